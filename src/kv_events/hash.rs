//! Block hashes as SGLang gives them: the pages of a token sequence are chained (each page's
//! digest is the SHA-256 of the digest before it followed by the page's token ids as 4-byte
//! little-endian integers: HiCache's `get_hash_str`), and a page's event hash is its digest's
//! first 8 bytes read as a big-endian signed integer (`hash_str_to_int64` of the hex key).
//! Only full pages have hashes.
//!
//! A LoRA adapter's pages SGLang publishes under hashes seeded by its own id for the adapter's
//! load (`kv_event_namespace_seed`), which no router can compute from a request; its events
//! carry the adapter's public name (`lora_name`) and each block's token ids instead. The index
//! keys those blocks by [`adapter_block_keys`]: a chain from the adapter's name through the
//! pages' tokens, the same whether computed from the events or from a request naming the
//! adapter.

use sha2::{Digest, Sha256};

/// The chained digests of the full pages of `tokens`.
pub fn page_digests(tokens: &[u32], page_size: usize) -> Vec<[u8; 32]> {
    let page_size = page_size.max(1);
    let mut out = Vec::with_capacity(tokens.len() / page_size);
    let mut prior: Option<[u8; 32]> = None;
    let mut bytes = Vec::with_capacity(page_size * 4);
    for page in tokens.chunks_exact(page_size) {
        let mut h = Sha256::new();
        if let Some(p) = &prior {
            h.update(p);
        }
        bytes.clear();
        for t in page {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        h.update(&bytes);
        let d: [u8; 32] = h.finalize().into();
        out.push(d);
        prior = Some(d);
    }
    out
}

/// A page digest's event hash.
pub fn event_hash(digest: &[u8; 32]) -> i64 {
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The event hashes of the full pages of `tokens`.
pub fn block_hashes(tokens: &[u32], page_size: usize) -> Vec<i64> {
    page_digests(tokens, page_size)
        .iter()
        .map(event_hash)
        .collect()
}

/// The chain's start for adapter `name`: what its first page's key follows.
pub fn adapter_seed(name: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(b"rbgctl-adapter-block-v1");
    h.update((name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    event_hash(&h.finalize().into())
}

/// The key of an adapter's page of `tokens` following the page keyed `parent`.
pub fn adapter_key(parent: i64, tokens: &[u32]) -> i64 {
    let mut h = Sha256::new();
    h.update(parent.to_be_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    event_hash(&h.finalize().into())
}

/// The keys of the full pages of `tokens` chained from the page keyed `parent`.
pub fn adapter_keys_after(parent: i64, tokens: &[u32], page_size: usize) -> Vec<i64> {
    let mut parent = parent;
    tokens
        .chunks_exact(page_size.max(1))
        .map(|page| {
            parent = adapter_key(parent, page);
            parent
        })
        .collect()
}

/// The keys of the full pages of `tokens` in adapter `name`'s namespace.
pub fn adapter_block_keys(name: &str, tokens: &[u32], page_size: usize) -> Vec<i64> {
    adapter_keys_after(adapter_seed(name), tokens, page_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMULATED engine's page keys (HiCache's hex chain) and these hashes agree, as
    /// SGLang's `hash_str_to_int64(key)` and its event hash do.
    #[test]
    fn hashes_are_the_page_keys_first_8_bytes() {
        let tokens: Vec<u32> = (0..40).collect();
        let keys = crate::simulated_tokens::page_keys(&tokens, 8);
        let hashes = block_hashes(&tokens, 8);
        assert_eq!(hashes.len(), 5);
        for (k, h) in keys.iter().zip(&hashes) {
            assert_eq!(crate::engine::cache::block_hash(k), *h);
        }
        assert_eq!(
            block_hashes(&tokens[..7], 8),
            Vec::<i64>::new(),
            "no full page"
        );
        assert_eq!(
            block_hashes(&tokens[..16], 8),
            hashes[..2],
            "a prefix's hashes"
        );
    }

    #[test]
    fn an_adapters_keys_chain_from_its_name_and_differ_from_the_base_models() {
        let tokens: Vec<u32> = (0..24).collect();
        let keys = adapter_block_keys("sql", &tokens, 8);
        assert_eq!(keys.len(), 3);
        assert_eq!(keys[0], adapter_key(adapter_seed("sql"), &tokens[..8]));
        assert_eq!(keys[2], adapter_key(keys[1], &tokens[16..]));
        assert_eq!(adapter_block_keys("sql", &tokens[..20], 8), keys[..2]);
        assert_ne!(adapter_block_keys("chat", &tokens, 8)[0], keys[0]);
        assert!(block_hashes(&tokens, 8).iter().all(|h| !keys.contains(h)));
        // The name is length-prefixed: no two names run into the same seed.
        assert_ne!(adapter_seed("ab"), adapter_seed("a"));
    }
}
