//! HTTP/1.1 message framing without I/O, shared by the router's client to workers and the
//! servers' own connection driver: what a head says of where its body ends and of its
//! connection (RFC 9112 §6.3, §9.3), and bodies (a length, chunks, or to the close) decoded in
//! place, their data handed out as slices of the read buffer (no copy).

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Method, StatusCode, Version};

/// A chunk-size line (with its extensions), at most.
const MAX_CHUNK_LINE: usize = 4096;
/// The trailer section of a chunked body, at most (its fields are read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;

/// What is wrong with a message's framing. The side that reads it says whose message it was.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FramingError {
    #[error("content-length {0:?} is not one non-negative number")]
    Length(String),
    #[error("the message's framing cannot be read: {0}")]
    Coding(&'static str),
    #[error("the chunked body is malformed: {0}")]
    Chunk(&'static str),
    #[error("the connection closed before the body ended")]
    Truncated,
}

/// A field value httparse accepted, as the slice `start..start + len` of the head it was read
/// from (no copy, no second check).
pub fn field_value(head: &Bytes, start: usize, len: usize) -> HeaderValue {
    // SAFETY: httparse accepts in a field value only HTAB, SP, visible ASCII and obs-text
    // (0x80-0xFF): exactly the bytes a `HeaderValue` may hold.
    unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(start..start + len)) }
}

/// What a message head says of where its body ends and of its connection, gathered line by
/// line (RFC 9112 §6.3, §9.3).
#[derive(Debug, Default)]
pub struct Delimiters {
    /// Whether the last transfer coding named is `chunked`, once one is named.
    chunked: Option<bool>,
    length: Option<u64>,
    /// `connection: close` / `keep-alive`.
    close: bool,
    keep_alive: bool,
}

impl Delimiters {
    /// Takes in one header line.
    pub fn see(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), FramingError> {
        let tokens = || {
            value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .filter(|t| !t.is_empty())
        };
        if name == http::header::TRANSFER_ENCODING {
            let last = tokens().next_back();
            self.chunked = match last {
                Some(t) => Some(t.eq_ignore_ascii_case(b"chunked")),
                None => self.chunked.or(Some(false)),
            };
        } else if name == http::header::CONTENT_LENGTH {
            let text = || String::from_utf8_lossy(value).into_owned();
            let mut parts = value.split(|&b| b == b',').map(<[u8]>::trim_ascii);
            parts.try_for_each(|part| {
                let n = std::str::from_utf8(part)
                    .ok()
                    .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|p| p.parse::<u64>().ok())
                    .ok_or_else(|| FramingError::Length(text()))?;
                match self.length.replace(n) {
                    Some(l) if l != n => Err(FramingError::Length(text())),
                    _ => Ok(()),
                }
            })?;
        } else if name == http::header::CONNECTION {
            for t in tokens() {
                self.close |= t.eq_ignore_ascii_case(b"close");
                self.keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        Ok(())
    }

    /// Whether the connection may carry another exchange after this one, as far as the head
    /// says: HTTP/1.1 unless `close`, 1.0 only with `keep-alive`.
    pub fn persistent(&self, version: Version) -> bool {
        match version {
            Version::HTTP_10 => self.keep_alive,
            _ => !self.close,
        }
    }

    /// How a request's body is delimited (RFC 9112 §6.3): chunked, a length, or none. A
    /// transfer coding other than a final `chunked`, one beside a length (the shape of request
    /// smuggling), or one in HTTP/1.0 is refused.
    pub fn request_framing(&self, version: Version) -> Result<Framing, FramingError> {
        match (self.chunked, self.length) {
            (Some(_), Some(_)) => Err(FramingError::Coding(
                "both transfer-encoding and content-length",
            )),
            (Some(_), None) if version == Version::HTTP_10 => {
                Err(FramingError::Coding("transfer-encoding in HTTP/1.0"))
            }
            (Some(true), None) => Ok(Framing::chunked()),
            (Some(false), None) => Err(FramingError::Coding(
                "a transfer-encoding whose last coding is not chunked",
            )),
            (None, Some(n)) => Ok(Framing::Length(n)),
            (None, None) => Ok(Framing::Length(0)),
        }
    }

    /// How a response's body is delimited, and whether the connection may carry another
    /// exchange after it (only if the body's end is known without the close).
    pub fn response_framing(
        self,
        method: &Method,
        status: StatusCode,
        version: Version,
    ) -> (Framing, bool) {
        let (framing, delimited) = if *method == Method::HEAD
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            (Framing::Length(0), true)
        } else {
            match (self.chunked, self.length) {
                (Some(true), _) => (Framing::chunked(), true),
                // Another coding last: the body runs to the close.
                (Some(false), _) => (Framing::UntilClose, false),
                (None, Some(n)) => (Framing::Length(n), true),
                (None, None) => (Framing::UntilClose, false),
            }
        };
        let persistent = self.persistent(version);
        (framing, delimited && persistent)
    }
}

/// How a message body is delimited, and how far it has been read.
#[derive(Debug, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes are still to come.
    Length(u64),
    Chunked(Chunks),
    /// Everything until the peer closes the connection (responses only).
    UntilClose,
}

/// Where a chunked body's decoding stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunks {
    /// A chunk-size line comes next.
    Size,
    /// This many bytes of a chunk's data are still to come.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section, this many bytes of it read so far.
    Trailers(usize),
    Done,
}

/// One step of decoding a body out of the read buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Data(Bytes),
    /// The buffer holds no more of the body: read more.
    NeedMore,
    End,
}

impl Framing {
    /// A chunked body, before its first chunk's size.
    pub fn chunked() -> Framing {
        Framing::Chunked(Chunks::Size)
    }

    /// Whether the body has been read to its end.
    pub fn is_done(&self) -> bool {
        matches!(self, Framing::Length(0) | Framing::Chunked(Chunks::Done))
    }

    /// Bytes of the body still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Length(n) => Some(*n),
            Framing::Chunked(Chunks::Done) => Some(0),
            _ => None,
        }
    }

    /// The peer closed the connection: the end of a body that runs to the close, else a
    /// truncated one.
    pub fn at_eof(&mut self) -> Result<(), FramingError> {
        match self {
            Framing::UntilClose => Ok(()),
            _ if self.is_done() => Ok(()),
            _ => Err(FramingError::Truncated),
        }
    }

    /// The next piece of the body out of `buf` (split off it).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, FramingError> {
        match self {
            Framing::Length(0) => Ok(Decoded::End),
            Framing::Length(left) => match take(buf, left) {
                Some(data) => Ok(Decoded::Data(data)),
                None => Ok(Decoded::NeedMore),
            },
            Framing::UntilClose => match buf.is_empty() {
                true => Ok(Decoded::NeedMore),
                false => Ok(Decoded::Data(buf.split().freeze())),
            },
            Framing::Chunked(state) => decode_chunks(state, buf),
        }
    }
}

/// Up to `left` bytes off the front of `buf`, if it holds any.
fn take(buf: &mut BytesMut, left: &mut u64) -> Option<Bytes> {
    if buf.is_empty() {
        return None;
    }
    let n = (*left).min(buf.len() as u64) as usize;
    *left -= n as u64;
    Some(buf.split_to(n).freeze())
}

fn decode_chunks(state: &mut Chunks, buf: &mut BytesMut) -> Result<Decoded, FramingError> {
    loop {
        match state {
            Chunks::Size => match httparse::parse_chunk_size(buf) {
                Ok(httparse::Status::Complete((used, _))) if used > MAX_CHUNK_LINE => {
                    return Err(FramingError::Chunk("a chunk-size line is too long"))
                }
                Ok(httparse::Status::Complete((used, size))) => {
                    buf.advance(used);
                    *state = match size {
                        0 => Chunks::Trailers(0),
                        n => Chunks::Data(n),
                    };
                }
                Ok(httparse::Status::Partial) if buf.len() > MAX_CHUNK_LINE => {
                    return Err(FramingError::Chunk("a chunk-size line is too long"))
                }
                Ok(httparse::Status::Partial) => return Ok(Decoded::NeedMore),
                Err(_) => return Err(FramingError::Chunk("a chunk size is not hexadecimal")),
            },
            Chunks::Data(left) => {
                let data = take(buf, left);
                if *left == 0 {
                    *state = Chunks::DataEnd;
                }
                return Ok(data.map_or(Decoded::NeedMore, Decoded::Data));
            }
            Chunks::DataEnd => {
                if buf.len() < 2 {
                    return Ok(Decoded::NeedMore);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(FramingError::Chunk(
                        "a chunk's data is not followed by CRLF",
                    ));
                }
                buf.advance(2);
                *state = Chunks::Size;
            }
            Chunks::Trailers(seen) => match buf.windows(2).position(|w| w == b"\r\n") {
                Some(0) => {
                    buf.advance(2);
                    *state = Chunks::Done;
                    return Ok(Decoded::End);
                }
                Some(line) => {
                    *seen += line + 2;
                    if *seen > MAX_TRAILERS {
                        return Err(FramingError::Chunk("the trailer section is too long"));
                    }
                    buf.advance(line + 2);
                }
                None if *seen + buf.len() > MAX_TRAILERS => {
                    return Err(FramingError::Chunk("the trailer section is too long"))
                }
                None => return Ok(Decoded::NeedMore),
            },
            Chunks::Done => return Ok(Decoded::End),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything `framing` decodes out of `wire`, fed `step` bytes at a time.
    fn decode_all(mut framing: Framing, wire: &[u8], step: usize) -> Result<Vec<u8>, FramingError> {
        let mut buf = BytesMut::new();
        let mut fed = 0;
        let mut out = Vec::new();
        loop {
            match framing.decode(&mut buf)? {
                Decoded::Data(d) => out.extend_from_slice(&d),
                Decoded::End => return Ok(out),
                Decoded::NeedMore if fed == wire.len() => {
                    framing.at_eof()?;
                    return Ok(out);
                }
                Decoded::NeedMore => {
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn bodies_decode_alike_however_the_bytes_arrive() {
        let chunked = b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, 1000] {
            assert_eq!(
                decode_all(Framing::chunked(), chunked, step).unwrap(),
                b"hello world",
                "chunked, {step} bytes at a time"
            );
            assert_eq!(
                decode_all(Framing::Length(11), b"hello world", step).unwrap(),
                b"hello world"
            );
            assert_eq!(
                decode_all(Framing::UntilClose, b"hello world", step).unwrap(),
                b"hello world"
            );
        }
    }

    #[test]
    fn a_body_cut_short_or_malformed_is_an_error() {
        assert_eq!(
            decode_all(Framing::Length(20), b"hello", 3),
            Err(FramingError::Truncated)
        );
        assert_eq!(
            decode_all(Framing::chunked(), b"5\r\nhello\r\n", 4),
            Err(FramingError::Truncated)
        );
        assert!(matches!(
            decode_all(Framing::chunked(), b"zz\r\nhello\r\n0\r\n\r\n", 100),
            Err(FramingError::Chunk(_))
        ));
        assert!(matches!(
            decode_all(Framing::chunked(), b"5\r\nhelloXX0\r\n\r\n", 100),
            Err(FramingError::Chunk(_))
        ));
        let long = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert!(matches!(
            decode_all(Framing::chunked(), long.as_bytes(), 100_000),
            Err(FramingError::Chunk(_))
        ));
    }

    #[test]
    fn a_body_ends_without_consuming_what_follows_it() {
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1"[..]);
        let mut f = Framing::chunked();
        assert_eq!(
            f.decode(&mut buf).unwrap(),
            Decoded::Data(Bytes::from_static(b"abc"))
        );
        assert_eq!(f.decode(&mut buf).unwrap(), Decoded::End);
        assert!(f.is_done());
        assert_eq!(&buf[..], b"HTTP/1.1");
        let mut buf = BytesMut::from(&b"abcdef"[..]);
        let mut f = Framing::Length(3);
        assert_eq!(
            f.decode(&mut buf).unwrap(),
            Decoded::Data(Bytes::from_static(b"abc"))
        );
        assert!(f.is_done());
        assert_eq!(&buf[..], b"def");
    }
}
