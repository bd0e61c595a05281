//! Exponential backoff, one for every retry loop of the house (informers, the router's pod
//! watch and request retries, the operator's work queue, worker discovery, `up`'s restarts, a
//! client following a new leader): the wait grows from `initial` by `growth` (2 unless said)
//! up to `max`, and starts over after a success; the router's retries also move each wait by
//! up to ± a `jitter` fraction of itself.

use std::time::Duration;

/// Exponential backoff: each wait longer, up to a cap, starting over after a success (with
/// jitter where asked).
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    growth: f64,
    jitter: f64,
}

impl Backoff {
    /// A backoff from `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial.min(max),
            growth: 2.0,
            jitter: 0.0,
        }
    }

    /// Each wait `growth` times the one before (at least 1).
    pub fn growing_by(mut self, growth: f64) -> Backoff {
        self.growth = if growth.is_finite() {
            growth.max(1.0)
        } else {
            2.0
        };
        self
    }

    /// Each wait of `nth_jittered` moved by up to ± `jitter` (in [0, 1]) of itself.
    pub fn jittered_by(mut self, jitter: f64) -> Backoff {
        self.jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    fn grown(&self, d: Duration) -> Duration {
        if self.growth == 2.0 {
            return d.saturating_mul(2).min(self.max);
        }
        Duration::from_secs_f64((d.as_secs_f64() * self.growth).min(self.max.as_secs_f64()))
    }

    /// The wait before the next attempt; the one after it `growth` times as long, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.grown(self.next);
        d
    }

    /// After a success: the next wait is `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }

    /// True once the waits have reached `max`.
    pub fn at_max(&self) -> bool {
        self.next >= self.max
    }

    /// The wait before the `n`th retry (1-based) of a fresh backoff, without keeping state.
    pub fn nth(&self, n: u32) -> Duration {
        let steps = n.saturating_sub(1).min(64) as i32;
        if self.growth == 2.0 {
            return self
                .initial
                .saturating_mul(1u32 << steps.min(31))
                .min(self.max);
        }
        let grown = self.initial.as_secs_f64() * self.growth.powi(steps);
        Duration::from_secs_f64(grown.min(self.max.as_secs_f64()))
    }

    /// `nth`, moved by up to ± the jitter of itself: `unit`, in [0, 1), picks where (0 the
    /// shortest, 0.5 none).
    pub fn nth_jittered(&self, n: u32, unit: f64) -> Duration {
        let base = self.nth(n).as_secs_f64();
        Duration::from_secs_f64((base * (1.0 + self.jitter * (2.0 * unit - 1.0))).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_starts_over_after_a_success() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let waits: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(waits, vec![ms(100), ms(200), ms(400), ms(500), ms(500)]);
        assert!(b.at_max());
        b.reset();
        assert_eq!(b.next_delay(), ms(100));
        assert!(!b.at_max());
        assert_eq!(
            (1..=5).map(|n| b.nth(n)).collect::<Vec<_>>(),
            vec![ms(100), ms(200), ms(400), ms(500), ms(500)]
        );
        assert_eq!(b.nth(1000), ms(500), "no overflow far out");
    }

    #[test]
    fn grows_by_any_factor_and_jitters_around_each_wait() {
        let ms = Duration::from_millis;
        let b = Backoff::new(ms(50), ms(100))
            .growing_by(1.5)
            .jittered_by(0.2);
        assert_eq!(b.nth_jittered(1, 0.5), ms(50));
        assert_eq!(b.nth_jittered(2, 0.5), ms(75));
        assert_eq!(b.nth_jittered(6, 0.5), ms(100));
        assert_eq!(b.nth_jittered(1, 0.0), ms(40));
        assert!(b.nth_jittered(1, 0.999_999) < ms(60));
        let mut b = b;
        let waits: Vec<Duration> = (0..4).map(|_| b.next_delay()).collect();
        assert_eq!(waits, vec![ms(50), ms(75), ms(100), ms(100)]);
        // Nonsense settings fall back to sane ones.
        let odd = Backoff::new(ms(10), ms(80))
            .growing_by(f64::NAN)
            .jittered_by(7.0);
        assert_eq!(odd.nth(3), ms(40));
        assert_eq!(odd.nth_jittered(1, 0.0), ms(0));
    }
}
