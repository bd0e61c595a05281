//! Election on a `coordination.k8s.io/v1` Lease, for a pool inside Kubernetes without etcd.
//!
//! The decision is `kube::lease::claim` (client-go's rule: a candidate takes the Lease only
//! after seeing the same record unchanged for a whole `leaseDurationSeconds` on its own clock),
//! and every write is conditional on the resourceVersion read. The epoch is `leaseTransitions`, raised by every
//! acquisition (also when the same master takes the Lease again after losing it); the leader's
//! view is the annotation `rbgctl.io/master-view`.

use super::elector::{Backend, Outcome};
use super::lease::{self, LeaderHint};
use super::{HaError, MasterView};
use crate::kube::lease::{self as kube_lease, Claim};
use crate::kube::{Kube, KubeConfig, KubeError};
use crate::shutdown::Shutdown;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The Lease annotation holding the leader's view.
pub const VIEW_ANNOTATION: &str = "rbgctl.io/master-view";

/// Longest wait for one API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn kube_err(e: KubeError) -> HaError {
    HaError::Kube(e.to_string())
}

/// A Lease's holder and view, as clients read them.
pub fn leader_of(lease: &Value) -> Option<LeaderHint> {
    let spec = &lease["spec"];
    spec["holderIdentity"].as_str().filter(|h| !h.is_empty())?;
    let view = lease["metadata"]["annotations"][VIEW_ANNOTATION].as_str()?;
    let view: MasterView = serde_json::from_str(view).ok()?;
    Some(view.hint(spec["leaseTransitions"].as_u64().unwrap_or(0)))
}

/// Blocking calls to the API server from the election and leader-watch threads.
pub struct LeaseApi {
    kube: Kube,
    runtime: tokio::runtime::Runtime,
    pub path: String,
    collection: String,
    pub name: String,
}

impl LeaseApi {
    /// The Lease `namespace/name` through `kube`.
    pub fn new(kube: Kube, namespace: &str, name: &str) -> Result<LeaseApi, HaError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| HaError::Kube(format!("runtime: {e}")))?;
        let collection = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases");
        Ok(LeaseApi {
            kube,
            runtime,
            path: format!("{collection}/{name}"),
            collection,
            name: name.to_string(),
        })
    }

    /// With the kube settings found in the environment (in-cluster, else `KUBECONFIG`).
    pub fn from_env(namespace: &str, name: &str) -> Result<LeaseApi, HaError> {
        let kube = Kube::new(KubeConfig::infer().map_err(kube_err)?).map_err(kube_err)?;
        LeaseApi::new(kube, namespace, name)
    }

    fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, KubeError>>,
    ) -> Result<T, KubeError> {
        self.runtime
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, f).await })
            .unwrap_or_else(|_| {
                Err(KubeError::Config(format!(
                    "no answer from the API server within {CALL_TIMEOUT:?}"
                )))
            })
    }

    /// The Lease, or `None` when it does not exist.
    pub fn get(&self) -> Result<Option<Value>, HaError> {
        match self.call(self.kube.get_json(&self.path)) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code() == Some(404) => Ok(None),
            Err(e) => Err(kube_err(e)),
        }
    }

    /// Creates the Lease; `Ok(None)` when another candidate created it first.
    fn create(&self, lease: &Value) -> Result<Option<Value>, HaError> {
        match self.call(self.kube.create(&self.collection, lease)) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code() == Some(409) => Ok(None),
            Err(e) => Err(kube_err(e)),
        }
    }

    /// Replaces the Lease (conditional on its resourceVersion); `Ok(None)` on a conflict.
    fn replace(&self, lease: &Value) -> Result<Option<Value>, HaError> {
        match self.call(self.kube.replace(&self.path, lease)) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code() == Some(409) => Ok(None),
            Err(e) => Err(kube_err(e)),
        }
    }
}

/// Master election on a Kubernetes Lease.
pub struct KubeLeaseBackend {
    api: LeaseApi,
    identity: String,
    ttl: Duration,
    /// The record last seen and when it was first seen so (the takeover clock).
    observed: kube_lease::Observed,
    /// The Lease as last written while leading, and the epoch.
    held: Option<(Value, u64)>,
}

impl KubeLeaseBackend {
    /// Elections through the Lease of `api`, as `identity`, holding it for `ttl`.
    pub fn new(api: LeaseApi, identity: &str, ttl: Duration) -> KubeLeaseBackend {
        KubeLeaseBackend {
            api,
            identity: identity.to_string(),
            ttl,
            observed: None,
            held: None,
        }
    }

    fn secs(&self) -> u64 {
        self.ttl.as_secs().max(1)
    }

    fn won(&mut self, written: Value, sent: Instant) -> Outcome {
        let epoch = written["spec"]["leaseTransitions"].as_u64().unwrap_or(0);
        self.observed = Some((written["spec"].clone(), Instant::now()));
        self.held = Some((written, epoch));
        Outcome::Won {
            epoch,
            until: lease::deadline(sent, Duration::from_secs(self.secs())),
        }
    }
}

impl Backend for KubeLeaseBackend {
    fn campaign(&mut self, view: &MasterView) -> Result<Outcome, HaError> {
        let sent = Instant::now();
        let view_json = String::from_utf8_lossy(&view.to_json()).into_owned();
        let duration = Duration::from_secs(self.secs());
        let Some(current) = self.api.get()? else {
            let mut lease = kube_lease::new_lease(&self.api.name, &self.identity, duration, 1);
            lease["metadata"]["annotations"] = json!({VIEW_ANNOTATION: view_json});
            return Ok(match self.api.create(&lease)? {
                Some(v) => self.won(v, sent),
                None => Outcome::Held(None),
            });
        };
        // Not leading now, so even a Lease naming this master is taken anew (a transition):
        // it may have lost it meanwhile.
        let now = Instant::now();
        let mut next = match kube_lease::claim(
            &current,
            &self.identity,
            duration,
            false,
            &mut self.observed,
            now,
        ) {
            Claim::Wait => return Ok(Outcome::Held(leader_of(&current))),
            Claim::Write(next) => next,
        };
        next["metadata"]["annotations"][VIEW_ANNOTATION] = json!(view_json);
        Ok(match self.api.replace(&next)? {
            Some(v) => {
                tracing::info!(
                    previous = current["spec"]["holderIdentity"].as_str().unwrap_or(""),
                    "took the Lease"
                );
                self.won(v, sent)
            }
            None => Outcome::Held(None),
        })
    }

    fn renew(&mut self) -> Result<Option<Instant>, HaError> {
        let Some((mut mine, epoch)) = self.held.take() else {
            return Ok(None);
        };
        let sent = Instant::now();
        mine["spec"]["renewTime"] = json!(kube_lease::micro_now());
        let written = match self.api.replace(&mine)? {
            Some(v) => v,
            None => {
                // Something else wrote the Lease: still ours only if holder and epoch are.
                let Some(current) = self.api.get()? else {
                    return Ok(None);
                };
                let spec = &current["spec"];
                if spec["holderIdentity"].as_str() != Some(self.identity.as_str())
                    || spec["leaseTransitions"].as_u64() != Some(epoch)
                {
                    return Ok(None);
                }
                let mut again = current.clone();
                again["spec"]["renewTime"] = json!(kube_lease::micro_now());
                match self.api.replace(&again)? {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
        };
        self.held = Some((written, epoch));
        Ok(Some(lease::deadline(
            sent,
            Duration::from_secs(self.secs()),
        )))
    }

    fn wait_for_change(&mut self, max: Duration, shutdown: &Shutdown) -> Result<(), HaError> {
        // The takeover clock needs the record looked at now and then; a quarter of the lease
        // bounds how late a vacancy is noticed.
        shutdown.sleep(max.min(Duration::from_secs(self.secs()) / 4));
        Ok(())
    }

    fn resign(&mut self) {
        if let Some((mut mine, _)) = self.held.take() {
            mine["spec"]["holderIdentity"] = Value::Null;
            mine["spec"]["leaseDurationSeconds"] = json!(1);
            if let Err(e) = self.api.replace(&mine) {
                tracing::warn!(error = %e, "could not release the Lease; a standby takes over when it expires");
            }
        }
    }

    fn describe(&self) -> String {
        format!("kubernetes Lease {}", self.api.path)
    }
}
