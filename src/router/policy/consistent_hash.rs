//! `consistent_hashing`: rendezvous hashing of the routing key (`X-SMG-Routing-Key` or
//! `X-Session-Id`), so a conversation sticks to one worker and a removed worker moves only
//! its own keys; without a key, the least loaded.

use super::{least_loaded, Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use std::time::Instant;

/// The `consistent_hashing` policy: rendezvous hashing of the routing key.
pub struct ConsistentHashing;

impl LoadBalancingPolicy for ConsistentHashing {
    fn kind(&self) -> PolicyKind {
        PolicyKind::ConsistentHashing
    }

    fn select(&self, c: &[Candidate], request: &RouteInput, _: Instant) -> Option<usize> {
        match request.routing_key {
            Some(key) => (0..c.len())
                .max_by_key(|&i| rendezvous_hash(&[key.as_bytes(), c[i].url.as_bytes()])),
            None => least_loaded(c),
        }
    }
}

/// 64-bit FNV-1a, stable across processes and releases (std's hasher is not).
pub fn rendezvous_hash(parts: &[&[u8]]) -> u64 {
    let mut fnv = crate::hash::Fnv64::new();
    for p in parts {
        // 0xff never occurs in UTF-8: it separates the parts.
        fnv.write(p).write(&[0xff]);
    }
    let mut h = fnv.finish();
    // Final avalanche (splitmix64) so that similar keys spread.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn consistent_hashing_sticks_and_moves_little() {
        let p = ConsistentHashing;
        let now = Instant::now();
        let c = cands(&[0, 0, 0, 0]);
        let keys: Vec<String> = (0..400).map(|i| format!("session-{i}")).collect();
        let first: Vec<usize> = keys
            .iter()
            .map(|k| p.select(&c, &key(k), now).unwrap())
            .collect();
        let a = p.select(&c, &key("conversation-42"), now).unwrap();
        for _ in 0..20 {
            assert_eq!(p.select(&c, &key("conversation-42"), now), Some(a));
        }
        let mut per = [0; 4];
        first.iter().for_each(|&i| per[i] += 1);
        assert!(per.iter().all(|&n| n > 60), "spread: {per:?}");
        // Removing worker 3 moves only the keys that were on it.
        let c3 = &c[..3];
        for (k, &before) in keys.iter().zip(&first) {
            let after = p.select(c3, &key(k), now).unwrap();
            if before != 3 {
                assert_eq!(after, before, "{k} moved although its worker stayed");
            }
        }
        // Without a key: least loaded.
        assert_eq!(p.select(&cands(&[3, 1, 2]), &text(""), now), Some(1));
    }
}
