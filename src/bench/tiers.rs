//! `rbgctl bench tiers`: seed 000's experiment on one machine. The same multi-turn workload
//! runs three times against a fresh service on loopback (`rbgctl up`'s machinery, SIMULATED
//! engines): device cache only (L1), with a host tier (L1+L2), and with the rbgctl pool as
//! the third tier (L1+L2+L3). It prints hit rate, TTFT and throughput side by side.

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
    for (name, cfg) in layouts(&base) {
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
        results.push((name, r));
        if interrupted {
            eprintln!("interrupted");
            break;
        }
    }
    if a.workload.json {
        let v: serde_json::Map<String, serde_json::Value> = results
            .iter()
            .map(|(n, r)| (n.to_string(), json!({"summary": r.summary, "round": r.rounds.iter().map(|(k, v)| (format!("round_{k}"), json!(v))).collect::<serde_json::Map<_, _>>()})))
            .collect();
        println!("{}", serde_json::Value::Object(v));
        return Ok(());
    }
    println!(
        "Three tiers, same workload ({} clients x {} rounds, rate {} req/s; SIMULATED engines)",
        a.workload.num_clients, a.workload.num_rounds, a.workload.request_rate
    );
    println!(
        "  {:<10} {:>10} {:>12} {:>12} {:>14} {:>10} {:>8}",
        "tiers", "hit rate", "mean TTFT", "p90 TTFT", "input tok/s", "req/s", "failed"
    );
    for (name, r) in &results {
        let s = &r.summary;
        println!(
            "  {:<10} {:>9.2}% {:>10.3} s {:>10.3} s {:>14.1} {:>10.2} {:>8}",
            name,
            s.cache_hit_rate * 100.0,
            s.average_ttft,
            s.p90_ttft,
            s.input_token_throughput,
            s.throughput,
            s.failed_requests
        );
    }
    Ok(())
}
