//! The client library: what an inference engine links to use the pool as its KV cache.
//!
//! A put asks the master for space (`PutStart`), writes every replica straight from the caller's
//! buffer (to the store over TCP, or by memory copy when the segment is on this host), then
//! commits (`PutEnd`) with a CRC-32C of the value. A get asks the master where the object is,
//! reads one replica straight into the destination buffer and checks the CRC; a failing replica
//! is skipped for the next one. Batch forms pipeline every transfer to a store on one connection.
//!
//! `Client` is `Send + Sync`; share one per process.

mod shm;

use crate::config::mooncake::MooncakeEnv;
use crate::config::ConfigError;
use crate::store::config::StoreConfig;
use crate::store::Store;
use crate::transfer::message::*;
use crate::transfer::{ConnOptions, Connection, Opcode, Pool, Status, TransferError};
use parking_lot::{Mutex, RwLock};
use shm::LocalSegment;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use crate::transfer::message::ReplicateConfig;

/// Batch items grouped by store endpoint: the store's pool and (item index, offset) pairs.
type ByStore = HashMap<String, (Arc<Pool>, Vec<(usize, u64)>)>;
/// Objects copied into same-host persistent segments, by store, waiting to be sealed.
type SealsByStore = HashMap<String, (Arc<Pool>, Vec<(usize, StoredObject)>)>;

/// Most requests in flight on one connection in a batch.
const PIPELINE_WINDOW: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("key {0:?} not found")]
    NotFound(String),
    #[error("master {addr}: {source}")]
    Master { addr: String, source: TransferError },
    #[error("store {endpoint}: {source}")]
    Store {
        endpoint: String,
        source: TransferError,
    },
    #[error("{status}: {message}")]
    Rejected { status: Status, message: String },
    #[error("{key:?}: checksum mismatch on every readable replica")]
    Checksum { key: String },
    #[error("{key:?}: buffer of {got} bytes is smaller than the value ({needed} bytes)")]
    BufferTooSmall {
        key: String,
        needed: u64,
        got: usize,
    },
    #[error("{key:?}: no replica could be read ({last})")]
    Unreadable { key: String, last: String },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("embedded store: {0}")]
    EmbeddedStore(#[from] crate::store::StoreError),
}

impl ClientError {
    /// The protocol status behind the error, when the master or store answered with one.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::NotFound(_) => Some(Status::ObjectNotFound),
            ClientError::Rejected { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The master's RPC address.
    pub master: String,
    pub conn: ConnOptions,
    /// Read and write same-host replicas through shared memory. Default true.
    pub same_host_shm: bool,
    /// Heartbeat period, which keeps this client's unfinished puts alive at the master.
    pub heartbeat_interval: Duration,
    /// Contribute memory from this process (an embedded store); `None` = pure client.
    pub embedded_store: Option<StoreConfig>,
}

impl ClientConfig {
    pub fn new(master: impl Into<String>) -> ClientConfig {
        ClientConfig {
            master: master.into(),
            conn: ConnOptions::default(),
            same_host_shm: true,
            heartbeat_interval: Duration::from_secs(1),
            embedded_store: None,
        }
    }

    /// Reads `MOONCAKE_MASTER`, `MOONCAKE_GLOBAL_SEGMENT_SIZE` (> 0 embeds a store) and the other
    /// `MOONCAKE_*` variables, or `MOONCAKE_CONFIG_PATH`, as Mooncake's store client does.
    pub fn from_mooncake_env() -> Result<ClientConfig, ConfigError> {
        let env = MooncakeEnv::from_process()?;
        let master = env
            .master
            .clone()
            .ok_or_else(|| ConfigError::invalid("MOONCAKE_MASTER", "not set"))?;
        crate::config::check_endpoint("MOONCAKE_MASTER", &master)?;
        let mut cfg = ClientConfig::new(master);
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

struct Route {
    info: SegmentInfo,
    pool: Arc<Pool>,
    local: Option<LocalSegment>,
}

struct Inner {
    cfg: ClientConfig,
    id: u64,
    host_id: String,
    master: Pool,
    routes: RwLock<HashMap<u64, Arc<Route>>>,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    stop: AtomicBool,
}

pub struct Client {
    inner: Arc<Inner>,
    embedded: Option<Store>,
}

/// Where one replica of one item is, resolved.
struct Target {
    segment_id: u64,
    route: Arc<Route>,
    offset: u64,
}

impl Client {
    /// Connects to the master (checked with a first heartbeat) and starts heartbeating.
    pub fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
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
            host_id: crate::transfer::local_host_id(),
            master: Pool::new(cfg.master.clone(), cfg.conn.clone()),
            routes: RwLock::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            cfg,
        });
        inner.master_call::<_, PingResp>(
            Opcode::Ping,
            &PingReq {
                client_id: inner.id,
            },
        )?;
        let hb = inner.clone();
        std::thread::Builder::new()
            .name("client-heartbeat".into())
            .spawn(move || hb.heartbeat_loop())
            .map_err(|e| ClientError::Invalid(format!("cannot start the heartbeat thread: {e}")))?;
        Ok(Client { inner, embedded })
    }

    /// The segment name of the embedded store, if this client contributes memory.
    pub fn local_segment(&self) -> Option<&str> {
        self.embedded.as_ref().map(|s| s.name())
    }

    /// Stores `value` under `key`, replacing any previous value.
    pub fn put(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<(), ClientError> {
        self.batch_put(&[key], &[value], config)
            .pop()
            .expect("one result per item")
    }

    /// Reads `key` into a new buffer.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, ClientError> {
        let desc = self.inner.describe(key)?;
        let mut buf = vec![0u8; desc.size as usize];
        self.inner.read_object(key, &desc, &mut buf)?;
        Ok(buf)
    }

    /// Reads `key` into `buf`; returns the value's length.
    pub fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize, ClientError> {
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
        Ok(self.inner.describe(key)?.size)
    }

    pub fn exists(&self, key: &str) -> Result<bool, ClientError> {
        self.inner
            .master_call(Opcode::Exists, &KeyReq { key: key.into() })
    }

    /// Removes `key`; refused while a read lease is held unless `force`.
    pub fn remove(&self, key: &str, force: bool) -> Result<(), ClientError> {
        self.inner.master_call(
            Opcode::Remove,
            &RemoveReq {
                key: key.into(),
                force,
            },
        )
    }

    /// Removes every object (leased ones only with `force`); returns how many.
    pub fn remove_all(&self, force: bool) -> Result<u64, ClientError> {
        let r: RemoveAllResp = self
            .inner
            .master_call(Opcode::RemoveAll, &RemoveAllReq { force })?;
        Ok(r.removed)
    }

    pub fn batch_exists(&self, keys: &[&str]) -> Result<Vec<bool>, ClientError> {
        let req = BatchKeysReq {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        let r: BatchExistsResp = self.inner.master_call(Opcode::BatchExists, &req)?;
        Ok(r.items)
    }

    pub fn batch_remove(
        &self,
        keys: &[&str],
        force: bool,
    ) -> Result<Vec<Result<(), ClientError>>, ClientError> {
        let req = BatchRemoveReq {
            force,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        let r: BatchStatusResp = self.inner.master_call(Opcode::BatchRemove, &req)?;
        Ok(r.items
            .into_iter()
            .zip(keys)
            .map(|(s, k)| status_result(s, k))
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
        self.inner.batch_put(keys, values, config)
    }

    /// Reads several keys into the caller's buffers; returns each value's length.
    pub fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize, ClientError>> {
        self.inner.batch_get_into(keys, bufs)
    }

    /// Reads several keys into new buffers.
    pub fn batch_get(&self, keys: &[&str]) -> Vec<Result<Vec<u8>, ClientError>> {
        let descs = match self.inner.batch_describe(keys) {
            Ok(d) => d,
            Err(e) => return keys.iter().map(|_| Err(clone_err(&e))).collect(),
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

    /// The segments the master knows, refreshed.
    pub fn segments(&self) -> Result<Vec<SegmentEntry>, ClientError> {
        let r: ListSegmentsResp = self.inner.master_call(Opcode::ListSegments, &())?;
        Ok(r.segments)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(s) = &mut self.embedded {
            s.shutdown();
        }
    }
}

fn status_result(s: Status, key: &str) -> Result<(), ClientError> {
    match s {
        Status::Ok => Ok(()),
        Status::ObjectNotFound => Err(ClientError::NotFound(key.into())),
        s => Err(ClientError::Rejected {
            status: s,
            message: format!("{key:?}: {}", s.describe()),
        }),
    }
}

/// `ClientError` holds non-clonable sources; batch results repeat a shared failure as text.
fn clone_err(e: &ClientError) -> ClientError {
    match e {
        ClientError::NotFound(k) => ClientError::NotFound(k.clone()),
        ClientError::Rejected { status, message } => ClientError::Rejected {
            status: *status,
            message: message.clone(),
        },
        other => ClientError::Unreadable {
            key: String::new(),
            last: other.to_string(),
        },
    }
}

fn remote_to_client(addr: &str, e: TransferError) -> ClientError {
    match e {
        TransferError::Remote { status, message } => ClientError::Rejected { status, message },
        source => ClientError::Master {
            addr: addr.to_string(),
            source,
        },
    }
}

impl Inner {
    fn master_call<Req: Wire, Resp: Wire>(
        &self,
        op: Opcode,
        req: &Req,
    ) -> Result<Resp, ClientError> {
        self.master.with(|c| c.call(op, req)).map_err(|e| match e {
            TransferError::Remote {
                status: Status::ObjectNotFound,
                message,
            } => ClientError::NotFound(message),
            e => remote_to_client(self.master.addr(), e),
        })
    }

    fn heartbeat_loop(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let mut slept = Duration::ZERO;
            while slept < self.cfg.heartbeat_interval && !self.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
                slept += Duration::from_millis(20);
            }
            if let Err(e) =
                self.master_call::<_, PingResp>(Opcode::Ping, &PingReq { client_id: self.id })
            {
                tracing::debug!(error = %e, "client heartbeat failed");
            }
        }
    }

    fn pool_for(&self, endpoint: &str) -> Arc<Pool> {
        self.pools
            .lock()
            .entry(endpoint.to_string())
            .or_insert_with(|| Arc::new(Pool::new(endpoint, self.cfg.conn.clone())))
            .clone()
    }

    fn refresh_routes(&self) -> Result<(), ClientError> {
        let r: ListSegmentsResp = self.master_call(Opcode::ListSegments, &())?;
        let mut routes = self.routes.write();
        let live: std::collections::HashSet<u64> = r.segments.iter().map(|s| s.id).collect();
        routes.retain(|id, _| live.contains(id));
        for s in r.segments {
            if routes.contains_key(&s.id) {
                continue;
            }
            let local = if self.cfg.same_host_shm {
                LocalSegment::open(&s.info, &self.host_id)
            } else {
                None
            };
            let pool = self.pool_for(&s.info.endpoint);
            routes.insert(
                s.id,
                Arc::new(Route {
                    info: s.info,
                    pool,
                    local,
                }),
            );
        }
        Ok(())
    }

    fn route(&self, segment_id: u64) -> Result<Arc<Route>, ClientError> {
        if let Some(r) = self.routes.read().get(&segment_id) {
            return Ok(r.clone());
        }
        self.refresh_routes()?;
        self.routes
            .read()
            .get(&segment_id)
            .cloned()
            .ok_or_else(|| ClientError::Rejected {
                status: Status::SegmentNotFound,
                message: format!("segment {segment_id} is not mounted"),
            })
    }

    /// Resolves replicas, local ones first.
    fn targets(&self, replicas: &[ReplicaLoc]) -> Result<Vec<Target>, ClientError> {
        let mut out = Vec::with_capacity(replicas.len());
        let mut last_err = None;
        for r in replicas {
            match self.route(r.segment_id) {
                Ok(route) => out.push(Target {
                    segment_id: r.segment_id,
                    route,
                    offset: r.offset,
                }),
                Err(e) => last_err = Some(e),
            }
        }
        if out.is_empty() {
            return Err(
                last_err.unwrap_or_else(|| ClientError::Invalid("object has no replicas".into()))
            );
        }
        out.sort_by_key(|t| t.route.local.is_none());
        Ok(out)
    }

    fn describe(&self, key: &str) -> Result<ObjectDesc, ClientError> {
        self.master_call(Opcode::GetReplicas, &KeyReq { key: key.into() })
            .map_err(|e| match e {
                ClientError::NotFound(_) => ClientError::NotFound(key.into()),
                e => e,
            })
    }

    fn batch_describe(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<ObjectDesc, ClientError>>, ClientError> {
        let req = BatchKeysReq {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        let r: BatchGetReplicasResp = self.master_call(Opcode::BatchGetReplicas, &req)?;
        if r.items.len() != keys.len() {
            return Err(ClientError::Invalid(
                "master answered a different number of items".into(),
            ));
        }
        Ok(r.items
            .into_iter()
            .zip(keys)
            .map(|(it, k)| {
                it.map_err(|s| match status_result(s, k) {
                    Err(e) => e,
                    Ok(()) => ClientError::Invalid("error item with OK status".into()),
                })
            })
            .collect())
    }

    /// Reads one object, trying each replica (local first) until one reads with a good CRC.
    fn read_object(&self, key: &str, desc: &ObjectDesc, dst: &mut [u8]) -> Result<(), ClientError> {
        let targets = self.targets(&desc.replicas)?;
        let mut last = String::from("no replica tried");
        let mut bad_checksum = false;
        for t in &targets {
            let read = match &t.route.local {
                Some(local) if local.read(t.offset, dst) => Ok(()),
                _ => read_one(&t.route.pool, t.offset, dst),
            };
            match read {
                Ok(()) if crc32c::crc32c(dst) == desc.checksum => return Ok(()),
                Ok(()) => {
                    bad_checksum = true;
                    tracing::warn!(key, segment = %t.route.info.name, "checksum mismatch; trying another replica");
                    // The master drops the corrupt replica so that no one is sent to it again.
                    let report = ReportCorruptReq {
                        key: key.into(),
                        version: desc.version,
                        segment_id: t.segment_id,
                    };
                    if let Err(e) = self.master_call::<_, ()>(Opcode::ReportCorrupt, &report) {
                        tracing::debug!(error = %e, "cannot report a corrupt replica");
                    }
                }
                Err(e) => {
                    last = format!("{}: {e}", t.route.info.endpoint);
                    t.route.pool.clear();
                }
            }
        }
        if bad_checksum {
            Err(ClientError::Checksum { key: key.into() })
        } else {
            Err(ClientError::Unreadable {
                key: key.into(),
                last,
            })
        }
    }

    fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize, ClientError>> {
        if keys.len() != bufs.len() {
            return keys
                .iter()
                .map(|_| {
                    Err(ClientError::Invalid(
                        "keys and buffers differ in number".into(),
                    ))
                })
                .collect();
        }
        let descs = match self.batch_describe(keys) {
            Ok(d) => d,
            Err(e) => return keys.iter().map(|_| Err(clone_err(&e))).collect(),
        };
        let descs: Vec<Result<ObjectDesc, ClientError>> = descs
            .into_iter()
            .zip(bufs.iter())
            .zip(keys)
            .map(|((d, b), k)| match d {
                Ok(d) if (b.len() as u64) < d.size => Err(ClientError::BufferTooSmall {
                    key: k.to_string(),
                    needed: d.size,
                    got: b.len(),
                }),
                other => other,
            })
            .collect();
        self.batch_read(keys, descs, bufs)
    }

    /// Reads described objects: local replicas by copy, remote ones pipelined per store; an item
    /// whose first replica fails falls back to the single-object path over the others.
    fn batch_read(
        &self,
        keys: &[&str],
        descs: Vec<Result<ObjectDesc, ClientError>>,
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize, ClientError>> {
        let mut results: Vec<Option<Result<usize, ClientError>>> =
            (0..keys.len()).map(|_| None).collect();
        // endpoint → (pool, [(item, offset)])
        let mut remote: ByStore = HashMap::new();
        for (i, d) in descs.iter().enumerate() {
            let d = match d {
                Ok(d) => d,
                Err(e) => {
                    results[i] = Some(Err(clone_err(e)));
                    continue;
                }
            };
            let n = d.size as usize;
            let first = match self.targets(&d.replicas) {
                Ok(t) => t.into_iter().next().expect("targets is non-empty"),
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            match &first.route.local {
                Some(local) if local.read(first.offset, &mut bufs[i][..n]) => {
                    results[i] = Some(Ok(n));
                }
                _ => remote
                    .entry(first.route.info.endpoint.clone())
                    .or_insert_with(|| (first.route.pool.clone(), Vec::new()))
                    .1
                    .push((i, first.offset)),
            }
        }
        for (_, (pool, items)) in remote {
            let lens: Vec<usize> = items
                .iter()
                .map(|(i, _)| descs[*i].as_ref().map_or(0, |d| d.size as usize))
                .collect();
            let outcome = pipelined_reads(&pool, &items, &lens, bufs);
            for (j, ok) in outcome.into_iter().enumerate() {
                if ok {
                    results[items[j].0] = Some(Ok(lens[j]));
                }
            }
        }
        // Verify checksums; anything unread or corrupt goes through the careful path.
        (0..keys.len())
            .map(|i| {
                let d = match &descs[i] {
                    Ok(d) => d,
                    Err(_) => return results[i].take().expect("error recorded"),
                };
                let n = d.size as usize;
                match results[i].take() {
                    Some(Ok(_)) if crc32c::crc32c(&bufs[i][..n]) == d.checksum => Ok(n),
                    Some(Err(e)) => Err(e),
                    _ => self.read_object(keys[i], d, &mut bufs[i][..n]).map(|_| n),
                }
            })
            .collect()
    }

    fn batch_put(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<(), ClientError>> {
        if keys.len() != values.len() {
            return keys
                .iter()
                .map(|_| {
                    Err(ClientError::Invalid(
                        "keys and values differ in number".into(),
                    ))
                })
                .collect();
        }
        let mut results: Vec<Option<Result<(), ClientError>>> =
            (0..keys.len()).map(|_| None).collect();
        let req = BatchPutStartReq {
            client_id: self.id,
            config: config.clone(),
            items: keys
                .iter()
                .zip(values)
                .map(|(k, v)| PutItem {
                    key: k.to_string(),
                    size: v.len() as u64,
                })
                .collect(),
        };
        let started = match self.master_call::<_, BatchPutStartResp>(Opcode::BatchPutStart, &req) {
            Ok(r) if r.items.len() == keys.len() => r,
            Ok(_) => {
                return keys
                    .iter()
                    .map(|_| {
                        Err(ClientError::Invalid(
                            "master answered a different number of items".into(),
                        ))
                    })
                    .collect()
            }
            Err(e) => return keys.iter().map(|_| Err(clone_err(&e))).collect(),
        };
        // Checksums first: persistent stores record them with the object.
        let checksums: Vec<u32> = values.iter().map(|v| crc32c::crc32c(v)).collect();
        // Writes: local replicas by copy, the rest pipelined per store.
        let mut remote: ByStore = HashMap::new();
        // Objects copied into persistent same-host segments, to be recorded by their stores.
        let mut seals: SealsByStore = HashMap::new();
        let mut object_ids = vec![0u64; keys.len()];
        for (i, item) in started.items.iter().enumerate() {
            let s = match item {
                Ok(s) => s,
                Err(status) => {
                    results[i] = Some(status_result(*status, keys[i]));
                    continue;
                }
            };
            object_ids[i] = s.object_id;
            for r in &s.replicas {
                match self.route(r.segment_id) {
                    Ok(route) => match &route.local {
                        Some(local) if local.write(r.offset, values[i]) => {
                            if route.info.segment_uuid != 0 {
                                seals
                                    .entry(route.info.endpoint.clone())
                                    .or_insert_with(|| (route.pool.clone(), Vec::new()))
                                    .1
                                    .push((
                                        i,
                                        StoredObject {
                                            key: keys[i].to_string(),
                                            version: s.object_id,
                                            offset: r.offset,
                                            size: values[i].len() as u64,
                                            checksum: checksums[i],
                                        },
                                    ));
                            }
                        }
                        _ => remote
                            .entry(route.info.endpoint.clone())
                            .or_insert_with(|| (route.pool.clone(), Vec::new()))
                            .1
                            .push((i, r.offset)),
                    },
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
        }
        for (endpoint, (pool, items)) in seals {
            let (idx, objects): (Vec<usize>, Vec<StoredObject>) = items.into_iter().unzip();
            let n = objects.len();
            let sealed = pool.with(|c| {
                c.call::<_, BatchStatusResp>(
                    Opcode::Seal,
                    &SealReq {
                        objects: objects.clone(),
                    },
                )
            });
            match sealed {
                Ok(r) if r.items.len() == n => {
                    for (i, st) in idx.into_iter().zip(r.items) {
                        if st != Status::Ok {
                            results[i] = Some(status_result(st, keys[i]));
                        }
                    }
                }
                Ok(_) => {
                    for i in idx {
                        results[i] = Some(Err(ClientError::Invalid(
                            "store answered a different number of items".into(),
                        )));
                    }
                }
                Err(e) => {
                    for i in idx {
                        results[i] = Some(Err(ClientError::Store {
                            endpoint: endpoint.clone(),
                            source: TransferError::Protocol(format!("seal failed: {e}")),
                        }));
                    }
                }
            }
        }
        let records = WriteRecords {
            keys,
            object_ids: &object_ids,
            checksums: &checksums,
        };
        for (endpoint, (pool, items)) in remote {
            let outcome = pipelined_writes(&pool, &items, values, &records);
            for ((i, _), r) in items.iter().zip(outcome) {
                if let Err(e) = r {
                    pool.clear();
                    results[*i] = Some(Err(ClientError::Store {
                        endpoint: endpoint.clone(),
                        source: e,
                    }));
                }
            }
        }
        // Commit what was written, revoke what was not.
        let (mut commit, mut revoke) = (Vec::new(), Vec::new());
        for i in 0..keys.len() {
            if object_ids[i] == 0 {
                continue;
            }
            let item = EndItem {
                key: keys[i].to_string(),
                object_id: object_ids[i],
                checksum: if results[i].is_none() {
                    checksums[i]
                } else {
                    0
                },
            };
            if results[i].is_none() {
                commit.push((i, item))
            } else {
                revoke.push(item)
            }
        }
        if !revoke.is_empty() {
            let req = BatchPutEndReq {
                client_id: self.id,
                items: revoke,
            };
            if let Err(e) = self.master_call::<_, BatchStatusResp>(Opcode::BatchPutRevoke, &req) {
                tracing::warn!(error = %e, "revoking failed puts; the master reclaims them later");
            }
        }
        if !commit.is_empty() {
            let (idx, items): (Vec<usize>, Vec<EndItem>) = commit.into_iter().unzip();
            let req = BatchPutEndReq {
                client_id: self.id,
                items,
            };
            match self.master_call::<_, BatchStatusResp>(Opcode::BatchPutEnd, &req) {
                Ok(r) => {
                    for (i, s) in idx.iter().zip(r.items) {
                        results[*i] = Some(status_result(s, keys[*i]));
                    }
                }
                Err(e) => {
                    for i in idx {
                        results[i] = Some(Err(clone_err(&e)));
                    }
                }
            }
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }
}

fn read_one(pool: &Pool, offset: u64, dst: &mut [u8]) -> Result<(), TransferError> {
    let mut conn = pool.get()?;
    let req = ReadReq {
        offset,
        length: dst.len() as u64,
    };
    let id = conn.send(Opcode::Read, &req.to_meta(), &[])?;
    recv_read(&mut conn, id, dst)?;
    conn.release();
    Ok(())
}

fn recv_read(conn: &mut Connection, id: u64, dst: &mut [u8]) -> Result<(), TransferError> {
    let (header, _) = conn.recv(id)?;
    if header.data_len != dst.len() as u64 {
        return Err(TransferError::Protocol(format!(
            "store sent {} bytes, expected {}",
            header.data_len,
            dst.len()
        )));
    }
    conn.io.read_data_into(dst)
}

/// Sends reads in windows of `PIPELINE_WINDOW` on one connection and receives each payload
/// straight into its buffer. Returns, per item, whether it was read.
fn pipelined_reads(
    pool: &Pool,
    items: &[(usize, u64)],
    lens: &[usize],
    bufs: &mut [&mut [u8]],
) -> Vec<bool> {
    let mut ok = vec![false; items.len()];
    let Ok(mut conn) = pool.get() else { return ok };
    let mut healthy = true;
    for chunk_start in (0..items.len()).step_by(PIPELINE_WINDOW) {
        let chunk = chunk_start..(chunk_start + PIPELINE_WINDOW).min(items.len());
        let mut ids = Vec::with_capacity(chunk.len());
        for j in chunk.clone() {
            let req = ReadReq {
                offset: items[j].1,
                length: lens[j] as u64,
            };
            match conn.send(Opcode::Read, &req.to_meta(), &[]) {
                Ok(id) => ids.push(id),
                Err(_) => {
                    healthy = false;
                    break;
                }
            }
        }
        for (k, id) in ids.into_iter().enumerate() {
            let j = chunk.start + k;
            let (item, _) = items[j];
            match recv_read(&mut conn, id, &mut bufs[item][..lens[j]]) {
                Ok(()) => ok[j] = true,
                Err(e) if !e.breaks_connection() => {}
                Err(_) => {
                    healthy = false;
                    break;
                }
            }
        }
        if !healthy {
            break;
        }
    }
    if healthy {
        conn.release();
    }
    ok
}

/// What a persistent store records with each written object, by item.
struct WriteRecords<'a> {
    keys: &'a [&'a str],
    object_ids: &'a [u64],
    checksums: &'a [u32],
}

/// Sends writes in windows on one connection, payloads straight from the values.
fn pipelined_writes(
    pool: &Pool,
    items: &[(usize, u64)],
    values: &[&[u8]],
    records: &WriteRecords<'_>,
) -> Vec<Result<(), TransferError>> {
    let mut out: Vec<Result<(), TransferError>> = Vec::with_capacity(items.len());
    let mut conn = match pool.get() {
        Ok(c) => c,
        Err(e) => {
            let msg = e.to_string();
            out.push(Err(e));
            out.extend((1..items.len()).map(|_| Err(TransferError::Protocol(msg.clone()))));
            return out;
        }
    };
    for chunk_start in (0..items.len()).step_by(PIPELINE_WINDOW) {
        let chunk = chunk_start..(chunk_start + PIPELINE_WINDOW).min(items.len());
        let mut ids = Vec::with_capacity(chunk.len());
        let mut send_err = None;
        for j in chunk.clone() {
            let (item, offset) = items[j];
            let req = WriteReq {
                offset,
                key: records.keys[item].to_string(),
                version: records.object_ids[item],
                checksum: records.checksums[item],
            };
            match conn.send(Opcode::Write, &req.to_meta(), &[values[item]]) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    send_err = Some(e.to_string());
                    break;
                }
            }
        }
        for id in &ids {
            out.push(conn.recv(*id).map(|_| ()));
        }
        if let Some(msg) = send_err {
            let left = items.len() - out.len();
            out.extend(
                (0..left).map(|_| Err(TransferError::Protocol(format!("write not sent: {msg}")))),
            );
            return out;
        }
    }
    if out
        .iter()
        .all(|r| r.as_ref().map_or_else(|e| !e.breaks_connection(), |_| true))
    {
        conn.release();
    }
    out
}
