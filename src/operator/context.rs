//! What a reconcile works with (kube-rs's and controller-runtime's context): the API client,
//! caches, queues, metrics, the write throttle and the event recorder. A reconcile (`group.rs`,
//! `adapter.rs`, `groupset.rs`) reads
//! everything from the caches, computes the desired children and the next rollout step with
//! the pure modules, and writes only the difference (`apply.rs`). Level-triggered: any
//! reconcile may be the first.

use super::events::Recorder;
use super::gang::Scheduler;
use super::throttle::Throttle;
use crate::kube::object::ObjectMeta;
use crate::kube::{Kube, KubeError};
use crate::operator::desired::GROUP;
use crate::operator::informer::Store;
use crate::operator::queue::Queue;
use serde_json::Value;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Why a reconcile did not finish; it is queued again with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Api(#[from] KubeError),
    /// An object whose last write the API server refused, not written again before its
    /// backoff (`refusals`).
    #[error("{object}: held back after the API server refused it ({why})")]
    Held { object: String, why: String },
}

impl ReconcileError {
    /// A write lost a race with another writer: reconciling again from the latest version is
    /// the normal course, not a failure.
    pub fn is_conflict(&self) -> bool {
        match self {
            ReconcileError::Api(e) => e.is_conflict(),
            ReconcileError::Held { .. } => false,
        }
    }
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
    /// RoleBasedGroupScalingAdapters (all of them: adapters can be made by hand).
    pub adapters: Store,
    /// RoleBasedGroupSets.
    pub sets: Store,
    /// The roles' ControllerRevisions (those the operator made).
    pub revisions: Store,
}

/// What is queued for a reconcile, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Group,
    Adapter,
    Set,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Group, Kind::Adapter, Kind::Set];

    /// The kind as logs and metrics name it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Group => "group",
            Kind::Adapter => "adapter",
            Kind::Set => "set",
        }
    }
}

/// One work queue per kind.
#[derive(Clone)]
pub struct Queues {
    pub groups: Arc<Queue>,
    pub adapters: Arc<Queue>,
    pub sets: Arc<Queue>,
}

impl Default for Queues {
    fn default() -> Self {
        Queues {
            groups: Queue::new(),
            adapters: Queue::new(),
            sets: Queue::new(),
        }
    }
}

impl Queues {
    /// The work queue of `kind`.
    pub fn of(&self, kind: Kind) -> &Arc<Queue> {
        match kind {
            Kind::Group => &self.groups,
            Kind::Adapter => &self.adapters,
            Kind::Set => &self.sets,
        }
    }
}

/// The operator's counters, for its `/metrics`.
#[derive(Default)]
pub struct Metrics {
    /// Group reconciles.
    pub reconciles: AtomicU64,
    pub adapter_reconciles: AtomicU64,
    pub set_reconciles: AtomicU64,
    pub errors: AtomicU64,
    pub pods_created: AtomicU64,
    pub pods_deleted: AtomicU64,
    pub pods_inplace: AtomicU64,
    pub status_writes: AtomicU64,
}

/// What every reconcile shares: the API client, the watch caches and queues, counters,
/// the write throttle and event recorder.
pub struct Context {
    pub kube: Kube,
    pub caches: Caches,
    pub queues: Queues,
    pub metrics: Metrics,
    /// In front of every write (`--kube-api-qps`, `--kube-api-burst`).
    pub(super) throttle: Arc<Throttle>,
    pub(super) events: Recorder,
    /// In-place updates unconfirmed for longer than this are reported.
    pub(super) inplace_timeout: std::time::Duration,
    /// Objects whose writes the API server refused, held back for a while.
    pub(super) refusals: parking_lot::Mutex<super::refusals::Refusals>,
    /// Whose PodGroups gang-scheduled groups get.
    pub(super) scheduler: Scheduler,
    /// Each group's PodGroup and each store role's PodDisruptionBudget as last written
    /// (`unwatched`): not watched, so this spares reading one back on every reconcile.
    pub(super) pod_groups: super::unwatched::Memo,
    pub(super) budgets: super::unwatched::Memo,
}

pub(super) fn ns_of(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// The API path of RoleBasedGroup `name` in namespace `ns`.
pub fn group_path(ns: &str, name: &str) -> String {
    format!("/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/rolebasedgroups/{name}")
}

pub(super) fn core(ns: &str, plural: &str) -> String {
    format!("/api/v1/namespaces/{ns}/{plural}")
}

pub(super) fn slices_path(ns: &str) -> String {
    format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")
}

impl Context {
    /// The controller's context: the API client, the caches and queues, and the pace of its
    /// writes (`qps`, `burst`).
    pub fn new(
        kube: Kube,
        caches: Caches,
        queues: Queues,
        qps: f64,
        burst: f64,
        inplace_timeout: std::time::Duration,
        scheduler: Scheduler,
    ) -> Context {
        let throttle = Arc::new(Throttle::new(qps, burst));
        Context {
            inplace_timeout,
            scheduler,
            pod_groups: Default::default(),
            budgets: Default::default(),
            refusals: Default::default(),
            events: Recorder::new(kube.clone(), throttle.clone()),
            throttle,
            kube,
            caches,
            queues,
            metrics: Metrics::default(),
        }
    }

    /// The pods of a group, from the cache.
    pub(super) fn pods_of(&self, ns: &str, group: &str) -> Vec<Value> {
        self.caches.pods.select(|p| {
            let m = ObjectMeta::of(p);
            m.namespace == ns && m.label(GROUP) == group
        })
    }
}
