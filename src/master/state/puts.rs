//! The put path: a put starts (replicas allocated, a pending version no reader sees), ends
//! (the pending version becomes the key's value at once) or is revoked; a reservation is
//! allocated ahead and committed under a key in one round trip.

use super::placement::{self, Candidate};
use super::{fail, table_full, MasterState, OpResult};
use crate::master::state::objects::{Pending, Version};
use crate::transfer::message::{PutStartResp, ReplicaLoc, ReplicateConfig, StoredObject};
use crate::transfer::Status;
use std::time::{Duration, Instant};

impl MasterState {
    fn check_key(key: &str) -> OpResult<()> {
        if key.is_empty() {
            return fail(Status::InvalidParams, "empty key");
        }
        Ok(())
    }

    /// Starts a put: allocates `replica_num` replicas on distinct segments (fewer when fewer
    /// segments have room, at least one) and records a pending version.
    /// A started put as its client gets it: with the master's grant for each replica, which
    /// its store checks before it takes the bytes (`transfer::grant`).
    pub fn granted(
        &self,
        size: u64,
        (object_id, replicas): (u64, Vec<ReplicaLoc>),
    ) -> PutStartResp {
        let grants = self.segments.grants(object_id, &replicas, size);
        PutStartResp {
            object_id,
            replicas,
            grants,
        }
    }

    /// A put begins: `key`'s replicas of `size` bytes placed by `config` and reserved for
    /// `client_id`; answers its object id and replicas.
    pub fn put_start(
        &mut self,
        client_id: u64,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        now: Instant,
    ) -> OpResult<(u64, Vec<ReplicaLoc>)> {
        Self::check_key(key)?;
        self.admit_put(key, size)?;
        self.preempt_pending(key, now)?;
        self.objects.make_room().map_err(table_full)?;
        let p = self.start_version(client_id, size, config, true, now)?;
        let answer = (p.object_id, p.replicas.clone());
        self.indexes
            .pending_began(key, p.started, p.object_id, p.size);
        self.objects.get_or_insert(key).map_err(table_full)?.pending = Some(Box::new(p));
        Ok(answer)
    }

    /// Fails when a put of `key` is in progress; drops one abandoned longer than the discard
    /// timeout (its space waits for the release timeout: its writer may still be writing).
    fn preempt_pending(&mut self, key: &str, now: Instant) -> OpResult<()> {
        if let Some(p) = self.objects.get(key).and_then(|e| e.pending.as_ref()) {
            let age = now.saturating_duration_since(p.started);
            if age < self.cfg.put_start_discard_timeout_ms.0 {
                return fail(
                    Status::PutInProgress,
                    format!(
                        "a put of {key:?} started {} ms ago is not finished",
                        age.as_millis()
                    ),
                );
            }
            self.drop_pending(key, now, true);
            self.counters.reclaimed_puts += 1;
        }
        Ok(())
    }

    /// Allocates the replicas of a new version of `size` bytes (evicting when the pool is
    /// full, if `may_evict`) and draws its version; the caller records it as a pending put or a
    /// reservation.
    fn start_version(
        &mut self,
        client_id: u64,
        size: u64,
        config: &ReplicateConfig,
        may_evict: bool,
        now: Instant,
    ) -> OpResult<Pending> {
        if size == 0 {
            return fail(Status::InvalidParams, "empty value");
        }
        // replica_num 0 is the default: one replica.
        let config = &ReplicateConfig {
            replica_num: config.replica_num.max(1),
            ..config.clone()
        };
        let largest = self
            .segments
            .live_memory()
            .filter(|s| s.reachable_by(config.reach) && !self.hand_overs.closed(s.id))
            .map(|s| s.alloc.capacity())
            .max()
            .unwrap_or(0);
        if largest == 0 {
            return fail(Status::NoSpace, "no segment is mounted");
        }
        if size > largest {
            return fail(
                Status::ValueTooLarge,
                format!(
                    "value of {size} bytes is larger than the largest segment ({largest} bytes)"
                ),
            );
        }
        let soft_pin_ttl = if config.soft_pin {
            let ttl = if config.soft_pin_ttl_ms == 0 {
                self.cfg.default_kv_soft_pin_ttl_ms.0
            } else {
                Duration::from_millis(config.soft_pin_ttl_ms)
            };
            Some(ttl.min(self.cfg.max_kv_soft_pin_ttl_ms.0))
        } else {
            None
        };
        self.clients.touch(client_id, now);
        let mut replicas = self.allocate(size, config);
        if replicas.is_empty() && !may_evict {
            return fail(Status::NoSpace, format!("no segment has {size} free bytes"));
        }
        if replicas.is_empty() {
            self.counters.alloc_failures += 1;
            let need = size * config.replica_num as u64;
            self.evict(now, need);
            replicas = self.allocate(size, config);
        }
        if replicas.is_empty() {
            self.force_eviction = true;
            return fail(
                Status::NoSpace,
                format!("no segment has {size} free bytes, even after eviction"),
            );
        }
        if replicas.len() < config.replica_num as usize {
            self.counters.partial_allocations += 1;
        }
        // Keep usage under the watermark at every step, not only at the next housekeeping tick.
        let (used, capacity) = self.segments.used_and_capacity();
        if used as f64 > self.cfg.eviction_high_watermark_ratio * capacity as f64 {
            self.evict(now, 0);
        }
        Ok(Pending {
            object_id: self.next_version(),
            client_id,
            size,
            replicas,
            started: now,
            soft_pin_ttl,
            hashed_early: None,
        })
    }

    /// Reserves space for a client's next puts, one per size: allocated and versioned now,
    /// given a key by the put's commit (`put_end` with the reservation's object id). A client
    /// holds at most `put_reservation_max_bytes`; reservations are off with a zero TTL.
    pub fn reserve(
        &mut self,
        client_id: u64,
        sizes: &[u64],
        config: &ReplicateConfig,
        now: Instant,
    ) -> Vec<OpResult<(u64, Vec<ReplicaLoc>)>> {
        let ttl = self.cfg.put_reservation_ttl_ms.0;
        let cap = self.cfg.put_reservation_max_bytes.0;
        sizes
            .iter()
            .map(|&size| {
                if ttl.is_zero() {
                    return fail(Status::InvalidParams, "put reservations are off");
                }
                let copies = u64::from(config.replica_num.max(1));
                let held = self.reservations.held_by(client_id);
                if held.saturating_add(size.saturating_mul(copies)) > cap {
                    return fail(
                        Status::NoSpace,
                        format!("this client holds {held} bytes of reservations (most {cap})"),
                    );
                }
                // Nothing is evicted for space that may go unused: the put that needs it will.
                let p = self.start_version(client_id, size, config, false, now)?;
                let answer = (p.object_id, p.replicas.clone());
                self.reservations.insert(p);
                Ok(answer)
            })
            .collect()
    }

    fn allocate(&mut self, size: u64, config: &ReplicateConfig) -> Vec<ReplicaLoc> {
        let candidates: Vec<Candidate<'_>> = self
            .segments
            .live_memory()
            .filter(|s| {
                s.reachable_by(config.reach)
                    && s.alloc.largest_free() >= size
                    && !self.hand_overs.closed(s.id)
            })
            .map(|s| Candidate {
                id: s.id,
                name: &s.info.name,
                capacity: s.alloc.capacity(),
                free: s.alloc.free(),
            })
            .collect();
        let order = placement::order(
            &candidates,
            &config.preferred_segment,
            self.cfg.allocation_strategy,
            &mut self.rng,
        );
        let mut replicas = Vec::with_capacity(config.replica_num as usize);
        for id in order {
            if replicas.len() == config.replica_num as usize {
                break;
            }
            let seg = self.segments.get_mut(id).expect("candidate is mounted");
            if let Some(offset) = seg.alloc.alloc(size) {
                replicas.push(ReplicaLoc {
                    segment_id: id,
                    offset,
                });
            }
        }
        replicas
    }

    /// Removes the pending version of `key`; `zombie` keeps its space until the release timeout
    /// (its writer may still be writing).
    pub(super) fn drop_pending(&mut self, key: &str, now: Instant, zombie: bool) {
        let Some(entry) = self.objects.get_mut(key) else {
            return;
        };
        let Some(p) = entry.pending.take() else {
            return;
        };
        self.indexes
            .pending_ended(key, p.started, p.object_id, p.size);
        if entry.current.is_none() {
            self.objects.remove(key);
        }
        let until = if zombie {
            p.started + self.cfg.put_start_release_timeout_ms.0
        } else {
            now
        };
        self.release(&p.replicas, p.size, p.object_id, until, now);
    }

    /// Finishes a put: the pending version becomes current. Idempotent for the same object id.
    /// `checksum`: the value's CRC-32C, `None` when nothing took one (`PutEndReq::unhashed`).
    pub fn put_end(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        checksum: Option<u32>,
        now: Instant,
    ) -> OpResult<()> {
        let pending_here = self
            .objects
            .get(key)
            .and_then(|e| e.pending.as_ref())
            .is_some_and(|p| p.object_id == object_id);
        if !pending_here && self.reservations.get(object_id).is_some() {
            return self.commit_reservation(client_id, key, object_id, checksum, now);
        }
        let entry = match self.objects.get_mut(key) {
            Some(e) => e,
            None => {
                return fail(
                    Status::ObjectNotFound,
                    format!("no put of {key:?} in progress"),
                )
            }
        };
        match &entry.pending {
            Some(p) if p.object_id == object_id => {
                if p.client_id != client_id {
                    return fail(
                        Status::IllegalClient,
                        "only the client that started a put may end it",
                    );
                }
                if p.replicas.is_empty() {
                    self.indexes
                        .pending_ended(key, p.started, p.object_id, p.size);
                    entry.pending = None;
                    if entry.current.is_none() {
                        self.objects.remove(key);
                    }
                    return fail(
                        Status::ReplicaNotReady,
                        "every replica's segment went away during the put",
                    );
                }
            }
            _ => {
                if entry
                    .current
                    .as_ref()
                    .is_some_and(|c| c.object_id == object_id)
                {
                    return Ok(());
                }
                return fail(
                    Status::WriteSuperseded,
                    format!("put {object_id} of {key:?} was reclaimed or replaced"),
                );
            }
        }
        let p = entry.pending.take().expect("matched above");
        self.indexes
            .pending_ended(key, p.started, p.object_id, p.size);
        self.install(key, *p, checksum, now)
    }

    /// A written put becomes the key's current version; the one it replaces is released when
    /// its read leases end.
    fn install(
        &mut self,
        key: &str,
        p: Pending,
        checksum: Option<u32>,
        now: Instant,
    ) -> OpResult<()> {
        // A new key needs room in the object table, found before anything changes: a put
        // refused here frees its space at once.
        if self.objects.get(key).is_none() {
            if let Err(e) = self.objects.make_room() {
                self.release(&p.replicas, p.size, p.object_id, now, now);
                return Err(table_full(e));
            }
        }
        if checksum.is_none() && p.hashed_early.is_some() {
            self.counters.hashed_later += 1;
        }
        let checksum = checksum.or(p.hashed_early);
        let new = Version {
            object_id: p.object_id,
            size: p.size,
            checksum: checksum.unwrap_or(0),
            unhashed: checksum.is_none(),
            replicas: p.replicas.into_iter().collect(),
            last_access: now,
            lease_until: now,
            soft_pin_until: p.soft_pin_ttl.map(|ttl| now + ttl),
            disk_hits: 0,
        };
        self.indexes
            .version_began(key, new.object_id, new.size, new.soft_pin_until);
        let entry = self.objects.touch_or_insert(key).map_err(table_full)?;
        let replaced = entry.current.replace(new);
        let medium = self.medium_of(key);
        self.pool_events.began(key, medium);
        if let Some(old) = replaced {
            self.indexes
                .version_ended(key, old.object_id, old.size, old.soft_pin_until);
            self.pool_events.ended(key, medium);
            let until = old.lease_until;
            self.release(&old.replicas, old.size, old.object_id, until, now);
        }
        self.forgets.wait_for_retired(key);
        Ok(())
    }

    /// Commits a put written into a reservation: it becomes `key`'s value unless a put of the
    /// key is in progress or a newer version of it was committed meanwhile (the reservation's
    /// version was drawn before that one's: a restarted master would let the newer win). Either
    /// way the reservation is used up; the client puts again without one.
    fn commit_reservation(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        checksum: Option<u32>,
        now: Instant,
    ) -> OpResult<()> {
        match self.reservations.get(object_id) {
            Some(r) if r.client_id != client_id => {
                return fail(
                    Status::IllegalClient,
                    "only the client that holds a reservation may commit it",
                )
            }
            Some(_) => {}
            None => {
                return fail(
                    Status::ObjectNotFound,
                    format!("reservation {object_id} expired or is unknown"),
                )
            }
        }
        let r = self.reservations.remove(object_id).expect("checked above");
        let newer = self
            .objects
            .get(key)
            .and_then(|e| e.current.as_ref())
            .map_or(0, |c| c.object_id)
            .max(object_id);
        let refusal = if let Err(e) = Self::check_key(key) {
            Some(e)
        } else if r.replicas.is_empty() {
            Some((
                Status::ReplicaNotReady,
                "every replica's segment went away during the put".to_owned(),
            ))
        } else if let Err(e) = self.admit_put(key, r.size) {
            Some(e)
        } else if let Err(e) = self.preempt_pending(key, now) {
            Some(e)
        } else if newer > object_id {
            Some((
                Status::WriteSuperseded,
                format!(
                    "{key:?} got version {newer} after reservation {object_id} was made; put again"
                ),
            ))
        } else {
            None
        };
        if let Some(e) = refusal {
            // The client wrote and finished writing: the space is free at once.
            self.release(&r.replicas, r.size, r.object_id, now, now);
            return Err(e);
        }
        self.install(key, r, checksum, now)?;
        self.counters.reserved_puts += 1;
        Ok(())
    }

    /// `client_id` gives up its put of `key` (object `object_id`): the reservation and its
    /// space go.
    pub fn put_revoke(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        now: Instant,
    ) -> OpResult<()> {
        if let Some(r) = self.reservations.get(object_id) {
            if r.client_id != client_id {
                return fail(
                    Status::IllegalClient,
                    "only the client that holds a reservation may revoke it",
                );
            }
            let r = self.reservations.remove(object_id).expect("checked above");
            self.release(&r.replicas, r.size, r.object_id, now, now);
            return Ok(());
        }
        let pending = self.objects.get(key).and_then(|e| e.pending.as_ref());
        match pending {
            Some(p) if p.object_id == object_id && p.client_id == client_id => {
                self.drop_pending(key, now, false);
                Ok(())
            }
            Some(p) if p.object_id == object_id => fail(
                Status::IllegalClient,
                "only the client that started a put may revoke it",
            ),
            _ => fail(
                Status::ObjectNotFound,
                format!("no put {object_id} of {key:?} in progress"),
            ),
        }
    }

    /// A store's checksums for objects it recorded unhashed (`OBJECTS_HASHED`): each goes to
    /// the version it names when that version is current, still unhashed, of that size and
    /// has a replica at that offset of the store's segment, or is kept for it when it is the
    /// put still ending (the store's hash overtook the commit); anything else is ignored (the
    /// object was replaced or removed meanwhile). A second replica that hashes differently
    /// leaves the version unhashed: which of them holds the value written cannot be told.
    pub fn objects_hashed(
        &mut self,
        client_id: u64,
        segment_id: u64,
        objects: Vec<StoredObject>,
    ) -> OpResult<()> {
        self.segment_of(client_id, segment_id)?;
        let here = |replicas: &[ReplicaLoc], o: &StoredObject| {
            replicas
                .iter()
                .any(|r| r.segment_id == segment_id && r.offset == o.offset)
        };
        for o in objects {
            let Some(entry) = self.objects.get_mut(&o.key) else {
                continue;
            };
            // The store may hash faster than the put's end reaches the commit.
            if let Some(p) = entry
                .pending
                .as_mut()
                .filter(|p| p.object_id == o.version && p.size == o.size && here(&p.replicas, &o))
            {
                p.hashed_early.get_or_insert(o.checksum);
                continue;
            }
            let Some(v) = entry.current.as_mut() else {
                continue;
            };
            if v.object_id != o.version || v.size != o.size || !here(&v.replicas, &o) {
                continue;
            }
            if v.unhashed {
                v.checksum = o.checksum;
                v.unhashed = false;
                self.counters.hashed_later += 1;
            } else if !v.unhashed && v.checksum != o.checksum {
                tracing::warn!(key = %o.key, segment_id, "a replica hashes differently from \
                    another; the object stays unhashed");
                v.unhashed = true;
                self.counters.hash_mismatches += 1;
            }
        }
        Ok(())
    }
}
