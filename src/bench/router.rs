//! `rbgctl bench router`: the router's overhead. Starts FAKE workers (`bench fake-worker`, no
//! model; or with `--worker-kind sim` SIMULATED engines publishing KV events) and a router in
//! front of them as separate processes on loopback, then drives the
//! same load at the workers directly and through the router (and through a peer router, given
//! as a command line), interleaved, on keep-alive connections: requests per second, latency
//! p50/p99, time to first byte for streams, and each router's CPU time per request (from
//! /proc).
//!
//! Prefill/decode cases deploy a FAKE prefill worker that holds each answer `--prefill-ms`
//! (the prefill leg's answer time) and a FAKE decode worker: `pd-*` runs SGLang's contract
//! (both legs at once, bootstrap fields), `vllm-pd-*` vLLM's over the Mooncake connector
//! (rbgctl: the legs at once). There, "direct" is the bench's client running both legs
//! itself, at once, reading decode's answer as it comes: the router-less bound. FAKE engines
//! hold no KV cache, so decode never waits for prefill: legs sent at once save the whole
//! prefill answer time, where real engines save its return trip and decode's admission.

use crate::bench::kit::report::BenchReport;
use crate::bench::kit::stats::percentile;
use crate::launch::{self, wait_http_ok, Launcher, Logs};
use crate::router::config::{
    Backend, MetricsConfig, PolicyConfig, PrefillSpec, RouterConfig, ServerConfig,
};
use crate::router::policy::PolicyKind;
use crate::router::request::{self, Endpoint};
use crate::router::vllm;
use crate::testkit::fake_worker;
use anyhow::{bail, Context as _};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rbgctl bench router`'s arguments.
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
    /// Cases: `gen` (/generate) and `chat` (/v1/chat/completions), `-stream` added for SSE;
    /// prefixed `pd-` for SGLang prefill/decode, `vllm-pd-` for vLLM's over Mooncake (chat
    /// only), e.g. `gen,pd-gen-stream,vllm-pd-chat-stream`.
    #[arg(
        long,
        default_value = "gen,gen-stream,chat,chat-stream",
        value_delimiter = ','
    )]
    pub cases: Vec<String>,
    /// Characters of the (fixed) prompt.
    #[arg(long, default_value_t = 512)]
    pub prompt_chars: usize,
    /// Distinct prompts (each the prompt behind a prefix of its own): client `i` sends prompt
    /// `i mod N`, so that a cache-aware policy has something to spread. Regular cases only
    /// (prefill/decode cases send the first).
    #[arg(long, default_value_t = 1)]
    pub prompts: usize,
    /// Tokens per reply.
    #[arg(long, default_value_t = 8)]
    pub tokens: usize,
    /// Fake workers behind the router in regular cases (the direct case spreads its clients
    /// over them as the router's round robin would).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// What the regular cases' workers are: `fake` (FAKE workers: canned tokens, nothing
    /// cached) or `sim` (SIMULATED engines answering at once, whose caches publish KV events:
    /// what `--policy precise_prefix` routes on).
    #[arg(long, value_enum, default_value_t = WorkerKind::Fake)]
    pub worker_kind: WorkerKind,
    /// Router policy.
    #[arg(long, value_enum, default_value_t = PolicyKind::RoundRobin)]
    pub policy: PolicyKind,
    /// CPU microseconds each fake worker burns per request (0: as fast as it can answer).
    #[arg(long, default_value_t = 0)]
    pub worker_cpu_us: u64,
    /// Runtime threads of each fake worker.
    #[arg(long, default_value_t = 1)]
    pub worker_threads: usize,
    /// Runtime threads of rbgctl's router. Default: the router's (one per core, at most 4).
    #[arg(long)]
    pub router_threads: Option<usize>,
    /// How rbgctl's router threads share the work (`router --runtime`). Default: the
    /// router's (`thread_per_core`).
    #[arg(long, value_enum)]
    pub router_runtime: Option<crate::router::config::RuntimeKind>,
    /// Threads of the bench's own load generator (the clients). One thread drives about
    /// 100,000 requests a second; give it more where the router and workers have cores to
    /// spare, so that the generator is not the limit of the direct figure. Default: 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub load_threads: u16,
    /// Prefill/decode cases: milliseconds the FAKE prefill worker holds each answer (the
    /// prefill leg's answer time).
    #[arg(long, default_value_t = 20)]
    pub prefill_ms: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with charts (requests/s, p50 and p99 latency, time to
    /// first byte per case: direct, rbgctl's router and the peer) to this file.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Another router measured beside rbgctl's in regular cases, on the same workers in the
    /// same run, interleaved: a command run with `sh -c`, where `{port}` and
    /// `{prometheus_port}` become free ports and `{workers}` the worker URLs (space-separated),
    /// e.g. `smg launch --host 127.0.0.1 --port {port} --prometheus-port {prometheus_port}
    /// --worker-urls {workers} --policy round_robin`. Default: none.
    #[arg(long)]
    pub peer_cmd: Option<String>,
    /// The peer in prefill/decode cases: `{prefill}` becomes the prefill worker's URL and
    /// bootstrap port (space-separated, as SMG's `--prefill URL PORT`), `{decode}` the decode
    /// worker's URL, `{port}` and `{prometheus_port}` as for --peer-cmd, e.g. `smg launch
    /// --host 127.0.0.1 --port {port} --prometheus-port {prometheus_port} --pd-disaggregation
    /// --prefill {prefill} --decode {decode}`. Default: none.
    #[arg(long)]
    pub peer_pd_cmd: Option<String>,
    /// The peer's name in the report. Default: peer.
    #[arg(long, default_value = "peer")]
    pub peer_name: String,
    /// Regular cases: also measure rbgctl's router with admission on, in the same run,
    /// interleaved: a tenants file of N tenants (each with request and token rates far above
    /// the load and a concurrency cap), clients spread over their keys, and
    /// --max-concurrent-requests at 4 × the clients, so that every request goes through the
    /// tenant's limits and the class's capacity. Its CPU per request is set beside the router
    /// without tenants. 0: not measured.
    #[arg(long, default_value_t = 0)]
    pub tenants: usize,
}

/// The API key of tenant `i` in `bench router --tenants`.
fn tenant_key(i: usize) -> String {
    format!("bench-tenant-key-{i:06}")
}

/// The tenants file of `bench router --tenants n`.
fn tenants_file(n: usize) -> String {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "[[tenant]]\nname = \"t{i}\"\nkeys = [\"{}\"]\nrequests_per_second = 1e9\n\
             tokens_per_second = 1e12\nmax_concurrent = 100000\n",
            crate::router::tenants::table::key_entry(&tenant_key(i))
        ));
    }
    text
}

/// What serves behind the router in regular cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkerKind {
    /// `rbgctl bench fake-worker`: canned tokens, no cache.
    Fake,
    /// `rbgctl sim-engine`, answering at once, publishing its caches' KV events.
    Sim,
}

impl WorkerKind {
    fn label(self) -> &'static str {
        match self {
            WorkerKind::Fake => "FAKE workers",
            WorkerKind::Sim => "SIMULATED engines answering at once",
        }
    }
}

/// A SIMULATED engine that answers at once and publishes its KV events on free ports.
fn sim_engine_config() -> crate::engine::EngineConfig {
    crate::engine::EngineConfig {
        port: 0,
        prefill_us_per_token: 0.0,
        decode_ms_per_token: 0.0,
        kv_events_config: Some(
            r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,"replay_endpoint":"tcp://127.0.0.1:0"}"#
                .into(),
        ),
        ..Default::default()
    }
}

/// How a case's workers are deployed, and so which contract the routers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Regular workers.
    Regular,
    /// SGLang prefill/decode: both legs at once, with bootstrap fields.
    SglangPd,
    /// vLLM prefill/decode over the Mooncake connector.
    VllmPd,
}

/// One measured case: `[pd-|vllm-pd-](gen|chat)[-stream]`.
#[derive(Clone, Debug)]
struct Case {
    name: String,
    mode: Mode,
    endpoint: Endpoint,
    stream: bool,
}

impl Case {
    fn parse(name: &str) -> anyhow::Result<Case> {
        let (mode, rest) = if let Some(r) = name.strip_prefix("vllm-pd-") {
            (Mode::VllmPd, r)
        } else if let Some(r) = name.strip_prefix("pd-") {
            (Mode::SglangPd, r)
        } else {
            (Mode::Regular, name)
        };
        let (kind, stream) = match rest.strip_suffix("-stream") {
            Some(k) => (k, true),
            None => (rest, false),
        };
        let endpoint = match kind {
            "gen" => Endpoint::Generate,
            "chat" => Endpoint::Chat,
            _ => bail!(
                "unknown case {name:?}: [pd-|vllm-pd-](gen|chat)[-stream], e.g. gen, \
                 pd-gen-stream, vllm-pd-chat"
            ),
        };
        if mode == Mode::VllmPd && endpoint == Endpoint::Generate {
            bail!("case {name:?}: vLLM serves no /generate; use vllm-pd-chat");
        }
        Ok(Case {
            name: name.to_string(),
            mode,
            endpoint,
            stream,
        })
    }

    /// The client's request body.
    fn body(&self, prompt: &str, tokens: usize) -> Bytes {
        let v = match self.endpoint {
            Endpoint::Generate => serde_json::json!({"text": prompt,
                "sampling_params": {"max_new_tokens": tokens, "temperature": 0},
                "stream": self.stream}),
            _ => serde_json::json!({"model": "fake-model",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": tokens, "temperature": 0, "stream": self.stream}),
        };
        Bytes::from(v.to_string())
    }
}

/// A peer router's process, stopped when dropped.
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

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Tries to start a peer this many times when another process took a port chosen for it
/// between the choice and the peer's bind.
const PORT_TRIES: usize = 3;

/// Starts a peer command (`{port}`, `{prometheus_port}` and the placeholders in `vars`
/// replaced) and waits (up to 120 s) for its `/readiness` (or `/health`). A peer that exits
/// because a port it was given is in use (taken since it was chosen) is started again on
/// other ports.
fn start_peer(
    template: &str,
    vars: &[(&str, String)],
    log: std::path::PathBuf,
) -> anyhow::Result<Peer> {
    let mut tries = 0;
    loop {
        tries += 1;
        match start_peer_once(template, vars, &log) {
            Err(PeerStart::PortTaken(e)) if tries < PORT_TRIES => {
                tracing::info!(error = %e, "a port chosen for the peer was taken; other ports");
            }
            Err(PeerStart::PortTaken(e) | PeerStart::Failed(e)) => return Err(e),
            Ok(peer) => return Ok(peer),
        }
    }
}

enum PeerStart {
    /// It exited saying an address was in use.
    PortTaken(anyhow::Error),
    Failed(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for PeerStart {
    fn from(e: E) -> PeerStart {
        PeerStart::Failed(e.into())
    }
}

fn start_peer_once(
    template: &str,
    vars: &[(&str, String)],
    log: &std::path::Path,
) -> Result<Peer, PeerStart> {
    let log = log.to_path_buf();
    let port = free_port()?;
    let mut line = template
        .replace("{port}", &port.to_string())
        .replace("{prometheus_port}", &free_port()?.to_string());
    for (name, value) in vars {
        line = line.replace(name, value);
    }
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
            let e = anyhow::anyhow!(
                "the peer exited ({status}) before it was ready: {line}\n(log: {})",
                peer.log.display()
            );
            let said = std::fs::read_to_string(&peer.log).unwrap_or_default();
            return Err(if said.to_ascii_lowercase().contains("in use") {
                PeerStart::PortTaken(e)
            } else {
                PeerStart::Failed(e)
            });
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
            return Err(PeerStart::Failed(anyhow::anyhow!(
                "the peer never answered /readiness on port {port}: {line}\n(log: {})",
                peer.log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Where one measurement's requests go.
#[derive(Clone)]
enum Target {
    /// A router, or the regular workers: client `i` keeps to `ports[i % ports.len()]` and
    /// sends `bodies[i % bodies.len()]`.
    One {
        ports: Arc<[u16]>,
        bodies: Arc<[Bytes]>,
        /// `Authorization` values: client `i` sends `keys[i % keys.len()]` (none when empty).
        keys: Arc<[http::HeaderValue]>,
    },
    /// Both legs of a prefill/decode request, sent at once by the client itself; the answer
    /// is decode's.
    Legs {
        prefill: (u16, Bytes),
        decode: (u16, Bytes),
    },
}

/// The workers of one mode, rbgctl's router in front of them, and the peer's.
struct Deployment {
    /// The regular workers the direct case spreads its clients over, or (prefill, decode).
    direct: Direct,
    /// Prefill's bootstrap port (PD).
    bootstrap: u16,
    /// vLLM/Mooncake: the prefill engine as its bootstrap server describes it.
    engine: Option<vllm::MooncakeEngine>,
    router: (u16, Option<u32>),
    /// `--tenants`: rbgctl's router with admission on, and its clients' keys.
    admission: Option<Admission>,
    peer: Option<Peer>,
    _workers: Vec<launch::Process>,
    _router: launch::Child<launch::Router>,
}

/// rbgctl's router with a tenants file, beside the one without.
struct Admission {
    port: u16,
    pid: Option<u32>,
    keys: Arc<[http::HeaderValue]>,
    _router: launch::Child<launch::Router>,
}

#[derive(Clone)]
enum Direct {
    Spread(Arc<[u16]>),
    Legs { prefill: u16, decode: u16 },
}

/// rbgctl's router started with `config`, once ready: the child and its port.
fn start_router(
    launcher: &Launcher,
    name: &str,
    config: RouterConfig,
) -> anyhow::Result<(launch::Child<launch::Router>, u16)> {
    let router = launcher.spawn::<launch::Router>(name, config)?;
    let port = router.addrs.http.port();
    wait_http_ok(
        &format!("http://127.0.0.1:{port}/readiness"),
        Duration::from_secs(20),
    )?;
    Ok((router, port))
}

/// Which of a deployment's paths a measurement takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Direct,
    Router,
    /// rbgctl's router with admission on (`--tenants`).
    Admission,
    Peer,
}

impl Deployment {
    fn start(
        mode: Mode,
        args: &RouterBenchArgs,
        launcher: &Launcher,
        scratch: &std::path::Path,
    ) -> anyhow::Result<Deployment> {
        let (tokens, cpu_us, threads) = (
            args.tokens.to_string(),
            args.worker_cpu_us.to_string(),
            args.worker_threads.to_string(),
        );
        let common = [
            "--tokens",
            &tokens,
            "--cpu-us",
            &cpu_us,
            "--threads",
            &threads,
        ];
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let fake = |name: &str, extra: &[&str]| {
            fake_worker::spawn(launcher, "127.0.0.1", 0, name, extra)
                .map(|w| (w.process, w.addrs.http.port()))
        };
        let bootstrap = free_port()?;
        let mut workers = Vec::new();
        let mut config = RouterConfig {
            server: ServerConfig {
                host: "127.0.0.1".into(),
                port: 0,
                runtime_threads: args.router_threads,
                runtime: args.router_runtime.unwrap_or_default(),
                ..Default::default()
            },
            metrics: MetricsConfig {
                prometheus_port: 0,
                ..Default::default()
            },
            policy: PolicyConfig {
                policy: args.policy,
                ..Default::default()
            },
            ..RouterConfig::default()
        };
        let (direct, peer_vars) = match mode {
            Mode::Regular => {
                let mut ports = Vec::new();
                for i in 0..args.workers.max(1) {
                    let name = format!("w{i}");
                    let (process, port) = match args.worker_kind {
                        WorkerKind::Fake => fake(&name, &common)?,
                        WorkerKind::Sim => {
                            let e = launcher.spawn::<launch::Engine>(&name, sim_engine_config())?;
                            (e.process, e.addrs.http.port())
                        }
                    };
                    workers.push(process);
                    ports.push(port);
                }
                config.server.worker_urls = ports.iter().map(|&p| url(p)).collect();
                let vars = vec![("{workers}", config.server.worker_urls.join(" "))];
                (Direct::Spread(ports.into()), vars)
            }
            Mode::SglangPd | Mode::VllmPd => {
                let held = args.prefill_ms.to_string();
                let b = bootstrap.to_string();
                let mut prefill_args = common.to_vec();
                prefill_args.extend(["--headers-delay-ms", &held]);
                let mut decode_args = common.to_vec();
                if mode == Mode::VllmPd {
                    prefill_args.extend(["--engine", "vllm", "--kv-bootstrap-port", &b]);
                    decode_args.extend(["--engine", "vllm"]);
                    config.server.backend = Backend::Vllm;
                }
                let (prefill, prefill_port) = fake("prefill", &prefill_args)?;
                let (decode, decode_port) = fake("decode", &decode_args)?;
                workers.extend([prefill, decode]);
                config.pd.enabled = true;
                config.pd.prefill = vec![PrefillSpec {
                    url: url(prefill_port),
                    bootstrap_port: Some(bootstrap),
                }];
                config.pd.decode = vec![url(decode_port)];
                let vars = vec![
                    ("{prefill}", format!("{} {bootstrap}", url(prefill_port))),
                    ("{decode}", url(decode_port)),
                ];
                let direct = Direct::Legs {
                    prefill: prefill_port,
                    decode: decode_port,
                };
                (direct, vars)
            }
        };
        let engine = match mode {
            Mode::VllmPd => Some(query_engine(bootstrap)?),
            _ => None,
        };
        let admission = match (mode, args.tenants) {
            (Mode::Regular, n) if n > 0 => {
                let file = scratch.join("tenants.toml");
                std::fs::write(&file, tenants_file(n))?;
                let mut c = config.clone();
                c.tenants.tenants_file = Some(file);
                let most = args.clients.iter().max().copied().unwrap_or(1);
                c.limits.max_concurrent_requests = (4 * most) as i64;
                let (r, port) = start_router(launcher, "router-admission", c)?;
                let keys = (0..n)
                    .map(|i| http::HeaderValue::from_str(&format!("Bearer {}", tenant_key(i))))
                    .collect::<Result<_, _>>()?;
                Some(Admission {
                    port,
                    pid: r.process.pid(),
                    keys,
                    _router: r,
                })
            }
            _ => None,
        };
        let (router, router_port) = start_router(launcher, &format!("router-{mode:?}"), config)?;
        let template = match mode {
            Mode::Regular => &args.peer_cmd,
            _ => &args.peer_pd_cmd,
        };
        let peer = match template {
            Some(t) => Some(start_peer(
                t,
                &peer_vars,
                scratch.join(format!("peer-{mode:?}.log")),
            )?),
            None => None,
        };
        Ok(Deployment {
            direct,
            bootstrap,
            engine,
            router: (router_port, router.process.pid()),
            admission,
            peer,
            _workers: workers,
            _router: router,
        })
    }

    fn paths(&self) -> Vec<Path> {
        let mut p = vec![Path::Direct, Path::Router];
        if self.admission.is_some() {
            p.push(Path::Admission);
        }
        if self.peer.is_some() {
            p.push(Path::Peer);
        }
        p
    }

    /// Where `case`'s requests go on `path`, and whose CPU is counted.
    fn target(
        &self,
        path: Path,
        case: &Case,
        bodies: &Arc<[Bytes]>,
    ) -> anyhow::Result<(Target, Option<u32>)> {
        let keyed = |ports: Arc<[u16]>, pid: Option<u32>, keys: Arc<[http::HeaderValue]>| {
            (
                Target::One {
                    ports,
                    bodies: bodies.clone(),
                    keys,
                },
                pid,
            )
        };
        let spread = |ports, pid| keyed(ports, pid, Arc::new([]));
        let body = &bodies[0];
        Ok(match (path, &self.direct) {
            (Path::Router, _) => spread(Arc::new([self.router.0]), self.router.1),
            (Path::Admission, _) => {
                let a = self.admission.as_ref().context("no admission router")?;
                keyed(Arc::new([a.port]), a.pid, a.keys.clone())
            }
            (Path::Peer, _) => {
                let p = self.peer.as_ref().context("no peer")?;
                spread(Arc::new([p.port]), Some(p.child.id()))
            }
            (Path::Direct, Direct::Spread(ports)) => spread(ports.clone(), None),
            (Path::Direct, &Direct::Legs { prefill, decode }) => {
                let (p_body, d_body) = self.leg_bodies(case, body)?;
                (
                    Target::Legs {
                        prefill: (prefill, Bytes::from(p_body)),
                        decode: (decode, Bytes::from(d_body)),
                    },
                    None,
                )
            }
        })
    }

    /// The prefill and decode bodies a router would send for `body`.
    fn leg_bodies(&self, case: &Case, body: &[u8]) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
        Ok(match &self.engine {
            Some(engine) => {
                let id = vllm::transfer_id();
                (
                    vllm::prefill_body(body, &vllm::mooncake_prefill_params(&id))?,
                    vllm::decode_body(body, &vllm::mooncake_decode_params(&id, engine))?,
                )
            }
            None => {
                let info = request::inspect(case.endpoint, body)?;
                let rooms = [request::random_room()];
                let b = request::inject_bootstrap(
                    body,
                    &info,
                    "127.0.0.1",
                    Some(self.bootstrap),
                    &rooms,
                )?;
                (b.clone(), b)
            }
        })
    }
}

/// The Mooncake engine behind a prefill worker's bootstrap server, as a router learns it.
fn query_engine(bootstrap: u16) -> anyhow::Result<vllm::MooncakeEngine> {
    let addr = format!("http://127.0.0.1:{bootstrap}");
    wait_http_ok(&format!("{addr}/query"), Duration::from_secs(20))?;
    let answer: serde_json::Value = reqwest::blocking::get(format!("{addr}/query"))?.json()?;
    vllm::mooncake_engine(&answer, &addr)
        .with_context(|| format!("{addr}/query named no engine: {answer}"))
}

/// What one case measured: rate, latencies and the router's CPU.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Measure {
    pub requests: u64,
    pub errors: u64,
    pub req_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Time to the first body byte (of decode's answer in prefill/decode cases).
    pub ttfb_p50_ms: f64,
    pub ttfb_p99_ms: f64,
    /// Router CPU per request, microseconds (router runs only).
    pub cpu_us_per_req: Option<f64>,
    /// Of that CPU, the share the kernel spent on the router's behalf (system calls, the
    /// network stack, waking the peers it writes to), 0 to 1.
    pub kernel_share: Option<f64>,
}

/// One case of `bench router`: the router and the direct path beside it.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub case: String,
    pub mode: Mode,
    pub clients: usize,
    /// Straight to the worker; prefill/decode: the client runs both legs itself, at once.
    pub direct: Measure,
    pub router: Measure,
    /// Router req/s over direct req/s.
    pub throughput_ratio: f64,
    /// rbgctl's router with admission on (`--tenants`), measured the same way.
    pub admission: Option<Measure>,
    /// Its CPU per request over the router's without tenants.
    pub admission_cpu_ratio: Option<f64>,
    /// The peer router (`--peer-cmd`, `--peer-pd-cmd`), measured the same way.
    pub peer: Option<Measure>,
    /// rbgctl's router req/s over the peer's.
    pub router_over_peer: Option<f64>,
    /// The peer's median time to first byte minus rbgctl's.
    pub ttfb_saved_vs_peer_ms: Option<f64>,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
    pub added_ttfb_p50_ms: f64,
}

/// User and system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    super::kit::procfs::cpu_split(pid).map(|c| (c.user.as_secs_f64(), c.system.as_secs_f64()))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(port: u16) -> anyhow::Result<Sender> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// One request on `send`, its answer read to the end: (success, time of its first body byte
/// since `t0`).
async fn exchange(
    send: &mut Sender,
    path: &str,
    body: Bytes,
    key: Option<&http::HeaderValue>,
    t0: Instant,
) -> anyhow::Result<(bool, Option<Duration>)> {
    let mut req = http::Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header(http::header::AUTHORIZATION, k.clone());
    }
    let req = req.body(Full::new(body))?;
    send.ready().await?;
    let resp = send.send_request(req).await?;
    let ok = resp.status().is_success();
    let mut b = resp.into_body();
    let mut first = None;
    while let Some(frame) = b.frame().await {
        if first.is_none() && frame?.data_ref().is_some_and(|d| !d.is_empty()) {
            first = Some(t0.elapsed());
        }
    }
    Ok((ok, first))
}

/// Client `index` on its own keep-alive connection(s) until `deadline`: (latency, time to
/// first byte) per successful request, and the failures.
async fn client_loop(
    target: Target,
    index: usize,
    path: &'static str,
    deadline: Instant,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, u64)> {
    let mut lat = Vec::new();
    let mut ttfb = Vec::new();
    let mut errors = 0;
    let mut record = |ok: bool, first: Option<Duration>, total: Duration| {
        if ok {
            lat.push(total);
            ttfb.push(first.unwrap_or(total));
        } else {
            errors += 1;
        }
    };
    match target {
        Target::One {
            ports,
            bodies,
            keys,
        } => {
            let mut send = connect(ports[index % ports.len()]).await?;
            let body = &bodies[index % bodies.len()];
            let key = (!keys.is_empty()).then(|| &keys[index % keys.len()]);
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let (ok, first) = exchange(&mut send, path, body.clone(), key, t0).await?;
                record(ok, first, t0.elapsed());
            }
        }
        Target::Legs {
            prefill: (p_port, p_body),
            decode: (d_port, d_body),
        } => {
            let (mut p_send, mut d_send) = (connect(p_port).await?, connect(d_port).await?);
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let (p, d) = tokio::join!(
                    exchange(&mut p_send, path, p_body.clone(), None, t0),
                    exchange(&mut d_send, path, d_body.clone(), None, t0)
                );
                let ((p_ok, _), (d_ok, first)) = (p?, d?);
                record(p_ok && d_ok, first, t0.elapsed());
            }
        }
    }
    Ok((lat, ttfb, errors))
}

fn measure(
    rt: &tokio::runtime::Runtime,
    target: &Target,
    path: &'static str,
    clients: usize,
    seconds: f64,
    cpu_pid: Option<u32>,
) -> anyhow::Result<Measure> {
    let cpu0 = cpu_pid.and_then(cpu_seconds);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let results = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..clients {
            set.spawn(client_loop(target.clone(), i, path, deadline));
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            out.push(r.context("client task")?);
        }
        anyhow::Ok(out)
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu1 = cpu_pid.and_then(cpu_seconds);
    // The router's CPU seconds in the run: in its own code, in the kernel.
    let used = cpu0.zip(cpu1).map(|(a, b)| (b.0 - a.0, b.1 - a.1));
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
        cpu_us_per_req: used
            .filter(|_| n > 0)
            .map(|(user, system)| (user + system) * 1e6 / n as f64),
        kernel_share: used
            .filter(|(user, system)| user + system > 0.0)
            .map(|(user, system)| system / (user + system)),
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
        kernel_share: ms
            .iter()
            .all(|m| m.kernel_share.is_some())
            .then(|| pick(|m| m.kernel_share.unwrap_or(0.0))),
    }
}

fn row(case: &Case, clients: usize, paths: &[Path], measured: &[Vec<Measure>]) -> Row {
    let of = |path| {
        paths
            .iter()
            .position(|p| *p == path)
            .map(|i| median_measure(&measured[i]))
    };
    let d = of(Path::Direct).unwrap_or_default();
    let r = of(Path::Router).unwrap_or_default();
    let p = of(Path::Peer);
    let a = of(Path::Admission);
    Row {
        admission_cpu_ratio: a
            .as_ref()
            .and_then(|a| Some(a.cpu_us_per_req? / r.cpu_us_per_req.filter(|c| *c > 0.0)?)),
        admission: a,
        router_over_peer: p
            .as_ref()
            .filter(|p| p.req_per_s > 0.0)
            .map(|p| r.req_per_s / p.req_per_s),
        ttfb_saved_vs_peer_ms: p.as_ref().map(|p| p.ttfb_p50_ms - r.ttfb_p50_ms),
        peer: p,
        case: case.name.clone(),
        mode: case.mode,
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
    }
}

/// Runs `rbgctl bench router` and prints (or writes) its report.
pub fn run(args: RouterBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.prompts >= 1, "--prompts must be at least 1");
    let cases = args
        .cases
        .iter()
        .map(|c| Case::parse(c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let launcher = Launcher::new(Logs::Null)?;
    // Inside the run directory: it goes with the launcher, peer logs and all.
    let scratch = launcher.dir().join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut deployments = BTreeMap::new();
    for case in &cases {
        if let std::collections::btree_map::Entry::Vacant(e) = deployments.entry(case.mode) {
            let d = Deployment::start(case.mode, &args, &launcher, &scratch)
                .with_context(|| format!("deploying the {:?} cases", case.mode))?;
            e.insert(d);
        }
    }
    let rt = match args.load_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
    }
    .enable_all()
    .build()?;
    let prompt: String = "The quick brown fox jumps over the lazy dog. "
        .chars()
        .cycle()
        .take(args.prompt_chars)
        .collect();
    // Prompt k: its own first words, then the common text.
    let bodies = |case: &Case| -> Arc<[Bytes]> {
        (0..args.prompts)
            .map(|k| match k {
                0 => case.body(&prompt, args.tokens),
                k => case.body(&format!("conversation {k}: {prompt}"), args.tokens),
            })
            .collect()
    };
    // Warm every path (connections, allocator, caches) with its deployment's first case.
    for (mode, d) in &deployments {
        let Some(case) = cases.iter().find(|c| c.mode == *mode) else {
            continue;
        };
        let bodies = bodies(case);
        for path in d.paths() {
            let (target, _) = d.target(path, case, &bodies)?;
            measure(&rt, &target, case.endpoint.path(), 4, 0.3, None)?;
        }
    }
    let steps: usize = cases
        .iter()
        .map(|c| deployments.get(&c.mode).map_or(0, |d| d.paths().len()))
        .sum::<usize>()
        * args.clients.len()
        * args.reps.max(1);
    let progress =
        crate::bench::kit::progress::Progress::new("router measurements", steps as u64, args.json);
    if !args.json {
        eprintln!(
            "… router vs direct: {steps} measurements of {} s each (about {:.0} s)",
            args.seconds,
            steps as f64 * args.seconds
        );
    }
    let mut rows = Vec::new();
    for case in &cases {
        let d = deployments
            .get(&case.mode)
            .context("every case's deployment was started")?;
        let bodies = bodies(case);
        let paths = d.paths();
        for &clients in &args.clients {
            let mut measured: Vec<Vec<Measure>> = vec![Vec::new(); paths.len()];
            for rep in 0..args.reps.max(1) {
                // Rotate the order so that drift does not favour one path.
                for k in 0..paths.len() {
                    let i = (rep + k) % paths.len();
                    let (target, pid) = d.target(paths[i], case, &bodies)?;
                    let m = measure(
                        &rt,
                        &target,
                        case.endpoint.path(),
                        clients,
                        args.seconds,
                        pid,
                    )?;
                    progress.set_message(&format!("{}, {clients} clients", case.name));
                    progress.inc(1);
                    measured[i].push(m);
                }
            }
            rows.push(row(case, clients, &paths, &measured));
        }
    }
    progress.finish();
    let figures = Figures {
        rows: &rows,
        args: &args,
    };
    figures.publish(args.json, args.report.as_deref())
}

/// What `bench router` reports: a row per case and client count (its JSON), read beside the
/// arguments that made them.
#[derive(Serialize)]
#[serde(transparent)]
struct Figures<'a> {
    rows: &'a [Row],
    #[serde(skip)]
    args: &'a RouterBenchArgs,
}

impl BenchReport for Figures<'_> {
    fn table(&self) -> String {
        tables(self.args, self.rows)
    }

    fn page(&self) -> anyhow::Result<crate::report::Page> {
        page(self.args, self.rows)
    }
}

/// The HTML report: per case and client count, bars for direct, rbgctl's router and the
/// peer (when measured) — requests/s, p50 and p99 latency, median time to first byte.
fn page(args: &RouterBenchArgs, rows: &[Row]) -> anyhow::Result<crate::report::Page> {
    use crate::report::{BarChart, Format, Group, Page, Panel};
    let mut page = Page::new(&format!(
        "Router against direct-to-worker ({})",
        args.worker_kind.label()
    ));
    page.fact(
        "workers",
        format!(
            "{} {}, {} thread(s), {} µs CPU per request; {} load thread(s); {} s × {} reps, medians",
            args.workers, args.worker_kind.label(), args.worker_threads, args.worker_cpu_us, args.load_threads, args.seconds, args.reps
        ),
    );
    let cases: Vec<String> = rows
        .iter()
        .map(|r| format!("{} ×{}", r.case, r.clients))
        .collect();
    let peer = rows.iter().any(|r| r.peer.is_some());
    let groups = |f: fn(&Measure) -> f64| -> Vec<Group> {
        let mut g = vec![
            Group::new("direct", rows.iter().map(|r| Some(f(&r.direct))).collect()),
            Group::new(
                "rbgctl router",
                rows.iter().map(|r| Some(f(&r.router))).collect(),
            ),
        ];
        if peer {
            g.push(Group::new(
                args.peer_name.as_str(),
                rows.iter().map(|r| r.peer.as_ref().map(f)).collect(),
            ));
        }
        g
    };
    let chart = |id: &str, title: &str, unit: &str, f: fn(&Measure) -> f64| {
        BarChart::new(id, title, cases.clone()).panel(Panel::bars(
            "",
            unit,
            Format::Number,
            groups(f),
        ))
    };
    page.heading("Charts");
    page.bar_chart(
        &chart("req-per-s", "Requests per second", "requests/s", |m| {
            m.req_per_s
        }),
        "Case ×clients: each client on its own keep-alive connection. Higher is better.",
    )?;
    page.bar_chart(
        &chart("p50-ms", "Median latency", "ms", |m| m.p50_ms),
        "The router's added latency is its bar minus direct's.",
    )?;
    page.bar_chart(&chart("p99-ms", "p99 latency", "ms", |m| m.p99_ms), "")?;
    page.bar_chart(
        &chart("ttfb-p50-ms", "Median time to first byte", "ms", |m| {
            m.ttfb_p50_ms
        }),
        "Of decode's answer in prefill/decode cases.",
    )?;
    page.heading("Figures");
    let rows = rows
        .iter()
        .map(|r| {
            vec![
                r.case.clone(),
                r.clients.to_string(),
                format!("{:.0}", r.direct.req_per_s),
                format!("{:.0}", r.router.req_per_s),
                format!("{:.0}%", r.throughput_ratio * 100.0),
                format!("{:.3}", r.added_p50_ms),
                format!("{:.3}", r.added_p99_ms),
                r.router
                    .cpu_us_per_req
                    .map_or("-".into(), |c| format!("{c:.1}")),
                r.peer
                    .as_ref()
                    .map_or("-".into(), |p| format!("{:.0}", p.req_per_s)),
            ]
        })
        .collect();
    page.table(
        &[
            "case",
            "clients",
            "direct/s",
            "router/s",
            "router/direct",
            "added p50 ms",
            "added p99 ms",
            "router CPU µs/req",
            "peer/s",
        ],
        rows,
    );
    Ok(page)
}

fn tables(args: &RouterBenchArgs, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out,
        "rbgctl router ({}{}, {}) vs direct, {} ({} x, {} thread(s), {} µs CPU/request), {} load thread(s), {} s x {} reps, medians",
        match args.router_threads {
            Some(n) => format!("{n} thread(s)"),
            None => "default threads".to_string(),
        },
        match args.router_runtime.unwrap_or_default() {
            crate::router::config::RuntimeKind::ThreadPerCore => ", thread-per-core",
            crate::router::config::RuntimeKind::WorkStealing => ", work-stealing",
        },
        args.policy.name(),
        args.worker_kind.label(),
        args.workers,
        args.worker_threads,
        args.worker_cpu_us,
        args.load_threads,
        args.seconds,
        args.reps
    );
    if rows.iter().any(|r| r.mode != Mode::Regular) {
        let _ =
            writeln!(out,
            "pd-*/vllm-pd-*: FAKE prefill answers after {} ms, decode at once (no KV: it does not \
             wait for prefill); direct = the client sends both legs itself, at once",
            args.prefill_ms
        );
    }
    let _ = writeln!(
        out,
        "{:<20} {:>4} {:>10} {:>10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>7}",
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
        "cpu µs",
        "kernel"
    );
    for r in rows {
        let _ = writeln!(out,
            "{:<20} {:>4} {:>10.0} {:>10.0} {:>5.0}% {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10.3} {:>10.3} {:>8.1} {:>6.0}%",
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
            r.router.kernel_share.unwrap_or(f64::NAN) * 100.0,
        );
    }
    if rows.iter().any(|r| r.admission.is_some()) {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "rbgctl's router with admission on (--tenants), same run (interleaved)"
        );
        let _ = writeln!(
            out,
            "{:<20} {:>4} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "case", "cli", "router/s", "admit/s", "r cpu µs", "a cpu µs", "a/r cpu", "a p99ms"
        );
        for r in rows {
            let Some(a) = &r.admission else { continue };
            let _ = writeln!(
                out,
                "{:<20} {:>4} {:>10.0} {:>10.0} {:>9.1} {:>9.1} {:>8.2}x {:>9.3}",
                r.case,
                r.clients,
                r.router.req_per_s,
                a.req_per_s,
                r.router.cpu_us_per_req.unwrap_or(f64::NAN),
                a.cpu_us_per_req.unwrap_or(f64::NAN),
                r.admission_cpu_ratio.unwrap_or(f64::NAN),
                a.p99_ms,
            );
        }
    }
    if rows.iter().all(|r| r.peer.is_none()) {
        return out;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{} on the same workers, same run (interleaved)",
        args.peer_name
    );
    let _ = writeln!(
        out,
        "{:<20} {:>4} {:>10} {:>10} {:>7} {:>9} {:>9} {:>10} {:>9} {:>8} {:>9}",
        "case",
        "cli",
        "peer/s",
        "router/s",
        "r/peer",
        "p p50ms",
        "p p99ms",
        "p ttfb50",
        "saved ms",
        "p cpu µs",
        "p/direct"
    );
    for r in rows {
        let Some(p) = &r.peer else { continue };
        let _ = writeln!(out,
            "{:<20} {:>4} {:>10.0} {:>10.0} {:>6.2}x {:>9.3} {:>9.3} {:>10.3} {:>9.3} {:>8.1} {:>8.0}%",
            r.case,
            r.clients,
            p.req_per_s,
            r.router.req_per_s,
            r.router_over_peer.unwrap_or(f64::NAN),
            p.p50_ms,
            p.p99_ms,
            p.ttfb_p50_ms,
            r.ttfb_saved_vs_peer_ms.unwrap_or(f64::NAN),
            p.cpu_us_per_req.unwrap_or(f64::NAN),
            if r.direct.req_per_s > 0.0 {
                p.req_per_s / r.direct.req_per_s * 100.0
            } else {
                0.0
            },
        );
    }
    let _ = writeln!(
        out,
        "(saved ms: the peer's median time to first byte minus rbgctl's)"
    );
    out
}
