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
        if self.qps <= 0.0 {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
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
}
