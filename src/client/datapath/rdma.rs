//! Bytes over RDMA (reliable-connected queue pairs through libibverbs): a get is an RDMA READ
//! from the store's segment, a put an RDMA WRITE into the extent the master granted, followed
//! by `SEAL_CHECKED`, in which the store checks each value's CRC-32C over what landed before it
//! records it. The store's CPU takes no part in moving the bytes.
//!
//! A *lane* is one queue pair with its own completion queue, the TCP connection it was set up
//! on (after the cluster-secret handshake: the store's segment key is a capability, given only
//! to a proven peer; the store destroys its pair when that connection closes), and a registered
//! staging buffer of [`SLOTS`] × [`SLOT`] bytes. Values are cut into slot-sized chunks that are
//! posted many per doorbell and stream through the slots: a READ lands in a slot and is copied
//! out into the caller's buffer with its checksum computed in the same pass (the checked copy),
//! a WRITE is copied in (and checksummed) before it is posted. The caller's memory is never
//! registered, so nothing the caller frees can still be a target of the NIC.
//!
//! A read of a remembered location (a `version` is named) is checked by the store's version
//! stamp for its extent, READ right after the bytes in the same doorbell, while the store's
//! read lease runs as the store last reported it; otherwise (no lease known, another version
//! in the stamp) by `CHECK_VERSION` on the lane's connection, which the store answers only if
//! it still holds that version there under the master's read lease, saying how long that lease
//! runs. `docs/kv-pool.md` ("Versions") has the argument.
//!
//! What fails on a lane — a completion error (the store died, its pair was torn down), no
//! completion in time, a broken connection — tears the lane down (its pair moved to the error
//! state, then destroyed) and the batch's unanswered operations go over TCP instead, once; a
//! store that does not serve RDMA is reached over TCP from then on.

use super::{DataPath, PathKind, ReadOp, Tcp, WriteOp};
use crate::transfer::checked_copy::{copy_crc, Dest};
use crate::transfer::message::{
    BatchStatusResp, RdmaConnectReq, RdmaConnectResp, ReadVersionReq, SealReq, StoredObject,
};
use crate::transfer::rdma::nic::Nic;
use crate::transfer::rdma::verbs::{
    self, Cq, IbvSge, IbvWc, Mr, Qp, QpEndpoint, VerbsError, ACCESS_LOCAL_WRITE, WC_SUCCESS,
    WR_RDMA_READ, WR_RDMA_WRITE,
};
use crate::transfer::rpc::{self, Rpc};
use crate::transfer::stamps::{self, STAMP_BYTES};
use crate::transfer::{ConnOptions, Connection, Pool, Status, TransferError};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of one staging slot: the largest piece one work request moves.
pub const SLOT: usize = 256 << 10;
/// Slots per lane: work requests in flight at once (at most [`verbs::RD_ATOMIC`] of them READs
/// the NIC keeps outstanding; the rest wait in its send queue).
pub const SLOTS: usize = 16;
/// Most lanes (queue pairs) one client keeps to one store.
pub const MAX_LANES: usize = 4;

/// Most memory regions a client registers (`Client::register_buffer`).
pub const MAX_REGISTERED: usize = 256;

/// This client's RDMA side: its NICs (queue pairs use them in turn) and the memory its caller
/// registered, which reads land in and writes leave from with no staging copy.
pub struct Local {
    pub nics: Vec<Arc<Nic>>,
    registered: parking_lot::RwLock<Vec<Arc<Registered>>>,
    counts: Counts,
}

/// How this client's reads of remembered locations were checked.
#[derive(Debug, Default)]
struct Counts {
    /// By the version stamp read beside the bytes: no round trip to the store.
    stamped: AtomicU64,
    /// By asking the store (`CHECK_VERSION`).
    asked: AtomicU64,
}

/// What [`Local::counts`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VersionChecks {
    /// Reads of remembered locations that the version stamp read with the bytes answered.
    pub stamped: u64,
    /// Reads of remembered locations for which the store was asked (`CHECK_VERSION`).
    pub asked: u64,
}

/// Caller memory registered on every NIC of the client.
struct Registered {
    start: usize,
    len: usize,
    /// One region per NIC, in the order of `Local::nics`.
    mrs: Vec<Mr>,
}

impl Local {
    /// The local side over `nics`, no memory registered yet.
    pub fn new(nics: Vec<Arc<Nic>>) -> Local {
        Local {
            nics,
            registered: Default::default(),
            counts: Counts::default(),
        }
    }

    /// How this client's reads of remembered locations were checked so far.
    pub fn version_checks(&self) -> VersionChecks {
        VersionChecks {
            stamped: self.counts.stamped.load(Ordering::Relaxed),
            asked: self.counts.asked.load(Ordering::Relaxed),
        }
    }

    /// Registers `len` bytes at `ptr` on every NIC.
    ///
    /// # Safety
    /// The memory must stay mapped until [`Local::unregister`] returns for it.
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<(), VerbsError> {
        let start = ptr as usize;
        let end = start.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
            VerbsError::Device(format!("cannot register {len} bytes at {start:#x}"))
        })?;
        let mut regions = self.registered.write();
        if regions
            .iter()
            .any(|r| start < r.start + r.len && r.start < end)
        {
            return Err(VerbsError::Device(format!(
                "{len} bytes at {start:#x} overlap memory registered already"
            )));
        }
        if regions.len() >= MAX_REGISTERED {
            return Err(VerbsError::Device(format!(
                "{MAX_REGISTERED} buffers are registered already: unregister one first"
            )));
        }
        let access = ACCESS_LOCAL_WRITE;
        let mrs = self
            .nics
            .iter()
            .map(|nic| Mr::register(&nic.pd, ptr, len, access))
            .collect::<Result<Vec<_>, _>>()?;
        regions.push(Arc::new(Registered { start, len, mrs }));
        Ok(())
    }

    /// Forgets the registration that starts at `ptr`; false if there is none.
    pub fn unregister(&self, ptr: *mut u8) -> bool {
        let mut regions = self.registered.write();
        let before = regions.len();
        regions.retain(|r| r.start != ptr as usize);
        regions.len() != before
    }

    /// The registration holding `[addr, addr + len)`, if any.
    fn find(&self, addr: usize, len: usize) -> Option<Arc<Registered>> {
        if len == 0 {
            return None;
        }
        self.registered
            .read()
            .iter()
            .find(|r| addr >= r.start && addr + len <= r.start + r.len)
            .cloned()
    }
}

/// A lane broke: why, to log and to answer the operations it left unanswered.
pub(super) struct Broken(pub(super) TransferError);

impl From<VerbsError> for Broken {
    fn from(e: VerbsError) -> Broken {
        Broken(TransferError::Io(std::io::Error::other(e.to_string())))
    }
}

impl From<TransferError> for Broken {
    fn from(e: TransferError) -> Broken {
        Broken(e)
    }
}

/// Registered, page-aligned memory the NIC reads from and writes into.
pub(super) struct Staging {
    /// Dropped (deregistered) before the mapping it covers.
    mr: Mr,
    map: memmap2::MmapMut,
}

impl Staging {
    pub(super) fn new(nic: &Nic) -> Result<Staging, VerbsError> {
        let mut map = memmap2::MmapMut::map_anon(SLOT * SLOTS).map_err(|e| VerbsError::Call {
            call: "mmap (RDMA staging)",
            source: e,
        })?;
        // SAFETY: the mapping lives in this struct, after the region (dropped later).
        let mr = unsafe { Mr::register(&nic.pd, map.as_mut_ptr(), map.len(), ACCESS_LOCAL_WRITE)? };
        Ok(Staging { mr, map })
    }

    fn slot(&self, k: usize) -> (u64, u32) {
        (self.mr.addr() + ((k % SLOTS) * SLOT) as u64, self.mr.lkey())
    }

    fn slot_bytes(&mut self, k: usize, len: usize) -> &mut [u8] {
        let at = (k % SLOTS) * SLOT;
        &mut self.map[at..at + len]
    }
}

/// The store's segment as its NIC sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Remote {
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) rkey: u32,
}

/// The store's table of version stamps as its NIC sees it.
#[derive(Clone, Copy, Debug)]
struct RemoteStamps {
    addr: u64,
    rkey: u32,
    slots: u64,
}

impl RemoteStamps {
    fn of(resp: &RdmaConnectResp) -> Option<RemoteStamps> {
        resp.stamp_slots.is_power_of_two().then_some(RemoteStamps {
            addr: resp.stamp_addr,
            rkey: resp.stamp_rkey,
            slots: resp.stamp_slots,
        })
    }

    fn at(&self, offset: u64) -> u64 {
        self.addr + stamps::slot(offset, self.slots) * STAMP_BYTES
    }
}

/// One queue pair to the store and what it needs. Fields drop in order: the pair first, then
/// its staging memory, then the connection (whose closing makes the store drop its pair).
pub(super) struct Lane {
    pub(super) qp: Qp,
    staging: Staging,
    /// Which of the client's NICs it uses (the index of its regions in a registration).
    nic: usize,
    /// The client's NICs and registered memory.
    local: Arc<Local>,
    /// The rbgctl connection the pair was set up on, which seals writes and checks versions;
    /// `None` for a pair to a Mooncake Transfer Engine (which does neither).
    conn: Option<Connection>,
    remote: Remote,
    stamps: Option<RemoteStamps>,
    /// Until when the store's read lease surely runs, as the last `CHECK_VERSION` answer told
    /// (counted from when it was asked): version stamps are trusted only before then.
    lease_until: Option<Instant>,
    /// Retired once idle this long (half the store's idle timeout: the store closes an idle
    /// connection, and its queue pair with it).
    max_idle: Duration,
    last_used: Instant,
}

/// A batch's plan on a lane: per operation, its remote address (or why it has none), whether
/// its local memory is registered (and under which key), and the chunks to post.
#[derive(Default)]
struct Planned {
    remote: Vec<Result<u64, TransferError>>,
    direct: Vec<Option<(Arc<Registered>, u32)>>,
    bases: Vec<u64>,
    lens: Vec<usize>,
    work: Vec<Chunk>,
}

impl Planned {
    fn remote(&self, c: Chunk) -> u64 {
        self.remote[c.op].as_ref().map_or(0, |at| at + c.at as u64)
    }

    /// The chunk's local memory when its operation's is registered.
    fn local(&self, c: Chunk) -> Option<(u64, u32)> {
        let (_, lkey) = self.direct[c.op].as_ref()?;
        Some((self.bases[c.op] + c.at as u64, *lkey))
    }
}

/// How to post one chunk.
struct Post {
    opcode: u32,
    remote: u64,
    rkey: u32,
    /// The caller's registered memory (address, key); `None`: the chunk's staging slot.
    local: Option<(u64, u32)>,
}

/// A piece of one operation that goes through one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    op: usize,
    at: usize,
    len: usize,
}

/// Cuts operations of these sizes into slot-sized chunks, in order.
fn chunks(sizes: impl Iterator<Item = usize>) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (op, size) in sizes.enumerate() {
        let mut at = 0;
        while at < size {
            let len = SLOT.min(size - at);
            out.push(Chunk { op, at, len });
            at += len;
        }
    }
    out
}

impl Lane {
    fn connect(
        addr: &str,
        opts: &ConnOptions,
        local: &Arc<Local>,
        nic_index: usize,
    ) -> Result<Lane, Broken> {
        let nic = &local.nics[nic_index % local.nics.len()];
        let mut conn = Connection::connect(addr, opts)?;
        let ctx = nic.pd.context();
        let cq = Cq::new(ctx, (2 * SLOTS) as u32)?;
        let qp = Qp::new(&nic.pd, &cq, nic.path, (2 * SLOTS) as u32)?;
        let staging = Staging::new(nic)?;
        let me = qp.endpoint();
        let (gid_hi, gid_lo) = gid_halves(&me.gid);
        let resp: RdmaConnectResp = conn.call::<rpc::RdmaConnect>(&RdmaConnectReq {
            qpn: me.qpn,
            psn: me.psn,
            lid: u32::from(me.lid),
            gid_hi,
            gid_lo,
            mtu: me.mtu,
            nic: nic_index as u32,
        })?;
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&resp.gid_hi.to_be_bytes());
        gid[8..].copy_from_slice(&resp.gid_lo.to_be_bytes());
        qp.connect(
            &QpEndpoint {
                qpn: resp.qpn,
                psn: resp.psn,
                lid: resp.lid as u16,
                gid,
                mtu: resp.mtu,
            },
            0,
        )?;
        tracing::debug!(
            store = addr,
            device = nic.name(),
            qpn = me.qpn,
            peer_qpn = resp.qpn,
            "RDMA lane connected"
        );
        Ok(Lane {
            qp,
            staging,
            nic: nic_index % local.nics.len(),
            local: local.clone(),
            conn: Some(conn),
            remote: Remote {
                addr: resp.addr,
                len: resp.length,
                rkey: resp.rkey,
            },
            stamps: RemoteStamps::of(&resp),
            lease_until: None,
            max_idle: Duration::from_millis(resp.idle_ms / 2),
            last_used: Instant::now(),
        })
    }

    /// A lane on a pair set up some other way (Mooncake's handshake), to `remote`: no version
    /// stamps, no seal, kept while idle.
    pub(super) fn on_pair(
        qp: Qp,
        staging: Staging,
        local: &Arc<Local>,
        nic: usize,
        remote: Remote,
    ) -> Lane {
        Lane {
            qp,
            staging,
            nic,
            local: local.clone(),
            conn: None,
            remote,
            stamps: None,
            lease_until: None,
            max_idle: Duration::MAX,
            last_used: Instant::now(),
        }
    }

    fn remote_at(&self, offset: u64, len: usize) -> Result<u64, TransferError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.remote.len => Ok(self.remote.addr + offset),
            _ => Err(TransferError::Remote {
                status: Status::OutOfBounds,
                message: format!(
                    "range {offset}+{len} is outside the store's segment of {} bytes",
                    self.remote.len
                ),
            }),
        }
    }

    /// Streams `chunks` through the slots: `prepare(k)` says how to post chunk `k` (opcode,
    /// remote address, and its local memory when the caller registered it, else its slot, which
    /// it may fill first), `landed(k)` takes it once its completion is in. Completions on one
    /// queue pair arrive in the order posted, so at most [`SLOTS`] chunks are in flight and
    /// chunk `k`'s slot is `k % SLOTS`.
    fn stream(
        &mut self,
        chunks: &[Chunk],
        deadline: Instant,
        mut prepare: impl FnMut(&mut Staging, usize) -> Result<Post, TransferError>,
        mut landed: impl FnMut(&mut Staging, usize),
    ) -> Result<(), Broken> {
        let mut posted = 0;
        let mut done = 0;
        let mut wrs = Vec::with_capacity(SLOTS);
        let mut sges = Vec::with_capacity(SLOTS);
        let mut wcs = [IbvWc::default(); SLOTS];
        let mut spins = 0u32;
        while done < chunks.len() {
            wrs.clear();
            sges.clear();
            while posted < chunks.len() && posted - done < SLOTS {
                let Post {
                    opcode,
                    remote,
                    rkey,
                    local,
                } = prepare(&mut self.staging, posted)?;
                let (addr, lkey) = local.unwrap_or_else(|| self.staging.slot(posted));
                sges.push(IbvSge {
                    addr,
                    length: chunks[posted].len as u32,
                    lkey,
                });
                wrs.push(verbs::rdma_wr(opcode, posted as u64, remote, rkey, true));
                posted += 1;
            }
            // SAFETY: each request names its own slot of the registered staging buffer and a
            // bounds-checked range of the store's segment; the slot is not touched again until
            // its completion is polled below (or the lane is dropped, pair first).
            unsafe { self.qp.post(&mut wrs, &mut sges)? };
            loop {
                let n = self.qp.cq().poll(&mut wcs)?;
                for wc in &wcs[..n] {
                    if wc.status != WC_SUCCESS {
                        return Err(Broken(TransferError::Io(std::io::Error::other(format!(
                            "RDMA {} failed: {} (vendor error {:#x})",
                            if wc.opcode == 0 { "WRITE" } else { "READ" },
                            verbs::wc_status_text(wc.status),
                            wc.vendor_err
                        )))));
                    }
                    let k = wc.wr_id as usize;
                    if k != done {
                        return Err(Broken(TransferError::Protocol(format!(
                            "RDMA completion {k} arrived where {done} was due"
                        ))));
                    }
                    landed(&mut self.staging, k);
                    done += 1;
                }
                if n > 0 || done == chunks.len() {
                    spins = 0;
                    break;
                }
                spins += 1;
                if spins % 1024 == 0 {
                    if Instant::now() >= deadline {
                        return Err(Broken(TransferError::Timeout));
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        Ok(())
    }

    /// Where each operation goes and how its chunks are posted. `spans` are the operations'
    /// segment offsets and local memory (address, length).
    fn plan(&self, spans: impl Iterator<Item = (u64, usize, usize)>) -> Planned {
        let mut p = Planned::default();
        for (offset, addr, len) in spans {
            let remote = self.remote_at(offset, len);
            // Memory the caller registered is posted as it is (the registration kept alive
            // until the chunks are done); the rest goes through the staging slots.
            p.direct.push(
                remote
                    .is_ok()
                    .then(|| self.local.find(addr, len))
                    .flatten()
                    .map(|reg| {
                        let lkey = reg.mrs[self.nic].lkey();
                        (reg, lkey)
                    }),
            );
            p.bases.push(addr as u64);
            p.lens.push(len);
            p.remote.push(remote);
        }
        p.work = chunks(p.lens.iter().copied())
            .into_iter()
            .filter(|c| p.remote[c.op].is_ok())
            .collect();
        p
    }

    pub(super) fn read(
        &mut self,
        ops: &mut [ReadOp<'_>],
        deadline: Instant,
    ) -> Result<Vec<Result<(), TransferError>>, Broken> {
        let mut out: Vec<Result<(), TransferError>> = vec![Ok(()); ops.len()];
        // Remembered locations are checked by the version stamp read right after the bytes,
        // while the store's lease (as it last told) runs; otherwise by asking the store beside
        // the READ, which also tells how long its lease runs.
        let stamped = self
            .stamps
            .filter(|_| self.lease_until.is_some_and(|u| Instant::now() < u));
        let mut checks = Vec::new();
        let mut stamp_ops = Vec::new();
        for (j, op) in ops.iter().enumerate() {
            match (op.version, stamped) {
                (None, _) => {}
                (Some(_), Some(_)) => stamp_ops.push(j),
                (Some(version), None) => checks.push(self.ask(j, op, version)?),
            }
        }
        let mut plan = self.plan(
            ops.iter()
                .map(|op| (op.offset, op.dst.as_ptr() as usize, op.dst.len())),
        );
        // The bytes' chunks, then one 8-byte READ of each remembered operation's stamp.
        let mut work = std::mem::take(&mut plan.work);
        let data = work.len();
        work.extend(stamp_ops.iter().map(|&op| Chunk {
            op,
            at: 0,
            len: STAMP_BYTES as usize,
        }));
        let stamp_at: Vec<(u64, u32)> = match stamped {
            Some(table) => stamp_ops
                .iter()
                .map(|&j| (table.at(ops[j].offset), table.rkey))
                .collect(),
            None => Vec::new(),
        };
        let mut crcs = vec![0u32; ops.len()];
        let mut stamps_read = vec![0u64; ops.len()];
        let rkey = self.remote.rkey;
        self.stream(
            &work,
            deadline,
            |_, k| {
                let c = work[k];
                Ok(match k.checked_sub(data).map(|i| stamp_at[i]) {
                    Some((remote, rkey)) => Post {
                        opcode: WR_RDMA_READ,
                        remote,
                        rkey,
                        local: None,
                    },
                    None => Post {
                        opcode: WR_RDMA_READ,
                        remote: plan.remote(c),
                        rkey,
                        local: plan.local(c),
                    },
                })
            },
            |staging, k| {
                let c = work[k];
                if k >= data {
                    let bytes = staging.slot_bytes(k, c.len);
                    stamps_read[c.op] = u64::from_le_bytes(bytes.try_into().unwrap_or_default());
                    return;
                }
                let dst = &mut ops[c.op].dst[c.at..c.at + c.len];
                crcs[c.op] = if plan.direct[c.op].is_some() {
                    // Landed in place: checksummed as it is, a pass of its own.
                    crate::checksum::crc32c_append(crcs[c.op], dst)
                } else {
                    copy_crc(dst, staging.slot_bytes(k, c.len), crcs[c.op], Dest::Cached)
                };
            },
        )?;
        // Every stamp was read before now: one that names the version, read while the lease
        // ran, answers for it; any other is asked about (after the READ, which is as good).
        let in_lease = self.lease_until.is_some_and(|u| Instant::now() < u);
        let mut answered = 0;
        for j in stamp_ops {
            let version = ops[j].version.unwrap_or_default();
            if in_lease && plan.remote[j].is_ok() && stamps_read[j] == version {
                answered += 1;
            } else {
                checks.push(self.ask(j, &ops[j], version)?);
            }
        }
        self.local
            .counts
            .stamped
            .fetch_add(answered, Ordering::Relaxed);
        for (j, r) in plan.remote.iter().enumerate() {
            if let Err(e) = r {
                out[j] = Err(e.clone());
            }
        }
        for (j, id, asked) in checks {
            let Some(conn) = self.conn.as_mut() else {
                break;
            };
            match conn.recv(id) {
                Ok((_, meta)) => {
                    if let Ok(r) =
                        <<rpc::CheckVersion as Rpc>::Reply as crate::transfer::Wire>::from_meta(
                            &meta,
                        )
                    {
                        let until = asked + Duration::from_millis(r.lease_ms_left);
                        self.lease_until = self.lease_until.max(Some(until));
                    }
                }
                Err(e) if e.breaks_connection() => return Err(Broken(e)),
                Err(e) => out[j] = Err(e),
            }
        }
        for (j, op) in ops.iter_mut().enumerate() {
            if out[j].is_ok() {
                op.crc = Some(crcs[j]);
            }
        }
        Ok(out)
    }

    /// Sends `CHECK_VERSION` for operation `j`: answers (j, request id, when it was sent).
    fn ask(
        &mut self,
        j: usize,
        op: &ReadOp<'_>,
        version: u64,
    ) -> Result<(usize, u64, Instant), Broken> {
        let req = ReadVersionReq {
            offset: op.offset,
            length: op.dst.len() as u64,
            version,
        };
        let sent = Instant::now();
        let conn = self.conn.as_mut().ok_or_else(|| {
            Broken(TransferError::Protocol(
                "a version check needs an rbgctl store; this pair has none".into(),
            ))
        })?;
        let id = conn.send(
            rpc::CheckVersion::OPCODE,
            &crate::transfer::Wire::to_meta(&req),
            &[],
        )?;
        self.local.counts.asked.fetch_add(1, Ordering::Relaxed);
        Ok((j, id, sent))
    }

    pub(super) fn write(
        &mut self,
        ops: &[WriteOp<'_>],
        deadline: Instant,
    ) -> Result<Vec<Result<u32, TransferError>>, Broken> {
        let plan = self.plan(
            ops.iter()
                .map(|op| (op.offset, op.value.as_ptr() as usize, op.value.len())),
        );
        let work = &plan.work;
        let mut crcs = vec![0u32; ops.len()];
        let rkey = self.remote.rkey;
        self.stream(
            work,
            deadline,
            |staging, k| {
                let c = work[k];
                let src = &ops[c.op].value[c.at..c.at + c.len];
                let local = plan.local(c);
                crcs[c.op] = match local {
                    Some(_) => crate::checksum::crc32c_append(crcs[c.op], src),
                    None => copy_crc(staging.slot_bytes(k, c.len), src, crcs[c.op], Dest::Cached),
                };
                Ok(Post {
                    opcode: WR_RDMA_WRITE,
                    remote: plan.remote(c),
                    rkey,
                    local,
                })
            },
            |_, _| {},
        )?;
        let mut out: Vec<Result<u32, TransferError>> = plan
            .remote
            .iter()
            .map(|r| r.as_ref().map(|_| 0).map_err(Clone::clone))
            .collect();
        // Every byte is in the store's memory: it checks and records them (a Mooncake
        // Transfer Engine records nothing: the master has the checksums).
        let Some(conn) = self.conn.as_mut() else {
            for (j, r) in out.iter_mut().enumerate() {
                if r.is_ok() {
                    *r = Ok(crcs[j]);
                }
            }
            return Ok(out);
        };
        let sealed: Vec<usize> = (0..ops.len()).filter(|&j| out[j].is_ok()).collect();
        if sealed.is_empty() {
            return Ok(out);
        }
        let req = SealReq {
            objects: sealed
                .iter()
                .map(|&j| StoredObject {
                    key: ops[j].key.to_string(),
                    version: ops[j].version,
                    offset: ops[j].offset,
                    size: ops[j].value.len() as u64,
                    checksum: crcs[j],
                })
                .collect(),
            grants: sealed.iter().map(|&j| ops[j].grant).collect(),
        };
        let resp: BatchStatusResp = conn.call::<rpc::SealChecked>(&req)?;
        if resp.items.len() != sealed.len() {
            return Err(Broken(TransferError::Protocol(format!(
                "store sealed {} objects of {}",
                resp.items.len(),
                sealed.len()
            ))));
        }
        for (j, status) in sealed.into_iter().zip(resp.items) {
            out[j] = if status == Status::Ok {
                Ok(crcs[j])
            } else {
                Err(TransferError::Remote {
                    status,
                    message: format!("seal after RDMA WRITE: {}", status.describe()),
                })
            };
        }
        Ok(out)
    }
}

fn gid_halves(gid: &[u8; 16]) -> (u64, u64) {
    (
        u64::from_be_bytes(gid[..8].try_into().unwrap_or_default()),
        u64::from_be_bytes(gid[8..].try_into().unwrap_or_default()),
    )
}

/// The RDMA data path to a store: one-sided READs and WRITEs over its queue pairs.
pub struct Rdma {
    pool: Arc<Pool>,
    tcp: Tcp,
    local: Arc<Local>,
    idle: Mutex<Vec<Lane>>,
    freed: Condvar,
    /// Lanes that exist (idle or in use).
    lanes: AtomicUsize,
    next_nic: AtomicUsize,
    /// The store does not serve RDMA (it said so when asked): TCP from now on.
    tcp_only: AtomicBool,
}

impl Rdma {
    /// RDMA transfers through `pool`'s connections from `local`'s NICs.
    pub fn new(pool: Arc<Pool>, local: Arc<Local>) -> Rdma {
        Rdma {
            tcp: Tcp::new(pool.clone()),
            pool,
            local,
            idle: Mutex::new(Vec::new()),
            freed: Condvar::new(),
            lanes: AtomicUsize::new(0),
            next_nic: AtomicUsize::new(0),
            tcp_only: AtomicBool::new(false),
        }
    }

    /// Whether operations go over RDMA (false once the store said it does not serve it).
    pub fn uses_rdma(&self) -> bool {
        !self.tcp_only.load(Ordering::Relaxed)
    }

    /// An idle lane, a new one while fewer than [`MAX_LANES`] exist, or the next one freed.
    fn take(&self, deadline: Instant) -> Result<Lane, Broken> {
        let mut idle = self.idle.lock();
        loop {
            while let Some(lane) = idle.pop() {
                if lane.last_used.elapsed() < lane.max_idle {
                    return Ok(lane);
                }
                self.lanes.fetch_sub(1, Ordering::Relaxed);
                tracing::debug!(store = %self.pool.addr(), "retired an idle RDMA lane");
            }
            if self.lanes.load(Ordering::Relaxed) < MAX_LANES {
                self.lanes.fetch_add(1, Ordering::Relaxed);
                drop(idle);
                let i = self.next_nic.fetch_add(1, Ordering::Relaxed);
                return Lane::connect(&self.pool.addr(), self.pool.options(), &self.local, i)
                    .inspect_err(|_| {
                        self.lanes.fetch_sub(1, Ordering::Relaxed);
                    });
            }
            if self.freed.wait_until(&mut idle, deadline).timed_out() {
                return Err(Broken(TransferError::Timeout));
            }
        }
    }

    fn give_back(&self, mut lane: Lane) {
        lane.last_used = Instant::now();
        self.idle.lock().push(lane);
        self.freed.notify_one();
    }

    /// A lane failed: it is dropped (its pair to the error state first, so nothing posted
    /// lingers) and the reason logged; a store that refused RDMA is reached by TCP from now on.
    /// `lane` is `None` when it failed to connect (`take` has counted it out already).
    fn broke(&self, lane: Option<Lane>, why: &TransferError) {
        if let Some(lane) = lane {
            lane.qp.fail();
            drop(lane);
            self.lanes.fetch_sub(1, Ordering::Relaxed);
            self.freed.notify_one();
        }
        let refused = matches!(why, TransferError::Remote { status, .. }
            if matches!(status, Status::UnknownOpcode | Status::InvalidParams));
        if refused && !self.tcp_only.swap(true, Ordering::Relaxed) {
            tracing::warn!(store = %self.pool.addr(), reason = %why,
                "this store does not serve RDMA; reaching it over TCP");
        } else if !refused {
            tracing::warn!(store = %self.pool.addr(), error = %why,
                "RDMA lane failed and was torn down; its operations go over TCP");
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.pool.options().io_timeout
    }

    /// Runs `f` on a lane; on failure, the lane goes and `None` says to use TCP.
    fn on_lane<T>(&self, f: impl FnOnce(&mut Lane, Instant) -> Result<T, Broken>) -> Option<T> {
        if !self.uses_rdma() {
            return None;
        }
        let deadline = self.deadline();
        let mut lane = match self.take(deadline) {
            Ok(lane) => lane,
            Err(Broken(TransferError::Timeout)) => return None,
            Err(Broken(e)) => {
                self.broke(None, &e);
                return None;
            }
        };
        match f(&mut lane, deadline) {
            Ok(v) => {
                self.give_back(lane);
                Some(v)
            }
            Err(Broken(e)) => {
                self.broke(Some(lane), &e);
                None
            }
        }
    }
}

impl DataPath for Rdma {
    fn kind(&self) -> PathKind {
        PathKind::Rdma
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> Vec<Result<u32, TransferError>> {
        self.on_lane(|lane, deadline| lane.write(ops, deadline))
            .unwrap_or_else(|| self.tcp.write(ops))
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>> {
        // `ops` is reborrowed for the lane, and given whole to TCP if the lane fails.
        match self.on_lane(|lane, deadline| lane.read(ops, deadline)) {
            Some(out) => out,
            None => {
                for op in ops.iter_mut() {
                    op.crc = None;
                }
                self.tcp.read(ops)
            }
        }
    }

    fn checks_versions(&self) -> bool {
        self.tcp.checks_versions()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_cut_into_slot_sized_chunks_in_order() {
        let c = chunks([0, 10, SLOT, SLOT + 1, 3 * SLOT].into_iter());
        let want = [
            Chunk {
                op: 1,
                at: 0,
                len: 10,
            },
            Chunk {
                op: 2,
                at: 0,
                len: SLOT,
            },
            Chunk {
                op: 3,
                at: 0,
                len: SLOT,
            },
            Chunk {
                op: 3,
                at: SLOT,
                len: 1,
            },
            Chunk {
                op: 4,
                at: 0,
                len: SLOT,
            },
            Chunk {
                op: 4,
                at: SLOT,
                len: SLOT,
            },
            Chunk {
                op: 4,
                at: 2 * SLOT,
                len: SLOT,
            },
        ];
        assert_eq!(c, want);
        assert!(chunks(std::iter::empty()).is_empty());
    }

    #[test]
    fn gids_split_into_the_halves_the_wire_carries() {
        let gid = crate::transfer::rdma::nic::parse_gid("0000:0000:0000:0000:0000:ffff:0a00:020f")
            .unwrap();
        assert_eq!(gid_halves(&gid), (0, 0x0000_ffff_0a00_020f));
    }
}
