//! `power_of_two`: two random candidates; the one with fewer requests in flight wins.

use super::{Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use std::time::Instant;

/// The `power_of_two` policy: of two random candidates, the less loaded.
pub struct PowerOfTwo;

impl LoadBalancingPolicy for PowerOfTwo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::PowerOfTwo
    }

    fn select(&self, c: &[Candidate], _: &RouteInput, _: Instant) -> Option<usize> {
        if c.len() == 1 {
            return Some(0);
        }
        let a = fastrand::usize(..c.len());
        let mut b = fastrand::usize(..c.len() - 1);
        if b >= a {
            b += 1;
        }
        Some(if c[b].load < c[a].load { b } else { a })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn power_of_two_never_picks_the_busier_of_two() {
        let now = Instant::now();
        // With two workers both are always sampled: the idle one must win every time.
        let c = cands(&[7, 1]);
        for _ in 0..100 {
            assert_eq!(PowerOfTwo.select(&c, &text(""), now), Some(1));
        }
        // With three, the busiest can never win.
        let c = cands(&[9, 2, 3]);
        for _ in 0..200 {
            assert_ne!(PowerOfTwo.select(&c, &text(""), now), Some(0));
        }
        assert_eq!(PowerOfTwo.select(&cands(&[5]), &text(""), now), Some(0));
    }
}
