//! Tokens and page keys of the SIMULATED engine.
//!
//! The tokenizer is a stand-in: one token per word, words separated by ASCII whitespace (a
//! byte scan: the router runs it on every request it routes by KV events). A word `t<id>` is the
//! token `<id>` (so the engine's own output text, and the synthetic prompts of
//! `rbgctl bench multiturn --api-format openai`, tokenize back to the same ids); any other word
//! hashes into the vocabulary.
//!
//! Page keys are chained as SGLang's HiCache does (`get_hash_str`): the key of a page is the
//! hex SHA-256 of the previous page's digest followed by the page's token ids as 4-byte
//! little-endian integers. Only full pages have keys.

/// Size of the simulated vocabulary.
pub const VOCAB: u32 = 32_000;

/// Token ids of a text.
pub fn encode(text: &str) -> Vec<u32> {
    text.split_ascii_whitespace().map(word_id).collect()
}

fn word_id(w: &str) -> u32 {
    if let Some(id) = w.strip_prefix('t').and_then(|n| n.parse::<u32>().ok()) {
        if id < VOCAB {
            return id;
        }
    }
    (crate::hash::fnv1a(w.as_bytes()) % VOCAB as u64) as u32
}

/// The text of one token (with its separator).
pub fn decode_one(id: u32) -> String {
    format!("t{id} ")
}

/// The text of several tokens.
pub fn decode(ids: &[u32]) -> String {
    ids.iter().map(|&t| decode_one(t)).collect()
}

/// Chained page keys of the full pages of `tokens` (hex of `kv_events::hash::page_digests`).
pub fn page_keys(tokens: &[u32], page_size: usize) -> Vec<String> {
    crate::kv_events::hash::page_digests(tokens, page_size)
        .iter()
        .map(|d| hex(d))
        .collect()
}

fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(DIGITS[(x >> 4) as usize] as char);
        s.push(DIGITS[(x & 15) as usize] as char);
    }
    s
}

/// The bytes stored for a page: its key's bytes repeated, so that a read can be checked.
pub fn page_bytes(key: &str, len: usize) -> Vec<u8> {
    key.bytes().cycle().take(len).collect()
}

/// Whether `bytes` are what [`page_bytes`] stores for `key`.
pub fn page_bytes_ok(key: &str, bytes: &[u8]) -> bool {
    !key.is_empty()
        && bytes.len() >= key.len().min(bytes.len())
        && bytes.iter().zip(key.bytes().cycle()).all(|(a, b)| *a == b)
}

/// A deterministic "generated" token: a function of the request's prompt and the position.
pub fn output_token(prompt: &[u32], i: usize) -> u32 {
    let mut h = crate::hash::Fnv64::new();
    for &t in prompt.iter().rev().take(16) {
        h.mix(t as u64);
    }
    (h.mix(i as u64).finish() % VOCAB as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokenizer_round_trips_its_own_text() {
        let ids = vec![0, 17, 31_999, 5];
        assert_eq!(encode(&decode(&ids)), ids);
        assert_eq!(encode("hello  world\nhello").len(), 3);
        assert_eq!(encode("hello")[0], encode("hello")[0]);
        assert!(encode("t99999")[0] < VOCAB, "out-of-vocabulary ids hash");
    }

    #[test]
    fn page_keys_chain_like_sglang() {
        use sha2::{Digest, Sha256};
        // SGLang: sha256(bytes.fromhex(prior) + b''.join(t.to_bytes(4, "little"))).hexdigest()
        let k = page_keys(&[1, 2, 3, 4], 2);
        assert_eq!(k.len(), 2);
        let mut h = Sha256::new();
        h.update(1u32.to_le_bytes());
        h.update(2u32.to_le_bytes());
        let first: [u8; 32] = h.finalize().into();
        assert_eq!(k[0], hex(&first));
        let mut h = Sha256::new();
        h.update(first);
        h.update(3u32.to_le_bytes());
        h.update(4u32.to_le_bytes());
        assert_eq!(k[1], hex(&h.finalize()));
        // A partial page has no key; the same prefix gives the same keys.
        assert_eq!(page_keys(&[1, 2, 3], 2), k[..1]);
        // A different first page changes every later key.
        assert_ne!(page_keys(&[9, 2, 3, 4], 2)[1], k[1]);
    }

    #[test]
    fn page_bytes_are_checkable() {
        let b = page_bytes("abc", 8);
        assert_eq!(&b, b"abcabcab");
        assert!(page_bytes_ok("abc", &b));
        let mut bad = b.clone();
        bad[5] ^= 1;
        assert!(!page_bytes_ok("abc", &bad));
    }
}
