//! The disk tier with real processes: a master and a store whose memory is too small for the
//! objects put, with a disk tier on the repository's own filesystem (so `O_DIRECT` is used).
//! Memory's evictions go to disk and read back byte-exact; a hit promotes; the disk tier's own
//! eviction drops the least recently used; a kill -9 keeps both tiers; a corrupted disk record
//! is caught and dropped; a full disk tier degrades to dropping, never to failed puts.

use crate::common;

use common::{wait_until, Cluster, Opts};
use rbgctl::client::{Client, ReplicateConfig};
use rbgctl::config::{ByteSize, Millis};
use rbgctl::master::config::MasterConfig;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const VALUE: usize = 256 << 10;

/// A directory on the disk the repository is on (not tmpfs).
fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("disk-tier")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// A value that names its key, 256 KiB.
fn value(i: usize) -> Vec<u8> {
    format!("value {i} / ")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(VALUE)
        .collect()
}

/// A master and one store (`memory` bytes, and a disk tier of `disk` bytes in `dir`).
fn cluster(master: MasterConfig, memory: u64, disk: u64, dir: &Path) -> Cluster {
    let mut c = Cluster::start(Opts {
        stores: 0,
        master,
        ..Opts::default()
    });
    let dir = dir.to_path_buf();
    c.add_store_with(memory, move |s| {
        s.disk_tier = Some(dir);
        s.disk_tier_size = ByteSize(disk);
    });
    assert!(
        wait_until(Duration::from_secs(10), || c.segment_count() == 2),
        "the store's memory and disk segments mount"
    );
    c
}

/// Puts `n` values and waits until no copy between tiers is under way.
fn fill(c: &Cluster, client: &Client, n: usize) {
    for i in 0..n {
        client
            .put(&format!("k{i}"), &value(i), &ReplicateConfig::default())
            .unwrap_or_else(|e| panic!("put k{i}: {e}"));
    }
    settle(c);
}

fn settle(c: &Cluster) {
    assert!(
        wait_until(Duration::from_secs(20), || {
            c.master_metric("rbgctl_master_tier_moves_in_flight") == Some(0.0)
        }),
        "copies between tiers finish"
    );
}

/// The tier `key` lives in, by the admin API ("memory" or "disk"), without reading it.
fn tier(c: &Cluster, key: &str) -> String {
    c.object(key)["current"]["tier"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn tiers(c: &Cluster, n: usize) -> Vec<String> {
    (0..n).map(|i| tier(c, &format!("k{i}"))).collect()
}

#[test]
fn memory_gives_objects_to_the_disk_tier_they_read_back_byte_exact_and_a_hit_promotes() {
    let dir = disk_dir();
    // Short read leases: objects read (and so promoted) may go back to disk soon after.
    let master = MasterConfig {
        default_kv_lease_ttl_ms: Millis(Duration::from_millis(500)),
        ..MasterConfig::default()
    };
    let c = cluster(master, 8 * MIB, 64 * MIB, dir.path());
    let client = c.client();
    // 16 MiB into 8 MiB of memory.
    fill(&c, &client, 64);
    assert_eq!(
        c.master_metric("rbgctl_master_evicted_objects_total"),
        Some(0.0),
        "nothing dropped"
    );
    let demoted = c.master_metric("rbgctl_master_demotions_total").unwrap();
    assert!(demoted >= 32.0, "{demoted} demotions");
    let before = tiers(&c, 64);
    assert_eq!(before[0], "disk", "the oldest went to disk: {before:?}");
    assert_eq!(before[63], "memory");
    let r = &c.object("k0")["current"]["replicas"][0];
    assert_eq!(
        (r["tier"].as_str(), r["segment"].as_str()),
        (Some("disk"), Some("store-0/disk"))
    );
    assert_eq!(
        c.store_metric(0, "rbgctl_store_demotions_total"),
        Some(demoted)
    );
    // A read of a disk-resident object is served from disk, then promotes it.
    assert_eq!(client.get("k0").unwrap(), value(0));
    assert!(c.store_metric(0, "rbgctl_store_disk_reads_total").unwrap() >= 1.0);
    assert!(
        wait_until(Duration::from_secs(10), || tier(&c, "k0") == "memory"),
        "promoted on its first hit"
    );
    assert!(c.master_metric("rbgctl_master_promotions_total").unwrap() >= 1.0);
    // Every object, whichever tier it is in, reads back byte-exact.
    for i in 0..64 {
        assert_eq!(client.get(&format!("k{i}")).unwrap(), value(i), "k{i}");
    }
    let (_, body) = c.http_get("/metrics");
    assert!(
        body.contains("rbgctl_master_tier_keys{tier=\"disk\"}"),
        "{body}"
    );
    // Promotions filled memory past its watermark; once the reads' leases end, eviction
    // brings it back under by demoting again.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s = c.status()["summary"].clone();
            s["used_bytes"].as_f64().unwrap() <= 0.9 * (8 * MIB) as f64
                && s["demoting_bytes"].as_u64() == Some(0)
        }),
        "memory back under its watermark: {}",
        c.status()
    );
    assert_eq!(
        c.master_metric("rbgctl_master_evicted_objects_total"),
        Some(0.0),
        "still nothing dropped"
    );
}

#[test]
fn a_store_killed_with_objects_in_both_tiers_serves_each_from_its_tier_after_restart() {
    let dir = disk_dir();
    let mut c = cluster(MasterConfig::default(), 8 * MIB, 64 * MIB, dir.path());
    let client = c.client();
    fill(&c, &client, 48);
    let before = tiers(&c, 48);
    assert!(before.contains(&"disk".to_string()) && before.contains(&"memory".to_string()));
    c.stores[0].kill();
    c.restart_store(0);
    assert!(c.wait_store_mounted(0));
    assert!(
        wait_until(Duration::from_secs(15), || c.segment_count() == 2),
        "both segments live again"
    );
    assert_eq!(tiers(&c, 48), before, "every object in the tier it was in");
    for i in 0..48 {
        assert_eq!(client.get(&format!("k{i}")).unwrap(), value(i), "k{i}");
    }
    assert_eq!(
        c.master_metric("rbgctl_master_lost_objects_total"),
        Some(0.0)
    );
}

#[test]
fn a_corrupted_disk_record_is_caught_and_dropped_never_served() {
    let dir = disk_dir();
    let c = cluster(MasterConfig::default(), 8 * MIB, 64 * MIB, dir.path());
    let client = c.client();
    fill(&c, &client, 48);
    assert_eq!(tier(&c, "k1"), "disk");
    let offset = c.object("k1")["current"]["replicas"][0]["offset"]
        .as_u64()
        .unwrap();
    let file = dir.path().join("store-0-disk.disk");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(b"CORRUPTED", offset + 1000).unwrap();
        f.sync_all().unwrap();
    }
    assert!(
        client.get("k1").is_err(),
        "corrupt bytes are never returned"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !client.exists("k1").unwrap()),
        "the corrupt replica (the only one) is dropped"
    );
    assert!(
        c.master_metric("rbgctl_master_corrupt_replicas_total")
            .unwrap()
            >= 1.0
    );
    assert_eq!(
        client.get("k2").unwrap(),
        value(2),
        "its neighbours are untouched"
    );
}

#[test]
fn a_full_disk_tier_drops_its_least_recently_used_and_puts_never_fail() {
    let dir = disk_dir();
    // 4 MiB of memory and 2 MiB of disk for 25 MiB of values.
    let c = cluster(MasterConfig::default(), 4 * MIB, 2 * MIB, dir.path());
    let client = c.client();
    fill(&c, &client, 100);
    assert!(
        c.master_metric("rbgctl_master_disk_evicted_objects_total")
            .unwrap()
            > 0.0
    );
    let (_, body) = c.http_get("/api/v1/status");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let disk_used = status["summary"]["disk_used_bytes"].as_u64().unwrap();
    assert!(disk_used <= 2 * MIB, "{status}");
    // The disk holds the most recently demoted objects: the first ones went.
    assert!(!client.exists("k0").unwrap());
    let on_disk: Vec<usize> = (0..100)
        .filter(|i| {
            let (code, body) = c.http_get(&format!("/api/v1/objects?key=k{i}"));
            code == 200 && body.contains("\"tier\":\"disk\"")
        })
        .collect();
    assert!(!on_disk.is_empty());
    assert!(
        on_disk.iter().all(|i| *i >= 50),
        "oldest dropped first: {on_disk:?}"
    );
    for i in 90..100 {
        assert_eq!(client.get(&format!("k{i}")).unwrap(), value(i));
    }
}

#[test]
fn a_missing_disk_tier_directory_is_a_start_up_error_that_names_the_fix() {
    let dir = disk_dir();
    let c = cluster(MasterConfig::default(), 4 * MIB, 4 * MIB, dir.path());
    let missing = dir.path().join("nope");
    let (ok, err) = c.run_store_expecting_exit(0, |s| {
        s.name = Some("other".into());
        s.port = 0;
        s.metrics_port = 0;
        s.disk_tier_port = 0;
        s.disk_tier = Some(missing);
    });
    assert!(!ok);
    assert!(
        err.contains("does not exist") && err.contains("--disk-tier"),
        "{err}"
    );
}

#[test]
fn large_values_of_odd_sizes_read_back_from_disk_byte_exact() {
    let dir = disk_dir();
    let c = cluster(MasterConfig::default(), 8 * MIB, 64 * MIB, dir.path());
    let client = c.client();
    let big = |i: usize| -> Vec<u8> {
        let len = (1 << 20) + 777 + i * 4099;
        format!("big {i} / ")
            .into_bytes()
            .into_iter()
            .cycle()
            .take(len)
            .collect()
    };
    for i in 0..12 {
        client
            .put(&format!("big{i}"), &big(i), &ReplicateConfig::default())
            .unwrap();
    }
    settle(&c);
    assert_eq!(tier(&c, "big0"), "disk");
    let before = c.store_metric(0, "rbgctl_store_disk_reads_total").unwrap();
    for i in 0..12 {
        assert_eq!(client.get(&format!("big{i}")).unwrap(), big(i), "big{i}");
    }
    assert!(c.store_metric(0, "rbgctl_store_disk_reads_total").unwrap() > before);
    assert_eq!(
        c.master_metric("rbgctl_master_evicted_objects_total"),
        Some(0.0),
        "values larger than any freed extent waited for room rather than dropping others"
    );
}

#[test]
fn a_same_host_client_reads_the_disk_tier_file_itself() {
    let dir = disk_dir();
    let master = MasterConfig {
        promotion_on_hit: false,
        ..MasterConfig::default()
    };
    let c = cluster(master, 8 * MIB, 64 * MIB, dir.path());
    fill(&c, &c.client(), 48);
    assert_eq!(tier(&c, "k0"), "disk");
    let local =
        rbgctl::client::Client::connect(rbgctl::client::ClientConfig::new(c.rpc.clone())).unwrap();
    let before = c.store_metric(0, "rbgctl_store_disk_reads_total").unwrap();
    for i in 0..48 {
        assert_eq!(local.get(&format!("k{i}")).unwrap(), value(i), "k{i}");
    }
    assert_eq!(
        c.store_metric(0, "rbgctl_store_disk_reads_total"),
        Some(before),
        "the store served no disk read: the client read the file"
    );
    // Once the store is gone, its file is not read: the client is told, never given stale bytes.
    let mut c = c;
    c.stores[0].kill();
    assert!(local.get("k0").is_err());
}
