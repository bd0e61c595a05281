//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go does it: the holder
//! renews `renewTime`; another candidate takes the lease only after seeing the same record
//! unchanged for a whole `leaseDurationSeconds` on its own clock (so clock skew between
//! nodes does not matter), and every write is conditional on the resourceVersion read, so
//! two candidates can never both win.

use crate::kube::{Kube, KubeError};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub struct Elector {
    kube: Kube,
    path: String,
    collection: String,
    name: String,
    pub identity: String,
    pub lease: Duration,
    observed: Option<(Value, Instant)>,
}

fn micro_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

impl Elector {
    pub fn new(
        kube: Kube,
        namespace: &str,
        name: &str,
        identity: &str,
        lease: Duration,
    ) -> Elector {
        let collection = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases");
        Elector {
            kube,
            path: format!("{collection}/{name}"),
            collection,
            name: name.to_string(),
            identity: identity.to_string(),
            lease,
            observed: None,
        }
    }

    /// One attempt to take or renew the lease; `Ok(true)` while we hold it.
    pub async fn try_acquire(&mut self) -> Result<bool, KubeError> {
        let secs = self.lease.as_secs().max(1);
        let current = match self.kube.get_json(&self.path).await {
            Ok(v) => v,
            Err(e) if e.code() == Some(404) => {
                let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": secs,
                             "acquireTime": micro_now(), "renewTime": micro_now(),
                             "leaseTransitions": 0}});
                return match self.kube.create(&self.collection, &lease).await {
                    Ok(v) => {
                        self.observed = Some((v["spec"].clone(), Instant::now()));
                        Ok(true)
                    }
                    Err(e) if e.code() == Some(409) => Ok(false),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let spec = current["spec"].clone();
        let holder = spec["holderIdentity"].as_str().unwrap_or("");
        let now = Instant::now();
        // The record's age is measured from when we first saw it as it is.
        let seen_at = match &self.observed {
            Some((s, t)) if *s == spec => *t,
            _ => {
                self.observed = Some((spec.clone(), now));
                now
            }
        };
        let their_lease =
            Duration::from_secs(spec["leaseDurationSeconds"].as_u64().unwrap_or(secs));
        let mine = holder == self.identity;
        if !mine && !holder.is_empty() && now.duration_since(seen_at) < their_lease {
            return Ok(false);
        }
        let mut next = current.clone();
        next["spec"]["holderIdentity"] = json!(self.identity);
        next["spec"]["leaseDurationSeconds"] = json!(secs);
        next["spec"]["renewTime"] = json!(micro_now());
        if !mine {
            next["spec"]["acquireTime"] = json!(micro_now());
            let t = spec["leaseTransitions"].as_i64().unwrap_or(0);
            next["spec"]["leaseTransitions"] = json!(t + 1);
        }
        match self.kube.replace(&self.path, &next).await {
            Ok(v) => {
                if !mine {
                    tracing::info!(identity = %self.identity, previous = holder, "took the lease");
                }
                self.observed = Some((v["spec"].clone(), Instant::now()));
                Ok(true)
            }
            Err(e) if e.code() == Some(409) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on a clean shutdown) so a standby takes over at once.
    pub async fn release(&mut self) {
        if let Ok(mut v) = self.kube.get_json(&self.path).await {
            if v["spec"]["holderIdentity"].as_str() == Some(self.identity.as_str()) {
                v["spec"]["holderIdentity"] = Value::Null;
                v["spec"]["leaseDurationSeconds"] = json!(1);
                let _ = self.kube.replace(&self.path, &v).await;
            }
        }
    }
}
