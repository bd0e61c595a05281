//! A PAPER store for `bench master`: it mounts a segment that exists only on paper (no memory
//! behind it), heartbeats, takes the master's forgets and lease renewals, and after a master
//! restart reports the objects the benchmark put into it, as a persistent store reports its
//! index. It serves no bytes: every read or write is refused with a message saying so. It lets
//! the master be driven with millions of objects by metadata operations alone. It checks the
//! master's tag on each forget as a store does, so the master does that work as it would.

use crate::transfer::grant::GrantKey;
use crate::transfer::message::*;
use crate::transfer::rpc;
use crate::transfer::server::{
    self, ConnCounters, Handled, Handling, ServerHandle, ServerIo, Service,
};
use crate::transfer::{ConnOptions, Opcode, Pool, Status, TransferError};
use parking_lot::Mutex;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The store side: what the master sends a store.
struct PaperService {
    connections: ConnCounters,
    grant_key: GrantKey,
}

impl PaperService {
    /// The body of the master's order, or a protocol error (the master is the only sender).
    fn order<'m>(&self, op: Opcode, meta: &'m [u8]) -> Result<&'m [u8], TransferError> {
        self.grant_key
            .open_order(op, meta)
            .map_err(|e| TransferError::Protocol(e.to_string()))
    }
}

impl Service for PaperService {
    fn handle(&self, op: Opcode, meta: &[u8], io: &mut ServerIo<'_>) -> Handling {
        let answered = match op {
            Opcode::Forget => {
                ForgetReq::from_meta(self.order(op, meta)?)?;
                io.ok(&())
            }
            Opcode::ForgetLease => {
                ForgetLeaseReq::from_meta(self.order(op, meta)?)?;
                io.ok(&())
            }
            _ => {
                io.discard_data()?;
                io.error(
                    Status::SegmentNotFound,
                    "a PAPER store of `rbgctl bench master`: it holds no bytes",
                )
            }
        };
        answered.map(|()| Handled::Answered)
    }

    fn max_data_len(&self) -> u64 {
        0
    }

    fn connections(&self) -> &ConnCounters {
        &self.connections
    }
}

/// A PAPER store: a segment without memory behind it, for driving the master with
/// metadata alone.
pub struct PaperStore {
    client_id: u64,
    master: Pool,
    segment: SegmentInfo,
    grant_key: GrantKey,
    segment_id: AtomicU64,
    /// The objects put into the segment (reported after a master restart).
    objects: Mutex<Vec<StoredObject>>,
    /// The master restarted and has had the report: set by the heartbeat.
    reported: AtomicBool,
    stop: AtomicBool,
    _server: ServerHandle,
}

impl PaperStore {
    /// Serves on a loopback port and mounts a segment of `size` bytes (on paper).
    pub fn start(master: &str, size: u64) -> anyhow::Result<Arc<PaperStore>> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let endpoint = listener.local_addr()?.to_string();
        let grant_key = GrantKey::generate()?;
        let server = server::spawn(
            listener,
            Arc::new(PaperService {
                connections: ConnCounters::default(),
                grant_key: grant_key.clone(),
            }),
            server::ServerOptions {
                max_connections: 64,
                max_connections_per_peer: 64,
                idle_timeout: Duration::from_secs(120),
                request_timeout: Duration::from_secs(10),
                spin: Duration::ZERO,
                role: "paper-store",
                auth: None,
                keepalive: None,
            },
        )?;
        let store = Arc::new(PaperStore {
            client_id: fastrand::u64(1..),
            master: Pool::new(master.to_string(), ConnOptions::default()),
            segment: SegmentInfo {
                name: format!("PAPER-{endpoint}"),
                endpoint,
                size,
                segment_uuid: fastrand::u64(1..),
                ..SegmentInfo::default()
            },
            grant_key,
            segment_id: AtomicU64::new(0),
            objects: Mutex::new(Vec::new()),
            reported: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            _server: server,
        });
        store.mount(false)?;
        let beat = store.clone();
        std::thread::Builder::new()
            .name("paper-heartbeat".into())
            .spawn(move || beat.heartbeat())?;
        Ok(store)
    }

    /// Records objects the benchmark put into this segment.
    pub fn hold(&self, objects: impl IntoIterator<Item = StoredObject>) {
        self.objects.lock().extend(objects);
    }

    /// The segment id the master gave.
    pub fn segment_id(&self) -> u64 {
        self.segment_id.load(Ordering::Relaxed)
    }

    /// Whether the objects have been reported to a restarted master (and clears the flag).
    pub fn take_reported(&self) -> bool {
        self.reported.swap(false, Ordering::SeqCst)
    }

    /// Stops the store's heartbeat.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stops heartbeating and unmounts the segment for good: the master drops every object in
    /// it.
    pub fn leave(&self) -> Result<(), TransferError> {
        self.stop();
        let req = UnmountReq {
            client_id: self.client_id,
            segment_id: self.segment_id(),
            keep: false,
        };
        self.master.with(|c| c.call::<rpc::UnmountSegment>(&req))
    }

    fn mount(&self, recovering: bool) -> Result<(), TransferError> {
        let req = MountReq {
            client_id: self.client_id,
            segment: self.segment.clone(),
            recovering,
            grant_key: self.grant_key.bytes().to_vec(),
        };
        let resp: MountResp = self.master.with(|c| c.call::<rpc::MountSegment>(&req))?;
        self.segment_id.store(resp.segment_id, Ordering::Relaxed);
        if recovering {
            let objects = self.objects.lock().clone();
            let requests = crate::store::registration::report_requests(
                self.client_id,
                resp.segment_id,
                &objects,
            );
            for req in requests {
                let _: ReportResp = self.master.with(|c| c.call::<rpc::ReportObjects>(&req))?;
            }
            self.reported.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Heartbeats every 200 ms; mounts again, reporting its objects, when the master does not
    /// know it (it restarted).
    fn heartbeat(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            let ping = PingReq {
                client_id: self.client_id,
            };
            match self.master.with(|c| c.call::<rpc::Ping>(&ping)) {
                Ok(r) if r.need_remount => {
                    if let Err(e) = self.mount(true) {
                        tracing::debug!(error = %e, "PAPER store: remount failed");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "PAPER store: heartbeat failed"),
            }
        }
    }
}

impl Drop for PaperStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
