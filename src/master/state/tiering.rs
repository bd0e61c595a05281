//! The disk tier as the master drives it: the copies (*moves*) between a store's memory
//! segment and its disk segment that are under way.
//!
//! When memory eviction takes an object whose replica lives on a store with a disk tier, the
//! object is not dropped: space is allocated on that store's disk segment and a demotion is
//! queued. The object stays readable from memory meanwhile. When the store confirms the copy,
//! the disk replica replaces the memory ones and the memory is freed; if the copy fails, the
//! disk space goes back and the object stays in memory (a later eviction takes it again, or
//! drops it when memory is needed at once). A read of an object that lives only on disk may
//! queue a promotion the same way, the other direction.
//!
//! Moves are bounded: at most `disk_tier_queue_bytes` of demotions in flight per store, and at
//! most one move per object version. The mover (`mover.rs`) takes queued moves, sends them to
//! the stores and reports each outcome back (`MasterState::moved`).

use crate::transfer::message::{MoveItem, MoveKind, ReplicaLoc};
use std::collections::HashMap;

/// One copy between tiers under way.
#[derive(Clone, Debug)]
pub struct Move {
    pub kind: MoveKind,
    pub key: Box<str>,
    pub version: u64,
    pub size: u64,
    pub checksum: u32,
    pub from: ReplicaLoc,
    pub to: ReplicaLoc,
    /// The disk segment whose store does the copy (its endpoint takes the `MOVE`).
    pub via: u64,
}

impl Move {
    /// The move as the mover's wire item names it.
    pub fn item(&self) -> MoveItem {
        MoveItem {
            kind: self.kind,
            key: self.key.to_string(),
            version: self.version,
            from: self.from.offset,
            to: self.to.offset,
            size: self.size,
            checksum: self.checksum,
        }
    }
}

/// The moves under way, by object version.
#[derive(Debug, Default)]
pub struct Moves {
    by_version: HashMap<u64, Move>,
    /// Versions whose move the mover has not taken yet, in order.
    queued: Vec<u64>,
    /// Bytes of demotions under way, by disk segment.
    demoting: HashMap<u64, u64>,
}

impl Moves {
    /// Moves under way or queued.
    pub fn len(&self) -> usize {
        self.by_version.len()
    }

    /// Whether no move is under way or queued.
    pub fn is_empty(&self) -> bool {
        self.by_version.is_empty()
    }

    /// Whether moves wait for the mover to take them.
    pub fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Whether the object version `version` is being moved.
    pub fn contains(&self, version: u64) -> bool {
        self.by_version.contains_key(&version)
    }

    /// Bytes of demotions under way through disk segment `via`.
    pub fn demoting(&self, via: u64) -> u64 {
        self.demoting.get(&via).copied().unwrap_or(0)
    }

    /// Bytes of demotions under way on every store: memory they will free.
    pub fn demoting_total(&self) -> u64 {
        self.demoting.values().sum()
    }

    /// Queues `m`; false (and nothing queued) when its version already has a move.
    pub fn start(&mut self, m: Move) -> bool {
        if self.by_version.contains_key(&m.version) {
            return false;
        }
        if m.kind == MoveKind::Demote {
            *self.demoting.entry(m.via).or_default() += m.size;
        }
        self.queued.push(m.version);
        self.by_version.insert(m.version, m);
        true
    }

    /// The queued moves, for the mover; they stay under way until `finish`.
    pub fn take_queued(&mut self) -> Vec<&Move> {
        let versions = std::mem::take(&mut self.queued);
        versions
            .iter()
            .filter_map(|v| self.by_version.get(v))
            .collect()
    }

    /// The move of `version` is over (done or failed): it is no longer under way.
    pub fn finish(&mut self, version: u64) -> Option<Move> {
        let m = self.by_version.remove(&version)?;
        self.queued.retain(|v| *v != version);
        if m.kind == MoveKind::Demote {
            if let Some(bytes) = self.demoting.get_mut(&m.via) {
                *bytes = bytes.saturating_sub(m.size);
                if *bytes == 0 {
                    self.demoting.remove(&m.via);
                }
            }
        }
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demotion(version: u64, via: u64, size: u64) -> Move {
        Move {
            kind: MoveKind::Demote,
            key: format!("k{version}").into(),
            version,
            size,
            checksum: 0,
            from: ReplicaLoc {
                segment_id: 1,
                offset: 0,
            },
            to: ReplicaLoc {
                segment_id: via,
                offset: 0,
            },
            via,
        }
    }

    #[test]
    fn demoting_bytes_are_counted_per_store_until_each_move_finishes() {
        let mut m = Moves::default();
        assert!(m.start(demotion(1, 7, 100)));
        assert!(m.start(demotion(2, 7, 50)));
        assert!(m.start(demotion(3, 8, 10)));
        assert!(!m.start(demotion(3, 8, 10)), "one move per version");
        assert_eq!(
            (m.demoting(7), m.demoting(8), m.demoting_total()),
            (150, 10, 160)
        );
        let taken: Vec<u64> = m.take_queued().iter().map(|m| m.version).collect();
        assert_eq!(taken, [1, 2, 3]);
        assert!(m.take_queued().is_empty(), "taken once");
        assert!(m.contains(2), "under way until finished");
        assert_eq!(m.finish(1).map(|m| m.size), Some(100));
        assert!(m.finish(1).is_none());
        assert_eq!(m.demoting(7), 50);
        m.finish(2);
        m.finish(3);
        assert!(m.is_empty());
        assert_eq!(m.demoting_total(), 0);
    }
}
