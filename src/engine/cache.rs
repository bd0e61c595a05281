//! The SIMULATED engine's prefix cache: a bounded device tier (L1) and an optional host tier
//! (L2), both LRU sets of page keys. A lookup walks a request's pages from the first and stops
//! at the first page that neither tier holds (a prefix cache serves prefixes only). Pages
//! evicted from L1 move to L2, as HiCache's host pool keeps what the device drops; pages found
//! in L2 are loaded back into L1.
//!
//! With KV events on (`Tiers::record`), every change is an event as SGLang's HiCache would
//! publish it: a page computed is `BlockStored` on `GPU`; a page the device drops is
//! `BlockRemoved` there and `BlockStored` on `CPU_PINNED` (or only removed, without a host
//! tier); a page loaded back is removed from the host and stored on the device; a flush is
//! `AllBlocksCleared`. A block's hash is its page key's first 8 bytes, as SGLang's
//! `hash_str_to_int64` reads the same chained SHA-256 (`tokens::page_keys`).

use crate::kv_events::{Batcher, BlockRemoved, BlockStored, KvEvent, KvEventBatch, Medium};
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
    /// An empty cache of at most `cap` keys.
    pub fn new(cap: usize) -> Lru {
        Lru {
            cap,
            ..Lru::default()
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no page is held.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether `key` is held (without refreshing it).
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

    /// Drops `key`; whether it was held.
    pub fn remove(&mut self, key: &str) -> bool {
        match self.by_key.remove(key) {
            Some(t) => {
                self.by_tick.remove(&t);
                true
            }
            None => false,
        }
    }

    /// Drops every key.
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
    /// Leading pages held by the device and host tiers together.
    pub fn pages(&self) -> usize {
        self.device + self.host
    }
}

/// Device and host tiers.
#[derive(Debug)]
pub struct Tiers {
    pub device: Lru,
    pub host: Option<Lru>,
    /// With KV events on: what each cached page is, and the events not yet published.
    record: Option<Recorder>,
}

/// What an event says of a page besides its hash.
#[derive(Debug)]
struct PageMeta {
    parent: Option<i64>,
    tokens: Vec<u32>,
}

#[derive(Debug, Default)]
struct Recorder {
    /// Every page either tier holds (bounded by their capacities).
    pages: HashMap<String, PageMeta>,
    batch: Batcher,
}

/// A page key's event hash: its first 16 hex digits (8 bytes) as a signed 64-bit integer
/// (SGLang's `hash_str_to_int64`).
pub fn block_hash(key: &str) -> i64 {
    key.get(..16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .map_or(0, |u| u as i64)
}

impl Recorder {
    fn stored(&mut self, key: &str, medium: Medium) {
        let Some(meta) = self.pages.get(key) else {
            return;
        };
        self.batch.push(KvEvent::BlockStored(BlockStored::new(
            vec![block_hash(key)],
            meta.parent,
            meta.tokens.clone(),
            meta.tokens.len() as u32,
            medium,
        )));
    }

    fn removed(&mut self, key: &str, medium: Medium) {
        self.batch.push(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![block_hash(key)],
            medium: Some(medium),
        }));
    }
}

impl Tiers {
    /// `device_pages` > 0; `host_pages` 0 means no host tier.
    pub fn new(device_pages: usize, host_pages: usize) -> Tiers {
        Tiers {
            device: Lru::new(device_pages.max(1)),
            host: (host_pages > 0).then(|| Lru::new(host_pages)),
            record: None,
        }
    }

    /// Records every change as KV events from now on ([`Tiers::take_events`]).
    pub fn record(mut self) -> Tiers {
        self.record = Some(Recorder::default());
        self
    }

    /// The events since the last call, as one batch stamped `ts`.
    pub fn take_events(&mut self, ts: f64) -> Option<KvEventBatch> {
        self.record.as_mut()?.batch.take(ts)
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

    /// Records that `keys` (the pages of `tokens`, `page_size` tokens each) are now on the
    /// device (computed or loaded); what the device drops goes to the host tier.
    pub fn insert(&mut self, keys: &[String], tokens: &[u32], page_size: usize) {
        for (i, k) in keys.iter().enumerate() {
            let on_device = self.device.contains(k);
            let from_host = !on_device && self.host.as_mut().is_some_and(|h| h.remove(k));
            if let Some(r) = self.record.as_mut().filter(|_| !on_device) {
                let page = tokens
                    .get(i * page_size..(i + 1) * page_size)
                    .unwrap_or(&[]);
                r.pages.entry(k.clone()).or_insert_with(|| PageMeta {
                    parent: i.checked_sub(1).map(|p| block_hash(&keys[p])),
                    tokens: page.to_vec(),
                });
                if from_host {
                    r.removed(k, Medium::CpuPinned);
                }
                r.stored(k, Medium::Gpu);
            }
            for dropped in self.device.insert(k) {
                if let Some(r) = self.record.as_mut() {
                    r.removed(&dropped, Medium::Gpu);
                }
                let Some(h) = self.host.as_mut() else {
                    if let Some(r) = self.record.as_mut() {
                        r.pages.remove(&dropped);
                    }
                    continue;
                };
                let gone = h.insert(&dropped);
                if let Some(r) = self.record.as_mut() {
                    r.stored(&dropped, Medium::CpuPinned);
                    for g in gone {
                        r.removed(&g, Medium::CpuPinned);
                        r.pages.remove(&g);
                    }
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
        if let Some(r) = self.record.as_mut() {
            r.pages.clear();
            r.batch.push(KvEvent::AllBlocksCleared);
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
        t.insert(&keys(0..4), &[], 1); // k0, k1 dropped to host
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
        t.insert(&keys(0..2), &[], 1);
        assert!(t.device.contains("k0") && t.host.as_ref().unwrap().contains("k2"));
        t.clear();
        assert_eq!(t.lookup(&keys(0..4)).pages(), 0);
    }

    #[test]
    fn without_a_host_tier_dropped_pages_are_gone() {
        let mut t = Tiers::new(2, 0);
        t.insert(&keys(0..4), &[], 1);
        assert_eq!(t.lookup(&keys(0..4)).pages(), 0, "k0 was dropped");
        assert_eq!(t.lookup(&keys(2..4)).pages(), 2);
    }

    /// Events as SGLang's HiCache publishes them: stored on the device, demoted to the host,
    /// loaded back, gone, cleared; hashes chained by their pages' keys.
    #[test]
    fn every_change_is_an_event() {
        let tokens: Vec<u32> = (0..8).collect();
        let keys = crate::simulated_tokens::page_keys(&tokens, 2);
        let h: Vec<i64> = keys.iter().map(|k| block_hash(k)).collect();
        let mut t = Tiers::new(2, 1).record();
        assert!(t.take_events(0.0).is_none(), "nothing happened");
        t.insert(&keys, &tokens, 2);
        let b = t.take_events(1.0).unwrap();
        let stored = |hashes: Vec<i64>, parent: Option<i64>, tokens: Vec<u32>, m: Medium| {
            let size = (tokens.len() / hashes.len()) as u32;
            KvEvent::BlockStored(BlockStored::new(hashes, parent, tokens, size, m))
        };
        let removed = |hashes: Vec<i64>, m: Medium| {
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: hashes,
                medium: Some(m),
            })
        };
        assert_eq!(
            b.events,
            vec![
                stored(
                    vec![h[0], h[1], h[2]],
                    None,
                    vec![0, 1, 2, 3, 4, 5],
                    Medium::Gpu
                ),
                removed(vec![h[0]], Medium::Gpu),
                stored(vec![h[0]], None, vec![0, 1], Medium::CpuPinned),
                stored(vec![h[3]], Some(h[2]), vec![6, 7], Medium::Gpu),
                removed(vec![h[1]], Medium::Gpu),
                stored(vec![h[1]], Some(h[0]), vec![2, 3], Medium::CpuPinned),
                removed(vec![h[0]], Medium::CpuPinned),
            ]
        );
        // k1 is loaded back from the host: it leaves the host, comes to the device, k2 goes down.
        t.insert(&keys[1..2], &tokens[2..4], 2);
        let b = t.take_events(2.0).unwrap();
        assert_eq!(b.events[0], removed(vec![h[1]], Medium::CpuPinned));
        assert_eq!(
            b.events[1],
            stored(vec![h[1]], Some(h[0]), vec![2, 3], Medium::Gpu)
        );
        t.clear();
        assert_eq!(
            t.take_events(3.0).unwrap().events,
            vec![KvEvent::AllBlocksCleared]
        );
        assert_eq!(block_hash("8000000000000001ffff"), i64::MIN + 1);
    }
}
