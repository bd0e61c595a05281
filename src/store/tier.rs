//! The disk tier's data service. A store with `--disk-tier` contributes a second segment, of
//! tier disk, served on its own endpoint: clients read disk-resident objects from it with the
//! same `READ`/`READ_VERSION` as memory ones, and the master drives `MOVE`s through it, copying
//! objects between the store's memory segment and its disk area (memory gives an object up: a
//! demotion; a hit brings it back: a promotion).
//!
//! Every copy is checked against the object's checksum before it is recorded where it lands,
//! so a torn or corrupted source is refused (`CHECKSUM_MISMATCH`) rather than spread. A disk
//! record is written to the tier's durable index only after its bytes are on disk, as in the
//! memory segment. Disk I/O goes through block-aligned buffers (`O_DIRECT`); the bytes such
//! buffers hold at any moment are bounded (`IO_BUDGET`), so many readers wait rather than
//! grow memory without bound.

use super::disk::{blocks, AlignedBuf, DiskArea, DiskError, BLOCK};
use super::index::Records;
use super::segment::SegmentMemory;
use super::server::{answer_forget, versioned_refusal, GrantCheck, ReadLease};
use crate::telemetry::OpStats;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{
    BatchStatusResp, MoveItem, MoveKind, ReadReq, ReadVersionReq, StoreInfoResp, StoredObject, Wire,
};
use crate::transfer::rpc::{self, Rpc};
use crate::transfer::server::{ConnCounters, Handled, Handling, ServerIo, Service};
use crate::transfer::{Opcode, Status, TransferError};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest single disk read or move: bigger objects are not demoted (the master drops them).
pub const MAX_IO: u64 = crate::transfer::message::MAX_MOVE_BYTES;
/// Bytes of I/O buffers all requests together may hold.
const IO_BUDGET: u64 = 256 << 20;
/// Longest wait for buffer room before a request is refused as busy.
const IO_WAIT: Duration = Duration::from_secs(5);

/// A bound on the bytes of I/O buffers held at once, and the buffers themselves, kept for
/// reuse (a fresh 1 MiB buffer costs 256 page faults on its first use).
struct Budget {
    inner: Mutex<Pool>,
    freed: Condvar,
}

struct Pool {
    /// Bytes that may still be taken.
    free: u64,
    /// Buffers given back, for the next takers.
    spare: Vec<AlignedBuf>,
}

impl Budget {
    fn new(bytes: u64) -> Budget {
        Budget {
            inner: Mutex::new(Pool {
                free: bytes,
                spare: Vec::new(),
            }),
            freed: Condvar::new(),
        }
    }

    /// An aligned buffer of at least `len` bytes (whole blocks), once the budget has room.
    fn take(&self, len: u64) -> Option<Held<'_>> {
        let len = blocks(len).max(BLOCK);
        let deadline = Instant::now() + IO_WAIT;
        let mut pool = self.inner.lock();
        loop {
            // A spare buffer large enough (its size was counted when it was made).
            if let Some(i) = pool.spare.iter().position(|b| b.len() as u64 >= len) {
                let buf = pool.spare.swap_remove(i);
                return Some(Held {
                    budget: self,
                    buf: Some(buf),
                });
            }
            if pool.free >= len {
                pool.free -= len;
                drop(pool);
                return Some(Held {
                    budget: self,
                    buf: Some(AlignedBuf::new(len as usize)),
                });
            }
            // Spare buffers too small to use: give their room back for a new one.
            if let Some(small) = pool.spare.pop() {
                pool.free += small.len() as u64;
                continue;
            }
            if self.freed.wait_until(&mut pool, deadline).timed_out() {
                return None;
            }
        }
    }
}

/// A buffer of the budget's, given back when dropped.
struct Held<'a> {
    budget: &'a Budget,
    buf: Option<AlignedBuf>,
}

impl Held<'_> {
    fn buf(&mut self) -> &mut AlignedBuf {
        self.buf.as_mut().expect("held until dropped")
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.budget.inner.lock().spare.push(buf);
            self.budget.freed.notify_all();
        }
    }
}

/// What the disk tier counts, for `/metrics`.
#[derive(Default)]
pub struct TierCounters {
    pub reads: AtomicU64,
    pub bytes_read: AtomicU64,
    pub demoted: AtomicU64,
    pub demoted_bytes: AtomicU64,
    pub promoted: AtomicU64,
    pub promoted_bytes: AtomicU64,
    /// Moves refused because the source bytes failed their checksum.
    pub checksum_failures: AtomicU64,
    /// Reads and writes the filesystem failed.
    pub io_errors: AtomicU64,
    pub index_errors: AtomicU64,
    /// Version-checked reads refused (stale location, or no lease).
    pub stale_reads: AtomicU64,
}

/// The store's data service on its disk tier.
pub struct DiskService {
    pub name: String,
    pub area: Arc<DiskArea>,
    /// What the disk area holds (durable on a persistent store).
    pub records: Arc<Records>,
    pub lease: Arc<ReadLease>,
    /// The store's memory segment and its records: the other end of every move.
    pub memory: Arc<SegmentMemory>,
    pub memory_records: Arc<Records>,
    /// Checks that moves and forgets are the master's orders.
    pub grants: GrantCheck,
    pub counters: TierCounters,
    pub stats: OpStats,
    pub connections: ConnCounters,
    budget: Budget,
}

impl DiskService {
    /// The disk tier's service for the store named `name`: its area and records, and the memory
    /// segment it serves promotions into.
    pub fn new(
        name: String,
        area: Arc<DiskArea>,
        records: Arc<Records>,
        memory: Arc<SegmentMemory>,
        memory_records: Arc<Records>,
        grant_key: GrantKey,
    ) -> DiskService {
        DiskService {
            name,
            area,
            records,
            lease: Arc::default(),
            memory,
            memory_records,
            grants: GrantCheck::new(grant_key),
            counters: TierCounters::default(),
            stats: OpStats::default(),
            connections: ConnCounters::default(),
            budget: Budget::new(IO_BUDGET),
        }
    }

    fn io_error(&self, e: &DiskError) -> (Status, String) {
        self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!(error = %e, "disk tier I/O failed");
        (Status::Internal, e.to_string())
    }

    /// Reads `[offset, offset + length)` of the area into a budgeted buffer: whole blocks
    /// around the range; returns the buffer and where the range starts in it.
    fn read_range(&self, offset: u64, length: u64) -> Result<(Held<'_>, usize), (Status, String)> {
        let (start, end) = self.span(offset, length)?;
        let span = end - start;
        let mut held = self.budget.take(span).ok_or_else(|| {
            (
                Status::ObjectUnavailable,
                "the disk tier is busy (every I/O buffer taken); retry".to_owned(),
            )
        })?;
        self.area
            .read_at(start, &mut held.buf()[..span as usize])
            .map_err(|e| self.io_error(&e))?;
        Ok((held, (offset - start) as usize))
    }

    fn read(
        &self,
        io: &mut ServerIo<'_>,
        offset: u64,
        length: u64,
        version: Option<u64>,
    ) -> Result<bool, TransferError> {
        if let Some(version) = version {
            if let Some((status, msg)) =
                versioned_refusal(&self.lease, &self.records, offset, version, length)
            {
                self.counters.stale_reads.fetch_add(1, Ordering::Relaxed);
                io.error(status, &msg)?;
                return Ok(false);
            }
        }
        match self.read_range(offset, length) {
            Ok((mut held, at)) => {
                io.reply(Status::Ok, &[], &[&held.buf()[at..at + length as usize]])?;
                self.counters.reads.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_read
                    .fetch_add(length, Ordering::Relaxed);
                Ok(true)
            }
            Err((status, msg)) => {
                io.error(status, &msg)?;
                Ok(false)
            }
        }
    }

    /// Where `[offset, offset + length)` lies, in whole blocks: `(start, end)`, or why it
    /// cannot be read.
    fn span(&self, offset: u64, length: u64) -> Result<(u64, u64), (Status, String)> {
        let end = offset
            .checked_add(length)
            .filter(|&end| length > 0 && length <= MAX_IO && end <= self.area.size())
            .ok_or_else(|| {
                (
                    Status::OutOfBounds,
                    format!(
                        "[{offset}, +{length}) is outside the {}-byte disk tier or larger than \
                         {MAX_IO} bytes",
                        self.area.size()
                    ),
                )
            })?;
        Ok((offset / BLOCK * BLOCK, blocks(end)))
    }

    /// One move; the status for its item.
    fn move_one(&self, m: &MoveItem) -> Status {
        let result = match m.kind {
            MoveKind::Demote => self.demote(m),
            MoveKind::Promote => self.promote(m),
        };
        match result {
            Ok(()) => Status::Ok,
            Err((status, msg)) => {
                tracing::warn!(key = %m.key, version = m.version, kind = ?m.kind, %msg,
                    "disk tier move refused");
                status
            }
        }
    }

    fn check_move(&self, m: &MoveItem) -> Result<(), (Status, String)> {
        if m.key.is_empty() || m.size == 0 || m.size > MAX_IO {
            return Err((
                Status::InvalidParams,
                format!("a move needs a key and 1..={MAX_IO} bytes"),
            ));
        }
        let (mem_at, disk_at) = match m.kind {
            MoveKind::Demote => (m.from, m.to),
            MoveKind::Promote => (m.to, m.from),
        };
        self.memory
            .check(mem_at, m.size)
            .map_err(|msg| (Status::OutOfBounds, msg))?;
        if disk_at % BLOCK != 0
            || disk_at
                .checked_add(blocks(m.size))
                .is_none_or(|end| end > self.area.size())
        {
            return Err((
                Status::OutOfBounds,
                format!(
                    "disk range [{disk_at}, +{}) is unaligned or outside",
                    m.size
                ),
            ));
        }
        Ok(())
    }

    /// Whether `bytes` hash to `checksum`; a mismatch is counted.
    fn checked(&self, bytes: &[u8], checksum: u32) -> Result<(), (Status, String)> {
        let crc = crate::checksum::crc32c(bytes);
        if crc != checksum {
            self.counters
                .checksum_failures
                .fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::ChecksumMismatch,
                format!("the bytes hash to CRC-32C {crc:08x}, the object's is {checksum:08x}"),
            ));
        }
        Ok(())
    }

    fn record(
        &self,
        records: &Records,
        m: &MoveItem,
        (offset, checksum): (u64, u32),
    ) -> Result<(), (Status, String)> {
        records
            .seal(&[StoredObject {
                key: m.key.clone(),
                version: m.version,
                offset,
                size: m.size,
                checksum,
            }])
            .map_err(|e| {
                self.counters.index_errors.fetch_add(1, Ordering::Relaxed);
                (Status::Internal, format!("index write failed: {e}"))
            })
    }

    /// Memory → disk, then recorded in the tier's index. Whole blocks go from the segment's
    /// mapping straight to the file when the object starts on a page (the master places values
    /// of 64 KiB or more so); the rest through an aligned buffer. The memory record stays until
    /// the master's forget.
    ///
    /// The bytes are not checked against the checksum here: the master keeps the memory replica
    /// until this copy is confirmed, and discards the copy when the object was replaced or
    /// removed meanwhile (the only way its memory could be reused under the copy); and every
    /// reader checks every value. A promotion does check (`promote`): the disk is where bytes
    /// rot. A value recorded unhashed in memory (Mooncake's one-sided writes) is hashed here,
    /// as it is copied, so that the disk's record has its checksum.
    fn demote(&self, m: &MoveItem) -> Result<(), (Status, String)> {
        self.check_move(m)?;
        // SAFETY: bounds checked; the master does not reuse the range while the move runs.
        let src = unsafe { self.memory.slice(m.from, m.size) };
        let checksum = match self.memory_records.hashed(m.from, m.version, m.size) {
            Some(None) => crate::checksum::crc32c(src),
            _ => m.checksum,
        };
        let direct_ok = !self.area.direct() || src.as_ptr() as u64 % BLOCK == 0;
        let whole = if direct_ok { m.size / BLOCK * BLOCK } else { 0 };
        if whole > 0 {
            self.area
                .write_at(m.to, &src[..whole as usize])
                .map_err(|e| self.io_error(&e))?;
        }
        let rest = &src[whole as usize..];
        if !rest.is_empty() {
            let span = blocks(rest.len() as u64) as usize;
            let mut held = self.budget.take(span as u64).ok_or_else(|| {
                (
                    Status::ObjectUnavailable,
                    "the disk tier is busy; retry".to_owned(),
                )
            })?;
            let buf = held.buf();
            buf[..rest.len()].copy_from_slice(rest);
            buf[rest.len()..span].fill(0);
            self.area
                .write_at(m.to + whole, &buf[..span])
                .map_err(|e| self.io_error(&e))?;
        }
        self.record(&self.records, m, (m.to, checksum))?;
        self.counters.demoted.fetch_add(1, Ordering::Relaxed);
        self.counters
            .demoted_bytes
            .fetch_add(m.size, Ordering::Relaxed);
        Ok(())
    }

    /// Disk → memory: read, checked against the disk record's checksum, copied into the
    /// range the master allocated, then recorded in the memory segment's records. The disk
    /// record stays until the master's forget.
    fn promote(&self, m: &MoveItem) -> Result<(), (Status, String)> {
        self.check_move(m)?;
        let Some(on_disk) = self.records.hashed(m.from, m.version, m.size) else {
            return Err((
                Status::ObjectNotFound,
                format!(
                    "the disk tier has no record of version {} at {}",
                    m.version, m.from
                ),
            ));
        };
        let checksum = on_disk.unwrap_or(m.checksum);
        let (mut held, at) = self.read_range(m.from, m.size)?;
        let bytes = &held.buf()[at..at + m.size as usize];
        self.checked(bytes, checksum)?;
        // SAFETY: the master allocated this memory range to this promotion alone.
        unsafe { self.memory.slice_mut(m.to, m.size) }.copy_from_slice(bytes);
        self.record(&self.memory_records, m, (m.to, checksum))?;
        self.counters.promoted.fetch_add(1, Ordering::Relaxed);
        self.counters
            .promoted_bytes
            .fetch_add(m.size, Ordering::Relaxed);
        Ok(())
    }

    fn dispatch(
        &self,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
    ) -> Result<bool, TransferError> {
        match op {
            Opcode::Read => {
                let r = ReadReq::from_meta(meta)?;
                self.read(io, r.offset, r.length, None)
            }
            Opcode::ReadVersion => {
                let r = ReadVersionReq::from_meta(meta)?;
                self.read(io, r.offset, r.length, Some(r.version))
            }
            Opcode::Move => {
                let Some(body) = self.grants.open_order(io, op, meta)? else {
                    return Ok(false);
                };
                let r = rpc::Move::request(body)?;
                let items = r.items.iter().map(|m| self.move_one(m)).collect();
                io.answer::<rpc::Move>(&BatchStatusResp { items })?;
                Ok(true)
            }
            Opcode::Forget => {
                let Some(body) = self.grants.open_order(io, op, meta)? else {
                    return Ok(false);
                };
                let r = rpc::Forget::request(body)?;
                answer_forget(&self.records, &self.counters.index_errors, io, &r.items)
            }
            Opcode::ForgetLease => {
                let Some(body) = self.grants.open_order(io, op, meta)? else {
                    return Ok(false);
                };
                let r = rpc::ForgetLease::request(body)?;
                answer_forget(&self.records, &self.counters.index_errors, io, &r.items)
            }
            Opcode::StoreInfo => {
                rpc::StoreInfo::request(meta)?;
                io.answer::<rpc::StoreInfo>(&StoreInfoResp {
                    name: self.name.clone(),
                    size: self.area.size(),
                })?;
                Ok(true)
            }
            Opcode::Write | Opcode::WriteChecked | Opcode::Seal | Opcode::SealDeferred => {
                io.discard_data()?;
                io.error(
                    Status::InvalidParams,
                    "a disk tier segment takes no writes: objects come to it from the store's \
                     memory segment (MOVE)",
                )?;
                Ok(false)
            }
            other => {
                io.error(
                    Status::UnknownOpcode,
                    &format!("{} is not a disk tier operation", other.name()),
                )?;
                Ok(false)
            }
        }
    }
}

impl Service for DiskService {
    fn handle(&self, op: Opcode, meta: &[u8], io: &mut ServerIo<'_>) -> Handling {
        self.stats.timed(op as u8, || self.dispatch(op, meta, io))?;
        Ok(Handled::Answered)
    }

    fn max_data_len(&self) -> u64 {
        0
    }

    fn connections(&self) -> &ConnCounters {
        &self.connections
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value recorded unhashed in memory (Mooncake's one-sided writes) is hashed as it is
    /// copied to disk; on its way back it is checked against the disk record's checksum, and
    /// recorded in memory with it.
    #[test]
    fn an_unhashed_value_is_hashed_on_its_way_to_disk_and_checked_on_its_way_back() {
        let dir = tempfile::tempdir().unwrap();
        let memory = Arc::new(SegmentMemory::create(dir.path(), "m", 1 << 20).unwrap());
        let area = Arc::new(DiskArea::open(dir.path(), "d", 1 << 20).unwrap());
        let (records, memory_records) = (
            Arc::new(Records::in_memory()),
            Arc::new(Records::in_memory()),
        );
        let tier = DiskService::new(
            "d".into(),
            area,
            records,
            memory.clone(),
            Arc::clone(&memory_records),
            GrantKey::generate().unwrap(),
        );
        let value = b"written one-sided; ".repeat(300);
        let size = value.len() as u64;
        // SAFETY: the test's own segment, nothing else maps it.
        unsafe { memory.slice_mut(0, size) }.copy_from_slice(&value);
        let key = "k".to_string();
        memory_records
            .seal_unhashed(&[StoredObject {
                key: key.clone(),
                version: 7,
                offset: 0,
                size,
                checksum: 0,
            }])
            .unwrap();
        // The master's version is unhashed: its order carries no checksum.
        let down = MoveItem {
            kind: MoveKind::Demote,
            key,
            version: 7,
            from: 0,
            to: 0,
            size,
            checksum: 0,
        };
        tier.demote(&down).unwrap();
        let crc = crc32c::crc32c(&value);
        assert_eq!(tier.records.hashed(0, 7, size), Some(Some(crc)));
        let up = MoveItem {
            kind: MoveKind::Promote,
            from: 0,
            to: 1 << 16,
            ..down
        };
        tier.promote(&up).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { memory.slice(1 << 16, size) }, &value[..]);
        assert_eq!(memory_records.hashed(1 << 16, 7, size), Some(Some(crc)));
        assert_eq!(tier.counters.checksum_failures.load(Ordering::Relaxed), 0);
    }
}
