//! Gang scheduling, as RBG asks for it: the PodGroup a group's pods are scheduled under, and
//! the marks its pods carry, for the scheduler the operator is set to (`--scheduler-name`:
//! scheduler-plugins' coscheduling, `scheduling.x-k8s.io/v1alpha1`, or Volcano,
//! `scheduling.volcano.sh/v1beta1`). Pure: `group.rs` writes what this computes.
//!
//! A group asks for a gang with the annotation `rbg.workloads.x-k8s.io/group-gang-scheduling:
//! "true"` (its timeout, Volcano queue and priority class in the annotations beside it), a
//! v1alpha1 `spec.podGroupPolicy`, or a coordination rule's `strategy.scheduling.gang` (RBG
//! KEP-430), whose `minReplicas` lets a role start with fewer instances than it has (2
//! prefill + 1 decode rather than nothing). Volcano holds each such role to its minimum
//! (`subGroupPolicy`, one sub-group per instance); scheduler-plugins knows no roles, so there
//! the minimums only lower the group's `minMember`.

use super::desired::{self, GROUP, INSTANCE, ROLE};
use super::model::{Coordination, Group};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The group annotation that asks for a gang (`"true"`).
pub const ENABLED: &str = "rbg.workloads.x-k8s.io/group-gang-scheduling";
/// Seconds scheduler-plugins waits for the gang to fit (default [`DEFAULT_TIMEOUT_SECS`]).
pub const TIMEOUT: &str = "rbg.workloads.x-k8s.io/group-gang-scheduling-timeout";
/// The Volcano queue of the group's PodGroup.
pub const VOLCANO_QUEUE: &str = "rbg.workloads.x-k8s.io/group-gang-scheduling-volcano-queue";
/// The priority class of the group's Volcano PodGroup.
pub const VOLCANO_PRIORITY: &str = "rbg.workloads.x-k8s.io/group-gang-scheduling-volcano-priority";
/// The label scheduler-plugins' coscheduling finds a pod's PodGroup by.
pub const PLUGINS_LABEL: &str = "pod-group.scheduling.sigs.k8s.io/name";
/// The annotation Volcano finds a pod's PodGroup by.
pub const VOLCANO_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// Seconds scheduler-plugins waits for a gang to fit before it gives the pods up for a while.
pub const DEFAULT_TIMEOUT_SECS: u32 = 60;

/// The scheduler whose PodGroups the operator writes (`--scheduler-name`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduler {
    /// scheduler-plugins' coscheduling (RBG's default).
    #[default]
    SchedulerPlugins,
    Volcano,
}

impl Scheduler {
    /// The PodGroup CRD this scheduler reads (`plural.group`).
    pub fn crd(self) -> &'static str {
        match self {
            Scheduler::SchedulerPlugins => "podgroups.scheduling.x-k8s.io",
            Scheduler::Volcano => "podgroups.scheduling.volcano.sh",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Scheduler::SchedulerPlugins => "scheduling.x-k8s.io/v1alpha1",
            Scheduler::Volcano => "scheduling.volcano.sh/v1beta1",
        }
    }

    /// The PodGroups of a namespace, or one of them.
    pub fn path(self, ns: &str, name: Option<&str>) -> String {
        let base = format!("/apis/{}/namespaces/{ns}/podgroups", self.api_version());
        match name {
            Some(n) => format!("{base}/{n}"),
            None => base,
        }
    }

    /// The annotations a PodGroup takes over from its group: those under the scheduler's
    /// own prefix, as RBG passes them on.
    fn inherited_prefix(self) -> &'static str {
        match self {
            Scheduler::SchedulerPlugins => "scheduling.x-k8s.io/",
            Scheduler::Volcano => "volcano.sh/",
        }
    }
}

impl std::str::FromStr for Scheduler {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "scheduler-plugins" => Ok(Scheduler::SchedulerPlugins),
            "volcano" => Ok(Scheduler::Volcano),
            other => Err(format!(
                "{other:?} is not a scheduler the operator writes PodGroups for \
                 (scheduler-plugins, volcano)"
            )),
        }
    }
}

/// A group's gang, as its spec, annotations and coordination rules ask for it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gang {
    pub timeout_secs: u32,
    pub queue: Option<String>,
    pub priority_class: Option<String>,
    /// The least instances of a role the scheduler must place together; a role not named:
    /// all of its replicas.
    pub min_replicas: BTreeMap<String, u32>,
    /// The group's annotations (those a PodGroup may inherit are picked per scheduler).
    annotations: BTreeMap<String, String>,
}

/// The gang `obj` (a group) asks for, if any; an annotation or rule that cannot be read is an
/// error naming it.
pub fn wanted(obj: &Value, g: &Group, rules: &[Coordination]) -> Result<Option<Gang>, String> {
    let annotations: BTreeMap<String, String> = obj["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    let policy = obj["spec"].get("podGroupPolicy").filter(|p| !p.is_null());
    let by_rule: Vec<&Coordination> = rules.iter().filter(|r| r.gang.is_some()).collect();
    let asked = match annotations.get(ENABLED).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "annotation {ENABLED}: {other:?} is not true or false"
            ))
        }
    };
    if !asked && policy.is_none() && by_rule.is_empty() {
        return Ok(None);
    }
    let timeout_secs = match annotations.get(TIMEOUT) {
        Some(t) => t.parse::<u32>().ok().filter(|t| *t > 0).ok_or_else(|| {
            format!("annotation {TIMEOUT}: {t:?} is not a positive number of seconds")
        })?,
        None => policy
            .and_then(|p| p.pointer("/kubeScheduling/scheduleTimeoutSeconds"))
            .and_then(Value::as_u64)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_TIMEOUT_SECS),
    };
    let from_policy = |field: &str| {
        policy
            .and_then(|p| p["volcanoScheduling"][field].as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let queue = annotations
        .get(VOLCANO_QUEUE)
        .cloned()
        .or_else(|| from_policy("queue"));
    let priority_class = annotations
        .get(VOLCANO_PRIORITY)
        .cloned()
        .or_else(|| from_policy("priorityClassName"));
    let mut min_replicas: BTreeMap<String, u32> = BTreeMap::new();
    for rule in by_rule {
        for (role, n) in &rule.gang.as_ref().expect("filtered").min_replicas {
            if !g.roles.iter().any(|r| &r.name == role) {
                return Err(format!(
                    "coordination rule {:?}: scheduling.gang.minReplicas names {role:?}, which \
                     is not a role of this group",
                    rule.name
                ));
            }
            // Two rules naming one role: the stricter minimum holds.
            let m = min_replicas.entry(role.clone()).or_insert(*n);
            *m = (*m).max(*n);
        }
    }
    Ok(Some(Gang {
        timeout_secs,
        queue,
        priority_class,
        min_replicas,
        annotations,
    }))
}

impl Gang {
    /// Instances of `role` the gang needs placed (never more than it has).
    fn least(&self, role: &super::model::Role) -> u32 {
        self.min_replicas
            .get(&role.name)
            .map_or(role.replicas, |m| (*m).min(role.replicas))
    }

    /// Pods the scheduler must be able to place at once.
    pub fn min_member(&self, g: &Group) -> u32 {
        g.roles.iter().map(|r| self.least(r) * r.size()).sum()
    }
}

/// The PodGroup for group `g`'s gang under scheduler `s`: named as the group, controlled by it.
pub fn pod_group(g: &Group, gang: &Gang, s: Scheduler) -> Value {
    let inherited: Map<String, Value> = gang
        .annotations
        .iter()
        .filter(|(k, _)| k.starts_with(s.inherited_prefix()))
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut spec = json!({"minMember": gang.min_member(g)});
    match s {
        Scheduler::SchedulerPlugins => {
            spec["scheduleTimeoutSeconds"] = json!(gang.timeout_secs);
        }
        Scheduler::Volcano => {
            if let Some(q) = &gang.queue {
                spec["queue"] = json!(q);
            }
            if let Some(p) = &gang.priority_class {
                spec["priorityClassName"] = json!(p);
            }
            // Each role held to a minimum: a sub-group per instance, that many whole.
            let policies: Vec<Value> = g
                .roles
                .iter()
                .filter(|r| gang.min_replicas.contains_key(&r.name))
                .map(|r| {
                    json!({"name": r.name, "subGroupSize": r.size(),
                           "minSubGroups": gang.least(r),
                           "labelSelector": {"matchLabels": {GROUP: g.name, ROLE: r.name}},
                           "matchLabelKeys": [INSTANCE]})
                })
                .collect();
            if !policies.is_empty() {
                spec["subGroupPolicy"] = Value::Array(policies);
            }
        }
    }
    let mut labels = Map::new();
    labels.insert(GROUP.into(), json!(g.name));
    labels.insert(desired::MANAGED_BY.into(), json!(desired::MANAGER));
    json!({
        "apiVersion": s.api_version(),
        "kind": "PodGroup",
        "metadata": {"name": g.name, "namespace": g.namespace, "labels": labels,
                     "annotations": inherited, "ownerReferences": desired::owner(g)},
        "spec": spec,
    })
}

/// The labels and annotations that put a pod of group `group` in its gang.
pub fn pod_marks(group: &str, s: Scheduler) -> (Map<String, Value>, Map<String, Value>) {
    let (mut labels, mut annotations) = (Map::new(), Map::new());
    match s {
        Scheduler::SchedulerPlugins => labels.insert(PLUGINS_LABEL.into(), json!(group)),
        Scheduler::Volcano => annotations.insert(VOLCANO_ANNOTATION.into(), json!(group)),
    };
    (labels, annotations)
}

/// Whether a pod carries the gang mark of either scheduler (a sign a gang was asked for).
pub fn marked(pod: &Value) -> bool {
    pod["metadata"]["labels"].get(PLUGINS_LABEL).is_some()
        || pod["metadata"]["annotations"]
            .get(VOLCANO_ANNOTATION)
            .is_some()
}

/// What of `desired` an existing PodGroup lacks: the merge patch that brings it there (its
/// spec and inherited annotations), or `None` when it has it all.
pub fn patch_for(existing: &Value, desired: &Value) -> Option<Value> {
    let mut spec = Map::new();
    for (k, v) in desired["spec"].as_object().into_iter().flatten() {
        if existing["spec"].get(k) != Some(v) {
            spec.insert(k.clone(), v.clone());
        }
    }
    // A minimum set before and no longer asked for goes.
    for k in ["subGroupPolicy", "queue", "priorityClassName"] {
        if existing["spec"].get(k).is_some() && desired["spec"].get(k).is_none() {
            spec.insert(k.into(), Value::Null);
        }
    }
    let mut annotations = Map::new();
    for (k, v) in desired["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if existing["metadata"]["annotations"].get(k) != Some(v) {
            annotations.insert(k.clone(), v.clone());
        }
    }
    if spec.is_empty() && annotations.is_empty() {
        return None;
    }
    let mut p = json!({});
    if !spec.is_empty() {
        p["spec"] = Value::Object(spec);
    }
    if !annotations.is_empty() {
        p["metadata"] = json!({"annotations": annotations});
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::model::parse_group;

    /// A prefill (4 instances of 2) and decode (2) group; with `policy`, in v1alpha1's form.
    fn group(annotations: Value, policy: Value) -> (Value, Group) {
        let t = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        let meta = json!({"name": "pd", "namespace": "ns", "uid": "u1",
                          "annotations": annotations});
        let obj = if policy.is_null() {
            json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
                "metadata": meta, "spec": {"roles": [
                    {"name": "prefill", "replicas": 4,
                     "leaderWorkerPattern": {"size": 2, "template": t}},
                    {"name": "decode", "replicas": 2, "standalonePattern": {"template": t}}]}})
        } else {
            json!({"apiVersion": "workloads.x-k8s.io/v1alpha1", "kind": "RoleBasedGroup",
                "metadata": meta, "spec": {"podGroupPolicy": policy, "roles": [
                    {"name": "prefill", "replicas": 4, "template": t,
                     "leaderWorkerSet": {"size": 2}},
                    {"name": "decode", "replicas": 2, "template": t}]}})
        };
        let g = parse_group(&obj).unwrap();
        (obj, g)
    }

    fn rule(min: Value) -> Coordination {
        let list = json!([{"name": "gang", "roles": ["prefill", "decode"],
                           "strategy": {"scheduling": {"gang": {"minReplicas": min}}}}]);
        crate::operator::model::parse_policy(&json!({"spec": {"policies": list}}))
            .unwrap()
            .remove(0)
    }

    #[test]
    fn nothing_is_asked_without_the_annotation_a_policy_or_a_rule() {
        let (obj, g) = group(json!({}), Value::Null);
        assert_eq!(wanted(&obj, &g, &[]), Ok(None));
        let (obj, g) = group(json!({ENABLED: "false"}), Value::Null);
        assert_eq!(wanted(&obj, &g, &[]), Ok(None));
    }

    #[test]
    fn the_group_gang_counts_every_pod_and_takes_its_settings() {
        let (obj, g) = group(
            json!({ENABLED: "true", TIMEOUT: "120", VOLCANO_QUEUE: "q",
                   "scheduling.x-k8s.io/extra": "kept", "other/x": "not"}),
            Value::Null,
        );
        let gang = wanted(&obj, &g, &[]).unwrap().unwrap();
        assert_eq!(gang.min_member(&g), 4 * 2 + 2);
        let pg = pod_group(&g, &gang, Scheduler::SchedulerPlugins);
        assert_eq!(pg["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
        assert_eq!(
            pg["spec"],
            json!({"minMember": 10, "scheduleTimeoutSeconds": 120})
        );
        assert_eq!(
            pg["metadata"]["annotations"],
            json!({"scheduling.x-k8s.io/extra": "kept"})
        );
        assert_eq!(pg["metadata"]["ownerReferences"][0]["uid"], "u1");
        let vc = pod_group(&g, &gang, Scheduler::Volcano);
        assert_eq!(vc["spec"], json!({"minMember": 10, "queue": "q"}));
        assert_eq!(vc["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn a_v1alpha1_pod_group_policy_asks_for_a_gang() {
        let (obj, g) = group(
            json!({}),
            json!({"kubeScheduling": {"scheduleTimeoutSeconds": 30},
                   "volcanoScheduling": {"queue": "gpu", "priorityClassName": "high"}}),
        );
        let gang = wanted(&obj, &g, &[]).unwrap().unwrap();
        assert_eq!(
            (gang.timeout_secs, gang.queue.as_deref()),
            (30, Some("gpu"))
        );
        assert_eq!(gang.priority_class.as_deref(), Some("high"));
    }

    #[test]
    fn role_minimums_lower_min_member_and_become_volcano_sub_groups() {
        let (obj, g) = group(json!({}), Value::Null);
        // A minimum over a role's replicas is held to its replicas.
        let gang = wanted(&obj, &g, &[rule(json!({"prefill": 2, "decode": 9}))])
            .unwrap()
            .unwrap();
        assert_eq!(gang.min_member(&g), 2 * 2 + 2);
        let vc = pod_group(&g, &gang, Scheduler::Volcano);
        let policies = vc["spec"]["subGroupPolicy"].as_array().unwrap();
        assert_eq!(policies.len(), 2);
        assert_eq!(policies[0]["name"], "prefill");
        assert_eq!(policies[0]["subGroupSize"], 2);
        assert_eq!(policies[0]["minSubGroups"], 2);
        assert_eq!(policies[0]["matchLabelKeys"], json!([INSTANCE]));
        assert_eq!(policies[1]["minSubGroups"], 2);
        let plugins = pod_group(&g, &gang, Scheduler::SchedulerPlugins);
        assert!(plugins["spec"].get("subGroupPolicy").is_none());
        assert_eq!(plugins["spec"]["minMember"], 6);
    }

    #[test]
    fn bad_settings_are_named() {
        let (obj, g) = group(json!({ENABLED: "yes"}), Value::Null);
        assert!(wanted(&obj, &g, &[]).unwrap_err().contains(ENABLED));
        let (obj, g) = group(json!({ENABLED: "true", TIMEOUT: "soon"}), Value::Null);
        assert!(wanted(&obj, &g, &[]).unwrap_err().contains(TIMEOUT));
        let list = json!([{"name": "gang", "roles": ["prefill"],
                           "strategy": {"scheduling": {"gang": {"minReplicas": {"decode": 1}}}}}]);
        let e = crate::operator::model::parse_policy(&json!({"spec": {"policies": list}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"decode\"") && e.contains("rule's roles"),
            "{e}"
        );
        assert!("kai".parse::<Scheduler>().unwrap_err().contains("volcano"));
    }

    #[test]
    fn an_existing_pod_group_is_patched_only_where_it_differs() {
        let (obj, g) = group(json!({ENABLED: "true"}), Value::Null);
        let gang = wanted(&obj, &g, &[]).unwrap().unwrap();
        let want = pod_group(&g, &gang, Scheduler::Volcano);
        assert_eq!(patch_for(&want, &want), None);
        let mut old = want.clone();
        old["spec"]["minMember"] = json!(3);
        old["spec"]["subGroupPolicy"] = json!([]);
        old["status"] = json!({"phase": "Running"});
        assert_eq!(
            patch_for(&old, &want),
            Some(json!({"spec": {"minMember": 10, "subGroupPolicy": null}}))
        );
        let meta = crate::kube::object::ObjectMeta::of(&want);
        assert!(meta.controlled_by("u1") && !meta.controlled_by("u2"));
        let (labels, annotations) = pod_marks("pd", Scheduler::SchedulerPlugins);
        assert_eq!(labels[PLUGINS_LABEL], "pd");
        assert!(annotations.is_empty());
        let pod = json!({"metadata": {"annotations": {VOLCANO_ANNOTATION: "pd"}}});
        assert!(marked(&pod) && !marked(&json!({"metadata": {}})));
    }
}
