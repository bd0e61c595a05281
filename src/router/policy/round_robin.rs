//! `round_robin`: each candidate in turn.

use super::{Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The `round_robin` policy.
#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl LoadBalancingPolicy for RoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::RoundRobin
    }

    fn select(&self, workers: &[Candidate], _: &RouteInput, _: Instant) -> Option<usize> {
        Some(self.next.fetch_add(1, Ordering::Relaxed) % workers.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn round_robin_cycles() {
        let p = RoundRobin::default();
        let c = cands(&[0, 0, 0]);
        let now = Instant::now();
        let picks: Vec<usize> = (0..6)
            .map(|_| p.select(&c, &text(""), now).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }
}
