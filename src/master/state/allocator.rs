//! Per-segment space allocator: best fit over a free list indexed both by size and by offset, so
//! allocation is O(log n) and freed neighbours coalesce at once (little fragmentation).
//! Memory segments hand out 64-byte blocks; disk segments 4 KiB ones (`DISK_ALIGN`), so every
//! disk-tier range can be read and written with `O_DIRECT`.

use std::collections::{BTreeMap, BTreeSet};

/// Every allocation is rounded up to this, so payloads start cache-line aligned.
pub const ALIGN: u64 = 64;

/// A disk segment's block: the store's direct I/O granularity (`store::disk::BLOCK`).
pub const DISK_ALIGN: u64 = 4096;

/// A memory page: large allocations start on one.
pub const PAGE: u64 = 4096;
/// Allocations this large or larger start on a page.
pub const PAGE_ALIGNED_FROM: u64 = 64 << 10;

/// `size` rounded up to memory blocks.
pub fn aligned(size: u64) -> u64 {
    size.div_ceil(ALIGN) * ALIGN
}

/// One segment's space: best fit over free extents, by size and by offset.
#[derive(Debug)]
pub struct Allocator {
    /// Every allocation is a multiple of this and starts at one.
    align: u64,
    capacity: u64,
    used: u64,
    /// offset → length of each free extent.
    free_by_offset: BTreeMap<u64, u64>,
    /// (length, offset) of each free extent, for best fit.
    free_by_size: BTreeSet<(u64, u64)>,
}

impl Allocator {
    /// An allocator of memory blocks (`ALIGN`).
    pub fn new(capacity: u64) -> Allocator {
        Allocator::with_align(capacity, ALIGN)
    }

    /// An allocator of `align`-byte blocks (a power of two).
    pub fn with_align(capacity: u64, align: u64) -> Allocator {
        debug_assert!(align.is_power_of_two());
        let capacity = capacity / align * align;
        let mut a = Allocator {
            align,
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

    /// Bytes the segment has.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// The space `size` bytes take here: rounded up to whole blocks.
    pub fn footprint(&self, size: u64) -> u64 {
        size.div_ceil(self.align) * self.align
    }
    /// Bytes allocated.
    pub fn used(&self) -> u64 {
        self.used
    }
    /// Bytes not allocated.
    pub fn free(&self) -> u64 {
        self.capacity - self.used
    }
    /// The largest run of free bytes: the largest object that fits in one piece.
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

    /// Allocates `size` bytes (rounded up to whole blocks); the smallest extent that fits is
    /// used.
    ///
    /// Allocations of `PAGE_ALIGNED_FROM` bytes or more start on a 4 KiB page, so that a store
    /// can hand them to direct I/O (its disk tier) without copying them first.
    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        let need = self.footprint(size);
        let align = if need >= PAGE_ALIGNED_FROM {
            self.align.max(PAGE)
        } else {
            self.align
        };
        let fits = |&(len, offset): &(u64, u64)| {
            let pad = (align - offset % align) % align;
            (len >= need + pad).then_some((len, offset, pad))
        };
        // The best fit whose start can be aligned: a few extents just large enough may not be;
        // any of `need + align` or more is.
        let found = self
            .free_by_size
            .range((need, 0)..)
            .take(16)
            .find_map(fits)
            .or_else(|| self.free_by_size.range((need + align, 0)..).find_map(fits));
        let (len, offset, pad) = found?;
        self.remove_free(offset, len);
        if pad > 0 {
            self.insert_free(offset, pad);
        }
        let tail = len - pad - need;
        if tail > 0 {
            self.insert_free(offset + pad + need, tail);
        }
        self.used += need;
        Some(offset + pad)
    }

    /// Takes the specific range `[offset, offset + size)` (rounded up to whole blocks), as a
    /// recovering store reports it; false when any of it is not free or `offset` is unaligned.
    pub fn reserve(&mut self, offset: u64, size: u64) -> bool {
        let need = self.footprint(size);
        if size == 0 || offset % self.align != 0 || offset.checked_add(need).is_none() {
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
        let mut len = self.footprint(size);
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
    fn large_allocations_start_on_a_page_and_the_gap_stays_usable() {
        let mut a = Allocator::new(1 << 20);
        let small = a.alloc(100).unwrap();
        let big = a.alloc(64 << 10).unwrap();
        assert_eq!(small, 0);
        assert_eq!(big % PAGE, 0, "page-aligned");
        assert_eq!(a.used(), 128 + (64 << 10), "the gap is not counted as used");
        // The gap before the large allocation takes small ones.
        let again = a.alloc(1000).unwrap();
        assert!(again < big, "{again} fills the gap before {big}");
        a.release(big, 64 << 10);
        a.release(again, 1000);
        a.release(small, 100);
        assert_eq!(
            (a.used(), a.largest_free()),
            (0, 1 << 20),
            "everything coalesces"
        );
    }

    #[test]
    fn a_disk_allocator_hands_out_whole_4k_blocks() {
        let mut a = Allocator::with_align(1 << 20, DISK_ALIGN);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(5000).unwrap();
        assert_eq!([x % DISK_ALIGN, y % DISK_ALIGN], [0, 0]);
        assert_eq!(a.used(), 4096 + 8192);
        assert!(!a.reserve(64, 10), "unaligned for a disk segment");
        a.release(y, 5000);
        a.release(x, 100);
        assert_eq!((a.used(), a.largest_free()), (0, 1 << 20));
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
                let size = if rng.u8(..) < 32 {
                    rng.u64(PAGE_ALIGNED_FROM..200_000)
                } else {
                    rng.u64(1..20_000)
                };
                if let Some(off) = a.alloc(size) {
                    assert!(size < PAGE_ALIGNED_FROM || off % PAGE == 0, "aligned");
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
