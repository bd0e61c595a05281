//! `rbgctl bench master`: the master at scale, driven over its real RPC protocol by metadata
//! operations only. A PAPER store (`paper_store.rs`) mounts a segment that exists only on paper,
//! so millions of objects cost the master what they would cost it in production and nothing
//! else. It loads N objects with C clients, then measures existence checks (single and
//! batched), describes, put start+end and removes, the master's memory per object and its CPU at
//! rest, and (with its own master) the time a master killed with SIGKILL takes to rebuild
//! every object from the store's report.

use super::kit::cluster::scrape;
use super::kit::paper_store::PaperStore;
use super::kit::procfs::{cpu_time, host_busy, rss_bytes as rss};
use super::kit::stats::PhaseResult;
use crate::bench::kit::report::BenchReport;
use crate::config::Millis;
use crate::launch::{self, Launcher, Logs};
use crate::master::config::MasterConfig;
use crate::transfer::message::*;
use crate::transfer::rpc;
use crate::transfer::{ConnOptions, Connection, Status};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `rbgctl bench master`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct MasterBenchArgs {
    /// An existing master (host:port). By default the benchmark starts its own, and only then
    /// reports its memory, its CPU at rest and its rebuild after SIGKILL.
    #[arg(long)]
    pub master: Option<String>,
    /// Objects to load (`1M`, `10M` or a number).
    #[arg(long, default_value = "1M", value_parser = parse_count)]
    pub objects: u64,
    /// Concurrent clients, each with its own connection.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Bytes per key (keys are zero-padded to this length).
    #[arg(long, default_value_t = 64)]
    pub key_bytes: usize,
    /// Value size the objects are given (only allocated on paper).
    #[arg(long, default_value_t = 256)]
    pub value_bytes: u64,
    /// Longest time of one measured phase.
    #[arg(long, default_value = "3s")]
    pub phase_time: Millis,
    /// How long the master's CPU is measured at rest, with every object loaded.
    #[arg(long, default_value = "10s")]
    pub rest: Millis,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only these measured phases (comma-separated; `remove` removes what `put` made).
    /// Default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub phases: Vec<MasterPhase>,
    /// At most this many calls in each measured phase, all clients together (a count that
    /// does not drift, for instruction counts under callgrind). Default: as many as
    /// `--phase-time` allows.
    #[arg(long, value_parser = parse_count)]
    pub ops_per_phase: Option<u64>,
    /// Connections that do what an idle client does (one `PING`, which binds the connection to
    /// the client, then only a look each heartbeat interval that the connection is open), held
    /// from after the load to the end of the rest, then pinged once more: the phases run
    /// beside them and the report says what they cost the master. Default: 0.
    #[arg(long, default_value_t = 0)]
    pub idle_clients: usize,
    /// Also write an HTML report with charts (operations per second per phase beside the
    /// machine's round-trip ceiling; p50 and p99 latency per phase) to this file.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// The client ids the `ping` phase's connections heartbeat as (one per connection).
const PING_CLIENT_IDS: u64 = 1 << 40;

/// A measured phase of `bench master` (`--phases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MasterPhase {
    Exists,
    /// A client's heartbeat (`PING`): what each connected client costs the master every
    /// heartbeat interval, at rest.
    Ping,
    BatchExists,
    Describe,
    DescribeAlone,
    DescribeUnderPuts,
    Put,
    Remove,
}

impl MasterBenchArgs {
    fn wants(&self, p: MasterPhase) -> bool {
        self.phases.is_empty() || self.phases.contains(&p)
    }

    /// The most calls a phase makes.
    fn budget(&self) -> u64 {
        self.ops_per_phase.unwrap_or(u64::MAX / 2)
    }
}

/// A count such as `1000000`, `500k` or `10M` (a command-line value).
pub(super) fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, scale) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1_000),
        Some('m' | 'M') => (&s[..s.len() - 1], 1_000_000),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .map(|n| n * scale)
        .map_err(|_| format!("{s:?}: give a count such as 1000000, 500k or 10M"))
}

/// Keys per batched call, as SGLang's HiCache sends them.
const BATCH: usize = 128;

#[derive(Debug, Default, serde::Serialize)]
struct Report {
    objects: u64,
    clients: usize,
    key_bytes: usize,
    load_seconds: f64,
    load_objects_per_s: f64,
    results: Vec<PhaseResult>,
    /// With its own master: resident memory before and after the load.
    master_rss_empty_bytes: Option<u64>,
    master_rss_loaded_bytes: Option<u64>,
    master_bytes_per_object: Option<f64>,
    /// Puts (batches of 128, then removed) another client streamed during the
    /// "describe, 1 client, puts streaming" phase.
    streamed_puts: u64,
    /// With its own master: share of one core used over `rest` with every object loaded
    /// (and the idle clients heartbeating).
    master_cpu_at_rest: Option<f64>,
    /// `--idle-clients`: how they fared.
    #[serde(skip_serializing_if = "Option::is_none")]
    idle: Option<super::kit::idle_clients::IdleFigures>,
    /// With its own master: its resident memory per idle client's connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    master_rss_per_idle_client_bytes: Option<f64>,
    /// With its own master: from the start of a master killed with SIGKILL until it holds
    /// every object again (rebuilt from the store's report).
    rebuild_seconds: Option<f64>,
    /// With its own master: the unmount of the store holding every object (the master drops
    /// them all under its lock), after the rebuild.
    store_leave_seconds: Option<f64>,
    /// ... and until the master held none of its objects (dropped in steps, the lock let go
    /// between them).
    store_dropped_seconds: Option<f64>,
    /// The restarted master's longest lock hold, over its rebuild and the store leaving (ms).
    lock_longest_hold_rebuild_leave_ms: Option<f64>,
    errors: u64,
    /// With its own master: the longest hold of its state lock during the load, and over the
    /// whole run (ms).
    lock_longest_hold_load_ms: Option<f64>,
    lock_longest_hold_ms: Option<f64>,
    /// Where each phase's CPU went (same order as `results`).
    cpu: Vec<PhaseCpu>,
    /// The host's cores (`host_busy_cores` is out of these).
    host_cores: usize,
    /// With its own master: its state lock during each phase (same order as `results`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lock: Vec<LockUse>,
    /// The machine's ceiling for these clients, measured in the same run: round trips per
    /// second from a 64-byte echo server with a thread per connection, `clients` connections.
    loopback_round_trips_per_s: f64,
}

/// What the master's metrics and the host's CPU counters said before a phase.
#[derive(Clone, Copy)]
struct Before {
    lock: Option<LockCounters>,
    master: Option<Duration>,
    bench: Option<Duration>,
    host: Option<Duration>,
}

/// Where a phase's CPU went, in cores (CPU seconds per second of the phase).
#[derive(Clone, Debug, Default, serde::Serialize)]
struct PhaseCpu {
    op: String,
    /// The master (its own only).
    master_cores: Option<f64>,
    /// This process: the phase's clients.
    bench_cores: Option<f64>,
    /// The whole host, its kernel included (of `host_cores`).
    host_busy_cores: Option<f64>,
}

/// How the master's state lock was used during one phase (from its metrics).
#[derive(Clone, Debug, Default, serde::Serialize)]
struct LockUse {
    op: String,
    /// Share of the phase's time the lock was held.
    busy: f64,
    /// Mean wait for the lock per acquisition, µs.
    wait_us: f64,
    /// Holds longer than 1 ms.
    long_holds: u64,
}

/// The master's lock counters: (acquisitions, wait s, held s, long holds, longest hold s).
type LockCounters = [f64; 5];

fn lock_counters(metrics_port: Option<u16>) -> Option<LockCounters> {
    let body = super::kit::cluster::metrics_text(metrics_port?)?;
    let get = |name: &str| crate::telemetry::sample(&body, name);
    Some([
        get("rbgctl_master_state_lock_acquisitions_total")?,
        get("rbgctl_master_state_lock_wait_seconds_total")?,
        get("rbgctl_master_state_lock_held_seconds_total")?,
        get("rbgctl_master_state_lock_long_holds_total")?,
        get("rbgctl_master_state_lock_longest_hold_seconds")?,
    ])
}

/// `master/` and `i` zero-padded to `key_bytes` (written digit by digit: `format!` with a
/// fill costs the benchmark's clients a third of their time in the batched phases).
fn key(key_bytes: usize, i: u64) -> String {
    const PREFIX: &str = "master/";
    let width = key_bytes.saturating_sub(PREFIX.len()).max(1);
    let mut digits = [b'0'; 20];
    let (mut n, mut at) = (i, digits.len());
    while n > 0 {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    let digits = &digits[at.min(digits.len() - 1)..];
    let mut k = String::with_capacity(PREFIX.len() + width.max(digits.len()));
    k.push_str(PREFIX);
    k.extend(std::iter::repeat_n('0', width.saturating_sub(digits.len())));
    k.extend(digits.iter().map(|&d| d as char));
    k
}

fn rpc_opts() -> ConnOptions {
    ConnOptions {
        spin: Duration::ZERO,
        ..ConnOptions::default()
    }
}

/// Resident memory of a process, from /proc.
/// Resident memory once it stops falling: the allocator hands freed memory (a table that grew,
/// buffers of the load) back to the system a little after the fact. Samples every 200 ms until
/// two agree within 0.5 %, for at most 5 s.
fn settled_rss(pid: u32) -> Option<u64> {
    let mut last = rss(pid)?;
    for _ in 0..25 {
        std::thread::sleep(Duration::from_millis(200));
        let now = rss(pid)?;
        let settled = now.abs_diff(last) * 200 <= last;
        last = now;
        if settled {
            break;
        }
    }
    Some(last)
}

/// Runs `op` on `clients` threads, each with its own connection, until `budget` calls are done
/// or `time` is up; `op(conn, thread, i)` answers whether the call succeeded, or `None` when
/// that thread has nothing more to do.
fn phase(
    master: &str,
    clients: usize,
    budget: u64,
    time: Duration,
    op: impl Fn(&mut Connection, usize, u64) -> Option<bool> + Sync,
) -> (Vec<Duration>, u64, Duration) {
    let run = super::kit::load::closed_loop(
        clients,
        budget,
        time,
        |_| Connection::connect(master, &rpc_opts()).map_err(|e| e.to_string()),
        |conn, t, i| {
            op(conn, t, i).map(|ok| match ok {
                true => super::kit::load::Outcome::Ok,
                false => super::kit::load::Outcome::Failed(String::new()),
            })
        },
    );
    (run.latencies, run.errors, run.elapsed)
}

/// Starts and ends puts of `keys` in one batch each; the started objects, for the store's
/// report.
fn put_batch(
    conn: &mut Connection,
    client_id: u64,
    keys: &[String],
    size: u64,
) -> Option<Vec<StoredObject>> {
    let start = BatchPutStartReq {
        client_id,
        config: ReplicateConfig::default(),
        items: keys
            .iter()
            .map(|k| PutItem {
                key: k.clone(),
                size,
            })
            .collect(),
    };
    let started: BatchPutStartResp = conn.call::<rpc::BatchPutStart>(&start).ok()?;
    let mut objects = Vec::with_capacity(keys.len());
    let mut ends = Vec::with_capacity(keys.len());
    for (k, s) in keys.iter().zip(started.items) {
        let s = s.ok()?;
        let r = s.replicas.first()?;
        objects.push(StoredObject {
            key: k.clone(),
            version: s.object_id,
            offset: r.offset,
            size,
            checksum: 0,
        });
        ends.push(EndItem {
            key: k.clone(),
            object_id: s.object_id,
            checksum: 0,
            unhashed: false,
        });
    }
    let end = BatchPutEndReq {
        client_id,
        items: ends,
    };
    let done: BatchStatusResp = conn.call::<rpc::BatchPutEnd>(&end).ok()?;
    done.items
        .iter()
        .all(|s| *s == Status::Ok)
        .then_some(objects)
}

/// Runs `rbgctl bench master` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(args: MasterBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.clients > 0, "--clients: at least 1");
    anyhow::ensure!(args.objects > 0, "--objects: at least 1");
    anyhow::ensure!(args.value_bytes > 0, "--value-bytes: at least 1");
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    let launcher = Launcher::new(Logs::Null)?;
    let mut own = match &args.master {
        Some(_) => None,
        None => {
            progress("starting a master (its own process, loopback)");
            Some(launcher.spawn::<launch::Master>("master", {
                // Every connection comes from one address: room for all of them.
                let d = MasterConfig::default();
                let connections = args.clients + args.idle_clients + 1024;
                MasterConfig {
                    rpc_address: "127.0.0.1".into(),
                    rpc_port: 0,
                    metrics_host: "127.0.0.1".into(),
                    metrics_port: 0,
                    max_connections: d.max_connections.max(connections),
                    max_connections_per_peer: d.max_connections_per_peer.max(connections),
                    ..d
                }
            })?)
        }
    };
    let master = match (&args.master, &own) {
        (Some(m), _) => m.clone(),
        (None, Some(m)) => m.addrs.rpc.to_string(),
        (None, None) => anyhow::bail!("no master to measure"),
    };
    let pid = own.as_ref().and_then(|m| m.pid());
    let metrics_port = own.as_ref().map(|m| m.addrs.metrics.port());
    progress(&format!(
        "the machine's limit: loopback round trips with {} clients",
        args.clients
    ));
    // At most 3 s: a long --phase-time is for slow masters (one under callgrind).
    let ceiling_time = args.phase_time.0.min(Duration::from_secs(3));
    let ceiling = super::kit::limits::loopback_round_trips(args.clients, ceiling_time)?;
    let mut report = Report {
        host_cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        loopback_round_trips_per_s: ceiling,
        objects: args.objects,
        clients: args.clients,
        key_bytes: args.key_bytes,
        master_rss_empty_bytes: pid.and_then(rss),
        ..Report::default()
    };
    // Room on paper for every object and the phases' own puts, aligned as the allocator does.
    let aligned = args.value_bytes.div_ceil(64) * 64;
    let paper = PaperStore::start(&master, aligned * (args.objects + 10_000_000))?;
    let client_id = fastrand::u64(1..);

    progress(&format!(
        "loading {} objects with {} clients",
        args.objects, args.clients
    ));
    let batches = args.objects.div_ceil(BATCH as u64);
    let (lat, errors, elapsed) = phase(&master, args.clients, batches, Duration::MAX, |c, t, i| {
        let b = i * args.clients as u64 + t as u64;
        let from = b * BATCH as u64;
        let to = (from + BATCH as u64).min(args.objects);
        if from >= to {
            return None;
        }
        let keys: Vec<String> = (from..to).map(|n| key(args.key_bytes, n)).collect();
        Some(match put_batch(c, client_id, &keys, args.value_bytes) {
            Some(objects) => {
                paper.hold(objects);
                true
            }
            None => false,
        })
    });
    drop(lat);
    report.errors += errors;
    report.load_seconds = elapsed.as_secs_f64();
    report.load_objects_per_s = args.objects as f64 / report.load_seconds;
    report.master_rss_loaded_bytes = pid.and_then(settled_rss);
    report.lock_longest_hold_load_ms = lock_counters(metrics_port).map(|c| c[4] * 1e3);
    report.master_bytes_per_object = report
        .master_rss_empty_bytes
        .zip(report.master_rss_loaded_bytes)
        .map(|(e, l)| l.saturating_sub(e) as f64 / args.objects as f64);

    let idle = match args.idle_clients {
        0 => None,
        k => {
            progress(&format!(
                "opening {k} idle clients (bound by a ping each, then quiet)"
            ));
            let before = pid.and_then(rss);
            let every = crate::client::ClientConfig::new(&master).heartbeat_interval;
            let idle = super::kit::idle_clients::IdleClients::open(&master, k, every)?;
            report.master_rss_per_idle_client_bytes = before
                .zip(pid.and_then(settled_rss))
                .map(|(b, a)| a.saturating_sub(b) as f64 / k as f64);
            Some(idle)
        }
    };

    let n = args.objects;
    let time = args.phase_time.0;
    let clients = args.clients;
    // A phase's figures: `items` per call, `threads` clients; `before`: the master's lock
    // counters and the CPU counters taken before the phase.
    let bench_pid = std::process::id();
    let before_now = || Before {
        lock: lock_counters(metrics_port),
        master: pid.and_then(cpu_time),
        bench: cpu_time(bench_pid),
        host: host_busy(),
    };
    let mut measured =
        |op: &str,
         items: u64,
         threads: usize,
         before: Before,
         (lat, errors, elapsed): (Vec<Duration>, u64, Duration)| {
            let secs = elapsed.as_secs_f64().max(1e-9);
            let cores = |b: Option<Duration>, a: Option<Duration>| {
                b.zip(a)
                    .map(|(b, a)| a.saturating_sub(b).as_secs_f64() / secs)
            };
            report.cpu.push(PhaseCpu {
                op: op.to_owned(),
                master_cores: cores(before.master, pid.and_then(cpu_time)),
                bench_cores: cores(before.bench, cpu_time(bench_pid)),
                host_busy_cores: cores(before.host, host_busy()),
            });
            if let (Some(b), Some(a)) = (before.lock, lock_counters(metrics_port)) {
                let acquired = (a[0] - b[0]).max(1.0);
                report.lock.push(LockUse {
                    op: op.to_owned(),
                    busy: (a[2] - b[2]) / elapsed.as_secs_f64().max(1e-9),
                    wait_us: (a[1] - b[1]) / acquired * 1e6,
                    long_holds: (a[3] - b[3]) as u64,
                });
            }
            report.errors += errors;
            report.results.push(PhaseResult::from_samples(
                "master", op, 0, threads, lat, items, errors, elapsed,
            ));
        };
    // A describe (GET_REPLICAS) of a random loaded key.
    let describe_one = |c: &mut Connection, _: usize, _: u64| {
        let k = KeyReq {
            key: key(args.key_bytes, fastrand::u64(..n)),
        };
        Some(c.call::<rpc::GetReplicas>(&k).is_ok())
    };
    let budget = args.budget();
    if args.wants(MasterPhase::Exists) {
        progress("exists");
        measured(
            "exists",
            1,
            clients,
            before_now(),
            phase(&master, clients, budget, time, |c, _, _| {
                let k = KeyReq {
                    key: key(args.key_bytes, fastrand::u64(..n)),
                };
                Some(matches!(c.call::<rpc::Exists>(&k), Ok(true)))
            }),
        );
    }
    if args.wants(MasterPhase::Ping) {
        progress("ping");
        measured(
            "ping",
            1,
            clients,
            before_now(),
            phase(&master, clients, budget, time, |c, t, _| {
                let ping = PingReq {
                    client_id: PING_CLIENT_IDS + t as u64,
                };
                Some(c.call::<rpc::Ping>(&ping).is_ok())
            }),
        );
    }
    if args.wants(MasterPhase::BatchExists) {
        progress("batched exists");
        measured(
            "batch_exists 128x",
            BATCH as u64,
            clients,
            before_now(),
            phase(&master, clients, budget, time, |c, _, _| {
                let from = fastrand::u64(..n.saturating_sub(BATCH as u64).max(1));
                let req = BatchKeysReq {
                    keys: (from..(from + BATCH as u64).min(n))
                        .map(|i| key(args.key_bytes, i))
                        .collect(),
                };
                Some(
                    c.call::<rpc::BatchExists>(&req)
                        .is_ok_and(|r| r.items.iter().all(|e| *e)),
                )
            }),
        );
    }
    if args.wants(MasterPhase::Describe) {
        progress("describe");
        measured(
            "describe",
            1,
            clients,
            before_now(),
            phase(&master, clients, budget, time, describe_one),
        );
    }
    // The latency of one client's metadata operations, alone and while another client streams
    // puts: on two cores, sixteen clients' p99 is the scheduler's time slice, not the master.
    if args.wants(MasterPhase::DescribeAlone) {
        progress("describe by one client, alone");
        measured(
            "describe, 1 client",
            1,
            1,
            before_now(),
            phase(&master, 1, budget, time, describe_one),
        );
    }
    if args.wants(MasterPhase::DescribeUnderPuts) {
        progress("describe by one client while another streams puts");
        let streaming = std::sync::atomic::AtomicBool::new(true);
        let streamed = AtomicU64::new(0);
        let before = before_now();
        let under_puts = std::thread::scope(|s| {
            s.spawn(|| {
                let Ok(mut c) = Connection::connect(&master, &rpc_opts()) else {
                    return;
                };
                let mut b = 0u64;
                while streaming.load(Ordering::Relaxed) {
                    let keys: Vec<String> = (0..BATCH as u64)
                        .map(|j| format!("master-stream/{b}/{j}"))
                        .collect();
                    if put_batch(&mut c, client_id, &keys, args.value_bytes).is_some() {
                        streamed.fetch_add(BATCH as u64, Ordering::Relaxed);
                    }
                    let req = BatchRemoveReq { force: true, keys };
                    let _ = c.call::<rpc::BatchRemove>(&req);
                    b += 1;
                }
            });
            let r = phase(&master, 1, budget, time, describe_one);
            streaming.store(false, Ordering::Relaxed);
            r
        });
        measured(
            "describe, 1 client, puts streaming",
            1,
            1,
            before,
            under_puts,
        );
        report.streamed_puts = streamed.into_inner();
    }
    progress("put start + end, then remove");
    let fresh = |t: usize, i: u64| {
        format!(
            "master-put/{t}/{i:0w$}",
            w = args.key_bytes.saturating_sub(14).max(1)
        )
    };
    let put_count: Vec<AtomicU64> = (0..clients).map(|_| AtomicU64::new(0)).collect();
    if args.wants(MasterPhase::Put) {
        measured(
            "put start+end",
            1,
            clients,
            before_now(),
            phase(&master, clients, budget, time, |c, t, i| {
                let ok = put_batch(c, client_id, &[fresh(t, i)], args.value_bytes).is_some();
                if ok {
                    put_count[t].store(i + 1, Ordering::Relaxed);
                }
                Some(ok)
            }),
        );
    }
    let put_count: Vec<u64> = put_count
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    if args.wants(MasterPhase::Remove) {
        measured(
            "remove",
            1,
            clients,
            before_now(),
            phase(
                &master,
                clients,
                (put_count.iter().max().copied().unwrap_or(0) * clients as u64).min(budget),
                time,
                |c, t, i| {
                    if i >= put_count[t] {
                        return None;
                    }
                    let req = RemoveReq {
                        key: fresh(t, i),
                        force: true,
                    };
                    Some(c.call::<rpc::Remove>(&req).is_ok())
                },
            ),
        );
    }

    report.lock_longest_hold_ms = lock_counters(metrics_port).map(|c| c[4] * 1e3);
    if let (Some(pid), Some(m)) = (pid, own.as_mut()) {
        progress(&format!(
            "the master at rest for {} s",
            args.rest.0.as_secs_f64()
        ));
        let (c0, t0) = (cpu_time(pid), Instant::now());
        std::thread::sleep(args.rest.0);
        report.master_cpu_at_rest = cpu_time(pid)
            .zip(c0)
            .map(|(c1, c0)| (c1 - c0).as_secs_f64() / t0.elapsed().as_secs_f64());
        report.idle = idle.as_ref().map(|i| {
            i.check();
            i.figures()
        });
        drop(idle);

        progress("killing the master (SIGKILL) and timing its rebuild from the store's report");
        let metrics = m.addrs.metrics.port();
        paper.take_reported();
        m.kill();
        let t0 = Instant::now();
        m.start()?;
        let port = m.addrs.metrics.port();
        debug_assert_eq!(port, metrics);
        let deadline = t0 + Duration::from_secs(600);
        loop {
            if paper.take_reported() || scrape(port, "rbgctl_master_keys") == Some(n as f64) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the master did not rebuild within 600 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        while scrape(port, "rbgctl_master_keys") != Some(n as f64) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the rebuilt master holds {:?} objects, not {n}",
                scrape(port, "rbgctl_master_keys")
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        report.rebuild_seconds = Some(t0.elapsed().as_secs_f64());

        progress("the store leaves for good: the master drops every object");
        let t0 = Instant::now();
        paper.leave()?;
        report.store_leave_seconds = Some(t0.elapsed().as_secs_f64());
        let deadline = t0 + Duration::from_secs(600);
        while scrape(port, "rbgctl_master_keys") != Some(0.0) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the master still holds objects of the store that left"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        report.store_dropped_seconds = Some(t0.elapsed().as_secs_f64());
        // The restarted master's longest hold covers its rebuild and the store leaving.
        report.lock_longest_hold_rebuild_leave_ms = lock_counters(Some(port)).map(|c| c[4] * 1e3);
    }
    paper.stop();

    report.publish(args.json, args.report.as_deref())?;
    anyhow::ensure!(
        report.errors == 0,
        "{} operations failed; the figures above are partial",
        report.errors
    );
    Ok(())
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let r = self;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "master: {} objects ({}-byte keys) loaded by {} clients in {:.1} s ({:.0} objects/s)",
            r.objects, r.key_bytes, r.clients, r.load_seconds, r.load_objects_per_s
        );
        let _ = writeln!(
            out,
            "{:<34} {:>7} {:>12} {:>9} {:>9} {:>7} {:>10} {:>11} {:>10}",
            "op",
            "clients",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "errors",
            "lock busy",
            "lock wait µs",
            "holds >1ms"
        );
        for x in &r.results {
            let lock = r.lock.iter().find(|l| l.op == x.op);
            let _ = writeln!(
                out,
                "{:<34} {:>7} {:>12.0} {:>9.1} {:>9.1} {:>7} {:>10} {:>11} {:>10}",
                x.op,
                x.threads,
                x.ops_per_s,
                x.p50_us,
                x.p99_us,
                x.errors,
                lock.map(|l| format!("{:.0} %", l.busy * 100.0))
                    .unwrap_or_default(),
                lock.map(|l| format!("{:.1}", l.wait_us))
                    .unwrap_or_default(),
                lock.map(|l| l.long_holds.to_string()).unwrap_or_default(),
            );
        }
        let _ = writeln!(
            out,
            "machine limit: {:.0} loopback round trips/s with {} clients (64-byte echo, same run)",
            r.loopback_round_trips_per_s, r.clients
        );
        let c = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.2}"));
        let _ = writeln!(
            out,
            "{:<34} {:>12} {:>12} {:>16}",
            "CPU, cores", "master", "clients", "host busy"
        );
        for p in &r.cpu {
            let _ = writeln!(
                out,
                "{:<34} {:>12} {:>12} {:>16}",
                p.op,
                c(p.master_cores),
                c(p.bench_cores),
                format!("{} of {}", c(p.host_busy_cores), r.host_cores)
            );
        }
        let mb = |b: u64| b as f64 / (1 << 20) as f64;
        if let (Some(e), Some(l), Some(per)) = (
            r.master_rss_empty_bytes,
            r.master_rss_loaded_bytes,
            r.master_bytes_per_object,
        ) {
            let _ = writeln!(
                out,
                "master memory: {:.0} MiB empty, {:.0} MiB loaded: {per:.0} bytes per object, {:.0} \
                 beyond its {}-byte key",
                mb(e),
                mb(l),
                per - r.key_bytes as f64,
                r.key_bytes
            );
        }
        if let (Some(load), Some(all)) = (r.lock_longest_hold_load_ms, r.lock_longest_hold_ms) {
            let _ = writeln!(
                out,
                "master lock: longest hold {load:.2} ms during the load, {all:.2} ms over the phases"
            );
        }
        if let Some(idle) = &r.idle {
            let _ = writeln!(
                out,
                "idle clients: {} connections opened in {:.1} s, {} pings, {} not answered OK, {} \
                 connections made again{}{}",
                idle.connections,
                idle.open_seconds,
                idle.pings,
                idle.ping_errors,
                idle.reconnects,
                idle.reconnected
                    .iter()
                    .map(|(why, n)| format!(" ({n} {why})"))
                    .collect::<String>(),
                r.master_rss_per_idle_client_bytes
                    .map(|b| format!("; master memory {b:.0} bytes per connection"))
                    .unwrap_or_default(),
            );
        }
        if let Some(cpu) = r.master_cpu_at_rest {
            let _ = writeln!(out, "master CPU at rest: {:.2} % of one core", cpu * 100.0);
        }
        if let Some(s) = r.rebuild_seconds {
            let _ = writeln!(
                out,
                "master rebuild after SIGKILL: {s:.2} s until it held all {} objects again",
                r.objects
            );
        }
        if let (Some(s), Some(d)) = (r.store_leave_seconds, r.store_dropped_seconds) {
            let _ = writeln!(
                out,
                "store leaving with all {} objects: unmounted in {:.1} ms, every object dropped \
                 after {:.0} ms; longest lock hold over the rebuild and the leaving: {:.1} ms",
                r.objects,
                s * 1e3,
                d * 1e3,
                r.lock_longest_hold_rebuild_leave_ms.unwrap_or(f64::NAN)
            );
        }
        out
    }

    /// The HTML report: each phase's throughput (and the machine's ceiling for as many clients)
    /// and latency as bars, and the figures of memory, rest and rebuild.
    fn page(&self) -> anyhow::Result<crate::report::Page> {
        let r = self;
        use crate::report::{BarChart, Format, Group, Page, Panel};
        let mut page = Page::new("The master at scale: metadata operations");
        page.fact(
            "load",
            format!(
                "{} objects ({}-byte keys) loaded by {} clients in {:.1} s ({:.0} objects/s)",
                r.objects, r.key_bytes, r.clients, r.load_seconds, r.load_objects_per_s
            ),
        )
        .fact(
            "machine",
            format!(
                "loopback echo, {} connections: {:.0} round trips/s",
                r.clients, r.loopback_round_trips_per_s
            ),
        );
        let mut phases: Vec<String> = r
            .results
            .iter()
            .map(|x| format!("{} ×{}", x.op, x.threads))
            .collect();
        let mut ops: Vec<Option<f64>> = r.results.iter().map(|x| Some(x.ops_per_s)).collect();
        let mut ceiling = vec![None; ops.len()];
        phases.push(format!("loopback echo ×{}", r.clients));
        ops.push(None);
        ceiling.push(Some(r.loopback_round_trips_per_s));
        let throughput =
            BarChart::new("master-ops-per-s", "Operations per second by phase", phases).panel(
                Panel::bars(
                    "",
                    "operations/s",
                    Format::Number,
                    vec![
                        Group::new("master ops/s", ops),
                        Group::new("machine's round trips/s (ceiling)", ceiling),
                    ],
                ),
            );
        let names: Vec<String> = r
            .results
            .iter()
            .map(|x| format!("{} ×{}", x.op, x.threads))
            .collect();
        let latency =
            BarChart::new("master-latency", "Latency by phase (µs)", names).panel(Panel::bars(
                "",
                "µs",
                Format::Number,
                vec![
                    Group::new("p50", r.results.iter().map(|x| Some(x.p50_us)).collect()),
                    Group::new("p99", r.results.iter().map(|x| Some(x.p99_us)).collect()),
                ],
            ));
        page.heading("Charts");
        page.bar_chart(&throughput, "A batch call counts its keys. The ceiling: a 64-byte echo server with a thread per connection, as many connections, same run.")?;
        page.bar_chart(&latency, "Per call.")?;
        page.heading("Memory, rest and rebuild");
        let opt = |v: Option<f64>, unit: &str| v.map_or("-".into(), |v| format!("{v:.2} {unit}"));
        page.table(
            &["figure", "value"],
            vec![
                vec![
                    "resident memory, empty".into(),
                    r.master_rss_empty_bytes
                        .map_or("-".into(), crate::config::human_bytes),
                ],
                vec![
                    "resident memory, loaded".into(),
                    r.master_rss_loaded_bytes
                        .map_or("-".into(), crate::config::human_bytes),
                ],
                vec![
                    "bytes per object".into(),
                    opt(r.master_bytes_per_object, "B"),
                ],
                vec![
                    "CPU at rest (share of a core)".into(),
                    opt(r.master_cpu_at_rest.map(|c| c * 100.0), "%"),
                ],
                vec!["rebuild after SIGKILL".into(), opt(r.rebuild_seconds, "s")],
                vec![
                    "store leaving: unmount answered".into(),
                    opt(r.store_leave_seconds, "s"),
                ],
                vec![
                    "store leaving: every object dropped".into(),
                    opt(r.store_dropped_seconds, "s"),
                ],
                vec!["errors".into(), r.errors.to_string()],
            ],
        );
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_zero_padded_to_their_length() {
        assert_eq!(key(12, 0), "master/00000");
        assert_eq!(key(12, 4207), "master/04207");
        assert_eq!(key(12, 1234567), "master/1234567");
        assert_eq!(key(64, u64::MAX).len(), 64);
        assert_eq!(key(64, 42), format!("master/{:057}", 42));
    }

    #[test]
    fn counts_take_suffixes_and_name_a_bad_one() {
        assert_eq!(parse_count("1M"), Ok(1_000_000));
        assert_eq!(parse_count("500k"), Ok(500_000));
        assert_eq!(parse_count("12345"), Ok(12_345));
        assert!(parse_count("lots").unwrap_err().contains("10M"));
    }
}
