//! `rbgctl bench serving`: throughput and latency on a random dataset, like
//! `python -m sglang.bench_serving --dataset-name random`. Prompts of random token ids with
//! lengths uniform in `[max(L * range_ratio, 1), L]`, sent all at once (`--request-rate inf`)
//! or with Poisson arrivals, at most `--max-concurrency` in flight.

use super::kit::llm::{self, ApiFormat, Outcome};
use super::multiturn::summary;
use super::multiturn::workload::{length, Arrivals, Distribution};
use crate::bench::kit::report::BenchReport;
use crate::simulated_tokens::VOCAB;
use clap::Args;
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rbgctl bench serving`'s arguments, as SGLang's `bench_serving.py` names them.
#[derive(Debug, Clone, Args)]
pub struct ServingArgs {
    /// `sglang` (/generate), `sglang-oai` or `vllm` (/v1/completions), `sglang-oai-chat` or
    /// `vllm-chat` (/v1/chat/completions).
    #[arg(long, default_value = "sglang")]
    pub backend: String,
    /// Server URL (default http://HOST:PORT).
    #[arg(long)]
    pub base_url: Option<String>,
    /// Host of the server under test.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port of the server under test.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Only `random` (and `random-ids`): other datasets need files and a tokenizer.
    #[arg(long, default_value = "random")]
    pub dataset_name: String,
    /// Input tokens per request (the upper end with --random-range-ratio).
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    /// Output tokens per request (the upper end with --random-range-ratio).
    #[arg(long, default_value_t = 1024)]
    pub random_output_len: usize,
    /// 0.0 gives lengths uniform in [1, L].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Requests to send.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Requests per second (Poisson); `inf` sends everything at once.
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Most requests in flight at once (default: no limit).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Seed of the prompts' random numbers.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Requests sent (and not counted) before the run.
    #[arg(long, default_value_t = 1)]
    pub warmup_requests: usize,
    /// POST /flush_cache before the run.
    #[arg(long)]
    pub flush_cache: bool,
    /// Model name for the OpenAI APIs.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Append the result as one JSON line.
    #[arg(long)]
    pub output_file: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with charts (TTFT, latency and inter-token latency CDFs,
    /// throughput over time) to this file: self-contained, opens offline.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// The figures of a `bench serving` run, as SGLang's `bench_serving` prints them.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ServingResult {
    pub backend: String,
    pub request_rate: f64,
    /// Most requests in flight at once (0: no limit).
    pub max_concurrency: usize,
    pub completed: usize,
    pub failed: usize,
    pub duration: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub input_throughput: f64,
    pub output_throughput: f64,
    pub total_throughput: f64,
    /// Sum of latencies over duration: the mean number of requests in flight.
    pub concurrency: f64,
    pub mean_e2e_latency_ms: f64,
    pub median_e2e_latency_ms: f64,
    pub p99_e2e_latency_ms: f64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    pub mean_tpot_ms: f64,
    pub median_tpot_ms: f64,
    pub p99_tpot_ms: f64,
    pub mean_itl_ms: f64,
    pub median_itl_ms: f64,
    pub p99_itl_ms: f64,
    pub cache_hit_rate: f64,
}

fn api_of(backend: &str) -> anyhow::Result<ApiFormat> {
    Ok(match backend {
        "sglang" | "sglang-native" => ApiFormat::Sglang,
        "sglang-oai" | "vllm" | "lmdeploy" => ApiFormat::Completions,
        "sglang-oai-chat" | "vllm-chat" | "lmdeploy-chat" => ApiFormat::Openai,
        other => anyhow::bail!(
            "--backend {other:?}: expected sglang, sglang-oai, sglang-oai-chat, vllm or vllm-chat"
        ),
    })
}

/// The random dataset: (prompt ids, output length) per request.
pub fn dataset(a: &ServingArgs) -> Vec<(Vec<u32>, usize)> {
    let mut rng = fastrand::Rng::with_seed(a.seed);
    (0..a.num_prompts)
        .map(|_| {
            let n = length(&mut rng, a.random_input_len, a.random_range_ratio);
            let out = length(&mut rng, a.random_output_len, a.random_range_ratio);
            ((0..n).map(|_| rng.u32(0..VOCAB)).collect(), out)
        })
        .collect()
}

/// Mean, median and p99 in milliseconds.
fn stats_ms(v: Vec<f64>) -> (f64, f64, f64) {
    let (mean, median, _, p99, _) = summary::stats(v);
    (mean * 1e3, median * 1e3, p99 * 1e3)
}

/// The result of finished requests (with the prompt length each was sent with).
pub fn result(a: &ServingArgs, done: &[(usize, Outcome)], duration: f64) -> ServingResult {
    let ok: Vec<&(usize, Outcome)> = done.iter().filter(|(_, o)| o.ok).collect();
    let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
    let input: usize = ok
        .iter()
        .map(|(n, o)| {
            if o.prompt_tokens > 0 {
                o.prompt_tokens
            } else {
                *n
            }
        })
        .sum();
    let output: usize = ok.iter().map(|(_, o)| o.generated_len).sum();
    let cached: usize = ok.iter().map(|(_, o)| o.cached_tokens).sum();
    let (e2e_mean, e2e_med, e2e_p99) = stats_ms(ok.iter().map(|(_, o)| o.latency).collect());
    let (ttft_mean, ttft_med, ttft_p99) = stats_ms(ok.iter().map(|(_, o)| o.ttft).collect());
    let tpots: Vec<f64> = ok
        .iter()
        .filter(|(_, o)| o.generated_len > 1)
        .map(|(_, o)| (o.latency - o.ttft) / (o.generated_len - 1) as f64)
        .collect();
    let (tpot_mean, tpot_med, tpot_p99) = stats_ms(tpots);
    let (itl_mean, itl_med, itl_p99) =
        stats_ms(ok.iter().flat_map(|(_, o)| o.itl.iter().copied()).collect());
    ServingResult {
        backend: a.backend.clone(),
        request_rate: a.request_rate,
        max_concurrency: a.max_concurrency.unwrap_or(0),
        completed: ok.len(),
        failed: done.len() - ok.len(),
        duration,
        total_input_tokens: input,
        total_output_tokens: output,
        request_throughput: per_s(ok.len() as f64),
        input_throughput: per_s(input as f64),
        output_throughput: per_s(output as f64),
        total_throughput: per_s((input + output) as f64),
        concurrency: per_s(ok.iter().map(|(_, o)| o.latency).sum()),
        mean_e2e_latency_ms: e2e_mean,
        median_e2e_latency_ms: e2e_med,
        p99_e2e_latency_ms: e2e_p99,
        mean_ttft_ms: ttft_mean,
        median_ttft_ms: ttft_med,
        p99_ttft_ms: ttft_p99,
        mean_tpot_ms: tpot_mean,
        median_tpot_ms: tpot_med,
        p99_tpot_ms: tpot_p99,
        mean_itl_ms: itl_mean,
        median_itl_ms: itl_med,
        p99_itl_ms: itl_p99,
        cache_hit_rate: if input > 0 {
            cached as f64 / input as f64
        } else {
            0.0
        },
    }
}

/// The result as text, in `bench_serving`'s layout.
pub fn render(r: &ServingResult) -> String {
    let f2 = |x: f64| format!("{x:.2}");
    let concurrency = match r.max_concurrency {
        0 => "not set".to_string(),
        n => n.to_string(),
    };
    let mut rows: Vec<(String, String)> = vec![
        (
            format!("{:=^50}", " Serving Benchmark Result "),
            String::new(),
        ),
        ("Backend:".into(), r.backend.clone()),
        ("Traffic request rate:".into(), r.request_rate.to_string()),
        ("Max request concurrency:".into(), concurrency),
        ("Successful requests:".into(), r.completed.to_string()),
        ("Failed requests:".into(), r.failed.to_string()),
        ("Benchmark duration (s):".into(), f2(r.duration)),
        (
            "Total input tokens:".into(),
            r.total_input_tokens.to_string(),
        ),
        (
            "Total generated tokens:".into(),
            r.total_output_tokens.to_string(),
        ),
        (
            "Request throughput (req/s):".into(),
            f2(r.request_throughput),
        ),
        (
            "Input token throughput (tok/s):".into(),
            f2(r.input_throughput),
        ),
        (
            "Output token throughput (tok/s):".into(),
            f2(r.output_throughput),
        ),
        (
            "Total token throughput (tok/s):".into(),
            f2(r.total_throughput),
        ),
        ("Concurrency:".into(), f2(r.concurrency)),
        (
            "Cache hit rate:".into(),
            format!("{:.2} %", r.cache_hit_rate * 100.0),
        ),
        (format!("{:-^50}", "End-to-End Latency"), String::new()),
        ("Mean E2E Latency (ms):".into(), f2(r.mean_e2e_latency_ms)),
        (
            "Median E2E Latency (ms):".into(),
            f2(r.median_e2e_latency_ms),
        ),
    ];
    let latencies = [
        (
            "Time to First Token",
            "TTFT",
            [r.mean_ttft_ms, r.median_ttft_ms, r.p99_ttft_ms],
        ),
        (
            "Time per Output Token (excl. 1st token)",
            "TPOT",
            [r.mean_tpot_ms, r.median_tpot_ms, r.p99_tpot_ms],
        ),
        (
            "Inter-Token Latency",
            "ITL",
            [r.mean_itl_ms, r.median_itl_ms, r.p99_itl_ms],
        ),
    ];
    for (title, name, [mean, median, p99]) in latencies {
        rows.push((format!("{title:-^50}"), String::new()));
        rows.push((format!("Mean {name} (ms):"), f2(mean)));
        rows.push((format!("Median {name} (ms):"), f2(median)));
        rows.push((format!("P99 {name} (ms):"), f2(p99)));
    }
    let mut s: String = rows
        .iter()
        .map(|(k, v)| format!("{k:<40}{v:>12}\n"))
        .collect();
    s.push_str(&"=".repeat(50));
    s.push('\n');
    s
}

/// The HTML report: latency CDFs and throughput over time of the finished requests.
fn page(
    a: &ServingArgs,
    r: &ServingResult,
    done: &[(usize, Outcome)],
    finished_at: &[f64],
) -> anyhow::Result<crate::report::Page> {
    use crate::report::{Format, LineChart, Page, Series};
    let ok: Vec<(&Outcome, f64)> = done
        .iter()
        .zip(finished_at)
        .filter(|((_, o), _)| o.ok)
        .map(|((_, o), at)| (o, *at))
        .collect();
    let mut page = Page::new("Serving benchmark");
    page.fact("backend", &a.backend).fact(
        "workload",
        format!(
            "{} prompts, random input ≤ {} tokens, output ≤ {} tokens, rate {} req/s, max concurrency {}",
            a.num_prompts,
            a.random_input_len,
            a.random_output_len,
            a.request_rate,
            a.max_concurrency.map_or("unlimited".into(), |c| c.to_string())
        ),
    );
    let seconds = |f: fn(&Outcome) -> f64| -> Vec<f64> { ok.iter().map(|(o, _)| f(o)).collect() };
    let latency = LineChart::new(
        "latency-cdf",
        "Latency: CDF",
        "seconds",
        "share of requests",
    )
    .formats(Format::Number, Format::Percent)
    .series(Series::cdf("TTFT", &seconds(|o| o.ttft)))
    .series(Series::cdf("end-to-end latency", &seconds(|o| o.latency)));
    let itl: Vec<f64> = ok
        .iter()
        .flat_map(|(o, _)| o.itl.iter().map(|s| s * 1e3))
        .collect();
    let itl = LineChart::new("itl-cdf", "Inter-token latency: CDF", "ms", "share of gaps")
        .formats(Format::Number, Format::Percent)
        .series(Series::cdf("inter-token latency", &itl));
    let over_time = |f: fn(&Outcome) -> f64| -> Vec<(f64, f64)> {
        ok.iter().map(|(o, at)| (*at, f(o))).collect()
    };
    let tput = LineChart::new(
        "throughput-over-time",
        "Output-token throughput over time",
        "time since start (s)",
        "output tokens/s",
    )
    .series(Series::per_second(
        "output tokens/s",
        &over_time(|o| o.generated_len as f64),
    ));
    let requests = LineChart::new(
        "requests-over-time",
        "Requests finished over time",
        "time since start (s)",
        "requests/s",
    )
    .series(Series::per_second("requests/s", &over_time(|_| 1.0)));
    page.heading("Summary");
    page.table(
        &[
            "completed",
            "failed",
            "duration s",
            "req/s",
            "output tok/s",
            "TTFT mean/p99 ms",
            "E2E mean/p99 ms",
            "ITL mean/p99 ms",
            "concurrency",
        ],
        vec![vec![
            r.completed.to_string(),
            r.failed.to_string(),
            format!("{:.2}", r.duration),
            format!("{:.2}", r.request_throughput),
            format!("{:.1}", r.output_throughput),
            format!("{:.1} / {:.1}", r.mean_ttft_ms, r.p99_ttft_ms),
            format!("{:.1} / {:.1}", r.mean_e2e_latency_ms, r.p99_e2e_latency_ms),
            format!("{:.2} / {:.2}", r.mean_itl_ms, r.p99_itl_ms),
            format!("{:.2}", r.concurrency),
        ]],
    );
    page.heading("Charts");
    page.line_chart(&latency, "Share of requests whose first token (TTFT) or last token (end-to-end) came within the time on the x axis.")?;
    page.line_chart(&itl, "Gaps between streamed token chunks.")?;
    page.line_chart(&tput, "Output tokens of the requests finished per second.")?;
    page.line_chart(&requests, "Requests finished per second.")?;
    Ok(page)
}

/// Runs `rbgctl bench serving` and prints its result.
pub fn run(a: ServingArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.dataset_name == "random" || a.dataset_name == "random-ids",
        "--dataset-name {:?}: only random (and random-ids) are supported; the others need dataset files and the model's tokenizer",
        a.dataset_name
    );
    anyhow::ensure!(a.num_prompts > 0, "--num-prompts must be positive");
    anyhow::ensure!(
        (0.0..=1.0).contains(&a.random_range_ratio),
        "--random-range-ratio must be in [0, 1]"
    );
    anyhow::ensure!(
        a.request_rate > 0.0,
        "--request-rate must be positive (or inf)"
    );
    let api = api_of(&a.backend)?;
    let base = a
        .base_url
        .clone()
        .unwrap_or_else(|| format!("http://{}:{}", a.host, a.port));
    let url = format!("{base}{}", api.path());
    let data = dataset(&a);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(async {
        let http = reqwest::Client::new();
        let timeout = Duration::from_secs(600);
        let body = |ids: &[u32], out: usize| {
            let msgs = [json!({"role": "user", "content": crate::simulated_tokens::decode(ids)})];
            llm::payload(api, &a.model, ids, &msgs, out, "", true)
        };
        if a.flush_cache {
            let _ = http.post(format!("{base}/flush_cache")).send().await;
        }
        for (ids, out) in data.iter().take(a.warmup_requests) {
            let o = llm::send(&http, &url, api, &body(ids, (*out).min(16)), timeout).await;
            anyhow::ensure!(o.ok, "warm-up request failed: {}", o.error);
        }
        let limit = Arc::new(tokio::sync::Semaphore::new(
            a.max_concurrency.unwrap_or(usize::MAX >> 4).max(1),
        ));
        let mut arrivals = Arrivals::new(a.request_rate, Distribution::Poisson, a.seed);
        let bar = std::sync::Arc::new(crate::bench::kit::progress::Progress::new(
            "serving requests",
            data.len() as u64,
            a.json,
        ));
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(data.len());
        let stop = crate::shutdown::Shutdown::on_signals()?;
        for (ids, out) in &data {
            let permit = tokio::select! {
                p = limit.clone().acquire_owned() => p?,
                _ = stop.wait() => break,
            };
            let (http, url, b, n, bar) = (
                http.clone(),
                url.clone(),
                body(ids, *out),
                ids.len(),
                bar.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let o = llm::send(&http, &url, api, &b, timeout).await;
                drop(permit);
                bar.inc(1);
                (n, o, start.elapsed().as_secs_f64())
            }));
            let gap = arrivals.next_gap();
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
        }
        let mut done = Vec::with_capacity(tasks.len());
        let mut finished_at = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok((n, o, at)) = t.await {
                done.push((n, o));
                finished_at.push(at);
            }
        }
        bar.finish();
        let r = result(&a, &done, start.elapsed().as_secs_f64());
        Ok::<_, anyhow::Error>((r, done, finished_at))
    })?;
    let (r, done, finished_at) = r;
    if let Some(f) = &a.output_file {
        super::multiturn::append_log(f, &json!(r))?;
    }
    let figures = Figures {
        result: &r,
        args: &a,
        done: &done,
        finished_at: &finished_at,
    };
    figures.publish(a.json, a.report.as_deref())
}

/// What `bench serving` reports: its result (the JSON), with the requests it is made of for
/// the page's curves.
#[derive(Serialize)]
#[serde(transparent)]
struct Figures<'a> {
    result: &'a ServingResult,
    #[serde(skip)]
    args: &'a ServingArgs,
    /// Each finished request, and when it finished (seconds into the run).
    #[serde(skip)]
    done: &'a [(usize, Outcome)],
    #[serde(skip)]
    finished_at: &'a [f64],
}

impl BenchReport for Figures<'_> {
    fn table(&self) -> String {
        render(self.result)
    }

    fn page(&self) -> anyhow::Result<crate::report::Page> {
        page(self.args, self.result, self.done, self.finished_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ServingArgs,
    }

    fn args(extra: &[&str]) -> ServingArgs {
        Cli::parse_from(std::iter::once("x").chain(extra.iter().copied())).a
    }

    #[test]
    fn the_random_dataset_has_bench_servings_lengths() {
        let a = args(&[
            "--num-prompts",
            "500",
            "--random-input-len",
            "100",
            "--random-output-len",
            "10",
        ]);
        let d = dataset(&a);
        assert_eq!(d.len(), 500);
        assert!(d
            .iter()
            .all(|(p, o)| (1..=100).contains(&p.len()) && (1..=10).contains(o)));
        assert!(
            d.iter().any(|(p, _)| p.len() < 50),
            "ratio 0: uniform in [1, L]"
        );
        let fixed = dataset(&args(&[
            "--num-prompts",
            "5",
            "--random-input-len",
            "64",
            "--random-range-ratio",
            "1",
        ]));
        assert!(fixed.iter().all(|(p, _)| p.len() == 64));
        assert_eq!(api_of("vllm-chat").unwrap(), ApiFormat::Openai);
        assert!(api_of("trt").is_err());
    }

    #[test]
    fn results_add_up() {
        let a = args(&[]);
        let o = |ttft: f64, lat: f64, n: usize, cached: usize| Outcome {
            ok: true,
            ttft,
            latency: lat,
            generated_len: n,
            itl: vec![(lat - ttft) / (n - 1) as f64; n - 1],
            prompt_tokens: 100,
            cached_tokens: cached,
            ..Outcome::default()
        };
        let done = vec![
            (100, o(0.1, 1.1, 11, 50)),
            (100, o(0.3, 0.5, 3, 0)),
            (100, Outcome::default()),
        ];
        let r = result(&a, &done, 2.0);
        assert_eq!((r.completed, r.failed), (2, 1));
        assert_eq!((r.total_input_tokens, r.total_output_tokens), (200, 14));
        assert!((r.request_throughput - 1.0).abs() < 1e-9);
        assert!((r.mean_ttft_ms - 200.0).abs() < 1e-6);
        assert!(
            (r.mean_tpot_ms - 100.0).abs() < 1e-6,
            "(1.0/10 + 0.2/2) / 2"
        );
        assert!((r.concurrency - 0.8).abs() < 1e-9);
        assert!((r.cache_hit_rate - 0.25).abs() < 1e-12);
        let text = render(&r);
        assert!(text.starts_with("============ Serving Benchmark Result ============"));
        assert!(text.contains("\n---------------Time to First Token----------------"));
        assert!(text.contains("\n-----Time per Output Token (excl. 1st token)------"));
        assert!(text.contains(&format!("\n{:<40}{:>12}\n", "Mean TTFT (ms):", "200.00")));
        assert!(text.ends_with("\n==================================================\n"));
    }
}
