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
use http::{Request, Response};
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
    #[error("{}", crate::router::proxy::describe(.0))]
    Tls(hyper_util::client::legacy::Error),
    #[error("{0}")]
    TlsBody(hyper::Error),
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

    /// Sends `req` (its URI absolute) and waits for the head of the answer.
    pub async fn send(&self, req: Request<Bytes>) -> Result<Response<UpstreamBody>, UpstreamError> {
        let lane = self.lane();
        if req.uri().scheme_str() != Some("http") {
            return lane
                .tls
                .request(req.map(Full::new))
                .await
                .map(|r| r.map(UpstreamBody::Tls))
                .map_err(UpstreamError::Tls);
        }
        let (parts, body) = req.into_parts();
        let authority = parts
            .uri
            .authority()
            .ok_or_else(|| UpstreamError::Address(parts.uri.to_string()))?;
        let addr: Arc<str> = authority.as_str().into();
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(80);
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut head = BytesMut::new();
        codec::encode_request(
            &parts.method,
            target,
            &addr,
            &parts.headers,
            body.len(),
            &mut head,
        );
        // A pooled connection its worker closed meanwhile fails at once: the request goes
        // again on a new one.
        let mut pooled = lane.pool.take(&addr);
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => Conn::open(host, port, CONNECT_TIMEOUT)
                    .await
                    .map_err(|source| UpstreamError::Connect {
                        addr: addr.to_string(),
                        source,
                    })?,
            };
            match conn.exchange(&head, &body, &parts.method).await {
                Ok(h) => {
                    let mut resp = Response::new(UpstreamBody::Raw(RawBody::new(
                        conn,
                        h.framing,
                        h.keep_alive,
                        lane.pool.clone(),
                        addr,
                    )));
                    *resp.status_mut() = h.status;
                    *resp.version_mut() = h.version;
                    *resp.headers_mut() = h.headers;
                    return Ok(resp);
                }
                Err(e) if reused && e.stale() => {
                    tracing::debug!(worker = %addr, error = %e, "a pooled connection was closed by its worker: sending on a new one");
                }
                Err(e) => return Err(e),
            }
        }
    }
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
            let req = Request::post(format!("http://127.0.0.1:{port}/generate"))
                .body(Bytes::from_static(b"{}"))
                .unwrap();
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
        let req = Request::get(format!("http://127.0.0.1:{port}/health"))
            .body(Bytes::new())
            .unwrap();
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
