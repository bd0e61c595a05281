//! `rbgctl operator` end to end: the real binary against the in-process API server stand-in
//! (`rbgctl::testkit::apiserver`) with its SIMULATED kubelet. The seeds' RoleBasedGroups are the
//! acceptance cases (copied unchanged into `tests/seeds/`).

use crate::common;

use common::wait_until;
use rbgctl::launch::{self, Launcher, Process};
use rbgctl::operator::OperatorConfig;
use rbgctl::testkit::apiserver::{ApiServer, Kubelet, KubeletConfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NS: &str = "default";
const T: Duration = Duration::from_secs(20);

struct Env {
    launcher: Launcher,
    api: ApiServer,
    kubelet: Kubelet,
    kubeconfig: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn env() -> Env {
    let api = ApiServer::new();
    let port = api.serve().expect("stand-in listens");
    let kubelet = Kubelet::new(&api, KubeletConfig::default());
    kubelet.spawn_thread();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    std::fs::write(&kubeconfig, ApiServer::kubeconfig(port, NS)).unwrap();
    Env {
        launcher: common::launcher(),
        api,
        kubelet,
        kubeconfig,
        _dir: dir,
    }
}

/// A running operator and its metrics port.
struct Operator {
    process: Process,
    metrics_port: u16,
}

impl std::ops::Deref for Operator {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.process
    }
}

impl std::ops::DerefMut for Operator {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.process
    }
}

impl Operator {
    /// Group reconciles started so far (`rbgctl_operator_reconciles_total{kind="group"}`).
    fn reconciles(&self) -> u64 {
        let (_, text) = common::http(self.metrics_port, "GET", "/metrics", b"");
        text.lines()
            .find_map(|l| l.strip_prefix("rbgctl_operator_reconciles_total{kind=\"group\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    /// Waits until `n` more reconciles have started. One reconcile of a group starts only
    /// after the previous one of that group has finished, so with one group this proves
    /// `n - 1` whole reconciles ran after this call.
    fn wait_reconciles(&self, n: u64) {
        let seen = self.reconciles();
        assert!(
            wait_until(T, || self.reconciles() >= seen + n),
            "no reconcile after {seen}"
        );
    }
}

impl Env {
    /// Waits until the operator has observed the group's latest generation, then until a
    /// reconcile that started after that has finished: what it does for that spec is done.
    fn settled(&self, op: &Operator, name: &str) {
        assert!(wait_until(T, || {
            let g = self.group(name);
            g["status"]["observedGeneration"] == g["metadata"]["generation"]
        }));
        op.wait_reconciles(2);
    }

    fn operator(&self, identity: &str) -> Operator {
        self.operator_with(identity, |_| {})
    }

    /// An operator on this API server (metrics on a kernel-chosen port, a resync every second,
    /// no write throttle, short lease and watches), then changed by `change`.
    fn operator_with(&self, identity: &str, change: impl FnOnce(&mut OperatorConfig)) -> Operator {
        let mut cfg = OperatorConfig {
            metrics_port: 0,
            metrics_host: "127.0.0.1".into(),
            resync_secs: 1,
            lease_duration_secs: 2,
            watch_timeout_secs: 30,
            kube_api_qps: 0.0,
            identity: Some(identity.into()),
            kubeconfig: Some(self.kubeconfig.clone()),
            ..OperatorConfig::default()
        };
        change(&mut cfg);
        let child = self
            .launcher
            .spawn::<launch::Operator>(&format!("operator-{identity}"), cfg)
            .expect("the operator starts");
        Operator {
            metrics_port: child.addrs.metrics.map_or(0, |a| a.port()),
            process: child.process,
        }
    }

    fn group(&self, name: &str) -> Value {
        self.api
            .get("rolebasedgroups", NS, name)
            .unwrap_or(Value::Null)
    }

    fn ready(&self, name: &str) -> bool {
        let g = self.group(name);
        g.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            && g["status"]["observedGeneration"] == g["metadata"]["generation"]
    }

    fn pods(&self, selector: &str) -> BTreeMap<String, Value> {
        self.api
            .list("pods", NS, selector)
            .into_iter()
            .map(|p| (p["metadata"]["name"].as_str().unwrap().to_string(), p))
            .collect()
    }

    fn uids(&self, selector: &str) -> BTreeMap<String, String> {
        self.pods(selector)
            .into_iter()
            .map(|(n, p)| (n, p["metadata"]["uid"].as_str().unwrap().to_string()))
            .collect()
    }

    fn events(&self, reason: &str) -> Vec<Value> {
        self.api
            .list("events", NS, "")
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    }
}

impl Env {
    /// Runs the real `kubectl` against the stand-in (discovery cache in the test's folder).
    /// Without kubectl on the PATH, CI fails; elsewhere the scale goes through the same
    /// `scale` subresource with the stand-in's client, and the test says so.
    fn kubectl_scale(&self, resource: &str, replicas: u32) {
        let cache = self._dir.path().join("kubectl-cache");
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&cache)
            .args(["scale", resource, "--replicas", &replicas.to_string()])
            .output();
        match out {
            Ok(o) => assert!(
                o.status.success(),
                "kubectl scale {resource}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(err) if std::env::var_os("CI").is_none() => {
                eprintln!("kubectl not runnable ({err}): scaling {resource} through the stand-in's client");
                let (kind, name) = resource.split_once('/').unwrap();
                let plural = match kind {
                    "rbgsa" => "rolebasedgroupscalingadapters",
                    "rbgs" => "rolebasedgroupsets",
                    k => panic!("no plural for {k}"),
                };
                self.api.scale(plural, NS, name, replicas.into()).unwrap();
            }
            Err(err) => panic!("CI needs kubectl on the PATH: {err}"),
        }
    }

    fn adapter(&self, name: &str) -> Option<Value> {
        self.api.get("rolebasedgroupscalingadapters", NS, name)
    }

    fn role_replicas(&self, group: &str, role: &str) -> Option<u64> {
        self.group(group)["spec"]["roles"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == role)?
            .get("replicas")?
            .as_u64()
    }
}

fn seed(file: &str) -> Vec<Value> {
    let text =
        std::fs::read_to_string(format!("{}/tests/seeds/{file}", env!("CARGO_MANIFEST_DIR")))
            .unwrap();
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"] == "RoleBasedGroup" {
            out.push(v);
        }
    }
    out
}

fn sel(group: &str, role: &str) -> String {
    format!("rolebasedgroup.workloads.x-k8s.io/name={group},rolebasedgroup.workloads.x-k8s.io/role={role}")
}

fn env_of(pod: &Value, name: &str) -> Option<String> {
    pod["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

#[test]
fn every_seed_group_reconciles_to_ready_with_the_names_it_addresses() {
    let e = env();
    let _op = e.operator("a");
    for file in [
        "002-sglang-demo.yaml",
        "003-sglang-mooncake-smg-v2.yaml",
        "003-vllm-pd-with-mooncake-demo.yaml",
        "000-pd-disaggregated-with-mooncake.yaml",
    ] {
        for g in seed(file) {
            let name = g["metadata"]["name"].as_str().unwrap().to_string();
            e.api.create("rolebasedgroups", NS, g.clone()).unwrap();
            assert!(
                wait_until(T, || e.ready(&name)),
                "{file}: {name} not Ready: {}",
                e.group(&name)["status"]
            );
            let st = e.group(&name)["status"].clone();
            for (i, r) in g["spec"]["roles"].as_array().unwrap().iter().enumerate() {
                let role = r["name"].as_str().unwrap();
                let want = r["replicas"].as_u64().unwrap_or(1);
                let rs = st["roleStatuses"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["name"] == role)
                    .unwrap();
                assert_eq!(
                    (rs["replicas"].as_u64(), rs["readyReplicas"].as_u64()),
                    (Some(want), Some(want)),
                    "{name}/{role}"
                );
                let pods = e.pods(&sel(&name, role));
                assert_eq!(pods.len() as u64, want, "{name}/{role}: {:?}", pods.keys());
                let stateless = r
                    .pointer("/annotations/instance.rolebasedgroup.workloads.x-k8s.io~1pattern")
                    == Some(&json!("Stateless"));
                for (k, (pname, p)) in pods.iter().enumerate() {
                    if stateless {
                        let prefix = format!("{name}-{role}-");
                        let suffix = pname.strip_prefix(&prefix).unwrap();
                        // generateName's alphabet; an all-digit suffix is rare but legal.
                        assert!(
                            suffix.len() == 5
                                && suffix
                                    .bytes()
                                    .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
                            "{pname}"
                        );
                    } else {
                        assert_eq!(pname, &format!("{name}-{role}-{k}"));
                        assert_eq!(env_of(p, "RBG_ROLE_INDEX"), Some(k.to_string()));
                    }
                    assert_eq!(p["spec"]["hostname"], json!(pname));
                    assert_eq!(p["spec"]["subdomain"], json!(format!("s-{name}-{role}")));
                    assert_eq!(
                        p["metadata"]["labels"]["rbg.workloads.x-k8s.io/group-name"],
                        json!(name)
                    );
                    assert_eq!(env_of(p, "RBG_GROUP_NAME").as_deref(), Some(name.as_str()));
                    assert_eq!(env_of(p, "RBG_ROLE_NAME").as_deref(), Some(role));
                    // The user's own env is kept, after ours.
                    if let Some(first) = r
                        .pointer("/template/spec/containers/0/env/0/name")
                        .and_then(Value::as_str)
                    {
                        assert!(
                            env_of(p, first).is_some() || first == "POD_IP",
                            "{pname} lost {first}"
                        );
                    }
                    assert_eq!(
                        p["metadata"]["ownerReferences"][0]["uid"],
                        e.group(&name)["metadata"]["uid"]
                    );
                    let _ = i;
                }
                // Both Service names exist for these v1alpha1 groups.
                let s = e
                    .api
                    .get("services", NS, &format!("s-{name}-{role}"))
                    .unwrap();
                assert_eq!(s["spec"]["clusterIP"], "None");
                assert!(e
                    .api
                    .get("services", NS, &format!("{name}-{role}"))
                    .is_some());
                // The legacy Service's endpoints follow the pods (named by hostname).
                let want: Vec<String> = pods.keys().cloned().collect();
                let hosts = || -> Vec<String> {
                    e.api
                        .get("endpointslices", NS, &format!("{name}-{role}-rbgctl"))
                        .and_then(|s| s["endpoints"].as_array().cloned())
                        .unwrap_or_default()
                        .iter()
                        .filter(|x| x["conditions"]["ready"] == true)
                        .filter_map(|x| x["hostname"].as_str().map(str::to_string))
                        .collect()
                };
                assert!(
                    wait_until(T, || hosts() == want),
                    "{name}/{role}: {:?}",
                    hosts()
                );
            }
            let cm = e.api.get("configmaps", NS, &name).unwrap();
            let cfg: Value =
                serde_yaml_ng::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
            assert_eq!(cfg["group"]["name"], json!(name));
            assert_eq!(
                cfg["group"]["size"].as_u64(),
                Some(g["spec"]["roles"].as_array().unwrap().len() as u64)
            );
        }
    }
    // The addresses the seeds write resolve to pods and Services that exist.
    assert!(e
        .api
        .get("pods", NS, "sglang-demo-mooncake-master-0")
        .is_some());
    assert!(e
        .api
        .get("services", NS, "sglang-demo-mooncake-master")
        .is_some());
    assert!(e
        .api
        .get("services", NS, "s-sglang-mooncake-smg-v2-mooncake-master")
        .is_some());
    assert!(e
        .api
        .get("pods", NS, "vllm-pd-with-mooncake-demo-prefill-0")
        .is_some());
    let cm = e.api.get("configmaps", NS, "sglang-demo").unwrap();
    let cfg: Value = serde_yaml_ng::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        cfg["roles"]["mooncake-master"]["instances"][0]["address"],
        "sglang-demo-mooncake-master-0.s-sglang-demo-mooncake-master"
    );
    assert_eq!(
        cfg["roles"]["mooncake-master"]["instances"][0]["ports"]["http"],
        50051
    );
    assert_eq!(
        cfg["roles"]["mooncake-store"]["instances"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn dependencies_hold_back_roles_until_ready_and_bad_ones_create_nothing() {
    let e = env();
    let op = e.operator("a");
    e.kubelet
        .hold("rbg.workloads.x-k8s.io/role-name=mooncake-master");
    let g = seed("003-sglang-mooncake-smg-v2.yaml").remove(0);
    let name = "sglang-mooncake-smg-v2";
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e
        .pods(&sel(name, "mooncake-master"))
        .len()
        == 1));
    assert!(wait_until(T, || !e.events("DependencyNotMet").is_empty()));
    e.settled(&op, name);
    for role in [
        "mooncake-store",
        "prefill-worker",
        "decode-worker",
        "smg-router",
    ] {
        assert!(
            e.pods(&sel(name, role)).is_empty(),
            "{role} created before its dependencies were ready"
        );
    }
    assert_eq!(e.group(name)["status"]["conditions"][0]["status"], "False");
    e.kubelet.release_all();
    assert!(wait_until(T, || e.ready(name)));
    let created = |role: &str| {
        e.pods(&sel(name, role))
            .values()
            .map(|p| {
                p["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .min()
            .unwrap()
    };
    // Creation order follows the dependency tiers (resourceVersions are a global order).
    assert!(created("mooncake-store") < created("prefill-worker"));
    assert!(created("prefill-worker") < created("decode-worker"));
    assert!(created("decode-worker") < created("smg-router"));

    // An unknown dependency and a cycle: a condition and an event, and no pods.
    let bad = |n: &str, deps_a: Value, deps_b: Value| {
        json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
               "metadata": {"name": n},
               "spec": {"roles": [
                 {"name": "a", "dependencies": deps_a, "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}},
                 {"name": "b", "dependencies": deps_b, "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}}]}})
    };
    e.api
        .create(
            "rolebasedgroups",
            NS,
            bad("unknown", json!(["nope"]), json!([])),
        )
        .unwrap();
    e.api
        .create(
            "rolebasedgroups",
            NS,
            bad("cyclic", json!(["b"]), json!(["a"])),
        )
        .unwrap();
    for n in ["unknown", "cyclic"] {
        assert!(
            wait_until(T, || e.group(n)["status"]["conditions"][0]["reason"]
                == "InvalidRoleDependency"),
            "{n}: {}",
            e.group(n)
        );
        assert!(e
            .pods(&format!("rbg.workloads.x-k8s.io/group-name={n}"))
            .is_empty());
    }
    assert_eq!(e.events("InvalidRoleDependency").len(), 2);
}

#[test]
fn image_only_update_is_in_place_and_other_changes_recreate() {
    let e = env();
    let _op = e.operator("a");
    let name = "sglang-pd-with-mooncake-demo";
    e.api
        .create(
            "rolebasedgroups",
            NS,
            seed("000-pd-disaggregated-with-mooncake.yaml").remove(0),
        )
        .unwrap();
    assert!(wait_until(T, || e.ready(name)));
    let stores = sel(name, "mooncake-store");
    let before_all = e.uids(&format!("rolebasedgroup.workloads.x-k8s.io/name={name}"));
    let before = e.uids(&stores);
    let ips: BTreeMap<String, Value> = e
        .pods(&stores)
        .into_iter()
        .map(|(n, p)| (n, p["status"]["podIP"].clone()))
        .collect();
    // The seed's own upgrade command.
    e.api.json_patch("rolebasedgroups", NS, name,
        json!([{"op": "replace", "path": "/spec/roles/1/template/spec/containers/0/image", "value": "lmsysorg/sglang:v0.5.6"}])).unwrap();
    assert!(wait_until(T, || {
        let p = e.pods(&stores);
        p.len() == 3
            && p.values().all(|p| {
                p["spec"]["containers"][0]["image"] == "lmsysorg/sglang:v0.5.6"
                    && p["status"]["containerStatuses"][0]["image"] == "lmsysorg/sglang:v0.5.6"
            })
    }));
    assert!(wait_until(T, || e.ready(name)));
    let after = e.pods(&stores);
    assert_eq!(
        e.uids(&stores),
        before,
        "pod UIDs (names) unchanged by an image-only update"
    );
    for (n, p) in &after {
        assert_eq!(
            p["status"]["containerStatuses"][0]["restartCount"], 1,
            "{n}: one container restart"
        );
        assert_eq!(p["status"]["podIP"], ips[n], "{n}: IP unchanged");
    }
    let all = e.uids(&format!("rolebasedgroup.workloads.x-k8s.io/name={name}"));
    for (n, uid) in &before_all {
        if !before.contains_key(n) {
            assert_eq!(all.get(n), Some(uid), "{n} of another role was touched");
        }
    }
    // A command change recreates: decode pods get new UIDs under the same name.
    let decode = sel(name, "decode");
    let old = e.uids(&decode);
    e.api.json_patch("rolebasedgroups", NS, name,
        json!([{"op": "add", "path": "/spec/roles/4/template/spec/containers/0/command/-", "value": "--log-level=debug"}])).unwrap();
    assert!(wait_until(T, || {
        let now = e.uids(&decode);
        now.len() == 1 && now.keys().eq(old.keys()) && now.values().ne(old.values())
    }));
    assert!(wait_until(T, || e.ready(name)));
    assert_eq!(e.uids(&stores), before, "other roles keep their pods");
}

#[test]
fn partition_paused_and_replicas_only_changes() {
    let e = env();
    let op = e.operator("a");
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "p"},
        "spec": {"roles": [{"name": "w", "replicas": 2,
            "rolloutStrategy": {"rollingUpdate": {"type": "InPlaceIfPossible", "partition": 1}},
            "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}}]}});
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("p")));
    let s = "rbg.workloads.x-k8s.io/group-name=p";
    let image = |n: &str| {
        e.api
            .get("pods", NS, n)
            .map(|p| p["spec"]["containers"][0]["image"].clone())
            .unwrap_or(Value::Null)
    };
    e.api.json_patch("rolebasedgroups", NS, "p", json!([{"op": "replace",
        "path": "/spec/roles/0/standalonePattern/template/spec/containers/0/image", "value": "rbgctl:2"}])).unwrap();
    assert!(wait_until(T, || image("p-w-1") == "rbgctl:2"));
    e.settled(&op, "p");
    assert_eq!(
        image("p-w-0"),
        "rbgctl:1",
        "ordinal below the partition stays"
    );
    assert!(wait_until(T, || e.group("p")["status"]["roleStatuses"][0]
        ["updatedReplicas"]
        == 1));
    // Paused: lowering the partition moves nothing until unpaused.
    e.api.merge_patch("rolebasedgroups", NS, "p", false, json!({"spec": {"roles": [{"name": "w", "replicas": 2,
        "rolloutStrategy": {"rollingUpdate": {"partition": 0, "paused": true}},
        "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:2"}]}}}}]}})).unwrap();
    e.settled(&op, "p");
    assert_eq!(image("p-w-0"), "rbgctl:1", "paused");
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "p",
            json!([{"op": "replace",
        "path": "/spec/roles/0/rolloutStrategy/rollingUpdate/paused", "value": false}]),
        )
        .unwrap();
    assert!(wait_until(T, || image("p-w-0") == "rbgctl:2"));
    // Scaling 2 -> 3 keeps the existing pods.
    let before = e.uids(s);
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "p",
            json!([{"op": "replace", "path": "/spec/roles/0/replicas", "value": 3}]),
        )
        .unwrap();
    assert!(
        wait_until(T, || e.ready("p") && e.uids(s).len() == 3),
        "group {} pods {:?}",
        e.group("p"),
        e.pods(s)
            .values()
            .map(|p| (&p["metadata"]["name"], &p["status"]))
            .collect::<Vec<_>>()
    );
    let after = e.uids(s);
    for (n, u) in &before {
        assert_eq!(after.get(n), Some(u));
    }
}

#[test]
fn watches_that_break_or_expire_resume_and_conflicts_are_retried() {
    let e = env();
    let op = e.operator("a");
    let g = |replicas: u32| {
        json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "w"},
        "spec": {"roles": [{"name": "r", "replicas": replicas,
            "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}}]}})
    };
    e.api.create("rolebasedgroups", NS, g(1)).unwrap();
    assert!(wait_until(T, || e.ready("w")));
    let scale = |n: u32| {
        e.api
            .json_patch(
                "rolebasedgroups",
                NS,
                "w",
                json!([{"op": "replace", "path": "/spec/roles/0/replicas", "value": n}]),
            )
            .unwrap()
    };
    let count = || e.pods("rbg.workloads.x-k8s.io/group-name=w").len();
    // Broken watches resume from the last resourceVersion.
    e.api.break_watches();
    scale(2);
    assert!(wait_until(T, || count() == 2 && e.ready("w")));
    assert!(
        wait_until(T, || e.api.open_watches() >= 6),
        "watches reopened"
    );
    // Expired history: 410 Gone, list again.
    e.api.compact();
    e.api.break_watches();
    scale(3);
    assert!(wait_until(T, || count() == 3 && e.ready("w")));
    // A concurrent writer gets in before our status write: 409, read again, write again.
    e.api.race_next_write("rolebasedgroups/w/status");
    e.api.race_next_write("rolebasedgroups/w/status");
    scale(1);
    assert!(
        wait_until(T, || count() == 1 && e.ready("w")),
        "{}",
        e.group("w")["status"]
    );
    // Issue 40, item 37: a lost race is logged as the retry it is, not as a failure.
    let log = op.log();
    assert!(log.contains("resourceVersion conflict"), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("reconcile failed") && l.contains("409")),
        "{log}"
    );
    // Issue 67, item 8: a JSON patch whose resourceVersion test loses the race (here the
    // finalizer's) is answered 422 with the patch library's words only in the Status's causes,
    // as a real API server answers it: a lost race too.
    let conflicts = op.log().matches("resourceVersion conflict").count();
    e.api.race_next_write("rolebasedgroups/w2");
    let mut g2 = g(1);
    g2["metadata"]["name"] = json!("w2");
    e.api.create("rolebasedgroups", NS, g2).unwrap();
    assert!(wait_until(T, || e.ready("w2")));
    let log = op.log();
    assert!(
        log.matches("resourceVersion conflict").count() > conflicts,
        "{log}"
    );
    assert!(!log.contains("reconcile failed"), "{log}");
}

#[test]
fn two_operators_share_one_lease_and_the_standby_takes_over() {
    let e = env();
    let mut ops: BTreeMap<String, Operator> = [("a", e.operator("a")), ("b", e.operator("b"))]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let mk = |n: &str| {
        json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": n},
        "spec": {"roles": [{"name": "r", "replicas": 2,
            "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}}]}})
    };
    e.api.create("rolebasedgroups", NS, mk("one")).unwrap();
    assert!(wait_until(T, || e.ready("one")));
    let holder = e.api.get("leases", NS, "rbgctl-operator").unwrap()["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_string();
    let standby = if holder == "a" { "b" } else { "a" };
    // The standby has written nothing but its attempts at the Lease.
    let by_agent = e.api.counts().writes_by_agent;
    assert!(by_agent
        .get(&format!("rbgctl-operator/{holder}"))
        .is_some_and(|n| *n > 0));
    assert_eq!(
        by_agent.get(&format!("rbgctl-operator/{standby}")),
        None,
        "{by_agent:?}"
    );
    // kill -9 the leader: the standby takes the lease once it has expired, and acts.
    ops.get_mut(&holder).unwrap().kill();
    assert!(wait_until(T, || e
        .api
        .get("leases", NS, "rbgctl-operator")
        .is_some_and(|l| l["spec"]["holderIdentity"] == json!(standby))));
    e.api.create("rolebasedgroups", NS, mk("two")).unwrap();
    assert!(wait_until(T, || e.ready("two")));
    let l = e.api.get("leases", NS, "rbgctl-operator").unwrap();
    assert_eq!(l["spec"]["leaseTransitions"], 1);
}

#[test]
fn a_standby_stops_on_sigterm_and_never_takes_the_lease() {
    let e = env();
    let mut a = e.operator("a");
    assert!(wait_until(T, || e
        .api
        .get("leases", NS, "rbgctl-operator")
        .is_some_and(|l| l["spec"]["holderIdentity"] == "a")));
    let mut b = e.operator("b");
    // b stands by: it has read the Lease at least twice (so it is between attempts).
    let attempts = || {
        e.api
            .counts()
            .requests_by_agent
            .get("rbgctl-operator/b")
            .copied()
            .unwrap_or(0)
    };
    assert!(wait_until(T, || attempts() >= 2), "b never tried the lease");
    assert!(
        b.sigterm_exits_within(Duration::from_secs(1)).is_some(),
        "the standby did not exit within 1 s of SIGTERM"
    );
    // The leader stops too (cleanly: it gives the lease up); nobody holds it afterwards.
    assert!(a.sigterm_exits_within(Duration::from_secs(5)).is_some());
    let l = e.api.get("leases", NS, "rbgctl-operator").unwrap();
    assert_eq!(l["spec"]["holderIdentity"], Value::Null, "{l}");
    assert_eq!(l["spec"]["leaseTransitions"], 0, "{l}");
}

#[test]
fn steady_state_resync_writes_nothing_and_deletion_removes_children() {
    let e = env();
    let op = e.operator("a");
    e.api
        .create(
            "rolebasedgroups",
            NS,
            seed("002-sglang-demo.yaml").remove(0),
        )
        .unwrap();
    let name = "sglang-demo";
    assert!(wait_until(T, || e.ready(name)));
    e.settled(&op, name);
    e.api.reset_counts();
    // Three more reconciles (resyncs, 1 s apart) with nothing changing.
    op.wait_reconciles(3);
    let c = e.api.counts();
    assert_eq!(
        c.writes_except_leases(),
        0,
        "writes during steady state: {c:?}"
    );
    assert!(
        c.by_verb.get("update").is_some_and(|n| *n > 0),
        "the lease is renewed meanwhile"
    );
    // A group with none of issue 67's fields: one ControllerRevision per role is all it adds
    // (no PodGroup, no gang or rollout status).
    let g = e.group(name);
    let roles = g["spec"]["roles"].as_array().unwrap().len();
    let s = format!("rbg.workloads.x-k8s.io/group-name={name}");
    assert_eq!(e.api.list("controllerrevisions", NS, &s).len(), roles);
    assert!(e
        .api
        .get("podgroups.scheduling.x-k8s.io", NS, name)
        .is_none());
    assert!(g["status"].get("coordinatedRollouts").is_none(), "{g}");
    assert!(condition(&g, "GangScheduling").is_none(), "{g}");
    // Delete: the finalizer holds the group until every child is gone.
    e.api.delete("rolebasedgroups", NS, name).unwrap();
    assert!(wait_until(T, || e
        .api
        .get("rolebasedgroups", NS, name)
        .is_none()));
    assert!(e.api.list("pods", NS, &s).is_empty());
    assert!(e.api.list("services", NS, &s).is_empty());
    assert!(e.api.get("configmaps", NS, name).is_none());
    assert!(e.api.list("controllerrevisions", NS, &s).is_empty());
    // The finalizer was released once: a reconcile that came before the watch said the group
    // was gone found the finalizer gone from the cache (a real API server showed a second
    // release, answered 404).
    assert!(wait_until(T, || op.log().contains("finalizer released")));
    assert_eq!(
        op.log().matches("finalizer released").count(),
        1,
        "{}",
        op.log()
    );
}

fn docs(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

#[test]
fn manifests_parse_and_the_examples_reconcile() {
    for crd in [
        "workloads.x-k8s.io_rolebasedgroups.yaml",
        "workloads.x-k8s.io_coordinatedpolicies.yaml",
        "workloads.x-k8s.io_rolebasedgroupscalingadapters.yaml",
        "workloads.x-k8s.io_rolebasedgroupsets.yaml",
    ] {
        let d = docs(&format!("manifests/crds/{crd}"));
        assert_eq!(d[0]["kind"], "CustomResourceDefinition");
        let plural = d[0]["spec"]["names"]["plural"].as_str().unwrap();
        // The stand-in serves what the CRD declares: same short names, same subresources.
        let served = rbgctl::testkit::apiserver::RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap_or_else(|| panic!("{crd}: the stand-in does not serve {plural}"));
        assert_eq!(
            d[0]["spec"]["names"]["shortNames"],
            json!(served.short_names),
            "{crd}"
        );
        for v in d[0]["spec"]["versions"].as_array().unwrap() {
            assert!(
                v["subresources"]["status"].is_object(),
                "{crd}: status subresource"
            );
            let scale = &v["subresources"]["scale"];
            match &served.scale {
                None => assert!(scale.is_null(), "{crd}: scale not served by the stand-in"),
                Some(p) => {
                    let path = |jp: &str| jp.replacen('/', ".", 1).replace('/', ".");
                    assert_eq!(scale["specReplicasPath"], path(p.spec_replicas), "{crd}");
                    assert_eq!(
                        scale["statusReplicasPath"],
                        path(p.status_replicas),
                        "{crd}"
                    );
                    assert_eq!(
                        scale["labelSelectorPath"].as_str(),
                        p.label_selector.map(path).as_deref(),
                        "{crd}"
                    );
                }
            }
        }
    }
    let rbac = docs("manifests/operator/rbac.yaml");
    assert!(rbac.iter().any(|d| d["kind"] == "ClusterRole"));
    assert_eq!(
        docs("manifests/operator/deployment.yaml")[0]["kind"],
        "Deployment"
    );
    let e = env();
    let _op = e.operator("a");
    for file in [
        "pd-kvcache-v1alpha1.yaml",
        "kvcache-v1alpha2.yaml",
        "autoscaling.yaml",
        "kvcache-ha.yaml",
        "mooncake-ports-networkpolicy.yaml",
    ] {
        for d in docs(&format!("manifests/examples/{file}")) {
            match d["kind"].as_str() {
                // It selects the pods of a group the examples make, by the labels they get.
                Some("NetworkPolicy") => {
                    let selector = &d["spec"]["podSelector"]["matchLabels"];
                    assert_eq!(
                        selector["rolebasedgroup.workloads.x-k8s.io/name"],
                        "rbgctl-kv"
                    );
                }
                Some("RoleBasedGroup") => {
                    rbgctl::operator::model::parse_group(&d).unwrap();
                    e.api.create("rolebasedgroups", NS, d).unwrap();
                }
                Some("CoordinatedPolicy") => {
                    e.api.create("coordinatedpolicies", NS, d).unwrap();
                }
                Some("RoleBasedGroupSet") => {
                    e.api.create("rolebasedgroupsets", NS, d).unwrap();
                }
                Some("HorizontalPodAutoscaler") => {
                    assert_eq!(
                        d["spec"]["scaleTargetRef"]["kind"],
                        "RoleBasedGroupScalingAdapter"
                    );
                }
                _ => {}
            }
        }
    }
    assert!(wait_until(T, || e.ready("rbgctl-pd") && e.ready("rbgctl-kv")));
    assert!(wait_until(T, || e.ready("rbgctl-scaled")
        && e.adapter("rbgctl-scaled-decode")
            .is_some_and(|a| a["status"]["phase"] == "Bound")
        && set_ready(&e, "rbgctl-fleet", 2)));
    // The NetworkPolicy example selects the pool's pods by the labels they carry.
    let pool_pods = e
        .pods("")
        .into_iter()
        .filter(|(_, p)| {
            let l = &p["metadata"]["labels"];
            l["rolebasedgroup.workloads.x-k8s.io/name"] == "rbgctl-kv"
                && matches!(
                    l["rolebasedgroup.workloads.x-k8s.io/role"].as_str(),
                    Some("kv-master" | "kv-store")
                )
        })
        .count();
    assert!(
        pool_pods >= 2,
        "{pool_pods} pool pods carry the policy's labels"
    );
    // Issue 62, item B1: every store pod the examples make has a memory emptyDir at /dev/shm
    // (a container's own is 64 MiB) as large as its segment at least.
    let mut stores = 0;
    for (name, pod) in e.pods("") {
        let volumes = pod["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for c in pod["spec"]["containers"].as_array().unwrap() {
            let argv: Vec<&str> = c["command"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if argv.get(1) != Some(&"store") {
                continue;
            }
            stores += 1;
            let segment = argv
                .windows(2)
                .find(|w| w[0] == "--segment-size")
                .map(|w| w[1].to_string())
                .or_else(|| env_of(&pod, "MOONCAKE_GLOBAL_SEGMENT_SIZE"))
                .expect("a segment size");
            let segment: rbgctl::config::ByteSize = segment.parse().unwrap();
            let mount = c["volumeMounts"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["mountPath"] == "/dev/shm"))
                .unwrap_or_else(|| panic!("{name}: no volume at /dev/shm"));
            let volume = volumes
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap_or_else(|| panic!("{name}: no volume {}", mount["name"]));
            assert_eq!(volume["emptyDir"]["medium"], "Memory", "{name}");
            // A Kubernetes quantity (9Gi): the binary unit, spelled as rbgctl reads it.
            let quantity = volume["emptyDir"]["sizeLimit"].as_str().unwrap();
            let limit: rbgctl::config::ByteSize = quantity
                .strip_suffix('i')
                .map(|q| format!("{q}iB"))
                .unwrap_or(quantity.to_string())
                .parse()
                .unwrap();
            assert!(
                limit.0 >= segment.0,
                "{name}: {limit:?} for a {segment:?} segment"
            );
        }
    }
    assert!(stores >= 3, "{stores} store containers");
    // Leader-worker decode: 2 instances x 2 pods, only leaders behind the Service.
    let decode = e.pods(
        "rbg.workloads.x-k8s.io/group-name=rbgctl-kv,rbg.workloads.x-k8s.io/role-name=decode",
    );
    assert_eq!(
        decode.keys().cloned().collect::<Vec<_>>(),
        [
            "rbgctl-kv-decode-0-0",
            "rbgctl-kv-decode-0-1",
            "rbgctl-kv-decode-1-0",
            "rbgctl-kv-decode-1-1"
        ]
    );
    assert_eq!(
        env_of(&decode["rbgctl-kv-decode-1-1"], "RBG_LWP_LEADER_ADDRESS").as_deref(),
        Some("rbgctl-kv-decode-1-0.s-rbgctl-kv-decode.default")
    );
    let svc = e.api.get("services", NS, "s-rbgctl-kv-decode").unwrap();
    assert_eq!(
        svc["spec"]["selector"]["rbg.workloads.x-k8s.io/component-name"],
        "leader"
    );
    // Coordinated upgrade of prefill and decode: the updated fractions never part by more
    // than maxSkew (20%) plus one instance's step.
    // Both roles from one read of the status: two reads could straddle a step of the rollout
    // and show a drift that never existed.
    let updated = || {
        let g = e.group("rbgctl-kv");
        let role = |n: &str| {
            g["status"]["roleStatuses"]
                .as_array()
                .and_then(|all| all.iter().find(|r| r["name"] == n))
                .and_then(|r| r["updatedReplicas"].as_u64())
                .unwrap_or(0) as i64
        };
        (role("prefill"), role("decode"))
    };
    e.api.json_patch("rolebasedgroups", NS, "rbgctl-kv", json!([
        {"op": "replace", "path": "/spec/roles/2/standalonePattern/template/spec/containers/0/image", "value": "lmsysorg/sglang:v0.5.6"},
        {"op": "replace", "path": "/spec/roles/3/leaderWorkerPattern/template/spec/containers/0/image", "value": "lmsysorg/sglang:v0.5.6"}])).unwrap();
    let mut worst = 0i64;
    assert!(wait_until(T, || {
        let (p, d) = updated();
        worst = worst.max((p - d).abs());
        p == 2 && d == 2 && e.ready("rbgctl-kv")
    }));
    assert!(
        worst <= 1,
        "prefill and decode drifted apart by {worst} of 2 instances"
    );
}

#[test]
fn a_retag_to_the_same_digest_completes_its_inplace_rollout() {
    let e = env();
    let op = e.operator("a");
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "rt"},
        "spec": {"roles": [{"name": "w", "replicas": 2,
            "rolloutStrategy": {"rollingUpdate": {"type": "InPlaceIfPossible"}},
            "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}}]}});
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("rt")));
    let before = e.uids("rbg.workloads.x-k8s.io/group-name=rt");
    // Another tag of the same content: the kubelet keeps reporting the same image ID.
    e.kubelet.same_digest("rbgctl:1-retagged", "rbgctl:1");
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "rt",
            json!([{"op": "replace",
            "path": "/spec/roles/0/standalonePattern/template/spec/containers/0/image",
            "value": "rbgctl:1-retagged"}]),
        )
        .unwrap();
    let rolled = || {
        let pods = e.pods("rbg.workloads.x-k8s.io/group-name=rt");
        pods.len() == 2
            && pods
                .values()
                .all(|p| p["status"]["containerStatuses"][0]["image"] == "rbgctl:1-retagged")
            && e.group("rt")["status"]["roleStatuses"][0]["updatedReplicas"] == 2
            && e.ready("rt")
    };
    assert!(
        wait_until(T, rolled),
        "the rollout stalled: {}",
        e.group("rt")["status"]
    );
    assert_eq!(
        e.uids("rbg.workloads.x-k8s.io/group-name=rt"),
        before,
        "in place"
    );
    drop(op);
}

#[test]
fn an_endpoint_the_api_server_refuses_is_left_out_reported_and_blocks_nothing() {
    let e = env();
    let op = e.operator("a");
    let role = |name: &str, replicas: u32| {
        json!({"name": name, "replicas": replicas,
               "template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}})
    };
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha1", "kind": "RoleBasedGroup",
        "metadata": {"name": "lg"}, "spec": {"roles": [role("a", 2), role("b", 1)]}});
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("lg")));
    let slice = |role: &str| {
        e.api
            .get("endpointslices", NS, &format!("lg-{role}-rbgctl"))
    };
    assert!(wait_until(T, || slice("a")
        .is_some_and(
            |s| s["endpoints"].as_array().map_or(0, Vec::len) == 2
        )));
    // One pod of role a reports a loopback address, which no EndpointSlice may carry.
    e.api
        .merge_patch(
            "pods",
            NS,
            "lg-a-0",
            true,
            json!({"status": {"podIP": "127.0.0.1"}}),
        )
        .unwrap();
    assert!(
        wait_until(T, || {
            e.group("lg")["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["type"] == "EndpointsPublished"
                        && c["status"] == "False"
                        && c["message"]
                            .as_str()
                            .unwrap_or("")
                            .contains("lg-a-0: 127.0.0.1")
                })
        }),
        "{}",
        e.group("lg")["status"]
    );
    assert!(!e.events("EndpointAddressRefused").is_empty());
    let hosts: Vec<Value> = slice("a").unwrap()["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["hostname"].clone())
        .collect();
    assert_eq!(
        hosts,
        [json!("lg-a-1")],
        "the refused pod is left out, the other kept"
    );
    // The rest of the group's reconcile goes on: a role removed from the spec loses its pods.
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "lg",
            json!([{"op": "remove", "path": "/spec/roles/1"}]),
        )
        .unwrap();
    assert!(
        wait_until(T, || e
            .pods("rbg.workloads.x-k8s.io/role-name=b")
            .is_empty()),
        "role b's pods were not removed"
    );
    // A second refused endpoint is told in an event of its own; the first is not told again,
    // and no event's message grows with the pods.
    e.api
        .merge_patch(
            "pods",
            NS,
            "lg-a-1",
            true,
            json!({"status": {"podIP": "127.0.0.2"}}),
        )
        .unwrap();
    assert!(wait_until(T, || e.events("EndpointAddressRefused").len() == 2));
    let said = e.events("EndpointAddressRefused");
    let messages: Vec<&str> = said
        .iter()
        .filter_map(|ev| ev["message"].as_str())
        .collect();
    for pod in ["lg-a-0", "lg-a-1"] {
        assert_eq!(
            messages.iter().filter(|m| m.contains(pod)).count(),
            1,
            "{messages:?}"
        );
    }
    drop(op);
}

/// Issue 40, item 36: `EndpointsPublished` says what the API server took: with every
/// EndpointSlice write refused, it is False and names the failure; True again once they go in.
#[test]
fn endpoints_published_is_false_while_the_api_server_refuses_the_slices() {
    let e = env();
    e.api.fail("endpointslices");
    let op = e.operator("a");
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha1", "kind": "RoleBasedGroup",
        "metadata": {"name": "nes"}, "spec": {"roles": [{"name": "a", "replicas": 1,
            "template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}]}});
    let t0 = Instant::now();
    e.api.create("rolebasedgroups", NS, g).unwrap();
    // The refused slice is tried again as its backoff allows (100 ms, doubling), not at every
    // event its group's starting pods bring: the fourth try no sooner than 700 ms after the
    // first.
    let tries = || {
        e.api
            .counts()
            .write_faults
            .get("endpointslices")
            .copied()
            .unwrap_or(0)
    };
    assert!(wait_until(T, || tries() >= 4), "{}", tries());
    assert!(
        t0.elapsed() >= Duration::from_millis(700),
        "four tries within {:?}",
        t0.elapsed()
    );
    let published = |status: &str| {
        e.group("nes")["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "EndpointsPublished" && c["status"] == status)
    };
    assert!(
        wait_until(T, || published("False")),
        "{}",
        e.group("nes")["status"]
    );
    assert!(!published("True"));
    assert!(e.api.get("endpointslices", NS, "nes-a-rbgctl").is_none());
    e.api.heal();
    assert!(
        wait_until(T, || published("True")),
        "{}",
        e.group("nes")["status"]
    );
    assert!(e.api.get("endpointslices", NS, "nes-a-rbgctl").is_some());
    drop(op);
}

#[test]
fn an_inplace_update_the_kubelet_does_not_confirm_in_time_is_reported() {
    let e = env();
    let _op = e.operator_with("a", |c| c.inplace_timeout_secs = 1);
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "slow"},
        "spec": {"roles": [{"name": "w", "replicas": 1,
            "rolloutStrategy": {"rollingUpdate": {"type": "InPlaceIfPossible"}},
            "standalonePattern": {"template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}}]}});
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("slow")));
    let confirmed = |status: &str| {
        e.group("slow")["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "InPlaceUpdatesConfirmed" && c["status"] == status)
    };
    assert!(wait_until(T, || confirmed("True")));
    // The kubelet takes the new image but the container never becomes Ready.
    e.kubelet.hold("rbg.workloads.x-k8s.io/group-name=slow");
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "slow",
            json!([{"op": "replace",
            "path": "/spec/roles/0/standalonePattern/template/spec/containers/0/image",
            "value": "rbgctl:2"}]),
        )
        .unwrap();
    assert!(
        wait_until(T, || confirmed("False")),
        "{}",
        e.group("slow")["status"]
    );
    let said = e.events("InPlaceUpdateUnconfirmed");
    assert!(
        said.iter()
            .any(|ev| ev["message"].as_str().unwrap_or("").contains("slow-w-0")),
        "{said:?}"
    );
    // Once the kubelet confirms it, the condition clears.
    e.kubelet.release_all();
    assert!(wait_until(T, || confirmed("True") && e.ready("slow")));
}

fn template(image: &str) -> Value {
    json!({"template": {"spec": {"containers": [{"name": "c", "image": image}]}}})
}

#[test]
fn a_scaling_adapter_sizes_its_role_through_kubectl_and_overrides_a_disagreeing_edit() {
    let e = env();
    let op = e.operator("a");
    e.api
        .create(
            "rolebasedgroups",
            NS,
            json!({
            "apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
            "metadata": {"name": "hpa"},
            "spec": {"roles": [
                {"name": "prefill", "replicas": 1, "standalonePattern": template("p:1")},
                {"name": "decode", "replicas": 2, "standalonePattern": template("d:1"),
                 "scalingAdapter": {"enable": true, "labels": {"team": "serving"}}}]}}),
        )
        .unwrap();
    let uid = e.group("hpa")["metadata"]["uid"].clone();
    // Created, owned by the group, bound with the role's size.
    assert!(wait_until(T, || e.adapter("hpa-decode").is_some_and(|a| {
        a["status"]["phase"] == "Bound" && a["status"]["readyReplicas"] == 2
    })));
    let a = e.adapter("hpa-decode").unwrap();
    assert_eq!(a["spec"]["replicas"], 2);
    assert_eq!(
        a["spec"]["scaleTargetRef"],
        json!({"name": "hpa", "role": "decode"})
    );
    assert_eq!(a["metadata"]["ownerReferences"][0]["uid"], uid);
    assert_eq!(a["metadata"]["labels"]["team"], "serving");
    assert_eq!(
        a["status"]["selector"],
        "rbg.workloads.x-k8s.io/group-name=hpa,rbg.workloads.x-k8s.io/role-name=decode"
    );
    assert!(
        e.adapter("hpa-prefill").is_none(),
        "only roles that ask get one"
    );
    // kubectl scale on the adapter sizes the role.
    e.kubectl_scale("rbgsa/hpa-decode", 4);
    let decode = sel_v2("hpa", "decode");
    assert!(wait_until(T, || e.role_replicas("hpa", "decode")
        == Some(4)
        && e.pods(&decode).len() == 4
        && e.ready("hpa")));
    assert!(wait_until(T, || e.adapter("hpa-decode").is_some_and(|a| {
        a["status"]["replicas"] == 4
            && a["status"]["readyReplicas"] == 4
            && a["status"]["lastScaleTime"].is_string()
    })));
    assert_eq!(e.events("Scaled").len(), 1);
    // An edit of the group's replicas that disagrees with the adapter is set back, said in
    // a warning, and never acted on: the four pods stay as they are.
    let before = e.uids(&decode);
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "hpa",
            json!([{"op": "replace", "path": "/spec/roles/1/replicas", "value": 1}]),
        )
        .unwrap();
    assert!(wait_until(T, || !e
        .events("ReplicasOverriddenByAdapter")
        .is_empty()));
    assert!(wait_until(T, || e.role_replicas("hpa", "decode") == Some(4)));
    e.settled(&op, "hpa");
    assert_eq!(e.uids(&decode), before, "no decode pod was deleted");
    let warning = &e.events("ReplicasOverriddenByAdapter")[0];
    assert!(warning["message"]
        .as_str()
        .unwrap()
        .contains("kubectl scale rbgsa/hpa-decode"));
    // At rest, neither the group nor its adapter is written again.
    e.api.reset_counts();
    op.wait_reconciles(3);
    let c = e.api.counts();
    assert_eq!(c.writes_except_leases(), 0, "writes at rest: {c:?}");
    // Disabling the adapter deletes it; the role keeps its size and is the group's again.
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "hpa",
            json!([
            {"op": "replace", "path": "/spec/roles/1/scalingAdapter/enable", "value": false}]),
        )
        .unwrap();
    assert!(wait_until(T, || e.adapter("hpa-decode").is_none()));
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "hpa",
            json!([{"op": "replace", "path": "/spec/roles/1/replicas", "value": 3}]),
        )
        .unwrap();
    assert!(wait_until(T, || e.pods(&decode).len() == 3 && e.ready("hpa")));
    // Enabled again, then the group deleted: the adapter goes with it.
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "hpa",
            json!([
            {"op": "replace", "path": "/spec/roles/1/scalingAdapter/enable", "value": true}]),
        )
        .unwrap();
    assert!(wait_until(T, || e.adapter("hpa-decode").is_some_and(|a| {
        a["status"]["phase"] == "Bound" && a["spec"]["replicas"] == 3
    })));
    e.api.delete("rolebasedgroups", NS, "hpa").unwrap();
    assert!(wait_until(T, || e.group("hpa").is_null()
        && e.adapter("hpa-decode").is_none()));
}

#[test]
fn an_adapter_without_its_target_is_not_bound_and_binds_when_it_appears() {
    let e = env();
    let op = e.operator("a");
    e.api
        .create(
            "rolebasedgroupscalingadapters",
            NS,
            json!({
            "metadata": {"name": "manual"},
            "spec": {"replicas": 5, "scaleTargetRef": {"name": "later", "role": "worker"}}}),
        )
        .unwrap();
    assert!(wait_until(T, || e
        .adapter("manual")
        .is_some_and(|a| a["status"]["phase"] == "NotBound")));
    e.api
        .create(
            "rolebasedgroups",
            NS,
            json!({
            "metadata": {"name": "later"},
            "spec": {"roles": [{"name": "worker", "replicas": 2,
                                "standalonePattern": template("w:1")}]}}),
        )
        .unwrap();
    // Binding adopts the role's size (2), it does not impose its own (5).
    assert!(wait_until(T, || e.adapter("manual").is_some_and(|a| {
        a["status"]["phase"] == "Bound" && a["spec"]["replicas"] == 2
    })));
    assert!(wait_until(T, || e.ready("later")));
    assert_eq!(e.pods(&sel_v2("later", "worker")).len(), 2);
    // (Conflicts with the watch's late news are retried, as in any controller; a status
    // update without the resourceVersion it replaces is refused by the real server.)
    assert!(
        !op.log().contains("must be specified for an update"),
        "{}",
        op.log()
    );
    e.kubectl_scale("rbgsa/manual", 3);
    assert!(wait_until(T, || e.pods(&sel_v2("later", "worker")).len()
        == 3
        && e.ready("later")));
    // Not the group's: deleting the group leaves a hand-made adapter, unbound.
    e.api.delete("rolebasedgroups", NS, "later").unwrap();
    assert!(wait_until(T, || e
        .adapter("manual")
        .is_some_and(|a| a["status"]["phase"] == "NotBound")));
}

fn set_status(e: &Env, name: &str) -> Value {
    e.api
        .get("rolebasedgroupsets", NS, name)
        .map_or(Value::Null, |s| s["status"].clone())
}

fn set_ready(e: &Env, name: &str, n: u64) -> bool {
    let st = set_status(e, name);
    st["replicas"] == n
        && st["readyReplicas"] == n
        && st["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

#[test]
fn a_group_set_makes_groups_scales_with_kubectl_and_removes_the_highest_index_first() {
    let e = env();
    let _op = e.operator("a");
    e.api
        .create(
            "rolebasedgroupsets",
            NS,
            json!({
            "apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroupSet",
            "metadata": {"name": "fleet"},
            "spec": {"replicas": 2, "groupTemplate": {
                "labels": {"team": "serving"}, "annotations": {"note": "from the set"},
                "spec": {"roles": [{"name": "engine", "replicas": 1,
                                    "standalonePattern": template("e:1")}]}}}}),
        )
        .unwrap();
    assert!(wait_until(T, || set_ready(&e, "fleet", 2)));
    let g0 = e.group("fleet-0");
    assert_eq!(
        g0["metadata"]["labels"]["rbg.workloads.x-k8s.io/groupset-name"],
        "fleet"
    );
    assert_eq!(
        g0["metadata"]["labels"]["rbg.workloads.x-k8s.io/groupset-index"],
        "0"
    );
    assert_eq!(g0["metadata"]["labels"]["team"], "serving");
    assert_eq!(g0["metadata"]["annotations"]["note"], "from the set");
    assert_eq!(
        g0["metadata"]["ownerReferences"][0]["kind"],
        "RoleBasedGroupSet"
    );
    assert_eq!(g0["metadata"]["ownerReferences"][0]["controller"], true);
    assert!(e.ready("fleet-1"));
    e.kubectl_scale("rbgs/fleet", 3);
    assert!(wait_until(T, || set_ready(&e, "fleet", 3) && e.ready("fleet-2")));
    // Down to one: fleet-2 goes before fleet-1 begins to.
    e.kubectl_scale("rbgs/fleet", 1);
    let gone = |n: &str| {
        let g = e.group(n);
        g.is_null() || g["metadata"]["deletionTimestamp"].is_string()
    };
    let mut out_of_order = false;
    assert!(wait_until(T, || {
        out_of_order |= gone("fleet-1") && !e.group("fleet-2").is_null();
        e.group("fleet-1").is_null() && e.group("fleet-2").is_null()
    }));
    assert!(
        !out_of_order,
        "fleet-1 was deleted while fleet-2 still existed"
    );
    assert!(wait_until(T, || set_ready(&e, "fleet", 1)));
    assert!(!gone("fleet-0"));
    // A template change reaches the children.
    e.api
        .json_patch("rolebasedgroupsets", NS, "fleet", json!([{"op": "replace",
            "path": "/spec/groupTemplate/spec/roles/0/standalonePattern/template/spec/containers/0/image",
            "value": "e:2"}]))
        .unwrap();
    assert!(wait_until(T, || {
        e.pods(&sel_v2("fleet-0", "engine"))
            .values()
            .all(|p| p["spec"]["containers"][0]["image"] == "e:2")
            && e.ready("fleet-0")
    }));
    // Deleting the set deletes its groups, then the set itself goes.
    e.api.delete("rolebasedgroupsets", NS, "fleet").unwrap();
    assert!(wait_until(T, || e
        .api
        .get("rolebasedgroupsets", NS, "fleet")
        .is_none()
        && e.group("fleet-0").is_null()));
    assert!(e
        .pods("rbg.workloads.x-k8s.io/group-name=fleet-0")
        .is_empty());
}

fn sel_v2(group: &str, role: &str) -> String {
    format!("rbg.workloads.x-k8s.io/group-name={group},rbg.workloads.x-k8s.io/role-name={role}")
}

/// Issue 67, item 1: a container restart in a leader-worker instance recreates the whole
/// instance (RBG's `RecreateRoleInstanceOnPodRestart`, the default for the pattern); repeated
/// restarts back off exponentially from `baseDelaySeconds` up to `maxDelaySeconds`, told in
/// events and kept in the group's status. A standalone role's pod restarts alone, as a
/// kubelet restarts it.
#[test]
fn a_leader_worker_instance_whose_leader_crashes_is_recreated_with_growing_delays() {
    let e = env();
    let _op = e.operator("a");
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "crashy"},
        "spec": {"roles": [
            {"name": "lw", "replicas": 1,
             "leaderWorkerPattern": {"size": 2,
                "restartPolicyConfig": {"baseDelaySeconds": 1, "maxDelaySeconds": 4},
                "template": {"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}}}},
            {"name": "solo", "replicas": 1,
             "standalonePattern": {"template": {"spec": {"containers": [
                {"name": "c", "image": "rbgctl:1"}]}}}}]}});
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("crashy")));
    let lw = "rbg.workloads.x-k8s.io/group-name=crashy,rbg.workloads.x-k8s.io/role-name=lw";
    assert!(e.group("crashy")["status"]
        .get("instanceRestarts")
        .is_none());
    // A standalone pod's crash is the kubelet's to restart: the pod stays (checked after the
    // reconciles below, every one of which saw it).
    let solo = "rbg.workloads.x-k8s.io/group-name=crashy,rbg.workloads.x-k8s.io/role-name=solo";
    let solo_before = e.uids(solo);
    e.kubelet.crash(solo_before.keys().next().unwrap());
    assert!(wait_until(T, || e.pods(solo).values().all(|p| {
        p["status"]["containerStatuses"][0]["restartCount"] == 1
    })));
    // Five crashes of the leader, each right after the instance came back.
    let mut took = Vec::new();
    for _ in 0..5 {
        let before = e.uids(lw);
        assert_eq!(before.len(), 2, "{before:?}");
        let leader = before.keys().min().unwrap().clone();
        let t0 = Instant::now();
        e.kubelet.crash(&leader);
        assert!(
            wait_until(T, || {
                let now = e.uids(lw);
                now.len() == 2
                    && now.values().all(|u| !before.values().any(|b| b == u))
                    && e.ready("crashy")
            }),
            "the instance is recreated whole: {:?}",
            e.uids(lw)
        );
        took.push(t0.elapsed());
    }
    // At once, then after 1, 2, 4 and 4 s (the cap).
    for (k, want) in [0u64, 1, 2, 4, 4].into_iter().enumerate() {
        let want = Duration::from_secs(want);
        assert!(
            took[k] + Duration::from_millis(50) >= want,
            "recreation {} came after {:?}, before its {want:?}: {took:?}",
            k + 1,
            took[k]
        );
    }
    assert!(took[0] < Duration::from_secs(1), "{took:?}");
    let said = e.events("InstanceRecreated");
    let msgs: Vec<&str> = said
        .iter()
        .filter_map(|ev| ev["message"].as_str())
        .collect();
    for (n, next) in [(1, 1), (2, 2), (3, 4), (4, 4), (5, 4)] {
        assert!(
            msgs.iter().any(|m| m.contains(&format!(
                "(recreation {n}; the next no sooner than {next} s after)"
            ))),
            "{msgs:?}"
        );
    }
    let kept = &e.group("crashy")["status"]["instanceRestarts"];
    assert_eq!(kept[0]["instance"], "crashy-lw-0", "{kept}");
    assert_eq!(kept[0]["count"], 5, "{kept}");
    assert_eq!(
        e.uids(solo),
        solo_before,
        "the standalone pod was not recreated"
    );
}

/// Issue 67, item 5: a set with `rolloutStrategy.rollingUpdate.maxUnavailable: 1` rolls a
/// template change across its groups one at a time, each next group once the last is Ready
/// again; status counts the groups that run the template.
#[test]
fn a_paced_group_set_rolls_a_template_change_one_group_at_a_time() {
    let e = env();
    let _op = e.operator("a");
    let set = |image: &str| {
        json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroupSet",
            "metadata": {"name": "paced"},
            "spec": {"replicas": 3, "rolloutStrategy": {"rollingUpdate": {"maxUnavailable": 1}},
                "groupTemplate": {"spec": {"roles": [{"name": "engine", "replicas": 1,
                    "standalonePattern": template(image)}]}}}})
    };
    e.api.create("rolebasedgroupsets", NS, set("e:1")).unwrap();
    assert!(wait_until(T, || set_ready(&e, "paced", 3)));
    let image = |g: &str| {
        e.group(g)
            .pointer("/spec/roles/0/standalonePattern/template/spec/containers/0/image")
            .cloned()
            .unwrap_or(Value::Null)
    };
    // The first group's new pods are held not Ready: the rollout waits on it.
    e.kubelet.hold("rbg.workloads.x-k8s.io/group-name=paced-0");
    e.api
        .json_patch(
            "rolebasedgroupsets",
            NS,
            "paced",
            json!([{"op": "replace",
                "path": "/spec/groupTemplate/spec/roles/0/standalonePattern/template/spec/containers/0/image",
                "value": "e:2"}]),
        )
        .unwrap();
    assert!(wait_until(T, || set_status(&e, "paced")["updatedReplicas"] == 1));
    assert!(wait_until(T, || image("paced-0") == "e:2" && !e.ready("paced-0")));
    assert_eq!(
        (image("paced-1"), image("paced-2")),
        (json!("e:1"), json!("e:1"))
    );
    // Released: the others follow one at a time. Read from the highest index down, an updated
    // group is seen before the ones below it, which were Ready by the time it was updated.
    e.kubelet.release_all();
    let mut seen_all = false;
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        let down: Vec<String> = ["paced-2", "paced-1", "paced-0"]
            .into_iter()
            .filter(|g| image(g) == "e:2" && !e.ready(g))
            .map(str::to_string)
            .collect();
        assert!(down.len() <= 1, "two groups updating at once: {down:?}");
        if ["paced-0", "paced-1", "paced-2"]
            .iter()
            .all(|g| image(g) == "e:2" && e.ready(g))
        {
            seen_all = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        seen_all,
        "the rollout did not finish: {}",
        set_status(&e, "paced")
    );
    assert!(wait_until(T, || set_status(&e, "paced")["updatedReplicas"]
        == 3
        && set_ready(&e, "paced", 3)));
}

/// The CEL rules of a CRD version's schema (`x-kubernetes-validations`), evaluated as the API
/// server does: each rule with `self` bound to the value at the schema node that carries it,
/// down through `properties` and `items`. Answers the messages of the rules that fail (or do
/// not evaluate). Kubernetes' `type()` and the type names `int` and `string` are provided.
fn cel_refusals(schema: &Value, value: &Value, path: &str) -> Vec<String> {
    use cel_interpreter::{Context, Program, Value as Cel};
    let mut out = Vec::new();
    for v in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let rule = v["rule"].as_str().unwrap();
        let program = Program::compile(rule).unwrap_or_else(|e| panic!("{rule}: {e:?}"));
        let mut ctx = Context::default();
        ctx.add_variable("self", cel_interpreter::to_value(value).unwrap())
            .unwrap();
        ctx.add_variable("int", Cel::String(std::sync::Arc::new("int".into())))
            .unwrap();
        ctx.add_variable("string", Cel::String(std::sync::Arc::new("string".into())))
            .unwrap();
        ctx.add_function("type", |v: Cel| -> String {
            match v {
                Cel::Int(_) | Cel::UInt(_) => "int",
                Cel::String(_) => "string",
                Cel::Bool(_) => "bool",
                Cel::Float(_) => "double",
                Cel::List(_) => "list",
                Cel::Map(_) => "map",
                _ => "other",
            }
            .to_string()
        });
        if !matches!(program.execute(&ctx), Ok(Cel::Bool(true))) {
            out.push(format!("{path}: {}", v["message"].as_str().unwrap_or(rule)));
        }
    }
    if let (Some(props), Some(obj)) = (schema["properties"].as_object(), value.as_object()) {
        for (k, s) in props {
            if let Some(v) = obj.get(k) {
                out.extend(cel_refusals(s, v, &format!("{path}.{k}")));
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
        for (i, v) in list.iter().enumerate() {
            out.extend(cel_refusals(items, v, &format!("{path}[{i}]")));
        }
    }
    out
}

/// Issue 67, item 7: the RoleBasedGroup CRD's CEL rules refuse what one object can be checked
/// for (patterns and template sources mutually exclusive, dependencies among the roles,
/// rollout counts and percentages, partition within replicas), and take the seeds' groups and
/// the examples as they are.
#[test]
fn the_crds_cel_rules_take_good_groups_and_refuse_bad_ones_by_name() {
    let crd = docs("manifests/crds/workloads.x-k8s.io_rolebasedgroups.yaml").remove(0);
    let schema_of = |version: &str| -> Value {
        crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == version)
            .unwrap()["schema"]["openAPIV3Schema"]
            .clone()
    };
    let refusals = |g: &Value| {
        let version = g["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap();
        cel_refusals(&schema_of(version), g, "")
    };
    // Good: every seed group and the examples.
    let mut good = 0;
    for file in [
        "000-pd-disaggregated-with-mooncake.yaml",
        "002-sglang-demo.yaml",
        "003-sglang-mooncake-smg-v2.yaml",
        "003-vllm-pd-with-mooncake-demo.yaml",
    ] {
        for v in seed(file) {
            assert_eq!(refusals(&v), Vec::<String>::new(), "{file}");
            good += 1;
        }
    }
    for v in docs("manifests/examples/kvcache-v1alpha2.yaml") {
        if v["kind"] == "RoleBasedGroup" {
            assert_eq!(refusals(&v), Vec::<String>::new());
            good += 1;
        }
    }
    assert!(good >= 5, "groups checked: {good}");
    // Bad: each rule refuses, naming what is wrong.
    let tpl = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
    let group = |roles: Value| {
        json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
               "metadata": {"name": "g"}, "spec": {"roles": roles}})
    };
    let rolling = |ru: Value| {
        group(
            json!([{"name": "a", "replicas": 2, "standalonePattern": {"template": tpl},
                      "rolloutStrategy": {"rollingUpdate": ru}}]),
        )
    };
    for (bad, says) in [
        (
            group(json!([{"name": "a", "standalonePattern": {"template": tpl},
                       "leaderWorkerPattern": {"size": 2, "template": tpl}}])),
            "standalonePattern and leaderWorkerPattern are mutually exclusive",
        ),
        (
            group(json!([{"name": "a", "template": tpl, "templateRef": {"name": "t"}}])),
            "template and templateRef are mutually exclusive",
        ),
        (
            group(
                json!([{"name": "a", "standalonePattern": {"template": tpl}, "dependencies": ["z"]}]),
            ),
            "dependencies must name roles of this group",
        ),
        (
            rolling(json!({"partition": 3})),
            "partition may not exceed replicas",
        ),
        (
            rolling(json!({"maxSurge": "150%"})),
            "maxSurge: a count of 0 or more",
        ),
        (
            rolling(json!({"maxUnavailable": "a lot"})),
            "maxUnavailable: a count of 0 or more",
        ),
        (
            rolling(json!({"partition": -1})),
            "partition: a count of 0 or more",
        ),
    ] {
        let said = refusals(&bad);
        assert!(said.iter().any(|m| m.contains(says)), "{says}: {said:?}");
    }
    // A set's paced rollout takes 1 or more, or 1% to 100%.
    let sets = docs("manifests/crds/workloads.x-k8s.io_rolebasedgroupsets.yaml").remove(0);
    let set_schema = &sets["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let set = |max: Value| {
        json!({"spec": {"replicas": 3, "rolloutStrategy": {"rollingUpdate": {"maxUnavailable": max}},
               "groupTemplate": {"spec": {"roles": [{"name": "a"}]}}}})
    };
    for (max, ok) in [
        (json!(1), true),
        (json!("50%"), true),
        (json!(0), false),
        (json!("0%"), false),
        (json!("101%"), false),
    ] {
        let said = cel_refusals(set_schema, &set(max.clone()), "");
        assert_eq!(said.is_empty(), ok, "{max}: {said:?}");
    }
    // Good forms of the same fields.
    for ok in [
        rolling(json!({"partition": 2, "maxSurge": "25%", "maxUnavailable": 1})),
        rolling(json!({"partition": "50%", "maxSurge": 0, "maxUnavailable": "100%"})),
        group(
            json!([{"name": "a", "standalonePattern": {"template": tpl}},
                     {"name": "b", "dependencies": ["a"], "leaderWorkerPattern": {"size": 2, "template": tpl}}]),
        ),
    ] {
        assert_eq!(refusals(&ok), Vec::<String>::new(), "{ok}");
    }
}

fn bound(p: &Value) -> bool {
    p.pointer("/spec/nodeName").is_some()
}

fn unschedulable(p: &Value) -> bool {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
}

fn condition<'a>(g: &'a Value, kind: &str) -> Option<&'a Value> {
    g["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// A prefill (two leader-worker instances of two pods) and decode (two pods) group.
fn pd_group(name: &str, annotations: Value) -> Value {
    let t = json!({"spec": {"containers": [{"name": "c", "image": "rbgctl:1"}]}});
    json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"roles": [
            {"name": "prefill", "replicas": 2,
             "leaderWorkerPattern": {"size": 2, "template": t}},
            {"name": "decode", "replicas": 2, "standalonePattern": {"template": t}}]}})
}

/// Issue 67, item 2: a gang-scheduled group gets a Volcano PodGroup and its pods the mark
/// Volcano reads; on a cluster with room for four of its six pods nothing starts (all or
/// nothing), until a coordination rule's per-role minimums (KEP-430: one prefill instance and
/// one decode) let the scheduler start a whole prefill instance and a decode pod; without the
/// annotation and the rule the PodGroup goes.
#[test]
fn a_gang_waits_for_room_for_all_and_role_minimums_let_it_start_smaller() {
    use rbgctl::operator::config::Scheduler;
    let e = env();
    e.kubelet.set_capacity(Some(4));
    let _op = e.operator_with("a", |c| c.scheduler_name = Scheduler::Volcano);
    let g = pd_group(
        "gang",
        json!({"rbg.workloads.x-k8s.io/group-gang-scheduling": "true",
               "rbg.workloads.x-k8s.io/group-gang-scheduling-volcano-queue": "inference"}),
    );
    e.api.create("rolebasedgroups", NS, g).unwrap();
    let all = "rbg.workloads.x-k8s.io/group-name=gang";
    assert!(
        wait_until(T, || {
            let pods = e.pods(all);
            pods.len() == 6 && pods.values().all(unschedulable)
        }),
        "six pods, none placed: {:?}",
        e.pods(all)
            .values()
            .map(|p| &p["status"])
            .collect::<Vec<_>>()
    );
    let pg = e
        .api
        .get("podgroups.scheduling.volcano.sh", NS, "gang")
        .expect("the Volcano PodGroup");
    assert_eq!(pg["spec"]["minMember"], 6);
    assert_eq!(pg["spec"]["queue"], "inference");
    assert!(pg["spec"].get("subGroupPolicy").is_none());
    assert_eq!(
        pg["metadata"]["ownerReferences"][0]["kind"],
        "RoleBasedGroup"
    );
    assert!(e
        .api
        .get("podgroups.scheduling.x-k8s.io", NS, "gang")
        .is_none());
    for p in e.pods(all).values() {
        assert_eq!(
            p["metadata"]["annotations"]["scheduling.k8s.io/group-name"],
            "gang"
        );
    }
    let said = e.group("gang");
    let c = condition(&said, "GangScheduling").expect("the condition");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("PodGroupWritten"))
    );
    // Per-role minimums: one whole prefill instance and one decode pod may start.
    let policy = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "CoordinatedPolicy",
        "metadata": {"name": "gang"},
        "spec": {"policies": [{"name": "start-small", "roles": ["prefill", "decode"],
            "strategy": {"scheduling": {"gang": {"minReplicas": {"prefill": 1, "decode": 1}}}}}]}});
    e.api.create("coordinatedpolicies", NS, policy).unwrap();
    assert!(
        wait_until(T, || e.pods(all).values().filter(|p| bound(p)).count() == 4),
        "four pods placed: {:?}",
        e.pods(all)
            .values()
            .map(|p| &p["status"])
            .collect::<Vec<_>>()
    );
    let pg = e
        .api
        .get("podgroups.scheduling.volcano.sh", NS, "gang")
        .unwrap();
    assert_eq!(pg["spec"]["minMember"], 3, "{pg}");
    let policies = pg["spec"]["subGroupPolicy"].as_array().unwrap();
    assert_eq!(policies.len(), 2, "{pg}");
    let pods = e.pods(all);
    let placed = |role: &str| {
        pods.values()
            .filter(|p| p["metadata"]["labels"]["rbg.workloads.x-k8s.io/role-name"] == role)
            .filter(|p| bound(p))
            .map(|p| {
                p["metadata"]["labels"]["rbg.workloads.x-k8s.io/role-instance-name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    let prefill = placed("prefill");
    assert!(
        prefill
            .iter()
            .any(|i| prefill.iter().filter(|x| *x == i).count() == 2),
        "a whole prefill instance: {prefill:?}"
    );
    assert!(!placed("decode").is_empty());
    // No gang asked any more: the PodGroup and the condition go.
    e.api.delete("coordinatedpolicies", NS, "gang").unwrap();
    e.api
        .merge_patch(
            "rolebasedgroups",
            NS,
            "gang",
            false,
            json!({"metadata": {"annotations":
                {"rbg.workloads.x-k8s.io/group-gang-scheduling": null}}}),
        )
        .unwrap();
    assert!(wait_until(T, || e
        .api
        .get("podgroups.scheduling.volcano.sh", NS, "gang")
        .is_none()));
    assert!(wait_until(T, || condition(
        &e.group("gang"),
        "GangScheduling"
    )
    .is_none()));
}

/// Issue 67, item 2: scheduler-plugins' PodGroup and label; and a gang asked for where the
/// scheduler's CRD is not installed makes no pod and says why.
#[test]
fn scheduler_plugins_gangs_and_a_missing_podgroup_crd() {
    let e = env();
    let _op = e.operator("a");
    let g = pd_group(
        "sp",
        json!({"rbg.workloads.x-k8s.io/group-gang-scheduling": "true",
               "rbg.workloads.x-k8s.io/group-gang-scheduling-timeout": "120",
               "scheduling.x-k8s.io/note": "passed on"}),
    );
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("sp")));
    let pg = e
        .api
        .get("podgroups.scheduling.x-k8s.io", NS, "sp")
        .expect("the scheduler-plugins PodGroup");
    assert_eq!(
        pg["spec"],
        json!({"minMember": 6, "scheduleTimeoutSeconds": 120})
    );
    assert_eq!(
        pg["metadata"]["annotations"]["scheduling.x-k8s.io/note"],
        "passed on"
    );
    for p in e.pods("rbg.workloads.x-k8s.io/group-name=sp").values() {
        assert_eq!(
            p["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io/name"],
            "sp"
        );
    }
    // The group's deletion takes its PodGroup.
    e.api.delete("rolebasedgroups", NS, "sp").unwrap();
    assert!(wait_until(T, || e
        .api
        .get("podgroups.scheduling.x-k8s.io", NS, "sp")
        .is_none()));

    e.api.uninstall("podgroups.scheduling.x-k8s.io");
    let g = pd_group(
        "nocrd",
        json!({"rbg.workloads.x-k8s.io/group-gang-scheduling": "true"}),
    );
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || {
        condition(&e.group("nocrd"), "GangScheduling")
            .is_some_and(|c| c["reason"] == "PodGroupCRDMissing")
    }));
    let told = e.events("PodGroupCRDMissing");
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0]["message"]
        .as_str()
        .unwrap()
        .contains("podgroups.scheduling.x-k8s.io"));
    assert!(e.pods("rbg.workloads.x-k8s.io/group-name=nocrd").is_empty());
    // A bad setting is refused by name.
    let g = pd_group(
        "badgang",
        json!({"rbg.workloads.x-k8s.io/group-gang-scheduling": "true",
               "rbg.workloads.x-k8s.io/group-gang-scheduling-timeout": "soon"}),
    );
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || {
        condition(&e.group("badgang"), "Ready").is_some_and(|c| {
            c["reason"] == "InvalidGangScheduling"
                && c["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("group-gang-scheduling-timeout")
        })
    }));
}

/// Issue 67, item 3: each template a role has had is a numbered ControllerRevision; a pod
/// deleted below the partition comes back at the revision its neighbours keep (not the
/// role's new one); `rollback-to: previous` writes the old template back into the spec and
/// the pods follow in place; a rollback to a revision by name goes forward again.
#[test]
fn revisions_are_kept_and_a_group_rolls_back_to_one_in_place() {
    let e = env();
    let op = e.operator("a");
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "hist"},
        "spec": {"roles": [{"name": "web", "replicas": 3,
            "rolloutStrategy": {"rollingUpdate": {"type": "InPlaceIfPossible", "partition": 2}},
            "standalonePattern": {"template": {"spec": {"containers": [
                {"name": "c", "image": "rbgctl:1"}]}}}}]}});
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("hist")));
    let image = |n: &str| {
        e.api
            .get("pods", NS, n)
            .map(|p| p["spec"]["containers"][0]["image"].clone())
            .unwrap_or(Value::Null)
    };
    let revisions = || {
        let mut crs = e.api.list(
            "controllerrevisions",
            NS,
            "rbg.workloads.x-k8s.io/group-name=hist,rbg.workloads.x-k8s.io/role-name=web",
        );
        crs.sort_by_key(|c| c["revision"].as_i64());
        crs
    };
    assert!(wait_until(T, || revisions().len() == 1));
    let first = revisions()[0].clone();
    let h1 = first["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(first["metadata"]["name"], format!("hist-web-{h1}"));
    assert_eq!(first["revision"], 1);
    assert_eq!(
        first["metadata"]["ownerReferences"][0]["kind"],
        "RoleBasedGroup"
    );
    let pod_rev = |n: &str| {
        e.api.get("pods", NS, n).map_or(Value::Null, |p| {
            p["metadata"]["labels"]["controller-revision-hash"].clone()
        })
    };
    assert_eq!(pod_rev("hist-web-0"), h1.as_str());
    // The new image reaches the ordinal at and above the partition only.
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "hist",
            json!([{"op": "replace",
            "path": "/spec/roles/0/standalonePattern/template/spec/containers/0/image",
            "value": "rbgctl:2"}]),
        )
        .unwrap();
    assert!(wait_until(T, || image("hist-web-2") == "rbgctl:2"));
    e.settled(&op, "hist");
    assert!(wait_until(T, || revisions().len() == 2));
    let h2 = revisions()[1]["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(revisions()[1]["revision"], 2);
    let st = &e.group("hist")["status"]["roleStatuses"][0];
    assert_eq!(st["currentRevision"], h1.as_str(), "{st}");
    assert_eq!(st["updateRevision"], h2.as_str(), "{st}");
    // A pod deleted below the partition comes back at the revision it kept.
    let old_uid = e.uids("rbg.workloads.x-k8s.io/group-name=hist")["hist-web-0"].clone();
    e.api.delete("pods", NS, "hist-web-0").unwrap();
    assert!(wait_until(T, || {
        e.uids("rbg.workloads.x-k8s.io/group-name=hist")
            .get("hist-web-0")
            .is_some_and(|u| *u != old_uid)
            && e.ready("hist")
    }));
    assert_eq!(image("hist-web-0"), "rbgctl:1");
    assert_eq!(pod_rev("hist-web-0"), h1.as_str());
    // Roll back: the spec names rbgctl:1 again, and the updated pod follows in place.
    let uids = e.uids("rbg.workloads.x-k8s.io/group-name=hist");
    e.api
        .merge_patch("rolebasedgroups", NS, "hist", false,
            json!({"metadata": {"annotations": {"rbg.workloads.x-k8s.io/rollback-to": "previous"}}}))
        .unwrap();
    let spec_image = |g: &Value| {
        g["spec"]["roles"][0]["standalonePattern"]["template"]["spec"]["containers"][0]["image"]
            .clone()
    };
    assert!(wait_until(T, || spec_image(&e.group("hist")) == "rbgctl:1"));
    let g = e.group("hist");
    assert!(g["metadata"]["annotations"]
        .get("rbg.workloads.x-k8s.io/rollback-to")
        .is_none());
    assert_eq!(g["spec"]["roles"][0]["replicas"], 3, "replicas kept");
    assert!(wait_until(T, || image("hist-web-2") == "rbgctl:1"));
    assert_eq!(
        e.uids("rbg.workloads.x-k8s.io/group-name=hist"),
        uids,
        "rolled back in place"
    );
    let told = e.events("RolledBack");
    assert!(
        told[0]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("hist-web-{h1} (revision 1)")),
        "{told:?}"
    );
    assert_eq!(revisions().len(), 2, "going back makes no new revision");
    // Forward again by name; a name that is no revision is refused and said.
    e.api
        .merge_patch(
            "rolebasedgroups",
            NS,
            "hist",
            false,
            json!({"metadata": {"annotations":
                {"rbg.workloads.x-k8s.io/rollback-to": format!("hist-web-{h2}")}}}),
        )
        .unwrap();
    assert!(wait_until(T, || spec_image(&e.group("hist")) == "rbgctl:2"));
    e.api
        .merge_patch("rolebasedgroups", NS, "hist", false,
            json!({"metadata": {"annotations": {"rbg.workloads.x-k8s.io/rollback-to": "hist-web-nope"}}}))
        .unwrap();
    assert!(wait_until(T, || !e.events("RollbackRefused").is_empty()));
    assert!(wait_until(T, || e.group("hist")["metadata"]["annotations"]
        .get("rbg.workloads.x-k8s.io/rollback-to")
        .is_none()));
    assert_eq!(spec_image(&e.group("hist")), "rbgctl:2");
}

/// Issue 67, item 4: a CoordinatedPolicy orders a prefill/decode rollout (decode first,
/// prefill never further along than decode's updated and Ready share) and gives it a
/// progress deadline. A good image rolls decode first then prefill; a bad image stalls on
/// decode's first pod, and past the deadline every role goes back to its revision from before,
/// in reverse order; no role is ever left without a Ready pod, and prefill is never touched by
/// the bad rollout.
#[test]
fn an_ordered_rollout_leads_with_decode_and_rolls_back_in_reverse_past_its_deadline() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let e = env();
    e.kubelet.bad_image("rbgctl:bad");
    let op = e.operator("a");
    let t = |image: &str| json!({"spec": {"containers": [{"name": "c", "image": image}]}});
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "pdr"},
        "spec": {"roles": [
            {"name": "prefill", "replicas": 2, "standalonePattern": {"template": t("rbgctl:1")}},
            {"name": "decode", "replicas": 2, "standalonePattern": {"template": t("rbgctl:1")}}]}});
    let policy = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "CoordinatedPolicy",
        "metadata": {"name": "pdr"},
        "spec": {"policies": [{"name": "pd", "roles": ["prefill", "decode"],
            "strategy": {"rollingUpdate": {"order": ["decode", "prefill"],
                                           "progressDeadlineSeconds": 3}}}]}});
    e.api.create("coordinatedpolicies", NS, policy).unwrap();
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("pdr")));
    let phase = |e: &Env| e.group("pdr")["status"]["coordinatedRollouts"][0]["phase"].clone();
    assert!(wait_until(T, || phase(&e) == "Complete"));
    // Watch the pods throughout: the fewest Ready per role, and when each role first ran an
    // image other than rbgctl:1.
    let stop = Arc::new(AtomicBool::new(false));
    /// The fewest Ready pods seen per role, and each (role, image) as first seen.
    type Seen = (BTreeMap<String, usize>, Vec<(String, String)>);
    let seen: Arc<Mutex<Seen>> = Default::default();
    let watcher = {
        let (api, stop, seen) = (e.api.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let pods = api.list("pods", NS, "rbg.workloads.x-k8s.io/group-name=pdr");
                let mut s = seen.lock().unwrap();
                for role in ["prefill", "decode"] {
                    let mine: Vec<&Value> = pods
                        .iter()
                        .filter(|p| {
                            p["metadata"]["labels"]["rbg.workloads.x-k8s.io/role-name"] == role
                        })
                        .collect();
                    let ready = mine
                        .iter()
                        .filter(|p| {
                            p["status"]["conditions"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                                && p.pointer("/metadata/deletionTimestamp").is_none()
                        })
                        .count();
                    let low = s.0.entry(role.to_string()).or_insert(usize::MAX);
                    *low = (*low).min(ready);
                    for p in &mine {
                        let image = p["spec"]["containers"][0]["image"].as_str().unwrap_or("");
                        let change = (role.to_string(), image.to_string());
                        if image != "rbgctl:1" && !s.1.contains(&change) {
                            s.1.push(change);
                        }
                    }
                }
                drop(s);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let set_images = |image: &str| {
        e.api
            .json_patch("rolebasedgroups", NS, "pdr", json!([
                {"op": "replace", "path": "/spec/roles/0/standalonePattern/template/spec/containers/0/image", "value": image},
                {"op": "replace", "path": "/spec/roles/1/standalonePattern/template/spec/containers/0/image", "value": image}]))
            .unwrap();
    };
    let images = |role: &str| -> Vec<String> {
        e.pods(&sel_v2("pdr", role))
            .values()
            .map(|p| {
                p["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    // A good release: decode leads, then prefill; the rollout completes.
    set_images("rbgctl:2");
    assert!(wait_until(T, || phase(&e) == "Complete"
        && images("prefill") == ["rbgctl:2", "rbgctl:2"]
        && images("decode") == ["rbgctl:2", "rbgctl:2"]
        && e.ready("pdr")));
    {
        let s = seen.lock().unwrap();
        assert_eq!(
            s.1.first(),
            Some(&("decode".to_string(), "rbgctl:2".to_string())),
            "{:?}",
            s.1
        );
    }
    e.settled(&op, "pdr");
    let prefill_uids = e.uids(&sel_v2("pdr", "prefill"));
    // A bad release: decode's first pod never becomes Ready; prefill waits; past the deadline
    // both go back to rbgctl:2.
    set_images("rbgctl:bad");
    assert!(wait_until(T, || images("decode").contains(&"rbgctl:bad".to_string())));
    assert!(wait_until(T, || phase(&e) == "RollingBack"
        || phase(&e) == "RolledBack"));
    assert!(wait_until(T, || phase(&e) == "RolledBack" && e.ready("pdr")));
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    assert_eq!(images("decode"), ["rbgctl:2", "rbgctl:2"]);
    assert_eq!(images("prefill"), ["rbgctl:2", "rbgctl:2"]);
    assert_eq!(
        e.uids(&sel_v2("pdr", "prefill")),
        prefill_uids,
        "prefill untouched"
    );
    let spec = e.group("pdr");
    for r in 0..2 {
        assert_eq!(
            spec["spec"]["roles"][r]["standalonePattern"]["template"]["spec"]["containers"][0]
                ["image"],
            "rbgctl:2"
        );
    }
    let s = seen.lock().unwrap();
    assert!(
        !s.1.contains(&("prefill".to_string(), "rbgctl:bad".to_string())),
        "{:?}",
        s.1
    );
    for role in ["prefill", "decode"] {
        assert!(
            s.0[role] >= 1,
            "role {role} had no Ready pod at some moment: {:?}",
            s.0
        );
    }
    let told = e.events("RolloutRolledBack");
    assert_eq!(told.len(), 1, "{told:?}");
    let msg = told[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("progress deadline of 3 s") && msg.contains("prefill, decode"),
        "{msg}"
    );
}

/// Issue 67, item 6 (the operator's part): a pool store role that hands its objects over
/// (`rbg.workloads.x-k8s.io/store-hand-over-seconds`) gets a PodDisruptionBudget of one, its
/// pods the store's hand-over setting and a grace period that covers it, and scales down one
/// pod at a time, each once the last is gone; without the annotation the budget goes.
#[test]
fn a_store_role_that_hands_over_leaves_one_pod_at_a_time_under_a_budget() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let e = env();
    let op = e.operator("a");
    let g = json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
        "metadata": {"name": "pool"},
        "spec": {"roles": [{"name": "store", "replicas": 4,
            "annotations": {"rbg.workloads.x-k8s.io/store-hand-over-seconds": "120"},
            "standalonePattern": {"template": {"spec": {"containers": [
                {"name": "store", "image": "rbgctl:1", "args": ["store"]}]}}}}]}});
    e.api.create("rolebasedgroups", NS, g).unwrap();
    assert!(wait_until(T, || e.ready("pool")));
    let pdb = e
        .api
        .get("poddisruptionbudgets.policy", NS, "pool-store")
        .expect("the store role's budget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["rbg.workloads.x-k8s.io/role-name"],
        "store"
    );
    let sel = sel_v2("pool", "store");
    for p in e.pods(&sel).values() {
        assert_eq!(
            env_of(p, "RBGCTL_STORE_HAND_OVER_SECS").as_deref(),
            Some("120")
        );
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 150);
    }
    // Scale 4 -> 1 while watching how many of its pods are leaving at once.
    let (stop, most) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let watcher = {
        let (api, stop, most, sel) = (e.api.clone(), stop.clone(), most.clone(), sel.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let leaving = api
                    .list("pods", NS, &sel)
                    .iter()
                    .filter(|p| p.pointer("/metadata/deletionTimestamp").is_some())
                    .count();
                most.fetch_max(leaving, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "pool",
            json!([{"op": "replace", "path": "/spec/roles/0/replicas", "value": 1}]),
        )
        .unwrap();
    assert!(wait_until(T, || e.pods(&sel).len() == 1 && e.ready("pool")));
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    assert_eq!(most.load(Ordering::Relaxed), 1, "one store left at a time");
    assert!(e.pods(&sel).contains_key("pool-store-0"));
    // The annotation removed: the budget goes (the pods roll, their setting gone).
    e.api
        .json_patch(
            "rolebasedgroups",
            NS,
            "pool",
            json!([{"op": "remove", "path": "/spec/roles/0/annotations"}]),
        )
        .unwrap();
    assert!(wait_until(T, || e
        .api
        .get("poddisruptionbudgets.policy", NS, "pool-store")
        .is_none()));
    e.settled(&op, "pool");
}
