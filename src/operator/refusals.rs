//! Writes the API server refused, held back: an object whose last write was refused is not
//! written again until its backoff has passed (100 ms, doubling to 30 s), however many watch
//! events reconcile its group meanwhile; a write that goes through clears it. Without this, a
//! group whose pods are starting asks again at every pod's status change (a real API server
//! refusing the slices saw about eleven tries in the first second). Pure: callers give `now`.

use crate::backoff::Backoff;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const FIRST: Duration = Duration::from_millis(100);
const MOST: Duration = Duration::from_secs(30);

/// The objects whose last write was refused, each with its backoff.
#[derive(Debug, Default)]
pub struct Refusals {
    /// Object key → (refusals in a row, when it may be written again, the last refusal).
    held: HashMap<String, (u32, Instant, String)>,
}

impl Refusals {
    /// Why `key` is not to be written now, if it is held.
    pub fn held(&self, key: &str, now: Instant) -> Option<&str> {
        self.held
            .get(key)
            .filter(|(_, until, _)| now < *until)
            .map(|(_, _, why)| why.as_str())
    }

    /// A write of `key` was refused at `now` for `why`.
    pub fn refused(&mut self, key: &str, now: Instant, why: String) {
        let n = self.held.get(key).map_or(0, |h| h.0).saturating_add(1);
        let wait = Backoff::new(FIRST, MOST).nth(n);
        self.held.insert(key.to_string(), (n, now + wait, why));
    }

    /// A write of `key` went through (or it is gone): nothing held.
    pub fn written(&mut self, key: &str) {
        self.held.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_write_waits_longer_each_time_and_a_success_clears_it() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        assert_eq!(r.held("ns/s", t0), None);
        r.refused("ns/s", t0, "500".into());
        assert_eq!(r.held("ns/s", t0), Some("500"));
        let first = (1..).find(|ms| r.held("ns/s", t0 + Duration::from_millis(*ms)).is_none());
        r.refused("ns/s", t0, "500".into());
        let second = (1..).find(|ms| r.held("ns/s", t0 + Duration::from_millis(*ms)).is_none());
        assert!(second > first, "{first:?} {second:?}");
        assert_eq!(
            r.held("ns/other", t0),
            None,
            "one object's refusals hold no other"
        );
        r.written("ns/s");
        assert_eq!(r.held("ns/s", t0), None);
        // Capped.
        for _ in 0..40 {
            r.refused("ns/s", t0, "500".into());
        }
        assert_eq!(r.held("ns/s", t0 + MOST), None);
    }
}
