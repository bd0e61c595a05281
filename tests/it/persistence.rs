//! Lossless restarts with real processes: the seed's in-place upgrade of the cache role,
//! simulated by killing (SIGKILL) or stopping (SIGTERM) a store or the master while a client runs
//! a put/get loop, then starting it again on the same directory. Every key the client saw
//! committed must read back byte-exact. Also: corrupted backing files, and directories that do
//! not belong to the store.

use crate::common;
use rbgctl::transfer::rpc;

use common::{wait_until, Cluster, Opts};
use rbgctl::client::{Client, ClientError, ReplicateConfig};
use rbgctl::config::{ByteSize, Millis};
use rbgctl::master::config::MasterConfig;
use rbgctl::store::config::StoreConfig;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn one() -> ReplicateConfig {
    ReplicateConfig::default()
}

/// A value that names its key and attempt, of varying length.
fn value(key: usize, attempt: usize) -> Vec<u8> {
    let len = 1000 + (key * 7919 + attempt * 104_729) % 60_000;
    let seed = format!("{key}/{attempt}/");
    seed.bytes().cycle().take(len).collect()
}

/// What the client saw: per key, the last committed attempt, and attempts that failed after it
/// whose outcome is unknown (they may have completed).
#[derive(Default)]
struct Seen {
    committed: HashMap<usize, usize>,
    uncertain: HashMap<usize, Vec<usize>>,
}

/// A put/get loop over `keys` keys (so that keys are replaced), bounded by `max_ops` and time.
struct Workload {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    commits: Arc<AtomicUsize>,
    bad_reads: Arc<AtomicUsize>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Workload {
    fn start(client: Arc<Client>, keys: usize, max_ops: usize) -> Workload {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(AtomicUsize::new(0));
        let bad_reads = Arc::new(AtomicUsize::new(0));
        let (s, st, cm, br) = (
            seen.clone(),
            stop.clone(),
            commits.clone(),
            bad_reads.clone(),
        );
        let handle = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            for op in 0..max_ops {
                if st.load(Ordering::SeqCst) || Instant::now() > deadline {
                    break;
                }
                let key = (op * 31) % keys;
                match client.put(&format!("k/{key}"), &value(key, op), &one()) {
                    Ok(()) => {
                        let mut g = s.lock().unwrap();
                        g.committed.insert(key, op);
                        g.uncertain.remove(&key);
                        cm.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => {
                        s.lock().unwrap().uncertain.entry(key).or_default().push(op);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                // Read back an older key: a read may fail during an outage, never be wrong.
                let probe = (op * 17) % keys;
                let expected = s.lock().unwrap().committed.get(&probe).copied();
                if let (Some(att), Ok(v)) = (expected, client.get(&format!("k/{probe}"))) {
                    let ok_values: Vec<Vec<u8>> = std::iter::once(att)
                        .chain(
                            s.lock()
                                .unwrap()
                                .uncertain
                                .get(&probe)
                                .cloned()
                                .unwrap_or_default(),
                        )
                        .map(|a| value(probe, a))
                        .collect();
                    if !ok_values.contains(&v) {
                        br.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
        Workload {
            seen,
            stop,
            commits,
            bad_reads,
            handle: Some(handle),
        }
    }

    fn wait_commits(&self, n: usize) -> bool {
        wait_until(Duration::from_secs(20), || {
            self.commits.load(Ordering::SeqCst) >= n
        })
    }

    fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
        assert_eq!(
            self.bad_reads.load(Ordering::SeqCst),
            0,
            "a read returned a wrong value"
        );
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Every committed key reads back as its committed value (or, with `allow_uncertain`, as an
/// attempt whose failure was ambiguous).
fn verify(client: &Client, seen: &Seen, allow_uncertain: bool) {
    assert!(!seen.committed.is_empty());
    for (&key, &att) in &seen.committed {
        let got = client
            .get(&format!("k/{key}"))
            .unwrap_or_else(|e| panic!("k/{key} committed as attempt {att} but unreadable: {e}"));
        let mut ok = vec![att];
        if allow_uncertain {
            ok.extend(seen.uncertain.get(&key).cloned().unwrap_or_default());
        }
        assert!(
            ok.iter().any(|a| value(key, *a) == got),
            "k/{key}: read {} bytes, not the committed attempt {att}",
            got.len()
        );
    }
}

fn cluster(stores: usize, master: MasterConfig) -> Cluster {
    Cluster::start(Opts {
        stores,
        segment: 64 << 20,
        master,
    })
}

fn client(c: &Cluster) -> Arc<Client> {
    Arc::new(c.client())
}

/// Waits until `key` is readable (the store or master is back).
fn wait_readable(client: &Client, key: &str) -> bool {
    wait_until(Duration::from_secs(15), || client.get(key).is_ok())
}

fn store_restart_keeps_every_committed_object(sigkill: bool) {
    let mut c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    let w = Workload::start(cl.clone(), 150, 5000);
    assert!(w.wait_commits(300), "the loop did not get going");
    if sigkill {
        c.stores[0].kill();
    } else {
        c.stores[0].stop();
    }
    let before = w.commits.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    c.restart_store(0);
    assert!(
        w.wait_commits(before + 300),
        "the loop did not resume after the restart"
    );
    let seen = w.finish();
    verify(&cl, &seen, false);
    assert_eq!(
        c.store_metric(0, "rbgctl_store_recovery_corrupt_objects"),
        Some(0.0)
    );
    assert!(c.store_metric(0, "rbgctl_store_recovered_objects").unwrap() > 0.0);
}

#[test]
fn a_store_killed_with_sigkill_comes_back_with_every_committed_object() {
    store_restart_keeps_every_committed_object(true);
}

#[test]
fn a_store_stopped_with_sigterm_comes_back_with_every_committed_object() {
    store_restart_keeps_every_committed_object(false);
}

#[test]
fn objects_are_unavailable_not_lost_while_their_store_restarts() {
    let mut c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    cl.put("x", b"kept", &one()).unwrap();
    c.stores[0].stop();
    // SIGTERM says "back soon": the object is unavailable, not gone.
    let e = cl.get("x").unwrap_err();
    assert_eq!(
        e.status(),
        Some(rbgctl::transfer::Status::ObjectUnavailable),
        "{e}"
    );
    assert!(!cl.exists("x").unwrap());
    c.restart_store(0);
    assert!(c.wait_store_mounted(0), "the store did not come back");
    assert!(wait_readable(&cl, "x"));
    assert_eq!(cl.get("x").unwrap(), b"kept");
}

#[test]
fn a_restarted_master_rebuilds_every_object_from_its_stores() {
    let mut c = cluster(2, MasterConfig::default());
    let cl = client(&c);
    // Two replicas for some keys: both stores report them and they merge again.
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    for i in 0..20 {
        cl.put(&format!("r2/{i}"), &value(i, 0), &two).unwrap();
    }
    let w = Workload::start(cl.clone(), 150, 5000);
    assert!(w.wait_commits(300));
    c.restart_master();
    let before = w.commits.load(Ordering::SeqCst);
    assert!(
        w.wait_commits(before + 300),
        "the loop did not resume after the master restart"
    );
    let seen = w.finish();
    assert!(wait_readable(&cl, "r2/0"));
    verify(&cl, &seen, true);
    for i in 0..20 {
        let key = format!("r2/{i}");
        assert_eq!(cl.get(&key).unwrap(), value(i, 0));
        assert_eq!(
            c.replica_segments(&key).len(),
            2,
            "{key} has both replicas again"
        );
    }
}

/// Issue 40, item 1: a non-persistent store is alive across a master's kill -9 and holds its
/// bytes and records; the restarted master learns them from it. Puts over TCP and same-host
/// copies (which the store records through their SEAL).
#[test]
fn a_restarted_master_keeps_every_object_of_running_non_persistent_stores() {
    let mut c = Cluster::start(Opts {
        stores: 0,
        segment: 64 << 20,
        master: MasterConfig::default(),
    });
    for _ in 0..2 {
        c.add_store_with(64 << 20, |s| s.persistent = false);
    }
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 2));
    let tcp = client(&c);
    let shm =
        rbgctl::client::Client::connect(rbgctl::client::ClientConfig::new(c.rpc.clone())).unwrap();
    for i in 0..200 {
        let cl = if i % 2 == 0 { &*tcp } else { &shm };
        cl.put(&format!("np/{i}"), &value(i, 0), &one()).unwrap();
    }
    assert_eq!(
        c.store_metric(0, "rbgctl_store_mounted"),
        Some(1.0),
        "store 0 serves"
    );
    c.restart_master();
    wait_until(Duration::from_secs(15), || {
        (0..200).all(|i| tcp.get(&format!("np/{i}")).ok() == Some(value(i, 0)))
    });
    let lost: Vec<usize> = (0..200)
        .filter(|&i| tcp.get(&format!("np/{i}")).ok() != Some(value(i, 0)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of 200 acknowledged objects lost across the master restart: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

#[test]
fn puts_into_reservations_survive_a_store_killed_the_moment_they_returned() {
    let mut c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    // Same size: after the first, every put writes into a reservation and takes one master
    // round trip (its commit), sent only once the store has the bytes and their record.
    let reserved = || {
        c.master_metric("rbgctl_master_reserved_puts_total")
            .unwrap_or(0.0)
    };
    let before = reserved();
    for i in 0..50 {
        cl.put(&format!("rsv/{i}"), &value(i, 0)[..1000], &one())
            .unwrap();
    }
    assert!(
        reserved() - before >= 49.0,
        "the puts went into reservations"
    );
    c.stores[0].kill();
    c.restart_store(0);
    // Unavailable (never lost) until the store's report is in.
    assert!(wait_until(Duration::from_secs(15), || (0..50)
        .all(|i| cl.get(&format!("rsv/{i}")).is_ok())));
    for i in 0..50 {
        assert_eq!(cl.get(&format!("rsv/{i}")).unwrap(), &value(i, 0)[..1000]);
    }
}

#[test]
fn a_removed_key_stays_removed_across_a_master_restart() {
    let mut c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    cl.put("gone", b"v", &one()).unwrap();
    cl.put("kept", b"v", &one()).unwrap();
    cl.remove("gone", true).unwrap();
    c.restart_master();
    assert!(wait_readable(&cl, "kept"));
    assert!(matches!(cl.get("gone"), Err(ClientError::NotFound(_))));
}

/// Flips a byte of `key`'s replica in the store's backing file.
fn corrupt(c: &Cluster, store: usize, key: &str) {
    let obj = c.object(key);
    let offset = obj["current"]["replicas"][0]["offset"].as_u64().unwrap();
    let path = c.shm_dir().join(format!("{}.seg", c.store_stem(store)));
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset + 10).unwrap();
    b[0] ^= 0xff;
    f.write_all_at(&b, offset + 10).unwrap();
}

#[test]
fn bytes_corrupted_while_stopped_are_caught_at_recovery() {
    let mut c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    for i in 0..20 {
        cl.put(&format!("c/{i}"), &value(i, 0), &one()).unwrap();
    }
    c.stores[0].kill();
    corrupt(&c, 0, "c/3");
    c.restart_store(0);
    assert!(c.wait_store_mounted(0), "the store did not come back");
    assert!(wait_readable(&cl, "c/0"));
    assert!(
        matches!(cl.get("c/3"), Err(ClientError::NotFound(_))),
        "never served"
    );
    for i in (0..20).filter(|i| *i != 3) {
        assert_eq!(cl.get(&format!("c/{i}")).unwrap(), value(i, 0));
    }
    assert_eq!(
        c.store_metric(0, "rbgctl_store_recovery_corrupt_objects"),
        Some(1.0)
    );
}

#[test]
fn bytes_corrupted_while_running_are_caught_on_read_and_dropped() {
    let c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    cl.put("victim", &value(1, 0), &one()).unwrap();
    corrupt(&c, 0, "victim");
    let e = cl.get("victim").unwrap_err();
    assert!(matches!(e, ClientError::Checksum { .. }), "{e}");
    assert!(
        matches!(cl.get("victim"), Err(ClientError::NotFound(_))),
        "dropped"
    );
    assert_eq!(
        c.master_metric("rbgctl_master_corrupt_replicas_total"),
        Some(1.0)
    );
}

#[test]
fn a_store_away_past_its_grace_period_starts_empty() {
    let mut c = cluster(
        1,
        MasterConfig {
            client_ttl_ms: Millis(Duration::from_millis(300)),
            store_grace_period_ms: Millis(Duration::from_millis(500)),
            ..MasterConfig::default()
        },
    );
    let cl = client(&c);
    cl.put("old", b"v", &one()).unwrap();
    c.stores[0].kill();
    assert!(wait_until(Duration::from_secs(10), || {
        c.status()["counters"]["segments_given_up"] == 1
    }));
    cl.put_nowhere_check();
    c.restart_store(0);
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 1));
    assert!(matches!(cl.get("old"), Err(ClientError::NotFound(_))));
    assert!(wait_until(Duration::from_secs(5), || {
        c.store_metric(0, "rbgctl_store_index_records") == Some(0.0)
    }));
}

trait NoopCheck {
    fn put_nowhere_check(&self);
}
impl NoopCheck for Client {
    /// With no live segment, a put fails cleanly.
    fn put_nowhere_check(&self) {
        let e = self
            .put("nowhere", b"v", &ReplicateConfig::default())
            .unwrap_err();
        assert_eq!(e.status(), Some(rbgctl::transfer::Status::NoSpace), "{e}");
    }
}

#[test]
fn a_different_segment_size_or_a_second_owner_is_refused() {
    let mut c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    cl.put("a", b"v", &one()).unwrap();
    // Same name and directory while the first store runs (other ports): refused.
    let (ok, err) = c.run_store_expecting_exit(0, |s| {
        s.port = 0;
        s.metrics_port = 0;
    });
    assert!(!ok);
    assert!(err.contains("in use by another running store"), "{err}");
    c.stores[0].stop();
    // Another size over the same files: refused, data untouched.
    let (ok, err) = c.run_store_expecting_exit(0, |s| s.segment_size = ByteSize(32 << 20));
    assert!(!ok);
    assert!(err.contains("refusing to mix data"), "{err}");
    c.restart_store(0);
    assert!(c.wait_store_mounted(0), "the store did not come back");
    assert!(wait_readable(&cl, "a"));
    assert_eq!(cl.get("a").unwrap(), b"v");
}

#[test]
fn a_foreign_directory_is_refused_or_left_alone() {
    let mut c = cluster(1, MasterConfig::default());
    let cl = client(&c);
    cl.put("a", b"v", &one()).unwrap();
    c.stores[0].stop();
    let dir = c.shm_dir().to_path_buf();
    let stem = c.store_stem(0);
    // A second store (another name) in the same directory starts empty and leaves the first
    // store's files alone.
    let b = c.add_store(64 << 20);
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 1));
    assert_eq!(
        c.store_metric(b, "rbgctl_store_recovered_objects"),
        Some(0.0)
    );
    c.stores[b].stop();
    assert!(dir.join(format!("{stem}.idx")).exists());
    // Files renamed to another store's name are refused: they describe another segment.
    let other = c.store_stem(b);
    for ext in ["idx", "seg"] {
        std::fs::rename(
            dir.join(format!("{stem}.{ext}")),
            dir.join(format!("{other}.{ext}")),
        )
        .unwrap();
    }
    let (ok, err) = c.run_store_expecting_exit(b, |_| {});
    assert!(!ok);
    assert!(err.contains("belongs to segment"), "{err}");
}

#[test]
fn an_unusable_directory_is_a_clear_start_up_error() {
    let c = cluster(1, MasterConfig::default());
    // Another store (name and ports) than the running one.
    let fresh_ports = |s: &mut StoreConfig| {
        s.name = Some("another-store".into());
        s.port = 0;
        s.metrics_port = 0;
    };
    let (ok, err) = c.run_store_expecting_exit(0, |s| {
        fresh_ports(s);
        s.shm_dir = c.shm_dir().join("no/such/dir");
    });
    assert!(!ok);
    assert!(err.contains("parent directory does not exist"), "{err}");
    let (ok, err) = c.run_store_expecting_exit(0, |s| {
        fresh_ports(s);
        s.segment_size = ByteSize(1 << 50);
    });
    assert!(!ok);
    assert!(err.contains("has no room"), "{err}");
}

#[test]
fn objects_copied_through_shared_memory_are_recorded_and_survive_a_kill() {
    let mut c = cluster(1, MasterConfig::default());
    let cl =
        rbgctl::client::Client::connect(rbgctl::client::ClientConfig::new(c.rpc.clone())).unwrap();
    let keys: Vec<String> = (0..50).map(|i| format!("shm/{i}")).collect();
    let vals: Vec<Vec<u8>> = (0..50).map(|i| value(i, 0)).collect();
    let krefs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    let vrefs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
    for r in cl.batch_put(&krefs, &vrefs, &one()) {
        r.unwrap();
    }
    assert_eq!(
        c.store_metric(0, "rbgctl_store_written_bytes_total"),
        Some(0.0),
        "the same-host path copied the bytes"
    );
    assert_eq!(c.store_metric(0, "rbgctl_store_index_records"), Some(50.0));
    c.stores[0].kill();
    c.restart_store(0);
    assert!(c.wait_store_mounted(0), "the store did not come back");
    assert!(wait_readable(&cl, "shm/0"));
    for (k, v) in keys.iter().zip(&vals) {
        assert_eq!(&cl.get(k).unwrap(), v, "{k}");
    }
}

#[test]
fn a_write_of_a_put_an_earlier_master_started_is_refused_by_the_store() {
    use rbgctl::transfer::message::*;
    use rbgctl::transfer::{ConnOptions, Connection, Opcode, Status, TransferError};
    let mut c = Cluster::start(Opts {
        stores: 1,
        ..Opts::default()
    });
    let opts = ConnOptions::default();
    let mut master = Connection::connect(&c.rpc, &opts).unwrap();
    let client_id = 77;
    let _: PingResp = master.call::<rpc::Ping>(&PingReq { client_id }).unwrap();
    let started: PutStartResp = master
        .call::<rpc::PutStart>(&PutStartReq {
            client_id,
            key: "stale".into(),
            size: 4096,
            config: ReplicateConfig::default(),
        })
        .unwrap();
    let segments: ListSegmentsResp = master.call::<rpc::ListSegments>(&()).unwrap();
    let endpoint = segments.segments[0].info.endpoint.clone();
    drop(master);

    // The master restarts before the client writes: the put is committed by no one.
    c.restart_master();
    assert!(
        wait_until(Duration::from_secs(10), || c.segment_count() == 1),
        "the store did not mount again"
    );
    let loc = &started.replicas[0];
    let mut store = Connection::connect(&endpoint, &opts).unwrap();
    let value = vec![7u8; 4096];
    let req = WriteReq {
        offset: loc.offset,
        key: "stale".into(),
        version: started.object_id,
        checksum: crc32c::crc32c(&value),
        // The store is the same process: the grant its old master made still holds.
        grant: started.grants[0],
    };
    let id = store
        .send(Opcode::Write, &req.to_meta(), &[&value])
        .unwrap();
    match store.recv(id) {
        Err(TransferError::Remote { status, message }) => {
            assert_eq!(status, Status::WriteSuperseded, "{message}");
            assert!(message.contains("earlier master"), "{message}");
        }
        other => panic!("the stale write was taken: {other:?}"),
    }
    assert_eq!(
        c.store_metric(0, "rbgctl_store_stale_writes_total"),
        Some(1.0)
    );
    // Puts through the new master land as before.
    let client = c.client();
    client
        .put("fresh", &value, &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.get("fresh").unwrap(), value);
}

/// A put given up while its bytes were still on the way (its store stopped answering: SIGSTOP,
/// a pause, a partition) has its space given to the next put at once. When the store answers
/// again, the late bytes must not land over the newer put, which was acknowledged meanwhile.
#[test]
fn the_late_bytes_of_a_given_up_put_never_land_over_the_put_that_took_its_space() {
    use rbgctl::transfer::message::*;
    use rbgctl::transfer::{ConnOptions, Connection, Opcode, Status, TransferError};
    let c = Cluster::start(Opts {
        stores: 1,
        ..Opts::default()
    });
    let opts = ConnOptions::default();
    let mut master = Connection::connect(&c.rpc, &opts).unwrap();
    let client_id = 78;
    let _: PingResp = master.call::<rpc::Ping>(&PingReq { client_id }).unwrap();
    let start = |master: &mut Connection, key: &str| -> PutStartResp {
        master
            .call::<rpc::PutStart>(&PutStartReq {
                client_id,
                key: key.into(),
                size: 4096,
                config: ReplicateConfig::default(),
            })
            .unwrap()
    };
    let segments: ListSegmentsResp = master.call::<rpc::ListSegments>(&()).unwrap();
    let endpoint = segments.segments[0].info.endpoint.clone();
    let write = |key: &str, started: &PutStartResp, offset: u64, value: &[u8]| {
        let mut store = Connection::connect(&endpoint, &opts).unwrap();
        let req = WriteReq {
            offset,
            key: key.into(),
            version: started.object_id,
            checksum: crc32c::crc32c(value),
            grant: started.grants[0],
        };
        let id = store.send(Opcode::Write, &req.to_meta(), &[value]).unwrap();
        store.recv(id).map(|_| ())
    };

    // The first put is given up before its bytes arrive; the master gives its space to the next.
    let given_up = start(&mut master, "given-up");
    let _: () = master
        .call::<rpc::PutRevoke>(&PutRevokeReq {
            client_id,
            key: "given-up".into(),
            object_id: given_up.object_id,
        })
        .unwrap();
    let newer = start(&mut master, "newer");
    let offset = given_up.replicas[0].offset;
    assert_eq!(
        newer.replicas[0].offset, offset,
        "the master gave the freed space to the next put (the premise of this test)"
    );
    assert!(newer.object_id > given_up.object_id);
    let value = vec![0x5au8; 4096];
    write("newer", &newer, offset, &value).unwrap();
    let _: () = master
        .call::<rpc::PutEnd>(&PutEndReq {
            client_id,
            key: "newer".into(),
            object_id: newer.object_id,
            checksum: crc32c::crc32c(&value),
            unhashed: false,
        })
        .unwrap();

    // The given-up put's bytes come in late: refused, the newer put's bytes stay.
    match write("given-up", &given_up, offset, &[0xa5u8; 4096]) {
        Err(TransferError::Remote { status, message }) => {
            assert_eq!(status, Status::WriteSuperseded, "{message}");
            assert!(message.contains("given up"), "{message}");
        }
        other => panic!("the late write was taken: {other:?}"),
    }
    // A write of another range than the master granted (here: only the newer put's last
    // bytes) is refused before its range is even looked at.
    match write("given-up", &given_up, offset + 4032, &[0xa5u8; 128]) {
        Err(TransferError::Remote { status, .. }) => assert_eq!(status, Status::NotGranted),
        other => panic!("the late write was taken: {other:?}"),
    }
    assert_eq!(
        c.store_metric(0, "rbgctl_store_superseded_writes_total"),
        Some(1.0)
    );
    assert_eq!(c.store_metric(0, "rbgctl_store_ungranted_total"), Some(1.0));
    assert_eq!(c.client().get("newer").unwrap(), value);
}
