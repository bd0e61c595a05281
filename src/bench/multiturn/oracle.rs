//! The hit rate no routing can beat: an oracle that knows every cache exactly and never loses a
//! page. A request's best possible hit is the longest page-aligned prefix of its prompt that an
//! earlier request already computed (its prompt and its answer, which an engine keeps, as
//! SGLang's radix tree does) anywhere: any engine's device or host, or the pool, which every
//! engine can read; less the last token, which an engine always computes (as SGLang does). A policy's hit rate against this one says how much of the reusable prefix its choices
//! found; what it left is lost to routing or to eviction.
//!
//! Pages are named as the engines and their KV events name them (`kv_events::hash`), so a page
//! here is a page there.

use crate::kv_events::hash::page_digests;
use std::collections::HashSet;

/// The hit rate no routing can beat: every page computed so far, anywhere.
pub struct Oracle {
    page_size: usize,
    /// Every page prefilled so far.
    seen: HashSet<[u8; 32]>,
}

impl Oracle {
    /// An oracle of pages of `page_size` tokens, nothing cached yet.
    pub fn new(page_size: usize) -> Oracle {
        Oracle {
            page_size: page_size.max(1),
            seen: HashSet::new(),
        }
    }

    /// The tokens of `prompt` an engine could have served from cache, had it been sent where
    /// every page it needs was.
    pub fn best_hit(&self, prompt: &[u32]) -> usize {
        let held = page_digests(prompt, self.page_size)
            .iter()
            .take_while(|d| self.seen.contains(*d))
            .count();
        (held * self.page_size).min(prompt.len().saturating_sub(1))
    }

    /// `sequence` (a request's prompt and answer) was computed: its full pages are cached from
    /// now on.
    pub fn prefilled(&mut self, sequence: &[u32]) {
        self.seen.extend(page_digests(sequence, self.page_size));
    }

    /// Pages seen so far.
    pub fn pages(&self) -> usize {
        self.seen.len()
    }
}

/// A run's hit rate against the oracle's: cached over prompt tokens, each side.
pub fn hit_rates(records: &[super::summary::Record]) -> (f64, f64) {
    let prompt: usize = records.iter().map(|r| r.prompt_len).sum();
    let cached: usize = records.iter().map(|r| r.cached_tokens).sum();
    let best: usize = records.iter().map(|r| r.oracle_cached).sum();
    let rate = |n: usize| {
        if prompt == 0 {
            0.0
        } else {
            n as f64 / prompt as f64
        }
    };
    (rate(cached), rate(best))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_hit_is_the_prefilled_prefix_in_whole_pages_less_the_last_token() {
        let mut o = Oracle::new(4);
        let first: Vec<u32> = (0..10).collect();
        assert_eq!(o.best_hit(&first), 0, "nothing prefilled yet");
        o.prefilled(&first);
        assert_eq!(o.pages(), 2, "two full pages of ten tokens");
        // The next round: the first prompt and more.
        let next: Vec<u32> = (0..20).collect();
        assert_eq!(o.best_hit(&next), 8);
        // The same prompt again: every page, less the last token.
        let eight: Vec<u32> = (0..8).collect();
        assert_eq!(o.best_hit(&eight), 7);
        // A prompt that differs in its first page shares nothing after it (pages chain).
        let other: Vec<u32> = std::iter::once(99).chain(1..20).collect();
        assert_eq!(o.best_hit(&other), 0);
        assert_eq!(o.best_hit(&[]), 0);
    }

    #[test]
    fn hit_rates_weigh_requests_by_their_prompts() {
        use super::super::summary::Record;
        let r = |prompt_len, cached_tokens, oracle_cached| Record {
            prompt_len,
            cached_tokens,
            oracle_cached,
            ..Record::default()
        };
        let (got, best) = hit_rates(&[r(100, 0, 0), r(300, 150, 270)]);
        assert!((got - 0.375).abs() < 1e-9, "{got}");
        assert!((best - 0.675).abs() < 1e-9, "{best}");
        assert_eq!(hit_rates(&[]), (0.0, 0.0));
    }
}
