//! The SIMULATED engine's timing: a cost model in place of a GPU.
//!
//! Prefill takes time in proportion to the prompt tokens that must be computed, plus a smaller
//! time per token loaded from the host or storage tiers (the copy to device memory). Prefills
//! run one at a time (one device). Decoding emits one token per step; running requests decode
//! together (continuous batching), so a step does not get slower with more of them. Reads from
//! the L3 pool are not modelled: they are real transfers and take the time they take.

use std::time::Duration;

/// The SIMULATED engine's timing in place of a GPU: per prompt token computed or loaded, per
/// decode step, and the prefill-to-decode transfer's bandwidth.
#[derive(Debug, Clone, Copy)]
pub struct CostModel {
    /// Compute per uncached prompt token, in microseconds.
    pub prefill_us_per_token: f64,
    /// Copy to device per token found in the host tier or the pool, in microseconds.
    pub load_us_per_token: f64,
    /// Time per decode step (one token per running request), in milliseconds.
    pub decode_ms_per_token: f64,
    /// Bandwidth of the prefill-to-decode KV transfer (PD), in GB/s.
    pub kv_transfer_gbps: f64,
}

impl CostModel {
    /// Prefill of `computed_tokens` computed and `loaded_tokens` loaded from the cache.
    pub fn prefill(&self, computed_tokens: usize, loaded_tokens: usize) -> Duration {
        secs(
            (computed_tokens as f64 * self.prefill_us_per_token
                + loaded_tokens as f64 * self.load_us_per_token)
                / 1e6,
        )
    }

    /// One decode step.
    pub fn decode_step(&self) -> Duration {
        secs(self.decode_ms_per_token / 1e3)
    }

    /// Moving `bytes` of KV cache from the prefill to the decode engine.
    pub fn kv_transfer(&self, bytes: usize) -> Duration {
        if self.kv_transfer_gbps <= 0.0 {
            return Duration::ZERO;
        }
        secs(bytes as f64 / (self.kv_transfer_gbps * 1e9))
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_cost_less_than_computed_ones() {
        let m = CostModel {
            prefill_us_per_token: 100.0,
            load_us_per_token: 5.0,
            decode_ms_per_token: 10.0,
            kv_transfer_gbps: 10.0,
        };
        assert_eq!(m.prefill(1000, 0), Duration::from_millis(100));
        assert_eq!(m.prefill(0, 1000), Duration::from_millis(5));
        assert!(m.prefill(200, 800) < m.prefill(1000, 0));
        assert_eq!(m.decode_step(), Duration::from_millis(10));
        assert_eq!(m.kv_transfer(10_000_000_000), Duration::from_secs(1));
        let free = CostModel {
            kv_transfer_gbps: 0.0,
            ..m
        };
        assert_eq!(free.kv_transfer(1 << 30), Duration::ZERO);
    }
}
