//! Idle clients for `bench master --idle-clients N` and `bench failover --idle-clients N`: N
//! connections to the master, each doing what a connected client's heartbeat does while the
//! client has nothing to ask (`client`'s heartbeat loop):
//!
//! - one `PING` on a new connection, which binds it to the client at the master;
//! - then, at each tick (the heartbeat interval moved by up to half of itself at random), a
//!   look without a word to the master: is the connection still open (a `recv` peek), and is
//!   it still to the master the client follows? If not, a new connection and a ping;
//! - a connect or ping that fails is tried again at the next tick (`MasterLink::try_once`).
//!
//! Where the master is comes from one [`MasterLink`] for all of them (an elected master's
//! leader, watched in etcd), standing in for each client's own. A few threads keep them all,
//! so they cost the bench little. [`IdleClients::check`] pings each once more: every one must
//! still be served. [`IdleClients::fault`] marks a failover: each client's first answer from
//! another master after it is timed.

use crate::ha::link::MasterLink;
use crate::transfer::frame::{Header, Opcode, Status, HEADER_LEN};
use crate::transfer::message::{PingReq, Wire};
use crate::transfer::stream::{idle_socket_state, IdleSocket};
use crate::transfer::ConnOptions;
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The client ids idle clients ping as (one per connection).
const IDLE_CLIENT_IDS: u64 = 1 << 41;
/// Longest wait for one connection's connect or answer.
const WAIT: Duration = Duration::from_secs(5);
/// Clients per thread that keeps them.
const PER_THREAD: usize = 1000;
/// Threads that keep them, at most.
const MAX_THREADS: usize = 16;
/// Longest wait for every client's first ping, and for a check round.
const ROUND_WAIT: Duration = Duration::from_secs(60);

/// What the idle clients saw.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct IdleFigures {
    pub connections: usize,
    /// Seconds to open and bind them all.
    pub open_seconds: f64,
    pub pings: u64,
    /// Pings (and connects) that failed: refused, closed, slow, or not answered `OK`.
    pub ping_errors: u64,
    /// Connections found closed at a tick, or to a master no longer followed, and made again.
    pub reconnects: u64,
    /// Why, with how many each.
    pub reconnected: BTreeMap<String, u64>,
}

/// The idle clients, open until dropped.
pub struct IdleClients {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    connections: usize,
    open_seconds: f64,
}

struct Shared {
    link: MasterLink,
    every: Duration,
    stop: AtomicBool,
    pings: AtomicU64,
    errors: AtomicU64,
    reconnects: AtomicU64,
    /// Why connections were made again, with how many each.
    reconnected: Mutex<BTreeMap<String, u64>>,
    /// Clients bound once (their first ping answered).
    bound: AtomicU64,
    /// Asks every thread to ping each of its clients once more; each counts its round done.
    check: AtomicU64,
    checked: AtomicU64,
    /// The last failover marked: when, and the master followed then.
    fault: Mutex<Option<(Instant, Arc<str>)>>,
    /// Seconds from the fault to each client's first answer from another master.
    back: Mutex<Vec<f64>>,
}

/// One client, as its thread keeps it.
struct Idle {
    id: u64,
    /// Its connection, and the master it goes to.
    conn: Option<(TcpStream, Arc<str>)>,
    /// Its first ping was answered.
    bound: bool,
    /// The fault its return was timed for.
    timed: Option<Instant>,
}

impl IdleClients {
    /// Opens `n` clients of the master at `spec` (`host:port`, `etcd://…`), each bound by a
    /// ping, looking at their connection every `every` (jittered); returns once every one was
    /// bound (failed tries are tried again), or fails after a minute.
    pub fn open(spec: &str, n: usize, every: Duration) -> anyhow::Result<IdleClients> {
        crate::role::raise_open_files_limit(n as u64 + 4096);
        let link = MasterLink::new(spec, ConnOptions::default())?;
        let shared = Arc::new(Shared {
            link,
            every,
            stop: AtomicBool::new(false),
            pings: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            reconnected: Mutex::default(),
            bound: AtomicU64::new(0),
            check: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            fault: Mutex::new(None),
            back: Mutex::new(Vec::new()),
        });
        let t0 = Instant::now();
        let threads_n = n.div_ceil(PER_THREAD).clamp(1, MAX_THREADS);
        let mut threads = Vec::with_capacity(threads_n);
        for t in 0..threads_n {
            let clients: Vec<Idle> = (t..n)
                .step_by(threads_n)
                .map(|i| Idle {
                    id: IDLE_CLIENT_IDS + i as u64,
                    conn: None,
                    bound: false,
                    timed: None,
                })
                .collect();
            let shared = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("idle-clients".into())
                    .spawn(move || keep(&shared, clients))?,
            );
        }
        let mut idle = IdleClients {
            shared,
            threads,
            connections: n,
            open_seconds: 0.0,
        };
        let s = &idle.shared;
        while s.bound.load(Ordering::Relaxed) < n as u64 && t0.elapsed() < ROUND_WAIT {
            std::thread::sleep(Duration::from_millis(5));
        }
        anyhow::ensure!(
            s.bound.load(Ordering::Relaxed) == n as u64,
            "{} of {n} idle clients could not connect to the master {spec} within a minute \
             (its connection limits, or this host's open-files limit?)",
            n as u64 - s.bound.load(Ordering::Relaxed)
        );
        idle.open_seconds = t0.elapsed().as_secs_f64();
        Ok(idle)
    }

    /// Pings every client once more (an idle client's next request): each must be answered.
    pub fn check(&self) {
        let s = &self.shared;
        let done = s.checked.load(Ordering::Acquire) + self.threads.len() as u64;
        s.check.fetch_add(1, Ordering::AcqRel);
        let t0 = Instant::now();
        while s.checked.load(Ordering::Acquire) < done && t0.elapsed() < ROUND_WAIT {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Marks a failover starting now: from here on each client's first answer from a master
    /// other than the one followed now is timed.
    pub fn fault(&self, at: Instant) {
        *self.shared.fault.lock() = self.shared.link.leader_addr().map(|a| (at, a));
        self.shared.back.lock().clear();
    }

    /// Waits up to `within` for every client to be back since the fault: answers the seconds
    /// from the fault to each one's first answer from another master, in order.
    pub fn wait_return(&self, within: Duration) -> Vec<f64> {
        let t0 = Instant::now();
        while self.shared.back.lock().len() < self.connections && t0.elapsed() < within {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut back = self.shared.back.lock().clone();
        back.sort_by(f64::total_cmp);
        back
    }

    /// The figures so far.
    pub fn figures(&self) -> IdleFigures {
        let s = &self.shared;
        IdleFigures {
            connections: self.connections,
            open_seconds: self.open_seconds,
            pings: s.pings.load(Ordering::Relaxed),
            ping_errors: s.errors.load(Ordering::Relaxed),
            reconnects: s.reconnects.load(Ordering::Relaxed),
            reconnected: s.reconnected.lock().clone(),
        }
    }
}

impl Drop for IdleClients {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A thread's clients until `stop`: each at its own ticks, a check round when asked.
fn keep(shared: &Shared, mut clients: Vec<Idle>) {
    let now = Instant::now();
    // Due times: the first tick of each is now (its first connection and ping).
    let mut due: BinaryHeap<Reverse<(Instant, usize)>> =
        (0..clients.len()).map(|i| Reverse((now, i))).collect();
    let mut checks = shared.check.load(Ordering::Acquire);
    while !shared.stop.load(Ordering::Relaxed) {
        let asked = shared.check.load(Ordering::Acquire);
        if asked != checks {
            checks = asked;
            for c in clients.iter_mut() {
                if let Some((stream, _)) = &mut c.conn {
                    if !ping(shared, stream, c.id) {
                        c.conn = None;
                    }
                }
            }
            shared.checked.fetch_add(1, Ordering::AcqRel);
        }
        let now = Instant::now();
        match due.peek() {
            Some(Reverse((at, i))) if *at <= now => {
                let i = *i;
                due.pop();
                let next = tick(shared, &mut clients[i]);
                due.push(Reverse((now + next, i)));
            }
            next => {
                let wait = next.map_or(Duration::from_millis(20), |Reverse((at, _))| {
                    at.saturating_duration_since(now)
                });
                std::thread::sleep(wait.min(Duration::from_millis(20)));
            }
        }
    }
}

/// One tick of one client: what its heartbeat does. Answers the wait until its next.
fn tick(shared: &Shared, c: &mut Idle) -> Duration {
    let Some(master) = shared.link.leader_addr() else {
        shared.errors.fetch_add(1, Ordering::Relaxed);
        return jittered(shared.every);
    };
    if let Some((stream, to)) = &c.conn {
        let why = match idle_socket_state(stream) {
            IdleSocket::Open if *to == master => return jittered(shared.every),
            IdleSocket::Open => "the master moved".to_string(),
            IdleSocket::Closed => "closed by the master".to_string(),
            IdleSocket::Unasked => "bytes nobody asked for".to_string(),
            IdleSocket::Failed(e) => format!("failed: {e}"),
        };
        shared.reconnects.fetch_add(1, Ordering::Relaxed);
        *shared.reconnected.lock().entry(why).or_default() += 1;
        c.conn = None;
    }
    let Some(mut stream) = connect(&master) else {
        shared.errors.fetch_add(1, Ordering::Relaxed);
        return jittered(shared.every);
    };
    if !ping(shared, &mut stream, c.id) {
        return jittered(shared.every);
    }
    c.conn = Some((stream, master.clone()));
    if !c.bound {
        c.bound = true;
        shared.bound.fetch_add(1, Ordering::Relaxed);
    }
    let fault = shared.fault.lock().clone();
    if let Some((at, before)) = fault {
        if c.timed != Some(at) && master != before {
            c.timed = Some(at);
            let took = Instant::now().saturating_duration_since(at);
            shared.back.lock().push(took.as_secs_f64());
        }
    }
    jittered(shared.every)
}

/// The heartbeat interval moved by up to half of itself at random.
fn jittered(every: Duration) -> Duration {
    every.mul_f64(0.5 + fastrand::f64())
}

fn connect(master: &str) -> Option<TcpStream> {
    let addr = master.to_socket_addrs().ok()?.next()?;
    let s = TcpStream::connect_timeout(&addr, WAIT).ok()?;
    s.set_nodelay(true).ok()?;
    s.set_read_timeout(Some(WAIT)).ok()?;
    s.set_write_timeout(Some(WAIT)).ok()?;
    Some(s)
}

/// One ping as client `id`: true when answered `OK`.
fn ping(shared: &Shared, stream: &mut TcpStream, id: u64) -> bool {
    shared.pings.fetch_add(1, Ordering::Relaxed);
    let meta = PingReq { client_id: id }.to_meta();
    let mut frame = Header::request(Opcode::Ping, 1, meta.len(), 0)
        .encode()
        .to_vec();
    frame.extend_from_slice(&meta);
    let mut answer = Vec::new();
    let ok = stream.write_all(&frame).is_ok() && read_answer(stream, &mut answer);
    if !ok {
        shared.errors.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// Reads one answer: true when it is `OK`.
fn read_answer(c: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut head = [0u8; HEADER_LEN];
    if c.read_exact(&mut head).is_err() {
        return false;
    }
    let Ok(h) = Header::decode(&head) else {
        return false;
    };
    buf.resize(h.meta_len as usize, 0);
    c.read_exact(buf).is_ok() && Status::from_u16(h.status) == Status::Ok
}
