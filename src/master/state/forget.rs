//! The forget log: records stores must drop (of versions replaced, removed, evicted or moved),
//! waiting for the notifier, and what an operation that retired a value must see delivered
//! before it is acknowledged.
//!
//! Clients may read a cached location from its store directly; a store answers such a read
//! only while it still records that version and its read lease runs. So a removal or
//! replacement is acknowledged only once its forgets are delivered (or the stores' leases ran
//! out), and a put of a key whose earlier value left moments ago waits for that value's
//! forgets too.

use super::segments::SegmentTable;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{ForgetItem, ReplicaLoc};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an operation that replaced or removed values waits for before it is acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgetWait {
    /// The outbox sequence number its forgets (and those of evictions it depends on) have.
    pub seq: u64,
    /// The endpoints of the stores that held the versions it replaced or removed: once each
    /// has taken its forgets, no master restart can bring those versions back.
    pub endpoints: Vec<String>,
}

/// What the notifier has to deliver.
#[derive(Debug, Default)]
pub struct Outbox {
    /// The outbox sequence number these forgets run up to.
    pub seq: u64,
    /// Forgets by store endpoint.
    pub forgets: HashMap<String, Vec<ForgetItem>>,
    /// Endpoints of live segments: their stores get their read lease renewed.
    pub live: Vec<String>,
    /// Endpoints of away segments, whose forgets could not be sent: their stores keep stale
    /// records until their read lease runs out.
    pub unreachable: Vec<String>,
    /// The grant key of each mounted store, by endpoint: forgets are orders tagged with it.
    pub keys: HashMap<String, Arc<GrantKey>>,
}

/// Records stores must drop, per store, until each store took them.
#[derive(Debug, Default)]
pub struct ForgetLog {
    /// The stores' read lease: how long a store may serve a record it was not told to forget.
    lease: Duration,
    /// Forgets waiting for delivery: (segment id, record).
    outbox: Vec<(u64, ForgetItem)>,
    /// Incremented with every batch of forgets queued.
    seq: u64,
    /// Keys evicted or removed within the last store read lease, with their forgets' sequence
    /// number: a new value for one is acknowledged only once no store can serve the old one.
    retired: HashMap<String, (u64, Instant)>,
    /// The same keys in the order they were retired, with when (a key retired again is here
    /// twice; `delivered` prunes both from the front).
    retired_order: VecDeque<(Instant, String)>,
    /// The sequence number the current operation must see delivered before it answers.
    wait: u64,
    /// The segments the current operation queued forgets for.
    targets: Vec<u64>,
}

impl ForgetLog {
    /// An empty log; a removed version is remembered while a store's read lease
    /// (`store_read_lease`) may still serve it.
    pub fn new(store_read_lease: Duration) -> ForgetLog {
        ForgetLog {
            lease: store_read_lease,
            ..ForgetLog::default()
        }
    }

    /// The sequence number of the last batch queued.
    #[cfg(test)]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Queues the forgets of version `version`'s records at `replicas`, as one batch the
    /// current operation waits for. Returns the batch's sequence number.
    pub fn queue(&mut self, replicas: &[ReplicaLoc], version: u64) -> u64 {
        if replicas.is_empty() {
            return self.seq;
        }
        self.seq += 1;
        self.wait = self.seq;
        for r in replicas {
            self.targets.push(r.segment_id);
            let item = ForgetItem {
                offset: r.offset,
                version,
            };
            self.outbox.push((r.segment_id, item));
        }
        self.seq
    }

    /// Whether forgets wait for delivery.
    pub fn pending(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Takes the forgets waiting for delivery, grouped by store endpoint. Forgets for segments
    /// that are away or gone are dropped: a returning store reports its records and the master
    /// rejects those it no longer has (a gone segment's store has stopped or lost its read
    /// lease: it was dropped after `client_ttl`, or it left and revoked the lease first).
    pub fn take(&mut self, segments: &SegmentTable) -> Outbox {
        let mut out = Outbox {
            seq: self.seq,
            ..Outbox::default()
        };
        for (seg_id, item) in self.outbox.drain(..) {
            // A segment no store serves (a Mooncake process mounted it) keeps no records.
            let Some(seg) = segments.get(seg_id).filter(|s| s.has_store()) else {
                continue;
            };
            if seg.state.is_away() {
                out.unreachable.push(seg.info.endpoint.clone());
            } else {
                out.forgets
                    .entry(seg.info.endpoint.clone())
                    .or_default()
                    .push(item);
            }
        }
        out.unreachable.sort_unstable();
        out.unreachable.dedup();
        out.live = segments
            .iter()
            .filter(|s| s.is_live() && s.has_store())
            .map(|s| s.info.endpoint.clone())
            .collect();
        out.keys = segments
            .iter()
            .filter(|s| s.has_store())
            .map(|s| (s.info.endpoint.clone(), s.grant_key.clone()))
            .collect();
        out
    }

    /// The notifier delivered what it took: keys retired longer than a read lease ago no
    /// longer hold back their next value.
    pub fn delivered(&mut self, now: Instant) {
        while let Some((at, _)) = self.retired_order.front() {
            if now.saturating_duration_since(*at) <= self.lease {
                break;
            }
            if let Some((at, key)) = self.retired_order.pop_front() {
                // Retired again since: that later entry prunes it.
                if self.retired.get(&key).is_some_and(|(_, t)| *t <= at) {
                    self.retired.remove(&key);
                }
            }
        }
    }

    /// What the last operation must see settled before it is acknowledged, if anything
    /// (taken: the next operation starts from none).
    pub fn take_wait(&mut self, segments: &SegmentTable) -> Option<ForgetWait> {
        let seq = std::mem::take(&mut self.wait);
        let mut targets = std::mem::take(&mut self.targets);
        targets.sort_unstable();
        targets.dedup();
        let endpoints = targets
            .iter()
            .filter_map(|id| segments.get(*id))
            .filter(|s| s.has_store())
            .map(|s| s.info.endpoint.clone())
            .collect();
        (seq > 0).then_some(ForgetWait { seq, endpoints })
    }

    /// `key`'s value was just evicted or removed by the last batch queued: the next value of
    /// the key is acknowledged only once no store can serve the old one from a cached
    /// location (see `wait_for_retired`).
    pub fn retired(&mut self, key: &str, now: Instant) {
        if self.lease.is_zero() {
            return;
        }
        self.retired.insert(key.to_string(), (self.seq, now));
        self.retired_order.push_back((now, key.to_string()));
    }

    /// A new value of `key` is being acknowledged: it waits for the forgets of a value of the
    /// key retired moments ago.
    pub fn wait_for_retired(&mut self, key: &str) {
        if let Some(&(seq, _)) = self.retired.get(key) {
            self.wait = self.wait.max(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(segment_id: u64, offset: u64) -> ReplicaLoc {
        ReplicaLoc { segment_id, offset }
    }

    #[test]
    fn a_batch_is_waited_for_once_and_a_retired_key_holds_back_its_next_value_for_a_lease() {
        let t0 = Instant::now();
        let segments = SegmentTable::default();
        let mut log = ForgetLog::new(Duration::from_secs(5));
        assert_eq!(log.queue(&[], 7), 0, "nothing to forget is no batch");
        assert_eq!(log.take_wait(&segments), None);
        assert_eq!(log.queue(&[loc(1, 0), loc(2, 64)], 7), 1);
        log.retired("k", t0);
        assert_eq!(log.take_wait(&segments).map(|w| w.seq), Some(1));
        assert_eq!(
            log.take_wait(&segments),
            None,
            "taken: the next one starts from none"
        );
        log.wait_for_retired("k");
        assert_eq!(log.take_wait(&segments).map(|w| w.seq), Some(1));
        log.delivered(t0 + Duration::from_secs(6));
        log.wait_for_retired("k");
        assert_eq!(
            log.take_wait(&segments),
            None,
            "a lease later it no longer waits"
        );
    }
}
