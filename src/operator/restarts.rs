//! Restart policy, as RBG v0.8 spells it (`leaderWorkerPattern.restartPolicyConfig`: `type`,
//! `baseDelaySeconds`, `maxDelaySeconds`; the older `restartPolicy` string): a container that
//! restarts in any pod of a leader-worker instance recreates the whole instance, since a
//! leader or worker that came back alone cannot rejoin the others' collective. Recreations of
//! the same instance back off: the first at once, each next one only `base × 2^(n−1)` after
//! the last (at most `max`); an instance Ready for `max` after its last recreation starts
//! again from nothing. What each instance has been through is kept in the group's status
//! (`instanceRestarts`), so a restarted operator keeps the backoff. Pure: no I/O, no clock.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// RBG's name of the policy that recreates an instance.
pub const RECREATE: &str = "RecreateRoleInstanceOnPodRestart";
/// RBG's default `restartPolicyConfig.baseDelaySeconds`.
pub const BASE_DELAY: Duration = Duration::from_secs(30);
/// RBG's default `restartPolicyConfig.maxDelaySeconds`.
pub const MAX_DELAY: Duration = Duration::from_secs(600);

/// What a container restart in one of a role's instances does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Recreate the instance when a container of one of its pods restarts.
    pub recreate: bool,
    pub base: Duration,
    pub max: Duration,
}

impl RestartPolicy {
    pub const NONE: RestartPolicy = RestartPolicy {
        recreate: false,
        base: BASE_DELAY,
        max: MAX_DELAY,
    };

    /// How long after the last recreation the next may happen, the instance having been
    /// recreated `done` times: none for the first, then `base`, `2 × base`, … up to `max`.
    pub fn delay(&self, done: u32) -> Duration {
        match done {
            0 => Duration::ZERO,
            n => self
                .base
                .checked_mul(1u32.checked_shl(n - 1).unwrap_or(u32::MAX))
                .unwrap_or(self.max)
                .min(self.max),
        }
    }
}

/// One instance's recreations, as the group's status keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recreations {
    pub role: String,
    pub instance: String,
    pub count: u32,
    /// RFC 3339, as Kubernetes writes times.
    pub last_recreate_time: String,
}

impl Recreations {
    /// How long ago the last recreation was (a time that does not parse: long ago).
    pub fn since(&self, now: DateTime<Utc>) -> Duration {
        DateTime::parse_from_rfc3339(&self.last_recreate_time)
            .ok()
            .and_then(|t| (now - t.with_timezone(&Utc)).to_std().ok())
            .unwrap_or(Duration::MAX)
    }
}

/// Every instance's recreations, by (role, instance).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History(pub BTreeMap<(String, String), Recreations>);

impl History {
    /// From a group object's `status.instanceRestarts` (entries that do not parse are
    /// dropped: the backoff then starts again for them).
    pub fn of(group: &serde_json::Value) -> History {
        let list = group
            .pointer("/status/instanceRestarts")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|e| serde_json::from_value::<Recreations>(e.clone()).ok())
            .map(|r| ((r.role.clone(), r.instance.clone()), r))
            .collect();
        History(list)
    }

    /// As the status lists them, by role and instance.
    pub fn to_status(&self) -> Vec<&Recreations> {
        self.0.values().collect()
    }
}

/// What an instance's state asks for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do.
    Leave,
    /// Recreate the instance now; its record becomes this.
    Recreate(Recreations),
    /// A container restarted, but the backoff holds the recreation for this long.
    Wait(Duration),
    /// It has been Ready long enough since its last recreation: its record goes.
    Forget,
}

/// The verdict for one instance of a role under `policy`: `restarted` (a container of one of
/// its pods restarted, not by an in-place update), `ready` (every pod of it Ready), its record
/// `past`, at `now`.
pub fn verdict(
    policy: &RestartPolicy,
    (role, instance): (&str, &str),
    restarted: bool,
    ready: bool,
    past: Option<&Recreations>,
    now: DateTime<Utc>,
) -> Verdict {
    if !policy.recreate {
        return match past {
            Some(_) => Verdict::Forget,
            None => Verdict::Leave,
        };
    }
    if !restarted {
        return match past {
            Some(p) if ready && p.since(now) >= policy.max => Verdict::Forget,
            _ => Verdict::Leave,
        };
    }
    let done = past.map_or(0, |p| p.count);
    let wait = past.map_or(Duration::ZERO, |p| {
        policy.delay(done).saturating_sub(p.since(now))
    });
    if !wait.is_zero() {
        return Verdict::Wait(wait);
    }
    Verdict::Recreate(Recreations {
        role: role.to_string(),
        instance: instance.to_string(),
        count: done.saturating_add(1),
        last_recreate_time: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: RestartPolicy = RestartPolicy {
        recreate: true,
        base: Duration::from_secs(30),
        max: Duration::from_secs(600),
    };

    #[test]
    fn delays_double_from_the_base_up_to_the_cap() {
        let d: Vec<u64> = (0..8).map(|n| P.delay(n).as_secs()).collect();
        assert_eq!(d, [0, 30, 60, 120, 240, 480, 600, 600]);
        assert_eq!(P.delay(u32::MAX), P.max, "no overflow");
        let zero = RestartPolicy {
            base: Duration::ZERO,
            ..P
        };
        assert_eq!(zero.delay(5), Duration::ZERO);
    }

    #[test]
    fn a_restart_recreates_at_once_then_after_growing_delays_and_a_steady_instance_is_forgotten() {
        // Whole seconds, as the status keeps them.
        let t0: DateTime<Utc> = "2026-11-30T01:00:00Z".parse().unwrap();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let id = ("leader", "g-r-0");
        // Nothing restarted: nothing to do.
        assert_eq!(verdict(&P, id, false, true, None, t0), Verdict::Leave);
        // The first restart: at once.
        let Verdict::Recreate(first) = verdict(&P, id, true, false, None, t0) else {
            panic!("the first restart recreates at once");
        };
        assert_eq!(first.count, 1);
        // Again 10 s later: the backoff holds it for the other 20 s.
        assert_eq!(
            verdict(&P, id, true, false, Some(&first), at(10)),
            Verdict::Wait(Duration::from_secs(20))
        );
        let Verdict::Recreate(second) = verdict(&P, id, true, false, Some(&first), at(30)) else {
            panic!("after the base delay");
        };
        assert_eq!(second.count, 2);
        // The third waits twice the base.
        assert_eq!(
            verdict(&P, id, true, false, Some(&second), at(80)),
            Verdict::Wait(Duration::from_secs(10))
        );
        // Ready, but not yet for the cap since its last recreation: kept.
        assert_eq!(
            verdict(&P, id, false, true, Some(&second), at(300)),
            Verdict::Leave
        );
        // Not ready: kept, however long.
        assert_eq!(
            verdict(&P, id, false, false, Some(&second), at(9000)),
            Verdict::Leave
        );
        assert_eq!(
            verdict(&P, id, false, true, Some(&second), at(630)),
            Verdict::Forget
        );
        // No policy: never recreated, and a record left from a policy since removed goes.
        assert_eq!(
            verdict(&RestartPolicy::NONE, id, true, false, None, t0),
            Verdict::Leave
        );
        assert_eq!(
            verdict(&RestartPolicy::NONE, id, true, false, Some(&first), t0),
            Verdict::Forget
        );
    }

    #[test]
    fn the_history_reads_back_what_the_status_holds() {
        let r = Recreations {
            role: "w".into(),
            instance: "g-w-1".into(),
            count: 3,
            last_recreate_time: "2026-11-30T01:00:00Z".into(),
        };
        let group = serde_json::json!({"status": {"instanceRestarts": [
            serde_json::to_value(&r).unwrap(), {"role": "x"}]}});
        let h = History::of(&group);
        assert_eq!(h.to_status(), [&r], "the bad entry is dropped");
        assert_eq!(
            serde_json::to_value(&r).unwrap()["lastRecreateTime"],
            "2026-11-30T01:00:00Z"
        );
        assert_eq!(History::of(&serde_json::json!({})), History::default());
    }
}
