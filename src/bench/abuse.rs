//! `rbgctl bench abuse`: what bad input costs the pool. It starts its own master (with its
//! metadata server) and store on loopback and turns strangers on them, one attack at a time:
//!
//! - **idle flood**: connections to the master's RPC port and the store's data port that never
//!   send a byte, from 8 loopback addresses (more than the per-address and per-port limits);
//! - **slowloris**: HTTP requests to the master's two HTTP ports whose headers trickle in, one
//!   line a second, never ending;
//! - **huge frames**: RPC frames announcing 16 MiB of message fields and sending 1 KiB, and
//!   frames announcing a payload of 2^64-1 bytes;
//! - **huge bodies**: HTTP requests to the metadata server declaring a terabyte body, and
//!   chunked bodies streamed past the port's limit.
//!
//! For each attack it reports how many connections the kernel accepted, how many the servers
//! had closed within a second (refused or answered at once), how long until they had closed every one, the master's and
//! store's resident memory and open files before, at the peak and after, and how a normal
//! client (put and get of 4 KiB, `/health`, on connections it opened before the attack) fared
//! meanwhile. Everything runs against the processes it started, on loopback, and is bounded by
//! `--deadline`.

use super::kit::cluster::{OwnCluster, OwnOpts};
use crate::bench::kit::report::BenchReport;
use crate::client::{Client, ClientConfig, ReplicateConfig};
use crate::config::Millis;
use crate::master::config::MasterConfig;
use crate::transfer::frame::{Header, MAX_META_LEN};
use crate::transfer::Opcode;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rbgctl bench abuse`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct AbuseBenchArgs {
    /// Idle connections opened to each of the master's RPC port and the store's data port,
    /// spread over 8 loopback addresses (the servers admit 4096 per port, 1024 per address).
    #[arg(long, default_value_t = 5000)]
    pub connections: usize,
    /// Slowloris connections to each of the master's two HTTP ports (they admit 1024 each).
    #[arg(long, default_value_t = 1000)]
    pub slow: usize,
    /// Connections sending huge frames, and HTTP requests declaring huge bodies, per port.
    #[arg(long, default_value_t = 1000)]
    pub huge: usize,
    /// Longest wait for the servers to close an attack's connections.
    #[arg(long, default_value = "30s")]
    pub deadline: Millis,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where the connections of an attack come from: 127.0.0.2 to 127.0.0.9 (the normal client
/// uses 127.0.0.1).
const SOURCES: [Ipv4Addr; 8] = [
    Ipv4Addr::new(127, 0, 0, 2),
    Ipv4Addr::new(127, 0, 0, 3),
    Ipv4Addr::new(127, 0, 0, 4),
    Ipv4Addr::new(127, 0, 0, 5),
    Ipv4Addr::new(127, 0, 0, 6),
    Ipv4Addr::new(127, 0, 0, 7),
    Ipv4Addr::new(127, 0, 0, 8),
    Ipv4Addr::new(127, 0, 0, 9),
];

/// Memory and open files of one process over an attack.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Usage {
    pub rss_before_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_after_mib: f64,
    pub fds_before: usize,
    pub fds_peak: usize,
    pub fds_after: usize,
}

/// How the normal client fared during an attack.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Probe {
    pub ok: u64,
    pub failed: u64,
    pub slowest_ms: f64,
}

/// One kind of bad input the abuse benchmark sends, and what it cost the pool.
#[derive(Debug, Serialize)]
pub struct Attack {
    pub name: &'static str,
    /// What each connection did.
    pub what: String,
    /// Connections attempted, and accepted by the kernel.
    pub attempted: usize,
    pub opened: usize,
    /// Seconds it took to open them all.
    pub opening_s: f64,
    /// Closed by the servers within a second after the last one opened (refused or answered
    /// at once; in a long opening, also early ones that timed out meanwhile).
    pub closed_within_1s: usize,
    /// From the attack's start until the servers had closed every connection; `None` if some
    /// were still open at the deadline.
    pub all_closed_after_s: Option<f64>,
    /// HTTP answers received, by status code, where the attack reads them.
    pub answers: std::collections::BTreeMap<u16, usize>,
    pub master: Usage,
    pub store: Usage,
    /// Put and get of the normal client; `/health` of the master.
    pub client: Probe,
    pub health: Probe,
}

#[derive(Debug, Serialize)]
struct Report {
    attacks: Vec<Attack>,
}

/// Runs `rbgctl bench abuse` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(args: AbuseBenchArgs) -> anyhow::Result<()> {
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    crate::role::raise_open_files_limit(
        (args.connections * 2 + args.slow * 2 + args.huge * 2 + 256) as u64,
    );
    progress("starting a master (with its metadata server) and a store on loopback");
    let cluster = OwnCluster::start_with(OwnOpts {
        segment_size: 64 << 20,
        persistent: false,
        disk_tier: None,
        master: MasterConfig {
            enable_http_metadata_server: true,
            http_metadata_server_host: "127.0.0.1".into(),
            http_metadata_server_port: 0,
            ..MasterConfig::default()
        },
        rdma_device: None,
    })?;
    let (master_pid, store_pid) = match cluster.pids(0) {
        (Some(m), Some(s)) => (m, s),
        _ => anyhow::bail!("the master or store it started has no process id"),
    };
    let rpc: SocketAddr = cluster.master.parse()?;
    let data = cluster.store_data_addr(0);
    let (admin, metadata) = cluster.master_http_addrs();
    let metadata = metadata.ok_or_else(|| anyhow::anyhow!("the master serves no metadata port"))?;
    let client = Client::connect(ClientConfig {
        same_host_shm: false,
        ..ClientConfig::new(cluster.master.clone())
    })?;
    let health = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let bench = Bench {
        pids: [master_pid, store_pid],
        client: Arc::new(client),
        health: Arc::new(health),
        health_url: format!("http://{admin}/health"),
        deadline: args.deadline.0,
    };
    // The normal client's connections are open before any attack starts.
    bench.probe_once()?;

    let mut attacks = Vec::new();
    progress(&format!(
        "idle flood: {} connections to each of the master's RPC and the store's data port",
        args.connections
    ));
    attacks.push(bench.attack(
        "idle flood",
        format!("connect to the RPC port, send nothing ({rpc}, {data})"),
        &[rpc, data],
        args.connections,
        |_, _| Ok(()),
        None,
    ));
    progress(&format!(
        "slowloris: {} connections to each of the master's HTTP ports",
        args.slow
    ));
    attacks.push(bench.attack(
        "slowloris",
        "GET /health with one header line a second, never ending".into(),
        &[admin, metadata],
        args.slow,
        |c, _| c.write_all(b"GET /health HTTP/1.1\r\nHost: rbgctl\r\n"),
        Some(&|c: &mut TcpStream, round: usize| write!(c, "X-Slow-{round}: a\r\n")),
    ));
    progress(&format!(
        "huge frames: {} connections to each of the master's RPC and the store's data port",
        args.huge
    ));
    attacks.push(bench.attack(
        "huge frames",
        "announce 16 MiB of message fields and send 1 KiB, or a payload of 2^64-1 bytes".into(),
        &[rpc, data],
        args.huge,
        huge_frame,
        None,
    ));
    progress(&format!(
        "huge bodies: {} requests to the metadata server",
        args.huge
    ));
    attacks.push(bench.attack(
        "huge bodies",
        "PUT /metadata declaring 1 TB, or (1 in 10) streaming a chunked body past the 1 MiB limit"
            .into(),
        &[metadata],
        args.huge,
        huge_body,
        None,
    ));
    let report = Report { attacks };
    report.publish(args.json, None)?;
    drop(cluster);
    Ok(())
}

/// What a slow attack sends once a second on each connection still open (the round number).
type Dribble<'a> = &'a dyn Fn(&mut TcpStream, usize) -> std::io::Result<()>;

struct Bench {
    pids: [u32; 2],
    client: Arc<Client>,
    health: Arc<reqwest::blocking::Client>,
    health_url: String,
    deadline: Duration,
}

impl Bench {
    fn probe_once(&self) -> anyhow::Result<()> {
        self.client
            .put("abuse/probe", &[7u8; 4096], &ReplicateConfig::default())?;
        self.client.get("abuse/probe")?;
        self.health
            .get(&self.health_url)
            .send()?
            .error_for_status()?;
        Ok(())
    }

    /// Opens `per_target` connections to each target from the 8 sources, runs `open` on each
    /// (with its number among those to its target),
    /// then `dribble` once a second on the open ones, until the servers have closed them all or
    /// the deadline passes; meanwhile samples the roles' memory and runs the normal client.
    fn attack(
        &self,
        name: &'static str,
        what: String,
        targets: &[SocketAddr],
        per_target: usize,
        open: impl Fn(&mut TcpStream, usize) -> std::io::Result<()>,
        dribble: Option<Dribble<'_>>,
    ) -> Attack {
        let before = self.pids.map(sample);
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (pids, stop) = (self.pids, stop.clone());
            std::thread::spawn(move || {
                let mut peak = before;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    for (p, pid) in peak.iter_mut().zip(pids) {
                        let now = sample(pid);
                        p.0 = p.0.max(now.0);
                        p.1 = p.1.max(now.1);
                    }
                }
                peak
            })
        };
        let probes = {
            let (client, health, url, stop) = (
                self.client.clone(),
                self.health.clone(),
                self.health_url.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || run_probes(&client, &health, &url, &stop))
        };

        let t0 = Instant::now();
        let attempted = per_target * targets.len();
        let mut conns: Vec<Conn> = Vec::with_capacity(attempted);
        for i in 0..attempted {
            let target = targets[i % targets.len()];
            let source = IpAddr::V4(SOURCES[(i / targets.len()) % SOURCES.len()]);
            let Ok(mut stream) =
                super::kit::flood::connect_from(source, target, Duration::from_secs(2))
            else {
                continue;
            };
            let opened = open(&mut stream, i / targets.len()).is_ok();
            conns.push(Conn {
                stream,
                closed_at: (!opened).then(|| t0.elapsed()),
                answer: Vec::new(),
            });
        }
        let opened = conns.len();
        let opening = t0.elapsed();
        let mut last_dribble = Instant::now();
        let mut round = 0;
        loop {
            for c in conns.iter_mut().filter(|c| c.closed_at.is_none()) {
                if c.poll_closed() {
                    c.closed_at = Some(t0.elapsed());
                }
            }
            let open_now = conns.iter().filter(|c| c.closed_at.is_none()).count();
            if open_now == 0 || t0.elapsed() > self.deadline {
                break;
            }
            if let Some(dribble) = dribble {
                if last_dribble.elapsed() >= Duration::from_secs(1) {
                    last_dribble = Instant::now();
                    round += 1;
                    for c in conns.iter_mut().filter(|c| c.closed_at.is_none()) {
                        if dribble(&mut c.stream, round).is_err() {
                            c.closed_at = Some(t0.elapsed());
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let soon = opening + Duration::from_secs(1);
        let closed_within_1s = conns
            .iter()
            .filter(|c| c.closed_at.is_some_and(|t| t <= soon))
            .count();
        let all_closed_after_s = conns
            .iter()
            .map(|c| c.closed_at)
            .try_fold(Duration::ZERO, |m, t| t.map(|t| m.max(t)))
            .map(|d| d.as_secs_f64());
        let mut answers = std::collections::BTreeMap::new();
        for code in conns.iter().filter_map(|c| http_status(&c.answer)) {
            *answers.entry(code).or_insert(0) += 1;
        }
        drop(conns);
        stop.store(true, Ordering::Relaxed);
        let peak = sampler.join().unwrap_or(before);
        let (client, health) = probes.join().unwrap_or_default();
        // The roles get a moment to let go of what the attack made them hold.
        std::thread::sleep(Duration::from_secs(1));
        let after = self.pids.map(sample);
        let usage = |i: usize| Usage {
            rss_before_mib: mib(before[i].0),
            rss_peak_mib: mib(peak[i].0),
            rss_after_mib: mib(after[i].0),
            fds_before: before[i].1,
            fds_peak: peak[i].1,
            fds_after: after[i].1,
        };
        Attack {
            name,
            what,
            attempted,
            opened,
            opening_s: opening.as_secs_f64(),
            closed_within_1s,
            all_closed_after_s,
            answers,
            master: usage(0),
            store: usage(1),
            client,
            health,
        }
    }
}

/// One attacking connection, and when the server closed it.
struct Conn {
    stream: TcpStream,
    closed_at: Option<Duration>,
    /// What the server sent (the first 256 bytes).
    answer: Vec<u8>,
}

impl Conn {
    /// Reads what the server sent without waiting; true once it closed the connection.
    fn poll_closed(&mut self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        let mut buf = [0u8; 4096];
        let closed = loop {
            match self.stream.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => {
                    let room = 256usize.saturating_sub(self.answer.len());
                    self.answer.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        let _ = self.stream.set_nonblocking(false);
        closed
    }
}

/// Half the connections announce 16 MiB of message fields and send 1 KiB of them; the other
/// half announce a payload of 2^64-1 bytes.
fn huge_frame(c: &mut TcpStream, i: usize) -> std::io::Result<()> {
    let fields = i % 2 == 0;
    let header = match fields {
        true => Header::request(Opcode::Ping, 1, MAX_META_LEN as usize, 0),
        false => Header::request(Opcode::Write, 1, 0, u64::MAX),
    };
    c.write_all(&header.encode())?;
    if fields {
        c.write_all(&[0u8; 1024])?;
    }
    Ok(())
}

/// Nine requests in ten declare a terabyte body; the tenth streams a chunked body of up to
/// 4 MiB (the metadata port takes 1 MiB).
fn huge_body(c: &mut TcpStream, i: usize) -> std::io::Result<()> {
    if i % 10 != 0 {
        return c.write_all(
            b"PUT /metadata?key=abuse HTTP/1.1\r\nHost: rbgctl\r\nContent-Length: 1000000000000\r\n\r\n",
        );
    }
    c.write_all(
        b"PUT /metadata?key=abuse HTTP/1.1\r\nHost: rbgctl\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    c.set_write_timeout(Some(Duration::from_millis(200)))?;
    let chunk = [b'x'; 64 << 10];
    for _ in 0..64 {
        // A server that stopped reading leaves the write stuck: that is its answer.
        if write!(c, "{:x}\r\n", chunk.len())
            .and_then(|_| c.write_all(&chunk))
            .and_then(|_| c.write_all(b"\r\n"))
            .is_err()
        {
            break;
        }
    }
    let _ = c.set_write_timeout(None);
    Ok(())
}

/// The status code of an HTTP answer's first line.
fn http_status(answer: &[u8]) -> Option<u16> {
    let line = answer.strip_prefix(b"HTTP/1.1 ")?;
    std::str::from_utf8(line.get(..3)?).ok()?.parse().ok()
}

/// The normal client: put and get of 4 KiB, and the master's `/health`, until `stop`.
fn run_probes(
    client: &Client,
    health: &reqwest::blocking::Client,
    url: &str,
    stop: &AtomicBool,
) -> (Probe, Probe) {
    let (mut kv, mut http) = (Probe::default(), Probe::default());
    let value = [7u8; 4096];
    let mut i = 0u64;
    let time = |p: &mut Probe, ok: bool, t: Instant| {
        match ok {
            true => p.ok += 1,
            false => p.failed += 1,
        }
        p.slowest_ms = p.slowest_ms.max(t.elapsed().as_secs_f64() * 1e3);
    };
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let key = format!("abuse/probe/{}", i % 64);
        let t = Instant::now();
        let ok = client
            .put(&key, &value, &ReplicateConfig::default())
            .is_ok()
            && client.get(&key).is_ok_and(|v| v == value);
        time(&mut kv, ok, t);
        if i % 10 == 0 {
            let t = Instant::now();
            let ok = health
                .get(url)
                .send()
                .is_ok_and(|r| r.status().is_success());
            time(&mut http, ok, t);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (kv, http)
}

/// Resident memory (KiB) and open files of a process; zeros once it is gone.
fn sample(pid: u32) -> (u64, usize) {
    let rss = super::kit::procfs::rss_bytes(pid).unwrap_or(0) / 1024;
    (rss, super::kit::procfs::open_files(pid))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let r = self;
        let mut out = String::new();
        for a in &r.attacks {
            let _ = writeln!(out, "{}: {}", a.name, a.what);
            let closed = match a.all_closed_after_s {
                Some(s) => format!("all closed by the servers after {s:.1} s"),
                None => "SOME STILL OPEN at the deadline".into(),
            };
            let _ = writeln!(
                out,
                "  connections: {} attempted, {} accepted by the kernel in {:.1} s, {} closed within 1 s after; {closed}",
                a.attempted, a.opened, a.opening_s, a.closed_within_1s
            );
            if !a.answers.is_empty() {
                let codes: Vec<String> =
                    a.answers.iter().map(|(c, n)| format!("{c}: {n}")).collect();
                let _ = writeln!(out, "  HTTP answers: {}", codes.join(", "));
            }
            for (role, u) in [("master", &a.master), ("store", &a.store)] {
                let _ = writeln!(
                    out,
                    "  {role:<6} RSS {:.1} -> peak {:.1} -> {:.1} MiB; open files {} -> peak {} -> {}",
                    u.rss_before_mib,
                    u.rss_peak_mib,
                    u.rss_after_mib,
                    u.fds_before,
                    u.fds_peak,
                    u.fds_after
                );
            }
            let _ = writeln!(
                out,
                "  normal client meanwhile: put+get {} ok, {} failed (slowest {:.0} ms); /health {} ok, {} failed (slowest {:.0} ms)",
                a.client.ok, a.client.failed, a.client.slowest_ms, a.health.ok, a.health.failed, a.health.slowest_ms
            );
        }
        out
    }
}
