//! Reads: ask the master where an object is (granting a read lease), read one replica through
//! its segment's data path straight into the destination, check the CRC-32C. A batch reads
//! every item's first choice (same-host replicas first) grouped by segment; any item that fails
//! there, or fails its checksum, is read again over all its replicas one by one. Items whose
//! location this client remembers are read from it first, version-checked by their stores
//! (see `locations.rs`); only the rest are asked of the master.

use super::datapath::ReadOp;
use super::error::ClientError;
use super::plan::ReadPlan;
use super::routes::Route;
use super::Inner;
use crate::transfer::message::*;
use crate::transfer::rpc;
use crate::transfer::Status;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

impl Inner {
    /// Resolves an object's replicas to routes: same-host ones first, those whose segment
    /// just failed a transfer last.
    fn targets(&self, replicas: &[ReplicaLoc]) -> Result<Vec<(Arc<Route>, u64)>, ClientError> {
        let mut out = Vec::with_capacity(replicas.len());
        let mut last_err = None;
        for r in replicas {
            match self.route(r.segment_id) {
                Ok(route) => out.push((route, r.offset)),
                Err(e) => last_err = Some(e),
            }
        }
        if out.is_empty() {
            return Err(last_err.unwrap_or_else(|| ClientError::Rejected {
                status: Status::Internal,
                message: "the master described an object with no replica".into(),
            }));
        }
        // Same-host first; replicas on a segment that just failed last.
        out.sort_by_key(|(route, _)| (route.suspect(), route.path.kind()));
        Ok(out)
    }

    /// Asks the master where `key` is (and remembers the answer).
    pub(super) fn describe(&self, key: &str) -> Result<ObjectDesc, ClientError> {
        let asked = Instant::now();
        let desc: ObjectDesc = self
            .master_call::<rpc::GetReplicas>(&KeyReq { key: key.into() })
            .map_err(|e| e.for_key(key))?;
        self.locations.insert(key, desc.clone(), asked);
        Ok(desc)
    }

    /// Reads `key` from a remembered location: one round trip to a store that checks the
    /// version is still there, and the CRC-32C as always. On anything else the location is
    /// forgotten and `false` returned: the caller asks the master.
    pub(super) fn read_cached(&self, key: &str, desc: &ObjectDesc, dst: &mut [u8]) -> bool {
        let target = desc.replicas.iter().find_map(|r| {
            let route = self.routes.get(r.segment_id)?;
            route.path.checks_versions().then_some((route, r.offset))
        });
        let Some((route, offset)) = target else {
            self.locations.remove(key);
            return false;
        };
        let bytes = dst.len() as u64;
        let mut op = [ReadOp::of_version(offset, &mut *dst, desc.version)];
        let read = self
            .moved(&route, bytes, || route.path.read(&mut op))
            .pop()
            .unwrap_or(Ok(()));
        match read {
            Ok(()) if op[0].crc == Some(desc.checksum) => {
                tracing::trace!(key, version = desc.version, segment = %route.info.name, offset,
                    "read from a cached location");
                return true;
            }
            Ok(()) => {
                // Torn by a concurrent reuse of the space: the master knows better.
                tracing::debug!(
                    key,
                    "cached location read failed its checksum; asking the master"
                );
            }
            // The store no longer vouches for it (moved, or no lease): not the route's fault.
            Err(crate::transfer::TransferError::Remote { .. }) => {}
            Err(_) => route.failed(),
        }
        self.locations.remove(key);
        false
    }

    pub(super) fn batch_describe(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<ObjectDesc, ClientError>>, ClientError> {
        let req = BatchKeysReq {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        let asked = Instant::now();
        let r: BatchGetReplicasResp = self.master_call::<rpc::BatchGetReplicas>(&req)?;
        if r.items.len() != keys.len() {
            return Err(ClientError::Invalid(format!(
                "the master described {} items for {} keys",
                r.items.len(),
                keys.len()
            )));
        }
        for (desc, k) in r.items.iter().zip(keys) {
            if let Ok(desc) = desc {
                self.locations.insert(k, desc.clone(), asked);
            }
        }
        Ok(r.items
            .into_iter()
            .zip(keys)
            .map(|(it, k)| {
                it.map_err(|s| match ClientError::check_status(s, k) {
                    Err(e) => e,
                    Ok(()) => ClientError::Invalid("error item with OK status".into()),
                })
            })
            .collect())
    }

    /// Reads one object, trying each replica (same-host first) until one reads with a good CRC.
    /// A replica with a bad CRC is reported to the master, which drops it.
    pub(super) fn read_object(
        &self,
        key: &str,
        desc: &ObjectDesc,
        dst: &mut [u8],
    ) -> Result<(), ClientError> {
        let targets = self.targets(&desc.replicas)?;
        let mut last = String::from("no replica tried");
        let mut bad_checksum = false;
        for (route, offset) in &targets {
            let bytes = dst.len() as u64;
            let mut op = [ReadOp::new(*offset, &mut *dst)];
            let read = self
                .moved(route, bytes, || route.path.read(&mut op))
                .pop()
                .unwrap_or(Ok(()));
            let crc = op[0].crc;
            match &read {
                Ok(()) => route.succeeded(),
                Err(_) => route.failed(),
            }
            match read {
                Ok(()) if desc.holds(|| crc.unwrap_or_else(|| self.checksum(dst))) => return Ok(()),
                Ok(()) => {
                    bad_checksum = true;
                    tracing::warn!(key, segment = %route.info.name, "checksum mismatch; trying another replica");
                    let report = ReportCorruptReq {
                        key: key.into(),
                        version: desc.version,
                        segment_id: route.segment_id,
                    };
                    if let Err(e) = self.master_call::<rpc::ReportCorrupt>(&report) {
                        tracing::debug!(error = %e, "cannot report a corrupt replica");
                    }
                }
                Err(e) => last = format!("{}: {e}", route.info.endpoint),
            }
        }
        if bad_checksum {
            Err(ClientError::Checksum { key: key.into() })
        } else {
            Err(ClientError::Unreadable {
                key: key.into(),
                last,
            })
        }
    }

    pub(super) fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize, ClientError>> {
        if keys.len() != bufs.len() {
            let e = ClientError::Invalid(format!(
                "{} keys but {} buffers: give one buffer per key",
                keys.len(),
                bufs.len()
            ));
            return vec![Err(e); keys.len()];
        }
        let now = Instant::now();
        let remembered: Vec<Option<Arc<ObjectDesc>>> = keys
            .iter()
            .zip(bufs.iter())
            .map(|(k, b)| {
                self.locations
                    .get(k, now)
                    .filter(|d| d.size <= b.len() as u64)
            })
            .collect();
        let hits = self.batch_read_cached(keys, &remembered, bufs);
        let rest: Vec<usize> = (0..keys.len()).filter(|&i| !hits[i]).collect();
        let mut results: Vec<Result<usize, ClientError>> = remembered
            .iter()
            .map(|d| Ok(d.as_ref().map_or(0, |d| d.size as usize)))
            .collect();
        if rest.is_empty() {
            return results;
        }
        let rest_keys: Vec<&str> = rest.iter().map(|&i| keys[i]).collect();
        let mut rest_bufs: Vec<&mut [u8]> = bufs
            .iter_mut()
            .zip(&hits)
            .filter(|(_, hit)| !**hit)
            .map(|(b, _)| &mut **b)
            .collect();
        let descs = match self.batch_describe(&rest_keys) {
            Ok(d) => d,
            Err(e) => {
                for &i in &rest {
                    results[i] = Err(e.clone());
                }
                return results;
            }
        };
        let descs: Vec<Result<ObjectDesc, ClientError>> = descs
            .into_iter()
            .zip(rest_bufs.iter())
            .zip(&rest_keys)
            .map(|((d, b), k)| match d {
                Ok(d) if (b.len() as u64) < d.size => Err(ClientError::BufferTooSmall {
                    key: k.to_string(),
                    needed: d.size,
                    got: b.len(),
                }),
                other => other,
            })
            .collect();
        let read = self.batch_read(&rest_keys, descs, &mut rest_bufs);
        for (i, r) in rest.into_iter().zip(read) {
            results[i] = r;
        }
        results
    }

    /// Reads the items with a remembered location (`remembered`, each no larger than its
    /// buffer) from their stores, grouped by segment, each checked against its version and
    /// CRC-32C; answers which were read. The others' locations are forgotten: the caller asks
    /// the master for them.
    pub(super) fn batch_read_cached(
        &self,
        keys: &[&str],
        remembered: &[Option<Arc<ObjectDesc>>],
        bufs: &mut [&mut [u8]],
    ) -> Vec<bool> {
        let mut hits = vec![false; keys.len()];
        let mut groups: BTreeMap<u64, Vec<(usize, u64)>> = BTreeMap::new();
        for (i, d) in remembered.iter().enumerate() {
            let Some(d) = d else { continue };
            let target = d.replicas.iter().find(|r| {
                self.routes
                    .get(r.segment_id)
                    .is_some_and(|route| route.path.checks_versions())
            });
            match target {
                Some(r) => groups.entry(r.segment_id).or_default().push((i, r.offset)),
                None => self.locations.remove(keys[i]),
            }
        }
        let mut slots: Vec<Option<&mut [u8]>> = bufs.iter_mut().map(|b| Some(&mut **b)).collect();
        for (segment, reads) in groups {
            let Some(route) = self.routes.get(segment) else {
                continue;
            };
            let mut items = Vec::with_capacity(reads.len());
            let mut ops = Vec::with_capacity(reads.len());
            for (i, offset) in reads {
                let (Some(d), Some(buf)) = (&remembered[i], slots[i].take()) else {
                    continue;
                };
                items.push((i, d.checksum));
                ops.push(ReadOp::of_version(
                    offset,
                    &mut buf[..d.size as usize],
                    d.version,
                ));
            }
            let bytes = ops.iter().map(|op| op.dst.len() as u64).sum();
            let results = self.moved(&route, bytes, || route.path.read(&mut ops));
            for (((i, checksum), r), op) in items.into_iter().zip(results).zip(&ops) {
                match r {
                    Ok(()) => hits[i] = op.crc == Some(checksum),
                    Err(crate::transfer::TransferError::Remote { .. }) => {}
                    Err(_) => route.failed(),
                }
            }
        }
        for (i, d) in remembered.iter().enumerate() {
            if d.is_some() && !hits[i] {
                self.locations.remove(keys[i]);
            }
        }
        hits
    }

    /// Reads described objects into `bufs` (each at least its object's size); returns each
    /// value's length.
    pub(super) fn batch_read(
        &self,
        keys: &[&str],
        descs: Vec<Result<ObjectDesc, ClientError>>,
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize, ClientError>> {
        let plan = ReadPlan::new(descs.iter().map(|d| d.as_ref().ok()), |d| {
            // Unroutable items are left to the one-by-one path, which reports why.
            let (route, offset) = self.targets(&d.replicas).ok()?.into_iter().next()?;
            Some((route.segment_id, offset))
        });
        let mut read_ok = vec![false; keys.len()];
        // The CRC the data path computed in passing, where it did.
        let mut crcs: Vec<Option<u32>> = vec![None; keys.len()];
        {
            let mut slots: Vec<Option<&mut [u8]>> =
                bufs.iter_mut().map(|b| Some(&mut **b)).collect();
            for (segment, reads) in plan.groups() {
                let Some(route) = self.routes.get(segment) else {
                    continue;
                };
                let mut items = Vec::with_capacity(reads.len());
                let mut ops = Vec::with_capacity(reads.len());
                for r in reads {
                    let size = descs[r.item].as_ref().map_or(0, |d| d.size as usize);
                    if let Some(buf) = slots[r.item].take() {
                        items.push(r.item);
                        ops.push(ReadOp::new(r.offset, &mut buf[..size]));
                    }
                }
                let bytes = ops.iter().map(|op| op.dst.len() as u64).sum();
                let results = self.moved(&route, bytes, || route.path.read(&mut ops));
                for ((item, r), op) in items.into_iter().zip(results).zip(&ops) {
                    match &r {
                        Ok(()) => route.succeeded(),
                        Err(_) => route.failed(),
                    }
                    read_ok[item] = r.is_ok();
                    crcs[item] = op.crc;
                }
            }
        }
        descs
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let d = d?;
                let n = d.size as usize;
                let dst = &mut bufs[i][..n];
                let good = read_ok[i] && d.holds(|| crcs[i].unwrap_or_else(|| self.checksum(dst)));
                if !good {
                    self.read_object(keys[i], &d, dst)?;
                }
                Ok(n)
            })
            .collect()
    }
}
