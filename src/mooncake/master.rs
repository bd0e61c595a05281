//! Mooncake's master RPC on the master's port: each coro_rpc request is decoded, carried out
//! as the rbgctl operation it is (through the master's own service, so leases, durability and
//! leadership hold the same) and answered in Mooncake's types and error codes.
//!
//! Served so far: the calls a client makes before and around its first operations
//! (ServiceReady, GetStorageConfig, GetFsdir, Ping, FetchTasks) and the key operations that
//! move no bytes (ExistKey, BatchExistKey, Remove, BatchRemove, RemoveAll). The other RPCs a
//! client calls answer Mooncake's `NOT_SUPPORTED` in their own result type; handlers Mooncake
//! registers for features rbgctl has not (NoF, SSD offload, copy and move tasks) answer
//! coro_rpc's "not registered" with their name. Tenants other than `default` are refused with
//! `TENANT_NOT_REGISTERED`.

use super::coro_rpc::{self, error_response, Errc, RequestHeader, MAGIC, REQUEST_HEADER_LEN};
use super::objects::Objects;
use super::rpcs::{handler, Handler, Rpc, SERVICE_VERSION};
use super::segments::Mounts;
use super::struct_pack::Map;
use super::struct_pack::{Pack, SpError, TypeSig};
use super::types::{
    client_status, error_code, GetReplicaListResponse, GetStorageConfigResponse, ObjectMeta,
    PingResponse, ReplicaDescriptor, ReplicateConfig, Segment, TaskAssignment, Uuid,
};
use crate::telemetry::{Family, PromText};
use crate::transfer::frame::{Header, Opcode, Status, FLAG_EPOCH, HEADER_LEN};
use crate::transfer::message::{
    BatchKeysReq, BatchRemoveReq, KeyReq, PingReq, PingResp, RemoveAllReq, RemoveReq, Wire,
};
use crate::transfer::rpc;
use crate::transfer::server::{Guest, GuestConn, Handling, ServerIo, Service, Sink};
use crate::transfer::tenant as tenants;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

// The `/metrics` families this file writes, each declared once.
const MOONCAKE_BAD_REQUESTS_TOTAL: Family = Family::counter(
    "rbgctl_master_mooncake_bad_requests_total",
    "Mooncake requests refused: arguments that did not decode, an unknown version, a \
             body over the limit.",
);
const MOONCAKE_CONNECTIONS_TOTAL: Family = Family::counter(
    "rbgctl_master_mooncake_connections_total",
    "Connections that spoke Mooncake's master RPC.",
);
const MOONCAKE_REQUESTS_TOTAL: Family = Family::counter(
    "rbgctl_master_mooncake_requests_total",
    "Requests of Mooncake's master RPC, by RPC and result (ok, or error: a Mooncake \
             error code in the answer).",
);
const MOONCAKE_UNSERVED_REQUESTS_TOTAL: Family = Family::counter(
    "rbgctl_master_mooncake_unserved_requests_total",
    "Mooncake requests for handlers rbgctl's master does not serve (answered coro_rpc's \
             \"not registered\").",
);

/// Largest request body (and attachment) taken: Mooncake's largest requests are batches of a
/// few hundred keys.
pub const MAX_REQUEST: u64 = 16 << 20;

/// Mooncake's master RPC, as a guest of the master's port, and what it has served.
#[derive(Debug, Default)]
pub struct MooncakeMaster {
    stats: Stats,
    objects: Objects,
    mounts: Mounts,
}

/// Requests served, by RPC and outcome; connections and refused frames.
#[derive(Debug, Default)]
struct Stats {
    /// Per RPC (in `Rpc::ALL` order): answered with its value, with a Mooncake error code.
    ok: [AtomicU64; RPC_COUNT],
    failed: [AtomicU64; RPC_COUNT],
    /// Requests for handlers rbgctl does not serve, or no one registers.
    unserved: AtomicU64,
    /// Requests whose arguments did not decode, or frames refused (size, version).
    bad: AtomicU64,
    connections: AtomicU64,
    /// Per RPC: the request type hash its last request carried (0: none came), for the wire
    /// report that checks a client version against this master.
    seen_hash: [AtomicU32; RPC_COUNT],
    /// Function ids of requests for handlers not served, with the type hash each carried.
    unknown: parking_lot::Mutex<std::collections::BTreeMap<u32, u32>>,
}

/// Function ids not served that the wire report remembers.
const UNKNOWN_REMEMBERED: usize = 64;

/// One RPC of the wire report: what this master expects beside what clients sent.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct WireRow {
    pub rpc: String,
    /// Whether this master serves it (else it answers Mooncake's "not registered").
    pub served: bool,
    pub function_id: u32,
    /// The request type hash this master decodes (`None`: the RPC takes no arguments, or is
    /// not served).
    pub request_type_hash: Option<u32>,
    /// The hash the last request for it carried (`None`: no client called it yet).
    pub seen_type_hash: Option<u32>,
}

const RPC_COUNT: usize = Rpc::ALL.len();

impl MooncakeMaster {
    /// Its figures, for the master's `/metrics`.
    pub fn render(&self, p: &mut PromText) {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        p.family(&MOONCAKE_REQUESTS_TOTAL);
        for (i, rpc) in Rpc::ALL.iter().enumerate() {
            for (result, c) in [("ok", &self.stats.ok[i]), ("error", &self.stats.failed[i])] {
                if c.load(Ordering::Relaxed) > 0 {
                    p.sample(
                        &MOONCAKE_REQUESTS_TOTAL,
                        &[("rpc", rpc.name()), ("result", result)],
                        n(c),
                    );
                }
            }
        }
        p.atomic(&MOONCAKE_UNSERVED_REQUESTS_TOTAL, &self.stats.unserved)
            .atomic(&MOONCAKE_BAD_REQUESTS_TOTAL, &self.stats.bad)
            .atomic(&MOONCAKE_CONNECTIONS_TOTAL, &self.stats.connections);
    }
}

impl MooncakeMaster {
    /// Every RPC's function id and request type hash as this master expects them, beside the
    /// hashes clients sent; then the function ids of requests it does not serve.
    pub fn wire_report(&self) -> Vec<WireRow> {
        let seen = |h: u32| (h != 0).then_some(h);
        let mut rows: Vec<WireRow> = Rpc::ALL
            .iter()
            .enumerate()
            .map(|(i, &rpc)| {
                let (served, request_type_hash) = expected_request_hash(rpc);
                WireRow {
                    rpc: rpc.name().to_string(),
                    served,
                    function_id: rpc.id(),
                    request_type_hash,
                    seen_type_hash: seen(self.stats.seen_hash[i].load(Ordering::Relaxed)),
                }
            })
            .collect();
        for (&id, &hash) in self.stats.unknown.lock().iter() {
            rows.push(WireRow {
                rpc: match handler(id) {
                    Some(Handler::Unserved(name)) => name.to_string(),
                    _ => format!("unknown function {id:#010x}"),
                },
                served: false,
                function_id: id,
                request_type_hash: None,
                seen_type_hash: seen(hash),
            });
        }
        rows
    }
}

/// Whether `rpc` is served, and the request type hash its handler decodes: asked of the
/// handler itself, with a body whose hash no type has (its refusal names the one it wanted),
/// so that each type is written once.
fn expected_request_hash(rpc: Rpc) -> (bool, Option<u32>) {
    /// A service that serves nothing: the probe never gets past the arguments.
    struct Nothing(crate::transfer::server::ConnCounters);
    impl Service for Nothing {
        fn handle(&self, _: Opcode, _: &[u8], _: &mut ServerIo<'_>) -> Handling {
            Err(crate::transfer::TransferError::Protocol(
                "a probe serves nothing".into(),
            ))
        }
        fn max_data_len(&self) -> u64 {
            0
        }
        fn connections(&self) -> &crate::transfer::server::ConnCounters {
            &self.0
        }
    }
    let nothing = Nothing(Default::default());
    let probe = [0u8; 4];
    match carry_out(
        &nothing,
        (&Objects::default(), &Mounts::default()),
        rpc,
        &probe,
    ) {
        Err(Fail::Args(SpError::TypeHash { want, .. })) => (true, Some(want & !1)),
        Err(Fail::Code(error_code::NOT_SUPPORTED)) => (false, None),
        _ => (true, None),
    }
}

impl Guest for MooncakeMaster {
    fn speaks(&self, first: &[u8]) -> bool {
        first.first() == Some(&MAGIC)
    }

    fn serve(&self, service: &dyn Service, handed: GuestConn) {
        let GuestConn {
            mut stream,
            peer,
            read,
            idle_timeout,
            request_timeout,
        } = handed;
        tracing::debug!(%peer, "a Mooncake client connected to the master");
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let mut conn = Conn::new(read, idle_timeout, request_timeout);
        loop {
            let frame = match conn.next(&mut stream) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "Mooncake connection ended");
                    break;
                }
            };
            let answer = match frame {
                Frame::Request(head, body) => self.answer(service, &head, &body),
                Frame::Refused(head, errc, why) => {
                    self.stats.bad.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, reason = %why, "Mooncake request refused");
                    let out = error_response(head.seq_num, errc, &why);
                    let _ = stream.write_all(&out);
                    break;
                }
            };
            if stream.write_all(&answer).is_err() {
                break;
            }
        }
    }
}

/// A connection's bytes: `buf[start..end]` was read and not yet served; how long reads may
/// wait.
struct Conn {
    /// Zeroed once and read into in place: a request costs no clearing of a buffer (under
    /// TCG, which emulates `rep stosb` a byte at a time, clearing 64 KiB per read was most
    /// of what the master did for a Mooncake RPC).
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The read timeout the socket has, set again only when another applies.
    timeout: Option<Duration>,
    idle_timeout: Duration,
    request_timeout: Duration,
}

enum Frame {
    Request(RequestHeader, Vec<u8>),
    /// A request that is answered with a coro_rpc error, after which the connection closes.
    Refused(RequestHeader, Errc, String),
}

/// What one read may bring at most, and the room a connection keeps for it.
const READ_CHUNK: usize = 64 * 1024;

impl Conn {
    /// A connection whose first bytes (`read`, those its protocol was told by) are at hand.
    fn new(read: Vec<u8>, idle_timeout: Duration, request_timeout: Duration) -> Conn {
        let end = read.len();
        let mut buf = read;
        buf.resize(end.max(READ_CHUNK), 0);
        Conn {
            buf,
            start: 0,
            end,
            timeout: None,
            idle_timeout,
            request_timeout,
        }
    }

    /// Reads until `n` unserved bytes are at hand; `false` at a clean end between requests.
    /// `inside`: a request has begun (its header was read).
    fn fill(&mut self, stream: &mut TcpStream, n: usize, inside: bool) -> std::io::Result<bool> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
            // A large request's room is given back once it was served.
            if self.buf.len() > READ_CHUNK {
                self.buf.truncate(READ_CHUNK);
                self.buf.shrink_to_fit();
            }
        }
        while self.end - self.start < n {
            // Room for the whole of what is asked for and for a read: what is unserved moves
            // to the front, and the buffer grows only for a request larger than it (at most
            // MAX_REQUEST, checked before its body is read).
            if self.buf.len() - self.start < n || self.end == self.buf.len() {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
                if self.buf.len() < n {
                    self.buf.resize(n, 0);
                }
            }
            // Quiet between requests for up to the idle timeout; inside one, each read must
            // bring bytes within the request timeout (a half frame holds nothing for long).
            let wait = match inside || self.end > self.start {
                true => self.request_timeout,
                false => self.idle_timeout,
            };
            if self.timeout != Some(wait) {
                stream.set_read_timeout(Some(wait))?;
                self.timeout = Some(wait);
            }
            let room = (self.buf.len() - self.end).min(READ_CHUNK);
            let got = stream.read(&mut self.buf[self.end..self.end + room])?;
            if got == 0 {
                if self.end == self.start {
                    return Ok(false);
                }
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.end += got;
        }
        Ok(true)
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.buf[self.start..self.start + n];
        self.start += n;
        s
    }

    /// The next request, `None` when the client closed between requests.
    fn next(&mut self, stream: &mut TcpStream) -> std::io::Result<Option<Frame>> {
        if !self.fill(stream, REQUEST_HEADER_LEN, false)? {
            return Ok(None);
        }
        let raw: [u8; REQUEST_HEADER_LEN] = self.take(REQUEST_HEADER_LEN).try_into().expect("20");
        let head = match RequestHeader::decode(&raw) {
            Ok(h) => h,
            Err(e) => {
                let head = RequestHeader {
                    seq_num: u32::from_le_bytes(raw[4..8].try_into().expect("4")),
                    ..RequestHeader::default()
                };
                let errc = match e {
                    coro_rpc::FrameError::Version(_) => Errc::UnknownProtocolVersion,
                    _ => Errc::ProtocolError,
                };
                return Ok(Some(Frame::Refused(head, errc, e.to_string())));
            }
        };
        if head.payload_len() > MAX_REQUEST {
            let why = coro_rpc::FrameError::TooLarge {
                len: head.payload_len(),
                limit: MAX_REQUEST,
            };
            return Ok(Some(Frame::Refused(
                head,
                Errc::MessageTooLarge,
                why.to_string(),
            )));
        }
        let n = head.payload_len() as usize;
        if !self.fill(stream, n, true)? {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let body = self.take(n)[..head.length as usize].to_vec();
        Ok(Some(Frame::Request(head, body)))
    }
}

/// Why a request could not be carried out, as Mooncake's client is told.
pub(super) enum Fail {
    /// coro_rpc's own error: its arguments did not decode.
    Args(SpError),
    /// Mooncake's `ErrorCode`, inside the RPC's result.
    Code(i32),
}

impl From<SpError> for Fail {
    fn from(e: SpError) -> Fail {
        Fail::Args(e)
    }
}

impl MooncakeMaster {
    /// The answer frame to one request.
    fn answer(&self, service: &dyn Service, head: &RequestHeader, body: &[u8]) -> Vec<u8> {
        let seq = head.seq_num;
        let hash = body
            .first_chunk::<4>()
            .map_or(0, |h| u32::from_le_bytes(*h) & !1);
        let rpc = match handler(head.function_id) {
            Some(Handler::Served(rpc)) => rpc,
            other => {
                self.stats.unserved.fetch_add(1, Ordering::Relaxed);
                let mut unknown = self.stats.unknown.lock();
                if unknown.len() < UNKNOWN_REMEMBERED || unknown.contains_key(&head.function_id) {
                    unknown.insert(head.function_id, hash);
                }
                drop(unknown);
                let why = match other {
                    Some(Handler::Unserved(name)) => format!(
                        "rbgctl's master has no {name} (a Mooncake feature it does not have)"
                    ),
                    _ => "the rpc function not registered".to_string(),
                };
                return error_response(seq, Errc::FunctionNotRegistered, &why);
            }
        };
        let i = Rpc::ALL.iter().position(|&r| r == rpc).unwrap_or(0);
        if !body.is_empty() {
            self.stats.seen_hash[i].store(hash, Ordering::Relaxed);
        }
        let _span = tracing::debug_span!("mooncake_rpc", rpc = rpc.name(), seq).entered();
        match carry_out(service, (&self.objects, &self.mounts), rpc, body) {
            Ok(out) => {
                self.stats.ok[i].fetch_add(1, Ordering::Relaxed);
                coro_rpc::response(seq, Errc::Ok, &out)
            }
            Err(Fail::Args(e)) => {
                self.stats.bad.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(rpc = rpc.name(), error = %e, "Mooncake request did not decode");
                error_response(seq, Errc::InvalidRpcArguments, "invalid rpc arg")
            }
            Err(Fail::Code(code)) => {
                self.stats.failed[i].fetch_add(1, Ordering::Relaxed);
                tracing::debug!(rpc = rpc.name(), code, "Mooncake request answered an error");
                coro_rpc::response(seq, Errc::Ok, &error_body(rpc, code))
            }
        }
    }
}

/// `v` as the body of an answer of result type `R`.
fn body<R: Pack + 'static>(v: &R) -> Vec<u8> {
    TypeSig::cached::<R>().write(v)
}

/// Arguments of type `A` from a request body.
fn args<A: Pack + 'static>(body: &[u8]) -> Result<A, SpError> {
    TypeSig::cached::<A>().read(body)
}

type Expected<T> = Result<T, i32>;

/// Carries out one RPC; answers its result's body.
fn carry_out(
    service: &dyn Service,
    (objects, mounts): (&Objects, &Mounts),
    rpc: Rpc,
    b: &[u8],
) -> Result<Vec<u8>, Fail> {
    Ok(match rpc {
        Rpc::MountSegment => {
            let (seg, client): (Segment, Uuid) = args(b)?;
            body::<Expected<()>>(&mounts.mount(service, client_id(client), &seg)?)
        }
        Rpc::ReMountSegment => {
            let (segs, client): (Vec<Segment>, Uuid) = args(b)?;
            let mut result = Ok(());
            for seg in &segs {
                if let Err(code) = mounts.mount(service, client_id(client), seg)? {
                    result = Err(code);
                }
            }
            body::<Expected<()>>(&result)
        }
        Rpc::UnmountSegment => {
            let (segment, client): (Uuid, Uuid) = args(b)?;
            body::<Expected<()>>(&mounts.unmount(service, client_id(client), segment)?)
        }
        Rpc::GracefulUnmountSegment => {
            let (segment, client, _grace_ms): (Uuid, Uuid, u64) = args(b)?;
            body::<Expected<()>>(&mounts.unmount(service, client_id(client), segment)?)
        }
        Rpc::ServiceReady => body::<Expected<String>>(&Ok(SERVICE_VERSION.into())),
        Rpc::GetStorageConfig => {
            // No files: the answer of a Mooncake master without persistence.
            body::<Expected<GetStorageConfigResponse>>(&Ok(GetStorageConfigResponse {
                fsdir: String::new(),
                enable_disk_eviction: true,
                quota_bytes: 0,
            }))
        }
        Rpc::GetFsdir => body::<Expected<String>>(&Ok(String::new())),
        Rpc::Ping => {
            let client: Uuid = args(b)?;
            let r: PingResp = call::<rpc::Ping>(
                service,
                &PingReq {
                    client_id: client_id(client),
                },
            )?;
            let client_status = if r.need_remount {
                client_status::NEED_REMOUNT
            } else {
                client_status::OK
            };
            body::<Expected<PingResponse>>(&Ok(PingResponse {
                view_version_id: 0,
                client_status,
            }))
        }
        Rpc::FetchTasks => {
            let _: (Uuid, u64) = args(b)?;
            body::<Expected<Vec<TaskAssignment>>>(&Ok(Vec::new()))
        }
        Rpc::ExistKey => {
            let (key, tenant): (String, String) = args(b)?;
            let key = Scope::of(&tenant)?.key(key)?;
            let exists: bool = call::<rpc::Exists>(service, &KeyReq { key })?;
            body::<Expected<bool>>(&Ok(exists))
        }
        Rpc::BatchExistKey => {
            let (keys, tenant): (Vec<String>, String) = args(b)?;
            let n = keys.len();
            let exists = Scope::of(&tenant)
                .and_then(|s| s.keys(keys))
                .and_then(|keys| call::<rpc::BatchExists>(service, &BatchKeysReq { keys }));
            let items: Vec<Expected<bool>> = match exists {
                Ok(r) => r.items.into_iter().map(Ok).collect(),
                Err(f) => each_failed(n, f)?,
            };
            body(&items)
        }
        Rpc::Remove => {
            let (key, force, tenant): (String, bool, String) = args(b)?;
            let key = Scope::of(&tenant)?.key(key)?;
            let () = call::<rpc::Remove>(service, &RemoveReq { key, force })?;
            body::<Expected<()>>(&Ok(()))
        }
        Rpc::BatchRemove => {
            let (keys, force, tenant): (Vec<String>, bool, String) = args(b)?;
            let n = keys.len();
            let removed = Scope::of(&tenant)
                .and_then(|s| s.keys(keys))
                .and_then(|keys| {
                    let req = BatchRemoveReq { force, keys };
                    call::<rpc::BatchRemove>(service, &req)
                });
            let items: Vec<Expected<()>> = match removed {
                Ok(r) => r
                    .items
                    .into_iter()
                    .map(|s| match s {
                        Status::Ok => Ok(()),
                        s => Err(mooncake_code(s)),
                    })
                    .collect(),
                Err(f) => each_failed(n, f)?,
            };
            body(&items)
        }
        Rpc::PutStart | Rpc::UpsertStart => {
            let (client, key, len, config, tenant): (Uuid, String, u64, ReplicateConfig, String) =
                args(b)?;
            let key = Scope::of(&tenant)?.key(key)?;
            let upsert = rpc == Rpc::UpsertStart;
            let started = objects.put_start(
                service,
                client_id(client),
                vec![(key, len)],
                &config,
                upsert,
            )?;
            let one = started
                .into_iter()
                .next()
                .unwrap_or(Err(error_code::INTERNAL_ERROR));
            body::<Expected<Vec<ReplicaDescriptor>>>(&one)
        }
        Rpc::BatchPutStart | Rpc::BatchUpsertStart => {
            let (client, keys, lens, config, tenant): (
                Uuid,
                Vec<String>,
                Vec<u64>,
                ReplicateConfig,
                String,
            ) = args(b)?;
            let n = keys.len();
            let items: Vec<Expected<Vec<ReplicaDescriptor>>> =
                match Scope::of(&tenant).and_then(|s| s.keys(keys)) {
                    Err(f) => each_failed(n, f)?,
                    Ok(_) if lens.len() != n => not_even(n),
                    Ok(keys) => {
                        let upsert = rpc == Rpc::BatchUpsertStart;
                        let items = keys.into_iter().zip(lens).collect();
                        objects.put_start(service, client_id(client), items, &config, upsert)?
                    }
                };
            body(&items)
        }
        Rpc::PutEnd | Rpc::UpsertEnd => {
            let (client, meta, _, tenant): (Uuid, ObjectMeta, i32, String) = args(b)?;
            let key = Scope::of(&tenant)?.key(meta.key)?;
            let ended = objects.put_end(service, client_id(client), &[key]);
            body::<Expected<()>>(&ended.into_iter().next().unwrap_or(Ok(())))
        }
        Rpc::BatchPutEnd | Rpc::BatchUpsertEnd => {
            let (client, metas, tenant) = if rpc == Rpc::BatchPutEnd {
                let (client, metas, _, tenant): (Uuid, Vec<ObjectMeta>, i32, String) = args(b)?;
                (client, metas, tenant)
            } else {
                args::<(Uuid, Vec<ObjectMeta>, String)>(b)?
            };
            let keys: Vec<String> = metas.into_iter().map(|m| m.key).collect();
            let n = keys.len();
            let items = match Scope::of(&tenant).and_then(|s| s.keys(keys)) {
                Ok(keys) => objects.put_end(service, client_id(client), &keys),
                Err(f) => each_failed(n, f)?,
            };
            body(&items)
        }
        Rpc::PutRevoke | Rpc::UpsertRevoke => {
            let (client, key, _, tenant): (Uuid, String, i32, String) = args(b)?;
            let key = Scope::of(&tenant)?.key(key)?;
            let revoked = objects.put_revoke(service, client_id(client), &[key]);
            body::<Expected<()>>(&revoked.into_iter().next().unwrap_or(Ok(())))
        }
        Rpc::BatchPutRevoke | Rpc::BatchUpsertRevoke => {
            let (client, keys, tenant) = if rpc == Rpc::BatchPutRevoke {
                let (client, keys, _, tenant): (Uuid, Vec<String>, i32, String) = args(b)?;
                (client, keys, tenant)
            } else {
                args::<(Uuid, Vec<String>, String)>(b)?
            };
            let n = keys.len();
            let items = match Scope::of(&tenant).and_then(|s| s.keys(keys)) {
                Ok(keys) => objects.put_revoke(service, client_id(client), &keys),
                Err(f) => each_failed(n, f)?,
            };
            body(&items)
        }
        Rpc::GetReplicaList => {
            let (key, tenant): (String, String) = args(b)?;
            let key = Scope::of(&tenant)?.key(key)?;
            body::<Expected<GetReplicaListResponse>>(&objects.replica_list(service, key)?)
        }
        Rpc::BatchGetReplicaList => {
            let (keys, tenant): (Vec<String>, String) = args(b)?;
            let n = keys.len();
            let items = match Scope::of(&tenant).and_then(|s| s.keys(keys)) {
                Ok(keys) => objects.replica_lists(service, keys)?,
                Err(f) => each_failed(n, f)?,
            };
            body::<Vec<Expected<GetReplicaListResponse>>>(&items)
        }
        Rpc::GetReplicaListByRegex => {
            let (pattern, tenant): (String, String) = args(b)?;
            let scope = Scope::of(&tenant)?;
            body::<Expected<Map<String, Vec<ReplicaDescriptor>>>>(&Ok(
                objects.replica_lists_matching(service, pattern, scope.0)?
            ))
        }
        Rpc::RemoveByRegex => {
            let (pattern, force, tenant): (String, bool, String) = args(b)?;
            let scope = Scope::of(&tenant)?;
            body::<Expected<i64>>(&Ok(
                objects.remove_matching(service, pattern, force, scope.0)?
            ))
        }
        Rpc::RemoveAll => {
            let (force, tenant): (bool, String) = args(b)?;
            let tenant = Scope::of(&tenant)?.0.to_string();
            // A plain `long`, not an expected: Mooncake answers a failure as -1.
            let removed = call::<rpc::RemoveAll>(service, &RemoveAllReq { force, tenant })
                .map_or(-1, |r| r.removed as i64);
            body::<i64>(&removed)
        }
        _ => return Err(Fail::Code(error_code::NOT_SUPPORTED)),
    })
}

/// `n` items of a batch whose lists differ in length, each Mooncake's `INVALID_PARAMS`.
fn not_even<T>(n: usize) -> Vec<Expected<T>> {
    (0..n).map(|_| Err(error_code::INVALID_PARAMS)).collect()
}

/// A batch that failed as a whole, answered item by item with its code (arguments that did
/// not decode stay coro_rpc's error).
fn each_failed<T>(n: usize, f: Fail) -> Result<Vec<Expected<T>>, Fail> {
    match f {
        Fail::Code(code) => Ok((0..n).map(|_| Err(code)).collect()),
        args => Err(args),
    }
}

/// The body of a failed RPC that answers one result (batches answer per item in
/// `carry_out`): `code` in the RPC's own result type.
fn error_body(rpc: Rpc, code: i32) -> Vec<u8> {
    match rpc {
        Rpc::ServiceReady | Rpc::GetFsdir => body::<Expected<String>>(&Err(code)),
        Rpc::GetStorageConfig => body::<Expected<GetStorageConfigResponse>>(&Err(code)),
        Rpc::Ping => body::<Expected<PingResponse>>(&Err(code)),
        Rpc::FetchTasks => body::<Expected<Vec<TaskAssignment>>>(&Err(code)),
        Rpc::ExistKey => body::<Expected<bool>>(&Err(code)),
        Rpc::GetReplicaList => body::<Expected<GetReplicaListResponse>>(&Err(code)),
        Rpc::PutStart | Rpc::UpsertStart => body::<Expected<Vec<ReplicaDescriptor>>>(&Err(code)),
        Rpc::RemoveAll => body::<i64>(&-1),
        Rpc::RemoveByRegex => body::<Expected<i64>>(&Err(code)),
        Rpc::GetReplicaListByRegex => {
            body::<Expected<Map<String, Vec<ReplicaDescriptor>>>>(&Err(code))
        }
        // The rest answer `expected<void>` (mounts, ends, revokes, removes, task completion).
        _ => body::<Expected<()>>(&Err(code)),
    }
}

/// The rbgctl client id of a Mooncake client's UUID.
pub fn client_id(u: Uuid) -> u64 {
    (u.0 ^ u.1.rotate_left(32)).max(1)
}

/// A Mooncake request's `tenant_id`: the namespace its keys are in (`master::tenants`).
/// Whether the tenant is served is the master's to say when a put starts or a namespace is
/// listed or cleared (`TENANT_NOT_REGISTERED`); a key of a tenant it does not serve is found
/// nowhere.
struct Scope<'a>(&'a str);

impl<'a> Scope<'a> {
    fn of(tenant: &'a str) -> Result<Scope<'a>, Fail> {
        match tenants::check_name(tenant) {
            Ok(()) => Ok(Scope(tenant)),
            Err(e) => {
                tracing::debug!(error = %e, "a Mooncake request named a malformed tenant");
                Err(Fail::Code(error_code::TENANT_NOT_REGISTERED))
            }
        }
    }

    /// `key` as the master holds it; a key no client may name is `INVALID_PARAMS`.
    fn key(&self, key: String) -> Result<String, Fail> {
        if tenants::check_key(&key).is_err() {
            return Err(Fail::Code(error_code::INVALID_PARAMS));
        }
        Ok(match self.0 {
            tenants::DEFAULT_TENANT => key,
            tenant => tenants::scoped(tenant, &key).into_owned(),
        })
    }

    fn keys(&self, keys: Vec<String>) -> Result<Vec<String>, Fail> {
        keys.into_iter().map(|k| self.key(k)).collect()
    }
}

/// Mooncake's error code for an rbgctl status.
pub(super) fn mooncake_code(s: Status) -> i32 {
    match s {
        Status::Ok => 0,
        Status::ObjectNotFound => error_code::OBJECT_NOT_FOUND,
        Status::ObjectHasLease => error_code::OBJECT_HAS_LEASE,
        Status::ReplicaNotReady | Status::PutInProgress => error_code::REPLICA_IS_NOT_READY,
        Status::NoSpace => error_code::NO_AVAILABLE_HANDLE,
        Status::InvalidParams | Status::ValueTooLarge => error_code::INVALID_PARAMS,
        Status::SegmentNotFound => error_code::SEGMENT_NOT_FOUND,
        Status::SegmentExists => error_code::SEGMENT_ALREADY_EXISTS,
        Status::IllegalClient => error_code::ILLEGAL_CLIENT,
        Status::WriteSuperseded | Status::NotGranted => error_code::INVALID_WRITE,
        Status::QuotaExceeded => error_code::TENANT_QUOTA_EXCEEDED,
        Status::TenantNotRegistered => error_code::TENANT_NOT_REGISTERED,
        Status::ChecksumMismatch => error_code::CHECKSUM_MISMATCH,
        Status::NotLeader | Status::ObjectUnavailable | Status::NotDurable => {
            error_code::UNAVAILABLE_IN_CURRENT_STATUS
        }
        _ => error_code::INTERNAL_ERROR,
    }
}

/// Carries out rbgctl operation `op` through the master's service, as a request of its own
/// would be (on this thread, which may block); answers its reply or Mooncake's code for its
/// refusal.
pub(super) fn call<R: crate::transfer::rpc::Rpc>(
    service: &dyn Service,
    req: &R::Request,
) -> Result<R::Reply, Fail> {
    let op = R::OPCODE;
    let meta = req.to_meta();
    let header = Header::request(op, 1, meta.len(), 0);
    let mut out = Vec::new();
    let mut attached = None;
    let mut io = ServerIo::new(
        Sink::Buffer(&mut out),
        header,
        &mut attached,
        true,
        Instant::now(),
    );
    if let Err(e) = service.handle(op, &meta, &mut io) {
        tracing::warn!(op = op.name(), error = %e, "a Mooncake request failed in the master");
        return Err(Fail::Code(error_code::INTERNAL_ERROR));
    }
    let reply = out
        .first_chunk::<HEADER_LEN>()
        .and_then(|h| Header::decode(h).ok())
        .ok_or(Fail::Code(error_code::INTERNAL_ERROR))?;
    let mut meta = out
        .get(HEADER_LEN..HEADER_LEN + reply.meta_len as usize)
        .ok_or(Fail::Code(error_code::INTERNAL_ERROR))?;
    if reply.flags & FLAG_EPOCH != 0 {
        meta = meta
            .get(8..)
            .ok_or(Fail::Code(error_code::INTERNAL_ERROR))?;
    }
    let status = Status::from_u16(reply.status);
    if status != Status::Ok {
        return Err(Fail::Code(mooncake_code(status)));
    }
    <R::Reply as Wire>::from_meta(meta).map_err(|_| Fail::Code(error_code::INTERNAL_ERROR))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn frame(seq: u32, body: &[u8]) -> Vec<u8> {
        let head = RequestHeader {
            seq_num: seq,
            function_id: 7,
            length: body.len() as u32,
            attach_length: 0,
        };
        let mut out = head.encode().to_vec();
        out.extend_from_slice(body);
        out
    }

    fn body_of(f: Option<Frame>) -> (u32, Vec<u8>) {
        match f {
            Some(Frame::Request(head, body)) => (head.seq_num, body),
            Some(Frame::Refused(_, _, why)) => panic!("refused: {why}"),
            None => panic!("the connection ended"),
        }
    }

    #[test]
    fn requests_are_read_whole_however_they_arrive() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut stream, _) = listener.accept().unwrap();
        let large: Vec<u8> = (0..3 * READ_CHUNK + 17).map(|i| (i % 251) as u8).collect();
        let mut bytes = frame(1, b"first");
        bytes.extend(frame(2, &large));
        bytes.extend(frame(3, b"third"));
        // The first request's header comes with the protocol's first bytes (as the port
        // hands a connection over); the rest in pieces that cut headers and bodies.
        let handed = bytes[..5].to_vec();
        let sent = bytes[5..].to_vec();
        let feeder = std::thread::spawn(move || {
            for piece in sent.chunks(7_001) {
                writer.write_all(piece).unwrap();
            }
        });
        let wait = Duration::from_secs(10);
        let mut conn = Conn::new(handed, wait, wait);
        assert_eq!(
            body_of(conn.next(&mut stream).unwrap()),
            (1, b"first".to_vec())
        );
        assert_eq!(body_of(conn.next(&mut stream).unwrap()), (2, large));
        assert_eq!(
            body_of(conn.next(&mut stream).unwrap()),
            (3, b"third".to_vec())
        );
        feeder.join().unwrap();
        // The large request's room was given back, and the writer's close is a clean end.
        assert!(conn.next(&mut stream).unwrap().is_none());
        assert_eq!(conn.buf.len(), READ_CHUNK);
    }

    #[test]
    fn a_request_cut_short_is_an_error_not_an_end() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut stream, _) = listener.accept().unwrap();
        let bytes = frame(1, b"0123456789");
        writer.write_all(&bytes[..bytes.len() - 3]).unwrap();
        drop(writer);
        let wait = Duration::from_secs(10);
        let mut conn = Conn::new(Vec::new(), wait, wait);
        let e = conn.next(&mut stream).err().expect("a cut request");
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
