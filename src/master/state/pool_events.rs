//! What the pool holds, as KV events (pure: the housekeeper hands them to the publisher).
//!
//! Engines name what they put in the pool after the token chain: SGLang's HiCache keys a page
//! by the hex SHA-256 digest of its chained token ids (`get_hash_str`: the previous page's
//! digest, then the page's token ids as 4-byte little-endian integers), with a suffix per
//! rank and K/V half (Mooncake's backend: `<digest>_<rank>_k`, `<digest>__k` for MLA;
//! rbgctl's: `[<tag>_]<digest>_<model>[_<tp rank>_<tp size>]…`; none for rbgctl's SIMULATED
//! engine), and its KV events give the same page the digest's first 8 bytes as a big-endian
//! signed integer (`hash_str_to_int64`). So a key holding a 64-digit hex digest (at its start
//! or after an `_`) is a page, and its block hash is the one the engines announce: the router
//! joins the two. Other keys are not pages and make no events.
//!
//! A page is several objects (each rank's K and V); it is announced `BlockStored` when the
//! first of them becomes readable in a medium and `BlockRemoved` when the last there goes, with
//! medium `EXTERNAL` for the pool's memory and `DISK` for its disk tier (demotion and promotion
//! move it between the two). The object map's tier lists say which medium an object is in.

use crate::kv_events::{BlockRemoved, BlockStored, KvEvent, Medium};
use foldhash::fast::RandomState;
use std::collections::{HashMap, VecDeque};

/// Events held for the publisher, at most; past it the oldest go (counted), as the engines'
/// publishers drop batches a slow consumer did not take.
const MAX_HELD: usize = 1 << 20;

/// Where one of the pool's objects lives, as its events say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMedium {
    Memory,
    Disk,
}

impl PoolMedium {
    fn index(self) -> usize {
        self as usize
    }

    fn medium(self) -> Medium {
        match self {
            PoolMedium::Memory => Medium::External,
            PoolMedium::Disk => Medium::Disk,
        }
    }
}

/// The pool's blocks by medium, and the events not yet published.
#[derive(Debug, Default)]
pub struct PoolEvents {
    enabled: bool,
    /// Readable objects of each page, in memory and on disk.
    objects: HashMap<i64, [u32; 2], RandomState>,
    events: VecDeque<KvEvent>,
    /// Events dropped because the publisher did not take them in time.
    pub dropped: u64,
}

/// The block hash of a page key: the first 16 hex digits of the 64-digit SHA-256 hex digest
/// that starts it or follows an `_` (rbgctl's HiCache backend puts `extra_backend_tag_`
/// first), itself followed by nothing or `_`.
pub fn page_hash(key: &str) -> Option<i64> {
    let b = key.as_bytes();
    let mut starts = std::iter::once(0).chain(
        b.iter()
            .enumerate()
            .filter(|(_, &c)| c == b'_')
            .map(|(i, _)| i + 1),
    );
    let digest_at = |at: usize| {
        b.len() >= at + 64
            && b[at..at + 64].iter().all(u8::is_ascii_hexdigit)
            && matches!(b.get(at + 64), None | Some(b'_'))
    };
    let at = starts.find(|&at| digest_at(at))?;
    u64::from_str_radix(&key[at..at + 16], 16)
        .ok()
        .map(|u| u as i64)
}

impl PoolEvents {
    /// A recorder; a disabled one records nothing and costs a branch.
    pub fn new(enabled: bool) -> PoolEvents {
        PoolEvents {
            enabled,
            ..PoolEvents::default()
        }
    }

    /// Whether events are recorded.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Pages with an object in the pool.
    pub fn pages(&self) -> usize {
        self.objects.len()
    }

    /// An object of `key` became readable in `medium`.
    pub fn began(&mut self, key: &str, medium: PoolMedium) {
        if let Some(hash) = self.page(key) {
            self.add(hash, medium);
        }
    }

    /// An object of `key` in `medium` went (replaced, removed, evicted, lost).
    pub fn ended(&mut self, key: &str, medium: PoolMedium) {
        if let Some(hash) = self.page(key) {
            self.sub(hash, medium);
        }
    }

    /// An object of `key` moved between memory and disk (demoted, promoted).
    pub fn moved(&mut self, key: &str, from: PoolMedium, to: PoolMedium) {
        if let Some(hash) = self.page(key).filter(|_| from != to) {
            // Stored where it goes first, so that the page is never announced gone between.
            self.add(hash, to);
            self.sub(hash, from);
        }
    }

    /// The master forgot every object (it was deposed, or took office anew): the pool's
    /// blocks are announced cleared, and what its stores report next is announced again.
    pub fn clear(&mut self) {
        if self.enabled {
            self.objects.clear();
            self.push(KvEvent::AllBlocksCleared);
        }
    }

    /// Queues the whole state after what is queued: the blocks cleared, then every page
    /// stored in each medium it is in. A subscriber that asked for it (a router that started
    /// late, or lost its place) has the pool's state once it has applied the batch, whatever
    /// the replay buffer still holds; for the others it changes nothing. The pages it returns.
    pub fn snapshot(&mut self) -> usize {
        if !self.enabled {
            return 0;
        }
        self.events.push_back(KvEvent::AllBlocksCleared);
        for (&hash, counts) in &self.objects {
            for medium in [PoolMedium::Memory, PoolMedium::Disk] {
                if counts[medium.index()] > 0 {
                    let stored = BlockStored::new(vec![hash], None, Vec::new(), 0, medium.medium());
                    self.events.push_back(KvEvent::BlockStored(stored));
                }
            }
        }
        self.objects.len()
    }

    /// The events recorded since the last call, oldest first.
    /// Whether events wait to be published.
    pub fn queued(&self) -> bool {
        !self.events.is_empty()
    }

    /// The events recorded since the last take.
    pub fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events).into()
    }

    fn page(&self, key: &str) -> Option<i64> {
        self.enabled.then(|| page_hash(key)).flatten()
    }

    fn add(&mut self, hash: i64, medium: PoolMedium) {
        let counts = self.objects.entry(hash).or_default();
        counts[medium.index()] += 1;
        if counts[medium.index()] == 1 {
            let stored = BlockStored::new(vec![hash], None, Vec::new(), 0, medium.medium());
            self.push(KvEvent::BlockStored(stored));
        }
    }

    fn sub(&mut self, hash: i64, medium: PoolMedium) {
        let Some(counts) = self.objects.get_mut(&hash) else {
            return;
        };
        let n = &mut counts[medium.index()];
        if *n == 0 {
            return;
        }
        *n -= 1;
        if *n == 0 {
            if *counts == [0, 0] {
                self.objects.remove(&hash);
            }
            self.push(KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![hash],
                medium: Some(medium.medium()),
            }));
        }
    }

    fn push(&mut self, event: KvEvent) {
        if self.events.len() >= MAX_HELD {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "00000000000000ff0123456789abcdef0123456789abcdef0123456789abcdef";

    fn stored(e: &KvEvent) -> Option<(i64, &Medium)> {
        match e {
            KvEvent::BlockStored(s) => Some((s.block_hashes[0], s.medium.as_ref()?)),
            _ => None,
        }
    }

    fn removed(e: &KvEvent) -> Option<(i64, &Medium)> {
        match e {
            KvEvent::BlockRemoved(r) => Some((r.block_hashes[0], r.medium.as_ref()?)),
            _ => None,
        }
    }

    #[test]
    fn a_page_key_gives_the_engines_block_hash() {
        assert_eq!(page_hash(DIGEST), Some(255));
        assert_eq!(page_hash(&format!("{DIGEST}_0_k")), Some(255));
        assert_eq!(page_hash(&format!("{DIGEST}__v")), Some(255));
        assert_eq!(page_hash(&format!("{DIGEST}_Qwen3-8B_0_2")), Some(255));
        assert_eq!(
            page_hash(&format!("tag_{DIGEST}_Qwen3-8B")),
            Some(255),
            "after a tag"
        );
        assert_eq!(page_hash(&format!("tag{DIGEST}_m")), None);
        let negative = format!("f{}", &DIGEST[1..]);
        assert!(page_hash(&negative).unwrap() < 0, "read as signed");
        assert_eq!(page_hash("user-object"), None);
        assert_eq!(page_hash(&DIGEST[..63]), None);
        assert_eq!(page_hash(&format!("{DIGEST}0")), None, "65 hex digits");
        assert_eq!(page_hash(&format!("{DIGEST}.bin")), None);
    }

    #[test]
    fn a_page_is_stored_with_its_first_object_and_removed_with_its_last() {
        let mut p = PoolEvents::new(true);
        let (k, v) = (format!("{DIGEST}_0_k"), format!("{DIGEST}_0_v"));
        p.began(&k, PoolMedium::Memory);
        p.began(&v, PoolMedium::Memory);
        p.began("not-a-page", PoolMedium::Memory);
        let events = p.take();
        assert_eq!(events.len(), 1);
        assert_eq!(stored(&events[0]), Some((255, &Medium::External)));
        p.ended(&k, PoolMedium::Memory);
        assert!(p.take().is_empty(), "V is still there");
        p.ended(&v, PoolMedium::Memory);
        let events = p.take();
        assert_eq!(removed(&events[0]), Some((255, &Medium::External)));
        assert_eq!(p.pages(), 0);
        p.ended(&v, PoolMedium::Memory);
        assert!(p.take().is_empty(), "an end without a beginning is ignored");
    }

    #[test]
    fn demotion_announces_the_disk_copy_before_the_memory_one_goes() {
        let mut p = PoolEvents::new(true);
        p.began(DIGEST, PoolMedium::Memory);
        p.take();
        p.moved(DIGEST, PoolMedium::Memory, PoolMedium::Disk);
        let events = p.take();
        assert_eq!(stored(&events[0]), Some((255, &Medium::Disk)));
        assert_eq!(removed(&events[1]), Some((255, &Medium::External)));
        p.moved(DIGEST, PoolMedium::Disk, PoolMedium::Memory);
        let events = p.take();
        assert_eq!(stored(&events[0]), Some((255, &Medium::External)));
        assert_eq!(removed(&events[1]), Some((255, &Medium::Disk)));
    }

    #[test]
    fn a_snapshot_is_the_whole_state_after_what_was_queued() {
        let mut p = PoolEvents::new(true);
        let other = format!("7{}", &DIGEST[1..]);
        p.began(DIGEST, PoolMedium::Memory);
        p.began(&other, PoolMedium::Memory);
        p.moved(&other, PoolMedium::Memory, PoolMedium::Disk);
        let queued = p.events.len();
        assert_eq!(p.snapshot(), 2);
        let events = p.take();
        assert_eq!(events[queued], KvEvent::AllBlocksCleared);
        let mut after: Vec<(i64, Medium)> = events[queued + 1..]
            .iter()
            .map(|e| stored(e).map(|(h, m)| (h, m.clone())).unwrap())
            .collect();
        after.sort_by_key(|(h, _)| *h);
        assert_eq!(
            after,
            [
                (255, Medium::External),
                (page_hash(&other).unwrap(), Medium::Disk)
            ]
        );
    }

    #[test]
    fn a_disabled_recorder_records_nothing() {
        let mut p = PoolEvents::new(false);
        p.began(DIGEST, PoolMedium::Memory);
        assert!(p.take().is_empty());
        assert_eq!(p.pages(), 0);
    }
}
