//! Children the operator writes but does not watch: a gang's PodGroup (its CRD may not be
//! installed) and a store role's PodDisruptionBudget. What was last written is remembered by
//! `ns/name`, so that a reconcile reads one back only when it has no memory of it; an object
//! is looked for to be deleted only where one may be (written before, or its pods carry its
//! mark).

use super::context::{core, Context, ReconcileError};
use super::desired::{self, GROUP, ROLE};
use super::gang::{self, Gang};
use super::model::{Group, Role};
use crate::kube::object::{NewCondition, ObjectMeta};
use crate::kube::{KubeError, Patch};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// What was last written, by `ns/name` (`None`: known to be absent).
pub type Memo = parking_lot::Mutex<HashMap<String, Option<Value>>>;

/// The kinds written this way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    PodGroup,
    DisruptionBudget,
}

/// A role's PodDisruptionBudget: at most one of its pods disrupted at once (a node drain
/// evicts the next store only once the last has handed its objects over and gone).
pub fn disruption_budget(g: &Group, role: &Role) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": budget_name(&g.name, &role.name), "namespace": g.namespace,
                     "labels": desired::role_labels(g, &role.name),
                     "ownerReferences": desired::owner(g)},
        "spec": {"maxUnavailable": 1,
                 "selector": {"matchLabels": {GROUP: g.name, ROLE: role.name}}},
    })
}

/// The PodDisruptionBudget of a group's role: `<group>-<role>`.
pub fn budget_name(group: &str, role: &str) -> String {
    desired::dns_trunc(&format!("{group}-{role}"))
}

fn budgets_path(ns: &str) -> String {
    format!("/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets")
}

/// The merge patch that brings an existing PodDisruptionBudget's spec to `want`'s.
fn budget_patch(existing: &Value, want: &Value) -> Option<Value> {
    (existing["spec"] != want["spec"]).then(|| json!({"spec": want["spec"]}))
}

impl Context {
    fn memo(&self, kind: Kind) -> &Memo {
        match kind {
            Kind::PodGroup => &self.pod_groups,
            Kind::DisruptionBudget => &self.budgets,
        }
    }

    /// Creates `want` in `collection`, or patches the one there toward it (`patch_for`),
    /// unless it was last written so. A 404 answer means the API server does not serve the
    /// kind.
    async fn ensure_unwatched(
        &self,
        kind: Kind,
        collection: &str,
        want: &Value,
        patch_for: fn(&Value, &Value) -> Option<Value>,
    ) -> Result<(), KubeError> {
        let meta = ObjectMeta::of(want);
        let key = format!("{}/{}", meta.namespace, meta.name);
        if self.memo(kind).lock().get(&key) == Some(&Some(want.clone())) {
            return Ok(());
        }
        let path = format!("{collection}/{}", meta.name);
        let existing = match self.kube.get_json(&path).await {
            Ok(v) => Some(v),
            Err(e) if e.code() == Some(404) => None,
            Err(e) => return Err(e),
        };
        let written = match existing {
            None => {
                self.throttle.wait().await;
                self.kube.create(collection, want).await.map(drop)
            }
            Some(v) => match patch_for(&v, want) {
                None => Ok(()),
                Some(p) => {
                    self.throttle.wait().await;
                    self.kube.patch(&path, &Patch::Merge(p)).await.map(drop)
                }
            },
        };
        match written {
            Ok(()) => {
                self.memo(kind).lock().insert(key, Some(want.clone()));
                Ok(())
            }
            Err(e) => {
                self.memo(kind).lock().remove(&key);
                Err(e)
            }
        }
    }

    /// Deletes `path` (object `ns/name`) if the group `uid` controls it; looked for only when
    /// `may_exist` or it was written before.
    async fn remove_unwatched(
        &self,
        kind: Kind,
        key: String,
        path: &str,
        uid: &str,
        may_exist: bool,
    ) -> Result<(), ReconcileError> {
        let known = self.memo(kind).lock().get(&key).cloned();
        let look = match known {
            Some(written) => written.is_some(),
            None => may_exist,
        };
        if look {
            match self.kube.get_json(path).await {
                Ok(v) if ObjectMeta::of(&v).controlled_by(uid) => {
                    self.throttle.wait().await;
                    match self.kube.delete(path, None).await {
                        Err(e) if e.code() != Some(404) => return Err(e.into()),
                        _ => tracing::info!(object = %key, ?kind, "deleted: no longer asked for"),
                    }
                }
                Ok(_) => {}
                Err(e) if e.code() == Some(404) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.memo(kind).lock().insert(key, None);
        Ok(())
    }

    /// The group's PodGroup as `gang` asks (none: one it made goes), and its pods marked to
    /// join it. Answers the `GangScheduling` condition while a gang is asked for, false when
    /// the scheduler's PodGroup CRD is not installed: then no pod should be made yet.
    pub(super) async fn ensure_gang(
        &self,
        obj: &Value,
        g: &Group,
        gang: Option<&Gang>,
        pods: &[Value],
    ) -> Result<Option<NewCondition>, ReconcileError> {
        let s = self.scheduler;
        let Some(gang) = gang else {
            self.remove_pod_group(&g.namespace, &g.name, &g.uid, pods)
                .await?;
            return Ok(None);
        };
        let want = gang::pod_group(g, gang, s);
        let collection = s.path(&g.namespace, None);
        match self
            .ensure_unwatched(Kind::PodGroup, &collection, &want, gang::patch_for)
            .await
        {
            Ok(()) => {}
            // No such resource: the scheduler's CRD is not installed.
            Err(e) if e.code() == Some(404) => {
                let msg = format!(
                    "gang scheduling is asked for, but the API server does not serve {} \
                     (install the scheduler, or set the operator's --scheduler-name); no \
                     pod is made until it does",
                    s.crd()
                );
                self.events
                    .post(obj, "Warning", "PodGroupCRDMissing", &msg)
                    .await;
                return Ok(Some(NewCondition::new(
                    "GangScheduling",
                    false,
                    "PodGroupCRDMissing",
                    msg,
                )));
            }
            Err(e) => return Err(e.into()),
        }
        // Pods made before the gang was asked for join it (labels and annotations change in
        // place; the scheduler counts them toward minMember).
        let (labels, annotations) = gang::pod_marks(&g.name, s);
        self.mark_pods(g, pods, &labels, &annotations).await?;
        let said = format!(
            "PodGroup {} ({}) has the scheduler place at least {} pods together",
            g.name,
            s.crd(),
            want["spec"]["minMember"]
        );
        Ok(Some(NewCondition::new(
            "GangScheduling",
            true,
            "PodGroupWritten",
            said,
        )))
    }

    /// Labels and annotates, in place, the live pods that lack `labels` or `annotations`.
    async fn mark_pods(
        &self,
        g: &Group,
        pods: &[Value],
        labels: &Map<String, Value>,
        annotations: &Map<String, Value>,
    ) -> Result<(), ReconcileError> {
        for p in pods {
            let m = ObjectMeta::of(p);
            let lacks = labels
                .iter()
                .any(|(k, v)| p["metadata"]["labels"].get(k) != Some(v))
                || annotations
                    .iter()
                    .any(|(k, v)| p["metadata"]["annotations"].get(k) != Some(v));
            if m.is_terminating() || !lacks {
                continue;
            }
            let patch = json!({"metadata": {"labels": labels, "annotations": annotations}});
            self.throttle.wait().await;
            let mark = self.caches.pods.mark();
            let path = format!("{}/{}", core(&g.namespace, "pods"), m.name);
            match self.kube.patch(&path, &Patch::Merge(patch)).await {
                Ok(written) => self.caches.pods.put_written(written, mark),
                Err(e) if e.code() == Some(404) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Deletes the PodGroup the group `ns/name` (`uid`) made, if it made one.
    pub(super) async fn remove_pod_group(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        pods: &[Value],
    ) -> Result<(), ReconcileError> {
        let path = self.scheduler.path(ns, Some(name));
        let may_exist = pods.iter().any(gang::marked);
        self.remove_unwatched(
            Kind::PodGroup,
            format!("{ns}/{name}"),
            &path,
            uid,
            may_exist,
        )
        .await
    }

    /// Each store role's PodDisruptionBudget (those with a hand-over), and none for the
    /// others (one written before goes).
    pub(super) async fn ensure_budgets(
        &self,
        g: &Group,
        pods: &[Value],
    ) -> Result<(), ReconcileError> {
        let collection = budgets_path(&g.namespace);
        for r in &g.roles {
            if r.hand_over_secs.is_some() {
                let want = disruption_budget(g, r);
                self.ensure_unwatched(Kind::DisruptionBudget, &collection, &want, budget_patch)
                    .await?;
                continue;
            }
            let name = budget_name(&g.name, &r.name);
            let may_exist = pods
                .iter()
                .any(|p| ObjectMeta::of(p).label(ROLE) == r.name && runs_hand_over(p));
            let path = format!("{collection}/{name}");
            let key = format!("{}/{name}", g.namespace);
            self.remove_unwatched(Kind::DisruptionBudget, key, &path, &g.uid, may_exist)
                .await?;
        }
        Ok(())
    }

    /// The budgets of a group being deleted (for clusters without a garbage collector).
    pub(super) async fn remove_budgets(
        &self,
        ns: &str,
        group: &str,
        uid: &str,
        pods: &[Value],
    ) -> Result<(), ReconcileError> {
        let written: Vec<String> = self
            .budgets
            .lock()
            .iter()
            .filter(|(k, v)| v.is_some() && k.starts_with(&format!("{ns}/{group}-")))
            .map(|(k, _)| k.clone())
            .collect();
        let collection = budgets_path(ns);
        let mut roles: Vec<&str> = pods
            .iter()
            .filter(|p| runs_hand_over(p))
            .map(|p| ObjectMeta::of(p).label(ROLE))
            .collect();
        roles.sort_unstable();
        roles.dedup();
        let mut keys: Vec<String> = roles
            .into_iter()
            .map(|r| format!("{ns}/{}", budget_name(group, r)))
            .chain(written)
            .collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let name = key.rsplit('/').next().unwrap_or("").to_string();
            let path = format!("{collection}/{name}");
            self.remove_unwatched(Kind::DisruptionBudget, key.clone(), &path, uid, true)
                .await?;
            self.budgets.lock().remove(&key);
        }
        Ok(())
    }
}

/// Whether a pod's containers are stores that hand their objects over.
fn runs_hand_over(p: &Value) -> bool {
    p["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["env"].as_array().into_iter().flatten())
        .any(|e| e["name"] == desired::HAND_OVER_ENV)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::model::parse_group;

    #[test]
    fn a_store_role_gets_a_budget_of_one_and_its_pods_wait_for_their_hand_over() {
        let obj = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
            "metadata": {"name": "pool", "namespace": "ns", "uid": "u"},
            "spec": {"roles": [{"name": "store", "replicas": 3,
                "annotations": {crate::operator::model::HAND_OVER: "120"},
                "standalonePattern": {"template": {"spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{"name": "s", "image": "rbgctl:1"}]}}}}]}});
        let g = parse_group(&obj).unwrap();
        let r = &g.roles[0];
        assert_eq!(r.hand_over_secs, Some(120));
        let pdb = disruption_budget(&g, r);
        assert_eq!(pdb["metadata"]["name"], "pool-store");
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);
        assert_eq!(pdb["spec"]["selector"]["matchLabels"][ROLE], "store");
        let rev = desired::revision(r);
        let slot = desired::Slot {
            instance: "pool-store-0".into(),
            ordinal: Some(0),
            component: 0,
        };
        let pod = desired::pod(&g, r, &rev, &slot);
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 150);
        assert!(runs_hand_over(&pod));
        assert_eq!(budget_patch(&pdb, &pdb), None);
        // The annotation moves the revision; without it, the hash is what it always was.
        let mut plain = r.clone();
        plain.hand_over_secs = None;
        assert_ne!(desired::revision(&plain).hash, rev.hash);
        let bad = obj.to_string().replace("\"120\"", "\"soon\"");
        let e = parse_group(&serde_json::from_str(&bad).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains(crate::operator::model::HAND_OVER), "{e}");
    }
}
