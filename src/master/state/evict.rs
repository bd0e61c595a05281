//! Eviction and the disk tier: memory kept under its watermark by demoting least recently
//! used objects to their stores' disk tiers (or dropping them), a disk tier's own eviction,
//! promotion of objects read from disk, and the moves between tiers the stores carry out.

use super::MasterState;
use crate::master::state::eviction;
use crate::master::state::objects::Verdict;
use crate::master::state::pool_events::PoolMedium;
use crate::master::state::tiering::Move;
use crate::master::tenants;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{MoveItem, MoveKind, ReplicaLoc, Tier, MAX_MOVE_BYTES};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// What an eviction walk may do with the objects it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eviction {
    /// Demote where the object's store has a disk tier, else drop (the watermark).
    DemoteOrDrop,
    /// Demote only; leave what cannot be (room for a put that can wait).
    DemoteOnly,
    /// Drop (a put needs the memory now).
    Drop,
}

/// What memory eviction does with an object whose store may have a disk tier.
enum Demotion {
    /// A copy to disk is queued; the memory (bytes) is freed when it is confirmed.
    Started(u64),
    /// It already had a disk replica: its memory (bytes) is freed now.
    Done(u64),
    /// Its store's demotion queue is full: leave it for now.
    Wait,
    /// No disk tier (or no room there, or too large): drop it.
    Drop,
}

/// The moves one store is to carry out, and its grant key to tag the orders with.
#[derive(Debug)]
pub struct MoveJob {
    pub endpoint: String,
    pub key: Arc<GrantKey>,
    pub items: Vec<MoveItem>,
}

impl MasterState {
    /// Evicts least-recently-used objects, if usage is over the high watermark (or an allocation
    /// failed since the last run), down to `(watermark − ratio) × capacity`, and at least
    /// `at_least` bytes. Returns the bytes freed or being freed.
    ///
    /// An object on a store with a disk tier is demoted rather than dropped (`demote`): its
    /// memory is freed once the copy is confirmed, so the watermark counts the demotions under
    /// way as freed. With `at_least` (a put needs the memory now) objects are dropped.
    pub fn evict(&mut self, now: Instant, at_least: u64) -> u64 {
        let (used, capacity) = self.segments.used_and_capacity();
        let used = used.saturating_sub(self.moves.demoting_total());
        let forced = std::mem::take(&mut self.force_eviction) || at_least > 0;
        let need = eviction::bytes_to_free(
            used,
            capacity,
            self.cfg.eviction_high_watermark_ratio,
            self.cfg.eviction_ratio,
            forced,
        )
        .max(at_least);
        if need == 0 || self.cfg.eviction_ratio == 0.0 {
            return 0;
        }
        let mode = if at_least == 0 {
            Eviction::DemoteOrDrop
        } else {
            Eviction::Drop
        };
        self.evict_walk(now, need, mode)
    }

    /// Makes room for a put of `bytes` in all, the largest value `largest` bytes, without
    /// dropping anything: when memory has less free (or no free extent that large), objects
    /// are demoted to their stores' disk tiers. Returns whether the put should wait for
    /// demotions under way (none are, or no more can be started: it should not).
    pub fn make_room(&mut self, bytes: u64, largest: u64, now: Instant) -> bool {
        if !self.segments.has_disk() {
            return false;
        }
        let (used, capacity) = self.segments.used_and_capacity();
        let free = capacity.saturating_sub(used);
        let extent = self
            .segments
            .live_memory()
            .map(|s| s.alloc.largest_free())
            .max()
            .unwrap_or(0);
        if (free >= bytes && extent >= largest) || self.cfg.eviction_ratio == 0.0 {
            return false;
        }
        // Freed space is contiguous only by chance: a value larger than every free extent asks
        // for at least its own size again.
        let need = bytes
            .saturating_sub(free)
            .max(if extent < largest { largest } else { 0 });
        let coming = self.moves.demoting_total();
        if coming < need {
            self.evict_walk(now, need - coming, Eviction::DemoteOnly);
        }
        self.moves.demoting_total() > 0
    }

    /// Eviction of memory's least recently used objects for `need` bytes: first those of the
    /// tenants over their share (`tenants::eviction_order`), up to what each is over by, then
    /// anyone's.
    fn evict_walk(&mut self, now: Instant, need: u64, mode: Eviction) -> u64 {
        let mut freed = 0;
        let usage = self.indexes.usage();
        let over = if usage.only_default() && !self.tenants.any_quota() {
            Vec::new() // one tenant: nobody to take from first
        } else {
            let capacity = self.pool_capacity();
            tenants::eviction_order(usage, &self.tenants.effective(capacity), capacity)
        };
        if !over.is_empty() {
            let mut left: HashMap<String, u64> = over.into_iter().collect();
            let victims = self.choose_victims(now, need, |key, size| {
                match left.get_mut(tenants::split(key).0) {
                    Some(l) if *l > 0 => {
                        *l = l.saturating_sub(size);
                        true
                    }
                    _ => false,
                }
            });
            freed += self.take_victims(&victims, mode, now);
        }
        if freed < need {
            let victims = self.choose_victims(now, need - freed, |_, _| true);
            freed += self.take_victims(&victims, mode, now);
        }
        self.counters.eviction_runs += 1;
        freed
    }

    /// Walks memory's least recently used objects for `need` bytes; `take(key, size)` is told
    /// of each object the walk would evict and says whether it goes.
    fn choose_victims(
        &mut self,
        now: Instant,
        need: u64,
        mut take: impl FnMut(&str, u64) -> bool,
    ) -> Vec<Box<str>> {
        let (segments, moves) = (&self.segments, &self.moves);
        self.objects
            .eviction_walk(need, |key, entry, set_aside_pass| {
                let Some(v) = &entry.current else {
                    return Verdict::PassOver; // only a put in progress
                };
                if moves.contains(v.object_id) {
                    return Verdict::Skip; // already leaving memory (or coming in)
                }
                // Memory is what is short: an object only on disk frees none of it.
                let on_live_segment = v.replicas.iter().any(|r| {
                    segments
                        .get(r.segment_id)
                        .is_some_and(|s| s.is_live_memory())
                });
                match eviction::verdict(v, on_live_segment, set_aside_pass, now) {
                    Verdict::Evict(bytes) if take(key, v.size) => Verdict::Evict(bytes),
                    Verdict::Evict(_) => Verdict::Skip,
                    other => other,
                }
            })
    }

    /// Demotes or drops the objects an eviction walk chose; returns the bytes freed or being
    /// freed.
    fn take_victims(&mut self, victims: &[Box<str>], mode: Eviction, now: Instant) -> u64 {
        let (mut freed, mut dropped, mut demoting) = (0, 0u64, 0u64);
        for k in victims {
            if mode != Eviction::Drop {
                match self.demote(k, now) {
                    Demotion::Started(bytes) | Demotion::Done(bytes) => {
                        freed += bytes;
                        demoting += 1;
                        continue;
                    }
                    // Its store's queue is full: the object stays until the copies drain, or
                    // until a put needs its memory at once.
                    Demotion::Wait => continue,
                    Demotion::Drop if mode == Eviction::DemoteOnly => continue,
                    Demotion::Drop => {}
                }
            }
            if let Some(bytes) = self.drop_evicted(k, Tier::Memory, now) {
                freed += bytes;
                dropped += 1;
                self.counters.evicted_bytes += bytes;
            }
        }
        self.counters.evicted_objects += dropped;
        if dropped > 0 || demoting > 0 {
            tracing::info!(
                dropped,
                demoting,
                bytes = freed,
                "evicted least recently used objects"
            );
        }
        freed
    }

    /// Drops the current version of `key` as eviction of `tier` does, and logs it; returns
    /// the bytes it held.
    fn drop_evicted(&mut self, k: &str, tier: Tier, now: Instant) -> Option<u64> {
        let entry = self.objects.get_mut(k)?;
        let v = entry.current.take()?;
        self.evictions.push(k, self.clock.unix_micros(), tier);
        self.indexes
            .version_ended(k, v.object_id, v.size, v.soft_pin_until);
        let medium = match tier {
            Tier::Memory => PoolMedium::Memory,
            Tier::Disk => PoolMedium::Disk,
        };
        self.pool_events.ended(k, medium);
        if entry.pending.is_none() {
            self.objects.remove(k);
        }
        let freed = self.segments.footprint(&v.replicas, v.size);
        self.release(&v.replicas, v.size, v.object_id, now, now);
        self.forgets.retired(k, now);
        Some(freed)
    }

    /// The live segment of tier `tier` of the store (client) that holds segment `id`: its
    /// disk tier for a memory segment, and the other way round.
    fn sibling(&self, id: u64, tier: Tier) -> Option<u64> {
        let client = self.segments.get(id)?.client_id;
        let mine = &self.clients.get(client)?.segments;
        mine.iter().copied().find(|s| {
            self.segments
                .get(*s)
                .is_some_and(|s| s.is_live() && s.info.tier == tier)
        })
    }

    /// Memory gives `key` up: to its store's disk tier when it has one with room.
    fn demote(&mut self, key: &str, now: Instant) -> Demotion {
        let Some(v) = self.objects.get(key).and_then(|e| e.current.as_ref()) else {
            return Demotion::Drop;
        };
        let (version, size, checksum) = (v.object_id, v.size, v.checksum);
        let memory: Vec<ReplicaLoc> = v
            .replicas
            .iter()
            .filter(|r| !self.segments.is_disk(r))
            .cloned()
            .collect();
        let memory_bytes = self.segments.footprint(&memory, size);
        if v.replicas.iter().any(|r| self.segments.is_disk(r)) {
            // Already on disk (reported by a store that died mid-demotion): memory just goes.
            self.leave_memory(key, &memory, now);
            return Demotion::Done(memory_bytes);
        }
        let Some((from, via)) = memory.iter().find_map(|r| {
            self.sibling(r.segment_id, Tier::Disk)
                .map(|d| (r.clone(), d))
        }) else {
            return Demotion::Drop;
        };
        if size > MAX_MOVE_BYTES {
            self.counters.disk_full_drops += 1;
            return Demotion::Drop;
        }
        if self.moves.demoting(via) + size > self.cfg.disk_tier_queue_bytes.0 {
            return Demotion::Wait;
        }
        let Some(offset) = self.alloc_on_disk(via, size, now) else {
            self.counters.disk_full_drops += 1;
            return Demotion::Drop;
        };
        let to = ReplicaLoc {
            segment_id: via,
            offset,
        };
        self.moves.start(Move {
            kind: MoveKind::Demote,
            key: key.into(),
            version,
            size,
            checksum,
            from,
            to,
            via,
        });
        Demotion::Started(memory_bytes)
    }

    /// Space for `size` bytes on disk segment `id`, its own eviction making room first when
    /// it is over its watermark or full.
    fn alloc_on_disk(&mut self, id: u64, size: u64, now: Instant) -> Option<u64> {
        let (used, capacity, footprint) = {
            let seg = self.segments.get(id)?;
            (
                seg.alloc.used(),
                seg.alloc.capacity(),
                seg.alloc.footprint(size),
            )
        };
        let over = eviction::bytes_to_free(
            used + footprint,
            capacity,
            self.cfg.disk_eviction_high_watermark_ratio,
            self.cfg.disk_eviction_ratio,
            false,
        );
        if over > 0 {
            self.evict_disk(id, over, now);
        }
        if let Some(offset) = self.segments.get_mut(id)?.alloc.alloc(size) {
            return Some(offset);
        }
        self.evict_disk(id, footprint, now);
        self.segments.get_mut(id)?.alloc.alloc(size)
    }

    /// Drops objects that live only on disk segment `id`, least recently used first, until
    /// `need` bytes are free (leased and moving objects stay).
    fn evict_disk(&mut self, id: u64, need: u64, now: Instant) -> u64 {
        let Some(seg) = self.segments.get(id) else {
            return 0;
        };
        let block = seg.alloc.footprint(1);
        let moves = &self.moves;
        let victims = self.objects.disk_eviction_walk(need, |_, entry, _| {
            let Some(v) = &entry.current else {
                return Verdict::Skip;
            };
            if moves.contains(v.object_id) || !v.replicas.iter().any(|r| r.segment_id == id) {
                return Verdict::Skip;
            }
            if v.lease_until > now {
                return Verdict::PassOver;
            }
            Verdict::Evict(v.size.div_ceil(block) * block)
        });
        let mut freed = 0;
        for k in &victims {
            if let Some(bytes) = self.drop_evicted(k, Tier::Disk, now) {
                freed += bytes;
                self.counters.disk_evicted_objects += 1;
                self.counters.disk_evicted_bytes += bytes;
            }
        }
        if !victims.is_empty() {
            tracing::info!(
                segment_id = id,
                objects = victims.len(),
                bytes = freed,
                "disk tier evicted least recently used objects"
            );
        }
        freed
    }

    /// `key`'s memory replicas go (readers under a lease keep theirs until it ends) and it
    /// lives on in the disk tier.
    fn leave_memory(&mut self, key: &str, memory: &[ReplicaLoc], now: Instant) {
        let Some(v) = self.objects.get_mut(key).and_then(|e| e.current.as_mut()) else {
            return;
        };
        v.replicas.retain(|r| !memory.contains(r));
        v.disk_hits = 0;
        let (size, version, until) = (v.size, v.object_id, v.lease_until);
        if self.objects.to_disk(key) {
            self.pool_events
                .moved(key, PoolMedium::Memory, PoolMedium::Disk);
        }
        self.release(memory, size, version, until, now);
    }

    /// The store of disk replica `from` copies `key` back to its memory segment, if that has
    /// room (promotion never evicts: the next eviction makes room again).
    pub(super) fn promote(&mut self, key: &str, from: ReplicaLoc) {
        let Some(v) = self.objects.get(key).and_then(|e| e.current.as_ref()) else {
            return;
        };
        let (version, size, checksum) = (v.object_id, v.size, v.checksum);
        if self.moves.contains(version) || size > MAX_MOVE_BYTES {
            return;
        }
        let Some(memory) = self.sibling(from.segment_id, Tier::Memory) else {
            return;
        };
        let Some(seg) = self.segments.get_mut(memory) else {
            return;
        };
        let Some(offset) = seg.alloc.alloc(size) else {
            return;
        };
        self.moves.start(Move {
            kind: MoveKind::Promote,
            key: key.into(),
            version,
            size,
            checksum,
            via: from.segment_id,
            from,
            to: ReplicaLoc {
                segment_id: memory,
                offset,
            },
        });
    }

    /// The queued moves, grouped by the endpoint of the store that does them.
    /// Takes the queued moves, grouped by the store that carries them out.
    pub fn take_moves(&mut self, now: Instant) -> Vec<MoveJob> {
        let mut by_endpoint: HashMap<&str, (&Arc<GrantKey>, Vec<MoveItem>)> = HashMap::new();
        let mut orphans = Vec::new();
        for m in self.moves.take_queued() {
            match self.segments.get(m.via).filter(|s| s.is_live()) {
                Some(seg) => by_endpoint
                    .entry(seg.info.endpoint.as_str())
                    .or_insert_with(|| (&seg.grant_key, Vec::new()))
                    .1
                    .push(m.item()),
                None => orphans.push(m.version),
            }
        }
        let jobs = by_endpoint
            .into_iter()
            .map(|(endpoint, (key, items))| MoveJob {
                endpoint: endpoint.to_owned(),
                key: key.clone(),
                items,
            })
            .collect();
        // Their store went away before the move was sent: the moves fail.
        let failed: Vec<(u64, crate::transfer::Status)> = orphans
            .into_iter()
            .map(|v| (v, crate::transfer::Status::SegmentNotFound))
            .collect();
        if !failed.is_empty() {
            self.moved(&failed, now);
        }
        jobs
    }

    /// The outcome of moves, by object version, as their stores answered (a store that did
    /// not answer counts as a failure). A copy that landed replaces the source replica; one
    /// whose source failed its checksum drops that replica; any other failure leaves the
    /// object where it was. The destination's space goes back whenever the object did not
    /// move.
    pub fn moved(&mut self, results: &[(u64, crate::transfer::Status)], now: Instant) {
        use crate::transfer::Status;
        for &(version, status) in results {
            let Some(m) = self.moves.finish(version) else {
                continue;
            };
            let landed = status == Status::Ok && self.segments.is_live(m.to.segment_id);
            let here = self
                .objects
                .get(&m.key)
                .and_then(|e| e.current.as_ref())
                .is_some_and(|v| v.object_id == m.version && v.replicas.contains(&m.from));
            if landed && here {
                self.moved_in(&m, now);
                continue;
            }
            self.release(std::slice::from_ref(&m.to), m.size, m.version, now, now);
            if status == Status::ChecksumMismatch && here {
                self.report_corrupt(&m.key, m.version, m.from.segment_id, now);
            } else if status != Status::Ok {
                self.counters.move_failures += 1;
                tracing::warn!(key = %m.key, kind = ?m.kind, status = status.name(),
                    "copy between tiers failed; the object stays where it was");
            }
        }
        // Nothing waits on these forgets: no client operation is answered by a move.
        self.take_forget_wait();
    }

    /// A confirmed move: the copy at `m.to` replaces the replicas of the tier it left.
    fn moved_in(&mut self, m: &Move, now: Instant) {
        match m.kind {
            MoveKind::Demote => {
                let memory: Vec<ReplicaLoc> = self
                    .objects
                    .get(&m.key)
                    .and_then(|e| e.current.as_ref())
                    .map(|v| {
                        v.replicas
                            .iter()
                            .filter(|r| !self.segments.is_disk(r))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(v) = self
                    .objects
                    .get_mut(&m.key)
                    .and_then(|e| e.current.as_mut())
                {
                    v.replicas.push(m.to.clone());
                }
                self.leave_memory(&m.key, &memory, now);
                self.counters.demoted_objects += 1;
                self.counters.demoted_bytes += m.size;
            }
            MoveKind::Promote => {
                let Some(v) = self
                    .objects
                    .get_mut(&m.key)
                    .and_then(|e| e.current.as_mut())
                else {
                    return;
                };
                let disk: Vec<ReplicaLoc> = std::mem::take(&mut v.replicas).into_iter().collect();
                v.replicas.push(m.to.clone());
                v.disk_hits = 0;
                let (size, version, until) = (v.size, v.object_id, v.lease_until);
                if self.objects.to_memory(&m.key) {
                    self.pool_events
                        .moved(&m.key, PoolMedium::Disk, PoolMedium::Memory);
                }
                self.release(&disk, size, version, until, now);
                self.counters.promoted_objects += 1;
                self.counters.promoted_bytes += m.size;
            }
        }
    }
}
