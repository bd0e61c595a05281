//! `prefix_hash` (SGLang Model Gateway's): the head of a request's prompt hashed onto the
//! workers, so requests that begin alike (one system prompt, one document, one conversation's
//! turns) go where that head is cached, with no tree to keep: a lighter `cache_aware`.
//!
//! The head is the first `prefix_token_count` tokens: the request's own token ids
//! (`input_ids`, or the router's tokenizer's ids with `--tokenizer-path`), else the first
//! `4 × prefix_token_count` bytes of text (about four characters a token; SMG's HTTP path has
//! no tokens and hashes nothing). The worker is the head's rendezvous-hash winner, so a worker
//! leaving moves only its own heads. A winner whose load is above `prefix_hash_load_factor`
//! times the average (counting the request) gives way to the least loaded worker within it;
//! when every worker is above it, the winner keeps the request. A request with no text goes to
//! the least loaded worker.

use super::{
    least_loaded, rendezvous_hash, Candidate, LoadBalancingPolicy, PolicyKind, RouteInput, TextForm,
};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Bytes of text that stand for one token when the request has no token ids.
pub const BYTES_PER_TOKEN: usize = 4;

crate::config::settings::settings! {
    /// The `prefix_hash` policy's settings (SMG's names and defaults).
    #[derive(Clone, Copy, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct PrefixHashConfig;

    /// The `prefix_hash` policy's flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Policies")]
    pub struct PrefixHashArgs {}

    settings {
        /// `prefix_hash` policy: tokens of the prompt's head that are hashed (without token
        /// ids, four bytes of text a token).
        #[arg(long)]
        prefix_token_count: usize = 256;
        /// `prefix_hash` policy: a worker with more than this times the average load gives way
        /// to the least loaded.
        #[arg(id = "prefix_hash_load_factor", long = "prefix-hash-load-factor")]
        #[serde(rename = "prefix_hash_load_factor")]
        load_factor: f64 = 1.25;
    }
}

impl PrefixHashConfig {
    /// Why these settings cannot be used, naming the setting.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.prefix_token_count == 0 {
            return Err(("router.prefix_token_count", "must be at least 1".into()));
        }
        if !(self.load_factor.is_finite() && self.load_factor >= 1.0) {
            return Err((
                "router.prefix_hash_load_factor",
                format!("must be at least 1, got {}", self.load_factor),
            ));
        }
        Ok(())
    }
}

/// The `prefix_hash` policy: the prompt's head hashed onto the workers.
pub struct PrefixHash {
    cfg: PrefixHashConfig,
}

impl PrefixHash {
    /// The policy by `cfg`.
    pub fn new(cfg: PrefixHashConfig) -> PrefixHash {
        PrefixHash { cfg }
    }

    /// The head of the request that is hashed.
    fn head<'a>(&self, request: &RouteInput<'a>) -> &'a str {
        let text = request.text;
        let n = self.cfg.prefix_token_count;
        let bytes = match request.form {
            // Ids separated by single spaces: the head ends before the n-th space.
            TextForm::SpacedIds => {
                return match text.match_indices(' ').nth(n - 1) {
                    Some((at, _)) => &text[..at],
                    None => text,
                }
            }
            // Two 4-byte characters a token.
            TextForm::TokenChars => n.saturating_mul(8),
            TextForm::Text => n.saturating_mul(BYTES_PER_TOKEN),
        };
        let mut end = text.len().min(bytes);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        &text[..end]
    }

    /// Whether a worker with `load` requests in flight may take one more, when the workers
    /// together have `total` (SMG's rule: the average counts the incoming request).
    fn load_ok(&self, load: usize, total: usize, workers: usize) -> bool {
        if total == 0 || workers == 0 {
            return true;
        }
        let average = (total + 1) as f64 / workers as f64;
        load as f64 <= average * self.cfg.load_factor
    }
}

impl LoadBalancingPolicy for PrefixHash {
    fn kind(&self) -> PolicyKind {
        PolicyKind::PrefixHash
    }

    fn select(&self, c: &[Candidate], request: &RouteInput, _: Instant) -> Option<usize> {
        let head = self.head(request);
        if head.is_empty() {
            return least_loaded(c);
        }
        let winner = (0..c.len())
            .max_by_key(|&i| rendezvous_hash(&[head.as_bytes(), c[i].url.as_bytes()]))?;
        let total: usize = c.iter().map(|w| w.load).sum();
        if self.load_ok(c[winner].load, total, c.len()) {
            return Some(winner);
        }
        (0..c.len())
            .filter(|&i| self.load_ok(c[i].load, total, c.len()))
            .min_by_key(|&i| (c[i].load, c[i].processed, i))
            .or(Some(winner))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn policy(tokens: usize) -> PrefixHash {
        PrefixHash::new(PrefixHashConfig {
            prefix_token_count: tokens,
            ..PrefixHashConfig::default()
        })
    }

    fn text(t: &str) -> RouteInput<'_> {
        RouteInput {
            text: t,
            ..RouteInput::default()
        }
    }

    #[test]
    fn requests_with_one_head_go_to_one_worker_and_heads_spread() {
        let p = policy(4);
        let now = Instant::now();
        let c = cands(&[0, 0, 0, 0]);
        // 4 tokens: 16 bytes of text.
        let a = p.select(&c, &text("You are a helper. Question one?"), now);
        assert_eq!(
            p.select(&c, &text("You are a helper. Question two?"), now),
            a
        );
        assert_eq!(p.select(&c, &text("You are a helper"), now), a);
        let mut per = [0; 4];
        for i in 0..400 {
            let t = format!("document {i:04} .........");
            per[p.select(&c, &text(&t), now).unwrap()] += 1;
        }
        assert!(per.iter().all(|&n| n > 50), "heads spread: {per:?}");
    }

    #[test]
    fn token_ids_are_counted_as_tokens() {
        let p = policy(3);
        let now = Instant::now();
        let c = cands(&[0, 0, 0, 0, 0, 0, 0, 0]);
        let ids = |t| RouteInput {
            text: t,
            form: TextForm::SpacedIds,
            ..RouteInput::default()
        };
        assert_eq!(p.head(&ids("1 2 3 4 5")), "1 2 3");
        assert_eq!(p.head(&ids("1 2")), "1 2");
        assert_eq!(
            p.select(&c, &ids("11 22 33 44"), now),
            p.select(&c, &ids("11 22 33 99 98 97"), now)
        );
        // Text is cut on a character boundary.
        assert_eq!(policy(1).head(&text("héllo")), "hél");
        // The tokenizer's ids: two characters (8 bytes) a token.
        let tokens = crate::router::tokenize::token_text(&[1, 2, 3, 4]);
        let head = policy(3).head(&RouteInput {
            text: &tokens,
            form: TextForm::TokenChars,
            ..RouteInput::default()
        });
        assert_eq!(head, crate::router::tokenize::token_text(&[1, 2, 3]));
    }

    #[test]
    fn a_loaded_winner_gives_way_to_the_least_loaded_within_the_bound() {
        let p = policy(4);
        let now = Instant::now();
        let head = text("a shared system prompt");
        let winner = p.select(&cands(&[0, 0, 0, 0]), &head, now).unwrap();
        // Loads 10 on the winner, 2 elsewhere: average (16 + 1) / 4 = 4.25, bound 5.3.
        let mut loads = [2; 4];
        loads[winner] = 10;
        let other = p.select(&cands(&loads), &head, now).unwrap();
        assert_ne!(other, winner);
        // Within the bound it keeps its requests.
        let mut loads = [4; 4];
        loads[winner] = 5;
        assert_eq!(p.select(&cands(&loads), &head, now), Some(winner));
        // SMG's arithmetic: total 100 over 4, bound (101 / 4) × 1.25 = 31.56.
        assert!(p.load_ok(31, 100, 4));
        assert!(!p.load_ok(32, 100, 4));
        assert!(p.load_ok(7, 0, 4), "no load at all");
    }

    #[test]
    fn without_text_the_least_loaded_is_chosen() {
        let p = policy(4);
        assert_eq!(
            p.select(&cands(&[3, 1, 2]), &text(""), Instant::now()),
            Some(1)
        );
    }

    #[test]
    fn settings_are_checked_by_name() {
        let bad = PrefixHashConfig {
            prefix_token_count: 0,
            ..PrefixHashConfig::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "router.prefix_token_count");
        let bad = PrefixHashConfig {
            load_factor: 0.5,
            ..PrefixHashConfig::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "router.prefix_hash_load_factor");
        assert!(PrefixHashConfig::default().check().is_ok());
    }
}
