//! Output tokens of an answer, read as it is relayed: the engine's own count where the answer
//! carries one (`usage.completion_tokens` in OpenAI answers and in a stream's usage chunk,
//! `meta_info.completion_tokens` in SGLang's `/generate`), else one per streamed event, else
//! one per four bytes of a body. Pure: it sees the frames, nothing else.

use memchr::memmem::Finder;
use std::sync::LazyLock;

/// The field engines count output tokens in.
const FIELD: &[u8] = b"\"completion_tokens\"";

/// Searchers built once (building one costs more than a search of a small frame).
static FIELD_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(FIELD));
static EVENT_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"data:"));
/// Bytes kept from a frame's end, so that a field split over two frames is still read.
const CARRY: usize = 40;

/// What has been seen of one answer.
#[derive(Debug)]
pub struct OutputCount {
    /// The largest `completion_tokens` seen (a stream's counts are cumulative).
    reported: Option<u64>,
    /// `data:` events other than `[DONE]`.
    events: u64,
    bytes: u64,
    /// The previous frame's last bytes (`carry_len` of them).
    carry: [u8; CARRY],
    carry_len: usize,
}

impl Default for OutputCount {
    fn default() -> Self {
        OutputCount {
            reported: None,
            events: 0,
            bytes: 0,
            carry: [0; CARRY],
            carry_len: 0,
        }
    }
}

impl OutputCount {
    /// Reads one frame of the answer.
    pub fn frame(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        self.events += count_events(data);
        if self.carry_len > 0 {
            // Only a field that starts in the carry: one wholly in `data` is read below.
            let mut joined = [0u8; 2 * CARRY];
            let head = data.len().min(CARRY);
            joined[..self.carry_len].copy_from_slice(&self.carry[..self.carry_len]);
            joined[self.carry_len..self.carry_len + head].copy_from_slice(&data[..head]);
            let joined = &joined[..self.carry_len + head];
            let tail_start = joined.len() - data.len().min(CARRY);
            let mut at = 0;
            while let Some(i) = FIELD_FINDER.find(&joined[at..]) {
                let start = at + i;
                if start >= tail_start {
                    break;
                }
                if let Some(n) = number_after(&joined[start + FIELD.len()..]) {
                    self.note(n);
                }
                at = start + 1;
            }
        }
        let mut at = 0;
        while let Some(i) = FIELD_FINDER.find(&data[at..]) {
            let start = at + i;
            if let Some(n) = number_after(&data[start + FIELD.len()..]) {
                self.note(n);
            }
            at = start + 1;
        }
        let keep = data.len().min(CARRY);
        self.carry[..keep].copy_from_slice(&data[data.len() - keep..]);
        self.carry_len = keep;
    }

    fn note(&mut self, n: u64) {
        self.reported = Some(self.reported.map_or(n, |r| r.max(n)));
    }

    /// The output tokens: the engine's count, else the events, else the body's bytes / 4.
    pub fn tokens(&self) -> u64 {
        match (self.reported, self.events) {
            (Some(n), _) => n,
            (None, e) if e > 0 => e,
            _ => self.bytes / 4,
        }
    }
}

/// `data:` lines of an SSE frame, `[DONE]` left out.
fn count_events(data: &[u8]) -> u64 {
    let mut n = 0;
    let mut at = 0;
    while let Some(i) = EVENT_FINDER.find(&data[at..]) {
        let start = at + i;
        let line_start = start == 0 || data[start - 1] == b'\n';
        if line_start && !data[start + 5..].trim_ascii_start().starts_with(b"[DONE]") {
            n += 1;
        }
        at = start + 5;
    }
    n
}

/// The unsigned integer after `:` (and spaces) at the start of `rest`; `None` when it is cut
/// off by the end of `rest` or is not a number.
fn number_after(rest: &[u8]) -> Option<u64> {
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits == rest.len() || digits > 19 {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(frames: &[&str]) -> u64 {
        let mut c = OutputCount::default();
        for f in frames {
            c.frame(f.as_bytes());
        }
        c.tokens()
    }

    #[test]
    fn the_engines_count_wins_wherever_it_comes() {
        let openai = r#"{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        assert_eq!(count(&[openai]), 34);
        let sglang =
            r#"{"text":"hi","meta_info":{"prompt_tokens":5,"completion_tokens": 7,"id":"r"}}"#;
        assert_eq!(count(&[sglang]), 7);
        // SGLang's stream: cumulative counts in each event.
        let s = "data: {\"meta_info\":{\"completion_tokens\":1}}\n\ndata: {\"meta_info\":{\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        assert_eq!(count(&[s]), 2);
        // Split anywhere across two frames, the field is still read.
        for cut in 1..openai.len() {
            let (a, b) = openai.split_at(cut);
            assert_eq!(count(&[a, b]), 34, "cut at {cut}");
        }
    }

    #[test]
    fn without_a_count_events_then_bytes() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(count(&[stream]), 2);
        assert_eq!(count(&["{\"text\": \"0123456789abcdef\"}"]), 7, "28 bytes");
        assert_eq!(count(&[]), 0);
        // A number cut at the frame's end is not taken as a count.
        assert_eq!(count(&["{\"completion_tokens\":12"]), 5);
    }
}
