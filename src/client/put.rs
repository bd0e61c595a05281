//! The batch put. Items with a reservation (space the master set aside for this client's next
//! put of that size, see `reservations.rs`) are written at once; the others are started with one
//! master round trip. The writes go through each segment's data path (each answering the
//! value's CRC-32C, computed as the bytes went); one round trip commits what was written with
//! that CRC and asks for reservations for the next puts (one more revokes what was not written).
//! What to write and what to commit is decided in `plan.rs`; this file only does the I/O.
//!
//! "Acknowledged means readable" is unchanged: a put is acknowledged only by the master's
//! commit, sent after every replica's bytes are in place (and recorded by persistent stores).

use super::datapath::WriteOp;
use super::error::ClientError;
use super::plan::WritePlan;
use super::reservations::Reserved;
use super::Inner;
use crate::transfer::message::*;
use crate::transfer::rpc;
use crate::transfer::Status;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Inner {
    pub(super) fn batch_put(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<(), ClientError>> {
        if keys.len() != values.len() {
            let e = ClientError::Invalid(format!(
                "{} keys but {} values: give one value per key",
                keys.len(),
                values.len()
            ));
            return vec![Err(e); keys.len()];
        }
        let (mut results, reserved) = self.put_once(keys, values, config, true);
        // An item whose reservation was no longer good (the master restarted or dropped it, or
        // another client put a newer value of the key since it was made) is put again the
        // usual way.
        let again: Vec<usize> = (0..keys.len())
            .filter(|&i| reserved[i] && results[i].as_ref().is_err_and(reservation_spent))
            .collect();
        if !again.is_empty() {
            let k: Vec<&str> = again.iter().map(|&i| keys[i]).collect();
            let v: Vec<&[u8]> = again.iter().map(|&i| values[i]).collect();
            let (retried, _) = self.put_once(&k, &v, config, false);
            for (i, r) in again.into_iter().zip(retried) {
                results[i] = r;
            }
        }
        self.put_elsewhere(keys, values, config, &mut results);
        results
    }

    /// Items that failed because their store could not be reached (it died or is cut off; the
    /// master keeps its segment until the store's TTL runs out) are put once more, placed first
    /// on the live segment with the most room elsewhere: a put goes to a live store instead of
    /// failing for the TTL.
    fn put_elsewhere(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
        results: &mut [Result<(), ClientError>],
    ) {
        let dead: Vec<&str> = results
            .iter()
            .filter_map(|r| match r {
                Err(ClientError::Store { endpoint, .. }) => Some(endpoint.as_str()),
                _ => None,
            })
            .collect();
        if dead.is_empty() {
            return;
        }
        let Ok(segments) = self.master_call::<rpc::ListSegments>(&()) else {
            return;
        };
        let Some(other) = segments
            .segments
            .iter()
            .filter(|s| s.info.tier == Tier::Memory && !dead.contains(&s.info.endpoint.as_str()))
            .max_by_key(|s| s.info.size.saturating_sub(s.used))
        else {
            return;
        };
        let again: Vec<usize> = (0..keys.len())
            .filter(|&i| matches!(results[i], Err(ClientError::Store { .. })))
            .collect();
        tracing::info!(stores = ?dead, to = %other.info.name, items = again.len(),
            "a store could not be reached; putting its items elsewhere");
        let elsewhere = ReplicateConfig {
            preferred_segment: other.info.name.clone(),
            ..config.clone()
        };
        let k: Vec<&str> = again.iter().map(|&i| keys[i]).collect();
        let v: Vec<&[u8]> = again.iter().map(|&i| values[i]).collect();
        let (retried, _) = self.put_once(&k, &v, &elsewhere, false);
        for (i, r) in again.into_iter().zip(retried) {
            results[i] = r;
        }
    }

    /// One attempt at a batch put, into reservations where `reserve` and one is held. Answers
    /// each item's result and whether it went into a reservation.
    fn put_once(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
        reserve: bool,
    ) -> (Vec<Result<(), ClientError>>, Vec<bool>) {
        let now = Instant::now();
        let taken: Vec<Option<Reserved>> = values
            .iter()
            .map(|v| {
                reserve
                    .then(|| self.reservations.take(v.len() as u64, config, now))
                    .flatten()
            })
            .collect();
        let started = match self.start(keys, values, config, &taken) {
            Ok(started) => started,
            Err(e) => {
                taken
                    .into_iter()
                    .flatten()
                    .for_each(|r| self.reservations.put_back(r));
                return (vec![Err(e); keys.len()], vec![false; keys.len()]);
            }
        };
        let reserved: Vec<bool> = taken.iter().map(Option::is_some).collect();
        // Each write answers the value's CRC-32C, computed as its bytes went.
        let mut checksums: Vec<Option<u32>> = vec![None; keys.len()];
        let plan = WritePlan::new(keys, started, |segment| self.route(segment).map(|_| ()));
        // Where each item went, remembered once it is committed.
        let versions: Vec<u64> = (0..keys.len()).map(|i| plan.object_id(i)).collect();
        let mut placed: Vec<Vec<ReplicaLoc>> = vec![Vec::new(); keys.len()];
        for (segment, writes) in plan.groups() {
            for w in writes {
                placed[w.item].push(ReplicaLoc {
                    segment_id: segment,
                    offset: w.offset,
                });
            }
        }

        let mut outcomes = Vec::new();
        for (segment, writes) in plan.groups() {
            let route = match self.route(segment) {
                Ok(r) => r,
                Err(e) => {
                    outcomes.extend(writes.iter().map(|w| (w.item, Err(e.clone()))));
                    continue;
                }
            };
            let ops: Vec<WriteOp<'_>> = writes
                .iter()
                .map(|w| WriteOp {
                    offset: w.offset,
                    value: values[w.item],
                    key: keys[w.item],
                    version: plan.object_id(w.item),
                    grant: w.grant,
                })
                .collect();
            let bytes = ops.iter().map(|op| op.value.len() as u64).sum();
            let results = self.moved(&route, bytes, || route.path.write(&ops));
            for (w, r) in writes.iter().zip(results) {
                let r = match r {
                    Ok(crc) => match checksums[w.item].get_or_insert(crc) {
                        // Replicas of one value that hash apart: the caller's buffer changed
                        // while it was written; no replica can be trusted to be the value.
                        first if *first != crc => Err(ClientError::Invalid(format!(
                            "{:?}: the value changed while it was being written (its replicas \
                             differ); do not modify a buffer during its put",
                            keys[w.item]
                        ))),
                        _ => Ok(()),
                    },
                    Err(e) => Err(ClientError::from_store(&route.info.endpoint, e)),
                };
                outcomes.push((w.item, r));
            }
        }

        let checksums: Vec<u32> = checksums.into_iter().map(|c| c.unwrap_or(0)).collect();
        let mut settlement = plan.settle(keys, &checksums, outcomes);
        if !settlement.revoke.is_empty() {
            let req = BatchPutEndReq {
                client_id: self.id,
                items: std::mem::take(&mut settlement.revoke),
            };
            if let Err(e) = self.master_call::<rpc::BatchPutRevoke>(&req) {
                tracing::warn!(error = %e, "revoking failed puts; the master reclaims them later");
            }
        }
        let asked = Instant::now();
        let sizes = values.iter().map(|v| v.len() as u64);
        let want = if reserve {
            self.reservations.wanted(sizes, config)
        } else {
            Vec::new()
        };
        let answer = self.commit(std::mem::take(&mut settlement.commit), config, want, asked);
        let results = settlement.finish(keys, answer);
        for (i, r) in results.iter().enumerate() {
            if r.is_ok() {
                let desc = ObjectDesc {
                    size: values[i].len() as u64,
                    checksum: checksums[i],
                    lease_ttl_ms: 0,
                    version: versions[i],
                    replicas: std::mem::take(&mut placed[i]),
                    unhashed: false,
                };
                self.locations.insert(keys[i], desc, asked);
            } else {
                self.locations.remove(keys[i]);
            }
        }
        (results, reserved)
    }

    /// Each item's start: its reservation, or the master's answer to one `BatchPutStart` for
    /// the items without one.
    fn start(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
        taken: &[Option<Reserved>],
    ) -> Result<Vec<Result<PutStartResp, Status>>, ClientError> {
        let rest: Vec<usize> = (0..keys.len()).filter(|&i| taken[i].is_none()).collect();
        let mut answers = Vec::new().into_iter();
        if !rest.is_empty() {
            let req = BatchPutStartReq {
                client_id: self.id,
                config: config.clone(),
                items: rest
                    .iter()
                    .map(|&i| PutItem {
                        key: keys[i].to_string(),
                        size: values[i].len() as u64,
                    })
                    .collect(),
            };
            let r: BatchPutStartResp = self.master_call::<rpc::BatchPutStart>(&req)?;
            if r.items.len() != rest.len() {
                return Err(ClientError::Invalid(format!(
                    "the master answered {} items for {} keys",
                    r.items.len(),
                    rest.len()
                )));
            }
            answers = r.items.into_iter();
        }
        Ok(taken
            .iter()
            .map(|t| match t {
                Some(r) => Ok(r.start.clone()),
                None => answers.next().unwrap_or(Err(Status::Internal)),
            })
            .collect())
    }

    /// Commits `items` and asks for reservations of `want` sizes (kept for the next puts);
    /// answers one status per item. Against a master without `BatchPutCommit`, commits with
    /// `BatchPutEnd` and reserves nothing.
    fn commit(
        &self,
        items: Vec<EndItem>,
        config: &ReplicateConfig,
        want: Vec<u64>,
        asked: Instant,
    ) -> Result<Vec<Status>, ClientError> {
        if items.is_empty() && want.is_empty() {
            return Ok(Vec::new());
        }
        if !self.no_commit_op.load(Ordering::Relaxed) {
            let req = BatchPutCommitReq {
                client_id: self.id,
                items,
                config: config.clone(),
                reserve: want,
            };
            match self.master_call::<rpc::BatchPutCommit>(&req) {
                Ok(r) => {
                    let ttl = std::time::Duration::from_millis(r.ttl_ms);
                    self.reservations
                        .add(config, &req.reserve, r.reserved, asked, ttl);
                    return Ok(r.items);
                }
                Err(ClientError::Rejected {
                    status: Status::UnknownOpcode,
                    ..
                }) => {
                    tracing::info!(master = %self.master.addr(),
                        "the master has no BatchPutCommit; every put takes two round trips");
                    self.no_commit_op.store(true, Ordering::Relaxed);
                    return self.commit(req.items, config, Vec::new(), asked);
                }
                Err(e) => return Err(e),
            }
        }
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let req = BatchPutEndReq {
            client_id: self.id,
            items,
        };
        self.master_call::<rpc::BatchPutEnd>(&req).map(|r| r.items)
    }

    /// Hands back the reservations this client let run out, so their space is free at once
    /// (called by the heartbeat).
    pub(super) fn hand_back_expired_reservations(&self) {
        let expired = self.reservations.take_expired(Instant::now());
        if expired.is_empty() {
            return;
        }
        let req = BatchPutEndReq {
            client_id: self.id,
            items: expired
                .iter()
                .map(|r| EndItem {
                    key: String::new(),
                    object_id: r.start.object_id,
                    checksum: 0,
                    unhashed: false,
                })
                .collect(),
        };
        if let Err(e) = self.master.with(|c| c.call::<rpc::BatchPutRevoke>(&req)) {
            tracing::debug!(error = %e, "handing back expired reservations failed; the master \
                drops them itself");
        }
    }
}

/// A reservation-put failure that a put without one would not have.
fn reservation_spent(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::NotFound(_)
            | ClientError::Rejected {
                status: Status::WriteSuperseded | Status::ReplicaNotReady,
                ..
            }
    )
}
