//! Typed views of the parts of Kubernetes objects that rbgctl reads: object metadata and the
//! subset of a Pod's spec and status that readiness, scheduling and in-place updates need.
//! Views borrow from the JSON the caches hold (no copies); a field that is missing reads as
//! empty, and a misspelt field name does not compile, where a JSON pointer silently read "".
//!
//! Writes still build JSON: the operator writes whole objects it computes (`desired`), and the
//! API server's schema, not this file, is the contract for those; conditions are written
//! typed ([`set_condition`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// `metadata`, as every object has it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub resource_version: &'a str,
    pub generation: i64,
    #[serde(borrow)]
    pub labels: BTreeMap<&'a str, &'a str>,
    #[serde(borrow)]
    pub annotations: BTreeMap<&'a str, &'a str>,
    #[serde(borrow)]
    pub finalizers: Vec<&'a str>,
    pub deletion_timestamp: Option<&'a str>,
    #[serde(borrow)]
    pub owner_references: Vec<OwnerReference<'a>>,
}

/// One of `metadata.ownerReferences`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct OwnerReference<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub controller: bool,
}

impl<'a> ObjectMeta<'a> {
    /// The metadata of `obj`; all empty when it has none or it does not follow the schema
    /// (the API server guarantees the schema for what it serves).
    pub fn of(obj: &'a Value) -> ObjectMeta<'a> {
        obj.get("metadata")
            .and_then(|m| ObjectMeta::deserialize(m).ok())
            .unwrap_or_default()
    }

    /// A label's value, "" when the label is absent.
    pub fn label(&self, key: &str) -> &'a str {
        self.labels.get(key).copied().unwrap_or("")
    }

    /// An annotation's value, "" when it is absent.
    pub fn annotation(&self, key: &str) -> &'a str {
        self.annotations.get(key).copied().unwrap_or("")
    }

    /// `namespace/name`, the key caches and queues use.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Being deleted (a finalizer or grace period holds it).
    pub fn is_terminating(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    /// Whether the object carries `finalizer`.
    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.contains(&finalizer)
    }

    /// Whether the object with this uid is one of its owners.
    pub fn owned_by(&self, uid: &str) -> bool {
        !uid.is_empty() && self.owner_references.iter().any(|o| o.uid == uid)
    }

    /// Whether the object with `uid` is its controller (the owner reference marked so).
    pub fn controlled_by(&self, uid: &str) -> bool {
        !uid.is_empty()
            && self
                .owner_references
                .iter()
                .any(|o| o.uid == uid && o.controller)
    }
}

/// `metadata` of a list: where the list stands and how to ask for its next page.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ListMeta<'a> {
    pub resource_version: &'a str,
    #[serde(rename = "continue")]
    pub continue_token: &'a str,
}

impl<'a> ListMeta<'a> {
    /// The metadata of a list (its resourceVersion and continue token); empty when it has none.
    pub fn of(list: &'a Value) -> ListMeta<'a> {
        list.get("metadata")
            .and_then(|m| ListMeta::deserialize(m).ok())
            .unwrap_or_default()
    }
}

/// A Pod, as far as rbgctl looks.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Pod<'a> {
    #[serde(borrow)]
    pub metadata: ObjectMeta<'a>,
    #[serde(borrow)]
    pub spec: PodSpec<'a>,
    #[serde(borrow)]
    pub status: PodStatus<'a>,
}

/// What the operator reads of a pod's spec.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec<'a> {
    /// Empty until the scheduler binds the pod.
    pub node_name: &'a str,
    #[serde(borrow)]
    pub containers: Vec<Container<'a>>,
}

/// One container of a pod's spec: its name, image and ports.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Container<'a> {
    pub name: &'a str,
    pub image: &'a str,
    #[serde(borrow)]
    pub ports: Vec<ContainerPort<'a>>,
}

/// A container's named port.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort<'a> {
    pub name: &'a str,
    pub container_port: u16,
}

/// What the operator reads of a pod's status: its phase, address, conditions and
/// containers.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct PodStatus<'a> {
    pub phase: &'a str,
    #[serde(rename = "podIP")]
    pub pod_ip: &'a str,
    #[serde(borrow)]
    pub conditions: Vec<Condition<'a>>,
    #[serde(borrow)]
    pub container_statuses: Vec<ContainerStatus<'a>>,
}

/// A condition as read (`metav1.Condition`, or a Pod's).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Condition<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub status: &'a str,
}

/// What the status of rbgctl's own kinds shares: the generation it was written for and its
/// conditions.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Status<'a> {
    pub observed_generation: Option<i64>,
    #[serde(borrow)]
    pub conditions: Vec<Condition<'a>>,
}

impl<'a> Status<'a> {
    /// The status of `obj`; empty when it has none.
    pub fn of(obj: &'a Value) -> Status<'a> {
        obj.get("status")
            .and_then(|s| Status::deserialize(s).ok())
            .unwrap_or_default()
    }

    /// Whether condition `kind` is `True`.
    pub fn is_true(&self, kind: &str) -> bool {
        self.conditions
            .iter()
            .any(|c| c.kind == kind && c.status == "True")
    }
}

/// A condition to write (`metav1.Condition`): [`set_condition`] keeps its
/// `lastTransitionTime` while its status holds.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct NewCondition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
}

impl NewCondition {
    /// A condition of type `kind`, `True` when `ok`, with its reason and message.
    pub fn new(kind: &str, ok: bool, reason: &str, message: impl Into<String>) -> NewCondition {
        NewCondition {
            kind: kind.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: String::new(),
        }
    }
}

/// Now, as Kubernetes writes a time (`2026-11-26T19:00:00Z`).
pub fn timestamp_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Sets `cond` among `status.conditions` (replacing the one of its type), stamped `now` when
/// its status changed and with the old time when not; the list is left as it is when nothing
/// but the time would change, so a steady object is not written again.
pub fn set_condition(status: &mut Value, mut cond: NewCondition, now: &str) {
    let mut list: Vec<NewCondition> = status
        .get("conditions")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let old = list.iter().find(|c| c.kind == cond.kind);
    cond.last_transition_time = match old {
        Some(o) if o.status == cond.status => o.last_transition_time.clone(),
        _ => now.to_string(),
    };
    if old == Some(&cond) {
        return;
    }
    list.retain(|c| c.kind != cond.kind);
    list.push(cond);
    status["conditions"] = serde_json::to_value(list).unwrap_or_default();
}

/// One container's status: what it runs and how often it restarted.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerStatus<'a> {
    pub name: &'a str,
    /// The image the kubelet runs, as the spec named it (registries may normalise it).
    pub image: &'a str,
    #[serde(rename = "imageID")]
    pub image_id: &'a str,
    pub ready: bool,
    pub restart_count: u64,
}

impl<'a> Pod<'a> {
    /// The pod in `obj`; empty fields where `obj` has none.
    pub fn of(obj: &'a Value) -> Pod<'a> {
        Pod::deserialize(obj).unwrap_or_else(|_| Pod {
            metadata: ObjectMeta::of(obj),
            ..Pod::default()
        })
    }

    /// Phase Running and condition Ready=True.
    pub fn is_ready(&self) -> bool {
        self.status.phase == "Running"
            && self
                .status
                .conditions
                .iter()
                .any(|c| c.kind == "Ready" && c.status == "True")
    }

    /// Whether the pod has been given a node.
    pub fn is_scheduled(&self) -> bool {
        !self.spec.node_name.is_empty()
    }

    /// The image ID a container runs, "" when it has no status yet.
    pub fn image_id(&self, container: &str) -> &'a str {
        self.container_status(container).map_or("", |s| s.image_id)
    }

    /// The status of the container named `container`, once it has one.
    pub fn container_status(&self, container: &str) -> Option<&ContainerStatus<'a>> {
        self.status
            .container_statuses
            .iter()
            .find(|s| s.name == container)
    }

    /// The image the spec asks of a container, "" when there is no such container.
    pub fn spec_image(&self, container: &str) -> &'a str {
        self.spec
            .containers
            .iter()
            .find(|c| c.name == container)
            .map_or("", |c| c.image)
    }
}

/// Whether the image a kubelet reports is the one the spec names. Container runtimes report
/// a spec's `nginx:1.25` as `docker.io/library/nginx:1.25`, and a tagless name as `:latest`.
pub fn same_image(spec: &str, reported: &str) -> bool {
    fn normal(image: &str) -> String {
        let image = image
            .strip_prefix("docker.io/library/")
            .or_else(|| image.strip_prefix("docker.io/"))
            .unwrap_or(image);
        let last = image.rsplit('/').next().unwrap_or(image);
        if last.contains(':') || image.contains('@') {
            image.to_string()
        } else {
            format!("{image}:latest")
        }
    }
    spec == reported || normal(spec) == normal(reported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_keep_their_transition_time_and_do_not_churn() {
        let mut st = serde_json::json!({"replicas": 2});
        let ready = |reason: &str| NewCondition::new("Ready", false, reason, "m");
        set_condition(&mut st, ready("A"), "t1");
        let first = st.clone();
        set_condition(&mut st, ready("A"), "t2");
        assert_eq!(
            st, first,
            "the same condition: nothing changes, not even the time"
        );
        set_condition(&mut st, ready("B"), "t3");
        assert_eq!(st["conditions"][0]["lastTransitionTime"], "t1");
        assert_eq!(st["conditions"][0]["reason"], "B");
        set_condition(&mut st, NewCondition::new("Ready", true, "C", "ok"), "t4");
        set_condition(&mut st, NewCondition::new("Other", true, "D", ""), "t5");
        let obj = serde_json::json!({"status": st.clone()});
        let s = Status::of(&obj);
        assert!(s.is_true("Ready") && s.is_true("Other") && !s.is_true("Absent"));
        assert_eq!(st["conditions"][0]["lastTransitionTime"], "t4");
        assert_eq!(st["replicas"], 2, "the rest of the status is kept");
    }
    use serde_json::json;

    #[test]
    fn reported_images_match_their_spec_as_runtimes_normalise_them() {
        assert!(same_image("nginx:1.25", "docker.io/library/nginx:1.25"));
        assert!(same_image("nginx", "docker.io/library/nginx:latest"));
        assert!(same_image(
            "lmsysorg/sglang:v0.5.6",
            "docker.io/lmsysorg/sglang:v0.5.6"
        ));
        assert!(same_image("r.io/a/b@sha256:00", "r.io/a/b@sha256:00"));
        assert!(same_image("localhost:5000/x", "localhost:5000/x:latest"));
        assert!(!same_image("nginx:1.25", "docker.io/library/nginx:1.26"));
        assert!(!same_image(
            "lmsysorg/sglang:v0.5.6",
            "lmsysorg/sglang:v0.5.5"
        ));
    }

    #[test]
    fn views_read_what_is_there_and_empty_for_the_rest() {
        let v = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "labels": {"a/b": "1"}, "annotations": {"x": "y"}, "finalizers": ["f"],
                "deletionTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "7",
                "ownerReferences": [{"kind": "X"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i:1", "args": ["-x"]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null}],
                "containerStatuses": [{"name": "c", "imageID": "sha256:1", "ready": true}]}});
        let p = Pod::of(&v);
        assert_eq!(p.metadata.key(), "ns/p");
        assert_eq!(
            (p.metadata.label("a/b"), p.metadata.label("nope")),
            ("1", "")
        );
        assert_eq!(p.metadata.annotation("x"), "y");
        assert!(p.metadata.is_terminating() && p.metadata.has_finalizer("f"));
        assert!(p.is_ready() && p.is_scheduled());
        assert_eq!(
            (p.status.pod_ip, p.image_id("c"), p.image_id("d")),
            ("10.0.0.1", "sha256:1", "")
        );
        assert_eq!(p.spec.containers[0].image, "i:1");

        let bare = json!({"metadata": {"name": "q"}});
        let q = Pod::of(&bare);
        assert_eq!(q.metadata.key(), "/q");
        assert!(!q.is_ready() && !q.is_scheduled() && !q.metadata.is_terminating());
        assert_eq!(ObjectMeta::of(&json!(null)), ObjectMeta::default());
    }
}
