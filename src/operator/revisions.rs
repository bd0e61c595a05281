//! Revision history, as StatefulSets keep theirs: a ControllerRevision per template a role
//! has had (`<group>-<role>-<hash>`, numbered in order, the role as written in `data`), so
//! that a pod recreated below `partition` gets the revision its neighbours run and a group can
//! be rolled back to a revision by name. Pure: `group.rs` writes what this computes.
//!
//! A rollback is asked with the group annotation `rbg.workloads.x-k8s.io/rollback-to`:
//! `previous` (every role to the revision before the one its spec names), or revision names
//! (`kubectl get controllerrevisions -l rbg.workloads.x-k8s.io/group-name=G`), comma-separated,
//! one per role. The operator writes those roles back into the spec (the template inline) and
//! removes the annotation in one patch; the rollout that follows is like any other, in place
//! where only images differ.

use super::desired::{self, Revision, GROUP, MANAGED_BY, MANAGER, REVISION, ROLE};
use super::model::{Group, Role};
use super::plan::PodView;
use crate::kube::object::ObjectMeta;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The group annotation that asks for a rollback.
pub const ROLLBACK_TO: &str = "rbg.workloads.x-k8s.io/rollback-to";
/// Revisions kept per role (StatefulSet's `revisionHistoryLimit` default), besides those pods
/// still run.
pub const HISTORY_LIMIT: usize = 10;

/// The ControllerRevisions of a namespace, or one of them.
pub fn path(ns: &str, name: Option<&str>) -> String {
    let base = format!("/apis/apps/v1/namespaces/{ns}/controllerrevisions");
    match name {
        Some(n) => format!("{base}/{n}"),
        None => base,
    }
}

/// The name of a role's revision.
pub fn name(group: &str, role: &str, hash: &str) -> String {
    format!("{group}-{role}-{hash}")
}

/// One revision of a role, as its ControllerRevision says.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    pub name: String,
    pub number: i64,
    pub hash: String,
    /// The role as written then (`Role::source`).
    pub source: Value,
    /// The group was written in the v1alpha1 form.
    pub legacy: bool,
}

impl Kept {
    /// The revision a ControllerRevision keeps, if `cr` is one of the operator's.
    pub fn of(cr: &Value) -> Option<Kept> {
        let m = ObjectMeta::of(cr);
        Some(Kept {
            name: m.name.to_string(),
            number: cr["revision"].as_i64()?,
            hash: m.label(REVISION).to_string(),
            source: cr["data"]["role"].clone(),
            legacy: cr["data"]["legacy"].as_bool().unwrap_or(false),
        })
    }

    /// The role at this revision, with `replicas`.
    pub fn role(&self, replicas: u32) -> Option<Role> {
        super::model::role_at(&self.source, self.legacy, replicas).ok()
    }
}

/// A role's revisions, oldest first.
pub fn history_of(crs: &[Value], role: &str) -> Vec<Kept> {
    let mut out: Vec<Kept> = crs
        .iter()
        .filter(|c| ObjectMeta::of(c).label(ROLE) == role)
        .filter_map(Kept::of)
        .collect();
    out.sort_by_key(|k| k.number);
    out
}

/// The ControllerRevision for `role` at `rev`, numbered after the role's `history`.
pub fn revision_object(g: &Group, role: &Role, rev: &Revision, history: &[Kept]) -> Value {
    let number = history.iter().map(|k| k.number).max().unwrap_or(0) + 1;
    json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": name(&g.name, &role.name, &rev.hash),
            "namespace": g.namespace,
            "labels": {GROUP: g.name, ROLE: role.name, REVISION: rev.hash, MANAGED_BY: MANAGER},
            "ownerReferences": desired::owner(g),
        },
        "data": {"role": role.source, "legacy": g.legacy},
        "revision": number,
    })
}

/// The revisions past the history limit, oldest first, sparing `in_use` (those pods run, the
/// current and the update revision).
pub fn to_prune(history: &[Kept], in_use: &BTreeSet<String>) -> Vec<String> {
    let prunable: Vec<&Kept> = history
        .iter()
        .filter(|k| !in_use.contains(&k.hash))
        .collect();
    let over = (history.len()).saturating_sub(HISTORY_LIMIT);
    prunable
        .into_iter()
        .take(over)
        .map(|k| k.name.clone())
        .collect()
}

/// StatefulSet's `currentRevision`: the revision pods below `partition` keep while a rollout
/// is under way. Once all `want` pods run `update`, it is `update`; until then the one
/// recorded before (`previous`), else the revision most live pods run other than `update`.
pub fn current_revision(previous: &str, update: &str, pods: &[PodView], want: u32) -> String {
    let live: Vec<&PodView> = pods.iter().filter(|p| !p.terminating).collect();
    if live.len() >= want as usize && live.iter().all(|p| p.revision == update) {
        return update.to_string();
    }
    if !previous.is_empty() {
        return previous.to_string();
    }
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for p in live
        .iter()
        .filter(|p| p.revision != update && !p.revision.is_empty())
    {
        *count.entry(p.revision.as_str()).or_default() += 1;
    }
    count
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map_or_else(|| update.to_string(), |(h, _)| h.to_string())
}

/// What a rollback annotation asks: each role's revision to write back, by role name.
pub fn rollback_targets(
    asked: &str,
    g: &Group,
    revs: &BTreeMap<String, Revision>,
    crs: &[Value],
) -> Result<BTreeMap<String, Kept>, String> {
    let mut out = BTreeMap::new();
    if asked.trim() == "previous" {
        for r in &g.roles {
            let history = history_of(crs, &r.name);
            let now = history
                .iter()
                .find(|k| k.hash == revs[&r.name].hash)
                .map_or(i64::MAX, |k| k.number);
            if let Some(before) = history.iter().rev().find(|k| k.number < now) {
                out.insert(r.name.clone(), before.clone());
            }
        }
        if out.is_empty() {
            return Err("no role has a revision before the one its spec names".into());
        }
        return Ok(out);
    }
    for wanted in asked.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let kept = crs
            .iter()
            .filter_map(Kept::of)
            .find(|k| k.name == wanted)
            .ok_or_else(|| format!("no revision {wanted:?} of this group"))?;
        let role = crs
            .iter()
            .find(|c| ObjectMeta::of(c).name == wanted)
            .map(|c| ObjectMeta::of(c).label(ROLE).to_string())
            .unwrap_or_default();
        if !g.roles.iter().any(|r| r.name == role) {
            return Err(format!(
                "revision {wanted:?} is of role {role:?}, not in the spec"
            ));
        }
        if out.insert(role.clone(), kept).is_some() {
            return Err(format!("two revisions named for role {role:?}"));
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{ROLLBACK_TO}: {asked:?} names no revision (\"previous\", or revision names)"
        ));
    }
    Ok(out)
}

/// The JSON patch that writes `targets` back into the group `obj` (each role's replicas kept)
/// and (`asked`) removes the annotation that asked, on the condition that the group is still
/// the one read.
pub fn rollback_patch(obj: &Value, targets: &BTreeMap<String, Kept>, asked: bool) -> Value {
    let meta = ObjectMeta::of(obj);
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion",
                              "value": meta.resource_version})];
    if asked {
        ops.push(
            json!({"op": "remove", "path": format!("/metadata/annotations/{}",
            crate::kube::patch::escape(ROLLBACK_TO))}),
        );
    }
    for (i, r) in obj["spec"]["roles"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(k) = r["name"].as_str().and_then(|n| targets.get(n)) else {
            continue;
        };
        let mut role = k.source.clone();
        if let Some(n) = r.get("replicas") {
            role["replicas"] = n.clone();
        }
        ops.push(json!({"op": "replace", "path": format!("/spec/roles/{i}"), "value": role}));
    }
    Value::Array(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::model::parse_group;

    fn group(image: &str, via_ref: bool) -> (Value, Group) {
        let t = json!({"spec": {"containers": [{"name": "c", "image": image}]}});
        let decode = if via_ref {
            json!({"templateRef": {"name": "base", "patch": {"metadata": {"labels": {"x": "y"}}}}})
        } else {
            json!({"template": t})
        };
        let obj = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
            "metadata": {"name": "pd", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
            "spec": {"roleTemplates": [{"name": "base", "template": t}], "roles": [
                {"name": "prefill", "replicas": 3,
                 "leaderWorkerPattern": {"size": 2, "template": t}},
                {"name": "decode", "replicas": 2, "standalonePattern": decode}]}});
        let g = parse_group(&obj).unwrap();
        (obj, g)
    }

    fn crs_of(versions: &[(&str, bool)]) -> Vec<Value> {
        let mut crs: Vec<Value> = Vec::new();
        for (image, via_ref) in versions {
            let (_, g) = group(image, *via_ref);
            for r in &g.roles {
                let rev = desired::revision(r);
                let history: Vec<Kept> = history_of(&crs, &r.name);
                if history.iter().any(|k| k.hash == rev.hash) {
                    continue;
                }
                crs.push(revision_object(&g, r, &rev, &history));
            }
        }
        crs
    }

    #[test]
    fn a_kept_revision_gives_back_the_role_with_the_same_hash() {
        let (_, g) = group("img:1", true);
        for r in &g.roles {
            let rev = desired::revision(r);
            let cr = revision_object(&g, r, &rev, &[]);
            assert_eq!(
                cr["metadata"]["name"],
                format!("pd-{}-{}", r.name, rev.hash)
            );
            assert_eq!(cr["revision"], 1);
            let kept = Kept::of(&cr).unwrap();
            let back = kept.role(5).unwrap();
            assert_eq!(desired::revision(&back), rev, "role {}", r.name);
            assert_eq!(back.replicas, 5);
            assert!(kept.source.get("replicas").is_none());
        }
        // The templateRef was written inline, its patch applied.
        let (_, g) = group("img:1", true);
        let decode = &g.roles[1].source["standalonePattern"];
        assert!(decode.get("templateRef").is_none());
        assert_eq!(decode["template"]["metadata"]["labels"]["x"], "y");
    }

    #[test]
    fn revisions_are_numbered_and_pruned_past_the_limit_sparing_those_in_use() {
        let images: Vec<String> = (0..13).map(|i| format!("img:{i}")).collect();
        let crs = crs_of(
            &images
                .iter()
                .map(|i| (i.as_str(), false))
                .collect::<Vec<_>>(),
        );
        let history = history_of(&crs, "prefill");
        assert_eq!(history.len(), 13);
        assert_eq!(
            history.iter().map(|k| k.number).collect::<Vec<_>>(),
            (1..=13).collect::<Vec<_>>()
        );
        let in_use: BTreeSet<String> = [history[0].hash.clone()].into();
        let pruned = to_prune(&history, &in_use);
        assert_eq!(
            pruned,
            vec![
                history[1].name.clone(),
                history[2].name.clone(),
                history[3].name.clone()
            ]
        );
    }

    #[test]
    fn rollback_to_previous_or_by_name_writes_the_roles_back() {
        let crs = crs_of(&[("img:1", false), ("img:2", false)]);
        let (obj, g) = group("img:2", false);
        let revs: BTreeMap<String, Revision> = g
            .roles
            .iter()
            .map(|r| (r.name.clone(), desired::revision(r)))
            .collect();
        let t = rollback_targets("previous", &g, &revs, &crs).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t["prefill"].number, 1);
        let patch = rollback_patch(&obj, &t, true);
        let ops = patch.as_array().unwrap();
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(
            ops[1]["path"],
            "/metadata/annotations/rbg.workloads.x-k8s.io~1rollback-to"
        );
        assert_eq!(ops[2]["path"], "/spec/roles/0");
        assert_eq!(ops[2]["value"]["replicas"], 3);
        assert_eq!(
            ops[2]["value"]["leaderWorkerPattern"]["template"]["spec"]["containers"][0]["image"],
            "img:1"
        );
        let one = t["decode"].name.clone();
        let by_name = rollback_targets(&one, &g, &revs, &crs).unwrap();
        assert_eq!(by_name.keys().collect::<Vec<_>>(), ["decode"]);
        assert!(rollback_targets("nope", &g, &revs, &crs)
            .unwrap_err()
            .contains("\"nope\""));
        let first = crs_of(&[("img:1", false)]);
        let (_, g1) = group("img:1", false);
        let revs1: BTreeMap<String, Revision> = g1
            .roles
            .iter()
            .map(|r| (r.name.clone(), desired::revision(r)))
            .collect();
        assert!(rollback_targets("previous", &g1, &revs1, &first).is_err());
    }

    #[test]
    fn the_current_revision_holds_until_every_pod_is_updated() {
        let pod = |rev: &str| PodView {
            name: String::new(),
            uid: String::new(),
            instance: String::new(),
            ordinal: None,
            component: 0,
            revision: rev.into(),
            shape: String::new(),
            ready: true,
            terminating: false,
            failed: false,
            scheduled: true,
            inplace_unconfirmed_since: None,
            restarted: false,
        };
        let pods = [pod("a"), pod("a"), pod("b")];
        assert_eq!(current_revision("", "b", &pods, 3), "a");
        assert_eq!(current_revision("a", "b", &pods, 3), "a");
        let done = [pod("b"), pod("b"), pod("b")];
        assert_eq!(current_revision("a", "b", &done, 3), "b");
        assert_eq!(
            current_revision("a", "b", &done[..2], 3),
            "a",
            "one pod still to come"
        );
        assert_eq!(current_revision("", "b", &[], 3), "b");
    }
}
