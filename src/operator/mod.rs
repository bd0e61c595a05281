//! `rbgctl operator`: the RoleBasedGroup controller, over plain REST.
//!
//! - `model`: a group's JSON (v1alpha1 or v1alpha2 form) as one model; dependency tiers.
//! - `desired`: the pods, Services, discovery ConfigMap and EndpointSlices a group should
//!   have, and the revision hashes (pure).
//! - `plan`: the next rollout step of a role from its pods (pure).
//! - `coordination`: maxSkew for rolling updates and scaling across roles (pure).
//! - `gang`: the PodGroup a gang-scheduled group gets and the marks its pods carry (pure);
//!   `restarts`: the restart policy's verdicts and backoff (pure).
//! - `informer`: list + watch caches; `queue`: the work queue; `leader`: Lease election.
//! - `adapter`: RoleBasedGroupScalingAdapters; `groupset`: RoleBasedGroupSets; `finalizer`: the
//!   patches that hold and release a finalizer.
//! - `controller`: what a reconcile works with; `reconcile`: one reconcile of a group, which
//!   returns what the queue does next; `apply`: pure diffs of children, then the writes;
//!   `events`: Events told once; `throttle`: the write rate limit.
//!
//! Objects are read through typed views (`kube::object`), never by JSON pointer.

pub mod action;
pub mod adapter;
pub mod apply;
pub mod config;
pub mod context;
pub mod controller;
pub mod coordination;
pub mod desired;
pub mod events;
pub mod finalizer;
pub mod gang;
pub mod group;
pub mod groupset;
pub mod informer;
pub mod leader;
pub mod model;
pub mod plan;
pub mod queue;
pub mod refusals;
pub mod restarts;
pub mod revisions;
pub mod rollout;
pub mod throttle;
pub mod unwatched;

use crate::kube::{Kube, KubeConfig, KubeError};
use crate::role::{self, BindError};
use crate::shutdown::Shutdown;
use crate::telemetry::{Family, PromText};

pub use config::{OperatorArgs, OperatorConfig};
use context::{Caches, Context, Kind, Queues};
use informer::Source;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

// The `/metrics` families this file writes, each declared once.
const API_REQUESTS_TOTAL: Family = Family::counter(
    "rbgctl_operator_api_requests_total",
    "Requests sent to the API server",
);
const GROUPS: Family = Family::gauge("rbgctl_operator_groups", "RoleBasedGroups in the cache");
const GROUP_SETS: Family = Family::gauge(
    "rbgctl_operator_group_sets",
    "RoleBasedGroupSets in the cache",
);
const IS_LEADER: Family = Family::gauge(
    "rbgctl_operator_is_leader",
    "1 while this replica holds the lease",
);
const POD_ACTIONS_TOTAL: Family =
    Family::counter("rbgctl_operator_pod_actions_total", "Pod writes by action");
const QUEUE_DEPTH: Family = Family::gauge(
    "rbgctl_operator_queue_depth",
    "Keys waiting for a reconcile, by kind",
);
const RECONCILES_TOTAL: Family = Family::counter(
    "rbgctl_operator_reconciles_total",
    "Reconciles run, by kind (group, adapter, set)",
);
const RECONCILE_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_operator_reconcile_errors_total",
    "Reconciles that failed (retried with backoff)",
);
const SCALING_ADAPTERS: Family = Family::gauge(
    "rbgctl_operator_scaling_adapters",
    "RoleBasedGroupScalingAdapters in the cache",
);
const STATUS_WRITES_TOTAL: Family =
    Family::counter("rbgctl_operator_status_writes_total", "Group status writes");

fn identity(args: &OperatorConfig) -> String {
    args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "rbgctl".into());
        format!("{host}_{}", std::process::id())
    })
}

/// The group a child belongs to (by its group label).
fn owner_group_key(obj: &Value) -> Option<String> {
    let meta = crate::kube::object::ObjectMeta::of(obj);
    let group = meta.label(desired::GROUP);
    (!group.is_empty()).then(|| format!("{}/{group}", meta.namespace))
}

/// Errors that stop the operator.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("{0}; exiting so that only one replica acts")]
    Lease(&'static str),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The operator's sockets, bound before it starts.
pub struct Listeners {
    /// `/metrics`, `/health`, `/healthz`, `/readyz`.
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// Binds the operator's sockets its config names (port 0: the kernel chooses).
    pub fn bind(args: &OperatorConfig) -> Result<Listeners, OperatorError> {
        Ok(Listeners {
            metrics: Some(role::bind(
                "operator metrics",
                &args.metrics_host,
                args.metrics_port,
            )?),
        })
    }
}

/// Where a started operator listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Addrs {
    pub metrics: Option<SocketAddr>,
}

/// A running operator: its addresses, and how to stop it and wait for it.
pub type Handle = role::Handle<Addrs, OperatorError>;

/// Starts the operator; it stands by for the lease (with `leader_elect`), then reconciles
/// until `shutdown` fires (or it loses its lease, which is an error: the pod restarts and
/// stands by).
pub fn start(
    args: OperatorConfig,
    listeners: Listeners,
    shutdown: Shutdown,
) -> Result<Handle, OperatorError> {
    let addrs = Addrs {
        metrics: role::local_addr(listeners.metrics.as_ref())?,
    };
    let cfg = match &args.kubeconfig {
        Some(p) => KubeConfig::from_kubeconfig(p)?,
        None => KubeConfig::infer()?,
    };
    let runtime = role::runtime("operator", None)?;
    let metrics = {
        let _guard = runtime.enter();
        listeners.metrics.map(role::async_listener).transpose()?
    };
    role::announce("operator", &addrs);
    let stop = shutdown.clone();
    Ok(Handle::spawn("operator", addrs, shutdown, move || {
        let r = runtime.block_on(serve(args, cfg, metrics, stop));
        runtime.shutdown_timeout(Duration::from_secs(1));
        r
    })?)
}

/// Runs the operator until SIGINT or SIGTERM.
pub fn run(args: OperatorConfig) -> Result<(), OperatorError> {
    let listeners = Listeners::bind(&args)?;
    start(args, listeners, Shutdown::on_signals()?)?.wait()
}

async fn serve(
    args: OperatorConfig,
    cfg: KubeConfig,
    metrics: Option<tokio::net::TcpListener>,
    shutdown: Shutdown,
) -> Result<(), OperatorError> {
    let me = identity(&args);
    let kube = Kube::new(cfg.clone())?.with_user_agent(&format!("rbgctl-operator/{me}"));
    let leader = Arc::new(AtomicBool::new(!args.leader_elect));
    let caches = Caches::default();
    let queues = Queues::default();
    let ctl = Arc::new(Context::new(
        kube.clone(),
        caches.clone(),
        queues.clone(),
        args.kube_api_qps,
        args.kube_api_burst,
        Duration::from_secs(args.inplace_timeout_secs),
        args.scheduler_name,
    ));
    if let Some(listener) = metrics {
        start_metrics(listener, ctl.clone(), leader.clone(), shutdown.clone());
    }
    let mut elector = None;
    if args.leader_elect {
        let ns = args
            .lease_namespace
            .clone()
            .unwrap_or(cfg.namespace.clone());
        let lease = Duration::from_secs(args.lease_duration_secs.max(1));
        let mut e = leader::Elector::new(kube.clone(), &ns, &args.lease_name, &me, lease);
        tracing::info!(identity = %me, lease = %args.lease_name, namespace = %ns, "waiting for the lease");
        let retry = (lease / 4).max(Duration::from_millis(200));
        // Both the attempt and the wait between attempts end when the token fires: a standby
        // told to stop never goes on to take the lease.
        loop {
            tokio::select! {
                r = e.try_acquire() => match r {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(err) => tracing::warn!(error = %err, "lease"),
                },
                _ = shutdown.wait() => return Ok(()),
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = shutdown.wait() => return Ok(()),
            }
        }
        if shutdown.is_triggered() {
            e.release().await;
            return Ok(());
        }
        tracing::info!(identity = %me, "leading");
        leader.store(true, Ordering::Release);
        elector = Some(e);
    }
    start_informers(&args, &kube, &caches, &queues);
    for kind in Kind::ALL {
        let n = match kind {
            Kind::Group => args.workers.max(1),
            Kind::Adapter | Kind::Set => controller::SMALL_KIND_WORKERS,
        };
        for _ in 0..n {
            tokio::spawn(controller::work(ctl.clone(), kind));
        }
    }
    if args.resync_secs > 0 {
        let (queues, caches, every) = (
            queues.clone(),
            caches.clone(),
            Duration::from_secs(args.resync_secs),
        );
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            t.tick().await;
            loop {
                t.tick().await;
                for (store, q) in [
                    (&caches.groups, &queues.groups),
                    (&caches.adapters, &queues.adapters),
                    (&caches.sets, &queues.sets),
                ] {
                    for k in store.keys() {
                        q.add(&k);
                    }
                }
            }
        });
    }
    let Some(mut e) = elector else {
        shutdown.wait().await;
        return Ok(());
    };
    let renew = (e.lease / 3).max(Duration::from_millis(200));
    let mut last_ok = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(renew) => {}
            _ = shutdown.wait() => {
                e.release().await;
                return Ok(());
            }
        }
        match e.try_acquire().await {
            Ok(true) => last_ok = std::time::Instant::now(),
            Ok(false) => return Err(OperatorError::Lease("lost the lease to another replica")),
            Err(err) => {
                tracing::warn!(error = %err, "lease renewal failed");
                if last_ok.elapsed() > e.lease * 2 / 3 {
                    return Err(OperatorError::Lease("could not renew the lease in time"));
                }
            }
        }
    }
}

/// Where a watched object's change is queued.
#[derive(Clone, Copy)]
enum Route {
    /// A group: itself, its set, and the adapters that target it.
    Group,
    /// A group's policy (named like the group).
    Policy,
    /// A child of a group (by its group label).
    Child,
    /// An adapter: itself and its target group.
    Adapter,
    Set,
}

fn start_informers(args: &OperatorConfig, kube: &Kube, caches: &Caches, queues: &Queues) {
    let scoped = |api: &str, plural: &str| match &args.namespace {
        Some(ns) => format!("{api}/namespaces/{ns}/{plural}"),
        None => format!("{api}/{plural}"),
    };
    let managed = format!(
        "&labelSelector={}",
        crate::kube::encode(&format!("{}={}", desired::MANAGED_BY, desired::MANAGER))
    );
    const WORKLOADS: &str = "/apis/workloads.x-k8s.io/v1alpha2";
    let sources = [
        (
            "rolebasedgroups",
            WORKLOADS,
            "",
            &caches.groups,
            Route::Group,
        ),
        (
            "coordinatedpolicies",
            WORKLOADS,
            "",
            &caches.policies,
            Route::Policy,
        ),
        (
            adapter::PLURAL,
            WORKLOADS,
            "",
            &caches.adapters,
            Route::Adapter,
        ),
        (groupset::PLURAL, WORKLOADS, "", &caches.sets, Route::Set),
        (
            "pods",
            "/api/v1",
            managed.as_str(),
            &caches.pods,
            Route::Child,
        ),
        (
            "services",
            "/api/v1",
            managed.as_str(),
            &caches.services,
            Route::Child,
        ),
        (
            "configmaps",
            "/api/v1",
            managed.as_str(),
            &caches.configmaps,
            Route::Child,
        ),
        (
            "endpointslices",
            "/apis/discovery.k8s.io/v1",
            managed.as_str(),
            &caches.slices,
            Route::Child,
        ),
        (
            "controllerrevisions",
            "/apis/apps/v1",
            managed.as_str(),
            &caches.revisions,
            Route::Child,
        ),
    ];
    let timeout = Duration::from_secs(args.watch_timeout_secs.max(1));
    for (name, api, query, store, route) in sources {
        let src = Source {
            name,
            path: scoped(api, name),
            query: query.to_string(),
            optional: matches!(route, Route::Adapter | Route::Set),
        };
        let (queues, adapters) = (queues.clone(), caches.adapters.clone());
        let notify: Arc<dyn Fn(&Value) + Send + Sync> = Arc::new(move |o: &Value| {
            let meta = crate::kube::object::ObjectMeta::of(o);
            let in_ns = |n: &str| format!("{}/{n}", meta.namespace);
            match route {
                Route::Group => {
                    queues.groups.add(&meta.key());
                    let set = meta.label(groupset::SET_NAME);
                    if !set.is_empty() {
                        queues.sets.add(&in_ns(set));
                    }
                    for a in adapters.select(|a| {
                        let am = crate::kube::object::ObjectMeta::of(a);
                        am.namespace == meta.namespace
                            && adapter::Adapter::of(a)
                                .is_some_and(|a| a.spec.scale_target_ref.name == meta.name)
                    }) {
                        queues.adapters.add(&informer::key_of(&a));
                    }
                }
                Route::Policy => queues.groups.add(&meta.key()),
                Route::Child => {
                    if let Some(k) = owner_group_key(o) {
                        queues.groups.add(&k);
                    }
                }
                Route::Adapter => {
                    queues.adapters.add(&meta.key());
                    if let Some(a) = adapter::Adapter::of(o) {
                        queues.groups.add(&in_ns(a.spec.scale_target_ref.name));
                    }
                }
                Route::Set => queues.sets.add(&meta.key()),
            }
        });
        tokio::spawn(informer::run(
            kube.clone(),
            src,
            store.clone(),
            notify,
            timeout,
        ));
    }
}

fn start_metrics(
    listener: tokio::net::TcpListener,
    ctl: Arc<Context>,
    leader: Arc<AtomicBool>,
    shutdown: Shutdown,
) {
    use axum::routing::get;
    let metrics = {
        let (ctl, leader) = (ctl.clone(), leader.clone());
        move || {
            let (ctl, leader) = (ctl.clone(), leader.clone());
            async move {
                let m = &ctl.metrics;
                let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
                let mut p = PromText::new();
                p.single(
                    &IS_LEADER,
                    if leader.load(Ordering::Acquire) {
                        1.0
                    } else {
                        0.0
                    },
                );
                p.family(&RECONCILES_TOTAL);
                for (kind, n) in [
                    (Kind::Group, &m.reconciles),
                    (Kind::Adapter, &m.adapter_reconciles),
                    (Kind::Set, &m.set_reconciles),
                ] {
                    p.sample(&RECONCILES_TOTAL, &[("kind", kind.label())], l(n));
                }
                p.atomic(&RECONCILE_ERRORS_TOTAL, &m.errors);
                p.family(&QUEUE_DEPTH);
                for kind in Kind::ALL {
                    p.sample(
                        &QUEUE_DEPTH,
                        &[("kind", kind.label())],
                        ctl.queues.of(kind).len() as f64,
                    );
                }
                p.single(&GROUPS, ctl.caches.groups.len() as f64);
                p.single(&SCALING_ADAPTERS, ctl.caches.adapters.len() as f64);
                p.single(&GROUP_SETS, ctl.caches.sets.len() as f64);
                p.family(&POD_ACTIONS_TOTAL);
                p.sample(
                    &POD_ACTIONS_TOTAL,
                    &[("action", "create")],
                    l(&m.pods_created),
                );
                p.sample(
                    &POD_ACTIONS_TOTAL,
                    &[("action", "delete")],
                    l(&m.pods_deleted),
                );
                p.sample(
                    &POD_ACTIONS_TOTAL,
                    &[("action", "inplace")],
                    l(&m.pods_inplace),
                );
                p.atomic(&STATUS_WRITES_TOTAL, &m.status_writes);
                p.family(&API_REQUESTS_TOTAL);
                p.sample(
                    &API_REQUESTS_TOTAL,
                    &[("kind", "read")],
                    ctl.kube.stats.reads.load(Ordering::Relaxed) as f64,
                );
                p.sample(
                    &API_REQUESTS_TOTAL,
                    &[("kind", "write")],
                    ctl.kube.stats.writes.load(Ordering::Relaxed) as f64,
                );
                p.finish()
            }
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok" }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }));
    tracing::info!(addr = ?listener.local_addr().ok(), "operator metrics");
    tokio::spawn(crate::http_server::serve(listener, app, shutdown));
}
