//! The store's side of RDMA: its memory segment registered once on each NIC (one memory
//! region per NIC, remote read and write, rotated with every start of the store: a new
//! registration has a new key), and, for each client connection that asks (`RDMA_CONNECT`, only
//! after the cluster-secret handshake), a reliable-connected queue pair joined to the client's.
//! The pair belongs to that connection and is destroyed when it closes; from then on the key it
//! carried opens nothing through it.
//!
//! The store posts no work on these pairs: clients READ and WRITE its segment one-sidedly, and
//! the store learns of a write only from the `SEAL_CHECKED` that follows it. Its table of
//! version stamps (`transfer::stamps`) is registered beside the segment, for remote reads
//! only, so a client reads a version with the bytes.

use super::nic::Nic;
use super::verbs::{
    Cq, Mr, Qp, QpEndpoint, VerbsError, ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE,
};
use crate::transfer::message::{RdmaConnectReq, RdmaConnectResp};
use crate::transfer::stamps::StampTable;
use std::sync::Arc;
use std::time::Duration;

/// The segment as one NIC serves it.
struct Served {
    /// Shared by every pair on this NIC; never polled (a responder to one-sided operations
    /// gets no completions), sized for the receive queue entries no one posts.
    cq: Arc<Cq>,
    mr: Mr,
    /// The version stamps, remote read only.
    stamps_mr: Mr,
    nic: Arc<Nic>,
    /// Queue pairs made on this NIC.
    connects: std::sync::atomic::AtomicU64,
}

/// A device serving the segment, with the segment's keys on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceKeys {
    pub name: String,
    pub lid: u16,
    pub gid: [u8; 16],
    pub rkey: u32,
    pub lkey: u32,
}

/// A store's segment registered on its NICs, and the queue pairs connected to it.
pub struct RdmaSegment {
    nics: Vec<Served>,
    /// How long the store keeps an idle connection: clients retire their pairs before it.
    idle: Duration,
    /// Whatever keeps the registered memory mapped: dropped after the regions.
    _memory: Arc<dyn Send + Sync>,
    stamps: Arc<StampTable>,
}

impl RdmaSegment {
    /// Registers `len` bytes at `base`, and the table of version stamps, on each NIC.
    ///
    /// # Safety
    /// `memory` must keep `base..base + len` mapped for as long as it lives.
    pub unsafe fn register(
        nics: Vec<Arc<Nic>>,
        base: *mut u8,
        len: usize,
        memory: Arc<dyn Send + Sync>,
        stamps: Arc<StampTable>,
        idle: Duration,
    ) -> Result<RdmaSegment, VerbsError> {
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE;
        let mut served = Vec::with_capacity(nics.len());
        for nic in nics {
            let t0 = std::time::Instant::now();
            let mr = Mr::register(&nic.pd, base, len, access).map_err(|e| {
                VerbsError::Device(format!(
                    "cannot register the {len}-byte segment with {}: {e} (is the memlock limit \
                     high enough? `ulimit -l unlimited`, or LimitMEMLOCK=infinity under systemd)",
                    nic.name()
                ))
            })?;
            tracing::info!(
                device = nic.name(),
                bytes = len,
                seconds = t0.elapsed().as_secs_f64(),
                "segment registered for RDMA"
            );
            let (at, bytes) = stamps.memory();
            // SAFETY: the table's mapping lives in `stamps`, kept here after the regions.
            let stamps_mr = Mr::register(&nic.pd, at, bytes, ACCESS_REMOTE_READ)?;
            let cq = Cq::new(nic.pd.context(), 16)?;
            served.push(Served {
                cq,
                mr,
                stamps_mr,
                nic,
                connects: Default::default(),
            });
        }
        Ok(RdmaSegment {
            nics: served,
            idle,
            _memory: memory,
            stamps,
        })
    }

    /// Makes a queue pair for a client's, connected to it, and the answer that tells the
    /// client how to reach the segment through it. The pair must live exactly as long as the
    /// connection that asked.
    pub fn accept(&self, req: &RdmaConnectReq) -> Result<(Qp, RdmaConnectResp), VerbsError> {
        let served = &self.nics[req.nic as usize % self.nics.len()];
        let qp = Qp::new(&served.nic.pd, &served.cq, served.nic.path, 1)?;
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&req.gid_hi.to_be_bytes());
        gid[8..].copy_from_slice(&req.gid_lo.to_be_bytes());
        let client = QpEndpoint {
            qpn: req.qpn,
            psn: req.psn & 0xff_ffff,
            lid: req.lid as u16,
            gid,
            mtu: req.mtu,
        };
        qp.connect(&client, ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE)?;
        served
            .connects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let me = qp.endpoint();
        let resp = RdmaConnectResp {
            qpn: me.qpn,
            psn: me.psn,
            lid: u32::from(me.lid),
            gid_hi: u64::from_be_bytes(me.gid[..8].try_into().unwrap_or_default()),
            gid_lo: u64::from_be_bytes(me.gid[8..].try_into().unwrap_or_default()),
            mtu: me.mtu,
            nics: self.nics.len() as u32,
            addr: served.mr.addr(),
            length: served.mr.len(),
            rkey: served.mr.rkey(),
            idle_ms: self.idle.as_millis() as u64,
            stamp_addr: served.stamps_mr.addr(),
            stamp_rkey: served.stamps_mr.rkey(),
            stamp_slots: self.stamps.slots(),
        };
        Ok((qp, resp))
    }

    /// The segment's registered region: its address (the iova peers name) and length.
    pub fn region(&self) -> (u64, u64) {
        self.nics
            .first()
            .map_or((0, 0), |s| (s.mr.addr(), s.mr.len()))
    }

    /// Each device serving the segment, in order, with the segment's keys on it.
    pub fn device_keys(&self) -> Vec<DeviceKeys> {
        self.nics
            .iter()
            .map(|s| DeviceKeys {
                name: s.nic.name().to_string(),
                lid: s.nic.path.lid,
                gid: s.nic.path.gid,
                rkey: s.mr.rkey(),
                lkey: s.mr.lkey(),
            })
            .collect()
    }

    /// Queue pairs on device `device`, each joined to the peer's of the same index, for peers
    /// that exchange no sequence numbers: this side starts at `psn` (Mooncake's convention is
    /// 0 both ways; `peers` carry theirs). The peers may READ and WRITE the segment through
    /// them until they are dropped.
    pub fn peer_qps(
        &self,
        device: usize,
        peers: &[QpEndpoint],
        psn: u32,
    ) -> Result<Vec<Qp>, VerbsError> {
        let served = self
            .nics
            .get(device)
            .ok_or_else(|| VerbsError::Device(format!("no device {device} serves the segment")))?;
        let mut qps = Vec::with_capacity(peers.len());
        for peer in peers {
            let qp = Qp::new(&served.nic.pd, &served.cq, served.nic.path, 1)?.with_psn(psn);
            qp.connect(peer, ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE)?;
            qps.push(qp);
        }
        served
            .connects
            .fetch_add(peers.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(qps)
    }

    /// Each device serving the segment, by name, with the queue pairs made on it.
    pub fn devices(&self) -> Vec<(String, u64)> {
        self.nics
            .iter()
            .map(|s| {
                let n = s.connects.load(std::sync::atomic::Ordering::Relaxed);
                (s.nic.name().to_string(), n)
            })
            .collect()
    }
}
