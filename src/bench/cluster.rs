//! The benchmarks' own cluster: a master and stores as separate processes of this executable on
//! loopback (started by `crate::launch`), which a benchmark can kill (SIGKILL) and start again
//! on the same ports and directory. Everything is stopped and the directory removed on drop.

use crate::launch::{self, Child, Launcher, Logs};
use crate::master::config::MasterConfig;
use crate::store::config::StoreConfig;
use crate::transfer::message::ListSegmentsResp;
use crate::transfer::{ConnOptions, Connection, Opcode};
use std::time::{Duration, Instant};

pub struct OwnCluster {
    pub master: String,
    pub master_metrics_port: u16,
    master_proc: Child<launch::Master>,
    stores: Vec<Child<launch::Store>>,
    /// The stores' segments, in memory (`/dev/shm`) as in production; removed on drop.
    shm_dir: std::path::PathBuf,
    /// The disk tier's files, in a new directory inside the one asked for; removed on drop.
    disk_dir: Option<std::path::PathBuf>,
    /// The cluster secret, when its roles require one.
    auth: Option<std::sync::Arc<crate::auth::Secret>>,
    /// The first store's settings, which [`OwnCluster::add_fresh_store`] starts from.
    store_base: StoreConfig,
    // Last: the run directory goes after the children.
    launcher: Launcher,
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

/// What the benchmarks' own cluster is made of.
pub struct OwnOpts {
    pub segment_size: u64,
    pub persistent: bool,
    /// The store's disk tier: a directory (its files go in a new directory inside, removed at
    /// the end) and the tier's size.
    pub disk_tier: Option<(std::path::PathBuf, u64)>,
    /// The master's settings (its addresses are chosen here).
    pub master: MasterConfig,
    /// The store serves RDMA on these devices too (`protocol = "rdma"`).
    pub rdma_device: Option<String>,
}

impl OwnCluster {
    /// Starts a master and one store, and waits until the store's segment is live.
    pub fn start(segment_size: u64, persistent: bool) -> anyhow::Result<OwnCluster> {
        OwnCluster::start_with(OwnOpts {
            segment_size,
            persistent,
            disk_tier: None,
            master: MasterConfig::default(),
            rdma_device: None,
        })
    }

    /// Starts a master and one store as `opts` says, and waits until its segments are live.
    pub fn start_with(opts: OwnOpts) -> anyhow::Result<OwnCluster> {
        let OwnOpts {
            segment_size,
            persistent,
            disk_tier,
            master,
            rdma_device,
        } = opts;
        anyhow::ensure!(
            segment_size >= 4096,
            "--segment-size: the store it starts needs at least 4 KiB, got {segment_size} bytes"
        );
        let launcher = Launcher::new(Logs::Null)?;
        let host = "127.0.0.1".to_string();
        // The store holds the master's cluster secret, if it has one.
        let auth_token_file = master.auth_token_file.clone();
        let auth = crate::auth::load(auth_token_file.as_deref())?;
        let master_proc = launcher.spawn::<launch::Master>(
            "master",
            MasterConfig {
                rpc_address: host.clone(),
                rpc_port: 0,
                metrics_host: host.clone(),
                metrics_port: 0,
                ..master
            },
        )?;
        let master = master_proc.addrs.rpc.to_string();
        let run = format!(
            "rbgctl-bench-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let shm_dir = std::path::PathBuf::from(format!("/dev/shm/{run}"));
        let disk_tier = match disk_tier {
            Some((dir, size)) => {
                let mine = dir.join(&run);
                std::fs::create_dir(&mine)
                    .map_err(|e| anyhow::anyhow!("disk tier directory {}: {e}", mine.display()))?;
                Some((mine, size))
            }
            None => None,
        };
        let store_base = StoreConfig {
            master: master.clone(),
            bind_address: host.clone(),
            local_hostname: host.clone(),
            // A stable name: a restarted persistent store finds its segment again.
            name: Some("bench-store-0".into()),
            segment_size: crate::config::ByteSize(segment_size),
            persistent,
            metrics_host: host,
            metrics_port: 0,
            shm_dir: shm_dir.clone(),
            auth_token_file,
            protocol: if rdma_device.is_some() {
                crate::transfer::Transport::Rdma
            } else {
                crate::transfer::Transport::Tcp
            },
            device: rdma_device.unwrap_or_default(),
            ..StoreConfig::default()
        };
        let store = launcher.spawn::<launch::Store>(
            "store-0",
            StoreConfig {
                disk_tier: disk_tier.as_ref().map(|(dir, _)| dir.clone()),
                disk_tier_size: crate::config::ByteSize(disk_tier.as_ref().map_or(0, |(_, n)| *n)),
                ..store_base.clone()
            },
        )?;
        let segments = if disk_tier.is_some() { 2 } else { 1 };
        let c = OwnCluster {
            master,
            master_metrics_port: master_proc.addrs.metrics.port(),
            master_proc,
            stores: vec![store],
            shm_dir,
            disk_dir: disk_tier.map(|(dir, _)| dir),
            auth,
            store_base,
            launcher,
        };
        c.wait_live_segments(segments, Duration::from_secs(30))?;
        // The store serves at once and faults its pages in behind; measuring starts once that
        // work is done, so it neither competes for the cores nor leaves faults to the writes.
        let port = c.store_metrics_port(0);
        let t0 = Instant::now();
        while scrape(port, "rbgctl_store_segment_prefault_ended") != Some(1.0) {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(600),
                "the store did not fault its {segment_size}-byte segment in within 600 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(c)
    }

    /// Starts one more store, of `segment_size` bytes, that leaves its pages to fault in on
    /// their first write (`prefault = false`): memory as fresh as a store's just after its
    /// start. Answers its index and segment name once its segment is live.
    pub fn add_fresh_store(&mut self, segment_size: u64) -> anyhow::Result<(usize, String)> {
        let i = self.stores.len();
        let name = format!("bench-store-fresh-{i}");
        let live = self.live_segments().unwrap_or(0);
        let store = self.launcher.spawn::<launch::Store>(
            &format!("store-{i}"),
            StoreConfig {
                name: Some(name.clone()),
                segment_size: crate::config::ByteSize(segment_size),
                prefault: false,
                ..self.store_base.clone()
            },
        )?;
        self.stores.push(store);
        self.wait_live_segments(live + 1, Duration::from_secs(30))?;
        Ok((i, name))
    }

    /// Stops store `i` (it unmounts its segment) and waits until the master no longer counts
    /// its segment live.
    pub fn stop_store(&mut self, i: usize) -> anyhow::Result<()> {
        let live = self.live_segments().unwrap_or(0);
        self.stores[i].stop();
        self.wait_live_segments(live.saturating_sub(1), Duration::from_secs(30))?;
        Ok(())
    }

    /// Starts the master again (after `kill_master`) on the same ports.
    pub fn start_master(&mut self) -> anyhow::Result<()> {
        Ok(self.master_proc.start()?)
    }

    /// Starts store `i` again (after `kill_store`) with the same name, ports and directory.
    pub fn start_store(&mut self, i: usize) -> anyhow::Result<()> {
        Ok(self.stores[i].start()?)
    }

    pub fn kill_store(&mut self, i: usize) {
        self.stores[i].kill();
    }

    pub fn kill_master(&mut self) {
        self.master_proc.kill();
    }

    pub fn store_metrics_port(&self, i: usize) -> u16 {
        self.stores[i].addrs.metrics.port()
    }

    /// Store `i`'s data port.
    pub fn store_data_addr(&self, i: usize) -> std::net::SocketAddr {
        self.stores[i].addrs.data
    }

    /// The master's metrics/admin port and, when it serves one, its metadata server.
    pub fn master_http_addrs(&self) -> (std::net::SocketAddr, Option<std::net::SocketAddr>) {
        (
            self.master_proc.addrs.metrics,
            self.master_proc.addrs.metadata,
        )
    }

    /// Process ids of the master and store `i` (while they run).
    pub fn pids(&self, i: usize) -> (Option<u32>, Option<u32>) {
        (self.master_proc.process.pid(), self.stores[i].process.pid())
    }

    /// Live segments the master lists, or `None` while it cannot be reached.
    pub fn live_segments(&self) -> Option<usize> {
        let opts = ConnOptions {
            connect_timeout: Duration::from_millis(200),
            io_timeout: Duration::from_secs(2),
            spin: Duration::ZERO,
            auth: self.auth.clone(),
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
        // Stores first, so that they unmount from a master that is still there.
        for s in self.stores.iter_mut() {
            s.stop();
        }
        self.master_proc.stop();
        let _ = std::fs::remove_dir_all(&self.shm_dir);
        if let Some(dir) = &self.disk_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// One sample of a Prometheus text metric from `127.0.0.1:port/metrics`.
pub fn scrape(port: u16, name: &str) -> Option<f64> {
    crate::telemetry::sample(&metrics_text(port)?, name)
}

/// The Prometheus text of `127.0.0.1:port/metrics`.
pub fn metrics_text(port: u16) -> Option<String> {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .ok()?
        .text()
        .ok()
}
