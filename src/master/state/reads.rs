//! Reads and removals: where to read a key (granting a read lease), whether it exists, a
//! replica a reader found corrupt, removing one key or all, and lookups for the admin API.

use super::{fail, MasterState, OpResult, Segment};
use crate::master::state::objects::Entry;
use crate::master::tenants;
use crate::transfer::message::{ObjectDesc, ReplicaLoc};
use crate::transfer::Status;
use std::time::Instant;

impl MasterState {
    /// Where to read `key`; grants a read lease of `default_kv_lease_ttl` and counts as an access.
    /// A read of an object that lives only on disk may promote it (`promotion_on_hit`).
    pub fn get_replicas(&mut self, key: &str, now: Instant) -> OpResult<ObjectDesc> {
        if let Some(e) = self.unserved(key) {
            return Err(e);
        }
        let lease = self.cfg.default_kv_lease_ttl_ms.0;
        let unsure = self.unsure_of_misses(now);
        let segments = &self.segments;
        let (desc, on_disk) = match self.objects.touch_tiered(key) {
            Some((
                Entry {
                    current: Some(v), ..
                },
                on_disk,
            )) => {
                let replicas: Vec<ReplicaLoc> = v
                    .replicas
                    .iter()
                    .filter(|r| segments.is_live(r.segment_id))
                    .cloned()
                    .collect();
                if replicas.is_empty() {
                    // Every replica's store left for good: gone, even if its record is still
                    // being dropped.
                    if !v.replicas.iter().any(|r| segments.contains(r.segment_id)) {
                        return fail(Status::ObjectNotFound, format!("{key:?} not found"));
                    }
                    return fail(
                        Status::ObjectUnavailable,
                        format!("{key:?} is on a store that is restarting"),
                    );
                }
                v.last_access = now;
                v.lease_until = v.lease_until.max(now + lease);
                if on_disk {
                    v.disk_hits = v.disk_hits.saturating_add(1);
                }
                let desc = ObjectDesc {
                    size: v.size,
                    checksum: v.checksum,
                    lease_ttl_ms: lease.as_millis() as u64,
                    version: v.object_id,
                    replicas,
                    unhashed: v.unhashed,
                };
                (desc, on_disk)
            }
            Some((
                Entry {
                    current: None,
                    pending: Some(_),
                },
                _,
            )) => {
                return fail(
                    Status::ReplicaNotReady,
                    format!("{key:?} is still being written"),
                )
            }
            _ => {
                return match unsure {
                    Some(why) => fail(
                        Status::ObjectUnavailable,
                        format!("{key:?} is not known yet: {why}"),
                    ),
                    None => fail(Status::ObjectNotFound, format!("{key:?} not found")),
                }
            }
        };
        if on_disk {
            self.counters.disk_hits += 1;
            self.maybe_promote(key, &desc.replicas);
        }
        Ok(desc)
    }

    /// A read of disk-only `key` (its live replicas `replicas`): promote it once it has been
    /// read `promotion_admission_threshold` times.
    fn maybe_promote(&mut self, key: &str, replicas: &[ReplicaLoc]) {
        if !self.cfg.promotion_on_hit {
            return;
        }
        let hits = self
            .objects
            .get(key)
            .and_then(|e| e.current.as_ref())
            .map_or(0, |v| u32::from(v.disk_hits));
        if hits < self.cfg.promotion_admission_threshold {
            return;
        }
        if let Some(from) = replicas.iter().find(|r| self.segments.is_disk(r)) {
            self.promote(key, from.clone());
        }
    }

    /// Whether `key` has a readable value (a replica on a live segment); counts as an access.
    pub fn exists(&mut self, key: &str, now: Instant) -> bool {
        let segments = &self.segments;
        match self.objects.touch(key).and_then(|e| e.current.as_mut()) {
            Some(v) if v.replicas.iter().any(|r| segments.is_live(r.segment_id)) => {
                v.last_access = now;
                true
            }
            _ => false,
        }
    }

    /// A reader found the replica of `key` (version `version`) on `segment_id` corrupt: the
    /// replica is dropped (the object too when it was the last one).
    pub fn report_corrupt(&mut self, key: &str, version: u64, segment_id: u64, now: Instant) {
        let medium = self.medium_of(key);
        let Some(entry) = self.objects.get_mut(key) else {
            return;
        };
        let Some(v) = entry.current.as_mut() else {
            return;
        };
        if v.object_id != version {
            return;
        }
        let Some(pos) = v.replicas.iter().position(|r| r.segment_id == segment_id) else {
            return;
        };
        let r = v.replicas.remove(pos);
        let size = v.size;
        if v.replicas.is_empty() {
            self.indexes
                .version_ended(key, v.object_id, v.size, v.soft_pin_until);
            self.pool_events.ended(key, medium);
            entry.current = None;
            if entry.pending.is_none() {
                self.objects.remove(key);
            }
        }
        self.counters.corrupt_replicas += 1;
        tracing::warn!(
            key,
            segment_id,
            offset = r.offset,
            "replica failed its checksum; dropped"
        );
        self.release(&[r], size, version, now, now);
    }

    /// Removes `key`. Refused while a read lease runs unless `force`, which frees the space at
    /// once. A key with only an unfinished put is refused unless
    /// `force`, which revokes the put.
    pub fn remove(&mut self, key: &str, force: bool, now: Instant) -> OpResult<()> {
        if let Some(e) = self.unserved(key) {
            return Err(e);
        }
        let medium = self.medium_of(key);
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
                self.indexes
                    .version_ended(key, v.object_id, v.size, v.soft_pin_until);
                self.pool_events.ended(key, medium);
                if entry.pending.is_none() {
                    self.objects.remove(key);
                }
                // Forced or not, the space is free now: a reader still under the lease fails the
                // checksum and sees a miss, never another object's bytes.
                self.release(&v.replicas, v.size, v.object_id, now, now);
                // A put of the key that ends while these forgets are under way must wait for
                // them too, or a reader of a cached location could see this value after it.
                self.forgets.retired(key, now);
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

    /// Removes every readable object of `tenant` (leased ones only with `force`); returns how
    /// many.
    pub fn remove_all(&mut self, tenant: &str, force: bool, now: Instant) -> u64 {
        let keys: Vec<String> = self
            .objects
            .iter()
            .filter(|(k, e)| {
                tenants::owned_by(k, tenant).is_some()
                    && e.current
                        .as_ref()
                        .is_some_and(|v| force || v.lease_until <= now)
            })
            .map(|(k, _)| k.to_owned())
            .collect();
        let mut n = 0;
        for k in keys {
            if self.remove(&k, force, now).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// Up to `limit` of `tenant`'s readable keys starting with `prefix`, as the tenant names
    /// them, sorted, and whether more match. Stops as soon as it has `limit + 1`, so a small
    /// limit is cheap on a large pool.
    pub fn keys_with_prefix(
        &self,
        tenant: &str,
        prefix: &str,
        limit: usize,
    ) -> (Vec<String>, bool) {
        self.keys_where(tenant, |k| k.starts_with(prefix), limit)
    }

    /// Up to `limit` of `tenant`'s readable keys that `re` matches anywhere in them (as
    /// Mooncake's regex RPCs search), as the tenant names them, sorted, and whether more
    /// match.
    pub fn keys_matching(
        &self,
        tenant: &str,
        re: &regex::Regex,
        limit: usize,
    ) -> (Vec<String>, bool) {
        self.keys_where(tenant, |k| re.is_match(k), limit)
    }

    fn keys_where(
        &self,
        tenant: &str,
        wanted: impl Fn(&str) -> bool,
        limit: usize,
    ) -> (Vec<String>, bool) {
        let mut keys: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, e)| e.current.is_some())
            .filter_map(|(k, _)| tenants::owned_by(k, tenant).filter(|k| wanted(k)))
            .map(str::to_owned)
            .take(limit.saturating_add(1))
            .collect();
        let truncated = keys.len() > limit;
        keys.truncate(limit);
        keys.sort();
        (keys, truncated)
    }

    /// Warms the cache for a batch operation on `keys` (see `ObjectTable::prefetch`).
    pub fn prefetch<K: AsRef<str>>(&self, keys: &[K]) {
        self.objects.prefetch(keys);
    }

    /// An object's details for the admin API.
    /// Whether moves wait for the mover.
    pub fn has_queued_moves(&self) -> bool {
        self.moves.has_queued()
    }

    /// Whether `key`'s value lives only in a disk tier.
    pub fn on_disk_only(&self, key: &str) -> bool {
        self.objects.on_disk(key)
    }

    /// Whether version `object_id` is being copied between tiers.
    pub fn moving(&self, object_id: u64) -> bool {
        self.moves.contains(object_id)
    }

    /// `key`'s entry, without counting it as an access.
    pub fn lookup(&self, key: &str) -> Option<&Entry> {
        self.objects.get(key)
    }

    /// Segment `id`, if mounted.
    pub fn segment(&self, id: u64) -> Option<&Segment> {
        self.segments.get(id)
    }
}
