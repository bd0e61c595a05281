//! The multi-turn summary, with `bench_multiturn.py`'s keys: lengths, TTFT, inter-token
//! latency, latency (average, median, p90, p99, max), token and request throughputs and the
//! cache hit rate, overall and per round. Percentiles are `sorted[int(q * n)]` as there.

use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One finished request.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub round: usize,
    pub prompt_len: usize,
    pub cached_tokens: usize,
    pub output_len: usize,
    pub ttft: f64,
    pub itl: Vec<f64>,
    pub latency: f64,
    /// Seconds from the run's start to this request's completion.
    pub done_at: f64,
    /// What an oracle router could have served from cache (`oracle`); 0 where none ran.
    pub oracle_cached: usize,
}

/// Percentiles as SGLang's `bench_multiturn` takes them, so that the figures compare.
pub use crate::bench::kit::stats::percentile_as_sglang as percentile;

/// Average, median, p90, p99 and max.
pub fn stats(mut v: Vec<f64>) -> (f64, f64, f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let avg = if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    };
    (
        avg,
        percentile(&v, 0.5),
        percentile(&v, 0.9),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(0.0),
    )
}

/// The figures of a multi-turn run, as SGLang's `bench_multiturn` prints them.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Summary {
    pub total_requests: usize,
    pub failed_requests: usize,
    pub request_rate: f64,
    pub average_prompt_len: f64,
    pub p90_prompt_len: f64,
    pub p99_prompt_len: f64,
    pub average_output_len: f64,
    pub p90_output_len: f64,
    pub p99_output_len: f64,
    pub average_ttft: f64,
    pub median_ttft: f64,
    pub p90_ttft: f64,
    pub p99_ttft: f64,
    pub max_ttft: f64,
    pub average_itl: f64,
    pub median_itl: f64,
    pub p90_itl: f64,
    pub p99_itl: f64,
    pub max_itl: f64,
    pub average_latency: f64,
    pub median_latency: f64,
    pub p90_latency: f64,
    pub p99_latency: f64,
    pub max_latency: f64,
    pub input_token_throughput: f64,
    pub output_token_throughput: f64,
    pub throughput: f64,
    pub cache_hit_rate: f64,
    pub duration: f64,
}

/// The figures of one round of every conversation.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RoundSummary {
    pub average_ttft: f64,
    pub cache_hit_rate: f64,
    pub request_count: usize,
}

fn hit_rate(records: &[&Record]) -> f64 {
    let prompt: usize = records.iter().map(|r| r.prompt_len).sum();
    let cached: usize = records.iter().map(|r| r.cached_tokens).sum();
    if prompt == 0 {
        0.0
    } else {
        cached as f64 / prompt as f64
    }
}

/// Sums `records` up (and the `failed` requests) for a run offered at `request_rate`.
pub fn summarize(records: &[Record], failed: usize, request_rate: f64) -> Summary {
    let all: Vec<&Record> = records.iter().collect();
    let duration = records.iter().map(|r| r.done_at).fold(0.0, f64::max);
    let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
    let (ap, _, p90p, p99p, _) = stats(records.iter().map(|r| r.prompt_len as f64).collect());
    let (ao, _, p90o, p99o, _) = stats(records.iter().map(|r| r.output_len as f64).collect());
    let (at, mt, p90t, p99t, xt) = stats(records.iter().map(|r| r.ttft).collect());
    let (ai, mi, p90i, p99i, xi) =
        stats(records.iter().flat_map(|r| r.itl.iter().copied()).collect());
    let (al, ml, p90l, p99l, xl) = stats(records.iter().map(|r| r.latency).collect());
    Summary {
        total_requests: records.len(),
        failed_requests: failed,
        request_rate,
        average_prompt_len: ap,
        p90_prompt_len: p90p,
        p99_prompt_len: p99p,
        average_output_len: ao,
        p90_output_len: p90o,
        p99_output_len: p99o,
        average_ttft: at,
        median_ttft: mt,
        p90_ttft: p90t,
        p99_ttft: p99t,
        max_ttft: xt,
        average_itl: ai,
        median_itl: mi,
        p90_itl: p90i,
        p99_itl: p99i,
        max_itl: xi,
        average_latency: al,
        median_latency: ml,
        p90_latency: p90l,
        p99_latency: p99l,
        max_latency: xl,
        input_token_throughput: per_s(records.iter().map(|r| r.prompt_len).sum::<usize>() as f64),
        output_token_throughput: per_s(records.iter().map(|r| r.output_len).sum::<usize>() as f64),
        throughput: per_s(records.len() as f64),
        cache_hit_rate: hit_rate(&all),
        duration,
    }
}

/// The figures of each round, by round number.
pub fn rounds(records: &[Record]) -> BTreeMap<usize, RoundSummary> {
    let mut by: BTreeMap<usize, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by.entry(r.round).or_default().push(r);
    }
    by.into_iter()
        .map(|(k, rs)| {
            let ttft = rs.iter().map(|r| r.ttft).sum::<f64>() / rs.len() as f64;
            (
                k,
                RoundSummary {
                    average_ttft: ttft,
                    cache_hit_rate: hit_rate(&rs),
                    request_count: rs.len(),
                },
            )
        })
        .collect()
}

/// The JSONL line: `{"timestamp", "tag", "summary", "round": {"round_0": ...}}`.
pub fn log_line(
    tag: &str,
    s: &Summary,
    r: &BTreeMap<usize, RoundSummary>,
    interrupted: bool,
) -> Value {
    let rounds: serde_json::Map<String, Value> = r
        .iter()
        .map(|(k, v)| (format!("round_{k}"), json!(v)))
        .collect();
    let mut line = json!({
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, false),
        "tag": tag,
        "summary": s,
        "round": rounds,
    });
    if interrupted {
        line["interrupted"] = json!(true);
    }
    line
}

/// The printed summary.
pub fn render(s: &Summary, r: &BTreeMap<usize, RoundSummary>) -> String {
    let ms = |x: f64| format!("{:.1}", x * 1e3);
    let joined = |xs: &[f64], show: &dyn Fn(f64) -> String| {
        xs.iter().map(|&x| show(x)).collect::<Vec<_>>().join(" / ")
    };
    let tokens = |x: f64| format!("{x:.0}");
    let mut rows: Vec<(String, String)> = vec![
        (
            "requests".into(),
            format!("{} ({} failed)", s.total_requests, s.failed_requests),
        ),
        (
            "request rate asked".into(),
            format!(
                "{:.2} req/s (--request-rate; measured: request throughput)",
                s.request_rate
            ),
        ),
        ("duration".into(), format!("{:.2} s", s.duration)),
        (
            "prompt length avg/p90/p99".into(),
            joined(
                &[s.average_prompt_len, s.p90_prompt_len, s.p99_prompt_len],
                &tokens,
            ),
        ),
        (
            "output length avg/p90/p99".into(),
            joined(
                &[s.average_output_len, s.p90_output_len, s.p99_output_len],
                &tokens,
            ),
        ),
        (
            "TTFT avg/med/p90/p99/max ms".into(),
            joined(
                &[
                    s.average_ttft,
                    s.median_ttft,
                    s.p90_ttft,
                    s.p99_ttft,
                    s.max_ttft,
                ],
                &ms,
            ),
        ),
        (
            "ITL avg/med/p90/p99/max ms".into(),
            joined(
                &[s.average_itl, s.median_itl, s.p90_itl, s.p99_itl, s.max_itl],
                &ms,
            ),
        ),
        (
            "latency avg/med/p90/p99 ms".into(),
            joined(
                &[
                    s.average_latency,
                    s.median_latency,
                    s.p90_latency,
                    s.p99_latency,
                ],
                &ms,
            ),
        ),
        (
            "input token throughput".into(),
            format!("{:.1} tok/s", s.input_token_throughput),
        ),
        (
            "output token throughput".into(),
            format!("{:.1} tok/s", s.output_token_throughput),
        ),
        (
            "request throughput (measured)".into(),
            format!("{:.2} req/s", s.throughput),
        ),
        (
            "cache hit rate".into(),
            format!("{:.2} %", s.cache_hit_rate * 100.0),
        ),
    ];
    rows.extend(r.iter().map(|(k, v)| {
        let round = format!(
            "{} requests, TTFT avg {} ms, hit rate {:.2} %",
            v.request_count,
            ms(v.average_ttft),
            v.cache_hit_rate * 100.0
        );
        (format!("round {k}"), round)
    }));
    rows.iter()
        .map(|(k, v)| format!("  {k:<28} {v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(round: usize, prompt: usize, cached: usize, ttft: f64, done: f64) -> Record {
        Record {
            round,
            prompt_len: prompt,
            cached_tokens: cached,
            output_len: 4,
            ttft,
            itl: vec![0.01, 0.03],
            latency: ttft + 0.04,
            done_at: done,
            oracle_cached: 0,
        }
    }

    #[test]
    fn percentiles_index_like_the_original() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 6.0, "sorted[int(0.5*10)]");
        assert_eq!(percentile(&v, 0.9), 10.0);
        assert_eq!(percentile(&v, 0.99), 10.0);
        assert_eq!(percentile(&v, 1.0), 10.0);
        assert_eq!(percentile::<f64>(&[], 0.5), 0.0);
    }

    #[test]
    fn the_summary_adds_up() {
        let rs = vec![
            rec(0, 100, 0, 0.2, 1.0),
            rec(1, 200, 150, 0.1, 2.0),
            rec(1, 100, 50, 0.3, 4.0),
        ];
        let s = summarize(&rs, 1, 2.0);
        assert_eq!((s.total_requests, s.failed_requests), (3, 1));
        assert_eq!(s.duration, 4.0);
        assert!((s.cache_hit_rate - 200.0 / 400.0).abs() < 1e-12);
        assert!((s.input_token_throughput - 100.0).abs() < 1e-9);
        assert!((s.output_token_throughput - 3.0).abs() < 1e-9);
        assert!((s.throughput - 0.75).abs() < 1e-9);
        assert!((s.average_ttft - 0.2).abs() < 1e-9);
        assert_eq!(s.max_ttft, 0.3);
        assert_eq!(s.max_itl, 0.03);
        let r = rounds(&rs);
        assert_eq!(r[&0].request_count, 1);
        assert_eq!(r[&0].cache_hit_rate, 0.0);
        assert!((r[&1].cache_hit_rate - 200.0 / 300.0).abs() < 1e-12);
        assert!((r[&1].average_ttft - 0.2).abs() < 1e-9);
        let line = log_line("t", &s, &r, false);
        assert_eq!(line["tag"], "t");
        assert_eq!(line["summary"]["total_requests"], 3);
        assert_eq!(line["round"]["round_1"]["request_count"], 2);
        assert!(line.get("interrupted").is_none());
        assert!(render(&s, &r).contains("50.00 %"));
        let empty = summarize(&[], 0, 1.0);
        assert_eq!((empty.throughput, empty.cache_hit_rate), (0.0, 0.0));
    }
}
