//! Where objects are, as this client last learnt it (from a get's answer or from its own put),
//! so that the next get of the same key reads from the store in one round trip instead of
//! asking the master first.
//!
//! A location is only a hint. The store answers it (`READ_VERSION`) only while it still records
//! that object version at that offset and its read lease from the master runs, and the value's
//! CRC-32C is checked as on every read; on any refusal or failure the client forgets the entry
//! and asks the master. Entries are used for at most `ttl`, so that the master's LRU still
//! hears of objects in use now and then, and at most `capacity` are kept.

use crate::transfer::message::ObjectDesc;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where this client last saw each object, so a get can skip asking the master.
pub struct Locations {
    by_key: Mutex<HashMap<String, (Arc<ObjectDesc>, Instant)>>,
    capacity: usize,
    ttl: Duration,
}

impl Locations {
    /// `capacity` 0 keeps nothing (every get asks the master).
    pub fn new(capacity: usize, ttl: Duration) -> Locations {
        Locations {
            by_key: Mutex::new(HashMap::new()),
            capacity,
            ttl,
        }
    }

    /// The location of `key`, if known and learnt less than `ttl` before `now`.
    pub fn get(&self, key: &str, now: Instant) -> Option<Arc<ObjectDesc>> {
        if self.capacity == 0 {
            return None;
        }
        let map = self.by_key.lock();
        let (desc, learnt) = map.get(key)?;
        (now.saturating_duration_since(*learnt) < self.ttl).then(|| desc.clone())
    }

    /// Remembers where `key` is, as learnt at `learnt` (when the question was asked). When
    /// full, expired entries go first, then everything.
    pub fn insert(&self, key: &str, desc: ObjectDesc, learnt: Instant) {
        if self.capacity == 0 || desc.replicas.is_empty() {
            return;
        }
        let mut map = self.by_key.lock();
        if map.len() >= self.capacity && !map.contains_key(key) {
            let ttl = self.ttl;
            map.retain(|_, (_, t)| learnt.saturating_duration_since(*t) < ttl);
            if map.len() >= self.capacity {
                map.clear();
            }
        }
        map.insert(key.to_string(), (Arc::new(desc), learnt));
    }

    /// Forgets where `key` is.
    pub fn remove(&self, key: &str) {
        if self.capacity != 0 {
            self.by_key.lock().remove(key);
        }
    }

    /// Forgets every location.
    pub fn clear(&self) {
        self.by_key.lock().clear();
    }

    /// Keys whose location is held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.lock().len()
    }

    /// Whether no location is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::message::ReplicaLoc;

    fn desc(version: u64) -> ObjectDesc {
        ObjectDesc {
            size: 4096,
            checksum: 7,
            lease_ttl_ms: 0,
            unhashed: false,
            version,
            replicas: vec![ReplicaLoc {
                segment_id: 1,
                offset: 0,
            }],
        }
    }

    #[test]
    fn a_location_is_used_until_its_ttl_then_asked_again() {
        let l = Locations::new(8, Duration::from_secs(10));
        let t0 = Instant::now();
        l.insert("k", desc(1), t0);
        assert_eq!(l.get("k", t0 + Duration::from_secs(9)).unwrap().version, 1);
        assert!(l.get("k", t0 + Duration::from_secs(10)).is_none());
        l.insert("k", desc(2), t0 + Duration::from_secs(10));
        assert_eq!(l.get("k", t0 + Duration::from_secs(11)).unwrap().version, 2);
        l.remove("k");
        assert!(l.get("k", t0 + Duration::from_secs(11)).is_none());
    }

    #[test]
    fn a_full_cache_drops_expired_entries_first_then_everything() {
        let l = Locations::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        l.insert("old", desc(1), t0);
        l.insert("new", desc(2), t0 + Duration::from_millis(1500));
        l.insert("newer", desc(3), t0 + Duration::from_millis(1600));
        assert_eq!(l.len(), 2, "the expired entry made room");
        assert!(l.get("new", t0 + Duration::from_millis(1700)).is_some());
        l.insert("newest", desc(4), t0 + Duration::from_millis(1700));
        assert_eq!(l.len(), 1, "nothing had expired: all went");
        assert!(l.get("newest", t0 + Duration::from_millis(1700)).is_some());
    }

    #[test]
    fn a_zero_capacity_cache_keeps_nothing_and_replicaless_answers_are_not_kept() {
        let off = Locations::new(0, Duration::from_secs(10));
        let t0 = Instant::now();
        off.insert("k", desc(1), t0);
        assert!(off.get("k", t0).is_none());
        let on = Locations::new(8, Duration::from_secs(10));
        on.insert(
            "k",
            ObjectDesc {
                replicas: vec![],
                ..desc(1)
            },
            t0,
        );
        assert!(on.is_empty());
    }
}
