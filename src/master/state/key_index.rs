//! The index from keys to object slots: an open-addressing hash table (linear probing,
//! backward-shift deletion) of 8-byte entries, each a slot number and the low 32 bits of its
//! key's hash. The table itself never reads a key: the caller's `is` closure compares the one
//! the slot holds, and only for entries whose hash bits match. It exists, rather than a general
//! hash map, for two things a master with millions of objects needs under its lock:
//!
//! - a batch of lookups prefetches where each key's entry lies (`prefetch`), so that their
//!   cache misses overlap instead of coming three or four in a row per key;
//! - growing never stops the world: a table twice the size is allocated zeroed (pages the
//!   system hands out lazily, no copy), and every later insert or remove moves a few entries of
//!   the old table across. Until the old table is empty, lookups look in both. (Rehashing
//!   millions of entries at once held the lock for 168 ms at 4,000,000 objects.)

/// An empty entry. Real entries hold `slot + 1` in their low half, so never 0 there.
const EMPTY: u64 = 0;
/// An entry of the old table already moved to the new one (or removed meanwhile): lookups in
/// the old table go past it, as past any entry of the run.
const MOVED: u64 = 1 << 32;
/// Fewest entries a non-empty table has.
const MIN_ENTRIES: usize = 16;
/// Old entries moved across with each insert or remove while growing. With 8, the old table
/// (at most 7/8 full) is empty before the new one (twice its size) is half full.
const STEP: usize = 8;

/// A table of entries in memory mapped anonymously: the system hands out its pages zeroed as
/// they are first touched, so a new table of any size costs nothing up front. (The allocator's
/// zeroed allocation cleared a 64 MiB table at once under the master's lock.)
#[derive(Default)]
struct Table {
    map: Option<memmap2::MmapMut>,
    len: usize,
}

impl Table {
    /// A table of `len` zeroed entries, or why the system would not map one.
    fn zeroed(len: usize) -> Result<Table, IndexFull> {
        let map =
            memmap2::MmapMut::map_anon(len * std::mem::size_of::<u64>()).map_err(|source| {
                IndexFull {
                    entries: len,
                    source,
                }
            })?;
        Ok(Table {
            map: Some(map),
            len,
        })
    }
}

/// The key index could not grow: the system refused the memory for its larger table.
#[derive(Debug, thiserror::Error)]
#[error("cannot map a key index of {entries} entries: {source}")]
pub struct IndexFull {
    entries: usize,
    source: std::io::Error,
}

impl std::ops::Deref for Table {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match &self.map {
            // SAFETY: the mapping is page-aligned, `len` entries long and lives as long as
            // `self`; every bit pattern is a valid u64.
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr().cast::<u64>(), self.len) },
            None => &[],
        }
    }
}

impl std::ops::DerefMut for Table {
    fn deref_mut(&mut self) -> &mut [u64] {
        match &mut self.map {
            // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
            Some(m) => unsafe {
                std::slice::from_raw_parts_mut(m.as_mut_ptr().cast::<u64>(), self.len)
            },
            None => &mut [],
        }
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table({} entries)", self.len)
    }
}

/// Keys to object slots: an open-addressing hash table of slot numbers.
#[derive(Debug, Default)]
pub struct KeyIndex {
    /// A power of two long (or empty); at most 7/8 full.
    entries: Table,
    /// The table being emptied into `entries` while growing; empty otherwise.
    old: Table,
    /// Entries of `old` below this one have been moved.
    cursor: usize,
    /// Keys in both tables.
    len: usize,
}

fn pack(hash: u64, slot: u32) -> u64 {
    ((hash as u32 as u64) << 32) | (slot as u64 + 1)
}

/// The slot of a real entry (`None` for an empty or moved one).
fn slot_of(e: u64) -> Option<u32> {
    (e as u32).checked_sub(1)
}

fn hash_of(e: u64) -> u32 {
    (e >> 32) as u32
}

/// Where in `table` the entry of `hash` with `is(slot)` is.
fn position(table: &[u64], hash: u32, mut is: impl FnMut(u32) -> bool) -> Option<usize> {
    if table.is_empty() {
        return None;
    }
    let mask = table.len() - 1;
    let mut i = hash as usize & mask;
    loop {
        let e = table[i];
        if e == EMPTY {
            return None;
        }
        if let Some(slot) = slot_of(e) {
            if hash_of(e) == hash && is(slot) {
                return Some(i);
            }
        }
        i = (i + 1) & mask;
    }
}

/// Puts `e` in the first empty entry of its run (the table has one: it is never full).
fn place(table: &mut [u64], e: u64) {
    let mask = table.len() - 1;
    let mut i = hash_of(e) as usize & mask;
    while table[i] != EMPTY {
        i = (i + 1) & mask;
    }
    table[i] = e;
}

impl KeyIndex {
    /// Keys held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no key is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the table is growing (an old table still holds entries to move).
    pub fn growing(&self) -> bool {
        !self.old.is_empty()
    }

    /// The slot of the key with `hash` for which `is(slot)` holds.
    pub fn find(&self, hash: u64, mut is: impl FnMut(u32) -> bool) -> Option<u32> {
        let h = hash as u32;
        position(&self.entries, h, &mut is)
            .map(|i| self.entries[i])
            .or_else(|| position(&self.old, h, &mut is).map(|i| self.old[i]))
            .and_then(slot_of)
    }

    /// The first slot whose hash bits match `hash`: most likely the key's (for prefetching).
    pub fn candidate(&self, hash: u64) -> Option<u32> {
        self.find(hash, |_| true)
    }

    /// Asks the CPU to fetch the entries where a lookup of `hash` starts.
    pub fn prefetch(&self, hash: u64) {
        for table in [&*self.entries, &*self.old] {
            if !table.is_empty() {
                prefetch(&table[hash as u32 as usize & (table.len() - 1)]);
            }
        }
    }

    /// Makes room for one more entry (growing the table if it would be more than 7/8 full),
    /// so that the next `insert` cannot fail; on an error nothing changed.
    pub fn reserve_one(&mut self) -> Result<(), IndexFull> {
        if self.entries.is_empty() {
            self.entries = Table::zeroed(MIN_ENTRIES)?;
        } else if !self.growing() && (self.len + 1) * 8 > self.entries.len() * 7 {
            let bigger = Table::zeroed(self.entries.len() * 2)?;
            self.old = std::mem::replace(&mut self.entries, bigger);
            self.cursor = 0;
            self.step();
        }
        Ok(())
    }

    /// Adds `slot` under `hash`; the caller knows its key is not in the index. On an error
    /// (the table could not grow) nothing changed.
    pub fn insert(&mut self, hash: u64, slot: u32) -> Result<(), IndexFull> {
        self.step();
        self.reserve_one()?;
        place(&mut self.entries, pack(hash, slot));
        self.len += 1;
        Ok(())
    }

    /// Moves the next few entries of the old table across; frees it once it is empty.
    fn step(&mut self) {
        if !self.growing() {
            return;
        }
        let end = (self.cursor + STEP).min(self.old.len());
        for i in self.cursor..end {
            // Empty entries stay empty: they end the old table's runs.
            let e = self.old[i];
            if slot_of(e).is_some() {
                self.old[i] = MOVED;
                place(&mut self.entries, e);
            }
        }
        self.cursor = end;
        if end == self.old.len() {
            self.old = Table::default();
            self.cursor = 0;
        }
    }

    /// Removes `slot`, filed under `hash`. Returns whether it was there.
    pub fn remove(&mut self, hash: u64, slot: u32) -> bool {
        self.step();
        let h = hash as u32;
        if let Some(i) = position(&self.old, h, |s| s == slot) {
            // The old table only empties: a moved mark keeps the runs of its other entries.
            self.old[i] = MOVED;
            self.len -= 1;
            return true;
        }
        let Some(mut hole) = position(&self.entries, h, |s| s == slot) else {
            return false;
        };
        // Backward shift: later entries of the same run move into the hole when it lies on
        // their probe path, so that no lookup meets an empty entry before its key.
        let mask = self.entries.len() - 1;
        let mut j = (hole + 1) & mask;
        loop {
            let e = self.entries[j];
            if e == EMPTY {
                break;
            }
            let home = hash_of(e) as usize & mask;
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.entries[hole] = e;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.entries[hole] = EMPTY;
        self.len -= 1;
        true
    }
}

/// A hint to the CPU to bring `value`'s cache line in; no effect on what the program computes.
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache; it never faults and `value` is a valid reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A model: slot → hash; the index must agree with it after any sequence.
    fn check(ix: &KeyIndex, model: &HashMap<u32, u64>) {
        assert_eq!(ix.len(), model.len());
        for (&slot, &hash) in model {
            assert_eq!(ix.find(hash, |s| s == slot), Some(slot), "slot {slot}");
        }
    }

    #[test]
    fn inserts_and_removes_agree_with_a_model_even_when_hashes_collide() {
        for seed in 0..20 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut ix = KeyIndex::default();
            let mut model: HashMap<u32, u64> = HashMap::new();
            let mut next = 0u32;
            for _ in 0..3000 {
                if rng.u8(..3) > 0 || model.is_empty() {
                    // Few distinct hashes, and low bits that cluster: long runs, wraps, ties.
                    let hash = rng.u64(..64) * (1 << 40) + rng.u64(..8);
                    ix.insert(hash, next).unwrap();
                    model.insert(next, hash);
                    next += 1;
                } else {
                    let slot = *model.keys().nth(rng.usize(..model.len())).unwrap();
                    let hash = model.remove(&slot).unwrap();
                    assert!(ix.remove(hash, slot));
                    assert!(!ix.remove(hash, slot));
                    assert_eq!(ix.find(hash, |s| s == slot), None);
                }
            }
            check(&ix, &model);
            assert!(ix.entries.len() * 7 >= ix.len() * 8);
            // Growing ends: removes and inserts move the old table across.
            for slot in model.keys().copied().collect::<Vec<_>>() {
                let hash = model.remove(&slot).unwrap();
                assert!(ix.remove(hash, slot));
            }
            assert!(!ix.growing() && ix.is_empty());
            assert!(ix.entries.iter().all(|&e| e == EMPTY));
        }
    }

    #[test]
    fn lookups_of_absent_keys_end_and_an_empty_index_finds_nothing() {
        let mut ix = KeyIndex::default();
        assert_eq!(ix.find(5, |_| true), None);
        assert!(!ix.remove(5, 1));
        ix.prefetch(5);
        for slot in 0..14 {
            ix.insert(slot as u64, slot).unwrap(); // nearly full: 14 of 16
        }
        assert_eq!(ix.entries.len(), 16);
        assert_eq!(ix.find(99, |_| true), None);
        assert_eq!(ix.candidate(3), Some(3));
        ix.insert(100, 100).unwrap();
        assert_eq!(ix.entries.len(), 32, "grew past 7/8");
        // Growing moves a few old entries per insert; both tables are searched meanwhile.
        assert!(ix.growing());
        assert!((0..14).all(|s| ix.find(s as u64, |x| x == s) == Some(s)));
        assert_eq!(ix.find(100, |s| s == 100), Some(100));
        ix.insert(101, 101).unwrap();
        assert!(!ix.growing(), "16 old entries, 8 moved per insert");
        assert!((0..14).all(|s| ix.find(s as u64, |x| x == s) == Some(s)));
        assert_eq!(ix.len(), 16);
    }
}
