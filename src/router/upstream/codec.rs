//! HTTP/1.1 as the router speaks it to workers, without I/O: a request head written into a
//! buffer, a response head parsed out of the read buffer, and the body's framing (a length,
//! chunks, or to the close) decoded in place, its data handed out as slices of the read buffer
//! (no copy). RFC 9112's rules; what a proxy cannot relay is an error naming it.

use crate::http1::{field_value, Delimiters, FramingError};
pub use crate::http1::{Decoded, Framing};
use bytes::{BufMut, BytesMut};
use http::{HeaderMap, HeaderName, Method, StatusCode, Version};

/// A response head larger than this is refused.
pub const MAX_HEAD: usize = 64 * 1024;
/// Header lines in one response head, at most.
const MAX_HEADERS: usize = 128;

/// Why a worker's answer is not HTTP/1.1 the router takes.
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

impl From<FramingError> for CodecError {
    fn from(e: FramingError) -> CodecError {
        match e {
            FramingError::Length(v) => CodecError::Length(v),
            FramingError::Chunk(why) | FramingError::Coding(why) => CodecError::Chunk(why),
            FramingError::Truncated => CodecError::Truncated,
        }
    }
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
        let mut fields = Vec::with_capacity(resp.headers.len());
        let mut delimiters = Delimiters::default();
        for h in resp.headers.iter() {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| CodecError::Header(h.name.to_string()))?;
            delimiters.see(&name, h.value)?;
            let start = h.value.as_ptr() as usize - buf.as_ptr() as usize;
            fields.push((name, start, h.value.len()));
        }
        let head = buf.split_to(len).freeze();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(CodecError::Switch(status));
        }
        if status.is_informational() {
            continue;
        }
        let mut headers = HeaderMap::with_capacity(fields.len());
        for (name, start, n) in fields {
            headers.append(name, field_value(&head, start, n));
        }
        let (framing, keep_alive) = delimiters.response_framing(method, status, version);
        return Ok(Some(Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn head(text: &str) -> (Result<Option<Head>, CodecError>, BytesMut) {
        let mut buf = BytesMut::from(text.as_bytes());
        (parse_response(&mut buf, &Method::POST), buf)
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
}
