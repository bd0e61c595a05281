//! Mooncake's own client (the PyPI wheel `.ci/run` installs, unchanged) against rbgctl's
//! master on its one RPC port, beside rbgctl's own clients (issue 63).

use crate::common;

use common::wheel::Wheel;
use common::{wait_until, Cluster, Opts};
use rbgctl::client::ReplicateConfig;
use std::process::Command;
use std::time::Duration;

/// Runs `script` with the wheel's interpreter; answers its standard output (the test fails
/// with both streams when it does). `None` (and a skip line) when no interpreter is given.
fn wheel(script: &str) -> Option<String> {
    let Some(python) = std::env::var_os("RBGCTL_MOONCAKE_PYTHON") else {
        common::skip("RBGCTL_MOONCAKE_PYTHON (the Mooncake wheel's interpreter) is not set");
        return None;
    };
    let out = Command::new("timeout")
        .arg("120")
        .arg(&python)
        .args(["-c", script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the wheel's script failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

/// The wheel connects (ServiceReady, GetStorageConfig), sees and removes what rbgctl's client
/// put, and is told Mooncake's own codes for what is missing; rbgctl's client sees what the
/// wheel did.
#[test]
fn mooncakes_client_sets_up_and_works_on_keys_through_rbgctls_master() {
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let client = c.client();
    client
        .put("rb/kept", b"from rbgctl", &ReplicateConfig::default())
        .unwrap();
    client
        .put("rb/gone", b"to be removed", &ReplicateConfig::default())
        .unwrap();
    for i in 0..5 {
        client
            .put(&format!("rx/{i}"), b"regex", &ReplicateConfig::default())
            .unwrap();
    }
    let script = format!(
        "from mooncake.store import MooncakeDistributedStore as S\n\
         s = S()\n\
         print('setup', s.setup('127.0.0.1', 'http://127.0.0.1:{meta}/metadata', 0, 16 << 20, \
         'tcp', '', '{rpc}'))\n\
         print('exists', s.is_exist('rb/kept'), s.is_exist('missing'))\n\
         print('batch', list(s.batch_is_exist(['rb/kept', 'missing', 'rb/gone'])))\n\
         print('remove_missing', s.remove('missing'))\n\
         print('remove', s.remove('rb/gone'))\n\
         print('after', s.is_exist('rb/gone'))\n\
         print('bad_regex', s.remove_by_regex('(unclosed'))\n\
         print('by_regex', s.remove_by_regex('^rx/[0-2]$'))\n\
         print('regex_left', [s.is_exist('rx/%d' % i) for i in range(5)])\n\
         s.close()\n",
        meta = c.metadata_port,
        rpc = c.rpc
    );
    let Some(said) = wheel(&script) else { return };
    let line = |name: &str| line_of(&said, name);
    assert_eq!(line("setup"), "setup 0", "{said}");
    assert_eq!(line("exists"), "exists 1 0", "{said}");
    assert_eq!(line("batch"), "batch [1, 0, 1]", "{said}");
    // Mooncake's OBJECT_NOT_FOUND.
    assert_eq!(line("remove_missing"), "remove_missing -704", "{said}");
    assert_eq!(line("remove"), "remove 0", "{said}");
    assert_eq!(line("after"), "after 0", "{said}");
    // RemoveByRegex: Mooncake's INVALID_PARAMS for a pattern that is none, then the matches
    // (searched anywhere in the key, anchored here) go and the rest stay.
    assert_eq!(line("bad_regex"), "bad_regex -600", "{said}");
    assert_eq!(line("by_regex"), "by_regex 3", "{said}");
    assert_eq!(line("regex_left"), "regex_left [0, 0, 0, 1, 1]", "{said}");
    let (left, more) = client.keys("^rx/", 10).unwrap();
    assert_eq!(
        (left, more),
        (vec!["rx/3".to_string(), "rx/4".to_string()], false)
    );
    // GetReplicaListByRegex (the wheel's Python has no call for it): the matching keys with
    // their replicas, in Mooncake's types; INVALID_PARAMS for a pattern that is none.
    {
        use rbgctl::mooncake::coro_rpc::{RequestHeader, ResponseHeader, RESPONSE_HEADER_LEN};
        use rbgctl::mooncake::rpcs::Rpc;
        use rbgctl::mooncake::struct_pack::{Map, TypeSig};
        use rbgctl::mooncake::types::ReplicaDescriptor;
        use std::io::{Read, Write};
        type Answer = Result<Map<String, Vec<ReplicaDescriptor>>, i32>;
        let ask = |pattern: &str| -> Answer {
            let body = TypeSig::of::<(String, String)>()
                .write(&(pattern.to_string(), "default".to_string()));
            let head = RequestHeader {
                seq_num: 1,
                function_id: Rpc::GetReplicaListByRegex.id(),
                length: body.len() as u32,
                ..Default::default()
            };
            let mut s = std::net::TcpStream::connect(&c.rpc).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(&head.encode()).unwrap();
            s.write_all(&body).unwrap();
            let mut raw = [0u8; RESPONSE_HEADER_LEN];
            s.read_exact(&mut raw).unwrap();
            let h = ResponseHeader::decode(&raw).unwrap();
            let mut answer = vec![0u8; h.length as usize];
            s.read_exact(&mut answer).unwrap();
            assert_eq!(h.err_code, 0, "{}", String::from_utf8_lossy(&answer));
            TypeSig::of::<Answer>().read(&answer).unwrap()
        };
        let Map(mut found) = ask("^rx/").unwrap();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["rx/3", "rx/4"]);
        assert!(found.iter().all(|(_, replicas)| replicas.len() == 1));
        assert_eq!(ask("(unclosed").unwrap_err(), -600);
    }
    // rbgctl's client sees the wheel's remove, and what it left.
    assert!(!client.exists("rb/gone").unwrap());
    assert_eq!(client.get("rb/kept").unwrap(), b"from rbgctl");
    assert!(
        !c.master().log().contains("another protocol"),
        "the master took the wheel for a stranger"
    );
    // The master counts what the wheel asked, by RPC and result.
    let count = |rpc: &str, result: &str| {
        c.master_metric(&format!(
            "rbgctl_master_mooncake_requests_total{{rpc=\"{rpc}\",result=\"{result}\"}}"
        ))
        .unwrap_or(0.0)
    };
    assert_eq!(count("ServiceReady", "ok"), 1.0);
    assert_eq!(count("ExistKey", "ok"), 3.0 + 5.0);
    assert_eq!(count("RemoveByRegex", "ok"), 1.0);
    assert_eq!(count("Remove", "error"), 1.0, "the missing key");
    assert!(
        c.master_metric("rbgctl_master_mooncake_connections_total")
            .unwrap()
            >= 1.0
    );
}

/// The segment a Mooncake process mounted (no rbgctl store serves it), if one is.
fn mooncake_segment(
    client: &rbgctl::client::Client,
) -> Option<rbgctl::transfer::message::SegmentEntry> {
    client
        .segments()
        .unwrap()
        .into_iter()
        .find(|s| s.info.endpoint.is_empty())
}

/// The line of `said` that starts with `name`.
fn line_of(said: &str, name: &str) -> String {
    said.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} line in:\n{said}"))
        .to_string()
}

/// The wheel puts and gets through rbgctl's master and stores, its bytes moved by its own
/// Transfer Engine into the store's segment: with the HTTP metadata server and with the P2P
/// handshake against the same store, 1 B to 16 MiB byte-exact, zero-copy buffers, batches of
/// 128 and of 300 keys, a 300-byte key, the read lease, `upsert`, `remove_all`. What the wheel
/// put, rbgctl's client reads; what rbgctl's client put, the wheel reads.
#[test]
fn mooncakes_client_puts_and_gets_on_rbgctls_stores_in_both_discovery_modes() {
    let c = Cluster::start(Opts {
        stores: 1,
        segment: 256 << 20,
        ..Default::default()
    });
    let client = c.client();
    client
        .put(
            "rb/for-the-wheel",
            b"put by rbgctl",
            &ReplicateConfig::default(),
        )
        .unwrap();
    for (mode, metadata) in [
        (
            "http",
            format!("http://127.0.0.1:{}/metadata", c.metadata_port),
        ),
        ("p2p", "P2PHANDSHAKE".to_string()),
    ] {
        let script = format!(
            r#"
import ctypes, hashlib, os
from mooncake.store import MooncakeDistributedStore as S
s = S()
print('setup', s.setup('127.0.0.1', '{metadata}', 0, 64 << 20, 'tcp', '', '{rpc}'))
ok = True
for n in [1, 4096, 1 << 20, 16 << 20]:
    v = os.urandom(n)
    k = '{mode}/size/%d' % n
    r = s.put(k, v)
    got = s.get(k)
    if r != 0 or got != v or s.get_size(k) != n:
        ok = False
        print('mismatch', n, r, len(got))
print('sizes', ok)
print('rbgctl', s.get('rb/for-the-wheel'))
s.put('{mode}/for-rbgctl', b'put by the wheel')
# Zero-copy: registered buffers, put_from / get_into.
n = 1 << 20
src = (ctypes.c_ubyte * n)(*os.urandom(n)[:16])
dst = (ctypes.c_ubyte * n)()
print('register', s.register_buffer(ctypes.addressof(src), n), s.register_buffer(ctypes.addressof(dst), n))
print('put_from', s.put_from('{mode}/zc', ctypes.addressof(src), n))
print('get_into', s.get_into('{mode}/zc', ctypes.addressof(dst), n), bytes(dst) == bytes(src))
# Batches of 128 keys, 4 KiB each, through registered buffers.
m, each = 128, 4096
bsrc = (ctypes.c_ubyte * (m * each))()
ctypes.memmove(bsrc, os.urandom(m * each), m * each)
bdst = (ctypes.c_ubyte * (m * each))()
s.register_buffer(ctypes.addressof(bsrc), m * each)
s.register_buffer(ctypes.addressof(bdst), m * each)
keys = ['{mode}/batch/%d' % i for i in range(m)]
ptrs = [ctypes.addressof(bsrc) + i * each for i in range(m)]
print('batch_put_from', set(s.batch_put_from(keys, ptrs, [each] * m)))
print('batch_is_exist', set(s.batch_is_exist(keys)))
outs = [ctypes.addressof(bdst) + i * each for i in range(m)]
print('batch_get_into', set(s.batch_get_into(keys, outs, [each] * m)), bytes(bdst) == bytes(bsrc))
# 300 keys in one batch, one of them 300 bytes long.
many = ['{mode}/many/%03d' % i for i in range(299)] + ['{mode}/' + 'k' * 295]
print('put_batch', s.put_batch(many, [k.encode() for k in many]))
print('get_batch', [bytes(v) for v in s.get_batch(many)] == [k.encode() for k in many])
print('long_key', s.get('{mode}/' + 'k' * 295) == ('{mode}/' + 'k' * 295).encode())
# Mooncake's semantics: a put of an existing key leaves it; upsert replaces.
print('put_again', s.put('{mode}/size/1', b'x'), len(s.get('{mode}/size/1')))
print('upsert', s.upsert('{mode}/size/1', b'replaced'), s.get('{mode}/size/1'))
# A get holds a read lease: the remove is refused until it runs out.
import time
s.get('{mode}/size/4096')
print('remove_leased', s.remove('{mode}/size/4096'))
deadline = time.time() + 30
while (r := s.remove('{mode}/size/4096')) != 0 and time.time() < deadline:
    time.sleep(0.05)
print('remove_after', r, s.is_exist('{mode}/size/4096'))
s.close()
"#,
            metadata = metadata,
            rpc = c.rpc,
            mode = mode,
        );
        let Some(said) = wheel(&script) else { return };
        let line = |name: &str| line_of(&said, name);
        assert_eq!(line("setup"), "setup 0", "{mode}: {said}");
        assert_eq!(line("sizes"), "sizes True", "{mode}: {said}");
        assert_eq!(line("rbgctl"), "rbgctl b'put by rbgctl'", "{mode}: {said}");
        assert_eq!(line("register"), "register 0 0", "{mode}: {said}");
        assert_eq!(line("put_from"), "put_from 0", "{mode}: {said}");
        assert_eq!(
            line("get_into"),
            format!("get_into {} True", 1 << 20),
            "{mode}: {said}"
        );
        assert_eq!(
            line("batch_put_from"),
            "batch_put_from {0}",
            "{mode}: {said}"
        );
        assert_eq!(
            line("batch_is_exist"),
            "batch_is_exist {1}",
            "{mode}: {said}"
        );
        assert_eq!(
            line("batch_get_into"),
            "batch_get_into {4096} True",
            "{mode}: {said}"
        );
        assert_eq!(line("put_batch"), "put_batch 0", "{mode}: {said}");
        assert_eq!(line("get_batch"), "get_batch True", "{mode}: {said}");
        assert_eq!(line("long_key"), "long_key True", "{mode}: {said}");
        assert_eq!(line("put_again"), "put_again 0 1", "{mode}: {said}");
        assert_eq!(line("upsert"), "upsert 0 b'replaced'", "{mode}: {said}");
        // Mooncake's OBJECT_HAS_LEASE, then the remove once the lease ran out.
        assert_eq!(
            line("remove_leased"),
            "remove_leased -706",
            "{mode}: {said}"
        );
        assert_eq!(line("remove_after"), "remove_after 0 0", "{mode}: {said}");
        // What the wheel put, rbgctl's client reads, and so does its Python client.
        assert_eq!(
            client.get(&format!("{mode}/for-rbgctl")).unwrap(),
            b"put by the wheel"
        );
        if let Some(python) = std::env::var_os("RBGCTL_PYTHON") {
            let out = Command::new(python)
                .args([
                    "-c",
                    &format!(
                        "import rbgctl\n\
                         c = rbgctl.Client('{rpc}')\n\
                         print(bytes(c.get('{mode}/for-rbgctl')))\n\
                         c.close()\n",
                        rpc = c.rpc
                    ),
                ])
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "b'put by the wheel'",
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            common::skip("RBGCTL_PYTHON (rbgctl's Python client) is not set");
        }
    }
    // remove_all answers how many objects went (a plain count, as Mooncake's does).
    let script = format!(
        "from mooncake.store import MooncakeDistributedStore as S\n\
         s = S()\n\
         print('setup', s.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', '', '{rpc}'))\n\
         print('remove_all', s.remove_all())\n\
         print('left', s.is_exist('http/zc'))\n\
         s.close()\n",
        rpc = c.rpc
    );
    let said = wheel(&script).expect("the wheel ran above");
    let removed: u64 = line_of(&said, "remove_all")["remove_all ".len()..]
        .parse()
        .unwrap();
    assert!(removed > 2 * 300, "{said}");
    assert_eq!(line_of(&said, "left"), "left 0", "{said}");
    assert!(!client.exists("rb/for-the-wheel").unwrap());
    // The bytes went through the store's Transfer Engine port, not rbgctl's.
    let moved = c
        .store_metric(
            0,
            "rbgctl_store_mooncake_transfer_bytes_total{op=\"write\"}",
        )
        .unwrap();
    assert!(moved >= f64::from(2 * (17 << 20)), "{moved}");
    assert!(
        c.store_metric(0, "rbgctl_store_mooncake_handshakes_total")
            .unwrap()
            >= 1.0
    );
}

/// With the cluster secret, Mooncake's unauthenticated RPC is not served: the wheel's `setup`
/// fails at once (not after minutes of retries), and the master's log says what it saw.
#[test]
fn with_the_secret_mooncakes_client_is_told_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "the-cluster-secret-of-this-test-0123456789").unwrap();
    let master = rbgctl::master::config::MasterConfig {
        auth_token_file: Some(file),
        ..common::loopback_master(Default::default())
    };
    let c = Cluster::start(Opts {
        stores: 0,
        master,
        ..Default::default()
    });
    let script = format!(
        "from mooncake.store import MooncakeDistributedStore as S\n\
         s = S()\n\
         print('setup', s.setup('127.0.0.1', 'http://127.0.0.1:{}/metadata', 0, 16 << 20, \
         'tcp', '', '{}'))\n",
        c.metadata_port, c.rpc
    );
    let t0 = std::time::Instant::now();
    let Some(said) = wheel(&script) else { return };
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}: {said}");
    assert!(said.contains("setup -"), "the setup did not fail: {said}");
    assert!(
        wait_until(Duration::from_secs(5), || c
            .master()
            .log()
            .contains("Mooncake's RPC")),
        "the master's log does not name Mooncake's RPC"
    );
}

/// Hostile and mistaken frames on the master's port, in Mooncake's framing: each is answered
/// with coro_rpc's own error at once (or the connection closed within the request timeout),
/// and a well-formed request on another connection is served meanwhile.
#[test]
fn bad_mooncake_frames_are_refused_at_once_and_others_served() {
    use rbgctl::mooncake::coro_rpc::{RequestHeader, ResponseHeader, RESPONSE_HEADER_LEN};
    use rbgctl::mooncake::rpcs::Rpc;
    use rbgctl::mooncake::struct_pack::TypeSig;
    use std::io::{Read, Write};
    let master = rbgctl::master::config::MasterConfig {
        request_timeout_ms: rbgctl::config::Millis(Duration::from_secs(1)),
        ..common::loopback_master(Default::default())
    };
    let c = Cluster::start(Opts {
        stores: 0,
        master,
        ..Default::default()
    });
    let ask = |head: RequestHeader, body: &[u8]| -> (u8, Vec<u8>, Duration) {
        let mut s = std::net::TcpStream::connect(&c.rpc).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t0 = std::time::Instant::now();
        s.write_all(&head.encode()).unwrap();
        s.write_all(body).unwrap();
        let mut raw = [0u8; RESPONSE_HEADER_LEN];
        s.read_exact(&mut raw).unwrap();
        let h = ResponseHeader::decode(&raw).unwrap();
        assert_eq!(h.seq_num, head.seq_num);
        let mut answer = vec![0u8; h.length as usize];
        s.read_exact(&mut answer).unwrap();
        (h.err_code, answer, t0.elapsed())
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    // A function no one registers, and one Mooncake registers for a feature rbgctl has not.
    let (err, answer, took) = ask(
        RequestHeader {
            seq_num: 7,
            function_id: 0x1234_5678,
            ..Default::default()
        },
        &[],
    );
    assert_eq!(err, 11, "{}", text(&answer));
    assert!(text(&answer).contains("not registered"));
    assert!(took < Duration::from_secs(5));
    let unserved =
        rbgctl::mooncake::coro_rpc::function_id("mooncake::WrappedMasterService::BatchQueryIp");
    let (err, answer, _) = ask(
        RequestHeader {
            seq_num: 8,
            function_id: unserved,
            ..Default::default()
        },
        &[],
    );
    assert_eq!(err, 11);
    assert!(text(&answer).contains("BatchQueryIp"), "{}", text(&answer));
    // ExistKey's type hash with a body that is not its arguments.
    let sig = TypeSig::of::<(String, String)>();
    let mut lying = sig.write(&("k".to_string(), "default".to_string()));
    lying.truncate(lying.len() - 3);
    let (err, answer, _) = ask(
        RequestHeader {
            seq_num: 9,
            function_id: Rpc::ExistKey.id(),
            length: lying.len() as u32,
            ..Default::default()
        },
        &lying,
    );
    assert_eq!(err, 4, "{}", text(&answer));
    // A body of 4 GiB announced: refused before a byte of it is read.
    let (err, answer, took) = ask(
        RequestHeader {
            seq_num: 10,
            function_id: Rpc::ExistKey.id(),
            length: u32::MAX,
            ..Default::default()
        },
        &[],
    );
    assert_eq!(err, 14, "{}", text(&answer));
    assert!(took < Duration::from_secs(5));
    // Another tenant: Mooncake's TENANT_NOT_REGISTERED, inside the RPC's own result.
    let body = sig.write(&("k".to_string(), "other".to_string()));
    let (err, answer, _) = ask(
        RequestHeader {
            seq_num: 11,
            function_id: Rpc::ExistKey.id(),
            length: body.len() as u32,
            ..Default::default()
        },
        &body,
    );
    assert_eq!(err, 0);
    let result: Result<bool, i32> = TypeSig::of::<Result<bool, i32>>().read(&answer).unwrap();
    assert_eq!(result, Err(-1701));
    // A batch answers item by item, in its own type: lists of unequal length are each
    // item's INVALID_PARAMS; a pool without room is each item's NO_AVAILABLE_HANDLE.
    use rbgctl::mooncake::types::{ReplicaDescriptor, ReplicateConfig, Uuid};
    type Started = Vec<Result<Vec<ReplicaDescriptor>, i32>>;
    let keys: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    for (seq, lens, code) in [(14, vec![1u64, 2], -600), (15, vec![1u64, 2, 3], -200)] {
        let puts = (
            Uuid(1, 2),
            keys.clone(),
            lens,
            ReplicateConfig::default(),
            "default".to_string(),
        );
        let body =
            TypeSig::of::<(Uuid, Vec<String>, Vec<u64>, ReplicateConfig, String)>().write(&puts);
        let (err, answer, _) = ask(
            RequestHeader {
                seq_num: seq,
                function_id: Rpc::BatchPutStart.id(),
                length: body.len() as u32,
                ..Default::default()
            },
            &body,
        );
        assert_eq!(err, 0);
        assert_eq!(
            TypeSig::of::<Started>().read::<Started>(&answer).unwrap(),
            vec![Err(code); 3]
        );
    }
    // Half a frame, then nothing: closed within the request timeout (1 s here), not held.
    let mut half = std::net::TcpStream::connect(&c.rpc).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let head = RequestHeader {
        seq_num: 12,
        function_id: Rpc::ExistKey.id(),
        length: 8,
        ..Default::default()
    };
    half.write_all(&head.encode()).unwrap();
    let t0 = std::time::Instant::now();
    // Meanwhile a well-formed request on another connection is answered.
    let body = sig.write(&("nothing".to_string(), "default".to_string()));
    let (err, answer, _) = ask(
        RequestHeader {
            seq_num: 13,
            function_id: Rpc::ExistKey.id(),
            length: body.len() as u32,
            ..Default::default()
        },
        &body,
    );
    assert_eq!(err, 0);
    assert_eq!(
        TypeSig::of::<Result<bool, i32>>().read::<Result<bool, i32>>(&answer),
        Ok(Ok(false))
    );
    let mut rest = Vec::new();
    let _ = half.read_to_end(&mut rest);
    let held = t0.elapsed();
    assert!(
        held < Duration::from_secs(10),
        "a half frame held the connection {held:?}"
    );
    assert_eq!(
        c.master_metric("rbgctl_master_mooncake_unserved_requests_total"),
        Some(2.0)
    );
    assert_eq!(
        c.master_metric("rbgctl_master_mooncake_bad_requests_total"),
        Some(2.0),
        "the lying body and the 4 GiB one"
    );
}

/// Hostile input on a store's Mooncake ports: Transfer Engine requests outside the segment, of
/// 0 bytes, with an unknown opcode, or writing over an object the store records, are refused
/// (v2: the refusal frame, then a close; v1: a close) before a byte moves; a 1 GiB handshake
/// and garbage are refused; the store goes on serving, and nothing it holds changed.
#[test]
fn a_stores_mooncake_ports_refuse_hostile_input() {
    use rbgctl::mooncake::handshake;
    use rbgctl::mooncake::te_tcp::{Op, SessionHeader, SEGMENT_BASE, STATUS_OK, STATUS_REFUSED};
    use std::io::{Read, Write};
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let client = c.client();
    client
        .put("kept", &[7u8; 8192], &ReplicateConfig::default())
        .unwrap();
    let (desc, segments) = client.describe("kept").unwrap();
    let seg = &segments
        .iter()
        .find(|s| s.id == desc.replicas[0].segment_id)
        .unwrap()
        .info;
    assert!(
        !seg.te_endpoint.is_empty(),
        "the store serves no Transfer Engine"
    );
    let host = seg.te_endpoint.rsplit_once(':').unwrap().0.to_string();
    let data = format!("{host}:{}", seg.te_data_port);
    let kept_at = SEGMENT_BASE + desc.replicas[0].offset;
    let request = |h: SessionHeader, payload: &[u8]| -> (Vec<u8>, bool) {
        let mut s = std::net::TcpStream::connect(&data).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&h.encode()).unwrap();
        let _ = s.write_all(payload);
        let mut answer = Vec::new();
        let closed = s.read_to_end(&mut answer).is_ok();
        (answer, closed)
    };
    let v2 = |op, addr, size| SessionHeader {
        size,
        addr,
        op,
        v2: true,
    };
    let refused = STATUS_REFUSED.to_le_bytes().to_vec();
    for (why, h) in [
        (
            "past the end",
            v2(Op::Read, SEGMENT_BASE + seg.size - 8, 16),
        ),
        ("below the base", v2(Op::Write, SEGMENT_BASE - 4096, 8)),
        ("wrapping around", v2(Op::Read, u64::MAX - 4, 64)),
        ("empty", v2(Op::Read, SEGMENT_BASE, 0)),
        ("over a recorded object", v2(Op::Write, kept_at + 4096, 8)),
    ] {
        let (answer, closed) = request(h, &[1u8; 8]);
        assert_eq!(answer, refused, "{why}");
        assert!(closed, "{why}: not closed");
    }
    // v1 has no status frames: a refused request is a close.
    let (answer, closed) = request(
        SessionHeader {
            v2: false,
            ..v2(Op::Write, kept_at, 8)
        },
        &[1u8; 8],
    );
    assert!(answer.is_empty() && closed);
    // An unknown opcode, and garbage.
    let mut bad = v2(Op::Read, SEGMENT_BASE, 8).encode();
    bad[16] = 0x85;
    let mut s = std::net::TcpStream::connect(&data).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&bad).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, refused);
    // A handshake announcing 1 GiB is refused without reading it.
    let mut s = std::net::TcpStream::connect(&seg.te_endpoint).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&(1u64 << 30).to_le_bytes()).unwrap();
    s.write_all(&[1u8; 4096]).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(answer.is_empty());
    // Other clients are served: a good handshake, and a read of the kept object's bytes.
    let mut s = std::net::TcpStream::connect(&seg.te_endpoint).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&handshake::frame(
        handshake::METADATA,
        &serde_json::json!({"name": "probe"}),
    ))
    .unwrap();
    let (kind, descriptor) = handshake::read_frame(&mut s).unwrap();
    assert_eq!(kind, handshake::METADATA);
    assert_eq!(descriptor["name"], seg.te_endpoint.as_str());
    assert_eq!(descriptor["tcp_data_port"], seg.te_data_port);
    let mut s = std::net::TcpStream::connect(&data).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&v2(Op::Read, kept_at, 8192).encode()).unwrap();
    let mut answer = vec![0u8; 8 + 8192];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(answer[..8], STATUS_OK.to_le_bytes());
    assert!(answer[8..].iter().all(|&b| b == 7));
    assert_eq!(client.get("kept").unwrap(), vec![7u8; 8192]);
    assert!(
        c.store_metric(0, "rbgctl_store_mooncake_transfers_refused_total")
            .unwrap()
            >= 7.0
    );
    assert!(
        c.store_metric(0, "rbgctl_store_mooncake_handshakes_refused_total")
            .unwrap()
            >= 1.0
    );
}

/// A wheel process with a global segment (as `mooncake_store_service` and SGLang ranks run)
/// contributes memory to rbgctl's master beside an rbgctl store: another wheel client's puts
/// placed there are written and read through the holder's own Transfer Engine, and rbgctl's
/// client reads them the same way. The holder is
/// killed: within the client TTL no replica on it is handed out (the objects are gone, as with
/// Mooncake), and what rbgctl's client put on its store is untouched.
#[test]
fn a_wheel_processs_segment_is_a_placement_target_until_its_process_goes() {
    let Some(python) = common::wheel::python() else {
        return;
    };
    let c = Cluster::start(Opts {
        stores: 1,
        master: rbgctl::master::config::MasterConfig {
            client_ttl_ms: rbgctl::config::Millis(Duration::from_secs(2)),
            ..Default::default()
        },
        ..Default::default()
    });
    let client = c.client();
    client
        .put("rb/kept", b"on rbgctl's store", &ReplicateConfig::default())
        .unwrap();
    // The holder: a wheel process with a 64 MiB global segment, up until killed.
    let holder_script = format!(
        "import sys\n\
         from mooncake.store import MooncakeDistributedStore as S\n\
         s = S()\n\
         print('setup', s.setup('127.0.0.1', 'P2PHANDSHAKE', 64 << 20, 16 << 20, 'tcp', '', \
         '{rpc}'), flush=True)\n\
         sys.stdin.read()\n",
        rpc = c.rpc
    );
    let mut holder = Wheel::start(&python, &holder_script);
    assert_eq!(holder.line(), "setup 0");
    let mounted = || mooncake_segment(&client);
    assert!(
        wait_until(Duration::from_secs(10), || mounted().is_some()),
        "the holder's segment was not mounted: {:?}",
        client.segments()
    );
    let seg = mounted().unwrap();
    assert_eq!(seg.info.size, 64 << 20);
    assert!(!seg.info.te_endpoint.is_empty());
    // Another wheel client puts there (preferring the holder's segment) and reads back.
    let script = format!(
        "import os\n\
         from mooncake.store import MooncakeDistributedStore as S, ReplicateConfig\n\
         s = S()\n\
         print('setup', s.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', '', '{rpc}'))\n\
         c = ReplicateConfig()\n\
         c.preferred_segment = '{name}'\n\
         vals = {{'held/%d' % i: os.urandom(65536) for i in range(20)}}\n\
         print('put', set(s.put(k, v, c) for k, v in vals.items()))\n\
         print('get', all(s.get(k) == v for k, v in vals.items()))\n\
         s.close()\n",
        rpc = c.rpc,
        name = seg.info.name
    );
    let said = wheel(&script).expect("the wheel runs");
    assert_eq!(line_of(&said, "setup"), "setup 0", "{said}");
    assert_eq!(line_of(&said, "put"), "put {0}", "{said}");
    assert_eq!(line_of(&said, "get"), "get True", "{said}");
    let used = client
        .segments()
        .unwrap()
        .into_iter()
        .find(|s| s.id == seg.id)
        .unwrap()
        .used;
    assert!(
        used >= 20 * 65536,
        "the puts did not land on the holder: {used}"
    );
    // rbgctl's clients read it too, through the holder's Transfer Engine (the objects are
    // unhashed: nothing took a CRC of them), and their own puts work beside it.
    assert_eq!(client.get("held/0").unwrap().len(), 65536);
    for i in 0..20 {
        client
            .put(&format!("rb/{i}"), b"rbgctl", &ReplicateConfig::default())
            .unwrap();
        assert_eq!(client.get(&format!("rb/{i}")).unwrap(), b"rbgctl");
    }
    // The holder dies: its segment and objects go within the client TTL.
    holder.kill();
    assert!(
        wait_until(Duration::from_secs(15), || mounted().is_none()),
        "the dead holder's segment is still mounted"
    );
    let script = format!(
        "from mooncake.store import MooncakeDistributedStore as S\n\
         s = S()\n\
         print('setup', s.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', '', '{rpc}'))\n\
         print('held', s.is_exist('held/0'), len(s.get('held/0')))\n\
         print('kept', s.get('rb/kept'))\n\
         s.close()\n",
        rpc = c.rpc
    );
    let said = wheel(&script).expect("the wheel runs");
    assert_eq!(line_of(&said, "held"), "held 0 0", "{said}");
    assert_eq!(
        line_of(&said, "kept"),
        "kept b\"on rbgctl's store\"",
        "{said}"
    );
    assert_eq!(client.get("rb/kept").unwrap(), b"on rbgctl's store");
}

/// A mixed pool both ways (issue 63, item 4): a wheel process with a global segment, set up
/// in each discovery mode in turn, puts onto its own segment and rbgctl's Rust client, its
/// Python client and `rbgctl kv get` read it (through the process's Transfer Engine, the
/// object unhashed); `rbgctl kv put`, the Rust client and the Python client put onto that
/// segment and the wheel reads what they wrote.
#[test]
fn rbgctls_clients_read_and_write_a_wheel_processs_segment_in_both_discovery_modes() {
    let Some(python) = common::wheel::python() else {
        return;
    };
    let c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let http = format!("http://127.0.0.1:{}/metadata", c.metadata_port);
    for (mode, metadata) in [("p2p", "P2PHANDSHAKE"), ("http", http.as_str())] {
        // The holder: puts `KEY` as `N` bytes of `B` onto its own segment, reads keys back.
        let holder_script = format!(
            "import sys\n\
             from mooncake.store import MooncakeDistributedStore as S, ReplicateConfig\n\
             s = S()\n\
             print('setup', s.setup('127.0.0.1', '{metadata}', 64 << 20, 16 << 20, 'tcp', '', \
             '{rpc}'), flush=True)\n\
             for line in sys.stdin:\n\
             \x20   w = line.split()\n\
             \x20   if w[0] == 'put':\n\
             \x20       c = ReplicateConfig()\n\
             \x20       c.preferred_segment = w[4]\n\
             \x20       print('put', w[1], s.put(w[1], bytes([int(w[3])]) * int(w[2]), c), flush=True)\n\
             \x20   else:\n\
             \x20       v = s.get(w[1])\n\
             \x20       print('got', w[1], len(v), v.hex() if len(v) <= 64 else sorted(set(v)), \
             flush=True)\n\
             s.close()\n",
            rpc = c.rpc
        );
        let mut holder = Wheel::start(&python, &holder_script);
        assert_eq!(holder.line(), "setup 0", "{mode}");
        let client = {
            let mut cfg = rbgctl::client::ClientConfig::new(c.rpc.clone());
            cfg.same_host_shm = false;
            cfg.mooncake_discovery = rbgctl::client::Discovery::parse(metadata);
            rbgctl::client::Client::connect(cfg).unwrap()
        };
        let mounted = || mooncake_segment(&client);
        assert!(
            wait_until(Duration::from_secs(10), || mounted().is_some()),
            "{mode}: the holder's segment was not mounted"
        );
        let seg = mounted().unwrap();
        let on_holder = |key: &str| {
            let (desc, _) = client.describe(key).unwrap();
            desc.replicas.iter().all(|r| r.segment_id == seg.id)
        };

        // The wheel's put on its own segment, read by rbgctl's clients.
        let key = format!("{mode}/by-wheel");
        holder.send(&format!("put {key} 65536 7 {}", seg.info.name));
        assert_eq!(holder.line(), format!("put {key} 0"));
        let (desc, _) = client.describe(&key).unwrap();
        assert!(on_holder(&key) && desc.unhashed, "{desc:?}");
        assert_eq!(client.get(&key).unwrap(), vec![7u8; 65536], "{mode}");
        let kv = |args: &[&str]| {
            let out = Command::new(common::BIN)
                .arg("kv")
                .args(["--master", &c.rpc, "--mooncake-metadata-server", metadata])
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "rbgctl kv {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        assert_eq!(kv(&["get", &key]), vec![7u8; 65536], "{mode}");

        // rbgctl's puts onto the holder's segment, read back by rbgctl and by the wheel.
        let by_cli = format!("{mode}/by-kv");
        kv(&[
            "put",
            "--preferred-segment",
            &seg.info.name,
            &by_cli,
            "put by rbgctl kv",
        ]);
        assert!(
            on_holder(&by_cli),
            "{mode}: rbgctl kv put did not land on the holder"
        );
        let by_rust = format!("{mode}/by-rust");
        let big = vec![0x5au8; 1 << 20];
        let prefer = ReplicateConfig {
            preferred_segment: seg.info.name.clone(),
            ..Default::default()
        };
        client.put(&by_rust, &big, &prefer).unwrap();
        assert!(on_holder(&by_rust), "{mode}");
        assert!(!client.describe(&by_rust).unwrap().0.unhashed);
        assert_eq!(client.get(&by_rust).unwrap(), big);
        holder.send(&format!("get {by_cli}"));
        let text = "put by rbgctl kv";
        let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(holder.line(), format!("got {by_cli} {} {hex}", text.len()));
        holder.send(&format!("get {by_rust}"));
        assert_eq!(holder.line(), format!("got {by_rust} {} [90]", 1 << 20));

        // The Python client: reads the wheel's put, puts onto the holder, the wheel reads it.
        if let Some(py) = std::env::var_os("RBGCTL_PYTHON") {
            let script = format!(
                "import rbgctl\n\
                 from rbgctl.protocol import ReplicateConfig\n\
                 cfg = rbgctl.ClientConfig(master='{rpc}', same_host_shm=False, \
                 metadata_server='{metadata}')\n\
                 with rbgctl.Client(cfg) as c:\n\
                 \x20   print('read', bytes(c.get('{key}')) == bytes([7]) * 65536)\n\
                 \x20   c.put('{mode}/by-python', bytes([3]) * 262144, \
                 ReplicateConfig(preferred_segment='{seg}'))\n\
                 \x20   print('reread', bytes(c.get('{mode}/by-python')) == bytes([3]) * 262144)\n",
                rpc = c.rpc,
                seg = seg.info.name
            );
            let out = Command::new(py).args(["-c", &script]).output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                said.contains("read True") && said.contains("reread True"),
                "{said}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(on_holder(&format!("{mode}/by-python")), "{mode}");
            holder.send(&format!("get {mode}/by-python"));
            assert_eq!(holder.line(), format!("got {mode}/by-python 262144 [3]"));
        } else {
            common::skip("RBGCTL_PYTHON (rbgctl's Python client) is not set");
        }

        // The holder leaves (UnmountSegment): its segment and objects go with it.
        holder.finish();
        assert!(
            wait_until(Duration::from_secs(15), || mounted().is_none()),
            "{mode}: the holder's segment is still mounted"
        );
        assert!(client.get(&by_rust).is_err());
    }
}

/// The master is killed (SIGKILL) and started again on its ports under a connected wheel
/// process with a global segment and a connected wheel client: the holder's Pings are answered
/// NEED_REMOUNT by the new master, it remounts its segment, the client's puts resume, and
/// what the wheel put on rbgctl's persistent store before the kill is still there (the store
/// reported it to the new master).
#[test]
fn after_a_master_restart_the_wheel_remounts_and_what_it_put_on_rbgctls_store_stays() {
    let Some(python) = common::wheel::python() else {
        return;
    };
    let mut c = Cluster::start(Opts {
        stores: 1,
        ..Default::default()
    });
    let client = c.client();
    // One wheel process holds a segment and, told a line at a time, puts a key (on rbgctl's
    // store, by preference) and reads it back.
    let mut wheel = common::wheel::putter(&python, &c.rpc.to_string());
    assert_eq!(wheel.line(), "setup 0");
    let store_name = || {
        client
            .segments()
            .ok()?
            .into_iter()
            .find(|s| !s.info.endpoint.is_empty())
            .map(|s| s.info.name)
    };
    let wheel_mounted = |client: &rbgctl::client::Client| {
        client
            .segments()
            .is_ok_and(|v| v.iter().any(|s| s.info.endpoint.is_empty()))
    };
    assert!(wait_until(Duration::from_secs(10), || wheel_mounted(
        &client
    )));
    let store = store_name().unwrap();
    wheel.send(&format!("before {store}"));
    assert_eq!(wheel.line(), "put before 0 True");
    c.restart_master();
    let client = c.client();
    // The holder remounts (its Ping answered NEED_REMOUNT), the store reports its objects.
    assert!(
        wait_until(Duration::from_secs(20), || wheel_mounted(&client)),
        "the wheel did not mount its segment again: {:?}",
        client.segments()
    );
    assert!(wait_until(Duration::from_secs(20), || client
        .exists("before")
        .unwrap_or(false)));
    assert_eq!(client.get("before").unwrap(), b"before".repeat(100));
    // Puts resume, on the store and on the wheel's own segment.
    wheel.send(&format!("after {store}"));
    assert_eq!(wheel.line(), "put after 0 True");
    let on_wheel = client
        .segments()
        .unwrap()
        .into_iter()
        .find(|s| s.info.endpoint.is_empty())
        .unwrap()
        .info
        .name;
    wheel.send(&format!("on-wheel {on_wheel}"));
    assert_eq!(wheel.line(), "put on-wheel 0 True");
}

/// `rbgctl mooncake-wire` checks a wheel against the master: every RPC the wheel called in
/// its script carried the request type hash the master decodes (the pinned wheel speaks what
/// the master serves), and the report says which RPCs it did not call.
#[test]
fn mooncake_wire_finds_the_pinned_wheel_in_agreement_with_the_master() {
    let Some(python) = std::env::var_os("RBGCTL_MOONCAKE_PYTHON") else {
        common::skip("RBGCTL_MOONCAKE_PYTHON (the Mooncake wheel's interpreter) is not set");
        return;
    };
    let out = Command::new("timeout")
        .arg("300")
        .arg(common::BIN)
        .arg("mooncake-wire")
        .arg("--python")
        .arg(&python)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<rbgctl::mooncake::master::WireRow> = serde_json::from_slice(&out.stdout).unwrap();
    let row = |name: &str| rows.iter().find(|r| r.rpc == name).unwrap().clone();
    for called in [
        "MountSegment",
        "Ping",
        "FetchTasks",
        "ExistKey",
        "BatchExistKey",
        "GetReplicaList",
        "BatchGetReplicaList",
        "PutStart",
        "PutEnd",
        "BatchPutStart",
        "BatchPutEnd",
        "UpsertStart",
        "UpsertEnd",
        "Remove",
        "BatchRemove",
        "RemoveAll",
        "UnmountSegment",
    ] {
        let r = row(called);
        assert!(
            r.seen_type_hash.is_some() && r.seen_type_hash == r.request_type_hash,
            "{called}: {r:?}"
        );
        assert_eq!(
            r.function_id,
            rbgctl::mooncake::coro_rpc::function_id(&format!(
                "mooncake::WrappedMasterService::{called}"
            ))
        );
    }
    // Every RPC of the table is served now, the regex ones too.
    assert!(row("GetReplicaListByRegex").served && row("RemoveByRegex").served);
    // The table says the same in words.
    let text = rbgctl::bench::mooncake_wire::table(&rows);
    assert!(
        text.contains("PutStart") && !text.contains("DIFFERS"),
        "{text}"
    );
}

/// Issue 66, item 3: Mooncake's `tenant_id` is a namespace of rbgctl's pool. The wheel set up
/// with `tenant_id='a'` reads and writes a's objects (what rbgctl's client of tenant a put,
/// and the other way round), sees nobody else's, is refused at a's quota with Mooncake's
/// `TENANT_QUOTA_EXCEEDED` and clears only a's objects; a tenant the master does not serve is
/// `TENANT_NOT_REGISTERED`.
#[test]
fn mooncakes_tenant_id_is_a_namespace_with_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(
        &file,
        "[[tenant]]\nname = \"a\"\nquota = \"1MiB\"\n[[tenant]]\nname = \"b\"\n",
    )
    .unwrap();
    let c = Cluster::start(Opts {
        stores: 1,
        master: rbgctl::master::config::MasterConfig {
            tenants_file: Some(file),
            ..Default::default()
        },
        ..Default::default()
    });
    let (default, a) = (c.client(), c.client_as("a"));
    let one = ReplicateConfig::default();
    default.put("shared", b"default's", &one).unwrap();
    default.put("only-default", b"x", &one).unwrap();
    a.put("shared", b"a's", &one).unwrap();
    let script = format!(
        r#"
from mooncake.store import MooncakeDistributedStore as S
s = S()
print('setup', s.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', '', '{rpc}', tenant_id='a'))
print('shared', s.get('shared'))
print('others', s.is_exist('only-default'), list(s.batch_is_exist(['shared', 'only-default'])))
print('put', s.put('from-wheel', b'put by the wheel in a'))
print('fits', s.put('big/0', b'x' * (600 << 10)))
print('over', s.put('big/1', b'x' * (600 << 10)))
print('remove_all', s.remove_all())
print('after', s.is_exist('from-wheel'), s.is_exist('big/0'))
s.close()
z = S()
print('z_setup', z.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', '', '{rpc}', tenant_id='z'))
print('z_put', z.put('k', b'v'))
z.close()
"#,
        rpc = c.rpc
    );
    let Some(said) = wheel(&script) else { return };
    let line = |name: &str| line_of(&said, name);
    assert_eq!(line("setup"), "setup 0", "{said}");
    assert_eq!(line("shared"), "shared b\"a's\"", "{said}");
    assert_eq!(line("others"), "others 0 [1, 0]", "{said}");
    assert_eq!(line("put"), "put 0", "{said}");
    assert_eq!(line("fits"), "fits 0", "{said}");
    // Mooncake's TENANT_QUOTA_EXCEEDED.
    assert_eq!(line("over"), "over -1700", "{said}");
    assert_eq!(line("z_setup"), "z_setup 0", "{said}");
    // Mooncake's TENANT_NOT_REGISTERED.
    assert_eq!(line("z_put"), "z_put -1701", "{said}");
    // from-wheel and big/0 were a's (its shared is under the wheel's read lease, which a
    // remove_all without force leaves, as Mooncake's does); the default tenant's stay.
    assert_eq!(line("remove_all"), "remove_all 2", "{said}");
    assert_eq!(line("after"), "after 0 0", "{said}");
    assert_eq!(a.get("shared").unwrap(), b"a's");
    assert_eq!(default.get("shared").unwrap(), b"default's");
    assert!(default.exists("only-default").unwrap());
    assert!(!default.exists("from-wheel").unwrap());
    assert_eq!(
        c.master_metric(r#"rbgctl_master_tenant_quota_refusals_total{tenant="a"}"#),
        Some(1.0)
    );
}
