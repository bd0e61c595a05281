//! Message bodies (the meta section of a frame), one struct per request and response, each with
//! its encoding. Field order here is the wire order documented in `docs/protocol.md`.

use super::codec::{Decoder, Encoder};
use super::frame::Status;
use super::grant::Grant;
use super::TransferError;

/// Encoding of a message body.
pub trait Wire: Sized {
    fn encode(&self, e: &mut Encoder);
    fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError>;

    fn to_meta(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        self.encode(&mut e);
        e.buf
    }

    /// Decodes a whole meta section; trailing bytes are an error.
    fn from_meta(meta: &[u8]) -> Result<Self, TransferError> {
        let mut d = Decoder::new(meta);
        let v = Self::decode(&mut d)?;
        d.finish()?;
        Ok(v)
    }
}

impl Wire for () {
    fn encode(&self, _: &mut Encoder) {}
    fn decode(_: &mut Decoder<'_>) -> Result<Self, TransferError> {
        Ok(())
    }
}

impl Wire for String {
    fn encode(&self, e: &mut Encoder) {
        e.str(self);
    }
    fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
        d.string()
    }
}

impl Wire for Status {
    fn encode(&self, e: &mut Encoder) {
        e.u16(*self as u16);
    }
    fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
        Ok(Status::from_u16(d.u16()?))
    }
}

/// Smallest encoded size of a list item of each kind, for the decoder's count check.
pub trait MinLen {
    const MIN_LEN: usize;
}
impl MinLen for String {
    const MIN_LEN: usize = 2;
}
impl MinLen for Status {
    const MIN_LEN: usize = 2;
}

/// Numbers and flags go as the codec writes them, each in its fixed size.
macro_rules! wire_primitive {
    ($($t:ident: $len:literal),*) => {$(
        impl Wire for $t {
            fn encode(&self, e: &mut Encoder) {
                e.$t(*self);
            }
            fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
                d.$t()
            }
        }
        impl MinLen for $t {
            const MIN_LEN: usize = $len;
        }
    )*};
}
wire_primitive!(u8: 1, u32: 4, u64: 8, bool: 1);

impl<T: Wire + MinLen> Wire for Vec<T> {
    fn encode(&self, e: &mut Encoder) {
        e.count(self.len());
        for item in self {
            item.encode(e);
        }
    }
    fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
        let n = d.count(T::MIN_LEN)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(T::decode(d)?);
        }
        Ok(v)
    }
}

/// A per-item result in a batch response: the status, then the item only when it is OK.
impl<T: Wire> Wire for Result<T, Status> {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Ok(v) => {
                e.u16(Status::Ok as u16);
                v.encode(e);
            }
            Err(s) => {
                e.u16(*s as u16);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
        match Status::from_u16(d.u16()?) {
            Status::Ok => Ok(Ok(T::decode(d)?)),
            s => Ok(Err(s)),
        }
    }
}
impl<T: Wire> MinLen for Result<T, Status> {
    const MIN_LEN: usize = 2;
}

/// Declares a message struct and its wire encoding from a list of typed fields.
macro_rules! message {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? } min_len = $min:expr) => {
        $(#[$m])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }
        impl Wire for $name {
            #[allow(unused_variables)]
            fn encode(&self, e: &mut Encoder) { $( Wire::encode(&self.$field, e); )* }
            #[allow(unused_variables)]
            fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
                Ok($name { $( $field: <$ty as Wire>::decode(d)? ),* })
            }
        }
        impl MinLen for $name { const MIN_LEN: usize = $min; }
    };
}

/// Makes a fieldless enum travel as one byte, its variant's number (test vectors write it as
/// that number too): `Wire` and `Serialize` from one list of the variants, each with its number
/// and its name in the refusal of a number not known.
macro_rules! byte_enum {
    ($name:ident, $what:literal, { $($variant:ident = $n:literal $label:literal),+ $(,)? }) => {
        // Each variant is sent as the number listed.
        const _: () = { $(assert!($name::$variant as u8 == $n);)+ };
        impl Wire for $name {
            fn encode(&self, e: &mut Encoder) {
                e.u8(*self as u8);
            }
            fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
                match d.u8()? {
                    $($n => Ok($name::$variant),)+
                    other => {
                        let known = [$(concat!(stringify!($n), " ", $label)),+].join(", ");
                        Err(TransferError::Protocol(format!(
                            "unknown {} {other} ({known})",
                            $what
                        )))
                    }
                }
            }
        }
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_u8(*self as u8)
            }
        }
    };
}

/// The data paths a putter writes by, and so the segments its replicas may be placed on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reach {
    /// rbgctl's own (TCP, shared memory, RDMA): segments of rbgctl stores.
    Rbgctl,
    /// Mooncake's Transfer Engine: rbgctl stores that serve it, and segments Mooncake's own
    /// processes mounted.
    MooncakeTe,
    /// Both: rbgctl's clients, whose Transfer Engine path reaches the segments Mooncake's
    /// processes mounted.
    #[default]
    Any,
}

byte_enum!(Reach, "reach", {
    Rbgctl = 0 "rbgctl",
    MooncakeTe = 1 "Mooncake's Transfer Engine",
    Any = 2 "both",
});

/// Where a segment keeps its bytes. New puts go to memory segments only; a disk segment holds
/// what memory gave up (the disk tier).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Tier {
    #[default]
    Memory,
    Disk,
}

impl Tier {
    /// The tier as metrics and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Disk => "disk",
        }
    }
}

byte_enum!(Tier, "segment tier", { Memory = 0 "memory", Disk = 1 "disk" });

message!(
    /// What a store tells the master about the memory (or disk) it contributes.
    SegmentInfo {
        /// Unique name, `host:port` by convention (Mooncake's segment naming).
        name: String,
        /// Where the store serves reads and writes.
        endpoint: String,
        size: u64,
        /// The backing file, for same-host clients; empty when not shareable.
        shm_path: String,
        /// Random token written beside the backing file, proving a client opened the right one.
        shm_token: u64,
        /// Kernel boot id of the store's host: equal boot ids mean the same kernel, hence shared
        /// `/dev/shm` is possible.
        host_id: String,
        /// Random id of the segment's incarnation: of its backing file for a persistent store,
        /// of the store's process otherwise. A store mounting again with the same id still holds
        /// what it held (after a master restart or failover, or an expiry it outlived) and
        /// reports it; 0 from a store that reports nothing.
        segment_uuid: u64,
        /// Memory or disk.
        tier: Tier,
        /// Whether the store keeps its objects across its own restarts (a durable index).
        persistent: bool,
        /// Mooncake's name for the segment, `host:handshake_port`, when its store serves
        /// Mooncake's Transfer Engine into it (empty otherwise): the transport endpoint of its
        /// replicas in the answers to Mooncake's clients.
        te_endpoint: String,
        /// The Transfer Engine's data port, on `te_endpoint`'s host.
        te_data_port: u32,
        /// The segment's first address in the Transfer Engine's addresses (a replica at
        /// `offset` is at `te_base + offset`).
        te_base: u64,
    } min_len = 2 + 2 + 8 + 2 + 8 + 2 + 8 + 1 + 1 + 2 + 4 + 8
);

impl SegmentInfo {
    /// Whether an rbgctl store serves the segment (and takes the master's orders); a segment
    /// a Mooncake process mounted has none, only its Transfer Engine endpoint.
    pub fn has_store(&self) -> bool {
        !self.endpoint.is_empty()
    }
}

message!(
    /// A mounted segment as the master lists it.
    SegmentEntry { id: u64, info: SegmentInfo, used: u64 } min_len = 8 + 48 + 8
);
message!(
    /// One replica: a byte range in a segment.
    ReplicaLoc { segment_id: u64, offset: u64 } min_len = 16
);

message!(
    /// How a put is placed (Mooncake's `ReplicateConfig`).
    ReplicateConfig {
        /// Copies on distinct segments (best effort when fewer segments have room; 0 means 1).
        replica_num: u8,
        /// Keep the object out of eviction while anything else can go, until the pin expires.
        soft_pin: bool,
        /// 0 = the master's default soft-pin TTL.
        soft_pin_ttl_ms: u64,
        /// Segment name to try first; empty = placement strategy only.
        preferred_segment: String,
        /// Which data paths the putter writes by: the segments its replicas may go to.
        reach: Reach,
    } min_len = 1 + 1 + 8 + 2 + 1
);

message!(PingReq { client_id: u64 } min_len = 8);
message!(
    /// A client's fresh nonce (`AUTH_HELLO`).
    AuthHelloReq { nonce: Vec<u8> } min_len = 4
);
message!(
    /// A server's fresh nonce and its proof over both nonces; `proof` is empty when the
    /// server holds no secret.
    AuthChallengeResp { nonce: Vec<u8>, proof: Vec<u8> } min_len = 8
);
message!(
    /// A client's proof over both nonces (`AUTH_PROOF`).
    AuthProofReq { proof: Vec<u8> } min_len = 4
);
message!(
    /// Master (from a store): a read lease for the store's segment `segment_id`.
    LeaseReq { client_id: u64, segment_id: u64 } min_len = 16
);
message!(
    /// How long the segment may serve `READ_VERSION`, counted from when the store sent the
    /// request; 0 = not now (the segment is not live, or is owed forgets it has not taken).
    LeaseResp { lease_ms: u64 } min_len = 8
);
message!(
    /// `need_remount` is true when the master does not know this client (it restarted or the
    /// client expired): the client must mount its segments again.
    PingResp { need_remount: bool } min_len = 1
);
message!(
    /// `recovering`: the segment holds objects from before a restart, which the store reports
    /// with `ReportObjects` before the segment takes new allocations. `grant_key`: the key the
    /// store checks grants and orders with (`transfer::grant`), never shown to anyone else.
    MountReq { client_id: u64, segment: SegmentInfo, recovering: bool, grant_key: Vec<u8> } min_len = 8 + 48 + 1 + 4
);
message!(
    /// `discard`: the master gave this segment's objects up (the store was away longer than the
    /// grace period); the store must forget them and report none. `write_floor`: every version
    /// this master issues is at least this; a write of a lower version belongs to a put that an
    /// earlier master (restarted, or deposed) started, which no master will commit, and the
    /// store refuses it (its space may already hold a newer object).
    MountResp { segment_id: u64, discard: bool, write_floor: u64 } min_len = 17
);
message!(
    /// `keep`: the store is restarting and keeps its objects; the master holds them, unreadable,
    /// for the grace period instead of dropping them.
    UnmountReq { client_id: u64, segment_id: u64, keep: bool } min_len = 17
);
message!(
    /// An object a store holds, from its durable index.
    StoredObject { key: String, version: u64, offset: u64, size: u64, checksum: u32 } min_len = 2 + 8 + 8 + 8 + 4
);
message!(
    /// A record a store should drop: the object at `offset` with this version is gone.
    ForgetItem { offset: u64, version: u64 } min_len = 16
);
message!(
    /// Part of a recovering store's report; `done` on the last part.
    ReportReq { client_id: u64, segment_id: u64, objects: Vec<StoredObject>, done: bool } min_len = 8 + 8 + 4 + 1
);
message!(
    /// A store hands its segment over, taking at most `deadline_ms` (asked again, the same).
    HandOverReq { client_id: u64, segment_id: u64, deadline_ms: u64 } min_len = 24
);
message!(
    /// Where a hand-over stands: `state` 0 draining, 1 done, 2 expired (what was not handed
    /// over stays where it is); the objects listed on the segment when it started, those moved
    /// and their bytes, the copies that failed and the objects no other segment had room for.
    HandOverResp {
        state: u8,
        objects: u64,
        moved_objects: u64,
        moved_bytes: u64,
        failed: u64,
        no_room: u64,
    } min_len = 1 + 8 * 5
);
message!(
    /// A store's objects that were recorded unhashed and now have their CRC-32C.
    HashedReq { client_id: u64, segment_id: u64, objects: Vec<StoredObject> } min_len = 8 + 8 + 4
);
message!(
    /// The reported records the master did not take (stale, removed or invalid).
    ReportResp { forget: Vec<ForgetItem> } min_len = 4
);
message!(
    /// A reader found a replica whose bytes fail the checksum.
    ReportCorruptReq { key: String, version: u64, segment_id: u64 } min_len = 2 + 8 + 8
);
message!(ListSegmentsResp { segments: Vec<SegmentEntry> } min_len = 4);
message!(
    /// `LIST_KEYS`: `tenant`'s readable keys that `pattern` (a regular expression, Rust's
    /// `regex` syntax) matches anywhere in them, at most `limit` of them, as the tenant names
    /// them (`master::tenants`; `default` for a client that names none).
    ListKeysReq { pattern: String, limit: u32, tenant: String } min_len = 2 + 4 + 2
);
message!(
    /// The keys `LIST_KEYS` found, sorted; `truncated` when more matched than `limit`.
    ListKeysResp { keys: Vec<String>, truncated: bool } min_len = 4 + 1
);

message!(PutStartReq { client_id: u64, key: String, size: u64, config: ReplicateConfig } min_len = 8 + 2 + 8 + 12);
message!(
    /// Where a put goes, and for each replica the master's grant to write it there.
    PutStartResp { object_id: u64, replicas: Vec<ReplicaLoc>, grants: Vec<Grant> } min_len = 16
);
message!(
    /// Ends a put: its value's CRC-32C, or `unhashed` when nothing took one (Mooncake's client
    /// wrote the value onto a segment a Mooncake process mounted, which no store hashes).
    PutEndReq { client_id: u64, key: String, object_id: u64, checksum: u32, unhashed: bool } min_len = 8 + 2 + 8 + 4 + 1
);
message!(PutRevokeReq { client_id: u64, key: String, object_id: u64 } min_len = 8 + 2 + 8);
message!(KeyReq { key: String } min_len = 2);

impl KeyReq {
    /// The key of a `KeyReq` meta, borrowed from it rather than copied: for a lookup, which
    /// keeps nothing.
    pub fn key_of(meta: &[u8]) -> Result<&str, TransferError> {
        let mut d = Decoder::new(meta);
        let key = d.str()?;
        d.finish()?;
        Ok(key)
    }
}
message!(
    /// Where a readable object is and how to check it.
    ObjectDesc {
        size: u64,
        /// CRC-32C of the value, written by the putter, checked by the reader.
        checksum: u32,
        /// The read lease granted with this answer: the replicas will not be freed before it ends.
        lease_ttl_ms: u64,
        /// The object's version (its put's object id).
        version: u64,
        replicas: Vec<ReplicaLoc>,
        /// No CRC-32C was taken of the value (`PutEndReq::unhashed`): `checksum` means nothing
        /// and a reader has nothing to check the bytes against.
        unhashed: bool,
    } min_len = 8 + 4 + 8 + 8 + 4 + 1
);

impl ObjectDesc {
    /// Whether bytes read for this object are its value: their CRC-32C (`crc`, asked only when
    /// there is one to check against) is the putter's.
    pub fn holds(&self, crc: impl FnOnce() -> u32) -> bool {
        self.unhashed || crc() == self.checksum
    }
}

message!(RemoveReq { key: String, force: bool } min_len = 3);
message!(
    /// `REMOVE_ALL`: every readable object of `tenant` (`master::tenants`).
    RemoveAllReq { force: bool, tenant: String } min_len = 1 + 2
);
message!(RemoveAllResp { removed: u64 } min_len = 8);

message!(PutItem { key: String, size: u64 } min_len = 10);
message!(BatchPutStartReq { client_id: u64, config: ReplicateConfig, items: Vec<PutItem> } min_len = 8 + 12 + 4);
message!(BatchPutStartResp { items: Vec<Result<PutStartResp, Status>> } min_len = 4);
message!(EndItem { key: String, object_id: u64, checksum: u32, unhashed: bool } min_len = 15);
message!(BatchPutEndReq { client_id: u64, items: Vec<EndItem> } min_len = 12);
message!(BatchStatusResp { items: Vec<Status> } min_len = 4);
message!(
    /// Commits `items` (as `BatchPutEndReq`) and asks for one reservation per size in
    /// `reserve`, placed by `config`: space allocated and a version drawn for a put that does
    /// not know its key yet. Committing an item whose object id is a reservation's makes that
    /// reservation the key's value.
    BatchPutCommitReq {
        client_id: u64,
        items: Vec<EndItem>,
        config: ReplicateConfig,
        reserve: Vec<u64>,
    } min_len = 8 + 4 + 12 + 4
);
message!(
    /// Per-item commit statuses, one answer per size asked, and how long the reservations may
    /// be started into (counted from when the request was sent).
    BatchPutCommitResp {
        items: Vec<Status>,
        reserved: Vec<Result<PutStartResp, Status>>,
        ttl_ms: u64,
    } min_len = 4 + 4 + 8
);
message!(BatchKeysReq { keys: Vec<String> } min_len = 4);
message!(BatchGetReplicasResp { items: Vec<Result<ObjectDesc, Status>> } min_len = 4);
message!(BatchExistsResp { items: Vec<bool> } min_len = 4);
message!(BatchRemoveReq { force: bool, keys: Vec<String> } min_len = 5);

message!(
    /// Store: write the payload at `offset` of the segment. With a non-empty `key`, a
    /// persistent store records the object (key, version, checksum) in its durable index once
    /// every byte is in place. `grant`: the master's for this replica of the put.
    WriteReq { offset: u64, key: String, version: u64, checksum: u32, grant: Grant } min_len = 8 + 2 + 8 + 4 + 16
);
message!(
    /// Store: record objects written into the segment by memory copy (same-host clients) or
    /// RDMA, each with the master's grant for its range (`grants[i]` for `objects[i]`).
    SealReq { objects: Vec<StoredObject>, grants: Vec<Grant> } min_len = 8
);
message!(
    /// The answer to `SEAL_DEFERRED`: per object its status and whether it was recorded
    /// `hashed`, with its bytes' CRC-32C in `checksums` (0 while unhashed).
    SealDeferredResp { items: Vec<Status>, checksums: Vec<u32>, hashed: Vec<bool> } min_len = 12
);
message!(
    /// Store (from the master): drop these records from the durable index.
    ForgetReq { items: Vec<ForgetItem> } min_len = 4
);
message!(
    /// Store: send `length` bytes from `offset` of the segment as the payload.
    ReadReq { offset: u64, length: u64 } min_len = 16
);
message!(
    /// Store: as `ReadReq`, but only while the object at `offset` is still `version`.
    ReadVersionReq { offset: u64, length: u64, version: u64 } min_len = 24
);
message!(
    /// Store: connect an RDMA reliable-connected queue pair to this connection. The client's
    /// pair (number, first packet sequence number, LID, GID as two big-endian halves, port MTU
    /// as the verbs enum) and which of the store's NICs it uses (an index, modulo their count).
    RdmaConnectReq {
        qpn: u32,
        psn: u32,
        lid: u32,
        gid_hi: u64,
        gid_lo: u64,
        mtu: u8,
        nic: u32,
    } min_len = 4 + 4 + 4 + 8 + 8 + 1 + 4
);
message!(
    /// The store's pair, connected to the client's, its NIC count, its memory segment as that
    /// NIC sees it (base address, length, remote key), how long the store keeps an idle
    /// connection (and the pair with it), and its table of version stamps (address, remote key,
    /// slots: a power of two, or 0 when it keeps none; `transfer::stamps`).
    RdmaConnectResp {
        qpn: u32,
        psn: u32,
        lid: u32,
        gid_hi: u64,
        gid_lo: u64,
        mtu: u8,
        nics: u32,
        addr: u64,
        length: u64,
        rkey: u32,
        idle_ms: u64,
        stamp_addr: u64,
        stamp_rkey: u32,
        stamp_slots: u64,
    } min_len = 4 + 4 + 4 + 8 + 8 + 1 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 8
);
message!(
    /// Store: the answer to `CHECK_VERSION` (the version is there): how much longer its read
    /// lease from the master runs, counted from when it answered. A client trusts the version
    /// stamps it reads one-sidedly only within that time, counted from when it asked.
    CheckVersionResp { lease_ms_left: u64 } min_len = 8
);
message!(
    /// Store (from the master): drop these records. `lease_ms` is ignored (masters before
    /// `LEASE` extended the read lease with it, counted from when it arrived).
    ForgetLeaseReq { items: Vec<ForgetItem>, lease_ms: u64 } min_len = 12
);
/// Largest object a store copies between its tiers in one move (and reads from its disk tier
/// in one request): larger objects are dropped by eviction rather than demoted.
pub const MAX_MOVE_BYTES: u64 = 64 << 20;

/// Which way a `MoveItem` copies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MoveKind {
    /// Memory segment → disk segment (memory gave the object up).
    #[default]
    Demote,
    /// Disk segment → memory segment (a hit brings it back).
    Promote,
}

byte_enum!(MoveKind, "move kind", { Demote = 0 "demote", Promote = 1 "promote" });

message!(
    /// One object to copy between a store's tiers: `size` bytes at `from` (of the memory
    /// segment for a demotion, of the disk segment for a promotion) to `to` (of the other).
    /// The store checks the bytes against `checksum` and records the object (key, version)
    /// where it lands before it answers; the master drops the old record with a forget.
    MoveItem {
        kind: MoveKind,
        key: String,
        version: u64,
        from: u64,
        to: u64,
        size: u64,
        checksum: u32,
    } min_len = 1 + 2 + 8 + 8 + 8 + 8 + 4
);
message!(MoveReq { items: Vec<MoveItem> } min_len = 4);
message!(StoreInfoResp { name: String, size: u64 } min_len = 10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_enum_is_its_number_and_refuses_one_not_known_by_name() {
        let mut e = Encoder::default();
        MoveKind::Promote.encode(&mut e);
        Reach::Any.encode(&mut e);
        assert_eq!(e.buf, [1, 2]);
        let mut d = Decoder::new(&e.buf);
        assert_eq!(MoveKind::decode(&mut d).unwrap(), MoveKind::Promote);
        assert_eq!(Reach::decode(&mut d).unwrap(), Reach::Any);
        let err = Tier::decode(&mut Decoder::new(&[7])).unwrap_err();
        assert_eq!(
            err.to_string(),
            TransferError::Protocol("unknown segment tier 7 (0 memory, 1 disk)".into()).to_string()
        );
        assert_eq!(serde_json::to_string(&Tier::Disk).unwrap(), "1");
    }

    #[test]
    fn nested_messages_round_trip() {
        let resp = BatchGetReplicasResp {
            items: vec![
                Ok(ObjectDesc {
                    size: 4096,
                    checksum: 0xdead_beef,
                    lease_ttl_ms: 10_000,
                    version: 3,
                    replicas: vec![ReplicaLoc {
                        segment_id: 7,
                        offset: 128,
                    }],
                    unhashed: true,
                }),
                Err(Status::ObjectNotFound),
            ],
        };
        let back = BatchGetReplicasResp::from_meta(&resp.to_meta()).unwrap();
        assert_eq!(resp, back);

        let req = PutStartReq {
            client_id: 1,
            key: "k".into(),
            size: 10,
            config: ReplicateConfig {
                replica_num: 2,
                soft_pin: true,
                soft_pin_ttl_ms: 5,
                preferred_segment: "127.0.0.1:1".into(),
                reach: Reach::MooncakeTe,
            },
        };
        assert_eq!(PutStartReq::from_meta(&req.to_meta()).unwrap(), req);
    }

    #[test]
    fn truncated_or_padded_messages_fail() {
        let meta = KeyReq { key: "abc".into() }.to_meta();
        assert_eq!(KeyReq::key_of(&meta).unwrap(), "abc");
        assert!(KeyReq::key_of(&meta[..meta.len() - 1]).is_err());
        assert!(KeyReq::from_meta(&meta[..meta.len() - 1]).is_err());
        let mut padded = meta.clone();
        padded.push(0);
        assert!(KeyReq::from_meta(&padded).is_err());
        assert!(KeyReq::key_of(&padded).is_err());
    }
}
