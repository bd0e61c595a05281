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
//! - `Rdma` (cargo feature `rdma`): one-sided READ and WRITE of the store's registered segment
//!   through queue pairs set up on the store's TCP port, TCP when the store does not serve it.
//! - [`MooncakeTe`]: a segment a Mooncake process mounted (no rbgctl store serves it), through
//!   that process's Transfer Engine: its TCP transport, or its RDMA transport (Mooncake's
//!   handshake and QP conventions) when its descriptor says `rdma` and the client has NICs.

mod disk;
#[cfg(feature = "rdma")]
mod mooncake_rdma;
mod mooncake_te;
#[cfg(feature = "rdma")]
mod rdma;
mod shm;
mod tcp;

pub use disk::LocalDisk;
pub use mooncake_te::{Discovery, MooncakeTe};
#[cfg(feature = "rdma")]
pub use rdma::{Rdma, VersionChecks};
pub use shm::{LocalSegment, Shm};
pub use tcp::Tcp;

use crate::transfer::grant::Grant;
use crate::transfer::message::SegmentInfo;
use crate::transfer::{Pool, TransferError};
use std::sync::Arc;

/// What kind of path serves a segment, in order of preference for reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathKind {
    /// Memory copies on the same host.
    Shm,
    /// One-sided RDMA READ and WRITE.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    Rdma,
    /// Requests over a TCP connection.
    Tcp,
}

/// One replica write: the value goes to `offset`, and a persistent store records `key` at
/// `version` with the value's checksum once every byte is in place. `grant`: the master's, for
/// this replica of the put (the store refuses the write without it).
#[derive(Clone, Copy, Debug)]
pub struct WriteOp<'a> {
    pub offset: u64,
    pub value: &'a [u8],
    pub key: &'a str,
    pub version: u64,
    pub grant: Grant,
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
    /// A read of `dst.len()` bytes at `offset`.
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

/// The RDMA NICs a client uses, opened once; `None` when its transport is TCP.
pub type Nics = Option<NicsInner>;

/// What `Nics` holds: the opened NICs, used in turn by a store's queue pairs, and the memory
/// registered with them.
#[cfg(feature = "rdma")]
pub type NicsInner = Arc<rdma::Local>;
/// Without the `rdma` feature there are none.
#[cfg(not(feature = "rdma"))]
pub type NicsInner = std::convert::Infallible;

/// Opens the client's RDMA devices when its transport is RDMA: a missing device, a port that
/// is not ACTIVE or no usable GID is an error now, naming the setting.
pub fn open_nics(cfg: &crate::client::ClientConfig) -> Result<Nics, crate::config::ConfigError> {
    if cfg.transport != crate::transfer::Transport::Rdma {
        return Ok(None);
    }
    #[cfg(feature = "rdma")]
    {
        crate::transfer::rdma::nic::open_all(&cfg.rdma_devices, None)
            .map(|nics| Some(Arc::new(rdma::Local::new(nics))))
            .map_err(|e| crate::config::ConfigError::invalid("MOONCAKE_DEVICE", e.to_string()))
    }
    #[cfg(not(feature = "rdma"))]
    cfg.transport.check_built("client transport").map(|()| None)
}

/// The path for a segment: a Mooncake process's Transfer Engine when no rbgctl store serves
/// it; else shared memory when it is on this host and `same_host_shm` allows, else RDMA when
/// the client has NICs for it (TCP if the store turns out not to serve it), else TCP to the
/// store through `pool` (the store's connection pool, shared by every segment at that
/// endpoint).
pub fn open(
    info: &SegmentInfo,
    host_id: &str,
    same_host_shm: bool,
    pool: Arc<Pool>,
    nics: Option<&NicsInner>,
    discovery: &Discovery,
) -> Arc<dyn DataPath> {
    if !info.has_store() {
        return Arc::new(MooncakeTe::new(
            info,
            discovery.clone(),
            pool.options().clone(),
            nics.cloned(),
        ));
    }
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
    #[cfg(feature = "rdma")]
    if let (Some(nics), crate::transfer::message::Tier::Memory) = (nics, info.tier) {
        return Arc::new(Rdma::new(pool, nics.clone()));
    }
    #[cfg(not(feature = "rdma"))]
    let _ = nics;
    Arc::new(Tcp::new(pool))
}
