//! The router's client to its workers. A plain-HTTP worker (an engine on the cluster network)
//! is spoken to over keep-alive HTTP/1.1 connections the router drives itself: the request is
//! written and its answer read by the task serving the client's request, so a streamed token
//! crosses no other task or channel on its way through, and each runtime (thread-per-core)
//! keeps its own pool of connections. An `https://` worker is reached through hyper's client
//! with rustls.
//!
//! - `codec` (pure): the request head written, the response head parsed, bodies decoded.
//! - `conn`: a connection, the idle pool, the response body read off its connection.

mod codec;
mod conn;

pub use codec::CodecError;
use conn::{Conn, Pool, RawBody};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response};
use http_body::{Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// A new connection to a worker is given up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections kept per worker and runtime, at most ...
const MAX_IDLE_PER_WORKER: usize = 1024;
/// ... and for this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// hyper's pooled client, for `https://` workers.
type TlsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why a request to a worker failed: no connection, a timeout, or a bad answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("the worker address {0:?} has no host")]
    Address(String),
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("sending the request: {0}")]
    Write(io::Error),
    #[error("the worker closed the connection {}", match .answered {
        true => "in the middle of its response head",
        false => "before answering",
    })]
    Closed { answered: bool },
    #[error("the worker reset the connection before answering: {0}")]
    Reset(io::Error),
    #[error("reading the response: {0}")]
    Read(io::Error),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("{}", describe(.0))]
    Tls(hyper_util::client::legacy::Error),
    #[error("{0}")]
    TlsBody(hyper::Error),
}

/// The chain of causes of a client error, which hyper hides behind "client error (Connect)".
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl UpstreamError {
    /// Whether a reused connection failed as one its worker had closed while it sat idle:
    /// nothing of the request was taken up, and it goes again on a new connection.
    fn stale(&self) -> bool {
        matches!(
            self,
            UpstreamError::Write(_)
                | UpstreamError::Closed { answered: false }
                | UpstreamError::Reset(_)
        )
    }
}

/// A worker's response body: read off the router's own connection, or hyper's (`https://`).
pub enum UpstreamBody {
    Raw(RawBody),
    Tls(Incoming),
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        match self.get_mut() {
            UpstreamBody::Raw(b) => Pin::new(b).poll_frame(cx),
            UpstreamBody::Tls(b) => Pin::new(b).poll_frame(cx).map_err(UpstreamError::TlsBody),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Raw(b) => b.is_end_stream(),
            UpstreamBody::Tls(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Raw(b) => b.size_hint(),
            UpstreamBody::Tls(b) => b.size_hint(),
        }
    }
}

/// One runtime's connections.
struct Lane {
    pool: Arc<Pool>,
    tls: TlsClient,
}

/// The client to workers: a lane per runtime.
pub struct Upstream {
    lanes: Vec<Lane>,
}

thread_local! {
    /// Which of the router's runtimes this thread runs (thread-per-core), for its lane.
    static RUNTIME_INDEX: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as running the router's runtime `index`.
pub fn enter_runtime(index: usize) {
    RUNTIME_INDEX.with(|i| i.set(index));
}

impl Upstream {
    /// A client with a lane for each of `runtimes`; `https://` workers are reached with `tls`.
    pub fn new(runtimes: usize, tls: rustls::ClientConfig) -> Upstream {
        let lanes = (0..runtimes.max(1))
            .map(|_| Lane {
                pool: Arc::new(Pool::new(MAX_IDLE_PER_WORKER, IDLE_TIMEOUT)),
                tls: tls_client(tls.clone()),
            })
            .collect();
        Upstream { lanes }
    }

    /// Lanes, one per runtime.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    fn lane(&self) -> &Lane {
        &self.lanes[RUNTIME_INDEX.with(|i| i.get()) % self.lanes.len()]
    }

    /// Sends `req` and waits for the head of the answer.
    pub async fn send(&self, req: Outgoing) -> Result<Response<UpstreamBody>, UpstreamError> {
        let lane = self.lane();
        let Some(rest) = req.base.strip_prefix("http://") else {
            // Boxed: hyper's client future would make every request's future its size.
            return Box::pin(self.send_tls(lane, req)).await;
        };
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) =
            host_port(authority).ok_or_else(|| UpstreamError::Address(req.base.to_string()))?;
        let prefix = prefix.trim_end_matches('/');
        let target = match prefix.is_empty() {
            true => std::borrow::Cow::Borrowed(&*req.path),
            false => std::borrow::Cow::Owned(format!("{prefix}{}", req.path)),
        };
        let mut head = BytesMut::new();
        codec::encode_request(
            &req.method,
            &target,
            authority,
            &req.headers,
            req.body.len(),
            &mut head,
        );
        // A pooled connection its worker closed meanwhile fails at once: the request goes
        // again on a new one.
        let mut pooled = lane.pool.take(&req.base);
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => Conn::open(host, port, CONNECT_TIMEOUT)
                    .await
                    .map_err(|source| UpstreamError::Connect {
                        addr: authority.to_string(),
                        source,
                    })?,
            };
            match conn.exchange(&head, &req.body, &req.method).await {
                Ok(h) => {
                    let body =
                        RawBody::new(conn, h.framing, h.keep_alive, lane.pool.clone(), req.base);
                    let mut resp = Response::new(UpstreamBody::Raw(body));
                    *resp.status_mut() = h.status;
                    *resp.version_mut() = h.version;
                    *resp.headers_mut() = h.headers;
                    return Ok(resp);
                }
                Err(e) if reused && e.stale() => {
                    tracing::debug!(worker = %req.base, error = %e, "a pooled connection was closed by its worker: sending on a new one");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Through hyper's client: an `https://` worker (or an address of another form, which
    /// its URI parser judges).
    async fn send_tls(
        &self,
        lane: &Lane,
        req: Outgoing,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let url = format!("{}{}", req.base, req.path);
        let mut r = Request::builder()
            .method(req.method)
            .uri(&url)
            .body(Full::new(req.body))
            .map_err(|_| UpstreamError::Address(url.clone()))?;
        *r.headers_mut() = req.headers;
        lane.tls
            .request(r)
            .await
            .map(|r| r.map(UpstreamBody::Tls))
            .map_err(UpstreamError::Tls)
    }
}

/// A request for a worker, as the router builds it.
pub struct Outgoing {
    pub method: Method,
    /// Where the worker is: `http://host:port` (or `https://`), perhaps with a path prefix.
    pub base: Arc<str>,
    pub path: std::borrow::Cow<'static, str>,
    /// Its headers, less those that frame the message (the client's).
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Host and port of `host[:port]` or `[v6]:port` (port 80 when none is given).
fn host_port(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']')?;
            (host, rest.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 80,
    };
    (!host.is_empty()).then_some((host, port))
}

/// hyper's pooled keep-alive client with rustls, Nagle off (small SSE chunks go out at once).
fn tls_client(tls: rustls::ClientConfig) -> TlsClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_keepalive(Some(Duration::from_secs(60)));
    conn.set_connect_timeout(Some(CONNECT_TIMEOUT));
    conn.enforce_http(false);
    let conn = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(conn);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_max_idle_per_host(MAX_IDLE_PER_WORKER)
        .build(conn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn outgoing(method: Method, port: u16, path: &'static str, body: &'static [u8]) -> Outgoing {
        Outgoing {
            method,
            base: format!("http://127.0.0.1:{port}").into(),
            path: path.into(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn worker_addresses_split_into_host_and_port() {
        assert_eq!(host_port("10.0.0.1:30000"), Some(("10.0.0.1", 30000)));
        assert_eq!(host_port("[::1]:8000"), Some(("::1", 8000)));
        assert_eq!(host_port("[::1]"), Some(("::1", 80)));
        assert_eq!(host_port("engine-0.svc"), Some(("engine-0.svc", 80)));
        assert_eq!(host_port("engine-0.svc:http"), None);
        assert_eq!(host_port(":80"), None);
    }

    /// A worker that answers one request per connection, then closes it without saying so
    /// (no `connection: close`): the answer to how many connections it took.
    async fn one_per_connection(requests: usize) -> (u16, tokio::task::JoinHandle<usize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut accepted = 0;
            for _ in 0..requests {
                let (mut s, _) = l.accept().await.unwrap();
                accepted += 1;
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await
                    .unwrap();
            }
            accepted
        });
        (port, task)
    }

    #[tokio::test]
    async fn a_request_on_a_connection_its_worker_closed_goes_again_on_a_new_one() {
        let (port, worker) = one_per_connection(3).await;
        let tls = crate::tls::client_config(&[], None).unwrap();
        let upstream = Upstream::new(1, tls);
        for i in 0..3 {
            // Sent at once after the last answer: the worker's close has not been seen yet.
            let req = outgoing(Method::POST, port, "/generate", b"{}");
            let resp = upstream
                .send(req)
                .await
                .unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert_eq!(resp.status(), 200);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
        }
        assert_eq!(worker.await.unwrap(), 3, "one connection per request");
    }

    #[tokio::test]
    async fn an_unreachable_worker_is_an_error_naming_it() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let upstream = Upstream::new(1, crate::tls::client_config(&[], None).unwrap());
        let req = outgoing(Method::GET, port, "/health", b"");
        let Err(err) = upstream.send(req).await else {
            panic!("a closed port answered");
        };
        let err = err.to_string();
        assert!(
            err.contains(&format!("connecting to 127.0.0.1:{port}")),
            "{err}"
        );
    }
}
