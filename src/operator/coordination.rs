//! Coordination between roles, as pure functions of their counts.
//!
//! - Rolling update: roles of a rule advance so that their updated fractions stay within
//!   `maxSkew` of each other. Each role may reach `floor((slowest + maxSkew) × desired)`
//!   updated instances; when no role may move at all, the slowest (ties: the larger) moves by
//!   one, so that a rule can always finish even when `1/replicas` exceeds `maxSkew`. The
//!   result is a partition per role: instances with ordinal ≥ partition are updated.
//! - Scaling: while roles of a rule scale out, each may reach `ceil((slowest + maxSkew) ×
//!   desired)` instances (at least one more than now), and with a progression gate no role
//!   grows while another's new instances are not yet scheduled (`OrderScheduled`) or ready
//!   (`OrderReady`).

use crate::operator::model::{Coordination, IntOrPct, Progression};
use std::collections::BTreeMap;

/// What coordination needs of one role.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoleState {
    pub desired: u32,
    /// Instances that exist now.
    pub current: u32,
    pub ready: u32,
    pub updated: u32,
    pub scheduled: u32,
    /// Instances at the new revision and Ready.
    pub updated_ready: u32,
}

/// Overrides for one role's rollout this round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Override {
    pub partition: Option<u32>,
    pub max_unavailable: Option<IntOrPct>,
    /// The replica count to create up to this round (scaling coordination).
    pub replicas: Option<u32>,
}

fn frac(n: u32, d: u32) -> f64 {
    if d == 0 {
        1.0
    } else {
        n as f64 / d as f64
    }
}

/// Updated-instance targets for the roles of one rolling rule (`max_skew` in percent).
pub fn rolling_targets(states: &[(String, RoleState)], max_skew: u32) -> BTreeMap<String, u32> {
    let s = max_skew as f64 / 100.0;
    let live: Vec<&(String, RoleState)> = states.iter().filter(|(_, r)| r.desired > 0).collect();
    let mut out = BTreeMap::new();
    let Some(min_f) = live
        .iter()
        .map(|(_, r)| frac(r.updated, r.desired))
        .min_by(|a, b| a.total_cmp(b))
    else {
        return out;
    };
    let mut moved = false;
    for (name, r) in &live {
        let cap = ((min_f + s) * r.desired as f64 + 1e-9).floor() as u32;
        let t = r.updated.max(cap.min(r.desired));
        moved |= t > r.updated;
        out.insert(name.clone(), t);
    }
    if !moved {
        // Nobody may move within the skew: the slowest role (ties: the larger) takes one step.
        if let Some((name, r)) =
            live.iter()
                .filter(|(_, r)| r.updated < r.desired)
                .min_by(|a, b| {
                    frac(a.1.updated, a.1.desired)
                        .total_cmp(&frac(b.1.updated, b.1.desired))
                        .then(b.1.desired.cmp(&a.1.desired))
                })
        {
            out.insert(name.clone(), r.updated + 1);
        }
    }
    out
}

/// Updated-instance caps for roles rolled out in `order`: each role after the first at most
/// the share of its predecessor's instances that are updated and Ready.
pub fn ordered_targets(
    order: &[&String],
    states: &BTreeMap<String, RoleState>,
) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for pair in order.windows(2) {
        let (Some(lead), Some(follow)) = (states.get(pair[0]), states.get(pair[1])) else {
            continue;
        };
        let share = frac(lead.updated_ready, lead.desired);
        let cap = (share * follow.desired as f64 + 1e-9).floor() as u32;
        out.insert(pair[1].clone(), cap.min(follow.desired));
    }
    out
}

/// Replica targets for the roles of one scaling rule.
pub fn scaling_targets(
    states: &[(String, RoleState)],
    max_skew: u32,
    progression: &Progression,
) -> BTreeMap<String, u32> {
    let s = max_skew as f64 / 100.0;
    let growing: Vec<&(String, RoleState)> = states
        .iter()
        .filter(|(_, r)| r.current < r.desired)
        .collect();
    let mut out = BTreeMap::new();
    if growing.is_empty() {
        return out;
    }
    let held = states.iter().any(|(_, r)| match progression {
        Progression::None => false,
        Progression::OrderScheduled => r.scheduled < r.current,
        Progression::OrderReady => r.ready < r.current,
    });
    let min_p = growing
        .iter()
        .map(|(_, r)| frac(r.current, r.desired))
        .min_by(|a, b| a.total_cmp(b))
        .unwrap_or(1.0);
    for (name, r) in growing {
        let t = if held {
            r.current
        } else {
            let cap = ((min_p + s) * r.desired as f64 - 1e-9).ceil() as u32;
            let p = frac(r.current, r.desired);
            let floor = if p < min_p + s {
                r.current + 1
            } else {
                r.current
            };
            cap.max(floor).min(r.desired)
        };
        out.insert(name.clone(), t);
    }
    out
}

/// Overrides for every role named by a rule: partitions for rolling rules (the largest wins
/// across rules), replica caps for scaling rules (the smallest wins).
pub fn overrides(
    rules: &[Coordination],
    states: &BTreeMap<String, RoleState>,
    user_partition: &BTreeMap<String, u32>,
    reversed: &[String],
) -> BTreeMap<String, Override> {
    let mut out: BTreeMap<String, Override> = BTreeMap::new();
    for rule in rules {
        let members: Vec<(String, RoleState)> = rule
            .roles
            .iter()
            .filter_map(|r| states.get(r).map(|s| (r.clone(), *s)))
            .collect();
        if members.len() < 2 {
            continue;
        }
        if let Some(rolling) = &rule.rolling {
            for (name, st) in &members {
                let o = out.entry(name.clone()).or_default();
                if let Some(mu) = rolling.max_unavailable {
                    o.max_unavailable = Some(mu);
                }
                let mut part = user_partition.get(name).copied().unwrap_or(0);
                if let Some(p) = rolling.partition {
                    part = part.max(p.resolve(st.desired, true));
                }
                o.partition = Some(o.partition.unwrap_or(0).max(part));
            }
            if let Some(skew) = rolling.max_skew_pct {
                for (name, target) in rolling_targets(&members, skew) {
                    let st = states[&name];
                    let o = out.entry(name).or_default();
                    let p = st.desired.saturating_sub(target);
                    o.partition = Some(o.partition.unwrap_or(0).max(p));
                }
            }
            // An order: each role no further along than the one before it is updated and
            // Ready (reversed while the rule's rollout is rolled back).
            let mut order: Vec<&String> = rolling.order.iter().collect();
            if reversed.contains(&rule.name) {
                order.reverse();
            }
            for (name, target) in ordered_targets(&order, states) {
                let st = states[&name];
                let o = out.entry(name).or_default();
                let p = st.desired.saturating_sub(target);
                o.partition = Some(o.partition.unwrap_or(0).max(p));
            }
        }
        if let Some(scaling) = &rule.scaling {
            for (name, t) in scaling_targets(&members, scaling.max_skew_pct, &scaling.progression) {
                let o = out.entry(name).or_default();
                o.replicas = Some(o.replicas.map_or(t, |x| x.min(t)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(desired: u32, updated: u32) -> RoleState {
        RoleState {
            desired,
            current: desired,
            ready: desired,
            updated,
            scheduled: desired,
            updated_ready: updated,
        }
    }

    /// Simulates a coordinated rollout where each role updates up to its target each round;
    /// returns the largest skew between the roles' updated fractions seen.
    fn run(desired: &[u32], skew: u32) -> (f64, usize) {
        let mut updated = vec![0u32; desired.len()];
        let mut worst: f64 = 0.0;
        for round in 0..1000 {
            let states: Vec<(String, RoleState)> = desired
                .iter()
                .zip(&updated)
                .enumerate()
                .map(|(i, (d, u))| (format!("r{i}"), st(*d, *u)))
                .collect();
            if updated.iter().zip(desired).all(|(u, d)| u == d) {
                return (worst, round);
            }
            let t = rolling_targets(&states, skew);
            for (i, u) in updated.iter_mut().enumerate() {
                // One instance per round at most, as maxUnavailable 1 allows.
                let target = t[&format!("r{i}")];
                if *u < target {
                    *u += 1;
                }
            }
            let fr: Vec<f64> = updated
                .iter()
                .zip(desired)
                .map(|(u, d)| *u as f64 / *d as f64)
                .collect();
            let spread =
                fr.iter().cloned().fold(0.0, f64::max) - fr.iter().cloned().fold(1.0, f64::min);
            worst = worst.max(spread);
        }
        panic!("rollout did not finish");
    }

    #[test]
    fn rolling_update_keeps_roles_within_max_skew() {
        let (worst, rounds) = run(&[10, 10], 20);
        assert!(worst <= 0.2 + 1e-9, "skew {worst}");
        assert!(rounds <= 12, "{rounds} rounds");
        let (worst, _) = run(&[7, 3], 40);
        assert!(worst <= 0.4 + 1e-9, "skew {worst}");
        // Single-replica roles with a small skew still finish, one step at a time.
        let (_, rounds) = run(&[1, 1], 10);
        assert!(rounds <= 3);
    }

    #[test]
    fn rolling_overrides_become_partitions() {
        let rules = vec![Coordination {
            name: "pd".into(),
            roles: vec!["p".into(), "d".into()],
            rolling: Some(crate::operator::model::RollingRule {
                max_skew_pct: Some(10),
                partition: None,
                max_unavailable: None,
                order: vec![],
                progress_deadline_secs: None,
            }),
            scaling: None,
            gang: None,
        }];
        let states: BTreeMap<String, RoleState> =
            [("p".to_string(), st(10, 3)), ("d".to_string(), st(10, 1))].into();
        let o = overrides(&rules, &states, &BTreeMap::new(), &[]);
        assert_eq!(o["p"].partition, Some(7), "p is held at 3 updated");
        assert_eq!(
            o["d"].partition,
            Some(8),
            "d may reach 2 (within 10% of p's 30%... from 10%)"
        );
    }

    /// An order holds each role to the updated, Ready share of the one before it; reversed,
    /// the other way round.
    #[test]
    fn an_order_holds_followers_to_their_leaders_ready_share() {
        let rules = crate::operator::model::parse_policy(&serde_json::json!({"spec": {"policies":
            [{"name": "pd", "roles": ["p", "d"],
              "strategy": {"rollingUpdate": {"order": ["d", "p"]}}}]}}))
        .unwrap();
        let mut d = st(4, 2);
        d.updated_ready = 1;
        let states: BTreeMap<String, RoleState> =
            [("p".to_string(), st(2, 0)), ("d".to_string(), d)].into();
        let o = overrides(&rules, &states, &BTreeMap::new(), &[]);
        // d has 1 of 4 updated and Ready: p may have floor(2 × 1/4) = 0 updated.
        assert_eq!(o["p"].partition, Some(2));
        assert_eq!(o.get("d").and_then(|o| o.partition), Some(0));
        let back = overrides(&rules, &states, &BTreeMap::new(), &["pd".to_string()]);
        // Reversed: d follows p, which has none updated.
        assert_eq!(back["d"].partition, Some(4));
        assert_eq!(back["p"].partition, Some(0));
    }

    #[test]
    fn scaling_moves_roles_together_and_waits_for_readiness() {
        let s = |desired, current, ready| RoleState {
            desired,
            current,
            ready,
            updated: current,
            scheduled: current,
            updated_ready: current,
        };
        let states = vec![
            ("p".to_string(), s(10, 2, 2)),
            ("d".to_string(), s(4, 2, 2)),
        ];
        let t = scaling_targets(&states, 20, &Progression::OrderReady);
        // Slowest progress is p at 20%: p may reach 40% (4), d (50% now) is above the cap
        // of 40% and waits.
        assert_eq!((t["p"], t["d"]), (4, 2));
        let states = vec![
            ("p".to_string(), s(10, 4, 3)),
            ("d".to_string(), s(4, 2, 2)),
        ];
        let t = scaling_targets(&states, 20, &Progression::OrderReady);
        assert_eq!(
            (t["p"], t["d"]),
            (4, 2),
            "held while p has unready instances"
        );
        let t = scaling_targets(&states, 20, &Progression::None);
        assert_eq!((t["p"], t["d"]), (6, 3));
    }
}
