//! The events and their msgpack form, byte for byte as SGLang publishes them
//! (`sglang/srt/disaggregation/kv_events.py`, msgspec): a batch is the positional array
//! `[ts, events, attn_dp_rank]`; each event a map tagged by `type` (the class name) with its
//! fields by name in declaration order, the optional fields that have a default left out when
//! `None`, those without one (`parent_block_hash`, `lora_id`) always written (`nil`).
//!
//! Decoding takes what either engine sends: SGLang's (and today's vLLM's) tagged maps, older
//! vLLM's positional arrays (`["BlockStored", block_hashes, parent, token_ids, block_size,
//! lora_id, medium?]`), integer block hashes, and vLLM's byte-string hashes (its SHA-256 block
//! hashes), which become the first 8 bytes read as a big-endian `i64`, as SGLang namespaces its
//! own. Unknown fields and unknown event types are skipped, so a newer engine's additions never
//! stop the stream.

use serde::ser::{SerializeTuple, Serializer};
use serde::Serialize;

/// Where a block is held (SGLang's `StorageMedium`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// L1: device memory.
    Gpu,
    /// L2: pinned host memory.
    CpuPinned,
    /// L3: local SSD.
    Disk,
    /// L4: a shared pool (Mooncake's, or rbgctl's).
    External,
    /// A medium this build does not know, kept by name.
    Other(String),
}

impl Medium {
    /// The medium as events name it (`GPU`, `CPU_PINNED`, ...).
    pub fn as_str(&self) -> &str {
        match self {
            Medium::Gpu => "GPU",
            Medium::CpuPinned => "CPU_PINNED",
            Medium::Disk => "DISK",
            Medium::External => "EXTERNAL",
            Medium::Other(s) => s,
        }
    }

    /// A medium by its name in events; one not known is kept as given.
    pub fn parse(s: &str) -> Medium {
        match s {
            "GPU" => Medium::Gpu,
            "CPU_PINNED" | "CPU" => Medium::CpuPinned,
            "DISK" => Medium::Disk,
            "EXTERNAL" => Medium::External,
            other => Medium::Other(other.to_string()),
        }
    }
}

impl Serialize for Medium {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Blocks the engine (or the pool) now holds, each chained to the one before it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockStored {
    pub block_hashes: Vec<i64>,
    /// The hash of the block before the first of these; `None` at the start of a sequence.
    pub parent_block_hash: Option<i64>,
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    pub lora_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub medium: Option<Medium>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_name: Option<String>,
}

impl BlockStored {
    /// Blocks of one chain now on `medium`, with none of the optional attributions (adapter,
    /// salt, session).
    pub fn new(
        block_hashes: Vec<i64>,
        parent_block_hash: Option<i64>,
        token_ids: Vec<u32>,
        block_size: u32,
        medium: Medium,
    ) -> BlockStored {
        BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id: None,
            medium: Some(medium),
            cache_salt: None,
            session_id: None,
            lora_name: None,
        }
    }
}

/// Blocks no longer held on `medium`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockRemoved {
    pub block_hashes: Vec<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub medium: Option<Medium>,
}

/// One change to what a cache holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// Everything the source held is gone (a cache flush, a restart).
    AllBlocksCleared,
}

/// The events of one step, as one message.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// When, in seconds since the epoch.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The attention data-parallel rank whose cache this is.
    pub attn_dp_rank: Option<i64>,
}

impl Serialize for KvEventBatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.ts)?;
        t.serialize_element(&self.events)?;
        t.serialize_element(&self.attn_dp_rank)?;
        t.end()
    }
}

/// Why a payload is not a batch of events.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("not msgpack: {0}")]
    Msgpack(String),
    #[error("a KV event batch is [ts, events, attn_dp_rank]; got {0}")]
    Batch(String),
    #[error("event {index} ({kind}): {why}")]
    Event {
        index: usize,
        kind: String,
        why: String,
    },
}

impl KvEventBatch {
    /// The msgpack payload, as msgspec writes it.
    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::encode::to_vec_named(self).expect("a batch always encodes")
    }

    /// A payload from SGLang or vLLM (either event shape); unknown event types are skipped.
    pub fn decode(payload: &[u8]) -> Result<KvEventBatch, DecodeError> {
        use rmpv::Value;
        let mut rd = payload;
        let value =
            rmpv::decode::read_value(&mut rd).map_err(|e| DecodeError::Msgpack(e.to_string()))?;
        let Value::Array(items) = value else {
            return Err(DecodeError::Batch(kind_of(&value).into()));
        };
        if !(2..=3).contains(&items.len()) {
            return Err(DecodeError::Batch(format!("an array of {}", items.len())));
        }
        let ts = match &items[0] {
            Value::F64(f) => *f,
            Value::F32(f) => f64::from(*f),
            v => v
                .as_i64()
                .map(|i| i as f64)
                .ok_or_else(|| DecodeError::Batch(format!("ts is {}", kind_of(v))))?,
        };
        let Value::Array(raw) = &items[1] else {
            return Err(DecodeError::Batch(format!(
                "events is {}",
                kind_of(&items[1])
            )));
        };
        let attn_dp_rank = items.get(2).and_then(Value::as_i64);
        let mut events = Vec::with_capacity(raw.len());
        for (index, e) in raw.iter().enumerate() {
            if let Some(event) =
                decode_event(e).map_err(|(kind, why)| DecodeError::Event { index, kind, why })?
            {
                events.push(event);
            }
        }
        Ok(KvEventBatch {
            ts,
            events,
            attn_dp_rank,
        })
    }
}

fn kind_of(v: &rmpv::Value) -> &'static str {
    use rmpv::Value;
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension",
    }
}

/// The fields of an event by name, from either shape.
struct Fields<'a> {
    named: Vec<(&'a str, &'a rmpv::Value)>,
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a rmpv::Value> {
        self.named
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .filter(|v| !v.is_nil())
    }
}

/// The positional fields of older vLLM's array-shaped events.
const STORED_FIELDS: [&str; 6] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
];
const REMOVED_FIELDS: [&str; 2] = ["block_hashes", "medium"];

/// One event, `None` when its type is unknown; the error names the type and what is wrong.
fn decode_event(v: &rmpv::Value) -> Result<Option<KvEvent>, (String, String)> {
    use rmpv::Value;
    let (kind, fields) = match v {
        Value::Map(entries) => {
            let kind = entries
                .iter()
                .find(|(k, _)| k.as_str() == Some("type"))
                .and_then(|(_, v)| v.as_str())
                .ok_or_else(|| ("?".to_string(), "no `type`".to_string()))?;
            let named = entries
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?, v)))
                .collect();
            (kind, Fields { named })
        }
        Value::Array(items) => {
            let kind = items
                .first()
                .and_then(Value::as_str)
                .ok_or_else(|| ("?".to_string(), "no tag first".to_string()))?;
            let names: &[&str] = match kind {
                "BlockStored" => &STORED_FIELDS,
                "BlockRemoved" => &REMOVED_FIELDS,
                _ => &[],
            };
            let named = names.iter().copied().zip(items.iter().skip(1)).collect();
            (kind, Fields { named })
        }
        other => {
            return Err((
                "?".into(),
                format!("an event is a map or an array, not {}", kind_of(other)),
            ))
        }
    };
    let bad = |why: String| (kind.to_string(), why);
    let event = match kind {
        "BlockStored" => KvEvent::BlockStored(BlockStored {
            block_hashes: hashes(fields.get("block_hashes")).map_err(bad)?,
            parent_block_hash: fields
                .get("parent_block_hash")
                .map(hash)
                .transpose()
                .map_err(bad)?,
            token_ids: match fields.get("token_ids") {
                None => Vec::new(),
                Some(Value::Array(ids)) => ids
                    .iter()
                    .map(|i| {
                        i.as_u64()
                            .and_then(|i| u32::try_from(i).ok())
                            .ok_or_else(|| format!("token id {i} is not a u32"))
                    })
                    .collect::<Result<_, _>>()
                    .map_err(bad)?,
                Some(v) => return Err(bad(format!("token_ids is {}", kind_of(v)))),
            },
            block_size: fields
                .get("block_size")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad("block_size is missing or not a u32".into()))?,
            lora_id: fields.get("lora_id").and_then(Value::as_i64),
            medium: fields
                .get("medium")
                .and_then(Value::as_str)
                .map(Medium::parse),
            cache_salt: text(fields.get("cache_salt")),
            session_id: text(fields.get("session_id")),
            lora_name: text(fields.get("lora_name")),
        }),
        "BlockRemoved" => KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes(fields.get("block_hashes")).map_err(bad)?,
            medium: fields
                .get("medium")
                .and_then(Value::as_str)
                .map(Medium::parse),
        }),
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    };
    Ok(Some(event))
}

fn text(v: Option<&rmpv::Value>) -> Option<String> {
    v.and_then(rmpv::Value::as_str).map(str::to_owned)
}

/// A block hash: an integer (SGLang; signed or not), or bytes (vLLM's SHA-256), whose first
/// 8 bytes are read as a big-endian `i64`.
fn hash(v: &rmpv::Value) -> Result<i64, String> {
    use rmpv::Value;
    match v {
        Value::Integer(i) => i
            .as_i64()
            .or_else(|| i.as_u64().map(|u| u as i64))
            .ok_or_else(|| format!("block hash {i} is not 64-bit")),
        Value::Binary(b) if !b.is_empty() => {
            // Shorter than 8 bytes: read as a big-endian number.
            let mut head = [0u8; 8];
            let n = b.len().min(8);
            head[8 - n..].copy_from_slice(&b[..n]);
            Ok(i64::from_be_bytes(head))
        }
        other => Err(format!(
            "a block hash is an integer or bytes, not {}",
            kind_of(other)
        )),
    }
}

fn hashes(v: Option<&rmpv::Value>) -> Result<Vec<i64>, String> {
    match v {
        Some(rmpv::Value::Array(items)) => items.iter().map(hash).collect(),
        Some(other) => Err(format!("block_hashes is {}", kind_of(other))),
        None => Err("block_hashes is missing".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn sample() -> KvEventBatch {
        KvEventBatch {
            ts: 1.5,
            events: vec![
                KvEvent::BlockStored(BlockStored::new(
                    vec![1, -2, 1 << 40],
                    None,
                    vec![1, 2, 3, 300],
                    4,
                    Medium::Gpu,
                )),
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![7],
                    medium: Some(Medium::CpuPinned),
                }),
                KvEvent::AllBlocksCleared,
            ],
            attn_dp_rank: Some(0),
        }
    }

    /// msgspec's bytes for `sample()`, from SGLang 0.5.23's own classes (`KVEventBatch`,
    /// `BlockStored(... medium="GPU")`, `BlockRemoved(... medium="CPU_PINNED")`,
    /// `AllBlocksCleared()`); `tests/it/kv_events.rs` checks the same against SGLang in CI.
    const SGLANG_SAMPLE: &str = "93cb3ff80000000000009387a474797065ab426c6f636b53746f726564ac\
        626c6f636b5f6861736865739301fecf0000010000000000b1706172656e745f626c6f636b5f68617368c0\
        a9746f6b656e5f69647394010203cd012caa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469\
        756da347505583a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739107a66d65\
        6469756daa4350555f50494e4e454481a474797065b0416c6c426c6f636b73436c656172656400";

    #[test]
    fn a_batch_encodes_byte_for_byte_as_sglang_does() {
        let golden: String = SGLANG_SAMPLE.split_whitespace().collect();
        assert_eq!(sample().encode(), hex(&golden));
    }

    #[test]
    fn what_is_encoded_decodes_to_itself() {
        let b = sample();
        assert_eq!(KvEventBatch::decode(&b.encode()).unwrap(), b);
        let mut with_extras = sample();
        if let KvEvent::BlockStored(s) = &mut with_extras.events[0] {
            s.parent_block_hash = Some(-9);
            s.lora_id = Some(3);
            s.cache_salt = Some("salt".into());
            s.session_id = Some("s-1".into());
            s.lora_name = Some("adapter".into());
            s.medium = Some(Medium::Other("HBM3".into()));
        }
        with_extras.attn_dp_rank = None;
        assert_eq!(
            KvEventBatch::decode(&with_extras.encode()).unwrap(),
            with_extras
        );
    }

    /// Older vLLM: events as positional arrays led by their tag, block hashes as bytes.
    #[test]
    fn older_vllm_array_shaped_events_decode() {
        use rmpv::Value;
        let sha = |b: u8| Value::Binary(vec![b; 32]);
        let batch = Value::Array(vec![
            Value::F64(2.0),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    Value::Array(vec![sha(1), sha(2)]),
                    Value::Nil,
                    Value::Array(vec![5.into(), 6.into()]),
                    16.into(),
                    Value::Nil,
                ]),
                Value::Array(vec!["BlockRemoved".into(), Value::Array(vec![sha(2)])]),
                Value::Array(vec!["SomethingNew".into(), 1.into()]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &batch).unwrap();
        let b = KvEventBatch::decode(&bytes).unwrap();
        let h = |x: u8| i64::from_be_bytes([x; 8]);
        assert_eq!(b.attn_dp_rank, None);
        assert_eq!(b.events.len(), 3, "the unknown event is skipped");
        match &b.events[0] {
            KvEvent::BlockStored(s) => {
                assert_eq!(s.block_hashes, vec![h(1), h(2)]);
                assert_eq!(s.token_ids, vec![5, 6]);
                assert_eq!((s.block_size, s.medium.as_ref()), (16, None));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            b.events[1],
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![h(2)],
                medium: None
            })
        );
        assert_eq!(b.events[2], KvEvent::AllBlocksCleared);
    }

    #[test]
    fn bad_payloads_say_what_is_wrong() {
        let enc = |v: rmpv::Value| {
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &v).unwrap();
            out
        };
        assert!(matches!(
            KvEventBatch::decode(b"\x93\xcb\x3f"),
            Err(DecodeError::Msgpack(_))
        ));
        assert_eq!(
            KvEventBatch::decode(&enc(rmpv::Value::Map(vec![]))),
            Err(DecodeError::Batch("a map".into()))
        );
        let no_hashes = rmpv::Value::Array(vec![
            1.into(),
            rmpv::Value::Array(vec![rmpv::Value::Map(vec![(
                "type".into(),
                "BlockRemoved".into(),
            )])]),
        ]);
        let e = KvEventBatch::decode(&enc(no_hashes)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "event 0 (BlockRemoved): block_hashes is missing"
        );
    }
}
