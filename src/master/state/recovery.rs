//! Segments coming and going: mounts, a returning store's report of what it kept (confirmed
//! against the master's records, or adopted by a master that restarted), stores away for their
//! grace period, and the walks over every object that drop or confirm a segment's replicas in
//! steps.

use super::{fail, MasterState, OpResult, SegState, Segment};
use crate::master::state::allocator;
use crate::master::state::objects::Version;
use crate::master::state::pool_events::PoolMedium;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{ForgetItem, ReplicaLoc, SegmentEntry, SegmentInfo, StoredObject};
use crate::transfer::Status;
use std::sync::Arc;
use std::time::Instant;

/// Object slots looked at per step of a walk over every object (a few ms under the lock).
pub const WALK_STEP: usize = 16_384;

/// A walk over every object slot, done in steps (`walk_step`) so that the lock is let go
/// between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WalkKind {
    /// Drop the replicas of an unmounted segment.
    Drop,
    /// A rebound segment's report is complete: drop the replicas its store did not confirm,
    /// then make it live. The segment stays recovering (unreadable) until then.
    Confirm,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Walk {
    kind: WalkKind,
    segment_id: u64,
    /// The slot to go on from.
    from: u32,
    /// Objects left without a replica so far.
    lost: u64,
}

impl MasterState {
    /// Mounts a segment; returns its id and whether the store must discard the objects it
    /// kept. Mounting the same name again from the same client is a no-op that returns the same
    /// id. A new client mounting a name is a restarted store: when it brings back the same
    /// persistent segment (`recovering`, same incarnation and size) the segment is rebound and
    /// its objects wait for the store's report; otherwise the old mount is dropped.
    pub fn mount(
        &mut self,
        client_id: u64,
        info: SegmentInfo,
        grant_key: GrantKey,
        recovering: bool,
        now: Instant,
    ) -> OpResult<(u64, bool)> {
        if info.name.is_empty() || (!info.has_store() && info.te_endpoint.is_empty()) {
            return fail(
                Status::InvalidParams,
                "segment name and endpoint (rbgctl's, or Mooncake's Transfer Engine's) are \
                 required",
            );
        }
        if info.size < allocator::ALIGN {
            return fail(
                Status::InvalidParams,
                format!("segment size {} is too small", info.size),
            );
        }
        let recovering = recovering && info.segment_uuid != 0;
        if let Some(id) = self.segments.by_name(&info.name) {
            let seg = self.segments.get(id).expect("named segments are mounted");
            if seg.client_id == client_id
                && seg.info.size == info.size
                && seg.info.segment_uuid == info.segment_uuid
                && !matches!(seg.state, SegState::Away { .. })
            {
                self.clients.touch(client_id, now);
                self.segments
                    .get_mut(id)
                    .expect("looked up above")
                    .grant_key = Arc::new(grant_key);
                return Ok((id, false));
            }
            if recovering
                && seg.info.segment_uuid == info.segment_uuid
                && seg.info.size == info.size
            {
                self.clients.detach(seg.client_id, id);
                // A confirmation of its previous report stops: the new report confirms anew.
                self.walks
                    .retain(|w| !(w.kind == WalkKind::Confirm && w.segment_id == id));
                let seg = self.segments.get_mut(id).expect("looked up above");
                tracing::info!(segment = %info.name, endpoint = %info.endpoint, was = seg.state.name(),
                    "store is back with its segment; waiting for its report");
                seg.client_id = client_id;
                seg.info = info;
                seg.grant_key = Arc::new(grant_key);
                // Its store dropped its lease to mount; its report settles which records stay,
                // so forgets owed to it before are moot.
                seg.owed_seq = 0;
                self.segments.set_recovering(id, true);
                self.hand_overs.forget_ended(id);
                self.clients.touch(client_id, now).segments.push(id);
                return Ok((id, false));
            }
            // Another store under this name. While the holder heartbeats it keeps the name (and
            // its objects); a restart of the same store on the same files (whose lock proves
            // the old process gone) or a holder that stopped heartbeating gives it up.
            let holder_alive = !seg.state.is_away()
                && self
                    .clients
                    .alive(seg.client_id, self.cfg.client_ttl_ms.0, now);
            let same_files = !info.shm_path.is_empty()
                && info.shm_path == seg.info.shm_path
                && info.host_id == seg.info.host_id;
            if holder_alive && !same_files {
                return fail(
                    Status::SegmentExists,
                    format!(
                        "segment name {:?} is held by a running store at {} (client {}); give \
                         this store another name, or stop that one first",
                        info.name, seg.info.endpoint, seg.client_id
                    ),
                );
            }
            let old_client = seg.client_id;
            tracing::warn!(segment = %info.name, old_client, new_client = client_id,
                "segment mounted again by a new store with other memory; dropping the old mount");
            self.unmount_segment(id);
            // The old holder, should it still run, learns at its next heartbeat that it is
            // unknown, and mounts again (or is refused and stops).
            self.clients.remove_if_idle(old_client);
        }
        let discard = recovering && self.segments.was_lost(info.segment_uuid);
        // Never the id of a segment whose replicas are still being dropped.
        let mut id = self.rng.u64(1..);
        while self.segments.contains(id) || self.walks.iter().any(|w| w.segment_id == id) {
            id = self.rng.u64(1..);
        }
        tracing::info!(segment = %info.name, endpoint = %info.endpoint, size = info.size, client_id,
            recovering, discard, "segment mounted");
        let state = if recovering {
            SegState::recovering(false)
        } else {
            SegState::Live
        };
        self.segments
            .insert(Segment::new(id, info, grant_key, client_id, state));
        self.clients.touch(client_id, now).segments.push(id);
        Ok((id, discard))
    }

    /// Takes part of a recovering store's report; returns the records the master rejects.
    pub fn report(
        &mut self,
        client_id: u64,
        segment_id: u64,
        objects: Vec<StoredObject>,
        done: bool,
        now: Instant,
    ) -> OpResult<Vec<ForgetItem>> {
        let rebind = match self.segment_of(client_id, segment_id)?.state {
            SegState::Recovering { rebind, .. } => rebind,
            _ => {
                return fail(
                    Status::InvalidParams,
                    format!("segment {segment_id} is not recovering"),
                )
            }
        };
        self.clients.touch(client_id, now);
        let mut rejected = Vec::new();
        for o in objects {
            let item = ForgetItem {
                offset: o.offset,
                version: o.version,
            };
            let taken = if rebind {
                self.confirm(segment_id, &o)
            } else {
                self.adopt(segment_id, o, now)
            };
            if !taken {
                rejected.push(item);
            }
        }
        self.counters.rejected_records += rejected.len() as u64;
        if done {
            self.finish_recovery(segment_id);
        }
        Ok(rejected)
    }

    /// Rebind: a reported record is kept only when it is exactly a replica the master has.
    fn confirm(&mut self, segment_id: u64, o: &StoredObject) -> bool {
        let Some(entry) = self.objects.get_mut(&o.key) else {
            return false;
        };
        let here = |replicas: &[ReplicaLoc]| {
            replicas
                .iter()
                .any(|r| r.segment_id == segment_id && r.offset == o.offset)
        };
        // A version committed unhashed takes the checksum the store worked out since.
        let current = match entry.current.as_mut() {
            Some(v)
                if v.object_id == o.version
                    && v.size == o.size
                    && (v.unhashed || v.checksum == o.checksum)
                    && here(&v.replicas) =>
            {
                if v.unhashed {
                    v.checksum = o.checksum;
                    v.unhashed = false;
                    self.counters.hashed_later += 1;
                }
                true
            }
            _ => false,
        };
        let pending = entry
            .pending
            .as_ref()
            .is_some_and(|p| p.object_id == o.version && here(&p.replicas));
        if current {
            if let Some(Segment {
                state: SegState::Recovering { confirmed, .. },
                ..
            }) = self.segments.get_mut(segment_id)
            {
                confirmed.insert(o.offset);
            }
            self.counters.recovered_objects += 1;
        }
        current || pending
    }

    /// After a master restart: a reported record becomes (a replica of) the key's current
    /// version unless a newer version is known.
    fn adopt(&mut self, segment_id: u64, o: StoredObject, now: Instant) -> bool {
        if o.key.is_empty() || o.size == 0 || o.version == 0 {
            return false;
        }
        let Some(seg) = self.segments.get(segment_id) else {
            return false;
        };
        if seg.info.size < o.offset.saturating_add(o.size) {
            return false;
        }
        let entry = self.objects.get(&o.key);
        let newest_known = entry
            .map(|e| {
                let c = e.current.as_ref().map_or(0, |v| v.object_id);
                let p = e.pending.as_ref().map_or(0, |p| p.object_id);
                c.max(p)
            })
            .unwrap_or(0);
        let mut same = false;
        if let Some(v) = entry.and_then(|e| e.current.as_ref()) {
            if v.object_id == o.version {
                if v.replicas
                    .iter()
                    .any(|r| r.segment_id == segment_id && r.offset == o.offset)
                {
                    return true; // reported again (a retried report)
                }
                if v.size != o.size
                    || (!v.unhashed && v.checksum != o.checksum)
                    || v.replicas.iter().any(|r| r.segment_id == segment_id)
                {
                    return false;
                }
                same = true;
            }
        }
        if !same && o.version <= newest_known {
            return false;
        }
        if self.objects.make_room().is_err() {
            return false;
        }
        let seg = self.segments.get_mut(segment_id).expect("checked above");
        if !seg.alloc.reserve(o.offset, o.size) {
            return false;
        }
        self.next_object_id = self.next_object_id.max(o.version + 1);
        let loc = ReplicaLoc {
            segment_id,
            offset: o.offset,
        };
        let Ok(entry) = self.objects.get_or_insert(&o.key) else {
            return false;
        };
        if same {
            if let Some(v) = entry.current.as_mut() {
                v.replicas.push(loc);
                if v.unhashed {
                    v.checksum = o.checksum;
                    v.unhashed = false;
                }
            }
        } else {
            let old = entry.current.replace(Version {
                object_id: o.version,
                size: o.size,
                checksum: o.checksum,
                unhashed: false,
                replicas: smallvec::smallvec![loc],
                last_access: now,
                lease_until: now,
                soft_pin_until: None,
                disk_hits: 0,
            });
            if let Some(old) = &old {
                self.indexes
                    .version_ended(&o.key, old.object_id, old.size, old.soft_pin_until);
            }
            self.indexes.version_began(&o.key, o.version, o.size, None);
            let medium = self.medium_of(&o.key);
            self.pool_events.began(&o.key, medium);
            if old.is_some() {
                self.pool_events.ended(&o.key, medium);
            }
            if let Some(old) = old {
                self.release(&old.replicas, old.size, old.object_id, now, now);
            }
        }
        // An object only on disk segments belongs to the disk tier's eviction order.
        let only_disk = self
            .objects
            .get(&o.key)
            .and_then(|e| e.current.as_ref())
            .is_some_and(|v| v.replicas.iter().all(|r| self.segments.is_disk(r)));
        if only_disk {
            if self.objects.to_disk(&o.key) {
                self.pool_events
                    .moved(&o.key, PoolMedium::Memory, PoolMedium::Disk);
            }
        } else if self.objects.to_memory(&o.key) {
            self.pool_events
                .moved(&o.key, PoolMedium::Disk, PoolMedium::Memory);
        }
        self.counters.recovered_objects += 1;
        true
    }

    /// The report is complete: in a rebind, replicas the store did not confirm are gone.
    fn finish_recovery(&mut self, segment_id: u64) {
        let Some(seg) = self.segments.get_mut(segment_id) else {
            return;
        };
        let SegState::Recovering { rebind, confirmed } = &seg.state else {
            return;
        };
        if !*rebind {
            tracing::info!(segment = %seg.info.name, adopted = confirmed.len(),
                "segment recovered and live");
            seg.state = SegState::Live;
            return;
        }
        self.start_walk(WalkKind::Confirm, segment_id);
    }

    /// What a read lease for segment `segment_id` of store `client_id` depends on: the
    /// segment's endpoint and the outbox sequence number its store must have taken every
    /// forget up to (`Notifier::grant`). Refused unless the segment is the store's and live.
    pub fn lease_terms(&self, client_id: u64, segment_id: u64) -> OpResult<(String, u64)> {
        match self.segments.get(segment_id) {
            Some(s) if s.client_id != client_id => fail(
                Status::IllegalClient,
                format!("segment {segment_id} belongs to another client"),
            ),
            Some(s) if s.is_live() => Ok((s.info.endpoint.clone(), s.owed_seq)),
            // Its store missed that it was given up (a lost answer to a heartbeat): it must
            // mount again.
            Some(s) if matches!(s.state, SegState::Away { .. }) => fail(
                Status::SegmentNotFound,
                format!("segment {segment_id} is away here; mount it again"),
            ),
            Some(s) => fail(
                Status::ObjectUnavailable,
                format!("segment {segment_id} is {}", s.state.name()),
            ),
            None => fail(
                Status::SegmentNotFound,
                format!("segment {segment_id} is not mounted"),
            ),
        }
    }

    /// Segment `segment_id`, refused unless it is mounted and store `client_id`'s.
    pub(super) fn segment_of(&self, client_id: u64, segment_id: u64) -> OpResult<&Segment> {
        match self.segments.get(segment_id) {
            None => fail(
                Status::SegmentNotFound,
                format!("segment {segment_id} is not mounted"),
            ),
            Some(s) if s.client_id != client_id => fail(
                Status::IllegalClient,
                format!("segment {segment_id} belongs to another client"),
            ),
            Some(s) => Ok(s),
        }
    }

    /// Unmounts a segment. With `keep` (a persistent store restarting), its objects are kept,
    /// unreadable, for the grace period.
    pub fn unmount(
        &mut self,
        client_id: u64,
        segment_id: u64,
        keep: bool,
        now: Instant,
    ) -> OpResult<()> {
        self.segment_of(client_id, segment_id)?;
        if keep {
            self.set_away(segment_id, now);
        } else {
            self.unmount_segment(segment_id);
        }
        Ok(())
    }

    /// Marks a persistent segment away for the grace period (a non-persistent one, or with no
    /// grace period, is unmounted).
    pub(super) fn set_away(&mut self, segment_id: u64, now: Instant) {
        let grace = self.cfg.store_grace_period_ms.0;
        let Some(seg) = self.segments.get_mut(segment_id) else {
            return;
        };
        if seg.info.segment_uuid == 0 || grace.is_zero() {
            self.unmount_segment(segment_id);
            return;
        }
        let client = seg.client_id;
        seg.state = SegState::Away { until: now + grace };
        // A store that said it is restarting is routine; one that vanished was warned about
        // where its client was dropped.
        tracing::info!(segment = %seg.info.name, grace_ms = grace.as_millis() as u64,
            "store away; keeping its objects (unreadable) for the grace period");
        self.clients.detach(client, segment_id);
    }

    /// Removes a segment and every replica in it; objects left without replicas are dropped.
    pub(super) fn unmount_segment(&mut self, segment_id: u64) {
        let Some(seg) = self.segments.remove(segment_id) else {
            return;
        };
        self.clients.detach(seg.client_id, segment_id);
        self.deferred.retain(|d| d.segment_id != segment_id);
        self.reservations.drop_segment(segment_id);
        tracing::info!(segment = %seg.info.name, "segment unmounted; dropping its replicas");
        // Its replicas are unreadable from now on (no segment backs them).
        self.start_walk(WalkKind::Drop, segment_id);
    }

    /// Queues a walk and takes its first step now (the whole walk, in a small pool).
    fn start_walk(&mut self, kind: WalkKind, segment_id: u64) {
        self.walks.push_back(Walk {
            kind,
            segment_id,
            from: 0,
            lost: 0,
        });
        self.walk_step(WALK_STEP);
    }

    /// Whether a walk over every object is in progress (`walk_step`).
    pub fn walking(&self) -> bool {
        !self.walks.is_empty()
    }

    /// Takes the next step, over at most `budget` object slots, of the first walk: dropping
    /// an unmounted segment's replicas, or a rebound segment's unconfirmed ones (objects left
    /// without a replica go). Returns whether more remains. The master's housekeeper calls it
    /// until done, letting other operations in between: a store leaving or coming back with
    /// millions of objects never holds the lock for long.
    pub fn walk_step(&mut self, budget: usize) -> bool {
        let Some(&walk) = self.walks.front() else {
            return false;
        };
        let segment_id = walk.segment_id;
        let (segments, indexes) = (&self.segments, &mut self.indexes);
        let pool_events = &mut self.pool_events;
        let confirmed = match (walk.kind, segments.get(segment_id).map(|s| &s.state)) {
            (WalkKind::Drop, _) => None,
            (WalkKind::Confirm, Some(SegState::Recovering { confirmed, .. })) => Some(confirmed),
            // Gone or away meanwhile: its replicas wait (away) or are dropped (unmounted).
            (WalkKind::Confirm, _) => {
                self.walks.pop_front();
                return self.walking();
            }
        };
        let (mut lost, mut freed) = (0u64, Vec::new());
        let next = self
            .objects
            .retain_some(walk.from, budget, |key, e, on_disk| {
                let goes = |r: &ReplicaLoc| {
                    r.segment_id == segment_id && confirmed.is_none_or(|c| !c.contains(&r.offset))
                };
                if let Some(v) = &mut e.current {
                    let before = v.replicas.len();
                    let size = v.size;
                    v.replicas.retain(|r| {
                        let gone = goes(r);
                        if gone {
                            freed.push((r.offset, size));
                        }
                        !gone
                    });
                    if v.replicas.len() < before && v.replicas.is_empty() {
                        indexes.version_ended(key, v.object_id, v.size, v.soft_pin_until);
                        let medium = match on_disk {
                            true => PoolMedium::Disk,
                            false => PoolMedium::Memory,
                        };
                        pool_events.ended(key, medium);
                        e.current = None;
                        lost += 1;
                    }
                }
                // An unfinished put keeps its replicas on a rebound segment (its put end decides).
                if let (Some(p), None) = (&mut e.pending, confirmed) {
                    p.replicas.retain(|r| r.segment_id != segment_id);
                }
                e.current.is_some() || e.pending.is_some()
            });
        if let Some(seg) = self.segments.get_mut(segment_id) {
            for (offset, size) in freed {
                seg.alloc.release(offset, size);
            }
        }
        // Counted as they go: a walk cut short (its segment mounted again) keeps its count.
        match walk.kind {
            WalkKind::Drop => self.counters.dropped_objects += lost,
            WalkKind::Confirm => self.counters.lost_objects += lost,
        }
        let lost = walk.lost + lost;
        if let Some(at) = next {
            if let Some(front) = self.walks.front_mut() {
                front.from = at;
                front.lost = lost;
            }
            return true;
        }
        self.walks.pop_front();
        match walk.kind {
            WalkKind::Drop => {
                tracing::info!(
                    segment_id,
                    dropped_objects = lost,
                    "unmounted segment's replicas dropped"
                );
            }
            WalkKind::Confirm => {
                if let Some(seg) = self.segments.get_mut(segment_id) {
                    let confirmed = match &seg.state {
                        SegState::Recovering { confirmed, .. } => confirmed.len(),
                        _ => 0,
                    };
                    seg.state = SegState::Live;
                    tracing::info!(segment = %seg.info.name, rebind = true, confirmed, lost,
                        "segment recovered and live");
                }
            }
        }
        self.walking()
    }

    /// The live segments, for clients.
    pub fn list_segments(&self) -> Vec<SegmentEntry> {
        self.segments.list()
    }

    /// Every segment mounted.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.iter()
    }
}
