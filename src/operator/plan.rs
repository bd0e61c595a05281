//! The next step for one role, as a pure function of its desired state and its pods:
//! which pods to create, delete or update in place, obeying `partition`, `maxUnavailable`,
//! `maxSurge` and `paused`; and the role's status counts.
//!
//! Instances are the unit (one pod, or a leader and its workers). A stateful instance has an
//! ordinal; surge instances take the ordinals just past `replicas` and go once the rollout is
//! done. A stateless role's instances are ordered (old revision first, ready first) and
//! given positions, so the same rules apply.

use crate::kube::object::Pod;
use crate::operator::desired::{
    Revision, COMPONENT_INDEX, INDEX, INPLACE_STATE, INSTANCE, REVISION, SHAPE,
};
use crate::operator::model::{IntOrPct, Role};
use serde_json::Value;
use std::collections::BTreeMap;

/// What the planner needs to know about one existing pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub instance: String,
    pub ordinal: Option<u32>,
    pub component: u32,
    pub revision: String,
    pub shape: String,
    /// Running, Ready, and any in-place update finished.
    pub ready: bool,
    pub terminating: bool,
    pub failed: bool,
    pub scheduled: bool,
    /// When an in-place update that the kubelet has not yet confirmed was started.
    pub inplace_unconfirmed_since: Option<chrono::DateTime<chrono::Utc>>,
    /// A container restarted other than by an in-place update (`restarted`).
    pub restarted: bool,
}

/// Phase Running and condition Ready=True.
pub fn pod_ready(p: &Value) -> bool {
    Pod::of(p).is_ready()
}

/// What `apply::inplace_ops` records before an in-place update.
#[derive(serde::Deserialize)]
struct InPlaceState {
    #[serde(default, rename = "imageIDs")]
    image_ids: BTreeMap<String, String>,
    /// Absent in records written before restart counts were kept.
    #[serde(default, rename = "restartCounts")]
    restart_counts: Option<BTreeMap<String, u64>>,
}

impl InPlaceState {
    fn of(pod: &Pod<'_>) -> Option<InPlaceState> {
        let recorded = pod.metadata.annotation(INPLACE_STATE);
        (!recorded.is_empty())
            .then(|| serde_json::from_str(recorded).ok())
            .flatten()
    }
}

/// Whether a container of the pod restarted other than by an in-place update: its restart
/// count is past what it was when the last in-place update started (plus the one restart
/// that update makes of a container it changed), or past 0 without one. A record from before
/// restart counts were kept says nothing of the containers it changed.
pub fn restarted(pod: &Pod<'_>) -> bool {
    let state = InPlaceState::of(pod);
    pod.status.container_statuses.iter().any(|c| {
        let baseline = match &state {
            None => Some(0),
            Some(s) => {
                let before = s.restart_counts.as_ref().and_then(|r| r.get(c.name));
                match (s.image_ids.contains_key(c.name), before) {
                    (true, Some(b)) => Some(b + 1),
                    (true, None) => None,
                    (false, b) => Some(b.copied().unwrap_or(0)),
                }
            }
        };
        baseline.is_some_and(|b| c.restart_count > b)
    })
}

/// An in-place update is finished when the kubelet runs, Ready, every container it changed as
/// the new spec says: the status reports the spec's image, and the container was restarted
/// (restart count up) or runs other content (image ID changed). A retag to the same content
/// keeps its image ID; the restart and the reported image still show the update took.
pub fn inplace_done(pod: &Pod<'_>) -> bool {
    let Some(state) = InPlaceState::of(pod) else {
        return true;
    };
    state.image_ids.iter().all(|(container, id_before)| {
        let Some(now) = pod.container_status(container) else {
            return false;
        };
        let spec = pod.spec_image(container);
        let takes_spec = spec.is_empty() || crate::kube::object::same_image(spec, now.image);
        let restarted = state
            .restart_counts
            .as_ref()
            .and_then(|r| r.get(container))
            .is_some_and(|before| now.restart_count > *before);
        let new_content = !now.image_id.is_empty() && now.image_id != id_before;
        let legacy = id_before.is_empty() && state.restart_counts.is_none();
        // A retag to the same content: the runtime may go on reporting the other tag of that
        // image (the kubelet copies what it says), so a restart on an unchanged image ID
        // confirms the update whatever tag the status names.
        let same_content_restarted =
            restarted && !id_before.is_empty() && now.image_id == *id_before;
        now.ready
            && ((takes_spec && (restarted || new_content || legacy)) || same_content_restarted)
    })
}

/// When the pod's last in-place update was started (`updateTimestamp` of its record).
pub fn inplace_started(pod: &Pod<'_>) -> Option<chrono::DateTime<chrono::Utc>> {
    let recorded = pod.metadata.annotation(INPLACE_STATE);
    let v: Value = serde_json::from_str(recorded).ok()?;
    let at = v.get("updateTimestamp")?.as_str()?;
    chrono::DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// What planning needs of a pod.
pub fn view(p: &Value) -> PodView {
    let pod = Pod::of(p);
    let meta = &pod.metadata;
    let label = |k: &str| Some(meta.label(k)).filter(|v| !v.is_empty());
    PodView {
        instance: label(INSTANCE).unwrap_or(meta.name).to_string(),
        ordinal: label(INDEX).and_then(|i| i.parse().ok()),
        component: label(COMPONENT_INDEX)
            .and_then(|i| i.parse().ok())
            .unwrap_or(0),
        revision: meta.label(REVISION).to_string(),
        shape: meta.annotation(SHAPE).to_string(),
        ready: pod.is_ready() && inplace_done(&pod),
        inplace_unconfirmed_since: (!inplace_done(&pod))
            .then(|| inplace_started(&pod))
            .flatten(),
        terminating: meta.is_terminating(),
        restarted: restarted(&pod),
        failed: pod.status.phase == "Failed",
        scheduled: pod.is_scheduled(),
        uid: meta.uid.to_string(),
        name: meta.name.to_string(),
    }
}

/// One step of work.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the pod of `component` in `instance` (a new stateless instance when the
    /// instance name is empty).
    Create {
        instance: String,
        ordinal: Option<u32>,
        component: u32,
        /// The revision to make it at, when not the role's (a pod of an instance that runs
        /// an older one, or a whole instance below `partition`: `Limits::current_revision`).
        revision: Option<String>,
    },
    Delete {
        name: String,
        uid: String,
    },
    /// Patch the images of a running pod to the new revision.
    InPlace {
        name: String,
        uid: String,
    },
}

/// The rollout parameters after coordination.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub replicas: u32,
    pub partition: u32,
    pub max_unavailable: u32,
    pub max_surge: u32,
    pub paused: bool,
    pub recreate: bool,
    /// The revision instances below `partition` keep (StatefulSet's `currentRevision`), when
    /// it is not the role's own.
    pub current_revision: Option<String>,
}

impl Limits {
    /// The role's own limits resolved against `replicas` (maxSurge rounds up; maxUnavailable
    /// rounds down when surge is allowed, else up and at least 1, as RBG does).
    pub fn of(
        role: &Role,
        replicas: u32,
        partition: Option<IntOrPct>,
        max_unavailable: Option<IntOrPct>,
    ) -> Limits {
        let r = &role.rollout;
        let max_surge = r.max_surge.resolve(replicas, true);
        let mut mu = max_unavailable
            .unwrap_or(r.max_unavailable)
            .resolve(replicas, max_surge == 0);
        if max_surge == 0 {
            mu = mu.max(1);
        }
        Limits {
            replicas,
            partition: partition
                .unwrap_or(r.partition)
                .resolve(replicas, false)
                .min(replicas),
            max_unavailable: mu,
            max_surge,
            paused: r.paused,
            recreate: r.recreate,
            current_revision: None,
        }
    }
}

#[derive(Clone, Debug)]
struct Instance<'a> {
    name: String,
    pods: Vec<&'a PodView>,
}

impl Instance<'_> {
    fn live(&self) -> impl Iterator<Item = &&PodView> {
        self.pods.iter().filter(|p| !p.terminating)
    }
    fn exists(&self) -> bool {
        self.live().next().is_some()
    }
    fn terminating(&self) -> bool {
        self.pods.iter().any(|p| p.terminating)
    }
    fn updated(&self, rev: &Revision) -> bool {
        self.exists() && self.live().all(|p| p.revision == rev.hash)
    }
    fn ready(&self, size: u32) -> bool {
        self.live().count() == size as usize && self.live().all(|p| p.ready)
    }
}

/// Counts for `roleStatuses[]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    pub replicas: u32,
    pub ready: u32,
    pub updated: u32,
    /// Instances whose pods all have a node.
    pub scheduled: u32,
    /// Instances at the role's revision and Ready.
    pub updated_ready: u32,
}

/// The plan for one role, and its counts as they are now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub counts: Counts,
    /// Something is still moving (a watch event will bring the next step).
    pub progressing: bool,
}

fn group_instances<'a>(pods: &'a [PodView]) -> BTreeMap<String, Instance<'a>> {
    let mut m: BTreeMap<String, Instance<'a>> = BTreeMap::new();
    for p in pods {
        m.entry(p.instance.clone())
            .or_insert_with(|| Instance {
                name: p.instance.clone(),
                pods: Vec::new(),
            })
            .pods
            .push(p);
    }
    m
}

/// Plans one role. `instance_name(ordinal)` names stateful instances.
pub fn plan(
    role: &Role,
    rev: &Revision,
    lim: &Limits,
    pods: &[PodView],
    instance_name: &dyn Fn(u32) -> String,
) -> Plan {
    let size = role.size();
    let by_name = group_instances(pods);
    // Positions: ordinals for stateful roles, an order for stateless ones.
    let mut slots: Vec<(u32, Instance)> = Vec::new();
    if role.stateless {
        let mut list: Vec<Instance> = by_name.into_values().collect();
        list.sort_by_key(|i| {
            (
                i.updated(rev),
                !i.ready(size),
                i.terminating(),
                i.name.clone(),
            )
        });
        slots = list
            .into_iter()
            .enumerate()
            .map(|(i, x)| (i as u32, x))
            .collect();
    } else {
        for (_, inst) in by_name {
            let ordinal = inst.pods.iter().find_map(|p| p.ordinal);
            match ordinal {
                Some(o) => slots.push((o, inst)),
                // A pod of ours without an ordinal label cannot be placed: remove it.
                None => slots.push((u32::MAX, inst)),
            }
        }
    }
    let n = lim.replicas;
    let needs_update = |o: u32, i: &Instance| o < n && o >= lim.partition && !i.updated(rev);
    let in_rollout = !lim.paused && slots.iter().any(|(o, i)| i.exists() && needs_update(*o, i));
    // Surge instances stay until every base instance is ready on the new revision.
    let surging = slots
        .iter()
        .any(|(o, i)| *o >= n && *o < n + lim.max_surge && i.exists());
    let base_settling = (0..n).any(|o| {
        !slots
            .iter()
            .any(|(x, i)| *x == o && i.ready(size) && i.updated(rev))
    });
    let surge = if in_rollout || (surging && (base_settling || lim.paused)) {
        lim.max_surge
    } else {
        0
    };
    let mut out = Plan::default();
    let mut present: BTreeMap<u32, &Instance> = BTreeMap::new();
    // Pool stores that hand their objects over go one at a time, each once the last is gone,
    // so that each hand-over finds the others up and with room.
    let one_by_one = role.hand_over_secs.is_some();
    let leaving = slots
        .iter()
        .any(|(o, i)| *o >= n + surge && i.terminating());
    let next_to_go = slots
        .iter()
        .filter(|(o, i)| *o >= n + surge && i.live().next().is_some())
        .map(|(o, _)| *o)
        .max();
    for (o, inst) in &slots {
        if *o >= n + surge {
            if one_by_one && (leaving || Some(*o) != next_to_go) {
                out.progressing = true;
                continue;
            }
            // Scale down (and surge no longer needed): highest first, all at once.
            for p in inst.live() {
                out.actions.push(Action::Delete {
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                });
            }
            out.progressing = true;
            continue;
        }
        present.insert(*o, inst);
    }
    out.actions.reverse();
    // Create what is missing; replace failed pods.
    for o in 0..n + surge {
        let inst = present.get(&o);
        if role.stateless && inst.is_none() {
            for c in 0..size {
                out.actions.push(Action::Create {
                    instance: String::new(),
                    ordinal: None,
                    component: c,
                    revision: None,
                });
            }
            out.progressing = true;
            continue;
        }
        let name = match inst {
            Some(i) => i.name.clone(),
            None => instance_name(o),
        };
        for c in 0..size {
            let pod = inst.and_then(|i| i.pods.iter().find(|p| p.component == c));
            match pod {
                None => {
                    // A pod joins its instance at the revision the instance runs; a whole
                    // instance below the partition comes back at the current revision.
                    let revision = inst
                        .and_then(|i| i.live().next().map(|p| p.revision.clone()))
                        .or_else(|| {
                            let kept = !role.stateless && o < n && o < lim.partition;
                            kept.then(|| lim.current_revision.clone()).flatten()
                        })
                        .filter(|h| *h != rev.hash);
                    out.actions.push(Action::Create {
                        instance: name.clone(),
                        ordinal: (!role.stateless).then_some(o),
                        component: c,
                        revision,
                    });
                    out.progressing = true;
                }
                Some(p) if p.failed && !p.terminating => {
                    out.actions.push(Action::Delete {
                        name: p.name.clone(),
                        uid: p.uid.clone(),
                    });
                    out.progressing = true;
                }
                Some(p) if p.terminating => out.progressing = true,
                Some(_) => {}
            }
        }
    }
    // Counts over the base instances.
    for (o, inst) in &present {
        if *o >= n || !inst.exists() {
            continue;
        }
        out.counts.replicas += 1;
        if inst.ready(size) {
            out.counts.ready += 1;
        }
        if inst.updated(rev) {
            out.counts.updated += 1;
            if inst.ready(size) {
                out.counts.updated_ready += 1;
            }
        }
        if inst.live().count() == size as usize && inst.live().all(|p| p.scheduled) {
            out.counts.scheduled += 1;
        }
    }
    if out.counts.ready < n {
        out.progressing = true;
    }
    if !in_rollout {
        return out;
    }
    out.progressing = true;
    // Rollout: highest ordinal first, within the unavailability budget.
    let unavailable = (0..n)
        .filter(|o| !present.get(o).is_some_and(|i| i.ready(size)))
        .count() as i64;
    let surge_ready = (n..n + surge)
        .filter(|o| {
            present
                .get(o)
                .is_some_and(|i| i.ready(size) && i.updated(rev))
        })
        .count() as i64;
    let mut budget = lim.max_unavailable as i64 + surge_ready - unavailable;
    for (o, inst) in present.iter().rev() {
        if !needs_update(*o, inst) || !inst.exists() || inst.terminating() {
            continue;
        }
        if inst.ready(size) {
            if budget <= 0 {
                continue;
            }
            budget -= 1;
        }
        let shape_same = inst.live().all(|p| p.shape == rev.shape);
        for p in inst.live() {
            if p.revision == rev.hash {
                continue;
            }
            if !lim.recreate && shape_same {
                out.actions.push(Action::InPlace {
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                });
            } else {
                out.actions.push(Action::Delete {
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::model::{Pattern, Rollout};
    use serde_json::json;

    fn role(replicas: u32, stateless: bool) -> Role {
        Role {
            name: "r".into(),
            replicas,
            dependencies: vec![],
            template: json!({"spec": {"containers": [{"name": "c", "image": "i"}]}}),
            pattern: Pattern::Standalone,
            stateless,
            rollout: Rollout::default(),
            service_ports: vec![],
            scaling_adapter: None,
            restart: crate::operator::restarts::RestartPolicy::NONE,
            source: serde_json::Value::Null,
            hand_over_secs: None,
        }
    }

    fn rev(h: &str, s: &str) -> Revision {
        Revision {
            hash: h.into(),
            shape: s.into(),
        }
    }

    fn pod(o: u32, revision: &str, shape: &str, ready: bool) -> PodView {
        PodView {
            name: format!("g-r-{o}"),
            uid: format!("uid-{o}"),
            instance: format!("g-r-{o}"),
            ordinal: Some(o),
            component: 0,
            revision: revision.into(),
            shape: shape.into(),
            ready,
            terminating: false,
            failed: false,
            scheduled: true,
            inplace_unconfirmed_since: None,
            restarted: false,
        }
    }

    fn name(o: u32) -> String {
        format!("g-r-{o}")
    }

    fn lim(replicas: u32) -> Limits {
        Limits::of(&role(replicas, false), replicas, None, None)
    }

    /// A store role that hands its objects over scales down one instance at a time, the
    /// highest first, the next once the last is gone.
    #[test]
    fn stores_that_hand_over_leave_one_at_a_time() {
        let mut r = role(1, false);
        r.hand_over_secs = Some(60);
        let pods: Vec<PodView> = (0..3).map(|o| pod(o, "a", "s", true)).collect();
        let p = plan(&r, &rev("a", "s"), &lim(1), &pods, &name);
        let deleted: Vec<&str> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, ["g-r-2"]);
        let mut going = pods.clone();
        going[2].terminating = true;
        let p = plan(&r, &rev("a", "s"), &lim(1), &going, &name);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert!(p.progressing);
        let p = plan(&r, &rev("a", "s"), &lim(1), &going[..2], &name);
        assert!(matches!(&p.actions[..], [Action::Delete { name, .. }] if name == "g-r-1"));
        // Without a hand-over, all at once, as before.
        r.hand_over_secs = None;
        let p = plan(&r, &rev("a", "s"), &lim(1), &pods, &name);
        assert_eq!(p.actions.len(), 2);
    }

    /// A pod recreated below the partition gets the revision its neighbours keep; above it,
    /// the role's; a pod of an instance, the instance's.
    #[test]
    fn a_pod_recreated_below_the_partition_keeps_the_current_revision() {
        let r = role(3, false);
        let mut l = lim(3);
        l.partition = 2;
        l.current_revision = Some("a".into());
        let pods = vec![pod(1, "a", "s", true)];
        let p = plan(&r, &rev("b", "s"), &l, &pods, &name);
        let made: Vec<(Option<u32>, Option<String>)> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Create {
                    ordinal, revision, ..
                } => Some((*ordinal, revision.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(made, vec![(Some(0), Some("a".into())), (Some(2), None)]);
        // A worker missing from an instance that runs "a" comes back at "a", partition or not.
        let mut lw = role(1, false);
        lw.pattern = Pattern::LeaderWorker {
            size: 2,
            leader_patch: json!(null),
            worker_patch: json!(null),
            leader_only_service: true,
        };
        let leader = pod(0, "a", "s", true);
        let p = plan(&lw, &rev("b", "s"), &lim(1), &[leader], &name);
        assert!(
            p.actions.iter().any(|a| matches!(a,
            Action::Create { component: 1, revision: Some(h), .. } if h == "a")),
            "{:?}",
            p.actions
        );
    }

    #[test]
    fn creates_missing_and_removes_extra_ordinals() {
        let r = role(3, false);
        let pods = vec![pod(0, "a", "s", true), pod(4, "a", "s", true)];
        let p = plan(&r, &rev("a", "s"), &lim(3), &pods, &name);
        assert_eq!(
            p.actions,
            vec![
                Action::Delete {
                    name: "g-r-4".into(),
                    uid: "uid-4".into()
                },
                Action::Create {
                    instance: "g-r-1".into(),
                    ordinal: Some(1),
                    component: 0,
                    revision: None
                },
                Action::Create {
                    instance: "g-r-2".into(),
                    ordinal: Some(2),
                    component: 0,
                    revision: None
                },
            ]
        );
        assert_eq!(
            p.counts,
            Counts {
                replicas: 1,
                ready: 1,
                updated: 1,
                scheduled: 1,
                updated_ready: 1,
            }
        );
    }

    #[test]
    fn steady_state_plans_nothing() {
        let r = role(2, false);
        let pods = vec![pod(0, "a", "s", true), pod(1, "a", "s", true)];
        let p = plan(&r, &rev("a", "s"), &lim(2), &pods, &name);
        assert!(p.actions.is_empty());
        assert!(!p.progressing);
    }

    #[test]
    fn image_only_change_goes_in_place_one_at_a_time_highest_first() {
        let r = role(3, false);
        let pods: Vec<_> = (0..3).map(|o| pod(o, "a", "s", true)).collect();
        let p = plan(&r, &rev("b", "s"), &lim(3), &pods, &name);
        assert_eq!(
            p.actions,
            vec![Action::InPlace {
                name: "g-r-2".into(),
                uid: "uid-2".into()
            }]
        );
        // While ordinal 2 is updating (not ready), nothing else moves.
        let mut pods2 = pods.clone();
        pods2[2] = pod(2, "b", "s", false);
        let p = plan(&r, &rev("b", "s"), &lim(3), &pods2, &name);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        pods2[2].ready = true;
        let p = plan(&r, &rev("b", "s"), &lim(3), &pods2, &name);
        assert_eq!(
            p.actions,
            vec![Action::InPlace {
                name: "g-r-1".into(),
                uid: "uid-1".into()
            }]
        );
    }

    #[test]
    fn other_changes_and_recreate_type_delete_pods() {
        let r = role(2, false);
        let pods: Vec<_> = (0..2).map(|o| pod(o, "a", "s", true)).collect();
        let p = plan(&r, &rev("b", "t"), &lim(2), &pods, &name);
        assert_eq!(
            p.actions,
            vec![Action::Delete {
                name: "g-r-1".into(),
                uid: "uid-1".into()
            }]
        );
        let mut l = lim(2);
        l.recreate = true;
        let p = plan(&r, &rev("b", "s"), &l, &pods, &name);
        assert_eq!(
            p.actions,
            vec![Action::Delete {
                name: "g-r-1".into(),
                uid: "uid-1".into()
            }]
        );
    }

    #[test]
    fn partition_paused_and_max_unavailable_are_obeyed() {
        let r = role(4, false);
        let pods: Vec<_> = (0..4).map(|o| pod(o, "a", "s", true)).collect();
        let mut l = lim(4);
        l.partition = 2;
        l.max_unavailable = 4;
        let p = plan(&r, &rev("b", "s"), &l, &pods, &name);
        let names: Vec<_> = p
            .actions
            .iter()
            .map(|a| match a {
                Action::InPlace { name, .. } => name.clone(),
                _ => panic!(),
            })
            .collect();
        assert_eq!(names, ["g-r-3", "g-r-2"]);
        l.paused = true;
        assert!(plan(&r, &rev("b", "s"), &l, &pods, &name)
            .actions
            .is_empty());
        // An unready instance uses the budget up: nothing else may go down.
        let mut pods2 = pods.clone();
        pods2[0].ready = false;
        let p = plan(&r, &rev("b", "s"), &lim(4), &pods2, &name);
        assert_eq!(
            p.actions,
            vec![Action::InPlace {
                name: "g-r-0".into(),
                uid: "uid-0".into()
            }],
            "an instance that is down anyway is updated for free"
        );
    }

    #[test]
    fn surge_adds_instances_then_removes_them() {
        let r = role(2, false);
        let pods: Vec<_> = (0..2).map(|o| pod(o, "a", "s", true)).collect();
        let mut l = lim(2);
        l.max_surge = 1;
        l.max_unavailable = 0;
        let p = plan(&r, &rev("b", "t"), &l, &pods, &name);
        assert_eq!(
            p.actions,
            vec![Action::Create {
                instance: "g-r-2".into(),
                ordinal: Some(2),
                component: 0,
                revision: None
            }]
        );
        let mut pods2 = pods.clone();
        pods2.push(pod(2, "b", "t", true));
        let p = plan(&r, &rev("b", "t"), &l, &pods2, &name);
        assert_eq!(
            p.actions,
            vec![Action::Delete {
                name: "g-r-1".into(),
                uid: "uid-1".into()
            }]
        );
        // All updated and ready: the surge instance goes.
        let done = vec![
            pod(0, "b", "t", true),
            pod(1, "b", "t", true),
            pod(2, "b", "t", true),
        ];
        let p = plan(&r, &rev("b", "t"), &l, &done, &name);
        assert_eq!(
            p.actions,
            vec![Action::Delete {
                name: "g-r-2".into(),
                uid: "uid-2".into()
            }]
        );
    }

    #[test]
    fn terminating_pods_block_their_name_and_failed_pods_are_replaced() {
        let r = role(2, false);
        let mut t = pod(1, "a", "s", false);
        t.terminating = true;
        let mut f = pod(0, "a", "s", false);
        f.failed = true;
        let p = plan(&r, &rev("a", "s"), &lim(2), &[f, t], &name);
        assert_eq!(
            p.actions,
            vec![Action::Delete {
                name: "g-r-0".into(),
                uid: "uid-0".into()
            }]
        );
        assert!(p.progressing);
    }

    #[test]
    fn stateless_roles_count_instances_not_names() {
        let r = role(3, true);
        let mut a = pod(0, "a", "s", true);
        a.instance = "g-r-xkcd2".into();
        a.ordinal = None;
        let p = plan(&r, &rev("a", "s"), &lim(3), &[a.clone()], &name);
        let creates = p.actions.iter().filter(|x| matches!(x, Action::Create { instance, ordinal: None, .. } if instance.is_empty())).count();
        assert_eq!(creates, 2);
        let one = role(1, true);
        let p = plan(&one, &rev("b", "s"), &lim(1), &[a], &name);
        assert!(p.actions.contains(&Action::InPlace {
            name: "g-r-0".into(),
            uid: "uid-0".into()
        }));
    }

    fn pod_after_patch(
        image: &str,
        status_image: &str,
        id: &str,
        restarts: u64,
        ready: bool,
    ) -> Value {
        let state =
            json!({"revision": "b", "imageIDs": {"c": "sha256:one"}, "restartCounts": {"c": 0}});
        json!({"metadata": {"annotations": {INPLACE_STATE: state.to_string()}},
               "spec": {"containers": [{"name": "c", "image": image}]},
               "status": {"containerStatuses": [{"name": "c", "image": status_image,
                   "imageID": id, "restartCount": restarts, "ready": ready}]}})
    }

    #[test]
    fn an_inplace_update_is_done_when_the_kubelet_runs_the_new_spec_ready() {
        let done = |p: Value| inplace_done(&Pod::of(&p));
        // Not yet taken: the kubelet still reports the old image.
        assert!(!done(pod_after_patch("x:2", "x:1", "sha256:one", 0, true)));
        // New content, restarted, ready.
        assert!(done(pod_after_patch(
            "x:2",
            "docker.io/library/x:2",
            "sha256:two",
            1,
            true
        )));
        // Restarted but not ready yet.
        assert!(!done(pod_after_patch("x:2", "x:2", "sha256:two", 1, false)));
        // A retag to the same content: same image ID, but restarted on the new spec.
        assert!(done(pod_after_patch("x:1b", "x:1b", "sha256:one", 1, true)));
        // A retag the kubelet has not restarted for yet.
        assert!(!done(pod_after_patch(
            "x:1b",
            "x:1b",
            "sha256:one",
            0,
            true
        )));
        // Issue 40, item 34: a retag to the same content whose runtime reports the other tag
        // of that image: restarted on the same image ID, so done.
        assert!(done(pod_after_patch("x:1b", "x:1", "sha256:one", 1, true)));
        // The other tag and no restart: not yet.
        assert!(!done(pod_after_patch("x:1b", "x:1", "sha256:one", 0, true)));
        assert!(done(json!({"metadata": {}})));
    }

    #[test]
    fn a_restart_counts_unless_an_inplace_update_made_it() {
        let pod = |restarts: u64, state: Option<&str>| {
            let mut p = json!({"metadata": {"name": "p", "annotations": {}},
                "status": {"containerStatuses": [
                    {"name": "c", "restartCount": restarts}, {"name": "side", "restartCount": 0}]}});
            if let Some(s) = state {
                p["metadata"]["annotations"][INPLACE_STATE] = json!(s);
            }
            p
        };
        let restarted = |p: &Value| restarted(&Pod::of(p));
        assert!(!restarted(&pod(0, None)));
        assert!(
            restarted(&pod(1, None)),
            "a crash of a pod never updated in place"
        );
        // An in-place update of `c` from 2 restarts: its own restart is not a crash.
        let state = r#"{"imageIDs": {"c": "sha"}, "restartCounts": {"c": 2, "side": 0}}"#;
        assert!(!restarted(&pod(3, Some(state))));
        assert!(restarted(&pod(4, Some(state))), "one more is a crash");
        // A record from before restart counts were kept says nothing of what it changed.
        assert!(!restarted(&pod(9, Some(r#"{"imageIDs": {"c": "sha"}}"#))));
    }
}
