use super::*;
use crate::config::{ByteSize, Millis};
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{
    MoveItem, MoveKind, ObjectDesc, Reach, ReplicateConfig, SegmentInfo, StoredObject, Tier,
};
use std::sync::atomic::{AtomicU64, Ordering};

/// A master on the system clock whose draws are the same every run.
fn master(cfg: MasterConfig) -> MasterState {
    MasterState::new(cfg, Arc::new(SystemClock), fastrand::Rng::with_seed(7))
}

fn seg(name: &str, size: u64) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        endpoint: format!("{name}:1"),
        size,
        ..Default::default()
    }
}

fn grant_key() -> GrantKey {
    GrantKey::generate().unwrap()
}

fn state() -> (MasterState, Instant) {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    (st, t0)
}

const ONE: ReplicateConfig = ReplicateConfig {
    replica_num: 1,
    soft_pin: false,
    soft_pin_ttl_ms: 0,
    preferred_segment: String::new(),
    reach: Reach::Rbgctl,
};

#[test]
fn a_new_leader_does_not_deny_keys_its_stores_have_not_reported_yet() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    st.learn_for(Duration::from_secs(10), t0);
    let e = st.get_replicas("k", t0).unwrap_err();
    assert_eq!(e.0, Status::ObjectUnavailable, "{}", e.1);
    assert!(e.1.contains("took office"), "{}", e.1);
    // A persistent store reporting what it kept: still unsure after the window.
    let later = t0 + Duration::from_secs(11);
    let mut kept = seg("a", 1 << 20);
    kept.segment_uuid = 42;
    st.mount(1, kept, grant_key(), true, later).unwrap();
    let e = st.get_replicas("k", later).unwrap_err();
    assert_eq!(e.0, Status::ObjectUnavailable, "{}", e.1);
    assert!(e.1.contains("still reporting"), "{}", e.1);
    // Without either, an unknown key is a miss.
    let (mut fresh, t0) = state();
    assert_eq!(
        fresh.get_replicas("k", t0).unwrap_err().0,
        Status::ObjectNotFound
    );
}

#[test]
fn a_name_held_by_a_live_store_is_refused_and_its_objects_kept() {
    let (mut st, t0) = state();
    let (id, _) = st.put_start(7, "k", 100, &ONE, t0).unwrap();
    st.put_end(7, "k", id, Some(11), t0).unwrap();
    // Another store (other files) under the same name while store 1 heartbeats: refused.
    let other = SegmentInfo {
        shm_path: "/dev/shm/elsewhere/a.seg".into(),
        ..seg("a", 1 << 20)
    };
    let e = st
        .mount(2, other.clone(), grant_key(), false, t0)
        .unwrap_err();
    assert_eq!(e.0, Status::SegmentExists);
    assert!(e.1.contains("held by a running store at a:1"), "{}", e.1);
    assert_eq!(
        st.get_replicas("k", t0).unwrap().checksum,
        11,
        "objects kept"
    );
    assert!(!st.ping(1, t0), "the holder is still known");
    // Once the holder has stopped heartbeating for longer than the client TTL, the name
    // goes to the newcomer, and the old holder, if it still ran, is told to mount again.
    let later = t0 + Duration::from_secs(11);
    st.mount(2, other, grant_key(), false, later).unwrap();
    assert!(
        st.get_replicas("k", later).is_err(),
        "its objects went with its memory"
    );
    assert!(st.ping(1, later), "the old holder must mount again");
}

#[test]
fn the_same_store_restarting_on_its_own_files_takes_its_name_back_at_once() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let files = SegmentInfo {
        shm_path: "/dev/shm/rbgctl/a.seg".into(),
        host_id: "boot-1".into(),
        ..seg("a", 1 << 20)
    };
    st.mount(1, files.clone(), grant_key(), false, t0).unwrap();
    // kill -9 and restart: a new client id, the same files (the lock proved the old one gone).
    st.mount(2, files, grant_key(), false, t0).unwrap();
    assert!(st.ping(1, t0), "the dead holder is forgotten");
}

#[test]
fn a_put_is_invisible_until_it_ends_and_replaces_atomically() {
    let (mut st, t0) = state();
    let (id1, _) = st.put_start(7, "k", 100, &ONE, t0).unwrap();
    assert_eq!(
        st.get_replicas("k", t0).unwrap_err().0,
        Status::ReplicaNotReady
    );
    assert!(!st.exists("k", t0));
    st.put_end(7, "k", id1, Some(11), t0).unwrap();
    assert_eq!(st.get_replicas("k", t0).unwrap().checksum, 11);
    // A second put: readers keep seeing the first value until it ends.
    let (id2, _) = st.put_start(7, "k", 200, &ONE, t0).unwrap();
    assert_eq!(st.get_replicas("k", t0).unwrap().size, 100);
    assert_eq!(
        st.put_end(8, "k", id2, Some(22), t0).unwrap_err().0,
        Status::IllegalClient
    );
    st.put_end(7, "k", id2, Some(22), t0).unwrap();
    let d = st.get_replicas("k", t0).unwrap();
    assert_eq!((d.size, d.checksum), (200, 22));
    st.put_end(7, "k", id2, Some(22), t0).unwrap(); // idempotent
}

#[test]
fn a_reservation_becomes_the_value_of_the_key_its_commit_names() {
    let (mut st, t0) = state();
    let used = |st: &MasterState| st.segments().map(|s| s.alloc.used()).sum::<u64>();
    let r = st.reserve(7, &[128, 128], &ONE, t0);
    let (id, replicas) = r[0].clone().unwrap();
    assert_eq!(used(&st), 256, "reserved space is allocated");
    assert_eq!(st.summary(t0).reservations, 2);
    assert!(!st.exists("k", t0), "a reservation is no key's");
    assert_eq!(
        st.put_end(8, "k", id, Some(5), t0).unwrap_err().0,
        Status::IllegalClient,
        "only its holder commits it"
    );
    st.put_end(7, "k", id, Some(5), t0).unwrap();
    let d = st.get_replicas("k", t0).unwrap();
    assert_eq!((d.version, d.checksum, d.replicas), (id, 5, replicas));
    st.put_end(7, "k", id, Some(5), t0).unwrap(); // a retried commit is idempotent
    assert_eq!(st.counters.reserved_puts, 1);
    // The other one is handed back: its space is free at once.
    let (other, _) = r[1].clone().unwrap();
    st.put_revoke(7, "", other, t0).unwrap();
    assert_eq!(used(&st), 128);
    assert_eq!(st.summary(t0).reservations, 0);
}

#[test]
fn a_full_pool_evicts_for_a_put_but_not_for_a_reservation() {
    let mut st = master(MasterConfig {
        eviction_high_watermark_ratio: 1.0,
        ..MasterConfig::default()
    });
    let t0 = Instant::now();
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    for i in 0..16 {
        put(&mut st, &format!("k{i}"), 64 << 10, 1, t0);
    }
    let later = t0 + Duration::from_secs(60); // read leases over
    let r = st.reserve(7, &[64 << 10], &ONE, later);
    assert_eq!(r[0].clone().unwrap_err().0, Status::NoSpace);
    assert_eq!(
        st.summary(later).keys,
        16,
        "nothing evicted for a reservation"
    );
    st.put_start(7, "new", 64 << 10, &ONE, later).unwrap();
    assert!(st.summary(later).keys < 16, "a put evicts");
}

#[test]
fn a_reservation_older_than_the_keys_newest_value_cannot_replace_it() {
    let (mut st, t0) = state();
    let (old, _) = st.reserve(7, &[128], &ONE, t0)[0].clone().unwrap();
    let newer = put(&mut st, "k", 100, 1, t0);
    assert!(newer.version > old);
    assert_eq!(
        st.put_end(7, "k", old, Some(2), t0).unwrap_err().0,
        Status::WriteSuperseded
    );
    assert_eq!(
        st.get_replicas("k", t0).unwrap().checksum,
        1,
        "newer value kept"
    );
    assert_eq!(st.summary(t0).reservations, 0, "the reservation is used up");
    assert_eq!(
        st.put_end(7, "other", old, Some(2), t0).unwrap_err().0,
        Status::ObjectNotFound,
        "and cannot be committed again"
    );
}

#[test]
fn reservations_are_bounded_expire_and_go_with_their_client_or_segment() {
    let cfg = MasterConfig {
        put_reservation_max_bytes: crate::config::ByteSize(300),
        ..MasterConfig::default()
    };
    let mut st = master(cfg);
    let t0 = Instant::now();
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    let r = st.reserve(7, &[128, 128, 128], &ONE, t0);
    assert!(r[0].is_ok() && r[1].is_ok());
    assert_eq!(
        r[2].clone().unwrap_err().0,
        Status::NoSpace,
        "past the limit"
    );
    // Unused for twice the TTL: dropped; the space waits for the release timeout.
    let ttl = st.config().put_reservation_ttl_ms.0;
    st.housekeeping(t0 + ttl * 2 + Duration::from_millis(1));
    assert_eq!(st.summary(t0).reservations, 0);
    assert_eq!(st.counters.expired_reservations, 2);
    assert_eq!(st.summary(t0).deferred_bytes, 256);
    // A client that leaves takes its reservations with it.
    st.reserve(9, &[128], &ONE, t0)[0].clone().unwrap();
    st.leave(9, t0);
    assert_eq!(st.summary(t0).reservations, 0);
    // A segment that goes takes its replicas out of reservations: committing fails.
    let (id, _) = st.reserve(7, &[128], &ONE, t0)[0].clone().unwrap();
    let seg_id = st.segments().next().unwrap().id;
    st.unmount(1, seg_id, false, t0).unwrap();
    assert_eq!(
        st.put_end(7, "k", id, Some(1), t0).unwrap_err().0,
        Status::ReplicaNotReady
    );
    let off = master(MasterConfig {
        put_reservation_ttl_ms: Millis(Duration::ZERO),
        ..MasterConfig::default()
    })
    .reserve(7, &[128], &ONE, t0);
    assert_eq!(off[0].clone().unwrap_err().0, Status::InvalidParams, "off");
}

#[test]
fn abandoned_puts_are_preempted_then_reclaimed() {
    let (mut st, t0) = state();
    let (id, _) = st.put_start(7, "k", 1000, &ONE, t0).unwrap();
    assert_eq!(
        st.put_start(8, "k", 1000, &ONE, t0).unwrap_err().0,
        Status::PutInProgress
    );
    let later = t0 + Duration::from_secs(31);
    let (id2, _) = st.put_start(8, "k", 1000, &ONE, later).unwrap();
    assert_eq!(
        st.put_end(7, "k", id, Some(1), later).unwrap_err().0,
        Status::WriteSuperseded
    );
    st.put_end(8, "k", id2, Some(1), later).unwrap();
    // The zombie's space is held until the release timeout, then freed.
    assert_eq!(st.summary(later).deferred_bytes, 1024);
    let t = t0 + Duration::from_secs(601);
    st.ping(1, t); // the store stays alive
    st.housekeeping(t);
    assert_eq!(st.summary(t).deferred_bytes, 0);
    // A writer that stops heartbeating loses its unfinished put at expiry.
    st.ping(9, t);
    st.put_start(9, "z", 10, &ONE, t).unwrap();
    st.ping(1, t + Duration::from_secs(11));
    st.expire_clients(t + Duration::from_secs(11));
    assert!(st.lookup("z").is_none());
}

#[test]
fn a_client_holding_a_bound_connection_needs_no_heartbeat_until_it_closes() {
    let (mut st, t0) = state();
    let ttl = MasterConfig::default().client_ttl_ms.0;
    // A writer's first ping binds its connection, once; it starts a put and goes quiet.
    let (unknown, bound) = st.ping_on(9, None, t0);
    assert!(unknown, "a new client is news");
    let bound = bound.expect("a first ping binds its connection");
    assert_eq!(st.ping_on(9, Some(bound), t0), (false, None));
    st.put_start(9, "z", 10, &ONE, t0).unwrap();
    // A minute without a word from it (the store heartbeats): it stays, with its put.
    let minute = t0 + Duration::from_secs(60);
    st.ping(1, minute);
    assert_eq!(st.expire_clients(minute), 0);
    assert!(st.lookup("z").is_some());
    assert_eq!(st.summary(minute).bound_clients, 1);
    // Its connection closes: its TTL runs from then.
    st.unbind(bound, minute);
    assert_eq!(st.summary(minute).bound_clients, 0);
    st.ping(1, minute + ttl);
    assert_eq!(
        st.expire_clients(minute + ttl),
        0,
        "live for a TTL after it closed"
    );
    let after = minute + ttl + Duration::from_millis(1);
    st.ping(1, after);
    assert_eq!(st.expire_clients(after), 1);
    assert!(st.lookup("z").is_none(), "its unfinished put went with it");
}

#[test]
fn a_store_on_a_bound_connection_still_expires_when_its_heartbeats_stop() {
    // A paused store keeps its connection open: its segment must go away all the same.
    let (mut st, t0) = state();
    let (_, bound) = st.ping_on(1, None, t0);
    let bound = bound.expect("bound");
    let ttl = MasterConfig::default().client_ttl_ms.0;
    assert_eq!(st.expire_clients(t0 + ttl), 0);
    let after = t0 + ttl + Duration::from_millis(1);
    assert_eq!(st.expire_clients(after), 1);
    let s = st.summary(after);
    assert_eq!(
        (s.segments, s.capacity_bytes),
        (0, 0),
        "its segment is gone"
    );
    // Its connection closing later releases nothing and revives nothing.
    st.unbind(bound, after);
    assert_eq!(st.summary(after).clients, 0);
}

#[test]
fn a_binding_made_for_an_earlier_entry_of_a_client_binds_nothing() {
    let (mut st, t0) = state();
    let ttl = MasterConfig::default().client_ttl_ms.0;
    let (_, first) = st.ping_on(9, None, t0);
    let first = first.expect("bound");
    // It leaves, and comes back on another connection.
    st.leave(9, t0);
    let (unknown, second) = st.ping_on(9, None, t0);
    assert!(unknown, "after leaving it is new again");
    let second = second.expect("bound");
    assert_ne!(first, second);
    // The first connection closing does not unbind the second.
    st.unbind(first, t0);
    let later = t0 + ttl * 3;
    st.ping(1, later);
    assert_eq!(st.expire_clients(later), 0);
    // A ping on the first connection binds it anew.
    let (_, again) = st.ping_on(9, Some(first), later);
    assert_eq!(again, Some(second), "the current entry's binding");
    st.unbind(second, later);
    st.unbind(second, later);
    st.ping(1, later + ttl * 2);
    assert_eq!(
        st.expire_clients(later + ttl * 2),
        1,
        "both closed: it expires"
    );
}

#[test]
fn leases_and_removal() {
    let (mut st, t0) = state();
    let (id, _) = st.put_start(7, "k", 10, &ONE, t0).unwrap();
    st.put_end(7, "k", id, Some(0), t0).unwrap();
    st.get_replicas("k", t0).unwrap();
    assert_eq!(
        st.remove("k", false, t0).unwrap_err().0,
        Status::ObjectHasLease
    );
    assert_eq!(st.remove_all(DEFAULT_TENANT, false, t0), 0);
    assert_eq!(
        st.remove_all(DEFAULT_TENANT, false, t0 + Duration::from_secs(11)),
        1,
        "lease over"
    );
    assert_eq!(
        st.remove("k", false, t0).unwrap_err().0,
        Status::ObjectNotFound
    );
    assert_eq!(st.summary(t0).used_bytes, 0);
}

#[test]
fn full_pool_evicts_for_a_new_put_but_never_leased_objects() {
    // Watermark 1.0: only a failed allocation triggers eviction here.
    let cfg = MasterConfig {
        eviction_high_watermark_ratio: 1.0,
        ..MasterConfig::default()
    };
    let mut st = master(cfg);
    let t0 = Instant::now();
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    for i in 0..16 {
        let key = format!("k{i}");
        let (id, _) = st.put_start(7, &key, 64 << 10, &ONE, t0).unwrap();
        st.put_end(7, &key, id, Some(0), t0).unwrap();
    }
    // Everything is leased: no room, no eviction.
    for i in 0..16 {
        st.get_replicas(&format!("k{i}"), t0).unwrap();
    }
    assert_eq!(
        st.put_start(7, "new", 64 << 10, &ONE, t0).unwrap_err().0,
        Status::NoSpace
    );
    let later = t0 + Duration::from_secs(11);
    st.put_start(7, "new", 64 << 10, &ONE, later).unwrap();
    assert!(st.counters.evicted_objects >= 1);
}

#[test]
fn eviction_takes_the_least_recently_used_as_kept_through_touches_and_removals() {
    let cfg = MasterConfig {
        eviction_high_watermark_ratio: 1.0,
        default_kv_lease_ttl_ms: Millis(Duration::from_millis(10)),
        ..MasterConfig::default()
    };
    let mut st = master(cfg);
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    // Sixteen objects of 64 KiB fill the segment.
    for i in 0..16 {
        put(&mut st, &format!("k{i}"), 64 << 10, 0, at(i));
    }
    st.exists("k0", at(20));
    st.get_replicas("k1", at(21)).unwrap();
    // Replacing k2 (full pool) evicts the oldest: k2's old value.
    put(&mut st, "k2", 64 << 10, 0, at(22));
    assert_eq!(st.counters.evicted_objects, 1);
    assert!(st.lookup("k2").is_some() && st.lookup("k3").is_some());
    assert!(st.remove("k4", false, at(23)).is_ok());
    let kept = |st: &MasterState| -> Vec<String> {
        (0..16)
            .map(|i| format!("k{i}"))
            .filter(|k| st.lookup(k).is_some())
            .collect()
    };
    // Room for one: nothing evicted. Then each put evicts the oldest untouched.
    put(&mut st, "n0", 64 << 10, 0, at(40));
    assert_eq!(st.counters.evicted_objects, 1);
    put(&mut st, "n1", 64 << 10, 0, at(41));
    put(&mut st, "n2", 64 << 10, 0, at(42));
    assert!(st.lookup("k3").is_none() && st.lookup("k5").is_none());
    for i in 6..16 {
        put(&mut st, &format!("m{i}"), 64 << 10, 0, at(50 + i));
    }
    // Left, oldest first: what was touched, in the order it was.
    assert_eq!(kept(&st), ["k0", "k1", "k2"]);
    put(&mut st, "m16", 64 << 10, 0, at(70));
    assert_eq!(kept(&st), ["k1", "k2"]);
    st.objects.order();
}

#[test]
fn a_large_segment_unmounted_is_dropped_in_steps_and_its_objects_are_gone_at_once() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let (a, _) = st
        .mount(1, seg("a", 4 << 20), grant_key(), false, t0)
        .unwrap();
    st.mount(2, seg("b", 4 << 20), grant_key(), false, t0)
        .unwrap();
    let n = WALK_STEP + WALK_STEP / 2;
    let on_a = ReplicateConfig {
        preferred_segment: "a".into(),
        ..ONE
    };
    for i in 0..n {
        let key = format!("k{i}");
        let (id, replicas) = st.put_start(7, &key, 64, &on_a, t0).unwrap();
        assert_eq!(replicas[0].segment_id, a);
        st.put_end(7, &key, id, Some(0), t0).unwrap();
    }
    let on_b = ReplicateConfig {
        preferred_segment: "b".into(),
        ..ONE
    };
    let (id, _) = st.put_start(7, "elsewhere", 64, &on_b, t0).unwrap();
    st.put_end(7, "elsewhere", id, Some(0), t0).unwrap();
    st.unmount(1, a, false, t0).unwrap();
    // One step done; the rest waits, but nothing of the store is readable meanwhile.
    assert!(st.walking());
    let last = format!("k{}", n - 1);
    assert!(st.lookup(&last).is_some(), "not yet walked");
    assert!(!st.exists(&last, t0));
    assert_eq!(
        st.get_replicas(&last, t0).unwrap_err().0,
        Status::ObjectNotFound
    );
    // A new segment never takes the id of one being dropped, and a put of a key still
    // being dropped replaces it.
    put(&mut st, &last, 64, 0, t0);
    assert!(st.exists(&last, t0));
    while st.walk_step(WALK_STEP) {}
    assert!(st.lookup("k0").is_none());
    assert_eq!(st.counters.dropped_objects, n as u64 - 1);
    assert_eq!(st.summary(t0).keys, 2);
    assert_eq!(
        (
            st.summary(t0).keys,
            st.summary(t0).soft_pinned_keys,
            st.summary(t0).pending_puts
        ),
        st.recount(t0)
    );
    st.objects.order();
}

fn pseg(name: &str, uuid: u64) -> SegmentInfo {
    SegmentInfo {
        segment_uuid: uuid,
        ..seg(name, 1 << 20)
    }
}

#[test]
fn kept_counts_equal_a_recount_after_a_random_workload() {
    let (mut evicted, mut pinned) = (0, 0);
    for seed in 0..20u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let cfg = MasterConfig {
            default_kv_lease_ttl_ms: Millis(Duration::from_millis(5)),
            put_start_release_timeout_ms: Millis(Duration::from_millis(50)),
            ..MasterConfig::default()
        };
        let mut st = master(cfg);
        let mut now = Instant::now();
        // Small segments: puts evict.
        st.mount(1, seg("a", 64 << 10), grant_key(), false, now)
            .unwrap();
        st.mount(2, seg("b", 64 << 10), grant_key(), false, now)
            .unwrap();
        st.set_tenants(
            tenants::Quotas::parse(
                "[[tenant]]\nname = \"a\"\nquota = \"40KiB\"\n[[tenant]]\nname = \"b\"\n",
            )
            .unwrap(),
        );
        let mut started: Vec<(String, u64)> = Vec::new();
        for _ in 0..400 {
            now += Duration::from_millis(rng.u64(0..4));
            let tenant = ["default", "a", "b"][rng.usize(0..3)];
            let key = tenants::scoped(tenant, &format!("k{}", rng.u8(0..30))).into_owned();
            match rng.u8(0..10) {
                0..=2 => {
                    let pin = ReplicateConfig {
                        replica_num: rng.u8(1..3),
                        soft_pin: rng.bool(),
                        soft_pin_ttl_ms: rng.u64(1..40),
                        preferred_segment: String::new(),
                        reach: Reach::Rbgctl,
                    };
                    if let Ok((id, _)) = st.put_start(7, &key, rng.u64(1..9000), &pin, now) {
                        started.push((key, id));
                    }
                }
                3..=4 if !started.is_empty() => {
                    let (k, id) = started.swap_remove(rng.usize(..started.len()));
                    let _ = st.put_end(7, &k, id, Some(1), now);
                }
                5 => {
                    let _ = st.remove(&key, rng.bool(), now);
                }
                6 => {
                    if let Ok(d) = st.get_replicas(&key, now) {
                        if let Some(r) = d.replicas.first() {
                            st.report_corrupt(&key, d.version, r.segment_id, now);
                        }
                    }
                }
                7 => {
                    let sizes = [rng.u64(1..4000)];
                    if let Ok((id, _)) = st.reserve(7, &sizes, &ONE, now)[0].clone() {
                        let _ = st.put_end(7, &key, id, Some(1), now);
                    }
                }
                8 => st.housekeeping(now),
                _ => {
                    let _ = st.exists(&key, now);
                }
            }
            st.housekeeping(now);
            st.objects.order(); // every object on a list, links intact
            assert_eq!(st.indexes.usage(), &st.recount_usage(), "seed {seed}");
            let s = st.summary(now);
            pinned += s.soft_pinned_keys;
            assert_eq!(
                (s.keys, s.soft_pinned_keys, s.pending_puts),
                st.recount(now),
                "seed {seed}"
            );
        }
        let (client, id) = st.segments().map(|s| (s.client_id, s.id)).next().unwrap();
        st.unmount(client, id, false, now).unwrap();
        while st.walk_step(WALK_STEP) {}
        let s = st.summary(now);
        assert_eq!(
            (s.keys, s.soft_pinned_keys, s.pending_puts),
            st.recount(now)
        );
        assert_eq!(st.indexes.usage(), &st.recount_usage(), "seed {seed}");
        evicted += st.counters.evicted_objects;
    }
    assert!(evicted > 0 && pinned > 0, "the workload evicts and pins");
}

#[test]
fn tiers_stay_consistent_through_a_random_workload_with_moves_failing_and_hanging() {
    let (mut demoted, mut promoted, mut failed) = (0, 0, 0);
    for seed in 0..20u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let cfg = MasterConfig {
            default_kv_lease_ttl_ms: Millis(Duration::from_millis(5)),
            disk_tier_queue_bytes: ByteSize(32 << 10),
            ..MasterConfig::default()
        };
        let mut st = master(cfg);
        let mut now = Instant::now();
        for (client, name) in [(1, "a"), (2, "b")] {
            st.mount(client, seg(name, 64 << 10), grant_key(), false, now)
                .unwrap();
            let disk = SegmentInfo {
                tier: Tier::Disk,
                ..seg(&format!("{name}/disk"), 128 << 10)
            };
            st.mount(client, disk, grant_key(), false, now).unwrap();
        }
        let mut sent: Vec<u64> = Vec::new();
        for _ in 0..600 {
            now += Duration::from_millis(rng.u64(0..4));
            let key = format!("k{}", rng.u8(0..40));
            match rng.u8(0..10) {
                0..=3 => {
                    let size = rng.u64(1..9000);
                    if !st.make_room(size, size, now) {
                        if let Ok((id, _)) = st.put_start(7, &key, size, &ONE, now) {
                            let _ = st.put_end(7, &key, id, Some(1), now);
                        }
                    }
                }
                4 => {
                    let _ = st.remove(&key, rng.bool(), now);
                }
                5..=6 => {
                    let _ = st.get_replicas(&key, now);
                }
                7 => {
                    sent.extend(
                        st.take_moves(now)
                            .into_iter()
                            .flat_map(|j| j.items)
                            .map(|m| m.version),
                    );
                }
                _ if !sent.is_empty() => {
                    // Answered in any order, some failing; some never (they hang).
                    let v = sent.swap_remove(rng.usize(..sent.len()));
                    let status = match rng.u8(0..10) {
                        0 => Status::Internal,
                        1 => Status::ChecksumMismatch,
                        _ => Status::Ok,
                    };
                    st.moved(&[(v, status)], now);
                }
                _ => st.housekeeping(now),
            }
            st.objects.order(); // every object on a list, links and lengths intact
            assert_eq!(st.indexes.usage(), &st.recount_usage(), "seed {seed}");
            let s = st.summary(now);
            assert_eq!(
                (s.keys, s.soft_pinned_keys, s.pending_puts),
                st.recount(now)
            );
            let mut disk_only = 0;
            for (k, e) in st.objects.iter() {
                let Some(v) = &e.current else { continue };
                let on_disk = v.replicas.iter().all(|r| st.segments.is_disk(r));
                assert!(!v.replicas.is_empty(), "seed {seed}: {k} has no replica");
                assert_eq!(
                    st.objects.on_disk(k),
                    on_disk,
                    "seed {seed}: {k} on the wrong list"
                );
                disk_only += u64::from(on_disk);
            }
            assert_eq!(s.disk_keys, disk_only, "seed {seed}");
            for seg in st.segments() {
                assert!(seg.alloc.used() <= seg.alloc.capacity());
            }
        }
        demoted += st.counters.demoted_objects;
        promoted += st.counters.promoted_objects;
        failed += st.counters.move_failures;
        // A disk segment leaving drops what only it held.
        let (client, id) = st
            .segments()
            .find(|s| s.info.tier == Tier::Disk)
            .map(|s| (s.client_id, s.id))
            .unwrap();
        st.unmount(client, id, false, now).unwrap();
        while st.walk_step(WALK_STEP) {}
        let s = st.summary(now);
        assert_eq!(
            (s.keys, s.soft_pinned_keys, s.pending_puts),
            st.recount(now)
        );
    }
    assert!(
        demoted > 0 && promoted > 0 && failed > 0,
        "{demoted} {promoted} {failed}"
    );
}

fn put(st: &mut MasterState, key: &str, size: u64, crc: u32, now: Instant) -> ObjectDesc {
    let (id, _) = st.put_start(7, key, size, &ONE, now).unwrap();
    st.put_end(7, key, id, Some(crc), now).unwrap();
    st.get_replicas(key, now).unwrap()
}

fn stored(key: &str, d: &ObjectDesc) -> StoredObject {
    StoredObject {
        key: key.into(),
        version: d.version,
        offset: d.replicas[0].offset,
        size: d.size,
        checksum: d.checksum,
    }
}

#[test]
fn a_put_after_a_removal_waits_for_the_removals_forgets() {
    let (mut st, t0) = state();
    put(&mut st, "k", 100, 1, t0);
    st.take_forget_wait();
    st.remove("k", true, t0).unwrap();
    let removal = st.take_forget_wait().expect("the removal waits").seq;
    // The next value ends while the removal's forgets may still be on their way: a reader
    // of a cached location could see the removed value after it, so it waits for them.
    let (id, _) = st.put_start(7, "k", 10, &ONE, t0).unwrap();
    st.put_end(7, "k", id, Some(0), t0).unwrap();
    let wait = st.take_forget_wait().expect("the put waits");
    assert!(wait.seq >= removal, "{wait:?} before {removal}");
    assert!(
        wait.endpoints.is_empty(),
        "not its own forgets: its durability is not theirs"
    );
    // Once a lease has passed, a store cannot serve it any more: nothing to wait for.
    let later = t0 + Duration::from_secs(30);
    st.forgets_delivered(later);
    st.remove("k", true, later).unwrap();
    st.take_forget_wait();
    st.forgets_delivered(later + Duration::from_secs(30));
    let (id, _) = st.put_start(7, "k", 10, &ONE, later).unwrap();
    st.put_end(7, "k", id, Some(0), later).unwrap();
    assert_eq!(st.take_forget_wait(), None);
}

#[test]
fn a_segment_owes_the_forgets_of_what_left_it_until_it_mounts_again() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let (id, _) = st.mount(1, pseg("a", 42), grant_key(), true, t0).unwrap();
    assert_eq!(
        st.lease_terms(1, id).unwrap_err().0,
        Status::ObjectUnavailable,
        "no lease while it reports"
    );
    st.report(1, id, vec![], true, t0).unwrap();
    assert_eq!(st.lease_terms(1, id).unwrap(), ("a:1".to_string(), 0));
    assert_eq!(st.lease_terms(2, id).unwrap_err().0, Status::IllegalClient);
    put(&mut st, "k", 100, 1, t0);
    st.remove("k", true, t0).unwrap();
    let (_, owed) = st.lease_terms(1, id).unwrap();
    assert_eq!(owed, st.forgets.seq(), "owes the removal's forget");
    assert_eq!(st.take_outbox().seq, owed);
    // Back after a restart: its report settles its records; nothing older is owed.
    st.unmount(1, id, true, t0).unwrap();
    assert_eq!(
        st.lease_terms(1, id).unwrap_err().0,
        Status::SegmentNotFound,
        "away: its store must mount again"
    );
    st.mount(2, pseg("a", 42), grant_key(), true, t0).unwrap();
    st.report(2, id, vec![], true, t0).unwrap();
    assert_eq!(st.lease_terms(2, id).unwrap().1, 0);
}

#[test]
fn an_away_store_keeps_its_objects_and_gets_back_only_what_it_confirms() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let (id, discard) = st.mount(1, pseg("a", 42), grant_key(), true, t0).unwrap();
    assert!(!discard);
    assert!(st.report(1, id, vec![], true, t0).unwrap().is_empty());
    let a = put(&mut st, "a", 100, 1, t0);
    let b = put(&mut st, "b", 100, 2, t0);
    // SIGTERM with keep: unreadable, not gone.
    st.unmount(1, id, true, t0).unwrap();
    assert_eq!(
        st.get_replicas("a", t0).unwrap_err().0,
        Status::ObjectUnavailable
    );
    assert!(!st.exists("a", t0));
    assert_eq!(
        st.put_start(7, "c", 10, &ONE, t0).unwrap_err().0,
        Status::NoSpace,
        "no allocation on an away segment"
    );
    // Back with the same incarnation: it reports a (intact), not b (lost), and a record
    // the master never had.
    let (id2, discard) = st.mount(2, pseg("a", 42), grant_key(), true, t0).unwrap();
    assert_eq!((id2, discard), (id, false));
    let stray = StoredObject {
        key: "stray".into(),
        version: 1,
        offset: 4096,
        size: 10,
        checksum: 0,
    };
    let rejected = st
        .report(2, id, vec![stored("a", &a), stray], true, t0)
        .unwrap();
    assert_eq!(rejected.len(), 1, "the stray record is rejected");
    assert_eq!(st.get_replicas("a", t0).unwrap().version, a.version);
    assert_eq!(
        st.get_replicas("b", t0).unwrap_err().0,
        Status::ObjectNotFound
    );
    assert_eq!(st.counters.lost_objects, 1);
    let _ = b;
}

/// A store with 1 MiB of memory and a disk tier of `disk` bytes (client 1), and a client 7.
fn tiered(cfg: MasterConfig, disk: u64) -> (MasterState, Instant, u64, u64) {
    let mut st = master(cfg);
    let t0 = Instant::now();
    let (mem, _) = st
        .mount(1, seg("mem", 1 << 20), grant_key(), false, t0)
        .unwrap();
    let info = SegmentInfo {
        tier: Tier::Disk,
        ..seg("mem/disk", disk)
    };
    let (disk_id, _) = st.mount(1, info, grant_key(), false, t0).unwrap();
    st.ping(7, t0);
    (st, t0, mem, disk_id)
}

const KB64: u64 = 64 << 10;

/// Puts `key` (64 KiB) without reading it; its checksum is its number.
fn put_quiet(st: &mut MasterState, i: u64, now: Instant) -> u64 {
    let key = format!("k{i}");
    let (id, replicas) = st.put_start(7, &key, KB64, &ONE, now).unwrap();
    assert_eq!(replicas.len(), 1);
    st.put_end(7, &key, id, Some(i as u32), now).unwrap();
    id
}

/// The queued moves, answered with `status` each; returns the items.
fn answer_moves(st: &mut MasterState, status: Status, now: Instant) -> Vec<MoveItem> {
    let jobs = st.take_moves(now);
    let items: Vec<MoveItem> = jobs.into_iter().flat_map(|j| j.items).collect();
    let results: Vec<(u64, Status)> = items.iter().map(|m| (m.version, status)).collect();
    st.moved(&results, now);
    items
}

fn replica_segment(st: &mut MasterState, key: &str, now: Instant) -> u64 {
    st.get_replicas(key, now).unwrap().replicas[0].segment_id
}

#[test]
fn puts_land_in_memory_and_eviction_demotes_to_the_stores_disk_tier() {
    let (mut st, t0, mem, disk) = tiered(MasterConfig::default(), 1 << 30);
    // Fill memory past the watermark (16 objects fill it): every object lands in memory;
    // the oldest are queued to go to disk, and stay readable from memory until their
    // copies are confirmed.
    for i in 0..15 {
        put_quiet(&mut st, i, t0);
    }
    let s = st.summary(t0);
    assert_eq!(s.capacity_bytes, 1 << 20, "memory only");
    assert_eq!(s.disk_capacity_bytes, 1 << 30);
    assert!(s.moves_in_flight > 0, "{s:?}");
    assert_eq!(s.demoting_bytes, s.moves_in_flight * KB64);
    assert_eq!(
        replica_segment(&mut st, "k0", t0),
        mem,
        "readable while it moves"
    );
    let jobs = st.take_moves(t0);
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        jobs[0].endpoint, "mem/disk:1",
        "sent to the disk tier's endpoint"
    );
    let items = jobs.into_iter().next().unwrap().items;
    assert!(items.iter().all(|m| m.kind == MoveKind::Demote));
    assert_eq!(items[0].key, "k0", "least recently used first");
    assert_eq!(items[0].checksum, 0);
    assert_eq!(items[0].to % 4096, 0, "whole disk blocks");
    let results: Vec<(u64, Status)> = items.iter().map(|m| (m.version, Status::Ok)).collect();
    st.take_outbox();
    st.moved(&results, t0);
    // The memory records go to the store as forgets.
    let out = st.take_outbox();
    assert_eq!(out.forgets["mem:1"].len(), items.len());
    let d = st.get_replicas("k1", t0).unwrap();
    assert_eq!((d.replicas[0].segment_id, d.checksum), (disk, 1));
    // A stream of puts goes on with the copies confirmed as they come: nothing is dropped.
    for i in 15..60 {
        put_quiet(&mut st, i, t0);
        answer_moves(&mut st, Status::Ok, t0);
    }
    let s = st.summary(t0);
    assert_eq!(st.counters.evicted_objects, 0, "nothing dropped");
    assert_eq!(st.counters.alloc_failures, 0);
    assert_eq!(s.keys, 60);
    // k1 was read from disk above: promoted back on that first hit.
    assert_eq!(st.counters.promoted_objects, 1);
    assert_eq!(s.disk_keys, st.counters.demoted_objects - 1);
    // k1's disk copy is freed when the read lease granted on it ends.
    assert_eq!(s.disk_used_bytes, (s.disk_keys + 1) * KB64);
    assert!(
        s.used_bytes as f64 <= 0.9 * s.capacity_bytes as f64,
        "{s:?}"
    );
    assert_eq!((s.moves_in_flight, s.demoting_bytes), (0, 0));
    assert_eq!(replica_segment(&mut st, "k59", t0), mem);
    st.objects.order(); // every list's links and lengths check out
}

#[test]
fn a_hit_promotes_after_the_admission_count_and_a_failed_move_leaves_the_object() {
    let cfg = MasterConfig {
        promotion_admission_threshold: 2,
        ..MasterConfig::default()
    };
    let (mut st, t0, mem, disk) = tiered(cfg, 1 << 30);
    let mut demoted = Vec::new();
    for i in 0..20 {
        put_quiet(&mut st, i, t0);
        demoted.extend(answer_moves(&mut st, Status::Ok, t0));
    }
    assert!(demoted.len() >= 3, "{}", demoted.len());
    // Room in memory again for promotions.
    for m in &demoted[..3] {
        assert_eq!(
            replica_segment(&mut st, &m.key, t0),
            disk,
            "first hit: stays"
        );
    }
    assert!(st.take_moves(t0).is_empty(), "not admitted yet");
    assert_eq!(replica_segment(&mut st, "k0", t0), disk, "second hit");
    let items = st.take_moves(t0).into_iter().next().unwrap().items;
    assert_eq!(items.len(), 1);
    assert_eq!(
        (items[0].kind, items[0].key.as_str()),
        (MoveKind::Promote, "k0")
    );
    assert_eq!(
        items[0].from, demoted[0].to,
        "from the disk replica to new memory"
    );
    assert_eq!(
        replica_segment(&mut st, "k0", t0),
        disk,
        "served from disk meanwhile"
    );
    st.take_outbox();
    st.moved(&[(items[0].version, Status::Ok)], t0);
    assert_eq!(replica_segment(&mut st, "k0", t0), mem, "promoted");
    assert_eq!(st.counters.promoted_objects, 1);
    assert_eq!(
        st.take_outbox().forgets["mem/disk:1"].len(),
        1,
        "disk record forgotten"
    );
    // A promotion that fails leaves the object on disk and gives the memory back.
    let used = st.summary(t0).used_bytes;
    assert_eq!(replica_segment(&mut st, "k1", t0), disk);
    assert_eq!(
        st.summary(t0).used_bytes,
        used + KB64,
        "allocated for the copy"
    );
    answer_moves(&mut st, Status::Internal, t0);
    assert_eq!(st.counters.move_failures, 1);
    assert_eq!(st.summary(t0).used_bytes, used);
    assert_eq!(replica_segment(&mut st, "k1", t0), disk, "tried again");
    assert_eq!(answer_moves(&mut st, Status::Internal, t0).len(), 1);
    // A promotion whose disk bytes fail their checksum drops that replica (its only one).
    assert_eq!(replica_segment(&mut st, "k2", t0), disk);
    let items = answer_moves(&mut st, Status::ChecksumMismatch, t0);
    assert_eq!(items[0].key, "k2");
    assert_eq!(
        st.get_replicas("k2", t0).unwrap_err().0,
        Status::ObjectNotFound
    );
    assert_eq!(st.counters.corrupt_replicas, 1);
    st.objects.order();
}

#[test]
fn the_disk_tier_drops_its_least_recently_used_and_a_full_one_degrades_to_dropping() {
    // Room on disk for 8 objects of 64 KiB: its watermark (95 %) keeps 7.
    let (mut st, t0, _, disk) = tiered(MasterConfig::default(), 8 * KB64);
    for i in 0..200 {
        put_quiet(&mut st, i, t0);
        answer_moves(&mut st, Status::Ok, t0);
    }
    let s = st.summary(t0);
    assert!(
        s.disk_used_bytes <= (0.95 * (8 * KB64) as f64) as u64,
        "{s:?}"
    );
    assert!(st.counters.disk_evicted_objects > 0);
    assert_eq!(st.counters.alloc_failures, 0, "puts never failed for room");
    // The disk holds the most recently demoted; the first ones are gone.
    assert_eq!(
        st.get_replicas("k0", t0).unwrap_err().0,
        Status::ObjectNotFound
    );
    let on_disk: Vec<u64> = (0..200)
        .filter(|i| {
            st.get_replicas(&format!("k{i}"), t0)
                .is_ok_and(|d| d.replicas[0].segment_id == disk)
        })
        .collect();
    assert!(!on_disk.is_empty());
    let newest_gone = (0..200)
        .filter(|i| st.lookup(&format!("k{i}")).is_none())
        .max()
        .unwrap();
    assert!(
        on_disk.iter().all(|i| *i > newest_gone),
        "disk eviction took the oldest first: {on_disk:?}, {newest_gone}"
    );
    st.objects.order();

    // A disk tier that cannot take an object at all (everything on it leased): the object
    // is dropped, counted; the put goes through.
    let (mut st, t0, _, _) = tiered(MasterConfig::default(), KB64);
    for i in 0..40 {
        put_quiet(&mut st, i, t0);
        for m in answer_moves(&mut st, Status::Ok, t0) {
            st.get_replicas(&m.key, t0).unwrap(); // leased: disk eviction passes it over
        }
    }
    assert!(st.counters.disk_full_drops > 0);
    assert!(st.counters.evicted_objects > 0);
    assert_eq!(st.counters.alloc_failures, 0);
}

#[test]
fn disk_segments_are_allocated_in_whole_blocks_whatever_the_value_size() {
    let (mut st, t0, _, disk) = tiered(MasterConfig::default(), 1 << 30);
    let cfg = ReplicateConfig::default();
    for i in 0..400u64 {
        let key = format!("odd{i}");
        let (id, _) = st.put_start(7, &key, 5000 + i, &cfg, t0).unwrap();
        st.put_end(7, &key, id, Some(0), t0).unwrap();
        for m in answer_moves(&mut st, Status::Ok, t0) {
            assert_eq!(m.to % 4096, 0, "{m:?}");
        }
    }
    let seg = st.segment(disk).unwrap();
    assert!(seg.alloc.used() > 0);
    assert_eq!(seg.alloc.used() % 4096, 0, "whole blocks");
}

#[test]
fn a_batch_larger_than_free_memory_waits_for_demotions_instead_of_dropping() {
    let (mut st, t0, _, _) = tiered(MasterConfig::default(), 1 << 30);
    for i in 0..14 {
        put_quiet(&mut st, i, t0);
    }
    assert!(!st.make_room(KB64, KB64, t0), "room enough: no wait");
    // A batch of 8 objects needs 512 KiB; 128 KiB are free.
    assert!(
        st.make_room(8 * KB64, KB64, t0),
        "demotions started: wait for them"
    );
    let s = st.summary(t0);
    assert!(s.demoting_bytes >= 6 * KB64, "{s:?}");
    assert!(
        !st.make_room(8 * KB64, KB64, t0) || st.summary(t0).demoting_bytes == s.demoting_bytes,
        "asking again starts no more than needed"
    );
    answer_moves(&mut st, Status::Ok, t0);
    assert!(!st.make_room(8 * KB64, KB64, t0), "the copies landed: room");
    for i in 14..22 {
        put_quiet(&mut st, i, t0);
    }
    assert_eq!(st.counters.evicted_objects, 0);
    // Without a disk tier there is nothing to wait for.
    let (mut plain, t0) = state();
    for i in 0..15 {
        put_quiet(&mut plain, i, t0);
    }
    assert!(!plain.make_room(8 * KB64, KB64, t0));
}

#[test]
fn demotions_in_flight_are_bounded_and_a_put_short_of_memory_drops_instead() {
    let cfg = MasterConfig {
        disk_tier_queue_bytes: ByteSize(2 * KB64),
        ..MasterConfig::default()
    };
    let (mut st, t0, _, _) = tiered(cfg, 1 << 30);
    // Nobody answers the moves: at most two are in flight, and once memory is full the
    // puts go on by dropping the least recently used objects that are not moving.
    for i in 0..60 {
        put_quiet(&mut st, i, t0);
        let s = st.summary(t0);
        assert!(s.demoting_bytes <= 2 * KB64, "{s:?}");
    }
    assert_eq!(st.summary(t0).moves_in_flight, 2);
    assert!(
        st.counters.evicted_objects > 0,
        "dropped while the copies hang"
    );
    assert!(
        st.exists("k0", t0) && st.exists("k1", t0),
        "moving objects stay"
    );
    // The copies land late: both objects end on disk.
    let items = answer_moves(&mut st, Status::Ok, t0);
    assert_eq!(items.len(), 2);
    assert_eq!(st.summary(t0).disk_keys, 2);
}

#[test]
fn a_large_rebound_segment_is_confirmed_in_steps_and_readable_only_once_done() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let big = SegmentInfo {
        segment_uuid: 42,
        ..seg("a", 4 << 20)
    };
    let (id, _) = st.mount(1, big.clone(), grant_key(), true, t0).unwrap();
    st.report(1, id, vec![], true, t0).unwrap();
    let n = WALK_STEP + WALK_STEP / 2;
    let records: Vec<StoredObject> = (0..n)
        .map(|i| {
            let key = format!("k{i}");
            let d = put(&mut st, &key, 64, i as u32, t0);
            stored(&key, &d)
        })
        .collect();
    st.unmount(1, id, true, t0).unwrap();
    // Back, twice: the first report's confirmation is cut short by the second mount, and
    // must not drop what the second report confirms. k0 and the last key are lost.
    let kept = &records[1..n - 1];
    for client in [2, 3] {
        assert_eq!(
            st.mount(client, big.clone(), grant_key(), true, t0)
                .unwrap(),
            (id, false)
        );
        for chunk in kept.chunks(4096) {
            st.report(client, id, chunk.to_vec(), false, t0).unwrap();
        }
        st.report(client, id, vec![], true, t0).unwrap();
        assert!(st.walking(), "more objects than one step");
        assert_eq!(
            st.get_replicas("k1", t0).unwrap_err().0,
            Status::ObjectUnavailable,
            "unreadable until confirmed"
        );
    }
    while st.walk_step(WALK_STEP) {}
    assert!(st.segment(id).is_some_and(|s| s.is_live()));
    assert_eq!(st.counters.lost_objects, 2);
    assert!(st.lookup("k0").is_none() && st.lookup(&format!("k{}", n - 1)).is_none());
    for r in kept.iter().step_by(1000) {
        assert_eq!(st.get_replicas(&r.key, t0).unwrap().version, r.version);
    }
    let s = st.summary(t0);
    assert_eq!(s.keys, n as u64 - 2);
    assert_eq!((s.keys, s.soft_pinned_keys, s.pending_puts), st.recount(t0));
}

#[test]
fn a_store_away_past_the_grace_period_is_given_up_and_told_to_discard() {
    let cfg = MasterConfig {
        store_grace_period_ms: crate::config::Millis(Duration::from_secs(5)),
        ..MasterConfig::default()
    };
    let mut st = master(cfg);
    let t0 = Instant::now();
    let (id, _) = st.mount(1, pseg("a", 42), grant_key(), true, t0).unwrap();
    st.report(1, id, vec![], true, t0).unwrap();
    put(&mut st, "a", 100, 1, t0);
    // Heartbeats stop: after the TTL the segment is away, after the grace it is gone.
    st.housekeeping(t0 + Duration::from_secs(11));
    assert_eq!(st.summary(t0).away_segments, 1);
    st.housekeeping(t0 + Duration::from_secs(17));
    assert!(st.lookup("a").is_none());
    let (_, discard) = st
        .mount(
            2,
            pseg("a", 42),
            grant_key(),
            true,
            t0 + Duration::from_secs(18),
        )
        .unwrap();
    assert!(
        discard,
        "its objects were given up; the store must not bring them back"
    );
}

#[test]
fn a_restarted_master_adopts_reports_and_the_newest_version_wins() {
    let mut old = master(MasterConfig::default());
    let t0 = Instant::now();
    let (ia, _) = old.mount(1, pseg("a", 1), grant_key(), true, t0).unwrap();
    old.report(1, ia, vec![], true, t0).unwrap();
    let (ib, _) = old.mount(2, pseg("b", 2), grant_key(), true, t0).unwrap();
    old.report(2, ib, vec![], true, t0).unwrap();
    let pref = |s: &str| ReplicateConfig {
        preferred_segment: s.into(),
        ..ONE
    };
    let (v1, r1) = old.put_start(7, "k", 100, &pref("a"), t0).unwrap();
    old.put_end(7, "k", v1, Some(1), t0).unwrap();
    let (v2, r2) = old.put_start(7, "k", 200, &pref("b"), t0).unwrap();
    old.put_end(7, "k", v2, Some(2), t0).unwrap();
    assert!(v2 > v1);
    let rec = |v, off, size, crc| StoredObject {
        key: "k".into(),
        version: v,
        offset: off,
        size,
        checksum: crc,
    };
    // A new master; store b reports first, then a with the older version (its forget was
    // lost in the crash).
    let mut st = master(MasterConfig::default());
    let (nb, _) = st.mount(3, pseg("b", 2), grant_key(), true, t0).unwrap();
    assert!(st
        .report(3, nb, vec![rec(v2, r2[0].offset, 200, 2)], true, t0)
        .unwrap()
        .is_empty());
    let (na, _) = st.mount(4, pseg("a", 1), grant_key(), true, t0).unwrap();
    let rejected = st
        .report(4, na, vec![rec(v1, r1[0].offset, 100, 1)], true, t0)
        .unwrap();
    assert_eq!(rejected.len(), 1, "the stale version is rejected");
    let d = st.get_replicas("k", t0).unwrap();
    assert_eq!((d.version, d.size), (v2, 200));
    // New versions beat everything reported.
    let (v3, _) = st.put_start(7, "k", 10, &ONE, t0).unwrap();
    assert!(v3 > v2);
    // The other order: the newer report replaces the adopted older one and queues its forget.
    let mut st = master(MasterConfig::default());
    let (na, _) = st.mount(4, pseg("a", 1), grant_key(), true, t0).unwrap();
    st.report(4, na, vec![rec(v1, r1[0].offset, 100, 1)], true, t0)
        .unwrap();
    let (nb, _) = st.mount(3, pseg("b", 2), grant_key(), true, t0).unwrap();
    st.report(3, nb, vec![rec(v2, r2[0].offset, 200, 2)], true, t0)
        .unwrap();
    assert_eq!(st.get_replicas("k", t0).unwrap().version, v2);
    let out = st.take_outbox();
    assert_eq!(out.forgets.len(), 1);
    assert_eq!(out.forgets.values().next().unwrap()[0].version, v1);
}

#[test]
fn removals_and_replacements_queue_forgets_and_corrupt_replicas_are_dropped() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let (id, _) = st.mount(1, pseg("a", 9), grant_key(), true, t0).unwrap();
    st.report(1, id, vec![], true, t0).unwrap();
    let a = put(&mut st, "a", 100, 1, t0);
    let later = t0 + Duration::from_secs(11);
    st.remove("a", false, later).unwrap();
    let out = st.take_outbox();
    assert_eq!(out.forgets.values().next().unwrap()[0].version, a.version);
    let b = put(&mut st, "b", 100, 1, later);
    st.report_corrupt("b", b.version + 1, id, later);
    assert!(st.exists("b", later), "another version's report is ignored");
    st.report_corrupt("b", b.version, id, later);
    assert!(st.lookup("b").is_none());
    assert_eq!(st.counters.corrupt_replicas, 1);
}

/// A wall clock the test sets.
struct SetClock(AtomicU64);

impl WallClock for SetClock {
    fn unix_micros(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[test]
fn versions_follow_the_wall_clock_forward_never_back_and_evictions_are_logged_with_it() {
    let clock = Arc::new(SetClock(AtomicU64::new(1_000_000)));
    let mut st = MasterState::new(
        MasterConfig::default(),
        clock.clone(),
        fastrand::Rng::with_seed(1),
    );
    assert_eq!(st.write_floor(), 1_000_000, "the clock when it started");
    let t0 = Instant::now();
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    assert_eq!(put(&mut st, "k1", 64, 1, t0).version, 1_000_000);
    assert_eq!(
        put(&mut st, "k2", 64, 2, t0).version,
        1_000_001,
        "the clock standing still, versions still rise"
    );
    clock.0.store(5_000_000, Ordering::Relaxed);
    assert_eq!(put(&mut st, "k3", 64, 3, t0).version, 5_000_000);
    clock.0.store(2_000_000, Ordering::Relaxed);
    assert_eq!(
        put(&mut st, "k4", 64, 4, t0).version,
        5_000_001,
        "a clock stepping back does not take versions back"
    );
    // Past the read leases the gets granted.
    assert!(st.evict(t0 + Duration::from_secs(600), 1 << 20) > 0);
    let logged: Vec<u64> = st
        .evictions
        .since(0, 10)
        .0
        .iter()
        .map(|e| e.at_us)
        .collect();
    assert!(
        !logged.is_empty() && logged.iter().all(|&t| t == 2_000_000),
        "{logged:?}"
    );
}

/// What a subscriber to the pool's events holds: each page's block hash and media.
fn follow(
    held: &mut std::collections::BTreeMap<i64, std::collections::BTreeSet<String>>,
    events: Vec<crate::kv_events::KvEvent>,
) {
    use crate::kv_events::KvEvent;
    for e in events {
        match e {
            KvEvent::BlockStored(s) => {
                let medium = s.medium.expect("a medium").as_str().to_string();
                held.entry(s.block_hashes[0]).or_default().insert(medium);
            }
            KvEvent::BlockRemoved(r) => {
                let medium = r.medium.expect("a medium").as_str().to_string();
                let h = r.block_hashes[0];
                let media = held.get_mut(&h).expect("removed after stored");
                assert!(media.remove(&medium), "{h} was not in {medium}");
                if media.is_empty() {
                    held.remove(&h);
                }
            }
            KvEvent::AllBlocksCleared => held.clear(),
        }
    }
}

#[test]
fn the_pools_kv_events_follow_every_page_through_puts_moves_evictions_and_removals() {
    let cfg = MasterConfig {
        kv_events_config: Some(r#"{"publisher":"zmq","endpoint":"tcp://*:0"}"#.into()),
        ..MasterConfig::default()
    };
    // Memory for 16 objects and disk for 30 under 60 puts: demotions, promotions and disk
    // evictions.
    let (mut st, t0, _, _) = tiered(cfg, 30 * KB64);
    let page = |i: u64| format!("{i:016x}{}", "ab".repeat(24));
    let mut held = std::collections::BTreeMap::new();
    for i in 0..60u64 {
        let key = match i % 3 {
            0 => page(i),
            1 => format!("{}_0_k", page(i)),
            _ => format!("user-object-{i}"),
        };
        let (id, _) = st.put_start(7, &key, KB64, &ONE, t0).unwrap();
        st.put_end(7, &key, id, Some(i as u32), t0).unwrap();
        if i % 7 == 6 {
            // An old page, on disk by now: read, it is promoted.
            st.get_replicas(&page((i / 7) * 3), t0).ok();
        }
        answer_moves(&mut st, Status::Ok, t0);
        st.housekeeping(t0);
        if i % 10 == 9 {
            st.remove(&page(i - 9), true, t0).ok();
        }
        follow(&mut held, st.pool_events.take());
    }
    let c = &st.counters;
    let moved = (
        c.demoted_objects,
        c.promoted_objects,
        c.disk_evicted_objects,
    );
    assert!(
        moved.0 > 0 && moved.1 > 0 && moved.2 > 0,
        "demoted, promoted, evicted: {moved:?}"
    );
    // The truth: every readable page, in the medium its tier list says.
    let mut truth = std::collections::BTreeMap::<i64, std::collections::BTreeSet<String>>::new();
    for (key, entry) in st.objects.iter() {
        if let (Some(h), Some(_)) = (
            crate::master::state::pool_events::page_hash(key),
            &entry.current,
        ) {
            let medium = match st.objects.on_disk(key) {
                true => "DISK",
                false => "EXTERNAL",
            };
            truth.entry(h).or_default().insert(medium.to_string());
        }
    }
    assert!(!truth.is_empty());
    assert_eq!(held, truth);
    assert_eq!(st.pool_events.pages(), truth.len());
    // A master that forgets everything says so.
    st.reset();
    follow(&mut held, st.pool_events.take());
    assert!(held.is_empty());
}

/// The housekeeper ticks slowly only while nothing waits on the clock: an unfinished put, a
/// removal's forgets, or a store away make the state busy; a finished put and delivered forgets
/// leave it quiet.
#[test]
fn the_state_is_quiet_only_while_nothing_waits_on_the_clock() {
    let (mut st, t0) = state();
    assert!(st.quiet(), "a mounted, empty pool");
    let (id, _) = st.put_start(7, "k", 100, &ONE, t0).unwrap();
    assert!(!st.quiet(), "an unfinished put");
    st.put_end(7, "k", id, Some(0), t0).unwrap();
    assert!(st.quiet(), "a finished put");
    st.remove("k", true, t0).unwrap();
    assert!(!st.quiet(), "forgets to deliver");
    let _ = st.take_outbox();
    st.forgets_delivered(t0);
    // Past the stores' read lease (2 s), within the client's TTL (10 s).
    let later = t0 + Duration::from_secs(3);
    st.housekeeping(later);
    assert!(st.quiet(), "forgets delivered, extents released");
    let (persistent, _) = st
        .mount(2, pseg("b", 9), grant_key(), false, later)
        .unwrap();
    assert!(st.quiet(), "a second store mounted");
    st.unmount(2, persistent, true, later).unwrap();
    assert!(!st.quiet(), "a store away");
}

/// Issue 63: a segment a Mooncake process mounted (no rbgctl store, a Transfer Engine
/// endpoint) takes the puts of those who reach it, and no forget is ever queued for a store
/// it lacks.
#[test]
fn a_mooncake_processs_segment_takes_the_puts_that_reach_it_and_no_orders() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let wheel = SegmentInfo {
        endpoint: String::new(),
        te_endpoint: "127.0.0.1:13081".into(),
        te_base: 0x7f00_0000_0000,
        ..seg("wheel", 1 << 20)
    };
    st.mount(1, wheel, grant_key(), false, t0).unwrap();
    // No rbgctl store: rbgctl's puts have nowhere to go.
    let (status, _) = st.put_start(7, "rb", 100, &ONE, t0).unwrap_err();
    assert_eq!(status, Status::NoSpace);
    let te = ReplicateConfig {
        reach: Reach::MooncakeTe,
        ..ONE.clone()
    };
    let (id, _) = st.put_start(8, "mc", 100, &te, t0).unwrap();
    st.put_end(8, "mc", id, Some(0), t0).unwrap();
    st.remove("mc", true, t0).unwrap();
    let outbox = st.take_outbox();
    assert!(outbox.forgets.is_empty(), "{:?}", outbox.forgets);
    assert!(outbox.live.is_empty() && outbox.keys.is_empty());
    // Beside an rbgctl store, each kind of put goes where its putter reaches.
    st.mount(2, seg("store", 1 << 20), grant_key(), false, t0)
        .unwrap();
    let store_id = st.segments.by_name("store").unwrap();
    for i in 0..20 {
        let (_, r) = st.put_start(7, &format!("rb/{i}"), 100, &ONE, t0).unwrap();
        assert_eq!(r[0].segment_id, store_id);
    }
    // A putter that reaches both (rbgctl's clients, `Reach::Any`) may go to either; a put
    // nothing hashed (Mooncake's, onto the wheel's segment) reads back as unhashed.
    let wheel_id = st.segments.by_name("wheel").unwrap();
    let both = ReplicateConfig {
        reach: Reach::Any,
        preferred_segment: "wheel".into(),
        ..ONE.clone()
    };
    let (id, r) = st.put_start(7, "both", 100, &both, t0).unwrap();
    assert_eq!(r[0].segment_id, wheel_id);
    st.put_end(7, "both", id, Some(0xabc), t0).unwrap();
    let d = st.get_replicas("both", t0).unwrap();
    assert!(!d.unhashed && d.checksum == 0xabc);
    let (id, _) = st.put_start(8, "mc2", 100, &te, t0).unwrap();
    st.put_end(8, "mc2", id, None, t0).unwrap();
    assert!(st.get_replicas("mc2", t0).unwrap().unhashed);
}

/// `LIST_KEYS` (and Mooncake's regex RPCs over it): readable keys the pattern matches anywhere,
/// sorted, at most the limit, and whether more match; a put in progress is not listed.
#[test]
fn keys_are_listed_by_a_pattern_found_anywhere_in_them() {
    let (mut st, t0) = state();
    for key in ["page/1", "page/2", "page/10", "other/page", "x"] {
        put(&mut st, key, 10, 0, t0);
    }
    st.put_start(7, "page/3", 10, &ONE, t0).unwrap();
    let re = |p: &str| regex::Regex::new(p).unwrap();
    let (keys, more) = st.keys_matching(DEFAULT_TENANT, &re("^page/"), 10);
    assert_eq!(
        (keys, more),
        (
            vec!["page/1".into(), "page/10".into(), "page/2".into()],
            false
        )
    );
    let (keys, _) = st.keys_matching(DEFAULT_TENANT, &re("page"), 10);
    assert_eq!(keys.len(), 4, "{keys:?}");
    let (keys, more) = st.keys_matching(DEFAULT_TENANT, &re("^page/"), 2);
    assert_eq!((keys.len(), more), (2, true));
    assert_eq!(st.keys_matching(DEFAULT_TENANT, &re(""), 100).0.len(), 5);
}

/// A put whose store records it unhashed (Mooncake's one-sided writes) is committed unhashed;
/// the store's checksum sent after it (`OBJECTS_HASHED`) goes to that version only, from the
/// segment's own store; a second replica hashing differently puts it back to unhashed; a store
/// that comes back after a restart brings the checksum with its report.
#[test]
fn checksums_that_stores_send_after_the_put_reach_the_version_they_name() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    let (a, _) = st.mount(1, pseg("a", 42), grant_key(), true, t0).unwrap();
    st.report(1, a, vec![], true, t0).unwrap();
    let (id, r) = st.put_start(7, "k", 100, &ONE, t0).unwrap();
    st.put_end(7, "k", id, None, t0).unwrap();
    let d = st.get_replicas("k", t0).unwrap();
    assert!(d.unhashed);
    let hashed = |crc: u32, version: u64| StoredObject {
        key: "k".into(),
        version,
        offset: r[0].offset,
        size: 100,
        checksum: crc,
    };
    assert_eq!(
        st.objects_hashed(2, a, vec![hashed(0xabc, id)])
            .unwrap_err()
            .0,
        Status::IllegalClient,
        "only the segment's store"
    );
    st.objects_hashed(1, a, vec![hashed(0xabc, id + 1), hashed(0xabc, id - 1)])
        .unwrap();
    assert!(st.get_replicas("k", t0).unwrap().unhashed, "other versions");
    st.objects_hashed(1, a, vec![hashed(0xabc, id)]).unwrap();
    let d = st.get_replicas("k", t0).unwrap();
    assert!(!d.unhashed && d.checksum == 0xabc);
    assert_eq!(st.counters.hashed_later, 1);
    st.objects_hashed(1, a, vec![hashed(0xabc, id)]).unwrap();
    assert_eq!(st.counters.hash_mismatches, 0, "the same again");
    st.objects_hashed(1, a, vec![hashed(0xdef, id)]).unwrap();
    assert!(st.get_replicas("k", t0).unwrap().unhashed);
    assert_eq!(st.counters.hash_mismatches, 1);

    // A store that hashes before the put's commit: the checksum waits for it.
    let (early, r2) = st.put_start(7, "early", 100, &ONE, t0).unwrap();
    let o = StoredObject {
        key: "early".into(),
        version: early,
        offset: r2[0].offset,
        size: 100,
        checksum: 0x777,
    };
    st.objects_hashed(1, a, vec![o]).unwrap();
    st.put_end(7, "early", early, None, t0).unwrap();
    let d = st.get_replicas("early", t0).unwrap();
    assert!(!d.unhashed && d.checksum == 0x777);
    assert_eq!(st.counters.hashed_later, 2);

    // Unhashed when its store went away; its report after the restart brings the checksum.
    st.unmount(1, a, true, t0).unwrap();
    st.mount(3, pseg("a", 42), grant_key(), true, t0).unwrap();
    assert!(st
        .report(3, a, vec![hashed(0x123, id)], true, t0)
        .unwrap()
        .is_empty());
    let d = st.get_replicas("k", t0).unwrap();
    assert!(!d.unhashed && d.checksum == 0x123);
    // Hashed, a report of other bytes is refused as before.
    st.unmount(3, a, true, t0).unwrap();
    st.mount(4, pseg("a", 42), grant_key(), true, t0).unwrap();
    assert_eq!(
        st.report(4, a, vec![hashed(0x456, id)], true, t0)
            .unwrap()
            .len(),
        1
    );
}

fn tenants_file(text: &str) -> tenants::Quotas {
    tenants::Quotas::parse(text).unwrap()
}

#[test]
fn two_tenants_put_the_same_key_and_neither_sees_the_others_object() {
    let (mut st, t0) = state();
    st.set_tenants(tenants_file(
        "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"b\"\n",
    ));
    let (ka, kb) = (tenants::scoped("a", "k"), tenants::scoped("b", "k"));
    let da = put(&mut st, &ka, 100, 1, t0);
    let db = put(&mut st, &kb, 200, 2, t0);
    put(&mut st, "k", 300, 3, t0);
    assert_ne!(da.version, db.version);
    assert_eq!(st.get_replicas(&ka, t0).unwrap().size, 100);
    assert_eq!(st.get_replicas(&kb, t0).unwrap().size, 200);
    assert_eq!(st.get_replicas("k", t0).unwrap().size, 300);
    // Each tenant lists its own keys, as it names them.
    let all = regex::Regex::new("").unwrap();
    for t in ["a", "b", DEFAULT_TENANT] {
        assert_eq!(
            st.keys_matching(t, &all, 10),
            (vec!["k".to_string()], false),
            "{t}"
        );
        assert_eq!(st.keys_with_prefix(t, "k", 10).0, ["k"], "{t}");
    }
    // Clearing one namespace leaves the others.
    let later = t0 + Duration::from_secs(60);
    assert_eq!(st.remove_all("a", false, later), 1);
    assert!(!st.exists(&ka, later));
    assert!(st.exists(&kb, later) && st.exists("k", later));
    let usage = st.tenant_usage();
    let used = |t: &str| usage.iter().find(|u| u.name == t).map(|u| u.used_bytes);
    assert_eq!(
        (used("a"), used("b"), used(DEFAULT_TENANT)),
        (Some(0), Some(200), Some(300))
    );
    // A key that names no well-formed tenant, or one not served, is refused at its put.
    let e = st.put_start(7, "\u{1}a", 10, &ONE, t0).unwrap_err();
    assert_eq!(e.0, Status::InvalidParams, "{}", e.1);
    let e = st
        .put_start(7, &tenants::scoped("z", "k"), 10, &ONE, t0)
        .unwrap_err();
    assert_eq!(e.0, Status::TenantNotRegistered, "{}", e.1);
    assert!(e.1.contains("\"z\""), "{}", e.1);
    assert_eq!(
        st.check_tenant("z").unwrap_err().0,
        Status::TenantNotRegistered
    );
    // Reads of a tenant not served say so, as Mooncake's master does, rather than miss.
    let z = tenants::scoped("z", "k");
    assert_eq!(
        st.get_replicas(&z, t0).unwrap_err().0,
        Status::TenantNotRegistered
    );
    assert_eq!(
        st.remove(&z, true, t0).unwrap_err().0,
        Status::TenantNotRegistered
    );
    assert_eq!(st.unserved(&z).unwrap().0, Status::TenantNotRegistered);
    assert!(st.unserved(&kb).is_none() && st.unserved("k").is_none());
    assert_eq!(st.check_tenant("a b").unwrap_err().0, Status::InvalidParams);
}

#[test]
fn a_put_past_its_tenants_quota_is_refused_while_another_tenant_puts() {
    let (mut st, t0) = state(); // a 1 MiB pool
    st.set_tenants(tenants_file(
        "[[tenant]]\nname = \"a\"\nquota = \"1KiB\"\n[[tenant]]\nname = \"b\"\n",
    ));
    let a = |k: &str| tenants::scoped("a", k).into_owned();
    put(&mut st, &a("1"), 600, 1, t0);
    // A put in progress counts: a second one that would pass the quota is refused.
    let (id, _) = st.put_start(7, &a("2"), 400, &ONE, t0).unwrap();
    let e = st.put_start(7, &a("3"), 100, &ONE, t0).unwrap_err();
    assert_eq!(e.0, Status::QuotaExceeded, "{}", e.1);
    assert!(e.1.contains("holds 1000 bytes of 1024"), "{}", e.1);
    // The other tenant, and the default one, are not held back.
    put(&mut st, &tenants::scoped("b", "1"), 4096, 2, t0);
    put(&mut st, "1", 4096, 3, t0);
    // A put into a reservation is admitted when it is committed.
    let (rid, _) = st.reserve(7, &[200], &ONE, t0)[0].clone().unwrap();
    let e = st.put_end(7, &a("4"), rid, Some(1), t0).unwrap_err();
    assert_eq!(e.0, Status::QuotaExceeded, "{}", e.1);
    // The revoked put and a removed object make room again.
    st.put_revoke(7, &a("2"), id, t0).unwrap();
    put(&mut st, &a("3"), 400, 4, t0);
    st.remove(&a("1"), true, t0).unwrap();
    put(&mut st, &a("5"), 600, 5, t0);
    let usage = st.tenant_usage();
    let ua = usage.iter().find(|u| u.name == "a").unwrap();
    assert_eq!(
        (
            ua.used_bytes,
            ua.quota_bytes,
            ua.quota_in_force_bytes,
            ua.refused_puts
        ),
        (1000, Some(1024), Some(1024), 2)
    );
    assert_eq!(st.indexes.usage(), &st.recount_usage());
}

#[test]
fn quotas_that_add_up_past_the_pool_are_scaled_to_it() {
    let (mut st, t0) = state(); // a 1 MiB pool
    st.set_tenants(tenants_file(
        "[[tenant]]\nname = \"a\"\nquota = \"1536KiB\"\n[[tenant]]\nname = \"b\"\nquota = \"512KiB\"\n",
    ));
    let usage = st.tenant_usage();
    let in_force: Vec<_> = usage
        .iter()
        .map(|u| (u.name.as_str(), u.quota_in_force_bytes))
        .collect();
    assert_eq!(
        in_force,
        [
            ("a", Some(768 << 10)),
            ("b", Some(256 << 10)),
            (DEFAULT_TENANT, None)
        ]
    );
    let e = st
        .put_start(7, &tenants::scoped("b", "k"), (256 << 10) + 1, &ONE, t0)
        .unwrap_err();
    assert_eq!(e.0, Status::QuotaExceeded, "{}", e.1);
}

#[test]
fn eviction_takes_first_from_the_tenant_over_its_share() {
    let cfg = MasterConfig {
        default_kv_lease_ttl_ms: Millis(Duration::from_millis(1)),
        ..MasterConfig::default()
    };
    let mut st = master(cfg);
    let t0 = Instant::now();
    st.mount(1, seg("s", 64 << 10), grant_key(), false, t0)
        .unwrap();
    // Two tenants without quotas share the pool: 32 KiB each.
    st.set_tenants(tenants_file(
        "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"b\"\n",
    ));
    let mut now = t0;
    // b's objects are the oldest, but a holds more than its half: 2 KiB each, 2 ms apart.
    for (tenant, i) in (0..8).map(|i| ("b", i)).chain((0..24).map(|i| ("a", i))) {
        now += Duration::from_millis(2);
        put(
            &mut st,
            &tenants::scoped(tenant, &i.to_string()),
            2 << 10,
            1,
            now,
        );
    }
    now += Duration::from_millis(2);
    // The pool is full (64 KiB, a holding 48): another put of b's must evict.
    put(&mut st, &tenants::scoped("b", "more"), 4 << 10, 1, now);
    let kept_b = (0..8)
        .filter(|i| st.exists(&tenants::scoped("b", &format!("{i}")), now))
        .count();
    let kept_a = (0..24)
        .filter(|i| st.exists(&tenants::scoped("a", &format!("{i}")), now))
        .count();
    assert_eq!(kept_b, 8, "b, under its share, kept every object");
    assert!(kept_a < 24, "a gave up objects: {kept_a} left");
    assert!(st.counters.evicted_objects > 0);
    assert_eq!(st.indexes.usage(), &st.recount_usage());
}

/// A draining segment takes no new puts; its objects are copied to the others (the one with
/// the most room), each replica swapped once its copy lands; a copy that fails goes back and
/// is tried again; a key replaced meanwhile keeps its new value; the drain ends done.
#[test]
fn a_drained_segment_hands_every_object_over_and_takes_no_new_puts() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    for (client, name) in [(1, "a"), (2, "b"), (3, "c")] {
        st.mount(client, seg(name, 1 << 20), grant_key(), false, t0)
            .unwrap();
    }
    let a = st.segments.by_name("a").unwrap();
    let pinned = ReplicateConfig {
        preferred_segment: "a".into(),
        ..ONE
    };
    for i in 0..10 {
        let key = format!("k{i}");
        let (id, _) = st.put_start(7, &key, 1000, &pinned, t0).unwrap();
        st.put_end(7, &key, id, Some(i), t0).unwrap();
    }
    let on_a = |st: &mut MasterState| {
        (0..10)
            .filter(|i| {
                st.get_replicas(&format!("k{i}"), t0)
                    .is_ok_and(|d| d.replicas.iter().any(|r| r.segment_id == a))
            })
            .count()
    };
    assert_eq!(on_a(&mut st), 10, "placed on a as preferred");
    // A put begun before the drain and ended after it listed the keys is handed over too.
    let (late, late_replicas) = st.put_start(7, "late", 1000, &pinned, t0).unwrap();
    assert_eq!(late_replicas[0].segment_id, a);
    let status = st
        .start_drain("a", Duration::from_secs(60), true, t0)
        .unwrap();
    st.put_end(7, "late", late, Some(5), t0).unwrap();
    assert_eq!((status.state, status.objects), (DrainState::Draining, 10));
    assert!(st
        .start_drain("nope", Duration::from_secs(1), true, t0)
        .is_err());
    // New puts go elsewhere, even asked for a.
    for i in 0..5 {
        let (_, replicas) = st
            .put_start(7, &format!("new{i}"), 100, &pinned, t0)
            .unwrap();
        assert_ne!(replicas[0].segment_id, a);
    }
    // A key replaced while its copy is under way keeps the new value.
    let jobs = st.take_hand_overs(4, u64::MAX, t0);
    assert_eq!(jobs.len(), 4);
    assert!(jobs
        .iter()
        .all(|j| j.from_endpoint == "a:1" && j.to_endpoint != "a:1"));
    let replaced = jobs[0].key.clone();
    let (id, _) = st.put_start(7, &replaced, 500, &ONE, t0).unwrap();
    st.put_end(7, &replaced, id, Some(99), t0).unwrap();
    // One copy fails: tried again later.
    let failed = jobs[1].version;
    let mut results: Vec<(u64, Status)> = jobs.iter().map(|j| (j.version, Status::Ok)).collect();
    results[1].1 = Status::Internal;
    st.handed_over(&results, t0);
    let d = st.get_replicas(&replaced, t0).unwrap();
    assert_eq!((d.size, d.checksum), (500, 99), "the new value stays");
    loop {
        let jobs = st.take_hand_overs(3, u64::MAX, t0);
        if jobs.is_empty() {
            break;
        }
        let results: Vec<(u64, Status)> = jobs.iter().map(|j| (j.version, Status::Ok)).collect();
        st.handed_over(&results, t0);
    }
    assert_eq!(on_a(&mut st), 0);
    let late = st.get_replicas("late", t0).unwrap();
    assert_ne!(
        late.replicas[0].segment_id, a,
        "the late put was found and moved"
    );
    let status = st.drain_status(a, t0).unwrap();
    assert_eq!(status.state, DrainState::Done, "{status:?}");
    assert_eq!(status.failed, 1);
    assert_eq!(status.moved_objects, 10, "the replaced key needed no copy");
    // A store asking again sees the drain it ended; the admin API may start another.
    let client = st.segments.get(a).unwrap().client_id;
    let again = st
        .hand_over(client, a, Duration::from_secs(60), t0)
        .unwrap();
    assert_eq!(again.state, DrainState::Done);
    assert!(
        st.hand_over(client + 1, a, Duration::from_secs(60), t0)
            .is_err(),
        "not its own"
    );
    assert!(
        !st.hand_overs.contains(failed),
        "the failed copy was tried again and landed"
    );
    for i in 0..10 {
        let d = st.get_replicas(&format!("k{i}"), t0).unwrap();
        assert_eq!(d.replicas.len(), 1);
    }
    assert_eq!(st.drains(t0).len(), 1);
}

/// A key that cannot be taken now (its copy under way) is put back and looked at again on the
/// next call, without the call going round it forever.
#[test]
fn a_key_put_back_waits_for_the_next_call() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    st.mount(2, seg("b", 1 << 20), grant_key(), false, t0)
        .unwrap();
    let pinned = ReplicateConfig {
        preferred_segment: "a".into(),
        ..ONE
    };
    let (id, _) = st.put_start(7, "k", 100, &pinned, t0).unwrap();
    st.put_end(7, "k", id, Some(1), t0).unwrap();
    st.start_drain("a", Duration::from_secs(60), true, t0)
        .unwrap();
    let jobs = st.take_hand_overs(10, u64::MAX, t0);
    assert_eq!(jobs.len(), 1);
    // Its key queued again while the copy is under way: the next call returns at once.
    let a = st.segments.by_name("a").unwrap();
    st.hand_overs
        .drains
        .get_mut(&a)
        .unwrap()
        .queue
        .push_back("k".into());
    assert!(st.take_hand_overs(10, u64::MAX, t0).is_empty());
    st.handed_over(&[(jobs[0].version, Status::Ok)], t0);
    assert_eq!(st.drain_status(a, t0).unwrap().moved_objects, 1);
}

/// A drain whose objects find no room elsewhere, or that runs past its deadline, ends expired
/// with what is left where it was.
#[test]
fn a_drain_without_room_or_past_its_deadline_expires_and_leaves_objects_in_place() {
    let mut st = master(MasterConfig::default());
    let t0 = Instant::now();
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    st.mount(2, seg("b", 4096), grant_key(), false, t0).unwrap();
    let pinned = ReplicateConfig {
        preferred_segment: "a".into(),
        ..ONE
    };
    let (id, _) = st.put_start(7, "big", 100_000, &pinned, t0).unwrap();
    st.put_end(7, "big", id, Some(1), t0).unwrap();
    st.start_drain("a", Duration::from_secs(5), true, t0)
        .unwrap();
    let a = st.segments.by_name("a").unwrap();
    for _ in 0..10 {
        assert!(st.take_hand_overs(10, u64::MAX, t0).is_empty());
    }
    let s = st.drain_status(a, t0).unwrap();
    assert_eq!((s.state, s.no_room), (DrainState::Expired, 3), "{s:?}");
    assert!(st.get_replicas("big", t0).is_ok(), "left where it was");
    // Past its deadline: expired, whatever is queued.
    let mut st = master(MasterConfig::default());
    st.mount(1, seg("a", 1 << 20), grant_key(), false, t0)
        .unwrap();
    st.mount(2, seg("b", 1 << 20), grant_key(), false, t0)
        .unwrap();
    let (id, _) = st.put_start(7, "k", 100, &pinned, t0).unwrap();
    st.put_end(7, "k", id, Some(1), t0).unwrap();
    st.start_drain("a", Duration::from_secs(5), true, t0)
        .unwrap();
    assert!(st
        .take_hand_overs(10, u64::MAX, t0 + Duration::from_secs(6))
        .is_empty());
    let a = st.segments.by_name("a").unwrap();
    assert_eq!(st.drain_status(a, t0).unwrap().state, DrainState::Expired);
}
