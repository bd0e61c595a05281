//! `rbgctl bench tiers`: seed 000's experiment on one machine. The same multi-turn workload
//! runs against a fresh service on loopback (`rbgctl up`'s machinery, SIMULATED engines):
//! device cache only (L1), with a host tier (L1+L2), with the rbgctl pool as the third tier
//! (L1+L2+L3), and a fourth time with the pool's memory cut to a quarter of the working set the
//! third run stored and a disk tier on every store (L1+L2+L3+disk: the disk tier as L4). It
//! prints hit rate, TTFT and throughput side by side, and for the pool runs the share of pool
//! reads the disk tier served.

use super::multiturn::{self, MultiturnArgs};
use crate::bench::kit::report::BenchReport;
use crate::launch::{Launcher, Logs};
use crate::up::{Stack, UpConfig};
use clap::Args;
use serde_json::json;
use std::fmt::Write as _;
use std::path::PathBuf;

/// `rbgctl bench tiers`'s arguments.
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
        let mut c = base.on_free_ports();
        c.engines.host_cache_tokens = if l2 { host } else { 0 };
        c.engines.l3 = l3;
        c.pool.stores = if l3 { base.pool.stores.max(1) } else { 0 };
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

/// Seed 000's table (appendix 8.2), as published: SGLang with HiCache and Mooncake on GPUs.
pub struct Published {
    pub tiers: &'static str,
    pub mean_ttft_s: f64,
    pub p90_ttft_s: f64,
    pub input_tokens_per_s: f64,
    pub hit_rate: f64,
}

/// Seed 000's published rows (appendix 8.2), set beside this machine's.
pub const SEED_000: [Published; 3] = [
    Published {
        tiers: "L1",
        mean_ttft_s: 5.91,
        p90_ttft_s: 12.16,
        input_tokens_per_s: 6576.86,
        hit_rate: 0.0222,
    },
    Published {
        tiers: "L1+L2",
        mean_ttft_s: 3.77,
        p90_ttft_s: 10.88,
        input_tokens_per_s: 10054.21,
        hit_rate: 0.4062,
    },
    Published {
        tiers: "L1+L2+L3",
        mean_ttft_s: 2.58,
        p90_ttft_s: 6.97,
        input_tokens_per_s: 15022.80,
        hit_rate: 0.6467,
    },
];

/// One layout's result as the report draws it.
pub struct TierRun<'a> {
    pub tiers: &'a str,
    pub result: &'a multiturn::RateResult,
}

/// Seed 000's two figures with this run's figures beside the published ones (each in its
/// own panel: the machines differ), and the relative throughput of both on one axis.
pub fn seed_figures(page: &mut crate::report::Page, runs: &[TierRun<'_>]) -> anyhow::Result<()> {
    use crate::report::{BarChart, Format, Group, Panel};
    let tiers: Vec<String> = runs.iter().map(|r| r.tiers.to_string()).collect();
    let ours = |f: fn(&multiturn::summary::Summary) -> f64| -> Vec<Option<f64>> {
        runs.iter().map(|r| Some(f(&r.result.summary))).collect()
    };
    let seed = |f: fn(&Published) -> f64| -> Vec<Option<f64>> {
        tiers
            .iter()
            .map(|t| SEED_000.iter().find(|p| p.tiers == t).map(f))
            .collect()
    };
    let relative = |v: Vec<Option<f64>>| -> Vec<Option<f64>> {
        let base = v.first().copied().flatten().filter(|b| *b > 0.0);
        v.iter().map(|x| Some((*x)? / base?)).collect()
    };
    const OURS: &str = "rbgctl, this run (SIMULATED engines)";
    const SEED: &str = "seed 000, as published (SGLang + Mooncake on GPUs)";
    let tput = BarChart::new(
        "tiers-throughput",
        "Overall throughput per cache tier (input tokens/s)",
        tiers.clone(),
    )
    .panel(Panel::bars(
        OURS,
        "input tokens/s",
        Format::Number,
        vec![Group::new(
            "rbgctl input tok/s",
            ours(|s| s.input_token_throughput),
        )],
    ))
    .panel(Panel::bars(
        SEED,
        "input tokens/s",
        Format::Number,
        vec![Group::new(
            "seed 000 input tok/s",
            seed(|p| p.input_tokens_per_s),
        )],
    ))
    .panel(Panel::bars(
        "both, relative to L1",
        "× L1's throughput",
        Format::Number,
        vec![
            Group::new("rbgctl", relative(ours(|s| s.input_token_throughput))),
            Group::new("seed 000", relative(seed(|p| p.input_tokens_per_s))),
        ],
    ));
    page.bar_chart(
        &tput,
        "Seed 000's first figure. Left: this run; middle: the seed's published figures (its \
         machine, not this one); right: both as multiples of their own L1 run.",
    )?;
    let hit_ttft = |title: &str, name: &str, hit, mean, p90| {
        Panel::bars(
            title,
            "cache hit rate",
            Format::Percent,
            vec![Group::new(format!("{name} hit rate"), hit)],
        )
        .with_lines(
            "TTFT (s)",
            Format::Number,
            vec![
                Group::new(format!("{name} mean TTFT"), mean),
                Group::new(format!("{name} p90 TTFT"), p90),
            ],
        )
    };
    let hits = BarChart::new(
        "tiers-hit-rate-ttft",
        "KV-cache hit rate and TTFT per cache tier",
        tiers.clone(),
    )
    .panel(hit_ttft(
        OURS,
        "rbgctl",
        ours(|s| s.cache_hit_rate),
        ours(|s| s.average_ttft),
        ours(|s| s.p90_ttft),
    ))
    .panel(hit_ttft(
        SEED,
        "seed 000",
        seed(|p| p.hit_rate),
        seed(|p| p.mean_ttft_s),
        seed(|p| p.p90_ttft_s),
    ));
    page.bar_chart(
        &hits,
        "Seed 000's second figure: bars are the hit rate (left axis), lines the mean and p90 \
         TTFT (right axis). The seed has no disk-tier run.",
    )?;
    Ok(())
}

fn page(a: &TiersArgs, results: &[TierResult<'_>]) -> anyhow::Result<crate::report::Page> {
    let w = &a.workload;
    let mut page = crate::report::Page::new("Cache tiers: seed 000's experiment on this machine");
    page.fact(
        "workload",
        format!(
            "{} clients × {} rounds, {} prompt tokens, {} output tokens, rate {} req/s; SIMULATED engines",
            w.num_clients, w.num_rounds, w.request_length, w.output_length, w.request_rate
        ),
    );
    let runs: Vec<TierRun<'_>> = results
        .iter()
        .map(|(n, r, _, _)| TierRun {
            tiers: n,
            result: r,
        })
        .collect();
    page.heading("Seed 000's figures, beside ours");
    seed_figures(&mut page, &runs)?;
    page.heading("Figures");
    let ms = |s: f64| format!("{:.1}", s * 1e3);
    let mut rows: Vec<Vec<String>> = results
        .iter()
        .map(|(n, r, memory, from_disk)| {
            let s = &r.summary;
            vec![
                format!("rbgctl {n}"),
                format!("{:.2}%", s.cache_hit_rate * 100.0),
                ms(s.average_ttft),
                ms(s.p90_ttft),
                format!("{:.1}", s.input_token_throughput),
                s.failed_requests.to_string(),
                if n.contains("L3") {
                    crate::config::human_bytes(*memory)
                } else {
                    "-".into()
                },
                from_disk.map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
            ]
        })
        .collect();
    rows.extend(SEED_000.iter().map(|p| {
        vec![
            format!("seed 000 {} (published)", p.tiers),
            format!("{:.2}%", p.hit_rate * 100.0),
            ms(p.mean_ttft_s),
            ms(p.p90_ttft_s),
            format!("{:.2}", p.input_tokens_per_s),
            "-".into(),
            "-".into(),
            "-".into(),
        ]
    }));
    page.table(
        &[
            "run",
            "hit rate",
            "mean TTFT ms",
            "p90 TTFT ms",
            "input tok/s",
            "failed",
            "pool memory",
            "from disk",
        ],
        rows,
    );
    page.heading("Each tier's run");
    let named: Vec<multiturn::report::Run<'_>> = results
        .iter()
        .map(|(n, r, _, _)| multiturn::report::Run {
            name: n.to_string(),
            result: r,
        })
        .collect();
    multiturn::report::charts(&mut page, &named)?;
    Ok(page)
}

/// Runs `rbgctl bench tiers` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
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
        let w = a.workload.against(&router, name)?;
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
    let figures = Figures {
        args: &a,
        results: &results,
    };
    figures.publish(a.workload.json, a.workload.report.as_deref())
}

/// Each tier setup's name, its multi-turn result, the pool's memory and its share of reads
/// from disk.
type TierResult<'a> = (&'a str, multiturn::RateResult, u64, Option<f64>);

/// What `bench tiers` reports: each tier setup's result (the JSON: one entry per setup).
struct Figures<'a> {
    args: &'a TiersArgs,
    results: &'a [TierResult<'a>],
}

impl serde::Serialize for Figures<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut by_setup = serde_json::Map::new();
        for (name, r, memory, from_disk) in self.results {
            let rounds: serde_json::Map<_, _> = (r.rounds.iter())
                .map(|(k, v)| (format!("round_{k}"), json!(v)))
                .collect();
            let entry = json!({
                "summary": r.summary,
                "pool_memory_bytes": memory,
                "pool_reads_from_disk": from_disk,
                "round": rounds,
            });
            by_setup.insert(name.to_string(), entry);
        }
        by_setup.serialize(serializer)
    }
}

impl BenchReport for Figures<'_> {
    fn table(&self) -> String {
        let (a, results, mut out) = (self.args, self.results, String::new());
        let _ =
            writeln!(out,
            "Cache tiers, same workload ({} clients x {} rounds, rate {} req/s; SIMULATED engines)",
            a.workload.num_clients, a.workload.num_rounds, a.workload.request_rate
        );
        let _ = writeln!(
            out,
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
        for (name, r, memory, from_disk) in results {
            let s = &r.summary;
            let _ = writeln!(
                out,
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
        out
    }

    fn page(&self) -> anyhow::Result<crate::report::Page> {
        page(self.args, self.results)
    }
}
