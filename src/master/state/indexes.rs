//! What the master keeps beside its object map so that nothing periodic walks every object:
//! counts of readable keys and soft-pinned keys, soft pins by expiry, and unfinished puts by
//! age, and the bytes each tenant holds. The state machine tells it each time a current
//! version or a pending put begins or ends; housekeeping then touches only what is due.

use crate::master::tenants::Usage;
use std::collections::BTreeMap;
use std::time::Instant;

/// What the master keeps beside its objects so that nothing periodic walks them all.
#[derive(Debug, Default)]
pub struct Indexes {
    keys: u64,
    /// Bytes of values by tenant, current versions and pending puts alike.
    usage: Usage,
    soft_pinned: u64,
    /// Soft pins by (expiry, version): the key, to clear the pin when it runs out.
    pin_expiry: BTreeMap<(Instant, u64), String>,
    /// Unfinished puts by (start, version): the key.
    pending_by_age: BTreeMap<(Instant, u64), String>,
}

impl Indexes {
    /// Readable keys (objects with a current version).
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// Objects whose soft pin has not yet been seen to run out.
    pub fn soft_pinned(&self) -> u64 {
        self.soft_pinned
    }

    /// Puts begun and not yet ended.
    pub fn pending(&self) -> u64 {
        self.pending_by_age.len() as u64
    }

    /// Bytes of values by tenant.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// `key` got a current version of `size` bytes (it had none, or the old one was ended
    /// first).
    pub fn version_began(
        &mut self,
        key: &str,
        version: u64,
        size: u64,
        soft_pin_until: Option<Instant>,
    ) {
        self.keys += 1;
        self.usage.add(key, size);
        if let Some(until) = soft_pin_until {
            self.soft_pinned += 1;
            self.pin_expiry.insert((until, version), key.to_owned());
        }
    }

    /// `key`'s current version of `size` bytes went (replaced, removed, evicted, lost).
    pub fn version_ended(
        &mut self,
        key: &str,
        version: u64,
        size: u64,
        soft_pin_until: Option<Instant>,
    ) {
        self.keys = self.keys.saturating_sub(1);
        self.usage.sub(key, size);
        if let Some(until) = soft_pin_until {
            self.soft_pinned = self.soft_pinned.saturating_sub(1);
            self.pin_expiry.remove(&(until, version));
        }
    }

    /// Takes the soft pins that ran out by `now`: (key, version, expiry). The caller clears
    /// them on the versions, which then end without one.
    pub fn pins_expired(&mut self, now: Instant) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        while let Some(entry) = self.pin_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, version), key) = entry.remove_entry();
            self.soft_pinned = self.soft_pinned.saturating_sub(1);
            out.push((key, version));
        }
        out
    }

    /// A put of `size` bytes of `key` started.
    pub fn pending_began(&mut self, key: &str, started: Instant, version: u64, size: u64) {
        self.usage.add(key, size);
        self.pending_by_age
            .insert((started, version), key.to_owned());
    }

    /// A put of `size` bytes of `key` ended (committed, revoked, dropped).
    pub fn pending_ended(&mut self, key: &str, started: Instant, version: u64, size: u64) {
        if self.pending_by_age.remove(&(started, version)).is_some() {
            self.usage.sub(key, size);
        }
    }

    /// Keys of the unfinished puts started before `before`, oldest first.
    pub fn pending_started_before(&self, before: Instant) -> Vec<String> {
        self.pending_by_age
            .iter()
            .take_while(|((started, _), _)| *started < before)
            .map(|(_, key)| key.clone())
            .collect()
    }

    /// Keys of every unfinished put.
    pub fn pending_keys(&self) -> impl Iterator<Item = &str> {
        self.pending_by_age.values().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pins_run_out_in_expiry_order_and_ended_versions_leave_no_trace() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut ix = Indexes::default();
        ix.version_began("a", 1, 10, Some(at(30)));
        ix.version_began("b", 2, 10, Some(at(10)));
        ix.version_began("c", 3, 10, None);
        ix.version_began("d", 4, 10, Some(at(20)));
        assert_eq!((ix.keys(), ix.soft_pinned()), (4, 3));
        ix.version_ended("d", 4, 10, Some(at(20)));
        assert_eq!((ix.keys(), ix.soft_pinned()), (3, 2));
        assert!(ix.pins_expired(at(9)).is_empty());
        assert_eq!(
            ix.pins_expired(at(30)),
            vec![("b".into(), 2), ("a".into(), 1)]
        );
        assert_eq!((ix.keys(), ix.soft_pinned()), (3, 0));
        // Their pins cleared by the caller, the versions end without one.
        ix.version_ended("a", 1, 10, None);
        assert_eq!((ix.keys(), ix.soft_pinned()), (2, 0));
        assert_eq!(ix.usage().of(crate::master::tenants::DEFAULT_TENANT), 20);
    }

    #[test]
    fn pending_puts_come_out_oldest_first() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut ix = Indexes::default();
        ix.pending_began("late", at(20), 9, 1);
        ix.pending_began("early", at(5), 7, 1);
        ix.pending_began("mid", at(10), 8, 1);
        assert_eq!(ix.pending_started_before(at(11)), vec!["early", "mid"]);
        ix.pending_ended("early", at(5), 7, 1);
        ix.pending_ended("early", at(5), 7, 1);
        assert_eq!(ix.usage().of("default"), 2, "an end told twice counts once");
        assert_eq!(ix.pending_started_before(at(100)), vec!["mid", "late"]);
        assert_eq!(ix.pending(), 2);
        assert_eq!(ix.pending_keys().count(), 2);
    }
}
