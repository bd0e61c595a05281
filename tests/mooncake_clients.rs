//! Mooncake's own client (the PyPI wheel `.ci/run` installs, unchanged) against rbgctl's
//! master on its one RPC port, beside rbgctl's own clients (issue 63).

mod common;

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
/// put, and is told Mooncake's own codes for what is missing or not served yet; rbgctl's
/// client sees what the wheel did.
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
         print('put', s.put('mc/k', b'not yet'))\n\
         print('put_batch', s.put_batch(['mc/a', 'mc/b'], [b'1', b'2']))\n\
         print('get', len(s.get('rb/kept')))\n\
         s.close()\n",
        meta = c.metadata_port,
        rpc = c.rpc
    );
    let Some(said) = wheel(&script) else { return };
    let line = |name: &str| -> String {
        said.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} line in:\n{said}"))
            .to_string()
    };
    assert_eq!(line("setup"), "setup 0", "{said}");
    assert_eq!(line("exists"), "exists 1 0", "{said}");
    assert_eq!(line("batch"), "batch [1, 0, 1]", "{said}");
    // Mooncake's OBJECT_NOT_FOUND.
    assert_eq!(line("remove_missing"), "remove_missing -704", "{said}");
    assert_eq!(line("remove"), "remove 0", "{said}");
    assert_eq!(line("after"), "after 0", "{said}");
    // Puts and gets are not served yet: refused at once with an error, never a hang.
    assert_ne!(line("put"), "put 0", "{said}");
    assert_ne!(line("put_batch"), "put_batch 0", "{said}");
    assert_eq!(line("get"), "get 0", "{said}");
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
    assert_eq!(count("ExistKey", "ok"), 3.0);
    assert_eq!(count("Remove", "error"), 1.0, "the missing key");
    assert!(
        c.master_metric("rbgctl_master_mooncake_connections_total")
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
    // A batch RPC not served yet answers each item NOT_SUPPORTED, in the batch's own type.
    use rbgctl::mooncake::types::{ReplicaDescriptor, ReplicateConfig, Uuid};
    type Started = Vec<Result<Vec<ReplicaDescriptor>, i32>>;
    let keys: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let puts = (
        Uuid(1, 2),
        keys,
        vec![1u64, 2, 3],
        ReplicateConfig::default(),
        "default".to_string(),
    );
    let body = TypeSig::of::<(Uuid, Vec<String>, Vec<u64>, ReplicateConfig, String)>().write(&puts);
    let (err, answer, _) = ask(
        RequestHeader {
            seq_num: 14,
            function_id: Rpc::BatchPutStart.id(),
            length: body.len() as u32,
            ..Default::default()
        },
        &body,
    );
    assert_eq!(err, 0);
    assert_eq!(
        TypeSig::of::<Started>().read::<Started>(&answer).unwrap(),
        vec![Err(-1012); 3]
    );
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
