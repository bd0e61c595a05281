//! RoleBasedGroupScalingAdapter (`rbgsa`): one role's replica count as an object of its own,
//! with the `scale` subresource, so that `kubectl scale rbgsa/NAME` and a
//! HorizontalPodAutoscaler can size a role without editing its group.
//!
//! A role with `scalingAdapter.enable: true` gets an adapter `<group>-<role>` owned by its
//! group; adapters can also be created by hand. An adapter binds to its target role by
//! adopting the role's replicas (`phase: Bound`); from then on it is the role's size: a scale
//! of the adapter is written into the group's `spec.roles[i].replicas`, and an edit of the
//! group's replicas that disagrees with a bound adapter is overridden (set back to the
//! adapter's value, with a `ReplicasOverriddenByAdapter` warning), as RBG's controller does.
//! (RBG's admission webhook refuses that edit instead; rbgctl ships no webhook, and an
//! override keeps `helm upgrade` of a chart that still names replicas working.)
//!
//! Deciding is pure (`decide`); `Context::reconcile_adapter` reads the caches and writes.

use super::action::{Requeue, CACHE_SYNC_WAIT};
use super::context::{ns_of, Context, ReconcileError};
use super::desired::{self, COMPONENT_INDEX, GROUP, ROLE};
use super::model::{self, Group, Pattern, Role};
use crate::kube::object::ObjectMeta;
use crate::kube::{KubeError, Patch};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// The kind of a scaling adapter: `kubectl scale` (and an autoscaler) on one role of a
/// group, through its `scale` subresource.
pub const KIND: &str = "RoleBasedGroupScalingAdapter";
/// Its resource name in the API.
pub const PLURAL: &str = "rolebasedgroupscalingadapters";

/// The API path of adapter `name` in namespace `ns`.
pub fn path(ns: &str, name: &str) -> String {
    format!("{}/{name}", collection(ns))
}

/// The API path of the adapters in namespace `ns`.
pub fn collection(ns: &str) -> String {
    format!("/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/{PLURAL}")
}

/// The adapter a role with `scalingAdapter.enable` gets: `<group>-<role>`.
pub fn name(group: &str, role: &str) -> String {
    desired::dns_trunc(&format!("{group}-{role}"))
}

/// An adapter, as far as the operator reads it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Adapter<'a> {
    #[serde(borrow)]
    pub metadata: ObjectMeta<'a>,
    #[serde(borrow)]
    pub spec: AdapterSpec<'a>,
    #[serde(borrow)]
    pub status: AdapterStatus<'a>,
}

/// An adapter's spec: the replicas asked for, and the group and role they are for.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AdapterSpec<'a> {
    pub replicas: Option<u32>,
    #[serde(borrow)]
    pub scale_target_ref: TargetRef<'a>,
}

/// The role an adapter scales.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct TargetRef<'a> {
    /// The group's name (same namespace).
    pub name: &'a str,
    pub role: &'a str,
}

/// An adapter's status, as the operator writes it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AdapterStatus<'a> {
    /// "", `NotBound` or `Bound`.
    pub phase: &'a str,
    /// The role size last written for this adapter.
    pub replicas: Option<u32>,
    pub last_scale_time: Option<&'a str>,
}

impl<'a> Adapter<'a> {
    /// The adapter's view; `None` when the object does not follow the schema.
    pub fn of(obj: &'a Value) -> Option<Adapter<'a>> {
        Adapter::deserialize(obj).ok()
    }

    /// Whether the adapter is bound to its group.
    pub fn bound(&self) -> bool {
        self.status.phase == "Bound"
    }
}

/// The adapter's target role as it is now.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetRole {
    /// Index of the role in the group's `spec.roles`.
    pub index: usize,
    /// The role's replicas in the group's spec.
    pub replicas: u32,
    /// Ready instances (the group's `status.roleStatuses`).
    pub ready: u32,
    /// Label selector of the role's instances (leader pods only for leader/worker roles).
    pub selector: String,
}

/// Why a role's replicas are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The adapter was scaled (`kubectl scale`, an HPA).
    Scaled,
    /// The group's replicas were edited to disagree with the bound adapter: set back.
    Overridden,
}

/// A change of a role's replicas an adapter brings, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct RoleScale {
    pub from: u32,
    pub to: u32,
    pub cause: Cause,
}

/// What an adapter's reconcile writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Binding: the adapter adopts the role's replicas.
    pub spec_replicas: Option<u32>,
    /// The group's role replicas to write.
    pub scale_role: Option<RoleScale>,
    /// The adapter's status as it should be.
    pub status: Value,
}

/// Decides an adapter's next writes from its target (`None`: no such group or role). `now` is
/// written as `lastScaleTime` when the adapter scales its role.
pub fn decide(a: &Adapter, target: Option<&TargetRole>, now: &str) -> Decision {
    let last = a.status.last_scale_time.map(|t| json!(t));
    let Some(t) = target else {
        let mut status = json!({"phase": "NotBound"});
        if let Some(l) = last {
            status["lastScaleTime"] = l;
        }
        return Decision {
            spec_replicas: None,
            scale_role: None,
            status,
        };
    };
    let (spec_replicas, want, scale_role) = if !a.bound() {
        // Binding adopts what the role runs now; nothing is scaled.
        let adopt = (a.spec.replicas != Some(t.replicas)).then_some(t.replicas);
        (adopt, t.replicas, None)
    } else {
        let want = a.spec.replicas.unwrap_or(t.replicas);
        let scale = (want != t.replicas).then(|| RoleScale {
            from: t.replicas,
            to: want,
            cause: if a.status.replicas == Some(want) {
                Cause::Overridden
            } else {
                Cause::Scaled
            },
        });
        let fill = a.spec.replicas.is_none().then_some(want);
        (fill, want, scale)
    };
    let mut status = json!({"phase": "Bound", "replicas": want, "readyReplicas": t.ready.min(want),
                            "selector": t.selector});
    match (&scale_role, last) {
        (Some(s), _) if s.cause == Cause::Scaled => status["lastScaleTime"] = json!(now),
        (_, Some(l)) => status["lastScaleTime"] = l,
        _ => {}
    }
    Decision {
        spec_replicas,
        scale_role,
        status,
    }
}

/// The label selector of a role's instances, as an HPA counts them.
pub fn selector(g: &Group, role: &Role) -> String {
    let mut s = format!("{GROUP}={},{ROLE}={}", g.name, role.name);
    if matches!(role.pattern, Pattern::LeaderWorker { .. }) {
        s.push_str(&format!(",{COMPONENT_INDEX}=0"));
    }
    s
}

/// The adapter a group's role asks for (`scalingAdapter.enable`), owned by the group.
pub fn desired(g: &Group, role: &Role, extra_labels: &BTreeMap<String, String>) -> Value {
    let mut labels: Map<String, Value> = extra_labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    labels.insert(GROUP.into(), json!(g.name));
    labels.insert(ROLE.into(), json!(role.name));
    json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": KIND,
           "metadata": {"name": name(&g.name, &role.name), "namespace": g.namespace,
               "labels": labels,
               "ownerReferences": [{"apiVersion": "workloads.x-k8s.io/v1alpha2",
                   "kind": "RoleBasedGroup", "name": g.name, "uid": g.uid,
                   "blockOwnerDeletion": true}]},
           "spec": {"replicas": role.replicas,
                    "scaleTargetRef": {"name": g.name, "role": role.name}}})
}

/// The replicas a bound adapter holds for a role of `g`, where they differ from the spec:
/// the group is reconciled with these until the adapter has written them into the group.
pub fn overrides(g: &Group, adapters: &[Value]) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for obj in adapters {
        let Some(a) = Adapter::of(obj) else { continue };
        let t = &a.spec.scale_target_ref;
        if t.name != g.name || !a.bound() || a.metadata.is_terminating() {
            continue;
        }
        let (Some(role), Some(n)) = (g.roles.iter().find(|r| r.name == t.role), a.spec.replicas)
        else {
            continue;
        };
        if n != role.replicas {
            out.insert(role.name.clone(), n);
        }
    }
    out
}

/// Adapters of a namespace that target the group `name`.
pub(super) fn adapters_of(ctx: &Context, ns: &str, group: &str) -> Vec<Value> {
    ctx.caches.adapters.select(|o| {
        ObjectMeta::of(o).namespace == ns
            && Adapter::of(o).is_some_and(|a| a.spec.scale_target_ref.name == group)
    })
}

/// The group's side: each role with `scalingAdapter.enable` has its adapter; adapters the
/// group owns for roles that no longer ask for one are deleted.
pub(super) async fn ensure(ctx: &Context, g: &Group) -> Result<(), ReconcileError> {
    let owned = |o: &Value| {
        let m = ObjectMeta::of(o);
        m.namespace == g.namespace && m.owned_by(&g.uid)
    };
    let mine = ctx.caches.adapters.select(owned);
    for r in &g.roles {
        let Some(labels) = &r.scaling_adapter else {
            continue;
        };
        let want = desired(g, r, labels);
        let n = name(&g.name, &r.name);
        match ctx.caches.adapters.get(&format!("{}/{n}", g.namespace)) {
            None => {
                ctx.throttle.wait().await;
                let mark = ctx.caches.adapters.mark();
                match ctx.kube.create(&collection(&g.namespace), &want).await {
                    Ok(v) => ctx.caches.adapters.put_written(v, mark),
                    Err(KubeError::Status { code: 409, .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                tracing::info!(group = %g.name, role = %r.name, adapter = %n, "scaling adapter created");
            }
            Some(have) => {
                let m = ObjectMeta::of(&have);
                let missing: Map<String, Value> = want["metadata"]["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, v)| v.as_str() != Some(m.label(k)))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if m.owned_by(&g.uid) && !missing.is_empty() && !m.is_terminating() {
                    ctx.throttle.wait().await;
                    let mark = ctx.caches.adapters.mark();
                    let v = ctx
                        .kube
                        .patch(
                            &path(&g.namespace, &n),
                            &Patch::Merge(json!({"metadata": {"labels": missing}})),
                        )
                        .await?;
                    ctx.caches.adapters.put_written(v, mark);
                }
            }
        }
    }
    for o in mine {
        let m = ObjectMeta::of(&o);
        let wanted = g
            .roles
            .iter()
            .any(|r| r.scaling_adapter.is_some() && name(&g.name, &r.name) == m.name);
        if wanted || m.is_terminating() {
            continue;
        }
        ctx.throttle.wait().await;
        let mark = ctx.caches.adapters.mark();
        ctx.kube
            .delete(&path(m.namespace, m.name), Some(m.uid))
            .await?;
        ctx.caches.adapters.remove_written(&m.key(), mark);
        tracing::info!(group = %g.name, adapter = %m.name, "scaling adapter deleted (role no longer asks for one)");
    }
    Ok(())
}

/// One reconcile of the adapter `namespace/name`.
#[tracing::instrument(skip(ctx), fields(adapter = %key))]
pub async fn reconcile(ctx: &Context, key: &str) -> Result<Requeue, ReconcileError> {
    ctx.metrics
        .adapter_reconciles
        .fetch_add(1, Ordering::Relaxed);
    if !(ctx.caches.adapters.synced() && ctx.caches.groups.synced()) {
        return Ok(Requeue::After(CACHE_SYNC_WAIT));
    }
    let Some(obj) = ctx.caches.adapters.get(key) else {
        return Ok(Requeue::AwaitChange);
    };
    let Some(a) = Adapter::of(&obj) else {
        return Ok(Requeue::AwaitChange);
    };
    if a.metadata.is_terminating() {
        return Ok(Requeue::AwaitChange);
    }
    let (ns, _) = ns_of(key);
    let group_key = format!("{ns}/{}", a.spec.scale_target_ref.name);
    let group_obj = ctx
        .caches
        .groups
        .get(&group_key)
        .filter(|g| !ObjectMeta::of(g).is_terminating());
    let parsed = group_obj.as_ref().and_then(|o| {
        let mut g = model::parse_group(o).ok()?;
        g.namespace = ns.to_string();
        Some(g)
    });
    let target = parsed.as_ref().and_then(|g| {
        let index = g
            .roles
            .iter()
            .position(|r| r.name == a.spec.scale_target_ref.role)?;
        let role = &g.roles[index];
        let ready = group_obj.as_ref().and_then(|o| {
            model::RoleStatus::all_of(o)
                .into_iter()
                .find(|s| s.name == role.name)
                .map(|s| s.ready_replicas)
        });
        Some(TargetRole {
            index,
            replicas: role.replicas,
            ready: ready.unwrap_or(0),
            selector: selector(g, role),
        })
    });
    let now = crate::kube::object::timestamp_now();
    let d = decide(&a, target.as_ref(), &now);
    let (name, meta_rv) = (a.metadata.name, a.metadata.resource_version);
    // The status is written over the adapter as it stands after the spec write (a
    // custom resource takes no update without the resourceVersion it replaces).
    let mut current = obj.clone();
    if let Some(n) = d.spec_replicas {
        let ops = json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta_rv},
            {"op": "add", "path": "/spec/replicas", "value": n}]);
        ctx.throttle.wait().await;
        let mark = ctx.caches.adapters.mark();
        let v = ctx.kube.patch(&path(ns, name), &Patch::Json(ops)).await?;
        ctx.caches.adapters.put_written(v.clone(), mark);
        current = v;
    }
    if let (Some(s), Some(t), Some(gobj)) = (&d.scale_role, &target, &group_obj) {
        let gm = ObjectMeta::of(gobj);
        let ops = json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": gm.resource_version},
            {"op": "test", "path": format!("/spec/roles/{}/name", t.index),
             "value": a.spec.scale_target_ref.role},
            {"op": "add", "path": format!("/spec/roles/{}/replicas", t.index), "value": s.to},
        ]);
        ctx.throttle.wait().await;
        let mark = ctx.caches.groups.mark();
        let v = ctx
            .kube
            .patch(&super::context::group_path(ns, gm.name), &Patch::Json(ops))
            .await?;
        ctx.caches.groups.put_written(v, mark);
        let role = a.spec.scale_target_ref.role;
        match s.cause {
            Cause::Scaled => {
                tracing::info!(adapter = %name, role, from = s.from, to = s.to, "role scaled");
                let msg = format!("role {role} scaled from {} to {} replicas", s.from, s.to);
                ctx.events
                    .post_on(&obj, KIND, "Normal", "Scaled", &msg)
                    .await;
            }
            Cause::Overridden => {
                let msg = format!(
                    "role {role}: replicas {} in the group disagree with the bound scaling \
                     adapter {name} ({}); set back to {}. Scale the role with `kubectl \
                     scale rbgsa/{name} --replicas N`, or set scalingAdapter.enable: false",
                    s.from, s.to, s.to
                );
                tracing::warn!(adapter = %name, role, from = s.from, to = s.to, "group replicas overridden by the adapter");
                ctx.events
                    .post(gobj, "Warning", "ReplicasOverriddenByAdapter", &msg)
                    .await;
            }
        }
    }
    if current.get("status") != Some(&d.status) {
        let mut next = current;
        next["status"] = d.status;
        ctx.throttle.wait().await;
        let mark = ctx.caches.adapters.mark();
        let v = ctx
            .kube
            .replace(&format!("{}/status", path(ns, name)), &next)
            .await?;
        ctx.caches.adapters.put_written(v, mark);
    }
    Ok(Requeue::AwaitChange)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(replicas: Option<u32>, phase: &str, status_replicas: Option<u32>) -> Value {
        json!({"metadata": {"name": "g-r", "namespace": "ns"},
               "spec": {"replicas": replicas, "scaleTargetRef": {"name": "g", "role": "r"}},
               "status": {"phase": phase, "replicas": status_replicas}})
    }

    fn target(replicas: u32) -> TargetRole {
        TargetRole {
            index: 0,
            replicas,
            ready: 2,
            selector: "s".into(),
        }
    }

    #[test]
    fn binding_adopts_the_roles_replicas_and_scales_nothing() {
        let o = adapter(Some(7), "", None);
        let d = decide(&Adapter::of(&o).unwrap(), Some(&target(3)), "t");
        assert_eq!(d.spec_replicas, Some(3));
        assert_eq!(d.scale_role, None);
        assert_eq!(d.status["phase"], "Bound");
        assert_eq!(d.status["replicas"], 3);
        assert_eq!(d.status["readyReplicas"], 2);
        assert!(d.status.get("lastScaleTime").is_none());
    }

    #[test]
    fn a_scaled_adapter_scales_its_role_and_says_when() {
        let o = adapter(Some(5), "Bound", Some(3));
        let d = decide(&Adapter::of(&o).unwrap(), Some(&target(3)), "t");
        assert_eq!(
            d.scale_role,
            Some(RoleScale {
                from: 3,
                to: 5,
                cause: Cause::Scaled
            })
        );
        assert_eq!(d.spec_replicas, None);
        assert_eq!(d.status["replicas"], 5);
        assert_eq!(d.status["lastScaleTime"], "t");
    }

    #[test]
    fn a_group_edit_that_disagrees_with_a_bound_adapter_is_overridden() {
        let o = adapter(Some(3), "Bound", Some(3));
        let d = decide(&Adapter::of(&o).unwrap(), Some(&target(10)), "t");
        assert_eq!(
            d.scale_role,
            Some(RoleScale {
                from: 10,
                to: 3,
                cause: Cause::Overridden
            })
        );
        assert!(d.status.get("lastScaleTime").is_none(), "not a scale");
    }

    #[test]
    fn in_agreement_nothing_is_written_but_the_status() {
        let o = adapter(Some(3), "Bound", Some(3));
        let d = decide(&Adapter::of(&o).unwrap(), Some(&target(3)), "t");
        assert_eq!((d.spec_replicas, d.scale_role), (None, None));
        assert_eq!(
            d.status,
            json!({"phase": "Bound", "replicas": 3, "readyReplicas": 2, "selector": "s"})
        );
    }

    #[test]
    fn without_its_target_an_adapter_is_not_bound() {
        let o = adapter(Some(3), "Bound", Some(3));
        let d = decide(&Adapter::of(&o).unwrap(), None, "t");
        assert_eq!(d.status, json!({"phase": "NotBound"}));
        assert_eq!((d.spec_replicas, d.scale_role), (None, None));
    }

    #[test]
    fn only_bound_adapters_override_their_roles() {
        let g = model::parse_group(&json!({"metadata": {"name": "g"}, "spec": {"roles": [
            {"name": "r", "replicas": 2, "standalonePattern": {"template": {"spec": {
                "containers": [{"name": "c", "image": "i"}]}}}}]}}))
        .unwrap();
        let bound = adapter(Some(4), "Bound", Some(4));
        let unbound = json!({"metadata": {"name": "x"},
            "spec": {"replicas": 9, "scaleTargetRef": {"name": "g", "role": "r"}}});
        assert_eq!(
            overrides(&g, std::slice::from_ref(&unbound)),
            BTreeMap::new()
        );
        assert_eq!(
            overrides(&g, &[bound, unbound]),
            BTreeMap::from([("r".to_string(), 4)])
        );
    }
}
