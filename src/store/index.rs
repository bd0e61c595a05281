//! The store's durable index: which objects its segment holds (key, version, offset, size,
//! checksum), kept in an append-only log beside the segment file so that a restarted store knows
//! what its memory contains.
//!
//! Log file `<stem>.idx`: a header naming the segment (size, incarnation id, name), then entries,
//! each `[u32 body_len][u32 crc32c(body)][body]`. A body is a *put* (`1`, offset, version, size,
//! checksum, key), a *put* not hashed yet (`3`, the same fields, the checksum 0: bytes that came
//! in one-sided, recorded before the store read them; a later put of the same version gives its
//! checksum) or a *forget* (`2`, offset, version). Every entry goes to the kernel with one
//! `write(2)` before the request that caused it is answered, so a killed process loses nothing
//! it acknowledged; a torn last entry (the process died inside the write) fails its CRC and is cut
//! off at replay. The log is rewritten as a snapshot of the live records when it grows to several
//! times their number.
//!
//! `IndexMap` is the pure part (records by offset, overlap rules); `DurableIndex` adds the file.

use crate::transfer::message::{ForgetItem, StoredObject};
use crate::transfer::stamps::{StampTable, Stamps};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"RBGIDX01";
const KIND_PUT: u8 = 1;
const KIND_FORGET: u8 = 2;
const KIND_PUT_UNHASHED: u8 = 3;
/// No entry is larger than this (a key is at most 4096 bytes).
const MAX_ENTRY: usize = 8192;
/// Compact when the log holds this many more entries than there are live records.
const COMPACT_SLACK: u64 = 4096;

/// Why the store's durable index could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("index {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "index {path} describes a segment of {found} bytes but this store is configured with \
         {configured}; refusing to mix data (restore the old size, or remove {path} and its \
         .seg file to start empty)"
    )]
    SizeMismatch {
        path: PathBuf,
        found: u64,
        configured: u64,
    },
    #[error(
        "index {path} belongs to segment {found:?}, not {configured:?}; refusing to mix data \
         (use another directory or remove the files)"
    )]
    Foreign {
        path: PathBuf,
        found: String,
        configured: String,
    },
}

/// One object's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: String,
    pub version: u64,
    pub size: u64,
    pub checksum: u32,
    /// Whether `checksum` is the bytes' CRC-32C; `false` for bytes that came in one-sided and
    /// were recorded before the store read them (`checksum` is then 0 until they are hashed).
    pub hashed: bool,
}

impl Record {
    /// The record of `o`, with the CRC-32C its writer gave.
    pub fn of(o: &StoredObject) -> Record {
        Record {
            key: o.key.clone(),
            version: o.version,
            size: o.size,
            checksum: o.checksum,
            hashed: true,
        }
    }

    /// The record of `o`, whose bytes nobody has hashed yet.
    pub fn unhashed(o: &StoredObject) -> Record {
        Record {
            checksum: 0,
            hashed: false,
            ..Record::of(o)
        }
    }

    /// The object this record describes, at `offset`.
    pub fn to_stored(&self, offset: u64) -> StoredObject {
        StoredObject {
            key: self.key.clone(),
            version: self.version,
            offset,
            size: self.size,
            checksum: self.checksum,
        }
    }
}

/// Records by offset. Records never overlap: a new record removes every record it overlaps
/// (their bytes are being overwritten, so they are gone).
#[derive(Default)]
pub struct IndexMap {
    by_offset: BTreeMap<u64, Record>,
    /// The version stamps that one-sided readers check, kept in step with the records (set
    /// once a record exists, cleared before it is dropped).
    stamps: Option<Stamps>,
    /// Offsets of the records not hashed yet.
    unhashed: std::collections::BTreeSet<u64>,
}

impl std::fmt::Debug for IndexMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexMap")
            .field("by_offset", &self.by_offset)
            .field("stamps", &self.stamps.is_some())
            .field("unhashed", &self.unhashed)
            .finish()
    }
}

impl IndexMap {
    /// Records held.
    pub fn len(&self) -> usize {
        self.by_offset.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.by_offset.is_empty()
    }

    /// The record that starts at `offset`.
    pub fn get(&self, offset: u64) -> Option<&Record> {
        self.by_offset.get(&offset)
    }

    /// Every record with its offset, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Record)> {
        self.by_offset.iter().map(|(o, r)| (*o, r))
    }

    /// Offsets of the records that overlap `[offset, offset + size)`.
    pub fn overlapping(&self, offset: u64, size: u64) -> Vec<u64> {
        let end = offset.saturating_add(size.max(1));
        let mut out = Vec::new();
        if let Some((&o, r)) = self.by_offset.range(..offset).next_back() {
            if o.saturating_add(r.size) > offset {
                out.push(o);
            }
        }
        out.extend(self.by_offset.range(offset..end).map(|(o, _)| *o));
        out
    }

    /// The newest version recorded over any byte of `[offset, offset + size)`.
    pub fn newest_overlapping(&self, offset: u64, size: u64) -> Option<u64> {
        let end = offset.saturating_add(size.max(1));
        let before = self
            .by_offset
            .range(..offset)
            .next_back()
            .filter(|(o, r)| o.saturating_add(r.size) > offset);
        before
            .into_iter()
            .chain(self.by_offset.range(offset..end))
            .map(|(_, r)| r.version)
            .max()
    }

    /// Keeps `table`'s stamps in step with the records from now on, starting with those
    /// already here.
    pub fn attach_stamps(&mut self, table: std::sync::Arc<StampTable>) {
        let mut stamps = Stamps::new(table);
        for (o, r) in &self.by_offset {
            stamps.recorded(*o, r.version);
        }
        self.stamps = Some(stamps);
    }

    /// Inserts a record; returns the records it displaced.
    pub fn insert(&mut self, offset: u64, rec: Record) -> Vec<(u64, Record)> {
        let displaced = self
            .overlapping(offset, rec.size)
            .into_iter()
            .filter_map(|o| self.remove(o).map(|r| (o, r)))
            .collect();
        if let Some(stamps) = &mut self.stamps {
            stamps.recorded(offset, rec.version);
        }
        if !rec.hashed {
            self.unhashed.insert(offset);
        }
        self.by_offset.insert(offset, rec);
        displaced
    }

    /// Drops the record at `offset` (its stamp first).
    pub fn remove(&mut self, offset: u64) -> Option<Record> {
        if let Some(stamps) = &mut self.stamps {
            stamps.dropping(offset);
        }
        self.unhashed.remove(&offset);
        self.by_offset.remove(&offset)
    }

    /// The records not hashed yet, as objects (checksum 0).
    pub fn unhashed(&self) -> Vec<StoredObject> {
        self.unhashed
            .iter()
            .filter_map(|&o| Some(self.by_offset.get(&o)?.to_stored(o)))
            .collect()
    }

    /// Gives the unhashed record of `version` at `offset` its CRC-32C, in place (its stamp
    /// stays); returns the record as an object when it changed.
    pub fn set_hashed(&mut self, offset: u64, version: u64, crc: u32) -> Option<StoredObject> {
        let rec = self
            .by_offset
            .get_mut(&offset)
            .filter(|r| r.version == version && !r.hashed)?;
        rec.checksum = crc;
        rec.hashed = true;
        self.unhashed.remove(&offset);
        Some(rec.to_stored(offset))
    }

    /// Whether the record at `offset` is `version`, `size` bytes long; its checksum if so.
    pub fn holds(&self, offset: u64, version: u64, size: u64) -> Option<u32> {
        self.hashed(offset, version, size)
            .map(|crc| crc.unwrap_or(0))
    }

    /// As `holds`, with `None` for the checksum of a record not hashed yet.
    pub fn hashed(&self, offset: u64, version: u64, size: u64) -> Option<Option<u32>> {
        self.by_offset
            .get(&offset)
            .filter(|r| r.version == version && r.size == size)
            .map(|r| r.hashed.then_some(r.checksum))
    }

    /// Removes the record at `offset` if it has `version`.
    pub fn forget(&mut self, offset: u64, version: u64) -> bool {
        match self.by_offset.get(&offset) {
            Some(r) if r.version == version => {
                self.remove(offset);
                true
            }
            _ => false,
        }
    }

    /// Drops every record (and its stamp).
    pub fn clear(&mut self) {
        if let Some(stamps) = &mut self.stamps {
            stamps.clear();
        }
        self.unhashed.clear();
        self.by_offset.clear();
    }
}

/// One decoded log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Put { offset: u64, rec: Record },
    Forget { offset: u64, version: u64 },
}

impl Entry {
    fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; 8]);
        match self {
            Entry::Put { offset, rec } => {
                out.push(if rec.hashed {
                    KIND_PUT
                } else {
                    KIND_PUT_UNHASHED
                });
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&rec.version.to_le_bytes());
                out.extend_from_slice(&rec.size.to_le_bytes());
                out.extend_from_slice(&rec.checksum.to_le_bytes());
                out.extend_from_slice(&(rec.key.len() as u16).to_le_bytes());
                out.extend_from_slice(rec.key.as_bytes());
            }
            Entry::Forget { offset, version } => {
                out.push(KIND_FORGET);
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
            }
        }
        let body_len = (out.len() - start - 8) as u32;
        let crc = crate::checksum::crc32c(&out[start + 8..]);
        out[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    fn decode(body: &[u8]) -> Option<Entry> {
        let u64_at = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(body.get(i..i + 8)?.try_into().ok()?))
        };
        match *body.first()? {
            kind @ (KIND_PUT | KIND_PUT_UNHASHED) => {
                let checksum = u32::from_le_bytes(body.get(25..29)?.try_into().ok()?);
                let key_len = u16::from_le_bytes(body.get(29..31)?.try_into().ok()?) as usize;
                let key = body.get(31..31 + key_len)?;
                if body.len() != 31 + key_len {
                    return None;
                }
                Some(Entry::Put {
                    offset: u64_at(1)?,
                    rec: Record {
                        key: String::from_utf8(key.to_vec()).ok()?,
                        version: u64_at(9)?,
                        size: u64_at(17)?,
                        checksum,
                        hashed: kind == KIND_PUT,
                    },
                })
            }
            KIND_FORGET if body.len() == 17 => Some(Entry::Forget {
                offset: u64_at(1)?,
                version: u64_at(9)?,
            }),
            _ => None,
        }
    }

    fn apply(self, map: &mut IndexMap) {
        match self {
            Entry::Put { offset, rec } => {
                map.insert(offset, rec);
            }
            Entry::Forget { offset, version } => {
                map.forget(offset, version);
            }
        }
    }
}

/// What identifies the segment an index belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexHeader {
    pub segment_size: u64,
    pub segment_uuid: u64,
    pub name: String,
}

impl IndexHeader {
    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.segment_size.to_le_bytes());
        body.extend_from_slice(&self.segment_uuid.to_le_bytes());
        body.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        body.extend_from_slice(self.name.as_bytes());
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crate::checksum::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes the header at the start of `buf`; returns it and its length.
    fn decode(buf: &[u8]) -> Option<(IndexHeader, usize)> {
        if buf.get(..8)? != MAGIC {
            return None;
        }
        let len = u32::from_le_bytes(buf.get(8..12)?.try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(buf.get(12..16)?.try_into().ok()?);
        let body = buf.get(16..16 + len)?;
        if crate::checksum::crc32c(body) != crc || len < 18 {
            return None;
        }
        let name_len = u16::from_le_bytes(body[16..18].try_into().ok()?) as usize;
        if len != 18 + name_len {
            return None;
        }
        Some((
            IndexHeader {
                segment_size: u64::from_le_bytes(body[0..8].try_into().ok()?),
                segment_uuid: u64::from_le_bytes(body[8..16].try_into().ok()?),
                name: String::from_utf8(body[18..].to_vec()).ok()?,
            },
            16 + len,
        ))
    }
}

/// The result of replaying a log image.
#[derive(Debug)]
pub struct Replay {
    pub header: IndexHeader,
    pub map: IndexMap,
    pub entries: u64,
    /// Length of the valid prefix; bytes after it are a torn tail.
    pub valid_len: usize,
}

/// Replays a whole log image. `None` when the header itself is unreadable.
pub fn replay(buf: &[u8]) -> Option<Replay> {
    let (header, mut pos) = IndexHeader::decode(buf)?;
    let mut map = IndexMap::default();
    let mut entries = 0;
    while let Some(head) = buf.get(pos..pos + 8) {
        let len = u32::from_le_bytes(head[0..4].try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(head[4..8].try_into().ok()?);
        if len == 0 || len > MAX_ENTRY {
            break;
        }
        let Some(body) = buf.get(pos + 8..pos + 8 + len) else {
            break;
        };
        if crate::checksum::crc32c(body) != crc {
            break;
        }
        let Some(entry) = Entry::decode(body) else {
            break;
        };
        entry.apply(&mut map);
        entries += 1;
        pos += 8 + len;
    }
    Some(Replay {
        header,
        map,
        entries,
        valid_len: pos,
    })
}

/// How `DurableIndex::open` found the directory.
#[derive(Debug)]
pub enum Opened {
    /// A valid index: these records were committed before the last stop.
    Existing { torn_bytes: u64 },
    /// No usable index: a new, empty one was written.
    Fresh,
}

struct LogFile {
    file: File,
    entries: u64,
    /// Bumped by every snapshot written under the lock (`clear`): a compaction that began
    /// before one does not swap its older snapshot in.
    generation: u64,
    /// While a compaction writes its snapshot outside the lock: the entries logged since its
    /// copy was taken (and their count), added to the new file before it replaces this one.
    since_copy: Option<(Vec<u8>, u64)>,
}

/// A compaction's copy of the records, taken under the lock and written outside it.
struct Compaction {
    bytes: Vec<u8>,
    entries: u64,
    generation: u64,
}

/// When the last compaction wrote its snapshot (outside the index lock): start and end of the
/// write and its fsync.
#[derive(Clone, Copy, Debug)]
pub struct CompactionIo {
    pub started: std::time::Instant,
    pub ended: std::time::Instant,
}

/// The index and its log file.
pub struct DurableIndex {
    path: PathBuf,
    header: IndexHeader,
    inner: Mutex<(IndexMap, LogFile)>,
    last_compaction: Mutex<Option<CompactionIo>>,
}

impl DurableIndex {
    /// Opens `<dir>/<stem>.idx`: replays it when it belongs to this segment, or starts a fresh
    /// one (new incarnation id) when there is none or it is unreadable. A size or name mismatch
    /// is an error: the files belong to another configuration.
    pub fn open(
        dir: &Path,
        stem: &str,
        name: &str,
        segment_size: u64,
    ) -> Result<(DurableIndex, Opened), IndexError> {
        let path = dir.join(format!("{stem}.idx"));
        let io_err = |source| IndexError::Io {
            path: path.clone(),
            source,
        };
        let mut buf = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut buf).map_err(io_err)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        if let Some(r) = replay(&buf) {
            if r.header.name != name {
                return Err(IndexError::Foreign {
                    path,
                    found: r.header.name,
                    configured: name.into(),
                });
            }
            if r.header.segment_size != segment_size {
                return Err(IndexError::SizeMismatch {
                    path,
                    found: r.header.segment_size,
                    configured: segment_size,
                });
            }
            let torn = (buf.len() - r.valid_len) as u64;
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io_err)?;
            if torn > 0 {
                tracing::warn!(path = %path.display(), torn_bytes = torn,
                    "index ends in a torn entry (the store died while writing it); cutting it off");
                file.set_len(r.valid_len as u64).map_err(io_err)?;
            }
            let idx = DurableIndex {
                path: path.clone(),
                header: r.header,
                inner: Mutex::new((r.map, LogFile::new(file, r.entries))),
                last_compaction: Mutex::new(None),
            };
            return Ok((idx, Opened::Existing { torn_bytes: torn }));
        }
        if !buf.is_empty() {
            tracing::warn!(path = %path.display(), "index header unreadable; starting empty");
        }
        let header = IndexHeader {
            segment_size,
            segment_uuid: fastrand::u64(1..),
            name: name.into(),
        };
        let file = write_snapshot(&path, &header, &IndexMap::default()).map_err(io_err)?;
        let idx = DurableIndex {
            path: path.clone(),
            header,
            inner: Mutex::new((IndexMap::default(), LogFile::new(file, 0))),
            last_compaction: Mutex::new(None),
        };
        Ok((idx, Opened::Fresh))
    }

    /// The incarnation of the segment this index belongs to (a new file, a new uuid).
    pub fn uuid(&self) -> u64 {
        self.header.segment_uuid
    }

    /// The index's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.inner.lock().0.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// See [`IndexMap::holds`].
    pub fn holds(&self, offset: u64, version: u64, size: u64) -> Option<u32> {
        self.inner.lock().0.holds(offset, version, size)
    }

    /// See [`IndexMap::newest_overlapping`].
    pub fn newest_overlapping(&self, offset: u64, size: u64) -> Option<u64> {
        self.inner.lock().0.newest_overlapping(offset, size)
    }

    /// Every record, for the master.
    pub fn snapshot(&self) -> Vec<StoredObject> {
        let g = self.inner.lock();
        g.0.iter().map(|(o, r)| r.to_stored(o)).collect()
    }

    /// Records objects whose bytes are complete in the segment; returns once the entries are
    /// in the kernel (they survive the process).
    pub fn seal(&self, objects: &[StoredObject]) -> Result<(), IndexError> {
        self.record(objects, Record::of)
    }

    /// Records objects, each as `rec_of` makes its record (`Record::unhashed` for objects
    /// whose bytes nobody has hashed yet: `set_hashed` gives them their checksums).
    fn record(
        &self,
        objects: &[StoredObject],
        rec_of: fn(&StoredObject) -> Record,
    ) -> Result<(), IndexError> {
        let mut buf = Vec::with_capacity(objects.len() * 64);
        let mut g = self.inner.lock();
        let (map, log) = &mut *g;
        for o in objects {
            let rec = rec_of(o);
            Entry::Put {
                offset: o.offset,
                rec: rec.clone(),
            }
            .encode_into(&mut buf);
            map.insert(o.offset, rec);
        }
        self.append(log, &buf, objects.len() as u64)?;
        let due = self.compaction_due(&mut g);
        drop(g);
        match due {
            Some(job) => self.compact_outside_lock(job),
            None => Ok(()),
        }
    }

    /// See [`IndexMap::unhashed`].
    pub fn unhashed(&self) -> Vec<StoredObject> {
        self.inner.lock().0.unhashed()
    }

    /// Gives unhashed records (`(offset, version, crc)`) their checksums, logged as puts of
    /// the same version; returns the records that changed.
    pub fn set_hashed(&self, items: &[(u64, u64, u32)]) -> Result<Vec<StoredObject>, IndexError> {
        let mut buf = Vec::new();
        let mut g = self.inner.lock();
        let (map, log) = &mut *g;
        let changed: Vec<StoredObject> = items
            .iter()
            .filter_map(|&(offset, version, crc)| map.set_hashed(offset, version, crc))
            .collect();
        for o in &changed {
            Entry::Put {
                offset: o.offset,
                rec: Record::of(o),
            }
            .encode_into(&mut buf);
        }
        if !changed.is_empty() {
            self.append(log, &buf, changed.len() as u64)?;
        }
        Ok(changed)
    }

    /// Drops records (matched by offset and version); returns how many were present.
    pub fn forget(&self, items: &[ForgetItem]) -> Result<usize, IndexError> {
        let mut buf = Vec::new();
        let mut g = self.inner.lock();
        let (map, log) = &mut *g;
        let mut n = 0;
        for it in items {
            if map.forget(it.offset, it.version) {
                Entry::Forget {
                    offset: it.offset,
                    version: it.version,
                }
                .encode_into(&mut buf);
                n += 1;
            }
        }
        if n > 0 {
            self.append(log, &buf, n as u64)?;
        }
        Ok(n)
    }

    /// Forgets every record (the master gave this segment's objects up).
    pub fn clear(&self) -> Result<(), IndexError> {
        let mut g = self.inner.lock();
        g.0.clear();
        self.compact(&mut g)
    }

    fn append(&self, log: &mut LogFile, buf: &[u8], entries: u64) -> Result<(), IndexError> {
        log.file.write_all(buf).map_err(|e| self.io_err(e))?;
        log.entries += entries;
        if let Some((since, n)) = &mut log.since_copy {
            since.extend_from_slice(buf);
            *n += entries;
        }
        Ok(())
    }

    fn io_err(&self, source: std::io::Error) -> IndexError {
        IndexError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// When the log has grown well past the records, a copy of them to compact to (taken
    /// here, under the lock), unless a compaction is under way.
    fn compaction_due(&self, g: &mut (IndexMap, LogFile)) -> Option<Compaction> {
        let (map, log) = g;
        if log.entries <= 2 * map.len() as u64 + COMPACT_SLACK || log.since_copy.is_some() {
            return None;
        }
        log.since_copy = Some((Vec::new(), 0));
        Some(Compaction {
            bytes: snapshot_bytes(&self.header, map),
            entries: map.len() as u64,
            generation: log.generation,
        })
    }

    /// Writes and syncs `job`'s snapshot with the lock released (reads and writes of the
    /// records go on meanwhile), then, under the lock, adds what was logged since the copy and
    /// swaps the new file in.
    fn compact_outside_lock(&self, job: Compaction) -> Result<(), IndexError> {
        // Not `write_snapshot`'s file: a `clear` may write that one meanwhile.
        let tmp = self.path.with_extension("idx.compacting");
        let started = std::time::Instant::now();
        let written = write_synced(&tmp, &job.bytes);
        let ended = std::time::Instant::now();
        let mut g = self.inner.lock();
        let log = &mut g.1;
        let since = log.since_copy.take();
        let swapped = written.and_then(|mut f| {
            if log.generation != job.generation {
                return Ok(None);
            }
            let (bytes, n) = since.unwrap_or_default();
            f.write_all(&bytes)?;
            std::fs::rename(&tmp, &self.path)?;
            Ok(Some((OpenOptions::new().append(true).open(&self.path)?, n)))
        });
        match swapped {
            Ok(Some((file, n))) => {
                log.file = file;
                log.entries = job.entries + n;
                *self.last_compaction.lock() = Some(CompactionIo { started, ended });
                Ok(())
            }
            Ok(None) => {
                let _ = std::fs::remove_file(&tmp);
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(self.io_err(e))
            }
        }
    }

    /// When the last compaction wrote its snapshot.
    pub fn last_compaction(&self) -> Option<CompactionIo> {
        *self.last_compaction.lock()
    }

    /// Writes a snapshot under the lock (the records were just replaced wholesale).
    fn compact(&self, g: &mut (IndexMap, LogFile)) -> Result<(), IndexError> {
        let file = write_snapshot(&self.path, &self.header, &g.0).map_err(|e| self.io_err(e))?;
        // A compaction under way finds a newer generation and leaves this file be; it stays
        // marked as under way, so that no second one starts before it is done.
        g.1 = LogFile {
            file,
            entries: g.0.len() as u64,
            generation: g.1.generation + 1,
            since_copy: g.1.since_copy.as_ref().map(|_| Default::default()),
        };
        Ok(())
    }

    /// Checks every hashed record's bytes against its checksum with `threads` threads; drops
    /// (and logs a forget for) each record that fails; hashes the records not hashed yet (their
    /// bytes were whole when they were recorded, and nothing has written them since). Returns
    /// the failed records.
    pub fn verify(
        &self,
        memory: &super::segment::SegmentMemory,
        threads: usize,
    ) -> Result<Vec<StoredObject>, IndexError> {
        let records: Vec<(StoredObject, bool)> = {
            let g = self.inner.lock();
            g.0.iter()
                .map(|(o, r)| (r.to_stored(o), r.hashed))
                .collect()
        };
        let objects: Vec<StoredObject> = records.iter().map(|(o, _)| o.clone()).collect();
        // Nothing writes the segment before recovery ends: what is hashed is what was kept.
        let crcs: std::collections::HashMap<u64, u32> = hash_in(memory, &objects, threads)
            .into_iter()
            .map(|(offset, _, crc)| (offset, crc))
            .collect();
        let mut bad = Vec::new();
        let mut hashed_now = Vec::new();
        for (o, hashed) in records {
            match crcs.get(&o.offset) {
                Some(&crc) if !hashed => hashed_now.push((o.offset, o.version, crc)),
                Some(&crc) if crc == o.checksum => {}
                _ => bad.push(o),
            }
        }
        let items: Vec<ForgetItem> = bad
            .iter()
            .map(|o| ForgetItem {
                offset: o.offset,
                version: o.version,
            })
            .collect();
        self.forget(&items)?;
        self.set_hashed(&hashed_now)?;
        Ok(bad)
    }
}

/// `(offset, version, crc)` of each of `objects` inside `memory`, hashed on `threads` threads.
fn hash_in(
    memory: &super::segment::SegmentMemory,
    objects: &[StoredObject],
    threads: usize,
) -> Vec<(u64, u64, u32)> {
    let inside: Vec<&StoredObject> = objects
        .iter()
        .filter(|o| memory.check(o.offset, o.size).is_ok())
        .collect();
    // SAFETY: bounds checked above; a recorded object's range is written again only after the
    // master gave it up (a hash taken then is of a version nobody reads, and its record goes).
    let bytes: Vec<&[u8]> = inside
        .iter()
        .map(|o| unsafe { memory.slice(o.offset, o.size) })
        .collect();
    let crcs = crate::transfer::hashing::crc32c_many(&bytes, threads);
    inside
        .iter()
        .zip(crcs)
        .map(|(o, crc)| (o.offset, o.version, crc))
        .collect()
}

/// Writes header + live records to a temporary file and renames it over `path`; returns the new
/// file opened for appending.
fn write_snapshot(path: &Path, header: &IndexHeader, map: &IndexMap) -> std::io::Result<File> {
    let tmp = path.with_extension("idx.tmp");
    drop(write_synced(&tmp, &snapshot_bytes(header, map))?);
    std::fs::rename(&tmp, path)?;
    OpenOptions::new().append(true).open(path)
}

/// Header + live records, as a snapshot file holds them.
fn snapshot_bytes(header: &IndexHeader, map: &IndexMap) -> Vec<u8> {
    let mut buf = header.encode();
    for (offset, rec) in map.iter() {
        Entry::Put {
            offset,
            rec: rec.clone(),
        }
        .encode_into(&mut buf);
    }
    buf
}

/// Creates `path` with `bytes`, synced to the disk; returns it open for more writes.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<File> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(f)
}

impl LogFile {
    fn new(file: File, entries: u64) -> LogFile {
        LogFile {
            file,
            entries,
            generation: 0,
            since_copy: None,
        }
    }
}

/// What a store's segment holds, by offset: the durable index of a persistent store, or the same
/// records kept in memory only. Besides recovery, the records let the store answer a read that
/// names the version it expects (`READ_VERSION`) without asking the master.
pub enum Records {
    Durable(std::sync::Arc<DurableIndex>),
    Memory(Mutex<IndexMap>),
}

impl Records {
    /// Records kept in memory only: a store that does not persist.
    pub fn in_memory() -> Records {
        Records::Memory(Mutex::new(IndexMap::default()))
    }

    /// The durable index, on a persistent store.
    pub fn durable(&self) -> Option<&std::sync::Arc<DurableIndex>> {
        match self {
            Records::Durable(index) => Some(index),
            Records::Memory(_) => None,
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        match self {
            Records::Durable(index) => index.len(),
            Records::Memory(map) => map.lock().len(),
        }
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records objects whose bytes are complete in the segment.
    pub fn seal(&self, objects: &[StoredObject]) -> Result<(), IndexError> {
        self.record(objects, Record::of)
    }

    /// As `seal`, for objects whose bytes nobody has hashed yet.
    pub fn seal_unhashed(&self, objects: &[StoredObject]) -> Result<(), IndexError> {
        self.record(objects, Record::unhashed)
    }

    fn record(
        &self,
        objects: &[StoredObject],
        rec_of: fn(&StoredObject) -> Record,
    ) -> Result<(), IndexError> {
        match self {
            Records::Durable(index) => index.record(objects, rec_of),
            Records::Memory(map) => {
                let mut map = map.lock();
                for o in objects {
                    map.insert(o.offset, rec_of(o));
                }
                Ok(())
            }
        }
    }

    /// Hashes the records not hashed yet (on `threads` threads, outside the lock) and records
    /// their checksums; returns the records that took one.
    pub fn hash_unhashed(
        &self,
        memory: &super::segment::SegmentMemory,
        threads: usize,
    ) -> Result<Vec<StoredObject>, IndexError> {
        let unhashed = match self {
            Records::Durable(index) => index.unhashed(),
            Records::Memory(map) => map.lock().unhashed(),
        };
        if unhashed.is_empty() {
            return Ok(Vec::new());
        }
        let crcs = hash_in(memory, &unhashed, threads);
        match self {
            Records::Durable(index) => index.set_hashed(&crcs),
            Records::Memory(map) => {
                let mut map = map.lock();
                Ok(crcs
                    .iter()
                    .filter_map(|&(offset, version, crc)| map.set_hashed(offset, version, crc))
                    .collect())
            }
        }
    }

    /// How many records are not hashed yet.
    pub fn unhashed_count(&self) -> usize {
        match self {
            Records::Durable(index) => index.inner.lock().0.unhashed.len(),
            Records::Memory(map) => map.lock().unhashed.len(),
        }
    }

    /// Drops records (matched by offset and version); returns how many were present.
    pub fn forget(&self, items: &[ForgetItem]) -> Result<usize, IndexError> {
        match self {
            Records::Durable(index) => index.forget(items),
            Records::Memory(map) => {
                let mut map = map.lock();
                Ok(items
                    .iter()
                    .filter(|it| map.forget(it.offset, it.version))
                    .count())
            }
        }
    }

    /// Forgets every record (the master no longer knows this segment's objects).
    pub fn clear(&self) -> Result<(), IndexError> {
        match self {
            Records::Durable(index) => index.clear(),
            Records::Memory(map) => {
                map.lock().clear();
                Ok(())
            }
        }
    }

    /// Keeps `table`'s version stamps in step with the records from now on.
    pub fn attach_stamps(&self, table: std::sync::Arc<StampTable>) {
        match self {
            Records::Durable(index) => index.inner.lock().0.attach_stamps(table),
            Records::Memory(map) => map.lock().attach_stamps(table),
        }
    }

    /// See [`IndexMap::holds`].
    pub fn holds(&self, offset: u64, version: u64, size: u64) -> Option<u32> {
        match self {
            Records::Durable(index) => index.holds(offset, version, size),
            Records::Memory(map) => map.lock().holds(offset, version, size),
        }
    }

    /// See [`IndexMap::hashed`].
    pub fn hashed(&self, offset: u64, version: u64, size: u64) -> Option<Option<u32>> {
        match self {
            Records::Durable(index) => index.inner.lock().0.hashed(offset, version, size),
            Records::Memory(map) => map.lock().hashed(offset, version, size),
        }
    }

    /// See [`IndexMap::newest_overlapping`].
    pub fn newest_overlapping(&self, offset: u64, size: u64) -> Option<u64> {
        match self {
            Records::Durable(index) => index.newest_overlapping(offset, size),
            Records::Memory(map) => map.lock().newest_overlapping(offset, size),
        }
    }

    /// Every record, for the master's report after a mount.
    pub fn snapshot(&self) -> Vec<StoredObject> {
        match self {
            Records::Durable(index) => index.snapshot(),
            Records::Memory(map) => map.lock().iter().map(|(o, r)| r.to_stored(o)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &str, version: u64, size: u64) -> Record {
        Record {
            key: key.into(),
            version,
            size,
            checksum: version as u32,
            hashed: true,
        }
    }

    fn obj(key: &str, version: u64, offset: u64, size: u64) -> StoredObject {
        rec(key, version, size).to_stored(offset)
    }

    #[test]
    fn a_new_record_displaces_every_record_it_overlaps() {
        let mut m = IndexMap::default();
        assert!(m.insert(0, rec("a", 1, 100)).is_empty());
        assert!(m.insert(128, rec("b", 2, 64)).is_empty());
        assert!(m.insert(256, rec("c", 3, 64)).is_empty());
        // [50, 200) overlaps a's tail and all of b, not c.
        let displaced = m.insert(50, rec("d", 4, 150));
        let keys: Vec<&str> = displaced.iter().map(|(_, r)| r.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(m.len(), 2);
        // Adjacent is not overlapping.
        assert!(m.insert(320, rec("e", 5, 64)).is_empty());
        // Forget matches the version, so a late forget cannot drop a newer object.
        assert!(!m.forget(256, 99));
        assert!(m.forget(256, 3));
        assert!(m.get(256).is_none());
    }

    #[test]
    fn stamps_follow_the_records_through_every_change() {
        use crate::transfer::stamps::{slot, StampTable};
        let table = std::sync::Arc::new(StampTable::new(1 << 20).unwrap());
        let at = |offset| table.get(slot(offset, table.slots()));
        let records = Records::in_memory();
        records.seal(&[obj("before", 1, 0, 64)]).unwrap();
        // Attached late, the table takes the records already there.
        records.attach_stamps(table.clone());
        assert_eq!(at(0), 1);
        records.seal(&[obj("a", 2, 4096, 64)]).unwrap();
        assert_eq!(at(4096), 2);
        // Displaced by an overlapping record: the old stamp goes, the new one comes.
        records.seal(&[obj("b", 3, 4096 - 64, 128)]).unwrap();
        assert_eq!(at(4096), 0);
        assert_eq!(at(4096 - 64), 3);
        // A forget of another version leaves it; of its own version clears it.
        records
            .forget(&[ForgetItem {
                offset: 4096 - 64,
                version: 2,
            }])
            .unwrap();
        assert_eq!(at(4096 - 64), 3);
        records
            .forget(&[ForgetItem {
                offset: 4096 - 64,
                version: 3,
            }])
            .unwrap();
        assert_eq!(at(4096 - 64), 0);
        records
            .forget(&[ForgetItem {
                offset: 0,
                version: 1,
            }])
            .unwrap();
        assert_eq!(at(0), 0);
        records.seal(&[obj("c", 4, 8192, 64)]).unwrap();
        records.clear().unwrap();
        assert_eq!(at(8192), 0);
        // The durable index keeps them in step the same way.
        let dir = tempfile::tempdir().unwrap();
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        let durable = Records::Durable(std::sync::Arc::new(idx));
        durable.attach_stamps(table.clone());
        durable.seal(&[obj("d", 5, 12288, 64)]).unwrap();
        assert_eq!(at(12288), 5);
        durable
            .forget(&[ForgetItem {
                offset: 12288,
                version: 5,
            }])
            .unwrap();
        assert_eq!(at(12288), 0);
    }

    #[test]
    fn replay_restores_records_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (idx, opened) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        assert!(matches!(opened, Opened::Fresh));
        let uuid = idx.uuid();
        idx.seal(&[
            obj("a", 1, 0, 10),
            obj("b", 2, 64, 10),
            obj("c", 3, 128, 10),
        ])
        .unwrap();
        idx.forget(&[ForgetItem {
            offset: 64,
            version: 2,
        }])
        .unwrap();
        drop(idx);
        // A torn write: half an entry at the end.
        let path = dir.path().join("s.idx");
        let mut bytes = std::fs::read(&path).unwrap();
        let mut extra = Vec::new();
        Entry::Put {
            offset: 192,
            rec: rec("torn", 9, 10),
        }
        .encode_into(&mut extra);
        bytes.extend_from_slice(&extra[..extra.len() - 3]);
        std::fs::write(&path, &bytes).unwrap();

        let (idx, opened) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        assert!(
            matches!(opened, Opened::Existing { torn_bytes } if torn_bytes == extra.len() as u64 - 3)
        );
        assert_eq!(idx.uuid(), uuid, "same incarnation");
        let keys: Vec<String> = idx.snapshot().into_iter().map(|o| o.key).collect();
        assert_eq!(keys, ["a", "c"]);
        // Appending after the cut works and replays.
        idx.seal(&[obj("d", 4, 256, 10)]).unwrap();
        drop(idx);
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        assert_eq!(idx.len(), 3);
    }

    /// One-sided bytes recorded before they are hashed: the record survives a restart as
    /// unhashed, takes its checksum in place, and a store that died before hashing it hashes
    /// it at start-up instead of dropping it as corrupt.
    #[test]
    fn unhashed_records_survive_a_restart_and_are_hashed_not_dropped() {
        use super::super::segment::SegmentMemory;
        let dir = tempfile::tempdir().unwrap();
        let (seg, _) = SegmentMemory::open_persistent(dir.path(), "s", 1 << 20, false).unwrap();
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        // SAFETY: the test's own segment, the range inside it, nobody else using it.
        unsafe { seg.slice_mut(0, 5) }.copy_from_slice(b"first");
        unsafe { seg.slice_mut(64, 6) }.copy_from_slice(b"second");
        unsafe { seg.slice_mut(128, 5) }.copy_from_slice(b"third");
        let [a, b, c] =
            [("a", 0, 5), ("b", 64, 6), ("c", 128, 5)].map(|(k, off, n)| StoredObject {
                checksum: 0,
                ..obj(k, off + 1, off, n)
            });
        idx.record(&[a.clone(), b.clone()], Record::unhashed)
            .unwrap();
        idx.seal(&[StoredObject {
            checksum: crc32c::crc32c(b"third"),
            ..c.clone()
        }])
        .unwrap();
        assert_eq!(idx.unhashed(), [a.clone(), b.clone()]);
        // One is hashed before the store dies; a stale version changes nothing.
        let changed = idx
            .set_hashed(&[(0, 1, crc32c::crc32c(b"first")), (64, 99, 7)])
            .unwrap();
        assert_eq!(changed.len(), 1);
        assert_eq!(idx.holds(0, 1, 5), Some(crc32c::crc32c(b"first")));
        drop(idx);

        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        assert_eq!(
            idx.unhashed(),
            std::slice::from_ref(&b),
            "replayed as unhashed"
        );
        assert!(idx.verify(&seg, 2).unwrap().is_empty(), "nothing dropped");
        assert!(idx.unhashed().is_empty());
        assert_eq!(idx.holds(64, 65, 6), Some(crc32c::crc32c(b"second")));
        drop(idx);
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        assert!(idx.unhashed().is_empty(), "the hash was logged");
        assert_eq!(idx.len(), 3);
        // A hashed record whose bytes changed is still dropped.
        // SAFETY: the test's own segment, the range inside it, nobody else using it.
        unsafe { seg.slice_mut(128, 1) }.copy_from_slice(b"T");
        let bad = idx.verify(&seg, 2).unwrap();
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].key, "c");

        // The in-memory records hash theirs too, and a record replaced meanwhile is left be.
        let records = Records::in_memory();
        records.seal_unhashed(&[a.clone(), b.clone()]).unwrap();
        records
            .seal(&[StoredObject {
                version: 70,
                ..b.clone()
            }])
            .unwrap();
        assert_eq!(records.unhashed_count(), 1);
        let hashed = records.hash_unhashed(&seg, 2).unwrap();
        assert_eq!(hashed.len(), 1);
        assert_eq!(hashed[0].checksum, crc32c::crc32c(b"first"));
        assert_eq!(records.unhashed_count(), 0);
        assert!(records.hash_unhashed(&seg, 2).unwrap().is_empty());
    }

    #[test]
    fn mismatched_size_or_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        drop(idx);
        let e = DurableIndex::open(dir.path(), "s", "s:1", 2 << 20)
            .err()
            .unwrap();
        assert!(matches!(e, IndexError::SizeMismatch { .. }), "{e}");
        let e = DurableIndex::open(dir.path(), "s", "s/1", 1 << 20)
            .err()
            .unwrap();
        assert!(matches!(e, IndexError::Foreign { .. }), "{e}");
        // A garbage file is not an index: start fresh.
        std::fs::write(dir.path().join("s.idx"), b"garbage").unwrap();
        let (_, opened) = DurableIndex::open(dir.path(), "s", "s:1", 2 << 20).unwrap();
        assert!(matches!(opened, Opened::Fresh));
    }

    #[test]
    fn the_log_is_compacted_to_its_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        // Rewrite the same two slots many times: the log must not grow without bound.
        for v in 1..=20_000u64 {
            idx.seal(&[obj(&format!("k{}", v % 2), v, (v % 2) * 64, 10)])
                .unwrap();
        }
        let len = std::fs::metadata(dir.path().join("s.idx")).unwrap().len();
        assert!(len < 400 * 1024, "log is {len} bytes");
        drop(idx);
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 20).unwrap();
        let mut versions: Vec<u64> = idx.snapshot().iter().map(|o| o.version).collect();
        versions.sort();
        assert_eq!(versions, [19_999, 20_000]);
    }

    /// A compaction writes and syncs its snapshot with the lock released: remembered-version
    /// reads (`holds`) complete while it writes, and what is sealed meanwhile is in the file
    /// that replaces the log.
    #[test]
    fn reads_and_seals_go_on_while_a_compaction_writes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::Instant;
        let dir = tempfile::tempdir().unwrap();
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 40).unwrap();
        let idx = std::sync::Arc::new(idx);
        // A large index, so that its snapshot takes a while to write.
        const RECORDS: u64 = 100_000;
        let batch = |v: u64, from: u64| -> Vec<StoredObject> {
            (from..from + 1000)
                .map(|i| obj(&format!("key/{i:08}"), v, i * 64, 10))
                .collect()
        };
        for from in (0..RECORDS).step_by(1000) {
            idx.seal(&batch(1, from)).unwrap();
        }
        let stop = AtomicBool::new(false);
        let mut overlapped = false;
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut done = Vec::new();
                while !stop.load(Ordering::Relaxed) && done.len() < 5_000_000 {
                    idx.holds(64 * 7, 0, 10);
                    done.push(Instant::now());
                }
                done
            });
            // Rewrite the records until the log has compacted three times.
            let mut v = 2;
            let mut compactions = 0;
            let mut seen = None;
            while compactions < 3 {
                for from in (0..RECORDS).step_by(1000) {
                    idx.seal(&batch(v, from)).unwrap();
                    let last = idx.last_compaction().map(|c| c.started);
                    if last != seen {
                        seen = last;
                        compactions += 1;
                    }
                }
                v += 1;
            }
            stop.store(true, Ordering::Relaxed);
            let done = reader.join().unwrap();
            let io = idx.last_compaction().expect("the log compacted");
            overlapped = done.iter().any(|t| *t > io.started && *t < io.ended);
            let during = done
                .iter()
                .filter(|t| **t > io.started && **t < io.ended)
                .count();
            eprintln!(
                "last compaction wrote for {:?}; {during} reads completed meanwhile",
                io.ended - io.started
            );
        });
        assert!(
            overlapped,
            "no read completed while the snapshot was written"
        );
        // Every record is in the file at its newest version, what was sealed while a snapshot
        // was being written included.
        let newest = idx.snapshot().iter().map(|o| o.version).max().unwrap();
        drop(idx);
        let (idx, _) = DurableIndex::open(dir.path(), "s", "s:1", 1 << 40).unwrap();
        let got = idx.snapshot();
        assert_eq!(got.len() as u64, RECORDS);
        assert!(got.iter().all(|o| o.version == newest));
        assert!(!dir.path().join("s.idx.compacting").exists());
    }

    #[test]
    fn hostile_entries_decode_to_none() {
        assert!(Entry::decode(&[]).is_none());
        assert!(Entry::decode(&[KIND_PUT, 1, 2]).is_none());
        assert!(Entry::decode(&[7; 17]).is_none());
        let mut buf = Vec::new();
        Entry::Put {
            offset: 1,
            rec: rec("k", 1, 1),
        }
        .encode_into(&mut buf);
        // Claimed key length longer than the body.
        let mut body = buf[8..].to_vec();
        body[29] = 200;
        assert!(Entry::decode(&body).is_none());
    }
}
