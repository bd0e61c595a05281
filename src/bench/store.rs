//! `rbgctl bench store`: put and get throughput and latency for several value sizes and thread
//! counts, batches, the same-host path and the master's existence checks. Without `--master` it
//! starts its own master and store as separate processes on loopback.

use super::cluster::master_or_own;
use super::limits;
use super::stats::PhaseResult;
use crate::client::{Client, ClientConfig, ReplicateConfig};
use crate::config::{human_bytes, ByteSize};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, clap::Args)]
pub struct StoreBenchArgs {
    /// An existing master (host:port); by default the benchmark starts a master and one store.
    #[arg(long)]
    pub master: Option<String>,
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
    /// The local address the flood comes from (another loopback address than the client's).
    #[arg(long, default_value = "127.0.0.2")]
    pub flood_from: std::net::IpAddr,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    persistent: bool,
    loopback_tcp_gb_per_s: f64,
    memcpy_gb_per_s: f64,
    results: Vec<PhaseResult>,
    flood: Option<FloodReport>,
}

/// What the idle flood did.
#[derive(Debug, serde::Serialize)]
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

/// Runs `threads` workers; each does `op(thread, i)` for i in 0.. until its share of `budget`
/// is done or the time is up. Returns latencies, errors and the phase's wall time.
fn run_phase(
    threads: usize,
    budget: u64,
    time: Duration,
    op: impl Fn(usize, u64) -> bool + Sync,
) -> (Vec<Duration>, u64, Duration) {
    let per_thread = budget.div_ceil(threads as u64);
    let t0 = Instant::now();
    let (lat, errs) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let op = &op;
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(per_thread.min(1 << 20) as usize);
                    let mut errors = 0;
                    for i in 0..per_thread {
                        if t0.elapsed() > time {
                            break;
                        }
                        let start = Instant::now();
                        if op(t, i) {
                            lat.push(start.elapsed());
                        } else {
                            errors += 1;
                        }
                    }
                    (lat, errors)
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut errors = 0;
        for h in handles {
            let (l, e) = h.join().expect("bench worker panicked");
            all.extend(l);
            errors += e;
        }
        (all, errors)
    });
    (lat, errs, t0.elapsed())
}

/// Put then get of unique keys for one value size and thread count.
fn put_get_case(
    client: &Arc<Client>,
    case: &str,
    args: &StoreBenchArgs,
    size: usize,
    threads: usize,
) -> Vec<PhaseResult> {
    let value = value_for(size, size as u64);
    let budget = phase_budget(args, size as u64);
    let cfg = ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    let key = |t: usize, i: u64| format!("bench/{case}/{size}/{threads}/{t}/{i}");
    let written: Vec<parking_lot::Mutex<u64>> =
        (0..threads).map(|_| parking_lot::Mutex::new(0)).collect();
    let (lat, errors, elapsed) = run_phase(threads, budget, args.phase_time.0, |t, i| {
        let ok = client.put(&key(t, i), &value, &cfg).is_ok();
        if ok {
            *written[t].lock() = i + 1;
        }
        ok
    });
    let put = PhaseResult::from_samples(case, "put", size as u64, threads, lat, 1, errors, elapsed);
    let counts: Vec<u64> = written.iter().map(|w| *w.lock()).collect();
    let total: u64 = counts.iter().sum();
    let bufs: Vec<parking_lot::Mutex<Vec<u8>>> = (0..threads)
        .map(|_| parking_lot::Mutex::new(vec![0u8; size]))
        .collect();
    let (lat, errors, elapsed) =
        run_phase(threads, total.max(1), Duration::from_secs(3600), |t, i| {
            if i >= counts[t] {
                return true;
            }
            let mut buf = bufs[t].lock();
            matches!(client.get_into(&key(t, i), &mut buf), Ok(n) if n == size)
        });
    let lat: Vec<Duration> = lat.into_iter().take(total as usize).collect();
    let get = PhaseResult::from_samples(case, "get", size as u64, threads, lat, 1, errors, elapsed);
    // Spot-check content once.
    if counts[0] > 0 {
        if let Ok(v) = client.get(&key(0, 0)) {
            if v != value {
                eprintln!("warning: {case}: value read back differs from the one written");
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

fn batch_case(client: &Arc<Client>, case: &str, args: &StoreBenchArgs) -> Vec<PhaseResult> {
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
            .map(|j| format!("bench/{case}/batch/{call}/{j}"))
            .collect()
    };
    let done = parking_lot::Mutex::new(0u64);
    let (lat, errors, elapsed) = run_phase(1, calls, args.phase_time.0, |_, call| {
        let keys = keys_of(call);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let ok = client
            .batch_put(&refs, &value_refs, &cfg)
            .iter()
            .all(Result::is_ok);
        if ok {
            *done.lock() = call + 1;
        }
        ok
    });
    let put = PhaseResult::from_samples(
        case,
        &format!("batch_put {n}x"),
        size as u64,
        1,
        lat,
        n as u64,
        errors,
        elapsed,
    );
    let done = *done.lock();
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; size]).collect();
    let bufs_lock = parking_lot::Mutex::new(&mut bufs);
    let (lat, errors, elapsed) = run_phase(1, done.max(1), Duration::from_secs(3600), |_, call| {
        if call >= done {
            return true;
        }
        let keys = keys_of(call);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut guard = bufs_lock.lock();
        let mut slices: Vec<&mut [u8]> = guard.iter_mut().map(|b| b.as_mut_slice()).collect();
        client
            .batch_get_into(&refs, &mut slices)
            .iter()
            .all(|r| matches!(r, Ok(x) if *x == size))
    });
    let lat: Vec<Duration> = lat.into_iter().take(done as usize).collect();
    let get = PhaseResult::from_samples(
        case,
        &format!("batch_get {n}x"),
        size as u64,
        1,
        lat,
        n as u64,
        errors,
        elapsed,
    );
    cleanup(client, (0..done).flat_map(keys_of).collect());
    vec![put, get]
}

fn exists_case(client: &Arc<Client>, args: &StoreBenchArgs) -> PhaseResult {
    let n = args.exists_batch;
    let keys: Vec<String> = (0..n).map(|i| format!("bench/exists/{i}")).collect();
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
    let (lat, errors, elapsed) = run_phase(
        1,
        u64::MAX / 2,
        args.phase_time.0,
        |_, _| matches!(client.batch_exists(&refs), Ok(v) if v.iter().all(|e| *e)),
    );
    cleanup(client, keys.clone());
    PhaseResult::from_samples(
        "tcp",
        &format!("batch_exists {n}x"),
        0,
        1,
        lat,
        n as u64,
        errors,
        elapsed,
    )
}

pub fn run(args: StoreBenchArgs) -> anyhow::Result<()> {
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    progress("measuring the machine: loopback TCP, memcpy");
    let (loopback, memcpy) = limits::machine()?;
    let (master, _cluster) = master_or_own(
        args.master.as_deref(),
        args.segment_size.0,
        args.persistent,
        progress,
    )?;
    let tcp = Arc::new(Client::connect(ClientConfig {
        same_host_shm: false,
        ..ClientConfig::new(master.clone())
    })?);
    let mut results = Vec::new();
    for &threads in &args.threads {
        for size in &args.sizes {
            progress(&format!(
                "tcp: {} × {threads} thread(s)",
                human_bytes(size.0)
            ));
            results.extend(put_get_case(&tcp, "tcp", &args, size.0 as usize, threads));
        }
    }
    progress(&format!(
        "tcp: batches of {} × {}",
        args.batch,
        human_bytes(args.batch_value.0)
    ));
    results.extend(batch_case(&tcp, "tcp", &args));
    progress("master: batched existence checks");
    results.push(exists_case(&tcp, &args));
    let flood = if args.idle_flood > 0 {
        Some(flood_cases(&tcp, &master, &args, &mut results, progress)?)
    } else {
        None
    };
    for r in results.iter_mut().filter(|r| r.value_bytes >= 1 << 20) {
        r.of_limit = Some(r.gb_per_s / loopback);
    }
    if !args.no_shm {
        let shm = Arc::new(Client::connect(ClientConfig::new(master.clone()))?);
        let shared = shm.segments()?.iter().any(|s| !s.info.shm_path.is_empty());
        if shared {
            for size in [1u64 << 20, 4 << 20] {
                progress(&format!("same-host shared memory: {}", human_bytes(size)));
                let mut r = put_get_case(&shm, "shm", &args, size as usize, 1);
                for x in &mut r {
                    x.of_limit = Some(x.gb_per_s / memcpy);
                }
                results.extend(r);
            }
        } else {
            progress("no segment is shareable from this host; skipping the shared-memory cases");
        }
    }
    let report = Report {
        persistent: args.persistent,
        loopback_tcp_gb_per_s: loopback,
        memcpy_gb_per_s: memcpy,
        results,
        flood,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// 4 KiB and 1 MiB put/get again while `--idle-flood` idle connections are held open to the
/// master and every store, from `--flood-from`.
fn flood_cases(
    tcp: &Arc<Client>,
    master: &str,
    args: &StoreBenchArgs,
    results: &mut Vec<PhaseResult>,
    progress: impl Fn(&str),
) -> anyhow::Result<FloodReport> {
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
    let flood = super::flood::Flood::open(args.flood_from, &targets, args.idle_flood);
    for size in [4usize << 10, 1 << 20] {
        progress(&format!(
            "flood: {} × 1 thread beside {} idle connections",
            human_bytes(size as u64),
            flood.len()
        ));
        results.extend(put_get_case(tcp, "flood", args, size, 1));
    }
    Ok(FloodReport {
        asked: args.idle_flood,
        opened: flood.len(),
        held_after: flood.still_open(),
    })
}

fn print_table(r: &Report) {
    println!(
        "machine: loopback TCP, one stream {:.2} GB/s; memcpy {:.2} GB/s; store persistent: {}",
        r.loopback_tcp_gb_per_s, r.memcpy_gb_per_s, r.persistent
    );
    println!(
        "{:<5} {:<17} {:>11} {:>3} {:>8} {:>10} {:>9} {:>9} {:>6} {:>8}",
        "path", "op", "value", "thr", "GB/s", "ops/s", "p50 µs", "p99 µs", "errors", "of limit"
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
        println!(
            "{:<5} {:<17} {:>11} {:>3} {:>8.2} {:>10.0} {:>9.1} {:>9.1} {:>6} {:>8}",
            x.case,
            x.op,
            value,
            x.threads,
            x.gb_per_s,
            x.ops_per_s,
            x.p50_us,
            x.p99_us,
            x.errors,
            limit
        );
    }
    println!("(of limit: large tcp values against the loopback stream, shm against memcpy)");
    if let Some(f) = &r.flood {
        println!(
            "flood: {} idle connections asked, {} opened, {} still held by the servers after the \
             flood phases (the rest were refused or closed)",
            f.asked, f.opened, f.held_after
        );
    }
}
