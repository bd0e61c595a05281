//! `predicted_ttft`: the worker with the shortest predicted time to first token. A request's
//! first token waits on a worker for the prefill queued ahead of it there (the prompt tokens
//! the router sent that worker to compute whose first byte has not come back, of the request's
//! priority band and those before it: [`Candidate::queued_prefill`]) and then for its own
//! prefill: the prompt tokens that worker does not hold. What a worker holds comes from the
//! engines' KV events (the global index, priced by tier as `precise_prefix` prices it) where
//! they are followed, else from the tree of texts sent to it (`cache_aware`'s); and a session
//! (`X-Session-Id` or `X-SMG-Routing-Key`) holds at least the prompt its last turn sent to its
//! worker, until it has been idle for `session_idle_secs`. The workers are alike, so the one
//! with the fewest tokens to compute before this request's first token answers first; ties go
//! to the one with fewer requests in flight, then to the one that has served fewer.
//!
//! Unlike `cache_aware`, a held prefix never outweighs the queue in front of it: a long prompt
//! goes to the worker holding its prefix only while that worker's queue is shorter than what
//! the prefix saves.

use super::cache_aware::{CacheAware, CacheAwareConfig};
use super::precise_prefix::{vouched_prefixes, PrefixView};
use super::tree::Tenant;
use super::{text_tokens, Candidate, LoadBalancingPolicy, Placement, PolicyKind, RouteInput};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sessions remembered at most: past it, the least recently used eighth is forgotten (a
/// client may name any number of sessions).
pub const MAX_SESSIONS: usize = 100_000;

/// A session's worker and its last turn.
#[derive(Clone, Debug)]
struct Session {
    url: Tenant,
    /// Prompt tokens its last turn sent there (the worker holds them while it keeps them).
    tokens: u64,
    used: Instant,
}

/// Sessions by key, bounded by [`MAX_SESSIONS`]. Keys come from clients: the map keeps the
/// standard library's keyed hasher.
struct Sessions {
    map: HashMap<String, Session>,
    idle: Duration,
}

impl Sessions {
    /// The session's worker and what it holds there, unless idle too long.
    fn get(&self, key: &str, now: Instant) -> Option<&Session> {
        self.map
            .get(key)
            .filter(|s| now.saturating_duration_since(s.used) < self.idle)
    }

    fn put(&mut self, key: &str, session: Session) {
        if let Some(s) = self.map.get_mut(key) {
            *s = session;
            return;
        }
        if self.map.len() >= MAX_SESSIONS {
            self.trim(session.used);
        }
        self.map.insert(key.to_string(), session);
    }

    /// Forgets the idle sessions, and the least recently used eighth if that is not enough.
    fn trim(&mut self, now: Instant) {
        let idle = self.idle;
        self.map
            .retain(|_, s| now.saturating_duration_since(s.used) < idle);
        if self.map.len() >= MAX_SESSIONS {
            let mut used: Vec<Instant> = self.map.values().map(|s| s.used).collect();
            let cut = used.len() / 8;
            let (_, &mut oldest_kept, _) = used.select_nth_unstable(cut);
            self.map.retain(|_, s| s.used >= oldest_kept);
        }
    }

    fn evict(&mut self, now: Instant) {
        let idle = self.idle;
        self.map
            .retain(|_, s| now.saturating_duration_since(s.used) < idle);
    }
}

/// The `predicted_ttft` policy: the worker with the shortest predicted time to first token.
pub struct PredictedTtft {
    view: Arc<dyn PrefixView>,
    /// Its tree of texts sent to each worker.
    tree: CacheAware,
    sessions: Mutex<Sessions>,
}

/// One candidate's prediction, in prompt tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Predicted {
    /// Queued ahead of the request.
    queued: u64,
    /// The request's own tokens it must compute.
    uncached: u64,
}

impl Predicted {
    fn tokens(&self) -> u64 {
        self.queued.saturating_add(self.uncached)
    }
}

impl PredictedTtft {
    /// The policy over the KV index `view`, with the cache-aware tree of `cache` for requests
    /// the index knows nothing of, and sessions idle past `session_idle` forgotten.
    pub fn new(
        view: Arc<dyn PrefixView>,
        cache: CacheAwareConfig,
        session_idle: Duration,
    ) -> PredictedTtft {
        PredictedTtft {
            view,
            tree: CacheAware::new(cache),
            sessions: Mutex::new(Sessions {
                map: HashMap::new(),
                idle: session_idle,
            }),
        }
    }

    /// Sessions remembered.
    pub fn sessions(&self) -> usize {
        self.sessions.lock().map.len()
    }

    /// Each candidate's prediction for `request` of `prompt` tokens.
    fn predict(
        &self,
        c: &[Candidate],
        request: &RouteInput,
        prompt: u64,
        now: Instant,
    ) -> Vec<Predicted> {
        let prompt = prompt as f64;
        let mut saved = vec![0.0f64; c.len()];
        let indexed = vouched_prefixes(&*self.view, c, request);
        let known = |i: usize| indexed.as_ref().and_then(|h| h[i]);
        if (0..c.len()).any(|i| known(i).is_none()) {
            // The tree answers for the workers the index does not know.
            let (chars, of) = self.tree.held(request.text, c);
            if of > 0 {
                for (s, h) in saved.iter_mut().zip(chars) {
                    *s = prompt * h as f64 / of as f64;
                }
            }
        }
        for (i, s) in saved.iter_mut().enumerate() {
            if let Some(h) = known(i) {
                *s = h.saved_tokens();
            }
        }
        if let Some(key) = request.routing_key {
            if let Some(session) = self.sessions.lock().get(key, now) {
                if let Some(i) = c.iter().position(|x| x.url == session.url) {
                    saved[i] = saved[i].max(session.tokens as f64);
                }
            }
        }
        c.iter()
            .zip(saved)
            .map(|(x, s)| Predicted {
                queued: x.queued_prefill,
                uncached: (prompt - s.min(prompt)).round() as u64,
            })
            .collect()
    }
}

impl LoadBalancingPolicy for PredictedTtft {
    fn kind(&self) -> PolicyKind {
        PolicyKind::PredictedTtft
    }

    fn select(&self, c: &[Candidate], request: &RouteInput, now: Instant) -> Option<usize> {
        self.place(c, request, now).map(|p| p.index)
    }

    fn place(&self, c: &[Candidate], request: &RouteInput, now: Instant) -> Option<Placement> {
        let prompt = match request.tokens {
            Some(t) => t.len(),
            None => text_tokens(request.text, request.form),
        } as u64;
        let predicted = self.predict(c, request, prompt, now);
        let chosen =
            (0..c.len()).min_by_key(|&i| (predicted[i].tokens(), c[i].load, c[i].processed, i))?;
        if tracing::enabled!(tracing::Level::DEBUG) {
            let why: Vec<String> = c
                .iter()
                .zip(&predicted)
                .map(|(x, p)| {
                    format!(
                        "{} queued={} uncached={} load={}",
                        x.url, p.queued, p.uncached, x.load
                    )
                })
                .collect();
            tracing::debug!(worker = %c[chosen].url, candidates = ?why, "predicted_ttft");
        }
        self.tree.record(request.text, &c[chosen].url);
        if let Some(key) = request.routing_key {
            self.sessions.lock().put(
                key,
                Session {
                    url: c[chosen].url.clone(),
                    tokens: prompt,
                    used: now,
                },
            );
        }
        Some(Placement {
            index: chosen,
            prefill_tokens: Some(predicted[chosen].uncached),
        })
    }

    fn reads_queued_prefill(&self) -> bool {
        true
    }

    fn on_worker_removed(&self, url: &str) {
        self.tree.on_worker_removed(url);
        self.sessions.lock().map.retain(|_, s| *s.url != *url);
    }

    /// Trims the tree and forgets idle sessions.
    fn evict(&self, now: Instant) {
        self.tree.evict(now);
        self.sessions.lock().evict(now);
    }
}

#[cfg(test)]
mod tests {
    use super::super::precise_prefix::tests::{gpu, host, view};
    use super::super::precise_prefix::Unknown;
    use super::super::testing::*;
    use super::*;

    fn policy(view: Arc<dyn PrefixView>) -> PredictedTtft {
        PredictedTtft::new(view, CacheAwareConfig::default(), Duration::from_secs(60))
    }

    fn queued(c: &mut [Candidate], tokens: &[u64]) {
        for (x, &t) in c.iter_mut().zip(tokens) {
            x.queued_prefill = t;
        }
    }

    /// Plain text of `n` tokens (four characters each) starting with `head`.
    fn prompt(head: &str, n: usize) -> String {
        let mut s = head.to_string();
        while s.len() < n * 4 {
            s.push_str(" filler");
        }
        s.truncate(n * 4);
        s
    }

    #[test]
    fn a_held_prefix_wins_until_the_queue_in_front_of_it_costs_more_than_it_saves() {
        let p = policy(Arc::new(Unknown));
        let now = Instant::now();
        let mut c = cands(&[0, 0, 0]);
        let doc = prompt("a long shared document", 1000);
        // Nothing held anywhere: the least loaded; it now holds the text.
        let first = p.place(&c, &text(&doc), now).unwrap();
        assert_eq!(first.index, 0);
        assert_eq!(first.prefill_tokens, Some(1000));
        // The same document with a question after it: w0 holds 1000 of its 1,100 tokens.
        let follow = format!("{doc}{}", prompt(" and a question", 100));
        queued(&mut c, &[500, 0, 0]);
        let at = p.place(&c, &text(&follow), now).unwrap();
        assert_eq!(at.index, 0, "500 queued + 100 to compute beat 1,100");
        assert_eq!(at.prefill_tokens, Some(100));
        // A queue longer than what the prefix saves sends it elsewhere, though w0 holds it.
        queued(&mut c, &[1200, 0, 300]);
        let away = p.place(&c, &text(&follow), now).unwrap();
        assert_eq!(away.index, 1, "1,200 + 100 on w0, 0 + 1,100 on w1");
        assert_eq!(away.prefill_tokens, Some(1100));
        // w1 was sent the text: it now holds it too, and its queue is shorter.
        queued(&mut c, &[1200, 10, 300]);
        assert_eq!(p.place(&c, &text(&follow), now).unwrap().index, 1);
    }

    #[test]
    fn the_index_prices_what_each_worker_holds_by_tier_where_the_tree_does_not_know() {
        // Blocks of 16 tokens: w0 holds 4 on its device (64 tokens saved), w1 10 on its host
        // (10 × 16 × 0.8 = 128 saved); w2's events are not followed.
        let p = policy(view(&[(0, gpu(4)), (1, host(10))]));
        let now = Instant::now();
        let ids: Vec<u32> = (0..200).collect();
        let req = RouteInput {
            tokens: Some(&ids),
            ..RouteInput::default()
        };
        let mut c = cands(&[0, 0, 0]);
        let placed = p.place(&c, &req, now).unwrap();
        assert_eq!((placed.index, placed.prefill_tokens), (1, Some(72)));
        // 65 tokens queued on w1 make w0 (136) the shorter wait than w1 (72 + 65).
        queued(&mut c, &[0, 65, 0]);
        assert_eq!(p.place(&c, &req, now).unwrap().index, 0);
    }

    #[test]
    fn a_session_keeps_its_worker_while_its_last_turn_outweighs_the_queue_and_not_once_idle() {
        let p = PredictedTtft::new(
            Arc::new(Unknown),
            CacheAwareConfig::default(),
            Duration::from_secs(10),
        );
        let t0 = Instant::now();
        let mut c = cands(&[0, 0]);
        // Turns that share no text, so the tree cannot tell: only the session can.
        let (first, second, third) = (prompt("x", 400), prompt("y", 500), prompt("z", 600));
        fn turn(t: &str) -> RouteInput<'_> {
            RouteInput {
                routing_key: Some("conversation-1"),
                ..text(t)
            }
        }
        assert_eq!(p.place(&c, &turn(&first), t0).unwrap().index, 0);
        // The next turn (500 tokens) on w0 computes 100; w0 has 300 queued, w1 none: 400 < 500.
        queued(&mut c, &[300, 0]);
        let placed = p.place(&c, &turn(&second), t0).unwrap();
        assert_eq!((placed.index, placed.prefill_tokens), (0, Some(100)));
        // Idle past the TTL: the session no longer counts, and w1's empty queue wins.
        let later = t0 + Duration::from_secs(11);
        assert_eq!(p.place(&c, &turn(&third), later).unwrap().index, 1);
        assert_eq!(p.sessions(), 1);
        p.evict(later + Duration::from_secs(11));
        assert_eq!(p.sessions(), 0);
    }

    #[test]
    fn sessions_are_bounded_and_forget_a_removed_worker() {
        let p = policy(Arc::new(Unknown));
        let now = Instant::now();
        let c = cands(&[0, 0]);
        for i in 0..MAX_SESSIONS + 10 {
            let key = format!("s{i}");
            let r = RouteInput {
                routing_key: Some(&key),
                ..text("hello")
            };
            p.place(&c, &r, now + Duration::from_micros(i as u64));
        }
        assert!(p.sessions() <= MAX_SESSIONS, "{}", p.sessions());
        assert!(p.sessions() > MAX_SESSIONS / 2, "{}", p.sessions());
        p.on_worker_removed("http://w0:1");
        p.on_worker_removed("http://w1:1");
        assert_eq!(p.sessions(), 0);
    }
}
