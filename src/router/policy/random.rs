//! `random`: any candidate.

use super::{Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use std::time::Instant;

/// The `random` policy.
pub struct Random;

impl LoadBalancingPolicy for Random {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    fn select(&self, workers: &[Candidate], _: &RouteInput, _: Instant) -> Option<usize> {
        Some(fastrand::usize(..workers.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn random_reaches_every_worker() {
        let c = cands(&[0, 0, 0]);
        let mut seen = [0; 3];
        for _ in 0..300 {
            seen[Random.select(&c, &text(""), Instant::now()).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    }
}
