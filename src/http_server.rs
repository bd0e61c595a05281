//! The HTTP server every role's HTTP ports use (metrics, health, admin, the metadata server,
//! the engine, the router): axum's router on hyper, with what a port facing strangers needs.
//! A client gets `header_read_timeout` to send its request headers (slowloris connections are
//! closed), at most `max_connections` connections are open at once (more are refused, logged
//! at most once per 10 s), and a request whose declared `Content-Length` is above
//! `max_body_bytes` is answered 413 from its headers, without waiting for the body.

use crate::shutdown::Shutdown;
use crate::transfer::server::LogBudget;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Limits of one HTTP port.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Longest wait for a request's headers. Default 10 s.
    pub header_read_timeout: Duration,
    /// Most open connections. Default 1024.
    pub max_connections: usize,
    /// Largest request body. Default 16 MiB.
    pub max_body_bytes: usize,
    /// On shutdown, how long requests in flight may take to finish. Default 1 s.
    pub grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_body_bytes: 16 << 20,
            grace: Duration::from_secs(1),
        }
    }
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
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let max_body = limits.max_body_bytes;
    let app = app
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| refuse_declared_oversize(req, next, max_body),
        ));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if let Some(n) = refusals.spend(Instant::now()) {
                tracing::warn!(?local, %peer, limit = limits.max_connections, refused = n,
                    "HTTP connection limit reached; refusing connections");
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let stop = shutdown.clone();
        let acceptor = acceptor.clone();
        let open = open.clone().map(OpenConnection::new);
        tokio::spawn(async move {
            let _slot = slot;
            let _open = open;
            match acceptor {
                None => serve_connection(stream, service, stop, limits, peer).await,
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(tls)) => serve_connection(tls, service, stop, limits, peer).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    // Requests in flight finish (their connections were told to close) within the grace.
    let all = limits.max_connections as u32;
    if tokio::time::timeout(limits.grace, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(?local, grace = ?limits.grace, "HTTP requests still in flight at shutdown; stopping anyway");
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

/// One connection, until it ends or `stop` fires (then gracefully).
async fn serve_connection<I>(
    io: I,
    service: TowerToHyperService<axum::Router>,
    stop: Shutdown,
    limits: HttpLimits,
    peer: std::net::SocketAddr,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let done = tokio::select! {
        r = conn.as_mut() => Some(r),
        _ = stop.wait() => None,
    };
    let result = match done {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "HTTP connection ended");
    }
}

/// Answers 413 from the headers when the declared body is larger than `limit`.
async fn refuse_declared_oversize(req: Request, next: Next, limit: usize) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => {
            let message = format!(
                "request body of {n} bytes is larger than this port's limit of {limit} bytes"
            );
            let body = serde_json::json!({"error": {"message": message,
                "type": "invalid_request_error", "code": 413}});
            (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response()
        }
        _ => next.run(req).await,
    }
}
