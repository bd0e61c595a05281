//! Version stamps: a table in a store's memory that says, for each recorded object, which
//! version its extent holds, so that a client that reads the bytes one-sidedly (RDMA READ) can
//! read the version beside them in the same doorbell instead of asking the store
//! (`CHECK_VERSION`, a TCP round trip).
//!
//! The table is direct-mapped: an extent starting at `offset` has its stamp in slot
//! [`slot`]`(offset)`, which holds the version recorded there, or 0. A slot belongs to one
//! record at a time (the first that maps to it); a record whose slot is taken gets no stamp,
//! and a reader of it finds another version and asks the store as before. The store writes the
//! stamp when it records an object (its bytes complete) and clears it before it drops the
//! record, so before it acknowledges the master's forget: a stamp that reads `v` means the
//! record of `v` was there at that moment. Versions are never recorded twice, and a slot only
//! changes between 0 and a version (never from one version to another), so a read torn by a
//! concurrent update mixes a version with zeros, which reads as `v` only while `v` is being
//! written or cleared, when the record is there too. Why that is enough, with the client's lease
//! window, is in docs/kv-pool.md ("Versions").

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of one stamp.
pub const STAMP_BYTES: u64 = 8;
/// Extents start on this boundary (the master's allocation unit for memory segments).
const UNIT: u64 = 64;
/// One slot per this many bytes of segment, within [`MIN_SLOTS`, `MAX_SLOTS`].
const BYTES_PER_SLOT: u64 = 8 << 10;
const MIN_SLOTS: u64 = 1 << 10;
const MAX_SLOTS: u64 = 1 << 20;

/// How many slots a segment of `segment_bytes` gets (a power of two).
pub fn slots_for(segment_bytes: u64) -> u64 {
    (segment_bytes / BYTES_PER_SLOT)
        .next_power_of_two()
        .clamp(MIN_SLOTS, MAX_SLOTS)
}

/// The slot of the extent at `offset` in a table of `slots` (a power of two) slots.
pub fn slot(offset: u64, slots: u64) -> u64 {
    debug_assert!(slots.is_power_of_two());
    // Fibonacci hashing of the allocation unit: neighbouring extents spread over the table.
    let h = (offset / UNIT).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - slots.trailing_zeros().max(1))) & (slots - 1)
}

/// The table's memory: page-aligned, so it can be registered with a NIC, and written only
/// through atomics (a NIC may read it at any time).
pub struct StampTable {
    map: memmap2::MmapMut,
    slots: u64,
}

impl StampTable {
    /// A zeroed table with a slot per stamp unit of a `segment_bytes` segment.
    pub fn new(segment_bytes: u64) -> std::io::Result<StampTable> {
        let slots = slots_for(segment_bytes);
        let map = memmap2::MmapMut::map_anon((slots * STAMP_BYTES) as usize)?;
        Ok(StampTable { map, slots })
    }

    /// The table's slots.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The table's address and length, to register it.
    pub fn memory(&self) -> (*mut u8, usize) {
        (self.map.as_ptr() as *mut u8, self.map.len())
    }

    fn cell(&self, slot: u64) -> &AtomicU64 {
        let cells = self.map.as_ptr() as *const AtomicU64;
        // SAFETY: the mapping is page-aligned and `slots` cells long, `slot < slots`; every
        // access to it is atomic.
        unsafe { &*cells.add((slot % self.slots) as usize) }
    }

    /// The stamp in `slot`. Stamps are little-endian in memory, as a reader on any host
    /// decodes them.
    pub fn get(&self, slot: u64) -> u64 {
        u64::from_le(self.cell(slot).load(Ordering::Acquire))
    }

    fn set(&self, slot: u64, version: u64) {
        self.cell(slot).store(version.to_le(), Ordering::Release);
    }
}

/// The table with its owners: which record (by offset) each slot's stamp belongs to. Kept
/// beside the records and changed only under their lock.
pub struct Stamps {
    table: std::sync::Arc<StampTable>,
    /// Per slot, the owning record's offset + 1, or 0 when free.
    owners: Vec<u64>,
}

impl Stamps {
    /// `table`, every slot free.
    pub fn new(table: std::sync::Arc<StampTable>) -> Stamps {
        let owners = vec![0; table.slots as usize];
        Stamps { table, owners }
    }

    /// A record of `version` at `offset` now exists: stamp it, if its slot is free.
    pub fn recorded(&mut self, offset: u64, version: u64) {
        let s = slot(offset, self.table.slots);
        if self.owners[s as usize] == 0 && version != 0 {
            self.owners[s as usize] = offset + 1;
            self.table.set(s, version);
        }
    }

    /// The record at `offset` is about to be dropped: clear its stamp, if it has one.
    pub fn dropping(&mut self, offset: u64) {
        let s = slot(offset, self.table.slots);
        if self.owners[s as usize] == offset + 1 {
            self.table.set(s, 0);
            self.owners[s as usize] = 0;
        }
    }

    /// Every record is about to be dropped.
    pub fn clear(&mut self) {
        for (s, owner) in self.owners.iter_mut().enumerate() {
            if *owner != 0 {
                self.table.set(s as u64, 0);
                *owner = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn tables_scale_with_the_segment_within_bounds() {
        assert_eq!(slots_for(0), MIN_SLOTS);
        assert_eq!(slots_for(512 << 20), 64 << 10);
        assert_eq!(slots_for(1 << 40), MAX_SLOTS);
        assert!(slots_for(3 << 30).is_power_of_two());
    }

    #[test]
    fn neighbouring_extents_land_in_different_slots() {
        let slots = 1 << 12;
        let used: std::collections::HashSet<u64> =
            (0..1024u64).map(|i| slot(i * 4096, slots)).collect();
        assert!(used.len() > 1000, "{} distinct slots of 1024", used.len());
        assert!((0..1 << 16).all(|i| slot(i * UNIT, slots) < slots));
    }

    #[test]
    fn a_stamp_lives_exactly_as_long_as_its_record_and_a_taken_slot_is_not_stolen() {
        let table = Arc::new(StampTable::new(8 << 20).unwrap());
        let slots = table.slots();
        let mut stamps = Stamps::new(table.clone());
        stamps.recorded(4096, 7);
        assert_eq!(table.get(slot(4096, slots)), 7);
        // Another extent in the same slot gets no stamp and leaves the owner's alone.
        let other = (1..1 << 20)
            .map(|i| 4096 + i * UNIT)
            .find(|o| slot(*o, slots) == slot(4096, slots))
            .expect("a colliding offset");
        stamps.recorded(other, 9);
        assert_eq!(table.get(slot(4096, slots)), 7);
        stamps.dropping(other);
        assert_eq!(table.get(slot(4096, slots)), 7, "not its stamp to clear");
        stamps.dropping(4096);
        assert_eq!(table.get(slot(4096, slots)), 0);
        // Freed, the slot takes the next record.
        stamps.recorded(other, 9);
        assert_eq!(table.get(slot(other, slots)), 9);
        stamps.clear();
        assert_eq!(table.get(slot(other, slots)), 0);
    }
}
