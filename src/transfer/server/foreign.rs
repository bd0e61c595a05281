//! Event loops for another protocol's connections (Mooncake's Transfer Engine on a store):
//! admitted as rbgctl's are (`admission`), then driven by a few loop threads waiting on all of
//! them at once (`epoll`), each connection's protocol a state machine that moves what its
//! socket takes now and says what it waits for ([`ForeignConn`]). A connection costs a record,
//! not a thread: on a small machine the lanes of Mooncake's clients no longer each take a
//! thread that the scheduler must share out, and their bytes go out one request after another
//! as Mooncake's own event loop sends them.
//!
//! A busy connection moves at most [`BUDGET`] bytes before the others get their turn (epoll is
//! edge-triggered: the loop keeps it on its own list of connections with more to do). Idle and
//! request timeouts are checked a few times a second; a connection the protocol ends after a
//! refusal lingers, its write side shut, until its peer closes or [`LINGER`] passes, so that
//! the refusal is read rather than reset away.

use super::admission::Slot;
use super::epoll::{Epoll, Events, Waker, EVENTS};
use super::{ConnCounters, ServerHandle, ServerOptions};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes one connection moves before the loop turns to the next.
pub const BUDGET: usize = 1 << 20;
/// How long a connection ended after a refusal waits for its peer to close.
pub const LINGER: Duration = Duration::from_millis(100);
/// How often the loops look at their connections' timeouts.
const SWEEP: Duration = Duration::from_millis(250);
/// The token of a loop's waker.
const WAKE: u64 = u64::MAX;

/// What a connection waits for after a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Between requests: the idle timeout runs.
    Idle,
    /// Inside a request, waiting for its socket: the request timeout runs.
    Busy,
    /// Its budget is spent with more to do at once.
    More,
    /// Done: close now (the peer closed, or nothing more is to be said).
    Close,
    /// Close once the peer has read what was sent (a refusal).
    Linger,
}

/// A turn's outcome: bytes moved (either way) and what comes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub moved: usize,
    pub next: Next,
}

/// One connection of the protocol: moves what `stream` (non-blocking) takes now, up to
/// `budget` bytes.
pub trait ForeignConn: Send {
    fn turn(&mut self, stream: &TcpStream, budget: usize) -> std::io::Result<Step>;
}

/// Makes the protocol's record of a connection admitted from a peer.
pub type NewConn = Arc<dyn Fn(SocketAddr) -> Box<dyn ForeignConn> + Send + Sync>;

/// A connection on a loop.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    proto: Box<dyn ForeignConn>,
    /// What it waits for now, since when (the last byte moved).
    waits: Next,
    since: Instant,
    /// On the loop's list of connections to turn.
    queued: bool,
}

/// What the accept thread hands a loop.
struct Shared {
    inbox: Mutex<Vec<(TcpStream, SocketAddr, Slot)>>,
    waker: Arc<Waker>,
}

/// Serves `listener` for a protocol that is not rbgctl's under the same admission as
/// `spawn_foreign`, its connections driven by `loops` event loops (at least one) rather than a
/// thread each. `opts.auth` is ignored.
pub fn spawn(
    listener: TcpListener,
    opts: ServerOptions,
    counters: Arc<ConnCounters>,
    loops: usize,
    new_conn: NewConn,
) -> std::io::Result<ServerHandle> {
    let opts = ServerOptions { auth: None, ..opts };
    let shutdown = Arc::new(AtomicBool::new(false));
    let mut shared = Vec::new();
    let mut handles = Vec::new();
    for i in 0..loops.max(1) {
        let poll = Epoll::new()?;
        let waker = Arc::new(Waker::new(&poll, WAKE)?);
        let s = Arc::new(Shared {
            inbox: Mutex::new(Vec::new()),
            waker: waker.clone(),
        });
        let mut lp = Loop {
            poll,
            shared: s.clone(),
            conns: Vec::new(),
            free: Vec::new(),
            turns: VecDeque::new(),
            opts: opts.clone(),
            counters: counters.clone(),
            new_conn: new_conn.clone(),
            shutdown: shutdown.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("{}-loop{i}", opts.role))
            .spawn(move || lp.run())?;
        handles.push((waker, thread));
        shared.push(s);
    }
    let mut next = 0usize;
    let admit = move |stream: TcpStream, peer: SocketAddr, slot: Slot| {
        let s = &shared[next % shared.len()];
        next = next.wrapping_add(1);
        s.inbox.lock().push((stream, peer, slot));
        let _ = s.waker.wake();
    };
    super::accepting(listener, opts, counters, shutdown, handles, admit)
}

struct Loop {
    poll: Epoll,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Connections to turn (reported by epoll, or with more to do).
    turns: VecDeque<usize>,
    opts: ServerOptions,
    counters: Arc<ConnCounters>,
    new_conn: NewConn,
    shutdown: Arc<AtomicBool>,
}

impl Loop {
    fn run(&mut self) {
        let mut events: Events = Vec::with_capacity(EVENTS);
        let mut swept = Instant::now();
        loop {
            let timeout = if self.turns.is_empty() {
                SWEEP
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.wait(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    tracing::error!(role = self.opts.role, error = %e, "event loop wait failed");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            if self.shutdown.load(Ordering::SeqCst) {
                self.conns.clear();
                return;
            }
            for e in &events {
                match e.data.u64() {
                    WAKE => self.admit_waiting(),
                    token => self.queue(token as usize),
                }
            }
            // Each connection queued now gets one turn; those with more to do queue again.
            for _ in 0..self.turns.len() {
                let Some(token) = self.turns.pop_front() else {
                    break;
                };
                self.turn(token);
            }
            let now = Instant::now();
            if now.duration_since(swept) >= SWEEP {
                swept = now;
                self.sweep(now);
            }
        }
    }

    fn admit_waiting(&mut self) {
        self.shared.waker.reset();
        let admitted = std::mem::take(&mut *self.shared.inbox.lock());
        for (stream, peer, slot) in admitted {
            if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
                continue;
            }
            let token = self.free.pop().unwrap_or(self.conns.len());
            if let Err(e) = self.poll.watch(&stream, token as u64, true) {
                tracing::warn!(role = self.opts.role, error = %e, "cannot watch a connection");
                continue;
            }
            let conn = Conn {
                proto: (self.new_conn)(peer),
                stream,
                peer,
                slot,
                waits: Next::Idle,
                since: Instant::now(),
                queued: false,
            };
            if token == self.conns.len() {
                self.conns.push(Some(conn));
            } else {
                self.conns[token] = Some(conn);
            }
            // Bytes that came before the watch are reported by it; a turn now costs nothing.
            self.queue(token);
        }
    }

    fn queue(&mut self, token: usize) {
        if let Some(Some(c)) = self.conns.get_mut(token) {
            if !c.queued {
                c.queued = true;
                self.turns.push_back(token);
            }
        }
    }

    fn turn(&mut self, token: usize) {
        let Some(Some(c)) = self.conns.get_mut(token) else {
            return;
        };
        c.queued = false;
        let now = Instant::now();
        let next = if c.waits == Next::Linger {
            match drained(&c.stream) {
                true => Next::Close,
                false => Next::Linger,
            }
        } else {
            match c.proto.turn(&c.stream, BUDGET) {
                Ok(Step { moved, next }) => {
                    if moved > 0 || next != c.waits {
                        c.since = now;
                    }
                    if next != c.waits {
                        c.slot.active(now, next != Next::Idle);
                    }
                    match next {
                        Next::Linger => {
                            let _ = c.stream.shutdown(std::net::Shutdown::Write);
                            match drained(&c.stream) {
                                true => Next::Close,
                                false => Next::Linger,
                            }
                        }
                        next => next,
                    }
                }
                Err(e) => {
                    tracing::debug!(role = self.opts.role, peer = %c.peer, error = %e,
                        "connection ended");
                    Next::Close
                }
            }
        };
        c.waits = next;
        match next {
            Next::More => {
                c.queued = true;
                self.turns.push_back(token);
            }
            Next::Close => self.close(token),
            Next::Idle | Next::Busy | Next::Linger => {}
        }
    }

    fn close(&mut self, token: usize) {
        if let Some(c) = self.conns.get_mut(token).and_then(Option::take) {
            let _ = self.poll.unwatch(&c.stream);
            self.free.push(token);
        }
    }

    /// Closes what stalled past its timeout, and what lingered long enough.
    fn sweep(&mut self, now: Instant) {
        for token in 0..self.conns.len() {
            let Some(c) = &self.conns[token] else {
                continue;
            };
            let quiet = now.duration_since(c.since);
            let (limit, counter) = match c.waits {
                Next::Idle => (self.opts.idle_timeout, &self.counters.idle_closed),
                Next::Busy => (self.opts.request_timeout, &self.counters.bad_frames),
                Next::Linger => (LINGER, &self.counters.bad_frames),
                Next::More | Next::Close => continue,
            };
            if quiet >= limit {
                if c.waits != Next::Linger {
                    counter.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(role = self.opts.role, peer = %c.peer, waits = ?c.waits,
                        "connection timed out");
                }
                self.close(token);
            }
        }
    }
}

/// Reads and drops what the peer still sends; whether it has closed (or the socket failed).
fn drained(stream: &TcpStream) -> bool {
    let mut scratch = [0u8; 4096];
    loop {
        match super::recv_some(stream, &mut scratch) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A protocol of 4-byte requests, each answered with itself.
    struct Echo {
        got: [u8; 4],
        n: usize,
    }

    impl ForeignConn for Echo {
        fn turn(&mut self, stream: &TcpStream, _budget: usize) -> std::io::Result<Step> {
            let mut moved = 0;
            loop {
                match rustix::net::recv(
                    stream,
                    &mut self.got[self.n..],
                    rustix::net::RecvFlags::empty(),
                ) {
                    Ok((0, _)) => {
                        return Ok(Step {
                            moved,
                            next: Next::Close,
                        })
                    }
                    Ok((k, _)) => {
                        moved += k;
                        self.n += k;
                        if self.n == 4 {
                            rustix::net::send(stream, &self.got, rustix::net::SendFlags::NOSIGNAL)?;
                            self.n = 0;
                        }
                    }
                    Err(rustix::io::Errno::AGAIN) => {
                        let next = if self.n == 0 { Next::Idle } else { Next::Busy };
                        return Ok(Step { moved, next });
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }

    #[test]
    fn connections_are_served_by_the_loop_and_closed_at_their_timeouts_and_at_the_stop() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let opts = ServerOptions {
            max_connections: 16,
            max_connections_per_peer: 16,
            idle_timeout: Duration::from_millis(600),
            request_timeout: Duration::from_millis(300),
            spin: Duration::ZERO,
            role: "test-foreign",
            auth: None,
            keepalive: None,
        };
        let counters = Arc::new(ConnCounters::default());
        let new_conn: NewConn = Arc::new(|_| Box::new(Echo { got: [0; 4], n: 0 }));
        let mut handle = spawn(listener, opts, counters.clone(), 2, new_conn).unwrap();
        let connect = || {
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        };
        // Served, in pieces, on both loops.
        let (mut a, mut b) = (connect(), connect());
        for s in [&mut a, &mut b] {
            s.write_all(b"pi").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s.write_all(b"ngpong").unwrap();
            let mut got = [0u8; 8];
            s.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"pingpong");
        }
        // Half a request: closed at the request timeout, counted as a bad frame.
        let t0 = Instant::now();
        b.write_all(b"x").unwrap();
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert_eq!(counters.bad_frames.load(Ordering::Relaxed), 1);
        // Idle: closed at the idle timeout, counted as such.
        a.read_to_end(&mut rest).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(600));
        assert_eq!(counters.idle_closed.load(Ordering::Relaxed), 1);
        // The stop closes what is open.
        let mut c = connect();
        c.write_all(b"abcd").unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).unwrap();
        handle.stop();
        let t0 = Instant::now();
        let _ = c.read_to_end(&mut rest);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(counters.accepted.load(Ordering::Relaxed), 3);
    }
}
