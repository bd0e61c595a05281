//! An in-process stand-in for kube-apiserver, for tests and benchmarks of the operator and
//! the router's pod discovery. It follows the real server's semantics for what rbgctl uses;
//! `docs/operator.md` lists them. In short:
//!
//! - Resources: pods, services, configmaps, events (core/v1), endpointslices
//!   (discovery.k8s.io/v1), leases (coordination.k8s.io/v1), controllerrevisions (apps/v1),
//!   rolebasedgroups (workloads.x-k8s.io v1alpha1 and v1alpha2, one stored object served at
//!   both versions as a CRD with conversion strategy `None` does), coordinatedpolicies,
//!   rolebasedgroupscalingadapters and rolebasedgroupsets (v1alpha2).
//! - One global resourceVersion counter; every write bumps it. uid, creationTimestamp and
//!   generation are server-owned; generation moves only when something outside metadata and
//!   status changes.
//! - GET, LIST (label selectors, `metadata.name` field selector, `limit`/`continue`), POST
//!   (409 AlreadyExists, `generateName`), PUT (409 Conflict on a stale resourceVersion),
//!   PATCH (merge, JSON, strategic merge; server-side apply is refused with 415), DELETE
//!   (uid/resourceVersion preconditions; finalizers turn a delete into a deletionTimestamp
//!   and the object goes when the last finalizer is removed).
//! - The status subresource: writes to the object ignore `status`, writes to `/status`
//!   change only `status`.
//! - Pod spec is immutable except container images (422 otherwise), like the real server.
//! - WATCH from a resourceVersion: history replay, label-selector transitions as
//!   ADDED/DELETED, bookmarks when asked, `timeoutSeconds`, and `410 Gone` as an ERROR
//!   event once the history is compacted past the requested version.
//! - The `scale` subresource (autoscaling/v1 Scale) of the CRDs that declare one
//!   (rolebasedgroupscalingadapters, rolebasedgroupsets), and discovery (`/api`, `/apis`,
//!   resource lists with short names), so `kubectl scale rbgsa/NAME` works against it.
//! - Not done: owner-reference garbage collection (deleting an owner leaves its children,
//!   which is why the operator has a finalizer), admission webhooks, RBAC, server-side apply.
//!
//! A simulated kubelet (`Kubelet`) can run pods: it schedules them, gives them a loopback
//! IP, marks them Running and Ready (unless held), restarts containers whose image changed
//! (restartCount + 1, new imageID) and removes terminating pods after a grace delay.
//!
//! Parts: `resources` (what is served, and validation), `storage` (objects, resourceVersion,
//! history, the write rules), `watch` (watchers and event delivery), `http` (paths, queries
//! and the handler), `kubelet` (the SIMULATED kubelet).

use crate::kube::patch;
use crate::kube::selector::Selector;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

mod http;
mod kubelet;
mod resources;
mod scheduler;
mod storage;
mod watch;

use http::*;
pub use kubelet::{Kubelet, KubeletConfig};
use resources::*;
pub use resources::{Resource, RESOURCES};
use storage::*;
use watch::*;

/// Requests served, by verb; writes by resource; and writes other than to Leases by
/// User-Agent (which shows who acts, leader election aside).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub by_verb: BTreeMap<String, u64>,
    /// Every request, by the client's user agent.
    pub requests_by_agent: BTreeMap<String, u64>,
    pub writes_by_agent: BTreeMap<String, u64>,
    pub writes_by_resource: BTreeMap<String, u64>,
    /// Writes answered with an injected fault (`fail`), by the path they matched.
    pub write_faults: BTreeMap<String, u64>,
}

impl Counts {
    /// Requests of every verb.
    pub fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }
    /// Requests that change something (create, update, patch, delete).
    pub fn writes(&self) -> u64 {
        ["create", "update", "patch", "delete"]
            .iter()
            .map(|v| self.by_verb.get(*v).copied().unwrap_or(0))
            .sum()
    }

    /// Writes to anything but Leases (leader election renews its Lease all the time).
    pub fn writes_except_leases(&self) -> u64 {
        self.writes_by_resource
            .iter()
            .filter(|(r, _)| r.as_str() != "leases")
            .map(|(_, n)| n)
            .sum()
    }
}

/// The shared state; cheap to clone.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Mutex<Inner>>,
}

/// An error the API server stand-in answers with, as the real one words it.
#[derive(Debug)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// What failed, in `details.causes` (the message then says only that the request was
    /// rejected).
    pub cause: Option<String>,
}

fn api_err(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        reason,
        message: message.into(),
        cause: None,
    }
}

/// A JSON patch that did not apply, as the real API server answers it: 422, a generic message,
/// the patch library's words as the cause (`NewGenericServerResponse`).
fn patch_failed(why: impl Into<String>) -> ApiError {
    ApiError {
        cause: Some(why.into()),
        ..api_err(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
    }
}

impl ApiError {
    fn status(&self) -> Value {
        let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code});
        if let Some(cause) = &self.cause {
            s["details"] =
                json!({"causes": [{"type": "UnexpectedServerResponse", "message": cause}]});
        }
        s
    }
}

impl Default for ApiServer {
    fn default() -> Self {
        ApiServer::new()
    }
}

impl ApiServer {
    /// An empty API server: no objects, the built-in resources and the RBG CRDs known.
    pub fn new() -> ApiServer {
        ApiServer {
            inner: Arc::new(Mutex::new(Inner {
                rv: 1000,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: 100_000,
                compacted: 0,
                watchers: Vec::new(),
                watches_stalled: false,
                counts: Counts::default(),
                race_next_write: Vec::new(),
                fail_paths: Vec::new(),
                uninstalled: Vec::new(),
            })),
        }
    }

    /// A resource by its full name (`podgroups.scheduling.volcano.sh`), or by its plural
    /// alone where that names one.
    fn resource(id: &str) -> Option<&'static Resource> {
        RESOURCES
            .iter()
            .find(|r| r.name == id)
            .or_else(|| RESOURCES.iter().find(|r| r.plural == id))
    }

    /// The requests served so far, by verb and by writing agent.
    pub fn counts(&self) -> Counts {
        self.inner.lock().counts.clone()
    }

    /// Starts the request counts from zero.
    pub fn reset_counts(&self) {
        self.inner.lock().counts = Counts::default();
    }

    /// Drops the event history: a watch from any earlier resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        let mut i = self.inner.lock();
        i.compacted = i.rv;
        i.history.clear();
    }

    /// Ends every open watch, as an API server restart or a load balancer timeout does.
    pub fn break_watches(&self) {
        let mut i = self.inner.lock();
        i.watchers.clear();
        i.watches_stalled = false;
    }

    /// The open watches' connections stall: they stay open but carry no event until
    /// `break_watches`, so their clients miss what happens meanwhile (and, after `compact`,
    /// resume from a version that is gone).
    pub fn stall_watches(&self) {
        self.inner.lock().watches_stalled = true;
    }

    /// Watches still open (their client has not gone).
    pub fn open_watches(&self) -> usize {
        let mut i = self.inner.lock();
        i.watchers.retain(|w| !w.tx.is_closed());
        i.watchers.len()
    }

    /// Before the next write to a path containing `path`, another client updates the object
    /// (its resourceVersion moves), so a write carrying the old version gets 409 Conflict.
    pub fn race_next_write(&self, path: &str) {
        self.inner.lock().race_next_write.push(path.to_string());
    }

    /// Requests to paths containing `path` fail with 500 until `heal`.
    pub fn fail(&self, path: &str) {
        self.inner.lock().fail_paths.push(path.to_string());
    }

    /// Serves the resource `name` (`podgroups.scheduling.x-k8s.io`) as if its CRD were not
    /// installed: every request for it gets 404, as from a real server without the CRD.
    pub fn uninstall(&self, name: &str) {
        if let Some(r) = RESOURCES.iter().find(|r| r.name == name) {
            self.inner.lock().uninstalled.push(r.name);
        }
    }

    /// Ends every failure set up with `fail`: requests are served again.
    pub fn heal(&self) {
        self.inner.lock().fail_paths.clear();
    }

    /// The object `ns/name` of resource `plural`, if there is one.
    pub fn get(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let r = Self::resource(plural)?;
        self.inner
            .lock()
            .objects
            .get(&(r.name, ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of a type in a namespace matching a label selector.
    pub fn list(&self, plural: &str, ns: &str, selector: &str) -> Vec<Value> {
        let Some(r) = Self::resource(plural) else {
            return Vec::new();
        };
        let sel = Selector::parse(selector).unwrap_or_default();
        self.inner
            .lock()
            .objects
            .iter()
            .filter(|((p, n, _), o)| *p == r.name && n == ns && sel.matches(o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Creates an object directly (as `kubectl apply` of a new object would).
    pub fn create(&self, plural: &str, ns: &str, obj: Value) -> Result<Value, ApiError> {
        let r = Self::resource(plural).ok_or_else(|| api_err(404, "NotFound", plural))?;
        let version = r.versions[0];
        self.inner.lock().create(r, version, ns, obj)
    }

    /// Applies a JSON patch as a client would (`kubectl patch --type=json`).
    pub fn json_patch(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        ops: Value,
    ) -> Result<Value, ApiError> {
        self.patch_as(plural, ns, name, false, "application/json-patch+json", &ops)
    }

    /// Applies a merge patch to the object or, with `status`, to its status subresource.
    pub fn merge_patch(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        status: bool,
        p: Value,
    ) -> Result<Value, ApiError> {
        self.patch_as(plural, ns, name, status, "application/merge-patch+json", &p)
    }

    fn patch_as(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        status: bool,
        content_type: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let r = Self::resource(plural).ok_or_else(|| api_err(404, "NotFound", plural))?;
        self.inner
            .lock()
            .patch(r, r.versions[0], ns, name, status, content_type, body)
    }

    /// Sets `spec.replicas` through the `scale` subresource, as `kubectl scale` or a
    /// HorizontalPodAutoscaler does; returns the Scale.
    pub fn scale(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        replicas: i64,
    ) -> Result<Value, ApiError> {
        let r = Self::resource(plural).ok_or_else(|| api_err(404, "NotFound", plural))?;
        self.inner.lock().write_scale(
            r,
            r.versions[0],
            ns,
            name,
            Some("application/merge-patch+json"),
            &json!({"spec": {"replicas": replicas}}),
        )
    }

    /// Deletes the object `ns/name` of resource `plural` as a client's DELETE would (finalizers
    /// and owners honoured); answers what is left of it.
    pub fn delete(&self, plural: &str, ns: &str, name: &str) -> Result<Value, ApiError> {
        let r = Self::resource(plural).ok_or_else(|| api_err(404, "NotFound", plural))?;
        self.inner
            .lock()
            .delete(r, r.versions[0], ns, name, &Value::Null)
    }

    /// A kubeconfig that points at the stand-in on `port`, with `namespace` as its default.
    pub fn kubeconfig(port: u16, namespace: &str) -> String {
        format!(
            "current-context: t\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: t\n  context:\n    cluster: c\n    user: u\n    namespace: {namespace}\n"
        )
    }

    /// Serves HTTP on a free loopback port from a runtime thread of its own.
    pub fn serve(&self) -> std::io::Result<u16> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let state = self.clone();
        std::thread::Builder::new()
            .name("api-standin".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(_) => return,
                };
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let bookmarks = state.clone();
                    tokio::spawn(async move {
                        let mut t = tokio::time::interval(Duration::from_millis(500));
                        loop {
                            t.tick().await;
                            bookmarks.inner.lock().send_bookmarks();
                        }
                    });
                    let app = axum::Router::new().fallback(handle).with_state(state);
                    let _ = axum::serve(listener, app).await;
                });
            })?;
        Ok(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_resources_versions_and_subresources() {
        let t =
            parse_path("/apis/workloads.x-k8s.io/v1alpha1/namespaces/ns/rolebasedgroups/g/status")
                .unwrap();
        assert_eq!(
            (
                t.r.kind,
                t.version.as_str(),
                t.ns.as_deref(),
                t.name.as_deref(),
                t.status
            ),
            ("RoleBasedGroup", "v1alpha1", Some("ns"), Some("g"), true)
        );
        let t = parse_path("/api/v1/pods").unwrap();
        assert_eq!((t.r.plural, t.ns, t.name), ("pods", None, None));
        assert!(parse_path("/api/v1/namespaces/ns/configmaps/x/status").is_none());
        assert!(parse_path("/apis/apps/v2/namespaces/ns/controllerrevisions").is_none());
    }

    #[test]
    fn writes_follow_resource_version_generation_and_status_rules() {
        let api = ApiServer::new();
        let g = api
            .create(
                "rolebasedgroups",
                "ns",
                json!({"metadata": {"name": "g"}, "spec": {"roles": []}, "status": {"x": 1}}),
            )
            .unwrap();
        assert_eq!(g["status"], json!({}), "status is not set by create");
        assert_eq!(g["metadata"]["generation"], 1);
        let mut inner = api.inner.lock();
        let r = ApiServer::resource("rolebasedgroups").unwrap();
        // Status through the subresource: generation stays.
        let mut s = g.clone();
        s["status"] = json!({"observedGeneration": 1});
        let s = inner.update(r, "v1alpha2", "ns", "g", true, s).unwrap();
        assert_eq!(s["metadata"]["generation"], 1);
        // A stale resourceVersion is a conflict.
        let e = inner
            .update(r, "v1alpha2", "ns", "g", false, g.clone())
            .unwrap_err();
        assert_eq!(e.code, 409);
        // A label change keeps generation, a spec change bumps it.
        let mut l = s.clone();
        l["metadata"]["labels"] = json!({"a": "b"});
        let l = inner.update(r, "v1alpha2", "ns", "g", false, l).unwrap();
        assert_eq!(l["metadata"]["generation"], 1);
        assert_eq!(
            l["status"]["observedGeneration"], 1,
            "object writes keep status"
        );
        let p = inner
            .patch(
                r,
                "v1alpha1",
                "ns",
                "g",
                false,
                "application/merge-patch+json",
                &json!({"spec": {"roles": [{"name": "a"}]}}),
            )
            .unwrap();
        assert_eq!(p["metadata"]["generation"], 2);
        assert_eq!(p["apiVersion"], "workloads.x-k8s.io/v1alpha1");
        // Finalizers hold a delete until removed.
        let f = inner
            .patch(
                r,
                "v1alpha2",
                "ns",
                "g",
                false,
                "application/merge-patch+json",
                &json!({"metadata": {"finalizers": ["x/y"]}}),
            )
            .unwrap();
        let d = inner
            .delete(r, "v1alpha2", "ns", "g", &Value::Null)
            .unwrap();
        assert!(d["metadata"]["deletionTimestamp"].is_string());
        assert!(f["metadata"]["deletionTimestamp"].is_null());
        inner
            .patch(
                r,
                "v1alpha2",
                "ns",
                "g",
                false,
                "application/merge-patch+json",
                &json!({"metadata": {"finalizers": null}}),
            )
            .unwrap();
        assert!(!inner
            .objects
            .contains_key(&("rolebasedgroups", "ns".into(), "g".into())));
        let e = inner
            .patch(
                r,
                "v1alpha2",
                "ns",
                "g",
                false,
                "application/apply-patch+yaml",
                &json!({}),
            )
            .unwrap_err();
        assert_eq!(e.code, 404);
    }

    #[test]
    fn the_scale_subresource_reads_and_writes_the_declared_paths() {
        let api = ApiServer::new();
        let e = api
            .create(
                "rolebasedgroupscalingadapters",
                "ns",
                json!({"metadata": {"name": "a"}, "spec": {"scaleTargetRef": {"name": "g"}}}),
            )
            .unwrap_err();
        assert!(e.message.contains("scaleTargetRef.role"), "{}", e.message);
        api.create(
            "rolebasedgroupscalingadapters",
            "ns",
            json!({"metadata": {"name": "a"},
                   "spec": {"replicas": 2, "scaleTargetRef": {"name": "g", "role": "r"}}}),
        )
        .unwrap();
        api.merge_patch(
            "rolebasedgroupscalingadapters",
            "ns",
            "a",
            true,
            json!({"status": {"replicas": 2, "selector": "x=y"}}),
        )
        .unwrap();
        let s = api
            .scale("rolebasedgroupscalingadapters", "ns", "a", 5)
            .unwrap();
        assert_eq!(s["kind"], "Scale");
        assert_eq!(s["apiVersion"], "autoscaling/v1");
        assert_eq!(s["spec"]["replicas"], 5);
        assert_eq!(s["status"], json!({"replicas": 2, "selector": "x=y"}));
        let a = api.get("rolebasedgroupscalingadapters", "ns", "a").unwrap();
        assert_eq!(a["spec"]["replicas"], 5);
        assert_eq!(a["metadata"]["generation"], 2, "a scale is a spec change");
        let e = api
            .scale("rolebasedgroupscalingadapters", "ns", "a", -1)
            .unwrap_err();
        assert_eq!(e.code, 422);
        let e = api.scale("configmaps", "ns", "a", 1).unwrap_err();
        assert_eq!(e.code, 404);
        // Sets default to one replica, as the CRD's schema says.
        let set = api
            .create(
                "rolebasedgroupsets",
                "ns",
                json!({"metadata": {"name": "s"},
                       "spec": {"groupTemplate": {"spec": {"roles": [{"name": "r"}]}}}}),
            )
            .unwrap();
        assert_eq!(set["spec"]["replicas"], 1);
        assert!(parse_path(
            "/apis/workloads.x-k8s.io/v1alpha2/namespaces/ns/rolebasedgroups/g/scale"
        )
        .is_none());
    }

    #[test]
    fn discovery_names_short_names_and_the_scale_subresource() {
        let apis = discovery("/apis").unwrap();
        assert!(apis["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "workloads.x-k8s.io"
                && g["preferredVersion"]["version"] == "v1alpha2"));
        let list = discovery("/apis/workloads.x-k8s.io/v1alpha2").unwrap();
        let rs = list["resources"].as_array().unwrap();
        assert!(rs
            .iter()
            .any(|r| r["name"] == "rolebasedgroupscalingadapters"
                && r["shortNames"] == json!(["rbgsa"])));
        assert!(rs
            .iter()
            .any(|r| r["name"] == "rolebasedgroupsets/scale" && r["kind"] == "Scale"));
        assert!(discovery("/api/v1").is_some());
        assert!(discovery("/apis/workloads.x-k8s.io/v9").is_none());
    }

    #[test]
    fn pod_specs_are_immutable_except_images() {
        let api = ApiServer::new();
        api.create(
            "pods",
            "ns",
            json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "a:1", "args": ["x"]}]}}),
        )
        .unwrap();
        api.json_patch(
            "pods",
            "ns",
            "p",
            json!([{"op": "replace", "path": "/spec/containers/0/image", "value": "a:2"}]),
        )
        .unwrap();
        let e = api
            .json_patch(
                "pods",
                "ns",
                "p",
                json!([{"op": "replace", "path": "/spec/containers/0/args", "value": ["y"]}]),
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        let e = api
            .create(
                "pods",
                "ns",
                json!({"metadata": {"name": "Bad_Name"},
                "spec": {"containers": [{"name": "c", "image": "a"}]}}),
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
    }
}
