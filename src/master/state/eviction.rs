//! What eviction does with each object, as a pure function; the order it looks at them in
//! (least recently used first, kept as objects are touched) is the object table's
//! (`objects.rs`). Leased objects, objects readable only on away or recovering segments (they
//! take no live space) and unfinished puts are passed over; soft-pinned objects are set aside
//! and taken only when nothing else is left.

use super::allocator::aligned;
use super::objects::{Verdict, Version};
use std::time::Instant;

/// The verdict on a readable version. `on_live_segment`: one of its replicas is on a live
/// segment; `set_aside_pass`: the walk is on the objects already set aside.
pub fn verdict(v: &Version, on_live_segment: bool, set_aside_pass: bool, now: Instant) -> Verdict {
    if v.lease_until > now || !on_live_segment {
        return Verdict::PassOver;
    }
    if !set_aside_pass && v.soft_pin_until.is_some_and(|t| t > now) {
        return Verdict::SetAside;
    }
    Verdict::Evict(aligned(v.size) * v.replicas.len() as u64)
}

/// Bytes to free so that usage falls to `(high_watermark − ratio) × capacity`; 0 while usage is
/// at or under the watermark and nothing forces eviction.
pub fn bytes_to_free(
    used: u64,
    capacity: u64,
    high_watermark: f64,
    ratio: f64,
    forced: bool,
) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let hwm = (high_watermark * capacity as f64) as u64;
    if used <= hwm && !forced {
        return 0;
    }
    let target = ((high_watermark - ratio).max(0.0) * capacity as f64) as u64;
    used.saturating_sub(target)
        .max((ratio * capacity as f64) as u64 * forced as u64)
}

/// Entries the eviction log keeps; older ones are overwritten (`EvictionLog::since` says how
/// many a reader missed).
pub const EVICTION_LOG_ENTRIES: usize = 65_536;

/// One logged eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Numbered from 1, in the order evictions happened.
    pub seq: u64,
    pub key: String,
    /// Wall clock, microseconds since the Unix epoch.
    pub at_us: u64,
    /// The tier the value was dropped from.
    pub tier: crate::transfer::message::Tier,
}

/// The keys eviction dropped, oldest first, with when: what lets a reader (the history checker
/// of the fault tests) tell an eviction from a loss. Bounded to `capacity` entries.
#[derive(Debug)]
pub struct EvictionLog {
    entries: std::collections::VecDeque<Logged>,
    capacity: usize,
    next_seq: u64,
    started_us: u64,
}

impl Default for EvictionLog {
    fn default() -> Self {
        EvictionLog::with_capacity(EVICTION_LOG_ENTRIES)
    }
}

impl EvictionLog {
    /// An empty log keeping the last `capacity` evictions.
    pub fn with_capacity(capacity: usize) -> EvictionLog {
        EvictionLog {
            entries: std::collections::VecDeque::new(),
            capacity,
            next_seq: 1,
            started_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        }
    }

    /// Logs the eviction of `key` at `at_us` from `tier` (the oldest entry goes when full).
    pub fn push(&mut self, key: &str, at_us: u64, tier: crate::transfer::message::Tier) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(Logged {
            seq: self.next_seq,
            key: key.to_string(),
            at_us,
            tier,
        });
        self.next_seq += 1;
    }

    /// At most `limit` entries numbered above `after`, and how many such entries were already
    /// overwritten.
    pub fn since(&self, after: u64, limit: usize) -> (Vec<Logged>, u64) {
        let first = self.entries.front().map_or(self.next_seq, |e| e.seq);
        let missed = first.saturating_sub(after + 1);
        let skip = (after + 1).saturating_sub(first) as usize;
        let entries = self
            .entries
            .iter()
            .skip(skip)
            .take(limit)
            .cloned()
            .collect();
        (entries, missed)
    }

    /// When this log began (wall clock, microseconds).
    pub fn started_us(&self) -> u64 {
        self.started_us
    }

    /// The number the next eviction gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::message::ReplicaLoc;
    use std::time::Duration;

    #[test]
    fn leased_and_unreadable_objects_are_passed_over_and_pinned_ones_set_aside_once() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let loc = |segment_id| ReplicaLoc {
            segment_id,
            offset: 0,
        };
        let v = Version {
            object_id: 1,
            size: 100,
            checksum: 0,
            unhashed: false,
            replicas: smallvec::smallvec![loc(1), loc(2)],
            last_access: t0,
            lease_until: at(5),
            soft_pin_until: Some(at(10)),
            disk_hits: 0,
        };
        // Two replicas of 100 bytes take two 128-byte blocks.
        assert_eq!(verdict(&v, true, false, at(4)), Verdict::PassOver, "leased");
        assert_eq!(
            verdict(&v, false, false, at(6)),
            Verdict::PassOver,
            "not live"
        );
        assert_eq!(verdict(&v, true, false, at(6)), Verdict::SetAside);
        assert_eq!(verdict(&v, true, true, at(6)), Verdict::Evict(256));
        assert_eq!(
            verdict(&v, true, false, at(10)),
            Verdict::Evict(256),
            "pin ran out"
        );
    }

    #[test]
    fn watermark_arithmetic() {
        // Under the watermark: nothing.
        assert_eq!(bytes_to_free(80, 100, 0.9, 0.05, false), 0);
        // Over: down to 85 %.
        assert_eq!(bytes_to_free(95, 100, 0.9, 0.05, false), 10);
        // Forced (an allocation failed) under the watermark: at least ratio × capacity.
        assert_eq!(bytes_to_free(50, 1000, 0.9, 0.05, true), 50);
        assert_eq!(bytes_to_free(0, 0, 0.9, 0.05, true), 0);
    }

    #[test]
    fn the_eviction_log_is_read_in_order_and_says_what_was_overwritten() {
        use crate::transfer::message::Tier;
        let mut log = EvictionLog::with_capacity(3);
        for (i, k) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            log.push(k, 100 + i as u64, Tier::Memory);
        }
        let (entries, missed) = log.since(0, 10);
        let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!((keys, missed), (vec!["c", "d", "e"], 2));
        let (entries, missed) = log.since(3, 1);
        assert_eq!(
            (entries[0].key.as_str(), entries[0].seq, missed),
            ("d", 4, 0)
        );
        let (entries, missed) = log.since(5, 10);
        assert!(entries.is_empty() && missed == 0);
        assert_eq!(log.next_seq(), 6);
    }
}
