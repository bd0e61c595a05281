//! The benchmarks as a user runs them against a pool: they keep to their own keys, do not count
//! a cache's evictions as errors, refuse to flood someone else's cache unasked, and never
//! report figures they could not measure as if they were whole.

use crate::common;

use common::*;
use rbgctl::client::ReplicateConfig;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn bench_store(master: &str, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args([
            "bench",
            "store",
            "--master",
            master,
            "--sizes",
            "4KiB",
            "--threads",
            "1",
        ])
        .args([
            "--phase-time",
            "300ms",
            "--phase-bytes",
            "2MiB",
            "--batch",
            "4",
        ])
        .args(["--batch-value", "16KiB", "--exists-batch", "8", "--no-shm"])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn bench_store_keeps_to_its_own_keys_and_asks_before_writing_into_a_used_pool() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let client = c.client();
    client
        .put("theirs", b"an engine's page", &ReplicateConfig::default())
        .unwrap();
    let o = bench_store(&c.rpc, &[]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("--allow-eviction"), "{}", text(&o));
    let o = bench_store(&c.rpc, &["--allow-eviction", "--held", "300,1500"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("PARTIAL"), "{}", text(&o));
    // Put/get measured with the pool holding each count, and the p99 change between them.
    for line in ["get, 1500 held", "put p99", "with 300 objects held"] {
        assert!(text(&o).contains(line), "{line}: {}", text(&o));
    }
    assert_eq!(client.get("theirs").unwrap(), b"an engine's page");
    let (_, keys) = c.http_get("/api/v1/keys?prefix=bench-store/");
    let v: serde_json::Value = serde_json::from_str(&keys).unwrap();
    assert_eq!(
        v["keys"],
        serde_json::json!([]),
        "the benchmark left keys behind"
    );
}

/// Issue 41: `bench store` measures fresh segment memory beside reused: 1 MiB and 4 MiB rows
/// into new stores that leave their pages to the writes, over TCP and same-host, judged against
/// the same limits; the report says which rows are which. Rows of several threads have a limit
/// of as many loopback streams, measured in the same run.
#[test]
fn bench_store_measures_fresh_segment_memory_beside_reused() {
    let o = Command::new(BIN)
        .args(["bench", "store", "--sizes", "4KiB", "--threads", "1,2"])
        .args(["--phase-time", "200ms", "--phase-bytes", "16MiB"])
        .args([
            "--segment-size",
            "64MiB",
            "--batch",
            "4",
            "--batch-value",
            "16KiB",
        ])
        .args(["--exists-batch", "8", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        report["segments"]
            .as_str()
            .unwrap()
            .contains("prefault = false"),
        "{report}"
    );
    let streams = &report["loopback_streams"][0];
    assert_eq!(
        streams["streams"], 2,
        "two-thread rows judged against two streams: {report}"
    );
    assert!(
        streams["gb_per_s"]["best"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let rows = report["results"].as_array().unwrap();
    for case in ["tcp-fresh", "shm-fresh"] {
        for size in [1u64 << 20, 4 << 20] {
            for op in ["put", "get"] {
                let row = rows
                    .iter()
                    .find(|r| r["case"] == case && r["op"] == op && r["value_bytes"] == size)
                    .unwrap_or_else(|| panic!("no {case} {op} {size} row: {report}"));
                assert!(row["ops_per_s"].as_f64().unwrap() > 0.0, "{row}");
                assert_eq!(row["errors"], 0, "{row}");
                assert!(row["of_limit"].as_f64().unwrap() > 0.0, "{row}");
            }
        }
    }
    assert_eq!(report["partial"], false, "{report}");
}

/// The `redis-server` to measure beside the pool: `$RBGCTL_REDIS_SERVER` (CI installs Debian's),
/// else one on the PATH.
fn redis_server() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("RBGCTL_REDIS_SERVER") {
        return Some(p.into());
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join("redis-server"))
        .find(|p| p.is_file())
}

/// Issue 41: `bench store --redis-server` runs redis-server's SET and GET of the same small
/// values in the same run, one connection with one request in flight, and sets the pool's
/// one-thread rows beside them; the server is gone afterwards.
#[test]
fn bench_store_measures_redis_beside_the_pool() {
    let Some(redis) = redis_server() else {
        return skip("no redis-server (apt-get install redis-server)");
    };
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let o = bench_store(
        &c.rpc,
        &["--json", "--redis-server", redis.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for op in ["put", "get"] {
        let row = report["redis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["op"] == op && r["value_bytes"] == 4096)
            .unwrap_or_else(|| panic!("no redis {op} row: {report}"));
        assert!(row["ops"].as_u64().unwrap() > 0, "{row}");
        let versus = report["versus_redis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["op"] == op)
            .unwrap_or_else(|| panic!("no {op} beside redis: {report}"));
        assert!(versus["ratio"].as_f64().unwrap() > 0.0, "{versus}");
    }
    assert_eq!(report["partial"], false, "{report}");
    let dirs = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rbgctl-redis-"))
        .count();
    assert_eq!(dirs, 0, "redis-server's directory was left behind");
}

#[test]
fn bench_store_breakdown_shows_where_each_operation_went() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let o = bench_store(&c.rpc, &["--breakdown", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = |op: &str| -> serde_json::Value {
        report["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["op"] == op)
            .unwrap_or_else(|| panic!("no {op} row: {report}"))["breakdown"]
            .clone()
    };
    let (put, get, batch_put) = (row("put"), row("get"), row("batch_put 4x"));
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    // Today's protocol: a put writes into the space its previous put's commit reserved, so it
    // is one master round trip (the commit) and one transfer; a get of a key this client put
    // reads the location it remembers: no master round trip, one transfer; a batch shares its
    // calls. Values are checksummed in passing, by the transfers. (The first put of a size
    // and learning a store's segments cost one round trip more.)
    let about = |v: &serde_json::Value, k: &str, want: f64| {
        assert!((f(v, k) - want).abs() < 0.05, "{k}: want {want}: {v}");
    };
    about(&put, "master_rpcs", 1.0);
    about(&put, "transfers", 1.0);
    about(&put, "checksums", 0.0);
    about(&get, "checksums", 0.0);
    about(&get, "master_rpcs", 0.0);
    about(&get, "transfers", 1.0);
    about(&batch_put, "master_rpcs", 0.25);
    for b in [&put, &get, &batch_put] {
        let parts = [
            "master_us",
            "transfer_us",
            "copy_us",
            "checksum_us",
            "other_us",
        ]
        .iter()
        .map(|k| f(b, k))
        .sum::<f64>();
        assert!(f(b, "transfer_us") > 0.0, "{b}");
        assert_eq!(f(b, "master_us") > 0.0, f(b, "master_rpcs") > 0.0, "{b}");
        assert!(
            (parts - f(b, "total_us")).abs() < 0.01 * f(b, "total_us") + 0.5,
            "{b}"
        );
        assert!(f(b, "syscalls") > 0.0, "{b}");
    }
    // The first run removed its objects and left; the master frees their space once their
    // store has taken the forgets (and the client's reservations once it has left): the
    // second run starts on an empty pool, as it checks.
    let client = c.client();
    assert!(
        wait_until(Duration::from_secs(30), || client
            .segments()
            .is_ok_and(|s| s.iter().all(|s| s.used == 0))),
        "the first run's objects were not all freed"
    );
    drop(client);
    let o = bench_store(&c.rpc, &["--breakdown"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("where an item's time went"),
        "{}",
        text(&o)
    );
}

#[test]
fn bench_store_that_could_not_measure_says_so_and_fails() {
    let mut c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    // The store dies; the master lists its segment until the store's heartbeats are overdue.
    c.stores[0].kill();
    let o = bench_store(&c.rpc, &[]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("PARTIAL RESULTS"), "{out}");
    assert!(out.contains("failed (first:"), "{out}");
}

/// A FAKE worker (`bench fake-worker`) on a free port.
fn fake_worker(
    launcher: &rbgctl::launch::Launcher,
) -> rbgctl::launch::Spawned<rbgctl::testkit::fake_worker::Addrs> {
    rbgctl::testkit::fake_worker::spawn(launcher, "127.0.0.1", 0, "w", &[])
        .expect("the FAKE worker starts")
}

fn multiturn(port: u16, extra: &[&str]) -> Output {
    multiturn_command(&port.to_string(), 4, 2, "inf")
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs")
}

/// A SIMULATED engine whose L3 KV cache is the pool at `master`.
fn sim_engine(
    launcher: &rbgctl::launch::Launcher,
    master: &str,
) -> rbgctl::launch::Child<rbgctl::launch::Engine> {
    launcher
        .spawn::<rbgctl::launch::Engine>(
            "engine",
            rbgctl::engine::EngineConfig {
                port: 0,
                prefill_us_per_token: 1.0,
                decode_ms_per_token: 0.1,
                l3_master: Some(master.to_string()),
                ..Default::default()
            },
        )
        .expect("the SIMULATED engine starts")
}

#[test]
fn multiturn_runs_start_cold_unless_asked_and_say_when_round_0_was_warm() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let engine = sim_engine(&c.launcher, &c.rpc);
    let port = engine.addrs.http.port();
    // The same prompts twice: the engine's own cache is flushed before each run, but the pool
    // (its L3) kept the first run's pages, so the second run's round 0 is served from it.
    let first = multiturn(port, &["--salt", "none"]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(!text(&first).contains("already warm"), "{}", text(&first));
    // The first run's pages reach the pool in the background: wait until they have.
    let backups_done = || {
        let (_, m) = http(port, "GET", "/metrics", b"");
        m.lines().any(|l| l == "rbgctl_sim_l3_backups_in_flight 0")
    };
    assert!(
        wait_until(std::time::Duration::from_secs(20), backups_done),
        "the first run's L3 backups never finished"
    );
    let second = multiturn(port, &["--salt", "none"]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        text(&second).contains("round 0 was already warm"),
        "{}",
        text(&second)
    );
    // By default each run salts its prompts: round 0 is cold again.
    let third = multiturn(port, &[]);
    assert!(third.status.success(), "{}", text(&third));
    assert!(!text(&third).contains("already warm"), "{}", text(&third));
}

#[test]
fn multiturn_fails_fast_without_a_server_and_never_builds_on_a_failed_turn() {
    let nothing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = nothing.local_addr().unwrap().port();
    drop(nothing);
    let t0 = std::time::Instant::now();
    let o = multiturn(port, &[]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains(&format!("nothing answers at http://127.0.0.1:{port}")),
        "{}",
        text(&o)
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    // A server whose first two answers fail: those conversations stop, the run says so.
    let launcher = launcher();
    let worker = fake_worker(&launcher);
    let port = worker.addrs.http.port();
    let (code, _) = http(port, "POST", "/fake/fail?count=2&status=500", b"");
    assert_eq!(code, 200);
    let o = multiturn(port, &[]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("2 request(s) failed"), "{out}");
    assert!(
        out.contains("2 later turn(s) of their conversations were not sent"),
        "{out}"
    );
}

#[test]
fn bench_hicache_checks_its_python_before_measuring_anything() {
    let t0 = std::time::Instant::now();
    let o = Command::new(BIN)
        .args(["bench", "hicache", "--python", "/nonexistent/bin/python"])
        .env_remove("RBGCTL_PYTHON")
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    let out = text(&o);
    assert!(!o.status.success());
    assert!(
        out.contains("the Python side cannot run with /nonexistent/bin/python"),
        "{out}"
    );
    assert!(out.contains("--no-python"), "{out}");
    assert!(
        !out.contains("measuring the machine"),
        "it measured before checking: {out}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_long_benchmark_shows_progress_lines_when_not_on_a_terminal() {
    let launcher = launcher();
    let worker = fake_worker(&launcher);
    // 14 requests at 2 per second: about 7 s, past the 5 s between progress lines.
    let o = Command::new(BIN)
        .args(["bench", "multiturn", "--host", "127.0.0.1"])
        .args(["--port", &worker.addrs.http.port().to_string()])
        .args([
            "--num-clients",
            "7",
            "--num-rounds",
            "2",
            "--request-length",
            "64",
        ])
        .args([
            "--output-length",
            "2",
            "--disable-auto-run",
            "--request-rate",
            "2",
        ])
        .args(["--log-file", ""])
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}", text(&o));
    let line = err
        .lines()
        .find(|l| l.starts_with("multiturn requests: "))
        .unwrap_or_else(|| panic!("no progress line: {err}"));
    assert!(line.contains("/14 (") && line.contains("s left"), "{line}");
}

#[test]
fn bench_operator_reports_the_seed_steady_state_and_reconcile_rate_figures() {
    let out = Command::new(BIN)
        .args([
            "bench",
            "operator",
            "--json",
            "--replicas",
            "5",
            "--groups",
            "10",
        ])
        .args(["--steady-secs", "2", "--storm-secs", "1"])
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON document");
    let seed = &v["seed_002"];
    assert!(seed["seconds_to_first_pod"].as_f64().unwrap() > 0.0);
    assert!(
        seed["seconds_to_first_pod"].as_f64() <= seed["seconds_to_ready"].as_f64(),
        "{seed}"
    );
    assert!(
        seed["steady_state_reconciles"].as_f64().unwrap() >= 1.0,
        "{seed}"
    );
    assert_eq!(seed["steady_state_writes"], 0, "{seed}");
    assert_eq!(v["large_group"]["pods"], 15);
    let many = &v["many_groups"];
    assert_eq!(many["groups"], 10);
    assert!(many["reconciles_per_second_sustained"].as_f64().unwrap() > 0.0);
    assert_eq!(many["operator_writes_while_touched"], 0, "{many}");
    assert!(text(&out).contains("SIMULATED kubelet"));
}

/// The Mooncake wheel's Python, which CI installs (`.ci/run`); elsewhere the test is skipped
/// unless `RBGCTL_MOONCAKE_PYTHON` names one.
fn mooncake_python() -> Option<String> {
    let python = std::env::var("RBGCTL_MOONCAKE_PYTHON").ok();
    if python.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs the Mooncake wheel and sets RBGCTL_MOONCAKE_PYTHON"
        );
        eprintln!("skipped: RBGCTL_MOONCAKE_PYTHON is not set (a Python with the Mooncake wheel)");
    }
    python
}

#[test]
fn bench_store_measures_the_mooncake_store_side_by_side() {
    let Some(python) = mooncake_python() else {
        return;
    };
    let o = Command::new(BIN)
        .args(["bench", "store", "--sizes", "4KiB,1MiB", "--threads", "1"])
        .args([
            "--phase-time",
            "300ms",
            "--phase-ops",
            "300",
            "--batch",
            "4",
        ])
        .args(["--batch-value", "64KiB", "--exists-batch", "8", "--no-shm"])
        // Well under both segments: a fast machine must not write enough 1 MiB values for
        // either store to evict (an evicted object is a get error in the peer's rows).
        .args(["--phase-bytes", "128MiB"])
        .args([
            "--segment-size",
            "256MiB",
            "--mooncake-python",
            &python,
            "--mooncake-rounds",
            "2",
            "--json",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The wheel's client on Mooncake's own master and store, and on rbgctl's, in two rounds
    // each (every row the median round's).
    assert_eq!(report["mooncake_rounds"], 2, "{report}");
    // The wheel's client on Mooncake's own master and store, and on rbgctl's.
    for side in ["mooncake", "mooncake_client_on_rbgctl"] {
        let rows = report[side].as_array().expect("the wheel's rows");
        assert_eq!(
            rows.len(),
            7,
            "{side}: put and get of each size, both batches, batch exists: {report}"
        );
        for row in rows {
            assert_eq!(row["errors"], 0, "{side}: {row}");
            assert!(row["ops"].as_u64().unwrap() > 0, "{side}: {row}");
            // The client's own CPU per call: a wheel call costs its process something.
            assert!(
                row["client_cpu_us"].as_f64().is_some_and(|us| us > 0.0),
                "{side}: {row}"
            );
        }
    }
    let client = report["versus_mooncake_client"]
        .as_array()
        .expect("the wheel on both pools");
    assert_eq!(client.len(), 7, "{report}");
    for v in client {
        for figure in [
            "rbgctl_client_cpu_us",
            "peer_client_cpu_us",
            "rbgctl_p50_us",
        ] {
            assert!(v[figure].as_f64().is_some_and(|f| f > 0.0), "{figure}: {v}");
        }
    }
    assert!(client
        .iter()
        .any(|v| v["op"] == "batch_exists 128x" && v["ratio"].as_f64().unwrap() > 0.0));
    for side in ["rbgctl", "mooncake"] {
        for (figure, of) in [
            ("master_us_per_rpc", "master"),
            ("store_us_per_call", "store"),
        ] {
            let us = report["server_cpu"][figure][side].as_f64();
            assert!(us.is_some_and(|us| us > 0.0), "{side}'s {of}: {report}");
        }
    }
    let versus = report["versus_mooncake"]
        .as_array()
        .expect("the comparison");
    let ops: Vec<(&str, u64)> = versus
        .iter()
        .map(|v| {
            (
                v["op"].as_str().unwrap(),
                v["value_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            ("put", 4096),
            ("get", 4096),
            ("put", 1 << 20),
            ("get", 1 << 20),
            ("batch_put 4x", 65_536),
            ("batch_get 4x", 65_536)
        ]
    );
    for v in versus {
        assert!(v["ratio"].as_f64().unwrap() > 0.0, "{v}");
    }
}

/// `--phases` and `--ops-per-phase` make a count that does not drift (callgrind's figure,
/// `scripts/callgrind-master.sh`): only the phases named, each of exactly that many calls.
#[test]
fn bench_master_runs_only_the_phases_named_for_a_fixed_count_beside_idle_clients() {
    let o = Command::new(BIN)
        .args(["bench", "master", "--objects", "1000", "--clients", "2"])
        .args(["--phases", "exists,describe", "--ops-per-phase", "400"])
        .args(["--phase-time", "30s", "--rest", "0s", "--json"])
        .args(["--idle-clients", "300"])
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["errors"], 0, "{r}");
    // The idle clients stayed connected, bound by one ping each before the phases and quiet
    // until the one each at the end, which was answered; their connections cost the master
    // memory, not threads.
    let idle = &r["idle"];
    assert_eq!(idle["connections"], 300, "{r}");
    assert_eq!(idle["pings"], 600, "{r}");
    assert_eq!(idle["ping_errors"], 0, "{r}");
    assert!(
        r["master_rss_per_idle_client_bytes"].as_f64().is_some(),
        "{r}"
    );
    let results = r["results"].as_array().unwrap();
    let ops: Vec<(&str, u64)> = results
        .iter()
        .map(|x| (x["op"].as_str().unwrap(), x["ops"].as_u64().unwrap()))
        .collect();
    assert_eq!(ops, [("exists", 400), ("describe", 400)], "{r}");
}

#[test]
fn bench_master_loads_measures_and_times_a_rebuild_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("master.html");
    let o = Command::new(BIN)
        .args(["bench", "master", "--objects", "5000", "--clients", "3"])
        .args([
            "--phase-time",
            "300ms",
            "--rest",
            "500ms",
            "--json",
            "--report",
        ])
        .arg(&report)
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["objects"], 5000);
    assert_eq!(r["errors"], 0, "{r}");
    let ops: Vec<&str> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops,
        [
            "exists",
            "ping",
            "batch_exists 128x",
            "describe",
            "describe, 1 client",
            "describe, 1 client, puts streaming",
            "put start+end",
            "remove"
        ]
    );
    for x in r["results"].as_array().unwrap() {
        assert!(x["ops"].as_u64().unwrap() > 0, "{x}");
    }
    assert!(r["streamed_puts"].as_u64().unwrap() > 0, "{r}");
    assert!(r["master_bytes_per_object"].as_f64().is_some(), "{r}");
    assert!(r["master_cpu_at_rest"].as_f64().unwrap() < 0.5, "{r}");
    assert!(r["rebuild_seconds"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["store_leave_seconds"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["store_dropped_seconds"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        r["loopback_round_trips_per_s"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    common::pictures::check_report(
        &report,
        "bench-master",
        &[
            (
                "master-ops-per-s",
                &[
                    "master ops/s",
                    "machine's round trips/s (ceiling)",
                    "exists ×3",
                ],
            ),
            ("master-latency", &["p50", "p99", "remove ×3"]),
        ],
    );
}

#[test]
fn bench_failover_kills_and_pauses_the_leader_and_loses_nothing() {
    if rbgctl::ha::etcd_server::etcd_program().is_none() {
        common::skip("no etcd program (apt-get install etcd-server)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("failover.html");
    let o = Command::new(BIN)
        .args([
            "bench",
            "failover",
            "--objects",
            "300",
            "--value-size",
            "4KiB",
        ])
        .args([
            "--segment-size",
            "64MiB",
            "--pause",
            "3s",
            "--idle-clients",
            "200",
            "--json",
            "--report",
        ])
        .arg(&report)
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["objects_lost"], 0, "{r}");
    assert!(r["objects_committed"].as_u64().unwrap() > 300, "{r}");
    for fault in [&r["kill"], &r["pause"]] {
        assert!(fault["first_put_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(fault["all_readable_s"].as_f64().is_some(), "{r}");
        assert!(
            fault["epoch_after"].as_u64().unwrap() > fault["epoch_before"].as_u64().unwrap(),
            "{r}"
        );
    }
    // The idle clients, bound to the killed leader, all came back to the new one on their own
    // (their heartbeat saw the connection closed and the leader moved).
    let idle = &r["idle_return"];
    assert_eq!(idle["clients"], 200, "{r}");
    assert_eq!(idle["back"], 200, "{r}");
    assert_eq!(idle["back_within_5s_of_leader"], 200, "{r}");
    assert!(idle["reconnects"].as_u64().unwrap() >= 200, "{r}");
    assert_eq!(r["pause"]["stale_writes_accepted"], 0, "{r}");
    assert_eq!(r["pause"]["stale_writes_refused"], 16, "{r}");
    assert!(
        r["pause"]["stepped_down_after_continue_s"]
            .as_f64()
            .is_some(),
        "{r}"
    );
    common::pictures::check_report(
        &report,
        "bench-failover",
        &[
            (
                "failover-rates",
                &[
                    "puts acknowledged/s",
                    "operations failed/s",
                    "kill -9 of master-0",
                    "SIGSTOP of master-1",
                ],
            ),
            ("failover-epochs", &["epoch"]),
        ],
    );
}

#[test]
fn bench_store_disk_tier_measures_demotion_and_disk_reads_beside_the_filesystem() {
    let dir = tempfile::Builder::new()
        .prefix("bench-disk")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("disk-tier.html");
    let o = Command::new(BIN)
        .args(["bench", "store", "--disk-tier"])
        .arg(dir.path())
        .args(["--disk-tier-memory", "16MiB", "--disk-tier-size", "64MiB"])
        .args(["--disk-tier-values", "256KiB", "--threads", "1,2", "--json"])
        .arg("--report")
        .arg(&report)
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        r["filesystem"][0]["read_gb_per_s"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    let stream = &r["put_streams"][0];
    assert!(stream["no_tier_gb_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(stream["demotion_gb_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(stream["dropped_with_tier"], 0, "{r}");
    let gets = r["disk_gets"].as_array().unwrap();
    assert_eq!(
        gets.len(),
        4,
        "1 and 2 threads, over TCP and on the same host"
    );
    for g in gets {
        assert!(g["ops"].as_u64().unwrap() > 0, "{r}");
        if g["path"] == "tcp" {
            let from_disk = g["from_disk"].as_f64().unwrap();
            assert!(from_disk > 0.99, "every read came from disk: {r}");
        }
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the benchmark's files are gone"
    );
    common::pictures::check_report(
        &report,
        "bench-store-disk-tier",
        &[
            (
                "put-streams",
                &[
                    "no tier (eviction drops)",
                    "disk tier (eviction demotes)",
                    "256 KiB",
                ],
            ),
            (
                "disk-gets",
                &[
                    "tcp get, 1 thread",
                    "same-host get, 2 threads",
                    "filesystem sequential read (this machine)",
                ],
            ),
        ],
    );
}

#[test]
fn bench_abuse_shows_every_attack_bounded_in_memory_and_time() {
    let out = Command::new(BIN)
        .args(["bench", "abuse", "--connections", "1200", "--slow", "100"])
        .args(["--huge", "200", "--deadline", "40s", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs");
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let attacks = report["attacks"].as_array().expect("attacks");
    let names: Vec<&str> = attacks.iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(
        names,
        ["idle flood", "slowloris", "huge frames", "huge bodies"]
    );
    for a in attacks {
        let name = a["name"].as_str().unwrap_or_default();
        assert_eq!(a["opened"], a["attempted"], "{name}: {a}");
        // The servers closed every connection, within their 10 s timeouts plus the opening.
        let closed = a["all_closed_after_s"].as_f64();
        assert!(closed.is_some_and(|s| s < 35.0), "{name}: {a}");
        // A normal client on connections opened before kept working.
        assert_eq!(a["client"]["failed"], 0, "{name}: {a}");
        assert_eq!(a["health"]["failed"], 0, "{name}: {a}");
        // At most 1200 connections per role: well under 128 KiB each (a 2 MiB huge page per
        // connection thread would be ten times that), and nothing near the 16 MiB announced.
        for role in ["master", "store"] {
            let u = &a[role];
            let grew = u["rss_peak_mib"].as_f64().unwrap() - u["rss_before_mib"].as_f64().unwrap();
            assert!(grew < 150.0, "{name}: the {role} grew {grew} MiB: {a}");
            assert!(
                u["fds_after"].as_u64().unwrap() <= u["fds_before"].as_u64().unwrap() + 4,
                "{name}: the {role} kept files open: {a}"
            );
        }
    }
    let frames = &attacks[2];
    assert!(
        frames["closed_within_1s"].as_u64().unwrap() >= 200,
        "the announced 2^64-1 byte payloads are refused at once: {frames}"
    );
    let bodies = &attacks[3];
    assert_eq!(bodies["answers"]["413"], 200, "{bodies}");
}

/// Issue 40, item 26: `bench multiturn` writes its JSONL log only when asked for one.
#[test]
fn bench_multiturn_writes_a_log_file_only_when_asked() {
    let launcher = common::launcher();
    let w = fake_worker(&launcher);
    let port = w.addrs.http.port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        Command::new(BIN)
            .args(["bench", "multiturn", "--host", "127.0.0.1", "--port", &port])
            .args([
                "--num-clients",
                "2",
                "--num-rounds",
                "1",
                "--request-length",
                "32",
            ])
            .args([
                "--output-length",
                "2",
                "--disable-auto-run",
                "--request-rate",
                "inf",
            ])
            .args(extra)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("rbgctl runs")
    };
    let o = run(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let written: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(written.is_empty(), "{written:?}");
    let o = run(&["--log-file", "mine.jsonl"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = std::fs::read_to_string(dir.path().join("mine.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 1, "{log}");
}
