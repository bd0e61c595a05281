//! Who holds a segment, and what happens to writes when the holder is gone: a name held by a
//! running store is not taken over; bytes copied into a dead store's memory are never
//! acknowledged; a dead non-persistent store's files are cleaned up; a store that cannot reach
//! its master keeps saying so.

use crate::common;

use common::*;
use rbgctl::client::{Client, ClientConfig, ReplicateConfig};
use rbgctl::config::Millis;
use serde_json::Value;
use std::time::Duration;

fn health(port: u16) -> (u16, Value) {
    let (code, body) = http(port, "GET", "/health", b"");
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        replica_num: 1,
        preferred_segment: segment.into(),
        ..Default::default()
    }
}

#[test]
fn a_second_store_under_a_taken_name_is_refused_and_the_first_keeps_its_objects() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let client = c.client();
    client.put("kept", b"value", &on("store-0")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let (exited_ok, stderr) = c.run_store_expecting_exit(0, |s| {
        s.shm_dir = elsewhere.path().to_path_buf();
        s.name_conflict_wait_ms = Millis(Duration::from_millis(500));
        (s.port, s.metrics_port) = (0, 0);
    });
    assert!(!exited_ok, "the second store must exit non-zero");
    assert!(
        stderr.contains("\"store-0\" is held by a running store at 127.0.0.1:"),
        "{stderr}"
    );
    assert_eq!(client.get("kept").unwrap(), b"value");
    let (code, h) = health(c.store_metrics[0]);
    assert_eq!((code, &h["mounted"]), (200, &Value::Bool(true)), "{h}");
    // Still mounted as far as the master knows too: a put on it works.
    client.put("after", b"v", &on("store-0")).unwrap();
}

#[test]
fn a_put_through_shared_memory_into_a_dead_store_is_never_acknowledged() {
    let mut c = Cluster::start(Opts {
        stores: 0,
        ..Default::default()
    });
    c.add_store_with(16 << 20, |s| s.persistent = false);
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 1));
    let mut cfg = ClientConfig::new(c.rpc.clone());
    cfg.same_host_shm = true;
    let client = Client::connect(cfg).unwrap();
    client.put("before", b"alive", &on("store-0")).unwrap();
    assert_eq!(client.get("before").unwrap(), b"alive");
    let seg_file = c.shm_dir().join("store-0.seg");
    assert!(
        seg_file.exists(),
        "the segment is file-backed (shared memory)"
    );

    c.stores[0].kill();
    // The master still lists the segment until the store's heartbeats are overdue; its file
    // is still there. Nothing written into it may be acknowledged.
    for i in 0..20 {
        let r = client.put(&format!("after/{i}"), b"lost?", &on("store-0"));
        assert!(r.is_err(), "put {i} into a dead store was acknowledged");
    }

    // A new non-persistent store in the same directory sweeps the dead one's files.
    c.add_store_with(16 << 20, |s| s.persistent = false);
    assert!(
        !seg_file.exists(),
        "the dead store's segment file is still there"
    );
    assert!(!c.shm_dir().join("store-0.lock").exists());
    assert!(c.shm_dir().join("store-1.seg").exists());
}

#[test]
fn a_non_persistent_store_leaves_no_files_and_refuses_a_twin() {
    let mut c = Cluster::start(Opts {
        stores: 0,
        ..Default::default()
    });
    c.add_store_with(8 << 20, |s| s.persistent = false);
    let dir = c.shm_dir().to_path_buf();
    assert!(dir.join("store-0.seg").exists() && dir.join("store-0.lock").exists());
    // The same name in the same directory: refused at once, files untouched.
    let (exited_ok, stderr) = c.run_store_expecting_exit(0, |s| (s.port, s.metrics_port) = (0, 0));
    assert!(!exited_ok);
    assert!(
        stderr.contains("in use by another running store"),
        "{stderr}"
    );
    assert!(dir.join("store-0.seg").exists());
    // A clean stop removes everything the store created.
    assert!(c.stores[0]
        .sigterm_exits_within(Duration::from_secs(10))
        .is_some());
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_store_without_its_master_says_so_in_health() {
    let launcher = launcher();
    let dir = tempfile::tempdir().unwrap();
    let cfg = rbgctl::store::config::StoreConfig {
        master: "127.0.0.1:1".into(),
        bind_address: "127.0.0.1".into(),
        local_hostname: "127.0.0.1".into(),
        segment_size: rbgctl::config::ByteSize(4 << 20),
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        persistent: false,
        heartbeat_interval_ms: Millis(Duration::from_millis(100)),
        shm_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let store = launcher
        .spawn::<rbgctl::launch::Store>("orphan", cfg)
        .expect("the store starts");
    let port = store.addrs.metrics.port();
    assert!(wait_until(Duration::from_secs(10), || {
        health(port).1["error"].as_str().is_some()
    }));
    let (code, h) = health(port);
    assert_eq!(code, 503, "{h}");
    assert_eq!(h["master"], "127.0.0.1:1");
    assert_eq!(h["master_reachable"], false);
    assert!(h["error"].as_str().unwrap().contains("127.0.0.1:1"), "{h}");
}

#[test]
fn a_store_whose_name_was_taken_while_it_was_frozen_stops_instead_of_believing_it_is_mounted() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let master = rbgctl::master::config::MasterConfig {
        client_ttl_ms: Millis(Duration::from_millis(600)),
        store_grace_period_ms: Millis(Duration::ZERO),
        ..Default::default()
    };
    let mut c = Cluster::start(Opts {
        stores: 0,
        master,
        ..Default::default()
    });
    c.add_store_with(8 << 20, |s| {
        s.name_conflict_wait_ms = Millis(Duration::from_millis(500));
    });
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 1));
    let pid = Pid::from_raw(c.stores[0].pid().expect("running") as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // Frozen past the client TTL: the master gives store-0 up, and another store takes the name.
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 0));
    let elsewhere = tempfile::tempdir().unwrap();
    let b = c.add_store_with(8 << 20, |s| {
        s.name = Some("store-0".into());
        s.shm_dir = elsewhere.path().to_path_buf();
    });
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 1));
    kill(pid, Signal::SIGCONT).unwrap();
    // The first store learns it is unknown, is refused its name, and stops with an error.
    let exit = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        c.stores[0].exited()
    });
    let exit = exit.expect("the first store did not stop");
    assert!(!exit.success(), "it must exit non-zero: {exit:?}");
    assert!(
        c.stores[0].log().contains("held by a running store"),
        "{}",
        c.stores[0].log()
    );
    let (code, h) = health(c.store_metrics[b]);
    assert_eq!(
        (code, &h["mounted"]),
        (200, &Value::Bool(true)),
        "the newcomer keeps the name"
    );
}

#[test]
fn a_store_counts_bytes_copied_through_shared_memory_and_shows_its_use() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let mut cfg = ClientConfig::new(c.rpc.clone());
    cfg.same_host_shm = true;
    let client = Client::connect(cfg).unwrap();
    let value = vec![7u8; 1 << 20];
    for i in 0..4 {
        client
            .put(&format!("shm/{i}"), &value, &on("store-0"))
            .unwrap();
    }
    let metric = |name: &str| c.store_metric(0, name).unwrap_or(-1.0);
    assert_eq!(
        metric("rbgctl_store_written_bytes_total"),
        0.0,
        "no TCP writes"
    );
    assert_eq!(metric("rbgctl_store_sealed_bytes_total"), (4 << 20) as f64);
    assert!(
        wait_until(Duration::from_secs(15), || metric(
            "rbgctl_store_used_bytes"
        ) >= (4 << 20) as f64),
        "used bytes: {}",
        metric("rbgctl_store_used_bytes")
    );
}

/// Issue 40, item 21: after `kill -9` of one store, puts that the master still places on its
/// segment (it is listed until the store's TTL runs out) go to the live store instead of
/// failing.
#[test]
fn puts_go_to_a_live_store_while_a_killed_one_is_still_listed() {
    let mut c = Cluster::start(Opts {
        stores: 2,
        master: rbgctl::master::config::MasterConfig {
            client_ttl_ms: Millis(Duration::from_secs(30)),
            ..Default::default()
        },
        ..Default::default()
    });
    let client = c.client();
    client
        .put("before", b"v", &ReplicateConfig::default())
        .unwrap();
    c.stores[0].kill();
    let t0 = std::time::Instant::now();
    for i in 0..20 {
        client
            .put(&format!("after/{i}"), b"kept", &ReplicateConfig::default())
            .unwrap_or_else(|e| panic!("put {i} after the kill: {e}"));
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert_eq!(c.segment_count(), 2, "the dead store is still listed");
    for i in 0..20 {
        assert_eq!(client.get(&format!("after/{i}")).unwrap(), b"kept");
        assert_eq!(c.replica_segments(&format!("after/{i}")), vec!["store-1"]);
    }
}
