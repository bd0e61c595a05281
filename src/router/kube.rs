//! Workers from Kubernetes pods (`--service-discovery --selector k=v ...`), kept current with a
//! plain-REST list + watch: a pod is a worker while its phase is Running, its Ready condition is
//! True and it has an IP; its URL is `http://<podIP>:<service_discovery_port>`. A prefill pod's
//! bootstrap port comes from its `sglang.ai/bootstrap-port` annotation. The watch resumes from
//! the last resourceVersion (bookmarks keep it fresh); 410 Gone or any error lists again, with
//! backoff.

use crate::backoff::Backoff;
use crate::kube::object::{ObjectMeta, Pod};
use crate::kube::{encode, Kube, KubeConfig, KubeError};
use crate::router::config::parse_selector;
use crate::router::vllm::Connector;
use crate::router::worker::{Source, WorkerSpec, WorkerType};
use crate::router::{Router, RouterError};
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// The worker a pod stands for, if it is Running and Ready with an IP.
pub fn pod_worker(pod: &Value, port: u16, t: WorkerType) -> Option<WorkerSpec> {
    let pod = Pod::of(pod);
    let ip = pod.status.pod_ip;
    if pod.metadata.is_terminating() || !pod.is_ready() || ip.is_empty() {
        return None;
    }
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let bootstrap_port = match t {
        WorkerType::Prefill => pod
            .metadata
            .annotation("sglang.ai/bootstrap-port")
            .trim()
            .parse()
            .ok(),
        _ => None,
    };
    let m = &pod.metadata;
    // vLLM PD: the engine's connector as SMG reads it from annotations. An unknown one is
    // refused loudly: requests to that worker would recompute the prompt on decode.
    let kv_connector = match m.annotation("smg.ai/kv-connector").trim() {
        "" => None,
        c => match Connector::parse(c) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(pod = %m.key(), "worker left out: {e}");
                return None;
            }
        },
    };
    let kv_engine_id = Some(m.annotation("smg.ai/kv-engine-id").trim())
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    Some(WorkerSpec {
        worker_type: t,
        bootstrap_port: bootstrap_port.or_else(|| {
            (t == WorkerType::Prefill)
                .then(|| m.annotation("smg.ai/bootstrap-port").trim().parse().ok())
                .flatten()
        }),
        kv_connector,
        kv_engine_id,
        ..WorkerSpec::regular(format!("http://{host}:{port}"))
    })
}

fn pod_key(pod: &Value) -> String {
    ObjectMeta::of(pod).key()
}

/// Pods of one selector, by namespace/name.
#[derive(Default)]
pub struct PodSet {
    pub workers: BTreeMap<String, WorkerSpec>,
}

impl PodSet {
    /// Applies a watch event; returns true when the worker set changed.
    pub fn apply(&mut self, kind: &str, pod: &Value, port: u16, t: WorkerType) -> bool {
        let key = pod_key(pod);
        let next = match kind {
            "ADDED" | "MODIFIED" => pod_worker(pod, port, t),
            "DELETED" => None,
            _ => return false,
        };
        let before = self.workers.get(&key).cloned();
        match &next {
            Some(w) => self.workers.insert(key, w.clone()),
            None => self.workers.remove(&key),
        };
        before != next
    }

    /// Replaces everything with a list's items.
    pub fn reset(&mut self, items: &[Value], port: u16, t: WorkerType) {
        self.workers = items
            .iter()
            .filter_map(|p| pod_worker(p, port, t).map(|w| (pod_key(p), w)))
            .collect();
    }
}

/// Starts one watcher per selector given.
pub fn start(router: Arc<Router>) -> Result<(), RouterError> {
    let kube = Kube::new(KubeConfig::infer()?)?;
    let c = &router.cfg.discovery;
    let mut watches = Vec::new();
    if router.pd() {
        watches.push((
            WorkerType::Prefill,
            parse_selector("router.prefill_selector", &c.prefill_selector)?,
        ));
        watches.push((
            WorkerType::Decode,
            parse_selector("router.decode_selector", &c.decode_selector)?,
        ));
    } else {
        watches.push((
            WorkerType::Regular,
            parse_selector("router.selector", &c.selector)?,
        ));
    }
    let sets: Arc<Mutex<HashMap<WorkerType, PodSet>>> = Arc::default();
    for (t, sel) in watches.into_iter().filter(|(_, s)| !s.is_empty()) {
        let selector = sel
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let base = match &c.namespace {
            Some(ns) => format!("/api/v1/namespaces/{ns}/pods"),
            None => "/api/v1/pods".to_string(),
        };
        let (kube, router, sets) = (kube.clone(), router.clone(), sets.clone());
        tokio::spawn(async move {
            watch_loop(kube, router, sets, t, base, selector).await;
        });
    }
    Ok(())
}

async fn publish(router: &Router, sets: &Mutex<HashMap<WorkerType, PodSet>>) {
    let wanted: Vec<WorkerSpec> = sets
        .lock()
        .values()
        .flat_map(|s| s.workers.values().cloned())
        .collect();
    let wanted = crate::router::dp::rank_specs_all(router, wanted).await;
    let (_, removed) = router.workers.registry.sync(Source::Kubernetes, &wanted);
    for w in removed {
        router.forget(&w.url);
    }
}

async fn watch_loop(
    kube: Kube,
    router: Arc<Router>,
    sets: Arc<Mutex<HashMap<WorkerType, PodSet>>>,
    t: WorkerType,
    base: String,
    selector: String,
) {
    let port = router.cfg.discovery.port;
    let sel = encode(&selector);
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let result: Result<(), KubeError> = async {
            // Paged (`limit` and `continue`), as a large cluster needs.
            let (items, rv) = kube.list_all(&base, &format!("&labelSelector={sel}")).await?;
            sets.lock().entry(t).or_default().reset(&items, port, t);
            publish(&router, &sets).await;
            tracing::info!(selector = %selector, pods = items.len(), "pods listed");
            let mut rv = rv;
            loop {
                let path = format!(
                    "{base}?labelSelector={sel}&watch=1&allowWatchBookmarks=true&timeoutSeconds=290&resourceVersion={}",
                    encode(&rv)
                );
                let mut stream = kube.watch(&path).await?;
                while let Some(ev) = stream.next(Duration::from_secs(330)).await? {
                    let seen = ObjectMeta::of(&ev.object).resource_version;
                    if !seen.is_empty() {
                        rv = seen.to_string();
                    }
                    match ev.kind.as_str() {
                        "ERROR" => {
                            let code = ev.object.get("code").and_then(Value::as_u64).unwrap_or(0) as u16;
                            let message = ev.object.get("message").and_then(Value::as_str).unwrap_or("").to_string();
                            return Err(KubeError::Status { path: path.clone(), code, message });
                        }
                        "BOOKMARK" => {}
                        kind => {
                            let changed = sets.lock().entry(t).or_default().apply(kind, &ev.object, port, t);
                            if changed {
                                publish(&router, &sets).await;
                            }
                        }
                    }
                }
            }
        }
        .await;
        if let Err(e) = result {
            if e.code() == Some(410) {
                tracing::info!(selector = %selector, "watch expired (410 Gone); listing again");
                backoff.reset();
                continue;
            }
            tracing::warn!(selector = %selector, error = %e, "pod watch failed; keeping the workers known");
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, ready: &str, ip: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns",
                "annotations": {"sglang.ai/bootstrap-port": "8998"}},
               "status": {"phase": phase, "podIP": ip,
                "conditions": [{"type": "Ready", "status": ready}]}})
    }

    #[test]
    fn smg_annotations_give_a_vllm_worker_its_connector_and_engine() {
        let mut p = pod("p", "Running", "True", "10.1.0.7");
        p["metadata"]["annotations"] = json!({"smg.ai/kv-connector": "NixlConnector",
            "smg.ai/kv-engine-id": "e-7", "smg.ai/bootstrap-port": "8997"});
        let w = pod_worker(&p, 8000, WorkerType::Prefill).unwrap();
        assert_eq!(w.kv_connector, Some(Connector::Nixl));
        assert_eq!(w.kv_engine_id.as_deref(), Some("e-7"));
        assert_eq!(w.bootstrap_port, Some(8997));
        // An unknown connector: left out (and said), never served with a recompute.
        p["metadata"]["annotations"]["smg.ai/kv-connector"] = json!("LMCacheConnectorV1");
        assert!(pod_worker(&p, 8000, WorkerType::Prefill).is_none());
    }

    #[test]
    fn only_running_ready_pods_are_workers() {
        let mut s = PodSet::default();
        assert!(!s.apply(
            "ADDED",
            &pod("a", "Pending", "False", ""),
            8000,
            WorkerType::Regular
        ));
        assert!(s.workers.is_empty());
        assert!(s.apply(
            "MODIFIED",
            &pod("a", "Running", "True", "10.1.0.5"),
            8000,
            WorkerType::Regular
        ));
        assert_eq!(s.workers["ns/a"].url, "http://10.1.0.5:8000");
        assert!(!s.apply(
            "MODIFIED",
            &pod("a", "Running", "True", "10.1.0.5"),
            8000,
            WorkerType::Regular
        ));
        assert!(s.apply(
            "MODIFIED",
            &pod("a", "Running", "False", "10.1.0.5"),
            8000,
            WorkerType::Regular
        ));
        assert!(s.workers.is_empty());
        assert!(s.apply(
            "ADDED",
            &pod("p", "Running", "True", "fd00::7"),
            30000,
            WorkerType::Prefill
        ));
        let w = &s.workers["ns/p"];
        assert_eq!(
            (w.url.as_str(), w.bootstrap_port),
            ("http://[fd00::7]:30000", Some(8998))
        );
        assert!(s.apply(
            "DELETED",
            &pod("p", "Running", "True", "fd00::7"),
            30000,
            WorkerType::Prefill
        ));
        let mut terminating = pod("t", "Running", "True", "10.0.0.1");
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(pod_worker(&terminating, 1, WorkerType::Regular).is_none());
        s.reset(
            &[
                pod("x", "Running", "True", "10.0.0.2"),
                pod("y", "Failed", "True", "10.0.0.3"),
            ],
            80,
            WorkerType::Decode,
        );
        assert_eq!(s.workers.len(), 1);
    }
}
