//! The SIMULATED engine's prefix cache: a bounded device tier (L1) and an optional host tier
//! (L2), both LRU sets of page keys. A lookup walks a request's pages from the first and stops
//! at the first page that neither tier holds (a prefix cache serves prefixes only). Pages
//! evicted from L1 move to L2, as HiCache's host pool keeps what the device drops; pages found
//! in L2 are loaded back into L1.

use std::collections::{BTreeMap, HashMap};

/// A set of keys with a capacity, evicting the least recently used.
#[derive(Debug, Default)]
pub struct Lru {
    cap: usize,
    tick: u64,
    by_key: HashMap<String, u64>,
    by_tick: BTreeMap<u64, String>,
}

impl Lru {
    pub fn new(cap: usize) -> Lru {
        Lru {
            cap,
            ..Lru::default()
        }
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// Inserts or refreshes `key`; returns the keys evicted to make room.
    pub fn insert(&mut self, key: &str) -> Vec<String> {
        self.tick += 1;
        if let Some(old) = self.by_key.insert(key.to_string(), self.tick) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(self.tick, key.to_string());
        let mut evicted = Vec::new();
        while self.by_key.len() > self.cap {
            let Some((_, k)) = self.by_tick.pop_first() else {
                break;
            };
            self.by_key.remove(&k);
            evicted.push(k);
        }
        evicted
    }

    pub fn remove(&mut self, key: &str) -> bool {
        match self.by_key.remove(key) {
            Some(t) => {
                self.by_tick.remove(&t);
                true
            }
            None => false,
        }
    }

    pub fn clear(&mut self) {
        self.by_key.clear();
        self.by_tick.clear();
    }
}

/// How many leading pages each tier holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    pub device: usize,
    pub host: usize,
}

impl Match {
    pub fn pages(&self) -> usize {
        self.device + self.host
    }
}

/// Device and host tiers.
#[derive(Debug)]
pub struct Tiers {
    pub device: Lru,
    pub host: Option<Lru>,
}

impl Tiers {
    /// `device_pages` > 0; `host_pages` 0 means no host tier.
    pub fn new(device_pages: usize, host_pages: usize) -> Tiers {
        Tiers {
            device: Lru::new(device_pages.max(1)),
            host: (host_pages > 0).then(|| Lru::new(host_pages)),
        }
    }

    /// The cached prefix of `keys`: pages in either tier, up to the first miss.
    pub fn lookup(&self, keys: &[String]) -> Match {
        let mut m = Match::default();
        for k in keys {
            if self.device.contains(k) {
                m.device += 1;
            } else if self.host.as_ref().is_some_and(|h| h.contains(k)) {
                m.host += 1;
            } else {
                break;
            }
        }
        m
    }

    /// Records that `keys` are now on the device (computed or loaded); what the device drops
    /// goes to the host tier.
    pub fn insert(&mut self, keys: &[String]) {
        for k in keys {
            if let Some(h) = self.host.as_mut() {
                h.remove(k);
            }
            for dropped in self.device.insert(k) {
                if let Some(h) = self.host.as_mut() {
                    h.insert(&dropped);
                }
            }
        }
    }

    /// Empties both tiers (`/flush_cache`).
    pub fn clear(&mut self) {
        self.device.clear();
        if let Some(h) = self.host.as_mut() {
            h.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(r: std::ops::Range<u32>) -> Vec<String> {
        r.map(|i| format!("k{i}")).collect()
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut l = Lru::new(2);
        assert!(l.insert("a").is_empty());
        l.insert("b");
        l.insert("a"); // refresh
        assert_eq!(l.insert("c"), vec!["b".to_string()]);
        assert!(l.contains("a") && l.contains("c") && !l.contains("b"));
    }

    #[test]
    fn lookup_is_a_prefix_across_tiers() {
        let mut t = Tiers::new(2, 4);
        t.insert(&keys(0..4)); // k0, k1 dropped to host
        assert_eq!(t.device.len(), 2);
        assert_eq!(
            t.lookup(&keys(0..6)),
            Match { device: 2, host: 2 },
            "k0,k1 on host, k2,k3 on device"
        );
        // A gap stops the walk even if later pages are cached.
        let mut probe = keys(0..4);
        probe[1] = "other".into();
        assert_eq!(t.lookup(&probe).pages(), 1);
        // Loading back moves pages to the device and pushes others to the host.
        t.insert(&keys(0..2));
        assert!(t.device.contains("k0") && t.host.as_ref().unwrap().contains("k2"));
        t.clear();
        assert_eq!(t.lookup(&keys(0..4)).pages(), 0);
    }

    #[test]
    fn without_a_host_tier_dropped_pages_are_gone() {
        let mut t = Tiers::new(2, 0);
        t.insert(&keys(0..4));
        assert_eq!(t.lookup(&keys(0..4)).pages(), 0, "k0 was dropped");
        assert_eq!(t.lookup(&keys(2..4)).pages(), 2);
    }
}
