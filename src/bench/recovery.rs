//! `rbgctl bench recovery`: how fast the pool is whole again after a crash. It starts a master
//! and a persistent store, fills the store, then
//!
//! 1. kills the store with SIGKILL, starts it again on the same directory, and times from its
//!    start until its segment is live again with every object confirmed, then reads every object
//!    back and compares it byte for byte;
//! 2. kills the master with SIGKILL, starts it again, and times from its start until it lists
//!    every object again (rebuilt from the store's report), then reads everything back again.

use super::kit::cluster::{scrape, OwnCluster};
use crate::bench::kit::report::BenchReport;
use crate::client::{Client, ClientConfig, ReplicateConfig};
use crate::config::{human_bytes, ByteSize};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// `rbgctl bench recovery`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RecoveryBenchArgs {
    /// Segment size of the store.
    #[arg(long, default_value = "4GiB")]
    pub segment_size: ByteSize,
    /// Objects to write before the crashes.
    #[arg(long, default_value_t = 12_000)]
    pub objects: usize,
    /// Size of each object.
    #[arg(long, default_value = "256KiB")]
    pub value_size: ByteSize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    segment_bytes: u64,
    objects: usize,
    value_bytes: u64,
    fill_seconds: f64,
    /// Store: from the new process's start until its segment is live with every object.
    store_restart_to_serving_s: f64,
    /// The store's own figure: open, map and checksum-verify of the kept segment.
    store_recovery_s: Option<f64>,
    store_readable_objects: usize,
    /// Master: from the new process's start until it lists every object again.
    master_restart_to_all_readable_s: f64,
    master_readable_objects: usize,
}

/// A deterministic value for object `i`: 8-byte words derived from `i`.
pub(super) fn fill_value(i: usize, buf: &mut [u8]) {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

fn key(i: usize) -> String {
    format!("recovery/{i}")
}

/// Reads every object back (batches of 64) and counts the byte-exact ones.
fn verify_all(client: &Client, n: usize, size: usize) -> usize {
    let mut good = 0;
    let mut expected = vec![0u8; size];
    for start in (0..n).step_by(64) {
        let keys: Vec<String> = (start..(start + 64).min(n)).map(key).collect();
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        for (j, r) in client.batch_get(&refs).into_iter().enumerate() {
            if let Ok(v) = r {
                fill_value(start + j, &mut expected);
                if v == expected {
                    good += 1;
                }
            }
        }
    }
    good
}

/// Keys the master lists (its admin API's summary).
fn master_keys(port: u16) -> Option<u64> {
    scrape(port, "rbgctl_master_keys").map(|v| v as u64)
}

/// Runs `rbgctl bench recovery` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(args: RecoveryBenchArgs) -> anyhow::Result<()> {
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    let size = args.value_size.0 as usize;
    let n = args.objects;
    let total = size as u64 * n as u64;
    anyhow::ensure!(
        (total as f64) < 0.85 * args.segment_size.0 as f64,
        "{n} objects of {} ({}) do not fit under the eviction watermark of a {} segment",
        human_bytes(size as u64),
        human_bytes(total),
        human_bytes(args.segment_size.0)
    );
    progress(&format!(
        "starting a master and a persistent store of {}",
        human_bytes(args.segment_size.0)
    ));
    let mut cluster = OwnCluster::start(args.segment_size.0, true)?;
    let client = Client::connect(ClientConfig {
        same_host_shm: false,
        ..ClientConfig::new(cluster.master.clone())
    })?;

    progress(&format!(
        "writing {n} objects of {}",
        human_bytes(size as u64)
    ));
    let t0 = Instant::now();
    let mut bufs = vec![vec![0u8; size]; 64];
    for start in (0..n).step_by(64) {
        let end = (start + 64).min(n);
        let keys: Vec<String> = (start..end).map(key).collect();
        for (j, b) in bufs.iter_mut().enumerate().take(end - start) {
            fill_value(start + j, b);
        }
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let vals: Vec<&[u8]> = bufs[..end - start].iter().map(|b| b.as_slice()).collect();
        for (k, r) in refs
            .iter()
            .zip(client.batch_put(&refs, &vals, &ReplicateConfig::default()))
        {
            r.map_err(|e| anyhow::anyhow!("put {k}: {e}"))?;
        }
    }
    let fill_seconds = t0.elapsed().as_secs_f64();

    progress("kill -9 of the store, then a new store process on the same directory");
    cluster.kill_store(0);
    let t_store = Instant::now();
    cluster.start_store(0)?;
    // The master still lists the old segment as live until the new process rebinds it; wait for
    // the rebind to finish: every object listed and readable again.
    let first = key(0);
    loop {
        if client.get(&first).is_ok() && master_keys(cluster.master_metrics_port) == Some(n as u64)
        {
            let listed = scrape(cluster.store_metrics_port(0), "rbgctl_store_mounted");
            if listed == Some(1.0) {
                break;
            }
        }
        anyhow::ensure!(
            t_store.elapsed() < Duration::from_secs(120),
            "the store did not serve again within 120 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let store_restart_to_serving_s = t_store.elapsed().as_secs_f64();
    let store_recovery_s = scrape(
        cluster.store_metrics_port(0),
        "rbgctl_store_recovery_seconds",
    );
    progress("reading every object back");
    let store_readable_objects = verify_all(&client, n, size);

    progress("kill -9 of the master, then a new master process");
    cluster.kill_master();
    let t_master = Instant::now();
    cluster.start_master()?;
    loop {
        if master_keys(cluster.master_metrics_port) == Some(n as u64) {
            break;
        }
        anyhow::ensure!(
            t_master.elapsed() < Duration::from_secs(120),
            "the master did not list every object within 120 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let master_restart_to_all_readable_s = t_master.elapsed().as_secs_f64();
    progress("reading every object back");
    let master_readable_objects = verify_all(&client, n, size);

    let report = Report {
        segment_bytes: args.segment_size.0,
        objects: n,
        value_bytes: size as u64,
        fill_seconds,
        store_restart_to_serving_s,
        store_recovery_s,
        store_readable_objects,
        master_restart_to_all_readable_s,
        master_readable_objects,
    };
    report.publish(args.json, None)
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let (r, mut out) = (self, String::new());
        let n = r.objects;
        let pct = |k: usize| 100.0 * k as f64 / n as f64;
        let _ = writeln!(
            out,
            "pool: one persistent store of {}, {n} objects of {} ({}), written in {:.2} s",
            human_bytes(r.segment_bytes),
            human_bytes(r.value_bytes),
            human_bytes(r.value_bytes * r.objects as u64),
            r.fill_seconds
        );
        let _ = writeln!(
            out,
            "store kill -9 → serving again: {:.3} s after its start (its own open+map+verify: {}); \
             readable byte-exact: {}/{n} ({:.1} %)",
            r.store_restart_to_serving_s,
            r.store_recovery_s.map_or("?".into(), |s| format!("{s:.3} s")),
            r.store_readable_objects,
            pct(r.store_readable_objects)
        );
        let _ = writeln!(
            out,
            "master kill -9 → every object listed again: {:.3} s after its start; readable \
             byte-exact: {}/{n} ({:.1} %)",
            r.master_restart_to_all_readable_s,
            r.master_readable_objects,
            pct(r.master_readable_objects)
        );
        out
    }
}
