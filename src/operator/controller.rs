//! The operator's controller: what a reconcile works with (API client, caches, queue,
//! metrics, the write throttle and the event recorder). A reconcile (`reconcile.rs`) reads
//! everything from the caches, computes the desired children and the next rollout step with
//! the pure modules, and writes only the difference (`apply.rs`). Level-triggered: any
//! reconcile may be the first.

use super::events::Recorder;
use super::throttle::Throttle;
use crate::kube::object::ObjectMeta;
use crate::kube::{Kube, KubeError};
use crate::operator::desired::GROUP;
use crate::operator::informer::Store;
use crate::operator::queue::Queue;
use serde_json::Value;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Api(#[from] KubeError),
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
    /// In front of every write (`--kube-api-qps`, `--kube-api-burst`).
    pub(super) throttle: Arc<Throttle>,
    pub(super) events: Recorder,
    /// In-place updates unconfirmed for longer than this are reported.
    pub(super) inplace_timeout: std::time::Duration,
}

pub(super) fn ns_of(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

pub fn group_path(ns: &str, name: &str) -> String {
    format!("/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/rolebasedgroups/{name}")
}

pub(super) fn core(ns: &str, plural: &str) -> String {
    format!("/api/v1/namespaces/{ns}/{plural}")
}

pub(super) fn slices_path(ns: &str) -> String {
    format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")
}

impl Controller {
    pub fn new(
        kube: Kube,
        caches: Caches,
        queue: Arc<Queue>,
        qps: f64,
        burst: f64,
        inplace_timeout: std::time::Duration,
    ) -> Controller {
        let throttle = Arc::new(Throttle::new(qps, burst));
        Controller {
            inplace_timeout,
            events: Recorder::new(kube.clone(), throttle.clone()),
            throttle,
            kube,
            caches,
            queue,
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
