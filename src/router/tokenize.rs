//! The router's local tokenizer (`--tokenizer-path`, or a local `--model-path` directory): a
//! Hugging Face `tokenizer.json` read from disk, never downloaded. It serves `/v1/tokenize`
//! and `/v1/detokenize`, and, for the cache-aware policy, turns request text into token ids so
//! that prefixes are matched token by token as the engines cache them.

use std::path::{Path, PathBuf};

/// Why the tokenizer could not be loaded, or a text tokenized or detokenized.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("{path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error("tokenizing: {0}")]
    Encode(String),
    #[error("detokenizing: {0}")]
    Decode(String),
}

/// The router's local tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The file it was read from.
    pub path: PathBuf,
}

/// Above this many bytes, text is tokenized off the async threads.
pub const INLINE_BYTES: usize = 8 << 10;

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .finish()
    }
}

impl Tokenizer {
    /// Reads `path`: a `tokenizer.json`, or a directory holding one.
    pub fn load(path: &Path) -> Result<Tokenizer, TokenizeError> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let fail = |reason: String| TokenizeError::Load {
            path: file.clone(),
            reason,
        };
        if !file.is_file() {
            return Err(fail(
                "no such file: give a local tokenizer.json or a directory holding one (rbgctl \
                 never downloads tokenizers)"
                    .into(),
            ));
        }
        let inner = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| fail(format!("not a tokenizer.json: {e}")))?;
        Ok(Tokenizer { inner, path: file })
    }

    /// The token ids of `text`, with the model's special tokens when `add_special_tokens`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    }

    /// The text of `ids`, leaving out special tokens when `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizeError::Decode(e.to_string()))
    }

    /// Request text as the cache-aware tree matches it: one token per two characters (see
    /// [`token_text`]).
    pub fn routing_text(&self, text: &str) -> Result<String, TokenizeError> {
        Ok(token_text(&self.encode(text, false)?))
    }
}

/// Token ids as characters, two per token (the id's high and low 16 bits, in Unicode's
/// plane 15), so that a prefix of characters is a prefix of tokens and the tree's match rate
/// is the share of tokens matched.
pub fn token_text(ids: &[u32]) -> String {
    const BASE: u32 = 0xF0000;
    let mut out = String::with_capacity(ids.len() * 8);
    for id in ids {
        for half in [id >> 16, id & 0xFFFF] {
            // BASE + half ≤ 0xFFFFF: always a scalar value.
            out.push(char::from_u32(BASE + half).unwrap_or(char::REPLACEMENT_CHARACTER));
        }
    }
    out
}

/// The ids [`token_text`] wrote.
pub fn ids_of_token_text(text: &str) -> Vec<u32> {
    const BASE: u32 = 0xF0000;
    let halves: Vec<u32> = text
        .chars()
        .map(|c| (c as u32).wrapping_sub(BASE))
        .collect();
    halves
        .chunks_exact(2)
        .map(|h| (h[0] << 16) | (h[1] & 0xFFFF))
        .collect()
}

/// Space-separated ids (how `input_ids` requests are matched) as ids.
pub fn parse_ids(text: &str) -> Vec<u32> {
    text.split_ascii_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::tokenizer::word_level_json;

    #[test]
    fn token_text_reads_back() {
        let ids = [0, 1, 65_535, 65_536, 151_643, u32::MAX >> 12];
        assert_eq!(ids_of_token_text(&token_text(&ids)), ids);
    }

    #[test]
    fn a_local_tokenizer_json_encodes_decodes_and_routes_by_token() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer.json"),
            word_level_json(&["hello", "world", "again"]),
        )
        .unwrap();
        // A directory holding tokenizer.json works as the file does.
        let t = Tokenizer::load(dir.path()).unwrap();
        assert_eq!(t.encode("hello world", true).unwrap(), [1, 2, 3]);
        assert_eq!(t.encode("hello world", false).unwrap(), [2, 3]);
        assert_eq!(t.encode("hello nope", false).unwrap(), [2, 0]);
        assert_eq!(t.decode(&[1, 2, 3], true).unwrap(), "hello world");
        let a = t.routing_text("hello world").unwrap();
        let b = t.routing_text("hello world again").unwrap();
        assert_eq!(a.chars().count(), 4, "two characters per token");
        assert!(b.starts_with(&a), "a token prefix is a character prefix");
        assert_eq!(token_text(&[0x12345]).chars().count(), 2);
        assert_eq!(parse_ids("1 22  333"), [1, 22, 333]);
    }

    #[test]
    fn missing_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = Tokenizer::load(&dir.path().join("nope.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nope.json") && e.contains("never downloads"),
            "{e}"
        );
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{}").unwrap();
        let e = Tokenizer::load(&bad).unwrap_err().to_string();
        assert!(
            e.contains("bad.json") && e.contains("not a tokenizer.json"),
            "{e}"
        );
    }
}
