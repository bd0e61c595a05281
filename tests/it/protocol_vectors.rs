//! Golden frames of the wire protocol (`docs/protocol.md`), generated from its one declaration
//! (`transfer::message`, `transfer::frame`) into `tests/vectors/frames.json`. Both
//! implementations decode every frame there and encode it again byte for byte: this suite for
//! Rust, `python/tests/test_vectors.py` for the Python client. A change to the protocol on one
//! side that the other does not follow fails a test, not a deployment.
//!
//! After a deliberate protocol change: `RBGCTL_BLESS=1 cargo test --test it protocol_vectors::`
//! rewrites the file; commit it with the change (and the Python side's follow-up).

use rbgctl::transfer::frame::{Header, Opcode, Status, HEADER_LEN};
use rbgctl::transfer::grant::{GrantKey, GRANT_LEN};
use rbgctl::transfer::message::*;
use rbgctl::transfer::{TransferError, Wire};
use serde::Serialize;
use serde_json::{json, Value};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/frames.json");

/// One frame: its header fields, the message its meta holds (by type name), the message's
/// fields as JSON, and the frame's bytes (header and meta; the payload is `data_len` bytes
/// that follow and is not part of the vector).
struct Case {
    name: String,
    message: &'static str,
    header: Header,
    fields: Value,
    meta: Vec<u8>,
}

impl Case {
    fn to_json(&self) -> Value {
        let mut frame = self.header.encode().to_vec();
        frame.extend_from_slice(&self.meta);
        json!({
            "name": self.name,
            "message": self.message,
            "opcode": self.header.opcode,
            "reply": self.header.is_response(),
            "status": self.header.status,
            "request_id": self.header.request_id,
            "data_len": self.header.data_len,
            "fields": self.fields,
            "frame": hex(&frame),
        })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The struct's name without its path.
fn type_name<M>() -> &'static str {
    let n = std::any::type_name::<M>();
    n.rsplit("::").next().unwrap_or(n)
}

struct Cases {
    out: Vec<Case>,
    next_id: u64,
}

impl Cases {
    fn push(
        &mut self,
        name: &str,
        message: &'static str,
        header: Header,
        fields: Value,
        meta: Vec<u8>,
    ) {
        self.out.push(Case {
            name: name.to_string(),
            message,
            header,
            fields,
            meta,
        });
    }

    fn request<M: Wire + Serialize>(&mut self, name: &str, op: Opcode, m: &M, data_len: u64) {
        self.next_id += 1;
        let meta = m.to_meta();
        let header = Header::request(op, self.next_id, meta.len(), data_len);
        let fields = serde_json::to_value(m).expect("fields");
        self.push(name, message_name::<M>(), header, fields, meta);
    }

    /// A master's order to a store: `m`'s meta followed by its tag under [`key`]. The message
    /// is named `<M>+tag`, its fields `{"order": m, "tag": hex}`.
    fn order<M: Wire + Serialize>(&mut self, name: &str, op: Opcode, m: &M) {
        self.next_id += 1;
        let meta = key().order(op, m.to_meta());
        let tag = &meta[meta.len() - GRANT_LEN..];
        let header = Header::request(op, self.next_id, meta.len(), 0);
        let fields = json!({"order": serde_json::to_value(m).expect("fields"), "tag": hex(tag)});
        let message = match message_name::<M>() {
            "ForgetReq" => "ForgetReq+tag",
            "ForgetLeaseReq" => "ForgetLeaseReq+tag",
            "MoveReq" => "MoveReq+tag",
            other => panic!("{other} is not an order"),
        };
        self.push(name, message, header, fields, meta);
    }

    /// The reply to the request just added.
    fn reply<M: Wire + Serialize>(&mut self, name: &str, op: Opcode, m: &M, data_len: u64) {
        let meta = m.to_meta();
        let req = Header::request(op, self.next_id, 0, 0);
        let header = Header::response(&req, Status::Ok, meta.len(), data_len);
        let fields = serde_json::to_value(m).expect("fields");
        self.push(name, message_name::<M>(), header, fields, meta);
    }

    /// An error answer: the status in the header, a UTF-8 message as the meta.
    fn error(&mut self, name: &str, op: Opcode, status: Status, text: &str) {
        self.next_id += 1;
        let req = Header::request(op, self.next_id, 0, 0);
        let header = Header::response(&req, status, text.len(), 0);
        self.push(name, "Error", header, json!(text), text.as_bytes().to_vec());
    }
}

fn message_name<M>() -> &'static str {
    match type_name::<M>() {
        "()" => "Empty",
        n => n,
    }
}

/// The grant key of the vectors: their grants and orders' tags are made with it, so that
/// another implementation can check its HMAC against them.
fn key() -> GrantKey {
    GrantKey::from_bytes(&[7u8; rbgctl::transfer::grant::KEY_LEN]).expect("32 bytes")
}

fn segment(name: &str, size: u64) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        endpoint: "10.0.0.7:12830".into(),
        size,
        shm_path: "/dev/shm/rbgctl/store-0.seg".into(),
        shm_token: 0x0123_4567_89ab_cdef,
        host_id: "5f2c0b9e-8f5e-4a8e-9d1c-3c0e2f7a9b11".into(),
        segment_uuid: 42,
        tier: Tier::Memory,
        persistent: true,
        te_endpoint: "10.0.0.7:15001".into(),
        te_data_port: 15002,
        te_base: 0x1000_0000_0000,
    }
}

/// Every message type, at ordinary and edge sizes, and error answers.
fn cases() -> Vec<Case> {
    let mut c = Cases {
        out: Vec::new(),
        next_id: 0,
    };
    let long_key = "k".repeat(rbgctl::transfer::codec::MAX_STR_LEN);
    let utf8_key = "ключ/🔑/page-0";
    let replicas = vec![
        ReplicaLoc {
            segment_id: 1,
            offset: 0,
        },
        ReplicaLoc {
            segment_id: u64::MAX,
            offset: (1 << 40) + 4096,
        },
    ];
    let config = ReplicateConfig {
        replica_num: 2,
        soft_pin: true,
        soft_pin_ttl_ms: 60_000,
        preferred_segment: "10.0.0.7:12830".into(),
        reach: Reach::MooncakeTe,
    };
    let desc = ObjectDesc {
        size: 1 << 20,
        checksum: 0xdead_beef,
        lease_ttl_ms: 5000,
        version: 77,
        replicas: replicas.clone(),
        unhashed: false,
    };
    let stored = StoredObject {
        key: utf8_key.into(),
        version: 9,
        offset: 8192,
        size: 4096,
        checksum: 0x1234_5678,
    };

    c.request("ping", Opcode::Ping, &PingReq { client_id: 1 }, 0);
    c.request("leave", Opcode::Leave, &PingReq { client_id: 1 }, 0);
    c.reply("leave reply", Opcode::Leave, &(), 0);
    let lease = LeaseReq {
        client_id: 1,
        segment_id: 3,
    };
    c.request("lease", Opcode::Lease, &lease, 0);
    c.reply(
        "lease reply",
        Opcode::Lease,
        &LeaseResp { lease_ms: 2000 },
        0,
    );
    let hello = AuthHelloReq {
        nonce: (0u8..16).collect(),
    };
    c.request("auth hello", Opcode::AuthHello, &hello, 0);
    let challenge = AuthChallengeResp {
        nonce: (16u8..32).collect(),
        proof: (100u8..132).collect(),
    };
    c.reply("auth hello reply", Opcode::AuthHello, &challenge, 0);
    let proof = AuthProofReq {
        proof: (200u8..232).collect(),
    };
    c.request("auth proof", Opcode::AuthProof, &proof, 0);
    c.reply("auth proof reply", Opcode::AuthProof, &(), 0);
    c.reply(
        "ping reply",
        Opcode::Ping,
        &PingResp { need_remount: true },
        0,
    );
    let mount = MountReq {
        client_id: u64::MAX,
        segment: segment("store-0", 64 << 30),
        recovering: true,
        grant_key: key().bytes().to_vec(),
    };
    c.request("mount", Opcode::MountSegment, &mount, 0);
    let mounted = MountResp {
        segment_id: 3,
        discard: false,
        write_floor: 1_764_000_000_000_000,
    };
    c.reply("mount reply", Opcode::MountSegment, &mounted, 0);
    let unmount = UnmountReq {
        client_id: 5,
        segment_id: 3,
        keep: true,
    };
    c.request("unmount", Opcode::UnmountSegment, &unmount, 0);
    c.reply("unmount reply", Opcode::UnmountSegment, &(), 0);
    c.request("list segments", Opcode::ListSegments, &(), 0);
    let listed = ListSegmentsResp {
        segments: vec![
            SegmentEntry {
                id: 3,
                info: segment("store-0", 1 << 30),
                used: 4096,
            },
            SegmentEntry {
                id: 4,
                info: SegmentInfo {
                    name: "remote".into(),
                    endpoint: "[fd00::2]:12830".into(),
                    size: 4096,
                    ..Default::default()
                },
                used: 0,
            },
            SegmentEntry {
                id: 5,
                info: SegmentInfo {
                    name: "store-0/disk".into(),
                    endpoint: "10.0.0.7:12831".into(),
                    size: 1 << 40,
                    segment_uuid: 43,
                    tier: Tier::Disk,
                    ..Default::default()
                },
                used: 1 << 20,
            },
        ],
    };
    c.reply("list segments reply", Opcode::ListSegments, &listed, 0);
    c.reply(
        "list segments reply, none",
        Opcode::ListSegments,
        &ListSegmentsResp::default(),
        0,
    );
    let report = ReportReq {
        client_id: 5,
        segment_id: 3,
        objects: vec![stored.clone()],
        done: true,
    };
    c.request("report objects", Opcode::ReportObjects, &report, 0);
    let forget = ReportResp {
        forget: vec![ForgetItem {
            offset: 8192,
            version: 9,
        }],
    };
    c.reply("report objects reply", Opcode::ReportObjects, &forget, 0);
    let hashed = HashedReq {
        client_id: 5,
        segment_id: 3,
        objects: vec![stored.clone()],
    };
    let hand_over = HandOverReq {
        client_id: 5,
        segment_id: 3,
        deadline_ms: 60_000,
    };
    c.request("hand over", Opcode::HandOver, &hand_over, 0);
    let handing = HandOverResp {
        state: 0,
        objects: 2000,
        moved_objects: 700,
        moved_bytes: 7 << 20,
        failed: 1,
        no_room: 0,
    };
    c.reply("hand over reply", Opcode::HandOver, &handing, 0);
    c.request("objects hashed", Opcode::ObjectsHashed, &hashed, 0);
    c.reply("objects hashed reply", Opcode::ObjectsHashed, &(), 0);
    let corrupt = ReportCorruptReq {
        key: utf8_key.into(),
        version: 77,
        segment_id: 3,
    };
    c.request("report corrupt", Opcode::ReportCorrupt, &corrupt, 0);
    let list = ListKeysReq {
        pattern: "^page/[0-9]+$".into(),
        limit: 1000,
        tenant: "default".into(),
    };
    c.request("list keys", Opcode::ListKeys, &list, 0);
    let listed_keys = ListKeysResp {
        keys: vec!["page/0".into(), "page/1".into()],
        truncated: true,
    };
    c.reply("list keys reply", Opcode::ListKeys, &listed_keys, 0);

    let put = PutStartReq {
        client_id: 5,
        key: "page/0".into(),
        size: 1 << 20,
        config: config.clone(),
    };
    c.request("put start", Opcode::PutStart, &put, 0);
    let started = PutStartResp {
        object_id: 77,
        replicas: replicas.clone(),
        grants: replicas
            .iter()
            .map(|r| key().grant(77, r.offset, 1 << 20))
            .collect(),
    };
    c.reply("put start reply", Opcode::PutStart, &started, 0);
    let end = PutEndReq {
        client_id: 5,
        key: "page/0".into(),
        object_id: 77,
        checksum: 0xdead_beef,
        unhashed: false,
    };
    c.request("put end", Opcode::PutEnd, &end, 0);
    let revoke = PutRevokeReq {
        client_id: 5,
        key: "page/0".into(),
        object_id: 77,
    };
    c.request("put revoke", Opcode::PutRevoke, &revoke, 0);
    c.request(
        "get replicas",
        Opcode::GetReplicas,
        &KeyReq {
            key: utf8_key.into(),
        },
        0,
    );
    c.reply("get replicas reply", Opcode::GetReplicas, &desc, 0);
    c.request(
        "exists, longest key",
        Opcode::Exists,
        &KeyReq { key: long_key },
        0,
    );
    c.reply("exists reply", Opcode::Exists, &true, 0);
    c.request(
        "exists, empty key",
        Opcode::Exists,
        &KeyReq { key: String::new() },
        0,
    );
    let remove = RemoveReq {
        key: "page/0".into(),
        force: true,
    };
    c.request("remove", Opcode::Remove, &remove, 0);
    c.request(
        "remove all",
        Opcode::RemoveAll,
        &RemoveAllReq {
            force: false,
            tenant: "team-a".into(),
        },
        0,
    );
    let removed = RemoveAllResp { removed: u64::MAX };
    c.reply("remove all reply", Opcode::RemoveAll, &removed, 0);

    let batch = BatchPutStartReq {
        client_id: 5,
        config: ReplicateConfig::default(),
        items: vec![
            PutItem {
                key: "a".into(),
                size: 1,
            },
            PutItem {
                key: utf8_key.into(),
                size: u64::MAX,
            },
        ],
    };
    c.request("batch put start", Opcode::BatchPutStart, &batch, 0);
    let batch_started = BatchPutStartResp {
        items: vec![Ok(started.clone()), Err(Status::NoSpace)],
    };
    c.reply(
        "batch put start reply",
        Opcode::BatchPutStart,
        &batch_started,
        0,
    );
    let ends = BatchPutEndReq {
        client_id: 5,
        items: vec![EndItem {
            key: "a".into(),
            object_id: 77,
            checksum: 0,
            unhashed: true,
        }],
    };
    c.request("batch put end", Opcode::BatchPutEnd, &ends, 0);
    let statuses = BatchStatusResp {
        items: vec![Status::Ok, Status::WriteSuperseded],
    };
    c.reply("batch put end reply", Opcode::BatchPutEnd, &statuses, 0);
    c.request("batch put revoke", Opcode::BatchPutRevoke, &ends, 0);
    let commit = BatchPutCommitReq {
        client_id: 5,
        items: ends.items.clone(),
        config: ReplicateConfig {
            replica_num: 2,
            ..ReplicateConfig::default()
        },
        reserve: vec![4096, 1 << 20],
    };
    c.request("batch put commit", Opcode::BatchPutCommit, &commit, 0);
    let committed = BatchPutCommitResp {
        items: vec![Status::Ok],
        reserved: vec![
            Ok(PutStartResp {
                object_id: 78,
                replicas: vec![ReplicaLoc {
                    segment_id: 1,
                    offset: 4096,
                }],
                grants: vec![key().grant(78, 4096, 4096)],
            }),
            Err(Status::NoSpace),
        ],
        ttl_ms: 500,
    };
    c.reply(
        "batch put commit reply",
        Opcode::BatchPutCommit,
        &committed,
        0,
    );
    let keys = BatchKeysReq {
        keys: vec!["a".into(), String::new(), utf8_key.into()],
    };
    c.request("batch get replicas", Opcode::BatchGetReplicas, &keys, 0);
    let descs = BatchGetReplicasResp {
        items: vec![
            Ok(desc.clone()),
            Err(Status::ObjectNotFound),
            Err(Status::ReplicaNotReady),
        ],
    };
    c.reply(
        "batch get replicas reply",
        Opcode::BatchGetReplicas,
        &descs,
        0,
    );
    c.request(
        "batch exists, none",
        Opcode::BatchExists,
        &BatchKeysReq::default(),
        0,
    );
    let exists = BatchExistsResp {
        items: vec![true, false],
    };
    c.reply("batch exists reply", Opcode::BatchExists, &exists, 0);
    let batch_remove = BatchRemoveReq {
        force: false,
        keys: vec!["a".into()],
    };
    c.request("batch remove", Opcode::BatchRemove, &batch_remove, 0);

    let write = WriteReq {
        offset: 8192,
        key: utf8_key.into(),
        version: 9,
        checksum: 0x1234_5678,
        grant: key().grant(9, 8192, 4096),
    };
    c.request("write, 4 KiB payload", Opcode::Write, &write, 4096);
    c.reply("write reply", Opcode::Write, &(), 0);
    let checked = WriteReq {
        checksum: 0,
        ..write.clone()
    };
    c.request(
        "write checked, 4 KiB payload then its CRC-32C",
        Opcode::WriteChecked,
        &checked,
        4096 + 4,
    );
    c.reply("write checked reply", Opcode::WriteChecked, &(), 0);
    let read = ReadReq {
        offset: 8192,
        length: 4096,
    };
    c.request("read", Opcode::Read, &read, 0);
    c.reply("read reply, 4 KiB payload", Opcode::Read, &(), 4096);
    c.request("store info", Opcode::StoreInfo, &(), 0);
    let info = StoreInfoResp {
        name: "store-0".into(),
        size: 1 << 30,
    };
    c.reply("store info reply", Opcode::StoreInfo, &info, 0);
    let seal = SealReq {
        objects: vec![stored.clone(), StoredObject::default()],
        grants: vec![key().grant(9, 8192, 4096), Default::default()],
    };
    c.request("seal", Opcode::Seal, &seal, 0);
    c.reply("seal reply", Opcode::Seal, &statuses, 0);
    let forget_req = ForgetReq {
        items: vec![ForgetItem {
            offset: 0,
            version: u64::MAX,
        }],
    };
    c.order("forget", Opcode::Forget, &forget_req);
    let forget_lease = ForgetLeaseReq {
        items: forget_req.items.clone(),
        lease_ms: 2000,
    };
    c.order("forget lease", Opcode::ForgetLease, &forget_lease);
    c.reply("forget lease reply", Opcode::ForgetLease, &(), 0);
    let read_version = ReadVersionReq {
        offset: 8192,
        length: 4096,
        version: 9,
    };
    c.request("read version", Opcode::ReadVersion, &read_version, 0);
    c.reply(
        "read version reply, 4 KiB payload",
        Opcode::ReadVersion,
        &(),
        4096,
    );
    let moves = MoveReq {
        items: vec![
            MoveItem {
                kind: MoveKind::Demote,
                key: "page/0".into(),
                version: 9,
                from: 8192,
                to: 1 << 20,
                size: 4096,
                checksum: 0xdead_beef,
            },
            MoveItem {
                kind: MoveKind::Promote,
                key: "page/1".into(),
                version: 10,
                from: 4096,
                to: 128,
                size: 100,
                checksum: 7,
            },
        ],
    };
    c.order("move between tiers", Opcode::Move, &moves);
    let moved = BatchStatusResp {
        items: vec![Status::Ok, Status::ChecksumMismatch],
    };
    c.reply("move between tiers reply", Opcode::Move, &moved, 0);
    let connect = RdmaConnectReq {
        qpn: 0x11,
        psn: 0x00ab_cdef,
        lid: 0,
        gid_hi: 0,
        gid_lo: 0x0000_ffff_0a00_020f,
        mtu: 3,
        nic: 1,
    };
    c.request("rdma connect", Opcode::RdmaConnect, &connect, 0);
    let connected = RdmaConnectResp {
        qpn: 0x12,
        psn: 0x0012_3456,
        lid: 0,
        gid_hi: 0,
        gid_lo: 0x0000_ffff_0a00_0210,
        mtu: 3,
        nics: 2,
        addr: 0x7f00_0000_0000,
        length: 64 << 20,
        rkey: 0x1234,
        idle_ms: 120_000,
        stamp_addr: 0x7f00_1000_0000,
        stamp_rkey: 0x1235,
        stamp_slots: 8192,
    };
    c.reply("rdma connect reply", Opcode::RdmaConnect, &connected, 0);
    let sealed = SealReq {
        objects: vec![StoredObject {
            key: "page/0".into(),
            version: 9,
            offset: 8192,
            size: 1 << 20,
            checksum: 0xdead_beef,
        }],
        grants: vec![key().grant(9, 8192, 1 << 20)],
    };
    c.request("seal checked", Opcode::SealChecked, &sealed, 0);
    c.reply(
        "seal checked reply",
        Opcode::SealChecked,
        &BatchStatusResp {
            items: vec![Status::ChecksumMismatch],
        },
        0,
    );
    c.request("seal deferred", Opcode::SealDeferred, &sealed, 0);
    c.reply(
        "seal deferred reply",
        Opcode::SealDeferred,
        &SealDeferredResp {
            items: vec![Status::Ok, Status::Ok, Status::NotGranted],
            checksums: vec![0x1234_5678, 0, 0],
            hashed: vec![true, false, false],
        },
        0,
    );
    c.request("check version", Opcode::CheckVersion, &read_version, 0);
    c.reply(
        "check version reply",
        Opcode::CheckVersion,
        &CheckVersionResp {
            lease_ms_left: 1_500,
        },
        0,
    );
    c.error(
        "error: the version moved",
        Opcode::ReadVersion,
        Status::ObjectNotFound,
        "version 9 is not at offset 8192",
    );

    c.error(
        "error: not found",
        Opcode::GetReplicas,
        Status::ObjectNotFound,
        "key \"page/0\" not found",
    );
    c.error(
        "error: no space",
        Opcode::BatchPutStart,
        Status::NoSpace,
        "no segment has room",
    );
    c.error(
        "error: a standby is not the leader",
        Opcode::PutStart,
        Status::NotLeader,
        "this master is a standby; the leader is 10.0.0.2:50051 (epoch 7)",
    );
    c.error(
        "error: malformed, empty message",
        Opcode::Ping,
        Status::MalformedFrame,
        "",
    );
    c.out
}

/// Decodes `meta` as the named message and encodes it again.
fn reencode(message: &str, meta: &[u8]) -> Result<Vec<u8>, TransferError> {
    // An order: its body re-encoded, then its tag as it was.
    if let Some(body_message) = message.strip_suffix("+tag") {
        let split = meta.len().checked_sub(GRANT_LEN).ok_or_else(|| {
            TransferError::Protocol(format!("an order of {} bytes has no tag", meta.len()))
        })?;
        let mut again = reencode(body_message, &meta[..split])?;
        again.extend_from_slice(&meta[split..]);
        return Ok(again);
    }
    macro_rules! by_name {
        ($($t:ty),* $(,)?) => {
            match message {
                "Error" => Ok(meta.to_vec()),
                "Empty" => <()>::from_meta(meta).map(|m| m.to_meta()),
                "bool" => bool::from_meta(meta).map(|m| m.to_meta()),
                $( n if n == type_name::<$t>() => <$t>::from_meta(meta).map(|m| m.to_meta()), )*
                other => Err(TransferError::Protocol(format!("no message type {other:?}"))),
            }
        };
    }
    by_name!(
        PingReq,
        PingResp,
        LeaseReq,
        LeaseResp,
        AuthHelloReq,
        AuthChallengeResp,
        AuthProofReq,
        HandOverReq,
        HandOverResp,
        MountReq,
        MountResp,
        UnmountReq,
        ListSegmentsResp,
        ReportReq,
        ReportResp,
        HashedReq,
        ReportCorruptReq,
        ListKeysReq,
        ListKeysResp,
        PutStartReq,
        PutStartResp,
        PutEndReq,
        PutRevokeReq,
        KeyReq,
        ObjectDesc,
        RemoveReq,
        RemoveAllReq,
        RemoveAllResp,
        BatchPutStartReq,
        BatchPutStartResp,
        BatchPutEndReq,
        BatchPutCommitReq,
        BatchPutCommitResp,
        BatchStatusResp,
        BatchKeysReq,
        BatchGetReplicasResp,
        BatchExistsResp,
        BatchRemoveReq,
        WriteReq,
        ReadReq,
        StoreInfoResp,
        SealReq,
        SealDeferredResp,
        ForgetReq,
        ReadVersionReq,
        ForgetLeaseReq,
        MoveReq,
        RdmaConnectReq,
        RdmaConnectResp,
        CheckVersionResp,
    )
}

#[test]
fn the_golden_frames_are_what_the_declaration_encodes() {
    let generated = Value::Array(cases().iter().map(Case::to_json).collect());
    let text = serde_json::to_string_pretty(&generated).expect("json") + "\n";
    if std::env::var_os("RBGCTL_BLESS").is_some() {
        std::fs::write(FILE, &text).expect("write the vectors");
        return;
    }
    let on_disk = std::fs::read_to_string(FILE).unwrap_or_default();
    assert!(
        on_disk == text,
        "tests/vectors/frames.json differs from what the protocol declaration encodes; after a \
         deliberate protocol change run `RBGCTL_BLESS=1 cargo test --test it protocol_vectors::` and \
         follow up in python/src/rbgctl/protocol.py"
    );
}

#[test]
fn every_golden_frame_decodes_and_encodes_again_byte_for_byte() {
    let text = std::fs::read_to_string(FILE).expect("tests/vectors/frames.json");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("vectors are JSON");
    assert!(cases.len() >= 40, "{} vectors", cases.len());
    let mut opcodes = std::collections::BTreeSet::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap_or("?");
        let frame = unhex(case["frame"].as_str().expect("frame"));
        let header_bytes: [u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().expect("header");
        let header = Header::decode(&header_bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(header.encode(), header_bytes, "{name}: header");
        assert_eq!(
            header.opcode as u64,
            case["opcode"].as_u64().unwrap_or(0),
            "{name}"
        );
        assert_eq!(header.is_response(), case["reply"] == true, "{name}");
        assert_eq!(
            header.data_len,
            case["data_len"].as_u64().unwrap_or(0),
            "{name}"
        );
        let meta = &frame[HEADER_LEN..];
        assert_eq!(meta.len(), header.meta_len as usize, "{name}: meta length");
        let message = case["message"].as_str().expect("message");
        let again = reencode(message, meta).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(hex(&again), hex(meta), "{name}: re-encoded {message}");
        opcodes.insert(header.opcode);
    }
    for op in Opcode::ALL {
        assert!(opcodes.contains(&(op as u8)), "no vector for {}", op.name());
    }
}
