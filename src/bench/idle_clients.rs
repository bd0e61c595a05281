//! Idle clients for `bench master --idle-clients N`: N connections to the master that do
//! nothing but what every connected client does between requests, a heartbeat (`PING`) each
//! `client::heartbeat_interval`. One thread keeps them all: each round writes every
//! connection's ping, then reads every answer, so they cost the bench little. The figures say
//! how many answered and what their connections cost the master in memory.

use crate::transfer::frame::{Header, Opcode, Status, HEADER_LEN};
use crate::transfer::message::{PingReq, Wire};
use anyhow::Context as _;
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
    /// Pings not answered `OK` (a connection refused, closed or slow).
    pub ping_errors: u64,
}

/// The idle clients, pinging until dropped.
pub struct IdleClients {
    stop: Arc<AtomicBool>,
    pings: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    connections: usize,
    open_seconds: f64,
}

impl IdleClients {
    /// Opens `n` connections to `master` (host:port) and pings on each every `every`.
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
        let open_seconds = t0.elapsed().as_secs_f64();
        let stop = Arc::new(AtomicBool::new(false));
        let pings = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let (s, p, e) = (stop.clone(), pings.clone(), errors.clone());
        let thread = std::thread::Builder::new()
            .name("idle-clients".into())
            .spawn(move || heartbeat(conns, every, &s, &p, &e))?;
        Ok(IdleClients {
            stop,
            pings,
            errors,
            thread: Some(thread),
            connections: n,
            open_seconds,
        })
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

/// Rounds of one ping per connection until `stop`; a connection that fails is dropped.
fn heartbeat(
    conns: Vec<TcpStream>,
    every: Duration,
    stop: &AtomicBool,
    pings: &AtomicU64,
    errors: &AtomicU64,
) {
    let frames: Vec<Vec<u8>> = (0..conns.len() as u64)
        .map(|i| {
            let meta = PingReq {
                client_id: IDLE_CLIENT_IDS + i,
            }
            .to_meta();
            let mut f = Header::request(Opcode::Ping, i, meta.len(), 0)
                .encode()
                .to_vec();
            f.extend_from_slice(&meta);
            f
        })
        .collect();
    let mut conns: Vec<Option<TcpStream>> = conns.into_iter().map(Some).collect();
    let mut answer = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let round = Instant::now();
        let sent: Vec<bool> = conns
            .iter_mut()
            .zip(&frames)
            .map(|(c, f)| c.as_mut().is_some_and(|c| c.write_all(f).is_ok()))
            .collect();
        for (slot, sent) in conns.iter_mut().zip(sent) {
            let Some(c) = slot else { continue };
            pings.fetch_add(1, Ordering::Relaxed);
            if !(sent && read_answer(c, &mut answer)) {
                // Refused, closed or too slow: counted once, then left closed.
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
