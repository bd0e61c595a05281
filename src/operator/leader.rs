//! The operator's replicas elect one that acts, on a `coordination.k8s.io/v1` Lease (the
//! decision is `kube::lease::claim`); every write is conditional on the resourceVersion read,
//! so two candidates can never both win.

use crate::kube::{lease, Kube, KubeError};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// This operator replica's side of the election on a Lease.
pub struct Elector {
    kube: Kube,
    path: String,
    collection: String,
    name: String,
    pub identity: String,
    pub lease: Duration,
    observed: lease::Observed,
}

impl Elector {
    /// Elections through the Lease `namespace/name` as `identity`, holding it for `lease`.
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
        let current = match self.kube.get_json(&self.path).await {
            Ok(v) => v,
            Err(e) if e.code() == Some(404) => {
                let lease = lease::new_lease(&self.name, &self.identity, self.lease, 0);
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
        let holder = current["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let mine = holder == self.identity;
        let now = Instant::now();
        let next = match lease::claim(
            &current,
            &self.identity,
            self.lease,
            mine,
            &mut self.observed,
            now,
        ) {
            lease::Claim::Wait => return Ok(false),
            lease::Claim::Write(next) => next,
        };
        match self.kube.replace(&self.path, &next).await {
            Ok(v) => {
                if !mine {
                    tracing::info!(identity = %self.identity, previous = %holder, "took the lease");
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
