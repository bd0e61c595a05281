//! Mooncake's master RPC against frames the real 0.3.13.post1 wheel and its master exchanged on
//! loopback (`tests/vectors/mooncake/`, hex dumps of whole coro_rpc frames): each request
//! decodes into rbgctl's types and encodes again byte for byte, and each answer rbgctl would
//! write for the decoded values is the one the wheel's master wrote.

use rbgctl::mooncake::coro_rpc::{
    response, Errc, RequestHeader, ResponseHeader, REQUEST_HEADER_LEN, RESPONSE_HEADER_LEN,
};
use rbgctl::mooncake::rpcs::{handler, Handler, Rpc, SERVICE_VERSION};
use rbgctl::mooncake::struct_pack::{Pack, TypeSig};
use rbgctl::mooncake::types::*;
use std::path::Path;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/mooncake");

/// A hex dump (`0000  15 00 …` lines) as bytes.
fn frame(name: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(Path::new(DIR).join(name)).expect(name);
    text.lines()
        .flat_map(|line| line.split_whitespace().skip(1))
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

/// The request `name`: its RPC and body, checked to decode as `A` and encode again the same.
fn request<A: Pack + std::fmt::Debug>(name: &str, rpc: Rpc) -> A {
    let f = frame(name);
    let head = RequestHeader::decode(f[..REQUEST_HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(
        handler(head.function_id),
        Some(Handler::Served(rpc)),
        "{name}"
    );
    let body = &f[REQUEST_HEADER_LEN..];
    assert_eq!(body.len(), head.length as usize, "{name}");
    let sig = TypeSig::of::<A>();
    let args: A = sig.read(body).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        sig.write(&args),
        body,
        "{name}: {args:?} encodes again as sent"
    );
    args
}

/// The answer `name`, checked to be what rbgctl writes for `value` to the request `seq`.
fn answer<R: Pack + std::fmt::Debug + PartialEq>(name: &str, value: R) {
    let f = frame(name);
    let head = ResponseHeader::decode(f[..RESPONSE_HEADER_LEN].try_into().unwrap()).unwrap();
    let sig = TypeSig::of::<R>();
    let body = &f[RESPONSE_HEADER_LEN..];
    assert_eq!(sig.read::<R>(body).unwrap(), value, "{name}: decoded");
    assert_eq!(
        response(head.seq_num, Errc::Ok, &sig.write(&value)),
        f,
        "{name}: rbgctl's answer is the wheel master's"
    );
}

#[test]
fn a_clients_first_calls_and_a_put_get_remove_are_the_captured_frames() {
    assert!(frame("00_ServiceReady_request.hex")[REQUEST_HEADER_LEN..].is_empty());
    let head = RequestHeader::decode(
        frame("00_ServiceReady_request.hex")[..REQUEST_HEADER_LEN]
            .try_into()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        handler(head.function_id),
        Some(Handler::Served(Rpc::ServiceReady))
    );
    answer::<Result<String, i32>>(
        "00_ServiceReady_response.hex",
        Ok(SERVICE_VERSION.to_string()),
    );
    answer::<Result<GetStorageConfigResponse, i32>>(
        "01_GetStorageConfig_response.hex",
        Ok(GetStorageConfigResponse {
            fsdir: String::new(),
            enable_disk_eviction: true,
            quota_bytes: 0,
        }),
    );

    let (client, key, len, config, tenant) = request::<(Uuid, String, u64, ReplicateConfig, String)>(
        "02_PutStart_request.hex",
        Rpc::PutStart,
    );
    assert_eq!(
        (key.as_str(), len, tenant.as_str()),
        ("k1", 1039, "default")
    );
    assert_eq!(config.replica_num, 1);
    assert_ne!(client, Uuid::default());
    // The master placed it at the segment's base, in the writer's own process.
    let placed = ReplicaDescriptor {
        id: 1,
        placement: Placement::Memory(BufferDescriptor {
            size: 1039,
            buffer_address: 0x7fd4_7500_0000,
            protocol: "tcp".into(),
            transport_endpoint: "127.0.0.1:61101".into(),
        }),
        status: replica_status::PROCESSING,
    };
    answer::<Result<Vec<ReplicaDescriptor>, i32>>(
        "02_PutStart_response.hex",
        Ok(vec![placed.clone()]),
    );

    let (end_client, meta, replica, tenant) =
        request::<(Uuid, ObjectMeta, i32, String)>("03_PutEnd_request.hex", Rpc::PutEnd);
    assert_eq!(end_client, client);
    assert_eq!(meta.key, "k1");
    assert_eq!((replica, tenant.as_str()), (replica_type::ALL, "default"));
    answer::<Result<(), i32>>("03_PutEnd_response.hex", Ok(()));

    let (key, _) = request::<(String, String)>("04_ExistKey_request.hex", Rpc::ExistKey);
    assert_eq!(key, "k1");
    answer::<Result<bool, i32>>("04_ExistKey_response.hex", Ok(true));

    request::<(String, String)>("05_GetReplicaList_request.hex", Rpc::GetReplicaList);
    answer::<Result<GetReplicaListResponse, i32>>(
        "05_GetReplicaList_response.hex",
        Ok(GetReplicaListResponse {
            replicas: vec![ReplicaDescriptor {
                status: replica_status::COMPLETE,
                ..placed
            }],
            lease_ttl_ms: 10_000,
            object_checksum: None,
        }),
    );

    let (missing, _) =
        request::<(String, String)>("06_ExistKey_missing_request.hex", Rpc::ExistKey);
    assert_ne!(missing, "k1");
    answer::<Result<bool, i32>>("06_ExistKey_missing_response.hex", Ok(false));

    let (key, force, _) = request::<(String, bool, String)>("07_Remove_request.hex", Rpc::Remove);
    assert_eq!((key.as_str(), force), ("k1", false));
    // Within the read lease the get took, a remove is refused with Mooncake's own code.
    answer::<Result<(), i32>>("07_Remove_response.hex", Err(error_code::OBJECT_HAS_LEASE));
    request::<(String, String)>("08_ExistKey_after_remove_request.hex", Rpc::ExistKey);
    answer::<Result<bool, i32>>("08_ExistKey_after_remove_response.hex", Ok(true));
}
