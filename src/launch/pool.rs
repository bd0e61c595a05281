//! A pool on this host — a master and its stores as processes of this executable — built from
//! one [`PoolSpec`]: `rbgctl up`, the benchmarks' own cluster and the tests all start theirs
//! here. The pool stops its stores first (they unmount from a master still there), then its
//! master, and removes the directories it made.

use super::{Child, LaunchError, Launcher, Master, Store};
use crate::config::ByteSize;
use crate::master::config::MasterConfig;
use crate::store::config::StoreConfig;
use crate::transfer::rpc;
use crate::transfer::{ConnOptions, Connection};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a pool of processes could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("{what} {}: {source}", path.display())]
    Dir {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no master led within {timeout:?}")]
    NoLeader { timeout: Duration },
    #[error("a client to ask the masters which leads: {0}")]
    Health(String),
    #[error("the pool's cluster secret: {0}")]
    Auth(String),
    #[error(
        "the master at {master} did not list {want} live segments within {timeout:?} \
         (it listed {listed:?})"
    )]
    NotReady {
        master: String,
        want: usize,
        listed: Option<usize>,
        timeout: Duration,
    },
}

/// Where a directory of the pool is.
#[derive(Clone, Debug)]
pub enum Dir {
    /// A new directory inside this one, made for the pool and removed with it.
    Inside(PathBuf),
    /// This directory, which outlives the pool.
    At(PathBuf),
}

/// What a pool is made of.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// The start of the name of the directories the pool makes (`<name>-<pid>-<random>`).
    pub name: String,
    /// The address every part binds and advertises.
    pub host: String,
    /// The master's settings. Its RPC, metrics and metadata addresses are set to `host` (the
    /// ports are kept: 0 lets the kernel choose).
    pub master: MasterConfig,
    /// How many masters run: with `master.enable_ha` they elect a leader through
    /// `master.ha_backend_connstring`, and stores are given `etcd://<endpoints>/<cluster_id>`.
    pub masters: usize,
    pub stores: usize,
    /// What every store starts from. The pool sets its name (`<store_prefix><i>`), master,
    /// addresses, segment directory, disk tier and cluster secret.
    pub store: StoreConfig,
    pub store_prefix: String,
    /// The stores' segments (memory files).
    pub shm_dir: Dir,
    /// Each store's disk tier, of this size, in this directory.
    pub disk_tier: Option<(Dir, ByteSize)>,
    /// How long the stores' segments may take to be listed live.
    pub ready_timeout: Duration,
    /// Keep the directories the pool made when a store did not stop cleanly (its files may
    /// hold what someone wants back). Otherwise they go with the pool whatever happened.
    pub keep_dirs_after_unclean_stop: bool,
}

impl PoolSpec {
    /// `stores` stores of `segment_size` bytes and their master on loopback, every port chosen
    /// by the kernel, the master's metadata server on, segments under `/dev/shm`.
    pub fn loopback(stores: usize, segment_size: u64) -> PoolSpec {
        PoolSpec {
            name: "rbgctl-pool".into(),
            host: "127.0.0.1".into(),
            master: MasterConfig {
                rpc_port: 0,
                metrics_port: 0,
                enable_http_metadata_server: true,
                http_metadata_server_port: 0,
                ..MasterConfig::default()
            },
            masters: 1,
            stores,
            store: StoreConfig {
                segment_size: ByteSize(segment_size),
                metrics_port: 0,
                ..StoreConfig::default()
            },
            store_prefix: "store-".into(),
            shm_dir: Dir::Inside("/dev/shm".into()),
            disk_tier: None,
            ready_timeout: Duration::from_secs(30),
            keep_dirs_after_unclean_stop: false,
        }
    }

    /// Segments each store mounts: its memory, and its disk tier if it has one.
    pub fn segments_per_store(&self) -> usize {
        1 + usize::from(self.disk_tier.is_some())
    }
}

/// A running pool.
pub struct Pool {
    /// The masters: one, or several electing a leader.
    pub masters: Vec<Child<Master>>,
    pub stores: Vec<Child<Store>>,
    /// The master clients and stores are given: its RPC address, or
    /// `etcd://<endpoints>/<cluster_id>` where masters elect a leader.
    pub rpc: String,
    /// Where masters elect a leader: the client that asks each one's `/health` which leads.
    health: Option<reqwest::blocking::Client>,
    /// The store settings with the pool's parts filled in; store `i` adds its name.
    store_base: StoreConfig,
    store_prefix: String,
    shm_dir: PathBuf,
    disk_dir: Option<PathBuf>,
    /// Directories this pool made, removed when it goes.
    own_dirs: Vec<PathBuf>,
    per_store: usize,
    keep_dirs_after_unclean_stop: bool,
    auth: Option<std::sync::Arc<crate::auth::Secret>>,
    launcher: Launcher,
}

/// The directory `dir` names, made if it is not there; and whether it is the pool's own.
fn make_dir(dir: &Dir, what: &'static str, run: &str) -> Result<(PathBuf, bool), PoolError> {
    let (path, own) = match dir {
        Dir::Inside(parent) => (parent.join(run), true),
        Dir::At(path) => (path.clone(), false),
    };
    std::fs::create_dir_all(&path).map_err(|source| PoolError::Dir {
        what,
        path: path.clone(),
        source,
    })?;
    Ok((path, own))
}

impl Pool {
    /// Starts the master, then the stores, and waits until every segment is listed live.
    pub fn start(launcher: &Launcher, spec: PoolSpec) -> Result<Pool, PoolError> {
        let auth = crate::auth::load(spec.master.auth_token_file.as_deref())
            .map_err(|e| PoolError::Auth(e.to_string()))?;
        let host = spec.host.clone();
        let ha = spec.master.enable_ha;
        let mut masters = Vec::with_capacity(spec.masters);
        for i in 0..spec.masters.max(1) {
            let name = if ha {
                format!("master-{i}")
            } else {
                "master".into()
            };
            masters.push(launcher.spawn::<Master>(
                &name,
                MasterConfig {
                    rpc_address: host.clone(),
                    metrics_host: host.clone(),
                    http_metadata_server_host: host.clone(),
                    ..spec.master.clone()
                },
            )?);
        }
        let master = &masters[0];
        let rpc = if ha {
            format!(
                "etcd://{}/{}",
                spec.master.ha_backend_connstring, spec.master.cluster_id
            )
        } else {
            master.addrs.rpc.to_string()
        };
        let run = format!(
            "{}-{}-{:08x}",
            spec.name,
            std::process::id(),
            fastrand::u32(..)
        );
        let mut own_dirs = Vec::new();
        let (shm_dir, own) = make_dir(&spec.shm_dir, "segment directory", &run)?;
        if own {
            own_dirs.push(shm_dir.clone());
        }
        let disk = match &spec.disk_tier {
            Some((dir, size)) => {
                let (path, own) = make_dir(dir, "disk tier directory", &run)?;
                if own {
                    own_dirs.push(path.clone());
                }
                Some((path, *size))
            }
            None => None,
        };
        let store_base = StoreConfig {
            master: rpc.clone(),
            bind_address: host.clone(),
            local_hostname: host.clone(),
            metrics_host: host,
            metadata_server: master
                .addrs
                .metadata
                .map(|m| format!("http://{m}/metadata"))
                .unwrap_or_else(|| spec.store.metadata_server.clone()),
            shm_dir: shm_dir.clone(),
            disk_tier: disk.as_ref().map(|(d, _)| d.clone()),
            disk_tier_size: disk.as_ref().map_or(ByteSize(0), |(_, n)| *n),
            auth_token_file: spec.master.auth_token_file.clone(),
            ..spec.store.clone()
        };
        let health = if ha {
            let client = reqwest::blocking::Client::builder()
                .timeout(Duration::from_millis(300))
                .build()
                .map_err(|e| PoolError::Health(e.to_string()))?;
            Some(client)
        } else {
            None
        };
        let mut pool = Pool {
            masters,
            stores: Vec::new(),
            rpc,
            health,
            store_base,
            store_prefix: spec.store_prefix.clone(),
            shm_dir,
            disk_dir: disk.map(|(d, _)| d),
            own_dirs,
            per_store: spec.segments_per_store(),
            keep_dirs_after_unclean_stop: spec.keep_dirs_after_unclean_stop,
            auth,
            launcher: launcher.clone(),
        };
        if ha {
            pool.wait_leader(spec.ready_timeout)?;
        }
        for _ in 0..spec.stores {
            pool.add_store_with(|_| {})?;
        }
        pool.wait_live_segments(spec.stores * pool.per_store, spec.ready_timeout)?;
        Ok(pool)
    }

    /// The config store `i` starts with: the pool's settings and the name `<prefix><i>`
    /// (stable, so that a restarted store finds its segment again).
    pub fn store_config(&self, i: usize) -> StoreConfig {
        StoreConfig {
            name: Some(format!("{}{i}", self.store_prefix)),
            ..self.store_base.clone()
        }
    }

    /// Starts one more store, configured as `store_config` says and then changed by
    /// `change`; answers its index (it does not wait for its segment).
    pub fn add_store_with(
        &mut self,
        change: impl FnOnce(&mut StoreConfig),
    ) -> Result<usize, PoolError> {
        let i = self.stores.len();
        let mut cfg = self.store_config(i);
        change(&mut cfg);
        let store = self
            .launcher
            .spawn::<Store>(&format!("{}{i}", self.store_prefix), cfg)?;
        self.stores.push(store);
        Ok(i)
    }

    /// The first master (the only one unless masters elect a leader).
    pub fn master(&self) -> &Child<Master> {
        &self.masters[0]
    }

    /// The first master.
    pub fn master_mut(&mut self) -> &mut Child<Master> {
        &mut self.masters[0]
    }

    /// The master that leads: the only one, or the one whose `/health` says it leads.
    pub fn leader(&self) -> Option<usize> {
        let Some(http) = &self.health else {
            return Some(0);
        };
        self.masters.iter().position(|m| {
            m.pid().is_some()
                && http
                    .get(format!("http://{}/health", m.addrs.metrics))
                    .send()
                    .ok()
                    .and_then(|r| r.json::<serde_json::Value>().ok())
                    .is_some_and(|h| h["role"] == "leader")
        })
    }

    /// Polls (every 20 ms) until a master leads; answers which.
    pub fn wait_leader(&self, timeout: Duration) -> Result<usize, PoolError> {
        let t0 = Instant::now();
        loop {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            if t0.elapsed() > timeout {
                return Err(PoolError::NoLeader { timeout });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Where the stores' segment files are.
    pub fn shm_dir(&self) -> &Path {
        &self.shm_dir
    }

    /// Where the stores' disk tiers are, when they have one.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk_dir.as_deref()
    }

    /// The master's metadata server, `http://host:port/metadata`, if it serves one.
    pub fn metadata_url(&self) -> Option<String> {
        self.master()
            .addrs
            .metadata
            .map(|m| format!("http://{m}/metadata"))
    }

    /// Segments each store mounts.
    pub fn segments_per_store(&self) -> usize {
        self.per_store
    }

    /// Live segments the (leading) master lists, or `None` while none can be reached.
    pub fn live_segments(&self) -> Option<usize> {
        let leader = &self.masters[self.leader()?];
        let opts = ConnOptions {
            connect_timeout: Duration::from_millis(200),
            io_timeout: Duration::from_secs(2),
            spin: Duration::ZERO,
            auth: self.auth.clone(),
        };
        Connection::connect(&leader.addrs.rpc.to_string(), &opts)
            .and_then(|mut c| c.call::<rpc::ListSegments>(&()))
            .ok()
            .map(|r| r.segments.len())
    }

    /// Polls (every 2 ms) until exactly `n` segments are live; answers how long it took.
    pub fn wait_live_segments(&self, n: usize, timeout: Duration) -> Result<Duration, PoolError> {
        let t0 = Instant::now();
        loop {
            let listed = self.live_segments();
            if listed == Some(n) {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > timeout {
                return Err(PoolError::NotReady {
                    master: self.rpc.clone(),
                    want: n,
                    listed,
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Pool {
    /// Stops the stores, last started first (they unmount from a master still there), then
    /// the master, and removes the directories the pool made (see
    /// `keep_dirs_after_unclean_stop`). Answers whether every store stopped cleanly.
    pub fn stop(&mut self) -> bool {
        let mut clean = true;
        for mut s in self.stores.drain(..).rev() {
            clean &= s.stop().is_some_and(|status| status.success());
        }
        for m in self.masters.iter_mut() {
            m.stop();
        }
        for dir in std::mem::take(&mut self.own_dirs) {
            if clean || !self.keep_dirs_after_unclean_stop {
                let _ = std::fs::remove_dir_all(&dir);
            } else {
                tracing::warn!(dir = %dir.display(),
                    "a store did not stop cleanly: its files are kept (remove them when done)");
            }
        }
        clean
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}
