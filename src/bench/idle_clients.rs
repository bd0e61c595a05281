//! Idle clients for `bench master --idle-clients N`: N connections to the master that do what
//! a connected client's heartbeat does while it has nothing to ask (`client`'s heartbeat loop):
//! one `PING` when the connection is new, which binds it to the client, then each heartbeat
//! interval a look that the connection is still open (a `recv` peek, on the client's side
//! only), and no word to the master. One thread keeps them all, so they cost the bench little.
//! [`IdleClients::check`] pings each once more at the end: every one must still be served.
//! The figures say how many answered and what their connections cost the master in memory.

use crate::transfer::frame::{Header, Opcode, Status, HEADER_LEN};
use crate::transfer::message::{PingReq, Wire};
use crate::transfer::stream::idle_socket_open;
use anyhow::Context as _;
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The client ids idle clients heartbeat as (one per connection).
const IDLE_CLIENT_IDS: u64 = 1 << 41;
/// Longest wait for one connection's connect or answer.
const WAIT: Duration = Duration::from_secs(5);

/// What the idle clients saw.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct IdleFigures {
    pub connections: usize,
    /// Seconds to open them all.
    pub open_seconds: f64,
    pub pings: u64,
    /// Pings not answered `OK` (a connection refused, closed or slow), and connections the
    /// master closed between them.
    pub ping_errors: u64,
}

/// The idle clients, open until dropped.
pub struct IdleClients {
    stop: Arc<AtomicBool>,
    /// The connections; `None` once one failed.
    conns: Arc<Mutex<Vec<Option<TcpStream>>>>,
    pings: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    connections: usize,
    open_seconds: f64,
}

impl IdleClients {
    /// Opens `n` connections to `master` (host:port), pings on each once, and looks every
    /// `every` that each is still open.
    pub fn open(master: &str, n: usize, every: Duration) -> anyhow::Result<IdleClients> {
        crate::role::raise_open_files_limit(n as u64 + 4096);
        let addr: SocketAddr = master
            .to_socket_addrs()
            .with_context(|| format!("resolving the master {master}"))?
            .next()
            .with_context(|| format!("the master {master} has no address"))?;
        let t0 = Instant::now();
        let mut conns = Vec::with_capacity(n);
        for i in 0..n {
            let s = TcpStream::connect_timeout(&addr, WAIT).with_context(|| {
                format!("idle client {i} of {n}: connecting to {addr} (open-files limit?)")
            })?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(WAIT))?;
            s.set_write_timeout(Some(WAIT))?;
            conns.push(s);
        }
        let mut conns: Vec<Option<TcpStream>> = conns.into_iter().map(Some).collect();
        let pings = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        ping_round(&mut conns, &pings, &errors);
        let open_seconds = t0.elapsed().as_secs_f64();
        let conns = Arc::new(Mutex::new(conns));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, c, e) = (stop.clone(), conns.clone(), errors.clone());
        let thread = std::thread::Builder::new()
            .name("idle-clients".into())
            .spawn(move || watch(&c, every, &s, &e))?;
        Ok(IdleClients {
            stop,
            conns,
            pings,
            errors,
            thread: Some(thread),
            connections: n,
            open_seconds,
        })
    }

    /// Pings every connection still open once more (an idle client's next request): each must
    /// be answered.
    pub fn check(&self) {
        ping_round(&mut self.conns.lock(), &self.pings, &self.errors);
    }

    /// The figures so far.
    pub fn figures(&self) -> IdleFigures {
        IdleFigures {
            connections: self.connections,
            open_seconds: self.open_seconds,
            pings: self.pings.load(Ordering::Relaxed),
            ping_errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

impl Drop for IdleClients {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One ping on every open connection, all written before any answer is read; a connection
/// that fails is counted and dropped.
fn ping_round(conns: &mut [Option<TcpStream>], pings: &AtomicU64, errors: &AtomicU64) {
    let mut frame = Vec::new();
    let sent: Vec<bool> = conns
        .iter_mut()
        .enumerate()
        .map(|(i, c)| {
            let meta = PingReq {
                client_id: IDLE_CLIENT_IDS + i as u64,
            }
            .to_meta();
            frame.clear();
            frame.extend_from_slice(
                &Header::request(Opcode::Ping, i as u64, meta.len(), 0).encode(),
            );
            frame.extend_from_slice(&meta);
            c.as_mut().is_some_and(|c| c.write_all(&frame).is_ok())
        })
        .collect();
    let mut answer = Vec::new();
    for (slot, sent) in conns.iter_mut().zip(sent) {
        let Some(c) = slot else { continue };
        pings.fetch_add(1, Ordering::Relaxed);
        if !(sent && read_answer(c, &mut answer)) {
            // Refused, closed or too slow: counted once, then left closed.
            errors.fetch_add(1, Ordering::Relaxed);
            *slot = None;
        }
    }
}

/// Each `every` until `stop`, looks that every connection is still open, as a client's
/// heartbeat does; one the master closed is counted and dropped.
fn watch(
    conns: &Mutex<Vec<Option<TcpStream>>>,
    every: Duration,
    stop: &AtomicBool,
    errors: &AtomicU64,
) {
    while !stop.load(Ordering::Relaxed) {
        let round = Instant::now();
        for slot in conns.lock().iter_mut() {
            if slot.as_ref().is_some_and(|c| !idle_socket_open(c)) {
                errors.fetch_add(1, Ordering::Relaxed);
                *slot = None;
            }
        }
        // Sleep out the interval in short steps, to see a stop soon.
        while !stop.load(Ordering::Relaxed) && round.elapsed() < every {
            std::thread::sleep(
                Duration::from_millis(20).min(every.saturating_sub(round.elapsed())),
            );
        }
    }
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
