//! The benchmarks' own cluster: a master and stores as separate processes of this executable on
//! loopback (started by `crate::launch`), which a benchmark can kill (SIGKILL) and start again
//! on the same ports and directory. Everything is stopped and the directory removed on drop.

use crate::launch::{Dir, Launcher, Logs, Pool, PoolSpec};
use crate::master::config::MasterConfig;
use std::time::{Duration, Instant};

/// A benchmark's own master and stores, stopped and cleaned up on drop.
pub struct OwnCluster {
    pub master: String,
    pub master_metrics_port: u16,
    pool: Pool,
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
        let mut spec = PoolSpec::loopback(1, segment_size);
        spec.name = "rbgctl-bench".into();
        spec.master = MasterConfig {
            rpc_port: 0,
            metrics_port: 0,
            ..master
        };
        // A stable name: a restarted persistent store finds its segment again.
        spec.store_prefix = "bench-store-".into();
        spec.store.persistent = persistent;
        if let Some(device) = rdma_device {
            spec.store.protocol = crate::transfer::Transport::Rdma;
            spec.store.device = device;
        }
        spec.disk_tier =
            disk_tier.map(|(dir, size)| (Dir::Inside(dir), crate::config::ByteSize(size)));
        let pool = Pool::start(&Launcher::new(Logs::Null)?, spec)?;
        let c = OwnCluster {
            master: pool.rpc.clone(),
            master_metrics_port: pool.master().addrs.metrics.port(),
            pool,
        };
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
        let live = self.live_segments().unwrap_or(0);
        let i = self.pool.stores.len();
        let name = format!("bench-store-fresh-{i}");
        self.pool.add_store_with(|c| {
            c.name = Some(name.clone());
            c.segment_size = crate::config::ByteSize(segment_size);
            c.prefault = false;
            // Memory only: the fresh store measures a segment, not a disk tier.
            c.disk_tier = None;
            c.disk_tier_size = crate::config::ByteSize(0);
        })?;
        self.wait_live_segments(live + 1, Duration::from_secs(30))?;
        Ok((i, name))
    }

    /// Stops store `i` (it unmounts its segment) and waits until the master no longer counts
    /// its segment live.
    pub fn stop_store(&mut self, i: usize) -> anyhow::Result<()> {
        let live = self.live_segments().unwrap_or(0);
        self.pool.stores[i].stop();
        self.wait_live_segments(live.saturating_sub(1), Duration::from_secs(30))?;
        Ok(())
    }

    /// Starts the master again (after `kill_master`) on the same ports.
    pub fn start_master(&mut self) -> anyhow::Result<()> {
        Ok(self.pool.master_mut().start()?)
    }

    /// Starts store `i` again (after `kill_store`) with the same name, ports and directory.
    pub fn start_store(&mut self, i: usize) -> anyhow::Result<()> {
        Ok(self.pool.stores[i].start()?)
    }

    /// Sends store `i` SIGKILL.
    pub fn kill_store(&mut self, i: usize) {
        self.pool.stores[i].kill();
    }

    /// Sends the master SIGKILL.
    pub fn kill_master(&mut self) {
        self.pool.master_mut().kill();
    }

    /// The `/metrics` port of store `i`.
    pub fn store_metrics_port(&self, i: usize) -> u16 {
        self.pool.stores[i].addrs.metrics.port()
    }

    /// Store `i`'s data port.
    pub fn store_data_addr(&self, i: usize) -> std::net::SocketAddr {
        self.pool.stores[i].addrs.data
    }

    /// The master's metrics/admin port and, when it serves one, its metadata server.
    pub fn master_http_addrs(&self) -> (std::net::SocketAddr, Option<std::net::SocketAddr>) {
        (
            self.pool.master().addrs.metrics,
            self.pool.master().addrs.metadata,
        )
    }

    /// Process ids of the master and store `i` (while they run).
    pub fn pids(&self, i: usize) -> (Option<u32>, Option<u32>) {
        (
            self.pool.master().process.pid(),
            self.pool.stores[i].process.pid(),
        )
    }

    /// Live segments the master lists, or `None` while it cannot be reached.
    pub fn live_segments(&self) -> Option<usize> {
        self.pool.live_segments()
    }

    /// Polls (every 2 ms) until `n` segments are live; returns how long it took.
    pub fn wait_live_segments(&self, n: usize, timeout: Duration) -> anyhow::Result<Duration> {
        Ok(self.pool.wait_live_segments(n, timeout)?)
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
