//! The data-path seam: how a client moves an object's bytes to and from one store's segment once
//! the master has said where they go. The put and get executors see only [`DataPath`]; which
//! implementation serves a segment is chosen once, when its route is learnt ([`open`]):
//!
//! - [`Shm`]: the segment is on this host (same kernel, its token file matches), so bytes are
//!   memory copies into the store's mapped segment file; a persistent store is then told what
//!   was written (`Seal`) so its durable index records it.
//! - [`LocalDisk`]: a disk tier segment on this host: reads are `O_DIRECT` reads of its file.
//! - [`Tcp`]: requests pipelined on one pooled connection per store, payloads sent straight from
//!   the caller's buffers and received straight into them.
//!
//! An RDMA transport (the `ibverbs` crate, under a cargo feature) is a third implementation of
//! the same trait; until one exists, `Transport::Rdma` is refused where it is configured.

mod disk;
mod shm;
mod tcp;

pub use disk::LocalDisk;
pub use shm::{LocalSegment, Shm};
pub use tcp::Tcp;

use crate::transfer::message::SegmentInfo;
use crate::transfer::{Pool, TransferError};
use std::sync::Arc;

/// What kind of path serves a segment, in order of preference for reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathKind {
    /// Memory copies on the same host.
    Shm,
    /// Requests over a TCP connection.
    Tcp,
}

/// One replica write: the value goes to `offset`, and a persistent store records `key` at
/// `version` with the value's checksum once every byte is in place.
#[derive(Clone, Copy, Debug)]
pub struct WriteOp<'a> {
    pub offset: u64,
    pub value: &'a [u8],
    pub key: &'a str,
    pub version: u64,
}

/// One replica read: `dst.len()` bytes from `offset` into `dst`.
#[derive(Debug)]
pub struct ReadOp<'a> {
    pub offset: u64,
    pub dst: &'a mut [u8],
    /// Read only if the store still holds this object version there (a location this client
    /// cached); see [`DataPath::checks_versions`].
    pub version: Option<u64>,
    /// Set by the path when the read succeeded: the CRC-32C of `dst`, computed as the bytes
    /// arrived (no second pass over them).
    pub crc: Option<u32>,
}

impl<'a> ReadOp<'a> {
    pub fn new(offset: u64, dst: &'a mut [u8]) -> ReadOp<'a> {
        ReadOp {
            offset,
            dst,
            version: None,
            crc: None,
        }
    }

    /// A read of a cached location: answered only while the store holds `version` there.
    pub fn of_version(offset: u64, dst: &'a mut [u8], version: u64) -> ReadOp<'a> {
        ReadOp {
            version: Some(version),
            ..ReadOp::new(offset, dst)
        }
    }
}

/// Moves bytes to and from one store's segment. Each call takes a batch for that segment and
/// answers one result per operation, in order; an implementation pipelines or vectors the batch
/// as its medium allows. A failure of one operation need not fail the others.
pub trait DataPath: Send + Sync {
    fn kind(&self) -> PathKind;

    /// Each value's CRC-32C as it was written, computed in passing.
    fn write(&self, ops: &[WriteOp<'_>]) -> Vec<Result<u32, TransferError>>;

    fn read(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>>;

    /// Whether the store behind this path checks a read's version (so a cached location can be
    /// read without asking the master). A path that cannot must not be given such reads.
    fn checks_versions(&self) -> bool {
        false
    }
}

/// The path for a segment: shared memory when it is on this host and `same_host_shm` allows,
/// else TCP to the store through `pool` (the store's connection pool, shared by every segment
/// at that endpoint).
pub fn open(
    info: &SegmentInfo,
    host_id: &str,
    same_host_shm: bool,
    pool: Arc<Pool>,
) -> Arc<dyn DataPath> {
    if same_host_shm && info.tier == crate::transfer::message::Tier::Disk {
        if let Some(disk) = LocalDisk::open(info, host_id) {
            return Arc::new(disk);
        }
    } else if same_host_shm {
        if let Some(segment) = LocalSegment::open(info, host_id) {
            // A store with a segment_uuid keeps records of its objects (durable or in memory),
            // which copies bypass: they are sealed.
            let seal = (info.segment_uuid != 0).then_some(pool);
            return Arc::new(Shm::new(segment, seal));
        }
    }
    Arc::new(Tcp::new(pool))
}
