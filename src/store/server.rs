//! The store's data service: writes land straight in segment memory from the socket, reads go
//! out straight from it (vectored writes), and every range is bounds-checked first. Each
//! completed object is recorded (in the durable index of a persistent store, before the write is
//! answered), so that a client holding an object's location can read it with one round trip
//! (`READ_VERSION`) while the master's read lease runs.

use super::claims::{ClaimError, ClaimGuard, WriteClaims};
use super::index::Records;
use super::segment::SegmentMemory;
use super::Recovery;
use crate::telemetry::OpStats;
use crate::transfer::grant::{Grant, GrantKey};
use crate::transfer::message::{
    BatchStatusResp, CheckVersionResp, ForgetItem, ReadReq, ReadVersionReq, SealDeferredResp,
    SealReq, StoreInfoResp, StoredObject, Wire, WriteReq,
};
use crate::transfer::rpc::{self, Rpc};
use crate::transfer::server::{Handled, Handling, ServerIo, Service};
use crate::transfer::{Opcode, Status, TransferError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a write waits for an older put still writing its range: such bytes come from a
/// socket buffer at once, or the older write's connection times out first.
pub const CLAIM_WAIT: Duration = Duration::from_secs(5);

/// How long this store may answer version-checked reads. The master extends it with each
/// `FORGET_LEASE`, after the store has applied the forgets it carries; it is revoked when the
/// store mounts (again) or leaves. So a store the master cannot reach stops serving cached
/// locations within one lease: the master, unable to tell it that an object was removed or
/// replaced, waits that long before it acknowledges the removal or replacement.
#[derive(Debug)]
pub struct ReadLease {
    base: Instant,
    /// Nanoseconds after `base` until which the lease runs; 0 = revoked.
    until_ns: AtomicU64,
}

impl Default for ReadLease {
    fn default() -> ReadLease {
        ReadLease {
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
        }
    }
}

impl ReadLease {
    /// Runs the lease until `from + lease` (never shortens it).
    pub fn extend(&self, from: Instant, lease: Duration) {
        let until = from.saturating_duration_since(self.base) + lease;
        self.until_ns
            .fetch_max(until.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Ends the lease now.
    pub fn revoke(&self) {
        self.until_ns.store(0, Ordering::SeqCst);
    }

    /// Whether the lease still runs at `now`.
    pub fn valid(&self, now: Instant) -> bool {
        !self.left(now).is_zero()
    }

    /// How much longer the lease runs from `now` (zero when it has none).
    pub fn left(&self, now: Instant) -> Duration {
        let until = self.until_ns.load(Ordering::SeqCst);
        let at = now.saturating_duration_since(self.base).as_nanos() as u64;
        Duration::from_nanos(until.saturating_sub(at))
    }
}

/// Why a read of a remembered location (`READ_VERSION`) must go to the master instead: no read
/// lease, or `version` is no longer what the records hold at `offset`.
pub fn versioned_refusal(
    lease: &ReadLease,
    records: &Records,
    offset: u64,
    version: u64,
    length: u64,
) -> Option<(Status, String)> {
    if !lease.valid(Instant::now()) {
        Some((
            Status::ObjectUnavailable,
            "this store has no read lease from the master now; ask the master".to_owned(),
        ))
    } else if records.holds(offset, version, length).is_none() {
        Some((
            Status::ObjectNotFound,
            format!(
                "version {version} is not at offset {offset} (replaced, removed or evicted); \
                 ask the master"
            ),
        ))
    } else {
        None
    }
}

/// A store's side of the master's grants (`transfer::grant`): the key it checks them with, and
/// how many writes, seals and orders it refused for want of one.
#[derive(Debug)]
pub struct GrantCheck {
    pub key: GrantKey,
    pub refused: AtomicU64,
}

impl GrantCheck {
    /// Checks grants signed with `key`.
    pub fn new(key: GrantKey) -> GrantCheck {
        GrantCheck {
            key,
            refused: AtomicU64::new(0),
        }
    }

    /// The body of a master's order (`FORGET`, `FORGET_LEASE`, `MOVE`) if it carries the
    /// master's tag; else the request is answered `NOT_GRANTED` (counted) and `None` returned.
    pub fn open_order<'m>(
        &self,
        io: &mut ServerIo<'_>,
        op: Opcode,
        meta: &'m [u8],
    ) -> Result<Option<&'m [u8]>, TransferError> {
        match self.key.open_order(op, meta) {
            Ok(body) => Ok(Some(body)),
            Err(e) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(op = op.name(), error = %e, "order refused");
                io.error(Status::NotGranted, &e.to_string())?;
                Ok(None)
            }
        }
    }
}

/// FORGET and FORGET_LEASE on `records`: drops them and answers the request. A lease that
/// comes with a FORGET_LEASE is not taken: counted from its arrival, it could outlast what
/// the master thinks (the store asks for its lease with `LEASE` instead).
pub fn answer_forget(
    records: &Records,
    index_errors: &AtomicU64,
    io: &mut ServerIo<'_>,
    items: &[ForgetItem],
) -> Result<bool, TransferError> {
    if let Err(e) = records.forget(items) {
        index_errors.fetch_add(1, Ordering::Relaxed);
        io.error(Status::Internal, &format!("index write failed: {e}"))?;
        return Ok(false);
    }
    if tracing::enabled!(tracing::Level::TRACE) {
        for it in items {
            tracing::trace!(offset = it.offset, version = it.version, "forgot");
        }
    }
    io.ok(&())?;
    Ok(true)
}

/// The store's data service on its memory segment.
pub struct StoreService {
    pub name: String,
    pub memory: Option<Arc<SegmentMemory>>,
    /// Checks the master's grants (writes, seals) and orders (forgets).
    pub grants: GrantCheck,
    /// What the segment holds: the durable index of a persistent store, else in memory.
    pub records: Arc<Records>,
    /// CRC-32C of ranges Mooncake's Transfer Engine wrote whole, for `SEAL_DEFERRED`.
    pub te_hashes: Arc<crate::mooncake::te_tcp::WrittenHashes>,
    /// Hashes the objects `SEAL_DEFERRED` recorded unhashed.
    pub hasher: Arc<super::hasher::Hasher>,
    pub lease: Arc<ReadLease>,
    /// Writes of a lower version are refused: the master's `write_floor` at the last mount.
    pub write_floor: Arc<AtomicU64>,
    /// Writes refused for it (puts an earlier master started).
    pub stale_writes: AtomicU64,
    /// The ranges being written now: an older put's late bytes never land over a newer put's.
    pub claims: WriteClaims,
    /// Writes refused because a newer put holds or is writing their range (their put was
    /// given up), or because an older put was still writing it past [`CLAIM_WAIT`].
    pub superseded_writes: AtomicU64,
    /// Version-checked reads refused: stale location, or no lease.
    pub stale_reads: AtomicU64,
    pub recovery: Recovery,
    pub index_errors: AtomicU64,
    /// Checked writes whose bytes did not match the CRC their writer sent.
    pub checksum_mismatches: AtomicU64,
    pub stats: OpStats,
    pub bytes_written: AtomicU64,
    /// Bytes same-host clients copied in and reported with `SEAL` (persistent stores).
    pub bytes_sealed: AtomicU64,
    pub bytes_read: AtomicU64,
    pub connections: crate::transfer::server::ConnCounters,
    /// The segment registered on this store's RDMA NICs (`protocol = "rdma"`).
    #[cfg(feature = "rdma")]
    pub rdma: Option<Arc<crate::transfer::rdma::serve::RdmaSegment>>,
    /// Queue pairs connected (`RDMA_CONNECT` answered).
    pub rdma_connects: AtomicU64,
    /// Bytes clients wrote with RDMA and sealed (checked and recorded).
    pub rdma_bytes_sealed: AtomicU64,
}

impl StoreService {
    /// Why a write of `version` must not land: a put that a master before the current one
    /// started (it restarted or was deposed) is committed by no one, and its space may already
    /// be another object's.
    fn stale(&self, key: &str, version: u64) -> Option<String> {
        let floor = self.write_floor.load(Ordering::Acquire);
        if key.is_empty() || version >= floor {
            return None;
        }
        self.stale_writes.fetch_add(1, Ordering::Relaxed);
        Some(format!(
            "version {version} of {key:?} was started at an earlier master (this one issues \
             versions from {floor}); start the put again"
        ))
    }

    /// Whether the master granted this write or seal: `size` bytes of `key` at `version`,
    /// `offset`. Refusals are counted and logged (a client that is not the put's: a bug, or
    /// someone writing over another client's value).
    fn granted(
        &self,
        key: &str,
        grant: &Grant,
        version: u64,
        offset: u64,
        size: u64,
    ) -> Result<(), (Status, String)> {
        if key.is_empty() {
            return Err((
                Status::InvalidParams,
                "a write names the key of its put (the master granted it for that put)".into(),
            ));
        }
        if self.grants.key.allows(grant, version, offset, size) {
            return Ok(());
        }
        self.grants.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            key,
            version,
            offset,
            size,
            "write refused: not granted by the master"
        );
        Err((
            Status::NotGranted,
            format!(
                "the master granted no write of {size} bytes of version {version} at offset                  {offset} of this store: write only where a put of yours was started, with                  its grant (is the client older than this store?)"
            ),
        ))
    }

    /// Claims a write's range (`claims`), or says why it may not land.
    fn claim(
        &self,
        offset: u64,
        len: u64,
        version: u64,
    ) -> Result<ClaimGuard<'_>, (Status, String)> {
        let recorded = |o, l| self.records.newest_overlapping(o, l);
        self.claims
            .claim(offset, len, version, recorded, CLAIM_WAIT)
            .map_err(|e| {
                self.superseded_writes.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(offset, len, version, error = %e, "write refused");
                let status = match e {
                    ClaimError::Superseded { .. } => Status::WriteSuperseded,
                    ClaimError::Busy { .. } => Status::ObjectUnavailable,
                };
                (status, e.to_string())
            })
    }

    /// Whether bytes that came in without the store (`SEAL`) were overtaken by a newer put.
    fn superseded(&self, o: &StoredObject) -> Option<ClaimError> {
        let recorded = |off, l| self.records.newest_overlapping(off, l);
        let e = self
            .claims
            .superseded(o.offset, o.size, o.version, recorded)?;
        self.superseded_writes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(offset = o.offset, version = o.version, error = %e, "seal refused");
        Some(e)
    }

    /// WRITE and WRITE_CHECKED: the bytes straight into the segment, checksummed as they come;
    /// with `checked`, the CRC-32C the writer sent after them must match.
    fn write(
        &self,
        io: &mut ServerIo<'_>,
        mem: &SegmentMemory,
        r: WriteReq,
        checked: bool,
    ) -> Result<bool, TransferError> {
        let total = io.data_len();
        let trailer = if checked { 4 } else { 0 };
        let Some(len) = total.checked_sub(trailer) else {
            io.discard_data()?;
            io.error(
                Status::InvalidParams,
                "a checked write's payload must end with its 4-byte CRC-32C",
            )?;
            return Ok(false);
        };
        if let Err(msg) = mem.check(r.offset, len) {
            io.discard_data()?;
            io.error(Status::OutOfBounds, &msg)?;
            return Ok(false);
        }
        if let Err((status, msg)) = self.granted(&r.key, &r.grant, r.version, r.offset, len) {
            io.discard_data()?;
            io.error(status, &msg)?;
            return Ok(false);
        }
        if let Some(msg) = self.stale(&r.key, r.version) {
            io.discard_data()?;
            io.error(Status::WriteSuperseded, &msg)?;
            return Ok(false);
        }
        // The master allocated this range to exactly one live put; an older, given-up put's
        // late bytes are refused here, and one still coming in is waited for.
        let claim = match self.claim(r.offset, len, r.version) {
            Ok(claim) => claim,
            Err((status, msg)) => {
                io.discard_data()?;
                io.error(status, &msg)?;
                return Ok(false);
            }
        };
        // SAFETY: the range is claimed by this put alone.
        let dst = unsafe { mem.slice_mut(r.offset, len) };
        let checksum = if checked {
            let crc = io.read_data_streamed_crc(dst)?;
            let mut sent = [0u8; 4];
            io.read_data_into(&mut sent)?;
            let sent = u32::from_le_bytes(sent);
            if sent != crc {
                self.checksum_mismatches.fetch_add(1, Ordering::Relaxed);
                let msg = format!(
                    "the bytes written at offset {} hash to CRC-32C {crc:08x}, their writer sent \
                     {sent:08x}: corrupted on the way; not recorded",
                    r.offset
                );
                tracing::warn!(offset = r.offset, key = %r.key, "{msg}");
                io.error(Status::InvalidParams, &msg)?;
                return Ok(false);
            }
            crc
        } else {
            io.read_data_into(dst)?;
            r.checksum
        };
        self.bytes_written.fetch_add(len, Ordering::Relaxed);
        // Every byte is in place: now the object may be recorded (never before, so a crash
        // mid-write leaves no record of a torn object).
        let result = self.records.seal(&[StoredObject {
            key: r.key,
            version: r.version,
            offset: r.offset,
            size: len,
            checksum,
        }]);
        if let Err(e) = result {
            self.index_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "cannot record the object in the index");
            io.error(Status::Internal, &format!("index write failed: {e}"))?;
            return Ok(false);
        }
        drop(claim);
        tracing::trace!(offset = r.offset, version = r.version, "recorded");
        io.reply(Status::Ok, &[], &[])?;
        Ok(true)
    }

    /// FORGET and FORGET_LEASE: drop the records.
    fn forget(&self, io: &mut ServerIo<'_>, items: &[ForgetItem]) -> Result<bool, TransferError> {
        answer_forget(&self.records, &self.index_errors, io, items)
    }

    /// Answers a read of `length` bytes at `offset`. With a `version`, the read is of a
    /// remembered location: it is served only while the master's read lease holds and the
    /// record at `offset` is still that version; otherwise the reader is told to ask the master.
    fn read_range(
        &self,
        io: &mut ServerIo<'_>,
        mem: &SegmentMemory,
        offset: u64,
        length: u64,
        version: Option<u64>,
    ) -> Result<bool, TransferError> {
        if let Err(msg) = mem.check(offset, length) {
            io.error(Status::OutOfBounds, &msg)?;
            return Ok(false);
        }
        if let Some(version) = version {
            if let Some((status, msg)) =
                versioned_refusal(&self.lease, &self.records, offset, version, length)
            {
                self.stale_reads.fetch_add(1, Ordering::Relaxed);
                io.error(status, &msg)?;
                return Ok(false);
            }
        }
        if let Some(version) = version {
            tracing::trace!(offset, version, length, "served a cached location");
        }
        // A plain read is covered by the reader's lease from the master: the range is not
        // reallocated meanwhile. A versioned read may race a reuse of freed space while the
        // bytes go out: the reader's checksum catches that.
        // SAFETY: the range is bounds-checked; the bytes are only read.
        let src = unsafe { mem.slice(offset, length) };
        io.reply(Status::Ok, &[], &[src])?;
        self.bytes_read.fetch_add(length, Ordering::Relaxed);
        Ok(true)
    }

    /// RDMA_CONNECT: a queue pair for this connection, joined to the client's.
    fn rdma_connect(&self, io: &mut ServerIo<'_>, meta: &[u8]) -> Result<bool, TransferError> {
        let req = crate::transfer::message::RdmaConnectReq::from_meta(meta)?;
        #[cfg(feature = "rdma")]
        if let Some(rdma) = &self.rdma {
            if io.has_attached() {
                io.error(
                    Status::InvalidParams,
                    "this connection has its RDMA queue pair already",
                )?;
                return Ok(false);
            }
            return match rdma.accept(&req) {
                Ok((qp, resp)) => {
                    io.attach(Box::new(qp));
                    self.rdma_connects.fetch_add(1, Ordering::Relaxed);
                    io.answer::<rpc::RdmaConnect>(&resp)?;
                    Ok(true)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot connect a client's RDMA queue pair");
                    io.error(Status::Internal, &format!("RDMA: {e}"))?;
                    Ok(false)
                }
            };
        }
        let _ = req;
        io.error(
            Status::InvalidParams,
            "this store does not serve RDMA (its protocol is tcp): use TCP",
        )?;
        Ok(false)
    }

    /// SEAL, SEAL_CHECKED and SEAL_DEFERRED: records objects whose bytes came into the segment
    /// without this store moving them (a same-host client's copies; a client's RDMA WRITEs;
    /// Mooncake's Transfer Engine), each if it is in bounds, granted and not superseded; with
    /// `Checked`, only if its bytes in the segment hash to the CRC-32C its writer computed as
    /// it sent them; with `Deferred`, with the CRC-32C the transport took on the way in, or
    /// else unhashed, for the hasher to hash after the answer.
    fn seal(
        &self,
        io: &mut ServerIo<'_>,
        mem: &SegmentMemory,
        SealReq { objects, grants }: SealReq,
        mode: SealMode,
    ) -> Result<bool, TransferError> {
        let checked = mode == SealMode::Checked;
        if grants.len() != objects.len() {
            io.error(
                Status::InvalidParams,
                &format!(
                    "a seal carries one grant per object: {} grants for {} objects",
                    grants.len(),
                    objects.len()
                ),
            )?;
            return Ok(false);
        }
        let mut items = Vec::with_capacity(objects.len());
        let mut good = Vec::with_capacity(objects.len());
        let mut checksums = Vec::with_capacity(objects.len());
        let mut hashed = Vec::with_capacity(objects.len());
        // Recorded without a checksum, hashed after the answer.
        let mut unhashed = Vec::new();
        for (mut o, grant) in objects.into_iter().zip(&grants) {
            let status = if mem.check(o.offset, o.size).is_err() {
                Status::OutOfBounds
            } else if let Err((status, _)) =
                self.granted(&o.key, grant, o.version, o.offset, o.size)
            {
                status
            } else if self.stale(&o.key, o.version).is_some() || self.superseded(&o).is_some() {
                Status::WriteSuperseded
            } else if checked && !self.holds_bytes_of(mem, &o) {
                Status::ChecksumMismatch
            } else {
                Status::Ok
            };
            items.push(status);
            if status != Status::Ok {
                checksums.push(0);
                hashed.push(false);
                continue;
            }
            if mode == SealMode::Deferred {
                // Hashed as the Transfer Engine's TCP transport wrote it, or else (one-sided
                // writes pass no CPU on the way in) by the hasher, after the answer.
                match self.te_hashes.take(o.offset, o.size) {
                    Some(crc) => o.checksum = crc,
                    None => {
                        checksums.push(0);
                        hashed.push(false);
                        unhashed.push(o);
                        continue;
                    }
                }
            }
            checksums.push(o.checksum);
            hashed.push(true);
            good.push(o);
        }
        let recorded = self.records.seal(&good).and_then(|()| {
            if unhashed.is_empty() {
                return Ok(());
            }
            self.records.seal_unhashed(&unhashed)
        });
        if let Err(e) = recorded {
            self.index_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "cannot record objects in the index");
            io.error(Status::Internal, &format!("index write failed: {e}"))?;
            return Ok(false);
        }
        let bytes: u64 = good.iter().chain(&unhashed).map(|o| o.size).sum();
        let counter = if checked {
            &self.rdma_bytes_sealed
        } else {
            &self.bytes_sealed
        };
        counter.fetch_add(bytes, Ordering::Relaxed);
        match mode {
            SealMode::Deferred => io.answer::<rpc::SealDeferred>(&SealDeferredResp {
                items,
                checksums,
                hashed,
            })?,
            SealMode::Checked => io.answer::<rpc::SealChecked>(&BatchStatusResp { items })?,
            SealMode::Trusted => io.answer::<rpc::Seal>(&BatchStatusResp { items })?,
        }
        if !unhashed.is_empty() {
            self.hasher.wake();
        }
        Ok(true)
    }

    /// Whether the (bounds-checked) range of `o` hashes to its CRC-32C; a mismatch is counted
    /// and logged.
    fn holds_bytes_of(&self, mem: &SegmentMemory, o: &StoredObject) -> bool {
        // SAFETY: bounds checked by the caller; the range is this put's alone, its writer done.
        let crc = crate::checksum::crc32c(unsafe { mem.slice(o.offset, o.size) });
        if crc == o.checksum {
            return true;
        }
        self.checksum_mismatches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(offset = o.offset, key = %o.key, crc, sent = o.checksum,
            "bytes written by RDMA do not match their writer's CRC-32C; not recorded");
        false
    }

    fn dispatch(
        &self,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
    ) -> Result<bool, TransferError> {
        let no_segment = |io: &mut ServerIo<'_>| -> Result<bool, TransferError> {
            io.discard_data()?;
            io.error(
                Status::SegmentNotFound,
                "this process contributes no segment",
            )?;
            Ok(false)
        };
        match op {
            Opcode::Write | Opcode::WriteChecked => {
                let r = WriteReq::from_meta(meta)?;
                let Some(mem) = &self.memory else {
                    return no_segment(io);
                };
                self.write(io, mem, r, op == Opcode::WriteChecked)
            }
            Opcode::Seal | Opcode::SealChecked | Opcode::SealDeferred => {
                // One request type for the three modes.
                let r = rpc::Seal::request(meta)?;
                let Some(mem) = &self.memory else {
                    return no_segment(io);
                };
                let mode = match op {
                    Opcode::SealChecked => SealMode::Checked,
                    Opcode::SealDeferred => SealMode::Deferred,
                    _ => SealMode::Trusted,
                };
                self.seal(io, mem, r, mode)
            }
            Opcode::RdmaConnect => self.rdma_connect(io, meta),
            Opcode::CheckVersion => {
                let r = rpc::CheckVersion::request(meta)?;
                if self.memory.is_none() {
                    return no_segment(io);
                }
                if let Some((status, msg)) =
                    versioned_refusal(&self.lease, &self.records, r.offset, r.version, r.length)
                {
                    self.stale_reads.fetch_add(1, Ordering::Relaxed);
                    io.error(status, &msg)?;
                    return Ok(false);
                }
                // Read after the check: the lease ran at least this long past it.
                let left = self.lease.left(Instant::now());
                io.answer::<rpc::CheckVersion>(&CheckVersionResp {
                    lease_ms_left: left.as_millis() as u64,
                })?;
                Ok(true)
            }
            Opcode::Forget => {
                let Some(body) = self.grants.open_order(io, op, meta)? else {
                    return Ok(false);
                };
                let r = rpc::Forget::request(body)?;
                self.forget(io, &r.items)
            }
            Opcode::ForgetLease => {
                let Some(body) = self.grants.open_order(io, op, meta)? else {
                    return Ok(false);
                };
                let r = rpc::ForgetLease::request(body)?;
                self.forget(io, &r.items)
            }
            Opcode::ReadVersion => {
                let r = ReadVersionReq::from_meta(meta)?;
                let Some(mem) = &self.memory else {
                    return no_segment(io);
                };
                self.read_range(io, mem, r.offset, r.length, Some(r.version))
            }
            Opcode::Read => {
                let r = ReadReq::from_meta(meta)?;
                let Some(mem) = &self.memory else {
                    return no_segment(io);
                };
                self.read_range(io, mem, r.offset, r.length, None)
            }
            Opcode::StoreInfo => {
                rpc::StoreInfo::request(meta)?;
                let size = self.memory.as_ref().map_or(0, |m| m.size());
                io.answer::<rpc::StoreInfo>(&StoreInfoResp {
                    name: self.name.clone(),
                    size,
                })?;
                Ok(true)
            }
            other => {
                io.error(
                    Status::UnknownOpcode,
                    &format!("{} is a master operation, not a store one", other.name()),
                )?;
                Ok(false)
            }
        }
    }
}

impl Service for StoreService {
    fn handle(&self, op: Opcode, meta: &[u8], io: &mut ServerIo<'_>) -> Handling {
        self.stats.timed(op as u8, || self.dispatch(op, meta, io))?;
        Ok(Handled::Answered)
    }

    fn max_data_len(&self) -> u64 {
        self.memory.as_ref().map_or(0, |m| m.size())
    }

    fn connections(&self) -> &crate::transfer::server::ConnCounters {
        &self.connections
    }
}

/// How a seal takes the checksums of the objects it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SealMode {
    /// As its writer sent them (a same-host client's copies).
    Trusted,
    /// Only if the bytes hash to them (RDMA WRITEs).
    Checked,
    /// Taken by the transport on the way in, or else worked out from the bytes after the
    /// answer (Mooncake's Transfer Engine, whose writers send none).
    Deferred,
}
