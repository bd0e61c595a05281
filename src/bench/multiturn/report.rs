//! The multi-turn benchmark's report page: TTFT CDF, mean TTFT and cache hit rate per round,
//! throughput over time, one curve per request rate, and the summary table.

use super::summary::Record;
use super::RateResult;
use crate::report::{Format, LineChart, Page, ReportError, Series};

/// One rate's run as the page draws it.
pub struct Run<'a> {
    pub name: String,
    pub result: &'a RateResult,
}

/// Adds the charts of `runs` (each a curve) to `page`.
pub fn charts(page: &mut Page, runs: &[Run<'_>]) -> Result<(), ReportError> {
    // Milliseconds, as the table gives them.
    let records =
        |r: &Run<'_>| -> Vec<f64> { r.result.records.iter().map(|x| x.ttft * 1e3).collect() };
    let mut cdf = LineChart::new(
        "ttft-cdf",
        "Time to first token: CDF",
        "TTFT (ms)",
        "share of requests",
    )
    .formats(Format::Number, Format::Percent);
    let mut ttft = LineChart::new(
        "ttft-per-round",
        "Mean TTFT per round",
        "round",
        "mean TTFT (ms)",
    )
    .formats(Format::Integer, Format::Number);
    let mut hits = LineChart::new(
        "hit-rate-per-round",
        "Cache hit rate per round (cached / prompt tokens)",
        "round",
        "hit rate",
    )
    .formats(Format::Integer, Format::Percent);
    let mut tput = LineChart::new(
        "throughput-over-time",
        "Throughput over time (requests finished)",
        "time since start (s)",
        "requests/s",
    );
    let mut tokens = LineChart::new(
        "input-tokens-over-time",
        "Input-token throughput over time (prompt tokens of requests finished)",
        "time since start (s)",
        "input tokens/s",
    );
    for r in runs {
        cdf = cdf.series(Series::cdf(&r.name, &records(r)));
        let rounds = &r.result.rounds;
        ttft = ttft.series(Series::new(
            &r.name,
            rounds
                .iter()
                .map(|(k, v)| (*k as f64, v.average_ttft * 1e3))
                .collect(),
        ));
        hits = hits.series(Series::new(
            &r.name,
            rounds
                .iter()
                .map(|(k, v)| (*k as f64, v.cache_hit_rate))
                .collect(),
        ));
        let done = |f: fn(&Record) -> f64| -> Vec<(f64, f64)> {
            r.result.records.iter().map(|x| (x.done_at, f(x))).collect()
        };
        tput = tput.series(Series::per_second(&r.name, &done(|_| 1.0)));
        tokens = tokens.series(Series::per_second(&r.name, &done(|x| x.prompt_len as f64)));
    }
    page.line_chart(&cdf, "Share of requests whose first token came within the time on the x axis; further left is better.")?;
    page.line_chart(
        &ttft,
        "Each round resends the conversation so far: with a prefix cache, later rounds reuse more.",
    )?;
    page.line_chart(
        &hits,
        "Prompt tokens served from cache over prompt tokens sent, per round.",
    )?;
    page.line_chart(
        &tput,
        "Requests finished per second, in buckets of a sixtieth of the run (at least 0.5 s).",
    )?;
    page.line_chart(
        &tokens,
        "Prompt tokens of the requests finished per second.",
    )?;
    Ok(())
}

/// The summary table, a row per run.
pub fn table(page: &mut Page, runs: &[Run<'_>]) {
    let ms = |s: f64| format!("{:.1}", s * 1e3);
    let rows = runs
        .iter()
        .map(|r| {
            let s = &r.result.summary;
            vec![
                r.name.clone(),
                s.total_requests.to_string(),
                r.result.failed.to_string(),
                format!("{:.2}%", s.cache_hit_rate * 100.0),
                ms(s.average_ttft),
                ms(s.median_ttft),
                ms(s.p90_ttft),
                ms(s.p99_ttft),
                ms(s.average_itl),
                format!("{:.1}", s.input_token_throughput),
                format!("{:.1}", s.output_token_throughput),
                format!("{:.2}", s.throughput),
                format!("{:.2}", s.duration),
            ]
        })
        .collect();
    page.table(
        &[
            "run",
            "requests",
            "failed",
            "hit rate",
            "TTFT avg ms",
            "TTFT p50 ms",
            "TTFT p90 ms",
            "TTFT p99 ms",
            "ITL avg ms",
            "input tok/s",
            "output tok/s",
            "req/s",
            "duration s",
        ],
        rows,
    );
}
