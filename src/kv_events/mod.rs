//! KV events: what each cache holds, as engines publish it (SGLang's and vLLM's
//! `--kv-events-config`) and as rbgctl's engine and pool will: `event` is the msgpack payload
//! (a batch of `BlockStored`, `BlockRemoved`, `AllBlocksCleared`, each with its `Medium`),
//! `wire` the ZMQ message around it (topic, sequence, payload; replay by sequence), `batch` a
//! step's events coalesced as SGLang's recorder does, `config` SGLang's `--kv-events-config`,
//! `publish` the ZMQ publisher (libzmq, as SGLang's pyzmq), `subscribe` a subscription kept
//! in step by sequence numbers and replay, and `index` the global KV index they feed. All but
//! `publish` and `subscribe` are pure.
//! Byte compatibility with SGLang's own encoder is checked in `tests/it/kv_events.rs`.

pub mod batch;
pub mod config;
pub mod event;
pub mod hash;
pub mod index;
pub mod publish;
pub mod subscribe;
pub mod wire;

pub use batch::Batcher;
pub use config::KvEventsConfig;
pub use event::{BlockRemoved, BlockStored, DecodeError, KvEvent, KvEventBatch, Medium};
pub use index::{Index, Prefix, SourceId, Tiers};
pub use publish::{Publisher, PublisherStats};
pub use subscribe::{Sink, Source, SourceStats, Subscription};
pub use wire::{Message, WireError};
