//! Master high availability with real etcd members and real masters, stores and clients:
//! failover under a put/get loop, a paused leader fenced, etcd member loss, etcd lost and back,
//! and Mooncake's flag spellings.

use crate::common;
use rbgctl::transfer::rpc;

use common::{launcher, loopback_master, wait_until};
use nix::sys::signal::Signal;
use rbgctl::client::{Client, ClientConfig, ReplicateConfig};
use rbgctl::config::{ByteSize, Millis};
use rbgctl::ha::etcd_server::{etcd_program, EtcdCluster};
use rbgctl::launch::{self, Child, Dir, Pool, PoolSpec};
use rbgctl::master::config::MasterConfig;
use rbgctl::store::config::StoreConfig;
use rbgctl::transfer::message::{KeyReq, PutStartReq, PutStartResp};
use rbgctl::transfer::{ConnOptions, Connection, Opcode, Status, TransferError};
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(2);

/// etcd is needed; CI installs it (Debian's etcd-server). Elsewhere a missing etcd skips.
fn etcd_or_skip(members: usize, dir: &std::path::Path) -> Option<EtcdCluster> {
    if etcd_program().is_none() {
        common::skip("no etcd program (apt-get install etcd-server)");
        return None;
    }
    Some(EtcdCluster::start(members, dir).expect("etcd starts"))
}

/// A pool whose masters elect a leader through etcd; derefs to the `launch::Pool`
/// (`masters`, `stores`). Dropped in field order: the pool, then etcd, then the directory.
struct HaPool {
    pool: Pool,
    etcd: EtcdCluster,
    cluster_id: String,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for HaPool {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        &self.pool
    }
}

impl std::ops::DerefMut for HaPool {
    fn deref_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }
}

fn ha_master(endpoints: &str, cluster_id: &str) -> MasterConfig {
    loopback_master(MasterConfig {
        enable_ha: true,
        ha_backend_connstring: endpoints.to_string(),
        cluster_id: cluster_id.to_string(),
        ha_lease_ttl_ms: Millis(TTL),
        client_ttl_ms: Millis(Duration::from_secs(3)),
        ..MasterConfig::default()
    })
}

impl HaPool {
    fn start(etcd_members: usize, masters: usize, stores: usize) -> Option<HaPool> {
        HaPool::start_with(etcd_members, masters, stores, true)
    }

    /// `persistent`: whether the stores keep their objects across their own restarts.
    fn start_with(
        etcd_members: usize,
        masters: usize,
        stores: usize,
        persistent: bool,
    ) -> Option<HaPool> {
        HaPool::start_configured(etcd_members, masters, stores, persistent, |_, _| {})
    }

    /// As `start_with`, the masters' settings changed by `configure` (given the pool's
    /// temporary directory).
    fn start_configured(
        etcd_members: usize,
        masters: usize,
        stores: usize,
        persistent: bool,
        configure: impl FnOnce(&mut MasterConfig, &std::path::Path),
    ) -> Option<HaPool> {
        let dir = tempfile::tempdir().unwrap();
        let etcd = etcd_or_skip(etcd_members, &dir.path().join("etcd"))?;
        let cluster_id = format!("test-{}", std::process::id());
        let mut spec = PoolSpec::loopback(stores, 32 << 20);
        spec.name = "rbgctl-test-ha".into();
        spec.masters = masters;
        spec.master = ha_master(&etcd.endpoints(), &cluster_id);
        configure(&mut spec.master, dir.path());
        spec.store.heartbeat_interval_ms = Millis(Duration::from_millis(200));
        spec.store.persistent = persistent;
        spec.shm_dir = Dir::At(dir.path().join("shm"));
        let pool = Pool::start(&launcher(), spec)
            .expect("the masters elect a leader and the stores mount");
        Some(HaPool {
            pool,
            etcd,
            cluster_id,
            _dir: dir,
        })
    }

    /// The master address clients and stores are given.
    fn spec(&self) -> String {
        format!("etcd://{}/{}", self.etcd.endpoints(), self.cluster_id)
    }

    fn health(&self, i: usize) -> Option<serde_json::Value> {
        let m = &self.pool.masters[i];
        m.pid()?;
        health(m.addrs.metrics.port())
    }

    fn epoch(&self, i: usize) -> u64 {
        self.health(i)
            .map_or(0, |h| h["epoch"].as_u64().unwrap_or(0))
    }

    /// The leader's `/api/v1/segments`: status and body (0 without a leader).
    fn segments_body(&self) -> (u16, String) {
        let Some(l) = self.leader() else {
            return (0, String::new());
        };
        common::http(
            self.pool.masters[l].addrs.metrics.port(),
            "GET",
            "/api/v1/segments",
            b"",
        )
    }

    fn segments_at_leader(&self) -> usize {
        let (code, body) = self.segments_body();
        if code != 200 {
            return 0;
        }
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["segments"].as_array().map(Vec::len))
            .unwrap_or(0)
    }

    fn client(&self) -> Client {
        Client::connect(ClientConfig::new(self.spec())).expect("a client connects through etcd")
    }

    fn client_as(&self, tenant: &str) -> Client {
        let cfg = ClientConfig::new(self.spec()).with_tenant(tenant).unwrap();
        Client::connect(cfg).expect("a client connects through etcd")
    }

    /// A metric of the leader's, if there is a leader that has it.
    fn leader_metric(&self, name: &str) -> Option<f64> {
        let l = self.leader()?;
        let port = self.pool.masters[l].addrs.metrics.port();
        let (_, body) = common::http(port, "GET", "/metrics", b"");
        rbgctl::telemetry::sample(&body, name)
    }
}

/// A master's `/health`, waited for at most 300 ms (a paused master answers nothing).
fn health(metrics_port: u16) -> Option<serde_json::Value> {
    let (code, body) = common::http_within(
        "127.0.0.1",
        metrics_port,
        "GET",
        "/health",
        b"",
        Duration::from_millis(300),
    );
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

fn value(key: &str) -> Vec<u8> {
    let mut v = format!("{key}:").into_bytes();
    v.resize(4096, key.len() as u8);
    v
}

fn signal(child: &Child<launch::Master>, sig: Signal) {
    let pid = child.pid().expect("running") as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("signal sent");
}

#[test]
fn kill_9_of_the_leader_under_a_put_get_loop_loses_no_committed_object() {
    let Some(mut pool) = HaPool::start(1, 2, 2) else {
        return;
    };
    let client = pool.client();
    let cfg = ReplicateConfig::default();
    let mut committed = Vec::new();
    for i in 0..200 {
        let key = format!("before-{i}");
        client
            .put(&key, &value(&key), &cfg)
            .expect("put before the failover");
        committed.push(key);
    }
    let old = pool.leader().expect("a leader");
    let old_epoch = pool.epoch(old);
    pool.masters[old].kill();
    let killed = Instant::now();

    // Keep putting and getting: errors are allowed while there is no leader, and every put
    // that succeeded must stay readable.
    let mut first_put_after: Option<Duration> = None;
    let mut failed = 0;
    let mut i = 0;
    while killed.elapsed() < Duration::from_secs(20) && (first_put_after.is_none() || i < 50) {
        let key = format!("during-{i}");
        match client.put(&key, &value(&key), &cfg) {
            Ok(()) => {
                first_put_after.get_or_insert(killed.elapsed());
                committed.push(key);
                i += 1;
            }
            Err(_) => {
                failed += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let probe = &committed[i % committed.len().min(200)];
        let _ = client.get(probe);
    }
    let first = first_put_after.expect("a put succeeded after the leader was killed");
    let new = pool.leader().expect("a new leader");
    assert_ne!(new, old);
    assert!(
        pool.epoch(new) > old_epoch,
        "the new leader's epoch is higher"
    );

    // Every committed object comes back, byte-exact, once the stores have reported.
    let all_readable = wait_until(Duration::from_secs(15), || {
        committed
            .iter()
            .all(|k| client.get(k).is_ok_and(|v| v == value(k)))
    });
    let missing: Vec<&String> = committed
        .iter()
        .filter(|k| !client.get(k).is_ok_and(|v| v == value(k)))
        .take(5)
        .collect();
    assert!(
        all_readable,
        "objects lost across the failover: {missing:?} ..."
    );
    eprintln!(
        "failover: first put {first:?} after the kill, {failed} failed attempts, {} objects checked",
        committed.len()
    );
}

/// Issue 40, item 1: a store without a durable index is alive through the failover and holds
/// the bytes and their records: the new leader learns them from it. Half the puts go over TCP,
/// half are same-host copies into the store's memory (sealed, so that the store records them).
#[test]
fn kill_9_of_the_leader_keeps_every_object_of_a_running_non_persistent_store() {
    let Some(mut pool) = HaPool::start_with(1, 2, 1, false) else {
        return;
    };
    let shm = pool.client();
    let tcp = Client::connect(ClientConfig {
        same_host_shm: false,
        ..ClientConfig::new(pool.spec())
    })
    .expect("a TCP client connects");
    let cfg = ReplicateConfig::default();
    let keys: Vec<String> = (0..200).map(|i| format!("np-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let client = if i % 2 == 0 { &shm } else { &tcp };
        client
            .put(key, &value(key), &cfg)
            .expect("put acknowledged");
    }
    let (code, body) = pool.segments_body();
    assert_eq!(code, 200);
    assert!(body.contains("\"persistent\":false"), "{body}");
    let old = pool.leader().expect("a leader");
    pool.masters[old].kill();
    assert!(
        wait_until(Duration::from_secs(20), || pool
            .leader()
            .is_some_and(|l| l != old)),
        "a standby takes over"
    );
    let all = wait_until(Duration::from_secs(20), || {
        keys.iter().all(|k| tcp.get(k).is_ok_and(|v| v == value(k)))
    });
    let lost = keys
        .iter()
        .filter(|k| !tcp.get(k).is_ok_and(|v| v == value(k)))
        .count();
    assert!(
        all,
        "{lost} of 200 acknowledged objects lost across the failover"
    );
    // The same-host reader too, and the store was not mounted afresh: it kept its memory.
    assert!(keys.iter().all(|k| shm.get(k).is_ok_and(|v| v == value(k))));
}

/// Issue 66: a failover keeps every tenant's quota (every master reads the tenants file) and
/// every tenant's objects, each in its own namespace; the new leader counts each tenant's
/// bytes again from the stores' reports and refuses a put past a quota as the old one did.
#[test]
fn a_failover_keeps_every_tenants_quota_and_objects() {
    let Some(mut pool) = HaPool::start_configured(1, 2, 1, true, |m, dir| {
        let file = dir.join("tenants.toml");
        std::fs::write(
            &file,
            "[[tenant]]\nname = \"a\"\nquota = \"1MiB\"\n[[tenant]]\nname = \"b\"\n",
        )
        .unwrap();
        m.tenants_file = Some(file);
    }) else {
        return;
    };
    let cfg = ReplicateConfig::default();
    let (default, a, b) = (pool.client(), pool.client_as("a"), pool.client_as("b"));
    for (client, v) in [(&default, "default's"), (&a, "a's"), (&b, "b's")] {
        client
            .put("k", v.as_bytes(), &cfg)
            .expect("put acknowledged");
    }
    let big = vec![7u8; 600 << 10];
    a.put("big/0", &big, &cfg).expect("within a's quota");
    let used_a = r#"rbgctl_master_tenant_used_bytes{tenant="a"}"#;
    let a_bytes = (big.len() + 3) as f64;
    assert_eq!(pool.leader_metric(used_a), Some(a_bytes));
    let old = pool.leader().expect("a leader");
    pool.masters[old].kill();
    assert!(
        wait_until(Duration::from_secs(20), || pool
            .leader()
            .is_some_and(|l| l != old)),
        "a standby takes over"
    );
    assert!(
        wait_until(Duration::from_secs(20), || {
            [(&default, "default's"), (&a, "a's"), (&b, "b's")]
                .iter()
                .all(|(c, v)| c.get("k").is_ok_and(|got| got == v.as_bytes()))
        }),
        "every tenant reads its own object after the failover"
    );
    assert!(
        wait_until(Duration::from_secs(20), || pool.leader_metric(used_a)
            == Some(a_bytes)),
        "the new leader counts a's bytes: {:?}",
        pool.leader_metric(used_a)
    );
    let e = a.put("big/1", &big, &cfg).unwrap_err();
    assert_eq!(e.status(), Some(Status::QuotaExceeded), "{e}");
    b.put("big/1", &big, &cfg).expect("b is not held back");
    assert_eq!(a.keys("", 10).unwrap().0, ["big/0", "k"]);
}

#[test]
fn a_paused_leader_is_fenced_and_a_request_it_held_is_refused() {
    let Some(pool) = HaPool::start(1, 2, 1) else {
        return;
    };
    let old = pool.leader().expect("a leader");
    let old_epoch = pool.epoch(old);
    // A connection straight to the leader, as a client that has not heard of any failover.
    let rpc = pool.masters[old].addrs.rpc.to_string();
    let mut conn = Connection::connect(&rpc, &ConnOptions::default()).expect("connects");
    let _: bool = conn
        .call::<rpc::Exists>(&KeyReq { key: "k".into() })
        .expect("the leader answers");

    signal(&pool.masters[old], Signal::SIGSTOP);
    let stopped = Instant::now();
    let other = 1 - old;
    assert!(
        wait_until(Duration::from_secs(10), || pool.leader() == Some(other)),
        "the standby did not take over from the paused leader"
    );
    let took_over = stopped.elapsed();
    // A request sent to the paused leader waits in its socket until it continues.
    let id = conn
        .send(
            Opcode::Exists,
            &rbgctl::transfer::message::Wire::to_meta(&KeyReq { key: "k".into() }),
            &[],
        )
        .expect("sent");
    std::thread::sleep(Duration::from_millis(200));
    signal(&pool.masters[old], Signal::SIGCONT);
    match conn.recv(id) {
        Err(TransferError::Remote { status, message }) => {
            assert_eq!(status, Status::NotLeader, "{message}");
        }
        other => panic!("the fenced leader answered {other:?}"),
    }
    assert!(
        wait_until(Duration::from_secs(5), || pool
            .health(old)
            .is_some_and(|h| h["role"] == "standby")),
        "the old leader did not step down"
    );
    assert!(pool.epoch(other) > old_epoch);
    // The store follows the leader and mounts there; then a client through etcd puts and
    // reads back.
    assert!(
        wait_until(Duration::from_secs(10), || pool.segments_at_leader() == 1),
        "the store did not mount at the new leader"
    );
    let client = pool.client();
    client
        .put("after", &value("after"), &ReplicateConfig::default())
        .expect("a put at the new leader");
    assert_eq!(client.get("after").unwrap(), value("after"));
    eprintln!("standby took over {took_over:?} after the leader was paused");
}

#[test]
fn losing_one_etcd_member_of_three_does_not_fail_over() {
    let Some(mut pool) = HaPool::start(3, 2, 1) else {
        return;
    };
    let leader = pool.leader().expect("a leader");
    let epoch = pool.epoch(leader);
    let client = pool.client();
    pool.etcd.kill(0);
    let until = Instant::now() + TTL * 3;
    let mut n = 0;
    while Instant::now() < until {
        let key = format!("k{n}");
        client
            .put(&key, &value(&key), &ReplicateConfig::default())
            .expect("puts go on with two of three etcd members");
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(pool.leader(), Some(leader), "the leader kept its lease");
    assert_eq!(pool.epoch(leader), epoch, "no election happened");
    assert!(n > 10);
}

#[test]
fn with_etcd_gone_the_masters_stop_answering_and_come_back_with_it() {
    let Some(mut pool) = HaPool::start(1, 2, 1) else {
        return;
    };
    let client = pool.client();
    client
        .put("kept", &value("kept"), &ReplicateConfig::default())
        .expect("put");
    pool.etcd.kill(0);
    // Within a lease, no master leads: writes are refused rather than risked.
    assert!(
        wait_until(TTL * 3, || pool.leader().is_none()),
        "a master kept leading without etcd"
    );
    let refused = client.put("during", &value("during"), &ReplicateConfig::default());
    assert!(refused.is_err(), "a put was accepted with no leader");
    pool.etcd.restart(0).expect("etcd comes back");
    assert!(
        wait_until(Duration::from_secs(20), || pool.leader().is_some()),
        "no leader after etcd came back"
    );
    assert!(
        wait_until(Duration::from_secs(15), || client
            .get("kept")
            .is_ok_and(|v| v == value("kept"))),
        "the object put before etcd went away is not readable again"
    );
    client
        .put("after", &value("after"), &ReplicateConfig::default())
        .expect("puts work again");
}

#[test]
fn mooncake_master_spellings_elect_through_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = etcd_or_skip(1, &dir.path().join("etcd")) else {
        return;
    };
    let launcher = launcher();
    let link = dir.path().join("mooncake_master");
    std::os::unix::fs::symlink(common::BIN, &link).unwrap();
    let argv: Vec<String> = [
        "--rpc_address=127.0.0.1",
        "--rpc_port=0",
        "--metrics_port=0",
        "--metrics_host=127.0.0.1",
        "--enable_ha=true",
        &format!("--etcd_endpoints={}", etcd.endpoints()),
        "--cluster_id=spellings",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let m: launch::Spawned<rbgctl::master::Addrs> = launcher
        .spawn_program(&link, "mooncake-master", &argv, &[])
        .expect("mooncake_master starts");
    let port = m.addrs.metrics.port();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (code, body) = common::http(port, "GET", "/health", b"");
            code == 200 && body.contains("\"role\":\"leader\"")
        }),
        "mooncake_master --enable_ha did not become leader: {}",
        m.process.log()
    );
    let (_, metrics) = common::http(port, "GET", "/metrics", b"");
    assert!(
        metrics.contains("rbgctl_master_ha_role{role=\"leader\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rbgctl_master_ha_elections_won_total 1"),
        "{metrics}"
    );
}

#[test]
fn masters_elect_on_a_kubernetes_lease_and_fail_over() {
    use rbgctl::testkit::apiserver::ApiServer;
    const NS: &str = "pool";
    let api = ApiServer::new();
    let port = api.serve().expect("the API stand-in listens");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, ApiServer::kubeconfig(port, NS)).unwrap();
    let launcher = launcher();
    let spawn = |i: usize| -> launch::Spawned<rbgctl::master::Addrs> {
        let cfg = loopback_master(MasterConfig {
            enable_ha: true,
            ha_backend: rbgctl::master::config::HaBackend::K8s,
            ha_backend_connstring: format!("{NS}/rbgctl-master"),
            ha_lease_ttl_ms: Millis(TTL),
            ..MasterConfig::default()
        });
        let path = dir.path().join(format!("master-{i}.toml"));
        std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
        let argv = [
            "master".to_string(),
            "--config".into(),
            path.display().to_string(),
        ];
        launcher
            .spawn_argv_with_env(
                &format!("k8s-master-{i}"),
                &argv,
                &[("KUBECONFIG", &kubeconfig)],
            )
            .expect("a master starts")
    };
    let mut masters = vec![spawn(0), spawn(1)];
    let role = |m: &launch::Spawned<rbgctl::master::Addrs>| -> Option<(String, u64)> {
        m.process.pid()?;
        let h = health(m.addrs.metrics.port())?;
        Some((
            h["role"].as_str()?.to_string(),
            h["epoch"].as_u64().unwrap_or(0),
        ))
    };
    let leader = |masters: &[launch::Spawned<rbgctl::master::Addrs>]| {
        (0..masters.len()).find(|&i| role(&masters[i]).is_some_and(|(r, _)| r == "leader"))
    };
    assert!(
        wait_until(Duration::from_secs(15), || leader(&masters).is_some()),
        "no master took the Lease"
    );
    let old = leader(&masters).unwrap();
    let old_epoch = role(&masters[old]).unwrap().1;
    let lease = api
        .get("leases", NS, "rbgctl-master")
        .expect("the Lease exists");
    let view = lease["metadata"]["annotations"]["rbgctl.io/master-view"]
        .as_str()
        .expect("the leader's view is annotated");
    assert!(
        view.contains(&masters[old].addrs.rpc.port().to_string()),
        "{view}"
    );
    assert_eq!(lease["spec"]["leaseTransitions"].as_u64(), Some(old_epoch));
    assert_eq!(
        role(&masters[1 - old]).map(|(r, _)| r).as_deref(),
        Some("standby")
    );

    // A store and `rbgctl kv` given the Lease as their master follow its leader.
    let spec = format!("k8s://{NS}/rbgctl-master");
    let store_cfg = StoreConfig {
        master: spec.clone(),
        bind_address: "127.0.0.1".into(),
        local_hostname: "127.0.0.1".into(),
        name: Some("k8s-store".into()),
        segment_size: ByteSize(32 << 20),
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        port: 0,
        heartbeat_interval_ms: Millis(Duration::from_millis(200)),
        shm_dir: dir.path().join("shm"),
        ..StoreConfig::default()
    };
    let store_path = dir.path().join("store.toml");
    std::fs::write(&store_path, toml::to_string(&store_cfg).unwrap()).unwrap();
    let _store: launch::Spawned<rbgctl::store::Addrs> = launcher
        .spawn_argv_with_env(
            "k8s-store",
            &[
                "store".into(),
                "--config".into(),
                store_path.display().to_string(),
            ],
            &[("KUBECONFIG", &kubeconfig)],
        )
        .expect("a store starts");
    let kv = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new(common::BIN)
            .args(["kv", "--master", &spec])
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert!(
        wait_until(Duration::from_secs(15), || kv(&["put", "lease-key", "v1"])
            .is_some()),
        "rbgctl kv could not put through the Lease's leader"
    );

    masters[old].process.kill();
    let killed = Instant::now();
    assert!(
        wait_until(Duration::from_secs(15), || leader(&masters)
            == Some(1 - old)),
        "the standby did not take the Lease over"
    );
    eprintln!(
        "Lease taken over {:?} after the leader was killed",
        killed.elapsed()
    );
    let new_epoch = role(&masters[1 - old]).unwrap().1;
    assert!(new_epoch > old_epoch, "{new_epoch} > {old_epoch}");
    let lease = api.get("leases", NS, "rbgctl-master").unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"].as_u64(), Some(new_epoch));
    assert!(
        wait_until(Duration::from_secs(15), || kv(&["get", "lease-key"])
            .as_deref()
            == Some("v1")),
        "the object put before the failover is not readable through the new leader"
    );
}

#[test]
fn a_leader_partitioned_from_etcd_stops_answering_before_a_standby_takes_over() {
    use rbgctl::testkit::proxy::DelayProxy;
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = etcd_or_skip(3, &dir.path().join("etcd")) else {
        return;
    };
    // master-0 reaches every etcd member through a proxy that can cut the link.
    let proxies: Vec<DelayProxy> = etcd
        .members
        .iter()
        .map(|m| DelayProxy::start(m.endpoint().parse().unwrap(), Duration::ZERO).expect("proxy"))
        .collect();
    let through: Vec<String> = proxies.iter().map(|p| p.addr.to_string()).collect();
    let cluster_id = "partition";
    let launcher = launcher();
    let m0 = launcher
        .spawn::<launch::Master>("master-0", ha_master(&through.join(";"), cluster_id))
        .expect("master-0 starts");
    let role = |m: &Child<launch::Master>| -> Option<String> {
        health(m.addrs.metrics.port())?["role"]
            .as_str()
            .map(str::to_string)
    };
    assert!(
        wait_until(Duration::from_secs(10), || role(&m0).as_deref()
            == Some("leader")),
        "master-0 did not lead"
    );
    let m1 = launcher
        .spawn::<launch::Master>("master-1", ha_master(&etcd.endpoints(), cluster_id))
        .expect("master-1 starts");
    assert!(wait_until(Duration::from_secs(5), || role(&m1).as_deref()
        == Some("standby")));
    let mut stale = Connection::connect(&m0.addrs.rpc.to_string(), &ConnOptions::default())
        .expect("connects to master-0");

    for p in &proxies {
        p.partition();
    }
    let cut = Instant::now();
    let (mut m0_down, mut m1_up) = (None, None);
    while cut.elapsed() < Duration::from_secs(15) && (m0_down.is_none() || m1_up.is_none()) {
        if m0_down.is_none() && role(&m0).as_deref() == Some("standby") {
            m0_down = Some(cut.elapsed());
        }
        if m1_up.is_none() && role(&m1).as_deref() == Some("leader") {
            m1_up = Some(cut.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (m0_down, m1_up) = (
        m0_down.expect("master-0 never stepped down"),
        m1_up.expect("master-1 never took over"),
    );
    assert!(
        m0_down < m1_up,
        "master-0 answered as leader until {m0_down:?}, master-1 led from {m1_up:?}"
    );
    // master-0 still has its clients, but accepts no write.
    let refused: Result<PutStartResp, _> = stale.call::<rpc::PutStart>(&PutStartReq {
        client_id: 9,
        key: "k".into(),
        size: 4096,
        config: Default::default(),
    });
    assert!(
        matches!(
            &refused,
            Err(TransferError::Remote {
                status: Status::NotLeader,
                ..
            })
        ),
        "{refused:?}"
    );
    // Healed, master-0 finds master-1 leading and stands by.
    for p in &proxies {
        p.heal();
    }
    // Once master-0 has read etcd again it names master-1, at master-1's epoch, as the leader.
    let m1_epoch = health(m1.addrs.metrics.port()).unwrap()["epoch"].clone();
    let m1_rpc = m1.addrs.rpc.to_string();
    assert!(
        wait_until(Duration::from_secs(10), || health(m0.addrs.metrics.port())
            .is_some_and(
                |h| h["leader"] == m1_rpc.as_str() && h["epoch"] == m1_epoch
            )),
        "master-0 did not find master-1 leading: {:?}",
        health(m0.addrs.metrics.port())
    );
    assert_eq!(role(&m0).as_deref(), Some("standby"));
    assert_eq!(role(&m1).as_deref(), Some("leader"));
    eprintln!("partitioned leader stepped down after {m0_down:?}, standby led after {m1_up:?}");
}

#[test]
fn a_standby_sends_admin_and_metadata_requests_to_the_leader() {
    let Some(pool) = HaPool::start(1, 2, 0) else {
        return;
    };
    let leader = pool.leader().expect("a leader");
    let standby = 1 - leader;
    let l = &pool.masters[leader].addrs;
    let s = &pool.masters[standby].addrs;
    // Until a standby has seen the leader's view it answers 503 (no leader known).
    assert!(
        wait_until(Duration::from_secs(10), || pool
            .health(standby)
            .is_some_and(
                |h| h["leader"].as_str() == Some(l.rpc.to_string().as_str())
            )),
        "the standby does not know the leader"
    );
    let head = |port: u16, path: &str| -> String {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        use std::io::{Read, Write};
        write!(
            conn,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).unwrap();
        out
    };
    let r = head(s.metadata.unwrap().port(), "/metadata?key=a");
    assert!(r.starts_with("HTTP/1.1 307"), "{r}");
    let location = format!(
        "http://127.0.0.1:{}/metadata?key=a",
        l.metadata.unwrap().port()
    );
    assert!(
        r.to_ascii_lowercase()
            .contains(&format!("location: {location}")),
        "{r}"
    );
    let r = head(s.metrics.port(), "/api/v1/status");
    assert!(r.starts_with("HTTP/1.1 307"), "{r}");
    assert!(
        r.contains(&format!("127.0.0.1:{}/api/v1/status", l.metrics.port())),
        "{r}"
    );
    // Its own metrics and health stay its own.
    let r = head(s.metrics.port(), "/metrics");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        r.contains("rbgctl_master_ha_role{role=\"standby\"} 1"),
        "{r}"
    );
    let r = head(l.metadata.unwrap().port(), "/metadata?key=a");
    assert!(
        r.starts_with("HTTP/1.1 404"),
        "the leader answers itself: {r}"
    );
    // The status pages: the standby's its own, pointing at the leader's; the leader's its pool.
    let r = head(s.metrics.port(), "/ui");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        r.contains("standby") && r.contains(&format!("http://{}/ui", l.metrics)),
        "{r}"
    );
    let r = head(l.metrics.port(), "/ui");
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("leader (epoch "),
        "{r}"
    );
    assert!(
        r.contains("Segments (0)") && r.contains("No store has mounted"),
        "{r}"
    );
}

#[test]
fn a_master_that_cannot_reach_etcd_stands_by_and_says_why() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = closed.local_addr().unwrap().to_string();
    drop(closed);
    let launcher = launcher();
    let m = launcher
        .spawn::<launch::Master>("master", ha_master(&endpoint, "unreachable"))
        .expect("the master starts even without etcd");
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (code, body) = common::http(m.addrs.metrics.port(), "GET", "/health", b"");
            code == 200 && body.contains("\"role\":\"standby\"") && body.contains(&endpoint)
        }),
        "no standby with the etcd error in /health: {}",
        m.log()
    );
    let mut conn = Connection::connect(&m.addrs.rpc.to_string(), &ConnOptions::default()).unwrap();
    let r: Result<bool, _> = conn.call::<rpc::Exists>(&KeyReq { key: "k".into() });
    assert!(
        matches!(&r, Err(TransferError::Remote { status: Status::NotLeader, message }) if message.contains("no leader is known")),
        "{r:?}"
    );
}

#[test]
fn a_bad_etcd_endpoint_list_is_a_start_up_error_naming_the_setting() {
    let out = std::process::Command::new(common::BIN)
        .args(["master", "--enable-ha", "--etcd-endpoints", "h1;h2:2379"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--etcd-endpoints") && err.contains("no port"),
        "{err}"
    );
}

/// Issue 40, item 23: a store looking for its master under another cluster id than the masters
/// were elected under says which id it looks under and which ids have a leader.
#[test]
fn a_store_under_the_wrong_cluster_id_names_the_id_it_looks_under_and_those_it_sees() {
    let Some(mut pool) = HaPool::start(1, 1, 0) else {
        return;
    };
    let wrong = format!("etcd://{}/not-{}", pool.etcd.endpoints(), pool.cluster_id);
    let i = pool
        .add_store_with(|s| {
            s.master = wrong;
            s.segment_size = ByteSize(4 << 20);
            s.persistent = false;
        })
        .expect("the store starts and keeps looking");
    let store = &pool.stores[i];
    let want_own = format!("\"not-{}\"", pool.cluster_id);
    let want_seen = format!("\"{}\"", pool.cluster_id);
    assert!(
        wait_until(Duration::from_secs(15), || {
            let log = store.log();
            log.contains(&want_own) && log.contains(&want_seen)
        }),
        "{}",
        store.log()
    );
}

/// Issue 63: a connected Mooncake wheel (a process with a global segment, putting and getting)
/// across a failover of rbgctl's masters. The wheel reads no etcd: it is given one address in
/// front of the masters that goes to whichever leads, as a Kubernetes Service over the ready
/// master does (here a forwarder that asks each master's `/health`). The leader is killed: the
/// wheel's calls fail while no one leads, its Pings are answered NEED_REMOUNT by the new leader
/// and it mounts its segment again, its puts resume, and what it put on rbgctl's persistent
/// store before the kill is still there (the store recorded each at its `PutEnd`, and reports
/// them to the new leader).
#[test]
fn a_wheel_behind_one_address_rides_a_master_failover() {
    let Some(python) = common::wheel::python() else {
        return;
    };
    let Some(mut pool) = HaPool::start(1, 2, 1) else {
        return;
    };
    let masters: Vec<(std::net::SocketAddr, u16)> = pool
        .masters
        .iter()
        .map(|m| (m.addrs.rpc, m.addrs.metrics.port()))
        .collect();
    let front = LeaderFront::start(masters);
    let mut wheel = common::wheel::putter(&python, &front.addr.to_string());
    assert_eq!(wheel.line(), "setup 0");
    let client = pool.client();
    let wheel_mounted = |c: &Client| {
        c.segments()
            .is_ok_and(|v| v.iter().any(|s| s.info.endpoint.is_empty()))
    };
    assert!(wait_until(Duration::from_secs(10), || wheel_mounted(
        &client
    )));
    // The wheel puts on rbgctl's store (by preference: its own segment could take them too,
    // and what a process's own segment holds is not kept across a failover, as with Mooncake).
    let store = client
        .segments()
        .unwrap()
        .into_iter()
        .find(|s| !s.info.endpoint.is_empty())
        .unwrap()
        .info
        .name;
    for i in 0..20 {
        wheel.send(&format!("before-{i} {store}"));
        assert_eq!(wheel.line(), format!("put before-{i} 0 True"));
    }
    let old = pool.leader().expect("a leader");
    // `/ready`: 200 on the leader alone, 503 on the standby (what the front goes by).
    let ready: Vec<u16> = pool
        .masters
        .iter()
        .map(|m| common::http(m.addrs.metrics.port(), "GET", "/ready", b"").0)
        .collect();
    let mut expected = vec![503; ready.len()];
    expected[old] = 200;
    assert_eq!(ready, expected);
    pool.masters[old].kill();
    // A new leader; the wheel's segment mounted there again (its Pings told it to remount).
    assert!(wait_until(Duration::from_secs(30), || pool
        .leader()
        .is_some_and(|l| l != old)));
    assert!(
        wait_until(Duration::from_secs(30), || wheel_mounted(&client)),
        "the wheel did not mount its segment on the new leader"
    );
    // Puts resume (the first ones may meet the failover: retried until one succeeds).
    let resumed = wait_until(Duration::from_secs(30), || {
        wheel.send(&format!("after {store}"));
        wheel.line() == "put after 0 True"
    });
    assert!(resumed, "the wheel's puts did not resume");
    // What it put before the kill on rbgctl's persistent store is all there.
    for i in 0..20 {
        let key = format!("before-{i}");
        let on_store = wait_until(Duration::from_secs(15), || {
            client
                .get(&key)
                .is_ok_and(|v| v == key.repeat(100).into_bytes())
        });
        assert!(on_store, "{key} was lost in the failover");
    }
    drop(wheel);
    drop(front);
}

/// One address in front of the masters: each connection goes to the master whose `/ready`
/// answers 200 when the connection opens (a Kubernetes Service over the ready master).
struct LeaderFront {
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl LeaderFront {
    fn start(masters: Vec<(std::net::SocketAddr, u16)>) -> LeaderFront {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let accept = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((inbound, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let leader = masters.iter().find(|(_, http)| {
                        common::http_within(
                            "127.0.0.1",
                            *http,
                            "GET",
                            "/ready",
                            b"",
                            Duration::from_millis(300),
                        )
                        .0 == 200
                    });
                    let Some(Ok(outbound)) = leader.map(|(rpc, _)| {
                        std::net::TcpStream::connect_timeout(rpc, Duration::from_secs(1))
                    }) else {
                        continue; // no leader now: the connection is closed
                    };
                    inbound.set_nonblocking(false).unwrap();
                    for (mut from, mut to) in [
                        (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                        (outbound, inbound),
                    ] {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(std::net::Shutdown::Both);
                            let _ = from.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            })
        };
        LeaderFront {
            addr,
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for LeaderFront {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}
