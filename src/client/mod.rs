//! The client library: what an inference engine links to use the pool as its KV cache.
//!
//! A put asks the master for space (`PutStart`), writes every replica straight from the caller's
//! buffer, then commits (`PutEnd`) with a CRC-32C of the value. A get asks the master where the
//! object is, reads one replica straight into the destination buffer and checks the CRC; a
//! failing replica is skipped for the next one. Batch forms take one master round trip per step
//! and pipeline the transfers to each store.
//!
//! - `plan.rs`: the pure decisions (which replica writes go where, what to commit or revoke).
//! - `put.rs`, `get.rs`: the executors, doing the I/O the plan asks for.
//! - `datapath/`: the seam between the client and the bytes' medium (TCP, same-host shared
//!   memory; RDMA later).
//! - `routes.rs`: the segments this client knows and the data path of each.
//! - `locations.rs`: where objects are, as last learnt, so a get can skip the master.
//! - `breakdown.rs`: where the time goes (master round trips, transfers, copies, checksums).
//!
//! `Client` is `Send + Sync`; share one per process.

mod breakdown;
mod datapath;
mod error;
mod get;
mod locations;
mod plan;
mod put;
mod reservations;
mod routes;

pub use breakdown::{Breakdown, Part};
pub use datapath::Discovery;
#[cfg(feature = "rdma")]
pub use datapath::VersionChecks;
pub use error::ClientError;

use crate::config::mooncake::MooncakeEnv;
use crate::config::ConfigError;
use crate::ha::link::MasterLink;
use crate::shutdown::Shutdown;
use crate::store::config::StoreConfig;
use crate::store::Store;
use crate::transfer::message::*;
use crate::transfer::rpc::{self, Rpc};
use crate::transfer::tenant as tenants;
use crate::transfer::{ConnOptions, Transport};
use routes::{Route, Routes};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::transfer::message::ReplicateConfig;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The master's RPC address.
    pub master: String,
    pub conn: ConnOptions,
    /// Read and write same-host replicas through shared memory. Default true.
    pub same_host_shm: bool,
    /// How bytes reach stores on other hosts. Default TCP; with RDMA, stores that serve it
    /// are read and written one-sidedly through `rdma_devices` (the others over TCP).
    pub transport: Transport,
    /// The RDMA devices this client uses (`rxe0`, `mlx5_0,mlx5_1`; Mooncake's
    /// `MOONCAKE_DEVICE`), with `transport` RDMA.
    pub rdma_devices: String,
    /// How often the heartbeat looks at the connections to the master (each tick moved by up
    /// to half of itself at random): it pings when they changed since its last ping, which
    /// binds a connection to this client and keeps the client, with its unfinished puts,
    /// alive at the master while that connection stays open. Default 1 s.
    pub heartbeat_interval: Duration,
    /// Contribute memory from this process (an embedded store); `None` = pure client.
    pub embedded_store: Option<StoreConfig>,
    /// Object locations remembered (from gets and this client's puts), so that a get of one
    /// reads from its store in one round trip; 0 = always ask the master. Default 65,536.
    pub location_cache_entries: usize,
    /// How long a remembered location is used before the master is asked again (which also
    /// tells its LRU the object is in use). Default 10 s.
    pub location_ttl: Duration,
    /// Most bytes of space held reserved at the master for this client's next puts (a put
    /// into a reservation takes one master round trip instead of two); 0 = never reserve.
    /// Default 4 MiB.
    pub put_reservation_bytes: u64,
    /// Only values up to this size are put into reservations. Default 1 MiB.
    pub put_reservation_max_value: u64,
    /// How segments that Mooncake's processes mounted are found (Mooncake's
    /// `MOONCAKE_TE_META_DATA_SERVER`): by a P2P handshake with the segment's name (default,
    /// `P2PHANDSHAKE`), or from an HTTP metadata server (`http://host:port/metadata`).
    pub mooncake_discovery: datapath::Discovery,
    /// The tenant whose namespace this client's keys live in (`master::tenants`; Mooncake's
    /// `MOONCAKE_TENANT_ID`): the master's tenants file must name it. Default `default`.
    pub tenant: String,
}

impl ClientConfig {
    /// A client of the master at `master` (`host:port`, or an etcd or Kubernetes address), with
    /// the default options.
    pub fn new(master: impl Into<String>) -> ClientConfig {
        ClientConfig {
            master: master.into(),
            conn: ConnOptions::default(),
            same_host_shm: true,
            transport: Transport::Tcp,
            rdma_devices: String::new(),
            heartbeat_interval: Duration::from_secs(1),
            embedded_store: None,
            location_cache_entries: 65_536,
            location_ttl: Duration::from_secs(10),
            put_reservation_bytes: 4 << 20,
            put_reservation_max_value: 1 << 20,
            mooncake_discovery: datapath::Discovery::Handshake,
            tenant: tenants::DEFAULT_TENANT.to_string(),
        }
    }

    /// Keys live in `tenant`'s namespace (checked).
    pub fn with_tenant(mut self, tenant: &str) -> Result<Self, ConfigError> {
        tenants::check_name(tenant).map_err(|e| ConfigError::invalid("tenant", e.to_string()))?;
        self.tenant = tenant.to_string();
        Ok(self)
    }

    /// Proves the cluster secret in `file` on every connection (`crate::auth`); `None`
    /// leaves the config as it is.
    pub fn with_auth_file(mut self, file: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        if let Some(f) = file {
            let secret = crate::auth::Secret::from_file(f)
                .map_err(|e| ConfigError::invalid("auth_token_file", e.to_string()))?;
            self.conn.auth = Some(Arc::new(secret));
        }
        Ok(self)
    }

    /// Takes the transport from `MOONCAKE_PROTOCOL` and the RDMA devices from
    /// `MOONCAKE_DEVICE` when they are set, as an engine that links Mooncake's client does.
    pub fn with_transport_from_env(mut self) -> Result<Self, ConfigError> {
        let protocol = std::env::var("MOONCAKE_PROTOCOL")
            .ok()
            .filter(|p| !p.is_empty());
        let device = std::env::var("MOONCAKE_DEVICE").ok();
        self.take_transport(protocol.as_deref(), device.as_deref())?;
        Ok(self)
    }

    /// Mooncake's `protocol` (`tcp` or `rdma`) and `device_name`, checked.
    fn take_transport(
        &mut self,
        protocol: Option<&str>,
        device: Option<&str>,
    ) -> Result<(), ConfigError> {
        if let Some(p) = protocol {
            self.transport = p
                .parse()
                .map_err(|e| ConfigError::invalid("MOONCAKE_PROTOCOL", e))?;
            self.transport.check_built("MOONCAKE_PROTOCOL")?;
        }
        if let Some(d) = device {
            self.rdma_devices = d.to_string();
        }
        Ok(())
    }

    /// Reads `MOONCAKE_MASTER`, `MOONCAKE_GLOBAL_SEGMENT_SIZE` (> 0 embeds a store) and the other
    /// `MOONCAKE_*` variables, or `MOONCAKE_CONFIG_PATH`, as Mooncake's store client does.
    pub fn from_mooncake_env() -> Result<ClientConfig, ConfigError> {
        let env = MooncakeEnv::from_process()?;
        let master = env
            .master
            .clone()
            .ok_or_else(|| ConfigError::invalid("MOONCAKE_MASTER", "not set"))?;
        crate::ha::MasterAddress::check("MOONCAKE_MASTER", &master)?;
        let token_file = std::env::var_os(crate::auth::TOKEN_FILE_ENV).filter(|f| !f.is_empty());
        let mut cfg = ClientConfig::new(master)
            .with_auth_file(token_file.as_deref().map(std::path::Path::new))?;
        cfg.take_transport(env.protocol.as_deref(), env.device.as_deref())?;
        if let Some(server) = &env.metadata_server {
            cfg.mooncake_discovery = datapath::Discovery::parse(server);
        }
        if let Some(t) = std::env::var("MOONCAKE_TENANT_ID")
            .ok()
            .filter(|t| !t.is_empty())
        {
            tenants::check_name(&t)
                .map_err(|e| ConfigError::invalid("MOONCAKE_TENANT_ID", e.to_string()))?;
            cfg.tenant = t;
        }
        if env.global_segment_size.unwrap_or(0) > 0 {
            let store = crate::store::config::StoreArgs::default().resolve(&env)?;
            cfg.embedded_store = Some(StoreConfig {
                metrics_port: 0,
                ..store
            });
        }
        Ok(cfg)
    }
}

struct Inner {
    cfg: ClientConfig,
    /// This client's id at the master, which ties its unfinished puts to its heartbeats and
    /// its bound connection.
    id: u64,
    master: MasterLink,
    routes: Routes,
    stop: Shutdown,
    meter: breakdown::Meter,
    locations: locations::Locations,
    reservations: reservations::Reservations,
    /// The master answered `UNKNOWN_OPCODE` to `BatchPutCommit`: commit with `BatchPutEnd`.
    no_commit_op: std::sync::atomic::AtomicBool,
}

/// A connection to the pool: puts and gets of values by key, over the data path each store
/// is best reached by. Cheap to share between threads.
pub struct Client {
    inner: Arc<Inner>,
    embedded: Option<Store>,
}

impl Client {
    /// Connects to the master (checked with a first heartbeat) and starts heartbeating.
    pub fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        cfg.transport.check_built("client transport")?;
        let embedded = match &cfg.embedded_store {
            Some(store_cfg) => {
                let store_cfg = StoreConfig {
                    master: cfg.master.clone(),
                    ..store_cfg.clone()
                };
                let data = crate::role::bind("store data", &store_cfg.bind_address, store_cfg.port)
                    .map_err(crate::store::StoreError::from)?;
                Some(Store::start(&store_cfg, data)?)
            }
            None => None,
        };
        let inner = Arc::new(Inner {
            id: fastrand::u64(1..),
            master: MasterLink::new(&cfg.master, cfg.conn.clone()).map_err(|e| {
                ClientError::Config(Arc::new(ConfigError::invalid(
                    "client.master",
                    e.to_string(),
                )))
            })?,
            routes: Routes::new(
                crate::transfer::local_host_id(),
                cfg.same_host_shm,
                cfg.conn.clone(),
            )
            .with_rdma(datapath::open_nics(&cfg)?)
            .with_discovery(cfg.mooncake_discovery.clone()),
            stop: Shutdown::new(),
            meter: breakdown::Meter::default(),
            locations: locations::Locations::new(cfg.location_cache_entries, cfg.location_ttl),
            reservations: reservations::Reservations::new(
                cfg.put_reservation_bytes,
                cfg.put_reservation_max_value,
            ),
            no_commit_op: Default::default(),
            cfg,
        });
        inner.master_call::<rpc::Ping>(&PingReq {
            client_id: inner.id,
        })?;
        // Nothing else runs yet: the connection that ping went on is the one it bound.
        let bound = inner.master.connection_changes();
        let hb = inner.clone();
        std::thread::Builder::new()
            .name("client-heartbeat".into())
            .spawn(move || hb.heartbeat_loop(bound))
            .map_err(|e| ClientError::Invalid(format!("cannot start the heartbeat thread: {e}")))?;
        Ok(Client { inner, embedded })
    }

    /// The segment name of the embedded store, if this client contributes memory.
    pub fn local_segment(&self) -> Option<&str> {
        self.embedded.as_ref().map(|s| s.name())
    }

    /// Stores `value` under `key` (at most 4096 bytes), replacing any previous value.
    pub fn put(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<(), ClientError> {
        self.batch_put(&[key], &[value], config)
            .pop()
            .unwrap_or_else(|| Err(ClientError::Invalid("no result for the put".into())))
    }

    /// Reads `key` into a new buffer.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, ClientError> {
        let key = &*self.scoped(key)?;
        if let Some(desc) = self.inner.locations.get(key, Instant::now()) {
            let mut buf = vec![0u8; desc.size as usize];
            if self.inner.read_cached(key, &desc, &mut buf) {
                return Ok(buf);
            }
        }
        let desc = self.inner.describe(key)?;
        let mut buf = vec![0u8; desc.size as usize];
        self.inner.read_object(key, &desc, &mut buf)?;
        Ok(buf)
    }

    /// Reads `key` into `buf`; returns the value's length.
    pub fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize, ClientError> {
        let key = &*self.scoped(key)?;
        if let Some(desc) = self.inner.locations.get(key, Instant::now()) {
            let n = desc.size as usize;
            if buf.len() >= n && self.inner.read_cached(key, &desc, &mut buf[..n]) {
                return Ok(n);
            }
        }
        let desc = self.inner.describe(key)?;
        if (buf.len() as u64) < desc.size {
            return Err(ClientError::BufferTooSmall {
                key: key.into(),
                needed: desc.size,
                got: buf.len(),
            });
        }
        let n = desc.size as usize;
        self.inner.read_object(key, &desc, &mut buf[..n])?;
        Ok(n)
    }

    /// The value's size, without reading it.
    pub fn get_size(&self, key: &str) -> Result<u64, ClientError> {
        Ok(self.inner.describe(&self.scoped(key)?)?.size)
    }

    /// Up to `limit` of this client's tenant's readable keys that `pattern` (a regular
    /// expression, Rust's `regex` syntax) matches anywhere in them, sorted, and whether more
    /// match.
    pub fn keys(&self, pattern: &str, limit: u32) -> Result<(Vec<String>, bool), ClientError> {
        let req = ListKeysReq {
            pattern: pattern.to_string(),
            limit,
            tenant: self.inner.cfg.tenant.clone(),
        };
        let r: ListKeysResp = self.inner.master_call::<rpc::ListKeys>(&req)?;
        Ok((r.keys, r.truncated))
    }

    /// Where the value is: its size, checksum, version and replicas (each with its segment,
    /// whose `tier` says memory or disk), without reading it. Counts as an access.
    pub fn describe(&self, key: &str) -> Result<(ObjectDesc, Vec<SegmentEntry>), ClientError> {
        let desc = self.inner.describe(&self.scoped(key)?)?;
        let segments = self.segments()?;
        let used = desc
            .replicas
            .iter()
            .filter_map(|r| segments.iter().find(|s| s.id == r.segment_id).cloned())
            .collect();
        Ok((desc, used))
    }

    /// Whether `key` is held.
    pub fn exists(&self, key: &str) -> Result<bool, ClientError> {
        let key = self.scoped(key)?.into_owned();
        self.inner.master_call::<rpc::Exists>(&KeyReq { key })
    }

    /// Removes `key`; refused while a read lease is held unless `force`.
    pub fn remove(&self, key: &str, force: bool) -> Result<(), ClientError> {
        let key = &*self.scoped(key)?;
        self.inner.locations.remove(key);
        let req = RemoveReq {
            key: key.into(),
            force,
        };
        self.inner
            .master_call::<rpc::Remove>(&req)
            .map_err(|e| e.for_key(key))
    }

    /// Removes every object of this client's tenant (leased ones only with `force`); returns
    /// how many.
    pub fn remove_all(&self, force: bool) -> Result<u64, ClientError> {
        self.inner.locations.clear();
        let req = RemoveAllReq {
            force,
            tenant: self.inner.cfg.tenant.clone(),
        };
        let r: RemoveAllResp = self.inner.master_call::<rpc::RemoveAll>(&req)?;
        Ok(r.removed)
    }

    /// Whether each of `keys` is held, in order.
    pub fn batch_exists(&self, keys: &[&str]) -> Result<Vec<bool>, ClientError> {
        let keys = self.scoped_all(keys)?;
        let req = BatchKeysReq {
            keys: keys.into_iter().map(Cow::into_owned).collect(),
        };
        let r: BatchExistsResp = self.inner.master_call::<rpc::BatchExists>(&req)?;
        Ok(r.items)
    }

    /// Removes each of `keys`: a result per key, in order; one held under a read lease is
    /// refused unless `force`.
    pub fn batch_remove(
        &self,
        keys: &[&str],
        force: bool,
    ) -> Result<Vec<Result<(), ClientError>>, ClientError> {
        let scoped = self.scoped_all(keys)?;
        for k in &scoped {
            self.inner.locations.remove(k);
        }
        let req = BatchRemoveReq {
            force,
            keys: scoped.into_iter().map(Cow::into_owned).collect(),
        };
        let r: BatchStatusResp = self.inner.master_call::<rpc::BatchRemove>(&req)?;
        Ok(r.items
            .into_iter()
            .zip(keys)
            .map(|(s, k)| ClientError::check_status(s, k))
            .collect())
    }

    /// Puts several values with one master round trip to start, pipelined writes to each store,
    /// and one to commit.
    pub fn batch_put(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<(), ClientError>> {
        let scoped = match self.scoped_all(keys) {
            Ok(s) => s,
            Err(e) => return vec![Err(e); keys.len()],
        };
        self.inner.batch_put(&as_strs(&scoped), values, config)
    }

    /// Reads several keys into the caller's buffers; returns each value's length.
    pub fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize, ClientError>> {
        let scoped = match self.scoped_all(keys) {
            Ok(s) => s,
            Err(e) => return vec![Err(e); keys.len()],
        };
        self.inner.batch_get_into(&as_strs(&scoped), bufs)
    }

    /// Reads several keys into new buffers.
    pub fn batch_get(&self, keys: &[&str]) -> Vec<Result<Vec<u8>, ClientError>> {
        let scoped = match self.scoped_all(keys) {
            Ok(s) => s,
            Err(e) => return vec![Err(e); keys.len()],
        };
        let keys = &as_strs(&scoped)[..];
        let now = Instant::now();
        let remembered: Vec<Option<Arc<ObjectDesc>>> = keys
            .iter()
            .map(|k| self.inner.locations.get(k, now))
            .collect();
        let mut bufs: Vec<Vec<u8>> = remembered
            .iter()
            .map(|d| vec![0u8; d.as_ref().map_or(0, |d| d.size as usize)])
            .collect();
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let hits = self.inner.batch_read_cached(keys, &remembered, &mut slices);
        let rest: Vec<usize> = (0..keys.len()).filter(|&i| !hits[i]).collect();
        let mut results: Vec<Result<Vec<u8>, ClientError>> = Vec::with_capacity(keys.len());
        let mut rest_results = if rest.is_empty() {
            Vec::new()
        } else {
            let rest_keys: Vec<&str> = rest.iter().map(|&i| keys[i]).collect();
            self.batch_get_described(&rest_keys)
        }
        .into_iter();
        for (buf, hit) in bufs.into_iter().zip(hits) {
            results.push(if hit {
                Ok(buf)
            } else {
                rest_results
                    .next()
                    .unwrap_or_else(|| Err(ClientError::Invalid("batch item left unread".into())))
            });
        }
        results
    }

    /// Reads several keys into new buffers, asking the master where each is.
    fn batch_get_described(&self, keys: &[&str]) -> Vec<Result<Vec<u8>, ClientError>> {
        let descs = match self.inner.batch_describe(keys) {
            Ok(d) => d,
            Err(e) => return vec![Err(e); keys.len()],
        };
        let mut bufs: Vec<Vec<u8>> = descs
            .iter()
            .map(|d| vec![0u8; d.as_ref().map_or(0, |d| d.size as usize)])
            .collect();
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let results = self.inner.batch_read(keys, descs, &mut slices);
        results
            .into_iter()
            .zip(bufs)
            .map(|(r, b)| r.map(|_| b))
            .collect()
    }

    /// Where this client's time went since it connected: master round trips, transfers,
    /// copies, checksums (subtract two with [`Breakdown::since`]).
    pub fn breakdown(&self) -> Breakdown {
        self.inner.meter.snapshot()
    }

    /// The leadership epoch of the master answering (0 for a master without HA).
    pub fn master_epoch(&self) -> u64 {
        self.inner.master.epoch()
    }

    /// The segments the master knows, refreshed.
    pub fn segments(&self) -> Result<Vec<SegmentEntry>, ClientError> {
        let r: ListSegmentsResp = self.inner.master_call::<rpc::ListSegments>(&())?;
        Ok(r.segments)
    }

    /// Registers `len` bytes at `ptr` with this client's RDMA devices (Mooncake's
    /// `register_buffer`): gets into that memory and puts from it move by RDMA with no staging
    /// copy (the checksum is then a pass of its own). Register a pool once (SGLang's host KV
    /// pool), not each buffer: a registration pins its pages and takes the kernel's time. Over
    /// TCP, nothing to do. At most 256 registrations; they may not overlap.
    ///
    /// # Safety
    /// The memory must stay mapped until `unregister_buffer(ptr)` returns.
    pub unsafe fn register_buffer(&self, ptr: *mut u8, len: usize) -> Result<(), ClientError> {
        #[cfg(feature = "rdma")]
        if let Some(local) = self.inner.routes.rdma_local() {
            return local
                .register(ptr, len)
                .map_err(|e| ClientError::Invalid(format!("register_buffer: {e}")));
        }
        let _ = (ptr, len);
        Ok(())
    }

    /// Over RDMA, how this client's reads of remembered locations were checked: by the version
    /// stamp read with the bytes, or by asking the store. `None` over TCP.
    #[cfg(feature = "rdma")]
    pub fn rdma_version_checks(&self) -> Option<VersionChecks> {
        self.inner.routes.rdma_local().map(|l| l.version_checks())
    }

    /// Forgets a registration made by `register_buffer` at `ptr`. Over TCP, nothing to do.
    pub fn unregister_buffer(&self, ptr: *mut u8) -> Result<(), ClientError> {
        #[cfg(feature = "rdma")]
        if let Some(local) = self.inner.routes.rdma_local() {
            if !local.unregister(ptr) {
                return Err(ClientError::Invalid(format!(
                    "unregister_buffer: nothing is registered at {ptr:p}"
                )));
            }
        }
        let _ = ptr;
        Ok(())
    }
}

/// A key the protocol can carry: 1 to 4096 bytes. Checked before anything is sent, so that
/// the error names the real size.
fn check_key(key: &str) -> Result<(), ClientError> {
    let limit = crate::transfer::codec::MAX_STR_LEN;
    if key.is_empty() {
        return Err(ClientError::Invalid("the key is empty".into()));
    }
    if key.len() > limit {
        let head: String = key.chars().take(32).collect();
        return Err(ClientError::Invalid(format!(
            "key {head:?}… is {} bytes long; the limit is {limit} bytes",
            key.len()
        )));
    }
    Ok(())
}

/// Every key of a batch, naming the first bad one by its place.
fn as_strs<'a>(keys: &'a [Cow<'_, str>]) -> Vec<&'a str> {
    keys.iter().map(|k| &**k).collect()
}

impl Client {
    /// `key` as the master holds it: in this client's tenant's namespace, checked.
    fn scoped<'a>(&self, key: &'a str) -> Result<Cow<'a, str>, ClientError> {
        tenants::check_key(key).map_err(|e| ClientError::Invalid(e.to_string()))?;
        let held = tenants::scoped(&self.inner.cfg.tenant, key);
        check_key(&held)?;
        Ok(held)
    }

    /// Every key of a batch as the master holds it; a bad one fails the batch, naming it.
    fn scoped_all<'a>(&self, keys: &[&'a str]) -> Result<Vec<Cow<'a, str>>, ClientError> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| {
                self.scoped(k).map_err(|e| match e {
                    ClientError::Invalid(why) => {
                        ClientError::Invalid(format!("batch item {i}: {why}"))
                    }
                    e => e,
                })
            })
            .collect()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.inner.stop.trigger();
        // Tell the master we are gone (best effort), so that it need not wait for us to expire.
        let bye = PingReq {
            client_id: self.inner.id,
        };
        if let Err(e) = self.inner.master_call::<rpc::Leave>(&bye) {
            tracing::debug!(error = %e, "could not tell the master this client left");
        }
        if let Some(s) = &mut self.embedded {
            s.shutdown();
        }
    }
}

impl Inner {
    fn master_call<R: Rpc>(&self, req: &R::Request) -> Result<R::Reply, ClientError> {
        self.meter
            .time(breakdown::Work::Master, || {
                self.master.with(|c| c.call::<R>(req))
            })
            .map_err(|e| ClientError::from_master(&self.master.addr(), e))
    }

    /// Runs a data-path call on `route` moving `bytes`, metered as a transfer, or as a copy
    /// on the same-host path.
    fn moved<T>(&self, route: &Route, bytes: u64, f: impl FnOnce() -> T) -> T {
        match route.path.kind() {
            datapath::PathKind::Shm => {
                self.meter.copied(bytes);
                self.meter.time(breakdown::Work::Copy, f)
            }
            datapath::PathKind::Tcp | datapath::PathKind::Rdma => {
                self.meter.time(breakdown::Work::Transfer, f)
            }
        }
    }

    /// A value's CRC-32C, metered.
    fn checksum(&self, data: &[u8]) -> u32 {
        self.meter
            .time(breakdown::Work::Checksum, || crate::checksum::crc32c(data))
    }

    /// Keeps this client known to the master. A ping binds the connection it goes on to this
    /// client, and the master counts a client without segments live while such a connection is
    /// open (`master::state::clients`): so a tick pings only when the connections to the
    /// master changed since the last ping answered (`bound`: their count of changes then),
    /// after it dropped the idle ones the master closed. An idle client's heartbeat costs the
    /// master nothing; a restarted master or a new leader hears from it within a tick. Ticks
    /// are `heartbeat_interval` moved by up to half of itself at random, so that clients a
    /// failover cut off together come back spread out. Each also hands back the reservations
    /// that ran out.
    fn heartbeat_loop(&self, mut bound: u64) {
        loop {
            let tick = self.cfg.heartbeat_interval.mul_f64(0.5 + fastrand::f64());
            if self.stop.sleep(tick) {
                return;
            }
            self.master.prune_closed();
            let changes = self.master.connection_changes();
            if changes != bound {
                // Not metered: heartbeats are not part of any operation.
                let ping = PingReq { client_id: self.id };
                // One try: a failed one is tried at the next tick (`MasterLink::try_once`).
                match self.master.try_once(|c| c.call::<rpc::Ping>(&ping)) {
                    Ok(_) => bound = changes,
                    Err(e) => tracing::debug!(error = %e, "client heartbeat failed"),
                }
            }
            self.hand_back_expired_reservations();
        }
    }

    /// The route to a segment, asking the master for its segment list when the segment is new
    /// to this client.
    fn route(&self, segment_id: u64) -> Result<Arc<Route>, ClientError> {
        if let Some(r) = self.routes.get(segment_id) {
            return Ok(r);
        }
        let r: ListSegmentsResp = self.master_call::<rpc::ListSegments>(&())?;
        self.routes.update(r.segments);
        self.routes
            .get(segment_id)
            .ok_or_else(|| ClientError::Rejected {
                status: crate::transfer::Status::SegmentNotFound,
                message: format!("segment {segment_id} is not mounted"),
            })
    }
}
