//! Latency percentiles and throughput arithmetic for the benchmarks.

use std::time::Duration;

/// The nearest-rank percentile of sorted samples, `q` in 0..=1 (0.99 is p99): the smallest
/// sample with at least `q` of the samples at or below it. Zero (the default) for no samples.
pub fn percentile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The percentile as SGLang's benchmarks take it, `sorted[int(q·n)]` (the last sample for
/// q = 1), `q` in 0..=1: used where our figures stand beside theirs. Zero for no samples.
pub fn percentile_as_sglang<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    sorted[((q * sorted.len() as f64) as usize).min(sorted.len() - 1)]
}

/// One measured phase.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PhaseResult {
    pub case: String,
    pub op: String,
    pub value_bytes: u64,
    pub threads: usize,
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Reads of objects the pool had evicted meanwhile (not errors: a cache may evict).
    pub evicted: u64,
    pub seconds: f64,
    pub gb_per_s: f64,
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Share of the relevant machine limit (loopback or memcpy), when one applies.
    pub of_limit: Option<f64>,
    /// Where an operation's time went (`bench store --breakdown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<OpBreakdown>,
    /// The client process's own CPU time per call, all its threads (the Mooncake wheel's
    /// rows): what no server can take off a call's latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cpu_us: Option<f64>,
}

/// Where one item's time went, as the client measured it: means per item (a batch call's
/// figures divided by its items).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct OpBreakdown {
    /// Mean latency.
    pub total_us: f64,
    /// Master round trips, and their time.
    pub master_rpcs: f64,
    pub master_us: f64,
    /// Data-path calls to a store over the network (each a pipelined batch), and their time.
    pub transfers: f64,
    pub transfer_us: f64,
    /// Copies to or from a same-host segment: their time and bytes.
    pub copy_us: f64,
    pub copied_bytes: f64,
    /// CRC-32C computations, and their time.
    pub checksums: f64,
    pub checksum_us: f64,
    /// The rest: the client's own work (planning, encoding, allocation, locks).
    pub other_us: f64,
    /// System calls of the client process (reads and writes, from /proc/self/io), when the
    /// system reports them.
    pub syscalls: Option<f64>,
}

impl OpBreakdown {
    /// `d` over `items` items whose latencies sum to `latency` (one client thread).
    pub fn per_item(
        d: &crate::client::Breakdown,
        items: u64,
        latency: Duration,
        syscalls: Option<u64>,
    ) -> OpBreakdown {
        let n = items.max(1) as f64;
        let us = |ns: u64| ns as f64 / 1e3 / n;
        let total_us = latency.as_secs_f64() * 1e6 / n;
        let (master_us, transfer_us, copy_us, checksum_us) = (
            us(d.master.ns),
            us(d.transfer.ns),
            us(d.copy.ns),
            us(d.checksum.ns),
        );
        OpBreakdown {
            total_us,
            master_rpcs: d.master.calls as f64 / n,
            master_us,
            transfers: d.transfer.calls as f64 / n,
            transfer_us,
            copy_us,
            copied_bytes: d.copied_bytes as f64 / n,
            checksums: d.checksum.calls as f64 / n,
            checksum_us,
            other_us: (total_us - master_us - transfer_us - copy_us - checksum_us).max(0.0),
            syscalls: syscalls.map(|s| s as f64 / n),
        }
    }
}

impl PhaseResult {
    /// A report row from one phase's latencies (each sample `items_per_sample` items), its
    /// errors and its time.
    #[allow(clippy::too_many_arguments)] // one row of the report, field by field
    pub fn from_samples(
        case: &str,
        op: &str,
        value_bytes: u64,
        threads: usize,
        mut latencies: Vec<Duration>,
        items_per_sample: u64,
        errors: u64,
        elapsed: Duration,
    ) -> PhaseResult {
        latencies.sort_unstable();
        let ops = latencies.len() as u64 * items_per_sample;
        let bytes = ops * value_bytes;
        let seconds = elapsed.as_secs_f64().max(1e-9);
        PhaseResult {
            case: case.into(),
            op: op.into(),
            value_bytes,
            threads,
            ops,
            bytes,
            errors,
            evicted: 0,
            seconds,
            gb_per_s: bytes as f64 / seconds / 1e9,
            ops_per_s: ops as f64 / seconds,
            p50_us: percentile(&latencies, 0.5).as_secs_f64() * 1e6,
            p99_us: percentile(&latencies, 0.99).as_secs_f64() * 1e6,
            of_limit: None,
            breakdown: None,
            client_cpu_us: None,
        }
    }
}

/// A plain-text table: the first column left-aligned, the others right-aligned, each as wide
/// as its widest cell (counted in characters), two spaces between.
pub fn text_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let width = |c: usize| {
        rows.iter()
            .filter_map(|r| r.get(c))
            .map(|s| s.chars().count())
            .chain(std::iter::once(headers[c].chars().count()))
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..headers.len()).map(width).collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (c, cell) in cells.enumerate().take(widths.len()) {
            let pad = " ".repeat(widths[c].saturating_sub(cell.chars().count()));
            match c {
                0 => out.push_str(&format!("{cell}{pad}")),
                _ => out.push_str(&format!("  {pad}{cell}")),
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(&mut headers.iter().copied());
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_micros(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_micros(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_micros(100));
        assert_eq!(percentile(&v, 0.0), Duration::from_micros(1));
        assert_eq!(percentile::<Duration>(&[], 0.5), Duration::ZERO);
        let one = [Duration::from_micros(7)];
        assert_eq!(percentile(&one, 0.99), Duration::from_micros(7));
    }

    #[test]
    fn throughput_arithmetic() {
        let lat = vec![Duration::from_micros(10); 1000];
        let r =
            PhaseResult::from_samples("c", "get", 1_000_000, 1, lat, 1, 0, Duration::from_secs(1));
        assert_eq!(r.ops, 1000);
        assert!((r.gb_per_s - 1.0).abs() < 1e-9);
        let r = PhaseResult::from_samples(
            "c",
            "batch_get",
            1000,
            1,
            vec![Duration::from_millis(1); 10],
            32,
            0,
            Duration::from_secs(2),
        );
        assert_eq!(r.ops, 320);
        assert!((r.ops_per_s - 160.0).abs() < 1e-9);
    }

    #[test]
    fn a_text_table_lines_its_columns_up() {
        let t = text_table(
            &["policy", "ms"],
            &[
                vec!["round_robin".into(), "1.5".into()],
                vec!["x".into(), "120.0".into()],
            ],
        );
        assert_eq!(
            t,
            "policy          ms\nround_robin    1.5\nx            120.0\n"
        );
    }
}
