//! `rbgctl bench router`: the router's overhead. Starts FAKE workers (`bench fake-worker`, no
//! model) and a router in front of them as separate processes on loopback, then drives the
//! same load at a worker directly and through the router, interleaved, on keep-alive
//! connections: requests per second, latency p50/p99, time to first byte for streams, and the
//! router's CPU time per request (from /proc).

use crate::bench::stats::percentile;
use crate::launch::{self, wait_http_ok, Launcher, Logs, Spawned};
use crate::router::config::{PolicyKind, RouterConfig};
use crate::testkit::fake_worker;
use anyhow::{bail, Context as _};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Args)]
pub struct RouterBenchArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Repetitions; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Concurrent clients, each on its own keep-alive connection (comma-separated list).
    #[arg(long, default_value = "1,32", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Cases: gen, gen-stream, chat, chat-stream.
    #[arg(
        long,
        default_value = "gen,gen-stream,chat,chat-stream",
        value_delimiter = ','
    )]
    pub cases: Vec<String>,
    /// Characters of the (fixed) prompt.
    #[arg(long, default_value_t = 512)]
    pub prompt_chars: usize,
    /// Tokens per reply.
    #[arg(long, default_value_t = 8)]
    pub tokens: usize,
    /// Fake workers behind the router (the direct case uses the first).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Router policy.
    #[arg(long, value_enum, default_value_t = PolicyKind::RoundRobin)]
    pub policy: PolicyKind,
    /// CPU microseconds each fake worker burns per request (0: as fast as it can answer).
    #[arg(long, default_value_t = 0)]
    pub worker_cpu_us: u64,
    /// Runtime threads of each fake worker.
    #[arg(long, default_value_t = 1)]
    pub worker_threads: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Another router measured beside rbgctl's, on the same workers in the same run,
    /// interleaved: a command run with `sh -c`, where `{port}` becomes a free port and
    /// `{workers}` the worker URLs (space-separated), e.g. `smg launch --host 127.0.0.1
    /// --port {port} --worker-urls {workers} --policy round_robin`. Default: none.
    #[arg(long)]
    pub peer_cmd: Option<String>,
    /// The peer's name in the report. Default: peer.
    #[arg(long, default_value = "peer")]
    pub peer_name: String,
}

/// The peer router's process, stopped when dropped.
struct Peer {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the peer command and waits (up to 120 s) for its `/readiness` (or `/health`).
fn start_peer(cmd: &str, workers: &[String], dir: &std::path::Path) -> anyhow::Result<Peer> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let line = cmd
        .replace("{port}", &port.to_string())
        .replace("{workers}", &workers.join(" "));
    let log = dir.join("peer.log");
    let out = std::fs::File::create(&log)?;
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec {line}"))
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting the peer: {line}"))?;
    let mut peer = Peer { child, port, log };
    let deadline = Instant::now() + Duration::from_secs(120);
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    loop {
        if let Some(status) = peer.child.try_wait()? {
            bail!(
                "the peer exited ({status}) before it was ready: {line}\n(log: {})",
                peer.log.display()
            );
        }
        let ready = ["/readiness", "/health"].iter().any(|p| {
            client
                .get(format!("http://127.0.0.1:{port}{p}"))
                .send()
                .is_ok_and(|r| r.status().is_success())
        });
        if ready {
            return Ok(peer);
        }
        if Instant::now() > deadline {
            bail!(
                "the peer never answered /readiness on port {port}: {line}\n(log: {})",
                peer.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Measure {
    pub requests: u64,
    pub errors: u64,
    pub req_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Time to the first body byte (streams).
    pub ttfb_p50_ms: f64,
    pub ttfb_p99_ms: f64,
    /// Router CPU per request, microseconds (router runs only).
    pub cpu_us_per_req: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub case: String,
    pub clients: usize,
    pub direct: Measure,
    pub router: Measure,
    /// Router req/s over direct req/s.
    pub throughput_ratio: f64,
    /// The peer router (`--peer-cmd`), measured the same way.
    pub peer: Option<Measure>,
    /// rbgctl's router req/s over the peer's.
    pub router_over_peer: Option<f64>,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
    pub added_ttfb_p50_ms: f64,
}

/// User + system CPU seconds of a process (Linux reports ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn body_for(case: &str, prompt: &str, tokens: usize) -> anyhow::Result<(&'static str, Bytes)> {
    let stream = case.ends_with("-stream");
    let (path, v) = match case.trim_end_matches("-stream") {
        "gen" => (
            "/generate",
            serde_json::json!({"text": prompt, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}, "stream": stream}),
        ),
        "chat" => (
            "/v1/chat/completions",
            serde_json::json!({"model": "fake-model", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": tokens, "temperature": 0, "stream": stream}),
        ),
        other => bail!("unknown case {other:?} (gen, gen-stream, chat, chat-stream)"),
    };
    Ok((path, Bytes::from(v.to_string())))
}

/// One client on one keep-alive connection until `deadline`: (latency, ttfb) per request.
async fn client_loop(
    port: u16,
    path: &'static str,
    body: Bytes,
    deadline: Instant,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, u64)> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let mut lat = Vec::new();
    let mut ttfb = Vec::new();
    let mut errors = 0;
    while Instant::now() < deadline {
        let req = http::Request::post(path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))?;
        let t0 = Instant::now();
        send.ready().await?;
        let resp = send.send_request(req).await?;
        let ok = resp.status().is_success();
        let mut b = resp.into_body();
        let mut first = None;
        while let Some(frame) = b.frame().await {
            let frame = frame?;
            if first.is_none() && frame.data_ref().is_some_and(|d| !d.is_empty()) {
                first = Some(t0.elapsed());
            }
        }
        let total = t0.elapsed();
        if ok {
            lat.push(total);
            ttfb.push(first.unwrap_or(total));
        } else {
            errors += 1;
        }
    }
    Ok((lat, ttfb, errors))
}

fn measure(
    rt: &tokio::runtime::Runtime,
    port: u16,
    case: &str,
    clients: usize,
    args: &RouterBenchArgs,
    prompt: &str,
    cpu_pid: Option<u32>,
) -> anyhow::Result<Measure> {
    let (path, body) = body_for(case, prompt, args.tokens)?;
    let cpu0 = cpu_pid.and_then(cpu_seconds);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let results = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..clients {
            set.spawn(client_loop(port, path, body.clone(), deadline));
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            out.push(r.context("client task")?);
        }
        anyhow::Ok(out)
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu1 = cpu_pid.and_then(cpu_seconds);
    let mut lat = Vec::new();
    let mut ttfb = Vec::new();
    let mut errors = 0;
    for r in results {
        let (l, t, e) = r?;
        lat.extend(l);
        ttfb.extend(t);
        errors += e;
    }
    lat.sort();
    ttfb.sort();
    let n = lat.len() as u64;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(Measure {
        requests: n,
        errors,
        req_per_s: n as f64 / elapsed,
        p50_ms: ms(percentile(&lat, 0.5)),
        p99_ms: ms(percentile(&lat, 0.99)),
        ttfb_p50_ms: ms(percentile(&ttfb, 0.5)),
        ttfb_p99_ms: ms(percentile(&ttfb, 0.99)),
        cpu_us_per_req: match (cpu0, cpu1) {
            (Some(a), Some(b)) if n > 0 => Some((b - a) * 1e6 / n as f64),
            _ => None,
        },
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn median_measure(ms: &[Measure]) -> Measure {
    let pick = |f: fn(&Measure) -> f64| median(ms.iter().map(f).collect());
    Measure {
        requests: ms.iter().map(|m| m.requests).sum(),
        errors: ms.iter().map(|m| m.errors).sum(),
        req_per_s: pick(|m| m.req_per_s),
        p50_ms: pick(|m| m.p50_ms),
        p99_ms: pick(|m| m.p99_ms),
        ttfb_p50_ms: pick(|m| m.ttfb_p50_ms),
        ttfb_p99_ms: pick(|m| m.ttfb_p99_ms),
        cpu_us_per_req: ms
            .iter()
            .all(|m| m.cpu_us_per_req.is_some())
            .then(|| pick(|m| m.cpu_us_per_req.unwrap_or(0.0))),
    }
}

pub fn run(args: RouterBenchArgs) -> anyhow::Result<()> {
    let launcher = Launcher::new(Logs::Null)?;
    let mut workers: Vec<Spawned<fake_worker::Addrs>> = Vec::new();
    for i in 0..args.workers.max(1) {
        let (tokens, cpu_us, threads) = (
            args.tokens.to_string(),
            args.worker_cpu_us.to_string(),
            args.worker_threads.to_string(),
        );
        let extra = [
            "--tokens",
            &tokens,
            "--cpu-us",
            &cpu_us,
            "--threads",
            &threads,
        ];
        let name = format!("w{i}");
        workers.push(fake_worker::spawn(
            &launcher,
            "127.0.0.1",
            0,
            &name,
            &extra,
        )?);
    }
    let worker_ports: Vec<u16> = workers.iter().map(|w| w.addrs.http.port()).collect();
    let router = launcher.spawn::<launch::Router>(
        "router",
        RouterConfig {
            host: "127.0.0.1".into(),
            port: 0,
            prometheus_port: 0,
            policy: args.policy,
            worker_urls: worker_ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            ..RouterConfig::default()
        },
    )?;
    let router_port = router.addrs.http.port();
    let router_pid = router.pid().unwrap_or(0);
    wait_http_ok(
        &format!("http://127.0.0.1:{router_port}/readiness"),
        Duration::from_secs(20),
    )?;
    let scratch = std::env::temp_dir().join(format!("rbgctl-bench-router-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let peer = match &args.peer_cmd {
        Some(cmd) => {
            let urls: Vec<String> = worker_ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect();
            Some(start_peer(cmd, &urls, &scratch)?)
        }
        None => None,
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let prompt: String = "The quick brown fox jumps over the lazy dog. "
        .chars()
        .cycle()
        .take(args.prompt_chars)
        .collect();
    // Warm both paths (connections, allocator, caches).
    let warm = RouterBenchArgs {
        seconds: 0.3,
        ..args.clone()
    };
    // Each side: 0 direct, 1 rbgctl's router, 2 the peer.
    let mut sides = vec![(worker_ports[0], None), (router_port, Some(router_pid))];
    if let Some(p) = &peer {
        sides.push((p.port, Some(p.child.id())));
    }
    for &(port, _) in &sides {
        measure(&rt, port, "gen", 4, &warm, &prompt, None)?;
    }
    let mut rows = Vec::new();
    let steps = args.cases.len() * args.clients.len() * args.reps.max(1) * sides.len();
    let progress =
        crate::bench::progress::Progress::new("router measurements", steps as u64, args.json);
    if !args.json {
        eprintln!(
            "… router vs direct: {steps} measurements of {} s each (about {:.0} s)",
            args.seconds,
            steps as f64 * args.seconds
        );
    }
    for case in &args.cases {
        for &clients in &args.clients {
            let mut measured: Vec<Vec<Measure>> = vec![Vec::new(); sides.len()];
            for rep in 0..args.reps.max(1) {
                // Rotate the order so that drift does not favour one side.
                for k in 0..sides.len() {
                    let side = (rep + k) % sides.len();
                    let (port, pid) = sides[side];
                    let m = measure(&rt, port, case, clients, &args, &prompt, pid)?;
                    progress.set_message(&format!("{case}, {clients} clients"));
                    progress.inc(1);
                    measured[side].push(m);
                }
            }
            let d = median_measure(&measured[0]);
            let r = median_measure(&measured[1]);
            let p = measured.get(2).map(|m| median_measure(m));
            rows.push(Row {
                router_over_peer: p
                    .as_ref()
                    .filter(|p| p.req_per_s > 0.0)
                    .map(|p| r.req_per_s / p.req_per_s),
                peer: p,
                case: case.clone(),
                clients,
                throughput_ratio: if d.req_per_s > 0.0 {
                    r.req_per_s / d.req_per_s
                } else {
                    0.0
                },
                added_p50_ms: r.p50_ms - d.p50_ms,
                added_p99_ms: r.p99_ms - d.p99_ms,
                added_ttfb_p50_ms: r.ttfb_p50_ms - d.ttfb_p50_ms,
                direct: d,
                router: r,
            });
        }
    }
    progress.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "rbgctl router vs direct, FAKE workers ({} x, {} thread(s), {} µs CPU/request), {} s x {} reps, medians",
        args.workers, args.worker_threads, args.worker_cpu_us, args.seconds, args.reps
    );
    println!(
        "{:<12} {:>4} {:>10} {:>10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8}",
        "case",
        "cli",
        "direct/s",
        "router/s",
        "ratio",
        "d p50ms",
        "r p50ms",
        "d p99ms",
        "r p99ms",
        "d ttfb50",
        "r ttfb50",
        "cpu µs"
    );
    for r in &rows {
        println!(
            "{:<12} {:>4} {:>10.0} {:>10.0} {:>5.0}% {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10.3} {:>10.3} {:>8.1}",
            r.case,
            r.clients,
            r.direct.req_per_s,
            r.router.req_per_s,
            r.throughput_ratio * 100.0,
            r.direct.p50_ms,
            r.router.p50_ms,
            r.direct.p99_ms,
            r.router.p99_ms,
            r.direct.ttfb_p50_ms,
            r.router.ttfb_p50_ms,
            r.router.cpu_us_per_req.unwrap_or(f64::NAN),
        );
    }
    if peer.is_some() {
        let name = &args.peer_name;
        println!();
        println!("{name} on the same workers, same run (interleaved)");
        println!(
            "{:<12} {:>4} {:>10} {:>10} {:>7} {:>9} {:>9} {:>10} {:>8} {:>9}",
            "case",
            "cli",
            "peer/s",
            "router/s",
            "r/peer",
            "p p50ms",
            "p p99ms",
            "p ttfb50",
            "p cpu µs",
            "p/direct"
        );
        for r in &rows {
            let Some(p) = &r.peer else { continue };
            println!(
                "{:<12} {:>4} {:>10.0} {:>10.0} {:>6.2}x {:>9.3} {:>9.3} {:>10.3} {:>8.1} {:>8.0}%",
                r.case,
                r.clients,
                p.req_per_s,
                r.router.req_per_s,
                r.router_over_peer.unwrap_or(f64::NAN),
                p.p50_ms,
                p.p99_ms,
                p.ttfb_p50_ms,
                p.cpu_us_per_req.unwrap_or(f64::NAN),
                if r.direct.req_per_s > 0.0 {
                    p.req_per_s / r.direct.req_per_s * 100.0
                } else {
                    0.0
                },
            );
        }
    }
    Ok(())
}
