//! `rbgctl bench multiturn`: a Rust counterpart of SGLang's
//! `benchmark/hicache/bench_multiturn.py`. Clients hold conversations; each round resends the
//! whole history plus a new question, so a server with a good prefix cache serves most of the
//! prompt from cache. It measures TTFT, inter-token latency, latency, throughputs and the cache
//! hit rate (cached over prompt tokens), overall and per round, and appends one JSON line per
//! request rate to a log file in the original's shape.

pub mod oracle;
pub mod report;
pub mod summary;
pub mod workload;

use super::kit::llm::{self, ApiFormat, Outcome};
use crate::bench::kit::report::BenchReport;
use crate::shutdown::Shutdown;
use clap::Args;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use summary::Record;
use workload::{Arrivals, Distribution, QueuePolicy, ReadyQueue, Shape};

/// The original's sweep when auto-run is on.
const SWEEP: [f64; 13] = [
    16.0, 14.0, 12.0, 10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0,
];

/// `rbgctl bench multiturn`'s arguments, as SGLang's `bench_multiturn.py` names them.
#[derive(Debug, Clone, Args)]
pub struct MultiturnArgs {
    /// Concurrent clients (conversations).
    #[arg(long, default_value_t = 256)]
    pub num_clients: usize,
    /// Most requests in flight.
    #[arg(long, default_value_t = 128)]
    pub max_parallel: usize,
    /// Tokens of each client's first prompt.
    #[arg(long, default_value_t = 512)]
    pub request_length: usize,
    /// Tokens appended per later round (0 = --request-length).
    #[arg(long, default_value_t = 0)]
    pub sub_question_input_length: usize,
    /// New tokens per turn (ignore_eos).
    #[arg(long, default_value_t = 64)]
    pub output_length: usize,
    /// Rounds per client.
    #[arg(long, default_value_t = 5)]
    pub num_rounds: usize,
    /// A skewed workload: this many clients (the first ones) open with a prompt of
    /// --long-request-length tokens instead, all starting with the same
    /// --long-shared-prefix tokens (a shared document). Default 0: none.
    #[arg(long, default_value_t = 0)]
    pub long_clients: usize,
    /// Tokens of a long client's first prompt.
    #[arg(long, default_value_t = 16384)]
    pub long_request_length: usize,
    /// Tokens at the head of every long client's first prompt that are the same for all.
    #[arg(long, default_value_t = 12288)]
    pub long_shared_prefix: usize,
    /// Per-client rounds drawn in [min, max] (0 = --num-rounds).
    #[arg(long, default_value_t = 0)]
    pub min_rounds: usize,
    /// Upper end of the per-client rounds range (0 = --num-rounds).
    #[arg(long, default_value_t = 0)]
    pub max_rounds: usize,
    /// Length variation of prompts and outputs (1.0 = fixed).
    #[arg(long, default_value_t = 1.0)]
    pub range_ratio: f64,
    /// Inter-arrival distribution of the sender.
    #[arg(long, value_enum, default_value_t = Distribution::Poisson)]
    pub distribution: Distribution,
    /// Requests per second of the sender (with --disable-auto-run; else a sweep 16..1).
    #[arg(long, default_value_t = 1.0)]
    pub request_rate: f64,
    /// Run only --request-rate instead of the sweep 16,14,12,10,9..1.
    #[arg(long)]
    pub disable_auto_run: bool,
    /// Order in which ready requests are sent.
    #[arg(long, value_enum, default_value_t = QueuePolicy::Random)]
    pub ready_queue_policy: QueuePolicy,
    /// Release round i only when every round i-1 reply has arrived.
    #[arg(long)]
    pub enable_round_barrier: bool,
    /// Pause at each barrier, seconds (the original sleeps 10).
    #[arg(long, default_value_t = 10.0)]
    pub round_barrier_pause: f64,
    /// POST the flush URL at each barrier (needs --enable-round-barrier).
    #[arg(long)]
    pub flush_between_rounds: bool,
    /// Flush endpoint (default http://HOST:PORT/flush_cache; PD: the prefill server).
    #[arg(long, default_value = "")]
    pub flush_url: String,
    /// Synthetic ids (offset + i + j) % vocab instead of random ones.
    #[arg(long)]
    pub disable_random_sample: bool,
    /// ShareGPT sampling needs the model's tokenizer; not supported (prompts are token ids).
    #[arg(long, default_value = "")]
    pub dataset_path: String,
    /// Seed of the workload's random numbers (same seed, same prompts).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tag written into each log line.
    #[arg(long, default_value = "")]
    pub tag: String,
    /// LoRA adapter name put in the payload.
    #[arg(long, default_value = "")]
    pub lora_path: String,
    /// `sglang` (/generate with input_ids) or `openai` (/v1/chat/completions).
    #[arg(long, value_enum, default_value_t = ApiFormat::Sglang)]
    pub api_format: ApiFormat,
    /// Model name for the OpenAI API.
    #[arg(long, default_value = "default")]
    pub model_path: String,
    /// Host of the server under test.
    #[arg(long, default_value = "localhost")]
    pub host: String,
    /// Port of the server under test.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Send the requests to these servers in turn (base URLs, `http://host:port`,
    /// comma-separated), as a load balancer without session affinity spreads them over router
    /// replicas: a conversation's turns land on different replicas. Flushes still go to
    /// --host/--port. Default: every request to --host/--port.
    #[arg(long, value_delimiter = ',')]
    pub spread_over: Vec<String>,
    /// JSONL log to append one summary line to (SGLang's `performance_metrics.jsonl`).
    /// Default: none.
    #[arg(long, default_value = "")]
    pub log_file: String,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with charts (TTFT CDF, TTFT and hit rate per round,
    /// throughput over time) to this file: self-contained, opens offline.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Makes this run's prompts its own, so that a server (or a KV pool) that kept an earlier
    /// run's pages does not serve round 0 from cache: `auto` (a random salt per run), `none`
    /// (the same prompts every run, for a warm-cache measurement), or a number.
    #[arg(long, default_value = "auto")]
    pub salt: Salt,
    /// Pages of this many tokens: the run also works out what an oracle router could have
    /// served from cache (`oracle`). Set by the benchmarks that start their own engines.
    #[arg(skip)]
    pub oracle_page_size: Option<usize>,
}

/// `--salt`: what makes a run's prompts differ from another run's with the same seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Salt {
    Auto,
    None,
    Fixed(u32),
}

impl std::str::FromStr for Salt {
    type Err = String;
    fn from_str(s: &str) -> Result<Salt, String> {
        match s {
            "auto" => Ok(Salt::Auto),
            "none" => Ok(Salt::None),
            n => n
                .parse()
                .map(Salt::Fixed)
                .map_err(|_| format!("expected auto, none or a number, got {n:?}")),
        }
    }
}

impl Salt {
    /// The salt of this run, if any.
    fn value(self) -> Option<u32> {
        match self {
            Salt::Auto => Some(fastrand::u32(1..)),
            Salt::None => None,
            Salt::Fixed(n) => Some(n),
        }
    }
}

/// Replaces the first token of every conversation with one derived from `salt`: every prompt
/// prefix becomes this run's own, lengths unchanged.
fn salt_prompts(convs: &mut [workload::Conversation], salt: u32) {
    for (i, c) in convs.iter_mut().enumerate() {
        if let Some(t) = c.questions.first_mut().and_then(|q| q.first_mut()) {
            let mixed = salt.wrapping_mul(0x9e37_79b9).wrapping_add(i as u32);
            *t = mixed % crate::simulated_tokens::VOCAB;
        }
    }
}

/// Round 0 hit rate above which the output says the cache was already warm.
const WARM_ROUND0: f64 = 0.10;

impl MultiturnArgs {
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.dataset_path.is_empty(),
            "--dataset-path: sampling ShareGPT needs the model's tokenizer, which rbgctl does not have; prompts are synthetic token ids (random, or --disable-random-sample)"
        );
        anyhow::ensure!(self.num_clients > 0, "--num-clients must be positive");
        anyhow::ensure!(self.max_parallel > 0, "--max-parallel must be positive");
        anyhow::ensure!(self.request_length > 0, "--request-length must be positive");
        anyhow::ensure!(
            self.range_ratio > 0.0 && self.range_ratio <= 1.0,
            "--range-ratio must be in (0, 1]"
        );
        anyhow::ensure!(
            self.request_rate > 0.0,
            "--request-rate must be positive (inf for no pacing)"
        );
        anyhow::ensure!(
            !self.flush_between_rounds || self.enable_round_barrier,
            "--flush-between-rounds needs --enable-round-barrier"
        );
        anyhow::ensure!(
            self.round_barrier_pause >= 0.0 && self.round_barrier_pause.is_finite(),
            "--round-barrier-pause must be a non-negative number of seconds"
        );
        anyhow::ensure!(
            self.long_clients <= self.num_clients,
            "--long-clients ({}) must be at most --num-clients ({})",
            self.long_clients,
            self.num_clients
        );
        anyhow::ensure!(
            self.long_clients == 0 || self.long_shared_prefix <= self.long_request_length,
            "--long-shared-prefix ({}) must be at most --long-request-length ({})",
            self.long_shared_prefix,
            self.long_request_length
        );
        Ok(())
    }

    fn shape(&self) -> Shape {
        Shape {
            num_clients: self.num_clients,
            request_length: self.request_length,
            sub_question_length: self.sub_question_input_length,
            output_length: self.output_length,
            num_rounds: self.num_rounds,
            min_rounds: self.min_rounds,
            max_rounds: self.max_rounds,
            range_ratio: self.range_ratio,
            deterministic_ids: self.disable_random_sample,
            seed: self.seed,
            long_clients: self.long_clients,
            long_request_length: self.long_request_length,
            long_shared_prefix: self.long_shared_prefix,
        }
    }

    /// This workload at its one `--request-rate` against a service's router
    /// (`http://host:port`) alone, its log lines tagged `name` (after `--tag`, if any).
    pub fn against(&self, router: &str, name: &str) -> anyhow::Result<MultiturnArgs> {
        let (host, port) = router
            .strip_prefix("http://")
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(h, p)| Some((h, p.parse().ok()?)))
            .ok_or_else(|| anyhow::anyhow!("the router's address {router} has no host and port"))?;
        let mut w = self.clone();
        w.host = host.to_string();
        w.port = port;
        w.spread_over.clear();
        w.disable_auto_run = true;
        w.tag = if w.tag.is_empty() {
            name.to_string()
        } else {
            format!("{}:{name}", w.tag)
        };
        Ok(w)
    }

    fn base(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }
}

/// One rate's result.
pub struct RateResult {
    pub summary: summary::Summary,
    pub rounds: std::collections::BTreeMap<usize, summary::RoundSummary>,
    pub interrupted: bool,
    pub errors: Vec<String>,
    /// Requests that failed.
    pub failed: usize,
    /// Turns not sent because an earlier turn of their conversation failed.
    pub abandoned: usize,
    /// Every request that succeeded, in the order they finished.
    pub records: Vec<Record>,
}

/// A request sent: its prompt's length, and what the oracle could have served of it.
#[derive(Clone, Copy)]
struct Sent {
    len: usize,
    oracle_cached: usize,
}

/// A client's state between rounds.
struct Chat {
    round: usize,
    ids: Vec<u32>,
    messages: Vec<Value>,
}

/// Runs the workload once at `rate`. Stops early (with what it has) when `stop` fires.
pub async fn run_rate(a: &MultiturnArgs, rate: f64, stop: &Shutdown) -> anyhow::Result<RateResult> {
    run_rate_with(a, rate, stop, &mut |_| {}).await
}

/// `run_rate`, calling `at_barrier(round)` at each round barrier (with
/// `--enable-round-barrier`), after the pause and before `round` is sent: what a benchmark
/// does between rounds (restart a part of the service, read its counters). It may block: it
/// runs where the runtime lets a task block (a multi-threaded runtime).
pub async fn run_rate_with(
    a: &MultiturnArgs,
    rate: f64,
    stop: &Shutdown,
    at_barrier: &mut (dyn FnMut(usize) + Send),
) -> anyhow::Result<RateResult> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(a.max_parallel)
        .build()?;
    let base = a.base();
    let flush_url = if a.flush_url.is_empty() {
        format!("{base}/flush_cache")
    } else {
        a.flush_url.clone()
    };
    // Every rate starts from a cold device cache, as the original's does.
    if let Err(e) = http
        .post(&flush_url)
        .timeout(Duration::from_secs(30))
        .send()
        .await
    {
        tracing::warn!(url = %flush_url, error = %e, "flush failed");
    }
    let mut convs = workload::conversations(&a.shape());
    if let Some(salt) = a.salt.value() {
        salt_prompts(&mut convs, salt);
    }
    let convs = Arc::new(convs);
    let mut total: usize = convs.iter().map(|c| c.rounds()).sum();
    let mut abandoned = 0usize;
    if let Some(bad) = a
        .spread_over
        .iter()
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
    {
        anyhow::bail!("--spread-over {bad}: give each server as a base URL, http://host:port");
    }
    let urls: Vec<String> = match a.spread_over.as_slice() {
        [] => vec![format!("{base}{}", a.api_format.path())],
        many => many
            .iter()
            .map(|u| format!("{}{}", u.trim_end_matches('/'), a.api_format.path()))
            .collect(),
    };
    let mut sent_count = 0usize;
    let timeout = Duration::from_secs_f64(a.request_timeout.max(1.0));
    let mut chats: Vec<Chat> = convs
        .iter()
        .map(|c| Chat {
            round: 0,
            ids: c.questions[0].clone(),
            messages: vec![
                json!({"role": "user", "content": crate::simulated_tokens::decode(&c.questions[0])}),
            ],
        })
        .collect();
    let mut ready = ReadyQueue::new(a.ready_queue_policy, a.seed);
    (0..chats.len()).for_each(|i| ready.push(i));
    let mut held: Vec<usize> = Vec::new();
    let mut arrivals = Arrivals::new(rate, a.distribution, a.seed);
    let mut oracle = a.oracle_page_size.map(oracle::Oracle::new);
    let (tx, mut rx) =
        tokio::sync::mpsc::unbounded_channel::<(usize, usize, Sent, Outcome, Instant)>();
    let bar =
        crate::bench::kit::progress::Progress::new("multiturn requests", total as u64, a.json);
    let start = Instant::now();
    let (mut inflight, mut done, mut failed) = (0usize, 0usize, 0usize);
    let mut records: Vec<Record> = Vec::with_capacity(total);
    let mut errors: Vec<String> = Vec::new();
    let mut next_send = tokio::time::Instant::now();
    let mut interrupted = false;
    while done < total {
        // At a barrier: every request of the round answered, the next round held.
        if a.enable_round_barrier && inflight == 0 && ready.is_empty() && !held.is_empty() {
            bar.set_message("round barrier");
            let hb = llm::payload(
                ApiFormat::Sglang,
                &a.model_path,
                &[1; 100],
                &[],
                100,
                "",
                true,
            );
            let _ = llm::send(
                &http,
                &format!("{base}/generate"),
                ApiFormat::Sglang,
                &hb,
                timeout,
            )
            .await;
            if a.flush_between_rounds {
                let _ = http
                    .post(&flush_url)
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(a.round_barrier_pause)) => {}
                _ = stop.wait() => { interrupted = true; break; }
            }
            let round = chats[held[0]].round;
            tokio::task::block_in_place(|| at_barrier(round));
            held.drain(..).for_each(|i| ready.push(i));
            bar.set_message("");
            next_send = tokio::time::Instant::now();
        }
        let can_send = inflight < a.max_parallel && !ready.is_empty();
        let wake = if can_send {
            next_send
        } else {
            tokio::time::Instant::now() + Duration::from_secs(3600)
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake), if can_send => {
                let Some(i) = ready.pop() else { continue };
                let c = &chats[i];
                let max_new = convs[i].output_lengths[c.round];
                let body = llm::payload(a.api_format, &a.model_path, &c.ids, &c.messages, max_new, &a.lora_path, true);
                let sent = Sent {
                    len: c.ids.len(),
                    oracle_cached: oracle.as_ref().map_or(0, |o| o.best_hit(&c.ids)),
                };
                let url = urls[sent_count % urls.len()].clone();
                sent_count += 1;
                let (http, tx, round) = (http.clone(), tx.clone(), c.round);
                let api = a.api_format;
                tokio::spawn(async move {
                    let o = llm::send(&http, &url, api, &body, timeout).await;
                    let _ = tx.send((i, round, sent, o, Instant::now()));
                });
                inflight += 1;
                next_send = tokio::time::Instant::now() + arrivals.next_gap();
            }
            got = rx.recv() => {
                let Some((i, round, sent, o, at)) = got else { break };
                inflight -= 1;
                done += 1;
                bar.inc(1);
                if o.ok {
                    records.push(Record {
                        round,
                        prompt_len: if o.prompt_tokens > 0 { o.prompt_tokens } else { sent.len },
                        cached_tokens: o.cached_tokens,
                        output_len: o.generated_len,
                        ttft: o.ttft,
                        itl: o.itl.clone(),
                        latency: o.latency,
                        done_at: (at - start).as_secs_f64(),
                        oracle_cached: sent.oracle_cached,
                    });
                    if let Some(oracle) = &mut oracle {
                        // The engine keeps the whole sequence, its answer too.
                        oracle.prefilled(&[chats[i].ids.as_slice(), &o.output_ids].concat());
                    }
                } else {
                    failed += 1;
                    if errors.len() < 5 {
                        errors.push(o.error.clone());
                    }
                    // A failed turn has no answer to build on: its conversation ends here.
                    let left = convs[i].rounds() - (round + 1);
                    abandoned += left;
                    total -= left;
                    bar.set_total(total as u64);
                    continue;
                }
                // The next round: history + answer + the next question.
                let conv = &convs[i];
                let c = &mut chats[i];
                if round + 1 < conv.rounds() {
                    let q = &conv.questions[round + 1];
                    c.round = round + 1;
                    c.ids.extend_from_slice(&o.output_ids);
                    c.ids.extend_from_slice(q);
                    c.messages.push(json!({"role": "assistant", "content": o.output_text}));
                    c.messages.push(json!({"role": "user", "content": crate::simulated_tokens::decode(q)}));
                    if a.enable_round_barrier { held.push(i) } else { ready.push(i) }
                }
            }
            _ = stop.wait() => { interrupted = true; break; }
        }
    }
    bar.finish();
    let s = summary::summarize(&records, failed, rate);
    Ok(RateResult {
        rounds: summary::rounds(&records),
        summary: s,
        interrupted,
        errors,
        failed,
        abandoned,
        records,
    })
}

/// Runs `rbgctl bench multiturn` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(a: MultiturnArgs) -> anyhow::Result<()> {
    a.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let rates: Vec<f64> = if a.disable_auto_run {
            vec![a.request_rate]
        } else {
            SWEEP.to_vec()
        };
        let stop = Shutdown::on_signals()?;
        probe(&a).await?;
        let mut runs: Vec<RateResult> = Vec::new();
        for rate in rates {
            if !a.json {
                eprintln!(
                    "multiturn: {} clients, rate {rate} req/s, {} -> {}",
                    a.num_clients,
                    a.api_format.path(),
                    a.base()
                );
            }
            let r = run_rate(&a, rate, &stop).await?;
            report(&a, &r)?;
            let (interrupted, failed) = (r.interrupted, r.failed > 0);
            runs.push(r);
            if interrupted {
                eprintln!("interrupted: the summary above covers the requests finished so far");
                break;
            }
            if failed {
                break;
            }
        }
        if let Some(path) = &a.report {
            // Each rate's figures are printed above as it ends: the sweep adds its page.
            let engine = engine_kind(&a).await;
            page(&a, &runs, engine.as_deref())?.save(path)?;
        }
        if let Some(r) = runs.iter().find(|r| r.failed > 0) {
            anyhow::bail!(
                "{} request(s) failed (first: {}); {} later turn(s) of their conversations were not \
                 sent; the figures above cover the rest only",
                r.failed,
                r.errors.first().map_or("unknown", String::as_str),
                r.abandoned
            );
        }
        Ok(())
    })
}

/// The HTML report of the rates run, a curve each.
fn page(
    a: &MultiturnArgs,
    runs: &[RateResult],
    engine: Option<&str>,
) -> anyhow::Result<crate::report::Page> {
    let simulated = engine == Some(SIMULATED);
    let title = if simulated {
        "Multi-turn benchmark (SIMULATED engine)"
    } else {
        "Multi-turn benchmark"
    };
    let mut page = crate::report::Page::new(title);
    page.fact("server", format!("{} ({})", a.base(), a.api_format.path()))
        .fact(
            "engine",
            engine.unwrap_or("not told (the server gives no server info)"),
        )
        .fact(
            "workload",
            format!(
                "{} clients, {} rounds, {} prompt tokens then +{} per round, {} output tokens, at most {} in flight",
                a.num_clients,
                a.num_rounds,
                a.request_length,
                if a.sub_question_input_length == 0 { a.request_length } else { a.sub_question_input_length },
                a.output_length,
                a.max_parallel
            ),
        );
    let named: Vec<report::Run<'_>> = runs
        .iter()
        .map(|r| report::Run {
            name: format!("rate {} req/s", r.summary.request_rate),
            result: r,
        })
        .collect();
    page.heading("Summary");
    report::table(&mut page, &named);
    page.heading("Charts");
    report::charts(&mut page, &named)?;
    Ok(page)
}

/// How the report names a SIMULATED engine.
const SIMULATED: &str = "SIMULATED (rbgctl sim-engine: no model, timings from a cost model)";

/// What engine answers behind `a`'s server, as its server info says (through a router, one
/// worker's): SIMULATED, or its model; `None` when it does not say.
async fn engine_kind(a: &MultiturnArgs) -> Option<String> {
    let http = reqwest::Client::new();
    for path in ["/server_info", "/get_server_info"] {
        let Ok(resp) = http
            .get(format!("{}{path}", a.base()))
            .timeout(Duration::from_secs(5))
            .send()
            .await
        else {
            continue;
        };
        let Ok(v) = resp.json::<serde_json::Value>().await else {
            continue;
        };
        if v.get("simulated").and_then(serde_json::Value::as_bool) == Some(true) {
            return Some(SIMULATED.into());
        }
        if let Some(m) = crate::router::background::model_from_server_info(&v) {
            return Some(m);
        }
    }
    None
}

/// Fails fast, naming the address, when nothing answers there (any HTTP answer will do).
async fn probe(a: &MultiturnArgs) -> anyhow::Result<()> {
    let url = format!("{}/health", a.base());
    let answer = reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    if let Err(e) = answer {
        let cause = std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
        anyhow::bail!(
            "nothing answers at {} ({cause}): start the server, or check --host and --port",
            a.base()
        );
    }
    Ok(())
}

/// One rate's figures: its log line (the JSON, one line per rate as SGLang's
/// `bench_multiturn` writes them) and its summary table.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct RateFigures<'a> {
    line: Value,
    #[serde(skip)]
    result: &'a RateResult,
}

impl BenchReport for RateFigures<'_> {
    fn json(&self) -> serde_json::Result<String> {
        Ok(self.line.to_string())
    }

    fn table(&self) -> String {
        rate_table(self.result)
    }
}

/// One rate's summary table.
fn rate_table(r: &RateResult) -> String {
    format!(
        "Multi-turn benchmark (request rate asked: {} req/s{})\n{}",
        r.summary.request_rate,
        if r.interrupted { ", INTERRUPTED" } else { "" },
        summary::render(&r.summary, &r.rounds)
    )
}

fn report(a: &MultiturnArgs, r: &RateResult) -> anyhow::Result<()> {
    let line = summary::log_line(&a.tag, &r.summary, &r.rounds, r.interrupted);
    if !a.log_file.is_empty() {
        append_log(&a.log_file, &line)?;
    }
    RateFigures { line, result: r }.publish(a.json, None)?;
    for e in &r.errors {
        eprintln!("  error: {e}");
    }
    if let Some(r0) = r.rounds.get(&0) {
        if r0.cache_hit_rate > WARM_ROUND0 {
            eprintln!(
                "note: round 0 was already warm ({:.1} % of its prompt tokens came from cache): the \
                 server kept these prompts from an earlier run{}",
                r0.cache_hit_rate * 100.0,
                if a.salt == Salt::None {
                    " (--salt none repeats the prompts; the default --salt auto makes each run's own)"
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}

/// Appends one JSON line to the log file.
pub fn append_log(path: &str, line: &Value) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("--log-file {path}: {e}"))?;
    writeln!(f, "{line}")?;
    Ok(())
}
