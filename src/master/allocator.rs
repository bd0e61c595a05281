//! Per-segment space allocator: best fit over a free list indexed both by size and by offset, so
//! allocation is O(log n) and freed neighbours coalesce at once (little fragmentation).

use std::collections::{BTreeMap, BTreeSet};

/// Every allocation is rounded up to this, so payloads start cache-line aligned.
pub const ALIGN: u64 = 64;

pub fn aligned(size: u64) -> u64 {
    size.div_ceil(ALIGN) * ALIGN
}

#[derive(Debug)]
pub struct Allocator {
    capacity: u64,
    used: u64,
    /// offset → length of each free extent.
    free_by_offset: BTreeMap<u64, u64>,
    /// (length, offset) of each free extent, for best fit.
    free_by_size: BTreeSet<(u64, u64)>,
}

impl Allocator {
    pub fn new(capacity: u64) -> Allocator {
        let capacity = capacity / ALIGN * ALIGN;
        let mut a = Allocator {
            capacity,
            used: 0,
            free_by_offset: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn free(&self) -> u64 {
        self.capacity - self.used
    }
    pub fn largest_free(&self) -> u64 {
        self.free_by_size
            .iter()
            .next_back()
            .map_or(0, |(len, _)| *len)
    }
    /// `1 − largest_free / total_free`: 0 when all free space is one extent.
    pub fn fragmentation(&self) -> f64 {
        let free = self.free();
        if free == 0 {
            0.0
        } else {
            1.0 - self.largest_free() as f64 / free as f64
        }
    }

    /// Allocates `size` bytes (rounded up to `ALIGN`); the smallest extent that fits is used.
    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        let need = aligned(size);
        let &(len, offset) = self.free_by_size.range((need, 0)..).next()?;
        self.remove_free(offset, len);
        if len > need {
            self.insert_free(offset + need, len - need);
        }
        self.used += need;
        Some(offset)
    }

    /// Takes the specific range `[offset, offset + size)` (rounded up to `ALIGN`), as a
    /// recovering store reports it; false when any of it is not free or `offset` is unaligned.
    pub fn reserve(&mut self, offset: u64, size: u64) -> bool {
        let need = aligned(size);
        if size == 0 || offset % ALIGN != 0 || offset.checked_add(need).is_none() {
            return false;
        }
        let Some((&start, &len)) = self.free_by_offset.range(..=offset).next_back() else {
            return false;
        };
        if start + len < offset + need {
            return false;
        }
        self.remove_free(start, len);
        if offset > start {
            self.insert_free(start, offset - start);
        }
        let tail = start + len - (offset + need);
        if tail > 0 {
            self.insert_free(offset + need, tail);
        }
        self.used += need;
        true
    }

    /// Frees an allocation made with the same `size`.
    pub fn release(&mut self, offset: u64, size: u64) {
        let mut start = offset;
        let mut len = aligned(size);
        debug_assert!(start + len <= self.capacity);
        self.used = self.used.saturating_sub(len);
        if let Some((&prev_off, &prev_len)) = self.free_by_offset.range(..start).next_back() {
            if prev_off + prev_len == start {
                self.remove_free(prev_off, prev_len);
                start = prev_off;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.free_by_offset.get(&(start + len)) {
            self.remove_free(start + len, next_len);
            len += next_len;
        }
        self.insert_free(start, len);
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.insert(offset, len);
        self.free_by_size.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.remove(&offset);
        self.free_by_size.remove(&(len, offset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_takes_exact_ranges_and_refuses_taken_ones() {
        let mut a = Allocator::new(1024);
        assert!(a.reserve(128, 100));
        assert!(!a.reserve(192, 10), "overlaps the first reservation");
        assert!(!a.reserve(100, 10), "unaligned");
        assert!(!a.reserve(1000, 64), "past the end");
        assert!(a.reserve(0, 64));
        assert_eq!(a.used(), 64 + 128);
        assert_eq!(a.largest_free(), 1024 - 256);
        a.release(128, 100);
        a.release(0, 64);
        assert_eq!((a.used(), a.largest_free()), (0, 1024));
    }

    #[test]
    fn allocations_are_disjoint_aligned_and_accounted() {
        let mut a = Allocator::new(1 << 20);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(64).unwrap();
        let z = a.alloc(1).unwrap();
        assert_eq!([x % ALIGN, y % ALIGN, z % ALIGN], [0, 0, 0]);
        assert!(x + 128 <= y || y + 64 <= x);
        assert_eq!(a.used(), 128 + 64 + 64);
        assert_eq!(a.alloc(0), None);
    }

    #[test]
    fn freed_neighbours_coalesce_into_one_extent() {
        let mut a = Allocator::new(4096);
        let offs: Vec<u64> = (0..64).map(|_| a.alloc(64).unwrap()).collect();
        assert_eq!(a.alloc(1), None, "full");
        // Free every other block: 32 holes of 64 bytes, fragmented.
        for o in offs.iter().step_by(2) {
            a.release(*o, 64);
        }
        assert_eq!(a.largest_free(), 64);
        assert!(a.fragmentation() > 0.9);
        assert_eq!(a.alloc(128), None, "no hole of 128 bytes yet");
        for o in offs.iter().skip(1).step_by(2) {
            a.release(*o, 64);
        }
        assert_eq!(a.used(), 0);
        assert_eq!(a.largest_free(), 4096);
        assert_eq!(a.fragmentation(), 0.0);
        assert_eq!(a.alloc(4096), Some(0));
    }

    #[test]
    fn best_fit_keeps_large_extents_whole() {
        let mut a = Allocator::new(10 * 1024);
        let small = a.alloc(1024).unwrap();
        let _big = a.alloc(4096).unwrap();
        let _rest = a.alloc(1024).unwrap();
        a.release(small, 1024); // a 1 KiB hole at the front, 4 KiB free at the end
        let again = a.alloc(1000).unwrap();
        assert_eq!(again, small, "the exact-size hole is chosen");
        assert_eq!(a.largest_free(), 4096);
    }

    #[test]
    fn random_churn_never_overlaps_and_returns_to_empty() {
        let mut a = Allocator::new(1 << 20);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..5000 {
            if rng.bool() || live.is_empty() {
                let size = rng.u64(1..20_000);
                if let Some(off) = a.alloc(size) {
                    for &(o, s) in &live {
                        assert!(off + aligned(size) <= o || o + aligned(s) <= off, "overlap");
                    }
                    live.push((off, size));
                }
            } else {
                let (o, s) = live.swap_remove(rng.usize(..live.len()));
                a.release(o, s);
            }
            assert_eq!(a.used(), live.iter().map(|(_, s)| aligned(*s)).sum::<u64>());
        }
        for (o, s) in live.drain(..) {
            a.release(o, s);
        }
        assert_eq!(a.largest_free(), 1 << 20);
    }
}
