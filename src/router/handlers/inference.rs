//! The inference routes (`/generate`, `/v1/chat/completions`, ...): one handler, which names
//! the caller, admits it, reads what the body asks for and hands it to `Router::dispatch`.
//! The router's front door (`super::super::front`) calls it, past the key check and metrics.

use super::access::rid_for;
use super::tokenize::by_token;
use crate::router::proxy::error_response;
use crate::router::request::{inspect_for, Endpoint};
use crate::router::Router;
use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderMap, StatusCode};
use std::sync::Arc;
use tracing::Instrument as _;

/// A refusal of admission: its status, `Retry-After` when the caller may try again, counted by
/// its code (and as an authentication failure when it is one).
pub(in crate::router) fn refusal(
    router: &Router,
    endpoint: Endpoint,
    status: u16,
    code: &'static str,
    msg: &str,
    retry_after: Option<u64>,
    rid: &str,
) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let kind = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            router
                .metrics
                .auth_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            "authentication_error"
        }
        StatusCode::BAD_REQUEST => "invalid_request_error",
        _ => "rate_limit_error",
    };
    router.metrics.error(endpoint.name(), code);
    let mut resp = error_response(status, kind, msg, rid);
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from(secs));
    }
    resp
}
pub(in crate::router) async fn inference(
    router: Arc<Router>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let rid = rid_for(&router, &headers, Some(endpoint));
    // With tenants the caller is named before its body is read, and admitted once the body
    // says how many tokens it asks for; without, the limiter admits it first.
    let mut slot = None;
    let caller = match &router.access.tenants {
        Some(t) => match t.caller(&headers) {
            Ok((table, caller)) => Some((t, table, caller)),
            Err(e) => {
                let msg = e.to_string();
                return refusal(
                    &router,
                    endpoint,
                    e.status(),
                    "tenant_unknown",
                    &msg,
                    None,
                    &rid,
                );
            }
        },
        None => {
            match router.limits.limiter.admit().await {
                Ok(p) => slot = p.map(crate::router::limiter::Slot::Permit),
                Err(e) => {
                    let (status, counter) = match e {
                        crate::router::limiter::Rejected::QueueFull { .. } => (
                            StatusCode::TOO_MANY_REQUESTS,
                            &router.metrics.rate_limited_429,
                        ),
                        crate::router::limiter::Rejected::Timeout(_) => (
                            StatusCode::REQUEST_TIMEOUT,
                            &router.metrics.queue_timeouts_408,
                        ),
                    };
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    router.metrics.error(endpoint.name(), "rate_limited");
                    return error_response(status, "rate_limit_error", &e.to_string(), &rid);
                }
            }
            None
        }
    };
    let limit = router.cfg.limits.max_payload_size;
    let mut bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let (status, msg) = match crate::http_server::body_error(&e) {
                (StatusCode::PAYLOAD_TOO_LARGE, _) => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body is larger than max_payload_size ({limit} bytes)"),
                ),
                other => other,
            };
            router.metrics.error(endpoint.name(), "bad_request");
            return error_response(status, "invalid_request_error", &msg, &rid);
        }
    };
    // A tenant's token rate counts the prompt's tokens: its text is read then.
    let reads = match &caller {
        Some((_, table, _)) if table.counts_tokens() => crate::router::request::Reads::Text,
        _ => router.routing.reads,
    };
    let info = match inspect_for(endpoint, &bytes, reads) {
        Ok(mut info) => by_token(&router, &mut info)
            .await
            .map(|()| info)
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let mut info = match info {
        Ok(i) => i,
        Err(e) => {
            router.metrics.error(endpoint.name(), "bad_request");
            return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &e, &rid);
        }
    };
    if let Some((t, table, caller)) = caller {
        let prompt_tokens = crate::router::tenants::prompt_tokens(&info, bytes.len());
        // The class's priority for the engine's scheduler replaces any the client wrote; the
        // engines then prefill it before the classes after it (its band).
        if let Some(p) = table.classes[caller.class].engine_priority {
            info.band = u8::try_from(caller.class).ok();
            match crate::router::request::set_fields(&bytes, &[("priority", p.into())]) {
                Ok(b) => bytes = bytes::Bytes::from(b),
                Err(e) => {
                    router.metrics.error(endpoint.name(), "bad_request");
                    let msg = e.to_string();
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        &msg,
                        &rid,
                    );
                }
            }
        }
        let ask = crate::router::tenants::admission::Ask {
            tenant: caller.tenant,
            class: caller.class,
            prompt_tokens,
        };
        match t.admission.admit(&table, &ask).await {
            Ok(ticket) => slot = Some(crate::router::limiter::Slot::Ticket(ticket)),
            Err(e) => {
                tracing::debug!(request_id = %rid, tenant = %table.tenants[caller.tenant].name, reason = %e, "not admitted");
                return refusal(
                    &router,
                    endpoint,
                    e.status(),
                    e.code(),
                    &e.to_string(),
                    Some(e.retry_after_secs()),
                    &rid,
                );
            }
        }
    }
    // The span follows the request's future (not the thread, which serves other requests
    // while this one waits).
    let span = tracing::debug_span!("request", request_id = %rid, endpoint = endpoint.name(), stream = info.stream);
    router
        .dispatch(endpoint, &headers, bytes, &info, &rid, slot)
        .instrument(span)
        .await
}
