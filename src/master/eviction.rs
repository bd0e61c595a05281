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
}
