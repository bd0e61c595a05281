//! The pure half of the batch put and get: which bytes go to which segment, and what to tell
//! the master afterwards. No sockets, no clocks: the executors in `put.rs` and `get.rs` do the
//! I/O through the data path and feed the outcomes back here.
//!
//! The rule a put settles by: an item is committed only when the master started it and every
//! replica it was given was written; anything started and not fully written is revoked, so its
//! space is freed at once rather than when its put lease runs out. A commit is acknowledged
//! only by the master's per-item answer to it.

use super::error::ClientError;
use crate::transfer::grant::Grant;
use crate::transfer::message::{EndItem, ObjectDesc, PutStartResp};
use crate::transfer::Status;
use std::collections::BTreeMap;

/// One replica to write: item `item`'s value at `offset` of the group's segment, with the
/// master's grant to write it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaWrite {
    pub item: usize,
    pub offset: u64,
    pub grant: Grant,
}

#[derive(Debug)]
struct PutItem {
    /// The object id the master gave, when it started the put.
    object_id: Option<u64>,
    /// Why the item cannot succeed, found before or during the writes.
    failure: Option<ClientError>,
}

/// The writes of a batch put, grouped by segment.
#[derive(Debug)]
pub struct WritePlan {
    items: Vec<PutItem>,
    groups: BTreeMap<u64, Vec<ReplicaWrite>>,
}

impl WritePlan {
    /// Plans from the master's answer to `BatchPutStart` (one per key, in order). `routable`
    /// says whether this client can reach a segment, or why not; an item with any unreachable
    /// replica writes nothing and is revoked.
    pub fn new(
        keys: &[&str],
        started: Vec<Result<PutStartResp, Status>>,
        mut routable: impl FnMut(u64) -> Result<(), ClientError>,
    ) -> WritePlan {
        let mut items = Vec::with_capacity(keys.len());
        let mut groups: BTreeMap<u64, Vec<ReplicaWrite>> = BTreeMap::new();
        for (i, (key, answer)) in keys.iter().zip(started).enumerate() {
            let s = match answer {
                Ok(s) => s,
                Err(status) => {
                    items.push(PutItem {
                        object_id: None,
                        failure: ClientError::check_status(status, key).err(),
                    });
                    continue;
                }
            };
            let failure = if s.replicas.is_empty() {
                Some(ClientError::Rejected {
                    status: Status::Internal,
                    message: format!("{key:?}: the master placed no replica"),
                })
            } else if s.grants.len() != s.replicas.len() {
                Some(ClientError::Invalid(format!(
                    "{key:?}: the master sent {} grants for {} replicas",
                    s.grants.len(),
                    s.replicas.len()
                )))
            } else {
                s.replicas.iter().find_map(|r| routable(r.segment_id).err())
            };
            if failure.is_none() {
                for (r, &grant) in s.replicas.iter().zip(&s.grants) {
                    groups.entry(r.segment_id).or_default().push(ReplicaWrite {
                        item: i,
                        offset: r.offset,
                        grant,
                    });
                }
            }
            items.push(PutItem {
                object_id: Some(s.object_id),
                failure,
            });
        }
        WritePlan { items, groups }
    }

    /// Writes to make, by segment id (ascending), each group in item order.
    pub fn groups(&self) -> impl Iterator<Item = (u64, &[ReplicaWrite])> {
        self.groups.iter().map(|(s, w)| (*s, w.as_slice()))
    }

    /// The object id (version) item `i` is written as; 0 when the master did not start it.
    pub fn object_id(&self, i: usize) -> u64 {
        self.items.get(i).and_then(|it| it.object_id).unwrap_or(0)
    }

    /// Records the writes' outcomes (item, result; several per item when it has several
    /// replicas) and decides what to commit and what to revoke.
    pub fn settle(
        mut self,
        keys: &[&str],
        checksums: &[u32],
        outcomes: impl IntoIterator<Item = (usize, Result<(), ClientError>)>,
    ) -> Settlement {
        for (i, outcome) in outcomes {
            if let (Some(item), Err(e)) = (self.items.get_mut(i), outcome) {
                item.failure.get_or_insert(e);
            }
        }
        let mut settlement = Settlement {
            commit: Vec::new(),
            revoke: Vec::new(),
            committing: Vec::new(),
            results: Vec::with_capacity(self.items.len()),
        };
        for (i, item) in self.items.into_iter().enumerate() {
            let end = |checksum| EndItem {
                key: keys[i].to_string(),
                object_id: item.object_id.unwrap_or(0),
                checksum,
                unhashed: false,
            };
            match (item.object_id, item.failure) {
                (Some(_), None) => {
                    settlement.commit.push(end(checksums[i]));
                    settlement.committing.push(i);
                    settlement.results.push(None);
                }
                (Some(_), Some(e)) => {
                    settlement.revoke.push(end(0));
                    settlement.results.push(Some(Err(e)));
                }
                (None, failure) => {
                    settlement.results.push(Some(Err(failure.unwrap_or_else(|| {
                        ClientError::Invalid(format!("{:?}: the master did not start it", keys[i]))
                    }))))
                }
            }
        }
        settlement
    }
}

/// What a batch put tells the master, and each item's result once it has answered.
#[derive(Debug)]
pub struct Settlement {
    /// Fully written: commit with the value's checksum.
    pub commit: Vec<EndItem>,
    /// Started but not fully written: free the space.
    pub revoke: Vec<EndItem>,
    /// The item index of each `commit` entry.
    committing: Vec<usize>,
    /// Final results of the items not being committed.
    results: Vec<Option<Result<(), ClientError>>>,
}

impl Settlement {
    /// Each item's result, given the master's answer to the commit (one status per `commit`
    /// entry). An item counts as stored only on its own `Ok` status.
    pub fn finish(
        self,
        keys: &[&str],
        answer: Result<Vec<Status>, ClientError>,
    ) -> Vec<Result<(), ClientError>> {
        let mut results = self.results;
        let n = self.committing.len();
        let statuses: Vec<Result<(), ClientError>> = match answer {
            Ok(s) if s.len() == n => s
                .into_iter()
                .zip(&self.committing)
                .map(|(s, &i)| ClientError::check_status(s, keys[i]))
                .collect(),
            Ok(s) => {
                let e = ClientError::Invalid(format!(
                    "the master answered {} commit statuses for {n} items",
                    s.len()
                ));
                vec![Err(e); n]
            }
            Err(e) => vec![Err(e); n],
        };
        for (&i, r) in self.committing.iter().zip(statuses) {
            results[i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ClientError::Invalid("item left unsettled".into()))))
            .collect()
    }
}

/// One object to read: item `item`'s value from `offset` of the group's segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaRead {
    pub item: usize,
    pub offset: u64,
}

/// The first-choice reads of a batch get, grouped by segment. Items that fail their first
/// choice (or their checksum) are read again one by one over all their replicas.
#[derive(Debug, Default)]
pub struct ReadPlan {
    groups: BTreeMap<u64, Vec<ReplicaRead>>,
}

impl ReadPlan {
    /// `first(desc)` picks the replica to try first (the executor prefers same-host ones) as
    /// (segment id, offset), or says why none can be tried; items with no description are
    /// skipped.
    pub fn new<'a>(
        descs: impl IntoIterator<Item = Option<&'a ObjectDesc>>,
        mut first: impl FnMut(&ObjectDesc) -> Option<(u64, u64)>,
    ) -> ReadPlan {
        let mut groups: BTreeMap<u64, Vec<ReplicaRead>> = BTreeMap::new();
        for (item, desc) in descs.into_iter().enumerate() {
            if let Some((segment, offset)) = desc.and_then(&mut first) {
                groups
                    .entry(segment)
                    .or_default()
                    .push(ReplicaRead { item, offset });
            }
        }
        ReadPlan { groups }
    }

    /// The reads by segment.
    pub fn groups(&self) -> impl Iterator<Item = (u64, &[ReplicaRead])> {
        self.groups.iter().map(|(s, r)| (*s, r.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::message::ReplicaLoc;

    fn started(object_id: u64, replicas: &[(u64, u64)]) -> Result<PutStartResp, Status> {
        Ok(PutStartResp {
            object_id,
            replicas: replicas
                .iter()
                .map(|&(segment_id, offset)| ReplicaLoc { segment_id, offset })
                .collect(),
            grants: vec![Grant::default(); replicas.len()],
        })
    }

    fn store_down() -> ClientError {
        ClientError::from_store("s:1", crate::transfer::TransferError::Closed)
    }

    const KEYS: [&str; 3] = ["a", "b", "c"];
    const SUMS: [u32; 3] = [11, 22, 33];

    /// a on segments 7 and 9, b on 9, c on 7.
    fn three_items() -> WritePlan {
        WritePlan::new(
            &KEYS,
            vec![
                started(1, &[(7, 0), (9, 0)]),
                started(2, &[(9, 64)]),
                started(3, &[(7, 128)]),
            ],
            |_| Ok(()),
        )
    }

    #[test]
    fn writes_are_grouped_by_segment_in_item_order() {
        let plan = three_items();
        let groups: Vec<(u64, Vec<usize>)> = plan
            .groups()
            .map(|(s, w)| (s, w.iter().map(|w| w.item).collect()))
            .collect();
        assert_eq!(groups, vec![(7, vec![0, 2]), (9, vec![0, 1])]);
        assert_eq!(plan.object_id(1), 2);
    }

    #[test]
    fn an_item_commits_only_when_every_replica_was_written() {
        let plan = three_items();
        // Item 0's second replica failed; items 1 and 2 were written.
        let outcomes = vec![
            (0, Ok(())),
            (2, Ok(())),
            (0, Err(store_down())),
            (1, Ok(())),
        ];
        let s = plan.settle(&KEYS, &SUMS, outcomes);
        let commit: Vec<(&str, u64, u32)> = s
            .commit
            .iter()
            .map(|e| (e.key.as_str(), e.object_id, e.checksum))
            .collect();
        assert_eq!(commit, vec![("b", 2, 22), ("c", 3, 33)]);
        let revoke: Vec<(&str, u64)> = s
            .revoke
            .iter()
            .map(|e| (e.key.as_str(), e.object_id))
            .collect();
        assert_eq!(revoke, vec![("a", 1)]);
        let results = s.finish(&KEYS, Ok(vec![Status::Ok, Status::Ok]));
        assert!(matches!(results[0], Err(ClientError::Store { .. })));
        assert!(results[1].is_ok() && results[2].is_ok());
    }

    #[test]
    fn refused_and_unroutable_items_write_nothing() {
        let plan = WritePlan::new(
            &KEYS,
            vec![
                Err(Status::NoSpace),
                started(2, &[(5, 0), (6, 0)]),
                started(3, &[(6, 64)]),
            ],
            |seg| {
                if seg == 5 {
                    Err(ClientError::Rejected {
                        status: Status::SegmentNotFound,
                        message: "segment 5 is not mounted".into(),
                    })
                } else {
                    Ok(())
                }
            },
        );
        let groups: Vec<(u64, usize)> = plan.groups().map(|(s, w)| (s, w.len())).collect();
        assert_eq!(groups, vec![(6, 1)], "item 1 writes no replica at all");
        let s = plan.settle(&KEYS, &SUMS, vec![(2, Ok(()))]);
        assert_eq!(
            s.revoke.len(),
            1,
            "the started but unroutable item is revoked"
        );
        assert_eq!(s.revoke[0].key, "b");
        assert_eq!(s.commit.len(), 1);
        let results = s.finish(&KEYS, Ok(vec![Status::Ok]));
        assert_eq!(
            results[0].as_ref().unwrap_err().status(),
            Some(Status::NoSpace)
        );
        assert_eq!(
            results[1].as_ref().unwrap_err().status(),
            Some(Status::SegmentNotFound)
        );
        assert!(results[2].is_ok());
    }

    #[test]
    fn a_started_item_without_replicas_is_never_acknowledged() {
        let plan = WritePlan::new(&KEYS[..1], vec![started(4, &[])], |_| Ok(()));
        let s = plan.settle(&KEYS[..1], &SUMS, Vec::new());
        assert!(s.commit.is_empty());
        assert_eq!(s.revoke.len(), 1);
        assert!(s.finish(&KEYS[..1], Ok(Vec::new()))[0].is_err());
    }

    #[test]
    fn only_the_masters_own_ok_acknowledges_a_commit() {
        let plan = WritePlan::new(
            &KEYS,
            vec![
                started(1, &[(7, 0)]),
                started(2, &[(7, 64)]),
                started(3, &[(7, 128)]),
            ],
            |_| Ok(()),
        );
        let all_written = (0..3).map(|i| (i, Ok(())));
        let s = plan.settle(&KEYS, &SUMS, all_written);
        assert_eq!(s.commit.len(), 3);
        // A short answer must not leave the unanswered items looking stored.
        let results = s.finish(&KEYS, Ok(vec![Status::Ok, Status::WriteSuperseded]));
        assert!(results.iter().all(|r| r.is_err()), "{results:?}");

        let plan = WritePlan::new(
            &KEYS[..2],
            vec![started(1, &[(7, 0)]), started(2, &[(7, 8)])],
            |_| Ok(()),
        );
        let s = plan.settle(&KEYS[..2], &SUMS, (0..2).map(|i| (i, Ok(()))));
        let results = s.finish(&KEYS[..2], Ok(vec![Status::Ok, Status::WriteSuperseded]));
        assert!(results[0].is_ok());
        assert_eq!(
            results[1].as_ref().unwrap_err().status(),
            Some(Status::WriteSuperseded)
        );
        let plan = WritePlan::new(&KEYS[..1], vec![started(1, &[(7, 0)])], |_| Ok(()));
        let s = plan.settle(&KEYS[..1], &SUMS, vec![(0, Ok(()))]);
        let master_gone = ClientError::from_master("m:1", crate::transfer::TransferError::Timeout);
        let results = s.finish(&KEYS[..1], Err(master_gone));
        assert!(matches!(results[0], Err(ClientError::Master { .. })));
    }

    #[test]
    fn reads_group_first_choices_and_skip_the_undescribed() {
        let desc = |seg: u64, offset: u64| ObjectDesc {
            size: 8,
            replicas: vec![ReplicaLoc {
                segment_id: seg,
                offset,
            }],
            ..Default::default()
        };
        let descs = [Some(desc(3, 0)), None, Some(desc(2, 8)), Some(desc(3, 16))];
        let plan = ReadPlan::new(descs.iter().map(|d| d.as_ref()), |d| {
            d.replicas.first().map(|r| (r.segment_id, r.offset))
        });
        let groups: Vec<(u64, Vec<(usize, u64)>)> = plan
            .groups()
            .map(|(s, r)| (s, r.iter().map(|r| (r.item, r.offset)).collect()))
            .collect();
        assert_eq!(groups, vec![(2, vec![(2, 8)]), (3, vec![(0, 0), (3, 16)])]);
    }
}
