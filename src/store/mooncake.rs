//! The store's door for Mooncake's own clients: its memory segment served over the Transfer
//! Engine's TCP transport, and a P2P handshake listener answering its descriptor, so that the
//! replicas the master hands a Mooncake client on this store are written and read in place.
//! The same descriptor goes to the HTTP metadata server (`registration.rs`), so one store
//! serves clients of both discovery modes.

use super::index::Records;
use super::segment::SegmentMemory;
use crate::mooncake::handshake::{self, HandshakeStats, TeEndpoint};
use crate::mooncake::te_tcp::{self, TeSegment, TeStats, WrittenHashes, SEGMENT_BASE};
use crate::telemetry::{Family, PromText};
use crate::transfer::server::{ConnCounters, ServerHandle, ServerOptions};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

// The `/metrics` families this file writes, each declared once.
const MOONCAKE_HANDSHAKES_REFUSED_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_handshakes_refused_total",
    "P2P handshakes refused (a frame too long, not JSON, another type).",
);
const MOONCAKE_HANDSHAKES_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_handshakes_total",
    "P2P handshakes answered with this store's descriptor.",
);
const MOONCAKE_TRANSFERS_REFUSED_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_transfers_refused_total",
    "Transfer Engine requests refused: a range outside the segment or over a recorded \
             object, an unknown opcode.",
);
const MOONCAKE_TRANSFERS_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_transfers_total",
    "Requests of Mooncake's Transfer Engine (TCP) served into the segment, by op.",
);
const MOONCAKE_TRANSFER_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_mooncake_transfer_bytes_total",
    "Bytes moved by Mooncake's Transfer Engine (TCP), by op.",
);

/// Ports Mooncake picks its own from (`MC_MIN_RPC_PORT`..`MC_MAX_RPC_PORT`); a store asked for
/// port 0 takes a free one here too.
pub const PORT_RANGE: std::ops::Range<u16> = 15000..17000;

/// Event loops serving the Transfer Engine's connections: half the cores, at least two, at
/// most eight. On the 2-vCPU VM two loops serve the wheel's four lanes per peer as fast as
/// Mooncake's storage process does (a batch get of 32 × 256 KiB: 5.0-5.2 ms against 5.1-6.1);
/// one loop answers the lanes in turn and three or four share two cores (5.3-5.7 ms).
fn te_loops() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / 2).clamp(2, 8)
}

/// The segment and its records, as the transport reaches them.
struct Segment {
    memory: Arc<SegmentMemory>,
    records: Arc<Records>,
    hashes: Arc<WrittenHashes>,
}

impl TeSegment for Segment {
    fn size(&self) -> u64 {
        self.memory.size()
    }

    fn recorded_over(&self, offset: u64, len: u64) -> Option<u64> {
        self.records.newest_overlapping(offset, len)
    }

    unsafe fn bytes(&self, offset: u64, len: u64) -> &[u8] {
        // SAFETY: the caller checked the range.
        unsafe { self.memory.slice(offset, len) }
    }

    unsafe fn bytes_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        // SAFETY: the caller checked the range, and that no committed object lies in it.
        unsafe { self.memory.slice_mut(offset, len) }
    }

    fn writing(&self, offset: u64, len: u64) {
        self.hashes.forget(offset, len);
    }

    fn wrote(&self, offset: u64, len: u64, crc: u32) {
        self.hashes.put(offset, len, crc);
    }
}

/// The transport and handshake listeners of a running store.
pub struct MooncakeDoor {
    pub endpoint: TeEndpoint,
    te: Arc<TeStats>,
    handshakes: Arc<HandshakeStats>,
    /// The two ports' connections, as their admission counts them.
    te_conns: Arc<ConnCounters>,
    handshake_conns: Arc<ConnCounters>,
    servers: parking_lot::Mutex<Vec<ServerHandle>>,
    /// The RDMA target and the thread checking its peers.
    #[cfg(feature = "rdma")]
    rdma: parking_lot::Mutex<
        Option<(
            Arc<crate::mooncake::rdma_target::RdmaTarget>,
            std::thread::JoinHandle<()>,
        )>,
    >,
}

/// A listener on `port` of `bind`, or with port 0 the first free one in [`PORT_RANGE`].
pub fn bind(
    what: &'static str,
    bind: &str,
    port: u16,
) -> Result<TcpListener, crate::role::BindError> {
    if port != 0 {
        return crate::role::bind(what, bind, port);
    }
    // Start at a different place in the range each time, so that stores starting together
    // do not race for the same ports.
    let span = PORT_RANGE.end - PORT_RANGE.start;
    let first = (std::process::id() as u16).wrapping_mul(7919) % span;
    let mut last = None;
    for i in 0..span {
        let port = PORT_RANGE.start + (first + i) % span;
        match crate::role::bind(what, bind, port) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("the range is not empty"))
}

/// How a store's segment reaches Mooncake's clients: one transport, as its descriptor names
/// one (Mooncake's clients take the transport the descriptor says, and have only one).
pub enum TeTransport {
    /// Mooncake's Transfer Engine TCP transport, on this listener.
    Tcp(TcpListener),
    /// Mooncake's RDMA transport, on the segment as the store registered it.
    #[cfg(feature = "rdma")]
    Rdma(Arc<crate::transfer::rdma::serve::RdmaSegment>),
}

impl MooncakeDoor {
    /// Serves `memory` over `transport` and answers handshakes on `handshake`, as `host`.
    pub fn start(
        host: &str,
        (transport, handshake): (TeTransport, TcpListener),
        (memory, records, hashes): (Arc<SegmentMemory>, Arc<Records>, Arc<WrittenHashes>),
        opts: ServerOptions,
    ) -> std::io::Result<MooncakeDoor> {
        let name = format!("{host}:{}", handshake.local_addr()?.port());
        let mut endpoint = TeEndpoint {
            name: name.clone(),
            data_host: host.to_string(),
            data_port: 0,
            base: SEGMENT_BASE,
            len: memory.size(),
            rdma: None,
        };
        let te = Arc::new(TeStats::default());
        let handshakes = Arc::new(HandshakeStats::default());
        let (te_conns, handshake_conns) = (Arc::default(), Arc::default());
        let mut servers = Vec::new();
        let mut connections: Option<Arc<dyn handshake::Connections>> = None;
        #[cfg(feature = "rdma")]
        let mut rdma = None;
        match transport {
            TeTransport::Tcp(data) => {
                endpoint.data_port = data.local_addr()?.port();
                let segment = Arc::new(Segment {
                    memory,
                    records,
                    hashes,
                });
                servers.push(te_tcp::serve(
                    data,
                    segment,
                    (
                        ServerOptions {
                            role: "store-mooncake-transfer",
                            ..opts.clone()
                        },
                        Arc::clone(&te_conns),
                        te_loops(),
                    ),
                    te.clone(),
                )?);
            }
            #[cfg(feature = "rdma")]
            TeTransport::Rdma(segment) => {
                let target = crate::mooncake::rdma_target::RdmaTarget::new(
                    segment,
                    name.clone(),
                    opts.idle_timeout,
                );
                endpoint.base = target.base();
                endpoint.rdma = Some(target.descriptor());
                let checks = target.start_checks()?;
                connections = Some(target.clone());
                rdma = Some((target, checks));
            }
        }
        servers.push(handshake::serve(
            handshake,
            endpoint.clone(),
            (
                handshake::port_options(ServerOptions {
                    role: "store-mooncake-handshake",
                    ..opts
                }),
                Arc::clone(&handshake_conns),
            ),
            handshakes.clone(),
            connections,
        )?);
        tracing::warn!(
            name = %endpoint.name,
            transport = if endpoint.rdma.is_some() { "rdma" } else { "tcp" },
            data_port = endpoint.data_port,
            "serving Mooncake's Transfer Engine and P2P handshake: both unauthenticated; \
             whoever reaches them reads the segment and writes its free space \
             (docs/security.md)"
        );
        Ok(MooncakeDoor {
            endpoint,
            te,
            handshakes,
            te_conns,
            handshake_conns,
            servers: parking_lot::Mutex::new(servers),
            #[cfg(feature = "rdma")]
            rdma: parking_lot::Mutex::new(rdma),
        })
    }

    /// Stops accepting and ends the transport's connections.
    pub fn stop(&self) {
        for mut server in self.servers.lock().drain(..) {
            server.stop();
        }
        #[cfg(feature = "rdma")]
        if let Some((target, checks)) = self.rdma.lock().take() {
            target.stop();
            let _ = checks.join();
        }
    }

    /// Writes the figures of Mooncake's door: Transfer Engine sessions, bytes, RDMA.
    pub fn render(&self, p: &mut PromText) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let t = &self.te;
        p.family(&MOONCAKE_TRANSFERS_TOTAL)
            .sample(&MOONCAKE_TRANSFERS_TOTAL, &[("op", "write")], n(&t.writes))
            .sample(&MOONCAKE_TRANSFERS_TOTAL, &[("op", "read")], n(&t.reads))
            .family(&MOONCAKE_TRANSFER_BYTES_TOTAL)
            .sample(
                &MOONCAKE_TRANSFER_BYTES_TOTAL,
                &[("op", "write")],
                n(&t.bytes_written),
            )
            .sample(
                &MOONCAKE_TRANSFER_BYTES_TOTAL,
                &[("op", "read")],
                n(&t.bytes_read),
            )
            .atomic(&MOONCAKE_TRANSFERS_REFUSED_TOTAL, &t.refused)
            .atomic(&MOONCAKE_HANDSHAKES_TOTAL, &self.handshakes.served)
            .atomic(&MOONCAKE_HANDSHAKES_REFUSED_TOTAL, &self.handshakes.refused);
        #[cfg(feature = "rdma")]
        if let Some((target, _)) = &*self.rdma.lock() {
            target.render(p);
        }
        self.te_conns.render(p, "rbgctl_store_mooncake_transfer");
        self.handshake_conns
            .render(p, "rbgctl_store_mooncake_handshake");
    }
}

impl Drop for MooncakeDoor {
    fn drop(&mut self) {
        self.stop();
    }
}
