//! One image for every role, across containers: a master, three stores, two SIMULATED engines
//! and the router, each in its own container with its own address on a private Docker network,
//! all started from the image the Dockerfile's `prebuilt` target makes with this build's binary,
//! only the command differing. Under a multiturn load through the router (the pool as L3), the
//! stores are upgraded as in seed 000: stopped and started again from a new image tag, same
//! address, same shared-memory directory. Then one store is cut off the network for 5 s while a
//! client reads objects kept with two replicas.
//!
//! Needs a Docker engine and the base image (`scripts/build-base-images.sh`, which `.ci/run`
//! runs where Docker is). Without an engine the test says so and is skipped; in CI (`CI` set)
//! an engine without the base image is a failure. Every container, network and image it makes
//! is labelled with its run and removed by that label when the test ends, failed or not.

use crate::common;

use common::{http_at, wait_until, BIN};
use rbgctl::client::{Client, ClientConfig, ReplicateConfig};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BASE: &str = "rbgctl-base:bookworm";
/// Every object this test makes carries this label, and `RUN_LABEL=<run>`.
const LABEL: &str = "rbgctl.test=containers";
const RUN_LABEL: &str = "rbgctl.test.run";
/// Longest any one docker command may take.
const DOCKER_LIMIT: &str = "180";
const T: Duration = Duration::from_secs(60);
const STORES: u8 = 3;
const MASTER_IP: u8 = 2;
const STORE_IP: u8 = 11;
const ENGINE_IP: u8 = 21;
const ROUTER_IP: u8 = 30;
const STORE_PORT: u16 = 17000;

/// Runs `docker ARGS` (bounded by `timeout`); stdout, or the error it printed.
fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .arg(DOCKER_LIMIT)
        .arg("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("docker not runnable: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "docker {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn must(args: &[&str]) -> String {
    docker(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Why the test cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if let Err(e) = docker(&["info", "--format", "{{.ServerVersion}}"]) {
        return Some(format!("no Docker engine ({e})"));
    }
    if docker(&["image", "inspect", BASE]).is_err() {
        let why = format!(
            "the base image {BASE} is missing: run scripts/build-base-images.sh (nothing can be \
             pulled here)"
        );
        assert!(
            std::env::var_os("CI").is_none(),
            "CI has a Docker engine: {why}"
        );
        return Some(why);
    }
    None
}

/// Removes every container, network and image labelled `label`.
fn remove_labelled(label: &str) {
    let ids = docker(&["ps", "-aq", "--filter", &format!("label={label}")]).unwrap_or_default();
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f", "-v"];
        args.extend(&ids);
        let _ = docker(&args);
    }
    let nets =
        docker(&["network", "ls", "-q", "--filter", &format!("label={label}")]).unwrap_or_default();
    for n in nets.split_whitespace() {
        let _ = docker(&["network", "rm", n]);
    }
    let images =
        docker(&["images", "-q", "--filter", &format!("label={label}")]).unwrap_or_default();
    for i in images.split_whitespace() {
        let _ = docker(&["rmi", "-f", i]);
    }
}

/// The deployment: its network, images and host folders; all removed on drop.
struct Cluster {
    run: String,
    net: String,
    /// First three octets of the network's /24.
    subnet: String,
    /// The image, then the one the stores are upgraded to.
    images: Vec<String>,
    /// Host shared-memory folders, one per store (mounted at the store's segment directory).
    shm: PathBuf,
    context: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        remove_labelled(&format!("{RUN_LABEL}={}", self.run));
        let _ = std::fs::remove_dir_all(&self.shm);
        let _ = std::fs::remove_dir_all(&self.context);
    }
}

impl Cluster {
    fn ip(&self, last: u8) -> String {
        format!("{}.{last}", self.subnet)
    }

    fn name(&self, role: &str) -> String {
        format!("{}-{role}", self.run)
    }

    /// `docker run -d` of `cmd` in `image`, as `role` at `.last` on the network.
    fn start(&self, role: &str, last: u8, image: &str, mounts: &[String], cmd: &[&str]) {
        let (name, ip, run_label) = (
            self.name(role),
            self.ip(last),
            format!("{RUN_LABEL}={}", self.run),
        );
        let mut args = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--hostname",
            role,
            "--network",
            &self.net,
            "--ip",
            &ip,
            "--label",
            LABEL,
            "--label",
            &run_label,
            "--env",
            "RBGCTL_LOG=info",
        ];
        for m in mounts {
            args.extend(["-v", m.as_str()]);
        }
        args.push(image);
        args.extend(cmd);
        must(&args);
    }

    fn store_cmd(&self, i: u8) -> Vec<String> {
        [
            "rbgctl",
            "store",
            "--master",
            &format!("{}:50051", self.ip(MASTER_IP)),
            // No --local-hostname: the store advertises its interface toward the master.
            "--port",
            &STORE_PORT.to_string(),
            "--name",
            &format!("store-{i}"),
            "--segment-size",
            "64MiB",
            "--shm-dir",
            "/var/lib/rbgctl/shm",
            "--metrics-port",
            "9100",
        ]
        .map(String::from)
        .to_vec()
    }

    fn start_store(&self, i: u8, image: &str) {
        let dir = self.shm.join(format!("store-{i}"));
        let mount = format!("{}:/var/lib/rbgctl/shm", dir.display());
        let cmd = self.store_cmd(i);
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        self.start(&format!("store-{i}"), STORE_IP + i, image, &[mount], &cmd);
    }

    fn master_json(&self, path: &str) -> Value {
        let (code, body) = http_at(&self.ip(MASTER_IP), 9003, "GET", path, b"");
        if code != 200 {
            return Value::Null;
        }
        serde_json::from_str(&body).unwrap_or(Value::Null)
    }

    /// Segment name -> state, as the master sees them.
    fn segments(&self) -> BTreeMap<String, String> {
        self.master_json("/api/v1/segments")["segments"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| Some((s["name"].as_str()?.into(), s["state"].as_str()?.into())))
            .collect()
    }

    fn live(&self, store: u8) -> bool {
        self.segments()
            .get(&format!("store-{store}"))
            .is_some_and(|s| s == "live")
    }

    fn client(&self) -> Client {
        let mut cfg = ClientConfig::new(format!("{}:50051", self.ip(MASTER_IP)));
        cfg.same_host_shm = false;
        Client::connect(cfg).expect("the host reaches the master's container")
    }

    fn logs(&self, role: &str) -> String {
        docker(&["logs", "--tail", "40", &self.name(role)]).unwrap_or_else(|e| e)
    }
}

/// The sum of a metric over an engine's `/metrics`.
fn engine_metric(ip: &str, name: &str) -> f64 {
    let (_, text) = http_at(ip, 8000, "GET", "/metrics", b"");
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn build_images(run: &str, context: &Path) -> Vec<String> {
    std::fs::create_dir_all(context).unwrap();
    // The test build's binary, without its debug sections: the image gets no Rust build.
    let bin = context.join("rbgctl");
    let status = Command::new("objcopy")
        .args(["--strip-debug", BIN])
        .arg(&bin)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        std::fs::copy(BIN, &bin).unwrap();
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let rel = bin
        .strip_prefix(root)
        .expect("the context is inside the repository");
    let prebuilt = format!("PREBUILT={}", rel.display());
    let run_label = format!("{RUN_LABEL}={run}");
    let tags = vec![format!("rbgctl-e2e:{run}-a"), format!("rbgctl-e2e:{run}-b")];
    // As the README says: scripts/build-image.sh (Docker's legacy builder here, no registry).
    for (tag, variant) in tags.iter().zip(["a", "b"]) {
        let variant = format!("rbgctl.test.variant={variant}");
        let out = Command::new("timeout")
            .arg(DOCKER_LIMIT)
            .arg(Path::new(root).join("scripts/build-image.sh"))
            .args([tag.as_str(), "-q", "--label", LABEL, "--label", &run_label])
            .args(["--label", &variant])
            .env("PREBUILT", prebuilt.trim_start_matches("PREBUILT="))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/build-image.sh: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    tags
}

/// Issue 40, items 15, 16 and 19: the image answers `--help` and `mooncake_master --help`, and
/// its OCI labels say when and from which revision it was built.
fn check_image_basics(image: &str) {
    let labels = must(&["image", "inspect", "-f", "{{json .Config.Labels}}", image]);
    let labels: Value = serde_json::from_str(&labels).unwrap();
    for key in ["created", "revision"] {
        let v = labels[format!("org.opencontainers.image.{key}")]
            .as_str()
            .unwrap_or("");
        assert!(!v.is_empty() && v != "unknown", "{key}: {labels}");
    }
    let help = must(&["run", "--rm", image, "--help"]);
    assert!(help.contains("store") && help.contains("master"), "{help}");
    let help = must(&["run", "--rm", image, "mooncake_master", "--help"]);
    assert!(help.contains("--rpc_port"), "{help}");
    let help = must(&["run", "--rm", image, "store", "--help"]);
    assert!(help.contains("--shm-group"), "{help}");
    // Issue 42: the image carries libibverbs, so a store asked for RDMA on a device this host
    // lacks says which device is missing, not that the library is.
    let refused = docker(&[
        "run",
        "--rm",
        image,
        "store",
        "--master",
        "127.0.0.1:1",
        "--protocol",
        "rdma",
        "--device",
        "rxe9",
        "--segment-size",
        "1MiB",
    ])
    .expect_err("no RDMA device in the container");
    assert!(
        refused.contains("store.device") && !refused.contains("cannot load libibverbs"),
        "{refused}"
    );
    // Issue 62, item B1: a segment larger than a container's default /dev/shm (64 MiB) is
    // refused with the fixes named.
    let refused = docker(&[
        "run",
        "--rm",
        image,
        "store",
        "--master",
        "127.0.0.1:1",
        // A stable name: the segment is a file in /dev/shm, kept across restarts.
        "--name",
        "store-x",
        "--segment-size",
        "128MiB",
    ])
    .expect_err("no room in the container's /dev/shm");
    assert!(
        refused.contains("--shm-size") && refused.contains("emptyDir: {medium: Memory"),
        "{refused}"
    );
}

#[test]
fn one_image_serves_every_role_and_a_store_upgrade_under_load_keeps_the_cache() {
    if let Some(why) = unavailable() {
        common::skip(&format!("the container test needs {why}"));
        return;
    }
    let pid = std::process::id();
    remove_labelled(LABEL); // what a killed earlier run left
    let run = format!("rbgctl-e2e-{pid}");
    let subnet = format!("172.29.{}", 20 + pid % 200);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let context = root.join("target/docker").join(&run);
    // From here on, whatever happens, the cluster's drop removes what the run made.
    let mut cluster = Cluster {
        net: run.clone(),
        subnet,
        images: Vec::new(),
        shm: PathBuf::from("/dev/shm").join(&run),
        context,
        run,
    };
    let t0 = Instant::now();
    cluster.images = build_images(&cluster.run, &cluster.context);
    let build_secs = t0.elapsed().as_secs_f64();
    let c = &cluster;
    let ids: Vec<String> = c
        .images
        .iter()
        .map(|t| must(&["image", "inspect", "-f", "{{.Id}}", t]))
        .collect();
    assert_ne!(ids[0], ids[1], "the upgrade goes to another image");
    check_image_basics(&c.images[0]);
    must(&[
        "network",
        "create",
        "--label",
        LABEL,
        "--label",
        &format!("{RUN_LABEL}={}", c.run),
        "--subnet",
        &format!("{}.0/24", c.subnet),
        &c.net,
    ]);
    for i in 0..STORES {
        let dir = c.shm.join(format!("store-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        // The image runs as uid 10001; the folder is the store's whatever uid runs the test.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let image = &c.images[0];

    // The master, then the stores: time from `docker run` to serving.
    let t = Instant::now();
    c.start(
        "master",
        MASTER_IP,
        image,
        &[],
        &["rbgctl", "master", "--metrics-port", "9003"],
    );
    assert!(
        wait_until(T, || http_at(&c.ip(MASTER_IP), 9003, "GET", "/health", b"")
            .0
            == 200),
        "master: {}",
        c.logs("master")
    );
    let master_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..STORES {
        c.start_store(i, image);
    }
    assert!(
        wait_until(T, || (0..STORES).all(|i| c.live(i))),
        "stores: {:?} {}",
        c.segments(),
        c.logs("store-0")
    );
    let stores_secs = t.elapsed().as_secs_f64();
    let master = format!("{}:50051", c.ip(MASTER_IP));
    for j in 0..2u8 {
        c.start(
            &format!("engine-{j}"),
            ENGINE_IP + j,
            image,
            &[],
            &[
                "rbgctl",
                "sim-engine",
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--l3-master",
                &master,
                "--device-cache-tokens",
                "1024",
                "--host-cache-tokens",
                "0",
                "--bytes-per-token",
                "512",
                "--prefill-us-per-token",
                "20",
                "--decode-ms-per-token",
                "1",
            ],
        );
    }
    let engines: Vec<String> = (0..2).map(|j| c.ip(ENGINE_IP + j)).collect();
    let workers: Vec<String> = engines.iter().map(|e| format!("http://{e}:8000")).collect();
    let mut router_cmd = vec![
        "rbgctl",
        "router",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--prometheus-port",
        "0",
        "--policy",
        "round_robin",
        "--worker-urls",
    ];
    router_cmd.extend(workers.iter().map(String::as_str));
    c.start("router", ROUTER_IP, image, &[], &router_cmd);
    assert!(
        wait_until(T, || http_at(
            &c.ip(ROUTER_IP),
            8000,
            "GET",
            "/readiness",
            b""
        )
        .0 == 200),
        "router: {}",
        c.logs("router")
    );

    // A multiturn load through the router, in the background.
    let (clients, rounds) = (8u32, 8u32);
    let load = Command::new(BIN)
        .args([
            "bench",
            "multiturn",
            "--host",
            &c.ip(ROUTER_IP),
            "--port",
            "8000",
        ])
        .args([
            "--num-clients",
            &clients.to_string(),
            "--num-rounds",
            &rounds.to_string(),
        ])
        .args([
            "--request-length",
            "512",
            "--sub-question-input-length",
            "128",
        ])
        .args([
            "--output-length",
            "16",
            "--disable-auto-run",
            "--request-rate",
            "3",
        ])
        .args(["--json", "--log-file", "", "--request-timeout", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let requests = || {
        engines
            .iter()
            .map(|e| engine_metric(e, "rbgctl_sim_requests_total"))
            .sum::<f64>() as u32
    };
    // Two rounds in, the pool holds their pages: what is committed now must survive.
    assert!(wait_until(T, || requests() >= 2 * clients));
    let listed = c.master_json("/api/v1/keys?limit=10000");
    assert_ne!(
        listed["truncated"], true,
        "more keys than one listing: {listed}"
    );
    let keys: Vec<String> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k.as_str().map(String::from))
        .collect();
    assert!(!keys.is_empty(), "the engines put pages in the pool");
    let client = c.client();
    let before: BTreeMap<&str, u32> = keys
        .iter()
        .map(|k| {
            (
                k.as_str(),
                crc32c::crc32c(&client.get(k).expect("readable before")),
            )
        })
        .collect();

    // Seed 000's upgrade: each store stopped (SIGTERM through tini) and started again from
    // the new tag at the same address on the same shared-memory folder, one at a time.
    let mut away = Vec::new();
    for i in 0..STORES {
        let t = Instant::now();
        must(&["stop", "-t", "20", &c.name(&format!("store-{i}"))]);
        must(&["rm", &c.name(&format!("store-{i}"))]);
        c.start_store(i, &c.images[1]);
        assert!(
            wait_until(T, || c.live(i)),
            "store-{i} back: {:?} {}",
            c.segments(),
            c.logs(&format!("store-{i}"))
        );
        away.push(t.elapsed().as_secs_f64());
    }
    let requests_at_upgrade_end = requests();
    let out = load.wait_with_output().unwrap();
    assert!(out.status.success(), "multiturn failed");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        requests_at_upgrade_end <= clients * (rounds - 1),
        "the upgrade ended after the last round began ({requests_at_upgrade_end} requests)"
    );
    assert_eq!(v["summary"]["failed_requests"], 0, "{}", v["summary"]);
    let hits: Vec<f64> = (0..rounds)
        .map(|r| {
            v["round"][format!("round_{r}")]["cache_hit_rate"]
                .as_f64()
                .unwrap_or(-1.0)
        })
        .collect();
    let cold = hits[0];
    for (r, h) in hits.iter().enumerate().skip(1) {
        assert!(
            *h > cold,
            "round {r}: hit rate {h} fell to the cold round's {cold}: {hits:?}"
        );
    }
    // Every object committed before the upgrade reads back, byte for byte.
    let mut lost = Vec::new();
    for (k, crc) in &before {
        match client.get(k) {
            Ok(v) if crc32c::crc32c(&v) == *crc => {}
            other => lost.push(format!("{k}: {:?}", other.map(|v| v.len()))),
        }
    }
    assert!(lost.is_empty(), "lost across the upgrade: {lost:?}");

    // A partition: store-1 off the network for 5 s; objects with two replicas stay readable.
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let values: Vec<(String, Vec<u8>)> = (0..24u32)
        .map(|i| {
            let v: Vec<u8> = (0..65536u32).map(|b| (b * 7 + i) as u8).collect();
            (format!("partition/{i}"), v)
        })
        .collect();
    for (k, val) in &values {
        client.put(k, val, &two).expect("a put with two replicas");
    }
    let store1 = c.name("store-1");
    must(&["network", "disconnect", &c.net, &store1]);
    let cut = Instant::now();
    let (mut gets, mut failed, mut slowest, mut stalled) = (0u32, Vec::new(), Duration::ZERO, 0u32);
    while cut.elapsed() < Duration::from_secs(5) {
        for (k, val) in &values {
            gets += 1;
            let t = Instant::now();
            let got = client.get(k);
            slowest = slowest.max(t.elapsed());
            stalled += u32::from(t.elapsed() > Duration::from_millis(1500));
            match got {
                Ok(v) if v == *val => {}
                other => failed.push(format!("{k}: {:?}", other.map(|v| v.len()))),
            }
        }
    }
    let (cut_secs, slowest) = (cut.elapsed().as_secs_f64(), slowest.as_secs_f64());
    must(&[
        "network",
        "connect",
        "--ip",
        &c.ip(STORE_IP + 1),
        &c.net,
        &store1,
    ]);
    assert!(
        failed.is_empty(),
        "gets failed while store-1 was cut off: {failed:?}"
    );
    // The first read that finds store-1 gone waits for its timeout; after that the client
    // reads the other replica first instead of waiting again for every object.
    assert!(
        stalled <= 1,
        "{stalled} gets each waited for the cut-off store"
    );
    assert!(wait_until(T, || c.live(1)), "{:?}", c.segments());
    for (k, val) in &values {
        assert_eq!(&client.get(k).expect("readable after the partition"), val);
    }
    eprintln!(
        "FIGURES {}",
        serde_json::json!({
            "image_build_seconds": build_secs,
            "master_docker_run_to_serving_seconds": master_secs,
            "three_stores_docker_run_to_live_seconds": stores_secs,
            "objects_before_upgrade": before.len(), "objects_readable_after": before.len() - lost.len(),
            "store_away_seconds": away, "hit_rate_per_round": hits,
            "requests_when_upgrade_ended": requests_at_upgrade_end,
            "partition_gets": gets, "partition_seconds": cut_secs,
            "partition_slowest_get_seconds": slowest, "partition_stalled_gets": stalled,
        })
    );
}
