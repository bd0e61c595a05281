//! Bytes to and from a segment a Mooncake process serves over Mooncake's RDMA transport (a
//! wheel process set up with `protocol="rdma"`): one-sided READ and WRITE through queue pairs
//! set up with Mooncake's Connection handshake, the way Mooncake's own clients reach it.
//!
//! An endpoint is Mooncake's: the QPs between one of this client's NICs and one of the peer's,
//! as many as Mooncake's `MC_NUM_QP_PER_EP` (2 unless that variable says otherwise; both sides
//! must agree, and nothing tells), paired by index, PSNs 0 both ways. Each QP is a lane of the
//! RDMA data path (`super::rdma`: its own completion queue and staging slots, the caller's
//! registered memory posted as it is). The peer keys endpoints by this side's nic path, whose
//! server part is the address of a listener this path holds: unique on the host while the path
//! lives, so no other client process (or path) resets this one's QPs by handshaking under the
//! same name. A lane that fails ends its endpoint: the next operation handshakes again (the
//! peer then replaces its QPs), with the descriptor looked up afresh, for a peer that came back
//! with new keys.
//!
//! There is no other way to such a segment (its descriptor names one transport): when RDMA
//! fails, the operations fail, and the caller's put or get tries another replica or reports.

use super::rdma::{Broken, Lane, Local, Remote, Staging, SLOTS};
use super::{ReadOp, WriteOp};
use crate::mooncake::handshake::{frame, read_frame};
use crate::mooncake::rdma::{
    Connection, Descriptor, NicPath, CONNECTION, DEFAULT_QPS_PER_ENDPOINT, MAX_QPS_PER_ENDPOINT,
    MTU_CEILING, PSN,
};
use crate::transfer::rdma::verbs::{Cq, Qp, QpEndpoint};
use crate::transfer::{Status, TransferError};
use parking_lot::{Condvar, Mutex};
use std::io::Write;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Mooncake's variable for the QPs of one endpoint.
pub const QPS_ENV: &str = "MC_NUM_QP_PER_EP";

/// How the path finds its peer: the segment's descriptor, and where the handshake listener of
/// a Mooncake server name is (the owner's discovery: handshake or metadata server).
pub trait Finder {
    fn descriptor(&self) -> Result<serde_json::Value, TransferError>;
    fn handshake_addr(&self, server: &str) -> Result<String, TransferError>;
}

/// QPs per endpoint: Mooncake's `MC_NUM_QP_PER_EP` when set (1 to 255), else its default.
pub fn qps_per_endpoint() -> Result<usize, String> {
    match std::env::var(QPS_ENV) {
        Err(_) => Ok(DEFAULT_QPS_PER_ENDPOINT),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_QPS_PER_ENDPOINT).contains(n))
            .ok_or_else(|| {
                format!("{QPS_ENV}={v}: a number of QPs from 1 to {MAX_QPS_PER_ENDPOINT}")
            }),
    }
}

struct Lanes {
    /// Bumped when an endpoint ends: lanes of an older one are dropped, not reused.
    generation: u64,
    idle: Vec<Lane>,
    /// Lanes of the current endpoint (idle or in use); 0: none, the next take handshakes.
    live: usize,
}

/// The data path to a Mooncake process's segment over Mooncake's RDMA transport.
pub struct MooncakeRdma {
    /// The segment's name for Mooncake, its first address in the peer and its length.
    name: String,
    base: u64,
    len: u64,
    local: Arc<Local>,
    qps: usize,
    /// Held for its address, the server part of this path's nic paths.
    me: TcpListener,
    connect_timeout: Duration,
    io_timeout: Duration,
    lanes: Mutex<Lanes>,
    freed: Condvar,
    next_nic: AtomicUsize,
}

fn refused(message: String) -> TransferError {
    TransferError::Remote {
        status: Status::InvalidParams,
        message,
    }
}

impl MooncakeRdma {
    /// The path to segment `name`, `len` bytes at `base` in its process.
    pub fn new(
        (name, base, len): (String, u64, u64),
        local: Arc<Local>,
        (connect_timeout, io_timeout): (Duration, Duration),
    ) -> Result<MooncakeRdma, TransferError> {
        let qps = qps_per_endpoint().map_err(TransferError::Protocol)?;
        Ok(MooncakeRdma {
            name,
            base,
            len,
            local,
            qps,
            me: TcpListener::bind(("0.0.0.0", 0))?,
            connect_timeout,
            io_timeout,
            lanes: Mutex::new(Lanes {
                generation: 0,
                idle: Vec::new(),
                live: 0,
            }),
            freed: Condvar::new(),
            next_nic: AtomicUsize::new(0),
        })
    }

    /// Writes `ops` by RDMA to Mooncake stores, `find` telling each one's segment: a result per
    /// op.
    pub fn write(&self, ops: &[WriteOp<'_>], find: &dyn Finder) -> Vec<Result<u32, TransferError>> {
        self.on_lane(find, |lane, deadline| lane.write(ops, deadline))
            .unwrap_or_else(|e| ops.iter().map(|_| Err(e.clone())).collect())
    }

    /// Reads `ops` by RDMA from Mooncake stores: a result per op.
    pub fn read(
        &self,
        ops: &mut [ReadOp<'_>],
        find: &dyn Finder,
    ) -> Vec<Result<(), TransferError>> {
        match self.on_lane(find, |lane, deadline| lane.read(ops, deadline)) {
            Ok(out) => out,
            Err(e) => ops
                .iter_mut()
                .map(|op| {
                    op.crc = None;
                    Err(e.clone())
                })
                .collect(),
        }
    }

    /// Runs `f` on a lane of the current endpoint (handshaking one first if there is none);
    /// a lane that fails ends its endpoint.
    fn on_lane<T>(
        &self,
        find: &dyn Finder,
        f: impl FnOnce(&mut Lane, Instant) -> Result<T, Broken>,
    ) -> Result<T, TransferError> {
        let deadline = Instant::now() + self.io_timeout;
        let (mut lane, generation) = self.take(find, deadline)?;
        match f(&mut lane, deadline) {
            Ok(v) => {
                let mut lanes = self.lanes.lock();
                if lanes.generation == generation {
                    lanes.idle.push(lane);
                }
                drop(lanes);
                self.freed.notify_one();
                Ok(v)
            }
            Err(Broken(e)) => {
                lane.qp.fail();
                drop(lane);
                let mut lanes = self.lanes.lock();
                if lanes.generation == generation {
                    lanes.generation += 1;
                    lanes.live = 0;
                    lanes.idle.clear();
                    tracing::warn!(segment = %self.name, error = %e,
                        "Mooncake RDMA endpoint failed; the next operation handshakes again");
                }
                drop(lanes);
                self.freed.notify_all();
                Err(e)
            }
        }
    }

    /// An idle lane of the current endpoint, the next one freed, or a new endpoint's.
    fn take(&self, find: &dyn Finder, deadline: Instant) -> Result<(Lane, u64), TransferError> {
        let mut lanes = self.lanes.lock();
        loop {
            if let Some(lane) = lanes.idle.pop() {
                return Ok((lane, lanes.generation));
            }
            if lanes.live == 0 {
                let generation = lanes.generation;
                // Handshaking marks the endpoint live, so others wait for its lanes.
                lanes.live = self.qps;
                drop(lanes);
                let made = self.handshake(find);
                let mut lanes = self.lanes.lock();
                return match made {
                    Ok(mut made) if lanes.generation == generation => {
                        let lane = made.pop().expect("at least one QP");
                        lanes.idle.extend(made);
                        drop(lanes);
                        self.freed.notify_all();
                        Ok((lane, generation))
                    }
                    Ok(_) => Err(TransferError::Closed),
                    Err(e) => {
                        lanes.live = 0;
                        drop(lanes);
                        self.freed.notify_all();
                        Err(e)
                    }
                };
            }
            if self.freed.wait_until(&mut lanes, deadline).timed_out() {
                return Err(TransferError::Timeout);
            }
        }
    }

    /// Sets up an endpoint: the peer's descriptor, QPs on one of this client's NICs, the
    /// Connection exchange with the peer's handshake listener (closed at once: Mooncake's
    /// serves one connection at a time), the QPs moved to RTS.
    fn handshake(&self, find: &dyn Finder) -> Result<Vec<Lane>, TransferError> {
        let protocol = |e: String| TransferError::Protocol(e);
        let desc = Descriptor::parse(&self.name, &find.descriptor()?)
            .map_err(|e| protocol(e.to_string()))?;
        let buffer = desc.buffer_for(self.base, self.len).ok_or_else(|| {
            refused(format!(
                "{}'s descriptor has no buffer holding the segment the master describes \
                 ([{:#x}, +{})): the process behind that name changed",
                self.name, self.base, self.len
            ))
        })?;
        let k = self.next_nic.fetch_add(1, Ordering::Relaxed) % self.local.nics.len();
        let nic = &self.local.nics[k];
        // The peer's device of the same name if it has one, else one in turn.
        let dev = desc
            .devices
            .iter()
            .position(|d| d.name == nic.name())
            .unwrap_or(k % desc.devices.len());
        let remote = Remote {
            addr: self.base,
            len: self.len,
            rkey: buffer.rkeys[dev],
        };
        let peer = NicPath::new(desc.nic_server(), &desc.devices[dev].name);
        let addr = find.handshake_addr(&peer.server)?;
        let mut qps = Vec::with_capacity(self.qps);
        for _ in 0..self.qps {
            let cq = Cq::new(nic.pd.context(), (2 * SLOTS) as u32).map_err(verbs)?;
            qps.push(
                Qp::new(&nic.pd, &cq, nic.path, (2 * SLOTS) as u32)
                    .map_err(verbs)?
                    .with_psn(PSN),
            );
        }
        let sock = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| protocol(format!("{addr} resolves to no address")))?;
        let mut stream = TcpStream::connect_timeout(&sock, self.connect_timeout).map_err(|e| {
            TransferError::Connect {
                addr: addr.clone(),
                source: e,
            }
        })?;
        stream.set_read_timeout(Some(self.io_timeout))?;
        stream.set_write_timeout(Some(self.io_timeout))?;
        let me = NicPath::new(&self.server(&stream)?, nic.name());
        let req = Connection {
            local_nic_path: me.to_string(),
            peer_nic_path: peer.to_string(),
            local_gid: Some(nic.path.gid),
            local_lid: nic.path.lid,
            qp_num: qps.iter().map(|q| q.endpoint().qpn).collect(),
            reply_msg: String::new(),
            // Absent: the peer marks the endpoint connected at once (no ready-ACK).
            ready_ack: None,
        };
        stream.write_all(&frame(CONNECTION, &req.to_json()))?;
        let answer = read_frame(&mut stream);
        drop(stream);
        let (kind, json) = answer.map_err(|e| protocol(format!("Mooncake handshake: {e}")))?;
        let reply = Connection::parse(&json).map_err(|e| protocol(e.to_string()))?;
        if kind != CONNECTION {
            return Err(protocol(format!("Mooncake handshake answered type {kind}")));
        }
        if !reply.reply_msg.is_empty() {
            return Err(refused(format!(
                "{} refused the RDMA handshake: {}",
                peer, reply.reply_msg
            )));
        }
        if reply.local_nic_path != req.peer_nic_path || reply.peer_nic_path != req.local_nic_path {
            return Err(protocol(format!(
                "Mooncake handshake answered for {} -> {}, not {} -> {}",
                reply.peer_nic_path, reply.local_nic_path, req.local_nic_path, req.peer_nic_path
            )));
        }
        if reply.qp_num.len() != qps.len() {
            return Err(protocol(format!(
                "{peer} answered {} QPs to {}: set {QPS_ENV} as the peer has it",
                reply.qp_num.len(),
                qps.len()
            )));
        }
        let gid = reply.local_gid.unwrap_or(desc.devices[dev].gid);
        let mut lanes = Vec::with_capacity(qps.len());
        for (qp, &qpn) in qps.into_iter().zip(&reply.qp_num) {
            qp.connect(
                &QpEndpoint {
                    qpn,
                    psn: PSN,
                    lid: reply.local_lid,
                    gid,
                    mtu: MTU_CEILING,
                },
                0,
            )
            .map_err(verbs)?;
            let staging = Staging::new(nic).map_err(verbs)?;
            lanes.push(Lane::on_pair(qp, staging, &self.local, k, remote));
        }
        tracing::debug!(segment = %self.name, local = %me, %peer, qps = lanes.len(),
            "Mooncake RDMA endpoint connected");
        Ok(lanes)
    }

    /// This path's server name, `ip:port`: the address `stream` leaves from and the port of
    /// the listener the path holds.
    fn server(&self, stream: &TcpStream) -> Result<String, TransferError> {
        let ip = stream.local_addr()?.ip();
        let port = self.me.local_addr()?.port();
        Ok(std::net::SocketAddr::new(ip, port).to_string())
    }
}

fn verbs(e: crate::transfer::rdma::verbs::VerbsError) -> TransferError {
    TransferError::Io(std::io::Error::other(e.to_string()))
}
