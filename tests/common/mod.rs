//! Real processes on loopback for the integration tests: a master and stores started from the
//! built binary on free ports, killed (SIGKILL) or stopped (SIGTERM) at will, always reaped.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_rbgctl");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every 20 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    /// Sends SIGTERM and waits up to `within` for the process to exit by itself.
    pub fn sigterm_exits_within(&mut self, within: Duration) -> bool {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        wait_until(within, || matches!(self.child.try_wait(), Ok(Some(_))))
    }

    pub fn terminate(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// How a store was started, so that it can be started again the same way.
#[derive(Clone, Debug)]
pub struct StoreSpec {
    pub data_port: u16,
    pub metrics_port: u16,
    pub segment: u64,
    pub extra: Vec<String>,
    /// `None`: the cluster's directory.
    pub shm_dir: Option<PathBuf>,
}

impl StoreSpec {
    /// The segment name (and file stem) of this store.
    pub fn stem(&self) -> String {
        format!("127.0.0.1_{}", self.data_port)
    }
}

pub struct Cluster {
    pub master: Proc,
    pub stores: Vec<Proc>,
    /// Metrics port of each store, by index.
    pub store_metrics: Vec<u16>,
    pub store_specs: Vec<StoreSpec>,
    pub master_args: Vec<String>,
    pub rpc: String,
    pub metrics_port: u16,
    pub metadata_port: u16,
    pub shm_dir: tempfile::TempDir,
}

pub struct Opts {
    pub stores: usize,
    pub segment: u64,
    pub master_args: Vec<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            stores: 2,
            segment: 64 << 20,
            master_args: vec![],
        }
    }
}

/// Starts a master on the given loopback ports, with the HTTP metadata server on.
pub fn spawn_master(
    rpc_port: u16,
    metrics_port: u16,
    metadata_port: u16,
    extra: &[String],
) -> Proc {
    let child = Command::new(BIN)
        .args([
            "master",
            "--rpc-address",
            "127.0.0.1",
            "--rpc-port",
            &rpc_port.to_string(),
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            &metrics_port.to_string(),
            "--enable-http-metadata-server",
            "--http-metadata-server-host",
            "127.0.0.1",
            "--http-metadata-server-port",
            &metadata_port.to_string(),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Proc {
        child,
        name: "master".into(),
    }
}

impl Cluster {
    /// Kills the master (SIGKILL) and starts a new one on the same ports.
    pub fn restart_master(&mut self) {
        self.master.kill9();
        let rpc_port: u16 = self.rpc.rsplit(':').next().unwrap().parse().unwrap();
        self.master = spawn_master(
            rpc_port,
            self.metrics_port,
            self.metadata_port,
            &self.master_args,
        );
    }

    pub fn start(opts: Opts) -> Cluster {
        let (rpc_port, metrics_port, metadata_port) = (free_port(), free_port(), free_port());
        let rpc = format!("127.0.0.1:{rpc_port}");
        let master = spawn_master(rpc_port, metrics_port, metadata_port, &opts.master_args);
        assert!(
            wait_until(Duration::from_secs(10), || TcpStream::connect(&rpc).is_ok()),
            "master did not start"
        );
        let mut c = Cluster {
            master,
            stores: vec![],
            store_metrics: vec![],
            store_specs: vec![],
            master_args: opts.master_args.clone(),
            rpc,
            metrics_port,
            metadata_port,
            shm_dir: tempfile::tempdir().unwrap(),
        };
        for _ in 0..opts.stores {
            c.add_store(opts.segment);
        }
        let n = opts.stores;
        assert!(
            wait_until(Duration::from_secs(10), || c.segment_count() == n),
            "stores did not register"
        );
        c
    }

    pub fn add_store(&mut self, segment: u64) -> usize {
        self.add_store_with(segment, &[])
    }

    pub fn add_store_with(&mut self, segment: u64, extra: &[&str]) -> usize {
        // Both ports explicit: a kernel-chosen data port could reuse the one just probed.
        let metrics = free_port();
        let mut data = free_port();
        while data == metrics {
            data = free_port();
        }
        let spec = StoreSpec {
            data_port: data,
            metrics_port: metrics,
            segment,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            shm_dir: None,
        };
        self.store_metrics.push(metrics);
        self.store_specs.push(spec.clone());
        let child = self.store_command(&spec).spawn().unwrap();
        self.stores.push(Proc {
            child,
            name: format!("store-{}", self.stores.len()),
        });
        self.stores.len() - 1
    }

    /// Starts store `i` again (after a kill or stop) with the same name, ports and directory.
    pub fn restart_store(&mut self, i: usize) {
        self.stores[i].kill9();
        let spec = self.store_specs[i].clone();
        self.stores[i].child = self.store_command(&spec).spawn().unwrap();
    }

    /// Runs a store like store `i` but changed by `change`, expecting it to exit; returns its
    /// exit status and stderr. Killed after 20 s if it does not exit.
    pub fn run_store_expecting_exit(
        &self,
        i: usize,
        change: impl FnOnce(&mut StoreSpec),
    ) -> (bool, String) {
        let mut spec = self.store_specs[i].clone();
        change(&mut spec);
        let mut child = self
            .store_command(&spec)
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

    fn store_command(&self, spec: &StoreSpec) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "store",
            "--master",
            &self.rpc,
            "--bind-address",
            "127.0.0.1",
            "--local-hostname",
            "127.0.0.1",
            "--port",
            &spec.data_port.to_string(),
            "--segment-size",
            &spec.segment.to_string(),
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            &spec.metrics_port.to_string(),
            "--heartbeat-interval",
            "200ms",
        ])
        .arg("--shm-dir")
        .arg(spec.shm_dir.as_deref().unwrap_or(self.shm_dir.path()))
        .args(&spec.extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        cmd
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
        let mut cfg = rbgctl::client::ClientConfig::new(self.rpc.clone());
        cfg.same_host_shm = false;
        cfg.conn.io_timeout = Duration::from_secs(3);
        rbgctl::client::Client::connect(cfg).unwrap()
    }
}

/// A minimal HTTP/1.1 exchange (Connection: close), returning status and body.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

pub fn tmp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rbgctl-test-{}-{name}", std::process::id()))
}
