//! Tokens and page keys of the SIMULATED engine, apart from it: the engine, the router (which
//! routes SIMULATED workers' requests by their KV events) and the benchmarks' synthetic
//! prompts share them, and no role depends on another for them.
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

/// Token ids of a text: one pass over its bytes, each word hashed as it is scanned (what
/// `split_ascii_whitespace` and a hash per word would give, in about a third of the
/// instructions: the router runs this on every request it routes by KV events).
pub fn encode(text: &str) -> Vec<u32> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 5 + 1);
    let mut i = 0;
    while i < b.len() {
        if SPACE[b[i] as usize] {
            i += 1;
            continue;
        }
        let start = i;
        let mut h = crate::hash::Fnv64::new();
        while i < b.len() && !SPACE[b[i] as usize] {
            h.mix(b[i] as u64);
            i += 1;
        }
        out.push(word_id(&b[start..i], h.finish()));
    }
    out
}

/// ASCII whitespace (`u8::is_ascii_whitespace`) by byte value.
static SPACE: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = (c as u8).is_ascii_whitespace();
        c += 1;
    }
    t
};

/// A word's id, knowing its FNV-1a hash: `t<id>` with `<id>` a number in the vocabulary (as
/// `str::parse::<u32>` reads it: an optional `+`, any leading zeros), else the hash's.
fn word_id(w: &[u8], hash: u64) -> u32 {
    if let [b't', digits @ ..] = w {
        if let Some(id) = id_in_vocab(digits.strip_prefix(b"+").unwrap_or(digits)) {
            return id;
        }
    }
    (hash % VOCAB as u64) as u32
}

/// The number `digits` spell, if it is one below `VOCAB`.
fn id_in_vocab(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() {
        return None;
    }
    let mut n = 0u32;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        // Digits only add: once at VOCAB, the number stays out of the vocabulary.
        if d > 9 || n >= VOCAB {
            return None;
        }
        n = n * 10 + d as u32;
    }
    (n < VOCAB).then_some(n)
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
        .map(|d| crate::hash::hex(d))
        .collect()
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

    /// The byte scan gives what the plain definition does: words between ASCII whitespace,
    /// `t<id>` read as `str::parse::<u32>` reads `<id>`.
    #[test]
    fn the_byte_scan_tokenizes_as_the_definition_does() {
        let reference = |text: &str| -> Vec<u32> {
            text.split_ascii_whitespace()
                .map(
                    |w| match w.strip_prefix('t').and_then(|n| n.parse::<u32>().ok()) {
                        Some(id) if id < VOCAB => id,
                        _ => (crate::hash::fnv1a(w.as_bytes()) % VOCAB as u64) as u32,
                    },
                )
                .collect()
        };
        let texts = [
            "",
            "   ",
            "t0 t17 t31999 t32000 t4294967295 t4294967296 t99999999999",
            "t+5 t-5 t++5 t+ t 5 tt5 t5x t05 t0000000000000000000007 T5",
            "\tleading and trailing\r\n  \x0c spaces\x0bvertical-tab-is-not-ascii-whitespace ",
            "The quick brown fox jumps over the lazy dog. héllo wörld t١٢",
        ];
        for t in texts {
            assert_eq!(encode(t), reference(t), "{t:?}");
        }
        // Every byte value around a word boundary.
        for c in 0u8..128 {
            let t = format!("a{}t1{}b", c as char, c as char);
            assert_eq!(encode(&t), reference(&t), "{t:?}");
        }
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
        assert_eq!(k[0], crate::hash::hex(&first));
        let mut h = Sha256::new();
        h.update(first);
        h.update(3u32.to_le_bytes());
        h.update(4u32.to_le_bytes());
        assert_eq!(k[1], crate::hash::hex(&h.finalize()));
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
