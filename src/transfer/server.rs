//! The serving side: an accept loop and one thread per connection running frames through a
//! `Service`. Blocking threads rather than async tasks because a data-plane connection carries one
//! request at a time and the spin-poll (see `stream`) needs a thread of its own; connections are
//! few (a pool per client). What a peer can hold is bounded: `max_connections` in all and
//! `max_connections_per_peer` per IP address; a new connection must begin its first request
//! within `request_timeout`, an idle one ends after `idle_timeout`, and a request whose bytes
//! stop coming (a half-sent frame) ends its connection after `request_timeout`. Refusals and
//! bad frames are logged at most once per 10 s, with counts.

use super::frame::{Header, Opcode, Status};
use super::message::Wire;
use super::stream::FramedStream;
use super::TransferError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A log line at most once per period, saying how many events it stands for.
pub struct LogBudget {
    period: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogBudget {
    pub fn new(period: Duration) -> LogBudget {
        LogBudget {
            period,
            state: Mutex::new((None, 0)),
        }
    }

    /// Counts one event; returns how many events (this one included) the caller's log line
    /// should report, or `None` when this event stays silent.
    pub fn spend(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        s.1 += 1;
        match s.0 {
            Some(last) if now.saturating_duration_since(last) < self.period => None,
            _ => {
                s.0 = Some(now);
                Some(std::mem::take(&mut s.1))
            }
        }
    }
}

/// What happened to a server's connections.
#[derive(Debug, Default)]
pub struct ConnCounters {
    /// Admitted (each then served on a thread of its own).
    pub accepted: AtomicU64,
    /// Closed because of malformed input or a request that stopped arriving.
    pub bad_frames: AtomicU64,
    /// Refused at a connection limit.
    pub refused: AtomicU64,
    /// Closed after idling.
    pub idle_closed: AtomicU64,
    /// Closed because the peer did not prove it holds the cluster secret.
    pub unauthenticated: AtomicU64,
}

impl ConnCounters {
    /// As `<prefix>_accepted_connections_total`, `<prefix>_bad_frames_total`,
    /// `<prefix>_refused_connections_total`, `<prefix>_idle_closed_connections_total`,
    /// `<prefix>_unauthenticated_connections_total`.
    pub fn render(&self, p: &mut crate::telemetry::PromText, prefix: &str) {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        p.single(
            &format!("{prefix}_accepted_connections_total"),
            "counter",
            "Connections admitted (each served on a thread of its own).",
            n(&self.accepted),
        )
        .single(
            &format!("{prefix}_bad_frames_total"),
            "counter",
            "Connections closed because of malformed input or a request that stopped arriving.",
            n(&self.bad_frames),
        )
        .single(
            &format!("{prefix}_refused_connections_total"),
            "counter",
            "Connections refused at a connection limit (in all or per peer).",
            n(&self.refused),
        )
        .single(
            &format!("{prefix}_idle_closed_connections_total"),
            "counter",
            "Connections closed after idling (clients reconnect).",
            n(&self.idle_closed),
        )
        .single(
            &format!("{prefix}_unauthenticated_connections_total"),
            "counter",
            "Connections closed because the peer did not prove it holds the cluster secret.",
            n(&self.unauthenticated),
        );
    }

    fn count(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Open connections, in all and per peer address.
#[derive(Default)]
struct Occupancy {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// One admitted connection's place; given back when dropped.
struct Slot {
    occupancy: Arc<Mutex<Occupancy>>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.occupancy.lock();
        o.total = o.total.saturating_sub(1);
        if let Some(n) = o.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                o.by_peer.remove(&self.peer);
            }
        }
    }
}

/// What a server does with each request.
pub trait Service: Send + Sync + 'static {
    /// Handles one request: consumes its payload and writes exactly one reply through `io`.
    /// A `Protocol` error replies `MALFORMED_FRAME` and closes the connection.
    fn handle(
        &self,
        req: &Header,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
    ) -> Result<(), TransferError>;
    /// Largest payload a request may carry.
    fn max_data_len(&self) -> u64;
    /// Where the server counts what happens to connections (for metrics).
    fn connections(&self) -> &ConnCounters;
}

/// What an elected master puts on its answers: its epoch (clients drop answers from an older
/// one), and the instant its leadership lease may run out, after which no answer may go out as
/// a success (`ha::lease::Leadership::check` makes one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub epoch: u64,
    pub until: std::time::Instant,
}

/// A request's view of its connection.
pub struct ServerIo<'a> {
    stream: &'a mut FramedStream,
    req: Header,
    replied: bool,
    /// An elected master's fence: its epoch goes on the reply, and a success past the fence's
    /// instant goes out as `NOT_LEADER` instead.
    fence: Option<Fence>,
    /// What the service keeps for this connection (a store's RDMA queue pair): dropped when
    /// the connection ends.
    attached: &'a mut Option<Box<dyn std::any::Any + Send>>,
}

impl ServerIo<'_> {
    pub fn data_len(&self) -> u64 {
        self.req.data_len
    }

    pub fn read_data_into(&mut self, dst: &mut [u8]) -> Result<(), TransferError> {
        self.stream.read_data_into(dst)
    }

    /// Reads into memory this thread does not read next (a segment) and answers the CRC-32C of
    /// what came, computed in the same pass (`FramedStream::read_data_streamed_crc`).
    pub fn read_data_streamed_crc(&mut self, dst: &mut [u8]) -> Result<u32, TransferError> {
        self.stream.read_data_streamed_crc(dst)
    }

    pub fn discard_data(&mut self) -> Result<(), TransferError> {
        self.stream.discard_data()
    }

    /// Keeps `thing` until the connection ends; false (and `thing` dropped) if something is
    /// kept already.
    pub fn attach(&mut self, thing: Box<dyn std::any::Any + Send>) -> bool {
        if self.attached.is_some() {
            return false;
        }
        *self.attached = Some(thing);
        true
    }

    /// Whether something is kept for this connection.
    pub fn has_attached(&self) -> bool {
        self.attached.is_some()
    }

    /// Answers as the leader of `fence.epoch`, as long as its lease lasts.
    pub fn fence(&mut self, fence: Fence) {
        self.fence = Some(fence);
    }

    /// Sends the reply: status, meta, and a payload written straight from `data`.
    pub fn reply(
        &mut self,
        status: Status,
        meta: &[u8],
        data: &[&[u8]],
    ) -> Result<(), TransferError> {
        if self.replied {
            return Err(TransferError::Protocol(
                "second reply to one request".into(),
            ));
        }
        self.replied = true;
        let Some(fence) = self.fence else {
            let data_len = data.iter().map(|d| d.len() as u64).sum();
            let header = Header::response(&self.req, status, meta.len(), data_len);
            return self.stream.write_frame(&header, meta, data);
        };
        // The last moment before the answer leaves: a leader whose lease may have run out
        // meanwhile (it was paused, or the request took long) acknowledges nothing.
        let late = "this master's leadership lease ran out before it could answer; \
                    what the request did may or may not stand: ask the leader";
        let (status, meta, data) = if std::time::Instant::now() >= fence.until {
            (Status::NotLeader, late.as_bytes(), &[][..])
        } else {
            (status, meta, data)
        };
        let mut stamped = Vec::with_capacity(8 + meta.len());
        stamped.extend_from_slice(&fence.epoch.to_le_bytes());
        stamped.extend_from_slice(meta);
        let data_len = data.iter().map(|d| d.len() as u64).sum();
        let mut header = Header::response(&self.req, status, stamped.len(), data_len);
        header.flags |= super::frame::FLAG_EPOCH;
        self.stream.write_frame(&header, &stamped, data)
    }

    pub fn ok<T: Wire>(&mut self, msg: &T) -> Result<(), TransferError> {
        self.reply(Status::Ok, &msg.to_meta(), &[])
    }

    /// An error reply; the message travels as the meta (UTF-8 text).
    pub fn error(&mut self, status: Status, message: &str) -> Result<(), TransferError> {
        self.reply(status, message.as_bytes(), &[])
    }
}

#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// An idle connection (between requests) ends after this.
    pub idle_timeout: Duration,
    /// A new connection's first request must begin within this, and every read or write
    /// inside a request must make progress within it.
    pub request_timeout: Duration,
    pub spin: Duration,
    /// Used in thread names and logs.
    pub role: &'static str,
    /// The cluster secret: every connection must prove it holds it before anything else
    /// (`crate::auth`). `None`: connections need not.
    pub auth: Option<Arc<crate::auth::Secret>>,
}

impl ServerOptions {
    /// Checks the limits, naming the `role.field` that is wrong.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        let field = |f: &str| format!("{}.{f}", self.role);
        let bad = |f: &str, why: &str| Err(crate::config::ConfigError::invalid(field(f), why));
        if self.max_connections == 0 {
            return bad("max_connections", "must be at least 1");
        }
        if self.max_connections_per_peer == 0 {
            return bad("max_connections_per_peer", "must be at least 1");
        }
        if self.idle_timeout < Duration::from_millis(100) {
            return bad("idle_timeout_ms", "must be at least 100 ms");
        }
        if self.request_timeout < Duration::from_millis(100) {
            return bad("request_timeout_ms", "must be at least 100 ms");
        }
        Ok(())
    }
}

/// A running server; dropping the handle does not stop it, `stop` does.
pub struct ServerHandle {
    pub addr: SocketAddr,
    shutdown: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// Stops accepting; open connections finish when their peers close them.
    pub fn stop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn spawn(
    listener: TcpListener,
    service: Arc<dyn Service>,
    opts: ServerOptions,
) -> std::io::Result<ServerHandle> {
    let addr = listener.local_addr()?;
    let shutdown = Arc::new(AtomicBool::new(false));
    let stop = shutdown.clone();
    let thread = std::thread::Builder::new()
        .name(format!("{}-accept", opts.role))
        .spawn(move || accept_loop(listener, service, opts, stop))?;
    Ok(ServerHandle {
        addr,
        shutdown,
        thread: Some(thread),
    })
}

fn accept_loop(
    listener: TcpListener,
    service: Arc<dyn Service>,
    opts: ServerOptions,
    shutdown: Arc<AtomicBool>,
) {
    let occupancy = Arc::new(Mutex::new(Occupancy::default()));
    let refusals = LogBudget::new(Duration::from_secs(10));
    let refuser = Refuser::spawn(opts.role);
    let logs = Arc::new(ConnLogs {
        bad_frames: LogBudget::new(Duration::from_secs(10)),
        stalls: LogBudget::new(Duration::from_secs(10)),
    });
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) => {
                if shutdown.load(Ordering::SeqCst) {
                    return;
                }
                tracing::warn!(role = opts.role, error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shutdown.load(Ordering::SeqCst) {
            return;
        }
        let admitted = {
            let mut o = occupancy.lock();
            let mine = o.by_peer.get(&peer.ip()).copied().unwrap_or(0);
            if o.total >= opts.max_connections {
                Err(("connection limit reached", opts.max_connections))
            } else if mine >= opts.max_connections_per_peer {
                Err((
                    "per-peer connection limit reached",
                    opts.max_connections_per_peer,
                ))
            } else {
                o.total += 1;
                *o.by_peer.entry(peer.ip()).or_default() += 1;
                Ok(())
            }
        };
        if let Err((why, limit)) = admitted {
            ConnCounters::count(&service.connections().refused);
            if let Some(n) = refusals.spend(Instant::now()) {
                tracing::warn!(role = opts.role, %peer, limit, refused = n, "{why}; refusing connections");
            }
            let reason = format!(
                "the {} at {} refused this connection: {why} ({limit} connections from {}); \
                 close idle connections or raise the limit",
                opts.role,
                listener
                    .local_addr()
                    .map_or_else(|_| "?".into(), |a| a.to_string()),
                peer.ip()
            );
            refuser.refuse(stream, &reason);
            continue;
        }
        ConnCounters::count(&service.connections().accepted);
        let service = service.clone();
        let slot = Slot {
            occupancy: occupancy.clone(),
            peer: peer.ip(),
        };
        let (conn_opts, logs) = (opts.clone(), logs.clone());
        let role = opts.role;
        let spawned = std::thread::Builder::new()
            .name(format!("{role}-conn"))
            .stack_size(512 * 1024)
            .spawn(move || {
                let _slot = slot;
                serve_connection(stream, peer, service.as_ref(), &conn_opts, &logs);
            });
        // A failed spawn dropped the closure, and with it the slot.
        if let Err(e) = spawned {
            tracing::error!(role, error = %e, "cannot start a connection thread");
        }
    }
}

/// Tells a refused connection why before closing it: a `CONNECTION_REFUSED` answer to no
/// request ([`REFUSAL_ID`](super::frame::REFUSAL_ID)), written without blocking the accept
/// loop. One thread then reads what the peer sent for a moment before the socket closes, so
/// that the close is not a reset that could discard the answer on the peer's side. Bounded:
/// past `REFUSALS_QUEUED` waiting sockets, one closes at once.
struct Refuser {
    queue: Option<std::sync::mpsc::SyncSender<TcpStream>>,
}

const REFUSALS_QUEUED: usize = 64;

impl Refuser {
    fn spawn(role: &'static str) -> Refuser {
        let (tx, rx) = std::sync::mpsc::sync_channel::<TcpStream>(REFUSALS_QUEUED);
        let spawned = std::thread::Builder::new()
            .name(format!("{role}-refuse"))
            .stack_size(64 * 1024)
            .spawn(move || {
                let mut scratch = [0u8; 4096];
                for mut stream in rx {
                    let until = Instant::now() + Duration::from_millis(100);
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
                    while Instant::now() < until {
                        match std::io::Read::read(&mut stream, &mut scratch) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                            Err(_) => break,
                        }
                    }
                }
            });
        Refuser {
            queue: spawned.ok().map(|_| tx),
        }
    }

    fn refuse(&self, stream: TcpStream, reason: &str) {
        let header = Header {
            opcode: 0,
            flags: super::frame::FLAG_RESPONSE,
            request_id: super::frame::REFUSAL_ID,
            status: Status::ConnectionRefused as u16,
            meta_len: reason.len() as u32,
            data_len: 0,
        };
        let mut frame = header.encode().to_vec();
        frame.extend_from_slice(reason.as_bytes());
        // A fresh socket's send buffer takes the few hundred bytes at once.
        if stream.set_nonblocking(true).is_ok() {
            let _ = std::io::Write::write(&mut &stream, &frame);
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
        if let Some(q) = &self.queue {
            let _ = q.try_send(stream);
        }
    }
}

/// Log budgets shared by a server's connections.
struct ConnLogs {
    bad_frames: LogBudget,
    stalls: LogBudget,
}

fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    service: &dyn Service,
    opts: &ServerOptions,
    logs: &ConnLogs,
) {
    let role = opts.role;
    let mut io = match FramedStream::new(stream, opts.spin) {
        Ok(io) => io,
        Err(e) => {
            tracing::warn!(role, %peer, error = %e, "cannot set up connection");
            return;
        }
    };
    // The first request must come soon; later ones may wait out an idle pooled connection.
    if let Err(e) = io.set_server_waits(opts.request_timeout, opts.request_timeout) {
        tracing::warn!(role, %peer, error = %e, "cannot set up connection");
        return;
    }
    let mut first = true;
    let mut waits_idle = false;
    let opened = Instant::now();
    let mut handshake = Handshake::new(opts.auth.clone());
    let mut attached: Option<Box<dyn std::any::Any + Send>> = None;
    let bad_frame = |reason: &dyn std::fmt::Display| {
        ConnCounters::count(&service.connections().bad_frames);
        if let Some(n) = logs.bad_frames.spend(Instant::now()) {
            tracing::warn!(role, %peer, %reason, bad_frames = n, "closing connection: bad frame");
        }
    };
    tracing::debug!(role, %peer, "connection opened");
    loop {
        // Until it proves the secret, a connection has `request_timeout` in all; then the
        // waits of a pooled connection (idle between requests).
        if !handshake.proven {
            let left = opts.request_timeout.saturating_sub(opened.elapsed());
            if left.is_zero() || io.set_server_waits(left, left).is_err() {
                ConnCounters::count(&service.connections().unauthenticated);
                tracing::debug!(role, %peer, "closing a connection that did not prove the secret in time");
                break;
            }
        } else if !first && !waits_idle {
            waits_idle = true;
            if io
                .set_server_waits(opts.idle_timeout, opts.request_timeout)
                .is_err()
            {
                break;
            }
        }
        let (req, meta) = match io.read_frame_within(true, handshake.meta_limit()) {
            Ok(x) => x,
            Err(TransferError::Closed) => break,
            Err(TransferError::Idle) => {
                tracing::debug!(role, %peer, first, "closing idle connection");
                ConnCounters::count(&service.connections().idle_closed);
                break;
            }
            Err(TransferError::Timeout) => {
                ConnCounters::count(&service.connections().bad_frames);
                if let Some(n) = logs.stalls.spend(Instant::now()) {
                    tracing::warn!(role, %peer, timeout = ?opts.request_timeout, stalled = n,
                        "closing connection: a request stopped arriving");
                }
                break;
            }
            Err(e) => {
                bad_frame(&e);
                // A header that did not decode (bad magic or version) still gets its answer,
                // addressed as far as its bytes go, before the connection closes.
                if let Some(raw) = io.take_bad_header() {
                    let reason = e.to_string();
                    let req = Header {
                        opcode: raw[5],
                        flags: 0,
                        request_id: u64::from_le_bytes(raw[8..16].try_into().unwrap_or_default()),
                        status: 0,
                        meta_len: 0,
                        data_len: 0,
                    };
                    let header = Header::response(&req, Status::MalformedFrame, reason.len(), 0);
                    let _ = io.write_frame(&header, reason.as_bytes(), &[]);
                }
                break;
            }
        };
        first = false;
        if let Err(reason) = check_request(&req, service.max_data_len()) {
            bad_frame(&reason);
            let header = Header::response(&req, Status::MalformedFrame, reason.len(), 0);
            let _ = io.write_frame(&header, reason.as_bytes(), &[]);
            break;
        }
        let Some(op) = Opcode::from_u8(req.opcode) else {
            if !handshake.proven {
                let msg = "prove the cluster secret first (AUTH_HELLO, AUTH_PROOF); see --auth-token-file";
                let header = Header::response(&req, Status::Unauthenticated, msg.len(), 0);
                let _ = io.write_frame(&header, msg.as_bytes(), &[]);
                ConnCounters::count(&service.connections().unauthenticated);
                break;
            }
            // Unknown operation: answer and keep the connection (the frame itself was sound).
            if io.discard_data().is_err() {
                break;
            }
            let msg = format!("unknown opcode 0x{:02x} for the {role}", req.opcode);
            let header = Header::response(&req, Status::UnknownOpcode, msg.len(), 0);
            if io.write_frame(&header, msg.as_bytes(), &[]).is_err() {
                break;
            }
            continue;
        };
        let mut sio = ServerIo {
            stream: &mut io,
            req,
            replied: false,
            fence: None,
            attached: &mut attached,
        };
        match handshake.step(op, &meta, &mut sio) {
            Ok(Step::Answered) if sio.stream.pending_data() == 0 => continue,
            Ok(Step::Answered) => break,
            Ok(Step::Refused(why)) => {
                ConnCounters::count(&service.connections().unauthenticated);
                if let Some(n) = logs.bad_frames.spend(Instant::now()) {
                    tracing::warn!(role, %peer, op = op.name(), refused = n, "closing connection: {why}");
                }
                break;
            }
            Ok(Step::Pass) => {}
            Err(e) => {
                tracing::debug!(role, %peer, error = %e, "connection ended in its handshake");
                break;
            }
        }
        match service.handle(&req, op, &meta, &mut sio) {
            Ok(()) if sio.replied && sio.stream.pending_data() == 0 => {}
            Ok(()) => {
                tracing::error!(role, %peer, op = op.name(), "handler left the request unanswered");
                break;
            }
            Err(TransferError::Protocol(reason)) => {
                bad_frame(&format!("{}: {reason}", op.name()));
                if !sio.replied {
                    let _ = sio.error(Status::MalformedFrame, &reason);
                }
                break;
            }
            Err(e) => {
                tracing::debug!(role, %peer, op = op.name(), error = %e, "connection ended");
                break;
            }
        }
    }
    tracing::debug!(role, %peer, "connection closed");
}

/// Where a connection is in proving it holds the cluster secret.
struct Handshake {
    secret: Option<Arc<crate::auth::Secret>>,
    /// Nonces of an `AUTH_HELLO` answered: the client's and this server's.
    nonces: Option<(Vec<u8>, [u8; crate::auth::NONCE_LEN])>,
    proven: bool,
}

enum Step {
    /// A handshake request, answered.
    Answered,
    /// Not allowed yet (answered `UNAUTHENTICATED`): close the connection.
    Refused(&'static str),
    /// An ordinary request the connection may make.
    Pass,
}

impl Handshake {
    fn new(secret: Option<Arc<crate::auth::Secret>>) -> Handshake {
        let proven = secret.is_none();
        Handshake {
            secret,
            nonces: None,
            proven,
        }
    }

    /// The largest meta the next frame may declare: small until the peer proves the secret.
    fn meta_limit(&self) -> u32 {
        match self.proven {
            true => super::frame::MAX_META_LEN,
            false => super::frame::MAX_UNPROVEN_META_LEN,
        }
    }

    fn step(
        &mut self,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
    ) -> Result<Step, TransferError> {
        use crate::auth::{nonce, Side};
        use crate::transfer::message::{AuthChallengeResp, AuthHelloReq, AuthProofReq};
        match op {
            Opcode::AuthHello => {
                let hello = AuthHelloReq::from_meta(meta)?;
                let mine = nonce().map_err(|e| TransferError::Protocol(e.to_string()))?;
                let proof = match &self.secret {
                    Some(s) => s.prove(Side::Server, &hello.nonce, &mine),
                    // No secret here: an empty proof says so (a client with one refuses us).
                    None => Vec::new(),
                };
                io.ok(&AuthChallengeResp {
                    nonce: mine.to_vec(),
                    proof,
                })?;
                self.nonces = Some((hello.nonce, mine));
                Ok(Step::Answered)
            }
            Opcode::AuthProof => {
                let p = AuthProofReq::from_meta(meta)?;
                let Some(secret) = &self.secret else {
                    io.ok(&())?;
                    return Ok(Step::Answered);
                };
                // One proof per AUTH_HELLO: the nonces are used up either way.
                let good = self.nonces.take().is_some_and(|(client, mine)| {
                    secret.verify(Side::Client, &client, &mine, &p.proof)
                });
                if !good {
                    io.error(
                        Status::Unauthenticated,
                        "the proof does not match this connection's nonces and the cluster secret",
                    )?;
                    return Ok(Step::Refused("a bad authentication proof"));
                }
                self.proven = true;
                io.ok(&())?;
                Ok(Step::Answered)
            }
            _ if !self.proven => {
                // Its payload is not read: an unproven peer gets nothing more from us.
                io.error(
                    Status::Unauthenticated,
                    "prove the cluster secret first (AUTH_HELLO, AUTH_PROOF); see --auth-token-file",
                )?;
                Ok(Step::Refused("a request before authentication"))
            }
            _ => Ok(Step::Pass),
        }
    }
}

fn check_request(req: &Header, max_data_len: u64) -> Result<(), String> {
    if req.is_response() {
        return Err("a response frame sent to a server".into());
    }
    if req.data_len > max_data_len {
        return Err(format!(
            "payload of {} bytes exceeds this server's limit of {max_data_len}",
            req.data_len
        ));
    }
    Ok(())
}
