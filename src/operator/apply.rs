//! Writing the difference: what each child should look like against what the cache holds
//! is a pure diff ([`config_change`], [`service_change`], [`slice_change`], [`inplace_ops`]);
//! [`Context::apply`] writes a [`Change`] and records the answer in the cache. Pod
//! creations, deletions and in-place updates follow the rollout plan (`plan.rs`).

use super::context::{core, slices_path, Context, ReconcileError};
use crate::kube::object::{ObjectMeta, Pod};
use crate::kube::patch::escape;
use crate::kube::Patch;
use crate::operator::desired::{self, Revision, Slot, GROUP, INPLACE_STATE, REVISION, ROLE, SHAPE};
use crate::operator::informer::{key_of, Store};
use crate::operator::model::{Group, Role};
use crate::operator::plan::{self, Action};
use crate::operator::revisions;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// What to write so that a child is as wanted.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Nothing,
    /// It does not exist: create this object.
    Create(Value),
    /// It differs: apply this patch.
    Patch(Patch),
    /// It differs: replace it with this object (carrying the resourceVersion it replaces).
    Replace(Value),
}

/// The discovery ConfigMap: its `data` is all that is ours.
pub fn config_change(cur: Option<&Value>, want: Value) -> Change {
    match cur {
        None => Change::Create(want),
        Some(cur) if cur["data"] != want["data"] => {
            Change::Patch(Patch::Merge(json!({"data": want["data"]})))
        }
        Some(_) => Change::Nothing,
    }
}

/// A Service: its selector and (when we set them) its ports are ours; the rest (cluster IP,
/// fields other controllers default) is left alone.
pub fn service_change(cur: Option<&Value>, want: Value) -> Change {
    let Some(cur) = cur else {
        return Change::Create(want);
    };
    let spec = &want["spec"];
    let same = cur["spec"].get("selector") == spec.get("selector")
        && (spec.get("ports").is_none() || ports_equal(&cur["spec"]["ports"], &spec["ports"]));
    if same {
        return Change::Nothing;
    }
    let mut patch = json!({"selector": spec.get("selector").cloned().unwrap_or(Value::Null)});
    if let Some(p) = spec.get("ports") {
        patch["ports"] = p.clone();
    }
    Change::Patch(Patch::Merge(json!({ "spec": patch })))
}

/// An EndpointSlice of a v1alpha1 group: replaced whole when its endpoints change.
pub fn slice_change(cur: Option<&Value>, want: Value) -> Change {
    match cur {
        None => Change::Create(want),
        Some(cur)
            if cur["endpoints"] != want["endpoints"]
                || cur["addressType"] != want["addressType"] =>
        {
            let mut next = want;
            next["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
            Change::Replace(next)
        }
        Some(_) => Change::Nothing,
    }
}

fn ports_equal(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| -> Vec<(String, u64)> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["name"].as_str().unwrap_or("").to_string(),
                    p["port"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    strip(a) == strip(b)
}

impl Context {
    /// Writes `change` for the object `name` in the collection at `collection` and records the
    /// answer in `cache`. A create that finds the object already there (409: our cache is
    /// behind) is left to the watch, which brings the object soon.
    pub(super) async fn apply(
        &self,
        cache: &Store,
        collection: &str,
        name: &str,
        change: Change,
    ) -> Result<(), ReconcileError> {
        if change == Change::Nothing {
            return Ok(());
        }
        self.throttle.wait().await;
        let mark = cache.mark();
        let path = format!("{collection}/{name}");
        let written = match change {
            Change::Nothing => return Ok(()),
            Change::Create(obj) => match self.kube.create(collection, &obj).await {
                Err(e) if e.code() == Some(409) => return Ok(()),
                other => other?,
            },
            Change::Patch(p) => self.kube.patch(&path, &p).await?,
            Change::Replace(obj) => self.kube.replace(&path, &obj).await?,
        };
        cache.put_written(written, mark);
        Ok(())
    }

    /// The discovery ConfigMap every pod of the group mounts.
    pub(super) async fn ensure_config(
        &self,
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
        let want = desired::config_map(g, &desired::discovery_config(g, &stateless));
        let cur = self
            .caches
            .configmaps
            .get(&format!("{}/{}", g.namespace, g.name));
        let change = config_change(cur.as_ref(), want);
        let collection = core(&g.namespace, "configmaps");
        self.apply(&self.caches.configmaps, &collection, &g.name, change)
            .await
    }

    pub(super) async fn ensure_service(&self, want: Value) -> Result<(), ReconcileError> {
        let (key, meta) = (key_of(&want), ObjectMeta::of(&want));
        let (collection, name) = (core(meta.namespace, "services"), meta.name.to_string());
        let cur = self.caches.services.get(&key);
        let change = service_change(cur.as_ref(), want);
        self.apply(&self.caches.services, &collection, &name, change)
            .await
    }

    /// Writes an EndpointSlice unless its last write was refused moments ago (`refusals`).
    pub(super) async fn ensure_slice(&self, want: Value) -> Result<(), ReconcileError> {
        let (key, meta) = (key_of(&want), ObjectMeta::of(&want));
        let (collection, name) = (slices_path(meta.namespace), meta.name.to_string());
        let now = std::time::Instant::now();
        if let Some(why) = self.refusals.lock().held(&key, now) {
            return Err(ReconcileError::Held {
                object: key.clone(),
                why: why.to_string(),
            });
        }
        let cur = self.caches.slices.get(&key);
        let change = slice_change(cur.as_ref(), want);
        let written = self
            .apply(&self.caches.slices, &collection, &name, change)
            .await;
        match &written {
            Ok(()) => self.refusals.lock().written(&key),
            Err(e) if !e.is_conflict() => self.refusals.lock().refused(&key, now, e.to_string()),
            Err(_) => {}
        }
        written
    }

    /// Takes one rollout step of a role; false when a step could not be taken now (an
    /// in-place update the API server refused) and the group needs another look soon.
    pub(super) async fn execute(
        &self,
        obj: &Value,
        g: &Group,
        role: &Role,
        rev: &Revision,
        actions: &[Action],
    ) -> Result<bool, ReconcileError> {
        let mut all_taken = true;
        let ns = &g.namespace;
        let (mut created, mut deleted, mut inplace) = (0, 0, 0);
        let mut fresh_instance = String::new();
        for a in actions {
            match a {
                Action::Create {
                    instance,
                    ordinal,
                    component,
                    revision,
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
                    let kept = revision.as_ref().and_then(|h| self.kept_role(g, role, h));
                    let pod = match &kept {
                        Some((old, old_rev)) => desired::pod(g, old, old_rev, &slot),
                        None => desired::pod(g, role, rev, &slot),
                    };
                    self.throttle.wait().await;
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
                    self.throttle.wait().await;
                    let mark = self.caches.pods.mark();
                    let path = format!("{}/{name}", core(ns, "pods"));
                    let key = format!("{ns}/{name}");
                    match self.kube.delete(&path, Some(uid)).await {
                        // Deleted, and terminating for its grace period: so it stays in the
                        // cache until the watch says it is gone (a pod of a store that hands
                        // over is still leaving; its name is still taken).
                        Ok(true) => {
                            if let Some(mut cur) = self.caches.pods.get(&key) {
                                cur["metadata"]["deletionTimestamp"] =
                                    json!(crate::kube::object::timestamp_now());
                                self.caches.pods.put_written(cur, mark);
                            }
                            deleted += 1;
                        }
                        Ok(false) => {
                            self.caches.pods.remove_written(&key, mark);
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
                    self.throttle.wait().await;
                    let mark = self.caches.pods.mark();
                    let path = format!("{}/{name}", core(ns, "pods"));
                    match self.kube.patch(&path, &Patch::Json(ops)).await {
                        Ok(v) => {
                            self.caches.pods.put_written(v, mark);
                            inplace += 1;
                        }
                        Err(e) if matches!(e.code(), Some(404 | 409 | 422)) => {
                            tracing::info!(pod = %name, error = %e, "in-place update not applied; will look again");
                            all_taken = false;
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
            // Every step is news, even when it reads like the last one.
            self.events.forget(&key_of(obj), "RoleStepped");
            self.events.post(obj, "Normal", "RoleStepped", &msg).await;
        }
        Ok(all_taken)
    }

    /// Each role's revision kept as a ControllerRevision (made when the spec names a new
    /// one), and each role's history pruned past its limit, sparing what pods still run.
    pub(super) async fn keep_revisions(
        &self,
        g: &Group,
        revs: &BTreeMap<String, Revision>,
        crs: &[Value],
        views: &BTreeMap<String, Vec<plan::PodView>>,
        current: &BTreeMap<String, String>,
    ) -> Result<(), ReconcileError> {
        let collection = revisions::path(&g.namespace, None);
        for r in &g.roles {
            let history = revisions::history_of(crs, &r.name);
            let rev = &revs[&r.name];
            if !history.iter().any(|k| k.hash == rev.hash) {
                let cr = revisions::revision_object(g, r, rev, &history);
                let name = revisions::name(&g.name, &r.name, &rev.hash);
                self.apply(
                    &self.caches.revisions,
                    &collection,
                    &name,
                    Change::Create(cr),
                )
                .await?;
            }
            let in_use: std::collections::BTreeSet<String> = views[&r.name]
                .iter()
                .map(|p| p.revision.clone())
                .chain([rev.hash.clone(), current[&r.name].clone()])
                .collect();
            for old in revisions::to_prune(&history, &in_use) {
                self.throttle.wait().await;
                let mark = self.caches.revisions.mark();
                let path = revisions::path(&g.namespace, Some(&old));
                match self.kube.delete(&path, None).await {
                    Err(e) if e.code() != Some(404) => return Err(e.into()),
                    _ => {
                        let key = format!("{}/{old}", g.namespace);
                        self.caches.revisions.remove_written(&key, mark)
                    }
                }
            }
        }
        Ok(())
    }

    /// `role` at its kept revision `hash`, from its ControllerRevision; `None` (and said) when
    /// the revision is not kept, so the pod is made at the role's own revision.
    fn kept_role(&self, g: &Group, role: &Role, hash: &str) -> Option<(Role, Revision)> {
        let name = revisions::name(&g.name, &role.name, hash);
        let found = self
            .caches
            .revisions
            .get(&format!("{}/{name}", g.namespace))
            .and_then(|cr| revisions::Kept::of(&cr))
            .and_then(|k| k.role(role.replicas));
        let Some(old) = found else {
            tracing::warn!(group = %g.name, role = %role.name, revision = hash,
                "revision not kept; the pod is made at the role's own revision");
            return None;
        };
        let old_rev = desired::revision(&old);
        Some((old, old_rev))
    }

    /// Children of roles that are gone from the spec.
    pub(super) async fn remove_orphans(
        &self,
        g: &Group,
        pods: &[Value],
    ) -> Result<(), ReconcileError> {
        let known = |r: &str| g.roles.iter().any(|x| x.name == r);
        for p in pods {
            let m = ObjectMeta::of(p);
            if !known(m.label(ROLE)) && !m.is_terminating() {
                self.throttle.wait().await;
                self.kube
                    .delete(&format!("{}/{}", core(&g.namespace, "pods"), m.name), None)
                    .await?;
            }
        }
        let group_children = |v: &Value| {
            let m = ObjectMeta::of(v);
            m.namespace == g.namespace && m.label(GROUP) == g.name
        };
        for svc in self.caches.services.select(|v| group_children(v)) {
            let name = ObjectMeta::of(&svc).name;
            let wanted = g.roles.iter().any(|r| {
                name == desired::service_name(&g.name, &r.name)
                    || (g.legacy && name == desired::legacy_service_name(&g.name, &r.name))
            });
            if !wanted {
                self.throttle.wait().await;
                let mark = self.caches.services.mark();
                self.kube
                    .delete(&format!("{}/{name}", core(&g.namespace, "services")), None)
                    .await?;
                self.caches.services.remove_written(&key_of(&svc), mark);
            }
        }
        for sl in self.caches.slices.select(|v| group_children(v)) {
            let m = ObjectMeta::of(&sl);
            if !g.legacy || !known(m.label(ROLE)) {
                self.throttle.wait().await;
                let mark = self.caches.slices.mark();
                self.kube
                    .delete(&format!("{}/{}", slices_path(&g.namespace), m.name), None)
                    .await?;
                self.caches.slices.remove_written(&key_of(&sl), mark);
            }
        }
        Ok(())
    }
}

/// The JSON patch that moves a pod's images to the new revision in place, guarded by the
/// pod's UID and container names, and records the images it ran before.
pub fn inplace_ops(cur: &Value, want: &Value, uid: &str, rev: &Revision) -> Value {
    let mut ops = vec![json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    let mut ids = serde_json::Map::new();
    let mut restarts = serde_json::Map::new();
    let pod = Pod::of(cur);
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
                    let name = c["name"].as_str().unwrap_or("");
                    ids.insert(name.to_string(), json!(pod.image_id(name)));
                    let count = pod.container_status(name).map_or(0, |s| s.restart_count);
                    restarts.insert(name.to_string(), json!(count));
                }
            }
        }
    }
    if cur["metadata"].get("annotations").is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", escape(REVISION)), "value": rev.hash}));
    ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(SHAPE)), "value": rev.shape}));
    let state = json!({"revision": rev.hash, "imageIDs": ids, "restartCounts": restarts,
        "updateTimestamp": crate::kube::object::timestamp_now()});
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
    fn children_change_only_where_they_differ() {
        let want = json!({"metadata": {"name": "s", "namespace": "ns"},
            "spec": {"selector": {"a": "1"}, "ports": [{"name": "http", "port": 80}]}});
        assert_eq!(
            service_change(None, want.clone()),
            Change::Create(want.clone())
        );
        let mut cur = want.clone();
        cur["spec"]["clusterIP"] = json!("10.0.0.1");
        cur["spec"]["ports"][0]["protocol"] = json!("TCP");
        assert_eq!(
            service_change(Some(&cur), want.clone()),
            Change::Nothing,
            "defaults are not ours"
        );
        cur["spec"]["selector"] = json!({"a": "2"});
        assert_eq!(
            service_change(Some(&cur), want),
            Change::Patch(Patch::Merge(json!({"spec": {"selector": {"a": "1"},
                "ports": [{"name": "http", "port": 80}]}})))
        );

        let cm = json!({"metadata": {"name": "g"}, "data": {"config.yaml": "x"}});
        let mut cur = cm.clone();
        cur["metadata"]["resourceVersion"] = json!("5");
        assert_eq!(config_change(Some(&cur), cm.clone()), Change::Nothing);
        cur["data"]["config.yaml"] = json!("y");
        assert_eq!(
            config_change(Some(&cur), cm),
            Change::Patch(Patch::Merge(json!({"data": {"config.yaml": "x"}})))
        );

        let slice = json!({"metadata": {"name": "e"}, "addressType": "IPv4", "endpoints": [1]});
        let mut cur = slice.clone();
        cur["metadata"]["resourceVersion"] = json!("9");
        assert_eq!(slice_change(Some(&cur), slice.clone()), Change::Nothing);
        cur["endpoints"] = json!([]);
        let Change::Replace(next) = slice_change(Some(&cur), slice) else {
            panic!("a changed slice is replaced");
        };
        assert_eq!(
            next["metadata"]["resourceVersion"], "9",
            "replaces the version it read"
        );
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
