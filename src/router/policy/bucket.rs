//! sglang-router's `bucket` policy, meant for prefill workers: requests are sorted by length
//! into as many buckets as there are workers, so that long prompts queue behind long ones and
//! short behind short. The bucket boundaries follow the lengths seen in the last window (every
//! `--bucket-adjust-interval-secs`, each bucket gets an equal share of the window's characters);
//! when the characters sent to the workers in the window are imbalanced beyond the balance
//! thresholds, the least loaded worker is chosen instead.
//!
//! Pure state: the caller passes the time, so every rule is tested without a clock.

use super::{Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `bucket` policy: [`Buckets`] behind a lock, balanced by the cache-aware thresholds.
pub struct Bucket {
    buckets: Mutex<Buckets>,
    balance: Balance,
}

impl Bucket {
    /// Boundaries adjusted every `interval` (also the window they follow).
    pub fn new(interval: Duration, balance: Balance) -> Bucket {
        Bucket {
            buckets: Mutex::new(Buckets::new(interval)),
            balance,
        }
    }
}

impl LoadBalancingPolicy for Bucket {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Bucket
    }

    fn select(&self, workers: &[Candidate], request: &RouteInput, now: Instant) -> Option<usize> {
        let chars = request.text.chars().count();
        Some(
            self.buckets
                .lock()
                .select(workers, chars, self.balance, now),
        )
    }
}

/// Before any request was seen, `n` workers split this many characters evenly (as
/// sglang-router starts).
const INITIAL_SPAN: usize = 4096;

/// A request sent within the window.
struct Sent {
    at: Instant,
    chars: usize,
    url: Arc<str>,
}

/// The `bucket` policy: requests sorted by length into one bucket per worker.
pub struct Buckets {
    window: Duration,
    recent: VecDeque<Sent>,
    /// Characters sent to each worker within the window.
    load: HashMap<Arc<str>, usize>,
    /// Lower bounds (in characters) of buckets 1..n; bucket `i` goes to the `i`-th candidate.
    bounds: Vec<usize>,
    adjusted: Option<Instant>,
}

/// When loads count as imbalanced (sglang-router's two thresholds, in characters here).
#[derive(Clone, Copy, Debug)]
pub struct Balance {
    pub abs: usize,
    pub rel: f64,
}

impl Buckets {
    /// Empty buckets over a `window` of load.
    pub fn new(window: Duration) -> Buckets {
        Buckets {
            window,
            recent: VecDeque::new(),
            load: HashMap::new(),
            bounds: Vec::new(),
            adjusted: None,
        }
    }

    /// Chooses among `c` (not empty) for a request of `chars` characters, and records it.
    pub fn select(
        &mut self,
        c: &[Candidate],
        chars: usize,
        balance: Balance,
        now: Instant,
    ) -> usize {
        self.expire(now);
        let due = self
            .adjusted
            .is_none_or(|t| now.saturating_duration_since(t) >= self.window);
        if due || self.bounds.len() + 1 != c.len() {
            self.adjust(c.len());
            self.adjusted = Some(now);
        }
        let loads: Vec<usize> = c
            .iter()
            .map(|x| self.load.get(&x.url).copied().unwrap_or(0))
            .collect();
        let min = loads.iter().copied().min().unwrap_or(0);
        let max = loads.iter().copied().max().unwrap_or(0);
        let imbalanced = max - min > balance.abs && (max as f64) > (min as f64) * balance.rel;
        let i = if imbalanced {
            (0..c.len()).min_by_key(|&i| (loads[i], i)).unwrap_or(0)
        } else {
            self.bucket_of(chars).min(c.len().saturating_sub(1))
        };
        if let Some(w) = c.get(i) {
            *self.load.entry(w.url.clone()).or_default() += chars;
            self.recent.push_back(Sent {
                at: now,
                chars,
                url: w.url.clone(),
            });
        }
        i
    }

    /// The bucket a request of `chars` characters falls in.
    pub fn bucket_of(&self, chars: usize) -> usize {
        self.bounds.partition_point(|&b| b <= chars)
    }

    /// Lower bounds of buckets 1..n.
    pub fn bounds(&self) -> &[usize] {
        &self.bounds
    }

    /// Forgets requests older than the window.
    fn expire(&mut self, now: Instant) {
        while let Some(s) = self.recent.front() {
            if now.saturating_duration_since(s.at) <= self.window {
                break;
            }
            if let Some(l) = self.load.get_mut(&s.url) {
                *l = l.saturating_sub(s.chars);
                if *l == 0 {
                    self.load.remove(&s.url);
                }
            }
            self.recent.pop_front();
        }
    }

    /// Splits the window's request lengths into `n` buckets of equal total characters; with no
    /// requests in the window, `n` equal spans of [`INITIAL_SPAN`].
    fn adjust(&mut self, n: usize) {
        self.bounds.clear();
        if n < 2 {
            return;
        }
        let mut lengths: Vec<usize> = self.recent.iter().map(|s| s.chars).collect();
        let total: usize = lengths.iter().sum();
        if total == 0 {
            self.bounds.extend((1..n).map(|k| k * INITIAL_SPAN / n));
            return;
        }
        lengths.sort_unstable();
        let mut cumulative = 0usize;
        let mut next = lengths.iter().map(move |&l| {
            cumulative += l;
            (cumulative, l)
        });
        for k in 1..n {
            let target = total * k / n;
            // The first length at which the running total reaches k/n of the whole starts
            // bucket k (it and all longer requests go above).
            let start = next
                .by_ref()
                .find(|&(cum, _)| cum >= target)
                .map_or(usize::MAX, |(_, l)| l);
            let floor = self.bounds.last().map_or(1, |b| b.saturating_add(1));
            self.bounds.push(start.max(floor));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                url: format!("http://p{i}:1").into(),
                load: 0,
                processed: 0,
                vouched: true,
                queued_prefill: 0,
            })
            .collect()
    }

    /// Thresholds so high that imbalance never decides: the buckets alone choose.
    const BUCKETS_ONLY: Balance = Balance {
        abs: usize::MAX,
        rel: f64::MAX,
    };

    #[test]
    fn lengths_split_evenly_before_any_traffic_then_follow_the_window() {
        let t0 = Instant::now();
        let c = cands(2);
        let mut b = Buckets::new(Duration::from_secs(5));
        // No history: 0..2048 to p0, 2048.. to p1.
        assert_eq!(b.select(&c, 100, BUCKETS_ONLY, t0), 0);
        assert_eq!(b.bounds(), [2048]);
        assert_eq!(b.select(&c, 3000, BUCKETS_ONLY, t0), 1);
        // A window of short requests (100 chars) and a few long ones (10 000).
        for _ in 0..100 {
            b.select(&c, 100, BUCKETS_ONLY, t0);
        }
        for _ in 0..2 {
            b.select(&c, 10_000, BUCKETS_ONLY, t0);
        }
        // Adjusted at the next interval: half the characters are in the long requests, so
        // the boundary moves up to them: a 3000-char request is now a short one.
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(b.select(&c, 3000, BUCKETS_ONLY, t1), 0);
        assert_eq!(b.bounds(), [10_000]);
        assert_eq!(b.select(&c, 10_000, BUCKETS_ONLY, t1), 1);
    }

    #[test]
    fn imbalance_sends_to_the_least_loaded_and_old_requests_expire() {
        let t0 = Instant::now();
        let c = cands(2);
        let balance = Balance {
            abs: 32,
            rel: 1.0001,
        };
        let mut b = Buckets::new(Duration::from_secs(5));
        // Both short: the first goes to bucket 0; the second would too, but p0 now carries 100
        // characters more than p1: imbalanced, so p1.
        assert_eq!(b.select(&c, 100, balance, t0), 0);
        assert_eq!(b.select(&c, 100, balance, t0), 1);
        // Once the window passed, the loads are forgotten and the bucket decides again.
        let later = t0 + Duration::from_secs(6);
        assert_eq!(b.select(&c, 100, balance, later), 0);
    }

    #[test]
    fn bounds_stay_increasing_and_a_changed_worker_count_rebuckets() {
        let t0 = Instant::now();
        let mut b = Buckets::new(Duration::from_secs(5));
        for _ in 0..10 {
            b.select(&cands(3), 50, BUCKETS_ONLY, t0);
        }
        // All lengths equal: bounds must still increase strictly.
        b.adjust(3);
        assert!(
            b.bounds().windows(2).all(|w| w[0] < w[1]),
            "{:?}",
            b.bounds()
        );
        // A fourth worker: four buckets at once, without waiting for the interval.
        b.select(&cands(4), 50, BUCKETS_ONLY, t0);
        assert_eq!(b.bounds().len(), 3);
        // One worker: everything goes to it.
        assert_eq!(b.select(&cands(1), 9_999, BUCKETS_ONLY, t0), 0);
    }
}
