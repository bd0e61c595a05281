//! Coordinated rollouts with a deadline (RBG issue #22): the roles of a coordination rule
//! whose `rollingUpdate` has an `order` or a `progressDeadlineSeconds` roll out as one, and the
//! group's `status.coordinatedRollouts` says where each such rollout is. A rollout that has not
//! finished (every role's instances updated and Ready) within the deadline is rolled back:
//! every role's revision from before is written back into the spec (as `revisions` does for a
//! rollback asked by hand) and, while it rolls back, the order is reversed (prefill back
//! before decode when decode led). Pure: `group.rs` writes what this decides.

use super::model::Coordination;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a rule's rollout is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// The roles are moving to `to`.
    Progressing,
    /// Every role runs `to`, updated and Ready.
    Complete,
    /// The deadline passed: the roles are going back to `from`, in reverse order.
    RollingBack,
    /// Every role runs `from` again.
    RolledBack,
}

/// One rule's rollout, as `status.coordinatedRollouts[]` keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tracked {
    /// The coordination rule's name.
    pub name: String,
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub started_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Each role's revision (hash) before the rollout.
    #[serde(default)]
    pub from: BTreeMap<String, String>,
    /// Each role's revision the rollout brings.
    #[serde(default)]
    pub to: BTreeMap<String, String>,
}

impl Tracked {
    /// `status.coordinatedRollouts` of a group object.
    pub fn all_of(group: &serde_json::Value) -> Vec<Tracked> {
        group
            .pointer("/status/coordinatedRollouts")
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }
}

/// One role as the tracker sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoleNow {
    /// The revision its instances below the partition keep.
    pub current: String,
    /// The revision its spec names.
    pub update: String,
    /// Every instance at `update` and Ready.
    pub done: bool,
}

/// What to do about one rule's rollout.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Record this.
    Keep(Tracked),
    /// Write `from` back into the spec (and record this, `RollingBack`).
    RollBack(Tracked),
}

/// Whether `rule` is one whose rollouts are tracked.
pub fn tracked(rule: &Coordination) -> bool {
    rule.rolling
        .as_ref()
        .is_some_and(|r| !r.order.is_empty() || r.progress_deadline_secs.is_some())
}

/// The next state of `rule`'s rollout, from what was recorded (`before`) and the roles now.
/// `None` for a rule that is not tracked or names no role of the group.
pub fn track(
    rule: &Coordination,
    before: Option<&Tracked>,
    roles: &BTreeMap<String, RoleNow>,
    now: DateTime<Utc>,
) -> Option<Verdict> {
    if !tracked(rule) {
        return None;
    }
    let deadline = rule.rolling.as_ref().and_then(|r| r.progress_deadline_secs);
    let members: Vec<(&String, &RoleNow)> = rule
        .roles
        .iter()
        .filter_map(|n| roles.get(n).map(|r| (n, r)))
        .collect();
    if members.is_empty() {
        return None;
    }
    let to: BTreeMap<String, String> = members
        .iter()
        .map(|(n, r)| ((*n).clone(), r.update.clone()))
        .collect();
    let done = members.iter().all(|(_, r)| r.done);
    let moving = members.iter().any(|(_, r)| r.current != r.update);
    let order = rule
        .rolling
        .as_ref()
        .map(|r| r.order.clone())
        .unwrap_or_default();
    let with = |phase: Phase, message: String, b: &Tracked| Tracked {
        phase,
        message,
        ..b.clone()
    };
    if let Some(b) = before {
        match b.phase {
            Phase::RollingBack if to == b.from => {
                return Some(Verdict::Keep(if done {
                    with(
                        Phase::RolledBack,
                        "every role runs its revision from before the rollout again".into(),
                        b,
                    )
                } else {
                    b.clone()
                }));
            }
            // Our write of the old templates has not landed yet: write it again.
            Phase::RollingBack if to == b.to => return Some(Verdict::RollBack(b.clone())),
            Phase::Progressing if to == b.to => {
                if done {
                    return Some(Verdict::Keep(with(
                        Phase::Complete,
                        "every role runs the new revision, updated and Ready".into(),
                        b,
                    )));
                }
                let started = DateTime::parse_from_rfc3339(&b.started_at)
                    .map(|t| t.with_timezone(&Utc))
                    .unwrap_or(now);
                if let Some(d) = deadline {
                    if now - started >= chrono::Duration::seconds(d as i64) {
                        let mut back = order.clone();
                        back.reverse();
                        let message = format!(
                            "not finished within its progress deadline of {d} s; every role \
                             goes back to its revision from before{}",
                            if back.is_empty() {
                                String::new()
                            } else {
                                format!(", in the order {}", back.join(", "))
                            }
                        );
                        return Some(Verdict::RollBack(with(Phase::RollingBack, message, b)));
                    }
                }
                return Some(Verdict::Keep(b.clone()));
            }
            Phase::Complete | Phase::RolledBack if to == b.to || to == b.from => {
                return Some(Verdict::Keep(b.clone()));
            }
            _ => {}
        }
    }
    // A new spec: a rollout when some role's instances keep another revision.
    let from: BTreeMap<String, String> = members
        .iter()
        .map(|(n, r)| ((*n).clone(), r.current.clone()))
        .collect();
    let (phase, message) = if moving && !done {
        let lead = if order.is_empty() {
            String::new()
        } else {
            format!(" in the order {}", order.join(", "))
        };
        (Phase::Progressing, format!("rolling out{lead}"))
    } else {
        (Phase::Complete, "every role runs its revision".into())
    };
    Some(Verdict::Keep(Tracked {
        name: rule.name.clone(),
        phase,
        started_at: if phase == Phase::Progressing {
            now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        } else {
            String::new()
        },
        message,
        from,
        to,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::model::parse_policy;
    use serde_json::json;

    fn rule() -> Coordination {
        let list = json!([{"name": "pd", "roles": ["prefill", "decode"],
            "strategy": {"rollingUpdate": {"order": ["decode", "prefill"],
                                           "progressDeadlineSeconds": 60}}}]);
        parse_policy(&json!({"spec": {"policies": list}}))
            .unwrap()
            .remove(0)
    }

    fn roles(current: &str, update: &str, done: bool) -> BTreeMap<String, RoleNow> {
        ["prefill", "decode"]
            .into_iter()
            .map(|n| {
                let r = RoleNow {
                    current: current.into(),
                    update: update.into(),
                    done,
                };
                (n.to_string(), r)
            })
            .collect()
    }

    fn keep(v: Option<Verdict>) -> Tracked {
        match v {
            Some(Verdict::Keep(t)) => t,
            other => panic!("not kept: {other:?}"),
        }
    }

    #[test]
    fn a_rollout_is_tracked_to_completion() {
        let t0 = Utc::now();
        let steady = keep(track(&rule(), None, &roles("a", "a", true), t0));
        assert_eq!(steady.phase, Phase::Complete);
        let started = keep(track(&rule(), Some(&steady), &roles("a", "b", false), t0));
        assert_eq!(started.phase, Phase::Progressing);
        assert_eq!(started.from["decode"], "a");
        assert_eq!(started.to["decode"], "b");
        assert!(
            started.message.contains("decode, prefill"),
            "{}",
            started.message
        );
        let later = t0 + chrono::Duration::seconds(30);
        let still = keep(track(
            &rule(),
            Some(&started),
            &roles("a", "b", false),
            later,
        ));
        assert_eq!(still, started);
        let done = keep(track(
            &rule(),
            Some(&started),
            &roles("b", "b", true),
            later,
        ));
        assert_eq!(done.phase, Phase::Complete);
    }

    #[test]
    fn past_the_deadline_it_rolls_back_in_reverse_order_until_back() {
        let t0 = Utc::now();
        let started = keep(track(&rule(), None, &roles("a", "b", false), t0));
        let late = t0 + chrono::Duration::seconds(61);
        let Some(Verdict::RollBack(back)) =
            track(&rule(), Some(&started), &roles("a", "b", false), late)
        else {
            panic!("rolled back");
        };
        assert_eq!(back.phase, Phase::RollingBack);
        assert!(back.message.contains("prefill, decode"), "{}", back.message);
        // Until the spec names `from` again, the write is asked again.
        assert!(matches!(
            track(&rule(), Some(&back), &roles("a", "b", false), late),
            Some(Verdict::RollBack(_))
        ));
        let going = keep(track(&rule(), Some(&back), &roles("a", "a", false), late));
        assert_eq!(going.phase, Phase::RollingBack);
        let back_done = keep(track(&rule(), Some(&going), &roles("a", "a", true), late));
        assert_eq!(back_done.phase, Phase::RolledBack);
        // It stays said until the spec changes again.
        let after = keep(track(
            &rule(),
            Some(&back_done),
            &roles("a", "a", true),
            late,
        ));
        assert_eq!(after.phase, Phase::RolledBack);
        let next = keep(track(
            &rule(),
            Some(&back_done),
            &roles("a", "c", false),
            late,
        ));
        assert_eq!(next.phase, Phase::Progressing);
    }

    #[test]
    fn untracked_rules_and_bad_orders() {
        let list = json!([{"name": "s", "roles": ["prefill", "decode"],
            "strategy": {"rollingUpdate": {"maxSkew": "50%"}}}]);
        let plain = parse_policy(&json!({"spec": {"policies": list}}))
            .unwrap()
            .remove(0);
        assert_eq!(
            track(&plain, None, &roles("a", "b", false), Utc::now()),
            None
        );
        let bad = json!([{"name": "s", "roles": ["prefill"],
            "strategy": {"rollingUpdate": {"order": ["decode"]}}}]);
        let e = parse_policy(&json!({"spec": {"policies": bad}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"decode\""), "{e}");
    }
}
