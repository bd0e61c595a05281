//! The KV pool end to end: a real master and real stores on loopback, driven by the client.

use crate::common;
use rbgctl::transfer::rpc;

use common::*;
use rbgctl::client::{ClientError, ReplicateConfig};
use rbgctl::config::Millis;
use rbgctl::master::config::MasterConfig;
use rbgctl::transfer::Status;
use std::time::{Duration, Instant};

fn one() -> ReplicateConfig {
    ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    }
}

fn value(size: usize, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn round_trips_across_sizes_and_clear_errors_at_the_edges() {
    let c = Cluster::start(Opts {
        stores: 2,
        segment: 32 << 20,
        ..Default::default()
    });
    let client = c.client();
    for size in [1usize, 100, 4096, 65_536, 1 << 20, 8 << 20] {
        let key = format!("size/{size}");
        let v = value(size, 3);
        client.put(&key, &v, &one()).unwrap();
        assert_eq!(client.get(&key).unwrap(), v, "value of {size} bytes");
        let mut buf = vec![0u8; size + 10];
        assert_eq!(client.get_into(&key, &mut buf).unwrap(), size);
        assert_eq!(&buf[..size], &v[..]);
        assert_eq!(client.get_size(&key).unwrap(), size as u64);
    }
    let empty = client.put("empty", b"", &one()).unwrap_err();
    assert_eq!(empty.status(), Some(Status::InvalidParams), "{empty}");
    let huge = client
        .put("huge", &vec![0u8; 33 << 20], &one())
        .unwrap_err();
    assert_eq!(huge.status(), Some(Status::ValueTooLarge), "{huge}");
    assert!(
        huge.to_string().contains("larger than the largest segment"),
        "{huge}"
    );
    assert!(matches!(
        client.get("missing"),
        Err(ClientError::NotFound(_))
    ));
    let mut small = [0u8; 10];
    assert!(matches!(
        client.get_into("size/4096", &mut small),
        Err(ClientError::BufferTooSmall { .. })
    ));
}

#[test]
fn putting_an_existing_key_replaces_its_value() {
    let c = Cluster::start(Opts::default());
    let client = c.client();
    client.put("k", b"first value", &one()).unwrap();
    client.put("k", b"second, longer value", &one()).unwrap();
    assert_eq!(client.get("k").unwrap(), b"second, longer value");
    assert_eq!(c.status()["summary"]["keys"], 1);
}

#[test]
fn batch_operations() {
    let c = Cluster::start(Opts::default());
    let client = c.client();
    let keys: Vec<String> = (0..40).map(|i| format!("batch/{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = (0..40).map(|i| value(1000 + i * 97, i as u8)).collect();
    let vrefs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    assert!(client
        .batch_put(
            &refs,
            &vrefs,
            &ReplicateConfig {
                replica_num: 2,
                ..Default::default()
            }
        )
        .iter()
        .all(Result::is_ok));
    let mut probe = refs.clone();
    probe.push("batch/absent");
    let exists = client.batch_exists(&probe).unwrap();
    assert_eq!(exists.iter().filter(|e| **e).count(), 40);
    assert!(!exists[40]);
    let got = client.batch_get(&probe);
    for (i, r) in got.iter().enumerate().take(40) {
        assert_eq!(r.as_ref().unwrap(), &values[i]);
    }
    assert!(matches!(got[40], Err(ClientError::NotFound(_))));
    let mut bufs: Vec<Vec<u8>> = (0..40).map(|_| vec![0u8; 5000]).collect();
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let lens = client.batch_get_into(&refs, &mut slices);
    for (i, n) in lens.iter().enumerate() {
        assert_eq!(*n.as_ref().unwrap(), values[i].len());
        assert_eq!(&bufs[i][..values[i].len()], &values[i][..]);
    }
    let removed = client.batch_remove(&probe, true).unwrap();
    assert!(removed[..40].iter().all(Result::is_ok));
    assert!(matches!(removed[40], Err(ClientError::NotFound(_))));
    assert!(client.batch_exists(&refs).unwrap().iter().all(|e| !e));
}

/// Issue 41: a batch of several megabytes goes over several connections to its store at once
/// (one lane each), and every value comes back whole, in its place.
#[test]
fn a_batch_of_megabytes_goes_over_several_connections_and_reads_back_whole() {
    let c = Cluster::start(Opts {
        stores: 1,
        segment: 64 << 20,
        ..Default::default()
    });
    let accepted = || {
        c.store_metric(0, "rbgctl_store_accepted_connections_total")
            .expect("the store counts its connections")
    };
    let before = accepted();
    let client = c.client();
    let keys: Vec<String> = (0..32).map(|i| format!("lanes/{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = (0..32).map(|i| value(256 << 10, i as u8)).collect();
    let vrefs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let put = client.batch_put(&refs, &vrefs, &one());
    assert!(put.iter().all(Result::is_ok), "{put:?}");
    let lanes = accepted() - before;
    assert!(lanes >= 4.0, "8 MiB went over {lanes} connections");
    let got = client.batch_get(&refs);
    for (i, r) in got.iter().enumerate() {
        assert!(
            r.as_ref().unwrap() == &values[i],
            "value {i} read back whole"
        );
    }
    let mut bufs: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 300 << 10]).collect();
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let lens = client.batch_get_into(&refs, &mut slices);
    for (i, n) in lens.iter().enumerate() {
        assert_eq!(*n.as_ref().unwrap(), 256 << 10);
        assert!(
            bufs[i][..256 << 10] == values[i][..],
            "value {i} in its buffer"
        );
    }
}

#[test]
fn replicas_land_on_distinct_stores() {
    let c = Cluster::start(Opts {
        stores: 3,
        ..Default::default()
    });
    let client = c.client();
    for i in 0..10 {
        let key = format!("rep/{i}");
        client
            .put(
                &key,
                &value(5000, i),
                &ReplicateConfig {
                    replica_num: 3,
                    ..Default::default()
                },
            )
            .unwrap();
        let segs = c.replica_segments(&key);
        let distinct: std::collections::HashSet<&String> = segs.iter().collect();
        assert_eq!((segs.len(), distinct.len()), (3, 3), "{segs:?}");
    }
    // Asking for more replicas than stores is best effort: one per store.
    client
        .put(
            "rep/many",
            b"x",
            &ReplicateConfig {
                replica_num: 5,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(c.replica_segments("rep/many").len(), 3);
}

#[test]
fn preferred_segment_is_used() {
    let c = Cluster::start(Opts {
        stores: 3,
        ..Default::default()
    });
    let client = c.client();
    let segs = client.segments().unwrap();
    let target = segs[1].info.name.clone();
    for i in 0..5 {
        let key = format!("pref/{i}");
        let cfg = ReplicateConfig {
            replica_num: 1,
            preferred_segment: target.clone(),
            ..Default::default()
        };
        client.put(&key, b"v", &cfg).unwrap();
        let segs = c.replica_segments(&key);
        assert!(segs.contains(&target), "{segs:?}");
    }
}

#[test]
fn store_killed_with_two_replicas_keeps_every_object_readable() {
    let c_opts = Opts {
        stores: 2,
        // No grace period: a dead store's objects go at the TTL.
        master: MasterConfig {
            client_ttl_ms: Millis(Duration::from_secs(2)),
            store_grace_period_ms: Millis(Duration::ZERO),
            ..MasterConfig::default()
        },
        ..Default::default()
    };
    let mut c = Cluster::start(c_opts);
    let client = c.client();
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    for i in 0..30 {
        client
            .put(&format!("safe/{i}"), &value(10_000, i), &two)
            .unwrap();
    }
    c.stores[0].kill();
    for i in 0..30 {
        assert_eq!(
            client.get(&format!("safe/{i}")).unwrap(),
            value(10_000, i),
            "right after the kill"
        );
    }
    // After the TTL the dead store's segment is gone and the objects are still readable.
    assert!(wait_until(Duration::from_secs(8), || c.segment_count() == 1));
    for i in 0..30 {
        assert_eq!(
            client.get(&format!("safe/{i}")).unwrap(),
            value(10_000, i),
            "after expiry"
        );
    }
}

#[test]
fn store_killed_with_one_replica_fails_cleanly_then_disappears_after_ttl() {
    let c_opts = Opts {
        stores: 1,
        master: MasterConfig {
            client_ttl_ms: Millis(Duration::from_secs(2)),
            store_grace_period_ms: Millis(Duration::ZERO),
            ..MasterConfig::default()
        },
        ..Default::default()
    };
    let mut c = Cluster::start(c_opts);
    let client = c.client();
    for i in 0..10 {
        client
            .put(&format!("lost/{i}"), &value(4096, i), &one())
            .unwrap();
    }
    c.stores[0].kill();
    let t0 = Instant::now();
    let err = client.get("lost/0").unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "failing took {:?}",
        t0.elapsed()
    );
    assert!(matches!(err, ClientError::Unreadable { .. }), "{err}");
    assert!(
        wait_until(Duration::from_secs(8), || !client.exists("lost/0").unwrap()),
        "objects outlived the TTL"
    );
    assert!(matches!(
        client.get("lost/1"),
        Err(ClientError::NotFound(_))
    ));
    assert_eq!(c.status()["summary"]["keys"], 0);
}

#[test]
fn leases_block_remove_unless_forced() {
    let c = Cluster::start(Opts {
        master: MasterConfig {
            default_kv_lease_ttl_ms: Millis(Duration::from_secs(60)),
            ..MasterConfig::default()
        },
        ..Default::default()
    });
    let client = c.client();
    client.put("leased", b"v", &one()).unwrap();
    client.put("free", b"v", &one()).unwrap();
    client.remove("free", false).unwrap();
    // A get that asks the master takes a lease (the writer's own get would read the location
    // it remembers, which needs none).
    c.client().get("leased").unwrap();
    let e = client.remove("leased", false).unwrap_err();
    assert_eq!(e.status(), Some(Status::ObjectHasLease), "{e}");
    assert_eq!(
        client.remove_all(false).unwrap(),
        0,
        "leased objects are skipped"
    );
    client.remove("leased", true).unwrap();
    assert!(!client.exists("leased").unwrap());
}

#[test]
fn eviction_keeps_usage_under_the_watermark_lru_first_and_never_a_leased_object() {
    // Two 4 MiB stores, 64 KiB objects: 128 fit. Leases last long so the leased one stays leased.
    let c = Cluster::start(Opts {
        stores: 2,
        segment: 4 << 20,
        master: MasterConfig {
            default_kv_lease_ttl_ms: Millis(Duration::from_secs(120)),
            ..MasterConfig::default()
        },
    });
    let client = c.client();
    let v = value(65_536, 1);
    for i in 0..40 {
        client.put(&format!("ev/{i}"), &v, &one()).unwrap();
    }
    // ev/0 is read (leased, by a client that asks the master); ev/1..10 are touched (recent);
    // ev/10..40 are the oldest.
    c.client().get("ev/0").unwrap();
    for i in 1..10 {
        assert!(client.exists(&format!("ev/{i}")).unwrap());
    }
    for i in 40..400 {
        client.put(&format!("ev/{i}"), &v, &one()).unwrap();
        let s = c.status();
        let used = s["summary"]["used_bytes"].as_f64().unwrap();
        let cap = s["summary"]["capacity_bytes"].as_f64().unwrap();
        assert!(
            used / cap <= 0.9 + 1e-9 || i < 100,
            "usage {} over the watermark after put {i}",
            used / cap
        );
    }
    let s = c.status();
    assert!(
        s["counters"]["evicted_objects"].as_u64().unwrap() > 200,
        "{s}"
    );
    assert!(
        client.exists("ev/0").unwrap(),
        "the leased object was evicted"
    );
    assert_eq!(client.get("ev/0").unwrap(), v);
    let survivors_recent = (1..10)
        .filter(|i| client.exists(&format!("ev/{i}")).unwrap())
        .count();
    let survivors_old = (10..40)
        .filter(|i| client.exists(&format!("ev/{i}")).unwrap())
        .count();
    assert_eq!(survivors_old, 0, "old untouched objects should go first");
    assert!(survivors_recent <= 9);
    assert!(
        client.exists("ev/399").unwrap(),
        "the newest object is there"
    );
}

#[test]
fn soft_pinned_objects_are_evicted_last() {
    let c = Cluster::start(Opts {
        stores: 1,
        segment: 4 << 20,
        master: MasterConfig::default(),
    });
    let client = c.client();
    let v = value(65_536, 2);
    let pinned = ReplicateConfig {
        replica_num: 1,
        soft_pin: true,
        ..Default::default()
    };
    client.put("pin/0", &v, &pinned).unwrap();
    for i in 1..200 {
        client.put(&format!("pin/{i}"), &v, &one()).unwrap();
    }
    assert!(
        client.exists("pin/0").unwrap(),
        "the soft-pinned oldest object was evicted before unpinned ones"
    );
    assert_eq!(c.status()["summary"]["soft_pinned_keys"], 1);
}

#[test]
fn corrupted_bytes_are_caught_by_the_checksum_and_never_served() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let client = c.client();
    // A new object whose stored bytes are then overwritten (a reader that finds it corrupt
    // has the master drop that replica, so each path gets its own).
    let corrupted = |key: &str| {
        client.put(key, &value(8192, 9), &one()).unwrap();
        let offset = c.object(key)["current"]["replicas"][0]["offset"]
            .as_u64()
            .unwrap();
        let seg_file = std::fs::read_dir(c.shm_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "seg"))
            .unwrap();
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&seg_file)
            .unwrap();
        f.seek(SeekFrom::Start(offset + 100)).unwrap();
        f.write_all(b"CORRUPT").unwrap();
    };
    // Checksummed as the bytes arrive, on every path: one get and a batch over TCP, and a
    // copy from the same-host segment.
    corrupted("crc-get");
    let err = client.get("crc-get").unwrap_err();
    assert!(matches!(err, ClientError::Checksum { .. }), "{err}");
    corrupted("crc-batch");
    let batch = client.batch_get(&["crc-batch"]);
    assert!(
        matches!(&batch[0], Err(ClientError::Checksum { .. })),
        "{batch:?}"
    );
    corrupted("crc-shm");
    let shm =
        rbgctl::client::Client::connect(rbgctl::client::ClientConfig::new(c.rpc.clone())).unwrap();
    let err = shm.get("crc-shm").unwrap_err();
    assert!(matches!(err, ClientError::Checksum { .. }), "{err}");
}

#[test]
fn a_batch_against_a_dead_master_names_the_master_for_every_item() {
    let mut c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    // Written by another client: this one remembers no location (a remembered one would be
    // read from its store, master or not, while the store's read lease runs).
    c.client().put("k/0", b"v", &one()).unwrap();
    let client = c.client();
    c.master_mut().kill();
    let keys = ["k/0", "k/1", "k/2"];
    let is_master_failure =
        |e: &ClientError| matches!(e, ClientError::Master { addr, .. } if *addr == c.rpc);
    let got = client.batch_get(&keys);
    assert!(
        got.iter().all(|r| r.as_ref().is_err_and(is_master_failure)),
        "{got:?}"
    );
    let values: [&[u8]; 3] = [b"a", b"b", b"c"];
    let put = client.batch_put(&keys, &values, &one());
    assert!(
        put.iter().all(|r| r.as_ref().is_err_and(is_master_failure)),
        "{put:?}"
    );
}

#[test]
fn a_client_that_leaves_is_forgotten_at_once_without_a_warning() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let clients = || {
        let (_, s) = c.http_get("/metrics/summary");
        s.split("Clients: ")
            .nth(1)
            .and_then(|n| n.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let before = clients();
    let client = c.client();
    client.put("k", b"v", &one()).unwrap();
    assert_eq!(clients(), before + 1);
    drop(client);
    assert!(
        wait_until(Duration::from_secs(5), || clients() == before),
        "the master still counts the client that left"
    );
    assert!(
        !c.master().log().contains("client expired"),
        "{}",
        c.master().log()
    );
}

/// Sum of one metric (exact sample name, labels included) over every store.
fn stores_metric(c: &Cluster, name: &str) -> f64 {
    (0..c.stores.len())
        .map(|i| c.store_metric(i, name).unwrap_or(0.0))
        .sum()
}

fn describes(c: &Cluster) -> f64 {
    c.master_metric("rbgctl_master_requests_total{op=\"get_replicas\"}")
        .unwrap_or(0.0)
}

fn leased(c: &Cluster) -> bool {
    wait_until(Duration::from_secs(10), || {
        (0..c.stores.len()).all(|i| c.store_metric(i, "rbgctl_store_read_lease") == Some(1.0))
    })
}

const PUT_STARTS: &str = "rbgctl_master_requests_total{op=\"batch_put_start\"}";

#[test]
fn a_put_into_a_reservation_takes_one_master_round_trip_and_never_undoes_a_newer_value() {
    let c = Cluster::start(Opts::default());
    let writer = c.client();
    let other = c.client();
    // The first put of a size starts, writes and commits; its commit reserves for the next.
    writer.put("rsv/0", &value(4096, 0), &one()).unwrap();
    let starts = c.master_metric(PUT_STARTS).unwrap_or(0.0);
    let before = writer.breakdown();
    for i in 1..=20u8 {
        writer
            .put(&format!("rsv/{i}"), &value(4096, i), &one())
            .unwrap();
    }
    let spent = writer.breakdown().since(&before);
    assert_eq!(spent.master.calls, 20, "one master round trip per put");
    assert_eq!(
        c.master_metric(PUT_STARTS).unwrap_or(0.0),
        starts,
        "no put was started"
    );
    assert!(
        c.master_metric("rbgctl_master_reserved_puts_total")
            .unwrap()
            >= 20.0
    );
    for i in 0..=20u8 {
        assert_eq!(other.get(&format!("rsv/{i}")).unwrap(), value(4096, i));
    }

    // Another client puts a newer value of a key after the writer's reservation was made;
    // the writer's own later put of it still wins, being later (its commit is refused as
    // older than the key's value, and the put is made again without a reservation).
    other.put("rsv/1", &value(4096, 101), &one()).unwrap();
    writer.put("rsv/1", &value(4096, 102), &one()).unwrap();
    assert_eq!(other.get("rsv/1").unwrap(), value(4096, 102));
    assert_eq!(writer.get("rsv/1").unwrap(), value(4096, 102));
    // Reservations are handed back or expire; none is left once the writers are gone.
    drop((writer, other));
    assert!(
        wait_until(Duration::from_secs(10), || c
            .master_metric("rbgctl_master_put_reservations")
            == Some(0.0)),
        "clients that left hold no reservations"
    );
}

#[test]
fn a_restarted_master_allocates_nothing_while_its_predecessors_reservations_may_be_written() {
    // Reservations usable for 3 s: one outlives the master that made it.
    let mut c = Cluster::start(Opts {
        stores: 1,
        master: MasterConfig {
            put_reservation_ttl_ms: Millis(Duration::from_secs(3)),
            ..MasterConfig::default()
        },
        ..Opts::default()
    });
    let a = c.client();
    a.put("rst/a1", &value(4096, 1), &one()).unwrap();
    c.restart_master();
    let b = c.client();
    // B's put waits until no reservation of the killed master can be started into, so it
    // cannot be given the space A still holds a reservation on...
    assert!(wait_until(Duration::from_secs(15), || b
        .put("rst/b", &value(4096, 2), &one())
        .is_ok()));
    // ...and A's next put, past its reservation's TTL, takes the usual way.
    a.put("rst/a2", &value(4096, 3), &one()).unwrap();
    assert_eq!(
        b.get("rst/b").unwrap(),
        value(4096, 2),
        "B's value is intact"
    );
    assert_eq!(b.get("rst/a2").unwrap(), value(4096, 3));
    assert!(wait_until(Duration::from_secs(15), || b
        .get("rst/a1")
        .is_ok()));
    assert_eq!(b.get("rst/a1").unwrap(), value(4096, 1));
}

#[test]
fn remembered_locations_skip_the_master_and_never_serve_a_replaced_or_removed_value() {
    let c = Cluster::start(Opts::default());
    assert!(leased(&c), "the master renews every store's read lease");
    let writer = c.client();
    let reader = c.client();
    let v1 = value(4096, 1);
    writer.put("loc/k", &v1, &one()).unwrap();
    assert_eq!(
        reader.get("loc/k").unwrap(),
        v1,
        "first get: asks the master"
    );

    let (d0, r0) = (describes(&c), stores_metric(&c, VERSION_READS));
    for _ in 0..20 {
        assert_eq!(reader.get("loc/k").unwrap(), v1);
    }
    let mut buf = vec![0u8; 8192];
    assert_eq!(
        writer.get_into("loc/k", &mut buf).unwrap(),
        4096,
        "the writer remembers its put"
    );
    assert_eq!(&buf[..4096], &v1[..]);
    assert_eq!(describes(&c), d0, "remembered gets did not ask the master");
    assert_eq!(
        stores_metric(&c, VERSION_READS) - r0,
        21.0,
        "each was one store read"
    );

    // Replaced by another client: the acknowledged new value, never the old one.
    let v2 = value(4096, 2);
    writer.put("loc/k", &v2, &one()).unwrap();
    let stale = stores_metric(&c, "rbgctl_store_stale_reads_total");
    assert_eq!(reader.get("loc/k").unwrap(), v2, "never the replaced value");
    assert!(
        stores_metric(&c, "rbgctl_store_stale_reads_total") > stale,
        "the store refused the remembered location of the old version"
    );
    // Removed by another client (the reader's get holds a lease: forced).
    writer.remove("loc/k", true).unwrap();
    assert!(
        matches!(reader.get("loc/k"), Err(ClientError::NotFound(_))),
        "never a removed value"
    );
}

const VERSION_READS: &str = "rbgctl_store_requests_total{op=\"read_version\"}";

#[test]
fn a_batch_get_reads_remembered_locations_and_asks_the_master_only_for_the_rest() {
    let c = Cluster::start(Opts::default());
    assert!(leased(&c));
    let writer = c.client();
    let reader = c.client();
    let keys: Vec<String> = (0..8).map(|i| format!("bloc/{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = (0..8u8).map(|i| value(65_536, i)).collect();
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    assert!(writer
        .batch_put(&keys, &refs, &one())
        .iter()
        .all(Result::is_ok));
    let batch_describes = || {
        c.master_metric("rbgctl_master_requests_total{op=\"batch_get_replicas\"}")
            .unwrap_or(0.0)
    };
    let got = |r: Vec<Result<Vec<u8>, ClientError>>| -> Vec<Vec<u8>> {
        r.into_iter().map(Result::unwrap).collect()
    };
    assert_eq!(
        got(reader.batch_get(&keys)),
        values,
        "first batch: asks the master"
    );
    let asked = batch_describes();
    let reads = stores_metric(&c, VERSION_READS);
    assert_eq!(got(reader.batch_get(&keys)), values);
    let mut bufs = vec![vec![0u8; 65_536]; 8];
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    let lens = writer.batch_get_into(&keys, &mut slices);
    assert!(lens.iter().all(|n| *n.as_ref().unwrap() == 65_536));
    assert_eq!(bufs, values, "the writer remembers its batch put");
    assert_eq!(
        batch_describes(),
        asked,
        "remembered batches did not ask the master"
    );
    assert_eq!(stores_metric(&c, VERSION_READS) - reads, 16.0);

    // One key replaced, one removed, one new: only those go to the master; never old values.
    let v3 = value(65_536, 33);
    writer.put(keys[3], &v3, &one()).unwrap();
    writer.remove(keys[5], true).unwrap();
    let mut with_new = keys.clone();
    with_new.push("bloc/new");
    writer.put("bloc/new", &value(100, 9), &one()).unwrap();
    let r = reader.batch_get(&with_new);
    assert_eq!(r[3].as_ref().unwrap(), &v3, "never the replaced value");
    assert!(matches!(r[5], Err(ClientError::NotFound(_))), "{:?}", r[5]);
    assert_eq!(r[8].as_ref().unwrap(), &value(100, 9));
    for i in [0, 1, 2, 4, 6, 7] {
        assert_eq!(r[i].as_ref().unwrap(), &values[i]);
    }
    assert_eq!(
        batch_describes(),
        asked + 1.0,
        "one master round trip for the rest"
    );
}

#[test]
fn a_remembered_location_of_an_evicted_value_never_shadows_its_new_value() {
    // Two 4 MiB stores, 64 KiB objects: about 115 fit under the watermark.
    let c = Cluster::start(Opts {
        stores: 2,
        segment: 4 << 20,
        master: MasterConfig {
            default_kv_lease_ttl_ms: Millis(Duration::from_millis(1)),
            ..MasterConfig::default()
        },
    });
    assert!(leased(&c));
    let writer = c.client();
    let reader = c.client();
    let old = value(65_536, 3);
    writer.put("evl/k", &old, &one()).unwrap();
    assert_eq!(
        reader.get("evl/k").unwrap(),
        old,
        "the reader remembers where it is"
    );
    let filler = value(65_536, 4);
    let gone = || c.http_get("/api/v1/objects?key=evl/k").0 == 404;
    let mut filled = 0;
    while !gone() && filled < 400 {
        writer
            .put(&format!("evl/fill/{filled}"), &filler, &one())
            .unwrap();
        filled += 1;
    }
    assert!(
        gone() && filled > 50,
        "the old value was evicted after {filled} puts"
    );
    let new = value(65_536, 5);
    writer.put("evl/k", &new, &one()).unwrap();
    let stale = stores_metric(&c, "rbgctl_store_stale_reads_total");
    assert_eq!(
        reader.get("evl/k").unwrap(),
        new,
        "never the evicted value after the new one"
    );
    assert!(
        stores_metric(&c, "rbgctl_store_stale_reads_total") > stale,
        "the reader tried its remembered location, and the store refused it"
    );
}

#[test]
fn a_store_serves_remembered_locations_only_while_the_master_renews_its_lease() {
    let mut c = Cluster::start(Opts {
        stores: 1,
        ..Opts::default()
    });
    assert!(leased(&c));
    let client = c.client();
    let v = value(4096, 6);
    client.put("lease/k", &v, &one()).unwrap();
    c.master_mut().kill();
    // Without the master, the lease runs out (2 s) and the store refuses cached locations.
    assert!(
        wait_until(Duration::from_secs(10), || c
            .store_metric(0, "rbgctl_store_read_lease")
            == Some(0.0)),
        "the store's read lease ran out without the master"
    );
    let refused = c
        .store_metric(0, "rbgctl_store_stale_reads_total")
        .unwrap_or(0.0);
    assert!(
        client.get("lease/k").is_err(),
        "no lease, no master: no answer"
    );
    assert!(
        c.store_metric(0, "rbgctl_store_stale_reads_total")
            .unwrap_or(0.0)
            > refused
    );
    // A new master: the store mounts again and is renewed once the master knows the segment.
    c.restart_master();
    assert!(leased(&c), "renewed by the new master");
}

/// One ping binds a connection to a client: the client stays known without another word for
/// as long as that connection is open, and expires a TTL after it closes.
#[test]
fn a_client_bound_by_a_ping_needs_no_heartbeat_until_its_connection_closes() {
    use rbgctl::transfer::message::PingReq;
    use rbgctl::transfer::{ConnOptions, Connection};
    let c = Cluster::start(Opts {
        stores: 0,
        master: MasterConfig {
            client_ttl_ms: Millis(Duration::from_millis(300)),
            ..MasterConfig::default()
        },
        ..Default::default()
    });
    let connect = || Connection::connect(&c.rpc, &ConnOptions::default()).unwrap();
    let ping = |conn: &mut Connection, client_id| {
        conn.call::<rpc::Ping>(&PingReq { client_id })
            .unwrap()
            .need_remount
    };
    let expired = || c.master_metric("rbgctl_master_expired_clients_total");
    let mut bound = connect();
    assert!(ping(&mut bound, 7), "a new client is news");
    assert_eq!(c.master_metric("rbgctl_master_bound_clients"), Some(1.0));
    // Another client pings once on a connection it then closes: it expires a TTL later, and
    // by then client 7 has said nothing for longer than that.
    let mut other = connect();
    assert!(ping(&mut other, 8));
    drop(other);
    assert!(wait_until(Duration::from_secs(5), || expired() == Some(1.0)));
    assert!(!ping(&mut connect(), 7), "client 7 is still known");
    // Its bound connection closes: it goes too.
    drop(bound);
    assert!(wait_until(Duration::from_secs(5), || expired() == Some(2.0)));
    assert_eq!(c.master_metric("rbgctl_master_bound_clients"), Some(0.0));
    assert!(ping(&mut connect(), 7), "client 7 expired");
}

/// A client whose master restarts hears of it from its heartbeat (the connection the master
/// closed) and binds a connection to the new master without being asked anything.
#[test]
fn an_idle_client_binds_itself_to_a_restarted_master() {
    let mut c = Cluster::start(Opts {
        stores: 0,
        ..Default::default()
    });
    let client = c.client();
    let bound = |c: &Cluster| c.master_metric("rbgctl_master_bound_clients");
    assert_eq!(bound(&c), Some(1.0), "connecting binds");
    c.restart_master();
    assert!(
        wait_until(Duration::from_secs(10), || bound(&c) == Some(1.0)),
        "the client never came back to the new master: {:?}",
        bound(&c)
    );
    assert!(!client.exists("k").unwrap());
}

/// Issue 66, item 3: tenants share one pool. The same key is an object of each tenant's own;
/// nobody lists, reads or clears another's; a put past a tenant's quota is refused with an
/// error naming it while another tenant goes on; a master killed and started again knows
/// every tenant's objects and bytes again from its stores, and takes a new tenants file
/// without a restart.
#[test]
fn tenants_keep_to_their_namespaces_and_quotas_across_a_master_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    let quotas = |a: &str| {
        let text = format!("[[tenant]]\nname = \"a\"\nquota = \"{a}\"\n[[tenant]]\nname = \"b\"\n");
        // Written whole, then moved over the old one: the master never reads half a file.
        std::fs::write(dir.path().join("next.toml"), text).unwrap();
        std::fs::rename(dir.path().join("next.toml"), &file).unwrap();
    };
    quotas("1MiB");
    let mut c = Cluster::start(Opts {
        stores: 1,
        master: MasterConfig {
            tenants_file: Some(file.clone()),
            ..MasterConfig::default()
        },
        ..Default::default()
    });
    let (default, a, b) = (c.client(), c.client_as("a"), c.client_as("b"));
    for (client, v) in [(&default, "default's"), (&a, "a's"), (&b, "b's")] {
        client.put("k", v.as_bytes(), &one()).unwrap();
    }
    default.put("only-default", b"x", &one()).unwrap();
    for (client, v) in [(&default, "default's"), (&a, "a's"), (&b, "b's")] {
        assert_eq!(client.get("k").unwrap(), v.as_bytes());
    }
    assert!(!a.exists("only-default").unwrap());
    assert_eq!(a.keys("", 10).unwrap().0, ["k"]);
    assert_eq!(default.keys("", 10).unwrap().0, ["k", "only-default"]);
    // A key that would reach into another namespace is refused before it leaves the client.
    let e = a.get("\u{1}b\u{1}k").unwrap_err();
    assert!(e.to_string().contains("0x01"), "{e}");

    // a's quota: 600 KiB fit, 600 more do not; b is not held back meanwhile.
    a.put("big/0", &value(600 << 10, 1), &one()).unwrap();
    let e = a.put("big/1", &value(600 << 10, 2), &one()).unwrap_err();
    assert_eq!(e.status(), Some(Status::QuotaExceeded), "{e}");
    assert!(
        e.to_string()
            .contains("\"big/1\" (tenant a): the put would take its tenant past its quota"),
        "{e}"
    );
    b.put("big/1", &value(2 << 20, 3), &one()).unwrap();
    let z = c.client_as("z");
    let e = z.put("k", b"v", &one()).unwrap_err();
    assert_eq!(e.status(), Some(Status::TenantNotRegistered), "{e}");
    assert_eq!(
        z.keys("", 1).unwrap_err().status(),
        Some(Status::TenantNotRegistered)
    );

    // The admin API and the metrics, by tenant.
    let (code, body) = c.http_get("/api/v1/keys?tenant=a");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["keys"], serde_json::json!(["big/0", "k"]));
    let (_, body) = c.http_get("/api/v1/keys");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["keys"], serde_json::json!(["k", "only-default"]));
    let (code, _) = c.http_get("/api/v1/objects?key=big/0");
    assert_eq!(code, 404, "a's object is not the default tenant's");
    let (code, _) = c.http_get("/api/v1/objects?key=big/0&tenant=a");
    assert_eq!(code, 200);
    let a_bytes = ((600 << 10) + 3) as f64;
    let used_a = r#"rbgctl_master_tenant_used_bytes{tenant="a"}"#;
    assert_eq!(c.master_metric(used_a), Some(a_bytes));
    assert_eq!(
        c.master_metric(r#"rbgctl_master_tenant_quota_refusals_total{tenant="a"}"#),
        Some(1.0)
    );

    // kill -9 and start again: the stores report every tenant's objects.
    c.restart_master();
    assert!(
        wait_until(Duration::from_secs(20), || c.master_metric(used_a)
            == Some(a_bytes)),
        "the restarted master learns a's bytes again: {:?}",
        c.master_metric(used_a)
    );
    let a = c.client_as("a");
    assert_eq!(a.get("k").unwrap(), b"a's");
    assert_eq!(c.client().get("k").unwrap(), b"default's");
    let e = a.put("big/1", &value(600 << 10, 2), &one()).unwrap_err();
    assert_eq!(e.status(), Some(Status::QuotaExceeded), "{e}");

    // A new tenants file is taken without a restart.
    quotas("2MiB");
    assert!(
        wait_until(Duration::from_secs(20), || c
            .master_metric(r#"rbgctl_master_tenant_quota_bytes{tenant="a"}"#)
            == Some((2 << 20) as f64)),
        "the master reads the new quota"
    );
    a.put("big/1", &value(600 << 10, 2), &one()).unwrap();

    // Clearing a namespace leaves the others.
    assert_eq!(a.remove_all(true).unwrap(), 3);
    assert!(!a.exists("k").unwrap());
    assert_eq!(c.client_as("b").get("k").unwrap(), b"b's");
    assert_eq!(c.client().get("k").unwrap(), b"default's");
}

/// Issue 67, item 6: a rolling recreate of three stores that hand their objects over before
/// they go (`hand_over_secs`): 2,000 objects put, then each store in turn stopped with SIGTERM
/// (it has the master copy its objects to the others, then unmounts) and a new, empty store
/// started in its place. Every object reads back byte for byte from the three new stores; a
/// store stopped without a hand-over would have taken a third of them along.
#[test]
fn a_rolling_recreate_of_stores_that_hand_over_loses_no_object() {
    use rbgctl::config::ByteSize;
    let mut c = Cluster::start(Opts {
        stores: 0,
        master: MasterConfig {
            // Paced as fast as loopback goes: the test counts objects, not seconds.
            hand_over_bytes_per_sec: ByteSize(0),
            ..MasterConfig::default()
        },
        ..Default::default()
    });
    let hand_over = |cfg: &mut rbgctl::store::config::StoreConfig| cfg.hand_over_secs = 60;
    for _ in 0..3 {
        let i = c.add_store_with(64 << 20, hand_over);
        assert!(c.wait_store_mounted(i));
    }
    let client = c.client();
    let n = 2000u32;
    let size = |i: u32| 1000 + (i as usize * 37) % 15_000;
    for i in 0..n {
        client
            .put(&format!("kv/{i}"), &value(size(i), i as u8), &one())
            .unwrap();
    }
    let on = |c: &Cluster, store: &str| {
        (0..n)
            .step_by(50)
            .filter(|i| {
                c.replica_segments(&format!("kv/{i}"))
                    .iter()
                    .any(|s| s == store)
            })
            .count()
    };
    // Clients keep reading throughout, and writing new keys: not one read may fail.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, client) = (stop.clone(), c.client());
        std::thread::spawn(move || {
            let (mut reads, mut puts) = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let i = (reads * 7919) % n;
                let got = client.get(&format!("kv/{i}"));
                assert_eq!(
                    got.ok(),
                    Some(value(size(i), i as u8)),
                    "kv/{i} during the recreate"
                );
                reads += 1;
                if reads % 10 == 0 {
                    client
                        .put(&format!("new/{puts}"), &value(4096, puts as u8), &one())
                        .unwrap();
                    puts += 1;
                }
            }
            (reads, puts)
        })
    };
    let mut took = Vec::new();
    for old in 0..3 {
        let name = c.stores[old].config.name.clone().unwrap();
        assert!(on(&c, &name) > 0, "store {name} holds some of the objects");
        let t = Instant::now();
        let exit = c.stores[old].sigterm_exits_within(Duration::from_secs(90));
        assert!(
            exit.is_some_and(|s| s.success()),
            "store {name} stops: {exit:?}"
        );
        took.push(t.elapsed());
        let log = c.stores[old].log();
        assert!(log.contains("hand-over to the other stores ended"), "{log}");
        assert!(
            log.contains("state=\"done\"") || log.contains("state=done"),
            "{log}"
        );
        let new = c.add_store_with(64 << 20, hand_over);
        assert!(c.wait_store_mounted(new));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, puts) = load.join().expect("no read failed under the recreate");
    assert!(reads > 0 && puts > 0);
    let reader = c.client();
    for i in 0..puts {
        assert_eq!(
            reader.get(&format!("new/{i}")).unwrap(),
            value(4096, i as u8)
        );
    }
    for i in 0..n {
        assert_eq!(
            reader.get(&format!("kv/{i}")).unwrap(),
            value(size(i), i as u8),
            "kv/{i}"
        );
    }
    let (code, drains) = c.http_get("/api/v1/drains");
    assert_eq!(code, 200);
    assert_eq!(drains.matches("\"state\":\"done\"").count(), 3, "{drains}");
    let moved = c
        .master_metric("rbgctl_master_hand_over_objects_total")
        .unwrap_or(0.0);
    let bytes = c
        .master_metric("rbgctl_master_hand_over_bytes_total")
        .unwrap_or(0.0);
    assert!(
        moved >= n as f64,
        "every object moved at least once: {moved}"
    );
    let secs: f64 = took.iter().map(Duration::as_secs_f64).sum();
    println!(
        "hand-over: {moved} objects ({:.1} MB) moved in {secs:.2} s over three stores \
         ({:.0} objects/s); per store {:?}; meanwhile {reads} reads and {puts} puts",
        bytes / 1e6,
        moved / secs,
        took
    );
}
