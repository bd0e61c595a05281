//! The benchmarks' own cluster: a master and stores as separate processes of this executable on
//! loopback, which a benchmark can kill (SIGKILL) and start again on the same ports and
//! directory. Everything is stopped and the directory removed on drop.

use crate::transfer::message::ListSegmentsResp;
use crate::transfer::{ConnOptions, Connection, Opcode};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub struct OwnCluster {
    pub master: String,
    pub master_metrics_port: u16,
    rpc_port: u16,
    master_proc: Option<Child>,
    stores: Vec<(StoreSpec, Option<Child>)>,
    shm_dir: PathBuf,
}

/// How a store of the cluster is started.
#[derive(Clone, Debug)]
pub struct StoreSpec {
    pub segment_size: u64,
    pub persistent: bool,
    pub data_port: u16,
    pub metrics_port: u16,
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn stop(child: &mut Child, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !matches!(child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The master a pool benchmark runs against: `existing`, or a master and one store started here
/// and kept running as long as the returned cluster lives.
pub fn master_or_own(
    existing: Option<&str>,
    segment_size: u64,
    persistent: bool,
    progress: impl Fn(&str),
) -> anyhow::Result<(String, Option<OwnCluster>)> {
    if let Some(m) = existing {
        return Ok((m.to_string(), None));
    }
    progress(&format!(
        "starting a master and a store (separate processes, loopback, persistent: {persistent})"
    ));
    let c = OwnCluster::start(segment_size, persistent)?;
    Ok((c.master.clone(), Some(c)))
}

impl OwnCluster {
    /// Starts a master and one store, and waits until the store's segment is live.
    pub fn start(segment_size: u64, persistent: bool) -> anyhow::Result<OwnCluster> {
        let mut c = OwnCluster {
            master: String::new(),
            master_metrics_port: free_port()?,
            rpc_port: free_port()?,
            master_proc: None,
            stores: Vec::new(),
            shm_dir: PathBuf::from(format!("/dev/shm/rbgctl-bench-{}", std::process::id())),
        };
        c.master = format!("127.0.0.1:{}", c.rpc_port);
        c.start_master()?;
        c.stores.push((
            StoreSpec {
                segment_size,
                persistent,
                data_port: free_port()?,
                metrics_port: free_port()?,
            },
            None,
        ));
        c.start_store(0)?;
        c.wait_live_segments(1, Duration::from_secs(30))?;
        Ok(c)
    }

    pub fn start_master(&mut self) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        let child = Command::new(exe)
            .args([
                "master",
                "--rpc-address",
                "127.0.0.1",
                "--rpc-port",
                &self.rpc_port.to_string(),
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                &self.master_metrics_port.to_string(),
            ])
            .env("RBGCTL_LOG", "warn")
            .spawn()?;
        self.master_proc = Some(child);
        Ok(())
    }

    pub fn start_store(&mut self, i: usize) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        let spec = self.stores[i].0.clone();
        let child = Command::new(exe)
            .args([
                "store",
                "--master",
                &self.master,
                "--bind-address",
                "127.0.0.1",
                "--local-hostname",
                "127.0.0.1",
                "--port",
                &spec.data_port.to_string(),
                "--segment-size",
                &spec.segment_size.to_string(),
                "--persistent",
                &spec.persistent.to_string(),
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                &spec.metrics_port.to_string(),
            ])
            .arg("--shm-dir")
            .arg(&self.shm_dir)
            .env("RBGCTL_LOG", "warn")
            .spawn()?;
        self.stores[i].1 = Some(child);
        Ok(())
    }

    pub fn kill_store(&mut self, i: usize) {
        if let Some(mut c) = self.stores[i].1.take() {
            stop(&mut c, nix::sys::signal::Signal::SIGKILL);
        }
    }

    pub fn kill_master(&mut self) {
        if let Some(mut c) = self.master_proc.take() {
            stop(&mut c, nix::sys::signal::Signal::SIGKILL);
        }
    }

    pub fn store_metrics_port(&self, i: usize) -> u16 {
        self.stores[i].0.metrics_port
    }

    /// Live segments the master lists, or `None` while it cannot be reached.
    pub fn live_segments(&self) -> Option<usize> {
        let opts = ConnOptions {
            connect_timeout: Duration::from_millis(200),
            io_timeout: Duration::from_secs(2),
            spin: Duration::ZERO,
        };
        Connection::connect(&self.master, &opts)
            .and_then(|mut c| c.call::<_, ListSegmentsResp>(Opcode::ListSegments, &()))
            .ok()
            .map(|r| r.segments.len())
    }

    /// Polls (every 2 ms) until `n` segments are live; returns how long it took.
    pub fn wait_live_segments(&self, n: usize, timeout: Duration) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        loop {
            if self.live_segments() == Some(n) {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > timeout {
                anyhow::bail!("{n} live segment(s) not reached within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for (_, c) in self.stores.iter_mut() {
            if let Some(c) = c.as_mut() {
                stop(c, nix::sys::signal::Signal::SIGTERM);
            }
        }
        if let Some(c) = self.master_proc.as_mut() {
            stop(c, nix::sys::signal::Signal::SIGTERM);
        }
        let _ = std::fs::remove_dir_all(&self.shm_dir);
    }
}

/// One sample of a Prometheus text metric from `127.0.0.1:port/metrics`.
pub fn scrape(port: u16, name: &str) -> Option<f64> {
    let body = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .ok()?
        .text()
        .ok()?;
    crate::telemetry::sample(&body, name)
}
