//! Who may call: the caller's key or tenant, the control plane's keys, this host's clients,
//! and CORS; the request id each answer carries.

use super::S;
use crate::router::proxy::error_response;
use crate::router::request::{request_id, Endpoint};
use crate::router::{config, Router};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{header, HeaderMap, Method, StatusCode};
use std::time::Duration;

pub(in crate::router) fn rid_for(
    router: &Router,
    headers: &HeaderMap,
    endpoint: Option<Endpoint>,
) -> String {
    // A scan of the few headers a request has, cheaper than a lookup per configured name.
    let lookup = |wanted: &str| {
        headers
            .iter()
            .find(|(name, _)| name.as_str().eq_ignore_ascii_case(wanted))
            .and_then(|(_, v)| v.to_str().ok())
    };
    request_id(&router.cfg.server.request_id_headers, lookup, endpoint)
}
/// Constant-time comparison, so the key cannot be guessed byte by byte from timings.
pub(in crate::router) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
/// The key of `Authorization: Bearer <key>`, trimmed.
pub(in crate::router) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::bearer_token)
}
/// The answer to a request for the service's routes (inference, tokenizing, server info) that
/// does not say who calls: with tenants, a tenant's key (or a trusted front's tenant header) or
/// `--api-key`; without, `--api-key` when set. Inference then names the tenant itself
/// (`tenants::identify`), and refuses `--api-key`, which is no tenant's.
pub(in crate::router) fn caller_refusal(router: &Router, headers: &HeaderMap) -> Option<Response> {
    use crate::router::tenants::IdentityError;
    let Some(t) = &router.access.tenants else {
        return key_refusal(router, headers);
    };
    match t.caller(headers) {
        Ok(_) | Err(IdentityError::UnknownClass { .. } | IdentityError::ClassNotAllowed { .. }) => {
            None
        }
        Err(e) => {
            let key = router.cfg.server.api_key.as_ref();
            if key
                .is_some_and(|k| bearer(headers).is_some_and(|g| same(g.as_bytes(), k.as_bytes())))
            {
                return None;
            }
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::UNAUTHORIZED);
            Some(auth_refusal(router, headers, status, &e.to_string()))
        }
    }
}
pub(in crate::router) async fn require_caller(
    State(router): S,
    req: Request,
    next: Next,
) -> Response {
    match caller_refusal(&router, req.headers()) {
        Some(refusal) => refusal,
        None => next.run(req).await,
    }
}
/// An authentication refusal, counted.
pub(in crate::router) fn auth_refusal(
    router: &Router,
    headers: &HeaderMap,
    status: StatusCode,
    msg: &str,
) -> Response {
    router
        .metrics
        .auth_failures
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let rid = rid_for(router, headers, None);
    error_response(status, "authentication_error", msg, &rid)
}
/// With `--api-key`, the answer to a request that does not carry it.
pub(in crate::router) fn key_refusal(router: &Router, headers: &HeaderMap) -> Option<Response> {
    let key = router.cfg.server.api_key.as_ref()?;
    let given = bearer(headers);
    if given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
        return None;
    }
    Some(auth_refusal(
        router,
        headers,
        StatusCode::UNAUTHORIZED,
        "missing or wrong API key (send Authorization: Bearer <key>)",
    ))
}
pub(in crate::router) async fn require_key(State(router): S, req: Request, next: Next) -> Response {
    match key_refusal(&router, req.headers()) {
        Some(refusal) => refusal,
        None => next.run(req).await,
    }
}
/// Whether the request being answered came from this host (loopback); unknown (no peer
/// known) counts as not.
pub(in crate::router) fn from_this_host() -> bool {
    crate::http_server::peer().is_some_and(|c| match c.ip() {
        std::net::IpAddr::V4(ip) => ip.is_loopback(),
        std::net::IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    })
}
/// The control plane's guard: without any key, this host's clients only; with `--control-plane-api-keys`, a key of role `admin` for
/// changes and `admin` or `user` for reads; without them, `--api-key` as for inference.
pub(in crate::router) async fn require_control_key(
    State(router): S,
    req: Request,
    next: Next,
) -> Response {
    if router.access.control_keys.is_empty() {
        if router.cfg.server.api_key.is_none() && !from_this_host() {
            // No credential at all: a worker added from anywhere could draw other users'
            // prompts, and its URL makes the router fetch what it names.
            return auth_refusal(
                &router,
                req.headers(),
                StatusCode::FORBIDDEN,
                "the control plane (workers, cache flushes, loads, the status page) answers only \
                 this host's clients while the router has no key: start it with \
                 --control-plane-api-keys (or --api-key) to manage it from elsewhere",
            );
        }
        return require_key(State(router), req, next).await;
    }
    let read = req.method() == Method::GET;
    let given = bearer(req.headers());
    let holder = given.and_then(|g| {
        router
            .access
            .control_keys
            .iter()
            .find(|k| same(g.as_bytes(), k.key.as_bytes()))
    });
    let (status, message) = match holder {
        Some(k) if read || k.role == config::ControlRole::Admin => {
            tracing::debug!(key = %k.id, method = %req.method(), path = %req.uri().path(), "control plane");
            return next.run(req).await;
        }
        Some(k) => {
            tracing::warn!(key = %k.id, method = %req.method(), path = %req.uri().path(),
                "control-plane change refused: the key's role is user");
            (
                StatusCode::FORBIDDEN,
                "this control-plane key may read, not change (role user)",
            )
        }
        None => (
            StatusCode::UNAUTHORIZED,
            "missing or wrong control-plane key (send Authorization: Bearer <key>)",
        ),
    };
    auth_refusal(&router, req.headers(), status, message)
}
/// CORS as sglang-router answers it: the listed origins, or any origin when none is listed.
pub(in crate::router) fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    let listed: Vec<http::HeaderValue> = origins.iter().filter_map(|o| o.parse().ok()).collect();
    let allow = if listed.is_empty() {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(listed)
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods(Any)
        .allow_headers(Any)
        .max_age(Duration::from_secs(3600))
}
