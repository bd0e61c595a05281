//! The history checker: verifies a recorded history of puts, gets and removes against the
//! pool's promise as `docs/consistency.md` states it, rule for rule. Pure: histories are data,
//! so the checker is tested on hand-written bad histories.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What an operation returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The pool said it was done.
    Ok,
    /// The pool said it was not done, before doing anything.
    Failed,
    /// Timed out or lost its connection: it may or may not have taken effect.
    Unknown,
}

/// What a get returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Read {
    /// A value, by its digest.
    Value(u64),
    /// The pool says the key has no value.
    Miss,
    /// The reader could not tell.
    Error,
}

/// What one operation of a history did, with its outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Put { digest: u64, outcome: Outcome },
    Get { read: Read },
    Remove { outcome: Outcome },
}

/// One operation: its key, what it was, and when it was invoked and completed (microseconds
/// on the clock the test's processes share).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub key: String,
    pub kind: Kind,
    pub invoked: u64,
    pub completed: u64,
    /// Why it failed or could not tell, for people (the checker does not look).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An eviction the master logged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eviction {
    pub key: String,
    pub at: u64,
}

/// A broken rule, with the operations (indexes into the history) that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Rule 1: the value read was never put to this key (or only by a failed put, or by one
    /// invoked after the get completed).
    Foreign { get: usize, digest: u64 },
    /// Rule 2: the value read was replaced (by `by`, an ok put) before the get began.
    Stale { get: usize, put: usize, by: usize },
    /// Rule 3: the value read was removed (by `by`, an ok remove) before the get began.
    Resurrected { get: usize, put: usize, by: usize },
    /// Rule 4: an acknowledged put's value was missing with no eviction or removal to explain.
    Lost { get: usize, put: usize },
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub gets: u64,
    pub get_errors: u64,
    pub misses: u64,
    /// Misses explained by a logged eviction or a removal.
    pub explained_misses: u64,
}

/// `a` precedes `b`: it completed before `b` was invoked.
fn precedes(a: &Op, b: &Op) -> bool {
    a.completed < b.invoked
}

/// Checks `history` against the promise, with the master's logged `evictions`.
pub fn check(history: &[Op], evictions: &[Eviction]) -> Report {
    let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, op) in history.iter().enumerate() {
        by_key.entry(op.key.as_str()).or_default().push(i);
    }
    let mut evicted: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in evictions {
        evicted.entry(e.key.as_str()).or_default().push(e.at);
    }
    let mut report = Report::default();
    for (key, ops) in &by_key {
        let evicted = evicted.get(key).map_or(&[][..], Vec::as_slice);
        for &g in ops {
            let Kind::Get { read } = history[g].kind else {
                continue;
            };
            report.gets += 1;
            match read {
                Read::Error => report.get_errors += 1,
                Read::Value(digest) => check_value(history, ops, g, digest, &mut report),
                Read::Miss => check_miss(history, ops, evicted, g, &mut report),
            }
        }
    }
    report
}

/// Rules 1–3 for get `g` that read `digest`.
fn check_value(history: &[Op], ops: &[usize], g: usize, digest: u64, report: &mut Report) {
    let get = &history[g];
    let source = ops.iter().copied().find(|&p| {
        matches!(history[p].kind, Kind::Put { digest: d, outcome } if d == digest && outcome != Outcome::Failed)
            && history[p].invoked < get.completed
    });
    let Some(p) = source else {
        report
            .violations
            .push(Violation::Foreign { get: g, digest });
        return;
    };
    let put = &history[p];
    // A put whose outcome is unknown may take effect after its client gave up (a request
    // delayed in the network still arrives): nothing surely follows it.
    if matches!(
        put.kind,
        Kind::Put {
            outcome: Outcome::Unknown,
            ..
        }
    ) {
        return;
    }
    for &o in ops {
        let other = &history[o];
        if o == p || !precedes(put, other) || !precedes(other, get) {
            continue;
        }
        match other.kind {
            Kind::Put {
                outcome: Outcome::Ok,
                ..
            } => report.violations.push(Violation::Stale {
                get: g,
                put: p,
                by: o,
            }),
            Kind::Remove {
                outcome: Outcome::Ok,
            } => report.violations.push(Violation::Resurrected {
                get: g,
                put: p,
                by: o,
            }),
            _ => {}
        }
    }
}

/// Rule 4 for get `g` that missed.
fn check_miss(history: &[Op], ops: &[usize], evicted: &[u64], g: usize, report: &mut Report) {
    report.misses += 1;
    let get = &history[g];
    let mut explained = true;
    for &p in ops {
        let put = &history[p];
        let acknowledged = matches!(
            put.kind,
            Kind::Put {
                outcome: Outcome::Ok,
                ..
            }
        );
        if !acknowledged || !precedes(put, get) {
            continue;
        }
        let (from, to) = (put.invoked, get.completed);
        let eviction = evicted.iter().any(|&t| from <= t && t <= to);
        let removal = ops.iter().any(|&r| {
            let op = &history[r];
            let Kind::Remove { outcome } = op.kind else {
                return false;
            };
            // An unknown remove may take effect after its client gave up: a request delayed
            // in the network still arrives.
            match outcome {
                Outcome::Failed => false,
                Outcome::Ok => op.invoked <= to && op.completed >= from,
                Outcome::Unknown => op.invoked <= to,
            }
        });
        if !eviction && !removal {
            explained = false;
            report.violations.push(Violation::Lost { get: g, put: p });
        }
    }
    if explained {
        report.explained_misses += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, kind: Kind, invoked: u64, completed: u64) -> Op {
        Op {
            key: key.into(),
            kind,
            invoked,
            completed,
            error: None,
        }
    }

    fn put(key: &str, digest: u64, invoked: u64, completed: u64, outcome: Outcome) -> Op {
        op(key, Kind::Put { digest, outcome }, invoked, completed)
    }

    fn get(key: &str, read: Read, invoked: u64, completed: u64) -> Op {
        op(key, Kind::Get { read }, invoked, completed)
    }

    fn remove(key: &str, invoked: u64, completed: u64, outcome: Outcome) -> Op {
        op(key, Kind::Remove { outcome }, invoked, completed)
    }

    use Outcome::{Failed, Ok as Done, Unknown};

    #[test]
    fn a_good_history_with_overlaps_unknowns_and_evictions_passes() {
        let h = vec![
            put("a", 1, 0, 10, Done),
            get("a", Read::Value(1), 11, 12),
            // Overlapping a replacement: old or new are both fine.
            put("a", 2, 20, 30, Done),
            get("a", Read::Value(1), 21, 25),
            get("a", Read::Value(2), 22, 28),
            // An unknown put may have taken effect.
            put("b", 7, 40, 50, Unknown),
            get("b", Read::Value(7), 60, 61),
            // A miss explained by an eviction.
            put("c", 9, 70, 71, Done),
            get("c", Read::Miss, 80, 81),
            // A miss explained by a remove, and an error, which proves nothing.
            put("d", 3, 90, 91, Done),
            remove("d", 92, 93, Done),
            get("d", Read::Miss, 94, 95),
            get("d", Read::Error, 96, 97),
        ];
        let r = check(
            &h,
            &[Eviction {
                key: "c".into(),
                at: 75,
            }],
        );
        assert_eq!(r.violations, vec![]);
        assert_eq!(
            (r.gets, r.get_errors, r.misses, r.explained_misses),
            (7, 1, 2, 2)
        );
    }

    #[test]
    fn a_stale_read_after_a_replacement_is_caught() {
        let h = vec![
            put("a", 1, 0, 10, Done),
            put("a", 2, 20, 30, Done),
            get("a", Read::Value(1), 40, 41),
        ];
        assert_eq!(
            check(&h, &[]).violations,
            vec![Violation::Stale {
                get: 2,
                put: 0,
                by: 1
            }]
        );
    }

    #[test]
    fn a_torn_or_foreign_value_is_caught() {
        let h = vec![
            put("a", 1, 0, 10, Done),
            put("b", 5, 0, 10, Done),
            // A torn value hashes to a digest nobody put.
            get("a", Read::Value(0xdead), 20, 21),
            // Another key's value.
            get("a", Read::Value(5), 22, 23),
            // A failed put's value, and one put only after the get completed.
            put("c", 8, 0, 1, Failed),
            get("c", Read::Value(8), 30, 31),
            get("c", Read::Value(9), 32, 33),
            put("c", 9, 40, 41, Done),
        ];
        let v = check(&h, &[]).violations;
        assert_eq!(v.len(), 4, "{v:?}");
        assert!(v.iter().all(|x| matches!(x, Violation::Foreign { .. })));
    }

    #[test]
    fn a_resurrected_key_is_caught() {
        let h = vec![
            put("a", 1, 0, 10, Done),
            remove("a", 20, 30, Done),
            get("a", Read::Value(1), 40, 41),
        ];
        assert_eq!(
            check(&h, &[]).violations,
            vec![Violation::Resurrected {
                get: 2,
                put: 0,
                by: 1
            }]
        );
        // A remove that failed, or overlaps the get, proves nothing.
        let h = vec![
            put("a", 1, 0, 10, Done),
            remove("a", 20, 30, Failed),
            remove("a", 35, 45, Done),
            get("a", Read::Value(1), 40, 41),
        ];
        assert_eq!(check(&h, &[]).violations, vec![]);
    }

    #[test]
    fn a_lost_acknowledged_put_is_caught_unless_an_eviction_or_removal_explains_it() {
        let h = vec![put("a", 1, 0, 10, Done), get("a", Read::Miss, 20, 21)];
        assert_eq!(
            check(&h, &[]).violations,
            vec![Violation::Lost { get: 1, put: 0 }]
        );
        // An eviction before the put was invoked explains nothing.
        let early = [Eviction {
            key: "a".into(),
            at: 0,
        }];
        let h = vec![put("a", 1, 5, 10, Done), get("a", Read::Miss, 20, 21)];
        assert_eq!(check(&h, &early).violations.len(), 1);
        // A replacement alone explains no miss.
        let h = vec![
            put("a", 1, 0, 10, Done),
            put("a", 2, 11, 12, Done),
            get("a", Read::Miss, 20, 21),
        ];
        assert_eq!(check(&h, &[]).violations.len(), 2, "both values lost");
        // A put that is not acknowledged promises nothing.
        let h = vec![put("a", 1, 0, 10, Unknown), get("a", Read::Miss, 20, 21)];
        assert_eq!(check(&h, &[]).violations, vec![]);
        // A remove whose client gave up before the put began may still land after it; one
        // that was done before the put began explains nothing.
        let h = vec![
            remove("a", 0, 3, Unknown),
            put("a", 1, 5, 10, Done),
            get("a", Read::Miss, 20, 21),
        ];
        assert_eq!(check(&h, &[]).violations, vec![]);
        let h = vec![
            remove("a", 0, 3, Done),
            put("a", 1, 5, 10, Done),
            get("a", Read::Miss, 20, 21),
        ];
        assert_eq!(check(&h, &[]).violations.len(), 1);
    }
}
