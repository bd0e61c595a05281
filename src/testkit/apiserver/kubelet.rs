//! A SIMULATED kubelet: binds the pods the SIMULATED scheduler admits (`scheduler.rs`: a
//! capacity, gangs), gives them pod-network IPs, marks them Running and Ready (unless held),
//! restarts containers whose image changed (or that a test crashes), removes terminating pods.

use super::*;

/// How the simulated kubelet treats pods.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// Time from creation to Running.
    pub start_delay: Duration,
    /// Time a terminating pod takes to go away.
    pub stop_delay: Duration,
    pub tick: Duration,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            start_delay: Duration::from_millis(20),
            stop_delay: Duration::from_millis(50),
            tick: Duration::from_millis(20),
        }
    }
}

/// A SIMULATED kubelet for the stand-in: no containers run; it only writes the pod status a
/// kubelet would.
#[derive(Clone)]
pub struct Kubelet {
    api: ApiServer,
    cfg: KubeletConfig,
    held: Arc<Mutex<Vec<Selector>>>,
    failed: Arc<Mutex<HashSet<String>>>,
    /// Crashes of a pod's first container not yet reported, by pod name.
    crashes: Arc<Mutex<HashMap<String, i64>>>,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    /// Image references that name the same content (a retag): they share a digest.
    same_digest: Arc<Mutex<HashMap<String, String>>>,
    /// Pods that may hold a node at once (none: no limit).
    capacity: Arc<Mutex<Option<usize>>>,
    /// Images whose containers run but never become Ready (a bad release).
    bad_images: Arc<Mutex<HashSet<String>>>,
}

impl Kubelet {
    /// A SIMULATED kubelet for `api`.
    pub fn new(api: &ApiServer, cfg: KubeletConfig) -> Kubelet {
        Kubelet {
            api: api.clone(),
            cfg,
            held: Default::default(),
            failed: Default::default(),
            crashes: Default::default(),
            same_digest: Default::default(),
            seen: Default::default(),
            capacity: Default::default(),
            bad_images: Default::default(),
        }
    }

    /// Containers running `image` never become Ready, as a release that does not start.
    pub fn bad_image(&self, image: &str) {
        self.bad_images.lock().insert(image.to_string());
    }

    /// At most `pods` pods hold a node at once (`None`: no limit); the others stay Pending,
    /// unschedulable, as on a cluster that is full.
    pub fn set_capacity(&self, pods: Option<usize>) {
        *self.capacity.lock() = pods;
    }

    /// Pods matching `selector` run but are not Ready until released.
    /// `retag` names the same image content as `original` (another tag of the same digest):
    /// like a real kubelet, its containers then report the same `imageID`.
    pub fn same_digest(&self, retag: &str, original: &str) {
        self.same_digest
            .lock()
            .insert(retag.to_string(), original.to_string());
    }

    /// The `imageID` a kubelet reports: the content's digest, not the tag.
    fn image_id(&self, image: &str) -> String {
        let content = self
            .same_digest
            .lock()
            .get(image)
            .cloned()
            .unwrap_or_else(|| image.to_string());
        format!(
            "sim://sha256:{:016x}",
            crate::hash::fnv1a(content.as_bytes())
        )
    }

    /// Pods matching the label selector `selector` stay Pending until released.
    pub fn hold(&self, selector: &str) {
        if let Ok(s) = Selector::parse(selector) {
            self.held.lock().push(s);
        }
    }

    /// Releases every held pod.
    pub fn release_all(&self) {
        self.held.lock().clear();
    }

    /// The first container of pod `name` crashes once and is restarted (its restart count
    /// goes up by one, its last state a termination with exit code 1), as a kubelet reports
    /// a container that exited under `restartPolicy: Always`.
    pub fn crash(&self, name: &str) {
        *self.crashes.lock().entry(name.to_string()).or_insert(0) += 1;
    }

    /// Marks a pod's containers as failed (phase Failed).
    pub fn fail_pod(&self, name: &str) {
        self.failed.lock().insert(name.to_string());
    }

    /// Runs on the current tokio runtime until the runtime stops.
    pub fn spawn(&self) {
        let k = self.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(k.cfg.tick);
            loop {
                t.tick().await;
                k.step();
            }
        });
    }

    /// Runs on a thread of its own.
    pub fn spawn_thread(&self) {
        let k = self.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(k.cfg.tick);
            k.step();
        });
    }

    /// One pass over every pod.
    pub fn step(&self) {
        let r = ApiServer::resource("pods").expect("pods are served");
        let now = Instant::now();
        let mut inner = self.api.inner.lock();
        let pods: Vec<(Key, Value)> = inner
            .objects
            .iter()
            .filter(|((p, _, _), _)| *p == "pods")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let held = self.held.lock().clone();
        let mut seen = self.seen.lock();
        let live: HashSet<String> = pods
            .iter()
            .filter_map(|(_, p)| p.pointer("/metadata/uid").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        seen.retain(|k, _| live.contains(k.split('/').next().unwrap_or(k)));
        let all: Vec<Value> = pods.iter().map(|(_, p)| p.clone()).collect();
        let capacity = *self.capacity.lock();
        let unschedulable = scheduler::schedule(
            &all,
            |(resource, ns, name)| {
                inner
                    .objects
                    .get(&(*resource, ns.clone(), name.clone()))
                    .cloned()
            },
            capacity,
        );
        for (idx, (key, pod)) in pods.into_iter().enumerate() {
            let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
            let first = *seen.entry(uid.clone()).or_insert(now);
            if pod.pointer("/metadata/deletionTimestamp").is_some() {
                let since = *seen.entry(format!("{uid}/deleting")).or_insert(now);
                if now.duration_since(since) >= self.cfg.stop_delay {
                    inner.remove(r, &key.1, &key.2);
                }
                continue;
            }
            if now.duration_since(first) < self.cfg.start_delay {
                continue;
            }
            let unbound = pod.pointer("/spec/nodeName").is_none();
            let want = match unschedulable.get(&idx) {
                Some(why) if unbound => json!({"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": why, "lastTransitionTime": null}]}),
                _ => self.pod_status(&pod, idx, &held),
            };
            let bind = unbound && !unschedulable.contains_key(&idx);
            if pod.get("status") != Some(&want) {
                let mut new = pod.clone();
                new["status"] = want;
                if bind {
                    new["spec"]["nodeName"] = json!(format!("standin-node-{}", idx % 3));
                }
                let rv = inner.next_rv();
                new["metadata"]["resourceVersion"] = json!(rv.to_string());
                inner.objects.insert(key.clone(), new.clone());
                inner.record(r, &key.1, "MODIFIED", Some(pod), new);
            }
        }
    }

    fn pod_status(&self, pod: &Value, idx: usize, held: &[Selector]) -> Value {
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        let old = pod.get("status").cloned().unwrap_or(json!({}));
        let failed = self.failed.lock().contains(name);
        let bad = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                c["image"]
                    .as_str()
                    .is_some_and(|i| self.bad_images.lock().contains(i))
            });
        let ready = !failed && !bad && !held.iter().any(|s| s.matches(pod));
        let mut crashed = self.crashes.lock().remove(name).unwrap_or(0);
        let mut statuses = Vec::new();
        for c in pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let cname = c["name"].as_str().unwrap_or("");
            let image = c["image"].as_str().unwrap_or("");
            let prev = old
                .get("containerStatuses")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|s| s["name"] == cname));
            let mut restarts = prev.and_then(|p| p["restartCount"].as_i64()).unwrap_or(0);
            if prev.is_some_and(|p| p["image"].as_str() != Some(image)) {
                restarts += 1;
            }
            let last = prev.map_or(Value::Null, |p| p["lastState"].clone());
            let last = if crashed > 0 {
                restarts += std::mem::take(&mut crashed);
                json!({"terminated": {"exitCode": 1, "reason": "Error"}})
            } else {
                last
            };
            let state = if failed {
                json!({"terminated": {"exitCode": 1, "reason": "Error"}})
            } else {
                json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
            };
            let mut status = json!({"name": cname, "image": image,
                "imageID": self.image_id(image), "ready": ready, "started": !failed,
                "restartCount": restarts, "state": state});
            if !last.is_null() {
                status["lastState"] = last;
            }
            statuses.push(status);
        }
        let ip = old
            .get("podIP")
            .and_then(Value::as_str)
            .map(str::to_string)
            // A pod network, as a CNI assigns (never loopback: EndpointSlices refuse it).
            .unwrap_or_else(|| format!("10.244.{}.{}", (idx / 250) % 250, idx % 250 + 1));
        let cond = |t: &str, ok: bool| {
            json!({"type": t, "status": if ok {"True"} else {"False"},
                   "lastTransitionTime": null})
        };
        json!({
            "phase": if failed {"Failed"} else {"Running"},
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "conditions": [cond("PodScheduled", true), cond("Initialized", true),
                           cond("ContainersReady", ready), cond("Ready", ready)],
            "containerStatuses": statuses,
        })
    }
}
