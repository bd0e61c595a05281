//! `rbgctl bench policies`: the router's policies side by side on one multi-turn workload. The
//! same conversations run against a fresh service on loopback per policy (`up`'s machinery:
//! SIMULATED engines with small device caches, the pool as their L3), so that no policy inherits
//! another's caches. For each it prints mean and p90 TTFT, the hit rate, the hit rate of an
//! oracle that knew every cache (`multiturn::oracle`), and where the hits were served from
//! (device, host, pool): the device's share is what a policy's choices win, the pool's what
//! they leave to a copy.

use super::multiturn::{self, oracle, MultiturnArgs, RateResult};
use crate::bench::kit::report::BenchReport;
use crate::launch::{Launcher, Logs};
use crate::router::policy::PolicyKind;
use crate::up::{Stack, UpConfig};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

/// `rbgctl bench policies`'s arguments.
#[derive(Debug, Args)]
pub struct PoliciesArgs {
    /// Service layout (config/up.toml's format). Default: 4 SIMULATED engines with 8,192-token
    /// device caches, no host tier, 2 stores as their L3. Ports are chosen free; the runs
    /// differ only in the router's policy.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The policies, run in this order (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,cache_aware,precise_prefix"
    )]
    pub policies: Vec<PolicyKind>,
    /// Kill the router (SIGKILL) at the barrier before this round and start it again (0:
    /// never): the figures then say how each policy's hits held across the restart. Turns
    /// `--enable-round-barrier` on.
    #[arg(long, default_value_t = 0)]
    pub restart_router_before_round: usize,
    /// Router replicas side by side, the requests spread over them in turn (a load balancer
    /// without session affinity): each `cache_aware` replica sees only the turns sent through
    /// it, while every `precise_prefix` replica follows the same KV events. Overrides the
    /// layout's `router.replicas`.
    #[arg(long)]
    pub routers: Option<usize>,
    /// Runs per policy, each on a fresh service: the figures are those of the run with the
    /// median mean TTFT, and the table gives every run's range.
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
    #[command(flatten)]
    pub workload: MultiturnArgs,
}

/// The layout without `--config`: small device caches, so that where a conversation goes
/// decides whether its prefix is on the device or must be copied from the pool.
pub fn default_layout() -> UpConfig {
    let mut c = UpConfig::default();
    c.engines.count = 4;
    c.engines.device_cache_tokens = 8192;
    c.engines.host_cache_tokens = 0;
    c
}

/// `base` for one policy: every port chosen by the kernel, the engines' KV events on where the
/// policy follows them.
pub fn layout(base: &UpConfig, policy: PolicyKind) -> UpConfig {
    let mut c = base.on_free_ports();
    c.router.policy = policy;
    c.engines.kv_events = Some(policy.follows_kv_events());
    c
}

/// Cached prompt tokens by the tier that served them, summed over the engines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ByTier {
    pub device: u64,
    pub host: u64,
    pub pool: u64,
}

impl ByTier {
    /// What was counted since `earlier` (counters only grow; a restarted engine's restart
    /// from zero counts as nothing).
    pub fn since(&self, earlier: &ByTier) -> ByTier {
        ByTier {
            device: self.device.saturating_sub(earlier.device),
            host: self.host.saturating_sub(earlier.host),
            pool: self.pool.saturating_sub(earlier.pool),
        }
    }

    /// The shares of each tier in the cached tokens (0 where nothing was cached).
    pub fn shares(&self) -> (f64, f64, f64) {
        let total = (self.device + self.host + self.pool) as f64;
        if total == 0.0 {
            return (0.0, 0.0, 0.0);
        }
        let s = |n: u64| n as f64 / total;
        (s(self.device), s(self.host), s(self.pool))
    }

    /// Adds one engine's `rbgctl_sim_cached_tokens_total{tier=...}` samples.
    pub fn add_metrics(&mut self, text: &str) {
        let tier = |t: &str| {
            let name = format!("rbgctl_sim_cached_tokens_total{{tier=\"{t}\"}}");
            crate::telemetry::sample(text, &name).unwrap_or(0.0) as u64
        };
        self.device += tier("device");
        self.host += tier("host");
        self.pool += tier("storage");
    }
}

/// How a policy's hits held across a router restart: the round before it against the round
/// after.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RestartFigures {
    /// The round sent first after the restart.
    pub round: usize,
    /// From the kill until the new router answered ready.
    pub ready_after_s: f64,
    pub hit_rate_before: f64,
    pub hit_rate_after: f64,
    /// The device's share of the cached tokens, each round.
    pub device_share_before: f64,
    pub device_share_after: f64,
}

impl RestartFigures {
    /// From the engines' counters as they stood before each round was sent (`at[r]`, `at[0]`
    /// zero) and at the end, and the run's per-round hit rates.
    pub fn of(
        round: usize,
        ready_after_s: f64,
        at: &std::collections::BTreeMap<usize, ByTier>,
        end: &ByTier,
        rounds: &std::collections::BTreeMap<usize, multiturn::summary::RoundSummary>,
    ) -> RestartFigures {
        let before_round = |r: usize| at.get(&r).copied().unwrap_or(*end);
        let in_round = |r: usize| before_round(r + 1).since(&before_round(r));
        let hit = |r: usize| rounds.get(&r).map_or(0.0, |x| x.cache_hit_rate);
        RestartFigures {
            round,
            ready_after_s,
            hit_rate_before: hit(round - 1),
            hit_rate_after: hit(round),
            device_share_before: in_round(round - 1).shares().0,
            device_share_after: in_round(round).shares().0,
        }
    }
}

/// One policy's run.
pub struct PolicyRun {
    pub policy: PolicyKind,
    pub result: RateResult,
    pub oracle_hit_rate: f64,
    pub by_tier: ByTier,
    pub restart: Option<RestartFigures>,
    /// Every run's mean TTFT, lowest first (this one is their median).
    pub mean_ttfts: Vec<f64>,
    /// The inference requests each router replica received (since its last start).
    pub by_router: Vec<u64>,
}

impl PolicyRun {
    fn json(&self, baseline: Option<&PolicyRun>) -> serde_json::Value {
        let s = &self.result.summary;
        let (device, host, pool) = self.by_tier.shares();
        serde_json::json!({
            "policy": self.policy.name(),
            "mean_ttft_s": s.average_ttft,
            "p90_ttft_s": s.p90_ttft,
            "hit_rate": s.cache_hit_rate,
            "oracle_hit_rate": self.oracle_hit_rate,
            "hits_by_tier": {"device": device, "host": host, "pool": pool},
            "cached_tokens_by_tier": self.by_tier,
            "mean_ttft_vs_cache_aware": baseline.map(|b| ratio(b.result.summary.average_ttft, s.average_ttft)),
            "p90_ttft_vs_cache_aware": baseline.map(|b| ratio(b.result.summary.p90_ttft, s.p90_ttft)),
            "input_token_throughput": s.input_token_throughput,
            "requests": s.total_requests,
            "failed": self.result.failed,
            "router_restart": self.restart,
            "runs_mean_ttft_s": self.mean_ttfts,
            "requests_by_router": self.by_router,
            "summary": s,
        })
    }
}

/// How many times lower `ours` is than `theirs` (`theirs / ours`).
fn ratio(theirs: f64, ours: f64) -> Option<f64> {
    (ours > 0.0).then(|| theirs / ours)
}

/// A service part's `/metrics` text (`None` when it did not answer).
fn metrics_of(base: &str) -> Option<String> {
    reqwest::blocking::get(format!("{base}/metrics"))
        .and_then(|r| r.error_for_status()?.text())
        .ok()
}

/// The inference requests each router replica received, from its `/metrics`.
fn router_requests(stack: &Stack) -> Vec<u64> {
    stack
        .routers
        .iter()
        .map(|url| {
            metrics_of(url).map_or(0, |text| {
                crate::telemetry::sum(&text, "smg_router_requests_total") as u64
            })
        })
        .collect()
}

fn engine_tiers(stack: &Stack) -> ByTier {
    let mut t = ByTier::default();
    for text in stack.engines.iter().filter_map(|(url, _)| metrics_of(url)) {
        t.add_metrics(&text);
    }
    t
}

/// What one run of one policy needs.
struct Once<'a> {
    a: &'a PoliciesArgs,
    base: &'a UpConfig,
    launcher: &'a Launcher,
    rt: &'a tokio::runtime::Runtime,
    stop: &'a crate::shutdown::Shutdown,
}

impl Once<'_> {
    /// Runs the workload once against a fresh service routing by `policy`.
    fn run(&self, policy: PolicyKind, rep: usize) -> anyhow::Result<PolicyRun> {
        let (a, restart) = (self.a, self.a.restart_router_before_round);
        let cfg = layout(self.base, policy);
        eprintln!(
            "policies: {}{}: starting the service ({} SIMULATED engines, {}-token device caches, {} router{})...",
            policy.name(),
            if a.reps > 1 { format!(" (run {} of {})", rep + 1, a.reps) } else { String::new() },
            cfg.engines.count,
            cfg.engines.device_cache_tokens,
            cfg.router.replicas,
            if cfg.router.replicas == 1 { "" } else { "s" },
        );
        let mut stack = Stack::start(&cfg, self.launcher)?;
        let router = stack
            .router
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the layout has no router (router.enabled = false?)"))?;
        let mut w = a.workload.against(&router, policy.name())?;
        w.oracle_page_size = Some(cfg.engines.page_size);
        if stack.routers.len() > 1 {
            w.spread_over = stack.routers.clone();
        }
        if restart > 0 {
            w.enable_round_barrier = true;
        }
        // The engines' counters before each round, and the restart's time to ready.
        let mut at = std::collections::BTreeMap::from([(0, ByTier::default())]);
        let mut ready_after: Option<anyhow::Result<f64>> = None;
        let mut at_barrier = |round: usize| {
            at.insert(round, engine_tiers(&stack));
            if round == restart {
                eprintln!(
                    "policies: {}: restarting the router (SIGKILL)",
                    policy.name()
                );
                ready_after = Some(
                    stack
                        .restart_router()
                        .map(|d| d.as_secs_f64())
                        .map_err(anyhow::Error::from),
                );
            }
        };
        let result = self.rt.block_on(multiturn::run_rate_with(
            &w,
            w.request_rate,
            self.stop,
            &mut at_barrier,
        ));
        let by_tier = engine_tiers(&stack);
        let by_router = router_requests(&stack);
        stack.stop();
        let result = result?;
        let restart = match ready_after {
            Some(ready) => Some(RestartFigures::of(
                restart,
                ready?,
                &at,
                &by_tier,
                &result.rounds,
            )),
            None => None,
        };
        if !w.log_file.is_empty() {
            multiturn::append_log(
                &w.log_file,
                &multiturn::summary::log_line(
                    &w.tag,
                    &result.summary,
                    &result.rounds,
                    result.interrupted,
                ),
            )?;
        }
        for e in &result.errors {
            eprintln!("  {}: error: {e}", policy.name());
        }
        let (_, oracle_hit_rate) = oracle::hit_rates(&result.records);
        let mean_ttfts = vec![result.summary.average_ttft];
        Ok(PolicyRun {
            policy,
            result,
            oracle_hit_rate,
            by_tier,
            restart,
            mean_ttfts,
            by_router,
        })
    }
}

/// The run of median mean TTFT among `reps` (one policy's), knowing every run's mean TTFT.
fn median_of(mut reps: Vec<PolicyRun>) -> PolicyRun {
    reps.sort_by(|x, y| {
        x.result
            .summary
            .average_ttft
            .total_cmp(&y.result.summary.average_ttft)
    });
    let means: Vec<f64> = reps.iter().map(|r| r.result.summary.average_ttft).collect();
    let mut median = reps.swap_remove(reps.len() / 2);
    median.mean_ttfts = means;
    median
}

/// Runs `rbgctl bench policies` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(a: PoliciesArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.policies.is_empty(),
        "--policies: name at least one policy"
    );
    anyhow::ensure!(a.reps >= 1, "--reps must be at least 1");
    anyhow::ensure!(
        a.workload.api_format == super::kit::llm::ApiFormat::Sglang,
        "--api-format: the oracle follows the answers' token ids, which only SGLang's /generate \
         returns; leave --api-format at sglang"
    );
    let restart = a.restart_router_before_round;
    anyhow::ensure!(
        restart == 0 || (1..a.workload.num_rounds).contains(&restart),
        "--restart-router-before-round {restart}: name a round after the first and within \
         --num-rounds ({}), or 0 for no restart",
        a.workload.num_rounds
    );
    let mut base = match &a.config {
        Some(p) => UpConfig::from_file(p)?,
        None => default_layout(),
    };
    if let Some(n) = a.routers {
        anyhow::ensure!(n >= 1, "--routers must be at least 1");
        base.router.replicas = n;
    }
    anyhow::ensure!(
        base.engines.count >= 2 && !base.engines.pd(),
        "--config: the policies choose between regular engines: set engines.count to 2 or more \
         (and no prefill/decode split)"
    );
    let launcher = Launcher::new(Logs::Null)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let stop = crate::shutdown::Shutdown::on_signals()?;
    let mut runs: Vec<PolicyRun> = Vec::new();
    let mut failed = 0;
    'policies: for &policy in &a.policies {
        let mut reps: Vec<PolicyRun> = Vec::with_capacity(a.reps);
        for rep in 0..a.reps {
            let ctx = Once {
                a: &a,
                base: &base,
                launcher: &launcher,
                rt: &rt,
                stop: &stop,
            };
            let r = ctx.run(policy, rep)?;
            failed += r.result.failed;
            let interrupted = r.result.interrupted;
            reps.push(r);
            if interrupted {
                eprintln!("interrupted: the runs so far follow");
                runs.push(median_of(reps));
                break 'policies;
            }
        }
        runs.push(median_of(reps));
    }
    let figures = Figures {
        args: &a,
        routers: base.router.replicas,
        runs: &runs,
    };
    figures.publish(a.workload.json, a.workload.report.as_deref())?;
    anyhow::ensure!(
        failed == 0,
        "{failed} request(s) failed; the figures above cover the rest only"
    );
    Ok(())
}

/// The table's rows: policy, mean and p90 TTFT (ms), × cache_aware's mean, hit rate, oracle's,
/// device/host/pool shares of the hits, input tokens/s.
fn rows(runs: &[PolicyRun]) -> Vec<Vec<String>> {
    let baseline = runs.iter().find(|r| r.policy == PolicyKind::CacheAware);
    let pct = |x: f64| format!("{:.1}%", x * 100.0);
    runs.iter()
        .map(|r| {
            let s = &r.result.summary;
            let (device, host, pool) = r.by_tier.shares();
            vec![
                r.policy.name().to_string(),
                format!("{:.1}", s.average_ttft * 1e3),
                format!("{:.1}", s.p90_ttft * 1e3),
                match r.mean_ttfts.as_slice() {
                    [lo, .., hi] => {
                        format!("{:.1}–{:.1} ({})", lo * 1e3, hi * 1e3, r.mean_ttfts.len())
                    }
                    _ => "-".into(),
                },
                baseline
                    .and_then(|b| ratio(b.result.summary.average_ttft, s.average_ttft))
                    .map_or("-".into(), |x| format!("{x:.2}×")),
                baseline
                    .and_then(|b| ratio(b.result.summary.p90_ttft, s.p90_ttft))
                    .map_or("-".into(), |x| format!("{x:.2}×")),
                pct(s.cache_hit_rate),
                pct(r.oracle_hit_rate),
                format!("{} / {} / {}", pct(device), pct(host), pct(pool)),
                format!("{:.0}", s.input_token_throughput),
            ]
        })
        .collect()
}

const HEADERS: [&str; 10] = [
    "policy",
    "mean TTFT ms",
    "p90 TTFT ms",
    "runs' mean TTFT ms",
    "cache_aware's mean ÷ this",
    "cache_aware's p90 ÷ this",
    "hit rate",
    "oracle hit rate",
    "hits device / host / pool",
    "input tok/s",
];

/// How many routers served, in words (the replicas the requests were spread over).
fn routers_phrase(routers: usize) -> String {
    match routers {
        1 => "one router".into(),
        n => format!("{n} router replicas, the requests spread over them in turn"),
    }
}

fn render(w: &MultiturnArgs, routers: usize, runs: &[PolicyRun]) -> String {
    let skew = match w.long_clients {
        0 => String::new(),
        n => format!(
            ", {n} of them opening with {}-token prompts that share their first {}",
            w.long_request_length, w.long_shared_prefix
        ),
    };
    let mut out = format!(
        "Router policies on one multi-turn workload ({} clients × {} rounds{skew}, rate {} \
         req/s; SIMULATED engines, {}, a fresh service per policy)\n",
        w.num_clients,
        w.num_rounds,
        w.request_rate,
        routers_phrase(routers)
    );
    out.push_str(&crate::bench::kit::stats::text_table(&HEADERS, &rows(runs)));
    if runs.iter().any(|r| r.restart.is_some()) {
        out.push_str("\nThe router killed (SIGKILL) and started again before a round:\n");
        out.push_str(&crate::bench::kit::stats::text_table(
            &RESTART_HEADERS,
            &restart_rows(runs),
        ));
    }
    out
}

const RESTART_HEADERS: [&str; 5] = [
    "policy",
    "ready after s",
    "hit rate round before → after",
    "after ÷ before",
    "device share before → after",
];

fn restart_rows(runs: &[PolicyRun]) -> Vec<Vec<String>> {
    let pct = |x: f64| format!("{:.1}%", x * 100.0);
    runs.iter()
        .filter_map(|r| Some((r.policy, r.restart?)))
        .map(|(policy, x)| {
            vec![
                format!("{} (round {})", policy.name(), x.round),
                format!("{:.2}", x.ready_after_s),
                format!("{} → {}", pct(x.hit_rate_before), pct(x.hit_rate_after)),
                if x.hit_rate_before > 0.0 {
                    pct(x.hit_rate_after / x.hit_rate_before)
                } else {
                    "-".into()
                },
                format!(
                    "{} → {}",
                    pct(x.device_share_before),
                    pct(x.device_share_after)
                ),
            ]
        })
        .collect()
}

/// What `bench policies` reports: the router replicas, and each policy's run (its JSON beside
/// `cache_aware`'s, the baseline).
struct Figures<'a> {
    args: &'a PoliciesArgs,
    routers: usize,
    runs: &'a [PolicyRun],
}

impl serde::Serialize for Figures<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let baseline = self
            .runs
            .iter()
            .find(|r| r.policy == PolicyKind::CacheAware);
        let policies: Vec<_> = self.runs.iter().map(|r| r.json(baseline)).collect();
        serde_json::json!({ "routers": self.routers, "policies": policies }).serialize(serializer)
    }
}

impl BenchReport for Figures<'_> {
    fn table(&self) -> String {
        render(&self.args.workload, self.routers, self.runs)
    }

    fn page(&self) -> anyhow::Result<crate::report::Page> {
        page(self.args, self.routers, self.runs)
    }
}

fn page(
    a: &PoliciesArgs,
    routers: usize,
    runs: &[PolicyRun],
) -> anyhow::Result<crate::report::Page> {
    use crate::report::{BarChart, Format, Group, Panel};
    let w = &a.workload;
    let mut page = crate::report::Page::new("Router policies on one multi-turn workload");
    page.fact(
        "workload",
        format!(
            "{} clients × {} rounds, {} prompt tokens, {} output tokens, rate {} req/s, at most {} in flight",
            w.num_clients, w.num_rounds, w.request_length, w.output_length, w.request_rate, w.max_parallel
        ),
    )
    .fact(
        "service",
        format!(
            "a fresh `rbgctl up` per policy: SIMULATED engines (no model, no GPU), the pool as \
             their L3, {}",
            routers_phrase(routers)
        ),
    );
    page.heading("Figures");
    page.table(&HEADERS, rows(runs));
    if runs.iter().any(|r| r.restart.is_some()) {
        page.heading("Across a router restart");
        page.table(&RESTART_HEADERS, restart_rows(runs));
    }
    let names: Vec<String> = runs.iter().map(|r| r.policy.name().to_string()).collect();
    let of = |f: &dyn Fn(&PolicyRun) -> f64| -> Vec<Option<f64>> {
        runs.iter().map(|r| Some(f(r))).collect()
    };
    let chart = BarChart::new(
        "policies-hit-ttft",
        "Hit rate and TTFT per policy",
        names.clone(),
    )
    .panel(
        Panel::bars(
            "hit rate, and the oracle's",
            "cache hit rate",
            Format::Percent,
            vec![
                Group::new("hit rate", of(&|r| r.result.summary.cache_hit_rate)),
                Group::new("oracle hit rate", of(&|r| r.oracle_hit_rate)),
            ],
        )
        .with_lines(
            "TTFT (s)",
            Format::Number,
            vec![
                Group::new("mean TTFT", of(&|r| r.result.summary.average_ttft)),
                Group::new("p90 TTFT", of(&|r| r.result.summary.p90_ttft)),
            ],
        ),
    );
    page.bar_chart(
        &chart,
        "Bars: the hit rate each policy reached and the oracle's for the same requests (left \
         axis); lines: mean and p90 TTFT (right axis).",
    )?;
    let tiers = BarChart::new("policies-tiers", "Where the hits were served from", names).panel(
        Panel::bars(
            "share of cached tokens",
            "share",
            Format::Percent,
            vec![
                Group::new("device", of(&|r| r.by_tier.shares().0)),
                Group::new("host", of(&|r| r.by_tier.shares().1)),
                Group::new("pool", of(&|r| r.by_tier.shares().2)),
            ],
        ),
    );
    page.bar_chart(
        &tiers,
        "A hit on the device costs nothing; one from the host or the pool costs its copy.",
    )?;
    page.heading("Each policy's run");
    let named: Vec<multiturn::report::Run<'_>> = runs
        .iter()
        .map(|r| multiturn::report::Run {
            name: r.policy.name().to_string(),
            result: &r.result,
        })
        .collect();
    multiturn::report::charts(&mut page, &named)?;
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_are_summed_by_tier_from_the_engines_metrics() {
        let mut t = ByTier::default();
        let text = "# TYPE rbgctl_sim_cached_tokens_total counter\n\
                    rbgctl_sim_cached_tokens_total{tier=\"device\"} 300\n\
                    rbgctl_sim_cached_tokens_total{tier=\"host\"} 0\n\
                    rbgctl_sim_cached_tokens_total{tier=\"storage\"} 100\n\
                    rbgctl_sim_requests_total 5\n";
        t.add_metrics(text);
        t.add_metrics(text);
        assert_eq!(
            t,
            ByTier {
                device: 600,
                host: 0,
                pool: 200
            }
        );
        assert_eq!(t.shares(), (0.75, 0.0, 0.25));
        assert_eq!(ByTier::default().shares(), (0.0, 0.0, 0.0));
    }

    #[test]
    fn each_policy_gets_its_own_ports_and_events_only_where_followed() {
        let base = default_layout();
        let precise = layout(&base, PolicyKind::PrecisePrefix);
        assert_eq!(precise.engines.kv_events, Some(true));
        assert_eq!((precise.router.port, precise.pool.master_port), (0, 0));
        let aware = layout(&base, PolicyKind::CacheAware);
        assert_eq!(aware.engines.kv_events, Some(false));
        assert_eq!(aware.router.policy, PolicyKind::CacheAware);
        assert_eq!(aware.engines.device_cache_tokens, 8192);
        aware.validate().unwrap();
    }

    #[test]
    fn a_restart_compares_the_round_before_it_with_the_round_after() {
        use multiturn::summary::RoundSummary;
        let t = |device, pool| ByTier {
            device,
            host: 0,
            pool,
        };
        // Counters before rounds 1 and 2 (0 is zero), and at the end.
        let at = std::collections::BTreeMap::from([
            (0, ByTier::default()),
            (1, t(0, 0)),
            (2, t(300, 100)),
        ]);
        let end = t(400, 400);
        let round = |cache_hit_rate| RoundSummary {
            cache_hit_rate,
            ..RoundSummary::default()
        };
        let rounds =
            std::collections::BTreeMap::from([(0, round(0.0)), (1, round(0.5)), (2, round(0.6))]);
        let r = RestartFigures::of(2, 0.25, &at, &end, &rounds);
        assert_eq!((r.hit_rate_before, r.hit_rate_after), (0.5, 0.6));
        // Round 1: 300 device of 400; round 2: 100 device of 400.
        assert_eq!((r.device_share_before, r.device_share_after), (0.75, 0.25));
        assert_eq!((r.round, r.ready_after_s), (2, 0.25));
    }
}
