//! The serving side of the transfer protocol: an accept loop that admits connections within
//! their limits, and one of two ways to serve them, both running request frames through a
//! `Service`:
//! - `threaded`: a thread per connection with blocking reads that spin first (`stream`), for
//!   the store's data port, where a connection carries one large transfer at a time;
//! - `evented`: a few event-loop threads over every connection (epoll, `epoll`), for the
//!   master, whose requests are small and whose clients are many and mostly idle. A request
//!   that must wait (for room, or for the stores to take a forget) goes on to a small pool of
//!   threads that may block, so that no wait holds up another connection.
//!
//! What a peer can hold is bounded either way: `max_connections` in all and
//! `max_connections_per_peer` per IP address; a new connection must begin its first request
//! within `request_timeout`, an idle one ends after `idle_timeout`, and a request whose bytes
//! stop coming (a half-sent frame) ends its connection after `request_timeout`. Refusals and
//! bad frames are logged at most once per 10 s, with counts.

mod admission;
pub use admission::{IDLE_YIELD, UNPROVEN_SHARE};
mod epoll;
mod evented;
mod foreign;
pub use foreign::spawn as spawn_foreign_evented;
pub use foreign::{ForeignConn, NewConn, Next, Step, BUDGET};
mod handshake;
mod threaded;

use super::frame::{Header, Opcode, Status, HEADER_LEN};
use super::message::Wire;
use super::stream::FramedStream;
use super::TransferError;
use parking_lot::Mutex;
use std::net::{SocketAddr, TcpListener, TcpStream};
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
    /// At most one line every `period`.
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
    /// Admitted.
    pub accepted: AtomicU64,
    /// Closed because of malformed input or a request that stopped arriving.
    pub bad_frames: AtomicU64,
    /// Refused at a connection limit.
    pub refused: AtomicU64,
    /// Closed after idling.
    pub idle_closed: AtomicU64,
    /// Closed because the peer did not prove it holds the cluster secret.
    pub unauthenticated: AtomicU64,
    /// Requests the evented server handed on to a thread that may block (they had to wait).
    pub handed_on: AtomicU64,
    /// Connections closed to make way for a new one at a limit (unproven, or idle longest).
    pub made_way: AtomicU64,
}

impl ConnCounters {
    /// As `<prefix>_accepted_connections_total`, `<prefix>_bad_frames_total`,
    /// `<prefix>_refused_connections_total`, `<prefix>_idle_closed_connections_total`,
    /// `<prefix>_unauthenticated_connections_total`, `<prefix>_handed_on_requests_total`.
    pub fn render(&self, p: &mut crate::telemetry::PromText, prefix: &str) {
        p.counters(
            prefix,
            &[
                (
                    "accepted_connections_total",
                    "Connections admitted.",
                    &self.accepted,
                ),
                (
                    "bad_frames_total",
                    "Connections closed because of malformed input or a request that stopped arriving.",
                    &self.bad_frames,
                ),
                (
                    "refused_connections_total",
                    "Connections refused at a connection limit (in all or per peer).",
                    &self.refused,
                ),
                (
                    "idle_closed_connections_total",
                    "Connections closed after idling (clients reconnect).",
                    &self.idle_closed,
                ),
                (
                    "unauthenticated_connections_total",
                    "Connections closed because the peer did not prove it holds the cluster secret.",
                    &self.unauthenticated,
                ),
                (
                    "made_way_connections_total",
                    "Connections closed to make way for a new one at a limit: one yet to prove the \
                 cluster secret, or the one idle longest.",
                    &self.made_way,
                ),
                (
                    "handed_on_requests_total",
                    "Requests that had to wait (for room, for the stores) and were answered from a \
                 thread that may block rather than an event loop.",
                    &self.handed_on,
                ),
            ],
        );
    }

    fn count(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a handler did with a request, or the error that ends its connection.
pub type Handling = Result<Handled, TransferError>;

/// What a server does with each request.
pub trait Service: Send + Sync + 'static {
    /// Handles one request, `op` with metadata `meta`: consumes its payload and writes exactly
    /// one reply through `io`, or, where `io` may not block, hands it on unanswered. A
    /// `Protocol` error replies `MALFORMED_FRAME` and closes the connection.
    fn handle(&self, op: Opcode, meta: &[u8], io: &mut ServerIo<'_>) -> Handling;
    /// Largest payload a request may carry.
    fn max_data_len(&self) -> u64;
    /// Where the server counts what happens to connections (for metrics).
    fn connections(&self) -> &ConnCounters;
    /// Another protocol this port serves beside rbgctl's, told apart by a connection's first
    /// bytes (the master: Mooncake's RPC). `None`: other protocols are refused.
    fn guest(&self) -> Option<Arc<dyn Guest>> {
        None
    }
}

/// Another protocol on a port of rbgctl's: a connection whose first bytes are its frames is
/// served by it on a thread of its own (blocking reads, writes and waits), with the port's
/// service at hand to carry out what the requests ask.
pub trait Guest: Send + Sync + 'static {
    /// Whether a connection whose first bytes are `first` speaks this protocol.
    fn speaks(&self, first: &[u8]) -> bool;
    /// Serves the connection until it ends.
    fn serve(&self, service: &dyn Service, conn: GuestConn);
}

/// A connection handed to a guest protocol.
pub struct GuestConn {
    /// Blocking, with the port's idle timeout on reads and request timeout on writes.
    pub stream: TcpStream,
    pub peer: SocketAddr,
    /// Its bytes read so far.
    pub read: Vec<u8>,
    /// How long it may stay quiet between requests.
    pub idle_timeout: Duration,
    /// How long each read or write inside a request may wait for progress.
    pub request_timeout: Duration,
}

/// Most connections of guest protocols one server serves at once (a thread each).
pub const MAX_GUEST_CONNECTIONS: usize = 512;

/// What an elected master puts on its answers: its epoch (clients drop answers from an older
/// one), and the instant its leadership lease may run out, after which no answer may go out as
/// a success (`ha::lease::Leadership::check` makes one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub epoch: u64,
    pub until: std::time::Instant,
}

/// Where a request's answer goes.
pub(crate) enum Sink<'a> {
    /// Straight to the connection's socket (the threaded server).
    Stream(&'a mut FramedStream),
    /// Into a buffer the event loop sends (the evented server): requests carry no payload there.
    Buffer(&'a mut Vec<u8>),
}

/// Work a request hands on to a thread that may block: the rest of its answer, given the
/// request's view of its connection.
pub type Deferred = Box<dyn FnOnce(&mut ServerIo<'_>) -> Result<(), TransferError> + Send>;

/// How a handler left its request.
#[must_use]
pub enum Handled {
    /// Answered through its [`ServerIo`]: exactly one reply.
    Answered,
    /// Handed on, unanswered, to a thread that may block (only from one that may not).
    HandedOn(HandOn),
}

/// What a handler running where it must not block asks for instead of answering.
pub enum HandOn {
    /// Serve the whole request again on a thread that may block (nothing was done yet).
    Rerun,
    /// Finish the answer on such a thread (the request's work is done).
    Finish(Deferred),
}

/// A request's view of its connection.
pub struct ServerIo<'a> {
    sink: Sink<'a>,
    req: Header,
    /// When the request was read (an event loop's wake-up: one clock read for all it serves).
    arrived: Instant,
    replied: bool,
    /// An elected master's fence: its epoch goes on the reply, and a success past the fence's
    /// instant goes out as `NOT_LEADER` instead.
    fence: Option<Fence>,
    /// What the service keeps for this connection (a store's RDMA queue pair): dropped when
    /// the connection ends.
    attached: &'a mut Option<Box<dyn std::any::Any + Send>>,
    /// Whether the handler may block this thread (wait for room, for the stores).
    may_block: bool,
}

impl<'a> ServerIo<'a> {
    pub(crate) fn new(
        sink: Sink<'a>,
        req: Header,
        attached: &'a mut Option<Box<dyn std::any::Any + Send>>,
        may_block: bool,
        arrived: Instant,
    ) -> ServerIo<'a> {
        ServerIo {
            sink,
            req,
            arrived,
            replied: false,
            fence: None,
            attached,
            may_block,
        }
    }
}

impl ServerIo<'_> {
    /// When the request arrived: read once per wake-up of an event loop, however many
    /// requests it serves, so a handler need not read the clock to start.
    pub fn arrived(&self) -> Instant {
        self.arrived
    }

    /// Payload bytes the request carries.
    pub fn data_len(&self) -> u64 {
        self.req.data_len
    }

    /// Payload bytes of this request not read yet.
    fn pending_data(&self) -> u64 {
        match &self.sink {
            Sink::Stream(s) => s.pending_data(),
            Sink::Buffer(_) => 0,
        }
    }

    fn no_payload(what: &str) -> TransferError {
        TransferError::Protocol(format!("{what}: this server's requests carry no payload"))
    }

    /// Reads the next `dst.len()` bytes of the request's payload into `dst`.
    pub fn read_data_into(&mut self, dst: &mut [u8]) -> Result<(), TransferError> {
        match &mut self.sink {
            Sink::Stream(s) => s.read_data_into(dst),
            Sink::Buffer(_) if dst.is_empty() => Ok(()),
            Sink::Buffer(_) => Err(Self::no_payload("a payload read")),
        }
    }

    /// Reads into memory this thread does not read next (a segment) and answers the CRC-32C of
    /// what came, computed in the same pass (`FramedStream::read_data_streamed_crc`).
    pub fn read_data_streamed_crc(&mut self, dst: &mut [u8]) -> Result<u32, TransferError> {
        match &mut self.sink {
            Sink::Stream(s) => s.read_data_streamed_crc(dst),
            Sink::Buffer(_) if dst.is_empty() => Ok(0),
            Sink::Buffer(_) => Err(Self::no_payload("a payload read")),
        }
    }

    /// Reads what is left of the request's payload and drops it (before an error answer, so
    /// the connection stays in step).
    pub fn discard_data(&mut self) -> Result<(), TransferError> {
        match &mut self.sink {
            Sink::Stream(s) => s.discard_data(),
            Sink::Buffer(_) => Ok(()),
        }
    }

    /// What the service keeps for this connection, if it is a `T`.
    pub fn attached<T: 'static>(&self) -> Option<&T> {
        self.attached.as_ref()?.downcast_ref()
    }

    /// Keeps `thing` until the connection ends instead of what was kept; answers that (for the
    /// caller to drop where it may).
    pub fn replace_attached(
        &mut self,
        thing: Box<dyn std::any::Any + Send>,
    ) -> Option<Box<dyn std::any::Any + Send>> {
        self.attached.replace(thing)
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

    /// Whether the handler may block this thread: false on an event loop's thread, where a
    /// wait would hold up every connection the loop serves. There, a request that must wait
    /// returns [`HandOn::Rerun`] (before doing anything) or [`HandOn::Finish`] (the rest of its
    /// answer).
    pub fn may_block(&self) -> bool {
        self.may_block
    }

    /// Whether a handler's result is sound: answered once, or handed on unanswered from a
    /// thread that may not block. The reason when it is not.
    fn check(&self, handled: &Handled) -> Result<(), &'static str> {
        match handled {
            Handled::Answered if !self.replied => Err("the handler left the request unanswered"),
            Handled::HandedOn(_) if self.replied => {
                Err("a request handed on after it was answered")
            }
            Handled::HandedOn(_) if self.may_block => {
                Err("a request handed on from a thread that may block")
            }
            _ => Ok(()),
        }
    }

    /// Sends the reply: status, meta, and a payload written straight from `data`.
    pub fn reply(
        &mut self,
        status: Status,
        meta: &[u8],
        data: &[&[u8]],
    ) -> Result<(), TransferError> {
        let epoch = match self.begin_reply()? {
            Ok(epoch) => epoch,
            Err(late) => return late.send(self),
        };
        let data_len = data.iter().map(|d| d.len() as u64).sum();
        let Some(epoch) = epoch else {
            let header = Header::response(&self.req, status, meta.len(), data_len);
            return self.send(&header, &[meta], data);
        };
        let mut header = Header::response(&self.req, status, epoch.len() + meta.len(), data_len);
        header.flags |= super::frame::FLAG_EPOCH;
        self.send(&header, &[&epoch, meta], data)
    }

    /// Marks the request answered. Answers the epoch its answer carries (an elected
    /// master's), or, where the fence's lease ran out (the last moment before the answer
    /// leaves: a leader whose lease may have run out meanwhile acknowledges nothing), the
    /// answer that goes out instead.
    #[allow(clippy::type_complexity)]
    fn begin_reply(&mut self) -> Result<Result<Option<[u8; 8]>, LateAnswer>, TransferError> {
        if self.replied {
            return Err(TransferError::Protocol(
                "second reply to one request".into(),
            ));
        }
        self.replied = true;
        Ok(match self.fence {
            None => Ok(None),
            Some(fence) if Instant::now() >= fence.until => {
                Err(LateAnswer(fence.epoch.to_le_bytes()))
            }
            Some(fence) => Ok(Some(fence.epoch.to_le_bytes())),
        })
    }

    fn send(
        &mut self,
        header: &Header,
        meta: &[&[u8]],
        data: &[&[u8]],
    ) -> Result<(), TransferError> {
        match &mut self.sink {
            Sink::Stream(s) if meta.len() == 1 => s.write_frame(header, meta[0], data),
            Sink::Stream(s) => s.write_frame(header, &meta.concat(), data),
            Sink::Buffer(b) => {
                b.extend_from_slice(&header.encode());
                meta.iter()
                    .chain(data)
                    .for_each(|piece| b.extend_from_slice(piece));
                Ok(())
            }
        }
    }

    /// An `OK` reply whose meta is `msg` encoded. Prefer [`ServerIo::answer`], which checks the
    /// pairing of request and reply.
    pub fn ok<T: Wire>(&mut self, msg: &T) -> Result<(), TransferError> {
        if let Sink::Buffer(_) = self.sink {
            return self.ok_in_place(msg);
        }
        // Encoded into this thread's scratch buffer, not a new one per answer.
        let mut e = crate::transfer::codec::Encoder {
            buf: ANSWER_SCRATCH.take(),
        };
        e.buf.clear();
        msg.encode(&mut e);
        let sent = self.reply(Status::Ok, &e.buf, &[]);
        if e.buf.capacity() <= MAX_KEPT_SCRATCH {
            ANSWER_SCRATCH.set(e.buf);
        }
        sent
    }

    /// `ok` into the event loop's buffer: the meta is encoded where it goes, after room for
    /// its header, which is written once the meta's length is known.
    fn ok_in_place<T: Wire>(&mut self, msg: &T) -> Result<(), TransferError> {
        let epoch = match self.begin_reply()? {
            Ok(epoch) => epoch,
            Err(late) => return late.send(self),
        };
        let Sink::Buffer(out) = &mut self.sink else {
            unreachable!("ok_in_place is for the evented server's buffer");
        };
        let start = out.len();
        let epoch_len = epoch.map_or(0, |e| e.len());
        out.resize(start + HEADER_LEN + epoch_len, 0);
        let mut e = crate::transfer::codec::Encoder {
            buf: std::mem::take(*out),
        };
        msg.encode(&mut e);
        **out = e.buf;
        let meta_len = out.len() - start - HEADER_LEN;
        let mut header = Header::response(&self.req, Status::Ok, meta_len, 0);
        if let Some(epoch) = epoch {
            header.flags |= super::frame::FLAG_EPOCH;
            out[start + HEADER_LEN..][..epoch_len].copy_from_slice(&epoch);
        }
        out[start..start + HEADER_LEN].copy_from_slice(&header.encode());
        Ok(())
    }

    /// Answers the request of `R` with its reply (the pairing `transfer::rpc` declares).
    pub fn answer<R: crate::transfer::rpc::Rpc>(
        &mut self,
        reply: &R::Reply,
    ) -> Result<(), TransferError> {
        debug_assert_eq!(
            self.req.opcode,
            R::OPCODE as u8,
            "a request answered with another operation's reply"
        );
        self.ok(reply)
    }

    /// An error reply; the message travels as the meta (UTF-8 text).
    pub fn error(&mut self, status: Status, message: &str) -> Result<(), TransferError> {
        self.reply(status, message.as_bytes(), &[])
    }
}

/// The answer of a leader (of this epoch) whose lease ran out before it could answer.
struct LateAnswer([u8; 8]);

impl LateAnswer {
    fn send(self, io: &mut ServerIo<'_>) -> Result<(), TransferError> {
        let msg = "this master's leadership lease ran out before it could answer; what the \
                   request did may or may not stand: ask the leader";
        let mut header = Header::response(&io.req, Status::NotLeader, 8 + msg.len(), 0);
        header.flags |= super::frame::FLAG_EPOCH;
        io.send(&header, &[&self.0, msg.as_bytes()], &[])
    }
}

thread_local! {
    /// Where [`ServerIo::ok`] encodes an answer's meta before it is sent.
    static ANSWER_SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest scratch buffer a thread keeps between answers (a larger one, for a rare big
/// answer, is freed).
const MAX_KEPT_SCRATCH: usize = 64 << 10;

/// A server's limits and settings: connections in all and per peer, idle and request
/// timeouts, spin-polling, the cluster secret and TCP keepalive.
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
    /// TCP keepalive on admitted connections: the kernel probes one idle this long, and ends
    /// it when its peer vanished (`crate::transfer::keep_alive`). The evented server keeps a
    /// connection the service keeps something for (a bound client) past `idle_timeout`: this
    /// is what ends it once its peer is gone.
    pub keepalive: Option<Duration>,
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

/// Log budgets shared by a server's connections.
struct ConnLogs {
    bad_frames: LogBudget,
    stalls: LogBudget,
}

impl ConnLogs {
    fn new() -> ConnLogs {
        ConnLogs {
            bad_frames: LogBudget::new(Duration::from_secs(10)),
            stalls: LogBudget::new(Duration::from_secs(10)),
        }
    }
}

/// A running server; dropping the handle does not stop it, `stop` does.
pub struct ServerHandle {
    pub addr: SocketAddr,
    shutdown: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    /// The evented server's loops: woken to see the stop, then joined.
    loops: Vec<(Arc<epoll::Waker>, JoinHandle<()>)>,
}

impl ServerHandle {
    /// Stops accepting. The threaded server's open connections finish when their peers close
    /// them; the evented server's loops answer what they have read and close theirs.
    pub fn stop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (waker, thread) in self.loops.drain(..) {
            let _ = waker.wake();
            let _ = thread.join();
        }
    }
}

/// Serves `listener` with a thread per connection.
pub fn spawn(
    listener: TcpListener,
    service: Arc<dyn Service>,
    opts: ServerOptions,
) -> std::io::Result<ServerHandle> {
    let logs = Arc::new(ConnLogs::new());
    let conn_opts = opts.clone();
    let counters = ServiceCounters(service.clone());
    spawn_threaded(listener, opts, counters, move |stream, peer, slot| {
        threaded::serve_connection(stream, peer, service.as_ref(), &conn_opts, &logs, &slot);
    })
}

/// A service's connection counters, owned (for the accept thread).
struct ServiceCounters(Arc<dyn Service>);

impl std::ops::Deref for ServiceCounters {
    type Target = ConnCounters;
    fn deref(&self) -> &ConnCounters {
        self.0.connections()
    }
}

/// The accept thread of a thread-per-connection port: admits connections under `opts`
/// (counted in `counters`) and hands each to `serve` on a thread of its own.
fn spawn_threaded(
    listener: TcpListener,
    opts: ServerOptions,
    counters: impl std::ops::Deref<Target = ConnCounters> + Send + 'static,
    serve: impl Fn(TcpStream, SocketAddr, admission::Slot) + Clone + Send + 'static,
) -> std::io::Result<ServerHandle> {
    let role = opts.role;
    let admit = move |stream: TcpStream, peer: SocketAddr, slot: admission::Slot| {
        let serve = serve.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{role}-conn"))
            .stack_size(512 * 1024)
            .spawn(move || serve(stream, peer, slot));
        // A failed spawn dropped the closure, and with it the slot.
        if let Err(e) = spawned {
            tracing::error!(role, error = %e, "cannot start a connection thread");
        }
    };
    let shutdown = Arc::new(AtomicBool::new(false));
    accepting(listener, opts, counters, shutdown, Vec::new(), admit)
}

/// Starts a port's accept thread: it admits connections under `opts` (counted in `counters`)
/// and gives each to `admit` until `shutdown` is set. The handle stops it and the event
/// `loops` the connections go to (a waker and thread each; none for threads per connection),
/// which are stopped at once if the thread cannot start.
fn accepting(
    listener: TcpListener,
    opts: ServerOptions,
    counters: impl std::ops::Deref<Target = ConnCounters> + Send + 'static,
    shutdown: Arc<AtomicBool>,
    loops: Vec<(Arc<epoll::Waker>, JoinHandle<()>)>,
    admit: impl FnMut(TcpStream, SocketAddr, admission::Slot) + Send + 'static,
) -> std::io::Result<ServerHandle> {
    let mut handle = ServerHandle {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        shutdown: shutdown.clone(),
        accept: None,
        loops,
    };
    let started = listener.local_addr().and_then(|addr| {
        handle.addr = addr;
        std::thread::Builder::new()
            .name(format!("{}-accept", opts.role))
            .spawn(move || admission::accept_loop(listener, &counters, &opts, &shutdown, admit))
    });
    match started {
        Ok(accept) => {
            handle.accept = Some(accept);
            Ok(handle)
        }
        Err(e) => {
            handle.stop();
            Err(e)
        }
    }
}

/// A connection of another protocol admitted on a port with rbgctl's limits
/// (`spawn_foreign`): its place is held while this lives.
pub struct Place(admission::Slot);

impl Place {
    /// The connection is in use (`busy`: a request is in hand) as of now: the one idle longest
    /// is the one that makes way at a limit.
    pub fn active(&self, busy: bool) {
        self.0.active(Instant::now(), busy);
    }
}

/// Serves `listener` for a protocol that is not rbgctl's (Mooncake's Transfer Engine and its
/// handshake on a store) under the same admission as rbgctl's ports: the limits in all and per
/// address of `opts`, the connection idle longest making way at a limit, each admitted one
/// counted in `counters` and handed to `serve` on a thread of its own. A refused connection is
/// closed (its peer reads rbgctl's refusal, or nothing). The protocol carries no secret:
/// `opts.auth` is ignored.
pub fn spawn_foreign(
    listener: TcpListener,
    opts: ServerOptions,
    counters: Arc<ConnCounters>,
    serve: impl Fn(TcpStream, SocketAddr, Place) + Clone + Send + 'static,
) -> std::io::Result<ServerHandle> {
    let opts = ServerOptions { auth: None, ..opts };
    spawn_threaded(listener, opts, counters, move |stream, peer, slot| {
        serve(stream, peer, Place(slot))
    })
}

/// One `recv` system call on a non-blocking socket (std's and mio's reads go through libc's
/// wrapper, which marks a cancellation point around each call: twice the instructions of the
/// call itself).
pub fn recv_some(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    Ok(rustix::net::recv(stream, buf, rustix::net::RecvFlags::empty())?.0)
}

/// One `send` system call (as `recv_some`); a peer that closed is an error, not a signal.
pub fn send_some(stream: &TcpStream, bytes: &[u8]) -> std::io::Result<usize> {
    Ok(rustix::net::send(
        stream,
        bytes,
        rustix::net::SendFlags::NOSIGNAL,
    )?)
}

/// Serves `listener` with `threads` event loops (at least one) for a service whose requests
/// carry no payload (`Service::max_data_len` 0).
pub fn spawn_evented(
    listener: TcpListener,
    service: Arc<dyn Service>,
    opts: ServerOptions,
    threads: usize,
) -> std::io::Result<ServerHandle> {
    if service.max_data_len() != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the evented server serves requests without payload only",
        ));
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    let (loops, handles) =
        evented::Loops::start(service.clone(), &opts, threads.max(1), &shutdown)?;
    let mut next = 0usize;
    let admit = move |stream: TcpStream, peer: SocketAddr, slot: admission::Slot| {
        loops.admit(next, stream, peer, slot);
        next = next.wrapping_add(1);
    };
    let counters = ServiceCounters(service);
    accepting(listener, opts, counters, shutdown, handles, admit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::frame::FLAG_EPOCH;
    use crate::transfer::message::PingResp;

    #[test]
    fn a_handler_answers_once_or_hands_on_unanswered_from_where_it_may_not_block() {
        let req = Header::request(Opcode::Ping, 9, 0, 0);
        let check = |may_block: bool, reply: bool, handled: Handled| {
            let (mut out, mut attached) = (Vec::new(), None);
            let sink = Sink::Buffer(&mut out);
            let mut io = ServerIo::new(sink, req, &mut attached, may_block, Instant::now());
            if reply {
                io.reply(Status::Ok, b"", &[]).unwrap();
            }
            io.check(&handled)
        };
        let rerun = || Handled::HandedOn(HandOn::Rerun);
        assert_eq!(check(false, true, Handled::Answered), Ok(()));
        assert_eq!(check(false, false, rerun()), Ok(()));
        assert_eq!(check(true, true, Handled::Answered), Ok(()));
        let unanswered = Err("the handler left the request unanswered");
        assert_eq!(check(false, false, Handled::Answered), unanswered);
        let after = Err("a request handed on after it was answered");
        assert_eq!(check(false, true, rerun()), after);
        let from_blocking = Err("a request handed on from a thread that may block");
        assert_eq!(check(true, false, rerun()), from_blocking);
    }

    /// The frame `answer` writes into an event loop's buffer, for request 9.
    fn buffered(fence: Option<Fence>, answer: impl FnOnce(&mut ServerIo<'_>)) -> (Header, Vec<u8>) {
        let req = Header::request(Opcode::Ping, 9, 0, 0);
        let (mut out, mut attached) = (b"earlier answer".to_vec(), None);
        let mut io = ServerIo::new(
            Sink::Buffer(&mut out),
            req,
            &mut attached,
            false,
            Instant::now(),
        );
        if let Some(fence) = fence {
            io.fence(fence);
        }
        answer(&mut io);
        assert!(
            io.reply(Status::Ok, b"", &[]).is_err(),
            "a second reply is refused"
        );
        let frame = out.split_off(b"earlier answer".len());
        assert_eq!(out, b"earlier answer", "what was in the buffer stays");
        let header = Header::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(header.meta_len as usize, frame.len() - HEADER_LEN);
        (header, frame[HEADER_LEN..].to_vec())
    }

    #[test]
    fn an_answer_encoded_in_place_is_the_frame_a_reply_sends() {
        let msg = PingResp { need_remount: true };
        let meta = msg.to_meta();
        let until = Instant::now() + Duration::from_secs(60);
        for fence in [None, Some(Fence { epoch: 7, until })] {
            let in_place = buffered(fence, |io| io.ok(&msg).unwrap());
            let replied = buffered(fence, |io| io.reply(Status::Ok, &meta, &[]).unwrap());
            assert_eq!(in_place, replied);
            let (header, got) = in_place;
            assert_eq!((header.request_id, header.status), (9, Status::Ok as u16));
            match fence {
                None => assert_eq!((header.flags & FLAG_EPOCH, got), (0, meta.clone())),
                Some(_) => {
                    assert_ne!(header.flags & FLAG_EPOCH, 0);
                    assert_eq!(got, [&7u64.to_le_bytes()[..], &meta].concat());
                }
            }
        }
    }

    #[test]
    fn a_leader_whose_lease_ran_out_answers_not_leader_with_its_epoch() {
        let fence = Fence {
            epoch: 3,
            until: Instant::now(),
        };
        let msg = PingResp {
            need_remount: false,
        };
        for (header, meta) in [
            buffered(Some(fence), |io| io.ok(&msg).unwrap()),
            buffered(Some(fence), |io| io.reply(Status::Ok, b"x", &[]).unwrap()),
        ] {
            assert_eq!(header.status, Status::NotLeader as u16);
            assert_ne!(header.flags & FLAG_EPOCH, 0);
            assert_eq!(meta[..8], 3u64.to_le_bytes());
            assert!(String::from_utf8_lossy(&meta[8..]).contains("lease ran out"));
        }
    }
}
