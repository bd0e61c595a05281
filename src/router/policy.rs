//! Worker selection. Every policy is a pure function of the candidates (the available workers,
//! with their in-flight load) and what the request offers for routing (its text, its routing
//! key); none of them touches a socket, so each is tested on constructed states.

use crate::router::bucket::{Balance, Buckets};
use crate::router::config::{AssignmentMode, CacheAwareConfig, ManualConfig, PolicyKind};
use crate::router::tree::{Tenant, Tree};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A worker that may be chosen.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub url: Tenant,
    /// Requests in flight.
    pub load: usize,
    /// Requests sent so far (tie-break, so that equal loads spread).
    pub processed: u64,
}

/// What a request offers for routing.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteInput<'a> {
    /// The text the cache-aware policy matches (prompt, messages, or input ids as text).
    pub text: &'a str,
    /// `X-SMG-Routing-Key` or `X-Session-Id`.
    pub routing_key: Option<&'a str>,
    /// `X-SMG-Target-Worker`: a worker URL, or an index into the candidates.
    pub target_worker: Option<&'a str>,
    /// The request's `model` (with `--enable-igw` or `--backend openai`, only workers
    /// serving it are candidates).
    pub model: Option<&'a str>,
}

/// A routing key's worker, and when the key was last used.
struct Assignment {
    url: Arc<str>,
    used: std::time::Instant,
}

pub struct Policy {
    kind: PolicyKind,
    counter: AtomicUsize,
    cache: CacheAwareConfig,
    tree: Mutex<Tree>,
    manual: ManualConfig,
    /// `manual`: routing key -> its worker.
    keys: Mutex<std::collections::HashMap<String, Assignment>>,
    /// `bucket`: length buckets over the recent window.
    buckets: Mutex<Buckets>,
}

/// The candidate with the least load; ties go to the one that has served fewer requests, then
/// to the first. (sglang-router 0.3.2 breaks ties by position only, which sends every request
/// of a quiet period to the first worker; its later releases use the same tie-break as here.)
fn least_loaded(c: &[Candidate]) -> Option<usize> {
    (0..c.len()).min_by_key(|&i| (c[i].load, c[i].processed, i))
}

/// 64-bit FNV-1a, stable across processes and releases (std's hasher is not).
pub fn rendezvous_hash(parts: &[&[u8]]) -> u64 {
    let mut fnv = crate::hash::Fnv64::new();
    for p in parts {
        // 0xff never occurs in UTF-8: it separates the parts.
        fnv.write(p).write(&[0xff]);
    }
    let mut h = fnv.finish();
    // Final avalanche (splitmix64) so that similar keys spread.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl Policy {
    pub fn new(kind: PolicyKind, cache: CacheAwareConfig) -> Policy {
        Policy {
            kind,
            counter: AtomicUsize::new(0),
            cache,
            tree: Mutex::new(Tree::new()),
            manual: ManualConfig::default(),
            keys: Mutex::new(std::collections::HashMap::new()),
            buckets: Mutex::new(Buckets::new(std::time::Duration::from_secs(5))),
        }
    }

    /// The `bucket` policy's adjustment interval (also its window).
    pub fn with_bucket_interval(mut self, interval: std::time::Duration) -> Policy {
        self.buckets = Mutex::new(Buckets::new(interval));
        self
    }

    /// The `manual` policy's settings.
    pub fn with_manual(mut self, manual: ManualConfig) -> Policy {
        self.manual = manual;
        self
    }

    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Chooses among `c` (never empty when called by the router; `None` if it is).
    pub fn select(&self, c: &[Candidate], req: &RouteInput) -> Option<usize> {
        if c.is_empty() {
            return None;
        }
        if let Some(i) = req.target_worker.and_then(|t| target(c, t)) {
            return Some(i);
        }
        match self.kind {
            PolicyKind::Random => Some(fastrand::usize(..c.len())),
            PolicyKind::RoundRobin => Some(self.counter.fetch_add(1, Ordering::Relaxed) % c.len()),
            PolicyKind::PowerOfTwo => {
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
            PolicyKind::CacheAware => self.cache_aware(c, req.text),
            PolicyKind::Manual => Some(self.manual(c, req.routing_key, std::time::Instant::now())),
            PolicyKind::Bucket => Some(self.buckets.lock().select(
                c,
                req.text.chars().count(),
                Balance {
                    abs: self.cache.balance_abs_threshold,
                    rel: self.cache.balance_rel_threshold,
                },
                std::time::Instant::now(),
            )),
            PolicyKind::ConsistentHashing => match req.routing_key {
                Some(key) => (0..c.len())
                    .max_by_key(|&i| rendezvous_hash(&[key.as_bytes(), c[i].url.as_bytes()])),
                None => least_loaded(c),
            },
        }
    }

    /// sglang-router's cache-aware rule (`../shared/reference/router_bench_hicache.md` §2):
    /// under imbalance the least loaded worker; else the worker holding the longest prefix
    /// when it covers more than `cache_threshold` of the text; else the least loaded. The
    /// text is then recorded for the chosen worker.
    fn cache_aware(&self, c: &[Candidate], text: &str) -> Option<usize> {
        let cfg = &self.cache;
        let min = c.iter().map(|x| x.load).min().unwrap_or(0);
        let max = c.iter().map(|x| x.load).max().unwrap_or(0);
        let imbalanced = max - min > cfg.balance_abs_threshold
            && (max as f64) > (min as f64) * cfg.balance_rel_threshold;
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

    /// sglang-router's `manual` policy: a routing key (`X-SMG-Routing-Key`) keeps the worker
    /// it was first given while that worker is a candidate; a new key (or one whose worker
    /// went) is given one by `assignment_mode`. Without a key: any candidate.
    fn manual(&self, c: &[Candidate], key: Option<&str>, now: std::time::Instant) -> usize {
        let Some(key) = key else {
            return fastrand::usize(..c.len());
        };
        let mut keys = self.keys.lock();
        if let Some(a) = keys.get_mut(key) {
            if let Some(i) = c.iter().position(|x| x.url == a.url) {
                a.used = now;
                return i;
            }
        }
        let i = match self.manual.assignment_mode {
            AssignmentMode::Random => fastrand::usize(..c.len()),
            AssignmentMode::MinLoad => least_loaded(c).unwrap_or(0),
            AssignmentMode::MinGroup => (0..c.len())
                .min_by_key(|&i| (keys.values().filter(|a| a.url == c[i].url).count(), i))
                .unwrap_or(0),
        };
        keys.insert(
            key.to_string(),
            Assignment {
                url: c[i].url.clone(),
                used: now,
            },
        );
        i
    }

    /// Routing keys the `manual` policy holds.
    pub fn routing_keys(&self) -> usize {
        self.keys.lock().len()
    }

    /// Trims the cache-aware tree to `max_tree_size` characters per worker; forgets routing
    /// keys idle for longer than `max_idle`.
    pub fn evict(&self) {
        match self.kind {
            PolicyKind::CacheAware => self.tree.lock().evict_by_size(self.cache.max_tree_size),
            PolicyKind::Manual => self.forget_idle(std::time::Instant::now()),
            _ => {}
        }
    }

    fn forget_idle(&self, now: std::time::Instant) {
        let idle = self.manual.max_idle.0;
        self.keys
            .lock()
            .retain(|_, a| now.saturating_duration_since(a.used) < idle);
    }

    /// Forgets a removed worker.
    pub fn remove_worker(&self, url: &str) {
        match self.kind {
            PolicyKind::CacheAware => self.tree.lock().remove_tenant(url),
            PolicyKind::Manual => self.keys.lock().retain(|_, a| *a.url != *url),
            _ => {}
        }
    }

    /// Characters the cache-aware tree holds for `url`.
    pub fn tree_chars(&self, url: &str) -> usize {
        self.tree.lock().tenant_chars(url)
    }
}

/// `X-SMG-Target-Worker`: a URL among the candidates, or an index into them.
fn target(c: &[Candidate], t: &str) -> Option<usize> {
    let t = t.trim();
    c.iter()
        .position(|x| *x.url == *t.trim_end_matches('/'))
        .or_else(|| t.parse::<usize>().ok().filter(|&i| i < c.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_keeps_a_key_on_its_worker_and_assigns_new_ones_by_mode() {
        let input = |k| RouteInput {
            routing_key: k,
            ..RouteInput::default()
        };
        let p = Policy::new(PolicyKind::Manual, CacheAwareConfig::default()).with_manual(
            ManualConfig {
                assignment_mode: AssignmentMode::MinGroup,
                max_idle: crate::config::Secs::from_secs(60),
            },
        );
        let c = cands(&[0, 0, 0]);
        // min_group spreads new keys: a, b, c on three workers; a stays where it is.
        let a = p.select(&c, &input(Some("a"))).unwrap();
        let b = p.select(&c, &input(Some("b"))).unwrap();
        let cc = p.select(&c, &input(Some("c"))).unwrap();
        let mut all = vec![a, b, cc];
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2]);
        assert!((0..10).all(|_| p.select(&c, &input(Some("a"))) == Some(a)));
        // Its worker gone: the key moves, once.
        let without: Vec<Candidate> = c
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != a)
            .map(|(_, x)| x.clone())
            .collect();
        let moved = p.select(&without, &input(Some("a"))).unwrap();
        assert_eq!(p.select(&without, &input(Some("a"))), Some(moved));
        // Idle keys are forgotten.
        assert_eq!(p.routing_keys(), 3);
        p.forget_idle(std::time::Instant::now() + std::time::Duration::from_secs(61));
        assert_eq!(p.routing_keys(), 0);
        // min_load: a new key goes to the least loaded worker.
        let q = Policy::new(PolicyKind::Manual, CacheAwareConfig::default()).with_manual(
            ManualConfig {
                assignment_mode: AssignmentMode::MinLoad,
                ..ManualConfig::default()
            },
        );
        assert_eq!(q.select(&cands(&[5, 1, 3]), &input(Some("k"))), Some(1));
    }

    fn cands(loads: &[usize]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &load)| Candidate {
                url: format!("http://w{i}:1").into(),
                load,
                processed: 0,
            })
            .collect()
    }

    fn text(t: &str) -> RouteInput<'_> {
        RouteInput {
            text: t,
            ..RouteInput::default()
        }
    }

    #[test]
    fn round_robin_cycles_and_random_stays_in_range() {
        let p = Policy::new(PolicyKind::RoundRobin, CacheAwareConfig::default());
        let c = cands(&[0, 0, 0]);
        let picks: Vec<usize> = (0..6).map(|_| p.select(&c, &text("")).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        let p = Policy::new(PolicyKind::Random, CacheAwareConfig::default());
        let mut seen = [0; 3];
        for _ in 0..300 {
            seen[p.select(&c, &text("")).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
        assert_eq!(p.select(&[], &text("")), None);
    }

    #[test]
    fn power_of_two_never_picks_the_busier_of_two() {
        let p = Policy::new(PolicyKind::PowerOfTwo, CacheAwareConfig::default());
        // With two workers both are always sampled: the idle one must win every time.
        let c = cands(&[7, 1]);
        for _ in 0..100 {
            assert_eq!(p.select(&c, &text("")), Some(1));
        }
        // With three, the busiest can never win.
        let c = cands(&[9, 2, 3]);
        for _ in 0..200 {
            assert_ne!(p.select(&c, &text("")), Some(0));
        }
        assert_eq!(p.select(&cands(&[5]), &text("")), Some(0));
    }

    #[test]
    fn cache_aware_follows_the_prefix_until_imbalanced() {
        let p = Policy::new(PolicyKind::CacheAware, CacheAwareConfig::default());
        let long = "You are a helpful assistant. Tell me about the history of Rome.";
        let mut c = cands(&[0, 0]);
        // A miss goes to the least loaded (ties: fewer served); the text is remembered there.
        c[0].processed = 5;
        assert_eq!(p.select(&c, &text(long)), Some(1));
        // The same prefix (above the 0.3 threshold) sticks to w1 even though it is busier.
        c[1].load = 10;
        let follow =
            "You are a helpful assistant. Tell me about the history of Rome. And Carthage?";
        assert_eq!(p.select(&c, &text(follow)), Some(1));
        // A text sharing too little goes to the least loaded.
        assert_eq!(
            p.select(&c, &text("Completely different question here")),
            Some(0)
        );
        // A large but proportionally small gap is not imbalance: affinity stays.
        c[0].load = 200;
        c[1].load = 280;
        assert_eq!(
            p.select(&c, &text(follow)),
            Some(1),
            "280 − 200 > 64, but 280 < 1.5 × 200: affinity stays"
        );
        // Imbalance: max − min > 64 and max > 1.5 × min → least loaded despite the match.
        c[0].load = 10;
        c[1].load = 80;
        assert_eq!(p.select(&c, &text(follow)), Some(0));
        assert!(p.tree_chars("http://w1:1") >= follow.len());
        // A removed worker is forgotten: its prefix no longer attracts requests.
        p.remove_worker("http://w1:1");
        assert_eq!(p.tree_chars("http://w1:1"), 0);
    }

    #[test]
    fn cache_aware_matched_worker_missing_from_candidates_falls_back() {
        let p = Policy::new(PolicyKind::CacheAware, CacheAwareConfig::default());
        let c = cands(&[0, 0]);
        assert_eq!(p.select(&c, &text("abcdefgh")), Some(0));
        // w0 is unavailable now (only w1 is a candidate).
        let only1 = vec![c[1].clone()];
        assert_eq!(p.select(&only1, &text("abcdefgh")), Some(0)); // index into `only1`
        let small = Policy::new(
            PolicyKind::CacheAware,
            CacheAwareConfig {
                max_tree_size: 4,
                ..CacheAwareConfig::default()
            },
        );
        small.select(&c, &text("abcdefgh"));
        small.evict();
        assert!(small.tree_chars("http://w0:1") <= 4);
    }

    #[test]
    fn consistent_hashing_sticks_and_moves_little() {
        let p = Policy::new(PolicyKind::ConsistentHashing, CacheAwareConfig::default());
        let c = cands(&[0, 0, 0, 0]);
        let key = |k: &'static str| RouteInput {
            routing_key: Some(k),
            ..RouteInput::default()
        };
        let keys: Vec<String> = (0..400).map(|i| format!("session-{i}")).collect();
        let first: Vec<usize> = keys
            .iter()
            .map(|k| {
                p.select(
                    &c,
                    &RouteInput {
                        routing_key: Some(k),
                        ..RouteInput::default()
                    },
                )
                .unwrap()
            })
            .collect();
        let a = p.select(&c, &key("conversation-42")).unwrap();
        for _ in 0..20 {
            assert_eq!(p.select(&c, &key("conversation-42")), Some(a));
        }
        let mut per = [0; 4];
        first.iter().for_each(|&i| per[i] += 1);
        assert!(per.iter().all(|&n| n > 60), "spread: {per:?}");
        // Removing worker 3 moves only the keys that were on it.
        let c3 = &c[..3];
        for (k, &before) in keys.iter().zip(&first) {
            let after = p
                .select(
                    c3,
                    &RouteInput {
                        routing_key: Some(k),
                        ..RouteInput::default()
                    },
                )
                .unwrap();
            if before != 3 {
                assert_eq!(after, before, "{k} moved although its worker stayed");
            }
        }
        // Without a key: least loaded. A target header wins over everything.
        assert_eq!(p.select(&cands(&[3, 1, 2]), &text("")), Some(1));
        let t = RouteInput {
            target_worker: Some("http://w2:1"),
            routing_key: Some("x"),
            ..RouteInput::default()
        };
        assert_eq!(p.select(&c, &t), Some(2));
        let t = RouteInput {
            target_worker: Some("3"),
            ..RouteInput::default()
        };
        assert_eq!(p.select(&c, &t), Some(3));
    }
}
