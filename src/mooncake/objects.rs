//! Mooncake's puts and replica lists, carried out as rbgctl's: a put is placed by the master's
//! own `PUT_START` on the stores that serve Mooncake's Transfer Engine, its replicas answered
//! as Mooncake buffer descriptors (the segment's Mooncake name, its address there); the client
//! writes them through the Transfer Engine; at its `PutEnd` the master has each store record
//! what was written (`SEAL_DEFERRED`, with the put's grants: the store hashes the bytes) before
//! it commits the put. So an object a Mooncake client put is an rbgctl object like any other:
//! recorded by its stores, reported after a master restart or failover, evicted, read by
//! rbgctl's clients.
//!
//! Mooncake's `PutEnd` names the key, not the put: the puts a client has started are kept by
//! (client, key) until they end, are revoked, or are older than [`PENDING_TTL`].

use super::master::{call, mooncake_code, Fail};
use super::struct_pack::Map;
use super::types::{
    error_code, replica_status, soft_pin, BufferDescriptor, GetReplicaListResponse, Placement,
    ReplicaDescriptor, ReplicateConfig,
};
use crate::transfer::grant::Grant;
use crate::transfer::message::{
    self as msg, BatchExistsResp, BatchKeysReq, BatchPutEndReq, BatchPutStartReq,
    BatchPutStartResp, BatchRemoveReq, EndItem, KeyReq, ListKeysReq, ObjectDesc, PutEndReq,
    PutItem, PutRevokeReq, ReplicaLoc, SealReq, StoredObject, Tier,
};
use crate::transfer::rpc;
use crate::transfer::server::Service;
use crate::transfer::tenant as tenants;
use crate::transfer::{ConnOptions, Pool, Status};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A put not ended within this is forgotten here (the master reclaims its space too).
pub const PENDING_TTL: Duration = Duration::from_secs(600);
/// Puts in progress kept at once, for all Mooncake clients.
pub const MAX_PENDING: usize = 1 << 20;
/// How old the segments' Mooncake names may be before they are asked for again.
const SEGMENTS_FRESH: Duration = Duration::from_secs(1);

type Expected<T> = Result<T, i32>;

/// A segment as Mooncake's answers need it.
#[derive(Clone, Debug)]
struct SegmentRef {
    /// Mooncake's name for it (`host:handshake_port`); `None` when its store does not serve
    /// the Transfer Engine (Mooncake's clients cannot reach it).
    te: Option<Arc<str>>,
    /// Its first address in the Transfer Engine's addresses.
    base: u64,
    /// Its store's rbgctl endpoint, where its puts are sealed; empty for a segment a Mooncake
    /// process mounted (which keeps no records).
    endpoint: Arc<str>,
    name: Arc<str>,
}

#[derive(Default)]
struct SegmentBook {
    by_id: HashMap<u64, SegmentRef>,
    asked: Option<Instant>,
}

/// A Mooncake put started and not yet ended.
struct Pending {
    object_id: u64,
    size: u64,
    replicas: Vec<ReplicaLoc>,
    grants: Vec<Grant>,
    started: Instant,
}

/// The state of Mooncake's object RPCs: segments' Mooncake names, puts in progress,
/// connections to the stores.
#[derive(Default)]
pub(super) struct Objects {
    segments: RwLock<SegmentBook>,
    pending: Mutex<HashMap<(u64, String), Pending>>,
    stores: Mutex<HashMap<Arc<str>, Arc<Pool>>>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("pending", &self.pending.lock().len())
            .finish_non_exhaustive()
    }
}

/// rbgctl's placement of a Mooncake `ReplicateConfig`: replica count, soft pin and its TTL,
/// the preferred segment (by its Mooncake or rbgctl name).
fn placement_of(
    c: &ReplicateConfig,
    names: impl Fn(&str) -> Option<String>,
) -> msg::ReplicateConfig {
    let preferred = std::iter::once(&c.preferred_segment)
        .chain(&c.preferred_segments)
        .find(|s| !s.is_empty())
        .map(|s| names(s).unwrap_or_else(|| s.clone()))
        .unwrap_or_default();
    msg::ReplicateConfig {
        replica_num: c.replica_num.clamp(1, u64::from(u8::MAX)) as u8,
        soft_pin: c.soft_pin_action == soft_pin::ENABLE || c.with_hard_pin,
        soft_pin_ttl_ms: c.soft_pin_ttl_ms.unwrap_or(0),
        preferred_segment: preferred,
        reach: msg::Reach::MooncakeTe,
    }
}

impl Objects {
    /// What `find` finds in the segments' book, asking the master's list again when the book
    /// is old, or when `find` finds nothing and what it looks for may be new (a segment
    /// mounted since the book was made). A name nothing has (a client preferring its own host,
    /// which contributes no segment) does not cost a list per put.
    fn look<T>(
        &self,
        service: &dyn Service,
        may_be_new: bool,
        find: impl Fn(&SegmentBook) -> Option<T>,
    ) -> Option<T> {
        {
            let book = self.segments.read();
            if book.asked.is_some_and(|t| t.elapsed() < SEGMENTS_FRESH) {
                let found = find(&book);
                if found.is_some() || !may_be_new {
                    return found;
                }
            }
        }
        self.refresh(service);
        find(&self.segments.read())
    }

    /// The segment `id` as Mooncake's answers need it (the master hands out replicas on
    /// mounted segments only: one it does not know is new).
    fn segment(&self, service: &dyn Service, id: u64) -> Option<SegmentRef> {
        self.look(service, true, |book| book.by_id.get(&id).cloned())
    }

    fn refresh(&self, service: &dyn Service) {
        let Ok(list) = call::<rpc::ListSegments>(service, &()) else {
            return;
        };
        let by_id = list
            .segments
            .into_iter()
            .map(|e| {
                let te = (e.info.tier == Tier::Memory && !e.info.te_endpoint.is_empty())
                    .then(|| Arc::from(e.info.te_endpoint.as_str()));
                let r = SegmentRef {
                    te,
                    base: e.info.te_base,
                    endpoint: Arc::from(e.info.endpoint.as_str()),
                    name: Arc::from(e.info.name.as_str()),
                };
                (e.id, r)
            })
            .collect();
        *self.segments.write() = SegmentBook {
            by_id,
            asked: Some(Instant::now()),
        };
    }

    /// The rbgctl name of the segment Mooncake calls `name`.
    fn rbgctl_name(&self, service: &dyn Service, name: &str) -> Option<String> {
        self.look(service, false, |book| {
            book.by_id
                .values()
                .find(|s| s.te.as_deref() == Some(name) || &*s.name == name)
                .map(|s| s.name.to_string())
        })
    }

    /// Mooncake's descriptor of each replica, `None` when one lies where Mooncake's clients
    /// cannot reach it.
    fn descriptors(
        &self,
        service: &dyn Service,
        replicas: &[ReplicaLoc],
        size: u64,
        status: i32,
    ) -> Vec<Option<ReplicaDescriptor>> {
        replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let seg = self.segment(service, r.segment_id)?;
                let te = seg.te?;
                Some(ReplicaDescriptor {
                    id: i as u64,
                    placement: Placement::Memory(BufferDescriptor {
                        size,
                        buffer_address: seg.base.checked_add(r.offset)?,
                        protocol: "tcp".into(),
                        transport_endpoint: te.to_string(),
                    }),
                    status,
                })
            })
            .collect()
    }

    /// `PutStart` of each `(key, size)` (or `UpsertStart`, which may replace a value): places
    /// the puts (one master operation for them all) and answers where to write each.
    pub(super) fn put_start(
        &self,
        service: &dyn Service,
        client_id: u64,
        items: Vec<(String, u64)>,
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Result<Vec<Expected<Vec<ReplicaDescriptor>>>, Fail> {
        let mut out: Vec<Expected<Vec<ReplicaDescriptor>>> = items
            .iter()
            .map(|(_, size)| match size {
                0 => Err(error_code::INVALID_PARAMS),
                _ => Ok(Vec::new()),
            })
            .collect();
        // Mooncake's put leaves a key that exists as it is (its upsert replaces it).
        if !upsert {
            let keys = items.iter().map(|(k, _)| k.clone()).collect();
            let exists: BatchExistsResp =
                call::<rpc::BatchExists>(service, &BatchKeysReq { keys })?;
            for (o, exists) in out.iter_mut().zip(exists.items) {
                if exists && o.is_ok() {
                    *o = Err(error_code::OBJECT_ALREADY_EXISTS);
                }
            }
        }
        let starting: Vec<usize> = (0..items.len()).filter(|&i| out[i].is_ok()).collect();
        if starting.is_empty() {
            return Ok(out);
        }
        let req = BatchPutStartReq {
            client_id,
            config: placement_of(config, |n| self.rbgctl_name(service, n)),
            items: starting
                .iter()
                .map(|&i| PutItem {
                    key: items[i].0.clone(),
                    size: items[i].1,
                })
                .collect(),
        };
        let started: BatchPutStartResp = match call::<rpc::BatchPutStart>(service, &req) {
            Ok(r) => r,
            Err(Fail::Code(code)) => {
                for &i in &starting {
                    out[i] = Err(code);
                }
                return Ok(out);
            }
            Err(f) => return Err(f),
        };
        let mut given_up = Vec::new();
        let mut pending = self.pending.lock();
        if pending.len() + starting.len() > MAX_PENDING {
            pending.retain(|_, p| p.started.elapsed() < PENDING_TTL);
        }
        for (&i, result) in starting.iter().zip(started.items) {
            let (key, size) = &items[i];
            let started = match result {
                Ok(r) => r,
                Err(status) => {
                    out[i] = Err(mooncake_code(status));
                    continue;
                }
            };
            let descriptors = self.descriptors(
                service,
                &started.replicas,
                *size,
                replica_status::PROCESSING,
            );
            let Some(descriptors) = descriptors.into_iter().collect::<Option<Vec<_>>>() else {
                tracing::warn!(%key, "a Mooncake put was placed on a store that does not serve \
                    Mooncake's Transfer Engine (mooncake_transfer = false); refused");
                given_up.push((key.clone(), started.object_id));
                out[i] = Err(error_code::NO_AVAILABLE_HANDLE);
                continue;
            };
            if pending.len() >= MAX_PENDING {
                tracing::warn!(
                    limit = MAX_PENDING,
                    "Mooncake puts in progress at their limit"
                );
                given_up.push((key.clone(), started.object_id));
                out[i] = Err(error_code::NO_AVAILABLE_HANDLE);
                continue;
            }
            let earlier = pending.insert(
                (client_id, key.clone()),
                Pending {
                    object_id: started.object_id,
                    size: *size,
                    replicas: started.replicas,
                    grants: started.grants,
                    started: Instant::now(),
                },
            );
            // The same client starting the same key again gave its earlier put up.
            if let Some(p) = earlier {
                given_up.push((key.clone(), p.object_id));
            }
            out[i] = Ok(descriptors);
        }
        drop(pending);
        for (key, object_id) in given_up {
            revoke(service, client_id, &key, object_id);
        }
        Ok(out)
    }

    /// `PutEnd` of each of `keys`: has the stores record what was written, then commits.
    pub(super) fn put_end(
        &self,
        service: &dyn Service,
        client_id: u64,
        keys: &[String],
    ) -> Vec<Expected<()>> {
        let mut taken: Vec<Option<Pending>> = {
            let mut pending = self.pending.lock();
            keys.iter()
                .map(|k| pending.remove(&(client_id, k.clone())))
                .collect()
        };
        let mut out: Vec<Expected<()>> = taken
            .iter()
            .map(|p| match p {
                Some(_) => Ok(()),
                None => Err(error_code::OBJECT_NOT_FOUND),
            })
            .collect();
        // One SEAL_DEFERRED per store for the whole batch: recorded at once, hashed by the
        // store after it answered when the bytes came one-sided.
        let mut by_store: HashMap<Arc<str>, (SealReq, Vec<usize>)> = HashMap::new();
        for (i, p) in taken.iter().enumerate() {
            let Some(p) = p else { continue };
            for (r, grant) in p.replicas.iter().zip(&p.grants) {
                let Some(seg) = self.segment(service, r.segment_id) else {
                    out[i] = Err(error_code::SEGMENT_NOT_FOUND);
                    continue;
                };
                // A Mooncake process's own segment: the client wrote it in place; nothing
                // there keeps a record.
                if seg.endpoint.is_empty() {
                    continue;
                }
                let (req, items) = by_store.entry(seg.endpoint).or_insert_with(|| {
                    (
                        SealReq {
                            objects: Vec::new(),
                            grants: Vec::new(),
                        },
                        Vec::new(),
                    )
                });
                req.objects.push(StoredObject {
                    key: keys[i].clone(),
                    version: p.object_id,
                    offset: r.offset,
                    size: p.size,
                    checksum: 0,
                });
                req.grants.push(*grant);
                items.push(i);
            }
        }
        let mut checksums: Vec<Option<u32>> = vec![None; keys.len()];
        // A replica recorded unhashed makes the put unhashed until its store sends the hash.
        let mut unhashed = vec![false; keys.len()];
        for (endpoint, (req, items)) in by_store {
            let sealed = self
                .store(&endpoint)
                .with(|c| c.call::<rpc::SealDeferred>(&req));
            match sealed {
                Ok(r)
                    if r.items.len() == items.len()
                        && r.checksums.len() == items.len()
                        && r.hashed.len() == items.len() =>
                {
                    let answers = r.items.into_iter().zip(r.checksums).zip(r.hashed);
                    for (&i, ((status, crc), hashed)) in items.iter().zip(answers) {
                        if status != Status::Ok {
                            tracing::warn!(key = %keys[i], %endpoint, ?status,
                                "a store did not record a Mooncake put's replica");
                            out[i] = Err(error_code::INVALID_WRITE);
                        } else if !hashed {
                            unhashed[i] = true;
                        } else if checksums[i].is_some_and(|c| c != crc) {
                            tracing::warn!(key = %keys[i], "a Mooncake put's replicas differ");
                            out[i] = Err(error_code::INVALID_WRITE);
                        } else {
                            checksums[i] = Some(crc);
                        }
                    }
                }
                other => {
                    tracing::warn!(%endpoint, error = ?other.err(),
                        "cannot have a store record Mooncake puts");
                    for &i in &items {
                        out[i] = Err(error_code::TRANSFER_FAIL);
                    }
                }
            }
        }
        // Commit those every replica of which is recorded; give the others up. A put with
        // no replica on an rbgctl store has no checksum (a Mooncake process's segment hashes
        // nothing), nor one with a replica its store hashes later: it is committed unhashed.
        let mut items = Vec::new();
        let mut committed = Vec::new();
        for (i, p) in taken.iter_mut().enumerate() {
            let Some(p) = p.take() else { continue };
            let checksum = checksums[i].filter(|_| !unhashed[i]);
            match (&out[i], checksum) {
                (Ok(()), checksum) => {
                    items.push(EndItem {
                        key: keys[i].clone(),
                        object_id: p.object_id,
                        checksum: checksum.unwrap_or(0),
                        unhashed: checksum.is_none(),
                    });
                    committed.push(i);
                }
                _ => revoke(service, client_id, &keys[i], p.object_id),
            }
        }
        match items.len() {
            0 => {}
            1 => {
                let EndItem {
                    key,
                    object_id,
                    checksum,
                    unhashed,
                } = items.pop().expect("one");
                let req = PutEndReq {
                    client_id,
                    key,
                    object_id,
                    checksum,
                    unhashed,
                };
                if let Err(f) = call::<rpc::PutEnd>(service, &req) {
                    out[committed[0]] = Err(code_of(f));
                }
            }
            _ => {
                let req = BatchPutEndReq { client_id, items };
                match call::<rpc::BatchPutEnd>(service, &req) {
                    Ok(r) => {
                        for (&i, s) in committed.iter().zip(r.items) {
                            if s != Status::Ok {
                                out[i] = Err(mooncake_code(s));
                            }
                        }
                    }
                    Err(f) => {
                        let code = code_of(f);
                        for &i in &committed {
                            out[i] = Err(code);
                        }
                    }
                }
            }
        }
        out
    }

    /// `PutRevoke` of each of `keys`.
    pub(super) fn put_revoke(
        &self,
        service: &dyn Service,
        client_id: u64,
        keys: &[String],
    ) -> Vec<Expected<()>> {
        keys.iter()
            .map(|key| {
                let p = self.pending.lock().remove(&(client_id, key.clone()));
                match p {
                    Some(p) => {
                        revoke(service, client_id, key, p.object_id);
                        Ok(())
                    }
                    None => Err(error_code::OBJECT_NOT_FOUND),
                }
            })
            .collect()
    }

    /// `GetReplicaList`: the object's replicas Mooncake's clients can read, with a read lease.
    pub(super) fn replica_list(
        &self,
        service: &dyn Service,
        key: String,
    ) -> Result<Expected<GetReplicaListResponse>, Fail> {
        match call::<rpc::GetReplicas>(service, &KeyReq { key: key.clone() }) {
            Ok(d) => Ok(self.listed(service, &key, d)),
            Err(Fail::Code(code)) => Ok(Err(code)),
            Err(f) => Err(f),
        }
    }

    /// `BatchGetReplicaList`.
    pub(super) fn replica_lists(
        &self,
        service: &dyn Service,
        keys: Vec<String>,
    ) -> Result<Vec<Expected<GetReplicaListResponse>>, Fail> {
        let n = keys.len();
        let resp =
            match call::<rpc::BatchGetReplicas>(service, &BatchKeysReq { keys: keys.clone() }) {
                Ok(r) => r,
                Err(Fail::Code(code)) => return Ok((0..n).map(|_| Err(code)).collect()),
                Err(f) => return Err(f),
            };
        Ok(keys
            .iter()
            .zip(resp.items)
            .map(|(key, item)| match item {
                Ok(d) => self.listed(service, key, d),
                Err(s) => Err(mooncake_code(s)),
            })
            .collect())
    }

    /// `GetReplicaListByRegex`: every readable key the pattern matches (searched anywhere in
    /// the key, as Mooncake does) with its replicas, each under a read lease; keys none of
    /// whose replicas Mooncake's clients reach are left out, as Mooncake leaves out keys
    /// without a complete replica.
    pub(super) fn replica_lists_matching(
        &self,
        service: &dyn Service,
        pattern: String,
        tenant: &str,
    ) -> Result<Map<String, Vec<ReplicaDescriptor>>, Fail> {
        let keys = matching_keys(service, pattern, tenant)?;
        let mut found = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(REGEX_BATCH) {
            let held = chunk
                .iter()
                .map(|k| tenants::scoped(tenant, k).into_owned());
            let lists = self.replica_lists(service, held.collect())?;
            for (key, list) in chunk.iter().zip(lists) {
                if let Ok(list) = list {
                    found.push((key.clone(), list.replicas));
                }
            }
        }
        Ok(Map(found))
    }

    /// `RemoveByRegex`: removes every readable key the pattern matches (those under a read
    /// lease too when `force`); answers how many went.
    pub(super) fn remove_matching(
        &self,
        service: &dyn Service,
        pattern: String,
        force: bool,
        tenant: &str,
    ) -> Result<i64, Fail> {
        let keys = matching_keys(service, pattern, tenant)?;
        let mut removed = 0i64;
        for chunk in keys.chunks(REGEX_BATCH) {
            let req = BatchRemoveReq {
                force,
                keys: chunk
                    .iter()
                    .map(|k| tenants::scoped(tenant, k).into_owned())
                    .collect(),
            };
            let r = call::<rpc::BatchRemove>(service, &req)?;
            removed += r.items.iter().filter(|s| **s == Status::Ok).count() as i64;
        }
        Ok(removed)
    }

    fn listed(
        &self,
        service: &dyn Service,
        key: &str,
        d: ObjectDesc,
    ) -> Expected<GetReplicaListResponse> {
        let replicas: Vec<ReplicaDescriptor> = self
            .descriptors(service, &d.replicas, d.size, replica_status::COMPLETE)
            .into_iter()
            .flatten()
            .collect();
        if replicas.is_empty() {
            tracing::debug!(
                key,
                "no replica of the object is where Mooncake's clients read \
                (a store without Mooncake's Transfer Engine, or the disk tier)"
            );
            return Err(error_code::REPLICA_IS_NOT_READY);
        }
        Ok(GetReplicaListResponse {
            replicas,
            lease_ttl_ms: d.lease_ttl_ms,
            object_checksum: None,
        })
    }

    /// The connection pool to the store at `endpoint`.
    fn store(&self, endpoint: &Arc<str>) -> Arc<Pool> {
        self.stores
            .lock()
            .entry(endpoint.clone())
            .or_insert_with(|| {
                Arc::new(Pool::new(
                    endpoint.to_string(),
                    ConnOptions {
                        connect_timeout: Duration::from_secs(1),
                        io_timeout: Duration::from_secs(5),
                        spin: Duration::ZERO,
                        auth: None,
                    },
                ))
            })
            .clone()
    }
}

fn code_of(f: Fail) -> i32 {
    match f {
        Fail::Code(code) => code,
        Fail::Args(_) => error_code::INVALID_PARAMS,
    }
}

/// Gives a put up (its space freed); a failure leaves it to the master's own reclaiming.
fn revoke(service: &dyn Service, client_id: u64, key: &str, object_id: u64) {
    let req = PutRevokeReq {
        client_id,
        key: key.to_string(),
        object_id,
    };
    if let Err(Fail::Code(code)) = call::<rpc::PutRevoke>(service, &req) {
        tracing::debug!(
            key,
            code,
            "revoking a Mooncake put failed; the master reclaims it"
        );
    }
}

/// Keys asked of the master per batch in the regex RPCs.
const REGEX_BATCH: usize = 4096;

/// `tenant`'s readable keys `pattern` matches, as the tenant names them (at most
/// `LIST_KEYS`'s limit, with a log line when more do); a pattern the master does not take is
/// Mooncake's `INVALID_PARAMS`.
fn matching_keys(
    service: &dyn Service,
    pattern: String,
    tenant: &str,
) -> Result<Vec<String>, Fail> {
    let limit = crate::transfer::codec::MAX_LIST_LEN as u32;
    let req = ListKeysReq {
        pattern,
        limit,
        tenant: tenant.to_string(),
    };
    let r = call::<rpc::ListKeys>(service, &req)?;
    if r.truncated {
        tracing::warn!(
            limit,
            "a Mooncake regex RPC matched more keys than one answer holds; only the first \
             are taken"
        );
    }
    Ok(r.keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicate_config_maps_what_rbgctl_has() {
        let c = ReplicateConfig {
            replica_num: 3,
            soft_pin_action: soft_pin::ENABLE,
            soft_pin_ttl_ms: Some(5_000),
            preferred_segments: vec!["127.0.0.1:15001".into()],
            ..Default::default()
        };
        let m = placement_of(&c, |n| (n == "127.0.0.1:15001").then(|| "store-0".into()));
        assert_eq!(m.replica_num, 3);
        assert!(m.soft_pin);
        assert_eq!(m.soft_pin_ttl_ms, 5_000);
        assert_eq!(m.preferred_segment, "store-0");
        let none = placement_of(&ReplicateConfig::default(), |_| None);
        assert_eq!((none.replica_num, none.soft_pin), (1, false));
        let huge = ReplicateConfig {
            replica_num: u64::MAX,
            ..Default::default()
        };
        assert_eq!(placement_of(&huge, |_| None).replica_num, u8::MAX);
    }
}
