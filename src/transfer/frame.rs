//! The frame: a fixed 32-byte little-endian header, then `meta_len` bytes of message fields, then
//! `data_len` bytes of bulk payload. Spec: `docs/protocol.md`.

use super::TransferError;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"RBGT";
/// The protocol version a frame header carries.
pub const VERSION: u8 = 1;
/// Bytes of a frame header (`docs/protocol.md`, "Frames").
pub const HEADER_LEN: usize = 32;
/// Message fields are small; anything larger is a malformed or hostile frame.
pub const MAX_META_LEN: u32 = 16 << 20;
/// Most message bytes a connection may send in one frame before it proves the cluster secret
/// (the handshake's own messages take a few dozen).
pub const MAX_UNPROVEN_META_LEN: u32 = 4096;
/// Header flag: the frame answers a request (the same id).
pub const FLAG_RESPONSE: u16 = 1;
/// On a response: the meta starts with the answering master's leadership epoch (8 bytes,
/// little-endian), set by elected masters (HA); the rest of the meta follows it.
pub const FLAG_EPOCH: u16 = 2;

/// Operation codes. Master operations are 0x01–0x3f, store operations 0x40–0x4f.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Ping = 0x01,
    MountSegment = 0x02,
    UnmountSegment = 0x03,
    ListSegments = 0x04,
    ReportObjects = 0x05,
    /// A client leaving cleanly (meta: `PingReq`; empty reply).
    Leave = 0x06,
    /// From a store: may this segment serve `READ_VERSION` (meta: `LeaseReq`; answer
    /// `LeaseResp`)? The store counts the lease from when it sent the request.
    Lease = 0x07,
    /// The first request on a connection to a server that holds the cluster secret (meta:
    /// `AuthHelloReq`, the client's nonce; answer `AuthChallengeResp`: the server's nonce and
    /// its proof, empty when the server has no secret). See `crate::auth`.
    AuthHello = 0x08,
    /// The client's proof over both nonces (meta: `AuthProofReq`; empty reply, or
    /// `UNAUTHENTICATED` and the connection closes).
    AuthProof = 0x09,
    /// From a store about to go for good: hand its segment's objects over to the other stores
    /// (meta: `HandOverReq`; answer `HandOverResp`, where the hand-over stands). Asked again
    /// to follow it; the master starts it once.
    HandOver = 0x0a,
    PutStart = 0x10,
    PutEnd = 0x11,
    PutRevoke = 0x12,
    GetReplicas = 0x13,
    Exists = 0x14,
    Remove = 0x15,
    RemoveAll = 0x16,
    ReportCorrupt = 0x17,
    /// Readable keys that a regular expression matches anywhere in them (meta: `ListKeysReq`;
    /// answer `ListKeysResp`, at most `limit` keys, sorted, and whether more match).
    ListKeys = 0x18,
    BatchPutStart = 0x20,
    BatchPutEnd = 0x21,
    BatchPutRevoke = 0x22,
    BatchGetReplicas = 0x23,
    BatchExists = 0x24,
    BatchRemove = 0x25,
    /// Ends a batch of puts, as `BatchPutEnd`, and reserves space for the next ones (meta:
    /// `BatchPutCommitReq`; answer `BatchPutCommitResp`): a put into a reservation needs no
    /// `BatchPutStart`, so it costs one master round trip instead of two.
    BatchPutCommit = 0x26,
    /// From a store: objects it recorded unhashed at a `SEAL_DEFERRED` now have their
    /// CRC-32C (meta: `HashedReq`; empty reply). The master gives each to the version it
    /// names if that is still current, unhashed and has a replica there.
    ObjectsHashed = 0x27,
    Write = 0x40,
    Read = 0x41,
    StoreInfo = 0x42,
    Seal = 0x43,
    Forget = 0x44,
    /// A write whose payload ends with the value's CRC-32C (4 bytes, little-endian), computed
    /// by the writer as it sent: the store checks it as it receives (meta: `WriteReq`, whose
    /// `checksum` is unused).
    WriteChecked = 0x45,
    /// A read that names the object version it expects (meta: `ReadVersionReq`): the store
    /// answers the bytes only while its records hold that version at that offset and the
    /// master's read lease on it runs; else `OBJECT_NOT_FOUND` (or `OBJECT_UNAVAILABLE`).
    ReadVersion = 0x46,
    /// From the master: forget records (meta: `ForgetLeaseReq`; empty reply). Its `lease_ms`
    /// is ignored: stores ask for their read lease with `LEASE`.
    ForgetLease = 0x47,
    /// From the master, to a store with a disk tier: copy objects between its memory segment
    /// and its disk segment, each checked against its checksum and recorded where it lands
    /// (meta: `MoveReq`; answer `BatchStatusResp`). Sent to the disk segment's endpoint.
    Move = 0x48,
    /// Connects an RDMA queue pair to this connection's store (meta: `RdmaConnectReq`; answer
    /// `RdmaConnectResp`: the store's pair and its segment's address and key). The pair lives
    /// as long as the connection.
    RdmaConnect = 0x49,
    /// As `SEAL`, for bytes a client wrote with RDMA: the store checks each object's CRC-32C
    /// over what its segment holds before it records it (answer `BatchStatusResp`; a mismatch
    /// is `CHECKSUM_MISMATCH` for that item, not recorded).
    SealChecked = 0x4a,
    /// Whether the store would answer `READ_VERSION` for this range now (meta:
    /// `ReadVersionReq`; answer `CheckVersionResp`, how long its read lease still runs, or the
    /// same refusal): the check beside a one-sided read.
    CheckVersion = 0x4b,
    /// As `SEAL`, for bytes a Mooncake client wrote through the Transfer Engine (sent by the
    /// master at Mooncake's `PutEnd`, with the put's grants): the store records each object at
    /// once, with its CRC-32C when the transport hashed it on the way in, else unhashed, and
    /// hashes the rest after it answered (`SealDeferredResp`; their checksums reach the master
    /// with `OBJECTS_HASHED`).
    SealDeferred = 0x4c,
}

impl Opcode {
    pub const ALL: [Opcode; 40] = [
        Opcode::Ping,
        Opcode::MountSegment,
        Opcode::UnmountSegment,
        Opcode::ListSegments,
        Opcode::ReportObjects,
        Opcode::Leave,
        Opcode::Lease,
        Opcode::AuthHello,
        Opcode::AuthProof,
        Opcode::HandOver,
        Opcode::PutStart,
        Opcode::PutEnd,
        Opcode::PutRevoke,
        Opcode::GetReplicas,
        Opcode::Exists,
        Opcode::Remove,
        Opcode::RemoveAll,
        Opcode::ReportCorrupt,
        Opcode::ListKeys,
        Opcode::BatchPutStart,
        Opcode::BatchPutEnd,
        Opcode::BatchPutRevoke,
        Opcode::BatchGetReplicas,
        Opcode::BatchExists,
        Opcode::BatchRemove,
        Opcode::BatchPutCommit,
        Opcode::ObjectsHashed,
        Opcode::Write,
        Opcode::Read,
        Opcode::StoreInfo,
        Opcode::Seal,
        Opcode::Forget,
        Opcode::WriteChecked,
        Opcode::ReadVersion,
        Opcode::ForgetLease,
        Opcode::Move,
        Opcode::RdmaConnect,
        Opcode::SealChecked,
        Opcode::CheckVersion,
        Opcode::SealDeferred,
    ];

    /// The opcode a header's first byte names, or `None` for one this build does not know.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Opcode::ALL.iter().copied().find(|op| *op as u8 == v)
    }

    /// Snake-case name used in metrics labels and logs.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Ping => "ping",
            Opcode::MountSegment => "mount_segment",
            Opcode::UnmountSegment => "unmount_segment",
            Opcode::ListSegments => "list_segments",
            Opcode::ReportObjects => "report_objects",
            Opcode::Leave => "leave",
            Opcode::Lease => "lease",
            Opcode::AuthHello => "auth_hello",
            Opcode::AuthProof => "auth_proof",
            Opcode::HandOver => "hand_over",
            Opcode::PutStart => "put_start",
            Opcode::PutEnd => "put_end",
            Opcode::PutRevoke => "put_revoke",
            Opcode::GetReplicas => "get_replicas",
            Opcode::Exists => "exists",
            Opcode::Remove => "remove",
            Opcode::RemoveAll => "remove_all",
            Opcode::ReportCorrupt => "report_corrupt",
            Opcode::ListKeys => "list_keys",
            Opcode::BatchPutStart => "batch_put_start",
            Opcode::BatchPutEnd => "batch_put_end",
            Opcode::BatchPutRevoke => "batch_put_revoke",
            Opcode::BatchGetReplicas => "batch_get_replicas",
            Opcode::BatchExists => "batch_exists",
            Opcode::BatchRemove => "batch_remove",
            Opcode::BatchPutCommit => "batch_put_commit",
            Opcode::ObjectsHashed => "objects_hashed",
            Opcode::Write => "write",
            Opcode::Read => "read",
            Opcode::StoreInfo => "store_info",
            Opcode::Seal => "seal",
            Opcode::Forget => "forget",
            Opcode::WriteChecked => "write_checked",
            Opcode::ReadVersion => "read_version",
            Opcode::ForgetLease => "forget_lease",
            Opcode::Move => "move",
            Opcode::RdmaConnect => "rdma_connect",
            Opcode::SealChecked => "seal_checked",
            Opcode::CheckVersion => "check_version",
            Opcode::SealDeferred => "seal_deferred",
        }
    }
}

/// Result codes carried in a response header (and per item in batch responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    Internal = 1,
    InvalidParams = 2,
    UnknownOpcode = 3,
    MalformedFrame = 4,
    ObjectNotFound = 10,
    PutInProgress = 11,
    ObjectHasLease = 12,
    ReplicaNotReady = 13,
    NoSpace = 14,
    ValueTooLarge = 15,
    SegmentNotFound = 16,
    IllegalClient = 17,
    OutOfBounds = 18,
    SegmentExists = 19,
    WriteSuperseded = 20,
    ObjectUnavailable = 21,
    NotLeader = 22,
    /// Bytes did not match their object's checksum (a store moving an object between tiers).
    ChecksumMismatch = 23,
    /// Done at the master, but a store holding the replaced or removed value could not be told
    /// in time: the old value may come back if the master restarts before that store does.
    NotDurable = 24,
    /// The connection has not proven it holds the cluster secret (`crate::auth`).
    Unauthenticated = 25,
    /// The server refused the connection at a connection limit; sent once, unasked, with
    /// request id [`REFUSAL_ID`], before it closes.
    ConnectionRefused = 26,
    /// A write or seal without the master's grant for exactly its range and version, or an
    /// order to a store that is not its master's (`transfer::grant`).
    NotGranted = 27,
    /// A put would take its tenant past its quota in bytes (`master::tenants`).
    QuotaExceeded = 28,
    /// A key names a tenant the master's tenants file does not name.
    TenantNotRegistered = 29,
}

/// The request id of a server's answer to no request: its refusal of the connection.
pub const REFUSAL_ID: u64 = u64::MAX;

impl Status {
    /// The status a reply carries; a code this build does not know reads as `Internal`.
    pub fn from_u16(v: u16) -> Status {
        match v {
            0 => Status::Ok,
            2 => Status::InvalidParams,
            3 => Status::UnknownOpcode,
            4 => Status::MalformedFrame,
            10 => Status::ObjectNotFound,
            11 => Status::PutInProgress,
            12 => Status::ObjectHasLease,
            13 => Status::ReplicaNotReady,
            14 => Status::NoSpace,
            15 => Status::ValueTooLarge,
            16 => Status::SegmentNotFound,
            17 => Status::IllegalClient,
            18 => Status::OutOfBounds,
            19 => Status::SegmentExists,
            20 => Status::WriteSuperseded,
            21 => Status::ObjectUnavailable,
            22 => Status::NotLeader,
            23 => Status::ChecksumMismatch,
            24 => Status::NotDurable,
            25 => Status::Unauthenticated,
            26 => Status::ConnectionRefused,
            27 => Status::NotGranted,
            28 => Status::QuotaExceeded,
            29 => Status::TenantNotRegistered,
            _ => Status::Internal,
        }
    }

    /// The status as docs/protocol.md and the logs spell it (`OBJECT_NOT_FOUND`).
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Internal => "INTERNAL",
            Status::InvalidParams => "INVALID_PARAMS",
            Status::UnknownOpcode => "UNKNOWN_OPCODE",
            Status::MalformedFrame => "MALFORMED_FRAME",
            Status::ObjectNotFound => "OBJECT_NOT_FOUND",
            Status::PutInProgress => "PUT_IN_PROGRESS",
            Status::ObjectHasLease => "OBJECT_HAS_LEASE",
            Status::ReplicaNotReady => "REPLICA_NOT_READY",
            Status::NoSpace => "NO_SPACE",
            Status::ValueTooLarge => "VALUE_TOO_LARGE",
            Status::SegmentNotFound => "SEGMENT_NOT_FOUND",
            Status::IllegalClient => "ILLEGAL_CLIENT",
            Status::OutOfBounds => "OUT_OF_BOUNDS",
            Status::SegmentExists => "SEGMENT_EXISTS",
            Status::WriteSuperseded => "WRITE_SUPERSEDED",
            Status::ObjectUnavailable => "OBJECT_UNAVAILABLE",
            Status::NotLeader => "NOT_LEADER",
            Status::ChecksumMismatch => "CHECKSUM_MISMATCH",
            Status::NotDurable => "NOT_DURABLE",
            Status::Unauthenticated => "UNAUTHENTICATED",
            Status::ConnectionRefused => "CONNECTION_REFUSED",
            Status::NotGranted => "NOT_GRANTED",
            Status::QuotaExceeded => "TENANT_QUOTA_EXCEEDED",
            Status::TenantNotRegistered => "TENANT_NOT_REGISTERED",
        }
    }
}

impl Status {
    /// A sentence for people, used where only the status travels (batch items).
    pub fn describe(self) -> &'static str {
        match self {
            Status::Ok => "success",
            Status::Internal => "internal error",
            Status::InvalidParams => "invalid parameters (empty key or value)",
            Status::UnknownOpcode => "operation not supported by this server",
            Status::MalformedFrame => "malformed frame",
            Status::ObjectNotFound => "object not found",
            Status::PutInProgress => "another put of this key is in progress",
            Status::ObjectHasLease => "object has a read lease; remove with force",
            Status::ReplicaNotReady => "object is still being written",
            Status::NoSpace => "no segment has room, even after eviction",
            Status::ValueTooLarge => "value is larger than the largest segment",
            Status::SegmentNotFound => "segment not mounted",
            Status::IllegalClient => "operation belongs to another client",
            Status::OutOfBounds => "range outside the segment",
            Status::SegmentExists => "segment already mounted",
            Status::WriteSuperseded => "put was reclaimed or replaced",
            Status::ObjectUnavailable => {
                "every replica is on a store that is restarting; retry shortly"
            }
            Status::NotLeader => "this master is not the leader; ask the leader",
            Status::ChecksumMismatch => "the bytes fail their checksum",
            Status::NotDurable => "done, but a store holding the old value could not be told yet",
            Status::Unauthenticated => "this connection has not proven it holds the cluster secret",
            Status::ConnectionRefused => "the server refused the connection at a connection limit",
            Status::NotGranted => "the master granted no such write (range, size and version)",
            Status::QuotaExceeded => "the put would take its tenant past its quota",
            Status::TenantNotRegistered => "the master's tenants file does not name this tenant",
        }
    }
}

/// A status is its number on the wire and in test vectors.
impl serde::Serialize for Status {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u16(*self as u16)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: u8,
    pub flags: u16,
    pub request_id: u64,
    pub status: u16,
    pub meta_len: u32,
    pub data_len: u64,
}

impl Header {
    /// The header of a request of `op` carrying `meta_len` bytes of meta and `data_len` of
    /// payload.
    pub fn request(op: Opcode, request_id: u64, meta_len: usize, data_len: u64) -> Header {
        Header {
            opcode: op as u8,
            flags: 0,
            request_id,
            status: 0,
            meta_len: meta_len as u32,
            data_len,
        }
    }

    /// The header of the answer to `req`: its opcode and request id, with `status`.
    pub fn response(req: &Header, status: Status, meta_len: usize, data_len: u64) -> Header {
        Header {
            opcode: req.opcode,
            flags: FLAG_RESPONSE,
            request_id: req.request_id,
            status: status as u16,
            meta_len: meta_len as u32,
            data_len,
        }
    }

    /// Whether this header is an answer's (`FLAG_RESPONSE`).
    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    /// The header's bytes on the wire (magic, version, fields little-endian).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.opcode;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..18].copy_from_slice(&self.status.to_le_bytes());
        // bytes 18..20 reserved, zero
        b[20..24].copy_from_slice(&self.meta_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.data_len.to_le_bytes());
        b
    }

    /// Decodes and validates magic, version, reserved bytes and the meta length limit.
    ///
    /// Read as four little-endian words (the layout above): a well-formed header costs a few
    /// compares; what is wrong with a bad one is worked out on the cold path.
    #[inline]
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, TransferError> {
        let word = |i: usize| u64::from_le_bytes(*b[i..].first_chunk::<8>().expect("32 bytes"));
        let (w0, w2) = (word(0), word(16));
        // Magic and version: the low five bytes of the first word.
        const PREFIX: u64 = u32::from_le_bytes(MAGIC) as u64 | (VERSION as u64) << 32;
        let meta_len = (w2 >> 32) as u32;
        // Reserved bytes 18..20: bits 16..32 of the third word.
        if w0 & 0xff_ffff_ffff != PREFIX || w2 & 0xffff_0000 != 0 || meta_len > MAX_META_LEN {
            return Err(Header::decode_error(b));
        }
        Ok(Header {
            opcode: (w0 >> 40) as u8,
            flags: (w0 >> 48) as u16,
            request_id: word(8),
            status: w2 as u16,
            meta_len,
            data_len: word(24),
        })
    }

    /// What is wrong with a header `decode` refused.
    #[cold]
    fn decode_error(b: &[u8; HEADER_LEN]) -> TransferError {
        let why = if b[0..4] != MAGIC {
            format!("bad magic {:02x?} (expected \"RBGT\")", &b[0..4])
        } else if b[4] != VERSION {
            format!(
                "unsupported protocol version {} (this side speaks {VERSION})",
                b[4]
            )
        } else if b[18] != 0 || b[19] != 0 {
            "reserved header bytes not zero".into()
        } else {
            let meta_len = u32::from_le_bytes(b[20..24].try_into().expect("4 bytes"));
            format!("meta length {meta_len} exceeds the limit of {MAX_META_LEN}")
        };
        TransferError::Protocol(why)
    }
}

/// Another protocol's first bytes on rbgctl's RPC port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// Mooncake's RPC (yalantinglibs' coro_rpc: its request header begins with magic 21).
    MooncakeRpc,
    Http,
    Tls,
}

impl Foreign {
    /// What it looks like and what to do, for the log line and (HTTP) the answer.
    pub fn advice(self) -> &'static str {
        match self {
            Foreign::MooncakeRpc => {
                "this looks like Mooncake's RPC (coro_rpc), which this port does not serve: \
                 rbgctl's master serves it only when the pool has no cluster secret (it \
                 carries no authentication), and stores speak rbgctl's own protocol (the \
                 rbgctl client, its Python package, SGLang's `rbgctl` HiCache backend)"
            }
            Foreign::Http => {
                "this looks like HTTP: this port speaks rbgctl's RPC; the HTTP API (metrics, \
                 admin, Mooncake's metadata server) is on the role's HTTP ports"
            }
            Foreign::Tls => {
                "this looks like a TLS handshake: this port is rbgctl's RPC in the clear \
                 (HTTPS is on the HTTP ports with --tls-cert-path); protect it with a private \
                 network and the cluster secret"
            }
        }
    }
}

/// Which known protocol the first bytes a connection sent (`first`, however few) are; `None`
/// while they could still begin an rbgctl frame, or are no protocol known (then they are a
/// bad frame like any other).
pub fn foreign_protocol(first: &[u8]) -> Option<Foreign> {
    let n = first.len().min(MAGIC.len());
    if first[..n] == MAGIC[..n] {
        return None;
    }
    const HTTP: [&[u8]; 9] = [
        b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"PRI ", b"CONN",
    ];
    let http = HTTP
        .iter()
        .any(|m| m.starts_with(&first[..first.len().min(4)]));
    match first {
        [21, ..] => Some(Foreign::MooncakeRpc),
        [0x16, 0x03, ..] | [0x16] => Some(Foreign::Tls),
        _ if http => Some(Foreign::Http),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_protocols_first_bytes_are_told_apart_from_a_frames() {
        assert_eq!(foreign_protocol(b""), None);
        assert_eq!(foreign_protocol(b"RB"), None);
        assert_eq!(
            foreign_protocol(&Header::request(Opcode::Ping, 1, 0, 0).encode()),
            None
        );
        // coro_rpc's request header: magic 21, then version, serialize type, msg type...
        assert_eq!(foreign_protocol(&[21, 0, 0, 0]), Some(Foreign::MooncakeRpc));
        assert_eq!(foreign_protocol(b"GET / HTTP/1.1\r\n"), Some(Foreign::Http));
        assert_eq!(foreign_protocol(b"PO"), Some(Foreign::Http));
        assert_eq!(foreign_protocol(&[0x16, 0x03, 0x01]), Some(Foreign::Tls));
        assert_eq!(
            foreign_protocol(b"RBGX"),
            None,
            "a bad frame, answered as one"
        );
        assert_eq!(foreign_protocol(&[0]), None);
    }

    #[test]
    fn header_round_trips() {
        let h = Header::request(Opcode::PutStart, 42, 17, 1 << 33);
        let back = Header::decode(&h.encode()).unwrap();
        assert_eq!(h, back);
        assert!(!back.is_response());
        let r = Header::response(&h, Status::NoSpace, 3, 0);
        let back = Header::decode(&r.encode()).unwrap();
        assert!(back.is_response());
        assert_eq!(Status::from_u16(back.status), Status::NoSpace);
        assert_eq!(back.request_id, 42);
    }

    #[test]
    fn malformed_headers_are_rejected_with_a_reason() {
        let ping = || Header::request(Opcode::Ping, 1, 0, 0).encode();
        let too_long = Header::request(Opcode::Ping, 1, (MAX_META_LEN + 1) as usize, 0).encode();
        let spoilt = |i: usize, byte: u8| {
            let mut b = ping();
            b[i] = byte;
            b
        };
        for (b, reason) in [
            (spoilt(0, b'X'), "magic"),
            (spoilt(4, 9), "version"),
            (too_long, "meta length"),
            (spoilt(19, 1), "reserved"),
        ] {
            let e = Header::decode(&b).unwrap_err().to_string();
            assert!(e.contains(reason), "{reason}: {e}");
        }
    }

    #[test]
    fn every_field_decodes_from_its_own_bytes() {
        let h = Header {
            opcode: 0xa5,
            flags: 0xbeef,
            request_id: 0x0102_0304_0506_0708,
            status: 0x1234,
            meta_len: MAX_META_LEN,
            data_len: u64::MAX - 1,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn every_opcode_decodes_to_itself() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(op as u8), Some(op));
        }
        assert_eq!(Opcode::from_u8(0xee), None);
    }
}
