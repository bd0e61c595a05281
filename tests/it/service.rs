//! The whole service on loopback: `rbgctl up` (pool, SIMULATED engines, router) driven by
//! `rbgctl bench multiturn`, the three-tier comparison, and the SIMULATED engine in a
//! prefill/decode pair behind the router.

use crate::common;

use common::{http, wait_until, BIN};
use rbgctl::engine::Addrs as EngineAddrs;
use rbgctl::launch::Spawned;
use rbgctl::router::Addrs as RouterAddrs;
use rbgctl::up::UpAddrs;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The port of an `http://host:port` URL.
fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap()
}

fn metric_sum(port: u16, name: &str, label: &str) -> f64 {
    let (_, body) = http(port, "GET", "/metrics", b"");
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `rbgctl ARGS` (a bench with `--json`), which must succeed: its JSON.
fn rbgctl_json(args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn multiturn(port: u16, clients: u32) -> Value {
    let (port, clients) = (port.to_string(), clients.to_string());
    rbgctl_json(&[
        "bench",
        "multiturn",
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--num-clients",
        &clients,
        "--num-rounds",
        "3",
        "--request-length",
        "512",
        "--sub-question-input-length",
        "128",
        "--output-length",
        "16",
        "--disable-auto-run",
        "--request-rate",
        "40",
        "--json",
        "--log-file",
        "",
        "--request-timeout",
        "60",
    ])
}

/// `rbgctl up` on ports the kernel chooses, its segment files under `dir`: `stores` stores of
/// `segment`, `engines` SIMULATED engines whose device caches are far smaller than a
/// conversation (no host tier), and a router with `policy`; `env` added to its environment.
fn up_on_free_ports(
    dir: &std::path::Path,
    (stores, segment): (usize, &str),
    engines: usize,
    policy: &str,
    env: &[(&str, &std::path::Path)],
) -> rbgctl::launch::Spawned<UpAddrs> {
    let cfg = dir.join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[pool]\nstores = {stores}\nsegment_size = \"{segment}\"\nmaster_port = 0\nmetadata_port = 0\nmetrics_port = 0\nshm_dir = {:?}\n\
             [engines]\ncount = {engines}\nbase_port = 0\ndevice_cache_tokens = 1024\nhost_cache_tokens = 0\nbytes_per_token = 512\n\
             prefill_us_per_token = 20.0\ndecode_ms_per_token = 1.0\n[router]\nport = 0\npolicy = \"{policy}\"\n",
            dir.join("shm"),
        ),
    )
    .unwrap();
    let argv = vec!["up".into(), "--config".into(), cfg.display().to_string()];
    // The test binary's launcher: `up`'s log outlives this call.
    common::shared_launcher()
        .spawn_argv_with_env::<UpAddrs>("up", &argv, env)
        .expect("up starts")
}

#[test]
fn up_serves_multiturn_with_the_pool_as_l3_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    // A device cache far smaller than the conversations, no host tier: hits beyond the
    // device must come from the pool. Every port is chosen by the kernel.
    let mut up = up_on_free_ports(dir.path(), (2, "64MiB"), 2, "round_robin", &[]);
    let router = port_of(up.addrs.router.as_deref().expect("a router"));
    let engines: Vec<u16> = up.addrs.engines.iter().map(|e| port_of(e)).collect();
    assert_eq!(engines.len(), 2);
    assert_eq!(
        http(router, "GET", "/readiness", b"").0,
        200,
        "router ready"
    );
    let v = multiturn(router, 12);
    let s = &v["summary"];
    assert_eq!(s["total_requests"], 36);
    assert_eq!(s["failed_requests"], 0);
    let hit = s["cache_hit_rate"].as_f64().unwrap();
    assert!(hit > 0.3, "hit rate {hit}");
    assert_eq!(
        v["round"]["round_0"]["cache_hit_rate"], 0.0,
        "cold first round"
    );
    assert!(v["round"]["round_2"]["cache_hit_rate"].as_f64().unwrap() > 0.5);
    // Round robin sends turns to the engine that did not see the history: those hits can
    // only have come from the pool, as real bytes.
    let storage: f64 = engines
        .iter()
        .map(|p| metric_sum(*p, "rbgctl_sim_cached_tokens_total", "storage"))
        .sum();
    let read: f64 = engines
        .iter()
        .map(|p| metric_sum(*p, "rbgctl_sim_l3_bytes_total", "read"))
        .sum();
    let bad: f64 = engines
        .iter()
        .map(|p| metric_sum(*p, "rbgctl_sim_l3_errors_total", "read"))
        .sum();
    assert!(
        storage > 0.0 && read > 0.0,
        "storage tokens {storage}, bytes {read}"
    );
    assert_eq!(bad, 0.0, "every page read back intact");
    // Ctrl-C stops everything.
    let stopped = up
        .process
        .signal_exits_within(nix::sys::signal::Signal::SIGINT, Duration::from_secs(30));
    assert!(stopped.is_some_and(|s| s.success()), "{stopped:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", router)).is_err(),
        "router gone"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", engines[0])).is_err(),
        "engine gone"
    );
}

#[test]
fn the_cache_tiers_on_the_same_workload_rank_as_in_seed_000_and_a_disk_tier_keeps_the_hits() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::small_tiers_config(dir.path());
    let out = Command::new(BIN)
        .args(["bench", "tiers", "--config"])
        .arg(&cfg)
        .args([
            "--num-clients",
            "16",
            "--num-rounds",
            "3",
            "--request-length",
            "512",
        ])
        .args([
            "--sub-question-input-length",
            "128",
            "--output-length",
            "16",
        ])
        .args([
            "--disable-auto-run",
            "--request-rate",
            "40",
            "--json",
            "--log-file",
            "",
        ])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hit = |t: &str| v[t]["summary"]["cache_hit_rate"].as_f64().unwrap();
    for t in ["L1", "L1+L2", "L1+L2+L3", "L1+L2+L3+disk"] {
        assert_eq!(v[t]["summary"]["failed_requests"], 0, "{t}");
        assert_eq!(v[t]["summary"]["total_requests"], 48, "{t}");
    }
    assert!(hit("L1+L2+L3") > hit("L1"), "{v}");
    assert!(hit("L1+L2+L3") >= hit("L1+L2"), "{v}");
    assert!(hit("L1+L2+L3") > 0.4, "{v}");
    // A quarter of the working set in memory, the rest on disk: the hit rate holds.
    let l4 = &v["L1+L2+L3+disk"];
    assert!(hit("L1+L2+L3+disk") >= hit("L1+L2+L3") - 0.05, "{v}");
    assert!(l4["pool_reads_from_disk"].as_f64().unwrap() > 0.0, "{v}");
    assert!(
        l4["pool_memory_bytes"].as_u64() < v["L1+L2+L3"]["pool_memory_bytes"].as_u64(),
        "{v}"
    );
}

/// A layout for `bench policies` small enough for a test: 2 SIMULATED engines with
/// 2,048-token device caches, one store as their L3.
fn small_policies_layout(dir: &std::path::Path) -> std::path::PathBuf {
    let cfg = dir.join("policies.toml");
    std::fs::write(
        &cfg,
        "[pool]\nstores = 1\nsegment_size = \"64MiB\"\n[engines]\ncount = 2\n\
         device_cache_tokens = 2048\nhost_cache_tokens = 0\nbytes_per_token = 512\n\
         prefill_us_per_token = 20.0\ndecode_ms_per_token = 1.0\n",
    )
    .unwrap();
    cfg
}

#[test]
fn the_policies_run_side_by_side_on_fresh_services_against_the_oracle() {
    // The oracle follows the answers' token ids: an API that returns none is refused at once.
    let refused = Command::new(BIN)
        .args(["bench", "policies", "--api-format", "openai"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("--api-format"), "{why}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_policies_layout(dir.path());
    let out = Command::new(BIN)
        .args(["bench", "policies", "--config"])
        .arg(&cfg)
        .args(["--policies", "round_robin,cache_aware,precise_prefix"])
        .args(["--num-clients", "8", "--num-rounds", "3"])
        .args(["--request-length", "256", "--output-length", "8"])
        .args(["--request-rate", "40", "--json", "--report"])
        .arg(dir.path().join("policies.html"))
        .args([
            "--restart-router-before-round",
            "2",
            "--round-barrier-pause",
            "0",
        ])
        .args(["--reps", "2"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["policies"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["round_robin", "cache_aware", "precise_prefix"]);
    for r in runs {
        assert_eq!(r["requests"], 24, "{r}");
        assert_eq!(r["failed"], 0, "{r}");
        let (hit, best) = (
            r["hit_rate"].as_f64().unwrap(),
            r["oracle_hit_rate"].as_f64().unwrap(),
        );
        // Rounds 1 and 2 resend their history: the oracle serves most of it, and no policy
        // serves more than the oracle could.
        assert!(best > 0.4, "{r}");
        assert!(hit <= best + 1e-9, "{r}");
        let tiers = &r["hits_by_tier"];
        let shares: f64 = ["device", "host", "pool"]
            .iter()
            .map(|t| tiers[t].as_f64().unwrap())
            .sum();
        assert!(hit == 0.0 || (shares - 1.0).abs() < 1e-6, "{r}");
        assert!(r["mean_ttft_vs_cache_aware"].as_f64().unwrap() > 0.0, "{r}");
        // Two runs each: the figures are one of them (the median's, here the slower).
        let means: Vec<f64> = r["runs_mean_ttft_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        assert_eq!(means.len(), 2, "{r}");
        assert!(means[0] <= means[1], "{r}");
        assert_eq!(r["mean_ttft_s"].as_f64(), Some(means[1]), "{r}");
        // Killed and started again before round 2: it came back, and the pool kept the hits.
        let restart = &r["router_restart"];
        assert_eq!(restart["round"], 2, "{r}");
        assert!(restart["ready_after_s"].as_f64().unwrap() > 0.0, "{r}");
        let (before, after) = (
            restart["hit_rate_before"].as_f64().unwrap(),
            restart["hit_rate_after"].as_f64().unwrap(),
        );
        assert!(before > 0.2 && after >= 0.9 * before, "{r}");
    }
    // Conversations that stay where their history is find it on the device (until the
    // restart empties cache_aware's tree).
    let aware = &runs[1]["router_restart"];
    assert!(aware["device_share_before"].as_f64().unwrap() > 0.5, "{v}");
    let html = std::fs::read_to_string(dir.path().join("policies.html")).unwrap();
    assert!(html.contains("policies-hit-ttft") && html.contains("precise_prefix"));
}

/// A skewed workload (a few long prompts among many short ones): `predicted_ttft` sees the
/// prefill queued on each worker in tokens, not in requests, so short prompts stay off the
/// workers busy with long ones, and the hits stay where the others find them.
#[test]
fn predicted_ttft_keeps_short_prompts_off_workers_busy_with_long_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("skew.toml");
    std::fs::write(
        &cfg,
        "[pool]\nstores = 1\nsegment_size = \"256MiB\"\n[engines]\ncount = 4\n\
         device_cache_tokens = 65536\nhost_cache_tokens = 0\nbytes_per_token = 512\n",
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let v = rbgctl_json(&[
        "bench",
        "policies",
        "--config",
        cfg,
        "--policies",
        "cache_aware,precise_prefix,predicted_ttft",
        "--num-clients",
        "48",
        "--num-rounds",
        "3",
        "--long-clients",
        "8",
        "--long-request-length",
        "16384",
        "--long-shared-prefix",
        "4096",
        "--request-length",
        "512",
        "--sub-question-input-length",
        "128",
        "--output-length",
        "32",
        "--request-rate",
        "8",
        "--disable-auto-run",
        "--json",
    ]);
    let runs = v["policies"].as_array().unwrap();
    let figure = |i: usize, name: &str| runs[i][name].as_f64().unwrap();
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(
            (r["requests"].as_u64(), r["failed"].as_u64()),
            (Some(144), Some(0)),
            "{r}"
        );
        assert!(figure(i, "hit_rate") > 0.5, "{r}");
    }
    let (aware, precise, predicted) = (0, 1, 2);
    assert_eq!(runs[predicted]["policy"], "predicted_ttft");
    for other in [aware, precise] {
        assert!(
            figure(other, "p90_ttft_s") >= 1.3 * figure(predicted, "p90_ttft_s"),
            "p90 TTFT not 1.3x lower than {}: {v}",
            runs[other]["policy"]
        );
        assert!(
            figure(predicted, "hit_rate") >= figure(other, "hit_rate") - 0.05,
            "hit rate more than 5 points below {}: {v}",
            runs[other]["policy"]
        );
    }
}

#[test]
fn router_replicas_share_the_load_and_precise_prefix_keeps_one_view_across_them() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_policies_layout(dir.path());
    let out = Command::new(BIN)
        .args(["bench", "policies", "--config"])
        .arg(&cfg)
        .args(["--routers", "2", "--policies", "cache_aware,precise_prefix"])
        .args(["--num-clients", "8", "--num-rounds", "3"])
        .args(["--request-length", "256", "--output-length", "8"])
        .args(["--request-rate", "40", "--json"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["routers"], 2, "{v}");
    for r in v["policies"].as_array().unwrap() {
        assert_eq!(r["failed"], 0, "{r}");
        // The requests went to the replicas in turn.
        assert_eq!(r["requests_by_router"], serde_json::json!([12, 12]), "{r}");
    }
    // Both replicas follow the same KV events: the conversations find what the oracle would,
    // though each replica sent only half of their turns.
    let precise = &v["policies"][1];
    let (hit, best) = (
        precise["hit_rate"].as_f64().unwrap(),
        precise["oracle_hit_rate"].as_f64().unwrap(),
    );
    assert!(best > 0.4 && hit >= best - 0.1, "{precise}");
}

#[test]
fn a_prefill_decode_pair_behind_the_router_streams_and_reports_cached_tokens() {
    let launcher = common::launcher();
    let engine = |mode: &str, extra: &[&str]| -> Spawned<EngineAddrs> {
        let argv: Vec<String> = ["sim-engine", "--port", "0", "--disaggregation-mode", mode]
            .into_iter()
            .chain(["--decode-ms-per-token", "1"])
            .chain(extra.iter().copied())
            .map(String::from)
            .collect();
        launcher
            .spawn_argv(&format!("{mode}-engine"), &argv)
            .unwrap()
    };
    let pe = engine("prefill", &["--disaggregation-bootstrap-port", "0"]);
    let de = engine("decode", &[]);
    let (p, d) = (pe.addrs.http.port(), de.addrs.http.port());
    let boot = pe.addrs.bootstrap.expect("a bootstrap port").port();
    let argv = common::router_argv(&[
        "--pd-disaggregation",
        "--prefill",
        &format!("http://127.0.0.1:{p}"),
        &boot.to_string(),
        "--decode",
        &format!("http://127.0.0.1:{d}"),
    ]);
    let r: Spawned<RouterAddrs> = launcher.spawn_argv("router", &argv).unwrap();
    let router = r.addrs.http.port();
    assert!(wait_until(Duration::from_secs(30), || http(
        router,
        "GET",
        "/readiness",
        b""
    )
    .0 == 200));
    // A decode engine alone refuses a request without bootstrap fields.
    let (code, body) = http(d, "POST", "/generate", br#"{"input_ids":[1,2,3]}"#);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("bootstrap"), "{body}");
    let v = multiturn(router, 4);
    assert_eq!(v["summary"]["failed_requests"], 0, "{v}");
    assert_eq!(
        v["summary"]["average_output_len"], 16.0,
        "decode streams every token"
    );
    assert!(
        v["summary"]["cache_hit_rate"].as_f64().unwrap() > 0.3,
        "{v}"
    );
}

#[test]
fn bench_serving_measures_a_simulated_engine() {
    let launcher = common::launcher();
    let argv: Vec<String> = ["sim-engine", "--port", "0", "--decode-ms-per-token", "1"]
        .map(String::from)
        .to_vec();
    let e: Spawned<EngineAddrs> = launcher.spawn_argv("engine", &argv).unwrap();
    let port = e.addrs.http.port();
    let out = Command::new(BIN)
        .args([
            "bench",
            "serving",
            "--port",
            &port.to_string(),
            "--num-prompts",
            "30",
        ])
        .args([
            "--random-input-len",
            "128",
            "--random-output-len",
            "8",
            "--max-concurrency",
            "4",
        ])
        .args(["--backend", "sglang-oai", "--json"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["completed"].as_u64(), v["failed"].as_u64()),
        (Some(30), Some(0)),
        "{v}"
    );
    assert!(v["concurrency"].as_f64().unwrap() <= 4.05, "{v}");
    assert!(v["mean_ttft_ms"].as_f64().unwrap() > 0.0);
}

/// The `kv_events` descriptor of the engine at `port` (its `/server_info`).
fn kv_ports(port: u16) -> Option<(u16, u16)> {
    let (code, body) = http(port, "GET", "/server_info", b"");
    if code != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    let d = &v["kv_events"];
    Some((
        d["endpoint_port_base"].as_u64()? as u16,
        d["replay_endpoint_port_base"].as_u64()? as u16,
    ))
}

/// Issue 62, item A5: an engine whose KV event ports another process took while it was down
/// starts again on new ones, and the router follows it there; the pool (and every object in
/// it) stays up throughout (before: ten failed starts stopped everything and the clean store
/// stop deleted the segment directory).
#[test]
fn an_engine_whose_ports_were_taken_starts_elsewhere_and_the_pool_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = up_on_free_ports(dir.path(), (1, "32MiB"), 1, "precise_prefix", &[]);
    let router = port_of(up.addrs.router.as_deref().expect("a router"));
    let engine = port_of(&up.addrs.engines[0]);
    let master = up.addrs.master.clone().expect("a master");
    let kv = |args: &[&str]| {
        Command::new(BIN)
            .args(["kv", "--master", &master])
            .args(args)
            .output()
            .unwrap()
    };
    assert!(kv(&["put", "kept", "across the engine's trouble"])
        .status
        .success());
    let followed = || {
        let (_, body) = http(router, "GET", "/metrics", b"");
        body.lines()
            .find(|l| l.starts_with("rbgctl_router_kv_events_in_step{"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            == Some(1.0)
    };
    assert!(
        wait_until(Duration::from_secs(30), followed),
        "the router never followed the engine"
    );
    let (pub_port, replay_port) = kv_ports(engine).expect("the engine publishes");
    // The engine dies; another process takes both its KV event ports meanwhile.
    let engine_pid = common::children_of(up.process.pid().unwrap())
        .into_iter()
        .find(|(_, cmd)| cmd.contains("sim-engine"))
        .map(|(pid, _)| pid)
        .expect("the engine's process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(engine_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let taken: Vec<std::net::TcpListener> = [pub_port, replay_port]
        .iter()
        .filter_map(|p| {
            (0..500).find_map(|_| {
                std::net::TcpListener::bind(("127.0.0.1", *p))
                    .ok()
                    .or_else(|| {
                        std::thread::sleep(Duration::from_millis(10));
                        None
                    })
            })
        })
        .collect();
    assert_eq!(taken.len(), 2, "both ports taken by another process");
    // Back on its HTTP port, publishing elsewhere.
    assert!(
        wait_until(Duration::from_secs(60), || kv_ports(engine)
            .is_some_and(|(p, r)| p != pub_port && r != replay_port)),
        "the engine did not start again on new KV event ports"
    );
    // What the engine stores now, on its new ports, reaches the router's index.
    let (_, info) = http(engine, "GET", "/server_info", b"");
    let info: Value = serde_json::from_str(&info).unwrap();
    let block = info["kv_events"]["block_size"].as_u64().unwrap() as usize;
    let ids: Vec<u32> = (7000..7000 + 4 * block as u32).collect();
    let prompt: String = ids.iter().map(|i| format!("t{i} ")).collect();
    let body = serde_json::json!({"text": prompt, "sampling_params": {"max_new_tokens": 1}});
    assert_eq!(
        http(engine, "POST", "/generate", body.to_string().as_bytes()).0,
        200
    );
    let query = serde_json::json!({"token_ids": ids, "block_size": block}).to_string();
    let held = || {
        let (_, v) = http(router, "POST", "/query", query.as_bytes());
        let v: Value = serde_json::from_str(&v).unwrap_or_default();
        v["default"][&up.addrs.engines[0]]["longest_matched"].as_u64() == Some(ids.len() as u64)
    };
    assert!(
        wait_until(Duration::from_secs(60), held),
        "the router did not follow the engine to its new ports"
    );
    let got = kv(&["get", "kept"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "across the engine's trouble",
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert!(up.process.exited().is_none(), "up is still running");
    drop(taken);
    let stopped = up
        .process
        .signal_exits_within(nix::sys::signal::Signal::SIGINT, Duration::from_secs(30));
    assert!(stopped.is_some_and(|s| s.success()), "{stopped:?}");
}

/// Issue 62, item A11: `up` runs with the cluster secret (`RBGCTL_AUTH_TOKEN_FILE`): the
/// master and stores require it, `up`'s own checks and the engines' L3 clients hold it, and
/// the pool serves the engines as L3; a client without it is refused.
#[test]
fn up_runs_with_the_cluster_secret_and_its_engines_use_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("token");
    std::fs::write(&secret, "the-secret-of-this-up-0123456789\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let up = up_on_free_ports(
        dir.path(),
        (1, "64MiB"),
        2,
        "round_robin",
        &[("RBGCTL_AUTH_TOKEN_FILE", &secret)],
    );
    let router = port_of(up.addrs.router.as_deref().expect("a router"));
    let engines: Vec<u16> = up.addrs.engines.iter().map(|e| port_of(e)).collect();
    let v = multiturn(router, 8);
    assert_eq!(v["summary"]["failed_requests"], 0);
    let read: f64 = engines
        .iter()
        .map(|p| metric_sum(*p, "rbgctl_sim_l3_bytes_total", "read"))
        .sum();
    assert!(
        read > 0.0,
        "the engines read their pages back from the pool"
    );
    let master = up.addrs.master.clone().expect("a master");
    let kv = |with: bool| {
        let mut c = Command::new(BIN);
        c.args(["kv", "--master", &master, "segments"])
            .env_remove("RBGCTL_AUTH_TOKEN_FILE");
        if with {
            c.env("RBGCTL_AUTH_TOKEN_FILE", &secret);
        }
        c.output().unwrap()
    };
    assert!(kv(true).status.success());
    let without = kv(false);
    assert!(!without.status.success());
    assert!(
        String::from_utf8_lossy(&without.stderr).contains("UNAUTHENTICATED"),
        "{}",
        String::from_utf8_lossy(&without.stderr)
    );
    // Item B9: a clean Ctrl-C logs no warning.
    let mut up = up;
    let stopped = up
        .process
        .signal_exits_within(nix::sys::signal::Signal::SIGINT, Duration::from_secs(30));
    assert!(stopped.is_some_and(|s| s.success()), "{stopped:?}");
    let log = up.process.log();
    let after = &log[log.find("stopping...").expect("up says it stops")..];
    let warned: Vec<&str> = after
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(warned.is_empty(), "a clean stop warned: {warned:#?}");
}

/// Issue 66: a batch tenant flooding the service at 5× what its engines can prefill leaves an
/// interactive tenant's time to first token where it was alone (within 1.3×), every request
/// answered; without admission the interactive tenant waits behind the flood.
#[test]
fn an_interactive_tenant_keeps_its_ttft_under_a_batch_tenants_flood() {
    let v = rbgctl_json(&[
        "bench",
        "tenants",
        "--seconds",
        "6",
        "--b-in-flight",
        "200",
        "--json",
    ]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{v}");
    for r in runs {
        for side in ["a", "b"] {
            let o = &r[side];
            if o.is_null() {
                continue;
            }
            // Every request answered, each counted once.
            assert_eq!(o["unanswered"], 0, "{r}");
            let by_status: u64 = o["status"]
                .as_object()
                .unwrap()
                .values()
                .map(|n| n.as_u64().unwrap())
                .sum();
            assert_eq!(by_status, o["sent"].as_u64().unwrap(), "{r}");
        }
    }
    // With admission tenant A is never refused (without, the flood fills the engines' own
    // queues, and A's requests share their refusals).
    for r in &runs[..2] {
        assert_eq!(r["a"]["status"]["200"], r["a"]["sent"], "{r}");
    }
    // With admission B's excess is turned away (503 past its class's queue), not queued.
    let flooded = &runs[1]["b"]["status"];
    assert!(flooded["503"].as_u64().unwrap_or(0) > 0, "{v}");
    // A's median stays where it was alone, and its tail near it: `predicted_ttft` (the
    // benchmark's policy) puts an interactive request where no other interactive prefill is
    // queued, and the engines prefill it before B's. (The tail's figure is the benchmark's in a
    // release build, docs/router.md: 1.15-1.22×; this debug build's router adds its own.)
    let p = |run: usize, q: &str| runs[run]["a"][q].as_f64().unwrap();
    let with = p(1, "ttft_p50_ms") / p(0, "ttft_p50_ms");
    assert!(
        with <= 1.3,
        "A's median TTFT {with:.2}× of alone with admission: {v}"
    );
    let tail = v["a_p99_ttft_admission_over_alone"].as_f64().unwrap();
    assert!(
        tail <= 2.0,
        "A's p99 TTFT {tail:.2}× of alone with admission: {v}"
    );
    assert!(
        p(1, "ttft_p99_ms") * 10.0 < p(2, "ttft_p99_ms"),
        "A's p99 TTFT with admission not a tenth of without: {v}"
    );
    let without = v["a_p99_ttft_no_admission_over_alone"].as_f64().unwrap();
    assert!(
        without > 3.0,
        "A's p99 TTFT only {without:.2}× without admission: {v}"
    );
}

/// Issue 66: with `up --router-replicas 2`, each replica enforces half of a tenant's rate, so
/// that the service as a whole admits what one router would, within 10 %.
#[test]
fn router_replicas_share_a_tenants_rate_and_the_service_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenant]]\nname = \"t\"\nkeys = [\"{}\"]\nrequests_per_second = 20\n",
            rbgctl::router::tenants::table::key_entry("replica-key")
        ),
    )
    .unwrap();
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[pool]\nstores = 0\nmaster_port = 0\nmetadata_port = 0\nmetrics_port = 0\n\
             [engines]\ncount = 1\nbase_port = 0\nl3 = false\nhost_cache_tokens = 0\n\
             prefill_us_per_token = 0.0\ndecode_ms_per_token = 0.0\n\
             [router]\nport = 0\nreplicas = 2\ntenants_file = {tenants:?}\n"
        ),
    )
    .unwrap();
    let argv = vec!["up".into(), "--config".into(), cfg.display().to_string()];
    let up = common::shared_launcher()
        .spawn_argv_with_env::<UpAddrs>("up", &argv, &[])
        .expect("up starts");
    let routers: Vec<u16> = up.addrs.routers.iter().map(|r| port_of(r)).collect();
    assert_eq!(routers.len(), 2);
    let client = reqwest::blocking::Client::new();
    // Requests in turn to each replica, as fast as they answer, for 4 s.
    let started = std::time::Instant::now();
    let (mut admitted, mut refused) = (0u32, 0u32);
    let mut i = 0usize;
    while started.elapsed() < Duration::from_secs(4) {
        let status = client
            .post(format!("http://127.0.0.1:{}/generate", routers[i % 2]))
            .bearer_auth("replica-key")
            .body(r#"{"text":"hi","sampling_params":{"max_new_tokens":1}}"#)
            .send()
            .unwrap()
            .status()
            .as_u16();
        match status {
            200 => admitted += 1,
            429 => refused += 1,
            other => panic!("status {other}"),
        }
        i += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    // One router's bucket: a burst of 20, then 20 a second.
    let one_router = 20.0 + 20.0 * elapsed;
    let ratio = f64::from(admitted) / one_router;
    assert!(
        refused > 0,
        "the load went past the rate: {admitted} admitted"
    );
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{admitted} admitted in {elapsed:.2} s by two replicas: {ratio:.3} of one router's {one_router:.0}"
    );
}
