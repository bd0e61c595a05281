//! `cache_aware`, sglang-router's rule (`../shared/reference/router_bench_hicache.md` §2):
//! under imbalance the least loaded worker; else the worker holding the longest prefix of the
//! request's text when it covers more than `cache_threshold` of it; else the least loaded. The
//! text is then recorded for the chosen worker in an approximate radix tree per worker.

use super::tree::{Tenant, Tree};
use super::{least_loaded, Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use crate::config::Secs;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::time::Instant;

crate::config::settings::settings! {
    /// The cache-aware policy's settings (sglang-router's names and defaults).
    #[derive(Clone, Copy, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct CacheAwareConfig;

    /// The cache-aware policy's flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Policies")]
    pub struct CacheAwareArgs {}

    settings {
        /// `cache_aware`: a match of more than this fraction of the request text goes to the
        /// worker that has it.
        #[arg(long)]
        cache_threshold: f64 = 0.3;
        /// `cache_aware`: load is imbalanced when max − min requests in flight exceed this (and
        /// the relative threshold holds); then the least loaded worker is chosen.
        #[arg(long)]
        balance_abs_threshold: usize = 64;
        /// `cache_aware`: ... and max in flight exceeds min × this.
        #[arg(long)]
        balance_rel_threshold: f64 = 1.5;
        /// `cache_aware`: how often the tree is trimmed to `max_tree_size`.
        #[arg(id = "eviction_interval_secs", long = "eviction-interval-secs")]
        #[serde(rename = "eviction_interval_secs")]
        eviction_interval: Secs = Secs::from_secs(60);
        /// `cache_aware`: characters of request text kept per worker (2^26).
        #[arg(long)]
        max_tree_size: usize = 1 << 26;
    }
}

/// The `cache_aware` policy: the worker whose tree matches most of the prompt, unless load
/// is out of balance.
pub struct CacheAware {
    cfg: CacheAwareConfig,
    tree: Mutex<Tree>,
}

impl CacheAware {
    /// The policy by `cfg`, its tree empty.
    pub fn new(cfg: CacheAwareConfig) -> CacheAware {
        CacheAware {
            cfg,
            tree: Mutex::new(Tree::new()),
        }
    }

    /// Remembers that `text` went to `url` (a choice another policy made, with this one as
    /// its fallback).
    pub fn record(&self, text: &str, url: &Tenant) {
        if !text.is_empty() {
            self.tree.lock().insert(text, url);
        }
    }

    /// For each of `c`, the characters of `text`'s longest prefix sent to it, and the
    /// characters of `text`.
    pub fn held(&self, text: &str, c: &[Candidate]) -> (Vec<usize>, usize) {
        if text.is_empty() {
            return (vec![0; c.len()], 0);
        }
        let urls: Vec<Tenant> = c.iter().map(|x| x.url.clone()).collect();
        self.tree.lock().held_by(text, &urls)
    }

    /// Whether load is imbalanced among `c` (sglang-router's rule).
    pub fn imbalanced(&self, c: &[Candidate]) -> bool {
        let min = c.iter().map(|x| x.load).min().unwrap_or(0);
        let max = c.iter().map(|x| x.load).max().unwrap_or(0);
        max - min > self.cfg.balance_abs_threshold
            && (max as f64) > (min as f64) * self.cfg.balance_rel_threshold
    }

    /// Characters the tree holds for `url`.
    pub fn tree_chars(&self, url: &str) -> usize {
        self.tree.lock().tenant_chars(url)
    }
}

impl LoadBalancingPolicy for CacheAware {
    fn kind(&self) -> PolicyKind {
        PolicyKind::CacheAware
    }

    fn select(&self, c: &[Candidate], request: &RouteInput, _: Instant) -> Option<usize> {
        let (cfg, text) = (&self.cfg, request.text);
        let imbalanced = self.imbalanced(c);
        let mut tree = self.tree.lock();
        let chosen = if imbalanced {
            least_loaded(c)
        } else {
            let m = tree.prefix_match(text);
            let hit = if m.rate() > cfg.cache_threshold {
                m.tenant
                    .as_ref()
                    .and_then(|t| c.iter().position(|x| *x.url == **t))
            } else {
                None
            };
            hit.or_else(|| least_loaded(c))
        }?;
        if !text.is_empty() {
            tree.insert(text, &c[chosen].url);
        }
        Some(chosen)
    }

    fn on_worker_removed(&self, url: &str) {
        self.tree.lock().remove_tenant(url);
    }

    /// Trims the tree to `max_tree_size` characters per worker.
    fn evict(&self, _: Instant) {
        self.tree.lock().evict_by_size(self.cfg.max_tree_size);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn cache_aware_follows_the_prefix_until_imbalanced() {
        let p = CacheAware::new(CacheAwareConfig::default());
        let now = Instant::now();
        let long = "You are a helpful assistant. Tell me about the history of Rome.";
        let mut c = cands(&[0, 0]);
        // A miss goes to the least loaded (ties: fewer served); the text is remembered there.
        c[0].processed = 5;
        assert_eq!(p.select(&c, &text(long), now), Some(1));
        // The same prefix (above the 0.3 threshold) sticks to w1 even though it is busier.
        c[1].load = 10;
        let follow =
            "You are a helpful assistant. Tell me about the history of Rome. And Carthage?";
        assert_eq!(p.select(&c, &text(follow), now), Some(1));
        // A text sharing too little goes to the least loaded.
        assert_eq!(
            p.select(&c, &text("Completely different question here"), now),
            Some(0)
        );
        // A large but proportionally small gap is not imbalance: affinity stays.
        c[0].load = 200;
        c[1].load = 280;
        assert_eq!(
            p.select(&c, &text(follow), now),
            Some(1),
            "280 − 200 > 64, but 280 < 1.5 × 200: affinity stays"
        );
        // Imbalance: max − min > 64 and max > 1.5 × min → least loaded despite the match.
        c[0].load = 10;
        c[1].load = 80;
        assert_eq!(p.select(&c, &text(follow), now), Some(0));
        assert!(p.tree_chars("http://w1:1") >= follow.len());
        // A removed worker is forgotten: its prefix no longer attracts requests.
        p.on_worker_removed("http://w1:1");
        assert_eq!(p.tree_chars("http://w1:1"), 0);
    }

    #[test]
    fn a_matched_worker_missing_from_the_candidates_falls_back_and_the_tree_is_trimmed() {
        let p = CacheAware::new(CacheAwareConfig::default());
        let now = Instant::now();
        let c = cands(&[0, 0]);
        assert_eq!(p.select(&c, &text("abcdefgh"), now), Some(0));
        // w0 is unavailable now (only w1 is a candidate).
        let only1 = vec![c[1].clone()];
        assert_eq!(p.select(&only1, &text("abcdefgh"), now), Some(0)); // index into `only1`
        let small = CacheAware::new(CacheAwareConfig {
            max_tree_size: 4,
            ..CacheAwareConfig::default()
        });
        small.select(&c, &text("abcdefgh"), now);
        small.evict(now);
        assert!(small.tree_chars("http://w0:1") <= 4);
    }
}
