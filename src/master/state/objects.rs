//! The master's objects, laid out for millions of them: entries live in a slab of slots, a
//! hash table maps each key to its slot number (`key_index.rs`: 8 bytes a key, hashed with
//! foldhash; a batch prefetches its lookups), and the slots are threaded on intrusive lists that keep least-recently-used order as objects are
//! touched, so that eviction takes the oldest from the head instead of sorting every object.
//!
//! Three lists: *recent* holds every object in memory in access order; *set aside* holds
//! soft-pinned objects that an eviction walk passed (soft-pinned objects go only when nothing
//! else is left), in the order they were found, which is their access order; *disk* holds the
//! objects that live only in the disk tier, in access order, for the disk tier's own eviction.
//! Touching an object moves it to the tail of its list (*recent* for one set aside); an object
//! set aside whose pin runs out goes back to the head of *recent*, being older than everything
//! the walk that set it aside left there. Demotion and promotion move an object between
//! *recent* and *disk* (`to_disk`, `to_memory`).

use super::key_index::{prefetch, KeyIndex};
use foldhash::fast::RandomState;
use smallvec::SmallVec;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use crate::transfer::message::ReplicaLoc;

/// An object's replicas: one is held inline (no allocation), more spill to the heap.
pub type Replicas = SmallVec<[ReplicaLoc; 1]>;

/// A readable version of an object.
#[derive(Clone, Debug)]
pub struct Version {
    pub object_id: u64,
    pub size: u64,
    pub checksum: u32,
    /// No CRC-32C was taken of the value: `checksum` means nothing (`ObjectDesc::unhashed`).
    pub unhashed: bool,
    pub replicas: Replicas,
    pub last_access: Instant,
    pub lease_until: Instant,
    pub soft_pin_until: Option<Instant>,
    /// Reads since the object went to the disk tier (promotion's admission count).
    pub disk_hits: u8,
}

/// A put in progress (or a reservation): allocated, versioned, not yet readable.
#[derive(Clone, Debug)]
pub struct Pending {
    pub object_id: u64,
    pub client_id: u64,
    pub size: u64,
    pub replicas: Vec<ReplicaLoc>,
    pub started: Instant,
    pub soft_pin_ttl: Option<Duration>,
    /// A checksum a store sent for this put before it ended (`OBJECTS_HASHED` overtaking the
    /// end of a put the store recorded unhashed): the version gets it when it is committed
    /// unhashed.
    pub hashed_early: Option<u32>,
}

/// A key's current version and its put in progress; a key with neither is not kept.
#[derive(Debug, Default)]
pub struct Entry {
    pub current: Option<Version>,
    /// Boxed: few keys have a put in progress at any moment.
    pub pending: Option<Box<Pending>>,
}

/// What an eviction walk does with the object it looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Evict it: frees this many bytes.
    Evict(u64),
    /// Leave it, and move it to the back of the order (leased, unreadable, being written).
    PassOver,
    /// Soft-pinned: set it aside, to be taken only when nothing else is left.
    SetAside,
    /// Not this walk's business: leave it where it is.
    Skip,
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    Recent = 0,
    SetAside = 1,
    /// Objects only in the disk tier.
    Disk = 2,
    /// A free slot; `next` links the free slots.
    Free = 3,
}

const LISTS: usize = 3;

/// Key and links first: a lookup and a touch read the first cache line.
#[derive(Debug)]
#[repr(C)]
struct Slot {
    key: Box<str>,
    prev: u32,
    next: u32,
    list: List,
    entry: Entry,
}

/// Slots in chunks of a fixed size: growing never moves or copies a slot (which would hold the
/// master's lock for tens of milliseconds at millions of objects) nor leaves a freed copy of
/// the table for the allocator to hand back.
#[derive(Debug, Default)]
struct Slots {
    chunks: Vec<Vec<Slot>>,
    len: usize,
}

const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

impl Slots {
    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, slot: Slot) {
        if self.len % CHUNK == 0 {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push(slot);
            self.len += 1;
        }
    }

    fn get(&self, i: usize) -> Option<&Slot> {
        self.chunks.get(i >> CHUNK_BITS)?.get(i & (CHUNK - 1))
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.chunks.iter().flatten()
    }
}

impl std::ops::Index<usize> for Slots {
    type Output = Slot;
    fn index(&self, i: usize) -> &Slot {
        &self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

impl std::ops::IndexMut<usize> for Slots {
    fn index_mut(&mut self, i: usize) -> &mut Slot {
        &mut self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
};

/// Why one more key does not fit in the object table.
#[derive(Debug, thiserror::Error)]
pub enum TableFull {
    #[error("the master holds 4,294,967,294 objects, its most")]
    Slots,
    #[error(transparent)]
    Index(super::key_index::IndexFull),
}

/// The master's objects: a slab of slots, found by key through the key index.
#[derive(Debug)]
pub struct ObjectTable {
    slots: Slots,
    /// First free slot, or NIL.
    free: u32,
    index: KeyIndex,
    hasher: RandomState,
    lists: [Ends; LISTS],
    /// Objects on each list.
    list_len: [usize; LISTS],
    len: usize,
}

impl Default for ObjectTable {
    fn default() -> Self {
        ObjectTable {
            slots: Slots::default(),
            free: NIL,
            index: KeyIndex::default(),
            hasher: RandomState::default(),
            lists: [EMPTY; LISTS],
            list_len: [0; LISTS],
            len: 0,
        }
    }
}

impl ObjectTable {
    /// Objects held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no object is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The hash of `key`'s bytes, alone: `str`'s own `Hash` adds a terminator byte, which
    /// costs this hasher one more round.
    fn hash(&self, key: &str) -> u64 {
        use std::hash::Hasher;
        let mut h = self.hasher.build_hasher();
        h.write(key.as_bytes());
        h.finish()
    }

    fn find(&self, key: &str) -> Option<u32> {
        let hash = self.hash(key);
        let slots = &self.slots;
        self.index.find(hash, |i| &*slots[i as usize].key == key)
    }

    /// Brings what looking up and touching `keys` will read into the cache, all keys at once,
    /// so that their cache misses overlap instead of coming one after another; a batch
    /// operation calls it first. Changes nothing.
    pub fn prefetch<K: AsRef<str>>(&self, keys: &[K]) {
        let hashes: Vec<u64> = keys.iter().map(|k| self.hash(k.as_ref())).collect();
        for &h in &hashes {
            self.index.prefetch(h);
        }
        let slots: Vec<&Slot> = hashes
            .iter()
            .filter_map(|&h| self.index.candidate(h))
            .map(|i| &self.slots[i as usize])
            .collect();
        for s in &slots {
            prefetch(*s);
        }
        for s in &slots {
            if let Some(b) = s.key.as_bytes().first() {
                prefetch(b);
            }
            for n in [s.prev, s.next] {
                if let Some(n) = self.slots.get(n as usize) {
                    prefetch(n);
                }
            }
            if let Some(v) = &s.entry.current {
                prefetch(v);
            }
        }
    }

    /// `key`'s entry, without counting it as an access.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.find(key).map(|i| &self.slots[i as usize].entry)
    }

    /// `key`'s entry to change, without counting it as an access.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        self.find(key).map(|i| &mut self.slots[i as usize].entry)
    }

    /// Whether `key` is held.
    #[cfg(test)]
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    /// `key`'s entry, as an access: it moves to the back of its tier's eviction order.
    pub fn touch(&mut self, key: &str) -> Option<&mut Entry> {
        self.touch_tiered(key).map(|(e, _)| e)
    }

    /// As `touch`, and whether the object lives only in the disk tier.
    pub fn touch_tiered(&mut self, key: &str) -> Option<(&mut Entry, bool)> {
        let i = self.find(key)?;
        let slot = &self.slots[i as usize];
        let on_disk = slot.list == List::Disk;
        let list = if on_disk { List::Disk } else { List::Recent };
        if slot.list == list {
            self.move_back(list, i);
        } else {
            self.unlink(i);
            self.link_tail(list, i);
        }
        Some((&mut self.slots[i as usize].entry, on_disk))
    }

    /// Moves slot `i`, on `list`, to the back of it: the list's length stays, and a slot at
    /// the back already stays where it is.
    fn move_back(&mut self, list: List, i: u32) {
        let Slot { prev, next, .. } = self.slots[i as usize];
        if next == NIL {
            return;
        }
        let ends = &mut self.lists[list as usize];
        if prev == NIL {
            ends.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        let tail = std::mem::replace(&mut ends.tail, i);
        self.slots[next as usize].prev = prev;
        self.slots[tail as usize].next = i;
        let slot = &mut self.slots[i as usize];
        slot.prev = tail;
        slot.next = NIL;
    }

    /// `key` now lives only in the disk tier: it joins the back of the disk order. Whether it
    /// was in memory before.
    pub fn to_disk(&mut self, key: &str) -> bool {
        self.move_to(key, List::Disk)
    }

    /// `key` is in memory again: it joins the back of the memory order. Whether it was on
    /// the disk tier's list before.
    pub fn to_memory(&mut self, key: &str) -> bool {
        self.move_to(key, List::Recent)
    }

    /// Moves `key` to the back of `list`: whether it changed tier.
    fn move_to(&mut self, key: &str, list: List) -> bool {
        let Some(i) = self.find(key) else {
            return false;
        };
        let was_disk = self.slots[i as usize].list == List::Disk;
        self.unlink(i);
        self.link_tail(list, i);
        was_disk != (list == List::Disk)
    }

    /// Objects that live only in the disk tier.
    pub fn disk_len(&self) -> usize {
        self.list_len[List::Disk as usize]
    }

    /// Whether `key` is on the disk tier's list.
    pub fn on_disk(&self, key: &str) -> bool {
        self.find(key)
            .is_some_and(|i| self.slots[i as usize].list == List::Disk)
    }

    /// Makes sure one more key fits (a free slot number, room in the key index, which may
    /// have to grow), so that an insert that follows cannot fail: operations call it before
    /// they change anything. On an error nothing changed.
    pub fn make_room(&mut self) -> Result<(), TableFull> {
        if self.free == NIL && self.next_slot().is_none() {
            return Err(TableFull::Slots);
        }
        self.index.reserve_one().map_err(TableFull::Index)
    }

    /// The number a new slot at the end would have, if it can have one.
    fn next_slot(&self) -> Option<u32> {
        u32::try_from(self.slots.len()).ok().filter(|&i| i != NIL)
    }

    /// `key`'s entry, made empty and most recently used if it was not kept, else touched.
    pub fn touch_or_insert(&mut self, key: &str) -> Result<&mut Entry, TableFull> {
        let i = match self.find(key) {
            Some(i) => {
                self.unlink(i);
                i
            }
            None => self.insert_new(key)?,
        };
        self.link_tail(List::Recent, i);
        Ok(&mut self.slots[i as usize].entry)
    }

    /// `key`'s entry, inserted empty and most recently used if it was not kept.
    pub fn get_or_insert(&mut self, key: &str) -> Result<&mut Entry, TableFull> {
        let i = match self.find(key) {
            Some(i) => i,
            None => {
                let i = self.insert_new(key)?;
                self.link_tail(List::Recent, i);
                i
            }
        };
        Ok(&mut self.slots[i as usize].entry)
    }

    /// Takes a free slot for `key` and indexes it; the caller links it. On an error nothing
    /// changed.
    fn insert_new(&mut self, key: &str) -> Result<u32, TableFull> {
        let i = match self.free {
            NIL => self.next_slot().ok_or(TableFull::Slots)?,
            free => free,
        };
        self.index
            .insert(self.hash(key), i)
            .map_err(TableFull::Index)?;
        let slot = Slot {
            key: key.into(),
            entry: Entry::default(),
            prev: NIL,
            next: NIL,
            list: List::Free,
        };
        if i == self.free {
            self.free = self.slots[i as usize].next;
            self.slots[i as usize] = slot;
        } else {
            self.slots.push(slot);
        }
        self.len += 1;
        Ok(i)
    }

    /// Drops `key` and returns its entry.
    pub fn remove(&mut self, key: &str) -> Option<Entry> {
        let i = self.find(key)?;
        Some(self.remove_slot(i))
    }

    fn remove_slot(&mut self, i: u32) -> Entry {
        let hash = self.hash(&self.slots[i as usize].key);
        self.index.remove(hash, i);
        self.unlink(i);
        let slot = &mut self.slots[i as usize];
        slot.key = Box::default();
        slot.list = List::Free;
        slot.next = self.free;
        self.free = i;
        self.len -= 1;
        std::mem::take(&mut slot.entry)
    }

    /// Keeps the entries for which `keep` is true; the others are dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut Entry) -> bool) {
        for i in 0..self.slots.len() as u32 {
            let slot = &mut self.slots[i as usize];
            if slot.list != List::Free && !keep(&slot.key, &mut slot.entry) {
                self.remove_slot(i);
            }
        }
    }

    /// `retain` over at most `budget` slots from slot `from`: returns where to go on, or `None`
    /// once past the last slot. Slots never move, so a walk in steps (with other operations
    /// between them) visits every object that was there when it began.
    pub fn retain_some(
        &mut self,
        from: u32,
        budget: usize,
        mut keep: impl FnMut(&str, &mut Entry, bool) -> bool,
    ) -> Option<u32> {
        let end = (from as usize).saturating_add(budget).min(self.slots.len());
        for i in from as usize..end {
            let slot = &mut self.slots[i];
            let on_disk = slot.list == List::Disk;
            if slot.list != List::Free && !keep(&slot.key, &mut slot.entry, on_disk) {
                self.remove_slot(i as u32);
            }
        }
        (end < self.slots.len()).then_some(end as u32)
    }

    /// Every kept key and entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.slots
            .iter()
            .filter(|s| s.list != List::Free)
            .map(|s| (&*s.key, &s.entry))
    }

    /// Every entry, in slot order.
    #[cfg(test)]
    pub fn values(&self) -> impl Iterator<Item = &Entry> {
        self.iter().map(|(_, e)| e)
    }

    /// `key`'s soft pin ran out: if an eviction walk had set it aside, it goes back to the head
    /// of the order (it was older than everything that walk left in the recent list).
    pub fn unpinned(&mut self, key: &str) {
        if let Some(i) = self.find(key) {
            if self.slots[i as usize].list == List::SetAside {
                self.unlink(i);
                self.link_head(List::Recent, i);
            }
        }
    }

    /// Walks the objects from the least recently used, recent list first, then the set-aside
    /// list, asking `judge` about each (`true` on the set-aside pass) until the objects judged
    /// to go free `need` bytes. Each object is looked at once. Returns those objects' keys,
    /// oldest first; the caller removes them.
    pub fn eviction_walk(
        &mut self,
        need: u64,
        judge: impl FnMut(&str, &Entry, bool) -> Verdict,
    ) -> Vec<Box<str>> {
        self.walk(
            &[(List::Recent, false), (List::SetAside, true)],
            need,
            judge,
        )
    }

    /// As `eviction_walk`, over the objects only in the disk tier.
    pub fn disk_eviction_walk(
        &mut self,
        need: u64,
        judge: impl FnMut(&str, &Entry, bool) -> Verdict,
    ) -> Vec<Box<str>> {
        self.walk(&[(List::Disk, true)], need, judge)
    }

    fn walk(
        &mut self,
        lists: &[(List, bool)],
        need: u64,
        mut judge: impl FnMut(&str, &Entry, bool) -> Verdict,
    ) -> Vec<Box<str>> {
        let mut victims = Vec::new();
        let mut freed = 0u64;
        for &(list, set_aside_pass) in lists {
            // Objects passed over move behind the last one looked at: stop there.
            let last = self.lists[list as usize].tail;
            let mut at = self.lists[list as usize].head;
            while at != NIL && freed < need {
                let slot = &self.slots[at as usize];
                let next = if at == last { NIL } else { slot.next };
                match judge(&slot.key, &slot.entry, set_aside_pass) {
                    Verdict::Evict(bytes) => {
                        freed = freed.saturating_add(bytes);
                        victims.push(slot.key.clone());
                    }
                    Verdict::PassOver => {
                        self.unlink(at);
                        self.link_tail(list, at);
                    }
                    Verdict::SetAside if !set_aside_pass => {
                        self.unlink(at);
                        self.link_tail(List::SetAside, at);
                    }
                    Verdict::SetAside => {
                        self.unlink(at);
                        self.link_tail(list, at);
                    }
                    Verdict::Skip => {}
                }
                at = next;
            }
        }
        victims
    }

    fn unlink(&mut self, i: u32) {
        let Slot {
            prev, next, list, ..
        } = self.slots[i as usize];
        if list == List::Free {
            return;
        }
        self.list_len[list as usize] -= 1;
        let ends = &mut self.lists[list as usize];
        if prev == NIL {
            ends.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            ends.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let slot = &mut self.slots[i as usize];
        slot.prev = NIL;
        slot.next = NIL;
        slot.list = List::Free;
    }

    fn link_tail(&mut self, list: List, i: u32) {
        self.list_len[list as usize] += 1;
        let ends = &mut self.lists[list as usize];
        let tail = ends.tail;
        ends.tail = i;
        if tail == NIL {
            ends.head = i;
        } else {
            self.slots[tail as usize].next = i;
        }
        let slot = &mut self.slots[i as usize];
        slot.prev = tail;
        slot.next = NIL;
        slot.list = list;
    }

    fn link_head(&mut self, list: List, i: u32) {
        self.list_len[list as usize] += 1;
        let ends = &mut self.lists[list as usize];
        let head = ends.head;
        ends.head = i;
        if head == NIL {
            ends.tail = i;
        } else {
            self.slots[head as usize].prev = i;
        }
        let slot = &mut self.slots[i as usize];
        slot.prev = NIL;
        slot.next = head;
        slot.list = list;
    }

    /// Keys in eviction order: the recent list, then the set-aside one, then the disk one,
    /// checking every link (tests).
    #[cfg(test)]
    pub fn order(&self) -> Vec<&str> {
        let mut out = Vec::new();
        for list in [List::Recent, List::SetAside, List::Disk] {
            let out_before = out.len();
            let mut at = self.lists[list as usize].head;
            let mut prev = NIL;
            while at != NIL {
                let s = &self.slots[at as usize];
                assert_eq!(s.prev, prev, "back link of {}", s.key);
                assert_eq!(s.list, list);
                out.push(&*s.key);
                prev = at;
                at = s.next;
            }
            assert_eq!(self.lists[list as usize].tail, prev);
            let on_list = out.len() - out_before;
            assert_eq!(self.list_len[list as usize], on_list, "length of {list:?}");
        }
        assert_eq!(out.len(), self.len, "every kept object is on a list");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(keys: &[&str]) -> ObjectTable {
        let mut t = ObjectTable::default();
        for k in keys {
            t.get_or_insert(k).unwrap();
        }
        t
    }

    fn keys(v: Vec<Box<str>>) -> Vec<String> {
        v.into_iter().map(String::from).collect()
    }

    #[test]
    fn a_slot_costs_little_beyond_its_key() {
        assert!(
            std::mem::size_of::<Slot>() <= 144,
            "{}",
            std::mem::size_of::<Slot>()
        );
    }

    #[test]
    fn touches_move_to_the_back_and_removals_leave_the_order_intact() {
        let mut t = table(&["a", "b", "c", "d"]);
        assert_eq!(t.order(), ["a", "b", "c", "d"]);
        t.touch("a");
        t.touch("c");
        assert_eq!(t.order(), ["b", "d", "a", "c"]);
        assert!(t.remove("d").is_some());
        assert!(t.remove("d").is_none());
        assert_eq!(t.order(), ["b", "a", "c"]);
        // A freed slot is reused; the new key is the most recent.
        t.touch_or_insert("e").unwrap();
        t.touch_or_insert("b").unwrap();
        assert_eq!(t.order(), ["a", "c", "e", "b"]);
        assert_eq!(t.slots.len(), 4);
        assert!(t.slots.get(4).is_none());
        // Looking without touching changes nothing.
        assert!(t.get("a").is_some() && t.get_mut("c").is_some() && t.get("d").is_none());
        t.get_or_insert("a").unwrap();
        assert_eq!(t.order(), ["a", "c", "e", "b"]);
        t.retain(|k, _| k != "c");
        assert_eq!(t.order(), ["a", "e", "b"]);
        assert_eq!((t.len(), t.iter().count()), (3, 3));
        // In steps: slot 0 is "a", 1 "b", 2 free ("c"), 3 "e" (where "d" was).
        assert_eq!(t.retain_some(0, 2, |k, _, _| k != "b"), Some(2));
        assert_eq!(t.order(), ["a", "e"]);
        assert_eq!(t.retain_some(2, 5, |k, _, _| k != "e"), None);
        assert_eq!(t.order(), ["a"]);
    }

    #[test]
    fn a_touch_of_the_back_the_front_or_the_only_one_keeps_every_link() {
        let mut t = table(&["only"]);
        t.touch("only");
        assert_eq!(t.order(), ["only"]);
        let mut t = table(&["a", "b", "c"]);
        t.touch("c");
        assert_eq!(t.order(), ["a", "b", "c"]);
        t.touch("a");
        assert_eq!(t.order(), ["b", "c", "a"]);
        t.touch("c");
        assert_eq!(t.order(), ["b", "a", "c"]);
        // An object only on disk moves to the back of the disk order, not to memory's.
        assert!(t.to_disk("b"));
        t.touch("a");
        assert_eq!(t.order(), ["c", "a", "b"]);
        assert_eq!(t.touch_tiered("b").map(|(_, on_disk)| on_disk), Some(true));
        assert_eq!(t.order(), ["c", "a", "b"]);
    }

    #[test]
    fn eviction_takes_the_oldest_passes_over_and_sets_pinned_aside() {
        let mut t = table(&["old", "pinned", "leased", "mid", "new"]);
        let judge = |k: &str, _: &Entry, set_aside_pass: bool| match k {
            "pinned" if !set_aside_pass => Verdict::SetAside,
            "leased" => Verdict::PassOver,
            _ => Verdict::Evict(10),
        };
        assert_eq!(keys(t.eviction_walk(15, judge)), ["old", "mid"]);
        // The walk moved what it passed; the caller removes the victims.
        assert_eq!(t.order(), ["old", "mid", "new", "leased", "pinned"]);
        t.remove("old");
        t.remove("mid");
        // Nothing else left: the pinned one goes, after everything unpinned.
        assert_eq!(keys(t.eviction_walk(100, judge)), ["new", "pinned"]);
        assert_eq!(keys(t.eviction_walk(0, judge)), Vec::<String>::new());
    }

    #[test]
    fn a_walk_looks_at_each_object_once_even_when_it_passes_over_everything() {
        let mut t = table(&["a", "b", "c"]);
        let mut seen = Vec::new();
        let victims = t.eviction_walk(u64::MAX, |k, _, set_aside| {
            seen.push((k.to_owned(), set_aside));
            if k == "b" {
                Verdict::SetAside
            } else {
                Verdict::PassOver
            }
        });
        assert!(victims.is_empty());
        let names: Vec<(&str, bool)> = seen.iter().map(|(k, p)| (k.as_str(), *p)).collect();
        assert_eq!(
            names,
            [("a", false), ("b", false), ("c", false), ("b", true)]
        );
        assert_eq!(t.order(), ["a", "c", "b"]);
    }

    #[test]
    fn an_object_set_aside_returns_as_the_oldest_when_its_pin_runs_out_or_new_on_a_touch() {
        let mut t = table(&["p", "q", "x", "y"]);
        t.eviction_walk(u64::MAX, |k, _, set_aside| match (k, set_aside) {
            ("p" | "q", false) => Verdict::SetAside,
            _ => Verdict::PassOver,
        });
        assert_eq!(t.order(), ["x", "y", "p", "q"]);
        t.unpinned("q");
        t.unpinned("x"); // not set aside: stays where it is
        assert_eq!(t.order(), ["q", "x", "y", "p"]);
        t.touch("p");
        assert_eq!(t.order(), ["q", "x", "y", "p"]);
        assert_eq!(t.lists[List::SetAside as usize].head, NIL);
    }

    #[test]
    fn many_keys_are_found_after_growth_and_reuse() {
        let mut t = ObjectTable::default();
        for i in 0..40_000 {
            t.get_or_insert(&format!("key-{i}")).unwrap().current = None;
        }
        for i in 10_000..40_000 {
            assert!(t.remove(&format!("key-{i}")).is_some());
        }
        for i in (0..10_000).step_by(2) {
            assert!(t.remove(&format!("key-{i}")).is_some());
        }
        for i in 0..5_000 {
            t.get_or_insert(&format!("new-{i}")).unwrap();
        }
        assert_eq!(t.len(), 10_000);
        assert_eq!(t.slots.len(), 40_000, "freed slots were reused");
        assert_eq!(t.slots.chunks.len(), 40_000usize.div_ceil(CHUNK));
        assert!((0..10_000).all(|i| t.contains_key(&format!("key-{i}")) == (i % 2 == 1)));
        assert!((0..5_000).all(|i| t.contains_key(&format!("new-{i}"))));
        assert_eq!(t.order().len(), 10_000);
    }
}
