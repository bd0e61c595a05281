//! Whole-process behaviour: the same-host path, a master restart, `rbgctl up`, clean shutdown.

mod common;

use common::*;
use rbgctl::client::{Client, ClientConfig, ReplicateConfig};
use rbgctl::up::UpAddrs;
use std::process::Command;
use std::time::Duration;

#[test]
fn same_host_client_reads_and_writes_through_shared_memory() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let shm = Client::connect(ClientConfig::new(c.rpc.clone())).unwrap();
    let tcp = c.client();
    let v: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
    shm.put("shm/a", &v, &ReplicateConfig::default()).unwrap();
    assert_eq!(
        tcp.get("shm/a").unwrap(),
        v,
        "written by memory copy, read over TCP"
    );
    tcp.put("shm/b", &v[..1000], &ReplicateConfig::default())
        .unwrap();
    assert_eq!(
        shm.get("shm/b").unwrap(),
        &v[..1000],
        "written over TCP, read by memory copy"
    );
    // Over its data port the store saw only the TCP client's bytes: the shared-memory client's
    // put and get were memory copies.
    let (code, metrics) = http(c.store_metrics[0], "GET", "/metrics", b"");
    assert_eq!(code, 200, "store metrics port {}", c.store_metrics[0]);
    assert!(
        metrics.contains("rbgctl_store_written_bytes_total 1000\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("rbgctl_store_read_bytes_total {}\n", 3 << 20)),
        "{metrics}"
    );
    let segs = shm.segments().unwrap();
    assert!(
        !segs[0].info.shm_path.is_empty(),
        "the store advertises its backing file"
    );
}

#[test]
fn stores_remount_after_a_master_restart() {
    let mut c = Cluster::start(Opts {
        stores: 2,
        ..Default::default()
    });
    c.restart_master();
    assert!(
        wait_until(Duration::from_secs(10), || c.segment_count() == 2),
        "stores did not come back"
    );
    let client = c.client();
    client
        .put("after-restart", b"ok", &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.get("after-restart").unwrap(), b"ok");
}

#[test]
fn sigterm_unmounts_a_store_at_once() {
    let mut c = Cluster::start(Opts {
        stores: 2,
        ..Default::default()
    });
    c.stores[1].stop();
    assert!(
        wait_until(Duration::from_secs(3), || c.segment_count() == 1),
        "a store stopped with SIGTERM should unmount before the TTL"
    );
}

#[test]
fn up_starts_a_master_and_stores_that_serve_the_kv_command() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = common::launcher();
    let argv: Vec<String> = [
        "up",
        "--stores",
        "2",
        "--segment-size",
        "16MiB",
        "--master-port",
        "0",
        "--metadata-port",
        "0",
        "--metrics-port",
        "0",
        "--engines",
        "0",
        "--shm-dir",
    ]
    .map(String::from)
    .into_iter()
    .chain([dir.path().display().to_string()])
    .collect();
    let mut up = launcher.spawn_argv::<UpAddrs>("up", &argv).unwrap();
    let master = up.addrs.master.clone().expect("up reports its master");
    let metrics: u16 = up
        .addrs
        .master_metrics
        .as_deref()
        .and_then(|m| m.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("up reports its master's metrics address");
    let (code, body) = http(metrics, "GET", "/api/v1/segments", b"");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body.matches("\"name\"").count(), 2, "{body}");
    let put = Command::new(BIN)
        .args([
            "kv",
            "--master",
            &master,
            "put",
            "hello",
            "world",
            "--replicas",
            "2",
        ])
        .output()
        .unwrap();
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = Command::new(BIN)
        .args(["kv", "--master", &master, "get", "hello"])
        .output()
        .unwrap();
    assert_eq!(get.stdout, b"world");
    let missing = Command::new(BIN)
        .args(["kv", "--master", &master, "exists", "nope"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let status = up.process.sigterm_exits_within(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "up should exit cleanly on SIGTERM: {status:?}"
    );
    // `up` stops its children before it exits.
    assert!(
        std::net::TcpStream::connect(&master).is_err(),
        "the master is still up after `up` stopped"
    );
}
