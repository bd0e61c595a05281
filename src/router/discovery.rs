//! Workers from the RBG discovery file (`/etc/rbg/config.yaml`, mounted from the group's
//! ConfigMap into every pod of a RoleBasedGroup). The file lists each role's instances with
//! resolvable addresses and named ports:
//!
//! ```yaml
//! group: {name: demo, size: 3, roles: [router, prefill, decode]}
//! roles:
//!   prefill: {size: 2, instances: [{address: demo-prefill-0.s-demo-prefill, ports: {http: 8000, bootstrap: 8998}}, ...]}
//! ```
//!
//! The file is re-read every `rbg_poll_secs`; when its content changes the router's
//! file-sourced workers are made to match. A file that cannot be read or parsed is reported
//! and changes nothing (the workers already known stay).

use crate::router::worker::{Source, WorkerSpec, WorkerType};
use crate::router::Router;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The discovery file the operator writes for a group (mounted from its ConfigMap): the
/// group and each role's instances.
#[derive(Debug, Deserialize, PartialEq)]
pub struct DiscoveryFile {
    #[serde(default)]
    pub group: Option<GroupInfo>,
    #[serde(default)]
    pub roles: BTreeMap<String, RoleInfo>,
}

/// The group a discovery file describes.
#[derive(Debug, Deserialize, PartialEq)]
pub struct GroupInfo {
    pub name: String,
    #[serde(default)]
    pub size: usize,
    #[serde(default)]
    pub roles: Vec<String>,
}

/// One role of the group: its size and the instances there are now.
#[derive(Debug, Deserialize, PartialEq)]
pub struct RoleInfo {
    #[serde(default)]
    pub size: usize,
    #[serde(default)]
    pub instances: Vec<Instance>,
}

/// One instance of a role: its address and its named ports.
#[derive(Debug, Deserialize, PartialEq)]
pub struct Instance {
    pub address: String,
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
}

/// Which roles are workers, and which ports to use.
#[derive(Clone, Debug, Default)]
pub struct RbgSelection {
    pub role: Option<String>,
    pub prefill_role: Option<String>,
    pub decode_role: Option<String>,
    pub port_name: Option<String>,
    pub bootstrap_port_name: Option<String>,
}

/// Reads a discovery file (YAML), or says why it is not one.
pub fn parse(text: &str) -> Result<DiscoveryFile, String> {
    serde_yaml_ng::from_str(text).map_err(|e| format!("not a discovery file: {e}"))
}

/// The HTTP port of an instance: the named one; else its only port; else `http`; else the
/// first by name.
fn http_port(i: &Instance, name: Option<&str>) -> Result<u16, String> {
    if let Some(n) = name {
        return i
            .ports
            .get(n)
            .copied()
            .ok_or_else(|| format!("{} has no port {n:?} (ports: {:?})", i.address, i.ports));
    }
    if i.ports.len() == 1 {
        return Ok(*i.ports.values().next().unwrap_or(&0));
    }
    i.ports
        .get("http")
        .or_else(|| i.ports.values().next())
        .copied()
        .ok_or_else(|| format!("{} lists no ports", i.address))
}

/// The workers a discovery file describes for `sel`. An instance whose port cannot be found is
/// an error naming it (so that a wrong `--rbg-port-name` is seen, not silently ignored).
pub fn workers(file: &DiscoveryFile, sel: &RbgSelection) -> Result<Vec<WorkerSpec>, String> {
    let mut out = Vec::new();
    let roles: Vec<(&String, WorkerType)> = [
        (&sel.role, WorkerType::Regular),
        (&sel.prefill_role, WorkerType::Prefill),
        (&sel.decode_role, WorkerType::Decode),
    ]
    .into_iter()
    .filter_map(|(r, t)| r.as_ref().map(|r| (r, t)))
    .collect();
    for (role, t) in roles {
        let Some(info) = file.roles.get(role) else {
            let known: Vec<&String> = file.roles.keys().collect();
            return Err(format!(
                "role {role:?} is not in the file (roles: {known:?})"
            ));
        };
        for i in &info.instances {
            let port = http_port(i, sel.port_name.as_deref())?;
            let bootstrap_port = match (&sel.bootstrap_port_name, t) {
                (Some(n), WorkerType::Prefill) => i.ports.get(n).copied(),
                _ => None,
            };
            let host = if i.address.contains(':') && !i.address.starts_with('[') {
                format!("[{}]", i.address)
            } else {
                i.address.clone()
            };
            out.push(WorkerSpec {
                worker_type: t,
                bootstrap_port,
                ..WorkerSpec::regular(format!("http://{host}:{port}"))
            });
        }
    }
    Ok(out)
}

/// Polls the file and keeps the registry in step.
pub fn start(router: Arc<Router>) {
    let Some(path) = router.cfg.discovery.rbg_config.clone() else {
        return;
    };
    let sel = RbgSelection {
        role: router.cfg.discovery.rbg_role.clone(),
        prefill_role: router.cfg.discovery.rbg_prefill_role.clone(),
        decode_role: router.cfg.discovery.rbg_decode_role.clone(),
        port_name: router.cfg.discovery.rbg_port_name.clone(),
        bootstrap_port_name: router.cfg.discovery.rbg_bootstrap_port_name.clone(),
    };
    let every = router.cfg.discovery.rbg_poll.0;
    tokio::spawn(async move {
        let mut last: Option<String> = None;
        let mut last_error: Option<String> = None;
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let text = match tokio::fs::read_to_string(&path).await {
                Ok(t) => t,
                Err(e) => {
                    router
                        .metrics
                        .discovery_rejected
                        .fetch_add(1, Ordering::Relaxed);
                    let msg = format!("{}: {e}", path.display());
                    if last_error.as_deref() != Some(&msg) {
                        tracing::warn!(error = %msg, "RBG discovery file unreadable; keeping the workers known");
                        last_error = Some(msg);
                    }
                    continue;
                }
            };
            if last.as_deref() == Some(&text) {
                continue;
            }
            match parse(&text).and_then(|f| workers(&f, &sel)) {
                Ok(specs) => {
                    let listed = specs.len();
                    let specs = crate::router::dp::rank_specs_all(&router, specs).await;
                    // A worker whose ranks are not known yet: the file is read again.
                    let complete =
                        specs.iter().filter(|s| s.dp_rank.unwrap_or(0) == 0).count() == listed;
                    let (added, removed) = router.workers.registry.sync(Source::RbgFile, &specs);
                    for w in &removed {
                        router.forget(&w.url);
                    }
                    for w in &added {
                        crate::router::background::learn_about(router.clone(), w.clone());
                    }
                    tracing::info!(
                        file = %path.display(),
                        workers = specs.len(),
                        added = added.len(),
                        removed = removed.len(),
                        "RBG discovery file read"
                    );
                    last_error = None;
                    if !complete {
                        continue;
                    }
                }
                Err(e) => {
                    router
                        .metrics
                        .discovery_rejected
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(file = %path.display(), error = %e, "RBG discovery file rejected; keeping the workers known");
                }
            }
            last = Some(text);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
group:
  name: demo
  size: 3
  roles: [router, prefill, decode]
roles:
  prefill:
    size: 2
    instances:
      - address: demo-prefill-0.s-demo-prefill
        ports: {http: 8000, bootstrap: 8998}
      - address: demo-prefill-1.s-demo-prefill
        ports: {http: 8000, bootstrap: 8998}
  decode:
    size: 1
    instances:
      - {address: demo-decode-0.s-demo-decode, ports: {port0: 8000}}
  worker:
    size: 1
    instances:
      - {address: "10.0.0.9", ports: {metrics: 9000, http: 30000}}
"#;

    #[test]
    fn pd_roles_and_ports_come_from_the_file() {
        let f = parse(FILE).unwrap();
        assert_eq!(f.group.as_ref().unwrap().name, "demo");
        let sel = RbgSelection {
            prefill_role: Some("prefill".into()),
            decode_role: Some("decode".into()),
            bootstrap_port_name: Some("bootstrap".into()),
            ..RbgSelection::default()
        };
        let w = workers(&f, &sel).unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!(w[0].url, "http://demo-prefill-0.s-demo-prefill:8000");
        assert_eq!(
            (w[0].worker_type, w[0].bootstrap_port),
            (WorkerType::Prefill, Some(8998))
        );
        assert_eq!(w[2].url, "http://demo-decode-0.s-demo-decode:8000");
        assert_eq!(
            (w[2].worker_type, w[2].bootstrap_port),
            (WorkerType::Decode, None)
        );
        let sel = RbgSelection {
            role: Some("worker".into()),
            ..RbgSelection::default()
        };
        assert_eq!(workers(&f, &sel).unwrap()[0].url, "http://10.0.0.9:30000");
    }

    #[test]
    fn mistakes_are_named() {
        let f = parse(FILE).unwrap();
        let sel = RbgSelection {
            role: Some("nope".into()),
            ..RbgSelection::default()
        };
        assert!(workers(&f, &sel).unwrap_err().contains("\"nope\""));
        let sel = RbgSelection {
            role: Some("worker".into()),
            port_name: Some("grpc".into()),
            ..RbgSelection::default()
        };
        assert!(workers(&f, &sel).unwrap_err().contains("no port \"grpc\""));
        assert!(parse("roles: [1, 2").is_err());
    }
}
