//! Requests, failures and latencies per operation of a binary-protocol server (the master's
//! and the stores' RPC ports), counted where requests are served, many times a second on many
//! threads at once.
//!
//! Each operation's figures are split in shards, each on cache lines of its own, and a thread
//! counts in the shard its number picks: threads on different cores do not pass one line back
//! and forth for every request (a shared histogram takes four atomic updates of one line per
//! observation). A scrape adds the shards up. Durations are counted in whole nanoseconds.

use super::metrics::{Family, PromText};
use prometheus::proto;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Upper bounds of the latency buckets, in nanoseconds (10 µs to 1 s); past the last, +Inf.
const BUCKETS_NS: [u64; 12] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    10_000_000,
    50_000_000,
    250_000_000,
    1_000_000_000,
];

/// Shards per operation: threads beyond this many share them, two or more to a shard.
const SHARDS: usize = 16;

/// One shard of an operation's figures: requests by latency bucket (the last for +Inf),
/// failures and the sum of durations.
#[derive(Default)]
#[repr(align(128))]
struct Shard {
    buckets: [AtomicU64; BUCKETS_NS.len() + 1],
    failures: AtomicU64,
    sum_ns: AtomicU64,
}

#[derive(Default)]
struct OpSeries {
    shards: [Shard; SHARDS],
}

/// An operation's figures, the shards added up.
#[derive(Clone, Debug, Default, PartialEq)]
struct Totals {
    buckets: [u64; BUCKETS_NS.len() + 1],
    failures: u64,
    sum_ns: u64,
}

impl Totals {
    fn requests(&self) -> u64 {
        self.buckets.iter().sum()
    }

    fn histogram(&self) -> proto::Histogram {
        let mut h = proto::Histogram::default();
        let mut below = 0;
        let buckets = BUCKETS_NS.iter().zip(&self.buckets).map(|(&bound, &n)| {
            below += n;
            let mut b = proto::Bucket::default();
            b.set_upper_bound(bound as f64 / 1e9);
            b.set_cumulative_count(below);
            b
        });
        h.set_bucket(buckets.collect());
        h.set_sample_count(self.requests());
        h.set_sample_sum(self.sum_ns as f64 / 1e9);
        h
    }
}

impl OpSeries {
    fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for s in &self.shards {
            for (sum, n) in t.buckets.iter_mut().zip(&s.buckets) {
                *sum += n.load(Ordering::Relaxed);
            }
            t.failures += s.failures.load(Ordering::Relaxed);
            t.sum_ns += s.sum_ns.load(Ordering::Relaxed);
        }
        t
    }
}

/// The shard the calling thread counts in: threads take shards in turn as they first count.
fn my_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    MINE.with(|s| *s)
}

/// Request counters and latency histograms per operation code (indexed by the opcode byte),
/// made the first time an operation is seen.
pub struct OpStats {
    ops: Box<[OnceLock<Box<OpSeries>>]>,
    /// Times requests from `start` to `record_since`: the CPU's cycle counter where it is
    /// steady (a few instructions a read), the system clock elsewhere.
    clock: quanta::Clock,
}

/// When a request began, as `OpStats::start` read it.
#[derive(Clone, Copy, Debug)]
pub struct Started(u64);

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            ops: (0..256).map(|_| OnceLock::new()).collect(),
            clock: quanta::Clock::new(),
        }
    }
}

impl OpStats {
    fn series(&self, opcode: u8) -> &OpSeries {
        self.ops[opcode as usize].get_or_init(Box::default)
    }

    /// A request begins (to be recorded with `record_since`).
    pub fn start(&self) -> Started {
        Started(self.clock.raw())
    }

    /// Records a request that began at `started` and ends now.
    pub fn record_since(&self, opcode: u8, ok: bool, started: Started) {
        let ns = self.clock.delta_as_nanos(started.0, self.clock.raw());
        self.record_ns(opcode, ok, ns);
    }

    /// Counts a call of `opcode`, whether it succeeded and how long it took.
    pub fn record(&self, opcode: u8, ok: bool, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.record_ns(opcode, ok, ns);
    }

    fn record_ns(&self, opcode: u8, ok: bool, ns: u64) {
        let shard = &self.series(opcode).shards[my_shard()];
        let bucket = BUCKETS_NS.partition_point(|&bound| bound < ns);
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        shard.sum_ns.fetch_add(ns, Ordering::Relaxed);
        if !ok {
            shard.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs one request's handler (`Ok(true)`: it succeeded) and records it under `opcode`.
    pub fn timed<E>(&self, opcode: u8, handle: impl FnOnce() -> Result<bool, E>) -> Result<(), E> {
        let started = self.start();
        let result = handle();
        self.record_since(opcode, matches!(result, Ok(true)), started);
        result.map(|_| ())
    }

    /// Calls of `opcode` counted.
    pub fn requests(&self, opcode: u8) -> u64 {
        self.ops[opcode as usize]
            .get()
            .map_or(0, |s| s.totals().requests())
    }

    /// Writes `<prefix>_requests_total`, `<prefix>_failures_total` and
    /// `<prefix>_request_duration_seconds` for every operation seen.
    pub fn render(
        &self,
        prom: &mut PromText,
        prefix: &str,
        name_of: impl Fn(u8) -> Option<&'static str>,
    ) {
        let seen: Vec<(&'static str, Totals)> = (0..=255u8)
            .filter_map(|op| Some((name_of(op)?, self.ops[op as usize].get()?.totals())))
            .filter(|(_, t)| t.requests() > 0)
            .collect();
        let (req, fail, hist) = (
            format!("{prefix}_requests_total"),
            format!("{prefix}_failures_total"),
            format!("{prefix}_request_duration_seconds"),
        );
        let req = Family::counter(&req, "Requests handled, by operation.");
        let fail = Family::counter(&fail, "Requests answered with an error, by operation.");
        let hist = Family::histogram(&hist, "Time to handle a request, by operation.");
        prom.family(&req);
        for (name, t) in &seen {
            prom.sample(&req, &[("op", name)], t.requests() as f64);
        }
        prom.family(&fail);
        for (name, t) in &seen {
            prom.sample(&fail, &[("op", name)], t.failures as f64);
        }
        for (name, t) in &seen {
            prom.histogram_counts(&hist, &[("op", name)], t.histogram());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_count_in_shards_of_their_own_and_a_scrape_adds_them_up() {
        let stats = OpStats::default();
        let threads = SHARDS + 3;
        std::thread::scope(|s| {
            for i in 0..threads {
                let stats = &stats;
                s.spawn(move || {
                    for _ in 0..100 {
                        stats.record(5, i % 2 == 0, Duration::from_micros(20));
                    }
                    stats.record(5, true, Duration::from_secs(2));
                });
            }
        });
        assert_eq!(stats.requests(5), threads as u64 * 101);
        assert_eq!(stats.requests(6), 0);
        let t = stats.series(5).totals();
        assert_eq!(t.failures, (threads / 2) as u64 * 100);
        // 20 µs is within (10 µs, 25 µs]; 2 s past the last bound.
        assert_eq!(t.buckets[1], threads as u64 * 100);
        assert_eq!(t.buckets[BUCKETS_NS.len()], threads as u64);
        assert_eq!(t.sum_ns, threads as u64 * (100 * 20_000 + 2_000_000_000));
        let used = stats.series(5).shards.iter();
        let used = used
            .filter(|s| s.sum_ns.load(Ordering::Relaxed) > 0)
            .count();
        assert!(used > 1, "the threads counted in {used} shard(s)");
    }

    #[test]
    fn a_request_is_timed_from_start_to_record() {
        let stats = OpStats::default();
        let started = stats.start();
        std::thread::sleep(Duration::from_millis(3));
        stats.record_since(4, true, started);
        let t = stats.series(4).totals();
        // 3 ms or more: in (2.5 ms, 10 ms] unless the machine stalled for longer.
        assert!(t.sum_ns >= 3_000_000, "{t:?}");
        assert_eq!(t.requests(), 1);
    }

    #[test]
    fn a_bound_itself_falls_in_its_bucket() {
        let stats = OpStats::default();
        stats.record(1, true, Duration::from_micros(10));
        stats.record(1, true, Duration::from_nanos(10_001));
        let t = stats.series(1).totals();
        assert_eq!((t.buckets[0], t.buckets[1]), (1, 1));
        let mut p = PromText::new();
        stats.render(&mut p, "x", |_| Some("op"));
        let text = p.finish();
        for line in [
            "x_request_duration_seconds_bucket{op=\"op\",le=\"0.00001\"} 1\n",
            "x_request_duration_seconds_bucket{op=\"op\",le=\"0.000025\"} 2\n",
            "x_request_duration_seconds_bucket{op=\"op\",le=\"+Inf\"} 2\n",
            "x_request_duration_seconds_count{op=\"op\"} 2\n",
            "x_requests_total{op=\"op\"} 2\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
    }
}
