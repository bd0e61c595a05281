//! KV events: what each cache holds, as engines publish it (SGLang's and vLLM's
//! `--kv-events-config`) and as rbgctl's engine and pool will: `event` is the msgpack payload
//! (a batch of `BlockStored`, `BlockRemoved`, `AllBlocksCleared`, each with its `Medium`),
//! `wire` the ZMQ message around it (topic, sequence, payload; replay by sequence).
//!
//! Pure: no socket here. Byte compatibility with SGLang's own encoder is checked in
//! `tests/kv_events.rs`.

pub mod event;
pub mod wire;

pub use event::{BlockRemoved, BlockStored, DecodeError, KvEvent, KvEventBatch, Medium};
pub use wire::{Message, WireError};
