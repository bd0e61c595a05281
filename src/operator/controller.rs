//! The reconcile loop: for one group, read everything from the caches, compute the desired
//! children and the next rollout step with the pure modules, write only the difference,
//! then the status (only when it changed). Level-triggered: any reconcile may be the first.

use crate::kube::patch::escape;
use crate::kube::{Kube, KubeError, Patch};
use crate::operator::coordination::{self, RoleState};
use crate::operator::desired::{
    self, Revision, Slot, FINALIZER, GROUP, INPLACE_STATE, REVISION, ROLE, SHAPE,
};
use crate::operator::informer::{key_of, Store};
use crate::operator::model::{self, Group, Role};
use crate::operator::plan::{self, Action, Limits};
use crate::operator::queue::Queue;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Api(#[from] KubeError),
    #[error("caches not synced yet")]
    NotSynced,
}

/// Caches of what the operator reads.
#[derive(Clone, Default)]
pub struct Caches {
    pub groups: Store,
    pub pods: Store,
    pub services: Store,
    pub configmaps: Store,
    pub slices: Store,
    pub policies: Store,
}

#[derive(Default)]
pub struct Metrics {
    pub reconciles: AtomicU64,
    pub errors: AtomicU64,
    pub pods_created: AtomicU64,
    pub pods_deleted: AtomicU64,
    pub pods_inplace: AtomicU64,
    pub status_writes: AtomicU64,
}

pub struct Controller {
    pub kube: Kube,
    pub caches: Caches,
    pub queue: Arc<Queue>,
    pub metrics: Metrics,
    /// Last event per (group, reason), so that a repeated condition is told once.
    told: Mutex<HashMap<(String, String), String>>,
    limiter: Mutex<(f64, Instant)>,
    qps: f64,
    burst: f64,
}

fn ns_of(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn label<'a>(v: &'a Value, k: &str) -> &'a str {
    v.pointer("/metadata/labels")
        .and_then(|l| l.get(k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn group_path(ns: &str, name: &str) -> String {
    format!("/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/rolebasedgroups/{name}")
}

fn core(ns: &str, plural: &str) -> String {
    format!("/api/v1/namespaces/{ns}/{plural}")
}

fn slices_path(ns: &str) -> String {
    format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")
}

impl Controller {
    pub fn new(kube: Kube, caches: Caches, queue: Arc<Queue>, qps: f64, burst: f64) -> Controller {
        Controller {
            kube,
            caches,
            queue,
            metrics: Metrics::default(),
            told: Mutex::new(HashMap::new()),
            limiter: Mutex::new((burst, Instant::now())),
            qps,
            burst,
        }
    }

    /// Token bucket in front of every write (`qps` 0 = unlimited).
    async fn throttle(&self) {
        if self.qps <= 0.0 {
            return;
        }
        loop {
            let wait = {
                let mut l = self.limiter.lock();
                let now = Instant::now();
                l.0 = (l.0 + now.duration_since(l.1).as_secs_f64() * self.qps).min(self.burst);
                l.1 = now;
                if l.0 >= 1.0 {
                    l.0 -= 1.0;
                    None
                } else {
                    Some(Duration::from_secs_f64((1.0 - l.0) / self.qps))
                }
            };
            match wait {
                None => return,
                Some(d) => tokio::time::sleep(d).await,
            }
        }
    }

    /// Posts an event on the group unless the same one was the last told for this reason.
    async fn event(&self, g: &Value, kind: &str, reason: &str, message: &str) {
        let key = (key_of(g), reason.to_string());
        if self.told.lock().get(&key).map(String::as_str) == Some(message) {
            return;
        }
        self.told.lock().insert(key, message.to_string());
        let ns = s(g, "/metadata/namespace");
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let ev = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{}.{:x}", s(g, "/metadata/name"), fastrand::u64(..)), "namespace": ns},
            "involvedObject": {"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
                "name": s(g, "/metadata/name"), "namespace": ns, "uid": s(g, "/metadata/uid")},
            "reason": reason, "message": message, "type": kind,
            "source": {"component": "rbgctl-operator"}, "reportingComponent": "rbgctl-operator",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1});
        self.throttle().await;
        if let Err(e) = self.kube.create(&core(ns, "events"), &ev).await {
            tracing::debug!(error = %e, "event not recorded");
        }
    }

    fn pods_of(&self, ns: &str, group: &str) -> Vec<Value> {
        self.caches
            .pods
            .select(|p| s(p, "/metadata/namespace") == ns && label(p, GROUP) == group)
    }

    /// One reconcile of the group `namespace/name`.
    #[tracing::instrument(skip(self), fields(group = %key))]
    pub async fn reconcile(&self, key: &str) -> Result<(), ReconcileError> {
        self.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
        if !(self.caches.groups.synced() && self.caches.pods.synced()) {
            return Err(ReconcileError::NotSynced);
        }
        let Some(mut obj) = self.caches.groups.get(key) else {
            return Ok(());
        };
        let (ns, name) = ns_of(key);
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            return self.finalize(&obj).await;
        }
        let finalizers: Vec<Value> = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion",
                                      "value": s(&obj, "/metadata/resourceVersion")})];
            if finalizers.is_empty() {
                ops.push(
                    json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}),
                );
            } else {
                ops.push(
                    json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}),
                );
            }
            self.throttle().await;
            let mark = self.caches.groups.mark();
            obj = self
                .kube
                .patch(&group_path(ns, name), &Patch::Json(Value::Array(ops)))
                .await?;
            self.caches.groups.put_written(obj.clone(), mark);
        }
        let mut g = match model::parse_group(&obj) {
            Ok(g) => g,
            Err(e) => return self.invalid(&obj, "InvalidSpec", &e.to_string()).await,
        };
        g.namespace = ns.to_string();
        let tiers = match model::dependency_tiers(&g.roles) {
            Ok(t) => t,
            Err(e) => {
                return self
                    .invalid(&obj, "InvalidRoleDependency", &e.to_string())
                    .await
            }
        };
        let mut rules = g.coordination.clone();
        if let Some(p) = self.caches.policies.get(key) {
            match model::parse_policy(&p) {
                Ok(r) => rules.extend(r),
                Err(e) => {
                    self.event(&obj, "Warning", "InvalidCoordinatedPolicy", &e.to_string())
                        .await
                }
            }
        }
        let pods = self.pods_of(ns, name);
        let revs: BTreeMap<String, Revision> = g
            .roles
            .iter()
            .map(|r| (r.name.clone(), desired::revision(r)))
            .collect();
        let views: BTreeMap<String, Vec<plan::PodView>> = g
            .roles
            .iter()
            .map(|r| {
                let v = pods
                    .iter()
                    .filter(|p| label(p, ROLE) == r.name)
                    .map(plan::view)
                    .collect();
                (r.name.clone(), v)
            })
            .collect();
        let instance_name = |role: &str| {
            let (gname, role) = (g.name.clone(), role.to_string());
            move |o: u32| desired::stateful_instance(&gname, &role, o)
        };
        // First pass: counts as things are.
        let mut states: BTreeMap<String, RoleState> = BTreeMap::new();
        let mut counts: BTreeMap<String, plan::Counts> = BTreeMap::new();
        for r in &g.roles {
            let lim = Limits::of(r, r.replicas, None, None);
            let p = plan::plan(
                r,
                &revs[&r.name],
                &lim,
                &views[&r.name],
                &instance_name(&r.name),
            );
            let c = p.counts.clone();
            states.insert(
                r.name.clone(),
                RoleState {
                    desired: r.replicas,
                    current: c.replicas,
                    ready: c.ready,
                    updated: c.updated,
                    scheduled: c.scheduled,
                },
            );
            counts.insert(r.name.clone(), c);
        }
        self.write_status(&obj, &g, &counts).await?;
        let user_partition: BTreeMap<String, u32> = g
            .roles
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    r.rollout.partition.resolve(r.replicas, false),
                )
            })
            .collect();
        let overrides = coordination::overrides(&rules, &states, &user_partition);
        self.ensure_config(&obj, &g, &views).await?;
        for r in &g.roles {
            for svc in desired::services(&g, r) {
                self.ensure_service(svc).await?;
            }
        }
        // Roles in dependency order; a role moves only when its dependencies are ready.
        let ready = |role: &str| {
            let st = &states[role];
            st.ready >= st.desired && st.current >= st.desired
        };
        for tier in &tiers {
            for role_name in tier {
                let Some(r) = g.roles.iter().find(|r| &r.name == role_name) else {
                    continue;
                };
                let waiting: Vec<&String> = r.dependencies.iter().filter(|d| !ready(d)).collect();
                if !waiting.is_empty() {
                    let msg = format!(
                        "role {} waits for {} to be ready",
                        r.name,
                        waiting
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    self.event(&obj, "Normal", "DependencyNotMet", &msg).await;
                    continue;
                }
                let o = overrides.get(&r.name).cloned().unwrap_or_default();
                let replicas = o.replicas.unwrap_or(r.replicas);
                let lim = Limits::of(r, replicas, None, o.max_unavailable);
                let lim = Limits {
                    partition: o.partition.map_or(lim.partition, |p| p.min(replicas)),
                    ..lim
                };
                let p = plan::plan(
                    r,
                    &revs[&r.name],
                    &lim,
                    &views[&r.name],
                    &instance_name(&r.name),
                );
                self.execute(&obj, &g, r, &revs[&r.name], &p.actions)
                    .await?;
            }
        }
        if g.legacy {
            for r in &g.roles {
                let mine: Vec<&Value> = pods
                    .iter()
                    .filter(|p| {
                        label(p, ROLE) == r.name
                            && p.pointer("/metadata/deletionTimestamp").is_none()
                    })
                    .collect();
                self.ensure_slice(desired::legacy_endpoints(&g, r, &mine))
                    .await?;
            }
        }
        self.remove_orphans(&g, &pods).await?;
        Ok(())
    }

    async fn invalid(
        &self,
        obj: &Value,
        reason: &str,
        message: &str,
    ) -> Result<(), ReconcileError> {
        tracing::warn!(group = %key_of(obj), reason, message, "group not reconciled");
        self.event(obj, "Warning", reason, message).await;
        let cond =
            json!({"type": "Ready", "status": "False", "reason": reason, "message": message});
        let mut status = obj.get("status").cloned().unwrap_or(json!({}));
        status["observedGeneration"] = obj["metadata"]["generation"].clone();
        set_condition(&mut status, cond);
        self.put_status(obj, status).await
    }

    async fn put_status(&self, obj: &Value, status: Value) -> Result<(), ReconcileError> {
        if obj.get("status") == Some(&status) {
            return Ok(());
        }
        let mut next = obj.clone();
        next["status"] = status;
        let key = key_of(obj);
        let (ns, name) = ns_of(&key);
        self.throttle().await;
        let mark = self.caches.groups.mark();
        let v = self
            .kube
            .replace(&format!("{}/status", group_path(ns, name)), &next)
            .await?;
        self.metrics.status_writes.fetch_add(1, Ordering::Relaxed);
        self.caches.groups.put_written(v, mark);
        Ok(())
    }

    async fn write_status(
        &self,
        obj: &Value,
        g: &Group,
        counts: &BTreeMap<String, plan::Counts>,
    ) -> Result<(), ReconcileError> {
        let role_statuses: Vec<Value> = g
            .roles
            .iter()
            .map(|r| {
                let c = &counts[&r.name];
                json!({"name": r.name, "replicas": c.replicas, "readyReplicas": c.ready,
                       "updatedReplicas": c.updated})
            })
            .collect();
        let all = g.roles.iter().all(|r| {
            let c = &counts[&r.name];
            c.replicas == r.replicas && c.ready == r.replicas
        });
        let cond = if all {
            json!({"type": "Ready", "status": "True", "reason": "AllRolesReady", "message": "All roles are ready"})
        } else {
            let waiting: Vec<&str> = g
                .roles
                .iter()
                .filter(|r| counts[&r.name].ready < r.replicas)
                .map(|r| r.name.as_str())
                .collect();
            json!({"type": "Ready", "status": "False", "reason": "RoleNotReady",
                   "message": format!("not ready: {}", waiting.join(", "))})
        };
        let mut status = obj.get("status").cloned().unwrap_or(json!({}));
        if !status.is_object() {
            status = json!({});
        }
        status["observedGeneration"] = json!(g.generation);
        status["roleStatuses"] = Value::Array(role_statuses);
        set_condition(&mut status, cond);
        self.put_status(obj, status).await
    }

    async fn ensure_config(
        &self,
        obj: &Value,
        g: &Group,
        views: &BTreeMap<String, Vec<plan::PodView>>,
    ) -> Result<(), ReconcileError> {
        let stateless: BTreeMap<String, Vec<String>> = g
            .roles
            .iter()
            .filter(|r| r.stateless)
            .map(|r| {
                let mut names: Vec<String> = views[&r.name]
                    .iter()
                    .filter(|p| !p.terminating)
                    .map(|p| p.instance.clone())
                    .collect();
                names.sort();
                names.dedup();
                (r.name.clone(), names)
            })
            .collect();
        let yaml = desired::discovery_config(g, &stateless);
        let want = desired::config_map(g, &yaml);
        let key = format!("{}/{}", g.namespace, g.name);
        match self.caches.configmaps.get(&key) {
            None => {
                self.throttle().await;
                let mark = self.caches.configmaps.mark();
                match self
                    .kube
                    .create(&core(&g.namespace, "configmaps"), &want)
                    .await
                {
                    Ok(v) => self.caches.configmaps.put_written(v, mark),
                    Err(e) if e.code() == Some(409) => {}
                    Err(e) => return Err(e.into()),
                }
                let _ = obj;
            }
            Some(cur) if cur["data"] != want["data"] => {
                self.throttle().await;
                let mark = self.caches.configmaps.mark();
                let v = self
                    .kube
                    .patch(
                        &format!("{}/{}", core(&g.namespace, "configmaps"), g.name),
                        &Patch::Merge(json!({"data": want["data"]})),
                    )
                    .await?;
                self.caches.configmaps.put_written(v, mark);
            }
            Some(_) => {}
        }
        Ok(())
    }

    async fn ensure_service(&self, want: Value) -> Result<(), ReconcileError> {
        let key = key_of(&want);
        let ns = s(&want, "/metadata/namespace").to_string();
        match self.caches.services.get(&key) {
            None => {
                self.throttle().await;
                let mark = self.caches.services.mark();
                match self.kube.create(&core(&ns, "services"), &want).await {
                    Ok(v) => self.caches.services.put_written(v, mark),
                    Err(e) if e.code() == Some(409) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Some(cur) => {
                let same = cur["spec"].get("selector") == want["spec"].get("selector")
                    && (want["spec"].get("ports").is_none()
                        || ports_equal(&cur["spec"]["ports"], &want["spec"]["ports"]));
                if !same {
                    let mut spec = json!({"selector": want["spec"].get("selector").cloned().unwrap_or(Value::Null)});
                    if let Some(p) = want["spec"].get("ports") {
                        spec["ports"] = p.clone();
                    }
                    self.throttle().await;
                    let mark = self.caches.services.mark();
                    let v = self
                        .kube
                        .patch(
                            &format!("{}/{}", core(&ns, "services"), s(&want, "/metadata/name")),
                            &Patch::Merge(json!({"spec": spec})),
                        )
                        .await?;
                    self.caches.services.put_written(v, mark);
                }
            }
        }
        Ok(())
    }

    async fn ensure_slice(&self, want: Value) -> Result<(), ReconcileError> {
        let key = key_of(&want);
        let ns = s(&want, "/metadata/namespace").to_string();
        match self.caches.slices.get(&key) {
            None => {
                self.throttle().await;
                let mark = self.caches.slices.mark();
                match self.kube.create(&slices_path(&ns), &want).await {
                    Ok(v) => self.caches.slices.put_written(v, mark),
                    Err(e) if e.code() == Some(409) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Some(cur)
                if cur["endpoints"] != want["endpoints"]
                    || cur["addressType"] != want["addressType"] =>
            {
                let mut next = want.clone();
                next["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
                self.throttle().await;
                let mark = self.caches.slices.mark();
                let v = self
                    .kube
                    .replace(
                        &format!("{}/{}", slices_path(&ns), s(&want, "/metadata/name")),
                        &next,
                    )
                    .await?;
                self.caches.slices.put_written(v, mark);
            }
            Some(_) => {}
        }
        Ok(())
    }

    async fn execute(
        &self,
        obj: &Value,
        g: &Group,
        role: &Role,
        rev: &Revision,
        actions: &[Action],
    ) -> Result<(), ReconcileError> {
        let ns = &g.namespace;
        let (mut created, mut deleted, mut inplace) = (0, 0, 0);
        let mut fresh_instance = String::new();
        for a in actions {
            match a {
                Action::Create {
                    instance,
                    ordinal,
                    component,
                } => {
                    let instance = if instance.is_empty() {
                        if *component == 0 || fresh_instance.is_empty() {
                            fresh_instance = format!(
                                "{}-{}-{}",
                                g.name,
                                role.name,
                                crate::kube::random_suffix(5)
                            );
                        }
                        fresh_instance.clone()
                    } else {
                        instance.clone()
                    };
                    let slot = Slot {
                        instance,
                        ordinal: *ordinal,
                        component: *component,
                    };
                    let pod = desired::pod(g, role, rev, &slot);
                    self.throttle().await;
                    let mark = self.caches.pods.mark();
                    match self.kube.create(&core(ns, "pods"), &pod).await {
                        Ok(v) => {
                            self.caches.pods.put_written(v, mark);
                            created += 1;
                        }
                        // Our cache is behind: the watch brings the pod soon.
                        Err(e) if e.code() == Some(409) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Action::Delete { name, uid } => {
                    self.throttle().await;
                    let mark = self.caches.pods.mark();
                    let path = format!("{}/{name}", core(ns, "pods"));
                    match self.kube.delete(&path, Some(uid)).await {
                        Ok(_) => {
                            self.caches
                                .pods
                                .remove_written(&format!("{ns}/{name}"), mark);
                            deleted += 1;
                        }
                        Err(e) if e.code() == Some(409) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Action::InPlace { name, uid } => {
                    let Some(cur) = self.caches.pods.get(&format!("{ns}/{name}")) else {
                        continue;
                    };
                    let slot = Slot {
                        instance: plan::view(&cur).instance,
                        ordinal: plan::view(&cur).ordinal,
                        component: plan::view(&cur).component,
                    };
                    let want = desired::pod(g, role, rev, &slot);
                    let ops = inplace_ops(&cur, &want, uid, rev);
                    self.throttle().await;
                    let mark = self.caches.pods.mark();
                    let path = format!("{}/{name}", core(ns, "pods"));
                    match self.kube.patch(&path, &Patch::Json(ops)).await {
                        Ok(v) => {
                            self.caches.pods.put_written(v, mark);
                            inplace += 1;
                        }
                        Err(e) if matches!(e.code(), Some(404 | 409 | 422)) => {
                            tracing::info!(pod = %name, error = %e, "in-place update not applied; will look again");
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        self.metrics
            .pods_created
            .fetch_add(created, Ordering::Relaxed);
        self.metrics
            .pods_deleted
            .fetch_add(deleted, Ordering::Relaxed);
        self.metrics
            .pods_inplace
            .fetch_add(inplace, Ordering::Relaxed);
        if created + deleted + inplace > 0 {
            tracing::info!(role = %role.name, revision = %rev.hash, created, deleted, inplace, "role stepped");
            let msg = format!(
                "role {}: created {created}, deleted {deleted}, updated in place {inplace} pods (revision {})",
                role.name, rev.hash
            );
            self.told
                .lock()
                .remove(&(key_of(obj), "RoleStepped".into()));
            self.event(obj, "Normal", "RoleStepped", &msg).await;
        }
        Ok(())
    }

    /// Children of roles that are gone from the spec.
    async fn remove_orphans(&self, g: &Group, pods: &[Value]) -> Result<(), ReconcileError> {
        let known = |r: &str| g.roles.iter().any(|x| x.name == r);
        for p in pods {
            if !known(label(p, ROLE)) && p.pointer("/metadata/deletionTimestamp").is_none() {
                self.throttle().await;
                self.kube
                    .delete(
                        &format!("{}/{}", core(&g.namespace, "pods"), s(p, "/metadata/name")),
                        None,
                    )
                    .await?;
            }
        }
        let group_children =
            |v: &Value| s(v, "/metadata/namespace") == g.namespace && label(v, GROUP) == g.name;
        for svc in self.caches.services.select(|v| group_children(v)) {
            let name = s(&svc, "/metadata/name");
            let wanted = g.roles.iter().any(|r| {
                name == desired::service_name(&g.name, &r.name)
                    || (g.legacy && name == desired::legacy_service_name(&g.name, &r.name))
            });
            if !wanted {
                self.throttle().await;
                let mark = self.caches.services.mark();
                self.kube
                    .delete(&format!("{}/{name}", core(&g.namespace, "services")), None)
                    .await?;
                self.caches.services.remove_written(&key_of(&svc), mark);
            }
        }
        for sl in self.caches.slices.select(|v| group_children(v)) {
            if !g.legacy || !known(label(&sl, ROLE)) {
                self.throttle().await;
                let mark = self.caches.slices.mark();
                self.kube
                    .delete(
                        &format!("{}/{}", slices_path(&g.namespace), s(&sl, "/metadata/name")),
                        None,
                    )
                    .await?;
                self.caches.slices.remove_written(&key_of(&sl), mark);
            }
        }
        Ok(())
    }

    /// Deleting: remove every child, then the finalizer.
    async fn finalize(&self, obj: &Value) -> Result<(), ReconcileError> {
        let key = key_of(obj);
        let (ns, name) = ns_of(&key);
        let has_ours = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        if !has_ours {
            return Ok(());
        }
        let mine = |v: &Value| s(v, "/metadata/namespace") == ns && label(v, GROUP) == name;
        let pods = self.caches.pods.select(mine);
        let services = self.caches.services.select(mine);
        let maps = self.caches.configmaps.select(mine);
        let slices = self.caches.slices.select(mine);
        let marks = [
            self.caches.services.mark(),
            self.caches.configmaps.mark(),
            self.caches.slices.mark(),
        ];
        for (list, base) in [
            (&pods, core(ns, "pods")),
            (&services, core(ns, "services")),
            (&maps, core(ns, "configmaps")),
            (&slices, slices_path(ns)),
        ] {
            for o in list.iter() {
                if o.pointer("/metadata/deletionTimestamp").is_some() {
                    continue;
                }
                self.throttle().await;
                self.kube
                    .delete(&format!("{base}/{}", s(o, "/metadata/name")), None)
                    .await?;
            }
        }
        for ((store, list), mark) in [
            (&self.caches.services, &services),
            (&self.caches.configmaps, &maps),
            (&self.caches.slices, &slices),
        ]
        .into_iter()
        .zip(marks)
        {
            for o in list.iter() {
                store.remove_written(&key_of(o), mark);
            }
        }
        if !self.caches.pods.select(mine).is_empty() {
            // Pods go when their kubelet has stopped them; their watch events bring us back.
            return Ok(());
        }
        let rest: Vec<Value> = obj["metadata"]["finalizers"]
            .as_array()
            .map(|f| f.iter().filter(|x| *x != FINALIZER).cloned().collect())
            .unwrap_or_default();
        let ops = json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": s(obj, "/metadata/resourceVersion")},
            {"op": "replace", "path": "/metadata/finalizers", "value": rest}
        ]);
        self.throttle().await;
        match self
            .kube
            .patch(&group_path(ns, name), &Patch::Json(ops))
            .await
        {
            Ok(_) | Err(KubeError::Status { code: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(group = %key, "children removed; finalizer released");
        self.told.lock().retain(|(k, _), _| *k != key);
        Ok(())
    }
}

fn ports_equal(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| -> Vec<(String, u64)> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|p| (s(p, "/name").to_string(), p["port"].as_u64().unwrap_or(0)))
            .collect()
    };
    strip(a) == strip(b)
}

/// Sets a condition, keeping its lastTransitionTime when its status does not change.
fn set_condition(status: &mut Value, mut cond: Value) {
    let mut list: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    let t = cond["type"].clone();
    let old = list.iter().find(|c| c["type"] == t).cloned();
    cond["lastTransitionTime"] = match &old {
        Some(o) if o["status"] == cond["status"] => o["lastTransitionTime"].clone(),
        _ => json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    };
    if let Some(o) = &old {
        if o["status"] == cond["status"]
            && o["reason"] == cond["reason"]
            && o["message"] == cond["message"]
        {
            return;
        }
    }
    list.retain(|c| c["type"] != t);
    list.push(cond);
    status["conditions"] = Value::Array(list);
}

/// The JSON patch that moves a pod's images to the new revision in place, guarded by the
/// pod's UID and container names, and records the images it ran before.
pub fn inplace_ops(cur: &Value, want: &Value, uid: &str, rev: &Revision) -> Value {
    let mut ops = vec![json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    let mut ids = serde_json::Map::new();
    let statuses = cur
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for list in ["containers", "initContainers"] {
        let (Some(have), Some(wants)) =
            (cur["spec"][list].as_array(), want["spec"][list].as_array())
        else {
            continue;
        };
        for (i, c) in have.iter().enumerate() {
            let Some(w) = wants.iter().find(|w| w["name"] == c["name"]) else {
                continue;
            };
            if w["image"] != c["image"] {
                ops.push(json!({"op": "test", "path": format!("/spec/{list}/{i}/name"), "value": c["name"]}));
                ops.push(json!({"op": "replace", "path": format!("/spec/{list}/{i}/image"), "value": w["image"]}));
                if list == "containers" {
                    let id = statuses
                        .iter()
                        .find(|st| st["name"] == c["name"])
                        .and_then(|st| st["imageID"].as_str())
                        .unwrap_or("");
                    ids.insert(s(c, "/name").to_string(), json!(id));
                }
            }
        }
    }
    if cur.pointer("/metadata/annotations").is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", escape(REVISION)), "value": rev.hash}));
    ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(SHAPE)), "value": rev.shape}));
    let state = json!({"revision": rev.hash, "imageIDs": ids,
        "updateTimestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)});
    ops.push(
        json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(INPLACE_STATE)),
                    "value": state.to_string()}),
    );
    Value::Array(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_keep_their_transition_time_and_do_not_churn() {
        let mut st = json!({});
        set_condition(
            &mut st,
            json!({"type": "Ready", "status": "False", "reason": "A", "message": "m"}),
        );
        let first = st.clone();
        set_condition(
            &mut st,
            json!({"type": "Ready", "status": "False", "reason": "A", "message": "m"}),
        );
        assert_eq!(st, first, "same condition: nothing changes");
        set_condition(
            &mut st,
            json!({"type": "Ready", "status": "False", "reason": "B", "message": "n"}),
        );
        assert_eq!(
            st["conditions"][0]["lastTransitionTime"],
            first["conditions"][0]["lastTransitionTime"]
        );
        assert_eq!(st["conditions"][0]["reason"], "B");
    }

    #[test]
    fn inplace_patch_touches_images_and_bookkeeping_only() {
        let cur = json!({"metadata": {"uid": "u", "labels": {}, "annotations": {}},
            "spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]},
            "status": {"containerStatuses": [{"name": "a", "imageID": "id-a"}]}});
        let want = json!({"spec": {"containers": [{"name": "a", "image": "x:2"}, {"name": "b", "image": "y:1"}]}});
        let rev = Revision {
            hash: "h2".into(),
            shape: "s".into(),
        };
        let ops = inplace_ops(&cur, &want, "u", &rev);
        let mut pod = cur.clone();
        crate::kube::patch::json_patch(&mut pod, &ops).unwrap();
        assert_eq!(pod["spec"]["containers"][0]["image"], "x:2");
        assert_eq!(pod["spec"]["containers"][1]["image"], "y:1");
        assert_eq!(pod["metadata"]["labels"][REVISION], "h2");
        let state: Value = serde_json::from_str(
            pod["metadata"]["annotations"][INPLACE_STATE]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(state["imageIDs"]["a"], "id-a");
        assert!(state["imageIDs"].get("b").is_none());
        // Another pod with the same name (new UID) is not touched.
        let mut other = cur.clone();
        other["metadata"]["uid"] = json!("v");
        assert!(crate::kube::patch::json_patch(&mut other, &ops).is_err());
    }
}
