//! Whole-process behaviour: the same-host path, a master restart, `rbgctl up`, clean shutdown.

use crate::common;

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
    let shm = dir.path().display().to_string();
    let mut up = pool_up(&launcher, &["--shm-dir", &shm]);
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

/// `up` with the pool only (two stores of 16 MiB) on kernel-chosen ports, in its own
/// shared-memory directory unless `extra` names one.
fn pool_up(
    launcher: &rbgctl::launch::Launcher,
    extra: &[&str],
) -> rbgctl::launch::Spawned<UpAddrs> {
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
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(String::from)
    .collect();
    launcher.spawn_argv::<UpAddrs>("up", &argv).unwrap()
}

/// The shared-memory directories `up` (process `pid`) made.
fn up_shm_dirs(pid: u32) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("rbgctl-up-{pid}-")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The pid of `up`'s child whose command line holds `stem` (its config file's stem).
fn child_pid(up: u32, stem: &str) -> Option<u32> {
    children_of(up)
        .into_iter()
        .find(|(_, cmd)| cmd.contains(stem))
        .map(|(pid, _)| pid)
}

/// Issue 40, item 2: `kill -9` of a store under `up` restarts that store on its files (its
/// objects come back), the other store serves throughout, and `up` goes on; its files are not
/// removed. A clean stop then takes every child and the directory along (item 11).
#[test]
fn up_restarts_a_killed_store_with_its_objects_and_keeps_the_rest_serving() {
    let launcher = common::launcher();
    let mut up = pool_up(&launcher, &[]);
    let up_pid = up.process.pid().unwrap();
    let master = up.addrs.master.clone().unwrap();
    let mut cfg = ClientConfig::new(master.clone());
    cfg.same_host_shm = false;
    let client = Client::connect(cfg).unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for k in &keys {
        client
            .put(k, k.as_bytes(), &ReplicateConfig::default())
            .unwrap();
    }
    let store0 = child_pid(up_pid, "store-0-").expect("store-0 runs under up");
    let store1 = child_pid(up_pid, "store-1-").expect("store-1 runs under up");
    let shm = up_shm_dirs(up_pid);
    assert_eq!(shm.len(), 1, "{shm:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(store0 as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Started again under the same name, with a new pid, and every object readable again.
    assert!(
        wait_until(Duration::from_secs(30), || child_pid(up_pid, "store-0-")
            .is_some_and(|p| p != store0)),
        "store-0 was not started again:\n{}",
        up.process.log()
    );
    assert!(
        wait_until(Duration::from_secs(30), || keys
            .iter()
            .all(|k| client.get(k).is_ok_and(|v| v == k.as_bytes()))),
        "objects lost with the store's restart:\n{}",
        up.process.log()
    );
    assert!(up.process.exited().is_none(), "up went on");
    assert_eq!(
        child_pid(up_pid, "store-1-"),
        Some(store1),
        "store-1 untouched"
    );
    assert!(shm[0].exists(), "the files stayed");
    let log = up.process.log();
    assert!(log.contains("starting it again"), "{log}");
    // Issue 40, item 14: the hints name this program as the shell can run it (it is not on
    // the PATH here).
    assert!(log.contains("/rbgctl kv --master"), "{log}");
    assert!(!log.contains("  rbgctl kv --master"), "{log}");
    // A clean stop: every child gone, the directory removed.
    let children: Vec<u32> = children_of(up_pid).into_iter().map(|(p, _)| p).collect();
    let status = up.process.sigterm_exits_within(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(children.iter().all(|&p| gone(p)), "children left behind");
    assert!(
        up_shm_dirs(up_pid).is_empty(),
        "the shared memory left behind"
    );
}

/// Issue 40, item 10: `kill -9` of `up` takes its children along (they stop gracefully).
#[test]
fn the_children_of_up_die_with_it() {
    let launcher = common::launcher();
    let mut up = pool_up(&launcher, &[]);
    let up_pid = up.process.pid().unwrap();
    let children: Vec<u32> = children_of(up_pid).into_iter().map(|(p, _)| p).collect();
    assert_eq!(children.len(), 3, "a master and two stores");
    let master = up.addrs.master.clone().unwrap();
    up.process.kill();
    assert!(
        wait_until(Duration::from_secs(20), || children
            .iter()
            .all(|&p| gone(p))),
        "orphans: {:?}",
        children.iter().filter(|&&p| !gone(p)).collect::<Vec<_>>()
    );
    assert!(
        std::net::TcpStream::connect(&master).is_err(),
        "the port is free"
    );
    // Killed, up could not clean up: its stores' files stay for a restart, and its run
    // directory (its children's configs); remove them here.
    for d in up_shm_dirs(up_pid) {
        std::fs::remove_dir_all(d).unwrap();
    }
    let run_dirs = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&format!("rbgctl-run-{up_pid}-")))
        });
    for d in run_dirs {
        std::fs::remove_dir_all(d.path()).unwrap();
    }
}

/// Issue 40, item 12: Ctrl-C at a terminal reaches `up` only (the children run in process
/// groups of their own), and `up` stops each child once, gracefully.
#[test]
fn ctrl_c_on_up_stops_each_child_once_and_gracefully() {
    let launcher = common::launcher();
    let mut up = pool_up(&launcher, &[]);
    let up_pid = up.process.pid().unwrap();
    // The terminal sends SIGINT to the foreground process group: up's.
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(up_pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = up
        .process
        .signal_exits_within(nix::sys::signal::Signal::SIGCONT, Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let log = up.process.log();
    assert!(!log.contains("second stop signal"), "{log}");
    assert!(
        log.matches("segment unmounted").count() >= 2,
        "both stores unmounted on their way out:\n{log}"
    );
    assert!(up_shm_dirs(up_pid).is_empty());
}

/// Issue 40, item 26: an idle master says its `Storage:` line when it changes, not every
/// summary interval.
#[test]
fn an_idle_master_logs_its_storage_line_only_when_it_changes() {
    let c = Cluster::start(Opts {
        stores: 1,
        master: rbgctl::master::config::MasterConfig {
            summary_interval_ms: rbgctl::config::Millis(Duration::from_millis(100)),
            ..Default::default()
        },
        ..Default::default()
    });
    let lines = || c.master().log().matches("Storage:").count();
    assert!(wait_until(Duration::from_secs(5), || lines() >= 1));
    let first = lines();
    // Ten intervals with nothing happening.
    std::thread::sleep(Duration::from_secs(1));
    let idle = lines();
    c.client()
        .put("k", b"v", &ReplicateConfig::default())
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || lines() > idle),
        "a change is said"
    );
    assert_eq!(
        idle,
        first,
        "idle intervals said nothing:\n{}",
        c.master().log()
    );
}
