//! The HTTP server every role's HTTP ports use (metrics, health, admin, the metadata server,
//! the engine, the router): axum's router (or a service of the role's own) on the servers' own
//! HTTP/1.1 connection driver (`h1`), with what a port facing strangers needs.
//! A client gets `header_read_timeout` to send its request headers (slowloris connections are
//! closed), at most `max_connections` connections are open at once (more are refused, logged
//! at most once per 10 s), and a request whose declared `Content-Length` is above
//! `max_body_bytes` is answered 413 from its headers, without waiting for the body. A body must
//! arrive whole within `body_read_timeout` of its headers (a client that sends headers and then
//! trickles or withholds the body holds nothing for long), and with a `BodyBudget` the bodies
//! being received on the port together stay under a total: beyond it a request is answered 503
//! from its headers.

pub mod gate;
mod h1;
pub mod lanes;

use crate::shutdown::Shutdown;
use crate::transfer::server::LogBudget;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

tokio::task_local! {
    /// The client of the connection a request came on: every connection is served in a task
    /// of its own, within this scope (no allocation per request).
    static PEER: std::net::SocketAddr;
}

/// The address of the client whose request is being answered, for routes that answer by where
/// a request comes from; `None` outside a connection's task.
pub fn peer() -> Option<std::net::SocketAddr> {
    PEER.try_with(|p| *p).ok()
}

/// Limits of one HTTP port.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Longest wait for a request's headers. Default 10 s.
    pub header_read_timeout: Duration,
    /// Most open connections. Default 1024.
    pub max_connections: usize,
    /// Most open connections from one address. Default 256.
    pub max_connections_per_peer: usize,
    /// Largest request body. Default 16 MiB.
    pub max_body_bytes: usize,
    /// Longest wait for a whole request body, from its headers. Default 10 s.
    pub body_read_timeout: Duration,
    /// Bytes of request bodies the port receives at once, all requests together; `None` for
    /// no total (each body is still bounded by `max_body_bytes`).
    pub body_budget: Option<Arc<BodyBudget>>,
    /// On shutdown, how long requests in flight may take to finish. Default 1 s.
    pub grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_connections_per_peer: 256,
            max_body_bytes: 16 << 20,
            body_read_timeout: Duration::from_secs(10),
            body_budget: None,
            grace: Duration::from_secs(1),
        }
    }
}

/// A total of request-body bytes that one port holds at once, charged from a request's headers
/// (its declared length) or as its chunks arrive, and given back when its response is made.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    used: AtomicUsize,
}

impl BodyBudget {
    /// A budget of `limit` bytes of bodies in flight.
    pub fn new(limit: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// A quarter of this machine's memory: the default total of a port that buffers bodies.
    pub fn quarter_of_memory() -> usize {
        // SAFETY: sysconf reads a system constant.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        match (usize::try_from(pages), usize::try_from(page)) {
            (Ok(p), Ok(s)) if p > 0 && s > 0 => p.saturating_mul(s) / 4,
            _ => 1 << 30,
        }
    }

    /// The budget's bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Charges `n` bytes if they fit under the limit.
    fn charge(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// What one request has charged to its port's budget, given back when dropped.
struct Charge {
    budget: Arc<BodyBudget>,
    bytes: AtomicUsize,
}

impl Charge {
    fn add(&self, n: usize) -> bool {
        let ok = self.budget.charge(n);
        if ok {
            self.bytes.fetch_add(n, Ordering::Relaxed);
        }
        ok
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(*self.bytes.get_mut());
    }
}

/// A request body that fails once `deadline` passes before it has all arrived, and that charges
/// the chunks of a body of undeclared length to the port's budget.
struct GuardedBody {
    inner: axum::body::Body,
    /// When the body must have arrived: the headers' arrival plus the timeout.
    until: tokio::time::Instant,
    /// The timer, made the first time the body makes the reader wait (a body that came with
    /// its headers never needs one).
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
    /// Set for a body of undeclared length under a budget.
    charge: Option<Arc<Charge>>,
}

/// Why a request body was cut off.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("the request body did not arrive within {0:?} of its headers")]
    TooSlow(Duration),
    #[error("too many request bodies are being received at once; retry later")]
    OverBudget,
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(charge)) = (frame.data_ref(), &this.charge) {
                    if !charge.add(data.len()) {
                        return Poll::Ready(Some(Err(axum::Error::new(BodyError::OverBudget))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => match this
                .deadline
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(this.until)))
                .as_mut()
                .poll(cx)
            {
                Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyError::TooSlow(
                    this.timeout,
                ))))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Why reading a request body failed, as the status to answer and a sentence: 408 when it did
/// not arrive in time, 503 past the port's budget, 413 past the length limit, else 400.
pub fn body_error(e: &(dyn std::error::Error + 'static)) -> (StatusCode, String) {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(b) = c.downcast_ref::<BodyError>() {
            let status = match b {
                BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
                BodyError::OverBudget => StatusCode::SERVICE_UNAVAILABLE,
            };
            return (status, b.to_string());
        }
        if c.to_string().contains("length limit") {
            return (StatusCode::PAYLOAD_TOO_LARGE, c.to_string());
        }
        cause = c.source();
    }
    (
        StatusCode::BAD_REQUEST,
        format!("could not read the request body: {e}"),
    )
}

/// An error answer shaped as the OpenAI-style APIs answer (the router's clients read it).
fn refusal(status: StatusCode, kind: &str, message: String) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": kind,
        "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// A request's hold on its port's body budget, from its headers until its answer is made.
#[must_use = "the body's bytes stay charged while this lives"]
pub struct BodyTicket(#[allow(dead_code)] Option<Arc<Charge>>);

/// What every request goes through before its handler: a declared `Content-Length` above
/// `max_body_bytes` is answered 413 and one the port's budget has no room for 503, both from the
/// headers; a body still to come gets the body deadline (and, of undeclared length, is charged
/// to the budget as its chunks arrive). A request without a body is passed on untouched. The
/// request comes back ready for its handler, with the ticket to hold until its answer is made.
// The refusal is the answer itself: boxing it would cost every admitted request an allocation.
#[allow(clippy::result_large_err)]
pub fn admit_body(req: Request, limits: &HttpLimits) -> Result<(Request, BodyTicket), Response> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let limit = limits.max_body_bytes;
    if let Some(n) = declared.filter(|n| *n > limit as u64) {
        return Err(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body of {n} bytes is larger than this port's limit of {limit} bytes"),
        ));
    }
    if declared == Some(0) || http_body::Body::is_end_stream(req.body()) {
        return Ok((req, BodyTicket(None)));
    }
    let declared = declared.map(|n| n as usize);
    let mut charge = None;
    if let Some(budget) = &limits.body_budget {
        let c = Arc::new(Charge {
            budget: budget.clone(),
            bytes: AtomicUsize::new(0),
        });
        if !c.add(declared.unwrap_or(0)) {
            return Err(refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                format!(
                    "too many request bodies are being received at once ({} of {} bytes in \
                     flight); retry later",
                    budget.used(),
                    budget.limit()
                ),
            ));
        }
        charge = Some(c);
    }
    let timeout = limits.body_read_timeout;
    let per_chunk = charge.clone().filter(|_| declared.is_none());
    let req = req.map(|inner| {
        axum::body::Body::new(GuardedBody {
            inner,
            until: tokio::time::Instant::now() + timeout,
            deadline: None,
            timeout,
            charge: per_chunk,
        })
    });
    Ok((req, BodyTicket(charge)))
}

/// [`admit_body`] as a middleware.
async fn guard_body(req: Request, next: Next, limits: Arc<HttpLimits>) -> Response {
    match admit_body(req, &limits) {
        Ok((req, ticket)) => {
            let response = next.run(req).await;
            drop(ticket);
            response
        }
        Err(refusal) => refusal,
    }
}

/// `app` with the guards every request goes through ([`admit_body`]), for [`serve_service`].
pub fn guarded(app: axum::Router, limits: &HttpLimits) -> axum::Router {
    // Shared by every request (one reference count, not a copy of the limits' own).
    let guard = Arc::new(limits.clone());
    app.layer(axum::extract::DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| guard_body(req, next, guard.clone()),
        ))
}

/// Serves `app` with the default limits until `shutdown` fires.
pub async fn serve(listener: tokio::net::TcpListener, app: axum::Router, shutdown: Shutdown) {
    serve_with(listener, app, shutdown, HttpLimits::default()).await
}

/// Serves `app` with `limits` until `shutdown` fires; then requests in flight get
/// `limits.grace` to finish.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: Shutdown,
    limits: HttpLimits,
) {
    serve_tls(listener, app, shutdown, limits, None, None).await
}

/// [`serve_with`], over TLS when `tls` is given (the handshake must finish within
/// `limits.header_read_timeout`); `open`, when given, counts the open connections.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: Shutdown,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    open: Option<Arc<AtomicUsize>>,
) {
    let app = guarded(app, &limits);
    serve_service(listener, app, shutdown, limits, tls, open, None).await
}

/// A service a port serves: it answers every request itself (never fails).
pub trait HttpService:
    tower_service::Service<Request, Response = Response, Error = std::convert::Infallible>
    + Clone
    + Send
    + 'static
{
}

impl<S> HttpService for S where
    S: tower_service::Service<Request, Response = Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static
{
}

/// [`serve_tls`] of any service that answers every request itself: one that does the
/// [`admit_body`] guard itself, or is [`guarded`]. With `lanes`, the connections this loop
/// accepts are spread over them (thread-per-core, [`lanes`]); their threads run [`serve_lane`].
/// Without, it serves them all itself within `limits.max_connections`.
pub async fn serve_service<S>(
    listener: tokio::net::TcpListener,
    app: S,
    shutdown: Shutdown,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    open: Option<Arc<AtomicUsize>>,
    lanes: Option<lanes::Handoff>,
) where
    S: HttpService,
    S::Future: Send + 'static,
{
    let server = ConnServer::new(app, &shutdown, &limits, tls, open);
    // The lanes hold the port's one set of slots; alone, this loop is the one lane.
    let mut lanes = lanes.unwrap_or_else(|| {
        lanes::lanes(1, limits.max_connections, limits.max_connections_per_peer).0
    });
    let (slots, max, gate) = (
        lanes.slots.clone(),
        lanes.max_connections,
        lanes.gate.clone(),
    );
    let refuser = Arc::new(Semaphore::new(REFUSALS_ANSWERED));
    let refusals = LogBudget::new(Duration::from_secs(10));
    let local = listener.local_addr().ok();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(?local, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.wait() => break,
        };
        let pass = match gate.admit(peer.ip()) {
            Ok(x) => x,
            Err(why) => {
                if let Some(n) = refusals.spend(Instant::now()) {
                    match why {
                        gate::Refused::Full { limit } => tracing::warn!(?local, limit, refused = n,
                            "HTTP connection limit reached, no connection waiting to give way; refusing connections"),
                        gate::Refused::PeerFull { limit } => tracing::warn!(?local, %peer, limit, refused = n,
                            "HTTP per-address connection limit reached; refusing this address's connections"),
                    }
                }
                refuse(stream, why.message(peer.ip()), &refuser);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if let Some(here) = lanes.place(stream, peer, pass) {
            server.spawn(here);
        }
    }
    drop(lanes);
    finish(&slots, max, limits.grace, local).await;
}

/// Serves the connections handed to `lane` by a thread-per-core port's accepting loop
/// ([`serve_service`] with lanes) until `shutdown` fires, then waits as it does for the
/// requests in flight.
pub async fn serve_lane<S>(
    mut lane: lanes::Lane,
    app: S,
    shutdown: Shutdown,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    open: Option<Arc<AtomicUsize>>,
) where
    S: HttpService,
    S::Future: Send + 'static,
{
    let server = ConnServer::new(app, &shutdown, &limits, tls, open);
    loop {
        let handed = tokio::select! {
            handed = lane.handed.recv() => match handed {
                Some(h) => h,
                None => break,
            },
            _ = shutdown.wait() => break,
        };
        if let Some(here) = handed.served() {
            server.spawn(here);
        }
    }
    // Connections handed but not yet served are closed (their slots given back).
    drop(lane.handed);
    finish(&lane.slots, lane.max_connections, limits.grace, None).await;
}

/// Refused connections answered at once, at most (beyond, a refused one is closed unanswered).
const REFUSALS_ANSWERED: usize = 256;

/// Answers a refused connection 503 with `why` and closes it, after reading what it sent for a
/// moment (a close with unread bytes would be a reset that may discard the answer).
fn refuse(stream: tokio::net::TcpStream, why: String, answering: &Arc<Semaphore>) {
    let Ok(turn) = answering.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _turn = turn;
        let body = serde_json::json!({"error": {"message": why, "type": "service_unavailable",
            "code": 503}})
        .to_string();
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        let _ = stream.try_write(answer.as_bytes());
        let _ = stream.shutdown().await;
        let drain = async {
            let mut scratch = [0u8; 4096];
            while matches!(stream.read(&mut scratch).await, Ok(n) if n > 0) {}
        };
        let _ = tokio::time::timeout(Duration::from_millis(100), drain).await;
    });
}

/// At shutdown: requests in flight finish (their connections were told to close) within the
/// grace, every connection of the port counted by its slots.
async fn finish(
    slots: &Semaphore,
    all: usize,
    grace: Duration,
    local: Option<std::net::SocketAddr>,
) {
    if tokio::time::timeout(grace, slots.acquire_many(all as u32))
        .await
        .is_err()
    {
        tracing::warn!(
            ?local,
            ?grace,
            "HTTP requests still in flight at shutdown; stopping anyway"
        );
    }
}

/// What serving one accepted connection takes, on the thread that serves it.
struct ConnServer<S> {
    service: S,
    stop: Shutdown,
    header_timeout: Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
    open: Option<Arc<AtomicUsize>>,
}

impl<S> ConnServer<S>
where
    S: HttpService,
    S::Future: Send + 'static,
{
    fn new(
        service: S,
        stop: &Shutdown,
        limits: &HttpLimits,
        tls: Option<Arc<rustls::ServerConfig>>,
        open: Option<Arc<AtomicUsize>>,
    ) -> ConnServer<S> {
        ConnServer {
            service,
            stop: stop.clone(),
            header_timeout: limits.header_read_timeout,
            tls: tls.map(tokio_rustls::TlsAcceptor::from),
            open,
        }
    }

    /// Serves `conn` on a task of this thread's runtime, holding what it was counted in (its
    /// connection slot, its lane's count) until it closes.
    fn spawn(&self, conn: lanes::Accepted<tokio::net::TcpStream>) {
        let lanes::Accepted {
            stream,
            peer,
            counted,
            pass,
        } = conn;
        let watch = pass.watch();
        let service = self.service.clone();
        let stop = self.stop.clone();
        let acceptor = self.tls.clone();
        let open = self.open.clone().map(OpenConnection::new);
        let header_timeout = self.header_timeout;
        tokio::spawn(async move {
            let _held = (counted, open, pass);
            match acceptor {
                None => {
                    let served = h1::serve(stream, service, stop, header_timeout, peer, watch);
                    PEER.scope(peer, served).await
                }
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(header_timeout, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(tls)) => {
                            let served = h1::serve(tls, service, stop, header_timeout, peer, watch);
                            PEER.scope(peer, served).await
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

/// Counts a connection as open while it lives.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn new(count: Arc<AtomicUsize>) -> OpenConnection {
        count.fetch_add(1, Ordering::Relaxed);
        OpenConnection(count)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
