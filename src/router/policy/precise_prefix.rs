//! `precise_prefix`: the worker that holds the longest prefix of the request, as the engines
//! themselves say through their KV events (the router's global index), rather than as guessed
//! from what was sent to them. Each candidate's leading blocks of the request are priced by
//! the tier they are on (a block on the device saves its whole prefill; one on the host, on
//! disk, or in the pool saves it less the copy), less what the candidate's requests in flight
//! cost; the best wins, ties to the least loaded. Under imbalance (`cache_aware`'s rule) the
//! least loaded wins. Where no candidate's events are followed, or the request's tokens are
//! not known, `cache_aware` decides; its tree is kept warm with every choice either way.
//!
//! The choice is explained in a debug log field per request (each candidate's blocks by tier).

use super::cache_aware::{CacheAware, CacheAwareConfig};
use super::tree::Tenant;
use super::{least_loaded, Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use crate::kv_events::Prefix;
use std::sync::Arc;
use std::time::Instant;

/// A worker's leading blocks of a request, by tier, and the tokens in each of its blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldPrefix {
    pub prefix: Prefix,
    pub block_size: usize,
}

impl HeldPrefix {
    /// What it is worth in prompt tokens not computed again (see [`worth`]).
    pub fn saved_tokens(&self) -> f64 {
        worth(&self.prefix) * self.block_size as f64
    }
}

/// What the index knows of each worker's cache.
pub trait PrefixView: Send + Sync {
    /// For each of `workers`, its leading blocks of `tokens` by tier (in LoRA adapter
    /// `adapter`'s namespace, when named); `None` for a worker whose events are not followed,
    /// or not in step.
    fn prefixes(
        &self,
        tokens: &[u32],
        adapter: Option<&str>,
        workers: &[Tenant],
    ) -> Vec<Option<HeldPrefix>>;
}

/// A view that knows nothing (no index): the request text's tree decides every request.
pub struct Unknown;

impl PrefixView for Unknown {
    fn prefixes(&self, _: &[u32], _: Option<&str>, workers: &[Tenant]) -> Vec<Option<HeldPrefix>> {
        vec![None; workers.len()]
    }
}

/// What the index says each candidate holds of the request, leaving out the claims of those
/// not vouched for while some candidate is ([`TRUSTED_AFTER`]); `None` when its tokens are
/// not known.
pub fn vouched_prefixes(
    view: &dyn PrefixView,
    c: &[Candidate],
    request: &RouteInput,
) -> Option<Vec<Option<HeldPrefix>>> {
    let tokens = request.tokens?;
    let urls: Vec<Tenant> = c.iter().map(|x| x.url.clone()).collect();
    let mut held = view.prefixes(tokens, request.adapter, &urls);
    if c.iter().any(|x| x.vouched) {
        for (h, x) in held.iter_mut().zip(c) {
            if !x.vouched {
                *h = None;
            }
        }
    }
    Some(held)
}

/// Share of a block's prefill a block on each tier saves (the rest is its copy to the device).
const SAVED_GPU: f64 = 1.0;
const SAVED_HOST: f64 = 0.8;
const SAVED_DISK: f64 = 0.5;
const SAVED_EXTERNAL: f64 = 0.5;
/// Blocks of prefill one request in flight is worth (its queueing ahead of this one).
const LOAD_BLOCKS: f64 = 4.0;
/// Requests a worker added through the API must have been sent before what its KV events
/// claim outranks vouched workers' (`Candidate::vouched`): whoever could register a worker
/// could otherwise announce the blocks another engine holds and draw its prompts. While no
/// candidate is vouched, all claims count alike.
pub const TRUSTED_AFTER: u64 = 8;

/// What a candidate's held prefix is worth, in blocks of prefill saved.
pub fn worth(p: &Prefix) -> f64 {
    p.gpu as f64 * SAVED_GPU
        + p.host as f64 * SAVED_HOST
        + p.disk as f64 * SAVED_DISK
        + p.external as f64 * SAVED_EXTERNAL
}

/// The `precise_prefix` policy: the worker holding the longest prefix, by its KV events.
pub struct PrecisePrefix {
    view: Arc<dyn PrefixView>,
    fallback: CacheAware,
}

impl PrecisePrefix {
    /// The policy over the KV index `view`, with the cache-aware tree of `cache` for requests
    /// the index knows nothing of.
    pub fn new(view: Arc<dyn PrefixView>, cache: CacheAwareConfig) -> PrecisePrefix {
        PrecisePrefix {
            view,
            fallback: CacheAware::new(cache),
        }
    }
}

impl LoadBalancingPolicy for PrecisePrefix {
    fn kind(&self) -> PolicyKind {
        PolicyKind::PrecisePrefix
    }

    fn select(&self, c: &[Candidate], request: &RouteInput, now: Instant) -> Option<usize> {
        let held = match vouched_prefixes(&*self.view, c, request) {
            Some(held) if held.iter().any(Option::is_some) => held,
            _ => return self.fallback.select(c, request, now),
        };
        let chosen = if self.fallback.imbalanced(c) {
            least_loaded(c)?
        } else {
            let score = |i: usize| {
                held[i].as_ref().map_or(0.0, |h| worth(&h.prefix)) - c[i].load as f64 * LOAD_BLOCKS
            };
            (0..c.len()).max_by(|&a, &b| {
                score(a)
                    .total_cmp(&score(b))
                    .then_with(|| (c[b].load, c[b].processed).cmp(&(c[a].load, c[a].processed)))
                    .then_with(|| b.cmp(&a))
            })?
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            let why: Vec<String> = c
                .iter()
                .zip(&held)
                .map(|(x, h)| match h.map(|h| h.prefix) {
                    Some(p) => format!(
                        "{} gpu={} host={} disk={} pool={} load={}",
                        x.url, p.gpu, p.host, p.disk, p.external, x.load
                    ),
                    None => format!("{} unknown load={}", x.url, x.load),
                })
                .collect();
            tracing::debug!(worker = %c[chosen].url, candidates = ?why, "precise_prefix");
        }
        self.fallback.record(request.text, &c[chosen].url);
        Some(chosen)
    }

    fn on_worker_removed(&self, url: &str) {
        self.fallback.on_worker_removed(url);
    }

    fn evict(&self, now: Instant) {
        self.fallback.evict(now);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::testing::*;
    use super::*;
    use std::collections::HashMap;

    /// A view that holds fixed prefixes by worker, in blocks of 16 tokens.
    pub(crate) struct Fixed(HashMap<String, Prefix>);

    impl PrefixView for Fixed {
        fn prefixes(
            &self,
            _: &[u32],
            _: Option<&str>,
            workers: &[Tenant],
        ) -> Vec<Option<HeldPrefix>> {
            workers
                .iter()
                .map(|w| {
                    self.0.get(&**w).map(|&prefix| HeldPrefix {
                        prefix,
                        block_size: 16,
                    })
                })
                .collect()
        }
    }

    pub(crate) fn view(entries: &[(usize, Prefix)]) -> Arc<dyn PrefixView> {
        Arc::new(Fixed(
            entries
                .iter()
                .map(|(i, p)| (format!("http://w{i}:1"), *p))
                .collect(),
        ))
    }

    fn tokens(t: &[u32]) -> RouteInput<'_> {
        RouteInput {
            tokens: Some(t),
            ..RouteInput::default()
        }
    }

    /// `n` blocks on the device.
    pub(crate) fn gpu(n: usize) -> Prefix {
        Prefix {
            gpu: n,
            ..Prefix::default()
        }
    }

    /// `n` blocks on the host.
    pub(crate) fn host(n: usize) -> Prefix {
        Prefix {
            host: n,
            ..Prefix::default()
        }
    }

    #[test]
    fn the_longest_held_prefix_wins_priced_by_tier_and_load() {
        let p = PrecisePrefix::new(
            view(&[(0, gpu(2)), (1, gpu(6)), (2, host(7))]),
            CacheAwareConfig::default(),
        );
        let now = Instant::now();
        let t = [1, 2, 3];
        // 6 blocks on a device (6.0) beat 7 on a host (5.6) and 2 on a device.
        assert_eq!(p.select(&cands(&[0, 0, 0, 0]), &tokens(&t), now), Some(1));
        // One request in flight costs w1 more than the host's copies cost w2.
        assert_eq!(p.select(&cands(&[0, 1, 0, 0]), &tokens(&t), now), Some(2));
        // Nothing held anywhere worth the load: the least loaded (w3, unknown) wins.
        assert_eq!(p.select(&cands(&[3, 3, 3, 0]), &tokens(&t), now), Some(3));
        // Imbalance (cache_aware's rule): the least loaded, whatever is held.
        assert_eq!(
            p.select(&cands(&[100, 0, 200, 100]), &tokens(&t), now),
            Some(1)
        );
        assert_eq!(
            p.select(&cands(&[0, 100, 200, 100]), &tokens(&t), now),
            Some(0)
        );
    }

    #[test]
    fn a_new_worker_does_not_outrank_established_ones_on_its_claims_alone() {
        // w2 claims the most, w1 holds less; w0 and w1 are vouched for, w2 is not.
        let p = PrecisePrefix::new(
            view(&[(1, gpu(3)), (2, gpu(50))]),
            CacheAwareConfig::default(),
        );
        let now = Instant::now();
        let mut c = cands(&[0, 0, 0]);
        c[2].vouched = false;
        assert_eq!(p.select(&c, &tokens(&[1, 2]), now), Some(1));
        // Once vouched for (it has served its share), its claims count.
        c[2].vouched = true;
        assert_eq!(p.select(&c, &tokens(&[1, 2]), now), Some(2));
        // None vouched for: every claim counts alike.
        for x in &mut c {
            x.vouched = false;
        }
        assert_eq!(p.select(&c, &tokens(&[1, 2]), now), Some(2));
    }

    #[test]
    fn without_tokens_or_followed_workers_cache_aware_decides() {
        let p = PrecisePrefix::new(view(&[]), CacheAwareConfig::default());
        let now = Instant::now();
        let c = cands(&[2, 1]);
        assert_eq!(
            p.select(&c, &tokens(&[1]), now),
            Some(1),
            "nobody followed: least loaded"
        );
        let long = "a system prompt long enough to match on a second request";
        let by_text = RouteInput {
            text: long,
            ..RouteInput::default()
        };
        assert_eq!(p.select(&c, &by_text, now), Some(1));
        // The fallback's tree remembers: the same text sticks to w1 though it is busier now.
        assert_eq!(p.select(&cands(&[0, 5]), &by_text, now), Some(1));
    }
}
