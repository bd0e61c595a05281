//! The index from keys to object slots: an open-addressing hash table (linear probing,
//! backward-shift deletion) of 8-byte entries, each a slot number and the low 32 bits of its
//! key's hash. The table itself never reads a key: the caller's `is` closure compares the one
//! the slot holds, and only for entries whose hash bits match. It exists, rather than a general
//! hash map, so that a batch of lookups can prefetch where each key's entry lies (`prefetch`)
//! and overlap their cache misses: a lookup among millions of objects is otherwise three or four
//! misses in a row.

/// Marks an empty entry (its slot part).
const NIL: u32 = u32::MAX;
const EMPTY: u64 = u64::MAX;
/// Fewest entries a non-empty table has.
const MIN_ENTRIES: usize = 16;

#[derive(Debug, Default)]
pub struct KeyIndex {
    /// A power of two long (or empty); at most 7/8 full.
    entries: Vec<u64>,
    len: usize,
}

fn pack(hash: u64, slot: u32) -> u64 {
    ((hash as u32 as u64) << 32) | slot as u64
}

fn slot_of(e: u64) -> u32 {
    e as u32
}

fn hash_of(e: u64) -> u32 {
    (e >> 32) as u32
}

impl KeyIndex {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    fn home(&self, hash: u32) -> usize {
        hash as usize & self.mask()
    }

    /// The slot of the key with `hash` for which `is(slot)` holds.
    pub fn find(&self, hash: u64, mut is: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.entries.is_empty() {
            return None;
        }
        let h = hash as u32;
        let mask = self.mask();
        let mut i = self.home(h);
        loop {
            let e = self.entries[i];
            if slot_of(e) == NIL {
                return None;
            }
            if hash_of(e) == h && is(slot_of(e)) {
                return Some(slot_of(e));
            }
            i = (i + 1) & mask;
        }
    }

    /// The first slot whose hash bits match `hash`: most likely the key's (for prefetching).
    pub fn candidate(&self, hash: u64) -> Option<u32> {
        self.find(hash, |_| true)
    }

    /// Asks the CPU to fetch the entry where a lookup of `hash` starts.
    pub fn prefetch(&self, hash: u64) {
        if !self.entries.is_empty() {
            prefetch(&self.entries[self.home(hash as u32)]);
        }
    }

    /// Adds `slot` under `hash`; the caller knows its key is not in the index.
    pub fn insert(&mut self, hash: u64, slot: u32) {
        if (self.len + 1) * 8 > self.entries.len() * 7 {
            self.grow();
        }
        self.place(pack(hash, slot));
        self.len += 1;
    }

    fn place(&mut self, e: u64) {
        let mask = self.mask();
        let mut i = self.home(hash_of(e));
        while slot_of(self.entries[i]) != NIL {
            i = (i + 1) & mask;
        }
        self.entries[i] = e;
    }

    fn grow(&mut self) {
        let size = (self.entries.len() * 2).max(MIN_ENTRIES);
        let old = std::mem::replace(&mut self.entries, vec![EMPTY; size]);
        for e in old.into_iter().filter(|&e| slot_of(e) != NIL) {
            self.place(e);
        }
    }

    /// Removes `slot`, filed under `hash`. Returns whether it was there.
    pub fn remove(&mut self, hash: u64, slot: u32) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let mask = self.mask();
        let mut hole = self.home(hash as u32);
        loop {
            let e = self.entries[hole];
            if slot_of(e) == NIL {
                return false;
            }
            if slot_of(e) == slot {
                break;
            }
            hole = (hole + 1) & mask;
        }
        // Backward shift: later entries of the same run move into the hole when it lies on
        // their probe path, so that no lookup meets an empty entry before its key.
        let mut j = (hole + 1) & mask;
        loop {
            let e = self.entries[j];
            if slot_of(e) == NIL {
                break;
            }
            let home = self.home(hash_of(e));
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

    /// Bytes the table takes.
    pub fn bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<u64>()
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
                    ix.insert(hash, next);
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
        }
    }

    #[test]
    fn lookups_of_absent_keys_end_and_an_empty_index_finds_nothing() {
        let mut ix = KeyIndex::default();
        assert_eq!(ix.find(5, |_| true), None);
        assert!(!ix.remove(5, 1));
        ix.prefetch(5);
        for slot in 0..14 {
            ix.insert(slot as u64, slot); // nearly full: 14 of 16
        }
        assert_eq!(ix.entries.len(), 16);
        assert_eq!(ix.find(99, |_| true), None);
        assert_eq!(ix.candidate(3), Some(3));
        ix.insert(100, 100);
        assert_eq!(ix.entries.len(), 32, "grew past 7/8");
        assert_eq!(ix.find(100, |s| s == 100), Some(100));
    }
}
