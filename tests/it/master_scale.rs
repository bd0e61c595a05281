//! The master holding many objects: nothing it does at rest grows with their number.

use crate::common;

use common::*;
use rbgctl::bench::kit::procfs::cpu_time;
use rbgctl::client::ReplicateConfig;
use std::time::{Duration, Instant};

#[test]
fn a_master_holding_200000_objects_is_idle_at_rest() {
    const OBJECTS: usize = 200_000;
    const BATCH: usize = 2_000;
    let c = Cluster::start(Opts {
        stores: 1,
        segment: 256 << 20,
        ..Default::default()
    });
    let client = c.client();
    let value = [7u8; 64];
    let one = ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    for b in 0..OBJECTS / BATCH {
        let keys: Vec<String> = (0..BATCH)
            .map(|i| format!("scale/{:064}", b * BATCH + i))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values: Vec<&[u8]> = vec![&value[..]; BATCH];
        let results = client.batch_put(&refs, &values, &one);
        assert!(results.iter().all(Result::is_ok), "batch {b} failed");
    }
    drop(client);
    assert_eq!(
        c.master_metric("rbgctl_master_keys"),
        Some(OBJECTS as f64),
        "every object is held"
    );

    // At rest: housekeeping runs every 50 ms and a scrape asks for the summary, but neither
    // walks the objects (before, one walk per tick cost about 6 % of a core at this count in a
    // release build, several times that in this debug build).
    let pid = c.master().pid().expect("the master runs");
    let window = Duration::from_secs(3);
    let (cpu0, t0) = (cpu_time(pid).expect("the master runs"), Instant::now());
    std::thread::sleep(window / 2);
    assert_eq!(c.master_metric("rbgctl_master_keys"), Some(OBJECTS as f64));
    std::thread::sleep(window / 2);
    let share =
        (cpu_time(pid).expect("the master runs") - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
    eprintln!(
        "master CPU at rest with {OBJECTS} objects: {:.2} % of a core",
        share * 100.0
    );
    assert!(
        share < 0.03,
        "the master used {:.1} % of a core at rest with {OBJECTS} objects",
        share * 100.0
    );
}

#[test]
fn a_large_segment_serves_at_once_and_its_pages_are_faulted_in_behind() {
    const SEGMENT: u64 = 2 << 30;
    let t0 = Instant::now();
    // Returns once the store has mounted its segment.
    let c = Cluster::start(Opts {
        stores: 1,
        segment: SEGMENT,
        ..Default::default()
    });
    let mounted = t0.elapsed();
    eprintln!(
        "a {SEGMENT}-byte segment mounted {} ms after start",
        mounted.as_millis()
    );
    assert!(
        mounted < Duration::from_secs(2),
        "mounting took {mounted:?} (pages faulted in first?)"
    );
    let client = c.client();
    let one = ReplicateConfig::default();
    client.put("early", &[5u8; 1 << 20], &one).unwrap();
    assert_eq!(client.get("early").unwrap(), vec![5u8; 1 << 20]);
    assert!(
        wait_until(Duration::from_secs(60), || c
            .store_metric(0, "rbgctl_store_segment_prefaulted_bytes")
            == Some(SEGMENT as f64)),
        "the pages were not faulted in behind"
    );
    assert_eq!(
        client.get("early").unwrap(),
        vec![5u8; 1 << 20],
        "and kept their bytes"
    );
}

/// Issue 41: `prefault = false` leaves the pages to fault in on their first write (as a
/// benchmark of fresh memory needs): nothing faulted in behind, the metric says no prefault
/// runs, and the store serves as usual.
#[test]
fn a_store_told_not_to_prefault_leaves_its_pages_to_their_first_write() {
    let mut c = Cluster::start(Opts {
        stores: 0,
        ..Default::default()
    });
    let i = c.add_store_with(64 << 20, |cfg| cfg.prefault = false);
    assert!(c.wait_store_mounted(i), "the store mounts");
    assert_eq!(
        c.store_metric(i, "rbgctl_store_segment_prefault_ended"),
        Some(1.0),
        "no prefault runs"
    );
    let client = c.client();
    client
        .put("fresh", &[9u8; 1 << 20], &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.get("fresh").unwrap(), vec![9u8; 1 << 20]);
    assert_eq!(
        c.store_metric(i, "rbgctl_store_segment_prefaulted_bytes"),
        Some(0.0),
        "nothing was faulted in behind"
    );
}
