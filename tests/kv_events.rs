//! KV events byte for byte as SGLang writes and reads them: the batches below are encoded by
//! SGLang 0.5.23's own classes (`sglang.srt.disaggregation.kv_events`, msgspec) and by
//! rbgctl; the bytes must be the same, rbgctl must decode SGLang's to the same events, and
//! SGLang's typed decoder must take rbgctl's. Needs an interpreter with SGLang in
//! `$RBGCTL_SGLANG_PYTHON` (`.ci/run` makes one in target/ci-sglang).

mod common;

use rbgctl::kv_events::{BlockRemoved, BlockStored, KvEvent, KvEventBatch, Medium};
use std::io::Write;
use std::process::{Command, Stdio};

/// SGLang's side: its encodings of the same batches, then, for each of rbgctl's (one hex line
/// each on stdin), whether its typed decoder takes it back to the same bytes.
const SGLANG: &str = r#"
import sys, msgspec
from sglang.srt.disaggregation import kv_events as k
batches = [
    k.KVEventBatch(ts=1.5, events=[
        k.BlockStored(block_hashes=[1, -2, 2**40], parent_block_hash=None,
                      token_ids=[1, 2, 3, 300], block_size=4, lora_id=None, medium="GPU"),
        k.BlockRemoved(block_hashes=[7], medium="CPU_PINNED"),
        k.AllBlocksCleared(),
    ], attn_dp_rank=0),
    k.KVEventBatch(ts=1700000000.25, events=[
        k.BlockStored(block_hashes=[-(2**63), 2**63 - 1], parent_block_hash=-5,
                      token_ids=list(range(70000, 70016)), block_size=16, lora_id=3,
                      medium="EXTERNAL", cache_salt="s", session_id="sess", lora_name="ad"),
    ], attn_dp_rank=None),
    k.KVEventBatch(ts=0.0, events=[
        k.BlockRemoved(block_hashes=[], medium="DISK"),
        k.BlockStored(block_hashes=[5], parent_block_hash=4, token_ids=[], block_size=1,
                      lora_id=None),
    ], attn_dp_rank=7),
]
enc = msgspec.msgpack.Encoder()
dec = msgspec.msgpack.Decoder(k.KVEventBatch)
for b in batches:
    print(enc.encode(b).hex())
for line in sys.stdin.read().split():
    raw = bytes.fromhex(line)
    again = enc.encode(dec.decode(raw))
    print("same" if again == raw else "differs " + again.hex())
"#;

fn stored(hashes: Vec<i64>, parent: Option<i64>, tokens: Vec<u32>, size: u32) -> BlockStored {
    BlockStored {
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: size,
        lora_id: None,
        medium: None,
        cache_salt: None,
        session_id: None,
        lora_name: None,
    }
}

fn batches() -> Vec<KvEventBatch> {
    vec![
        KvEventBatch {
            ts: 1.5,
            events: vec![
                KvEvent::BlockStored(BlockStored {
                    medium: Some(Medium::Gpu),
                    ..stored(vec![1, -2, 1 << 40], None, vec![1, 2, 3, 300], 4)
                }),
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![7],
                    medium: Some(Medium::CpuPinned),
                }),
                KvEvent::AllBlocksCleared,
            ],
            attn_dp_rank: Some(0),
        },
        KvEventBatch {
            ts: 1_700_000_000.25,
            events: vec![KvEvent::BlockStored(BlockStored {
                lora_id: Some(3),
                medium: Some(Medium::External),
                cache_salt: Some("s".into()),
                session_id: Some("sess".into()),
                lora_name: Some("ad".into()),
                ..stored(
                    vec![i64::MIN, i64::MAX],
                    Some(-5),
                    (70_000..70_016).collect(),
                    16,
                )
            })],
            attn_dp_rank: None,
        },
        KvEventBatch {
            ts: 0.0,
            events: vec![
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![],
                    medium: Some(Medium::Disk),
                }),
                KvEvent::BlockStored(stored(vec![5], Some(4), vec![], 1)),
            ],
            attn_dp_rank: Some(7),
        },
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn events_are_byte_compatible_with_sglangs_own_classes() {
    let Some(python) = std::env::var_os("RBGCTL_SGLANG_PYTHON") else {
        common::skip(
            "RBGCTL_SGLANG_PYTHON is not set (an interpreter with sglang 0.5.23; .ci/run makes \
             one in target/ci-sglang)",
        );
        return;
    };
    let ours = batches();
    let mut child = Command::new("timeout")
        .arg("300")
        .arg(&python)
        .args(["-c", SGLANG])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    let input: String = ours.iter().map(|b| hex(&b.encode()) + "\n").collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SGLang's side failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2 * ours.len(), "{stdout}");
    for (i, b) in ours.iter().enumerate() {
        let theirs = unhex(lines[i]);
        assert_eq!(hex(&b.encode()), lines[i], "batch {i}: rbgctl's bytes");
        assert_eq!(
            &KvEventBatch::decode(&theirs).unwrap(),
            b,
            "batch {i}: SGLang's bytes decoded"
        );
        assert_eq!(lines[ours.len() + i], "same", "batch {i}: SGLang's decoder");
    }
}
