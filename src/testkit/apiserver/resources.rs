//! The resources the stand-in serves, and the validation the real server applies to them.

use super::*;

/// A resource type the stand-in serves (every one is namespaced).
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    pub group: &'static str,
    pub versions: &'static [&'static str],
    pub plural: &'static str,
    /// The full name, `plural.group` (the plural alone in the core group), as a CRD is
    /// named: what objects are stored under (two groups may share a plural, as Volcano's and
    /// scheduler-plugins' `podgroups` do).
    pub name: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub short_names: &'static [&'static str],
    pub status: bool,
    /// The `scale` subresource, as a CRD's `subresources.scale` declares it.
    pub scale: Option<ScalePaths>,
}

/// Where a CRD keeps what its `scale` subresource reads and writes (JSON pointers).
#[derive(Debug, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: &'static str,
    pub status_replicas: &'static str,
    pub label_selector: Option<&'static str>,
}

/// The resource types the stand-in serves, with their API groups and versions.
pub const RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        versions: &["v1"],
        plural: "pods",
        name: "pods",
        singular: "pod",
        kind: "Pod",
        short_names: &[],
        status: true,
        scale: None,
    },
    Resource {
        group: "",
        versions: &["v1"],
        plural: "services",
        name: "services",
        singular: "service",
        kind: "Service",
        short_names: &["svc"],
        status: true,
        scale: None,
    },
    Resource {
        group: "",
        versions: &["v1"],
        plural: "configmaps",
        name: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        short_names: &["cm"],
        status: false,
        scale: None,
    },
    Resource {
        group: "",
        versions: &["v1"],
        plural: "events",
        name: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        status: false,
        scale: None,
    },
    Resource {
        group: "discovery.k8s.io",
        versions: &["v1"],
        plural: "endpointslices",
        name: "endpointslices.discovery.k8s.io",
        singular: "endpointslice",
        kind: "EndpointSlice",
        short_names: &[],
        status: false,
        scale: None,
    },
    Resource {
        group: "coordination.k8s.io",
        versions: &["v1"],
        plural: "leases",
        name: "leases.coordination.k8s.io",
        singular: "lease",
        kind: "Lease",
        short_names: &[],
        status: false,
        scale: None,
    },
    Resource {
        group: "apps",
        versions: &["v1"],
        plural: "controllerrevisions",
        name: "controllerrevisions.apps",
        singular: "controllerrevision",
        kind: "ControllerRevision",
        short_names: &[],
        status: false,
        scale: None,
    },
    Resource {
        group: "workloads.x-k8s.io",
        versions: &["v1alpha2", "v1alpha1"],
        plural: "rolebasedgroups",
        name: "rolebasedgroups.workloads.x-k8s.io",
        singular: "rolebasedgroup",
        kind: "RoleBasedGroup",
        short_names: &["rbg"],
        status: true,
        scale: None,
    },
    Resource {
        group: "workloads.x-k8s.io",
        versions: &["v1alpha2"],
        plural: "coordinatedpolicies",
        name: "coordinatedpolicies.workloads.x-k8s.io",
        singular: "coordinatedpolicy",
        kind: "CoordinatedPolicy",
        short_names: &["cpolicy"],
        status: true,
        scale: None,
    },
    Resource {
        group: "workloads.x-k8s.io",
        versions: &["v1alpha2"],
        plural: "rolebasedgroupscalingadapters",
        name: "rolebasedgroupscalingadapters.workloads.x-k8s.io",
        singular: "rolebasedgroupscalingadapter",
        kind: "RoleBasedGroupScalingAdapter",
        short_names: &["rbgsa"],
        status: true,
        scale: Some(ScalePaths {
            spec_replicas: "/spec/replicas",
            status_replicas: "/status/replicas",
            label_selector: Some("/status/selector"),
        }),
    },
    Resource {
        group: "workloads.x-k8s.io",
        versions: &["v1alpha2"],
        plural: "rolebasedgroupsets",
        name: "rolebasedgroupsets.workloads.x-k8s.io",
        singular: "rolebasedgroupset",
        kind: "RoleBasedGroupSet",
        short_names: &["rbgs"],
        status: true,
        scale: Some(ScalePaths {
            spec_replicas: "/spec/replicas",
            status_replicas: "/status/replicas",
            label_selector: None,
        }),
    },
    Resource {
        group: "policy",
        versions: &["v1"],
        plural: "poddisruptionbudgets",
        name: "poddisruptionbudgets.policy",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        short_names: &["pdb"],
        status: true,
        scale: None,
    },
    // Gang scheduling's PodGroups, of the two schedulers the operator writes them for (served
    // as if their CRDs were installed; `ApiServer::uninstall` takes one away).
    Resource {
        group: "scheduling.x-k8s.io",
        versions: &["v1alpha1"],
        plural: "podgroups",
        name: "podgroups.scheduling.x-k8s.io",
        singular: "podgroup",
        kind: "PodGroup",
        short_names: &["pg"],
        status: true,
        scale: None,
    },
    Resource {
        group: "scheduling.volcano.sh",
        versions: &["v1beta1"],
        plural: "podgroups",
        name: "podgroups.scheduling.volcano.sh",
        singular: "podgroup",
        kind: "PodGroup",
        short_names: &["pg", "podgroup-v1beta1"],
        status: true,
        scale: None,
    },
];

pub(super) fn api_version(r: &Resource, version: &str) -> String {
    if r.group.is_empty() {
        version.to_string()
    } else {
        format!("{}/{version}", r.group)
    }
}

pub(super) fn is_dns_subdomain(s: &str) -> bool {
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

pub(super) use crate::kube::is_dns_label;

pub(super) fn label_value_ok(v: &str) -> bool {
    v.len() <= 63
        && (v.is_empty()
            || (v.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && v.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// Validation the real server does for the fields rbgctl writes.
pub(super) fn validate(r: &Resource, obj: &Value) -> Result<(), ApiError> {
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
    if r.plural == "endpointslices" {
        // As the real server's ValidateEndpointIP: loopback, link-local ... are refused.
        for (i, e) in obj["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for (j, a) in e["addresses"].as_array().into_iter().flatten().enumerate() {
                let ip = a.as_str().unwrap_or("");
                if let Err(why) = crate::kube::validation::endpoint_ip(ip) {
                    return Err(bad(format!(
                        "endpoints[{i}].addresses[{j}]: Invalid value: {ip:?}: {why}"
                    )));
                }
            }
        }
    }
    let count = |at: &str| -> Result<(), ApiError> {
        match obj.pointer(at) {
            None => Ok(()),
            Some(v)
                if v.as_i64()
                    .is_some_and(|n| (0..=i32::MAX as i64).contains(&n)) =>
            {
                Ok(())
            }
            Some(v) => Err(bad(format!(
                "{}: Invalid value: {v}: should be an integer from 0 to 2147483647",
                at.trim_start_matches('/').replace('/', ".")
            ))),
        }
    };
    let required_str = |at: &str| -> Result<(), ApiError> {
        match obj.pointer(at).and_then(Value::as_str) {
            Some(s) if !s.is_empty() => Ok(()),
            _ => Err(bad(format!(
                "{}: Required value",
                at.trim_start_matches('/').replace('/', ".")
            ))),
        }
    };
    match r.plural {
        "rolebasedgroupscalingadapters" => {
            count("/spec/replicas")?;
            required_str("/spec/scaleTargetRef/name")?;
            required_str("/spec/scaleTargetRef/role")?;
        }
        "rolebasedgroupsets" => {
            count("/spec/replicas")?;
            if obj
                .pointer("/spec/groupTemplate/spec/roles")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                return Err(bad(
                    "spec.groupTemplate.spec.roles: Required value (at least one role)".into(),
                ));
            }
        }
        _ => {}
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

/// The defaults a CRD's schema gives fields left out (applied on every write, as the real
/// server does when it decodes a request).
pub(super) fn default_fields(r: &Resource, obj: &mut Value) {
    if r.plural == "rolebasedgroupsets" && obj.pointer("/spec/replicas").is_none() {
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("replicas".into(), json!(1));
        }
    }
}

/// A pod's spec with container images blanked: the part the real server keeps immutable.
pub(super) fn pod_spec_sans_images(spec: &Value) -> Value {
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
pub(super) fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    o
}
