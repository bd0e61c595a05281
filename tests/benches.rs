//! The benchmarks as a user runs them against a pool: they keep to their own keys, do not count
//! a cache's evictions as errors, refuse to flood someone else's cache unasked, and never
//! report figures they could not measure as if they were whole.

mod common;

use common::*;
use rbgctl::client::ReplicateConfig;
use std::process::{Command, Output, Stdio};

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
    let o = bench_store(&c.rpc, &["--allow-eviction"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("PARTIAL"), "{}", text(&o));
    assert_eq!(client.get("theirs").unwrap(), b"an engine's page");
    let (_, keys) = c.http_get("/api/v1/keys?prefix=bench-store/");
    let v: serde_json::Value = serde_json::from_str(&keys).unwrap();
    assert_eq!(
        v["keys"],
        serde_json::json!([]),
        "the benchmark left keys behind"
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
