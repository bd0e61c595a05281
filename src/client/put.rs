//! The batch put: one master round trip to start, the writes through each segment's data path
//! (each answering the value's CRC-32C, computed as the bytes went), one round trip to commit
//! what was written with that CRC (and one to revoke what was not). What to write and
//! what to commit is decided in `plan.rs`; this file only does the I/O.

use super::datapath::WriteOp;
use super::error::ClientError;
use super::plan::WritePlan;
use super::Inner;
use crate::transfer::message::*;
use crate::transfer::Opcode;
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
        let req = BatchPutStartReq {
            client_id: self.id,
            config: config.clone(),
            items: keys
                .iter()
                .zip(values)
                .map(|(k, v)| PutItem {
                    key: k.to_string(),
                    size: v.len() as u64,
                })
                .collect(),
        };
        let started = match self.master_call::<_, BatchPutStartResp>(Opcode::BatchPutStart, &req) {
            Ok(r) if r.items.len() == keys.len() => r.items,
            Ok(r) => {
                let e = ClientError::Invalid(format!(
                    "the master answered {} items for {} keys",
                    r.items.len(),
                    keys.len()
                ));
                return vec![Err(e); keys.len()];
            }
            Err(e) => return vec![Err(e); keys.len()],
        };
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
            if let Err(e) = self.master_call::<_, BatchStatusResp>(Opcode::BatchPutRevoke, &req) {
                tracing::warn!(error = %e, "revoking failed puts; the master reclaims them later");
            }
        }
        let asked = Instant::now();
        let answer = if settlement.commit.is_empty() {
            Ok(Vec::new())
        } else {
            let req = BatchPutEndReq {
                client_id: self.id,
                items: std::mem::take(&mut settlement.commit),
            };
            self.master_call::<_, BatchStatusResp>(Opcode::BatchPutEnd, &req)
                .map(|r| r.items)
        };
        let results = settlement.finish(keys, answer);
        for (i, r) in results.iter().enumerate() {
            if r.is_ok() {
                let desc = ObjectDesc {
                    size: values[i].len() as u64,
                    checksum: checksums[i],
                    lease_ttl_ms: 0,
                    version: versions[i],
                    replicas: std::mem::take(&mut placed[i]),
                };
                self.locations.insert(keys[i], desc, asked);
            } else {
                self.locations.remove(keys[i]);
            }
        }
        results
    }
}
