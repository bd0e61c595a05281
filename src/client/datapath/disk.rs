//! The same-host path to a store's disk tier: the client reads the tier's file itself, with
//! `O_DIRECT` `pread` into an aligned buffer, instead of having the store read it and send it
//! over a socket. Disk segments take no writes from clients (objects reach them only by the
//! master's moves), so this path only reads.

use super::{DataPath, PathKind, ReadOp, WriteOp};
use crate::store::disk::{blocks, AlignedBuf, DiskArea, BLOCK};
use crate::transfer::message::SegmentInfo;
use crate::transfer::TransferError;
use parking_lot::Mutex;
use std::path::Path;

/// Bytes read per `pread`: then copied out and checksummed while still in the cache.
const PIECE: u64 = 1 << 20;

/// The same-host path to a store's disk tier: its file read by this client directly.
pub struct LocalDisk {
    area: DiskArea,
    /// The store's lock file: held while the store runs.
    lock: std::path::PathBuf,
    /// Aligned buffers kept for the next reads (one per concurrent reader at most).
    spare: Mutex<Vec<AlignedBuf>>,
}

impl LocalDisk {
    /// Opens the disk tier's file if it is on this host, its token matches and its store's
    /// lock file is there; `None` otherwise (the client then reads over TCP).
    pub fn open(info: &SegmentInfo, host_id: &str) -> Option<LocalDisk> {
        if info.shm_path.is_empty() || info.host_id.is_empty() || info.host_id != host_id {
            return None;
        }
        let path = Path::new(&info.shm_path);
        let token = std::fs::read_to_string(path.with_extension("token"))
            .map_err(|e| super::shm::not_ours(info, &e))
            .ok()?;
        if u64::from_str_radix(token.trim(), 16).ok()? != info.shm_token {
            return None;
        }
        let lock = crate::store::segment::lock_path(path);
        if !lock.exists() {
            return None;
        }
        let area = DiskArea::open_existing(path, info.size)
            .map_err(|e| {
                if let crate::store::disk::DiskError::Io { source, .. } = &e {
                    super::shm::not_ours(info, source)
                }
            })
            .ok()?;
        tracing::debug!(segment = %info.name, direct = area.direct(), "reading same-host disk tier directly");
        Some(LocalDisk {
            area,
            lock,
            spare: Mutex::new(Vec::new()),
        })
    }

    fn owner_alive(&self) -> bool {
        super::shm::lock_held(&self.lock)
    }

    /// `dst.len()` bytes from `offset` into `dst`; answers their CRC-32C.
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<u32, TransferError> {
        let len = dst.len() as u64;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.area.size())
        {
            return Err(TransferError::Protocol(format!(
                "range {offset}+{len} lies outside the {}-byte disk tier",
                self.area.size()
            )));
        }
        let mut buf = self
            .spare
            .lock()
            .pop()
            .unwrap_or_else(|| AlignedBuf::new(PIECE as usize));
        let mut crc = 0;
        let mut done = 0u64;
        let result = (|| {
            while done < len {
                let at = offset + done;
                let start = at / BLOCK * BLOCK;
                let want = (len - done).min(PIECE - (at - start));
                let span = blocks(at + want) - start;
                self.area
                    .read_at(start, &mut buf[..span as usize])
                    .map_err(|e| TransferError::Io(std::io::Error::other(e.to_string())))?;
                let from = (at - start) as usize;
                let piece = &buf[from..from + want as usize];
                let out = &mut dst[done as usize..(done + want) as usize];
                out.copy_from_slice(piece);
                crc = crate::checksum::crc32c_append(crc, out);
                done += want;
            }
            Ok(crc)
        })();
        self.spare.lock().push(buf);
        result
    }
}

impl DataPath for LocalDisk {
    fn kind(&self) -> PathKind {
        PathKind::Shm
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> Vec<Result<u32, TransferError>> {
        let refused = TransferError::Protocol(
            "a disk tier segment takes no writes: objects reach it from memory".into(),
        );
        vec![Err(refused); ops.len()]
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>> {
        let out: Vec<Result<(), TransferError>> = ops
            .iter_mut()
            .map(|op| {
                op.crc = Some(self.read_into(op.offset, op.dst)?);
                Ok(())
            })
            .collect();
        // Bytes read from the file of a store that died may be from after the master moved on:
        // the checksum would catch a torn value, and the reader asks again.
        if !self.owner_alive() {
            let gone = TransferError::Protocol(
                "the store owning this same-host disk tier is not running (its lock is free)"
                    .into(),
            );
            return vec![Err(gone); ops.len()];
        }
        out
    }
}
