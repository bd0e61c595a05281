//! A step's events, gathered as SGLang's recorder gathers them before a batch is published:
//! consecutive removals from one medium become one `BlockRemoved`, and a store that continues
//! the chain of the store before it (same medium, block size, salt, session and adapter, its
//! parent the last block before) extends it.

use super::event::{KvEvent, KvEventBatch};

/// Gathers one step's events into a batch as SGLang's recorder does.
#[derive(Debug, Default)]
pub struct Batcher {
    events: Vec<KvEvent>,
}

impl Batcher {
    /// Adds an event, merged into the last one where SGLang's recorder merges them.
    pub fn push(&mut self, event: KvEvent) {
        match (self.events.last_mut(), &event) {
            (Some(KvEvent::BlockRemoved(tail)), KvEvent::BlockRemoved(e))
                if tail.medium == e.medium =>
            {
                tail.block_hashes.extend_from_slice(&e.block_hashes);
            }
            (Some(KvEvent::BlockStored(tail)), KvEvent::BlockStored(e))
                if tail.medium == e.medium
                    && tail.lora_id == e.lora_id
                    && tail.block_size == e.block_size
                    && tail.cache_salt == e.cache_salt
                    && tail.session_id == e.session_id
                    && tail.lora_name == e.lora_name
                    && tail.block_hashes.last().is_some()
                    && e.parent_block_hash == tail.block_hashes.last().copied() =>
            {
                tail.block_hashes.extend_from_slice(&e.block_hashes);
                tail.token_ids.extend_from_slice(&e.token_ids);
            }
            _ => self.events.push(event),
        }
    }

    /// Whether no event was added.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The gathered events as a batch stamped `ts`, leaving none.
    pub fn take(&mut self, ts: f64) -> Option<KvEventBatch> {
        (!self.events.is_empty()).then(|| KvEventBatch {
            ts,
            events: std::mem::take(&mut self.events),
            attn_dp_rank: Some(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::{BlockRemoved, BlockStored, Medium};

    fn stored(hash: i64, parent: Option<i64>, medium: Medium) -> KvEvent {
        KvEvent::BlockStored(BlockStored::new(
            vec![hash],
            parent,
            vec![hash as u32; 2],
            2,
            medium,
        ))
    }

    fn removed(hash: i64, medium: Medium) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![hash],
            medium: Some(medium),
        })
    }

    #[test]
    fn a_chain_of_stores_and_a_run_of_removals_coalesce() {
        let mut b = Batcher::default();
        assert!(b.take(0.0).is_none());
        b.push(stored(1, None, Medium::Gpu));
        b.push(stored(2, Some(1), Medium::Gpu));
        b.push(stored(3, Some(2), Medium::Gpu));
        b.push(stored(9, Some(7), Medium::Gpu)); // another chain
        b.push(stored(10, Some(9), Medium::CpuPinned)); // another medium
        b.push(removed(1, Medium::Gpu));
        b.push(removed(2, Medium::Gpu));
        b.push(removed(3, Medium::CpuPinned));
        let batch = b.take(1.0).unwrap();
        assert!(b.is_empty());
        let KvEvent::BlockStored(first) = &batch.events[0] else {
            panic!()
        };
        assert_eq!(first.block_hashes, vec![1, 2, 3]);
        assert_eq!(first.token_ids, vec![1, 1, 2, 2, 3, 3]);
        assert_eq!(batch.events.len(), 5);
        assert_eq!(
            batch.events[3],
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![1, 2],
                medium: Some(Medium::Gpu)
            })
        );
    }
}
