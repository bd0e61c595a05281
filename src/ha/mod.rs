//! Master high availability: several masters, one leader elected through etcd or a Kubernetes
//! Lease, the others standing by; clients and stores that find the leader and follow it.
//! Design and crash table: `docs/ha.md`.
//!
//! Parts:
//! - `lease`: the leader's right to answer, a deadline on its own clock (pure);
//! - `etcd`: etcd's v3 API over its JSON gateway; `etcd_server`: etcd members on loopback
//!   (tests and `bench failover`);
//! - `kube_lease`: the same election on a `coordination.k8s.io/v1` Lease;
//! - `elector`: the master's election loop over either backend;
//! - `link`: the client side — a master address (`host:port`, `etcd://…`, `k8s://…`) that
//!   follows the leader, refusing answers from an older epoch.

pub mod elector;
pub mod etcd;
pub mod etcd_server;
pub mod kube_lease;
pub mod lease;
pub mod link;

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Mooncake's default cluster id (`--cluster_id`, `MC_STORE_CLUSTER_ID`).
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";

/// Errors of election and leader discovery.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error(transparent)]
    Etcd(#[from] etcd::EtcdError),
    #[error("kubernetes Lease: {0}")]
    Kube(String),
    #[error("bad master address {spec:?}: {why}")]
    BadAddress { spec: String, why: String },
    #[error("bad leader view in {key}: {why}")]
    BadView { key: String, why: String },
}

/// What the leader publishes about itself (the value of the leader key, or the Lease's
/// annotation): where to reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterView {
    /// `host:port` of the RPC server.
    pub rpc: String,
    /// `host:port` of the admin API (`/metrics`, `/health`).
    pub admin: String,
    /// `host:port` of the HTTP metadata server, if it runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
    /// Who this master is (host name and process id), for logs.
    pub id: String,
}

impl MasterView {
    /// The view as JSON, as it is stored under its key.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A view read back from the store under `key`; a clear error if the bytes are not one.
    pub fn from_json(key: &str, bytes: &[u8]) -> Result<MasterView, HaError> {
        serde_json::from_slice(bytes).map_err(|e| HaError::BadView {
            key: key.to_string(),
            why: format!("{e} (is another program using this key?)"),
        })
    }

    /// What clients are told of the leader this view describes, elected at `epoch`.
    pub fn hint(&self, epoch: u64) -> lease::LeaderHint {
        lease::LeaderHint {
            epoch,
            rpc: self.rpc.clone(),
            admin: self.admin.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// The etcd key the leader holds for a cluster (Mooncake's name for it).
pub fn view_key(cluster_id: &str) -> String {
    format!("{VIEW_PREFIX}{cluster_id}/master_view")
}

/// Where every cluster's leader key lives in etcd.
pub const VIEW_PREFIX: &str = "mooncake-store/";

/// The cluster id of a leader key (`mooncake-store/<id>/master_view`).
pub fn cluster_of_view_key(key: &str) -> Option<&str> {
    key.strip_prefix(VIEW_PREFIX)?.strip_suffix("/master_view")
}

/// Where a master is found: a fixed address, or the leader of an elected group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MasterAddress {
    /// `host:port`.
    Direct(String),
    /// `etcd://h1:2379;h2:2379[/cluster_id]`.
    Etcd {
        endpoints: Vec<String>,
        cluster_id: String,
    },
    /// `k8s://namespace/lease-name`.
    Kube { namespace: String, lease: String },
}

impl MasterAddress {
    /// Checks the setting `field`: `host:port`, or an elected master's
    /// `etcd://h1:2379;h2:2379[/cluster]` or `k8s://namespace/lease`.
    pub fn check(field: &str, value: &str) -> Result<(), crate::config::ConfigError> {
        use crate::config::{check_endpoint, ConfigError};
        match MasterAddress::parse(value) {
            Ok(MasterAddress::Direct(a)) => check_endpoint(field, &a).map_err(|_| {
                ConfigError::invalid(
                    field,
                    format!(
                        "expected host:port, etcd://h1:2379;h2:2379 or k8s://namespace/lease, \
                         got {value:?}"
                    ),
                )
            }),
            Ok(_) => Ok(()),
            Err(e) => Err(ConfigError::invalid(field, e.to_string())),
        }
    }

    /// Parses a master address. The cluster id of an `etcd://` address without one comes from
    /// `RBGCTL_CLUSTER_ID` or Mooncake's `MC_STORE_CLUSTER_ID`, else `mooncake_cluster`.
    pub fn parse(spec: &str) -> Result<MasterAddress, HaError> {
        let bad = |why: &str| HaError::BadAddress {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        let spec_t = spec.trim();
        if let Some(rest) = spec_t.strip_prefix("etcd://") {
            let (list, cluster) = split_cluster(rest);
            let cluster = cluster.map_or_else(default_cluster_id, str::to_string);
            let endpoints = etcd::parse_endpoints(list)?;
            check_cluster_id(&cluster).map_err(|w| bad(&w))?;
            return Ok(MasterAddress::Etcd {
                endpoints,
                cluster_id: cluster,
            });
        }
        if let Some(rest) = spec_t.strip_prefix("k8s://") {
            let Some((ns, lease)) = rest.split_once('/') else {
                return Err(bad("expected k8s://namespace/lease-name"));
            };
            for (what, v) in [("namespace", ns), ("lease name", lease)] {
                if !crate::kube::is_dns_label(v) && !is_dns_subdomain(v) {
                    return Err(bad(&format!("{what} {v:?} is not a valid Kubernetes name")));
                }
            }
            return Ok(MasterAddress::Kube {
                namespace: ns.to_string(),
                lease: lease.to_string(),
            });
        }
        if let Some((scheme, _)) = spec_t.split_once("://") {
            return Err(bad(&format!(
                "unknown scheme {scheme:?} (expected host:port, etcd://h1:2379;h2:2379 or k8s://namespace/lease)"
            )));
        }
        Ok(MasterAddress::Direct(spec_t.to_string()))
    }

    /// Whether the master is elected (found through etcd or Kubernetes) rather than given.
    pub fn is_elected(&self) -> bool {
        !matches!(self, MasterAddress::Direct(_))
    }
}

/// `h1:2379;h2:2379/prod` → the endpoint list and the cluster id after the last `/` (an
/// endpoint's `http://` is not one, nor is a trailing `/`).
fn split_cluster(rest: &str) -> (&str, Option<&str>) {
    match rest.rsplit_once('/') {
        Some((head, "")) => (head, None),
        Some((head, tail)) if !tail.contains(':') && !head.ends_with(['/', ':']) => {
            (head, Some(tail))
        }
        _ => (rest, None),
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(crate::kube::is_dns_label)
}

/// The cluster id from the environment, else Mooncake's default.
pub fn default_cluster_id() -> String {
    ["RBGCTL_CLUSTER_ID", "MC_STORE_CLUSTER_ID"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_string())
}

/// A cluster id is part of an etcd key: printable, no `/`.
pub fn check_cluster_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "cluster id {id:?} must be 1-128 letters, digits, '-', '_' or '.'"
        ));
    }
    Ok(())
}

/// How long a standby waits on one watch before looking again (bounded, so a lost watch
/// stream cannot hide a vacancy for long).
pub const WATCH_WAIT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_addresses_parse_and_bad_ones_say_what_to_fix() {
        assert_eq!(
            MasterAddress::parse("127.0.0.1:50051").unwrap(),
            MasterAddress::Direct("127.0.0.1:50051".into())
        );
        assert_eq!(
            MasterAddress::parse("etcd://h1:2379;h2:2379/prod").unwrap(),
            MasterAddress::Etcd {
                endpoints: vec!["http://h1:2379".into(), "http://h2:2379".into()],
                cluster_id: "prod".into()
            }
        );
        assert!(matches!(
            MasterAddress::parse("etcd://h1:2379").unwrap(),
            MasterAddress::Etcd { .. }
        ));
        assert_eq!(
            MasterAddress::parse("etcd://h1:2379;http://h2:2380/").unwrap(),
            MasterAddress::Etcd {
                endpoints: vec!["http://h1:2379".into(), "http://h2:2380".into()],
                cluster_id: default_cluster_id()
            }
        );
        assert!(matches!(
            MasterAddress::parse("etcd://http://h1:2379/prod").unwrap(),
            MasterAddress::Etcd { cluster_id, .. } if cluster_id == "prod"
        ));
        assert_eq!(
            MasterAddress::parse("k8s://pool/rbgctl-master").unwrap(),
            MasterAddress::Kube {
                namespace: "pool".into(),
                lease: "rbgctl-master".into()
            }
        );
        for (spec, why) in [
            ("etcd://", "no endpoint"),
            ("etcd://h1", "no port"),
            ("etcd://h1:2379/a b", "cluster id"),
            ("etcd://h1:2379/a/b", "is not a port"),
            ("k8s://pool", "namespace/lease"),
            ("k8s://Pool/x", "not a valid Kubernetes name"),
            ("redis://h:1", "unknown scheme"),
        ] {
            let e = MasterAddress::parse(spec).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
    }

    #[test]
    fn the_view_round_trips_and_a_foreign_value_is_named() {
        let v = MasterView {
            rpc: "10.0.0.1:50051".into(),
            admin: "10.0.0.1:9003".into(),
            metadata: None,
            id: "m1/42".into(),
        };
        assert_eq!(MasterView::from_json("k", &v.to_json()).unwrap(), v);
        let e = MasterView::from_json("k", b"10.0.0.1:50051")
            .unwrap_err()
            .to_string();
        assert!(e.contains("another program"), "{e}");
        assert_eq!(view_key("c"), "mooncake-store/c/master_view");
    }
}
