//! A token bucket (pure: it takes `now`): up to `burst` at once, then `qps` per second. The
//! operator's API write throttle and the router's request rate limit both use it.

use std::time::{Duration, Instant};

/// Tokens and the time they were counted.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket; `qps` 0 (or less) means no limit.
    pub fn new(qps: f64, burst: f64, now: Instant) -> Bucket {
        let burst = burst.max(1.0);
        Bucket {
            qps,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token: `None` when one was there, else how long until one will be.
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        self.take_n(1.0, now)
    }

    /// Takes `n` tokens (at most a full bucket's: a request larger than the burst goes when
    /// the bucket is full): `None` when they were there, else how long until they will be.
    pub fn take_n(&mut self, n: f64, now: Instant) -> Option<Duration> {
        if self.qps <= 0.0 {
            return None;
        }
        self.refill(now);
        let n = n.min(self.burst);
        if self.tokens >= n {
            self.tokens -= n;
            None
        } else {
            Some(Duration::from_secs_f64((n - self.tokens) / self.qps))
        }
    }

    /// Charges `n` tokens used after the fact (a response's output): the bucket may go into
    /// debt, which later takes wait out. A negative `n` gives tokens back, up to a full bucket.
    pub fn settle(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens - n).min(self.burst);
    }

    /// A new rate and burst, keeping what the bucket holds (up to the new burst).
    pub fn retune(&mut self, qps: f64, burst: f64, now: Instant) {
        self.refill(now);
        self.qps = qps;
        self.burst = burst.max(1.0);
        self.tokens = self.tokens.min(self.burst);
    }

    /// Tokens held now (negative: in debt).
    pub fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = self.at.max(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0, 3.0, t0);
        assert!(
            (0..3).all(|_| b.take(t0).is_none()),
            "the burst goes at once"
        );
        let wait = b.take(t0).expect("then it waits");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert!(b.take(t0 + Duration::from_millis(100)).is_none());
        // Idle time refills up to the burst, not beyond.
        let later = t0 + Duration::from_secs(60);
        assert!((0..3).all(|_| b.take(later).is_none()));
        assert!(b.take(later).is_some());
        let mut unlimited = Bucket::new(0.0, 1.0, t0);
        assert!((0..1000).all(|_| unlimited.take(t0).is_none()));
    }

    #[test]
    fn many_at_once_debts_and_a_new_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(100.0, 50.0, t0);
        assert!(b.take_n(30.0, t0).is_none());
        let wait = b.take_n(30.0, t0).expect("20 left");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // More than the burst goes once the bucket is full.
        assert!(b.take_n(500.0, t0 + Duration::from_secs(1)).is_none());
        // Output settled after the fact: the bucket goes into debt, then waits it out.
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(b.level(t1), 50.0);
        b.settle(150.0, t1);
        assert_eq!(b.level(t1), -100.0);
        let wait = b.take_n(1.0, t1).unwrap();
        assert!((wait.as_secs_f64() - 1.01).abs() < 1e-9, "{wait:?}");
        // Given back, never beyond a full bucket.
        b.settle(-1000.0, t1);
        assert_eq!(b.level(t1), 50.0);
        b.retune(10.0, 5.0, t1);
        assert_eq!(b.level(t1), 5.0);
        assert!(b.take_n(5.0, t1).is_none());
        assert!(b.take_n(1.0, t1).is_some());
    }
}
