//! The same-host path: a store's segment file mapped into the client, so that reads and writes of
//! local replicas are memory copies instead of socket transfers.

use super::{DataPath, PathKind, ReadOp, WriteOp};
use crate::transfer::message::{BatchStatusResp, SealReq, SegmentInfo, StoredObject};
use crate::transfer::{Opcode, Pool, Status, TransferError};
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;

/// Same-host reads and writes copy (and checksum) this many bytes at a time.
const COPY_PIECE: usize = 256 * 1024;

/// `0..len` in ranges of [`COPY_PIECE`]: each piece is copied, then checksummed while it is
/// still in the cache.
fn pieces(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..len)
        .step_by(COPY_PIECE)
        .map(move |start| start..(start + COPY_PIECE).min(len))
}

/// Whether a store holds its lock file `lock`: it holds an exclusive lock for as long as it
/// lives, and the kernel drops the lock when it dies (kill -9 included). A shared lock that we
/// can take means nobody holds it.
pub fn lock_held(lock: &Path) -> bool {
    use nix::fcntl::{Flock, FlockArg};
    let file = match std::fs::File::open(lock) {
        Ok(file) => file,
        // The lock file is gone: its store stopped (and removed it) or died and was swept.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
        // Not ours to open (a store sharing its segment with a group keeps its lock private):
        // cannot tell, so do not claim the store is gone.
        Err(_) => return true,
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => true,
        Ok(_unlocked_on_drop) => false,
        // Cannot tell: do not claim the store is gone.
        Err(_) => true,
    }
}

/// Says why a same-host segment is reached over TCP when this user may not open its files.
pub fn not_ours(info: &SegmentInfo, e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        tracing::warn!(segment = %info.name, path = %info.shm_path, error = %e,
            "this user cannot open the same-host segment's files; using TCP. A store's files \
             are private to the user it runs as: run this client as that user, or start the \
             store with --shm-group GROUP and make this user a member of GROUP");
    }
}

pub struct LocalSegment {
    _map: memmap2::MmapRaw,
    ptr: *mut u8,
    size: u64,
    /// The store's lock file (`<stem>.lock`): held while the store runs.
    lock: std::path::PathBuf,
}

// SAFETY: as for the store's own mapping: callers touch ranges the master gave them.
unsafe impl Send for LocalSegment {}
unsafe impl Sync for LocalSegment {}

impl LocalSegment {
    /// Maps the segment if it is on this host, its token matches and its store's lock file is
    /// there; `None` otherwise (the client then uses TCP).
    pub fn open(info: &SegmentInfo, host_id: &str) -> Option<LocalSegment> {
        if info.shm_path.is_empty() || info.host_id.is_empty() || info.host_id != host_id {
            return None;
        }
        let path = Path::new(&info.shm_path);
        let token_path = path.with_extension("token");
        let token = std::fs::read_to_string(&token_path)
            .map_err(|e| not_ours(info, &e))
            .ok()?;
        if u64::from_str_radix(token.trim(), 16).ok()? != info.shm_token {
            tracing::debug!(path = %path.display(), "segment token differs: not the same file");
            return None;
        }
        let lock = crate::store::segment::lock_path(path);
        if !lock.exists() {
            return None;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| not_ours(info, &e))
            .ok()?;
        if file.metadata().ok()?.len() != info.size {
            return None;
        }
        let map = memmap2::MmapOptions::new()
            .len(info.size as usize)
            .map_raw(&file)
            .ok()?;
        tracing::debug!(segment = %info.name, "mapped same-host segment");
        Some(LocalSegment {
            ptr: map.as_mut_ptr(),
            _map: map,
            size: info.size,
            lock,
        })
    }

    /// Whether the store that owns the segment still runs: it holds an exclusive lock on its
    /// lock file for as long as it lives, and the kernel drops the lock when it dies (kill -9
    /// included). A shared lock that we can take means nobody holds it.
    pub fn owner_alive(&self) -> bool {
        lock_held(&self.lock)
    }

    fn check(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    fn out_of_bounds(&self, offset: u64, len: usize) -> TransferError {
        TransferError::Protocol(format!(
            "range {offset}+{len} lies outside the {}-byte same-host segment",
            self.size
        ))
    }

    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), TransferError> {
        if !self.check(offset, dst.len() as u64) {
            return Err(self.out_of_bounds(offset, dst.len()));
        }
        // SAFETY: bounds checked; the object is under a read lease.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.add(offset as usize),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), TransferError> {
        if !self.check(offset, src.len() as u64) {
            return Err(self.out_of_bounds(offset, src.len()));
        }
        // SAFETY: bounds checked; the master allocated the range to this put.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset as usize), src.len())
        };
        Ok(())
    }
}

/// A same-host segment as a data path.
pub struct Shm {
    segment: LocalSegment,
    /// The store's connection pool when its segment is persistent: copies bypass the store, so
    /// it is told what was written (`Seal`) for its durable index. A put is acknowledged only
    /// after the seal, so a store restarted from its files serves what was acknowledged.
    seal: Option<Arc<Pool>>,
}

impl Shm {
    pub fn new(segment: LocalSegment, seal: Option<Arc<Pool>>) -> Shm {
        Shm { segment, seal }
    }
}

impl DataPath for Shm {
    fn kind(&self) -> PathKind {
        PathKind::Shm
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> Vec<Result<u32, TransferError>> {
        let mut out: Vec<Result<u32, TransferError>> = ops
            .iter()
            .map(|op| {
                let mut crc = 0;
                for r in pieces(op.value.len()) {
                    let piece = &op.value[r.clone()];
                    self.segment.write(op.offset + r.start as u64, piece)?;
                    crc = crc32c::crc32c_append(crc, piece);
                }
                Ok(crc)
            })
            .collect();
        // Bytes copied into the file of a store that has died are not stored: the master drops
        // its segment when it notices. Checked after the copies, so a store dying before this
        // point is caught; the commit follows at once.
        if !self.segment.owner_alive() {
            let gone = TransferError::Protocol(
                "the store owning this same-host segment is not running (its lock is free)".into(),
            );
            return vec![Err(gone); ops.len()];
        }
        let Some(pool) = &self.seal else { return out };
        let (copied, objects): (Vec<usize>, Vec<StoredObject>) = ops
            .iter()
            .enumerate()
            .filter_map(|(j, op)| {
                let checksum = *out[j].as_ref().ok()?;
                let record = StoredObject {
                    key: op.key.to_string(),
                    version: op.version,
                    offset: op.offset,
                    size: op.value.len() as u64,
                    checksum,
                };
                Some((j, record))
            })
            .unzip();
        if objects.is_empty() {
            return out;
        }
        let req = SealReq { objects };
        let sealed: Result<Vec<Status>, TransferError> = pool
            .with(|c| c.call::<_, BatchStatusResp>(Opcode::Seal, &req))
            .and_then(|r| {
                if r.items.len() == copied.len() {
                    Ok(r.items)
                } else {
                    Err(TransferError::Protocol(format!(
                        "store sealed {} objects of {}",
                        r.items.len(),
                        copied.len()
                    )))
                }
            });
        match sealed {
            Ok(statuses) => {
                for (j, status) in copied.into_iter().zip(statuses) {
                    if status != Status::Ok {
                        out[j] = Err(TransferError::Remote {
                            status,
                            message: format!("seal: {}", status.describe()),
                        });
                    }
                }
            }
            Err(e) => {
                for j in copied {
                    out[j] = Err(e.clone());
                }
            }
        }
        out
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>> {
        ops.iter_mut()
            .map(|op| {
                let mut crc = 0;
                for r in pieces(op.dst.len()) {
                    let piece = &mut op.dst[r.clone()];
                    self.segment.read(op.offset + r.start as u64, piece)?;
                    crc = crc32c::crc32c_append(crc, piece);
                }
                op.crc = Some(crc);
                Ok(())
            })
            .collect()
    }
}
