//! The children a group should have, as pure functions of its model: pods (names, labels,
//! discovery env and config mount, hostname/subdomain), headless Services, the discovery
//! ConfigMap, the EndpointSlice behind a v1alpha1 group's `<group>-<role>` Service, and the
//! revision hashes that decide between in-place update and recreation.

use crate::kube::object::{Pod, PodSpec};
use crate::kube::patch;
use crate::operator::model::{Group, Pattern, Role};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The label naming a child's group (RBG v1alpha2's key).
pub const GROUP: &str = "rbg.workloads.x-k8s.io/group-name";
/// The label naming a child's role (RBG v1alpha2's key).
pub const ROLE: &str = "rbg.workloads.x-k8s.io/role-name";
/// The group label as v1alpha1 spelled it (written too, for selectors of that era).
pub const GROUP_V1: &str = "rolebasedgroup.workloads.x-k8s.io/name";
/// The role label as v1alpha1 spelled it.
pub const ROLE_V1: &str = "rolebasedgroup.workloads.x-k8s.io/role";
/// The label naming a pod's instance (`<group>-<role>-<ordinal>`, or a random one).
pub const INSTANCE: &str = "rbg.workloads.x-k8s.io/role-instance-name";
/// The label with a stateful instance's ordinal.
pub const INDEX: &str = "rbg.workloads.x-k8s.io/role-instance-index";
/// The label naming a leader-worker pod's part: `leader` or `worker`.
pub const COMPONENT: &str = "rbg.workloads.x-k8s.io/component-name";
/// The label with a pod's index in its instance (0: the leader).
pub const COMPONENT_INDEX: &str = "rbg.workloads.x-k8s.io/component-index";
/// The label with the pods an instance has.
pub const COMPONENT_SIZE: &str = "rbg.workloads.x-k8s.io/component-size";
/// The label with a pod's revision (its role's template hash; its ControllerRevision is
/// `<group>-<role>-<hash>`).
pub const REVISION: &str = "controller-revision-hash";
/// The label every child the operator makes carries ...
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// ... with this value (what the operator's watches select).
pub const MANAGER: &str = "rbgctl";
/// Hash of the template with container images left out: equal shapes mean an image-only
/// change, which can be applied in place.
pub const SHAPE: &str = "rbg.workloads.x-k8s.io/template-shape";
/// The annotation recording a pod's images and restart counts before an in-place update.
pub const INPLACE_STATE: &str = "rbg.workloads.x-k8s.io/inplace-update-state";
/// The finalizer that keeps a group until its children are gone.
pub const FINALIZER: &str = "rbg.workloads.x-k8s.io/children";
/// The volume every pod mounts the group's discovery ConfigMap from ...
pub const CONFIG_VOLUME: &str = "rbg-cluster-config";
/// ... at this directory (`config.yaml`).
pub const CONFIG_DIR: &str = "/etc/rbg";

/// Truncates to a DNS label's 63 characters without a trailing `-`.
pub fn dns_trunc(s: &str) -> String {
    let t: String = s.chars().take(63).collect();
    t.trim_end_matches('-').to_string()
}

/// The headless Service every role gets: `s-<group>-<role>`.
pub fn service_name(group: &str, role: &str) -> String {
    dns_trunc(&format!("s-{group}-{role}"))
}

/// The v1alpha1 name, `<group>-<role>`, kept for groups written in that form.
pub fn legacy_service_name(group: &str, role: &str) -> String {
    dns_trunc(&format!("{group}-{role}"))
}

/// The name of a stateful role's instance: `<group>-<role>-<ordinal>`.
pub fn stateful_instance(group: &str, role: &str, ordinal: u32) -> String {
    format!("{group}-{role}-{ordinal}")
}

/// A pod's name: its instance's, with `-<component>` for a leader-worker pod.
pub fn pod_name(role: &Role, instance: &str, component: u32) -> String {
    match role.pattern {
        Pattern::Standalone => instance.to_string(),
        Pattern::LeaderWorker { .. } => format!("{instance}-{component}"),
    }
}

fn hash_of(v: &Value) -> String {
    format!("{:016x}", crate::hash::fnv1a(v.to_string().as_bytes()))[..10].to_string()
}

/// The role's revision (everything that shapes its pods, replicas aside) and its shape
/// (the same without container images).
#[derive(Clone, Debug, PartialEq)]
pub struct Revision {
    pub hash: String,
    pub shape: String,
}

fn without_images(v: &Value) -> Value {
    let mut v = v.clone();
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for key in ["containers", "initContainers"] {
                    if let Some(Value::Array(cs)) = m.get_mut(key) {
                        for c in cs {
                            if let Some(o) = c.as_object_mut() {
                                o.remove("image");
                            }
                        }
                    }
                }
                for (_, x) in m.iter_mut() {
                    strip(x);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// The role's revision: the hash of what shapes its pods (replicas aside), and its shape.
pub fn revision(role: &Role) -> Revision {
    let basis = match &role.pattern {
        Pattern::Standalone => json!({"t": role.template, "stateless": role.stateless}),
        Pattern::LeaderWorker {
            size,
            leader_patch,
            worker_patch,
            leader_only_service,
        } => json!({"t": role.template, "size": size, "lp": leader_patch, "wp": worker_patch,
                    "lo": leader_only_service, "stateless": role.stateless}),
    };
    // Only where set: the hash of every other role stays what it was.
    let mut basis = basis;
    if let Some(n) = role.hand_over_secs {
        basis["ho"] = json!(n);
    }
    Revision {
        hash: hash_of(&basis),
        shape: hash_of(&without_images(&basis)),
    }
}

/// The store setting a hand-over role's containers get (`rbgctl store --hand-over-secs`).
pub const HAND_OVER_ENV: &str = "RBGCTL_STORE_HAND_OVER_SECS";
/// Seconds past a hand-over's deadline a stopping store's pod is given before SIGKILL.
pub const HAND_OVER_GRACE_SLACK: u32 = 30;

pub(super) fn owner(g: &Group) -> Value {
    json!([{"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
            "name": g.name, "uid": g.uid, "controller": true, "blockOwnerDeletion": true}])
}

/// Labels every child of a role carries (both API generations).
pub fn role_labels(g: &Group, role: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(GROUP.into(), json!(g.name));
    m.insert(ROLE.into(), json!(role));
    m.insert(GROUP_V1.into(), json!(g.name));
    m.insert(ROLE_V1.into(), json!(role));
    m.insert(MANAGED_BY.into(), json!(MANAGER));
    m
}

fn env_var(name: &str, value: impl Into<String>) -> Value {
    json!({"name": name, "value": value.into()})
}

/// Where one pod sits in its role.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    pub instance: String,
    /// Stateful roles only.
    pub ordinal: Option<u32>,
    /// 0 is the leader (or the only pod).
    pub component: u32,
}

/// The pod for a slot at the role's current revision.
pub fn pod(g: &Group, role: &Role, rev: &Revision, slot: &Slot) -> Value {
    let mut t = role.template.clone();
    let lwp = match &role.pattern {
        Pattern::LeaderWorker {
            size,
            leader_patch,
            worker_patch,
            leader_only_service,
        } => {
            let p = if slot.component == 0 {
                leader_patch
            } else {
                worker_patch
            };
            if !p.is_null() {
                patch::strategic_merge(&mut t, p);
            }
            Some((*size, *leader_only_service))
        }
        Pattern::Standalone => None,
    };
    let name = pod_name(role, &slot.instance, slot.component);
    let svc = service_name(&g.name, &role.name);
    let mut labels = t["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    labels.extend(role_labels(g, &role.name));
    labels.insert(INSTANCE.into(), json!(slot.instance));
    labels.insert(REVISION.into(), json!(rev.hash));
    if let Some(o) = slot.ordinal {
        labels.insert(INDEX.into(), json!(o.to_string()));
    }
    let mut annotations = t["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    annotations.insert(SHAPE.into(), json!(rev.shape));
    if let Some(s) = g.gang {
        let (l, a) = super::gang::pod_marks(&g.name, s);
        labels.extend(l);
        annotations.extend(a);
    }
    let mut env = vec![
        env_var("RBG_GROUP_NAME", &g.name),
        env_var("RBG_ROLE_NAME", &role.name),
        env_var("RBG_ROLE_INSTANCE_NAME", &slot.instance),
    ];
    if let Some(o) = slot.ordinal {
        env.push(env_var("RBG_ROLE_INDEX", o.to_string()));
    }
    if let Some(n) = role.hand_over_secs {
        env.push(env_var(HAND_OVER_ENV, n.to_string()));
    }
    let mut subdomain = true;
    if let Some((size, leader_only)) = lwp {
        let component = if slot.component == 0 {
            "leader"
        } else {
            "worker"
        };
        labels.insert(COMPONENT.into(), json!(component));
        labels.insert(COMPONENT_INDEX.into(), json!(slot.component.to_string()));
        labels.insert(COMPONENT_SIZE.into(), json!(size.to_string()));
        env.push(env_var(
            "RBG_LWP_LEADER_ADDRESS",
            format!("{}-0.{svc}.{}", slot.instance, g.namespace),
        ));
        env.push(env_var("RBG_LWP_WORKER_INDEX", slot.component.to_string()));
        env.push(env_var("RBG_LWP_GROUP_SIZE", size.to_string()));
        env.push(env_var("RBG_COMPONENT_NAME", component));
        env.push(env_var("RBG_COMPONENT_INDEX", slot.component.to_string()));
        subdomain = slot.component == 0 || !leader_only;
    }
    let spec = &mut t["spec"];
    if let Some(cs) = spec["containers"].as_array_mut() {
        for c in cs {
            let user = c["env"].as_array().cloned().unwrap_or_default();
            let mut merged = env.clone();
            merged.extend(
                user.into_iter()
                    .filter(|u| !env.iter().any(|e| e["name"] == u["name"])),
            );
            c["env"] = Value::Array(merged);
            let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
            if !mounts
                .iter()
                .any(|m| m["mountPath"] == CONFIG_DIR || m["name"] == CONFIG_VOLUME)
            {
                let mut m = mounts;
                m.push(json!({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": true}));
                c["volumeMounts"] = Value::Array(m);
            }
        }
    }
    // A stopping store hands its objects over before it exits: the kubelet waits for it.
    if let Some(n) = role.hand_over_secs {
        let asked = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        spec["terminationGracePeriodSeconds"] =
            json!(asked.max((n + HAND_OVER_GRACE_SLACK) as u64));
    }
    let mut volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    if !volumes.iter().any(|v| v["name"] == CONFIG_VOLUME) {
        volumes.push(json!({"name": CONFIG_VOLUME, "configMap": {"name": g.name,
            "items": [{"key": "config.yaml", "path": "config.yaml"}], "optional": true}}));
    }
    spec["volumes"] = Value::Array(volumes);
    if subdomain && name.len() <= 63 {
        spec["hostname"] = json!(name);
        spec["subdomain"] = json!(svc);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": g.namespace, "labels": labels,
                     "annotations": annotations, "ownerReferences": owner(g)},
        "spec": t["spec"],
    })
}

/// The headless Services of a role: `s-<group>-<role>` selecting its pods, and for v1alpha1
/// groups also `<group>-<role>` without a selector (its endpoints come from
/// `legacy_endpoints`, so per-pod names resolve under both Services).
pub fn services(g: &Group, role: &Role) -> Vec<Value> {
    let mut selector = Map::new();
    selector.insert(GROUP.into(), json!(g.name));
    selector.insert(ROLE.into(), json!(role.name));
    if let Pattern::LeaderWorker {
        leader_only_service: true,
        ..
    } = role.pattern
    {
        selector.insert(COMPONENT.into(), json!("leader"));
    }
    let ports: Vec<Value> = role
        .service_ports
        .iter()
        .map(|(n, p)| json!({"name": n.replace('_', "-"), "port": p, "protocol": "TCP"}))
        .collect();
    let svc = |name: String, selector: Option<&Map<String, Value>>| {
        let mut spec = json!({"clusterIP": "None", "publishNotReadyAddresses": true});
        if let Some(s) = selector {
            spec["selector"] = Value::Object(s.clone());
        }
        if !ports.is_empty() {
            spec["ports"] = Value::Array(ports.clone());
        }
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": g.namespace,
                            "labels": role_labels(g, &role.name), "ownerReferences": owner(g)},
               "spec": spec})
    };
    let mut out = vec![svc(service_name(&g.name, &role.name), Some(&selector))];
    if g.legacy {
        out.push(svc(legacy_service_name(&g.name, &role.name), None));
    }
    out
}

/// The EndpointSlice for a v1alpha1 group's `<group>-<role>` Service: one endpoint per pod
/// with an IP, named by its hostname, ready as the pod is. Addresses the API server refuses in
/// an EndpointSlice (loopback, link-local, ...) are left out and returned, described, so that
/// one such pod does not make the whole slice (and the group's reconcile) fail.
pub fn legacy_endpoints(g: &Group, role: &Role, pods: &[&Value]) -> (Value, Vec<String>) {
    let svc = legacy_service_name(&g.name, &role.name);
    let mut v6 = false;
    let mut endpoints: Vec<(String, Value)> = Vec::new();
    let mut skipped = Vec::new();
    for p in pods {
        let pod = Pod::of(p);
        let ip = pod.status.pod_ip;
        if ip.is_empty() {
            continue;
        }
        if let Err(why) = crate::kube::validation::endpoint_ip(ip) {
            skipped.push(format!("pod {}: {ip} {why}", pod.metadata.name));
            continue;
        }
        v6 |= ip.contains(':');
        let name = pod.metadata.name.to_string();
        let ready = pod.is_ready();
        let terminating = pod.metadata.is_terminating();
        let mut e = json!({"addresses": [ip],
            "conditions": {"ready": ready && !terminating, "serving": ready, "terminating": terminating},
            "targetRef": {"kind": "Pod", "name": name, "namespace": g.namespace,
                          "uid": pod.metadata.uid}});
        if name.len() <= 63 {
            e["hostname"] = json!(name);
        }
        endpoints.push((name, e));
    }
    endpoints.sort_by(|a, b| a.0.cmp(&b.0));
    let mut labels = role_labels(g, &role.name);
    labels.insert("kubernetes.io/service-name".into(), json!(svc));
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".into(),
        json!("rbgctl.workloads.x-k8s.io"),
    );
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": dns_trunc(&format!("{svc}-rbgctl")), "namespace": g.namespace,
                        "labels": labels, "ownerReferences": owner(g)},
           "addressType": if v6 {"IPv6"} else {"IPv4"},
           "endpoints": endpoints.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
           "ports": []});
    (slice, skipped)
}

fn role_ports(role: &Role) -> Map<String, Value> {
    let mut m = Map::new();
    if !role.service_ports.is_empty() {
        for (k, p) in &role.service_ports {
            m.insert(k.clone(), json!(p));
        }
        return m;
    }
    let spec = role
        .template
        .get("spec")
        .and_then(|s| PodSpec::deserialize(s).ok())
        .unwrap_or_default();
    for p in spec.containers.iter().flat_map(|c| &c.ports) {
        if !p.name.is_empty() && p.container_port != 0 {
            m.insert(
                p.name.to_lowercase().replace('-', "_"),
                json!(p.container_port),
            );
        }
    }
    m
}

/// `/etc/rbg/config.yaml`: every role's instances with an address that resolves (the
/// leader's, for leader-worker instances) and the role's ports. Stateless roles list the
/// instances that exist (`stateless` maps role to instance names).
pub fn discovery_config(g: &Group, stateless: &BTreeMap<String, Vec<String>>) -> String {
    let mut roles = Map::new();
    for role in &g.roles {
        let svc = service_name(&g.name, &role.name);
        let names: Vec<String> = if role.stateless {
            stateless.get(&role.name).cloned().unwrap_or_default()
        } else {
            (0..role.replicas)
                .map(|i| stateful_instance(&g.name, &role.name, i))
                .collect()
        };
        let ports = role_ports(role);
        let instances: Vec<Value> = names
            .iter()
            .map(|i| {
                json!({"address": format!("{}.{svc}", pod_name(role, i, 0)),
                       "ports": ports})
            })
            .collect();
        roles.insert(
            role.name.clone(),
            json!({"size": role.replicas, "instances": instances}),
        );
    }
    let doc = json!({
        "group": {"name": g.name, "size": g.roles.len(),
                  "roles": g.roles.iter().map(|r| r.name.clone()).collect::<Vec<_>>()},
        "roles": roles,
    });
    serde_yaml_ng::to_string(&doc).unwrap_or_default()
}

/// The group's discovery ConfigMap (`config.yaml`), named as the group.
pub fn config_map(g: &Group, config_yaml: &str) -> Value {
    let mut labels = Map::new();
    labels.insert(GROUP.into(), json!(g.name));
    labels.insert(GROUP_V1.into(), json!(g.name));
    labels.insert(MANAGED_BY.into(), json!(MANAGER));
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": g.name, "namespace": g.namespace, "labels": labels,
                        "ownerReferences": owner(g)},
           "data": {"config.yaml": config_yaml}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::model::parse_group;

    fn group() -> Group {
        parse_group(&json!({"metadata": {"name": "demo", "namespace": "ns", "uid": "u1"},
            "spec": {"roles": [
              {"name": "master", "replicas": 1, "servicePorts": [{"name": "rpc-port", "port": 50051}],
               "template": {"metadata": {"labels": {"app": "m"}}, "spec": {"containers": [
                 {"name": "m", "image": "rbgctl:1", "env": [{"name": "X", "value": "1"}],
                  "ports": [{"name": "http", "containerPort": 8080}]}]}}},
              {"name": "prefill", "replicas": 2, "leaderWorkerSet": {"size": 3,
                 "patchWorkerTemplate": {"metadata": {"labels": {"w": "y"}}}},
               "template": {"spec": {"containers": [{"name": "e", "image": "sim:1"}]}}}]}}))
        .unwrap()
    }

    #[test]
    fn pods_are_named_labelled_and_given_discovery() {
        let g = group();
        let role = &g.roles[0];
        let rev = revision(role);
        let slot = Slot {
            instance: stateful_instance("demo", "master", 0),
            ordinal: Some(0),
            component: 0,
        };
        let p = pod(&g, role, &rev, &slot);
        assert_eq!(p["metadata"]["name"], "demo-master-0");
        let l = &p["metadata"]["labels"];
        assert_eq!(
            (
                &l[GROUP],
                &l[ROLE],
                &l[GROUP_V1],
                &l[ROLE_V1],
                &l["app"],
                &l[INDEX]
            ),
            (
                &json!("demo"),
                &json!("master"),
                &json!("demo"),
                &json!("master"),
                &json!("m"),
                &json!("0")
            )
        );
        assert_eq!(p["spec"]["hostname"], "demo-master-0");
        assert_eq!(p["spec"]["subdomain"], "s-demo-master");
        let env = &p["spec"]["containers"][0]["env"];
        let names: Vec<&str> = env
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "RBG_GROUP_NAME",
                "RBG_ROLE_NAME",
                "RBG_ROLE_INSTANCE_NAME",
                "RBG_ROLE_INDEX",
                "X"
            ]
        );
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
            CONFIG_DIR
        );
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "u1");
    }

    #[test]
    fn leader_worker_pods_get_lwp_env_and_patches() {
        let g = group();
        let role = &g.roles[1];
        let rev = revision(role);
        let mk = |c| {
            pod(
                &g,
                role,
                &rev,
                &Slot {
                    instance: "demo-prefill-1".into(),
                    ordinal: Some(1),
                    component: c,
                },
            )
        };
        let (leader, worker) = (mk(0), mk(2));
        assert_eq!(leader["metadata"]["name"], "demo-prefill-1-0");
        assert_eq!(worker["metadata"]["name"], "demo-prefill-1-2");
        assert_eq!(worker["metadata"]["labels"]["w"], "y");
        assert!(leader["metadata"]["labels"].get("w").is_none());
        let env = |p: &Value, n: &str| {
            p["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == n)
                .map(|e| e["value"].clone())
        };
        assert_eq!(
            env(&worker, "RBG_LWP_LEADER_ADDRESS"),
            Some(json!("demo-prefill-1-0.s-demo-prefill.ns"))
        );
        assert_eq!(env(&worker, "RBG_LWP_WORKER_INDEX"), Some(json!("2")));
        assert_eq!(env(&leader, "RBG_LWP_GROUP_SIZE"), Some(json!("3")));
        // v1alpha1 leaderWorkerSet: every pod is addressable.
        assert_eq!(worker["spec"]["subdomain"], "s-demo-prefill");
    }

    #[test]
    fn revision_shape_ignores_images_only() {
        let g = group();
        let mut role = g.roles[0].clone();
        let a = revision(&role);
        role.template["spec"]["containers"][0]["image"] = json!("rbgctl:2");
        let b = revision(&role);
        assert_ne!(a.hash, b.hash);
        assert_eq!(a.shape, b.shape);
        role.template["spec"]["containers"][0]["args"] = json!(["--x"]);
        let c = revision(&role);
        assert_ne!(b.shape, c.shape);
        let mut scaled = g.roles[0].clone();
        scaled.replicas = 9;
        assert_eq!(
            revision(&scaled),
            a,
            "replicas are not part of the revision"
        );
    }

    #[test]
    fn services_and_discovery_file() {
        let g = group();
        let s = services(&g, &g.roles[0]);
        assert_eq!(s.len(), 2, "v1alpha1 groups get both names");
        assert_eq!(s[0]["metadata"]["name"], "s-demo-master");
        assert_eq!(s[0]["spec"]["clusterIP"], "None");
        assert_eq!(s[0]["spec"]["selector"][GROUP], "demo");
        assert_eq!(s[1]["metadata"]["name"], "demo-master");
        assert!(s[1]["spec"].get("selector").is_none());
        let y = discovery_config(&g, &BTreeMap::new());
        let v: Value = serde_yaml_ng::from_str(&y).unwrap();
        assert_eq!(v["group"]["size"], 2);
        assert_eq!(
            v["roles"]["master"]["instances"][0]["address"],
            "demo-master-0.s-demo-master"
        );
        assert_eq!(
            v["roles"]["master"]["instances"][0]["ports"]["rpc_port"],
            50051
        );
        assert_eq!(
            v["roles"]["prefill"]["instances"][1]["address"],
            "demo-prefill-1-0.s-demo-prefill"
        );
        let long = "x".repeat(70);
        assert_eq!(service_name(&long, "r").len(), 63);
        let pods = [json!({"metadata": {"name": "demo-master-0", "uid": "p"},
            "status": {"podIP": "10.0.0.9", "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}})];
        let (es, skipped) = legacy_endpoints(&g, &g.roles[0], &pods.iter().collect::<Vec<_>>());
        assert!(skipped.is_empty());
        assert_eq!(es["endpoints"][0]["hostname"], "demo-master-0");
        assert_eq!(
            es["metadata"]["labels"]["kubernetes.io/service-name"],
            "demo-master"
        );
        assert_eq!(es["endpoints"][0]["conditions"]["ready"], true);
    }
}
