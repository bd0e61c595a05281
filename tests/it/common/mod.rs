//! Real processes on loopback for the integration tests, started through `rbgctl::launch` (the
//! same machinery as `rbgctl up` and the benchmarks): a master and stores of the built binary on
//! kernel-chosen ports, killed (SIGKILL) or stopped (SIGTERM) at will, always reaped. Their logs
//! are in the launcher's run directory and quoted when one fails to start.

#![allow(dead_code)]

pub mod pictures;
pub mod wheel;

use rbgctl::config::{ByteSize, Millis};
use rbgctl::launch::{Dir, Launcher, Logs, Pool, PoolSpec};
use rbgctl::master::config::MasterConfig;
use rbgctl::store::config::StoreConfig;
use rbgctl::transfer::rpc;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_rbgctl");

/// Where skipped tests are listed, a line each, for `.ci/run` to print after the run.
pub const SKIPPED_FILE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/skipped-tests.txt");

/// Says that the running test is skipped and why: on standard error (hidden by the harness when the test
/// passes) and as a line of `SKIPPED_FILE`, which `.ci/run` prints. Under `CI=true` a test is
/// never skipped: a missing tool is a failure.
pub fn skip(why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    assert!(
        std::env::var_os("CI").is_none(),
        "{test} cannot run under CI: {why}"
    );
    note_skip(&test, why);
}

/// Lists `test` as skipped (stderr and `SKIPPED_FILE`), for a skip decided elsewhere (the
/// Python suite's own).
pub fn note_skip(test: &str, why: &str) {
    eprintln!("SKIPPED: {test}: {why}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(SKIPPED_FILE)
    {
        let _ = writeln!(f, "SKIPPED {test}: {why}");
    }
}

/// The processes whose parent is `pid`, with their command lines (from `/proc`).
pub fn children_of(pid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // The command name is in parentheses and may hold spaces: fields follow the last ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmd = std::fs::read(format!("/proc/{child}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (ppid == pid).then_some((child, cmd))
        })
        .collect()
}

/// Whether process `pid` is gone (or a zombie waiting for its parent).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// One launcher for a whole test binary (its children's logs outlive each test). A static is
/// never dropped, so its run directory is removed when the process exits.
pub fn shared_launcher() -> &'static Launcher {
    static SHARED: std::sync::OnceLock<Launcher> = std::sync::OnceLock::new();
    extern "C" fn remove_run_dir() {
        if let Some(l) = SHARED.get() {
            let _ = std::fs::remove_dir_all(l.dir());
        }
    }
    SHARED.get_or_init(|| {
        // SAFETY: registers a plain function to run at exit; it only removes a directory.
        unsafe { libc::atexit(remove_run_dir) };
        launcher()
    })
}

/// A launcher of the built binary that logs each child to a file in its run directory.
pub fn launcher() -> Launcher {
    Launcher::with_exe(PathBuf::from(BIN), Logs::File).expect("a run directory")
}

pub use rbgctl::testkit::wait_until;

/// Writes `tiers.toml` in `dir` for `bench tiers`: one store, one SIMULATED engine whose
/// device cache is far smaller than a conversation, so that the tiers differ; its path.
pub fn small_tiers_config(dir: &std::path::Path) -> PathBuf {
    let cfg = dir.join("tiers.toml");
    std::fs::write(
        &cfg,
        "[pool]\nstores = 1\nsegment_size = \"64MiB\"\n[engines]\ncount = 1\ndevice_cache_tokens = 2048\n\
         host_cache_tokens = 4096\nbytes_per_token = 512\nprefill_us_per_token = 20.0\ndecode_ms_per_token = 1.0\n",
    )
    .expect("the tiers config is written");
    cfg
}

/// `bench multiturn` against 127.0.0.1:`port`: `clients` conversations of `rounds` rounds
/// (256 prompt tokens, 4 output tokens) at `rate` requests/s, no log file.
pub fn multiturn_command(
    port: &str,
    clients: usize,
    rounds: usize,
    rate: &str,
) -> std::process::Command {
    let mut c = std::process::Command::new(BIN);
    c.args(["bench", "multiturn", "--host", "127.0.0.1", "--port", port])
        .args([
            "--num-clients",
            &clients.to_string(),
            "--num-rounds",
            &rounds.to_string(),
        ])
        .args([
            "--request-length",
            "256",
            "--output-length",
            "4",
            "--disable-auto-run",
        ])
        .args(["--request-rate", rate, "--log-file", ""]);
    c
}

/// A router's command line on loopback, its ports chosen by the kernel, then `extra`.
pub fn router_argv(extra: &[&str]) -> Vec<String> {
    [
        "router",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--prometheus-port",
        "0",
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// A master config on loopback, every port chosen by the kernel, the metadata server on.
pub fn loopback_master(base: MasterConfig) -> MasterConfig {
    MasterConfig {
        rpc_address: "127.0.0.1".into(),
        rpc_port: 0,
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        enable_http_metadata_server: true,
        http_metadata_server_host: "127.0.0.1".into(),
        http_metadata_server_port: 0,
        ..base
    }
}

/// A pool (`rbgctl::launch::Pool`) with the tests' helpers; derefs to the pool (`master`,
/// `stores`, `rpc`).
pub struct Cluster {
    pub pool: Pool,
    pub launcher: Launcher,
    /// Metrics port of each store, by index.
    pub store_metrics: Vec<u16>,
    pub metrics_port: u16,
    pub metadata_port: u16,
}

impl std::ops::Deref for Cluster {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        &self.pool
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }
}

pub struct Opts {
    pub stores: usize,
    pub segment: u64,
    /// The master's settings (its addresses are set by the cluster).
    pub master: MasterConfig,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            stores: 2,
            segment: 64 << 20,
            master: MasterConfig::default(),
        }
    }
}

impl Cluster {
    /// Kills the master (SIGKILL) and starts a new one on the same ports.
    pub fn restart_master(&mut self) {
        self.pool
            .master_mut()
            .start()
            .expect("the master starts again");
    }

    /// A master on loopback (`loopback_master`) and `opts.stores` stores of its
    /// `opts.segment` bytes, their segments in a temporary directory, heartbeating every
    /// 200 ms; the stores hold the master's cluster secret, if it has one.
    pub fn start(opts: Opts) -> Cluster {
        let launcher = launcher();
        let mut spec = PoolSpec::loopback(opts.stores, opts.segment);
        spec.name = "rbgctl-test".into();
        spec.master = loopback_master(opts.master);
        spec.store.heartbeat_interval_ms = Millis(Duration::from_millis(200));
        spec.shm_dir = Dir::Inside(std::env::temp_dir());
        let pool = Pool::start(&launcher, spec).expect("the pool starts");
        let a = pool.master().addrs.clone();
        Cluster {
            store_metrics: pool.stores.iter().map(|s| s.addrs.metrics.port()).collect(),
            pool,
            launcher,
            metrics_port: a.metrics.port(),
            metadata_port: a.metadata.map_or(0, |m| m.port()),
        }
    }

    /// The config store `i` of this cluster gets with a segment of `segment` bytes: a stable
    /// name (`store-<i>`), so that a restart finds its segment again.
    pub fn store_config(&self, i: usize, segment: u64) -> StoreConfig {
        StoreConfig {
            segment_size: ByteSize(segment),
            ..self.pool.store_config(i)
        }
    }

    pub fn add_store(&mut self, segment: u64) -> usize {
        self.add_store_with(segment, |_| {})
    }

    /// Adds a store configured as `store_config` says, then changed by `change`.
    pub fn add_store_with(&mut self, segment: u64, change: impl FnOnce(&mut StoreConfig)) -> usize {
        let i = self
            .pool
            .add_store_with(|cfg| {
                cfg.segment_size = ByteSize(segment);
                change(cfg)
            })
            .expect("the store starts");
        self.store_metrics
            .push(self.pool.stores[i].addrs.metrics.port());
        i
    }

    /// Starts store `i` again (after a kill or stop) with the same name, ports and directory.
    pub fn restart_store(&mut self, i: usize) {
        self.pool.stores[i].start().expect("the store starts again");
    }

    /// The file stem of store `i`'s segment and index files.
    pub fn store_stem(&self, i: usize) -> String {
        let name = self.stores[i].config.name.clone().unwrap_or_default();
        rbgctl::store::segment::file_stem(&name)
    }

    /// Runs a store like store `i` but changed by `change`, expecting it to exit; returns its
    /// exit status and stderr. Killed after 20 s if it does not exit.
    pub fn run_store_expecting_exit(
        &self,
        i: usize,
        change: impl FnOnce(&mut StoreConfig),
    ) -> (bool, String) {
        let mut cfg = self.stores[i].config.clone();
        change(&mut cfg);
        let path = self
            .launcher
            .dir()
            .join(format!("store-{i}-expecting-exit.toml"));
        std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
        let mut child = std::process::Command::new(BIN)
            .arg("store")
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status.is_some_and(|s| s.success()), err)
    }

    /// A store's metric value (first sample of `name`), or `None`.
    pub fn store_metric(&self, i: usize, name: &str) -> Option<f64> {
        let (_, body) = http(self.store_metrics[i], "GET", "/metrics", b"");
        rbgctl::telemetry::sample(&body, name)
    }

    /// Waits until store `i` says it is mounted (for a persistent store: its report is done and
    /// the master serves its objects again).
    pub fn wait_store_mounted(&self, i: usize) -> bool {
        wait_until(Duration::from_secs(15), || {
            self.store_metric(i, "rbgctl_store_mounted") == Some(1.0)
        })
    }

    /// A master metric value, or `None`.
    pub fn master_metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics");
        rbgctl::telemetry::sample(&body, name)
    }

    pub fn http_get(&self, path: &str) -> (u16, String) {
        http(self.metrics_port, "GET", path, b"")
    }

    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.http_get("/api/v1/status").1).unwrap()
    }

    /// The admin API's view of one object (`/api/v1/objects?key=`).
    pub fn object(&self, key: &str) -> serde_json::Value {
        let (code, body) = self.http_get(&format!("/api/v1/objects?key={key}"));
        assert_eq!(code, 200, "{key}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The segment names holding the current replicas of `key`.
    pub fn replica_segments(&self, key: &str) -> Vec<String> {
        self.object(key)["current"]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["segment"].as_str().unwrap().to_string())
            .collect()
    }

    /// Segments that are live (mounted and serving).
    pub fn segment_count(&self) -> usize {
        let (code, body) = self.http_get("/api/v1/segments");
        if code != 200 {
            return 0;
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["segments"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|s| s["state"] == "live").count())
    }

    pub fn client(&self) -> rbgctl::client::Client {
        self.client_as(rbgctl::transfer::tenant::DEFAULT_TENANT)
    }

    /// A client whose keys live in `tenant`'s namespace.
    pub fn client_as(&self, tenant: &str) -> rbgctl::client::Client {
        let mut cfg = rbgctl::client::ClientConfig::new(self.rpc.clone())
            .with_tenant(tenant)
            .unwrap();
        cfg.same_host_shm = false;
        cfg.conn.io_timeout = Duration::from_secs(3);
        rbgctl::client::Client::connect(cfg).unwrap()
    }

    /// A put of `size` bytes of `key` started at the master over its RPC, as a client of
    /// `client_id` starts one: the master's answer (with its grants) and the endpoint of the
    /// store its first replica goes to.
    pub fn start_put(
        &self,
        client_id: u64,
        key: &str,
        size: u64,
    ) -> (rbgctl::transfer::message::PutStartResp, String) {
        use rbgctl::transfer::message::*;
        use rbgctl::transfer::{ConnOptions, Connection};
        let mut master = Connection::connect(&self.rpc, &ConnOptions::default()).unwrap();
        let _: PingResp = master.call::<rpc::Ping>(&PingReq { client_id }).unwrap();
        let req = PutStartReq {
            client_id,
            key: key.into(),
            size,
            config: ReplicateConfig::default(),
        };
        let started: PutStartResp = master.call::<rpc::PutStart>(&req).unwrap();
        let listed: ListSegmentsResp = master.call::<rpc::ListSegments>(&()).unwrap();
        let endpoint = listed
            .segments
            .iter()
            .find(|s| s.id == started.replicas[0].segment_id)
            .map(|s| s.info.endpoint.clone())
            .expect("the replica's segment is listed");
        (started, endpoint)
    }
}

/// A minimal HTTP/1.1 exchange (Connection: close), returning status and body.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    http_at("127.0.0.1", port, method, path, body)
}

/// `http` to another host (a container's address); status 0 when it cannot connect in 2 s.
pub fn http_at(host: &str, port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    http_within(host, port, method, path, body, Duration::from_secs(5))
}

/// `http_at` that waits at most `wait` for the answer (a paused process answers nothing).
pub fn http_within(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    wait: Duration,
) -> (u16, String) {
    let Some(addr) = format!("{host}:{port}")
        .parse::<std::net::SocketAddr>()
        .ok()
    else {
        return (0, String::new());
    };
    let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(wait)).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    exchange(s, head.as_bytes(), body)
}

/// Writes `head` and `body` on `s` (a request with `Connection: close`) and reads the answer to
/// its end: the status code (0 when none came) and the body.
pub fn exchange(mut s: TcpStream, head: &[u8], body: &[u8]) -> (u16, String) {
    if s.write_all(head).and_then(|_| s.write_all(body)).is_err() {
        return (0, String::new());
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status_code(&text), body)
}

/// The status code of an HTTP answer's text (0 when it has none).
pub fn status_code(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

pub fn tmp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rbgctl-test-{}-{name}", std::process::id()))
}

/// A test CA, and PEM files of a server certificate (localhost, 127.0.0.1) and a client
/// certificate it signed, in `dir`: (ca, server cert, server key, client cert, client key).
pub fn test_pki(dir: &std::path::Path) -> [std::path::PathBuf; 5] {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "rbgctl test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let server = leaf(
        vec!["localhost".into(), "127.0.0.1".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let client = leaf(vec![], ExtendedKeyUsagePurpose::ClientAuth);
    let files = [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", server.0),
        ("server.key", server.1),
        ("client.pem", client.0),
        ("client.key", client.1),
    ];
    files.map(|(name, text)| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    })
}
