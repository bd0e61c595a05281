//! RoleBasedGroupSet (`rbgs`): `spec.replicas` copies of `spec.groupTemplate` as owned
//! RoleBasedGroups `<set>-<i>` (labels `groupset-name`, `groupset-index`), with the `scale`
//! subresource. Missing indices are created and template changes are copied into every child;
//! scaling down removes the highest index first, one group at a time (the next goes when the
//! previous is gone, so an interrupted scale-down keeps the lowest indices). Status counts the
//! children and the ready ones, with a `Ready` condition.
//!
//! A child's role with `scalingAdapter.enable` keeps the replicas its adapter gave it: the
//! template's count is where it starts, not where it is held.
//!
//! A template change reaches every child at once, as RBG does, unless the set paces it
//! (`spec.rolloutStrategy.rollingUpdate.maxUnavailable`, a count or a percentage of
//! `replicas`, rounded down and at least 1; RBG PR #474's shape): then a Ready child is
//! updated only while fewer than that many children are unavailable (not Ready at their
//! current spec with every pod at its current revision, the ones being updated among them), so the change rolls across the set that
//! many groups at a time, each next one once the last is Ready. A child that is not Ready
//! anyway is updated at once: it counts as unavailable already. Status says how many children
//! run the template (`updatedReplicas`).
//!
//! Planning is pure (`plan`); `Context::reconcile_set` reads the caches and writes.

use super::action::{Requeue, CACHE_SYNC_WAIT};
use super::context::{group_path, ns_of, Context, ReconcileError};
use super::finalizer;
use crate::kube::object::{set_condition, timestamp_now, NewCondition, ObjectMeta, Status};
use crate::kube::{KubeError, Patch};
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;

/// The kind of a group set: `replicas` numbered copies of one group template.
pub const KIND: &str = "RoleBasedGroupSet";
/// Its resource name in the API.
pub const PLURAL: &str = "rolebasedgroupsets";
/// Label on a set's groups: the set they belong to.
pub const SET_NAME: &str = "rbg.workloads.x-k8s.io/groupset-name";
/// Label on a set's groups: their index in it.
pub const SET_INDEX: &str = "rbg.workloads.x-k8s.io/groupset-index";
/// Held by a set until its groups are gone (the operator deletes them itself, so a cluster
/// without owner-reference garbage collection behaves the same).
pub const FINALIZER: &str = "rbg.workloads.x-k8s.io/groupset-children";

/// The API path of set `name` in namespace `ns`.
pub fn path(ns: &str, name: &str) -> String {
    format!("/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/{PLURAL}/{name}")
}

fn groups_collection(ns: &str) -> String {
    format!("/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/rolebasedgroups")
}

/// The name of a set's group at `index`.
pub fn child_name(set: &str, index: u32) -> String {
    format!("{set}-{index}")
}

/// A set's spec, read from its object.
#[derive(Clone, Debug, PartialEq)]
pub struct SetSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub generation: i64,
    pub replicas: u32,
    pub labels: Map<String, Value>,
    pub annotations: Map<String, Value>,
    /// `groupTemplate.spec`: a RoleBasedGroup spec.
    pub spec: Value,
    /// Children that may be unavailable at once while a template change rolls out; `None`:
    /// every child is updated at once.
    pub max_unavailable: Option<u32>,
}

/// A spec the set cannot be reconciled with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SetSpecError(String);

impl SetSpec {
    /// The set's spec as the operator reconciles it; an error naming a field it cannot take.
    pub fn of(obj: &Value) -> Result<SetSpec, SetSpecError> {
        let m = ObjectMeta::of(obj);
        let replicas = match obj.pointer("/spec/replicas") {
            None | Some(Value::Null) => 1,
            Some(v) => v
                .as_u64()
                .filter(|n| *n <= 10_000)
                .ok_or_else(|| SetSpecError(format!("spec.replicas {v} is not a count")))?
                as u32,
        };
        let t = obj
            .pointer("/spec/groupTemplate")
            .filter(|t| t.is_object())
            .ok_or_else(|| SetSpecError("spec.groupTemplate is required".into()))?;
        let spec = t
            .get("spec")
            .filter(|s| s["roles"].as_array().is_some_and(|r| !r.is_empty()))
            .cloned()
            .ok_or_else(|| {
                SetSpecError("spec.groupTemplate.spec.roles: at least one role is required".into())
            })?;
        let strings = |v: &Value| -> Map<String, Value> {
            v.as_object()
                .into_iter()
                .flatten()
                .filter(|(_, v)| v.is_string())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let max_unavailable =
            match obj.pointer("/spec/rolloutStrategy/rollingUpdate/maxUnavailable") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    let n = crate::operator::model::IntOrPct::parse(v).map_err(|e| {
                        SetSpecError(format!(
                            "spec.rolloutStrategy.rollingUpdate.maxUnavailable: {e}"
                        ))
                    })?;
                    Some(n.resolve(replicas, false).max(1))
                }
            };
        Ok(SetSpec {
            max_unavailable,
            name: m.name.to_string(),
            namespace: m.namespace.to_string(),
            uid: m.uid.to_string(),
            generation: m.generation,
            replicas,
            labels: strings(&t["labels"]),
            annotations: strings(&t["annotations"]),
            spec,
        })
    }
}

/// The group a set wants at `index`. With `existing`, roles whose scaling adapter is enabled
/// keep the existing group's replicas.
pub fn child(set: &SetSpec, index: u32, existing: Option<&Value>) -> Value {
    let mut labels = set.labels.clone();
    labels.insert(SET_NAME.into(), json!(set.name));
    labels.insert(SET_INDEX.into(), json!(index.to_string()));
    let mut spec = set.spec.clone();
    if let (Some(roles), Some(old)) = (
        spec.get_mut("roles").and_then(Value::as_array_mut),
        existing.and_then(|e| e.pointer("/spec/roles")?.as_array()),
    ) {
        for r in roles.iter_mut() {
            if r.pointer("/scalingAdapter/enable") != Some(&Value::Bool(true)) {
                continue;
            }
            let held = old
                .iter()
                .find(|o| o["name"] == r["name"])
                .and_then(|o| o.get("replicas"))
                .cloned();
            if let Some(n) = held {
                r["replicas"] = n;
            }
        }
    }
    json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
           "metadata": {"name": child_name(&set.name, index), "namespace": set.namespace,
               "labels": labels, "annotations": set.annotations,
               "ownerReferences": [{"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": KIND,
                   "name": set.name, "uid": set.uid, "controller": true,
                   "blockOwnerDeletion": true}]},
           "spec": spec})
}

/// `existing` brought to `want`: the spec replaced, the set's labels and annotations laid
/// over the group's own (others, such as the operator's, are kept).
pub fn updated(existing: &Value, want: &Value) -> Option<Value> {
    let mut next = existing.clone();
    next["spec"] = want["spec"].clone();
    for f in ["labels", "annotations"] {
        let Some(add) = want["metadata"][f].as_object().filter(|m| !m.is_empty()) else {
            continue;
        };
        let mut m = existing["metadata"][f]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for (k, v) in add {
            m.insert(k.clone(), v.clone());
        }
        next["metadata"][f] = Value::Object(m);
    }
    (next != *existing).then_some(next)
}

/// Whether a group is Ready at its current spec.
pub fn group_ready(g: &Value) -> bool {
    let st = Status::of(g);
    st.observed_generation == Some(ObjectMeta::of(g).generation) && st.is_true("Ready")
}

/// Whether a group is Ready at its current spec with its rollout done: every role's pods run
/// its current revision and are Ready (a group reports Ready while an in-place update is still
/// rolling through pods that are Ready at the old one).
pub fn group_settled(g: &Value) -> bool {
    group_ready(g)
        && crate::operator::model::RoleStatus::all_of(g)
            .iter()
            .all(|r| r.updated_replicas == r.replicas && r.ready_replicas == r.replicas)
}

/// A set's next writes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Groups to create.
    pub create: Vec<Value>,
    /// Groups to replace (whole objects, under their resourceVersion).
    pub update: Vec<Value>,
    /// The one group to delete now: the highest index above `replicas`, once no other is
    /// still going.
    pub delete: Option<(String, String)>,
    /// Children that exist and are not going, those of them that are Ready, and those that
    /// run the template as it is (after this plan's updates).
    pub replicas: u32,
    pub ready: u32,
    pub updated: u32,
}

/// The index a child group says it has.
fn index_of(g: &Value) -> Option<u32> {
    ObjectMeta::of(g).label(SET_INDEX).parse().ok()
}

/// Plans a set from its children (the groups it owns).
pub fn plan(set: &SetSpec, children: &[Value]) -> Plan {
    let mut p = Plan::default();
    let live: Vec<&Value> = children
        .iter()
        .filter(|c| !ObjectMeta::of(c).is_terminating())
        .collect();
    // Paced: how many more Ready children may be taken down for an update now.
    let unavailable = live.iter().filter(|c| !group_settled(c)).count() as u32;
    let mut budget = set
        .max_unavailable
        .map_or(u32::MAX, |m| m.saturating_sub(unavailable));
    let mut current = 0;
    for i in 0..set.replicas {
        let name = child_name(&set.name, i);
        match children.iter().find(|c| ObjectMeta::of(c).name == name) {
            None => p.create.push(child(set, i, None)),
            // The old one is still going; its successor comes when it is gone.
            Some(c) if ObjectMeta::of(c).is_terminating() => {}
            Some(c) => match updated(c, &child(set, i, Some(c))) {
                None => current += 1,
                Some(next) if !group_settled(c) => {
                    current += 1;
                    p.update.push(next);
                }
                Some(next) if budget > 0 => {
                    budget -= 1;
                    current += 1;
                    p.update.push(next);
                }
                // Its turn comes when fewer children are unavailable.
                Some(_) => {}
            },
        }
    }
    p.updated = current;
    let wanted = |c: &Value| {
        index_of(c)
            .is_some_and(|i| i < set.replicas && ObjectMeta::of(c).name == child_name(&set.name, i))
    };
    let going = children
        .iter()
        .any(|c| !wanted(c) && ObjectMeta::of(c).is_terminating());
    if !going {
        p.delete = live
            .iter()
            .filter(|c| !wanted(c))
            .max_by_key(|c| {
                (
                    index_of(c).map_or(u64::MAX, u64::from),
                    ObjectMeta::of(c).name,
                )
            })
            .map(|c| {
                let m = ObjectMeta::of(c);
                (m.name.to_string(), m.uid.to_string())
            });
    }
    p.replicas = live.len() as u32;
    p.ready = live.iter().filter(|c| group_ready(c)).count() as u32;
    p
}

/// The status a set should have after `p`.
pub fn status(set: &SetSpec, old: &Value, p: &Plan) -> Value {
    let mut st = if old.is_object() {
        old.clone()
    } else {
        json!({})
    };
    st["observedGeneration"] = json!(set.generation);
    st["replicas"] = json!(p.replicas);
    st["readyReplicas"] = json!(p.ready);
    if set.max_unavailable.is_some() || old.get("updatedReplicas").is_some() {
        st["updatedReplicas"] = json!(p.updated);
    }
    let cond = if p.ready == set.replicas && p.replicas == set.replicas {
        NewCondition::new(
            "Ready",
            true,
            "AllReplicasReady",
            format!("{} of {} groups ready", p.ready, set.replicas),
        )
    } else {
        NewCondition::new(
            "Ready",
            false,
            "ReplicasNotReady",
            format!(
                "{} of {} groups ready ({} exist)",
                p.ready, set.replicas, p.replicas
            ),
        )
    };
    set_condition(&mut st, cond, &timestamp_now());
    st
}

fn children_of(ctx: &Context, ns: &str, set: &str, uid: &str) -> Vec<Value> {
    ctx.caches.groups.select(|g| {
        let m = ObjectMeta::of(g);
        m.namespace == ns && m.label(SET_NAME) == set && m.owned_by(uid)
    })
}

/// One reconcile of the set `namespace/name`.
#[tracing::instrument(skip(ctx), fields(set = %key))]
pub async fn reconcile(ctx: &Context, key: &str) -> Result<Requeue, ReconcileError> {
    ctx.metrics.set_reconciles.fetch_add(1, Ordering::Relaxed);
    if !(ctx.caches.sets.synced() && ctx.caches.groups.synced()) {
        return Ok(Requeue::After(CACHE_SYNC_WAIT));
    }
    let Some(obj) = ctx.caches.sets.get(key) else {
        return Ok(Requeue::AwaitChange);
    };
    let (ns, name) = ns_of(key);
    let meta = ObjectMeta::of(&obj);
    let children = children_of(ctx, ns, name, meta.uid);
    if meta.is_terminating() {
        return finalize(ctx, &obj, &children).await;
    }
    if !meta.has_finalizer(FINALIZER) {
        let ops = finalizer::add(&meta, FINALIZER);
        ctx.throttle.wait().await;
        let mark = ctx.caches.sets.mark();
        let v = ctx.kube.patch(&path(ns, name), &Patch::Json(ops)).await?;
        ctx.caches.sets.put_written(v, mark);
        // The next reconcile goes on from the object with the finalizer.
        return Ok(Requeue::AwaitChange);
    }
    let set = match SetSpec::of(&obj) {
        Ok(s) => s,
        Err(e) => {
            ctx.events
                .post_on(&obj, KIND, "Warning", "InvalidSpec", &e.to_string())
                .await;
            return Ok(Requeue::AwaitChange);
        }
    };
    let p = plan(&set, &children);
    for g in &p.create {
        ctx.throttle.wait().await;
        let mark = ctx.caches.groups.mark();
        match ctx.kube.create(&groups_collection(ns), g).await {
            Ok(v) => ctx.caches.groups.put_written(v, mark),
            Err(KubeError::Status { code: 409, .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(set = %key, group = %ObjectMeta::of(g).name, "group created");
    }
    for g in &p.update {
        let m = ObjectMeta::of(g);
        ctx.throttle.wait().await;
        let mark = ctx.caches.groups.mark();
        let v = ctx.kube.replace(&group_path(ns, m.name), g).await?;
        ctx.caches.groups.put_written(v, mark);
        tracing::info!(set = %key, group = %m.name, "group updated from the template");
    }
    if let Some((child, uid)) = &p.delete {
        ctx.throttle.wait().await;
        ctx.kube.delete(&group_path(ns, child), Some(uid)).await?;
        tracing::info!(set = %key, group = %child, "group deleted (scaled down, highest index first)");
    }
    let st = status(&set, &obj["status"], &p);
    if obj.get("status") != Some(&st) {
        let mut next = obj.clone();
        next["status"] = st;
        ctx.throttle.wait().await;
        let mark = ctx.caches.sets.mark();
        let v = ctx
            .kube
            .replace(&format!("{}/status", path(ns, name)), &next)
            .await?;
        ctx.caches.sets.put_written(v, mark);
    }
    Ok(Requeue::AwaitChange)
}

/// Deleting: every child group is deleted, then the finalizer released once they are gone.
async fn finalize(
    ctx: &Context,
    obj: &Value,
    children: &[Value],
) -> Result<Requeue, ReconcileError> {
    let meta = ObjectMeta::of(obj);
    if !meta.has_finalizer(FINALIZER) {
        return Ok(Requeue::AwaitChange);
    }
    for c in children {
        let m = ObjectMeta::of(c);
        if m.is_terminating() {
            continue;
        }
        ctx.throttle.wait().await;
        ctx.kube
            .delete(&group_path(m.namespace, m.name), Some(m.uid))
            .await?;
    }
    if !children.is_empty() {
        // Their deletion events bring the set back.
        return Ok(Requeue::AwaitChange);
    }
    let ops = finalizer::release(&meta, FINALIZER);
    ctx.throttle.wait().await;
    // Into the cache at once, as for a group: released once.
    let mark = ctx.caches.sets.mark();
    match ctx
        .kube
        .patch(&path(meta.namespace, meta.name), &Patch::Json(ops))
        .await
    {
        Ok(v) => {
            ctx.caches.sets.put_written(v, mark);
            tracing::info!(set = %meta.key(), "groups removed; finalizer released");
        }
        Err(KubeError::Status { code: 404, .. }) => {
            ctx.caches.sets.remove_written(&meta.key(), mark);
            tracing::debug!(set = %meta.key(), "the set was gone before its finalizer was released");
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Requeue::AwaitChange)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(replicas: u32) -> SetSpec {
        SetSpec::of(&json!({
            "metadata": {"name": "s", "namespace": "ns", "uid": "u", "generation": 3},
            "spec": {"replicas": replicas, "groupTemplate": {
                "labels": {"team": "a"}, "annotations": {"note": "x"},
                "spec": {"roles": [
                    {"name": "r", "replicas": 2},
                    {"name": "h", "replicas": 1, "scalingAdapter": {"enable": true}}]}}}}))
        .unwrap()
    }

    fn existing(s: &SetSpec, i: u32, terminating: bool, ready: bool) -> Value {
        let mut g = child(s, i, None);
        g["metadata"]["uid"] = json!(format!("uid-{i}"));
        g["metadata"]["generation"] = json!(1);
        if terminating {
            g["metadata"]["deletionTimestamp"] = json!("t");
        }
        if ready {
            g["status"] = json!({"observedGeneration": 1,
                                 "conditions": [{"type": "Ready", "status": "True"}]});
        }
        g
    }

    #[test]
    fn missing_indices_are_created_with_the_sets_labels_and_owner() {
        let s = set(3);
        let p = plan(&s, &[existing(&s, 1, false, true)]);
        let names: Vec<&str> = p.create.iter().map(|g| ObjectMeta::of(g).name).collect();
        assert_eq!(names, ["s-0", "s-2"]);
        let m = ObjectMeta::of(&p.create[0]);
        assert_eq!(m.label(SET_NAME), "s");
        assert_eq!(m.label(SET_INDEX), "0");
        assert_eq!(m.label("team"), "a");
        assert_eq!(m.annotation("note"), "x");
        assert!(m.owned_by("u"));
        assert_eq!((p.replicas, p.ready, p.delete.clone()), (1, 1, None));
        assert!(p.update.is_empty(), "an identical child is left alone");
    }

    #[test]
    fn scaling_down_removes_the_highest_index_first_one_at_a_time() {
        let s = set(1);
        let kids: Vec<Value> = (0..4).map(|i| existing(&s, i, false, true)).collect();
        let p = plan(&s, &kids);
        assert_eq!(p.delete, Some(("s-3".into(), "uid-3".into())));
        let mut kids2 = kids.clone();
        kids2[3] = existing(&s, 3, true, true);
        assert_eq!(plan(&s, &kids2).delete, None, "waits while s-3 goes");
        let p = plan(&s, &kids[..3]);
        assert_eq!(p.delete, Some(("s-2".into(), "uid-2".into())));
    }

    #[test]
    fn a_template_change_updates_children_but_adapter_held_replicas_stay() {
        let s = set(1);
        let mut g = existing(&s, 0, false, true);
        g["spec"]["roles"][1]["replicas"] = json!(5); // scaled by its adapter
        g["metadata"]["labels"]["mine"] = json!("kept");
        assert!(plan(&s, &[g.clone()]).update.is_empty());
        let mut s2 = s.clone();
        s2.spec["roles"][0]["replicas"] = json!(4);
        let p = plan(&s2, &[g]);
        assert_eq!(p.update.len(), 1);
        let u = &p.update[0];
        assert_eq!(u["spec"]["roles"][0]["replicas"], 4);
        assert_eq!(u["spec"]["roles"][1]["replicas"], 5);
        assert_eq!(u["metadata"]["labels"]["mine"], "kept");
        assert_eq!(
            u["metadata"]["uid"], "uid-0",
            "a replace of the same object"
        );
    }

    #[test]
    fn status_counts_live_children_and_ready_ones() {
        let s = set(2);
        let kids = [existing(&s, 0, false, true), existing(&s, 1, false, false)];
        let p = plan(&s, &kids);
        let st = status(&s, &Value::Null, &p);
        assert_eq!(
            (st["replicas"].clone(), st["readyReplicas"].clone()),
            (json!(2), json!(1))
        );
        assert_eq!(st["observedGeneration"], 3);
        assert_eq!(st["conditions"][0]["status"], "False");
        let kids = [existing(&s, 0, false, true), existing(&s, 1, false, true)];
        let st = status(&s, &st, &plan(&s, &kids));
        assert_eq!(st["conditions"][0]["reason"], "AllReplicasReady");
    }

    #[test]
    fn a_set_without_roles_is_refused_by_name() {
        let e = SetSpec::of(&json!({"metadata": {"name": "s"},
                                    "spec": {"groupTemplate": {"spec": {"roles": []}}}}))
        .unwrap_err();
        assert!(e.to_string().contains("groupTemplate.spec.roles"), "{e}");
        let d = SetSpec::of(&json!({"metadata": {"name": "s"},
                                    "spec": {"groupTemplate": {"spec": {"roles": [{"name": "r"}]}}}}))
        .unwrap();
        assert_eq!(d.replicas, 1, "one replica by default");
    }

    #[test]
    fn a_paced_template_change_rolls_across_the_set_max_unavailable_groups_at_a_time() {
        let paced = |max: Value| {
            let mut obj = json!({
                "metadata": {"name": "s", "namespace": "ns", "uid": "u", "generation": 3},
                "spec": {"replicas": 4,
                    "rolloutStrategy": {"rollingUpdate": {"maxUnavailable": max}},
                    "groupTemplate": {"spec": {"roles": [{"name": "r", "replicas": 2}]}}}});
            SetSpec::of(&obj).map(|s| {
                obj["spec"]["groupTemplate"]["spec"]["roles"][0]["replicas"] = json!(3);
                (s, SetSpec::of(&obj).unwrap())
            })
        };
        let (old, new) = paced(json!(1)).unwrap();
        assert_eq!(new.max_unavailable, Some(1));
        let mut kids: Vec<Value> = (0..4).map(|i| existing(&old, i, false, true)).collect();
        // All Ready: one child is updated, the lowest index.
        let p = plan(&new, &kids);
        let names: Vec<&str> = p.update.iter().map(|g| ObjectMeta::of(g).name).collect();
        assert_eq!(names, ["s-0"]);
        assert_eq!(p.updated, 1);
        // It is not Ready yet (its new spec not observed): nothing more.
        kids[0] = p.update[0].clone();
        kids[0]["metadata"]["generation"] = json!(2);
        assert!(plan(&new, &kids).update.is_empty());
        // Ready again: the next one.
        kids[0]["status"] = json!({"observedGeneration": 2,
                                   "conditions": [{"type": "Ready", "status": "True"}]});
        let p = plan(&new, &kids);
        let names: Vec<&str> = p.update.iter().map(|g| ObjectMeta::of(g).name).collect();
        assert_eq!(names, ["s-1"]);
        // A child that is not Ready anyway is updated at once, beside the paced one.
        kids[3]["status"] = json!({});
        let p = plan(&new, &kids);
        let names: Vec<&str> = p.update.iter().map(|g| ObjectMeta::of(g).name).collect();
        assert_eq!(names, ["s-3"], "s-3 down already uses the budget of one");
        // 50 % of 4: two at a time.
        let (_, half) = paced(json!("50%")).unwrap();
        let kids: Vec<Value> = (0..4).map(|i| existing(&old, i, false, true)).collect();
        assert_eq!(plan(&half, &kids).update.len(), 2);
        // Unpaced (the default): all at once, as before.
        let mut unpaced = new.clone();
        unpaced.max_unavailable = None;
        assert_eq!(plan(&unpaced, &kids).update.len(), 4);
        assert!(paced(json!("lots")).is_err());
    }
}
