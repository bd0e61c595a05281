//! The master's state machine: clients, segments, objects, leases, pins and eviction. Every
//! operation takes `now` so that tests drive time without clocks; the RPC layer holds the lock.
//!
//! Object life cycle: `put_start` allocates replicas and records a *pending* version that no
//! reader sees; `put_end` makes it the *current* version atomically. Putting an existing key
//! replaces its value: readers see the old value until the new one is complete, then the new one,
//! never a mix; the old replicas are freed when the last read lease on them ends.

use super::allocator::Allocator;
use super::config::MasterConfig;
use super::eviction::{self, EvictionCandidate};
use super::placement::{self, Candidate};
use crate::transfer::message::{
    ObjectDesc, ReplicaLoc, ReplicateConfig, SegmentEntry, SegmentInfo,
};
use crate::transfer::Status;
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub type OpResult<T> = Result<T, (Status, String)>;

fn fail<T>(status: Status, msg: impl Into<String>) -> OpResult<T> {
    Err((status, msg.into()))
}

#[derive(Debug)]
pub struct Segment {
    pub id: u64,
    pub info: SegmentInfo,
    pub client_id: u64,
    pub alloc: Allocator,
}

#[derive(Debug)]
struct Client {
    last_seen: Instant,
    segments: Vec<u64>,
}

#[derive(Clone, Debug)]
pub struct Version {
    pub object_id: u64,
    pub size: u64,
    pub checksum: u32,
    pub replicas: Vec<ReplicaLoc>,
    pub last_access: Instant,
    pub lease_until: Instant,
    pub soft_pin_until: Option<Instant>,
}

#[derive(Clone, Debug)]
pub struct Pending {
    pub object_id: u64,
    pub client_id: u64,
    pub size: u64,
    pub replicas: Vec<ReplicaLoc>,
    pub started: Instant,
    pub soft_pin_ttl: Option<Duration>,
}

#[derive(Debug, Default)]
pub struct Entry {
    pub current: Option<Version>,
    pub pending: Option<Pending>,
}

/// Space that is no longer any object's but may still be read (a lease runs) or written (a
/// preempted writer), released at `until`.
#[derive(Debug)]
struct Deferred {
    until: Instant,
    segment_id: u64,
    offset: u64,
    size: u64,
}

/// Counters the master reports; plain integers because they change under the state lock.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Counters {
    pub evicted_objects: u64,
    pub evicted_bytes: u64,
    pub eviction_runs: u64,
    pub expired_clients: u64,
    pub dropped_objects: u64,
    pub reclaimed_puts: u64,
    pub alloc_failures: u64,
    pub partial_allocations: u64,
}

/// A summary for logs, metrics and the admin API.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    pub keys: u64,
    pub soft_pinned_keys: u64,
    pub pending_puts: u64,
    pub clients: u64,
    pub segments: u64,
    pub deferred_bytes: u64,
}

pub struct MasterState {
    cfg: MasterConfig,
    clients: HashMap<u64, Client>,
    segments: HashMap<u64, Segment>,
    segment_by_name: HashMap<String, u64>,
    objects: HashMap<String, Entry>,
    deferred: Vec<Deferred>,
    next_object_id: u64,
    rng: fastrand::Rng,
    pub counters: Counters,
    force_eviction: bool,
}

impl MasterState {
    pub fn new(cfg: MasterConfig) -> MasterState {
        MasterState {
            cfg,
            clients: HashMap::new(),
            segments: HashMap::new(),
            segment_by_name: HashMap::new(),
            objects: HashMap::new(),
            deferred: Vec::new(),
            next_object_id: 1,
            rng: fastrand::Rng::new(),
            counters: Counters::default(),
            force_eviction: false,
        }
    }

    pub fn config(&self) -> &MasterConfig {
        &self.cfg
    }

    // ---- clients and segments ----

    /// A heartbeat. Returns true when the client is unknown (new, expired, or the master
    /// restarted) and must mount its segments again.
    pub fn ping(&mut self, client_id: u64, now: Instant) -> bool {
        match self.clients.get_mut(&client_id) {
            Some(c) => {
                c.last_seen = now;
                false
            }
            None => {
                self.clients.insert(
                    client_id,
                    Client {
                        last_seen: now,
                        segments: Vec::new(),
                    },
                );
                true
            }
        }
    }

    fn touch_client(&mut self, client_id: u64, now: Instant) -> &mut Client {
        let c = self.clients.entry(client_id).or_insert(Client {
            last_seen: now,
            segments: Vec::new(),
        });
        c.last_seen = now;
        c
    }

    /// Mounts a segment. Mounting the same name again from the same client is a no-op that
    /// returns the same id; a new client mounting a name replaces the old mount (a restarted
    /// store: the name carries its listening address, which two live stores cannot share).
    pub fn mount(&mut self, client_id: u64, info: SegmentInfo, now: Instant) -> OpResult<u64> {
        if info.name.is_empty() || info.endpoint.is_empty() {
            return fail(
                Status::InvalidParams,
                "segment name and endpoint are required",
            );
        }
        if info.size < super::allocator::ALIGN {
            return fail(
                Status::InvalidParams,
                format!("segment size {} is too small", info.size),
            );
        }
        if let Some(&id) = self.segment_by_name.get(&info.name) {
            let seg = &self.segments[&id];
            if seg.client_id == client_id && seg.info.size == info.size {
                self.touch_client(client_id, now);
                return Ok(id);
            }
            tracing::warn!(segment = %info.name, old_client = seg.client_id, new_client = client_id,
                "segment mounted again by a new client; dropping the old mount");
            self.unmount_segment(id);
        }
        let mut id = self.rng.u64(1..);
        while self.segments.contains_key(&id) {
            id = self.rng.u64(1..);
        }
        tracing::info!(segment = %info.name, endpoint = %info.endpoint, size = info.size, client_id, "segment mounted");
        self.segment_by_name.insert(info.name.clone(), id);
        self.segments.insert(
            id,
            Segment {
                id,
                alloc: Allocator::new(info.size),
                info,
                client_id,
            },
        );
        self.touch_client(client_id, now).segments.push(id);
        Ok(id)
    }

    pub fn unmount(&mut self, client_id: u64, segment_id: u64) -> OpResult<()> {
        match self.segments.get(&segment_id) {
            None => fail(
                Status::SegmentNotFound,
                format!("segment {segment_id} is not mounted"),
            ),
            Some(s) if s.client_id != client_id => fail(
                Status::IllegalClient,
                format!("segment {segment_id} belongs to another client"),
            ),
            Some(_) => {
                self.unmount_segment(segment_id);
                Ok(())
            }
        }
    }

    /// Removes a segment and every replica in it; objects left without replicas are dropped.
    fn unmount_segment(&mut self, segment_id: u64) {
        let Some(seg) = self.segments.remove(&segment_id) else {
            return;
        };
        self.segment_by_name.remove(&seg.info.name);
        if let Some(c) = self.clients.get_mut(&seg.client_id) {
            c.segments.retain(|s| *s != segment_id);
        }
        self.deferred.retain(|d| d.segment_id != segment_id);
        let mut dropped = 0u64;
        self.objects.retain(|_, e| {
            if let Some(v) = &mut e.current {
                v.replicas.retain(|r| r.segment_id != segment_id);
                if v.replicas.is_empty() {
                    e.current = None;
                    dropped += 1;
                }
            }
            if let Some(p) = &mut e.pending {
                p.replicas.retain(|r| r.segment_id != segment_id);
            }
            e.current.is_some() || e.pending.is_some()
        });
        self.counters.dropped_objects += dropped;
        tracing::info!(segment = %seg.info.name, dropped_objects = dropped, "segment unmounted");
    }

    pub fn list_segments(&self) -> Vec<SegmentEntry> {
        let mut v: Vec<SegmentEntry> = self
            .segments
            .values()
            .map(|s| SegmentEntry {
                id: s.id,
                info: s.info.clone(),
                used: s.alloc.used(),
            })
            .collect();
        v.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        v
    }

    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }

    /// Drops clients whose heartbeats stopped more than `client_ttl` ago, with their segments
    /// and unfinished puts. Returns how many expired.
    pub fn expire_clients(&mut self, now: Instant) -> usize {
        let ttl = self.cfg.client_ttl_ms.0;
        let expired: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_seen) > ttl)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            let Some(client) = self.clients.remove(id) else {
                continue;
            };
            tracing::warn!(
                client_id = id,
                segments = client.segments.len(),
                "client expired"
            );
            for seg in client.segments {
                self.unmount_segment(seg);
            }
            let keys: Vec<String> = self
                .objects
                .iter()
                .filter(|(_, e)| e.pending.as_ref().is_some_and(|p| p.client_id == *id))
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                self.drop_pending(&k, now, false);
                self.counters.reclaimed_puts += 1;
            }
        }
        self.counters.expired_clients += expired.len() as u64;
        expired.len()
    }

    // ---- objects ----

    fn check_key(key: &str) -> OpResult<()> {
        if key.is_empty() {
            return fail(Status::InvalidParams, "empty key");
        }
        Ok(())
    }

    /// Starts a put: allocates `replica_num` replicas on distinct segments (fewer when fewer
    /// segments have room, at least one) and records a pending version.
    pub fn put_start(
        &mut self,
        client_id: u64,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        now: Instant,
    ) -> OpResult<(u64, Vec<ReplicaLoc>)> {
        Self::check_key(key)?;
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
            .values()
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
            // An abandoned put: its writer may still be writing, so its space waits for the
            // release timeout before reuse.
            self.drop_pending(key, now, true);
            self.counters.reclaimed_puts += 1;
        }
        self.touch_client(client_id, now);
        let mut replicas = self.allocate(size, config);
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
        let (used, capacity) = self.used_and_capacity();
        if used as f64 > self.cfg.eviction_high_watermark_ratio * capacity as f64 {
            self.evict(now, 0);
        }
        let object_id = self.next_object_id;
        self.next_object_id += 1;
        self.objects.entry(key.to_string()).or_default().pending = Some(Pending {
            object_id,
            client_id,
            size,
            replicas: replicas.clone(),
            started: now,
            soft_pin_ttl,
        });
        Ok((object_id, replicas))
    }

    fn allocate(&mut self, size: u64, config: &ReplicateConfig) -> Vec<ReplicaLoc> {
        let candidates: Vec<Candidate<'_>> = self
            .segments
            .values()
            .filter(|s| s.alloc.largest_free() >= size)
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
            let seg = self.segments.get_mut(&id).expect("candidate is mounted");
            if let Some(offset) = seg.alloc.alloc(size) {
                replicas.push(ReplicaLoc {
                    segment_id: id,
                    offset,
                });
            }
        }
        replicas
    }

    fn release(&mut self, replicas: &[ReplicaLoc], size: u64, until: Instant, now: Instant) {
        for r in replicas {
            if until > now {
                self.deferred.push(Deferred {
                    until,
                    segment_id: r.segment_id,
                    offset: r.offset,
                    size,
                });
            } else if let Some(seg) = self.segments.get_mut(&r.segment_id) {
                seg.alloc.release(r.offset, size);
            }
        }
    }

    /// Removes the pending version of `key`; `zombie` keeps its space until the release timeout
    /// (its writer may still be writing).
    fn drop_pending(&mut self, key: &str, now: Instant, zombie: bool) {
        let Some(entry) = self.objects.get_mut(key) else {
            return;
        };
        let Some(p) = entry.pending.take() else {
            return;
        };
        if entry.current.is_none() {
            self.objects.remove(key);
        }
        let until = if zombie {
            p.started + self.cfg.put_start_release_timeout_ms.0
        } else {
            now
        };
        self.release(&p.replicas, p.size, until, now);
    }

    /// Finishes a put: the pending version becomes current. Idempotent for the same object id.
    pub fn put_end(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        checksum: u32,
        now: Instant,
    ) -> OpResult<()> {
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
        let new = Version {
            object_id,
            size: p.size,
            checksum,
            replicas: p.replicas,
            last_access: now,
            lease_until: now,
            soft_pin_until: p.soft_pin_ttl.map(|ttl| now + ttl),
        };
        if let Some(old) = entry.current.replace(new) {
            let until = old.lease_until;
            self.release(&old.replicas, old.size, until, now);
        }
        Ok(())
    }

    pub fn put_revoke(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        now: Instant,
    ) -> OpResult<()> {
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

    /// Where to read `key`; grants a read lease of `default_kv_lease_ttl` and counts as an access.
    pub fn get_replicas(&mut self, key: &str, now: Instant) -> OpResult<ObjectDesc> {
        let lease = self.cfg.default_kv_lease_ttl_ms.0;
        match self.objects.get_mut(key) {
            Some(Entry {
                current: Some(v), ..
            }) => {
                v.last_access = now;
                v.lease_until = v.lease_until.max(now + lease);
                Ok(ObjectDesc {
                    size: v.size,
                    checksum: v.checksum,
                    lease_ttl_ms: lease.as_millis() as u64,
                    replicas: v.replicas.clone(),
                })
            }
            Some(Entry {
                current: None,
                pending: Some(_),
            }) => fail(
                Status::ReplicaNotReady,
                format!("{key:?} is still being written"),
            ),
            _ => fail(Status::ObjectNotFound, format!("{key:?} not found")),
        }
    }

    /// Whether `key` has a readable value; counts as an access (no lease).
    pub fn exists(&mut self, key: &str, now: Instant) -> bool {
        match self.objects.get_mut(key).and_then(|e| e.current.as_mut()) {
            Some(v) => {
                v.last_access = now;
                true
            }
            None => false,
        }
    }

    /// Removes `key`. Refused while a read lease runs unless `force`, which frees the space at
    /// once. A key with only an unfinished put is refused unless
    /// `force`, which revokes the put.
    pub fn remove(&mut self, key: &str, force: bool, now: Instant) -> OpResult<()> {
        let Some(entry) = self.objects.get_mut(key) else {
            return fail(Status::ObjectNotFound, format!("{key:?} not found"));
        };
        match &entry.current {
            Some(v) if v.lease_until > now && !force => {
                let left = v.lease_until.saturating_duration_since(now).as_millis();
                fail(
                    Status::ObjectHasLease,
                    format!("{key:?} has a read lease for {left} more ms"),
                )
            }
            Some(_) => {
                let v = entry.current.take().expect("matched");
                if entry.pending.is_none() {
                    self.objects.remove(key);
                }
                // Forced or not, the space is free now: a reader still under the lease fails the
                // checksum and sees a miss, never another object's bytes.
                self.release(&v.replicas, v.size, now, now);
                Ok(())
            }
            None if force => {
                self.drop_pending(key, now, true);
                Ok(())
            }
            None => fail(
                Status::ReplicaNotReady,
                format!("{key:?} is still being written"),
            ),
        }
    }

    /// Removes every readable object (leased ones only with `force`); returns how many.
    pub fn remove_all(&mut self, force: bool, now: Instant) -> u64 {
        let keys: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, e)| {
                e.current
                    .as_ref()
                    .is_some_and(|v| force || v.lease_until <= now)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut n = 0;
        for k in keys {
            if self.remove(&k, force, now).is_ok() {
                n += 1;
            }
        }
        n
    }

    // ---- eviction and housekeeping ----

    pub fn summary(&self, now: Instant) -> Summary {
        let mut s = Summary {
            clients: self.clients.len() as u64,
            segments: self.segments.len() as u64,
            deferred_bytes: self
                .deferred
                .iter()
                .map(|d| super::allocator::aligned(d.size))
                .sum(),
            ..Summary::default()
        };
        for seg in self.segments.values() {
            s.used_bytes += seg.alloc.used();
            s.capacity_bytes += seg.alloc.capacity();
        }
        for e in self.objects.values() {
            if let Some(v) = &e.current {
                s.keys += 1;
                if v.soft_pin_until.is_some_and(|t| t > now) {
                    s.soft_pinned_keys += 1;
                }
            }
            if e.pending.is_some() {
                s.pending_puts += 1;
            }
        }
        s
    }

    fn used_and_capacity(&self) -> (u64, u64) {
        self.segments.values().fold((0, 0), |(u, c), s| {
            (u + s.alloc.used(), c + s.alloc.capacity())
        })
    }

    /// Evicts least-recently-used objects, if usage is over the high watermark (or an allocation
    /// failed since the last run), down to `(watermark − ratio) × capacity`, and at least
    /// `at_least` bytes. Returns the bytes freed.
    pub fn evict(&mut self, now: Instant, at_least: u64) -> u64 {
        let (used, capacity) = self.used_and_capacity();
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
        let candidates: Vec<EvictionCandidate<'_>> = self
            .objects
            .iter()
            .filter_map(|(k, e)| {
                let v = e.current.as_ref()?;
                if v.lease_until > now {
                    return None;
                }
                Some(EvictionCandidate {
                    key: k,
                    last_access: v.last_access,
                    bytes: super::allocator::aligned(v.size) * v.replicas.len() as u64,
                    soft_pinned: v.soft_pin_until.is_some_and(|t| t > now),
                })
            })
            .collect();
        let victims: Vec<String> = eviction::select(candidates, need)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut freed = 0;
        for k in &victims {
            let Some(entry) = self.objects.get_mut(k) else {
                continue;
            };
            let Some(v) = entry.current.take() else {
                continue;
            };
            if entry.pending.is_none() {
                self.objects.remove(k);
            }
            freed += super::allocator::aligned(v.size) * v.replicas.len() as u64;
            self.release(&v.replicas, v.size, now, now);
        }
        self.counters.eviction_runs += 1;
        self.counters.evicted_objects += victims.len() as u64;
        self.counters.evicted_bytes += freed;
        if !victims.is_empty() {
            tracing::info!(
                objects = victims.len(),
                bytes = freed,
                "evicted least recently used objects"
            );
        }
        freed
    }

    /// Periodic work: expire clients, release deferred space, reclaim abandoned puts, evict.
    pub fn housekeeping(&mut self, now: Instant) {
        self.expire_clients(now);
        let mut i = 0;
        while i < self.deferred.len() {
            if self.deferred[i].until <= now {
                let d = self.deferred.swap_remove(i);
                if let Some(seg) = self.segments.get_mut(&d.segment_id) {
                    seg.alloc.release(d.offset, d.size);
                }
            } else {
                i += 1;
            }
        }
        let release = self.cfg.put_start_release_timeout_ms.0;
        let stale: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, e)| {
                e.pending
                    .as_ref()
                    .is_some_and(|p| now.saturating_duration_since(p.started) > release)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.drop_pending(&k, now, false);
            self.counters.reclaimed_puts += 1;
        }
        self.evict(now, 0);
    }

    /// An object's details for the admin API.
    pub fn lookup(&self, key: &str) -> Option<&Entry> {
        self.objects.get(key)
    }

    pub fn segment(&self, id: u64) -> Option<&Segment> {
        self.segments.get(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(name: &str, size: u64) -> SegmentInfo {
        SegmentInfo {
            name: name.into(),
            endpoint: format!("{name}:1"),
            size,
            ..Default::default()
        }
    }

    fn state() -> (MasterState, Instant) {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        st.mount(1, seg("a", 1 << 20), t0).unwrap();
        (st, t0)
    }

    const ONE: ReplicateConfig = ReplicateConfig {
        replica_num: 1,
        soft_pin: false,
        soft_pin_ttl_ms: 0,
        preferred_segment: String::new(),
    };

    #[test]
    fn a_put_is_invisible_until_it_ends_and_replaces_atomically() {
        let (mut st, t0) = state();
        let (id1, _) = st.put_start(7, "k", 100, &ONE, t0).unwrap();
        assert_eq!(
            st.get_replicas("k", t0).unwrap_err().0,
            Status::ReplicaNotReady
        );
        assert!(!st.exists("k", t0));
        st.put_end(7, "k", id1, 11, t0).unwrap();
        assert_eq!(st.get_replicas("k", t0).unwrap().checksum, 11);
        // A second put: readers keep seeing the first value until it ends.
        let (id2, _) = st.put_start(7, "k", 200, &ONE, t0).unwrap();
        assert_eq!(st.get_replicas("k", t0).unwrap().size, 100);
        assert_eq!(
            st.put_end(8, "k", id2, 22, t0).unwrap_err().0,
            Status::IllegalClient
        );
        st.put_end(7, "k", id2, 22, t0).unwrap();
        let d = st.get_replicas("k", t0).unwrap();
        assert_eq!((d.size, d.checksum), (200, 22));
        st.put_end(7, "k", id2, 22, t0).unwrap(); // idempotent
    }

    #[test]
    fn abandoned_puts_are_preempted_then_reclaimed() {
        let (mut st, t0) = state();
        let (id, _) = st.put_start(7, "k", 1000, &ONE, t0).unwrap();
        assert_eq!(
            st.put_start(8, "k", 1000, &ONE, t0).unwrap_err().0,
            Status::PutInProgress
        );
        let later = t0 + Duration::from_secs(31);
        let (id2, _) = st.put_start(8, "k", 1000, &ONE, later).unwrap();
        assert_eq!(
            st.put_end(7, "k", id, 1, later).unwrap_err().0,
            Status::WriteSuperseded
        );
        st.put_end(8, "k", id2, 1, later).unwrap();
        // The zombie's space is held until the release timeout, then freed.
        assert_eq!(st.summary(later).deferred_bytes, 1024);
        let t = t0 + Duration::from_secs(601);
        st.ping(1, t); // the store stays alive
        st.housekeeping(t);
        assert_eq!(st.summary(t).deferred_bytes, 0);
        // A writer that stops heartbeating loses its unfinished put at expiry.
        st.ping(9, t);
        st.put_start(9, "z", 10, &ONE, t).unwrap();
        st.ping(1, t + Duration::from_secs(11));
        st.expire_clients(t + Duration::from_secs(11));
        assert!(st.lookup("z").is_none());
    }

    #[test]
    fn leases_and_removal() {
        let (mut st, t0) = state();
        let (id, _) = st.put_start(7, "k", 10, &ONE, t0).unwrap();
        st.put_end(7, "k", id, 0, t0).unwrap();
        st.get_replicas("k", t0).unwrap();
        assert_eq!(
            st.remove("k", false, t0).unwrap_err().0,
            Status::ObjectHasLease
        );
        assert_eq!(st.remove_all(false, t0), 0);
        assert_eq!(
            st.remove_all(false, t0 + Duration::from_secs(11)),
            1,
            "lease over"
        );
        assert_eq!(
            st.remove("k", false, t0).unwrap_err().0,
            Status::ObjectNotFound
        );
        assert_eq!(st.summary(t0).used_bytes, 0);
    }

    #[test]
    fn full_pool_evicts_for_a_new_put_but_never_leased_objects() {
        // Watermark 1.0: only a failed allocation triggers eviction here.
        let cfg = MasterConfig {
            eviction_high_watermark_ratio: 1.0,
            ..MasterConfig::default()
        };
        let mut st = MasterState::new(cfg);
        let t0 = Instant::now();
        st.mount(1, seg("a", 1 << 20), t0).unwrap();
        for i in 0..16 {
            let key = format!("k{i}");
            let (id, _) = st.put_start(7, &key, 64 << 10, &ONE, t0).unwrap();
            st.put_end(7, &key, id, 0, t0).unwrap();
        }
        // Everything is leased: no room, no eviction.
        for i in 0..16 {
            st.get_replicas(&format!("k{i}"), t0).unwrap();
        }
        assert_eq!(
            st.put_start(7, "new", 64 << 10, &ONE, t0).unwrap_err().0,
            Status::NoSpace
        );
        let later = t0 + Duration::from_secs(11);
        st.put_start(7, "new", 64 << 10, &ONE, later).unwrap();
        assert!(st.counters.evicted_objects >= 1);
    }
}
