//! The segments stores mounted, by id and by name, with what their states mean for reads and
//! placement, and the incarnations of segments given up (a store returning after its grace
//! period is told to start empty).

use crate::master::state::allocator::{self, Allocator};
use crate::transfer::grant::{Grant, GrantKey};
use crate::transfer::message::{Reach, ReplicaLoc, SegmentEntry, SegmentInfo, Tier};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// Incarnations of given-up segments remembered.
const LOST_SEGMENTS_REMEMBERED: usize = 4096;

/// Where a segment stands: what may be read from it and placed on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegState {
    Live,
    /// Its store is reporting the objects it kept. `rebind`: the master knew the segment and
    /// only confirms its own records; otherwise it adopts what is reported. `confirmed` holds
    /// the offsets confirmed so far.
    Recovering {
        rebind: bool,
        confirmed: HashSet<u64>,
    },
    /// Its store went away; objects are kept, unreadable, until `until`.
    Away {
        until: Instant,
    },
}

impl SegState {
    /// The state as the admin API and the status page name it.
    pub fn name(&self) -> &'static str {
        match self {
            SegState::Live => "live",
            SegState::Recovering { .. } => "recovering",
            SegState::Away { .. } => "away",
        }
    }

    /// Recovering, with none of its objects confirmed yet; `rebind` when the master knew the
    /// segment and only confirms its own records (else it adopts what is reported).
    pub fn recovering(rebind: bool) -> SegState {
        SegState::Recovering {
            rebind,
            confirmed: HashSet::new(),
        }
    }

    /// Whether its store went away and its objects wait, unreadable, for it.
    pub fn is_away(&self) -> bool {
        matches!(self, SegState::Away { .. })
    }
}

/// One mounted segment: its store, its space and its state.
#[derive(Debug)]
pub struct Segment {
    pub id: u64,
    pub info: SegmentInfo,
    /// The key its store checks grants and orders with (sent with each mount; never listed).
    /// Shared with the notifier and the mover, which tag orders with it.
    pub grant_key: Arc<GrantKey>,
    pub client_id: u64,
    pub alloc: Allocator,
    pub state: SegState,
    /// The outbox sequence number of the last forget queued for this segment: its store is
    /// granted a read lease only once it has taken every forget up to this one.
    pub owed_seq: u64,
}

impl Segment {
    /// A new segment of `info` mounted by `client_id`. Disk segments hand out whole blocks:
    /// the store reads and writes them with direct I/O.
    pub fn new(
        id: u64,
        info: SegmentInfo,
        grant_key: GrantKey,
        client_id: u64,
        state: SegState,
    ) -> Segment {
        let alloc = match info.tier {
            Tier::Memory => Allocator::new(info.size),
            Tier::Disk => Allocator::with_align(info.size, allocator::DISK_ALIGN),
        };
        Segment {
            id,
            info,
            grant_key: Arc::new(grant_key),
            client_id,
            alloc,
            state,
            owed_seq: 0,
        }
    }

    /// Whether its store is here and serves it (not recovering, not away).
    pub fn is_live(&self) -> bool {
        self.state == SegState::Live
    }

    /// A live memory segment: where new puts go and what the memory watermark counts.
    pub fn is_live_memory(&self) -> bool {
        self.is_live() && self.info.tier == Tier::Memory
    }

    /// Whether an rbgctl store serves the segment (`SegmentInfo::has_store`).
    pub fn has_store(&self) -> bool {
        self.info.has_store()
    }

    /// Whether a putter writing by `reach` can write this segment.
    pub fn reachable_by(&self, reach: Reach) -> bool {
        match reach {
            Reach::Rbgctl => self.has_store(),
            Reach::MooncakeTe => !self.info.te_endpoint.is_empty(),
            Reach::Any => self.has_store() || !self.info.te_endpoint.is_empty(),
        }
    }
}

/// Every mounted segment (live, recovering or away).
#[derive(Debug, Default)]
pub struct SegmentTable {
    /// Hashed with foldhash: a read asks it for every replica (the ids are the master's own).
    by_id: HashMap<u64, Segment, foldhash::fast::RandomState>,
    by_name: HashMap<String, u64>,
    /// Incarnations (`segment_uuid`) of segments unmounted or given up, oldest first.
    lost: VecDeque<u64>,
    /// Disk segments mounted (live or not): with none, puts never wait for room.
    disk: usize,
    /// Whether a segment may be recovering: set when one starts, cleared by the next look
    /// that finds none, so that a miss costs a walk over the segments only while one might be.
    maybe_recovering: bool,
}

impl SegmentTable {
    /// Segment `id`, if mounted.
    pub fn get(&self, id: u64) -> Option<&Segment> {
        self.by_id.get(&id)
    }

    /// Segment `id`, if mounted, to change.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Segment> {
        self.by_id.get_mut(&id)
    }

    /// The grant for each of a put's replicas: `size` bytes of `version` at its offset.
    pub fn grants(&self, version: u64, replicas: &[ReplicaLoc], size: u64) -> Vec<Grant> {
        replicas
            .iter()
            .map(|r| {
                self.get(r.segment_id)
                    .map(|seg| seg.grant_key.grant(version, r.offset, size))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Whether segment `id` is mounted.
    pub fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// The id of the segment mounted as `name`.
    pub fn by_name(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).copied()
    }

    /// Every mounted segment, whatever its state.
    pub fn iter(&self) -> impl Iterator<Item = &Segment> {
        self.by_id.values()
    }

    /// Mounted segments.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Mounts `seg` (its id and name are new).
    pub fn insert(&mut self, seg: Segment) {
        self.disk += usize::from(seg.info.tier == Tier::Disk);
        self.maybe_recovering |= matches!(seg.state, SegState::Recovering { .. });
        self.by_name.insert(seg.info.name.clone(), seg.id);
        self.by_id.insert(seg.id, seg);
    }

    /// Removes segment `id`, remembering its incarnation as lost.
    pub fn remove(&mut self, id: u64) -> Option<Segment> {
        let seg = self.by_id.remove(&id)?;
        self.disk -= usize::from(seg.info.tier == Tier::Disk);
        self.by_name.remove(&seg.info.name);
        if seg.info.segment_uuid != 0 {
            if self.lost.len() >= LOST_SEGMENTS_REMEMBERED {
                self.lost.pop_front();
            }
            self.lost.push_back(seg.info.segment_uuid);
        }
        Some(seg)
    }

    /// Marks segment `id` recovering (its store is back and reports what it kept).
    pub fn set_recovering(&mut self, id: u64, rebind: bool) {
        if let Some(seg) = self.by_id.get_mut(&id) {
            seg.state = SegState::recovering(rebind);
            self.maybe_recovering = true;
        }
    }

    /// Whether the segment of incarnation `uuid` was given up here.
    pub fn was_lost(&self, uuid: u64) -> bool {
        self.lost.contains(&uuid)
    }

    /// Whether any disk-tier segment is mounted.
    pub fn has_disk(&self) -> bool {
        self.disk > 0
    }

    /// Whether any segment is recovering (a look over the segments only while one might be).
    pub fn any_recovering(&mut self) -> bool {
        if !self.maybe_recovering {
            return false;
        }
        let recovering = self
            .by_id
            .values()
            .any(|s| matches!(s.state, SegState::Recovering { .. }));
        self.maybe_recovering = recovering;
        recovering
    }

    /// Whether segment `id` is mounted and live.
    pub fn is_live(&self, id: u64) -> bool {
        self.get(id).is_some_and(Segment::is_live)
    }

    /// Whether replica `r` lives on a disk-tier segment.
    pub fn is_disk(&self, r: &ReplicaLoc) -> bool {
        self.get(r.segment_id)
            .is_some_and(|s| s.info.tier == Tier::Disk)
    }

    /// The live memory segments: where new puts go.
    pub fn live_memory(&self) -> impl Iterator<Item = &Segment> {
        self.by_id.values().filter(|s| s.is_live_memory())
    }

    /// Bytes the live segments hold, memory and disk tiers.
    pub fn live_capacity(&self) -> u64 {
        self.iter()
            .filter(|s| s.is_live())
            .map(|s| s.alloc.capacity())
            .sum()
    }

    /// Bytes used and held by the live memory segments: what eviction keeps under the
    /// watermark.
    pub fn used_and_capacity(&self) -> (u64, u64) {
        self.live_memory().fold((0, 0), |(u, c), s| {
            (u + s.alloc.used(), c + s.alloc.capacity())
        })
    }

    /// The bytes the footprints of a `size`-byte value's `replicas` take.
    pub fn footprint(&self, replicas: &[ReplicaLoc], size: u64) -> u64 {
        replicas
            .iter()
            .filter_map(|r| self.get(r.segment_id))
            .map(|s| s.alloc.footprint(size))
            .sum()
    }

    /// The live segments, for clients, by name.
    pub fn list(&self) -> Vec<SegmentEntry> {
        let mut v: Vec<SegmentEntry> = self
            .by_id
            .values()
            .filter(|s| s.is_live())
            .map(|s| SegmentEntry {
                id: s.id,
                info: s.info.clone(),
                used: s.alloc.used(),
            })
            .collect();
        v.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        v
    }
}
