//! An in-process stand-in for kube-apiserver, for tests and benchmarks of the operator and
//! the router's pod discovery. It follows the real server's semantics for what rbgctl uses;
//! `docs/operator.md` lists them. In short:
//!
//! - Resources: pods, services, configmaps, events (core/v1), endpointslices
//!   (discovery.k8s.io/v1), leases (coordination.k8s.io/v1), controllerrevisions (apps/v1),
//!   rolebasedgroups (workloads.x-k8s.io v1alpha1 and v1alpha2, one stored object served at
//!   both versions as a CRD with conversion strategy `None` does) and coordinatedpolicies.
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
//! - Not done: owner-reference garbage collection (deleting an owner leaves its children,
//!   which is why the operator has a finalizer), admission webhooks, RBAC, server-side apply.
//!
//! A simulated kubelet (`Kubelet`) can run pods: it schedules them, gives them a loopback
//! IP, marks them Running and Ready (unless held), restarts containers whose image changed
//! (restartCount + 1, new imageID) and removes terminating pods after a grace delay.

use crate::kube::patch;
use crate::kube::selector::Selector;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A resource type the stand-in serves.
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    pub group: &'static str,
    pub versions: &'static [&'static str],
    pub plural: &'static str,
    pub kind: &'static str,
    pub status: bool,
}

pub const RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        versions: &["v1"],
        plural: "pods",
        kind: "Pod",
        status: true,
    },
    Resource {
        group: "",
        versions: &["v1"],
        plural: "services",
        kind: "Service",
        status: true,
    },
    Resource {
        group: "",
        versions: &["v1"],
        plural: "configmaps",
        kind: "ConfigMap",
        status: false,
    },
    Resource {
        group: "",
        versions: &["v1"],
        plural: "events",
        kind: "Event",
        status: false,
    },
    Resource {
        group: "discovery.k8s.io",
        versions: &["v1"],
        plural: "endpointslices",
        kind: "EndpointSlice",
        status: false,
    },
    Resource {
        group: "coordination.k8s.io",
        versions: &["v1"],
        plural: "leases",
        kind: "Lease",
        status: false,
    },
    Resource {
        group: "apps",
        versions: &["v1"],
        plural: "controllerrevisions",
        kind: "ControllerRevision",
        status: false,
    },
    Resource {
        group: "workloads.x-k8s.io",
        versions: &["v1alpha2", "v1alpha1"],
        plural: "rolebasedgroups",
        kind: "RoleBasedGroup",
        status: true,
    },
    Resource {
        group: "workloads.x-k8s.io",
        versions: &["v1alpha2"],
        plural: "coordinatedpolicies",
        kind: "CoordinatedPolicy",
        status: true,
    },
];

fn api_version(r: &Resource, version: &str) -> String {
    if r.group.is_empty() {
        version.to_string()
    } else {
        format!("{}/{version}", r.group)
    }
}

type Key = (&'static str, String, String); // plural, namespace, name

#[derive(Clone)]
struct Event {
    rv: u64,
    plural: &'static str,
    ns: String,
    kind: &'static str,
    old: Option<Value>,
    obj: Value,
}

struct Watcher {
    plural: &'static str,
    version: String,
    ns: Option<String>,
    selector: Selector,
    name: Option<String>,
    bookmarks: bool,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// Requests served, by verb; writes by resource; and writes other than to Leases by
/// User-Agent (which shows who acts, leader election aside).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub by_verb: BTreeMap<String, u64>,
    /// Every request, by the client's user agent.
    pub requests_by_agent: BTreeMap<String, u64>,
    pub writes_by_agent: BTreeMap<String, u64>,
    pub writes_by_resource: BTreeMap<String, u64>,
}

impl Counts {
    pub fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }
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

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Event>,
    history_limit: usize,
    /// Events at or below this version are gone (watching from there is 410 Gone).
    compacted: u64,
    watchers: Vec<Watcher>,
    counts: Counts,
    /// Paths whose next write is preceded by a concurrent writer's update (a 409 test hook).
    race_next_write: Vec<String>,
    /// Requests whose path contains one of these fail with 500 (a fault hook).
    fail_paths: Vec<String>,
}

/// The shared state; cheap to clone.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

fn api_err(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        reason,
        message: message.into(),
    }
}

impl ApiError {
    fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

fn label_value_ok(v: &str) -> bool {
    v.len() <= 63
        && (v.is_empty()
            || (v.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && v.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// Validation the real server does for the fields rbgctl writes.
fn validate(r: &Resource, obj: &Value) -> Result<(), ApiError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let bad = |m: String| {
        api_err(
            422,
            "Invalid",
            format!("{} {name:?} is invalid: {m}", r.kind),
        )
    };
    if !is_dns_subdomain(name) {
        return Err(bad(
            "metadata.name: must be a lowercase RFC 1123 subdomain".into()
        ));
    }
    if r.plural == "services"
        && !(is_dns_label(name) && name.starts_with(|c: char| c.is_ascii_lowercase()))
    {
        return Err(bad("metadata.name: must be a DNS-1035 label".into()));
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let v = v
                .as_str()
                .ok_or_else(|| bad(format!("label {k}: not a string")))?;
            if !label_value_ok(v) {
                return Err(bad(format!("metadata.labels[{k}]: invalid value {v:?}")));
            }
        }
    }
    if r.plural == "pods" {
        let containers = obj
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| bad("spec.containers: Required value".into()))?;
        for c in containers {
            if c.get("image")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                return Err(bad("spec.containers[].image: Required value".into()));
            }
        }
        for f in ["hostname", "subdomain"] {
            if let Some(h) = obj.pointer(&format!("/spec/{f}")).and_then(Value::as_str) {
                if !is_dns_label(h) {
                    return Err(bad(format!("spec.{f}: must be a DNS label")));
                }
            }
        }
    }
    Ok(())
}

/// A pod's spec with container images blanked: the part the real server keeps immutable.
fn pod_spec_sans_images(spec: &Value) -> Value {
    let mut s = spec.clone();
    for list in ["containers", "initContainers"] {
        if let Some(cs) = s.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(o) = c.as_object_mut() {
                    o.remove("image");
                }
            }
        }
    }
    s
}

/// Everything but metadata and status (what moves `metadata.generation`).
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    o
}

impl Default for ApiServer {
    fn default() -> Self {
        ApiServer::new()
    }
}

impl ApiServer {
    pub fn new() -> ApiServer {
        ApiServer {
            inner: Arc::new(Mutex::new(Inner {
                rv: 1000,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: 100_000,
                compacted: 0,
                watchers: Vec::new(),
                counts: Counts::default(),
                race_next_write: Vec::new(),
                fail_paths: Vec::new(),
            })),
        }
    }

    fn resource(plural: &str) -> Option<&'static Resource> {
        RESOURCES.iter().find(|r| r.plural == plural)
    }

    pub fn counts(&self) -> Counts {
        self.inner.lock().counts.clone()
    }

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
        self.inner.lock().watchers.clear();
    }

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

    pub fn heal(&self) {
        self.inner.lock().fail_paths.clear();
    }

    pub fn get(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let r = Self::resource(plural)?;
        self.inner
            .lock()
            .objects
            .get(&(r.plural, ns.to_string(), name.to_string()))
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
            .filter(|((p, n, _), o)| *p == r.plural && n == ns && sel.matches(o))
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

/// Where a request goes.
struct Target {
    r: &'static Resource,
    version: String,
    ns: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(*s)),
        _ => return None,
    };
    let r = RESOURCES
        .iter()
        .find(|r| r.plural == plural && r.group == group && r.versions.contains(&version))?;
    let status = match sub {
        None => false,
        Some("status") if r.status => true,
        Some(_) => return None,
    };
    Some(Target {
        r,
        version: version.to_string(),
        ns,
        name,
        status,
    })
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    Some((decode(k)?, decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn reply(code: u16, v: Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(v)).into_response()
}

struct Events {
    rx: mpsc::UnboundedReceiver<Bytes>,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Events {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

async fn handle(
    State(api): State<ApiServer>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let Some(t) = parse_path(&path) else {
        return reply(
            404,
            api_err(404, "NotFound", format!("no route {path}")).status(),
        );
    };
    let q = query(&uri);
    let agent = headers
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let mut inner = api.inner.lock();
    if inner.fail_paths.iter().any(|p| path.contains(p.as_str())) {
        return reply(
            500,
            api_err(500, "InternalError", "injected fault").status(),
        );
    }
    let watch = q.get("watch").is_some_and(|v| v == "1" || v == "true");
    let verb = match (&method, &t.name, watch) {
        (&Method::GET, _, true) => "watch",
        (&Method::GET, None, false) => "list",
        (&Method::GET, Some(_), false) => "get",
        (&Method::POST, _, _) => "create",
        (&Method::PUT, _, _) => "update",
        (&Method::PATCH, _, _) => "patch",
        (&Method::DELETE, _, _) => "delete",
        _ => "other",
    };
    *inner.counts.by_verb.entry(verb.to_string()).or_default() += 1;
    *inner
        .counts
        .requests_by_agent
        .entry(agent.clone())
        .or_default() += 1;
    if matches!(verb, "create" | "update" | "patch" | "delete") {
        if t.r.plural != "leases" {
            *inner.counts.writes_by_agent.entry(agent).or_default() += 1;
        }
        *inner
            .counts
            .writes_by_resource
            .entry(t.r.plural.to_string())
            .or_default() += 1;
        if let Some(i) = inner
            .race_next_write
            .iter()
            .position(|p| path.contains(p.as_str()))
        {
            inner.race_next_write.remove(i);
            if let (Some(ns), Some(name)) = (&t.ns, &t.name) {
                inner.touch(t.r, ns, name);
            }
        }
    }
    let parsed_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&body)
            .map_err(|e| api_err(400, "BadRequest", format!("body is not JSON: {e}")))
    };
    let ns = t.ns.clone().unwrap_or_default();
    let result = match (verb, &t.name) {
        ("watch", _) => {
            return match inner.watch(&t, &q) {
                Ok((rx, timeout)) => Response::new(Body::new(Events {
                    rx,
                    deadline: Box::pin(tokio::time::sleep(timeout)),
                })),
                Err(e) => reply(e.code, e.status()),
            };
        }
        ("list", _) => inner.list(&t, &q),
        ("get", Some(name)) => inner
            .objects
            .get(&(t.r.plural, ns.clone(), name.clone()))
            .map(|o| inner.served(t.r, &t.version, o))
            .ok_or_else(|| {
                api_err(
                    404,
                    "NotFound",
                    format!("{} {name:?} not found", t.r.plural),
                )
            }),
        ("create", None) if t.ns.is_some() && !t.status => {
            parsed_body().and_then(|b| inner.create(t.r, &t.version, &ns, b))
        }
        ("update", Some(name)) if t.ns.is_some() => {
            parsed_body().and_then(|b| inner.update(t.r, &t.version, &ns, name, t.status, b))
        }
        ("patch", Some(name)) if t.ns.is_some() => {
            parsed_body().and_then(|b| inner.patch(t.r, &t.version, &ns, name, t.status, &ct, &b))
        }
        ("delete", Some(name)) if t.ns.is_some() => {
            let opts = serde_json::from_slice(&body).unwrap_or(Value::Null);
            inner.delete(t.r, &t.version, &ns, name, &opts)
        }
        _ => Err(api_err(405, "MethodNotAllowed", format!("{method} {path}"))),
    };
    match result {
        Ok(v) => reply(if verb == "create" { 201 } else { 200 }, v),
        Err(e) => reply(e.code, e.status()),
    }
}

impl Inner {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// The object as served at a version (conversion strategy None: only apiVersion moves).
    fn served(&self, r: &Resource, version: &str, o: &Value) -> Value {
        let mut o = o.clone();
        o["apiVersion"] = json!(api_version(r, version));
        o["kind"] = json!(r.kind);
        o
    }

    fn record(
        &mut self,
        r: &'static Resource,
        ns: &str,
        kind: &'static str,
        old: Option<Value>,
        obj: Value,
    ) {
        let rv = self.rv;
        let ev = Event {
            rv,
            plural: r.plural,
            ns: ns.to_string(),
            kind,
            old,
            obj,
        };
        self.deliver(r, &ev);
        self.history.push_back(ev);
        while self.history.len() > self.history_limit {
            if let Some(e) = self.history.pop_front() {
                self.compacted = e.rv;
            }
        }
    }

    fn deliver(&mut self, r: &Resource, ev: &Event) {
        let mut lines = Vec::new();
        for (i, w) in self.watchers.iter().enumerate() {
            if let Some(line) = filter_event(r, w, ev) {
                lines.push((i, line));
            }
        }
        let mut dead = HashSet::new();
        for (i, line) in lines {
            if self.watchers[i].tx.send(line).is_err() {
                dead.insert(i);
            }
        }
        if !dead.is_empty() {
            let mut i = 0;
            self.watchers.retain(|_| {
                i += 1;
                !dead.contains(&(i - 1))
            });
        }
    }

    fn send_bookmarks(&mut self) {
        let rv = self.rv.to_string();
        self.watchers.retain(|w| {
            if !w.bookmarks {
                return !w.tx.is_closed();
            }
            let r = RESOURCES.iter().find(|r| r.plural == w.plural);
            let (api, kind) = r
                .map(|r| (api_version(r, &w.version), r.kind))
                .unwrap_or_default();
            let ev = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api,
                            "metadata": {"resourceVersion": rv}}});
            w.tx.send(Bytes::from(format!("{ev}\n"))).is_ok()
        });
    }

    fn touch(&mut self, r: &'static Resource, ns: &str, name: &str) {
        let key = (r.plural, ns.to_string(), name.to_string());
        if let Some(old) = self.objects.get(&key).cloned() {
            let rv = self.next_rv();
            let mut o = old.clone();
            o["metadata"]["resourceVersion"] = json!(rv.to_string());
            o["metadata"]["annotations"]["standin.rbgctl/touched"] = json!(rv.to_string());
            self.objects.insert(key, o.clone());
            self.record(r, ns, "MODIFIED", Some(old), o);
        }
    }

    fn list(&self, t: &Target, q: &HashMap<String, String>) -> Result<Value, ApiError> {
        let sel = Selector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
            .map_err(|e| api_err(400, "BadRequest", e.to_string()))?;
        let name = field_name(q)?;
        let limit: usize = q
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX);
        let (skip, rv) = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(c) => {
                let (s, rv) = c
                    .split_once(':')
                    .and_then(|(s, rv)| Some((s.parse::<usize>().ok()?, rv.to_string())))
                    .ok_or_else(|| api_err(400, "BadRequest", "bad continue token"))?;
                (s, rv)
            }
            None => (0, self.rv.to_string()),
        };
        let all: Vec<Value> = self
            .objects
            .iter()
            .filter(|((p, n, nm), o)| {
                *p == t.r.plural
                    && t.ns.as_ref().is_none_or(|ns| ns == n)
                    && name.as_ref().is_none_or(|x| x == nm)
                    && sel.matches(o)
            })
            .map(|(_, o)| self.served(t.r, &t.version, o))
            .collect();
        let page: Vec<Value> = all.iter().skip(skip).take(limit).cloned().collect();
        let next = skip + page.len();
        let mut meta = json!({"resourceVersion": rv});
        if next < all.len() {
            meta["continue"] = json!(format!("{next}:{rv}"));
        }
        Ok(json!({"kind": format!("{}List", t.r.kind),
                  "apiVersion": api_version(t.r, &t.version),
                  "metadata": meta, "items": page}))
    }

    fn watch(
        &mut self,
        t: &Target,
        q: &HashMap<String, String>,
    ) -> Result<(mpsc::UnboundedReceiver<Bytes>, Duration), ApiError> {
        let selector = Selector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
            .map_err(|e| api_err(400, "BadRequest", e.to_string()))?;
        let name = field_name(q)?;
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(1800));
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Watcher {
            plural: t.r.plural,
            version: t.version.clone(),
            ns: t.ns.clone(),
            selector,
            name,
            bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
            tx,
        };
        let from = q.get("resourceVersion").cloned().unwrap_or_default();
        if from.is_empty() || from == "0" {
            // "Any version": the current state as ADDED events, then changes.
            for ((p, n, _), o) in &self.objects {
                let ev = Event {
                    rv: self.rv,
                    plural: p,
                    ns: n.clone(),
                    kind: "ADDED",
                    old: None,
                    obj: o.clone(),
                };
                if let Some(line) = filter_event(t.r, &w, &ev) {
                    let _ = w.tx.send(line);
                }
            }
        } else {
            let from: u64 = from
                .parse()
                .map_err(|_| api_err(400, "BadRequest", format!("bad resourceVersion {from:?}")))?;
            if from < self.compacted {
                let gone = api_err(
                    410,
                    "Expired",
                    format!("too old resource version: {from} ({})", self.compacted + 1),
                );
                let line = json!({"type": "ERROR", "object": gone.status()});
                let _ = w.tx.send(Bytes::from(format!("{line}\n")));
                return Ok((rx, timeout));
            }
            for ev in self.history.iter().filter(|e| e.rv > from) {
                if let Some(line) = filter_event(t.r, &w, ev) {
                    let _ = w.tx.send(line);
                }
            }
        }
        self.watchers.push(w);
        Ok((rx, timeout))
    }

    fn create(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(api_err(400, "BadRequest", "body is not an object"));
        }
        let mut name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let prefix = obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if prefix.is_empty() {
                return Err(api_err(
                    422,
                    "Invalid",
                    "metadata.name or metadata.generateName: Required value",
                ));
            }
            name = format!("{prefix}{}", random_suffix(5));
        }
        obj["metadata"]["name"] = json!(name);
        obj["metadata"]["namespace"] = json!(ns);
        validate(r, &obj)?;
        let key = (r.plural, ns.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(api_err(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", r.plural),
            ));
        }
        let rv = self.next_rv();
        let m = &mut obj["metadata"];
        m["uid"] = json!(uuid());
        m["resourceVersion"] = json!(rv.to_string());
        m["creationTimestamp"] = json!(now_rfc3339());
        m["generation"] = json!(1);
        if let Some(o) = m.as_object_mut() {
            o.remove("deletionTimestamp");
        }
        if r.status {
            obj["status"] = if r.plural == "pods" {
                json!({"phase": "Pending"})
            } else {
                json!({})
            };
        }
        let stored = self.served(r, r.versions[0], &obj);
        self.objects.insert(key, stored.clone());
        self.record(r, ns, "ADDED", None, stored.clone());
        Ok(self.served(r, version, &stored))
    }

    /// The common path of PUT and PATCH once the new object is known.
    fn write(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        status: bool,
        mut new: Value,
    ) -> Result<Value, ApiError> {
        let key = (r.plural, ns.to_string(), name.to_string());
        let old =
            self.objects.get(&key).cloned().ok_or_else(|| {
                api_err(404, "NotFound", format!("{} {name:?} not found", r.plural))
            })?;
        let given_rv = new
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let cur_rv = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !given_rv.is_empty() && given_rv != cur_rv {
            return Err(api_err(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                    r.plural
                ),
            ));
        }
        if new.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
            return Err(api_err(
                400,
                "BadRequest",
                "metadata.name does not match the URL",
            ));
        }
        if status {
            // Only status moves through the subresource.
            let st = new.get("status").cloned().unwrap_or(json!({}));
            new = old.clone();
            new["status"] = st;
        } else {
            if r.status {
                new["status"] = old.get("status").cloned().unwrap_or(json!({}));
            }
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "generation",
                "namespace",
            ] {
                match old["metadata"].get(f) {
                    Some(v) => new["metadata"][f] = v.clone(),
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove(f);
                        }
                    }
                }
            }
            validate(r, &new)?;
            if r.plural == "pods"
                && pod_spec_sans_images(&old["spec"]) != pod_spec_sans_images(&new["spec"])
            {
                return Err(api_err(
                    422,
                    "Invalid",
                    format!("Pod {name:?} is invalid: spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds`"),
                ));
            }
            if spec_part(&old) != spec_part(&new) {
                let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
                new["metadata"]["generation"] = json!(g);
            }
        }
        let mut new = self.served(r, r.versions[0], &new);
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if new == old {
            // A no-op write does not move resourceVersion (as the real server).
            return Ok(self.served(r, version, &old));
        }
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        let finalizers_gone = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty());
        if new.pointer("/metadata/deletionTimestamp").is_some() && finalizers_gone {
            self.objects.remove(&key);
            self.record(r, ns, "DELETED", Some(old), new.clone());
        } else {
            self.objects.insert(key, new.clone());
            self.record(r, ns, "MODIFIED", Some(old), new.clone());
        }
        Ok(self.served(r, version, &new))
    }

    fn update(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        status: bool,
        body: Value,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(api_err(400, "BadRequest", "body is not an object"));
        }
        self.write(r, version, ns, name, status, body)
    }

    #[allow(clippy::too_many_arguments)]
    fn patch(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        status: bool,
        ct: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let key = (r.plural, ns.to_string(), name.to_string());
        let old =
            self.objects.get(&key).cloned().ok_or_else(|| {
                api_err(404, "NotFound", format!("{} {name:?} not found", r.plural))
            })?;
        let mut new = self.served(r, version, &old);
        // A patch carries a resourceVersion precondition only if it names one.
        new["metadata"]["resourceVersion"] = json!("");
        match ct {
            "application/merge-patch+json" => patch::merge(&mut new, body),
            "application/strategic-merge-patch+json" if r.group != "workloads.x-k8s.io" => {
                patch::strategic_merge(&mut new, body)
            }
            "application/json-patch+json" => {
                new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                patch::json_patch(&mut new, body)
                    .map_err(|e| api_err(422, "Invalid", e.to_string()))?;
                if new["metadata"]["resourceVersion"] == old["metadata"]["resourceVersion"] {
                    new["metadata"]["resourceVersion"] = json!("");
                }
            }
            other => {
                return Err(api_err(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (not {other:?} here)"),
                ))
            }
        }
        self.write(r, version, ns, name, status, new)
    }

    fn delete(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        opts: &Value,
    ) -> Result<Value, ApiError> {
        let key = (r.plural, ns.to_string(), name.to_string());
        let old =
            self.objects.get(&key).cloned().ok_or_else(|| {
                api_err(404, "NotFound", format!("{} {name:?} not found", r.plural))
            })?;
        for (f, at) in [
            ("uid", "/metadata/uid"),
            ("resourceVersion", "/metadata/resourceVersion"),
        ] {
            if let Some(want) = opts
                .pointer(&format!("/preconditions/{f}"))
                .and_then(Value::as_str)
            {
                if old.pointer(at).and_then(Value::as_str) != Some(want) {
                    return Err(api_err(
                        409,
                        "Conflict",
                        format!("Precondition failed: {f} in precondition: {want}"),
                    ));
                }
            }
        }
        let has_finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let graceful = r.plural == "pods"
            && old
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
        if has_finalizers || graceful {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(self.served(r, version, &old));
            }
            let rv = self.next_rv();
            let mut new = old.clone();
            new["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            new["metadata"]["resourceVersion"] = json!(rv.to_string());
            if graceful {
                new["metadata"]["deletionGracePeriodSeconds"] = json!(30);
            }
            self.objects.insert(key, new.clone());
            self.record(r, ns, "MODIFIED", Some(old), new.clone());
            return Ok(self.served(r, version, &new));
        }
        self.remove(r, ns, name)
            .map(|o| self.served(r, version, &o))
            .ok_or_else(|| api_err(404, "NotFound", name.to_string()))
    }

    fn remove(&mut self, r: &'static Resource, ns: &str, name: &str) -> Option<Value> {
        let old = self
            .objects
            .remove(&(r.plural, ns.to_string(), name.to_string()))?;
        let rv = self.next_rv();
        let mut gone = old.clone();
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(r, ns, "DELETED", Some(old), gone.clone());
        Some(gone)
    }
}

fn field_name(q: &HashMap<String, String>) -> Result<Option<String>, ApiError> {
    match q.get("fieldSelector").filter(|f| !f.is_empty()) {
        None => Ok(None),
        Some(f) => f
            .strip_prefix("metadata.name=")
            .map(|n| Some(n.to_string()))
            .ok_or_else(|| {
                api_err(
                    400,
                    "BadRequest",
                    format!("field selector {f:?}: only metadata.name is served here"),
                )
            }),
    }
}

/// The watch line an event makes for a watcher, if any.
fn filter_event(r: &Resource, w: &Watcher, ev: &Event) -> Option<Bytes> {
    if ev.plural != w.plural || w.ns.as_ref().is_some_and(|n| *n != ev.ns) {
        return None;
    }
    let name_of = |o: &Value| {
        o.pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if w.name.is_some() && name_of(&ev.obj) != w.name {
        return None;
    }
    let now = w.selector.matches(&ev.obj);
    let before = ev.old.as_ref().is_some_and(|o| w.selector.matches(o));
    let kind = match (ev.kind, before, now) {
        ("ADDED", _, true) => "ADDED",
        ("DELETED", true, _) => "DELETED",
        ("MODIFIED", true, true) => "MODIFIED",
        ("MODIFIED", false, true) => "ADDED",
        ("MODIFIED", true, false) => "DELETED",
        _ => return None,
    };
    let mut obj = ev.obj.clone();
    obj["apiVersion"] = json!(api_version(r, &w.version));
    Some(Bytes::from(format!(
        "{}\n",
        json!({"type": kind, "object": obj})
    )))
}

fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}

fn uuid() -> String {
    let a = fastrand::u128(..);
    let h = format!("{a:032x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// How the simulated kubelet treats pods.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// Time from creation to Running.
    pub start_delay: Duration,
    /// Time a terminating pod takes to go away.
    pub stop_delay: Duration,
    pub tick: Duration,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            start_delay: Duration::from_millis(20),
            stop_delay: Duration::from_millis(50),
            tick: Duration::from_millis(20),
        }
    }
}

/// A SIMULATED kubelet for the stand-in: no containers run; it only writes the pod status a
/// kubelet would.
#[derive(Clone)]
pub struct Kubelet {
    api: ApiServer,
    cfg: KubeletConfig,
    held: Arc<Mutex<Vec<Selector>>>,
    failed: Arc<Mutex<HashSet<String>>>,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Kubelet {
    pub fn new(api: &ApiServer, cfg: KubeletConfig) -> Kubelet {
        Kubelet {
            api: api.clone(),
            cfg,
            held: Default::default(),
            failed: Default::default(),
            seen: Default::default(),
        }
    }

    /// Pods matching `selector` run but are not Ready until released.
    pub fn hold(&self, selector: &str) {
        if let Ok(s) = Selector::parse(selector) {
            self.held.lock().push(s);
        }
    }

    pub fn release_all(&self) {
        self.held.lock().clear();
    }

    /// Marks a pod's containers as failed (phase Failed).
    pub fn fail_pod(&self, name: &str) {
        self.failed.lock().insert(name.to_string());
    }

    /// Runs on the current tokio runtime until the runtime stops.
    pub fn spawn(&self) {
        let k = self.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(k.cfg.tick);
            loop {
                t.tick().await;
                k.step();
            }
        });
    }

    /// Runs on a thread of its own.
    pub fn spawn_thread(&self) {
        let k = self.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(k.cfg.tick);
            k.step();
        });
    }

    /// One pass over every pod.
    pub fn step(&self) {
        let r = ApiServer::resource("pods").expect("pods are served");
        let now = Instant::now();
        let mut inner = self.api.inner.lock();
        let pods: Vec<(Key, Value)> = inner
            .objects
            .iter()
            .filter(|((p, _, _), _)| *p == "pods")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let held = self.held.lock().clone();
        let mut seen = self.seen.lock();
        let live: HashSet<String> = pods
            .iter()
            .filter_map(|(_, p)| p.pointer("/metadata/uid").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        seen.retain(|k, _| live.contains(k.split('/').next().unwrap_or(k)));
        for (idx, (key, pod)) in pods.into_iter().enumerate() {
            let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
            let first = *seen.entry(uid.clone()).or_insert(now);
            if pod.pointer("/metadata/deletionTimestamp").is_some() {
                let since = *seen.entry(format!("{uid}/deleting")).or_insert(now);
                if now.duration_since(since) >= self.cfg.stop_delay {
                    inner.remove(r, &key.1, &key.2);
                }
                continue;
            }
            if now.duration_since(first) < self.cfg.start_delay {
                continue;
            }
            let want = self.pod_status(&pod, idx, &held);
            if pod.get("status") != Some(&want) {
                let mut new = pod.clone();
                new["status"] = want;
                if pod.pointer("/spec/nodeName").is_none() {
                    new["spec"]["nodeName"] = json!(format!("standin-node-{}", idx % 3));
                }
                let rv = inner.next_rv();
                new["metadata"]["resourceVersion"] = json!(rv.to_string());
                inner.objects.insert(key.clone(), new.clone());
                inner.record(r, &key.1, "MODIFIED", Some(pod), new);
            }
        }
    }

    fn pod_status(&self, pod: &Value, idx: usize, held: &[Selector]) -> Value {
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        let old = pod.get("status").cloned().unwrap_or(json!({}));
        let failed = self.failed.lock().contains(name);
        let ready = !failed && !held.iter().any(|s| s.matches(pod));
        let mut statuses = Vec::new();
        for c in pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let cname = c["name"].as_str().unwrap_or("");
            let image = c["image"].as_str().unwrap_or("");
            let prev = old
                .get("containerStatuses")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|s| s["name"] == cname));
            let mut restarts = prev.and_then(|p| p["restartCount"].as_i64()).unwrap_or(0);
            if prev.is_some_and(|p| p["image"].as_str() != Some(image)) {
                restarts += 1;
            }
            let state = if failed {
                json!({"terminated": {"exitCode": 1, "reason": "Error"}})
            } else {
                json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
            };
            statuses.push(json!({"name": cname, "image": image,
                "imageID": format!("sim://{image}"), "ready": ready, "started": !failed,
                "restartCount": restarts, "state": state}));
        }
        let ip = old
            .get("podIP")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("127.1.{}.{}", (idx / 250) % 250, idx % 250 + 1));
        let cond = |t: &str, ok: bool| {
            json!({"type": t, "status": if ok {"True"} else {"False"},
                   "lastTransitionTime": null})
        };
        json!({
            "phase": if failed {"Failed"} else {"Running"},
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "conditions": [cond("PodScheduled", true), cond("Initialized", true),
                           cond("ContainersReady", ready), cond("Ready", ready)],
            "containerStatuses": statuses,
        })
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
