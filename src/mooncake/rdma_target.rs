//! A store as the target of Mooncake's RDMA transport: its registered segment published in
//! Mooncake's `rdma` descriptor, and the Connection handshakes that make the QPs a Mooncake
//! client READs and WRITEs it through, one-sided, with Mooncake's conventions (as many QPs as
//! the peer lists, paired by index, PSNs 0 both ways, nothing torn down on the wire).
//!
//! The QPs live on the same devices, protection domains and memory registration as rbgctl's own
//! RDMA clients' (`transfer::rdma::serve`); which sets are kept, and for how long, is
//! [`super::endpoints`]. A peer's handshake listener is asked whether it is still there when
//! its set has gone unconfirmed for the store's idle timeout: its QPs go when it does not
//! answer.

use super::endpoints::{Admission, EndpointLimits, EndpointTable, Key};
use super::handshake::{self, Connections};
use super::rdma::{self, Connection, Descriptor, MTU_CEILING, PSN};
use crate::telemetry::{Family, PromText};
use crate::transfer::rdma::serve::{DeviceKeys, RdmaSegment};
use crate::transfer::rdma::verbs::{Qp, QpEndpoint};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// The `/metrics` families this file writes, each declared once.
const MOONCAKE_RDMA_HANDSHAKES_REFUSED_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_rdma_handshakes_refused_total",
    "Connection handshakes refused (a nic path or device not this store's, too many \
             QPs, a malformed request).",
);
const MOONCAKE_RDMA_HANDSHAKES_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_rdma_handshakes_total",
    "Connection handshakes of Mooncake's RDMA clients answered with QPs.",
);
const MOONCAKE_RDMA_QPS: Family = Family::gauge(
    "rbgctl_store_mooncake_rdma_qps",
    "QPs held for Mooncake's RDMA clients, by device.",
);
const MOONCAKE_RDMA_QPS_MADE_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_rdma_qps_made_total",
    "QPs made for Mooncake's RDMA clients.",
);
const MOONCAKE_RDMA_SETS_DROPPED_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_rdma_sets_dropped_total",
    "QP sets of Mooncake peers destroyed: replaced by a new handshake or to make room \
             (replaced), or their peer no longer answering (gone).",
);

/// The memory location the descriptor names the segment's buffer by (Mooncake's topology key;
/// every device serves it).
const LOCATION: &str = "cpu:0";
/// How long a peer's listener has to answer a check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Handshakes answered and refused, QPs made, sets dropped (replaced or gone).
#[derive(Debug, Default)]
pub struct TargetStats {
    pub handshakes: AtomicU64,
    pub refused: AtomicU64,
    pub made: AtomicU64,
    pub replaced: AtomicU64,
    pub gone: AtomicU64,
}

/// A store's segment served to Mooncake's RDMA clients: registered, published, its queue
/// pairs kept per peer.
pub struct RdmaTarget {
    segment: Arc<RdmaSegment>,
    /// The descriptor's name: the server part of this store's nic paths.
    server: String,
    devices: Vec<DeviceKeys>,
    table: parking_lot::Mutex<EndpointTable<Vec<Qp>>>,
    stats: TargetStats,
    /// Ends the checks.
    stop: crate::shutdown::Shutdown,
}

impl RdmaTarget {
    /// Serves `segment` to Mooncake peers as `server` (`host:handshake port`); sets unconfirmed
    /// for `idle` have their peers checked.
    pub fn new(segment: Arc<RdmaSegment>, server: String, idle: Duration) -> Arc<RdmaTarget> {
        let devices = segment.device_keys();
        Arc::new(RdmaTarget {
            segment,
            server,
            devices,
            table: parking_lot::Mutex::new(EndpointTable::new(EndpointLimits {
                idle,
                ..EndpointLimits::default()
            })),
            stats: TargetStats::default(),
            stop: crate::shutdown::Shutdown::new(),
        })
    }

    /// The segment as Mooncake's `rdma` descriptor names it: every device, the one registered
    /// region at its own address with its key on each device.
    pub fn descriptor(&self) -> Descriptor {
        let (addr, length) = self.segment.region();
        Descriptor {
            name: self.server.clone(),
            rdma_server_name: String::new(),
            devices: self
                .devices
                .iter()
                .map(|d| rdma::Device {
                    name: d.name.clone(),
                    lid: d.lid,
                    gid: d.gid,
                })
                .collect(),
            buffers: vec![rdma::Buffer {
                location: LOCATION.into(),
                addr,
                length,
                rkeys: self.devices.iter().map(|d| d.rkey).collect(),
                lkeys: self.devices.iter().map(|d| d.lkey).collect(),
            }],
        }
    }

    /// The first address of the registered region (what Mooncake's replicas add offsets to).
    pub fn base(&self) -> u64 {
        self.segment.region().0
    }

    /// Checks the peers of unconfirmed sets until [`RdmaTarget::stop`], on its own thread.
    pub fn start_checks(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("mooncake-rdma-checks".into())
            .spawn(move || me.check_loop())
    }

    /// Ends the checks and destroys every QP set.
    pub fn stop(&self) {
        self.stop.trigger();
        let sets = self.table.lock().drain();
        drop(sets);
    }

    fn check_loop(&self) {
        let period = (self.table.lock().idle() / 4).max(Duration::from_millis(250));
        while !self.stop.sleep(period) {
            let due = self.table.lock().due(Instant::now());
            for (key, server) in due {
                let alive = answers(&server);
                let dropped = self.table.lock().checked(&key, alive, Instant::now());
                if let Some(set) = dropped {
                    tracing::info!(peer = %key.1, qps = set.len(),
                        "Mooncake RDMA peer gone: its QPs are destroyed");
                    self.stats.gone.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Answers a Connection request from `from` (the handshake's TCP peer).
    fn connect(&self, req: &Connection, from: IpAddr) -> Connection {
        let names: Vec<&str> = self.devices.iter().map(|d| d.name.as_str()).collect();
        let reply = |qp_num: Vec<u32>, device: Option<&DeviceKeys>, msg: String| Connection {
            local_nic_path: req.peer_nic_path.clone(),
            peer_nic_path: req.local_nic_path.clone(),
            local_gid: device.map(|d| d.gid),
            local_lid: device.map_or(0, |d| d.lid),
            qp_num,
            reply_msg: msg,
            ready_ack: None,
        };
        let refuse = |msg: String| {
            tracing::warn!(peer = %req.local_nic_path, %from, reason = %msg,
                "Mooncake RDMA handshake refused");
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            reply(vec![], None, msg)
        };
        let (device, sender) =
            match rdma::check_request(req, &self.server, &names, rdma::MAX_QPS_PER_ENDPOINT) {
                Ok(found) => found,
                Err(msg) => return refuse(msg),
            };
        let key: Key = (device, sender.to_string());
        let now = Instant::now();
        if req.ready_ack == Some(true) {
            return match self.table.lock().ready_ack(&key, &req.qp_num, now) {
                Ok(()) => reply(vec![], None, String::new()),
                Err(msg) => refuse(msg),
            };
        }
        let Some(gid) = req.local_gid else {
            return refuse(
                "no local_gid in the handshake: this store serves Mooncake 0.3.12 and later, \
                 which send it"
                    .into(),
            );
        };
        let peers: Vec<QpEndpoint> = req
            .qp_num
            .iter()
            .map(|&qpn| QpEndpoint {
                qpn,
                psn: PSN,
                lid: req.local_lid,
                gid,
                mtu: MTU_CEILING,
            })
            .collect();
        let mut dropped = Vec::new();
        let mut table = self.table.lock();
        let qps = match table.admit(&key, &req.qp_num, from, now, &mut dropped) {
            Ok(Admission::Same) => table.get(&key).map(|s| numbers(s)).unwrap_or_default(),
            Ok(Admission::Make(_)) => match self.segment.peer_qps(device, &peers, PSN) {
                Ok(set) => {
                    let qps = numbers(&set);
                    table.insert(key.clone(), set, req.qp_num.clone(), from, now);
                    self.stats
                        .made
                        .fetch_add(qps.len() as u64, Ordering::Relaxed);
                    qps
                }
                Err(e) => {
                    drop(table);
                    return refuse(format!("cannot make QPs for {}: {e}", req.local_nic_path));
                }
            },
            Err(msg) => {
                drop(table);
                return refuse(msg);
            }
        };
        drop(table);
        if !dropped.is_empty() {
            self.stats
                .replaced
                .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        }
        drop(dropped);
        self.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer = %req.local_nic_path, device = %names[device], ?qps,
            "Mooncake RDMA endpoint connected");
        reply(qps, Some(&self.devices[device]), String::new())
    }

    /// Writes the RDMA target's figures: connections, queue pairs per device, handshakes.
    pub fn render(&self, p: &mut PromText) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let per_device = self.table.lock().qps_per_device(self.devices.len());
        p.family(&MOONCAKE_RDMA_QPS);
        for (d, held) in self.devices.iter().zip(per_device) {
            p.sample(&MOONCAKE_RDMA_QPS, &[("device", &d.name)], held as f64);
        }
        let s = &self.stats;
        p.atomic(&MOONCAKE_RDMA_HANDSHAKES_TOTAL, &s.handshakes)
            .atomic(&MOONCAKE_RDMA_HANDSHAKES_REFUSED_TOTAL, &s.refused)
            .atomic(&MOONCAKE_RDMA_QPS_MADE_TOTAL, &s.made)
            .family(&MOONCAKE_RDMA_SETS_DROPPED_TOTAL)
            .sample(
                &MOONCAKE_RDMA_SETS_DROPPED_TOTAL,
                &[("reason", "replaced")],
                n(&s.replaced),
            )
            .sample(
                &MOONCAKE_RDMA_SETS_DROPPED_TOTAL,
                &[("reason", "gone")],
                n(&s.gone),
            );
    }
}

impl Connections for RdmaTarget {
    fn connect(&self, req: &Connection, from: IpAddr) -> Connection {
        RdmaTarget::connect(self, req, from)
    }
}

fn numbers(set: &[Qp]) -> Vec<u32> {
    set.iter().map(|q| q.endpoint().qpn).collect()
}

/// Whether a Mooncake peer's handshake listener (`host:port`, its nic paths' server part)
/// still answers: it takes the connection, and is sent a Probe it may answer. A name that is
/// no address cannot be checked and counts as there.
fn answers(server: &str) -> bool {
    let Some(addr): Option<SocketAddr> = server.to_socket_addrs().ok().and_then(|mut a| a.next())
    else {
        return true;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, CHECK_TIMEOUT) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(CHECK_TIMEOUT));
    let _ = stream.set_write_timeout(Some(CHECK_TIMEOUT));
    // Mooncake's listener serves one connection at a time and waits for the client to close:
    // ask, take what it says, and go.
    use std::io::Write;
    if stream
        .write_all(&handshake::frame(handshake::PROBE, &serde_json::json!({})))
        .is_ok()
    {
        let _ = handshake::read_frame(&mut stream);
    }
    true
}
