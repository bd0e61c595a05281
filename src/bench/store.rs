//! `rbgctl bench store`: put and get throughput and latency for several value sizes and thread
//! counts, batches, the same-host path and the master's existence checks. Without `--master` it
//! starts its own master and store as separate processes on loopback.

use super::kit::cluster::master_or_own;
use super::kit::limits;
use super::kit::load::Outcome;
use super::kit::mooncake_peer;
use super::kit::procfs::own_syscalls as syscalls;
use super::kit::redis_peer;
use super::kit::stats::{OpBreakdown, PhaseResult};
use crate::bench::kit::report::BenchReport;
use crate::client::{Client, ClientConfig, ClientError, ReplicateConfig};
use crate::config::{human_bytes, ByteSize};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rbgctl bench store`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreBenchArgs {
    /// An existing master (host:port); by default the benchmark starts a master and one store.
    #[arg(long)]
    pub master: Option<String>,
    /// A file holding the cluster secret: the master and store it starts require it, and the
    /// client proves it on every connection (`docs/security.md`).
    #[arg(long)]
    pub auth_token_file: Option<std::path::PathBuf>,
    /// Segment size of the store it starts.
    #[arg(long, default_value = "4GiB")]
    pub segment_size: ByteSize,
    /// Whether the store it starts keeps its objects across restarts (true/false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub persistent: bool,
    /// Value sizes.
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,4MiB")]
    pub sizes: Vec<ByteSize>,
    /// Client thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub threads: Vec<usize>,
    /// Longest time of one phase.
    #[arg(long, default_value = "2s")]
    pub phase_time: crate::config::Millis,
    /// Most data one phase writes.
    #[arg(long, default_value = "1GiB")]
    pub phase_bytes: ByteSize,
    /// Most objects one phase writes.
    #[arg(long, default_value_t = 20_000)]
    pub phase_ops: u64,
    /// Objects per batch call.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Value size in batch calls.
    #[arg(long, default_value = "256KiB")]
    pub batch_value: ByteSize,
    /// Keys per existence-check batch.
    #[arg(long, default_value_t = 128)]
    pub exists_batch: usize,
    /// Skip the same-host shared-memory cases.
    #[arg(long)]
    pub no_shm: bool,
    /// Also measure 4 KiB and 1 MiB put/get while this many idle connections (a hostile or
    /// broken client) are held open to the master and the stores. 0 = no flood.
    #[arg(long, default_value_t = 0)]
    pub idle_flood: usize,
    /// Write into a pool that already holds objects (with --master) even though the master may
    /// evict them to make room. Default: refuse.
    #[arg(long)]
    pub allow_eviction: bool,
    /// The local address the flood comes from (another loopback address than the client's).
    #[arg(long, default_value = "127.0.0.2")]
    pub flood_from: std::net::IpAddr,
    /// Also show where each operation's time went, as the client sees it: master round trips,
    /// store transfers, same-host copies, checksums, the rest, and system calls.
    #[arg(long)]
    pub breakdown: bool,
    /// Also measure the Mooncake store side by side, in the same run and topology: a Python
    /// that imports the `mooncake-transfer-engine-non-cuda` wheel (installed, or on
    /// PYTHONPATH). Runs the single-thread TCP rows and the batch rows (with --rdma, by
    /// Mooncake's RDMA transport on that device, its client on Mooncake's store and on
    /// rbgctl's).
    #[arg(long)]
    pub mooncake_python: Option<std::path::PathBuf>,
    /// Rounds of the side-by-side runs with --mooncake-python: Mooncake's pool and the wheel
    /// on rbgctl's take turns (Mooncake first in odd rounds, rbgctl first in even ones), and
    /// each row is the round with its median ops/s, so that a noisy moment of a shared
    /// machine moves no ratio.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub mooncake_rounds: u32,
    /// Also measure this `redis-server` (Redis 7) in the same run: started on loopback with
    /// nothing saved, one connection with one request in flight (as `redis-benchmark -c 1`),
    /// `SET` then `GET` of each value size up to 64 KiB, beside the pool's one-thread TCP rows.
    #[arg(long)]
    pub redis_server: Option<std::path::PathBuf>,
    /// Also measure 4 KiB put/get (one thread) with the pool holding each of these numbers of
    /// small objects in turn (`10k,1M`): the pool is topped up with 256-byte objects before each,
    /// and emptied of them at the end. The table shows how p99 moved between the first and last.
    #[arg(long, value_delimiter = ',', value_parser = super::master::parse_count)]
    pub held: Vec<u64>,
    /// Measure the disk tier instead, with its directory here (a local filesystem): a put
    /// stream at the memory watermark with and without the tier, and gets of disk-resident
    /// values beside the filesystem's sequential read speed (measured in the same run).
    #[arg(long)]
    pub disk_tier: Option<std::path::PathBuf>,
    /// With --disk-tier: the disk tier's size (at least 4 × --disk-tier-memory).
    #[arg(long, default_value = "4GiB")]
    pub disk_tier_size: ByteSize,
    /// With --disk-tier: the store's memory, small so that most values go to disk.
    #[arg(long, default_value = "512MiB")]
    pub disk_tier_memory: ByteSize,
    /// With --disk-tier: value sizes.
    #[arg(long, value_delimiter = ',', default_value = "1MiB,256KiB")]
    pub disk_tier_values: Vec<ByteSize>,
    /// Measure the RDMA data path on this device instead (`rxe0`, `mlx5_0`): a master and a
    /// store serving RDMA, one client thread reading and writing it one-sidedly, each row
    /// beside perftest's ib_write_bw / ib_read_bw at the same message size and 4 KiB gets
    /// beside ib_read_lat, all run in the same run on the same device; and the store's CPU time
    /// for a stream of gets by RDMA against the same gets over TCP.
    #[arg(long)]
    pub rdma: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with charts (GB/s and p99 latency per value size against
    /// the machine's loopback and memcpy lines; with --disk-tier, put streams and disk reads
    /// against the filesystem's speed) to this file: self-contained, opens offline.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// What the rows' segment memory was, said in the report.
const SEGMENTS: &str = "rows without -fresh: the store faulted its segment's pages in before \
    measuring (as a store has seconds after its start), and phases reuse memory earlier ones \
    wrote; -fresh rows: a store just started with prefault = false, each write faulting its \
    pages in (a store's first minutes with a large segment)";

/// What the servers spent on Mooncake's client, on each pool (CPU time from /proc, in
/// microseconds): each master per RPC, the process holding the segment (rbgctl's store,
/// Mooncake's storage process) per client call.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
struct ServerCpu {
    master_us_per_rpc: Versus<Option<f64>>,
    store_us_per_call: Versus<Option<f64>>,
}

/// A figure on rbgctl's pool and on Mooncake's.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
struct Versus<T> {
    rbgctl: T,
    mooncake: T,
}

impl ServerCpu {
    /// Of the wheel's runs on rbgctl and on Mooncake; `None` when there were none.
    fn of(on_rbgctl: &mooncake_peer::PeerRun, mooncake: &mooncake_peer::PeerRun) -> Option<Self> {
        (!on_rbgctl.rows.is_empty()).then(|| ServerCpu {
            master_us_per_rpc: Versus {
                rbgctl: on_rbgctl.master_cpu_us_per_rpc(),
                mooncake: mooncake.master_cpu_us_per_rpc(),
            },
            store_us_per_call: Versus {
                rbgctl: on_rbgctl.store_cpu_us_per_call(),
                mooncake: mooncake.store_cpu_us_per_call(),
            },
        })
    }

    /// The lines the tables print.
    fn lines(&self) -> String {
        let us = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.1}"));
        format!(
            "master CPU per RPC of that client (µs, /proc): rbgctl {}, mooncake {}\n\
             segment's process CPU per call of that client (µs, /proc): rbgctl's store {}, \
             mooncake's storage process {}",
            us(self.master_us_per_rpc.rbgctl),
            us(self.master_us_per_rpc.mooncake),
            us(self.store_us_per_call.rbgctl),
            us(self.store_us_per_call.mooncake),
        )
    }
}

#[derive(Debug, Default, serde::Serialize)]
struct Report {
    persistent: bool,
    /// Fresh or reused segment memory: which rows measured which.
    segments: &'static str,
    /// The best of the runs below: the limit each row is judged against.
    loopback_tcp_gb_per_s: f64,
    memcpy_gb_per_s: f64,
    /// Every run of the two limits: best, median, worst.
    limits: limits::Machine,
    /// Several loopback streams at once, one per client thread of each multi-thread row:
    /// those rows are judged against the limit with as many streams.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    loopback_streams: Vec<StreamsLimit>,
    results: Vec<PhaseResult>,
    flood: Option<FloodReport>,
    /// Some phases failed or did not run: the figures are not the whole measurement.
    partial: bool,
    failures: Vec<String>,
    /// The Mooncake store's rows, with `--mooncake-python`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mooncake: Vec<PhaseResult>,
    /// rbgctl's rows beside Mooncake's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    versus_mooncake: Vec<mooncake_peer::Versus>,
    /// Mooncake's own client (the wheel, unchanged) on rbgctl's master and store, with
    /// `--mooncake-python` and the benchmark's own cluster.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mooncake_client_on_rbgctl: Vec<PhaseResult>,
    /// Rounds the side-by-side rows are the medians of (`--mooncake-rounds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    mooncake_rounds: Option<u32>,
    /// The wheel's rows on rbgctl beside its rows on Mooncake's own master and store.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    versus_mooncake_client: Vec<mooncake_peer::Versus>,
    /// What each master spent per RPC of the wheel's client, and the process holding the
    /// segment per call (CPU time from /proc, in microseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    server_cpu: Option<ServerCpu>,
    /// redis-server's rows, with `--redis-server`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    redis: Vec<PhaseResult>,
    /// rbgctl's small-value rows beside Redis's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    versus_redis: Vec<mooncake_peer::Versus>,
    /// With `--held`: how each operation's p99 moved from the fewest objects held to the most.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    held_p99: Vec<HeldChange>,
}

/// `streams` loopback TCP streams at once.
#[derive(Clone, Debug, serde::Serialize)]
struct StreamsLimit {
    streams: usize,
    gb_per_s: limits::Spread,
}

/// One operation's p99 with the pool holding few objects and many.
#[derive(Clone, Debug, serde::Serialize)]
struct HeldChange {
    op: String,
    from_objects: u64,
    to_objects: u64,
    from_p99_us: f64,
    to_p99_us: f64,
    /// to / from − 1.
    change: f64,
}

/// What the idle flood did.
#[derive(Clone, Debug, serde::Serialize)]
struct FloodReport {
    asked: usize,
    opened: usize,
    /// Still held open by the servers after the measured phases.
    held_after: usize,
}

fn value_for(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..size).map(|_| rng.u8(..)).collect()
}

/// How many objects of `size` one phase may write.
fn phase_budget(args: &StoreBenchArgs, size: u64) -> u64 {
    (args.phase_bytes.0 / size.max(1))
        .min(args.phase_ops)
        .max(1)
}

impl Outcome {
    /// A client call's outcome: a read of an object the pool had evicted is skipped (it may
    /// evict: it is a cache), not failed.
    fn of<T>(r: Result<T, ClientError>, ok: impl FnOnce(T) -> bool) -> Outcome {
        match r {
            Ok(v) => {
                if ok(v) {
                    Outcome::Ok
                } else {
                    Outcome::Failed("wrong length or content read back".into())
                }
            }
            Err(ClientError::NotFound(_)) => Outcome::Skipped,
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// What a phase measured: its calls (a read of an evicted value is skipped), and with
/// `--breakdown`, where their time went.
struct Phase {
    run: super::kit::load::Run,
    breakdown: Option<OpBreakdown>,
}

impl Phase {
    #[allow(clippy::too_many_arguments)] // one row of the report
    fn result(
        self,
        case: &str,
        op: &str,
        value: u64,
        threads: usize,
        items: u64,
        keep: usize,
        failures: &Failures,
    ) -> PhaseResult {
        let run = self.run;
        if let Some(e) = &run.first_error {
            failures.note(&format!("{case} {op}"), run.errors, e);
        }
        let lat: Vec<Duration> = run.latencies.into_iter().take(keep).collect();
        let mut r = PhaseResult::from_samples(
            case,
            op,
            value,
            threads,
            lat,
            items,
            run.errors,
            run.elapsed,
        );
        r.evicted = run.skipped;
        r.breakdown = self.breakdown;
        r
    }
}

/// Runs a phase and, with `--breakdown`, adds where its items' time went (`items` per
/// sample).
fn probed(client: &Client, ctx: &Ctx<'_>, items: u64, run: impl FnOnce() -> Phase) -> Phase {
    if !ctx.args.breakdown {
        return run();
    }
    let (before, sys_before) = (client.breakdown(), syscalls());
    let mut phase = run();
    let (after, sys_after) = (client.breakdown(), syscalls());
    let latency: Duration = phase.run.latencies.iter().sum();
    let n = phase.run.latencies.len() as u64 * items;
    let sys = sys_before.zip(sys_after).map(|(a, b)| b.saturating_sub(a));
    phase.breakdown = Some(OpBreakdown::per_item(
        &after.since(&before),
        n,
        latency,
        sys,
    ));
    phase
}

/// Failed operations across the run: a benchmark with any cannot claim its figures.
#[derive(Default)]
struct Failures(parking_lot::Mutex<Vec<String>>);

impl Failures {
    fn note(&self, phase: &str, n: u64, first: &str) {
        self.0
            .lock()
            .push(format!("{phase}: {n} failed (first: {first})"));
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock())
    }
}

/// Runs `threads` workers; each does `op(thread, i)` for i in 0.. until its share of `budget`
/// is done or the time is up.
fn run_phase(
    threads: usize,
    budget: u64,
    time: Duration,
    op: impl Fn(usize, u64) -> Outcome + Sync,
) -> Phase {
    Phase {
        run: super::kit::load::closed_loop(
            threads,
            budget,
            time,
            |_| Ok(()),
            |_, t, i| Some(op(t, i)),
        ),
        breakdown: None,
    }
}

/// What every case needs: the arguments, the run's own key prefix, and where failures go.
struct Ctx<'a> {
    args: &'a StoreBenchArgs,
    /// Every key this run writes starts with it (`bench-store/<run>/`), so that it never
    /// overwrites anyone's objects and removes exactly its own.
    prefix: String,
    failures: Failures,
}

impl<'a> Ctx<'a> {
    /// A run's context: its keys under a prefix of their own (this process, a random draw).
    fn new(args: &'a StoreBenchArgs) -> Ctx<'a> {
        Ctx {
            args,
            prefix: format!(
                "bench-store/{:x}-{:x}/",
                std::process::id(),
                fastrand::u32(..)
            ),
            failures: Failures::default(),
        }
    }
}

/// Put then get of unique keys for one value size and thread count, the values placed on
/// `segment` (any, if empty).
fn put_get_case(
    client: &Arc<Client>,
    case: &str,
    ctx: &Ctx<'_>,
    size: usize,
    threads: usize,
    segment: &str,
) -> Vec<PhaseResult> {
    let value = value_for(size, size as u64);
    let budget = phase_budget(ctx.args, size as u64);
    let cfg = ReplicateConfig {
        replica_num: 1,
        preferred_segment: segment.to_string(),
        ..Default::default()
    };
    let key = |t: usize, i: u64| format!("{}{case}/{size}/{threads}/{t}/{i}", ctx.prefix);
    let written: Vec<parking_lot::Mutex<u64>> =
        (0..threads).map(|_| parking_lot::Mutex::new(0)).collect();
    let phase = probed(client, ctx, 1, || {
        run_phase(threads, budget, ctx.args.phase_time.0, |t, i| {
            let r = client.put(&key(t, i), &value, &cfg);
            if r.is_ok() {
                *written[t].lock() = i + 1;
            }
            Outcome::of(r, |_| true)
        })
    });
    let put = phase.result(
        case,
        "put",
        size as u64,
        threads,
        1,
        usize::MAX,
        &ctx.failures,
    );
    let counts: Vec<u64> = written.iter().map(|w| *w.lock()).collect();
    let total: u64 = counts.iter().sum();
    let bufs: Vec<parking_lot::Mutex<Vec<u8>>> = (0..threads)
        .map(|_| parking_lot::Mutex::new(vec![0u8; size]))
        .collect();
    let phase = probed(client, ctx, 1, || {
        run_phase(threads, total.max(1), Duration::from_secs(3600), |t, i| {
            if i >= counts[t] {
                return Outcome::Ok;
            }
            let mut buf = bufs[t].lock();
            Outcome::of(client.get_into(&key(t, i), &mut buf), |n| n == size)
        })
    });
    let get = phase.result(
        case,
        "get",
        size as u64,
        threads,
        1,
        total as usize,
        &ctx.failures,
    );
    // Spot-check content once.
    if counts[0] > 0 {
        if let Ok(v) = client.get(&key(0, 0)) {
            if v != value {
                ctx.failures.note(
                    &format!("{case} get"),
                    1,
                    "the value read back differs from the one written",
                );
            }
        }
    }
    cleanup(
        client,
        (0..threads)
            .flat_map(|t| (0..counts[t]).map(move |i| (t, i)))
            .map(|(t, i)| key(t, i))
            .collect(),
    );
    vec![put, get]
}

fn cleanup(client: &Client, keys: Vec<String>) {
    for chunk in keys.chunks(1024) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let _ = client.batch_remove(&refs, true);
    }
}

fn batch_case(client: &Arc<Client>, case: &str, ctx: &Ctx<'_>) -> Vec<PhaseResult> {
    let args = ctx.args;
    let size = args.batch_value.0 as usize;
    let n = args.batch;
    let values: Vec<Vec<u8>> = (0..n).map(|i| value_for(size, i as u64)).collect();
    let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let calls = (phase_budget(args, size as u64) / n as u64).max(1);
    let cfg = ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    let keys_of = |call: u64| -> Vec<String> {
        (0..n)
            .map(|j| format!("{}{case}/batch/{call}/{j}", ctx.prefix))
            .collect()
    };
    let done = parking_lot::Mutex::new(0u64);
    let phase = probed(client, ctx, n as u64, || {
        run_phase(1, calls, args.phase_time.0, |_, call| {
            let keys = keys_of(call);
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let results = client.batch_put(&refs, &value_refs, &cfg);
            match results.into_iter().find_map(Result::err) {
                None => {
                    *done.lock() = call + 1;
                    Outcome::Ok
                }
                Some(e) => Outcome::Failed(e.to_string()),
            }
        })
    });
    let put_op = format!("batch_put {n}x");
    let put = phase.result(
        case,
        &put_op,
        size as u64,
        1,
        n as u64,
        usize::MAX,
        &ctx.failures,
    );
    let done = *done.lock();
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; size]).collect();
    let bufs_lock = parking_lot::Mutex::new(&mut bufs);
    let phase = probed(client, ctx, n as u64, || {
        run_phase(1, done.max(1), Duration::from_secs(3600), |_, call| {
            if call >= done {
                return Outcome::Ok;
            }
            let keys = keys_of(call);
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let mut guard = bufs_lock.lock();
            let mut slices: Vec<&mut [u8]> = guard.iter_mut().map(|b| b.as_mut_slice()).collect();
            let results = client.batch_get_into(&refs, &mut slices);
            if results
                .iter()
                .any(|r| matches!(r, Err(ClientError::NotFound(_))))
            {
                return Outcome::Skipped;
            }
            match results
                .into_iter()
                .find(|r| !matches!(r, Ok(x) if *x == size))
            {
                None => Outcome::Ok,
                Some(Err(e)) => Outcome::Failed(e.to_string()),
                Some(Ok(x)) => Outcome::Failed(format!("read {x} bytes, wrote {size}")),
            }
        })
    });
    let get_op = format!("batch_get {n}x");
    let get = phase.result(
        case,
        &get_op,
        size as u64,
        1,
        n as u64,
        done as usize,
        &ctx.failures,
    );
    cleanup(client, (0..done).flat_map(keys_of).collect());
    vec![put, get]
}

fn exists_case(client: &Arc<Client>, ctx: &Ctx<'_>) -> PhaseResult {
    let n = ctx.args.exists_batch;
    let keys: Vec<String> = (0..n)
        .map(|i| format!("{}exists/{i}", ctx.prefix))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = (0..n).map(|_| vec![1u8; 64]).collect();
    let vrefs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let _ = client.batch_put(
        &refs,
        &vrefs,
        &ReplicateConfig {
            replica_num: 1,
            ..Default::default()
        },
    );
    let phase = run_phase(1, u64::MAX / 2, ctx.args.phase_time.0, |_, _| {
        Outcome::of(client.batch_exists(&refs), |v| v.iter().all(|e| *e))
    });
    cleanup(client, keys.clone());
    let op = format!("batch_exists {n}x");
    phase.result("tcp", &op, 0, 1, n as u64, usize::MAX, &ctx.failures)
}

/// Before writing into a pool it did not start: refuses when the pool holds objects (someone
/// else's cache, which the benchmark's writes could make the master evict), unless
/// `--allow-eviction`.
fn check_foreign_pool(client: &Client, master: &str, args: &StoreBenchArgs) -> anyhow::Result<()> {
    let segments = client.segments()?;
    let used: u64 = segments.iter().map(|s| s.used).sum();
    let size: u64 = segments.iter().map(|s| s.info.size).sum();
    if used == 0 {
        return Ok(());
    }
    let message = format!(
        "the pool at {master} already holds {} of {} in {} segment(s); this benchmark writes up \
         to {} per phase (under its own key prefix, removed afterwards), which can make the master \
         evict those objects",
        human_bytes(used),
        human_bytes(size),
        segments.len(),
        human_bytes(args.phase_bytes.0)
    );
    anyhow::ensure!(
        args.allow_eviction,
        "{message}; pass --allow-eviction to run anyway"
    );
    eprintln!("warning: {message} (--allow-eviction given)");
    Ok(())
}

/// Runs `rbgctl bench store` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(args: StoreBenchArgs) -> anyhow::Result<()> {
    if let Some(device) = &args.rdma {
        anyhow::ensure!(
            args.master.is_none(),
            "--rdma starts its own master and store; leave out --master"
        );
        #[cfg(feature = "rdma")]
        return rdma_mode(&args, device);
        #[cfg(not(feature = "rdma"))]
        anyhow::bail!("--rdma {device}: this build has no RDMA (cargo feature `rdma`)");
    }
    if let Some(dir) = &args.disk_tier {
        anyhow::ensure!(
            args.master.is_none(),
            "--disk-tier starts its own master and store; leave out --master"
        );
        return super::disk_tier::run(super::disk_tier::Plan {
            dir,
            memory: args.disk_tier_memory.0,
            disk: args.disk_tier_size.0,
            sizes: args.disk_tier_values.iter().map(|s| s.0).collect(),
            threads: args.threads.clone(),
            json: args.json,
            report: args.report.as_deref(),
        });
    }
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    progress("measuring the machine: loopback TCP, memcpy");
    let machine = limits::machine_spread()?;
    let (loopback, memcpy) = (machine.loopback.best, machine.memcpy.best);
    let mut streams = Vec::new();
    for &n in args.threads.iter().filter(|&&n| n > 1) {
        progress(&format!(
            "measuring the machine: {n} loopback TCP streams at once"
        ));
        streams.push(StreamsLimit {
            streams: n,
            gb_per_s: limits::loopback_tcp_streams(n, 128 << 20, 5)?,
        });
    }
    // The limit a TCP row of `threads` client threads is judged against.
    let tcp_limit = |threads: usize| {
        streams
            .iter()
            .find(|s| s.streams == threads)
            .map_or(loopback, |s| s.gb_per_s.best)
    };
    let (master, mut cluster) = match (&args.auth_token_file, &args.master) {
        (Some(file), None) => {
            progress("starting a master and a store that require the cluster secret");
            let c = super::kit::cluster::OwnCluster::start_with(super::kit::cluster::OwnOpts {
                segment_size: args.segment_size.0,
                persistent: args.persistent,
                disk_tier: None,
                master: crate::master::config::MasterConfig {
                    auth_token_file: Some(file.clone()),
                    ..Default::default()
                },
                rdma_device: None,
            })?;
            (c.master.clone(), Some(c))
        }
        _ => master_or_own(
            args.master.as_deref(),
            args.segment_size.0,
            args.persistent,
            progress,
        )?,
    };
    let tcp = Arc::new(Client::connect(
        ClientConfig {
            same_host_shm: false,
            ..ClientConfig::new(master.clone())
        }
        .with_auth_file(args.auth_token_file.as_deref())?,
    )?);
    if args.master.is_some() {
        check_foreign_pool(&tcp, &master, &args)?;
    }
    let ctx = Ctx::new(&args);
    let mut results = Vec::new();
    let outcome = measure(
        &tcp,
        &master,
        &ctx,
        &mut results,
        &tcp_limit,
        memcpy,
        &progress,
    );
    let held_p99 = match outcome {
        Ok(_) if !args.held.is_empty() => held_cases(&tcp, &ctx, &mut results, &progress)?,
        _ => Vec::new(),
    };
    if let (Ok(_), Some(cluster)) = (&outcome, cluster.as_mut()) {
        let limits = (loopback, memcpy);
        if let Err(e) = fresh_cases(cluster, &master, &ctx, &mut results, limits, &progress) {
            ctx.failures.note("fresh segments", 1, &e.to_string());
        }
    }
    let mut failures = ctx.failures.take();
    let mut mooncake = mooncake_peer::PeerRun::default();
    let mut on_rbgctl = mooncake_peer::PeerRun::default();
    if let Some(python) = &args.mooncake_python {
        let mut plan = peer_plan(&args, None);
        // The same wheel client on rbgctl's master and store (which serve Mooncake's
        // protocols without a cluster secret), in turns with Mooncake's own.
        let pids = cluster.as_ref().map(|c| c.pids(0));
        let on_ours = match (pids, &args.auth_token_file) {
            (Some((Some(master_pid), store_pid)), None) => Some(OurPool {
                master: &master,
                master_pid,
                store_pid,
            }),
            _ => None,
        };
        (mooncake, on_rbgctl) = mooncake_rounds(
            python,
            &mut plan,
            on_ours,
            args.mooncake_rounds,
            &progress,
            &mut failures,
        );
    }
    let versus_mooncake = mooncake_peer::versus(&results, &mooncake.rows);
    let versus_mooncake_client = mooncake_peer::versus_case(
        &on_rbgctl.rows,
        "mooncake client on rbgctl tcp",
        &mooncake.rows,
    );
    let server_cpu = ServerCpu::of(&on_rbgctl, &mooncake);
    let mut redis = Vec::new();
    if let Some(server) = &args.redis_server {
        progress("redis-server, small values, one connection");
        let plan = redis_peer::RedisPlan {
            server,
            sizes: &args.sizes.iter().map(|s| s.0).collect::<Vec<_>>(),
            phase_time: args.phase_time.0,
            phase_ops: args.phase_ops,
        };
        match redis_peer::run(&plan) {
            Ok(rows) => redis = rows,
            Err(e) => failures.push(format!("redis: {e}")),
        }
    }
    let versus_redis = mooncake_peer::versus(&results, &redis);
    let report = Report {
        persistent: args.persistent,
        segments: SEGMENTS,
        loopback_tcp_gb_per_s: loopback,
        loopback_streams: streams,
        memcpy_gb_per_s: memcpy,
        limits: machine,
        results,
        flood: outcome.as_ref().ok().cloned().flatten(),
        partial: outcome.is_err() || !failures.is_empty(),
        failures: failures.clone(),
        mooncake: mooncake.rows,
        versus_mooncake,
        mooncake_client_on_rbgctl: on_rbgctl.rows,
        mooncake_rounds: args.mooncake_python.as_ref().map(|_| args.mooncake_rounds),
        versus_mooncake_client,
        server_cpu,
        redis,
        versus_redis,
        held_p99,
    };
    report.publish(args.json, args.report.as_deref())?;
    outcome?;
    anyhow::ensure!(
        failures.is_empty(),
        "{} phase(s) had failed operations; the figures above are partial",
        failures.len()
    );
    Ok(())
}

/// Every case in turn; stops at the first that cannot run (the results so far stay).
#[allow(clippy::too_many_arguments)]
fn measure(
    tcp: &Arc<Client>,
    master: &str,
    ctx: &Ctx<'_>,
    results: &mut Vec<PhaseResult>,
    tcp_limit: &impl Fn(usize) -> f64,
    memcpy: f64,
    progress: &impl Fn(&str),
) -> anyhow::Result<Option<FloodReport>> {
    let args = ctx.args;
    for &threads in &args.threads {
        for size in &args.sizes {
            progress(&format!(
                "tcp: {} × {threads} thread(s)",
                human_bytes(size.0)
            ));
            results.extend(put_get_case(tcp, "tcp", ctx, size.0 as usize, threads, ""));
        }
    }
    progress(&format!(
        "tcp: batches of {} × {}",
        args.batch,
        human_bytes(args.batch_value.0)
    ));
    results.extend(batch_case(tcp, "tcp", ctx));
    progress("master: batched existence checks");
    results.push(exists_case(tcp, ctx));
    for r in results.iter_mut().filter(|r| r.value_bytes >= 1 << 20) {
        r.of_limit = Some(r.gb_per_s / tcp_limit(r.threads));
    }
    let flood = if args.idle_flood > 0 {
        Some(flood_cases(tcp, master, ctx, results, progress)?)
    } else {
        None
    };
    if !args.no_shm {
        let shm = Arc::new(Client::connect(
            ClientConfig::new(master.to_string())
                .with_auth_file(args.auth_token_file.as_deref())?,
        )?);
        let shared = shm.segments()?.iter().any(|s| !s.info.shm_path.is_empty());
        if shared {
            for size in [1u64 << 20, 4 << 20] {
                progress(&format!("same-host shared memory: {}", human_bytes(size)));
                let mut r = put_get_case(&shm, "shm", ctx, size as usize, 1, "");
                for x in &mut r {
                    x.of_limit = Some(x.gb_per_s / memcpy);
                }
                results.extend(r);
            }
        } else {
            progress("no segment is shareable from this host; skipping the shared-memory cases");
        }
    }
    Ok(flood)
}

/// The 1 MiB and 4 MiB single-thread rows again, each into a store of its own just started with
/// `prefault = false` (`OwnCluster::add_fresh_store`), so every write lands on memory never
/// touched: over TCP, and same-host unless `--no-shm`. Each store is stopped after its row.
fn fresh_cases(
    cluster: &mut super::kit::cluster::OwnCluster,
    master: &str,
    ctx: &Ctx<'_>,
    results: &mut Vec<PhaseResult>,
    (loopback, memcpy): (f64, f64),
    progress: &impl Fn(&str),
) -> anyhow::Result<()> {
    let args = ctx.args;
    let client = |same_host_shm| -> anyhow::Result<Arc<Client>> {
        let cfg = ClientConfig {
            same_host_shm,
            ..ClientConfig::new(master.to_string())
        };
        Ok(Arc::new(Client::connect(
            cfg.with_auth_file(args.auth_token_file.as_deref())?,
        )?))
    };
    let mut paths = vec![("tcp-fresh", false, loopback)];
    if !args.no_shm {
        paths.push(("shm-fresh", true, memcpy));
    }
    for (case, same_host, limit) in paths {
        let client = client(same_host)?;
        for size in [1u64 << 20, 4 << 20] {
            progress(&format!(
                "{case}: {} into a new store's untouched memory",
                human_bytes(size)
            ));
            // Room for the phase's bytes, in whole values, and a little more.
            let room = args.phase_bytes.0.min(args.phase_ops * size) + 2 * size;
            let (i, segment) = cluster.add_fresh_store(room.next_multiple_of(4096))?;
            let rows = put_get_case(&client, case, ctx, size as usize, 1, &segment);
            results.extend(rows.into_iter().map(|mut r| {
                r.of_limit = Some(r.gb_per_s / limit);
                r
            }));
            cluster.stop_store(i)?;
        }
    }
    Ok(())
}

/// `--held`: for each count in turn, the pool topped up to that many 256-byte objects (four
/// threads, batches of 128), then 4 KiB put/get by one thread; the objects are removed at the
/// end. Returns each operation's p99 change from the first count to the last.
fn held_cases(
    tcp: &Arc<Client>,
    ctx: &Ctx<'_>,
    results: &mut Vec<PhaseResult>,
    progress: &impl Fn(&str),
) -> anyhow::Result<Vec<HeldChange>> {
    const LOADERS: u64 = 4;
    const BATCH: u64 = 128;
    let key = |i: u64| format!("{}held/{i:012}", ctx.prefix);
    let value = value_for(256, 256);
    let cfg = ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    let mut counts = ctx.args.held.clone();
    counts.sort_unstable();
    counts.dedup();
    let mut held = 0u64;
    let mut rows: Vec<(u64, PhaseResult)> = Vec::new();
    let outcome = (|| -> anyhow::Result<()> {
        for &target in &counts {
            progress(&format!("holding {target} objects: loading"));
            let from = held;
            let failed = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for t in 0..LOADERS {
                    let (key, value, cfg, failed) = (&key, &value, &cfg, &failed);
                    s.spawn(move || {
                        let mut b = from + t * BATCH;
                        while b < target {
                            let keys: Vec<String> = (b..(b + BATCH).min(target)).map(key).collect();
                            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                            let values: Vec<&[u8]> = vec![value.as_slice(); refs.len()];
                            let bad = tcp
                                .batch_put(&refs, &values, cfg)
                                .iter()
                                .filter(|r| r.is_err())
                                .count();
                            failed.fetch_add(bad as u64, std::sync::atomic::Ordering::Relaxed);
                            b += LOADERS * BATCH;
                        }
                    });
                }
            });
            held = target;
            let failed = failed.into_inner();
            anyhow::ensure!(
                failed == 0,
                "{failed} of the objects to hold could not be put (is the segment large enough \
                 for {target} objects of 256 bytes?)"
            );
            progress(&format!("holding {target} objects: 4 KiB × 1 thread"));
            for mut r in put_get_case(tcp, "held", ctx, 4 << 10, 1, "") {
                r.op = format!("{}, {} held", r.op, short_count(target));
                rows.push((target, r));
            }
        }
        Ok(())
    })();
    progress("removing the held objects");
    cleanup(tcp, (0..held).map(key).collect());
    outcome?;
    let mut changes = Vec::new();
    if let (Some(&first), Some(&last)) = (counts.first(), counts.last()) {
        for op in ["put", "get"] {
            let p99 = |n: u64| {
                rows.iter()
                    .find(|(held, r)| *held == n && r.op.starts_with(op))
                    .map(|(_, r)| r.p99_us)
            };
            if let (Some(a), Some(b)) = (p99(first), p99(last)) {
                changes.push(HeldChange {
                    op: op.to_owned(),
                    from_objects: first,
                    to_objects: last,
                    from_p99_us: a,
                    to_p99_us: b,
                    change: if a > 0.0 { b / a - 1.0 } else { 0.0 },
                });
            }
        }
    }
    results.extend(rows.into_iter().map(|(_, r)| r));
    Ok(changes)
}

/// 10000 as `10k`, 1000000 as `1M`.
fn short_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// 4 KiB and 1 MiB put/get again while `--idle-flood` idle connections are held open to the
/// master and every store, from `--flood-from`.
fn flood_cases(
    tcp: &Arc<Client>,
    master: &str,
    ctx: &Ctx<'_>,
    results: &mut Vec<PhaseResult>,
    progress: &impl Fn(&str),
) -> anyhow::Result<FloodReport> {
    let args = ctx.args;
    use std::net::ToSocketAddrs;
    let mut targets: Vec<std::net::SocketAddr> = master.to_socket_addrs()?.take(1).collect();
    for s in tcp.segments()? {
        targets.extend(s.info.endpoint.to_socket_addrs()?.take(1));
    }
    progress(&format!(
        "opening {} idle connections from {} to {} server(s)",
        args.idle_flood,
        args.flood_from,
        targets.len()
    ));
    let flood = super::kit::flood::Flood::open(args.flood_from, &targets, args.idle_flood);
    for size in [4usize << 10, 1 << 20] {
        progress(&format!(
            "flood: {} × 1 thread beside {} idle connections",
            human_bytes(size as u64),
            flood.len()
        ));
        results.extend(put_get_case(tcp, "flood", ctx, size, 1, ""));
    }
    Ok(FloodReport {
        asked: args.idle_flood,
        opened: flood.len(),
        held_after: flood.still_open(),
    })
}

#[cfg(feature = "rdma")]
impl BenchReport for RdmaReport {
    fn table(&self) -> String {
        let r = self;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "RDMA on {} (one client thread; limits from perftest in the same run)",
            r.device
        );
        for p in &r.perftest {
            let size = human_bytes(p.message_bytes);
            let _ = match (p.gb_per_s, p.typical_us) {
                (Some(gb), _) => writeln!(out, "  {:<12} {size:>9}  {gb:.3} GB/s", p.tool),
                (_, Some(us)) => writeln!(out, "  {:<12} {size:>9}  {us:.1} µs typical", p.tool),
                _ => Ok(()),
            };
        }
        let _ = writeln!(
            out,
            "{:<16} {:<14} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9}",
            "case", "op", "value", "GB/s", "ops/s", "p50 µs", "p99 µs", "of limit"
        );
        for x in &r.results {
            let _ = writeln!(
                out,
                "{:<16} {:<14} {:>9} {:>10.3} {:>10.0} {:>9.1} {:>9.1} {:>9}",
                x.case,
                x.op,
                human_bytes(x.value_bytes),
                x.gb_per_s,
                x.ops_per_s,
                x.p50_us,
                x.p99_us,
                x.of_limit
                    .map_or("-".into(), |f| format!("{:.0} %", f * 100.0))
            );
        }
        if let Some(l) = r.get_4k_latency_ratio {
            let _ = writeln!(out, "4 KiB get p50 / ib_read_lat typical: {l:.2}×");
        }
        if !r.versus_mooncake_store.is_empty() {
            let _ = write!(
                out,
                "{}",
                versus_table(
                    "Mooncake's wheel by RDMA: on rbgctl's store / on Mooncake's",
                    "mooncake",
                    &r.versus_mooncake_store
                )
            );
        }
        if let Some(cpu) = r.server_cpu {
            let _ = writeln!(out, "{}", cpu.lines());
        }
        for c in &r.store_cpu {
            let checks = c.version_checks.map_or(String::new(), |v| {
                format!(
                    " (versions checked by stamp {}, by asking the store {})",
                    v.stamped, v.asked
                )
            });
            let _ = writeln!(
                out,
                "store CPU, {} gets of 1 MiB by {}: {:.3} s in {:.2} s{checks}",
                c.gets, c.path, c.store_cpu_seconds, c.seconds
            );
        }
        if let Some(x) = r.store_cpu_ratio {
            let _ = writeln!(out, "store CPU by RDMA / over TCP: {:.1} %", x * 100.0);
        }
        out
    }
}

impl BenchReport for Report {
    /// The report as a person reads it: one aligned row per phase.
    fn table(&self) -> String {
        let r = self;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "machine: loopback TCP, one stream {}; memcpy {}; store persistent: {}",
            r.limits.loopback.describe(),
            r.limits.memcpy.describe(),
            r.persistent
        );
        for s in &r.loopback_streams {
            let _ = writeln!(
                out,
                "machine: {} loopback TCP streams at once {}",
                s.streams,
                s.gb_per_s.describe()
            );
        }
        let _ = writeln!(
            out,
            "{:<9} {:<17} {:>11} {:>3} {:>8} {:>10} {:>9} {:>9} {:>6} {:>7} {:>8}",
            "path",
            "op",
            "value",
            "thr",
            "GB/s",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "errors",
            "evicted",
            "of limit"
        );
        for x in &r.results {
            let value = if x.value_bytes == 0 {
                "-".to_string()
            } else {
                human_bytes(x.value_bytes)
            };
            let limit = x
                .of_limit
                .map(|l| format!("{:.0} %", l * 100.0))
                .unwrap_or_default();
            // No bytes move in an exists: no bandwidth to give.
            let gb = if x.value_bytes == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", x.gb_per_s)
            };
            let _ = writeln!(
                out,
                "{:<9} {:<17} {:>11} {:>3} {:>8} {:>10.0} {:>9.1} {:>9.1} {:>6} {:>7} {:>8}",
                x.case,
                x.op,
                value,
                x.threads,
                gb,
                x.ops_per_s,
                x.p50_us,
                x.p99_us,
                x.errors,
                x.evicted,
                limit
            );
        }
        let _ = writeln!(
            out,
            "legend: ops/s counts objects (a batch row, `batch_... Nx`, counts each of its N), p50 \
             and p99 are per call (a batch row's: the whole batch); GB/s is value bytes moved (- for \
             exists, which moves none); of limit: large tcp values against as many loopback \
             streams as threads, shm against memcpy, blank where no limit applies (small values, \
             batches, exists); evicted: reads of objects the pool had evicted, not errors. The \
             client, the stores and the master share this machine's cores: every figure is of \
             the three at once."
        );
        let _ = writeln!(out, "(segment memory: {})", r.segments);
        if r.results.iter().any(|x| x.breakdown.is_some()) {
            out.push_str(&breakdown_table(r));
        }
        if !r.versus_mooncake.is_empty() {
            out.push_str(&versus_table(
                "side by side with the Mooncake store (its zero-copy calls; same topology: a master, \
                 one storage process, this client; same run)",
                "mooncake",
                &r.versus_mooncake,
            ));
        }
        if !r.versus_mooncake_client.is_empty() {
            out.push_str(&versus_table(
                "Mooncake's own client (the wheel, unchanged, its zero-copy calls) on rbgctl's \
                 master and store, beside the same client on Mooncake's master and storage \
                 process (same run)",
                "mooncake",
                &r.versus_mooncake_client,
            ));
            if let Some(cpu) = r.server_cpu {
                let _ = writeln!(out, "{}", cpu.lines());
            }
        }
        if !r.versus_redis.is_empty() {
            out.push_str(&versus_table(
                "side by side with redis-server (one connection, one request in flight, as \
                 redis-benchmark -c 1; same run)",
                "redis",
                &r.versus_redis,
            ));
        }
        if r.partial {
            let _ = writeln!(out, "PARTIAL RESULTS: some phases failed or did not run:");
            for f in &r.failures {
                let _ = writeln!(out, "  {f}");
            }
        }
        for h in &r.held_p99 {
            let _ = writeln!(
                out,
                "held: 4 KiB {} p99 {:.1} µs with {} objects held, {:.1} µs with {} ({:+.0} %)",
                h.op,
                h.from_p99_us,
                short_count(h.from_objects),
                h.to_p99_us,
                short_count(h.to_objects),
                h.change * 100.0
            );
        }
        if let Some(f) = &r.flood {
            let _ = writeln!(
                out,
                "flood: {} idle connections asked, {} opened, {} still held by the servers after the \
                 flood phases (the rest were refused or closed)",
                f.asked, f.opened, f.held_after
            );
        }
        out
    }

    /// The HTML report: throughput and p99 latency per value size, a curve per path, operation
    /// and thread count (the Mooncake store's too, with `--mooncake-python`), the machine's
    /// limits as dashed lines, and every row in a table.
    fn page(&self) -> anyhow::Result<crate::report::Page> {
        let r = self;
        use crate::report::{Format, LineChart, Page, Series};
        let mut page = Page::new("KV pool: put and get");
        page.fact("loopback TCP, one stream", r.limits.loopback.describe())
            .fact("memcpy", r.limits.memcpy.describe())
            .fact("store persistent", r.persistent.to_string())
            .fact("segment memory", r.segments);
        for s in &r.loopback_streams {
            page.fact(
                &format!("loopback TCP, {} streams at once", s.streams),
                s.gb_per_s.describe(),
            );
        }
        if r.partial {
            page.fact("PARTIAL", r.failures.join("; "));
        }
        // One curve per (path, operation, threads) measured at two sizes or more.
        let mut curves: Vec<(String, Vec<&PhaseResult>)> = Vec::new();
        for x in r
            .results
            .iter()
            .chain(&r.mooncake)
            .chain(&r.mooncake_client_on_rbgctl)
            .chain(&r.redis)
            .filter(|x| x.value_bytes > 0)
        {
            let name = format!(
                "{} {}, {} thread{}",
                x.case,
                x.op,
                x.threads,
                if x.threads == 1 { "" } else { "s" }
            );
            match curves.iter_mut().find(|(n, _)| *n == name) {
                Some((_, rows)) => rows.push(x),
                None => curves.push((name, vec![x])),
            }
        }
        curves.retain(|(_, rows)| rows.len() > 1);
        let sizes = || {
            curves
                .iter()
                .flat_map(|(_, rows)| rows.iter().map(|x| x.value_bytes as f64))
        };
        let (lo, hi) = (
            sizes().fold(f64::INFINITY, f64::min),
            sizes().fold(0.0, f64::max),
        );
        let mut gbps = LineChart::new(
            "gb-per-s-per-size",
            "Throughput per value size",
            "value size",
            "GB/s",
        )
        .formats(Format::Bytes, Format::Number)
        .log_x();
        let mut p99 = LineChart::new(
            "p99-per-size",
            "p99 latency per value size",
            "value size",
            "p99 latency (µs)",
        )
        .formats(Format::Bytes, Format::Number)
        .log_x()
        .log_y();
        for (name, rows) in &curves {
            let points = |f: fn(&PhaseResult) -> f64| {
                rows.iter().map(|x| (x.value_bytes as f64, f(x))).collect()
            };
            gbps = gbps.series(Series::new(name, points(|x| x.gb_per_s)));
            p99 = p99.series(Series::new(name, points(|x| x.p99_us)));
        }
        if hi > 0.0 {
            gbps = gbps
                .series(Series::level(
                    "loopback TCP (this machine)",
                    r.loopback_tcp_gb_per_s,
                    lo,
                    hi,
                ))
                .series(Series::level(
                    "memcpy (this machine)",
                    r.memcpy_gb_per_s,
                    lo,
                    hi,
                ));
        }
        page.heading("Charts");
        page.line_chart(&gbps, "Bytes moved per second by all threads. Dashed: the machine's own limits, measured in this run: what one TCP stream over loopback and one memcpy reach.")?;
        page.line_chart(
            &p99,
            "99th percentile of one operation's latency (both axes logarithmic).",
        )?;
        page.heading("Every phase");
        let rows = r
            .results
            .iter()
            .chain(&r.mooncake)
            .chain(&r.mooncake_client_on_rbgctl)
            .chain(&r.redis)
            .map(|x| {
                vec![
                    x.case.clone(),
                    x.op.clone(),
                    if x.value_bytes == 0 {
                        "-".into()
                    } else {
                        human_bytes(x.value_bytes)
                    },
                    x.threads.to_string(),
                    format!("{:.2}", x.gb_per_s),
                    format!("{:.0}", x.ops_per_s),
                    format!("{:.1}", x.p50_us),
                    format!("{:.1}", x.p99_us),
                    x.errors.to_string(),
                    x.of_limit
                        .map_or(String::new(), |l| format!("{:.0}%", l * 100.0)),
                ]
            })
            .collect();
        page.table(
            &[
                "path", "op", "value", "threads", "GB/s", "ops/s", "p50 µs", "p99 µs", "errors",
                "of limit",
            ],
            rows,
        );
        Ok(page)
    }
}

/// rbgctl beside the Mooncake store, row by row.
/// rbgctl's one-thread rows beside a peer's: `title` says what the peer ran, `peer` names its
/// column.
fn versus_table(title: &str, peer: &str, rows: &[mooncake_peer::Versus]) -> String {
    let mut out = format!("{title}, one thread:\n");
    let cpu = rows
        .iter()
        .any(|v| v.rbgctl_client_cpu_us.is_some() && v.peer_client_cpu_us.is_some());
    let _ = writeln!(
        out,
        "{:<17} {:>11} {:>12} {:>9} {:>12} {:>9} {:>7}{}",
        "op",
        "value",
        "rbgctl ops/s",
        "GB/s",
        peer,
        "GB/s",
        "×",
        if cpu {
            "   p50 µs rbgctl/peer   client CPU µs/call rbgctl/peer"
        } else {
            ""
        }
    );
    for v in rows {
        let gb = |ops: f64| ops * v.value_bytes as f64 / 1e9;
        let ceiling = match (cpu, v.rbgctl_client_cpu_us, v.peer_client_cpu_us) {
            (true, Some(ours), Some(theirs)) => format!(
                "   {:>8.0} {:>8.0}   {:>8.0} {:>8.0}",
                v.rbgctl_p50_us, v.peer_p50_us, ours, theirs
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<17} {:>11} {:>12.0} {:>9.2} {:>12.0} {:>9.2} {:>7.2}{ceiling}",
            v.op,
            human_bytes(v.value_bytes),
            v.rbgctl_ops_per_s,
            gb(v.rbgctl_ops_per_s),
            v.peer_ops_per_s,
            gb(v.peer_ops_per_s),
            v.ratio
        );
    }
    if cpu {
        out.push_str(
            "(client CPU: the wheel's process, all its threads, per call; a call that costs \
             the client about its whole latency is bound by the client)\n",
        );
    }
    out
}

/// Where each item's time went, one row per phase that was probed.
fn breakdown_table(r: &Report) -> String {
    let mut out = String::from(
        "where an item's time went, client side (mean µs; rpcs, calls, syscalls per item):\n",
    );
    let _ = writeln!(
        out,
        "{:<5} {:<17} {:>11} {:>3} {:>8} {:>8} {:>5} {:>8} {:>5} {:>8} {:>8} {:>8} {:>8}",
        "path",
        "op",
        "value",
        "thr",
        "total",
        "master",
        "rpcs",
        "transfer",
        "calls",
        "copy",
        "crc",
        "other",
        "syscalls"
    );
    for x in &r.results {
        let Some(b) = &x.breakdown else { continue };
        let syscalls = b
            .syscalls
            .map(|s| format!("{s:.1}"))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:<5} {:<17} {:>11} {:>3} {:>8.1} {:>8.1} {:>5.2} {:>8.1} {:>5.2} {:>8.1} {:>8.1} {:>8.1} {:>8}",
            x.case,
            x.op,
            human_bytes(x.value_bytes),
            x.threads,
            b.total_us,
            b.master_us,
            b.master_rpcs,
            b.transfer_us,
            b.transfers,
            b.copy_us,
            b.checksum_us,
            b.other_us,
            syscalls
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_columns_line_up() {
        let row = |case: &str, op: &str, value: u64| PhaseResult {
            case: case.into(),
            op: op.into(),
            value_bytes: value,
            threads: 4,
            gb_per_s: 12.34,
            ops_per_s: 123456.0,
            p50_us: 1234.5,
            p99_us: 99999.9,
            errors: 12,
            evicted: 3,
            of_limit: Some(0.66),
            ..Default::default()
        };
        let report = Report {
            results: vec![
                row("tcp", "put", 4 << 10),
                row("tcp", "batch_put 32x", 256 << 10),
                row("tcp", "batch_exists 128x", 0),
                row("flood", "get", 1 << 20),
                row("shm", "get", 4 << 20),
                row("shm-fresh", "put", 1 << 20),
            ],
            ..Default::default()
        };
        let text = report.table();
        let lines: Vec<&str> = text.lines().skip(1).take(7).collect();
        let width = lines[0].chars().count();
        for l in &lines {
            assert_eq!(l.chars().count(), width, "{l:?} in\n{text}");
        }
        // Issue 62, item B7: an exists row moves no bytes; the legend says what rows mean.
        let exists = lines.iter().find(|l| l.contains("batch_exists")).unwrap();
        assert!(
            !exists.contains("0.00") && exists.contains(" - "),
            "{exists}"
        );
        assert!(
            text.contains("ops/s counts objects") && text.contains("share this machine's cores")
        );
    }
}

/// The Mooncake peer's phases, the same as rbgctl's rows; over RDMA on `rdma_device`.
fn peer_plan(args: &StoreBenchArgs, rdma_device: Option<&str>) -> mooncake_peer::PeerPlan {
    mooncake_peer::PeerPlan {
        sizes: args.sizes.iter().map(|s| s.0).collect(),
        phase_time: args.phase_time.0,
        phase_ops: args.phase_ops,
        phase_bytes: args.phase_bytes.0,
        batch: args.batch,
        batch_value: args.batch_value.0,
        segment: args.segment_size.0,
        on_master: None,
        rdma_device: rdma_device.map(str::to_string),
        // Over RDMA registered memory carries the bytes, and the wheel pins its staging
        // buffer: it only has to exist.
        buffer: if rdma_device.is_some() {
            16 << 20
        } else {
            512 << 20
        },
    }
}

/// rbgctl's pool for the wheel's client: the master's address, and the master's and the
/// store's processes, whose CPU is counted.
struct OurPool<'a> {
    master: &'a str,
    master_pid: u32,
    store_pid: Option<u32>,
}

/// `rounds` runs of the Mooncake peer by `plan` and, when `ours` is given, as many of the
/// same wheel client on rbgctl's pool; answers each side's rows, the round with the median
/// ops/s row by row. The sides take turns in A-B-B-A order (Mooncake first in odd rounds,
/// rbgctl first in even ones), so that a machine that drifts faster or slower through the
/// run favours neither.
fn mooncake_rounds(
    python: &std::path::Path,
    plan: &mut mooncake_peer::PeerPlan,
    ours: Option<OurPool<'_>>,
    rounds: u32,
    progress: &dyn Fn(&str),
    failures: &mut Vec<String>,
) -> (mooncake_peer::PeerRun, mooncake_peer::PeerRun) {
    let (mut theirs, mut on_ours) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let sides: &[bool] = match (&ours, round % 2 == 1) {
            (None, _) => &[false],
            (Some(_), true) => &[false, true],
            (Some(_), false) => &[true, false],
        };
        for &on_rbgctl in sides {
            match ours.as_ref().filter(|_| on_rbgctl) {
                None => {
                    progress(&format!(
                        "round {round} of {rounds}: the Mooncake store, same phases, same \
                         topology"
                    ));
                    plan.on_master = None;
                    match mooncake_peer::run(python, plan) {
                        Ok(run) => theirs.push(run),
                        Err(e) => failures.push(format!("mooncake: {e}")),
                    }
                }
                Some(pool) => {
                    progress(&format!(
                        "round {round} of {rounds}: Mooncake's client (the wheel, unchanged) \
                         on rbgctl's master and store"
                    ));
                    plan.on_master = Some(pool.master.to_string());
                    match run_on(python, plan, pool) {
                        Ok(run) => on_ours.push(run),
                        Err(e) => failures.push(format!("mooncake client on rbgctl: {e}")),
                    }
                }
            }
        }
    }
    (
        mooncake_peer::PeerRun::median_of(theirs),
        mooncake_peer::PeerRun::median_of(on_ours),
    )
}

/// One run of the wheel's client by `plan` on rbgctl's `pool`, with what its master and store
/// spent meanwhile.
fn run_on(
    python: &std::path::Path,
    plan: &mooncake_peer::PeerPlan,
    pool: &OurPool<'_>,
) -> anyhow::Result<mooncake_peer::PeerRun> {
    let cpu = || {
        let of = |pid: Option<u32>| pid.and_then(super::kit::procfs::cpu_time);
        (of(Some(pool.master_pid)), of(pool.store_pid))
    };
    let before = cpu();
    let mut run = mooncake_peer::run(python, plan)?;
    let after = cpu();
    let spent =
        |b: Option<Duration>, a: Option<Duration>| Some(a?.saturating_sub(b?).as_secs_f64());
    run.master_cpu_seconds = spent(before.0, after.0);
    run.store_cpu_seconds = spent(before.1, after.1);
    Ok(run)
}

/// `--rdma`: what one store serving RDMA gives one client thread, against perftest on the same
/// device in the same run.
#[cfg(feature = "rdma")]
#[derive(Debug, Default, serde::Serialize)]
struct RdmaReport {
    device: String,
    /// The limits: perftest's bandwidth at each message size, and its read latency.
    perftest: Vec<super::kit::rdma::Perftest>,
    /// Rows `rdma`; `of_limit` is the share of ib_write_bw (puts) or ib_read_bw (gets) at the
    /// value size.
    results: Vec<PhaseResult>,
    /// 4 KiB get p50 over ib_read_lat's typical latency.
    get_4k_latency_ratio: Option<f64>,
    /// The store's CPU time for the same stream of gets by RDMA and over TCP, each asking the
    /// master where the value is, then by RDMA from remembered locations (checked by the
    /// version stamp read with the bytes, or by asking the store); less what the store spends
    /// at rest (measured first).
    store_cpu: Vec<StoreCpu>,
    /// RDMA's store CPU over TCP's, both through the master.
    store_cpu_ratio: Option<f64>,
    /// With `--mooncake-python`: Mooncake's wheel by its RDMA transport on the same device,
    /// on Mooncake's own master and storage process (`mooncake rdma`) and on rbgctl's master
    /// and store (`mooncake client on rbgctl rdma`), in turns; each row the median round.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mooncake: Vec<PhaseResult>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mooncake_client_on_rbgctl: Vec<PhaseResult>,
    /// The wheel's client on rbgctl's store over the same client on Mooncake's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    versus_mooncake_store: Vec<mooncake_peer::Versus>,
    /// What each master spent per RPC of the wheel's client, and the process holding the
    /// segment per call (CPU time from /proc, in microseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    server_cpu: Option<ServerCpu>,
    failures: Vec<String>,
}

#[cfg(feature = "rdma")]
#[derive(Debug, Default, serde::Serialize)]
struct StoreCpu {
    path: &'static str,
    gets: u64,
    bytes: u64,
    seconds: f64,
    store_cpu_seconds: f64,
    /// Over RDMA, how the gets of remembered locations were checked (stamp or store).
    #[serde(skip_serializing_if = "Option::is_none")]
    version_checks: Option<crate::client::VersionChecks>,
}

#[cfg(feature = "rdma")]
fn rdma_mode(args: &StoreBenchArgs, device: &str) -> anyhow::Result<()> {
    use super::kit::rdma::{cpu_seconds, perftest};
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    let gid_index = crate::transfer::rdma::nic::Nic::open(device, None)
        .map_err(|e| anyhow::anyhow!("--rdma {device}: {e}"))?
        .path
        .gid_index as u32;
    let batch_value = args.batch_value.0;
    let mut limits = Vec::new();
    let bw_cases = [
        ("ib_write_bw", 1u64 << 20),
        ("ib_read_bw", 1 << 20),
        ("ib_write_bw", 4 << 20),
        ("ib_read_bw", 4 << 20),
        ("ib_write_bw", batch_value),
        ("ib_read_bw", batch_value),
    ];
    for (i, (tool, size)) in bw_cases.into_iter().enumerate() {
        progress(&format!("perftest: {tool} at {}", human_bytes(size)));
        let iterations = (args.phase_bytes.0 / size).clamp(20, 5000);
        limits.push(perftest(
            tool,
            device,
            gid_index,
            size,
            iterations,
            18515 + i as u16,
        )?);
    }
    progress("perftest: ib_read_lat at 4 KiB");
    limits.push(perftest(
        "ib_read_lat",
        device,
        gid_index,
        4096,
        1000,
        18530,
    )?);
    let bw = |tool: &str, size: u64| {
        limits
            .iter()
            .find(|p| p.tool == tool && p.message_bytes == size)
            .and_then(|p| p.gb_per_s)
    };
    progress(&format!("a master and a store serving RDMA on {device}"));
    let cluster = super::kit::cluster::OwnCluster::start_with(super::kit::cluster::OwnOpts {
        segment_size: args.segment_size.0,
        persistent: args.persistent,
        disk_tier: None,
        master: Default::default(),
        rdma_device: Some(device.to_string()),
    })?;
    let master = cluster.master.clone();
    // `remember`: whether the client reads remembered locations (checked by their stamps, or
    // by asking the store) or asks the master each time (its read lease then covers a
    // one-sided read alone).
    let connect = |transport, remember: bool| -> anyhow::Result<Arc<Client>> {
        Ok(Arc::new(Client::connect(ClientConfig {
            transport,
            rdma_devices: device.to_string(),
            same_host_shm: false,
            location_cache_entries: if remember { 65_536 } else { 0 },
            ..ClientConfig::new(master.clone())
        })?))
    };
    let rdma = connect(crate::transfer::Transport::Rdma, true)?;
    let ctx = Ctx::new(args);
    let mut results = Vec::new();
    for size in [4096u64, 1 << 20, 4 << 20] {
        progress(&format!("rdma: {} × 1 thread", human_bytes(size)));
        results.extend(put_get_case(&rdma, "rdma", &ctx, size as usize, 1, ""));
    }
    progress(&format!(
        "rdma: batches of {} × {}",
        args.batch,
        human_bytes(batch_value)
    ));
    results.extend(batch_case(&rdma, "rdma", &ctx));
    for size in [1u64 << 20, 4 << 20] {
        progress(&format!(
            "rdma-registered: {} × 1 thread, from and into registered memory",
            human_bytes(size)
        ));
        results.extend(registered_case(&rdma, &ctx, size as usize)?);
    }
    for r in results.iter_mut().filter(|r| r.value_bytes >= 64 << 10) {
        let tool = if r.op.contains("put") {
            "ib_write_bw"
        } else {
            "ib_read_bw"
        };
        r.of_limit = bw(tool, r.value_bytes).map(|limit| r.gb_per_s / limit);
    }
    let read_lat = limits.iter().find_map(|p| p.typical_us);
    let get_4k = results
        .iter()
        .find(|r| r.op == "get" && r.value_bytes == 4096)
        .map(|r| r.p50_us);
    // The store's CPU for the same gets, one-sided and over TCP.
    let store_pid = cluster
        .pids(0)
        .1
        .ok_or_else(|| anyhow::anyhow!("the store's process id is unknown"))?;
    let size = 1usize << 20;
    let keys: Vec<String> = (0..64).map(|i| format!("{}cpu/{i}", ctx.prefix)).collect();
    let v = value_for(size, 7);
    for k in &keys {
        rdma.put(k, &v, &ReplicateConfig::default())?;
    }
    let mut store_cpu = Vec::new();
    let mut buf = vec![0u8; size];
    // What the store spends at rest (heartbeats, leases) is not the gets': measured for a
    // while first, and taken off each run's figure for its duration.
    progress("the store's CPU at rest");
    let (t0, cpu0) = (Instant::now(), cpu_seconds(store_pid)?);
    std::thread::sleep(Duration::from_secs(3));
    let rest_per_s = (cpu_seconds(store_pid)? - cpu0) / t0.elapsed().as_secs_f64();
    let readers = [
        ("rdma", connect(crate::transfer::Transport::Rdma, false)?),
        ("tcp", connect(crate::transfer::Transport::Tcp, false)?),
        ("rdma, remembered locations", rdma.clone()),
    ];
    for (path, client) in &readers {
        let path = *path;
        progress(&format!("the store's CPU for 1 MiB gets by {path}"));
        // Locations are learnt (and a remembered one's lease with them) before the count
        // starts: the puts above may be older than a remembered location lives.
        for k in &keys {
            client.get_into(k, &mut buf)?;
        }
        let (t0, cpu0) = (Instant::now(), cpu_seconds(store_pid)?);
        let checks0 = client.rdma_version_checks();
        let rounds = (args.phase_bytes.0 / (keys.len() * size) as u64).clamp(1, 16);
        let mut gets = 0u64;
        for _ in 0..rounds {
            for k in &keys {
                client.get_into(k, &mut buf)?;
                gets += 1;
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        store_cpu.push(StoreCpu {
            path,
            gets,
            bytes: gets * size as u64,
            seconds,
            store_cpu_seconds: (cpu_seconds(store_pid)? - cpu0 - rest_per_s * seconds).max(0.0),
            version_checks: client
                .rdma_version_checks()
                .zip(checks0)
                .map(|(now, then)| crate::client::VersionChecks {
                    stamped: now.stamped - then.stamped,
                    asked: now.asked - then.asked,
                })
                .filter(|c| c.stamped + c.asked > 0),
        });
    }
    cleanup(&rdma, keys);
    let ratio = match store_cpu.as_slice() {
        [r, t, ..] if t.store_cpu_seconds > 0.0 => Some(r.store_cpu_seconds / t.store_cpu_seconds),
        _ => None,
    };
    let mut failures = ctx.failures.take();
    let (mut mooncake, mut on_rbgctl) = Default::default();
    if let Some(python) = &args.mooncake_python {
        let mut plan = peer_plan(args, Some(device));
        let (master_pid, store_pid) = cluster.pids(0);
        let master_pid =
            master_pid.ok_or_else(|| anyhow::anyhow!("the master's process id is unknown"))?;
        (mooncake, on_rbgctl) = mooncake_rounds(
            python,
            &mut plan,
            Some(OurPool {
                master: &master,
                master_pid,
                store_pid,
            }),
            args.mooncake_rounds,
            &progress,
            &mut failures,
        );
    }
    let versus_mooncake_store = mooncake_peer::versus_case(
        &on_rbgctl.rows,
        "mooncake client on rbgctl rdma",
        &mooncake.rows,
    );
    let server_cpu = ServerCpu::of(&on_rbgctl, &mooncake);
    let report = RdmaReport {
        device: device.to_string(),
        perftest: limits,
        results,
        get_4k_latency_ratio: get_4k.zip(read_lat).map(|(ours, theirs)| ours / theirs),
        store_cpu,
        store_cpu_ratio: ratio,
        mooncake: mooncake.rows,
        mooncake_client_on_rbgctl: on_rbgctl.rows,
        versus_mooncake_store,
        server_cpu,
        failures,
    };
    report.publish(args.json, None)?;
    anyhow::ensure!(
        report.failures.is_empty(),
        "{} phase(s) had failed operations; the figures above are partial",
        report.failures.len()
    );
    Ok(())
}

/// 1 MiB or 4 MiB put then get by one thread, the value and the destination in memory the
/// client registered (`Client::register_buffer`): no staging copy, the checksum a pass of its
/// own. Rows `rdma-registered`.
#[cfg(feature = "rdma")]
fn registered_case(
    client: &Arc<Client>,
    ctx: &Ctx<'_>,
    size: usize,
) -> anyhow::Result<Vec<PhaseResult>> {
    let mut value = value_for(size, size as u64 + 1);
    let mut dst = vec![0u8; size];
    // SAFETY: both buffers live until they are unregistered below.
    unsafe {
        client.register_buffer(value.as_mut_ptr(), size)?;
        client.register_buffer(dst.as_mut_ptr(), size)?;
    }
    let case = "rdma-registered";
    let budget = phase_budget(ctx.args, size as u64);
    let key = |i: u64| format!("{}{case}/{size}/{i}", ctx.prefix);
    let cfg = ReplicateConfig::default();
    let written = parking_lot::Mutex::new(0u64);
    let phase = probed(client, ctx, 1, || {
        run_phase(1, budget, ctx.args.phase_time.0, |_, i| {
            let r = client.put(&key(i), &value, &cfg);
            if r.is_ok() {
                *written.lock() = i + 1;
            }
            Outcome::of(r, |_| true)
        })
    });
    let put = phase.result(case, "put", size as u64, 1, 1, usize::MAX, &ctx.failures);
    let total = *written.lock();
    let dst_lock = parking_lot::Mutex::new(&mut dst);
    let phase = probed(client, ctx, 1, || {
        run_phase(1, total.max(1), Duration::from_secs(3600), |_, i| {
            if i >= total {
                return Outcome::Ok;
            }
            let mut d = dst_lock.lock();
            Outcome::of(client.get_into(&key(i), &mut d[..]), |n| n == size)
        })
    });
    let get = phase.result(
        case,
        "get",
        size as u64,
        1,
        1,
        total as usize,
        &ctx.failures,
    );
    if total > 0 && dst != value {
        ctx.failures
            .note(&format!("{case} get"), 1, "the value read back differs");
    }
    client.unregister_buffer(value.as_mut_ptr())?;
    client.unregister_buffer(dst.as_mut_ptr())?;
    cleanup(client, (0..total).map(key).collect());
    Ok(vec![put, get])
}
