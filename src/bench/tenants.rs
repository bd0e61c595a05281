//! `rbgctl bench tenants`: two tenants on one service (SIMULATED engines behind the router):
//! tenant A interactive at its usual rate, tenant B a batch flood at a multiple of what the
//! engines can prefill. Three runs, each on a fresh service: A alone, A and B with admission
//! (a tenants file: A's class first, B's class capped below the capacity, the class's priority
//! passed to the engines' priority scheduling), and A and B without (no tenants file). Figures:
//! A's TTFT (p50, p99) in each run and its ratio to A alone; every request of B answered (200,
//! 429, 503), the totals per tenant adding up.

use crate::bench::kit::report::BenchReport;
use crate::bench::kit::stats::percentile;
use crate::launch::{Launcher, Logs};
use crate::router::policy::PolicyKind;
use crate::up::{Stack, UpConfig};
use anyhow::Context as _;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rbgctl bench tenants`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct TenantsBenchArgs {
    /// Seconds each run sends for (answers still coming in are awaited).
    #[arg(long, default_value_t = 15.0)]
    pub seconds: f64,
    /// SIMULATED engines behind the router.
    #[arg(long, default_value_t = 2)]
    pub engines: usize,
    /// Prompt tokens of every request (all distinct: nothing is cached).
    #[arg(long, default_value_t = 1024)]
    pub prompt_tokens: usize,
    /// Tenant A's requests per second (Poisson), streamed.
    #[arg(long, default_value_t = 2.0)]
    pub a_rate: f64,
    /// Tenant A's output tokens per request.
    #[arg(long, default_value_t = 16)]
    pub a_output: usize,
    /// Tenant B's rate as a multiple of the engines' prefill capacity (engines / prefill time).
    #[arg(long, default_value_t = 5.0)]
    pub b_factor: f64,
    /// Tenant B's output tokens per request.
    #[arg(long, default_value_t = 64)]
    pub b_output: usize,
    /// Requests the engines are given at once with admission (`--max-concurrent-requests`).
    #[arg(long, default_value_t = 16)]
    pub capacity: usize,
    /// Of the capacity, slots batch may not take (kept for interactive).
    #[arg(long, default_value_t = 2)]
    pub reserved: usize,
    /// The engines' chunked prefill, tokens (SGLang's `--chunked-prefill-size`).
    #[arg(long, default_value_t = 128)]
    pub chunk_tokens: i64,
    /// Prefill compute per token of the SIMULATED engines, microseconds.
    #[arg(long, default_value_t = 100.0)]
    pub prefill_us_per_token: f64,
    /// The router's policy.
    #[arg(long, value_enum, default_value = "predicted_ttft")]
    pub policy: PolicyKind,
    /// Most of B's requests in flight from this client (a bound on the bench itself).
    #[arg(long, default_value_t = 1024)]
    pub b_in_flight: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// What one tenant's requests got.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcomes {
    pub sent: u64,
    /// By HTTP status.
    pub status: BTreeMap<u16, u64>,
    /// No answer at all (connection refused or cut, timeout): must be 0.
    pub unanswered: u64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    pub ttft_max_ms: f64,
}

impl Outcomes {
    /// Whether every request sent is counted once.
    pub fn adds_up(&self) -> bool {
        self.status.values().sum::<u64>() + self.unanswered == self.sent
    }
}

/// One run.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub name: &'static str,
    pub a: Outcomes,
    pub b: Option<Outcomes>,
}

/// What `bench tenants` reports: each run and the interactive tenant's p99 TTFT ratio.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub runs: Vec<Run>,
    /// A's p99 TTFT with B's flood and admission, over A's alone: the figure to keep ≤ 1.3.
    pub a_p99_ttft_admission_over_alone: f64,
    /// The same without admission.
    pub a_p99_ttft_no_admission_over_alone: f64,
    /// B's requests per second sent, and the engines' prefill capacity.
    pub b_rate: f64,
    pub capacity_rps: f64,
    /// The SIMULATED engines, each one's prefill per request, and B's rate over capacity.
    pub engines: usize,
    pub prefill_ms: f64,
    pub b_factor: f64,
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let (r, mut out) = (self, String::new());
        let _ = writeln!(
            out,
            "SIMULATED engines: {} × {:.0} ms prefill per request ({:.1} requests/s); B at {:.1}/s ({}×)",
            r.engines,
            r.prefill_ms,
            r.capacity_rps,
            r.b_rate,
            r.b_factor
        );
        let _ = writeln!(
            out,
            "{:<28} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>5}",
            "run",
            "A sent",
            "A p50 ms",
            "A p90 ms",
            "A p99 ms",
            "A max ms",
            "B sent",
            "B 200",
            "B 429",
            "B 503",
            "lost"
        );
        for run in &r.runs {
            let b = run.b.clone().unwrap_or_default();
            let n = |s: u16| b.status.get(&s).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{:<28} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>7} {:>7} {:>7} {:>5}",
                run.name,
                run.a.sent,
                run.a.ttft_p50_ms,
                run.a.ttft_p90_ms,
                run.a.ttft_p99_ms,
                run.a.ttft_max_ms,
                b.sent,
                n(200),
                n(429),
                n(503),
                run.a.unanswered + b.unanswered
            );
        }
        let _ = writeln!(
            out,
            "A's p99 TTFT over A alone: {:.2}× with admission, {:.2}× without",
            r.a_p99_ttft_admission_over_alone, r.a_p99_ttft_no_admission_over_alone
        );
        out
    }
}

const KEY_A: &str = "bench-tenant-a-key";
const KEY_B: &str = "bench-tenant-b-key";

fn tenants_file(a: &TenantsBenchArgs) -> String {
    use crate::router::tenants::table::key_entry;
    format!(
        "[[class]]\nname = \"interactive\"\nqueue_size = 256\nqueue_ttl_secs = 10\nengine_priority = 10\n\
         [[class]]\nname = \"batch\"\nqueue_size = 64\nqueue_ttl_secs = 2\nengine_priority = 0\nmax_running = {}\n\
         [[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\nclasses = [\"interactive\"]\n\
         [[tenant]]\nname = \"b\"\nkeys = [\"{}\"]\nclasses = [\"batch\"]\n",
        a.capacity.saturating_sub(a.reserved).max(1),
        key_entry(KEY_A),
        key_entry(KEY_B),
    )
}

/// A prompt of `n` token ids no other request shares (`seed` apart).
fn prompt(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n).map(|_| rng.u32(1000..30000)).collect()
}

/// One request: its status (None: no answer) and time to its first body byte.
async fn one(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    ids: Vec<u32>,
    max_new: usize,
) -> (Option<u16>, Option<Duration>) {
    let body = serde_json::json!({
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new, "ignore_eos": true},
        "stream": true,
    });
    let t0 = Instant::now();
    let resp = http
        .post(url)
        .bearer_auth(key)
        .json(&body)
        .timeout(Duration::from_secs(120))
        .send()
        .await;
    let Ok(mut resp) = resp else {
        return (None, None);
    };
    let status = resp.status().as_u16();
    let mut first = None;
    loop {
        match resp.chunk().await {
            Ok(Some(c)) if first.is_none() && !c.is_empty() => first = Some(t0.elapsed()),
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => return (None, first),
        }
    }
    (Some(status), first)
}

/// One tenant's load: open-loop Poisson arrivals for `seconds`.
struct Load {
    url: String,
    key: &'static str,
    rate: f64,
    seconds: f64,
    prompt_tokens: usize,
    max_new: usize,
    /// Most in flight; arrivals beyond are not sent (nor counted).
    cap: usize,
    seed: u64,
}

/// Sends `load`, then waits for every answer.
async fn tenant_load(http: reqwest::Client, load: Load) -> Outcomes {
    let Load {
        url,
        key,
        rate,
        seconds,
        prompt_tokens,
        max_new,
        cap,
        seed,
    } = load;
    let gate = Arc::new(tokio::sync::Semaphore::new(cap));
    let mut rng = fastrand::Rng::with_seed(seed);
    let end = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut next = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut sent = 0u64;
    while next < end {
        tokio::time::sleep_until(next).await;
        next += Duration::from_secs_f64(-(1.0 - rng.f64()).ln() / rate);
        let Ok(permit) = gate.clone().try_acquire_owned() else {
            continue;
        };
        sent += 1;
        let (http, url) = (http.clone(), url.clone());
        let ids = prompt(
            prompt_tokens,
            seed.wrapping_mul(1_000_003).wrapping_add(sent),
        );
        tasks.spawn(async move {
            let r = one(&http, &url, key, ids, max_new).await;
            drop(permit);
            r
        });
    }
    let mut out = Outcomes {
        sent,
        ..Outcomes::default()
    };
    let mut ttft = Vec::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((Some(status), first)) => {
                *out.status.entry(status).or_default() += 1;
                if status == 200 {
                    ttft.extend(first);
                }
            }
            _ => out.unanswered += 1,
        }
    }
    ttft.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    out.ttft_p50_ms = ms(percentile(&ttft, 0.5));
    out.ttft_p90_ms = ms(percentile(&ttft, 0.9));
    out.ttft_p99_ms = ms(percentile(&ttft, 0.99));
    out.ttft_max_ms = ttft.last().copied().map_or(0.0, ms);
    out
}

fn layout(a: &TenantsBenchArgs, admission: Option<&std::path::Path>) -> UpConfig {
    let mut c = UpConfig::default().on_free_ports();
    c.pool.stores = 0;
    c.engines.count = a.engines;
    c.engines.l3 = false;
    c.engines.host_cache_tokens = 0;
    c.engines.prefill_us_per_token = a.prefill_us_per_token;
    c.engines.chunked_prefill_size = a.chunk_tokens;
    c.engines.enable_priority_scheduling = true;
    c.router.policy = a.policy;
    if let Some(file) = admission {
        c.router.tenants_file = Some(file.to_path_buf());
        c.router.max_concurrent_requests = a.capacity as i64;
    }
    c
}

/// Runs `rbgctl bench tenants` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(a: TenantsBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.engines > 0, "--engines must be at least 1");
    anyhow::ensure!(a.a_rate > 0.0 && a.b_factor > 0.0, "rates must be positive");
    anyhow::ensure!(
        a.reserved < a.capacity,
        "--reserved must be below --capacity"
    );
    let launcher = Launcher::new(Logs::Null)?;
    let file = launcher.dir().join("tenants.toml");
    std::fs::write(&file, tenants_file(&a))?;
    let prefill_s = a.prompt_tokens as f64 * a.prefill_us_per_token / 1e6;
    let capacity_rps = a.engines as f64 / prefill_s;
    let b_rate = a.b_factor * capacity_rps;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut runs = Vec::new();
    for (name, admission, flood) in [
        ("A alone", true, false),
        ("A + B flood, admission", true, true),
        ("A + B flood, no admission", false, true),
    ] {
        if !a.json {
            eprintln!("… tenants: {name} ({} s)", a.seconds);
        }
        let cfg = layout(&a, admission.then_some(file.as_path()));
        let mut stack = Stack::start(&cfg, &launcher).context("starting the service")?;
        let router = stack.router.clone().context("the layout has a router")?;
        let url = format!("{router}/generate");
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(a.b_in_flight + 64)
            .build()?;
        let (ra, rb) = rt.block_on(async {
            let la = tokio::spawn(tenant_load(
                http.clone(),
                Load {
                    url: url.clone(),
                    key: KEY_A,
                    rate: a.a_rate,
                    seconds: a.seconds,
                    prompt_tokens: a.prompt_tokens,
                    max_new: a.a_output,
                    cap: 256,
                    seed: 1,
                },
            ));
            let lb = flood.then(|| {
                tokio::spawn(tenant_load(
                    http.clone(),
                    Load {
                        url: url.clone(),
                        key: KEY_B,
                        rate: b_rate,
                        seconds: a.seconds,
                        prompt_tokens: a.prompt_tokens,
                        max_new: a.b_output,
                        cap: a.b_in_flight,
                        seed: 2,
                    },
                ))
            });
            let ra = la.await?;
            let rb = match lb {
                Some(t) => Some(t.await?),
                None => None,
            };
            anyhow::Ok((ra, rb))
        })?;
        stack.stop();
        runs.push(Run { name, a: ra, b: rb });
    }
    let p99 = |i: usize| runs[i].a.ttft_p99_ms;
    let report = Report {
        a_p99_ttft_admission_over_alone: p99(1) / p99(0),
        a_p99_ttft_no_admission_over_alone: p99(2) / p99(0),
        b_rate,
        capacity_rps,
        engines: a.engines,
        prefill_ms: prefill_s * 1e3,
        b_factor: a.b_factor,
        runs,
    };
    report.publish(a.json, None)
}
