//! Leader election on a `coordination.k8s.io/v1` Lease, the decision part (pure), as client-go
//! makes it: the holder renews `renewTime`; another candidate takes the Lease only after seeing
//! the same record unchanged for a whole `leaseDurationSeconds` on its own clock (so clock skew
//! between nodes does not matter). The caller writes what this decides conditionally on the
//! resourceVersion it read, so two candidates never both win. Used by the operator's replicas
//! and by elected masters (`ha::kube_lease`).

use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The record a candidate last saw, and since when (on its own clock).
pub type Observed = Option<(Value, Instant)>;

/// What a candidate does with the Lease it read.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// Someone else holds it and renewed it within its duration: wait.
    Wait,
    /// Write this (a renewal of ours, or a takeover).
    Write(Value),
}

/// `renewTime` and `acquireTime` as the API writes them.
pub fn micro_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// A new Lease held by `identity`.
pub fn new_lease(name: &str, identity: &str, duration: Duration, transitions: u64) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": identity, "leaseDurationSeconds": secs(duration),
                 "acquireTime": micro_now(), "renewTime": micro_now(),
                 "leaseTransitions": transitions}})
}

fn secs(d: Duration) -> u64 {
    d.as_secs().max(1)
}

/// Decides on the Lease `current`, read at `now`. `ours`: the caller holds it now (a renewal;
/// otherwise a takeover, which counts a transition). `observed` is updated.
pub fn claim(
    current: &Value,
    identity: &str,
    duration: Duration,
    ours: bool,
    observed: &mut Observed,
    now: Instant,
) -> Claim {
    let spec = &current["spec"];
    // The record's age is measured from when this candidate first saw it as it is.
    let seen_at = match observed {
        Some((s, t)) if s == spec => *t,
        _ => {
            *observed = Some((spec.clone(), now));
            now
        }
    };
    let holder = spec["holderIdentity"].as_str().unwrap_or("");
    let theirs = Duration::from_secs(
        spec["leaseDurationSeconds"]
            .as_u64()
            .unwrap_or(secs(duration)),
    );
    if !ours && !holder.is_empty() && now.duration_since(seen_at) < theirs {
        return Claim::Wait;
    }
    let mut next = current.clone();
    next["spec"]["holderIdentity"] = json!(identity);
    next["spec"]["leaseDurationSeconds"] = json!(secs(duration));
    next["spec"]["renewTime"] = json!(micro_now());
    if !ours {
        next["spec"]["acquireTime"] = json!(micro_now());
        let t = spec["leaseTransitions"].as_u64().unwrap_or(0);
        next["spec"]["leaseTransitions"] = json!(t + 1);
    }
    Claim::Write(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lease_is_taken_only_after_a_whole_duration_unchanged() {
        let lease = new_lease("l", "a", Duration::from_secs(2), 1);
        let t0 = Instant::now();
        let mut seen = None;
        let d = Duration::from_secs(2);
        assert_eq!(claim(&lease, "b", d, false, &mut seen, t0), Claim::Wait);
        assert_eq!(
            claim(
                &lease,
                "b",
                d,
                false,
                &mut seen,
                t0 + Duration::from_millis(1999)
            ),
            Claim::Wait
        );
        let Claim::Write(taken) = claim(&lease, "b", d, false, &mut seen, t0 + d) else {
            panic!("not taken after the duration");
        };
        assert_eq!(taken["spec"]["holderIdentity"], "b");
        assert_eq!(taken["spec"]["leaseTransitions"], 2);

        // A renewal restarts the clock.
        let mut renewed = lease.clone();
        renewed["spec"]["renewTime"] = json!("later");
        assert_eq!(
            claim(&renewed, "b", d, false, &mut seen, t0 + d + d / 2),
            Claim::Wait
        );
        // The holder renews at once, without a transition; a released Lease is free.
        let Claim::Write(mine) = claim(&lease, "a", d, true, &mut None, t0) else {
            panic!("the holder could not renew");
        };
        assert_eq!(mine["spec"]["leaseTransitions"], 1);
        let mut released = lease.clone();
        released["spec"]["holderIdentity"] = Value::Null;
        assert!(matches!(
            claim(&released, "b", d, false, &mut None, t0),
            Claim::Write(_)
        ));
    }
}
