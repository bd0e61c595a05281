//! HTTP/1.1 as the router speaks it to workers, without I/O: a request head written into a
//! buffer, a response head parsed out of the read buffer, and the body's framing (a length,
//! chunks, or to the close) decoded in place, its data handed out as slices of the read buffer
//! (no copy). RFC 9112's rules; what a proxy cannot relay is an error naming it.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

/// A response head larger than this is refused.
pub const MAX_HEAD: usize = 64 * 1024;
/// Header lines in one response head, at most.
const MAX_HEADERS: usize = 128;
/// A chunk-size line (with its extensions), at most.
const MAX_CHUNK_LINE: usize = 4096;
/// The trailer section of a chunked body, at most (its fields are read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("the worker's response head is not HTTP/1.x: {0}")]
    Head(httparse::Error),
    #[error("the worker's response head is longer than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("the worker's response header {0:?} has a value that is not valid")]
    Header(String),
    #[error("the worker's content-length {0:?} is not one non-negative number")]
    Length(String),
    #[error("the worker's chunked body is malformed: {0}")]
    Chunk(&'static str),
    #[error("the worker answered {0} (a protocol switch), which the router does not relay")]
    Switch(StatusCode),
    #[error("the worker closed the connection before its body ended")]
    Truncated,
}

/// Writes a request head into `out`: `host`, the caller's headers (less those that frame the
/// message, which are the codec's), and `content-length` for a body (or any `POST`).
pub fn encode_request(
    method: &Method,
    target: &str,
    host: &str,
    headers: &HeaderMap,
    body_len: usize,
    out: &mut BytesMut,
) {
    out.reserve(64 + target.len() + host.len() + 48 * headers.len());
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\nhost: ");
    out.put_slice(host.as_bytes());
    out.put_slice(b"\r\n");
    for (name, value) in headers {
        if matches!(
            name.as_str(),
            "host" | "content-length" | "transfer-encoding" | "connection"
        ) {
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    if body_len > 0 || !matches!(*method, Method::GET | Method::HEAD) {
        out.put_slice(b"content-length: ");
        out.put_slice(itoa::Buffer::new().format(body_len).as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
}

/// A response's head, parsed.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the connection may carry another request once the body is read.
    pub keep_alive: bool,
}

/// Parses the response head at the front of `buf` and splits it off, skipping interim (1xx)
/// responses; `None` while the head is not whole yet.
pub fn parse_response(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, CodecError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut slots);
        let len = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(CodecError::HeadTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(CodecError::Head(e)),
        };
        if len > MAX_HEAD {
            return Err(CodecError::HeadTooLarge);
        }
        let code = resp.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| CodecError::Head(httparse::Error::Status))?;
        let version = match resp.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // Names parsed and the framing read as the lines come; values then become slices
        // of the head.
        let mut names = Vec::with_capacity(resp.headers.len());
        let mut spans = [(0usize, 0usize); MAX_HEADERS];
        let mut delimiters = Delimiters::default();
        for (h, span) in resp.headers.iter().zip(spans.iter_mut()) {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| CodecError::Header(h.name.to_string()))?;
            delimiters.see(&name, h.value)?;
            *span = (
                h.value.as_ptr() as usize - buf.as_ptr() as usize,
                h.value.len(),
            );
            names.push(name);
        }
        let head = buf.split_to(len).freeze();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(CodecError::Switch(status));
        }
        if status.is_informational() {
            continue;
        }
        let mut headers = HeaderMap::with_capacity(names.len());
        for (name, &(start, n)) in names.into_iter().zip(&spans) {
            let value = HeaderValue::from_maybe_shared(head.slice(start..start + n))
                .map_err(|_| CodecError::Header(name.to_string()))?;
            headers.append(name, value);
        }
        let (framing, keep_alive) = delimiters.framing(method, status, version);
        return Ok(Some(Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// What a response head says of where its body ends and of its connection, gathered line by
/// line (RFC 9112 §6.3, §9.3).
#[derive(Debug, Default)]
struct Delimiters {
    /// Whether the last transfer coding named is `chunked`, once one is named.
    chunked: Option<bool>,
    length: Option<u64>,
    /// `connection: close` / `keep-alive`.
    close: bool,
    keep_alive: bool,
}

impl Delimiters {
    fn see(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), CodecError> {
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
                    .ok_or_else(|| CodecError::Length(text()))?;
                match self.length.replace(n) {
                    Some(l) if l != n => Err(CodecError::Length(text())),
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

    /// How the body is delimited, and whether the connection may carry another exchange
    /// after it (only if the body's end is known without the close: HTTP/1.1 unless `close`,
    /// 1.0 only with `keep-alive`).
    fn framing(self, method: &Method, status: StatusCode, version: Version) -> (Framing, bool) {
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
        let persistent = match version {
            Version::HTTP_10 => self.keep_alive,
            _ => !self.close,
        };
        (framing, delimited && persistent)
    }
}

/// How a response body is delimited, and how far it has been read.
#[derive(Debug, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes are still to come.
    Length(u64),
    Chunked(Chunks),
    /// Everything until the worker closes the connection.
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

    /// The worker closed the connection: the end of a body that runs to the close, else a
    /// truncated one.
    pub fn at_eof(&mut self) -> Result<(), CodecError> {
        match self {
            Framing::UntilClose => Ok(()),
            _ if self.is_done() => Ok(()),
            _ => Err(CodecError::Truncated),
        }
    }

    /// The next piece of the body out of `buf` (split off it).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, CodecError> {
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

fn decode_chunks(state: &mut Chunks, buf: &mut BytesMut) -> Result<Decoded, CodecError> {
    loop {
        match state {
            Chunks::Size => match httparse::parse_chunk_size(buf) {
                Ok(httparse::Status::Complete((used, _))) if used > MAX_CHUNK_LINE => {
                    return Err(CodecError::Chunk("a chunk-size line is too long"))
                }
                Ok(httparse::Status::Complete((used, size))) => {
                    buf.advance(used);
                    *state = match size {
                        0 => Chunks::Trailers(0),
                        n => Chunks::Data(n),
                    };
                }
                Ok(httparse::Status::Partial) if buf.len() > MAX_CHUNK_LINE => {
                    return Err(CodecError::Chunk("a chunk-size line is too long"))
                }
                Ok(httparse::Status::Partial) => return Ok(Decoded::NeedMore),
                Err(_) => return Err(CodecError::Chunk("a chunk size is not hexadecimal")),
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
                    return Err(CodecError::Chunk("a chunk's data is not followed by CRLF"));
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
                        return Err(CodecError::Chunk("the trailer section is too long"));
                    }
                    buf.advance(line + 2);
                }
                None if *seen + buf.len() > MAX_TRAILERS => {
                    return Err(CodecError::Chunk("the trailer section is too long"))
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

    fn head(text: &str) -> (Result<Option<Head>, CodecError>, BytesMut) {
        let mut buf = BytesMut::from(text.as_bytes());
        (parse_response(&mut buf, &Method::POST), buf)
    }

    /// Everything `framing` decodes out of `wire`, fed `step` bytes at a time.
    fn decode_all(mut framing: Framing, wire: &[u8], step: usize) -> Result<Vec<u8>, CodecError> {
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
    fn a_request_head_carries_host_the_callers_headers_and_the_length() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("content-length", HeaderValue::from_static("999"));
        headers.insert("x-request-id", HeaderValue::from_static("r1"));
        let mut out = BytesMut::new();
        encode_request(
            &Method::POST,
            "/generate",
            "127.0.0.1:30000",
            &headers,
            12,
            &mut out,
        );
        assert_eq!(
            &out[..],
            b"POST /generate HTTP/1.1\r\nhost: 127.0.0.1:30000\r\ncontent-type: application/json\r\n\
              x-request-id: r1\r\ncontent-length: 12\r\n\r\n"
        );
        let mut get = BytesMut::new();
        encode_request(
            &Method::GET,
            "/health",
            "w:1",
            &HeaderMap::new(),
            0,
            &mut get,
        );
        assert_eq!(&get[..], b"GET /health HTTP/1.1\r\nhost: w:1\r\n\r\n");
    }

    #[test]
    fn a_head_is_parsed_once_whole_and_split_off() {
        let text = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n";
        let (partial, buf) = head(text);
        assert!(partial.unwrap().is_none());
        assert_eq!(
            &buf[..],
            text.as_bytes(),
            "a partial head stays in the buffer"
        );
        let (h, rest) = head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello");
        let h = h.unwrap().unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.framing, Framing::Length(5));
        assert!(h.keep_alive);
        assert_eq!(h.headers["x-a"], "b");
        assert_eq!(&rest[..], b"hello");
    }

    #[test]
    fn interim_responses_are_skipped() {
        let (h, rest) = head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n");
        let h = h.unwrap().unwrap();
        assert_eq!(h.status, StatusCode::NO_CONTENT);
        assert!(h.framing.is_done());
        assert!(rest.is_empty());
    }

    #[test]
    fn what_delimits_a_body_follows_rfc_9112() {
        let framing = |text: &str| {
            let h = head(text).0.unwrap().unwrap();
            (h.framing, h.keep_alive)
        };
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n"),
            (Framing::chunked(), true),
            "chunked wins over a length"
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
            (Framing::UntilClose, false)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\n\r\n"),
            (Framing::UntilClose, false)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: Close\r\n\r\n"),
            (Framing::Length(4), false)
        );
        assert_eq!(
            framing("HTTP/1.0 200 OK\r\ncontent-length: 4\r\n\r\n"),
            (Framing::Length(4), false)
        );
        assert_eq!(
            framing("HTTP/1.0 200 OK\r\ncontent-length: 4\r\nconnection: keep-alive\r\n\r\n"),
            (Framing::Length(4), true)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\n\r\n"),
            (Framing::Length(4), true)
        );
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n"[..]);
        let h = parse_response(&mut buf, &Method::HEAD).unwrap().unwrap();
        assert!(h.framing.is_done(), "the answer to HEAD has no body");
    }

    #[test]
    fn bad_heads_are_errors_that_say_what_is_wrong() {
        let err = |text: &str| head(text).0.unwrap_err();
        assert_eq!(
            err("HTTP/1.1 200 OK\r\ncontent-length: 4, 5\r\n\r\n"),
            CodecError::Length("4, 5".into())
        );
        assert_eq!(
            err("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"),
            CodecError::Length("-1".into())
        );
        assert!(matches!(
            err("SSH-2.0-OpenSSH\r\n\r\n"),
            CodecError::Head(_)
        ));
        assert_eq!(
            err("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n"),
            CodecError::Switch(StatusCode::SWITCHING_PROTOCOLS)
        );
        let long = format!("HTTP/1.1 200 OK\r\nx-long: {}", "a".repeat(MAX_HEAD + 1));
        assert_eq!(err(&long), CodecError::HeadTooLarge);
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
            Err(CodecError::Truncated)
        );
        assert_eq!(
            decode_all(Framing::chunked(), b"5\r\nhello\r\n", 4),
            Err(CodecError::Truncated)
        );
        assert!(matches!(
            decode_all(Framing::chunked(), b"zz\r\nhello\r\n0\r\n\r\n", 100),
            Err(CodecError::Chunk(_))
        ));
        assert!(matches!(
            decode_all(Framing::chunked(), b"5\r\nhelloXX0\r\n\r\n", 100),
            Err(CodecError::Chunk(_))
        ));
        let long = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert!(matches!(
            decode_all(Framing::chunked(), long.as_bytes(), 100_000),
            Err(CodecError::Chunk(_))
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
