//! Kubernetes Events on a group, told once: an event is posted unless the same message was
//! the last one told for that group, reason and subject (a role, for a condition each role has
//! on its own), so that a condition repeated by every resync does not flood the API server.
//! The memory of what was told is pure ([`Told`]).

use super::throttle::Throttle;
use crate::kube::object::ObjectMeta;
use crate::kube::Kube;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The last message told per (group key, reason, subject).
#[derive(Debug, Default)]
pub struct Told(HashMap<(String, String, String), String>);

impl Told {
    /// True (and remembered) when `message` is news for this group and reason.
    pub fn tell(&mut self, group: &str, reason: &str, message: &str) -> bool {
        self.tell_about(group, reason, "", message)
    }

    /// True (and remembered) when `message` is news for this group, reason and subject: the
    /// roles of a group waiting each for its own dependencies are told apart.
    pub fn tell_about(&mut self, group: &str, reason: &str, subject: &str, message: &str) -> bool {
        let key = (group.to_string(), reason.to_string(), subject.to_string());
        if self.0.get(&key).is_some_and(|m| m == message) {
            return false;
        }
        self.0.insert(key, message.to_string());
        true
    }

    /// The next message for this reason is news whatever it says, for every subject.
    pub fn forget(&mut self, group: &str, reason: &str) {
        self.0.retain(|(g, r, _), _| !(g == group && r == reason));
    }

    /// A group is gone: forget all it was told.
    pub fn forget_group(&mut self, group: &str) {
        self.0.retain(|(g, _, _), _| g != group);
    }
}

/// Posts Kubernetes Events, each message once per object within a while.
pub struct Recorder {
    kube: Kube,
    throttle: Arc<Throttle>,
    told: Mutex<Told>,
}

impl Recorder {
    /// A recorder writing Events through `kube`, its writes paced by `throttle`.
    pub fn new(kube: Kube, throttle: Arc<Throttle>) -> Recorder {
        Recorder {
            kube,
            throttle,
            told: Mutex::new(Told::default()),
        }
    }

    /// Posts an event of `kind` (Normal or Warning) on the group `g`, unless it is no news.
    pub async fn post(&self, g: &Value, kind: &str, reason: &str, message: &str) {
        self.post_on(g, "RoleBasedGroup", kind, reason, message)
            .await
    }

    /// Posts an event on the group `g` about one of its roles, unless it is no news for that
    /// role: each role's condition is deduplicated on its own.
    pub async fn post_about(&self, g: &Value, role: &str, kind: &str, reason: &str, message: &str) {
        self.post_told(g, "RoleBasedGroup", role, kind, reason, message)
            .await
    }

    /// Posts an event on an object of `object_kind` (a workloads.x-k8s.io/v1alpha2 kind),
    /// unless it is no news.
    pub async fn post_on(
        &self,
        obj: &Value,
        object_kind: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) {
        self.post_told(obj, object_kind, "", kind, reason, message)
            .await
    }

    /// Writes the event unless the same message was the last told for this object, reason and
    /// subject.
    async fn post_told(
        &self,
        obj: &Value,
        object_kind: &str,
        subject: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) {
        let meta = ObjectMeta::of(obj);
        let who = match object_kind {
            "RoleBasedGroup" => meta.key(),
            k => format!("{k}:{}", meta.key()),
        };
        if !self.told.lock().tell_about(&who, reason, subject, message) {
            return;
        }
        let now = crate::kube::object::timestamp_now();
        let name = format!("{}.{:x}", meta.name, fastrand::u64(..));
        let ev = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": meta.namespace},
            "involvedObject": {"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": object_kind,
                "name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
            "reason": reason, "message": message, "type": kind,
            "source": {"component": "rbgctl-operator"}, "reportingComponent": "rbgctl-operator",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1});
        self.throttle.wait().await;
        let path = format!("/api/v1/namespaces/{}/events", meta.namespace);
        if let Err(e) = self.kube.create(&path, &ev).await {
            tracing::debug!(error = %e, "event not recorded");
        }
    }

    /// Forgets that `reason` was told for `group`: the next such event is written again.
    pub fn forget(&self, group: &str, reason: &str) {
        self.told.lock().forget(group, reason);
    }

    /// Forgets every event told for `group` (it was deleted).
    pub fn forget_group(&self, group: &str) {
        self.told.lock().forget_group(group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_told_once_until_it_changes_or_is_forgotten() {
        let mut t = Told::default();
        assert!(t.tell("ns/g", "DependencyNotMet", "waits for a"));
        assert!(!t.tell("ns/g", "DependencyNotMet", "waits for a"));
        assert!(
            t.tell("ns/h", "DependencyNotMet", "waits for a"),
            "per group"
        );
        assert!(t.tell("ns/g", "DependencyNotMet", "waits for b"));
        assert!(
            t.tell("ns/g", "DependencyNotMet", "waits for a"),
            "news again after b"
        );
        t.forget("ns/g", "DependencyNotMet");
        assert!(t.tell("ns/g", "DependencyNotMet", "waits for a"));
        t.forget_group("ns/g");
        assert!(t.tell("ns/g", "DependencyNotMet", "waits for a"));
        assert!(
            !t.tell("ns/h", "DependencyNotMet", "waits for a"),
            "other groups keep theirs"
        );
    }

    /// Issue 40, item 35: roles waiting each for their own dependencies are told once each,
    /// not once per alternation of their messages.
    #[test]
    fn each_role_is_told_once_however_the_roles_take_turns() {
        let mut t = Told::default();
        let mut told = 0;
        for _resync in 0..5 {
            for (role, msg) in [
                ("router", "waits for prefill"),
                ("prefill", "waits for cache"),
            ] {
                told += usize::from(t.tell_about("ns/g", "DependencyNotMet", role, msg));
            }
        }
        assert_eq!(told, 2);
        assert!(t.tell_about("ns/g", "DependencyNotMet", "router", "waits for decode"));
        t.forget("ns/g", "DependencyNotMet");
        assert!(t.tell_about("ns/g", "DependencyNotMet", "prefill", "waits for cache"));
    }
}
