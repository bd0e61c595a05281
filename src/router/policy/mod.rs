//! Worker selection: one policy per file behind [`LoadBalancingPolicy`], made from the config
//! by [`PolicySettings::build`]. Every policy is a pure function of the candidates (the
//! available workers, with their in-flight load), what the request offers for routing (its
//! text, its routing key) and the time it is given; none touches a socket or reads a clock,
//! so each is tested on constructed states.

mod bucket;
mod cache_aware;
mod consistent_hash;
mod manual;
mod power_of_two;
mod precise_prefix;
mod predicted_ttft;
mod prefix_hash;
mod random;
mod round_robin;
pub mod tree;

pub use bucket::{Balance, Bucket, Buckets};
pub use cache_aware::{CacheAware, CacheAwareArgs, CacheAwareConfig};
pub use consistent_hash::{rendezvous_hash, ConsistentHashing};
pub use manual::{AssignmentMode, Manual, ManualArgs, ManualConfig};
pub use power_of_two::PowerOfTwo;
pub use precise_prefix::{
    vouched_prefixes, worth, HeldPrefix, PrecisePrefix, PrefixView, TRUSTED_AFTER,
};
pub use predicted_ttft::{PredictedTtft, MAX_SESSIONS};
pub use prefix_hash::{PrefixHash, PrefixHashArgs, PrefixHashConfig};
pub use random::Random;
pub use round_robin::RoundRobin;

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tree::Tenant;

/// How a worker is chosen for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    Random,
    RoundRobin,
    /// Two random workers; the one with fewer requests in flight wins.
    PowerOfTwo,
    /// Longest cached prefix (approximate radix tree per worker), unless load is imbalanced.
    CacheAware,
    /// SMG's `prefix_hash`: the prompt's first `--prefix-token-count` tokens hashed onto the
    /// workers, a loaded one giving way (`--prefix-hash-load-factor`).
    PrefixHash,
    /// The worker holding the longest prefix of the request by the engines' own KV events
    /// (the global index), priced by tier and load; `cache_aware` where events are missing.
    PrecisePrefix,
    /// Rendezvous hashing of the `X-SMG-Routing-Key` (or `X-Session-Id`) header, so a
    /// conversation sticks to one worker; `X-SMG-Target-Worker` names a worker directly.
    ConsistentHashing,
    /// sglang-router's `manual`: a routing key (`X-SMG-Routing-Key`) sticks to the worker it
    /// was first given (`--assignment-mode`), until idle for `--max-idle-secs`.
    Manual,
    /// sglang-router's `bucket` (for prefill): requests sorted by length into one bucket per
    /// worker, boundaries following the recent lengths (`--bucket-adjust-interval-secs`),
    /// unless the characters sent are imbalanced.
    Bucket,
    /// The shortest predicted time to first token: the prefill queued ahead of the request on
    /// each worker plus the prompt tokens it does not hold (by the engines' KV events where
    /// followed, else by the texts sent to it); a session (`X-Session-Id`) holds its last turn
    /// on its worker until idle for `--session-idle-secs`.
    PredictedTtft,
}

impl PolicyKind {
    /// Whether it routes on the request's text (so the body's text must be read).
    pub fn matches_text(self) -> bool {
        matches!(
            self,
            PolicyKind::CacheAware
                | PolicyKind::PrefixHash
                | PolicyKind::PrecisePrefix
                | PolicyKind::Bucket
                | PolicyKind::PredictedTtft
        )
    }

    /// Whether it reads what the engines' KV events say they hold (the global index).
    pub fn follows_kv_events(self) -> bool {
        matches!(self, PolicyKind::PrecisePrefix | PolicyKind::PredictedTtft)
    }

    /// The policy's name, as `--policy` takes it.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::PrefixHash => "prefix_hash",
            PolicyKind::PrecisePrefix => "precise_prefix",
            PolicyKind::ConsistentHashing => "consistent_hashing",
            PolicyKind::Manual => "manual",
            PolicyKind::Bucket => "bucket",
            PolicyKind::PredictedTtft => "predicted_ttft",
        }
    }
}

/// A worker that may be chosen.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub url: Tenant,
    /// Requests in flight.
    pub load: usize,
    /// Requests sent so far (tie-break, so that equal loads spread).
    pub processed: u64,
    /// What its KV events claim may outrank other workers (`precise_prefix`): it was given
    /// by the operator (flags, discovery), or has served its share since it was added through
    /// the API.
    pub vouched: bool,
    /// Prompt tokens the router has sent it to prefill that the request would wait behind
    /// and whose first byte has not come back (counted for `predicted_ttft` only, else 0).
    pub queued_prefill: u64,
}

/// A policy's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Into the candidates.
    pub index: usize,
    /// The prompt tokens the chosen worker is predicted to prefill, when the policy predicts
    /// them (`predicted_ttft`): the router counts them queued there until the first byte.
    pub prefill_tokens: Option<u64>,
}

impl Placement {
    fn of(index: usize) -> Placement {
        Placement {
            index,
            prefill_tokens: None,
        }
    }
}

/// What a request offers for routing.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteInput<'a> {
    /// The text the cache-aware policy matches (prompt, messages, or input ids as text).
    pub text: &'a str,
    /// What `text` holds: the prompt's text or its tokens.
    pub form: TextForm,
    /// The prompt's token ids, when the router knows them (`precise_prefix` hashes them as
    /// the engines do).
    pub tokens: Option<&'a [u32]>,
    /// The LoRA adapter the request names (`lora_path`): its blocks are the adapter's.
    pub adapter: Option<&'a str>,
    /// `X-SMG-Routing-Key` or `X-Session-Id`.
    pub routing_key: Option<&'a str>,
    /// `X-SMG-Target-Worker`: a worker URL, or an index into the candidates.
    pub target_worker: Option<&'a str>,
    /// The request's `model` (with `--enable-igw` or `--backend openai`, only workers
    /// serving it are candidates).
    pub model: Option<&'a str>,
    /// Its priority band (`RouteInfo::band`): what it waits behind on a worker.
    pub band: Option<u8>,
}

/// What a request's routing text holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TextForm {
    /// The prompt's text.
    #[default]
    Text,
    /// The request's `input_ids`, in decimal, separated by single spaces.
    SpacedIds,
    /// The router's tokenizer's ids for the text, two characters a token
    /// (`tokenize::token_text`).
    TokenChars,
}

/// Tokens of a routing text: its ids, or about four characters a token of plain text.
pub fn text_tokens(text: &str, form: TextForm) -> usize {
    match form {
        TextForm::SpacedIds => text.split(' ').filter(|s| !s.is_empty()).count(),
        TextForm::TokenChars => text.chars().count() / 2,
        TextForm::Text => text.len().div_ceil(4),
    }
}

/// A way of choosing a worker, as SGLang's gateway shapes them.
pub trait LoadBalancingPolicy: Send + Sync {
    fn kind(&self) -> PolicyKind;

    fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Chooses among `workers` (never empty: [`choose`] sees to that) for `request` at `now`.
    fn select(&self, workers: &[Candidate], request: &RouteInput, now: Instant) -> Option<usize>;

    /// Chooses as `select` does, and says what the chosen worker is predicted to prefill
    /// when the policy predicts it.
    fn place(
        &self,
        workers: &[Candidate],
        request: &RouteInput,
        now: Instant,
    ) -> Option<Placement> {
        self.select(workers, request, now).map(Placement::of)
    }

    /// Whether it reads [`Candidate::queued_prefill`] (the router counts it only then).
    fn reads_queued_prefill(&self) -> bool {
        false
    }

    /// Forgets what it holds about a removed worker.
    fn on_worker_removed(&self, _url: &str) {}

    /// Trims what it holds (the cache-aware tree, idle routing keys); run periodically.
    fn evict(&self, _now: Instant) {}
}

/// Chooses among `workers` for `request` with `policy`: none when there is no worker, and the
/// worker `X-SMG-Target-Worker` names wins over any policy.
pub fn choose(
    policy: &dyn LoadBalancingPolicy,
    workers: &[Candidate],
    request: &RouteInput,
    now: Instant,
) -> Option<Placement> {
    if workers.is_empty() {
        return None;
    }
    if let Some(i) = request.target_worker.and_then(|t| target(workers, t)) {
        return Some(Placement::of(i));
    }
    policy.place(workers, request, now)
}

/// Everything a policy is made from besides its kind.
#[derive(Clone)]
pub struct PolicySettings {
    pub cache: CacheAwareConfig,
    pub manual: ManualConfig,
    pub prefix_hash: PrefixHashConfig,
    /// `bucket`: the interval between boundary adjustments.
    pub bucket_interval: Duration,
    /// `precise_prefix`, `predicted_ttft`: what the global KV index knows (none: the tree of
    /// texts sent decides).
    pub prefixes: Option<Arc<dyn PrefixView>>,
    /// `predicted_ttft`: a session idle this long no longer counts as held on its worker.
    pub session_idle: Duration,
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings {
            cache: CacheAwareConfig::default(),
            manual: ManualConfig::default(),
            prefix_hash: PrefixHashConfig::default(),
            bucket_interval: Duration::from_secs(5),
            prefixes: None,
            session_idle: Duration::from_secs(600),
        }
    }
}

impl PolicySettings {
    fn view(&self) -> Arc<dyn PrefixView> {
        self.prefixes
            .clone()
            .unwrap_or_else(|| Arc::new(precise_prefix::Unknown))
    }

    /// A fresh policy of `kind`, holding nothing yet.
    pub fn build(&self, kind: PolicyKind) -> Arc<dyn LoadBalancingPolicy> {
        match kind {
            PolicyKind::Random => Arc::new(Random),
            PolicyKind::RoundRobin => Arc::new(RoundRobin::default()),
            PolicyKind::PowerOfTwo => Arc::new(PowerOfTwo),
            PolicyKind::CacheAware => Arc::new(CacheAware::new(self.cache)),
            PolicyKind::PrefixHash => Arc::new(PrefixHash::new(self.prefix_hash)),
            PolicyKind::PrecisePrefix => Arc::new(PrecisePrefix::new(self.view(), self.cache)),
            PolicyKind::PredictedTtft => Arc::new(PredictedTtft::new(
                self.view(),
                self.cache,
                self.session_idle,
            )),
            PolicyKind::ConsistentHashing => Arc::new(ConsistentHashing),
            PolicyKind::Manual => Arc::new(Manual::new(self.manual)),
            PolicyKind::Bucket => Arc::new(Bucket::new(
                self.bucket_interval,
                Balance {
                    abs: self.cache.balance_abs_threshold,
                    rel: self.cache.balance_rel_threshold,
                },
            )),
        }
    }
}

/// The candidate with the least load; ties go to the one that has served fewer requests, then
/// to the first. (sglang-router 0.3.2 breaks ties by position only, which sends every request
/// of a quiet period to the first worker; its later releases use the same tie-break as here.)
fn least_loaded(c: &[Candidate]) -> Option<usize> {
    (0..c.len()).min_by_key(|&i| (c[i].load, c[i].processed, i))
}

/// `X-SMG-Target-Worker`: a URL among the candidates, or an index into them.
fn target(c: &[Candidate], t: &str) -> Option<usize> {
    let t = t.trim();
    c.iter()
        .position(|x| *x.url == *t.trim_end_matches('/'))
        .or_else(|| t.parse::<usize>().ok().filter(|&i| i < c.len()))
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Candidates `http://w{i}:1` with these loads.
    pub fn cands(loads: &[usize]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &load)| Candidate {
                url: format!("http://w{i}:1").into(),
                load,
                processed: 0,
                vouched: true,
                queued_prefill: 0,
            })
            .collect()
    }

    /// What a policy reads of a request that carries only `t` as its text.
    pub fn text(t: &str) -> RouteInput<'_> {
        RouteInput {
            text: t,
            ..RouteInput::default()
        }
    }

    /// What a policy reads of a request that carries only routing key `k`.
    pub fn key(k: &str) -> RouteInput<'_> {
        RouteInput {
            routing_key: Some(k),
            ..RouteInput::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn a_target_worker_wins_over_every_policy_and_no_worker_chooses_none() {
        let now = Instant::now();
        let c = cands(&[0, 0, 0, 0]);
        let kinds = [
            PolicyKind::Random,
            PolicyKind::RoundRobin,
            PolicyKind::PowerOfTwo,
            PolicyKind::CacheAware,
            PolicyKind::ConsistentHashing,
            PolicyKind::Manual,
            PolicyKind::Bucket,
            PolicyKind::PredictedTtft,
        ];
        for kind in kinds {
            let p = PolicySettings::default().build(kind);
            assert_eq!(p.kind(), kind);
            assert_eq!(p.name(), kind.name());
            let by_url = RouteInput {
                target_worker: Some("http://w2:1/"),
                routing_key: Some("x"),
                ..text("some text")
            };
            assert_eq!(
                choose(&*p, &c, &by_url, now).map(|p| p.index),
                Some(2),
                "{kind:?}"
            );
            let by_index = RouteInput {
                target_worker: Some("3"),
                ..RouteInput::default()
            };
            assert_eq!(
                choose(&*p, &c, &by_index, now).map(|p| p.index),
                Some(3),
                "{kind:?}"
            );
            assert_eq!(choose(&*p, &[], &text("t"), now), None, "{kind:?}");
            let picked = choose(&*p, &c, &text("t"), now).unwrap();
            assert!(picked.index < c.len(), "{kind:?}");
        }
    }
}
