//! `rbgctl bench tiers`: seed 000's experiment on one machine. The same multi-turn workload
//! runs against a fresh service on loopback (`rbgctl up`'s machinery, SIMULATED engines):
//! device cache only (L1), with a host tier (L1+L2), with the rbgctl pool as the third tier
//! (L1+L2+L3), and a fourth time with the pool's memory cut to a quarter of the working set the
//! third run stored and a disk tier on every store (L1+L2+L3+disk: the disk tier as L4). It
//! prints hit rate, TTFT and throughput side by side, and for the pool runs the share of pool
//! reads the disk tier served.

use super::multiturn::{self, MultiturnArgs};
use crate::launch::{Launcher, Logs};
use crate::up::{Stack, UpConfig};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct TiersArgs {
    /// Service layout (config/up.toml's format): engine cache sizes, cost model, pool size.
    /// Ports are chosen free on 127.0.0.1; the three runs differ only in their tiers.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub workload: MultiturnArgs,
}

/// The three layouts, from one base, every port chosen by the kernel.
pub fn layouts(base: &UpConfig) -> Vec<(&'static str, UpConfig)> {
    let host = if base.engines.host_cache_tokens > 0 {
        base.engines.host_cache_tokens
    } else {
        4 * base.engines.device_cache_tokens
    };
    let mut out = Vec::new();
    for (name, l2, l3) in [
        ("L1", false, false),
        ("L1+L2", true, false),
        ("L1+L2+L3", true, true),
    ] {
        let mut c = base.clone();
        c.engines.host_cache_tokens = if l2 { host } else { 0 };
        c.engines.l3 = l3;
        c.pool.stores = if l3 { base.pool.stores.max(1) } else { 0 };
        c.pool.shm_dir = None;
        c.pool.master_port = 0;
        c.pool.metadata_port = 0;
        c.pool.metrics_port = 0;
        c.router.port = 0;
        c.engines.base_port = 0;
        c.engines.bootstrap_base_port = 0;
        out.push((name, c));
    }
    out
}

/// The L4 layout: `l3`'s, with each store's memory cut so that the pool holds a quarter of
/// `working_set` bytes, and a disk tier on each store large enough for all of it.
pub fn with_disk_tier(l3: &UpConfig, working_set: u64) -> UpConfig {
    const MIB: u64 = 1 << 20;
    const STEP: u64 = 256 << 10;
    let stores = l3.pool.stores.max(1) as u64;
    let mut c = l3.clone();
    let memory = (working_set / 4 / stores).div_ceil(STEP) * STEP;
    c.pool.segment_size = crate::config::ByteSize(memory.max(STEP));
    c.pool.disk_tier_size = crate::config::ByteSize((2 * working_set).div_ceil(MIB).max(16) * MIB);
    c
}

fn metrics(url: &str) -> String {
    reqwest::blocking::get(url)
        .and_then(|r| r.text())
        .unwrap_or_default()
}

/// The share of the pages the engines read from the pool that lived only on a disk tier: the
/// master's reads answered with a disk replica over the engines' page reads. (Counted at the
/// master: a same-host engine reads the disk tier's file itself, past the store.)
fn pool_reads_from_disk(stack: &Stack) -> f64 {
    let pages: f64 = stack
        .engines
        .iter()
        .map(|(url, _)| {
            metrics(&format!("{url}/metrics"))
                .lines()
                .filter(|l| l.starts_with("rbgctl_sim_l3_pages_total{") && l.contains("\"read\""))
                .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum();
    let disk_hits = stack.master_metrics.as_ref().map_or(0.0, |url| {
        crate::telemetry::sample(
            &metrics(&format!("{url}/metrics")),
            "rbgctl_master_disk_hits_total",
        )
        .unwrap_or(0.0)
    });
    (disk_hits / pages.max(1.0)).min(1.0)
}

/// The bytes the pool holds or gave up: what the run stored (its working set in the pool).
fn stored_bytes(stack: &Stack) -> u64 {
    let Some(url) = &stack.master_metrics else {
        return 0;
    };
    let text = metrics(&format!("{url}/metrics"));
    let n = |name| crate::telemetry::sample(&text, name).unwrap_or(0.0) as u64;
    n("rbgctl_master_used_bytes") + n("rbgctl_master_evicted_bytes_total")
}

pub fn run(a: TiersArgs) -> anyhow::Result<()> {
    let base = match &a.config {
        Some(p) => UpConfig::from_file(p)?,
        None => UpConfig::default(),
    };
    let launcher = Launcher::new(Logs::Null)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut results = Vec::new();
    let stop = crate::shutdown::Shutdown::on_signals()?;
    let mut queue: std::collections::VecDeque<(&'static str, UpConfig)> = layouts(&base).into();
    while let Some((name, cfg)) = queue.pop_front() {
        eprintln!("tiers: {name}: starting the service (SIMULATED engines)...");
        let mut stack = Stack::start(&cfg, &launcher)?;
        let router = stack
            .router
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the layout has no router (engines.count = 0?)"))?;
        let mut w = a.workload.clone();
        w.host = "127.0.0.1".into();
        w.port = router
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(cfg.router.port);
        w.disable_auto_run = true;
        w.tag = if w.tag.is_empty() {
            name.to_string()
        } else {
            format!("{}:{name}", w.tag)
        };
        let r = rt.block_on(multiturn::run_rate(&w, w.request_rate, &stop))?;
        let from_disk = (cfg.pool.disk_tier_size.0 > 0).then(|| pool_reads_from_disk(&stack));
        if name == "L1+L2+L3" {
            let working_set = stored_bytes(&stack);
            let l4 = with_disk_tier(&cfg, working_set);
            eprintln!(
                "tiers: the L3 run stored {}; the disk-tier run gets {} of memory per store and \
                 a {} disk tier",
                crate::config::human_bytes(working_set),
                crate::config::human_bytes(l4.pool.segment_size.0),
                crate::config::human_bytes(l4.pool.disk_tier_size.0)
            );
            queue.push_back(("L1+L2+L3+disk", l4));
        }
        stack.stop();
        if !w.log_file.is_empty() {
            multiturn::append_log(
                &w.log_file,
                &multiturn::summary::log_line(&w.tag, &r.summary, &r.rounds, r.interrupted),
            )?;
        }
        for e in &r.errors {
            eprintln!("  {name}: error: {e}");
        }
        let interrupted = r.interrupted;
        results.push((
            name,
            r,
            cfg.pool.segment_size.0 * cfg.pool.stores as u64,
            from_disk,
        ));
        if interrupted {
            eprintln!("interrupted");
            break;
        }
    }
    if a.workload.json {
        let v: serde_json::Map<String, serde_json::Value> = results
            .iter()
            .map(|(n, r, memory, from_disk)| (n.to_string(), json!({"summary": r.summary, "pool_memory_bytes": memory, "pool_reads_from_disk": from_disk, "round": r.rounds.iter().map(|(k, v)| (format!("round_{k}"), json!(v))).collect::<serde_json::Map<_, _>>()})))
            .collect();
        println!("{}", serde_json::Value::Object(v));
        return Ok(());
    }
    println!(
        "Cache tiers, same workload ({} clients x {} rounds, rate {} req/s; SIMULATED engines)",
        a.workload.num_clients, a.workload.num_rounds, a.workload.request_rate
    );
    println!(
        "  {:<14} {:>10} {:>12} {:>12} {:>14} {:>10} {:>8} {:>11} {:>10}",
        "tiers",
        "hit rate",
        "mean TTFT",
        "p90 TTFT",
        "input tok/s",
        "req/s",
        "failed",
        "pool memory",
        "from disk"
    );
    for (name, r, memory, from_disk) in &results {
        let s = &r.summary;
        println!(
            "  {:<14} {:>9.2}% {:>10.3} s {:>10.3} s {:>14.1} {:>10.2} {:>8} {:>11} {:>10}",
            name,
            s.cache_hit_rate * 100.0,
            s.average_ttft,
            s.p90_ttft,
            s.input_token_throughput,
            s.throughput,
            s.failed_requests,
            if name.contains("L3") {
                crate::config::human_bytes(*memory)
            } else {
                "-".into()
            },
            from_disk.map_or("-".into(), |f| format!("{:.1}%", f * 100.0))
        );
    }
    Ok(())
}
