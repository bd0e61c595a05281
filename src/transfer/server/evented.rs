//! The evented server: a few loop threads, each waiting on its connections at once (epoll,
//! `super::epoll`), serving every whole request frame a read brings and answering them with one
//! write. A connection costs its socket and a small record, not a thread, so tens of thousands
//! of mostly idle clients cost little; a busy loop serves several connections per wake-up.
//!
//! Nothing on a loop thread may block. A handler that must wait asks, through its `ServerIo`,
//! to be served again on a thread that may (before it did anything) or to finish there (after):
//! the request then goes to a small pool of such threads, and its connection reads nothing more
//! until the answer is back, so that answers keep their order. The pool grows with the waits
//! (to `BLOCKING_THREADS`) and its threads end after `BLOCKING_IDLE` without work.
//!
//! A loop that just served something may poll for `ServerOptions::spin` before it sleeps
//! (the master's `poll_spin_us`, 0 by default: with many clients a loop is woken often
//! enough, and a spin would keep it busy between the pings of idle ones).
//!
//! Timeouts are checked by a sweep of each loop's connections a few times per
//! `request_timeout` (at most once a second): an idle loop wakes for nothing else.

use super::admission::Slot;
use super::epoll::{Epoll, Events, Waker, EVENTS};
use super::handshake::{bad_header_answer, check_request, unknown_opcode, Handshake, Step};
use super::{
    recv_some, send_some, ConnCounters, ConnLogs, Fence, Guest, GuestConn, HandOn, Handled,
    ServerIo, ServerOptions, Service, Sink, MAX_GUEST_CONNECTIONS,
};
use crate::transfer::frame::{Header, Opcode, Status, HEADER_LEN};
use crate::transfer::stream::meta_too_long;
use crate::transfer::TransferError;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The token of a loop's waker (connections are numbered from 0).
const WAKE: u64 = u64::MAX;
/// Bytes read from a socket at once, into the loop's own buffer.
const READ_LEN: usize = 64 * 1024;
/// A buffer kept between uses above this size is given back.
const KEEP_BUFFER: usize = 256 * 1024;
/// Most threads the requests that wait run on at once; past it they queue.
const BLOCKING_THREADS: usize = 64;
/// A waiting-request thread with nothing to do for this long ends.
const BLOCKING_IDLE: Duration = Duration::from_secs(30);

/// What reaches a loop from other threads.
enum Inbox {
    /// A connection the accept loop admitted.
    Admitted(TcpStream, SocketAddr, Slot),
    /// A request that went on to a thread that may block, answered: the answer's bytes, and
    /// whether the connection closes after them.
    Answered {
        token: usize,
        generation: u64,
        out: Vec<u8>,
        close: bool,
    },
}

/// The way into one loop.
#[derive(Clone)]
struct Door {
    inbox: mpsc::Sender<Inbox>,
    waker: Arc<Waker>,
}

impl Door {
    fn send(&self, msg: Inbox) {
        if self.inbox.send(msg).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

/// What a server's loops and its waiting-request threads share.
struct Shared {
    service: Arc<dyn Service>,
    /// The other protocol the port serves, if any (`Service::guest`).
    guest: Option<Arc<dyn Guest>>,
    /// Connections a guest protocol's threads serve now.
    guests: std::sync::atomic::AtomicUsize,
    opts: ServerOptions,
    logs: ConnLogs,
    blocking: Arc<Blocking>,
    shutdown: Arc<AtomicBool>,
}

impl Shared {
    fn counters(&self) -> &ConnCounters {
        self.service.connections()
    }

    /// Counts and (within the log budget) logs a connection closed for a bad frame.
    /// A connection that speaks another protocol: closed, with a line saying what it looks
    /// like and what to do.
    fn foreign(&self, peer: SocketAddr, foreign: crate::transfer::frame::Foreign) {
        ConnCounters::count(&self.counters().bad_frames);
        if let Some(n) = self.logs.bad_frames.spend(Instant::now()) {
            let role = self.opts.role;
            tracing::warn!(role, %peer, protocol = ?foreign, bad_frames = n,
                "closing a connection that speaks another protocol: {}", foreign.advice());
        }
    }

    fn bad_frame(&self, peer: SocketAddr, reason: &dyn std::fmt::Display) {
        ConnCounters::count(&self.counters().bad_frames);
        if let Some(n) = self.logs.bad_frames.spend(Instant::now()) {
            let role = self.opts.role;
            tracing::warn!(role, %peer, %reason, bad_frames = n, "closing connection: bad frame");
        }
    }
}

/// One connection's count among those the guest protocol serves; given back when dropped.
struct GuestPlace {
    shared: Arc<Shared>,
    /// How many there are with this one.
    held: usize,
}

impl GuestPlace {
    fn take(shared: &Arc<Shared>) -> GuestPlace {
        GuestPlace {
            held: shared.guests.fetch_add(1, Ordering::SeqCst) + 1,
            shared: shared.clone(),
        }
    }
}

impl Drop for GuestPlace {
    fn drop(&mut self) {
        self.shared.guests.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The accept loop's side of a server's loops: where each admitted connection goes.
pub(super) struct Loops {
    doors: Vec<Door>,
}

impl Loops {
    /// Starts `threads` loops; answers the way into them and, for the server's handle, each
    /// one's waker and thread.
    #[allow(clippy::type_complexity)]
    pub(super) fn start(
        service: Arc<dyn Service>,
        opts: &ServerOptions,
        threads: usize,
        shutdown: &Arc<AtomicBool>,
    ) -> std::io::Result<(Loops, Vec<(Arc<Waker>, JoinHandle<()>)>)> {
        let shared = Arc::new(Shared {
            guest: service.guest(),
            guests: Default::default(),
            service,
            opts: opts.clone(),
            logs: ConnLogs::new(),
            blocking: Arc::new(Blocking::new(opts.role)),
            shutdown: shutdown.clone(),
        });
        let mut doors = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let poll = Epoll::new()?;
            let waker = Arc::new(Waker::new(&poll, WAKE)?);
            let (tx, rx) = mpsc::channel();
            let door = Door {
                inbox: tx,
                waker: waker.clone(),
            };
            let event_loop = EventLoop::new(poll, waker.clone(), rx, door.clone(), shared.clone());
            let thread = std::thread::Builder::new()
                .name(format!("{}-loop-{i}", opts.role))
                .spawn(move || event_loop.run())?;
            doors.push(door);
            handles.push((waker, thread));
        }
        Ok((Loops { doors }, handles))
    }

    /// Hands an admitted connection to loop `n` (modulo their number).
    pub(super) fn admit(&self, n: usize, stream: TcpStream, peer: SocketAddr, slot: Slot) {
        self.doors[n % self.doors.len()].send(Inbox::Admitted(stream, peer, slot));
    }
}

/// One connection, as its loop keeps it.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    /// Its place at the port, where the accept loop reads how active it is.
    slot: Slot,
    /// Tells this connection's answers from a closed one's that had the same token.
    generation: u64,
    handshake: Handshake,
    attached: Option<Box<dyn std::any::Any + Send>>,
    /// Bytes read and not served yet: part of a frame, or the frames behind a request that is
    /// on a waiting-request thread.
    unread: Vec<u8>,
    /// Answer bytes the socket has not taken yet.
    unsent: Vec<u8>,
    /// A request of this connection is on a waiting-request thread.
    busy: bool,
    /// Close once what is unsent is sent.
    closing: bool,
    /// Registered for writability too (while `unsent` waits).
    writable: bool,
    opened: Instant,
    /// When bytes last came in or went out.
    active: Instant,
    /// At least one request began.
    served: bool,
    /// `unread` holds frames not tried since a request waited.
    backlog: bool,
    /// Its first bytes are the guest protocol's: it goes to a thread of the guest's.
    guest: bool,
}

/// What serving one frame leaves the connection to do.
enum Next {
    Serve,
    Close,
    /// The request goes on to a waiting-request thread, with what it asked for there, the
    /// fence its answer carries, and its operation.
    HandOn(HandOn, Option<Fence>, Opcode),
}

struct EventLoop {
    poll: Epoll,
    waker: Arc<Waker>,
    inbox: mpsc::Receiver<Inbox>,
    door: Door,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    generations: u64,
    /// Where reads land.
    scratch: Box<[u8]>,
    /// Where one connection's answers are built before they are written.
    out: Vec<u8>,
    now: Instant,
    sweep_every: Duration,
    next_sweep: Instant,
}

impl EventLoop {
    fn new(
        poll: Epoll,
        waker: Arc<Waker>,
        inbox: mpsc::Receiver<Inbox>,
        door: Door,
        shared: Arc<Shared>,
    ) -> EventLoop {
        let shortest = shared.opts.request_timeout.min(shared.opts.idle_timeout);
        let sweep_every = (shortest / 8).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let now = Instant::now();
        EventLoop {
            poll,
            waker,
            inbox,
            door,
            shared,
            conns: Vec::new(),
            free: Vec::new(),
            generations: 0,
            scratch: vec![0u8; READ_LEN].into_boxed_slice(),
            out: Vec::with_capacity(4096),
            now,
            sweep_every,
            next_sweep: now + sweep_every,
        }
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS);
        let spin = self.shared.opts.spin;
        let mut spin_until = self.now;
        loop {
            // The clock as this wake-up read it: one clock read per turn. A loop that was just
            // woken by events waits at most a sweep period without working out how long until
            // the next sweep (a sweep due runs after any wake-up; so the first wait after a
            // busy spell may end up to a period past it); an idle one waits just until then.
            let now = self.now;
            let wait = if now < spin_until {
                Duration::ZERO
            } else if !events.is_empty() {
                self.sweep_every
            } else {
                self.next_sweep.saturating_duration_since(now)
            };
            if let Err(e) = self.poll.wait(&mut events, wait) {
                if e.kind() != ErrorKind::Interrupted {
                    tracing::error!(role = self.shared.opts.role, error = %e, "event loop cannot wait");
                    std::thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
            self.now = Instant::now();
            if !spin.is_zero() && !events.is_empty() {
                spin_until = self.now + spin;
            }
            for event in &events {
                match event.data.u64() {
                    WAKE => self.take_inbox(),
                    t => self.drive(t as usize),
                }
            }
            if self.shared.shutdown.load(Ordering::SeqCst) {
                break;
            }
            if self.now >= self.next_sweep {
                self.sweep();
                self.next_sweep = self.now + self.sweep_every;
            }
        }
        // Stopping: what was answered goes out if the socket takes it now; then all close.
        for t in 0..self.conns.len() {
            if let Some(conn) = self.conns[t].as_mut() {
                let _ = write_some(&conn.stream, &conn.unsent);
            }
            self.close(t);
        }
    }

    fn take_inbox(&mut self) {
        self.waker.reset();
        while let Ok(msg) = self.inbox.try_recv() {
            match msg {
                Inbox::Admitted(stream, peer, slot) => self.admit(stream, peer, slot),
                Inbox::Answered {
                    token,
                    generation,
                    out,
                    close,
                } => {
                    let Some(conn) = self.conns.get_mut(token).and_then(Option::as_mut) else {
                        continue;
                    };
                    if conn.generation != generation {
                        continue;
                    }
                    conn.busy = false;
                    conn.closing |= close;
                    conn.active = self.now;
                    self.out = out;
                    match send_out(&self.poll, token, conn, &mut self.out, self.now) {
                        Flow::Go => self.drive(token),
                        Flow::Wait => {}
                        Flow::Close => self.close(token),
                    }
                }
            }
        }
    }

    fn admit(&mut self, stream: TcpStream, peer: SocketAddr, slot: Slot) {
        let role = self.shared.opts.role;
        let set_up = stream
            .set_nonblocking(true)
            .and_then(|()| stream.set_nodelay(true));
        if let Err(e) = set_up {
            tracing::warn!(role, %peer, error = %e, "cannot set up connection");
            return;
        }
        let token = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = self.poll.watch(&stream, token as u64, false) {
            tracing::warn!(role, %peer, error = %e, "cannot watch connection");
            self.free.push(token);
            return;
        }
        self.generations += 1;
        self.conns[token] = Some(Conn {
            stream,
            peer,
            slot,
            generation: self.generations,
            handshake: Handshake::new(self.shared.opts.auth.clone()),
            attached: None,
            unread: Vec::new(),
            unsent: Vec::new(),
            busy: false,
            closing: false,
            writable: false,
            opened: self.now,
            active: self.now,
            served: false,
            backlog: false,
            guest: false,
        });
        tracing::debug!(role, %peer, "connection opened");
        // Bytes that came before the registration are reported by it (epoll looks once).
    }

    /// Gives a connection of the guest protocol to a thread of its own, with the bytes it
    /// sent so far; its place at the port is held until that thread ends.
    fn hand_to_guest(&mut self, token: usize) {
        let Some(conn) = self.conns[token].take() else {
            return;
        };
        self.free.push(token);
        let _ = self.poll.unwatch(&conn.stream);
        let role = self.shared.opts.role;
        let Some(guest) = self.shared.guest.clone() else {
            return;
        };
        let place = GuestPlace::take(&self.shared);
        if place.held > MAX_GUEST_CONNECTIONS {
            tracing::warn!(role, peer = %conn.peer, limit = MAX_GUEST_CONNECTIONS,
                "closing a connection of the guest protocol: too many at once");
            return;
        }
        let idle = self.shared.opts.idle_timeout;
        let set_up = conn
            .stream
            .set_nonblocking(false)
            .and_then(|()| conn.stream.set_read_timeout(Some(idle)))
            .and_then(|()| {
                conn.stream
                    .set_write_timeout(Some(self.shared.opts.request_timeout))
            });
        if let Err(e) = set_up {
            tracing::warn!(role, peer = %conn.peer, error = %e, "cannot set up a guest connection");
            return;
        }
        let Conn {
            stream,
            peer,
            slot,
            unread,
            ..
        } = conn;
        let service = self.shared.service.clone();
        let handed = GuestConn {
            stream,
            peer,
            read: unread,
            idle_timeout: idle,
            request_timeout: self.shared.opts.request_timeout,
        };
        let spawned = std::thread::Builder::new()
            .name(format!("{role}-guest"))
            .spawn(move || {
                let _held = (slot, place);
                guest.serve(service.as_ref(), handed);
            });
        if let Err(e) = spawned {
            tracing::warn!(role, %peer, error = %e, "cannot start a thread for a guest connection");
        }
    }

    fn close(&mut self, token: usize) {
        if let Some(conn) = self.conns[token].take() {
            let _ = self.poll.unwatch(&conn.stream);
            tracing::debug!(role = self.shared.opts.role, peer = %conn.peer, "connection closed");
            self.free.push(token);
        }
    }

    /// Does all a connection can do now: sends what waits, serves the frames it has, reads
    /// and serves until the socket has nothing more, or closes it.
    fn drive(&mut self, token: usize) {
        let Some(conn) = self.conns.get_mut(token).and_then(Option::as_mut) else {
            return;
        };
        // With nothing unsent there is nothing to settle: every write settled its connection
        // (a closing one closed, the watch for room follows what waits).
        if !conn.unsent.is_empty() && flush(&self.poll, token, conn, self.now) == Flow::Close {
            return self.close(token);
        }
        loop {
            if conn.busy || conn.closing || !conn.unsent.is_empty() {
                return;
            }
            // A short read took all the socket had: epoll reports the next bytes that come
            // (each arrival is an edge), so no read is spent learning that it has no more.
            let mut drained = false;
            if conn.backlog {
                // Frames that came behind a request that waited.
                conn.backlog = false;
                conn.active = self.now;
                serve_buffered(&self.shared, &self.door, token, conn, &[], &mut self.out);
            } else {
                let n = match recv_some(&conn.stream, &mut self.scratch) {
                    Ok(0) => return self.close(token),
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let role = self.shared.opts.role;
                        tracing::debug!(role, peer = %conn.peer, error = %e, "connection ended");
                        return self.close(token);
                    }
                };
                conn.active = self.now;
                drained = n < self.scratch.len();
                let read = &self.scratch[..n];
                serve_buffered(&self.shared, &self.door, token, conn, read, &mut self.out);
                if conn.guest {
                    return self.hand_to_guest(token);
                }
                if conn.unread.is_empty() && conn.unread.capacity() > KEEP_BUFFER {
                    conn.unread = Vec::new();
                }
            }
            match send_out(&self.poll, token, conn, &mut self.out, self.now) {
                Flow::Close => return self.close(token),
                Flow::Wait => return,
                Flow::Go if drained => return,
                Flow::Go => {}
            }
        }
    }

    /// Closes the connections whose time is up: one that has not proven the secret within
    /// `request_timeout` of its connect, a request (or an answer) that stopped moving for
    /// `request_timeout`, a first request that did not begin within it, and an idle one after
    /// `idle_timeout` unless the service keeps something for it.
    fn sweep(&mut self) {
        let opts = &self.shared.opts;
        let (within, idle) = (opts.request_timeout, opts.idle_timeout);
        let mut ended = Vec::new();
        for (token, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            // What the accept loop reads to choose who makes way at a limit.
            conn.slot.active(conn.active, conn.busy);
            if conn.busy {
                continue;
            }
            let quiet = self.now.saturating_duration_since(conn.active);
            let why = if !conn.handshake.proven
                && self.now.saturating_duration_since(conn.opened) >= within
            {
                Some(Ended::Unproven)
            } else if (!conn.unread.is_empty() || !conn.unsent.is_empty()) && quiet >= within {
                Some(Ended::Stalled)
            } else if conn.attached.is_some() {
                // Kept for by the service (a bound client): TCP keepalive ends it once its
                // peer is gone.
                None
            } else if quiet >= if conn.served { idle } else { within } {
                // A first request has `request_timeout` to begin, later ones `idle_timeout`.
                Some(Ended::Idle)
            } else {
                None
            };
            if let Some(why) = why {
                ended.push((token, why));
            }
        }
        let shared = self.shared.clone();
        let counters = shared.counters();
        for (token, why) in ended {
            let Some(conn) = self.conns[token].as_ref() else {
                continue;
            };
            let (role, peer) = (self.shared.opts.role, conn.peer);
            match why {
                Ended::Unproven => {
                    ConnCounters::count(&counters.unauthenticated);
                    tracing::debug!(role, %peer, "closing a connection that did not prove the secret in time");
                }
                Ended::Stalled => {
                    ConnCounters::count(&counters.bad_frames);
                    if let Some(n) = self.shared.logs.stalls.spend(self.now) {
                        tracing::warn!(role, %peer, timeout = ?within, stalled = n,
                            "closing connection: a request stopped arriving");
                    }
                }
                Ended::Idle => {
                    tracing::debug!(role, %peer, first = !conn.served, "closing idle connection");
                    ConnCounters::count(&counters.idle_closed);
                }
            }
            self.close(token);
        }
    }
}

/// Why the sweep closes a connection.
enum Ended {
    Unproven,
    Stalled,
    Idle,
}

/// Writes what the socket takes now; answers how much.
fn write_some(stream: &TcpStream, bytes: &[u8]) -> std::io::Result<usize> {
    let mut at = 0;
    while at < bytes.len() {
        match send_some(stream, &bytes[at..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

/// What a connection can do after its answers were written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Go on: nothing waits to be sent.
    Go,
    /// Nothing more now: answers wait for the socket to take them.
    Wait,
    /// Close it: it ended, or it was closing and all its answers are out.
    Close,
}

/// Sends the answers built in `out` (leaving it empty): what the socket does not take waits
/// in the connection's `unsent`.
fn send_out(poll: &Epoll, token: usize, conn: &mut Conn, out: &mut Vec<u8>, now: Instant) -> Flow {
    if !out.is_empty() {
        if conn.unsent.is_empty() {
            match write_some(&conn.stream, out) {
                Ok(n) if n == out.len() => {}
                Ok(n) => conn.unsent.extend_from_slice(&out[n..]),
                Err(_) => {
                    out.clear();
                    return Flow::Close;
                }
            }
        } else {
            conn.unsent.extend_from_slice(out);
        }
        conn.active = now;
        out.clear();
        if out.capacity() > KEEP_BUFFER {
            *out = Vec::with_capacity(4096);
        }
    }
    settle_writes(poll, token, conn)
}

/// Sends what a connection's socket did not take before.
fn flush(poll: &Epoll, token: usize, conn: &mut Conn, now: Instant) -> Flow {
    if !conn.unsent.is_empty() {
        match write_some(&conn.stream, &conn.unsent) {
            Ok(0) => {}
            Ok(n) => {
                conn.unsent.drain(..n);
                conn.active = now;
            }
            Err(_) => return Flow::Close,
        }
    }
    settle_writes(poll, token, conn)
}

/// After a write: a closing connection whose answers are all out closes; one whose answers
/// wait is watched for room, and one whose answers are out no longer.
#[inline]
fn settle_writes(poll: &Epoll, token: usize, conn: &mut Conn) -> Flow {
    let waiting = !conn.unsent.is_empty();
    if !waiting && conn.closing {
        return Flow::Close;
    }
    if waiting != conn.writable {
        if poll.rewatch(&conn.stream, token as u64, waiting).is_err() {
            return Flow::Close;
        }
        conn.writable = waiting;
        if !waiting && conn.unsent.capacity() > KEEP_BUFFER {
            conn.unsent = Vec::new();
        }
    }
    if waiting {
        Flow::Wait
    } else {
        Flow::Go
    }
}

/// Serves the whole frames of what the connection had unread followed by `more` (served
/// straight from `more` when nothing was), keeping the rest unread.
fn serve_buffered(
    shared: &Arc<Shared>,
    door: &Door,
    token: usize,
    conn: &mut Conn,
    more: &[u8],
    out: &mut Vec<u8>,
) {
    if conn.unread.is_empty() {
        let used = serve_frames(shared, door, token, conn, more, out);
        conn.unread.extend_from_slice(&more[used..]);
        return;
    }
    let mut unread = std::mem::take(&mut conn.unread);
    unread.extend_from_slice(more);
    let used = serve_frames(shared, door, token, conn, &unread, out);
    unread.drain(..used);
    conn.unread = unread;
}

/// Serves the whole frames at the start of `data`, their answers going to `out`, until one
/// closes the connection or goes on to a waiting-request thread; answers the bytes they took.
fn serve_frames(
    shared: &Arc<Shared>,
    door: &Door,
    token: usize,
    conn: &mut Conn,
    data: &[u8],
    out: &mut Vec<u8>,
) -> usize {
    let mut at = 0;
    // Another protocol's client (Mooncake's, a browser, TLS) is told at once, from its first
    // bytes, rather than left waiting for the rest of a header that never comes.
    if !conn.served {
        // The port's guest protocol (the master's: Mooncake's RPC) goes to a thread of its own.
        if shared.guest.as_ref().is_some_and(|g| g.speaks(data)) {
            conn.guest = true;
            return 0;
        }
        // Bytes of no protocol known are answered below as a bad frame, as ever.
        if let Some(foreign) = crate::transfer::frame::foreign_protocol(data) {
            shared.foreign(conn.peer, foreign);
            if foreign == crate::transfer::frame::Foreign::Http {
                let body = foreign.advice();
                out.extend_from_slice(
                    format!(
                        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
            conn.closing = true;
            return data.len();
        }
    }
    while !conn.busy && !conn.closing {
        let rest = &data[at..];
        let Some(raw) = rest.first_chunk::<HEADER_LEN>() else {
            break;
        };
        let limit = conn.handshake.meta_limit();
        let req = match Header::decode(raw) {
            Ok(h) if h.meta_len > limit => Err(meta_too_long(h.meta_len, limit)),
            other => other,
        };
        let req = match req {
            Ok(req) => req,
            Err(e) => {
                // Answered as far as its bytes go, then closed.
                shared.bad_frame(conn.peer, &e);
                let reason = e.to_string();
                push_frame(out, &bad_header_answer(raw, &reason), reason.as_bytes());
                conn.closing = true;
                break;
            }
        };
        let end = HEADER_LEN + req.meta_len as usize;
        if rest.len() < end {
            break;
        }
        at += end;
        conn.served = true;
        let meta = &rest[HEADER_LEN..end];
        match serve_frame(shared, conn, req, meta, out) {
            Next::Serve => {}
            Next::Close => conn.closing = true,
            Next::HandOn(handoff, fence, op) => {
                conn.busy = true;
                conn.backlog = true;
                let waiting = Waiting {
                    req,
                    op,
                    meta: meta.to_vec(),
                    handoff,
                    fence,
                };
                hand_on(shared, door, token, conn, waiting);
            }
        }
    }
    at
}

/// Appends one answer frame.
fn push_frame(out: &mut Vec<u8>, header: &Header, meta: &[u8]) {
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(meta);
}

/// Serves one request frame on the loop's thread, as the threaded server would.
fn serve_frame(
    shared: &Shared,
    conn: &mut Conn,
    req: Header,
    meta: &[u8],
    out: &mut Vec<u8>,
) -> Next {
    let role = shared.opts.role;
    if let Err(reason) = check_request(&req, 0) {
        shared.bad_frame(conn.peer, &reason);
        push_frame(
            out,
            &Header::response(&req, Status::MalformedFrame, reason.len(), 0),
            reason.as_bytes(),
        );
        return Next::Close;
    }
    let Some(op) = Opcode::from_u8(req.opcode) else {
        let (status, msg) = unknown_opcode(conn.handshake.proven, req.opcode, role);
        push_frame(
            out,
            &Header::response(&req, status, msg.len(), 0),
            msg.as_bytes(),
        );
        if conn.handshake.proven {
            return Next::Serve;
        }
        ConnCounters::count(&shared.counters().unauthenticated);
        return Next::Close;
    };
    // The loop's clock read at this wake-up (the connection was active then): the arrival.
    let arrived = conn.active;
    let mut io = ServerIo::new(Sink::Buffer(out), req, &mut conn.attached, false, arrived);
    match conn.handshake.step(op, meta, &mut io) {
        Ok(Step::Answered) => {
            if conn.handshake.proven {
                conn.slot.proven();
            }
            return Next::Serve;
        }
        Ok(Step::Refused(why)) => {
            ConnCounters::count(&shared.counters().unauthenticated);
            if let Some(n) = shared.logs.bad_frames.spend(Instant::now()) {
                tracing::warn!(role, peer = %conn.peer, op = op.name(), refused = n, "closing connection: {why}");
            }
            return Next::Close;
        }
        Ok(Step::Pass) => {}
        Err(e) => {
            tracing::debug!(role, peer = %conn.peer, error = %e, "connection ended in its handshake");
            return Next::Close;
        }
    }
    match shared.service.handle(op, meta, &mut io) {
        // Answered here: the common case, decided without a call.
        Ok(Handled::Answered) if io.replied => Next::Serve,
        result => settle(shared, conn.peer, op, result, &mut io),
    }
}

/// What a handler's result leaves the connection to do.
fn settle(
    shared: &Shared,
    peer: SocketAddr,
    op: Opcode,
    result: Result<Handled, TransferError>,
    io: &mut ServerIo<'_>,
) -> Next {
    let role = shared.opts.role;
    match result {
        Ok(handled) => match (io.check(&handled), handled) {
            (Err(why), _) => {
                tracing::error!(role, %peer, op = op.name(), "{why}");
                Next::Close
            }
            (Ok(()), Handled::Answered) => Next::Serve,
            (Ok(()), Handled::HandedOn(on)) => Next::HandOn(on, io.fence, op),
        },
        Err(TransferError::Protocol(reason)) => {
            shared.bad_frame(peer, &format!("{}: {reason}", op.name()));
            if !io.replied {
                let _ = io.error(Status::MalformedFrame, &reason);
            }
            Next::Close
        }
        Err(e) => {
            tracing::debug!(role, %peer, op = op.name(), error = %e, "connection ended");
            Next::Close
        }
    }
}

/// Sends a request on to a waiting-request thread; its answer comes back through `door`.
fn hand_on(shared: &Arc<Shared>, door: &Door, token: usize, conn: &Conn, waiting: Waiting) {
    ConnCounters::count(&shared.counters().handed_on);
    let (shared2, door, peer, generation) =
        (shared.clone(), door.clone(), conn.peer, conn.generation);
    shared.blocking.submit(Box::new(move || {
        let shared = shared2;
        let Waiting {
            req,
            op,
            meta,
            handoff,
            fence,
        } = waiting;
        let mut out = Vec::new();
        let mut attached = None;
        // Served again whole: it arrives again now.
        let arrived = Instant::now();
        let mut io = ServerIo::new(Sink::Buffer(&mut out), req, &mut attached, true, arrived);
        let result = match handoff {
            HandOn::Rerun => shared.service.handle(op, &meta, &mut io),
            HandOn::Finish(rest) => {
                if let Some(fence) = fence {
                    io.fence(fence);
                }
                rest(&mut io).map(|()| Handled::Answered)
            }
        };
        let close = !matches!(settle(&shared, peer, op, result, &mut io), Next::Serve);
        door.send(Inbox::Answered {
            token,
            generation,
            out,
            close,
        });
    }));
}

/// A request handed on, as its waiting-request thread needs it.
struct Waiting {
    req: Header,
    op: Opcode,
    meta: Vec<u8>,
    handoff: HandOn,
    fence: Option<Fence>,
}

type Job = Box<dyn FnOnce() + Send>;

/// The threads requests that wait run on: started as waits need them, ended when idle.
struct Blocking {
    role: &'static str,
    state: Mutex<BlockingState>,
    ready: Condvar,
}

#[derive(Default)]
struct BlockingState {
    jobs: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

impl Blocking {
    fn new(role: &'static str) -> Blocking {
        Blocking {
            role,
            state: Mutex::new(BlockingState::default()),
            ready: Condvar::new(),
        }
    }

    fn submit(self: &Arc<Self>, job: Job) {
        let mut s = self.state.lock();
        s.jobs.push_back(job);
        if s.jobs.len() <= s.idle || s.threads >= BLOCKING_THREADS {
            self.ready.notify_one();
            return;
        }
        s.threads += 1;
        drop(s);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-wait", self.role))
            .stack_size(512 * 1024)
            .spawn(move || me.work());
        if let Err(e) = spawned {
            tracing::error!(role = self.role, error = %e, "cannot start a thread for requests that wait");
            let mut s = self.state.lock();
            s.threads -= 1;
            if s.threads == 0 {
                // No thread will take them: run them here rather than never.
                let jobs: Vec<Job> = s.jobs.drain(..).collect();
                drop(s);
                jobs.into_iter().for_each(|job| job());
            }
        }
    }

    fn work(self: Arc<Self>) {
        let mut s = self.state.lock();
        loop {
            if let Some(job) = s.jobs.pop_front() {
                drop(s);
                job();
                s = self.state.lock();
                continue;
            }
            s.idle += 1;
            let timed_out = self.ready.wait_for(&mut s, BLOCKING_IDLE).timed_out();
            s.idle -= 1;
            if timed_out && s.jobs.is_empty() {
                break;
            }
        }
        s.threads -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{spawn_evented, Deferred, Fence, Handling, ServerHandle, ServerOptions};
    use super::*;
    use crate::transfer::frame::FLAG_EPOCH;
    use crate::transfer::stream::FramedStream;

    /// A service whose `EXISTS` waits before doing anything and whose `REMOVE` waits after
    /// it, both until the test lets them go; `PING` answers at once, `LEAVE` keeps something
    /// for its connection.
    struct Waits {
        go: Arc<Mutex<mpsc::Receiver<()>>>,
        connections: ConnCounters,
    }

    /// Longer than a client waits for an answer: a wait on the loop's thread fails the test.
    fn wait(go: &Mutex<mpsc::Receiver<()>>) -> bool {
        go.lock().recv_timeout(Duration::from_secs(10)).is_ok()
    }

    impl Service for Waits {
        fn handle(&self, op: Opcode, _meta: &[u8], io: &mut ServerIo<'_>) -> Handling {
            let answered = match op {
                Opcode::Ping => io.reply(Status::Ok, b"pong", &[]),
                Opcode::Leave => {
                    io.attach(Box::new(()));
                    io.reply(Status::Ok, b"kept", &[])
                }
                Opcode::Exists if !io.may_block() => return Ok(Handled::HandedOn(HandOn::Rerun)),
                Opcode::Exists => match wait(&self.go) {
                    true => io.reply(Status::Ok, b"waited first", &[]),
                    false => io.error(Status::Internal, "never let go"),
                },
                Opcode::Remove => {
                    io.fence(Fence {
                        epoch: 7,
                        until: Instant::now() + Duration::from_secs(60),
                    });
                    let go = self.go.clone();
                    let rest: Deferred = Box::new(move |io| match wait(&go) {
                        true => io.reply(Status::Ok, b"done, then waited", &[]),
                        false => io.error(Status::Internal, "never let go"),
                    });
                    return Ok(Handled::HandedOn(HandOn::Finish(rest)));
                }
                _ => io.error(Status::UnknownOpcode, "not in this test"),
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

    fn options() -> ServerOptions {
        ServerOptions {
            max_connections: 16,
            max_connections_per_peer: 16,
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
            spin: Duration::ZERO,
            role: "test",
            auth: None,
            keepalive: None,
        }
    }

    /// A `Waits` service served by `loops` loops with `opts`; the sender lets its waits go.
    fn serve(opts: ServerOptions, loops: usize) -> (Arc<Waits>, mpsc::Sender<()>, ServerHandle) {
        let (go, gate) = mpsc::channel();
        let service = Arc::new(Waits {
            go: Arc::new(Mutex::new(gate)),
            connections: ConnCounters::default(),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = spawn_evented(listener, service.clone(), opts, loops).unwrap();
        (service, go, server)
    }

    fn connect(addr: SocketAddr) -> FramedStream {
        let s = std::net::TcpStream::connect(addr).unwrap();
        let io = FramedStream::new(s, Duration::ZERO).unwrap();
        io.set_timeout(Some(Duration::from_secs(5))).unwrap();
        io
    }

    fn ask(io: &mut FramedStream, op: Opcode, id: u64) {
        io.write_frame(&Header::request(op, id, 0, 0), &[], &[])
            .unwrap();
    }

    fn answer(io: &mut FramedStream) -> (u64, Vec<u8>) {
        let (h, meta) = io.read_frame(false).unwrap();
        assert_eq!(
            Status::from_u16(h.status),
            Status::Ok,
            "{}",
            String::from_utf8_lossy(&meta)
        );
        (h.request_id, meta)
    }

    #[test]
    fn a_request_that_waits_holds_up_no_other_connection_and_keeps_its_answers_in_order() {
        // One loop: a wait on it would hold up every connection.
        let (service, go, mut server) = serve(options(), 1);
        let mut a = connect(server.addr);
        let mut b = connect(server.addr);
        // A waits before doing anything; its next request is already on the wire behind it.
        ask(&mut a, Opcode::Exists, 1);
        ask(&mut a, Opcode::Ping, 2);
        // B is served meanwhile.
        ask(&mut b, Opcode::Ping, 3);
        assert_eq!(answer(&mut b), (3, b"pong".to_vec()));
        go.send(()).unwrap();
        assert_eq!(answer(&mut a), (1, b"waited first".to_vec()));
        assert_eq!(answer(&mut a), (2, b"pong".to_vec()));

        // A request that did its work, then waits for what makes it durable: its answer comes
        // from the waiting thread, with the fence its handler set.
        ask(&mut a, Opcode::Remove, 4);
        ask(&mut b, Opcode::Ping, 5);
        assert_eq!(answer(&mut b), (5, b"pong".to_vec()));
        go.send(()).unwrap();
        let (h, meta) = a.read_frame(false).unwrap();
        assert_eq!((h.request_id, Status::from_u16(h.status)), (4, Status::Ok));
        assert_ne!(
            h.flags & FLAG_EPOCH,
            0,
            "the fence's epoch is on the answer"
        );
        assert_eq!(meta[..8], 7u64.to_le_bytes());
        assert_eq!(&meta[8..], b"done, then waited");

        // Both were counted as handed on.
        assert_eq!(service.connections.handed_on.load(Ordering::Relaxed), 2);

        // Stopping closes the loop's connections.
        server.stop();
        assert!(matches!(b.read_frame(false), Err(TransferError::Closed)));
    }

    #[test]
    fn the_sweep_closes_a_silent_a_half_sent_and_an_idle_connection_and_counts_them_but_not_a_kept_one(
    ) {
        let opts = ServerOptions {
            request_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(600),
            ..options()
        };
        let (service, _go, mut server) = serve(opts, 1);
        // Never sends a byte; sends half a header; is served once, then stays quiet.
        let mut silent = connect(server.addr);
        let mut half = connect(server.addr);
        half.write_raw(&Header::request(Opcode::Ping, 1, 0, 0).encode()[..10])
            .unwrap();
        let mut idle = connect(server.addr);
        ask(&mut idle, Opcode::Ping, 2);
        assert_eq!(answer(&mut idle), (2, b"pong".to_vec()));
        // One the service keeps something for is not closed for idling.
        let mut kept = connect(server.addr);
        ask(&mut kept, Opcode::Leave, 3);
        assert_eq!(answer(&mut kept), (3, b"kept".to_vec()));
        // Each read ends with the close (bounded by the client's 5 s timeout).
        for (name, conn) in [
            ("silent", &mut silent),
            ("half", &mut half),
            ("idle", &mut idle),
        ] {
            assert!(
                matches!(conn.read_frame(false), Err(TransferError::Closed)),
                "the {name} connection was closed"
            );
        }
        let c = &service.connections;
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        // The silent one and the idle one ended idle, the half-sent frame as a stall.
        assert_eq!((n(&c.idle_closed), n(&c.bad_frames)), (2, 1));
        // Quiet as long as the idle one, and more: still served.
        ask(&mut kept, Opcode::Ping, 4);
        assert_eq!(answer(&mut kept), (4, b"pong".to_vec()));
        server.stop();
    }

    #[test]
    fn many_frames_in_one_read_are_all_answered_in_one_go() {
        let (_service, _go, mut server) = serve(options(), 2);
        let mut a = connect(server.addr);
        // 500 pings in one write, the last one split across two writes.
        let mut bytes = Vec::new();
        for id in 0..500u64 {
            bytes.extend_from_slice(&Header::request(Opcode::Ping, id, 0, 0).encode());
        }
        let (most, last) = bytes.split_at(bytes.len() - 7);
        a.write_raw(most).unwrap();
        a.write_raw(last).unwrap();
        for id in 0..500u64 {
            assert_eq!(answer(&mut a), (id, b"pong".to_vec()));
        }
        server.stop();
    }
}
