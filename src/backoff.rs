//! Exponential backoff, one for every retry loop of the house (informers, the router's pod
//! watch, the operator's work queue, worker discovery): the wait doubles from `initial` up to
//! `max`, and starts over after a success.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The wait before the next attempt; the one after it is twice as long, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
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
        let doublings = n.saturating_sub(1).min(32);
        self.initial
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max)
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
}
