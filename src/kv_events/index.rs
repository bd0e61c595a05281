//! The global KV index: which source (an engine, or the pool) holds each block, on which
//! tiers, built from the sources' events. Pure: events in, answers out.
//!
//! Memory is bounded by a byte budget fixed at creation: the block table is allocated once, for
//! as many blocks as the budget holds ([`Index::capacity_for`]). The capacity is shared by
//! source: when full, the source holding the most blocks gives up the one it stored longest
//! ago (its holders will announce it again if they still have it), so that one source
//! flooding the index evicts its own blocks, never every other source's. A block costs
//! [`bytes_per_block`] bytes of budget (125 on x86-64): 16/7 buckets of the table (a slot
//! holds the hash and, inline for up to two sources, each holder's tiers and the generation of
//! its latest store; the table, a power of two of buckets, holds at most half its capacity, so
//! that removals' tombstones are cleared by rehashing in place, never by doubling it) and two
//! places in its holder's store order (a block stored again leaves a stale place behind,
//! dropped on compaction, before the order would grow). Measured by
//! `tests/kv_index_memory.rs`: 10 million blocks into 64 MiB peak at 45 MiB.

use super::event::{KvEvent, Medium};
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};

/// A source of events: an engine (by the router's worker index) or the pool.
pub type SourceId = u16;

/// The tiers a source holds a block on, as bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tiers(u8);

impl Tiers {
    pub const GPU: Tiers = Tiers(1);
    pub const HOST: Tiers = Tiers(2);
    pub const DISK: Tiers = Tiers(4);
    pub const EXTERNAL: Tiers = Tiers(8);

    /// The tier an event's medium names (no medium: the device, as SGLang defaults it).
    pub fn of(medium: Option<&Medium>) -> Tiers {
        match medium {
            None | Some(Medium::Gpu) => Tiers::GPU,
            Some(Medium::CpuPinned) => Tiers::HOST,
            Some(Medium::Disk) => Tiers::DISK,
            Some(Medium::External) => Tiers::EXTERNAL,
            // An unknown medium is a lower tier than any known one.
            Some(Medium::Other(_)) => Tiers::EXTERNAL,
        }
    }

    /// Whether any tier of `t` is among these.
    pub fn contains(self, t: Tiers) -> bool {
        self.0 & t.0 != 0
    }

    /// Whether no tier holds the block.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The fastest tier held.
    pub fn best(self) -> Option<Tiers> {
        [Tiers::GPU, Tiers::HOST, Tiers::DISK, Tiers::EXTERNAL]
            .into_iter()
            .find(|t| self.contains(*t))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    source: SourceId,
    tiers: Tiers,
    /// The generation of this source's latest store of the block: its place in the source's
    /// store order.
    generation: u32,
}

#[derive(Debug)]
struct Slot {
    holders: SmallVec<[Holder; 2]>,
}

/// One block's place in a source's store order.
type OrderRecord = (i64, u32);

/// A source's blocks in the order it (last) stored them, with how many it holds.
#[derive(Debug, Default)]
struct SourceOrder {
    queue: VecDeque<OrderRecord>,
    held: usize,
}

/// Bytes one table bucket costs: its entry and its control byte.
fn bucket_bytes() -> usize {
    std::mem::size_of::<(i64, Slot)>() + 1
}

/// Bytes of budget a block costs at full load: 16/7 table buckets (the table holds at most
/// half of what it could, 7/16 of its buckets, so that the tombstones of removed blocks are
/// cleared by rehashing it in place, never by doubling it) and two places in the store order.
pub fn bytes_per_block() -> usize {
    bucket_bytes() * 16 / 7 + 2 * std::mem::size_of::<OrderRecord>()
}

/// Drops the places in `source`'s `queue` of blocks it stored again since, or no longer holds.
fn compact(blocks: &HashMap<i64, Slot>, source: SourceId, queue: &mut VecDeque<OrderRecord>) {
    queue.retain(|(h, g)| {
        blocks.get(h).is_some_and(|s| {
            s.holders
                .iter()
                .any(|x| x.source == source && x.generation == *g)
        })
    });
}

/// How much of a prompt a source holds: leading blocks, by the fastest tier each is on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prefix {
    pub gpu: usize,
    pub host: usize,
    pub disk: usize,
    pub external: usize,
}

impl Prefix {
    /// Leading blocks held, on any tier.
    pub fn blocks(&self) -> usize {
        self.gpu + self.host + self.disk + self.external
    }

    fn add(&mut self, t: Tiers) {
        match t.best() {
            Some(Tiers::GPU) => self.gpu += 1,
            Some(Tiers::HOST) => self.host += 1,
            Some(Tiers::DISK) => self.disk += 1,
            _ => self.external += 1,
        }
    }
}

/// What the index did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub stored: u64,
    pub removed: u64,
    pub cleared: u64,
    /// Blocks dropped because the index was full.
    pub evicted: u64,
}

/// The keys of the adapter blocks sources published (`hash::adapter_block_keys`), by their
/// published hash: to chain a later block to its parent, and to apply a removal. At most
/// `cap`, the oldest dropped first (a removal that finds no key then applies to nothing, and
/// the block stays until evicted or cleared).
#[derive(Debug, Default)]
struct Adapters {
    keys: HashMap<(SourceId, i64), (i64, u32)>,
    /// Aliases in the order they were made, with their generation (a stale place is skipped).
    order: VecDeque<((SourceId, i64), u32)>,
    cap: usize,
    generation: u32,
}

impl Adapters {
    fn key(&self, source: SourceId, published: i64) -> Option<i64> {
        self.keys.get(&(source, published)).map(|(k, _)| *k)
    }

    fn insert(&mut self, source: SourceId, published: i64, key: i64) {
        if self.cap == 0 {
            return;
        }
        // Only a new alias makes room; one made again takes its own place.
        while self.keys.len() >= self.cap && !self.keys.contains_key(&(source, published)) {
            let Some((old, generation)) = self.order.pop_front() else {
                break;
            };
            if self.keys.get(&old).is_some_and(|(_, g)| *g == generation) {
                self.keys.remove(&old);
            }
        }
        self.generation = self.generation.wrapping_add(1);
        self.keys
            .insert((source, published), (key, self.generation));
        self.order.push_back(((source, published), self.generation));
        if self.order.len() >= self.cap * 2 {
            self.compact();
        }
    }

    /// Drops the places of aliases made again since, or gone.
    fn compact(&mut self) {
        let keys = &self.keys;
        self.order
            .retain(|(a, g)| keys.get(a).is_some_and(|(_, x)| x == g));
    }

    fn forget(&mut self, source: SourceId, published: i64) {
        self.keys.remove(&(source, published));
    }

    fn clear_source(&mut self, source: SourceId) {
        self.keys.retain(|(s, _), _| *s != source);
        self.compact();
    }
}

/// The global KV index: which sources hold each block, on which tiers, within a byte budget.
pub struct Index {
    blocks: HashMap<i64, Slot>,
    adapters: Adapters,
    /// Each source's blocks in the order it (last) stored them, with that store's generation.
    orders: HashMap<SourceId, SourceOrder>,
    capacity: usize,
    generation: u32,
    pub stats: IndexStats,
}

impl Index {
    /// Blocks a budget of `bytes` holds: 7/16 of the buckets of the largest power-of-two table
    /// that fits with its store order (past half of the table's capacity, hashbrown grows it
    /// instead of rehashing in place).
    pub fn capacity_for(bytes: usize) -> usize {
        let order = 2 * std::mem::size_of::<OrderRecord>();
        let fits = |buckets: usize| {
            buckets
                .checked_mul(bucket_bytes())
                .and_then(|t| t.checked_add((buckets * 7 / 16) * order))
                .is_some_and(|b| b <= bytes)
        };
        let mut buckets = 16usize;
        while fits(buckets * 2) {
            buckets *= 2;
        }
        buckets * 7 / 16 - 1
    }

    /// An index within `budget_bytes`; its memory is taken now, never grown.
    pub fn with_budget(budget_bytes: usize) -> Index {
        let capacity = Index::capacity_for(budget_bytes);
        Index {
            // The table's full capacity is twice the blocks it holds: it never fills past half,
            // so it rehashes in place (clearing tombstones) rather than growing.
            blocks: HashMap::with_capacity((capacity + 1) * 2),
            orders: HashMap::new(),
            // An adapter block's alias for one in eight blocks, allocated as they come.
            adapters: Adapters {
                cap: capacity / 8,
                ..Adapters::default()
            },
            capacity,
            generation: 0,
            stats: IndexStats::default(),
        }
    }

    /// Blocks the index holds.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is indexed.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks the index's byte budget holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Applies one event from `source`.
    pub fn apply(&mut self, source: SourceId, event: &KvEvent) {
        match event {
            KvEvent::BlockStored(s) => {
                let tiers = Tiers::of(s.medium.as_ref());
                let keys = match &s.lora_name {
                    Some(name) => self.adapter_keys(source, name, s),
                    None => Vec::new(),
                };
                for (i, &h) in s.block_hashes.iter().enumerate() {
                    match keys.get(i) {
                        Some(&key) => {
                            self.adapters.insert(source, h, key);
                            self.store(source, key, tiers);
                        }
                        // Not an adapter's, or a chain whose start the index no longer knows.
                        None => self.store(source, h, tiers),
                    }
                }
            }
            KvEvent::BlockRemoved(r) => {
                let tiers = Tiers::of(r.medium.as_ref());
                for &h in &r.block_hashes {
                    match self.adapters.key(source, h) {
                        Some(key) => {
                            self.remove(source, key, tiers);
                            if self.tiers_of(source, key).is_empty() {
                                self.adapters.forget(source, h);
                            }
                        }
                        None => self.remove(source, h, tiers),
                    }
                }
            }
            KvEvent::AllBlocksCleared => self.clear_source(source),
        }
    }

    /// The keys of adapter `name`'s blocks `s` stores, chained from its parent's (as far as
    /// its token ids go; none when the parent's key is not known).
    fn adapter_keys(&self, source: SourceId, name: &str, s: &super::BlockStored) -> Vec<i64> {
        let parent = match s.parent_block_hash {
            None => super::hash::adapter_seed(name),
            Some(p) => match self.adapters.key(source, p) {
                Some(k) => k,
                None => return Vec::new(),
            },
        };
        let pages = s.block_hashes.len() * s.block_size as usize;
        let tokens = &s.token_ids[..pages.min(s.token_ids.len())];
        super::hash::adapter_keys_after(parent, tokens, s.block_size as usize)
    }

    fn store(&mut self, source: SourceId, hash: i64, tiers: Tiers) {
        self.stats.stored += 1;
        if !self.blocks.contains_key(&hash) {
            while self.blocks.len() >= self.capacity {
                if !self.evict_one(source) {
                    break;
                }
            }
        }
        self.generation = self.generation.wrapping_add(1);
        let generation = self.generation;
        let slot = self.blocks.entry(hash).or_insert_with(|| Slot {
            holders: SmallVec::new(),
        });
        let order = self.orders.entry(source).or_default();
        match slot.holders.iter_mut().find(|h| h.source == source) {
            Some(h) => {
                h.tiers.0 |= tiers.0;
                h.generation = generation;
            }
            None => {
                slot.holders.push(Holder {
                    source,
                    tiers,
                    generation,
                });
                order.held += 1;
            }
        }
        // Stale places are dropped before the order would grow (when a quarter are stale), and
        // once they outnumber the live ones.
        let q = &order.queue;
        let stale = q.len().saturating_sub(order.held);
        if (q.len() == q.capacity() && stale >= q.len() / 4) || q.len() >= 2 * order.held + 16 {
            compact(&self.blocks, source, &mut order.queue);
        }
        order.queue.push_back((hash, generation));
    }

    fn remove(&mut self, source: SourceId, hash: i64, tiers: Tiers) {
        self.stats.removed += 1;
        let Some(slot) = self.blocks.get_mut(&hash) else {
            return;
        };
        if let Some(i) = slot.holders.iter().position(|h| h.source == source) {
            slot.holders[i].tiers.0 &= !tiers.0;
            if slot.holders[i].tiers.is_empty() {
                slot.holders.swap_remove(i);
                if let Some(o) = self.orders.get_mut(&source) {
                    o.held = o.held.saturating_sub(1);
                }
            }
        }
        if slot.holders.is_empty() {
            self.blocks.remove(&hash);
        }
    }

    /// Everything `source` held is gone (its `AllBlocksCleared`, or it left).
    pub fn clear_source(&mut self, source: SourceId) {
        self.stats.cleared += 1;
        self.adapters.clear_source(source);
        self.orders.remove(&source);
        self.blocks.retain(|_, slot| {
            slot.holders.retain(|h| h.source != source);
            !slot.holders.is_empty()
        });
    }

    /// The source holding the most blocks (of equals, `storing`, the one that needs the room)
    /// gives up the one it stored longest ago (a block others hold too stays theirs). False
    /// when no source holds anything.
    fn evict_one(&mut self, storing: SourceId) -> bool {
        let Some((&source, _)) = self
            .orders
            .iter()
            .filter(|(_, o)| o.held > 0)
            .max_by_key(|(s, o)| (o.held, **s == storing, std::cmp::Reverse(**s)))
        else {
            return false;
        };
        let order = self
            .orders
            .get_mut(&source)
            .expect("chosen from the orders");
        while let Some((hash, generation)) = order.queue.pop_front() {
            let Some(slot) = self.blocks.get_mut(&hash) else {
                continue;
            };
            let Some(i) = (slot.holders.iter())
                .position(|h| h.source == source && h.generation == generation)
            else {
                continue;
            };
            slot.holders.swap_remove(i);
            order.held -= 1;
            if slot.holders.is_empty() {
                self.blocks.remove(&hash);
                self.stats.evicted += 1;
            }
            return true;
        }
        // Its count and its order disagree: nothing of it is left to give up.
        order.held = 0;
        true
    }

    /// The tiers `source` holds `hash` on.
    pub fn tiers_of(&self, source: SourceId, hash: i64) -> Tiers {
        self.blocks
            .get(&hash)
            .and_then(|s| s.holders.iter().find(|h| h.source == source))
            .map_or(Tiers::default(), |h| h.tiers)
    }

    /// For `source`: the leading blocks of `hashes` it holds on any tier, and on each tier
    /// alone (GPU, host, disk, external): how much of the prompt each medium could serve.
    pub fn runs(&self, hashes: &[i64], source: SourceId) -> (usize, [usize; 4]) {
        let tiers = [Tiers::GPU, Tiers::HOST, Tiers::DISK, Tiers::EXTERNAL];
        let (mut any, mut each, mut open) = (0, [0usize; 4], [true; 4]);
        for h in hashes {
            let held = self.tiers_of(source, *h);
            if held.is_empty() {
                break;
            }
            any += 1;
            for (i, t) in tiers.iter().enumerate() {
                open[i] &= held.contains(*t);
                if open[i] {
                    each[i] += 1;
                }
            }
        }
        (any, each)
    }

    /// How many leading blocks of `hashes` each of `sources` holds, by tier.
    pub fn prefixes(
        &self,
        hashes: &[i64],
        sources: &[SourceId],
        pool: Option<SourceId>,
    ) -> Vec<Prefix> {
        let mut out = vec![Prefix::default(); sources.len()];
        let mut open: Vec<bool> = vec![true; sources.len()];
        for h in hashes {
            let Some(slot) = self.blocks.get(h) else {
                break;
            };
            let pooled = pool.is_some_and(|p| slot.holders.iter().any(|x| x.source == p));
            let mut any = false;
            for (i, s) in sources.iter().enumerate() {
                if !open[i] {
                    continue;
                }
                match slot.holders.iter().find(|x| x.source == *s) {
                    Some(x) => {
                        out[i].add(x.tiers);
                        any = true;
                    }
                    // What the pool holds any engine can load.
                    None if pooled => {
                        out[i].external += 1;
                        any = true;
                    }
                    None => open[i] = false,
                }
            }
            if !any {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::{BlockRemoved, BlockStored};

    fn stored(hashes: &[i64], medium: Medium) -> KvEvent {
        KvEvent::BlockStored(BlockStored::new(hashes.to_vec(), None, vec![], 16, medium))
    }

    fn removed(hashes: &[i64], medium: Medium) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.to_vec(),
            medium: Some(medium),
        })
    }

    /// An adapter's blocks, published under hashes the router cannot compute, are found by
    /// the keys a request naming the adapter gives; removals and clears reach them.
    #[test]
    fn an_adapters_blocks_are_found_by_its_name_and_tokens() {
        use crate::kv_events::hash::{adapter_block_keys, block_hashes};
        let adapter = |hashes: &[i64], parent: Option<i64>, tokens: std::ops::Range<u32>| {
            let mut s = BlockStored::new(hashes.to_vec(), parent, tokens.collect(), 4, Medium::Gpu);
            s.lora_name = Some("sql".into());
            KvEvent::BlockStored(s)
        };
        let mut ix = Index::with_budget(1 << 20);
        ix.apply(0, &adapter(&[101, 102], None, 0..8));
        ix.apply(0, &adapter(&[103], Some(102), 8..12));
        let tokens: Vec<u32> = (0..12).collect();
        let keys = adapter_block_keys("sql", &tokens, 4);
        let held = |ix: &Index, keys: &[i64]| ix.prefixes(keys, &[0], None)[0].gpu;
        assert_eq!(held(&ix, &keys), 3);
        assert_eq!(
            held(&ix, &block_hashes(&tokens, 4)),
            0,
            "not the base model's"
        );
        assert_eq!(held(&ix, &adapter_block_keys("chat", &tokens, 4)), 0);
        // A removal names the published hash.
        ix.apply(0, &removed(&[102], Medium::Gpu));
        assert_eq!(held(&ix, &keys), 1);
        // A block whose parent the index never saw is kept under its published hash.
        ix.apply(0, &adapter(&[201], Some(999), 0..4));
        assert_eq!(ix.tiers_of(0, 201), Tiers::GPU);
        ix.apply(0, &KvEvent::AllBlocksCleared);
        assert_eq!(held(&ix, &keys), 0);
        assert!(ix.adapters.keys.is_empty());
    }

    #[test]
    fn adapter_aliases_are_bounded_oldest_first() {
        let mut a = Adapters {
            cap: 2,
            ..Adapters::default()
        };
        a.insert(0, 1, 10);
        a.insert(0, 2, 20);
        a.insert(0, 1, 11);
        a.insert(0, 3, 30);
        assert_eq!(
            (a.key(0, 1), a.key(0, 2), a.key(0, 3)),
            (Some(11), None, Some(30))
        );
        assert!(a.keys.len() <= 2 && a.order.len() <= 4);
    }

    #[test]
    fn sources_hold_blocks_on_tiers_and_prefixes_count_them() {
        let mut ix = Index::with_budget(1 << 20);
        ix.apply(0, &stored(&[1, 2, 3, 4], Medium::Gpu));
        ix.apply(0, &removed(&[3, 4], Medium::Gpu));
        ix.apply(0, &stored(&[3], Medium::CpuPinned));
        ix.apply(1, &stored(&[1, 2], Medium::Gpu));
        ix.apply(9, &stored(&[1, 2, 3, 4, 5], Medium::External));
        assert_eq!(ix.tiers_of(0, 3), Tiers::HOST);
        assert!(ix.tiers_of(0, 4).is_empty());
        let p = ix.prefixes(&[1, 2, 3, 4, 5, 6], &[0, 1, 9, 7], None);
        assert_eq!(
            p[0],
            Prefix {
                gpu: 2,
                host: 1,
                ..Prefix::default()
            }
        );
        assert_eq!(p[1].gpu, 2);
        assert_eq!(p[2].external, 5);
        assert_eq!(p[3].blocks(), 0);
        // A prefix stops at the first block a source lacks, whatever follows.
        assert_eq!(ix.prefixes(&[2, 1], &[1], None)[0].gpu, 2);
        // With source 9 the pool: what an engine lacks the pool supplies, up to where neither
        // holds a block.
        let p = ix.prefixes(&[1, 2, 3, 4, 5, 6], &[0, 1], Some(9));
        assert_eq!((p[0].gpu, p[0].host, p[0].external), (2, 1, 2));
        assert_eq!((p[1].gpu, p[1].external), (2, 3));
        assert_eq!(ix.prefixes(&[7, 1], &[1], None)[0].gpu, 0);
        // A source clears: its blocks go, others' stay.
        ix.apply(0, &KvEvent::AllBlocksCleared);
        assert_eq!(ix.prefixes(&[1, 2, 3], &[0, 1], None)[0].blocks(), 0);
        assert_eq!(ix.prefixes(&[1, 2, 3], &[0, 1], None)[1].gpu, 2);
        // Removing the last holder drops the block.
        ix.apply(9, &removed(&[5], Medium::External));
        assert!(ix.tiers_of(9, 5).is_empty());
        assert_eq!(ix.len(), 4);
        // Per tier: 1 and 2 on the device, 3 on the host: 2 blocks on GPU, 0 on host alone.
        let mut ix = Index::with_budget(1 << 20);
        ix.apply(0, &stored(&[1, 2], Medium::Gpu));
        ix.apply(0, &stored(&[1, 2, 3], Medium::CpuPinned));
        assert_eq!(ix.runs(&[1, 2, 3, 4], 0), (3, [2, 3, 0, 0]));
        assert_eq!(ix.runs(&[9, 1], 0), (0, [0; 4]));
    }

    #[test]
    fn a_full_index_drops_the_block_stored_longest_ago() {
        let mut ix = Index::with_budget(0);
        assert_eq!(ix.capacity(), 6, "the smallest table");
        ix.capacity = 4;
        ix.apply(0, &stored(&[1, 2, 3, 4], Medium::Gpu));
        ix.apply(0, &stored(&[1], Medium::Gpu)); // stored again: now the newest
        ix.apply(0, &stored(&[5], Medium::Gpu));
        assert_eq!(ix.len(), 4);
        assert!(ix.tiers_of(0, 2).is_empty(), "2 was the oldest store");
        assert_eq!(ix.tiers_of(0, 1), Tiers::GPU);
        for h in 6..1000 {
            ix.apply(0, &stored(&[h], Medium::Gpu));
            assert!(ix.len() <= 4 && ix.orders[&0].queue.len() <= 2 * 4 + 16);
        }
        assert_eq!(ix.stats.evicted, 995, "one for 5, one for each of 6..1000");
        assert_eq!(ix.prefixes(&[996, 997, 998, 999], &[0], None)[0].gpu, 4);
    }

    /// Issue 62, item A14: the capacity is shared by source: one source flooding the index
    /// gives up its own oldest blocks, not the blocks of sources holding less.
    #[test]
    fn a_flooding_source_evicts_its_own_blocks_not_the_others() {
        let mut ix = Index::with_budget(0);
        ix.capacity = 100;
        // Three sources hold 20 blocks each; source 9 then floods 100,000.
        for s in 0..3u16 {
            let base = i64::from(s) * 1_000;
            let hashes: Vec<i64> = (base..base + 20).collect();
            ix.apply(s, &stored(&hashes, Medium::Gpu));
        }
        for chunk in (1_000_000..1_100_000i64).collect::<Vec<_>>().chunks(1_000) {
            ix.apply(9, &stored(chunk, Medium::Gpu));
        }
        assert_eq!(ix.len(), 100);
        for s in 0..3u16 {
            let base = i64::from(s) * 1_000;
            let hashes: Vec<i64> = (base..base + 20).collect();
            assert_eq!(
                ix.prefixes(&hashes, &[s], None)[0].gpu,
                20,
                "source {s} kept"
            );
        }
        // The flooder keeps its newest 40.
        let newest: Vec<i64> = (1_099_960..1_100_000).collect();
        assert_eq!(ix.prefixes(&newest, &[9], None)[0].gpu, 40);
        // A block two sources hold leaves the index only when both gave it up.
        let mut ix = Index::with_budget(0);
        ix.capacity = 2;
        ix.apply(0, &stored(&[1], Medium::Gpu));
        ix.apply(1, &stored(&[1, 2], Medium::Gpu));
        ix.apply(1, &stored(&[3], Medium::Gpu));
        assert_eq!(ix.tiers_of(0, 1), Tiers::GPU, "source 0 still holds 1");
        assert!(ix.tiers_of(1, 1).is_empty(), "source 1 gave its oldest up");
        assert!(ix.len() <= 3 && ix.tiers_of(1, 3) == Tiers::GPU);
    }
}
