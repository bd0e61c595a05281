//! Block hashes as SGLang gives them: the pages of a token sequence are chained (each page's
//! digest is the SHA-256 of the digest before it followed by the page's token ids as 4-byte
//! little-endian integers: HiCache's `get_hash_str`), and a page's event hash is its digest's
//! first 8 bytes read as a big-endian signed integer (`hash_str_to_int64` of the hex key).
//! Only full pages have hashes. No namespace (cache salt, LoRA extra key): those chains are
//! seeded differently and are not routed on here.

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMULATED engine's page keys (HiCache's hex chain) and these hashes agree, as
    /// SGLang's `hash_str_to_int64(key)` and its event hash do.
    #[test]
    fn hashes_are_the_page_keys_first_8_bytes() {
        let tokens: Vec<u32> = (0..40).collect();
        let keys = crate::engine::tokens::page_keys(&tokens, 8);
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
}
