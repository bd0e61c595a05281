//! The router's HTTP API (sglang-router 0.3.2's routes): inference, worker management, fan-out
//! admin calls, health and metrics. Accepted sockets get TCP_NODELAY, so a streamed chunk
//! leaves at once instead of waiting for the client's delayed ACK (the peer's 43 ms stall).

use crate::router::config::Backend;
use crate::router::policy::{PolicyKind, TextForm};
use crate::router::proxy::error_response;
use crate::router::request::{inspect_for, request_id, Endpoint, RouteInfo};
use crate::router::tokenize::{parse_ids, token_text, TokenizeError, Tokenizer, INLINE_BYTES};
use crate::router::vllm::Connector;
use crate::router::worker::{Source, Worker, WorkerSpec, WorkerType};
use crate::router::{background, config, discovery, kube, RouterError, Shared};
use crate::shutdown::Shutdown;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{header, HeaderMap, Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

type S = State<Arc<Shared>>;

fn rid_for(shared: &Shared, headers: &HeaderMap, endpoint: Option<Endpoint>) -> String {
    // A scan of the few headers a request has, cheaper than a lookup per configured name.
    let lookup = |wanted: &str| {
        headers
            .iter()
            .find(|(name, _)| name.as_str().eq_ignore_ascii_case(wanted))
            .and_then(|(_, v)| v.to_str().ok())
    };
    request_id(&shared.cfg.server.request_id_headers, lookup, endpoint)
}

/// Constant-time comparison, so the key cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key of `Authorization: Bearer <key>`, trimmed.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::bearer_token)
}

/// The answer to a request for the service's routes (inference, tokenizing, server info) that
/// does not say who calls: with tenants, a tenant's key (or a trusted front's tenant header) or
/// `--api-key`; without, `--api-key` when set. Inference then names the tenant itself
/// (`tenants::identify`), and refuses `--api-key`, which is no tenant's.
fn caller_refusal(shared: &Shared, headers: &HeaderMap) -> Option<Response> {
    use crate::router::tenants::IdentityError;
    let Some(t) = &shared.access.tenants else {
        return key_refusal(shared, headers);
    };
    match t.caller(headers) {
        Ok(_) | Err(IdentityError::UnknownClass { .. } | IdentityError::ClassNotAllowed { .. }) => {
            None
        }
        Err(e) => {
            let key = shared.cfg.server.api_key.as_ref();
            if key
                .is_some_and(|k| bearer(headers).is_some_and(|g| same(g.as_bytes(), k.as_bytes())))
            {
                return None;
            }
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::UNAUTHORIZED);
            Some(auth_refusal(shared, headers, status, &e.to_string()))
        }
    }
}

async fn require_caller(State(shared): S, req: Request, next: Next) -> Response {
    match caller_refusal(&shared, req.headers()) {
        Some(refusal) => refusal,
        None => next.run(req).await,
    }
}

/// An authentication refusal, counted.
fn auth_refusal(shared: &Shared, headers: &HeaderMap, status: StatusCode, msg: &str) -> Response {
    shared
        .metrics
        .auth_failures
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let rid = rid_for(shared, headers, None);
    error_response(status, "authentication_error", msg, &rid)
}

/// With `--api-key`, the answer to a request that does not carry it.
pub(super) fn key_refusal(shared: &Shared, headers: &HeaderMap) -> Option<Response> {
    let key = shared.cfg.server.api_key.as_ref()?;
    let given = bearer(headers);
    if given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
        return None;
    }
    Some(auth_refusal(
        shared,
        headers,
        StatusCode::UNAUTHORIZED,
        "missing or wrong API key (send Authorization: Bearer <key>)",
    ))
}

async fn require_key(State(shared): S, req: Request, next: Next) -> Response {
    match key_refusal(&shared, req.headers()) {
        Some(refusal) => refusal,
        None => next.run(req).await,
    }
}

/// Whether the request being answered came from this host (loopback); unknown (no peer
/// known) counts as not.
fn from_this_host() -> bool {
    crate::http_server::peer().is_some_and(|c| match c.ip() {
        std::net::IpAddr::V4(ip) => ip.is_loopback(),
        std::net::IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    })
}

/// The control plane's guard: without any key, this host's clients only; with `--control-plane-api-keys`, a key of role `admin` for
/// changes and `admin` or `user` for reads; without them, `--api-key` as for inference.
async fn require_control_key(State(shared): S, req: Request, next: Next) -> Response {
    if shared.access.control_keys.is_empty() {
        if shared.cfg.server.api_key.is_none() && !from_this_host() {
            // No credential at all: a worker added from anywhere could draw other users'
            // prompts, and its URL makes the router fetch what it names.
            return auth_refusal(
                &shared,
                req.headers(),
                StatusCode::FORBIDDEN,
                "the control plane (workers, cache flushes, loads, the status page) answers only \
                 this host's clients while the router has no key: start it with \
                 --control-plane-api-keys (or --api-key) to manage it from elsewhere",
            );
        }
        return require_key(State(shared), req, next).await;
    }
    let read = req.method() == Method::GET;
    let given = bearer(req.headers());
    let holder = given.and_then(|g| {
        shared
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
    auth_refusal(&shared, req.headers(), status, message)
}

/// A refusal of admission: its status, `Retry-After` when the caller may try again, counted by
/// its code (and as an authentication failure when it is one).
fn refusal(
    shared: &Shared,
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
            shared
                .metrics
                .auth_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            "authentication_error"
        }
        StatusCode::BAD_REQUEST => "invalid_request_error",
        _ => "rate_limit_error",
    };
    shared.metrics.error(endpoint.name(), code);
    let mut resp = error_response(status, kind, msg, rid);
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from(secs));
    }
    resp
}

pub(super) async fn inference(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let rid = rid_for(&shared, &headers, Some(endpoint));
    // With tenants the caller is named before its body is read, and admitted once the body
    // says how many tokens it asks for; without, the limiter admits it first.
    let mut slot = None;
    let caller = match &shared.access.tenants {
        Some(t) => match t.caller(&headers) {
            Ok((table, caller)) => Some((t, table, caller)),
            Err(e) => {
                let msg = e.to_string();
                return refusal(
                    &shared,
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
            match shared.limits.limiter.admit().await {
                Ok(p) => slot = p.map(crate::router::limiter::Slot::Permit),
                Err(e) => {
                    let (status, counter) = match e {
                        crate::router::limiter::Rejected::QueueFull { .. } => (
                            StatusCode::TOO_MANY_REQUESTS,
                            &shared.metrics.rate_limited_429,
                        ),
                        crate::router::limiter::Rejected::Timeout(_) => (
                            StatusCode::REQUEST_TIMEOUT,
                            &shared.metrics.queue_timeouts_408,
                        ),
                    };
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    shared.metrics.error(endpoint.name(), "rate_limited");
                    return error_response(status, "rate_limit_error", &e.to_string(), &rid);
                }
            }
            None
        }
    };
    let limit = shared.cfg.limits.max_payload_size;
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
            shared.metrics.error(endpoint.name(), "bad_request");
            return error_response(status, "invalid_request_error", &msg, &rid);
        }
    };
    // A tenant's token rate counts the prompt's tokens: its text is read then.
    let reads = match &caller {
        Some((_, table, _)) if table.counts_tokens() => crate::router::request::Reads::Text,
        _ => shared.routing.reads,
    };
    let info = match inspect_for(endpoint, &bytes, reads) {
        Ok(mut info) => by_token(&shared, &mut info)
            .await
            .map(|()| info)
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let mut info = match info {
        Ok(i) => i,
        Err(e) => {
            shared.metrics.error(endpoint.name(), "bad_request");
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
                    shared.metrics.error(endpoint.name(), "bad_request");
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
                    &shared,
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
    shared
        .dispatch(endpoint, &headers, bytes, &info, &rid, slot)
        .instrument(span)
        .await
}

async fn generate(State(s): S, headers: HeaderMap, body: Body) -> Response {
    inference(s, Endpoint::Generate, headers, body).await
}
async fn chat(State(s): S, headers: HeaderMap, body: Body) -> Response {
    inference(s, Endpoint::Chat, headers, body).await
}
async fn completions(State(s): S, headers: HeaderMap, body: Body) -> Response {
    inference(s, Endpoint::Completions, headers, body).await
}
async fn embeddings(State(s): S, headers: HeaderMap, body: Body) -> Response {
    inference(s, Endpoint::Embeddings, headers, body).await
}
async fn rerank(State(s): S, headers: HeaderMap, body: Body) -> Response {
    inference(s, Endpoint::Rerank, headers, body).await
}
async fn score(State(s): S, headers: HeaderMap, body: Body) -> Response {
    inference(s, Endpoint::Score, headers, body).await
}
async fn responses(State(s): S, headers: HeaderMap, body: Body) -> Response {
    inference(s, Endpoint::Responses, headers, body).await
}

// ---------------------------------------------------------------------------------------------
// Health and information

async fn health() -> &'static str {
    "OK"
}

async fn readiness(State(s): S) -> Response {
    let now = std::time::Instant::now();
    let workers = s.workers.registry.snapshot();
    let ready_of = |t: WorkerType| {
        workers
            .iter()
            .filter(|w| w.worker_type == t && w.available(&s.cfg.breaker, now))
            .count()
    };
    let healthy = workers
        .iter()
        .filter(|w| w.available(&s.cfg.breaker, now))
        .count();
    let ready = if s.pd() {
        ready_of(WorkerType::Prefill) > 0 && ready_of(WorkerType::Decode) > 0
    } else {
        ready_of(WorkerType::Regular) > 0
    };
    // A router that just started takes traffic once it knows what the caches hold.
    let warming = s.routing.kv_index.as_ref().is_some_and(|i| i.warming());
    // Workers whose events are not followed yet are routed by cache_aware's guess meanwhile.
    let unfollowed = s.routing.kv_index.as_ref().map(|i| i.unfollowed());
    let ready = ready && !warming;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if ready { "ready" } else { "not ready" },
        "kv_events_catching_up": warming,
        "kv_events_unfollowed_workers": unfollowed,
        "healthy_workers": healthy,
        "total_workers": workers.len(),
    });
    (status, Json(body)).into_response()
}

/// `/v1/models/{id}`: one of the models the workers serve, or 404.
async fn model(State(s): S, Path(id): Path<String>) -> Response {
    let Json(list) = models(State(s)).await;
    match list["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"] == id.as_str()))
    {
        Some(m) => Json(m.clone()).into_response(),
        None => error_response(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("the model {id:?} is not served by any worker"),
            "",
        ),
    }
}

/// `/engine_metrics`: every worker's `/metrics`, each sample labelled with its worker.
async fn engine_metrics(State(s): S) -> Response {
    let workers = s.workers.registry.snapshot();
    let mut seen = std::collections::HashSet::new();
    let mut out = String::new();
    for w in workers.iter() {
        let Ok((st, body)) = s
            .call(w, Method::GET, "/metrics", Duration::from_secs(5))
            .await
        else {
            continue;
        };
        if !st.is_success() {
            continue;
        }
        out.push_str(&label_samples(
            &String::from_utf8_lossy(&body),
            &w.url,
            &mut seen,
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// Prometheus text with `worker="<url>"` added to every sample; `# HELP`/`# TYPE` lines
/// already written (in `seen`) are left out.
pub fn label_samples(
    text: &str,
    worker: &str,
    seen: &mut std::collections::HashSet<String>,
) -> String {
    let esc = worker.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            if seen.insert(line.to_string()) {
                out.push_str(line);
                out.push('\n');
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let (name, rest) = line.split_at(name_end);
        match rest.strip_prefix('{') {
            Some(labels) => out.push_str(&format!("{name}{{worker=\"{esc}\",{labels}")),
            None => out.push_str(&format!("{name}{{worker=\"{esc}\"}}{rest}")),
        }
        out.push('\n');
    }
    out
}

async fn models(State(s): S) -> Json<Value> {
    let mut ids: Vec<String> = s
        .workers
        .registry
        .snapshot()
        .iter()
        .filter_map(|w| w.model_id.read().clone())
        .collect();
    ids.sort();
    ids.dedup();
    let data: Vec<Value> = ids
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "rbgctl"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn server_info(State(s): S, headers: HeaderMap) -> Response {
    let rid = rid_for(&s, &headers, None);
    s.proxy_get("/get_server_info", &rid).await
}

async fn model_info(State(s): S, headers: HeaderMap) -> Response {
    let rid = rid_for(&s, &headers, None);
    s.proxy_get("/get_model_info", &rid).await
}

async fn health_generate(State(s): S, headers: HeaderMap) -> Response {
    let rid = rid_for(&s, &headers, None);
    s.proxy_get("/health_generate", &rid).await
}

async fn metrics(State(s): S) -> Response {
    let (running, queued) = match &s.access.tenants {
        Some(t) => t.admission.load(),
        None => (s.limits.limiter.running(), s.limits.limiter.queued()),
    };
    let text = s.metrics.render(
        &s.workers.registry.snapshot(),
        &s.cfg.breaker,
        running,
        queued,
        |t| match t {
            WorkerType::Regular => s.routing.policy.name(),
            WorkerType::Prefill => s.routing.prefill_policy.name(),
            WorkerType::Decode => s.routing.decode_policy.name(),
        },
    );
    let mut text = match &s.routing.kv_index {
        Some(k) => text + &k.render_metrics(),
        None => text,
    };
    if let Some(t) = &s.access.tenants {
        let mut p = crate::telemetry::PromText::new();
        t.render(&mut p);
        text.push_str(&p.finish());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

// ---------------------------------------------------------------------------------------------
// Workers

fn worker_json(s: &Shared, w: &Worker) -> Value {
    json!({
        "id": w.id,
        "url": &*w.url,
        "worker_type": w.worker_type,
        "bootstrap_port": w.bootstrap_port,
        "is_healthy": w.healthy(),
        "circuit_state": w.circuit(&s.cfg.breaker, std::time::Instant::now()),
        "load": w.load(),
        "queued_prefill_tokens": w.queued_prefill_total(),
        "processed": w.processed(),
        "source": w.source,
        "model_id": *w.model_id.read(),
        "kv_connector": w.kv_connector.map(Connector::name),
        "engine": w.engine.read().map(Backend::name),
        "models": &*w.served_models.read(),
    })
}

/// `POST /workers` (sglang-router's `WorkerConfigRequest`; fields it has that rbgctl does not
/// use, such as tokenizer paths, are accepted and ignored: rbgctl never fetches tokenizers).
#[derive(Deserialize)]
struct AddWorker {
    url: String,
    #[serde(default)]
    worker_type: Option<String>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    model_id: Option<String>,
    /// vLLM PD: `MooncakeConnector` / `NixlConnector` (SMG's field).
    #[serde(default)]
    kv_connector: Option<String>,
    /// vLLM PD with Mooncake: the prefill engine's id (SMG's field).
    #[serde(default)]
    kv_engine_id: Option<String>,
}

/// With a local tokenizer and a cache-aware policy, the routing text becomes token ids (text
/// and `input_ids` requests then share prefixes). Long texts are tokenized off the async
/// threads.
async fn by_token(s: &Arc<Shared>, info: &mut RouteInfo) -> Result<(), TokenizeError> {
    let Some(t) = &s.routing.tokenizer else {
        return Ok(());
    };
    // The policies that match a prompt's tokens (bucket counts its characters).
    let by_tokens = [
        &s.routing.policy,
        &s.routing.prefill_policy,
        &s.routing.decode_policy,
    ]
    .iter()
    .any(|p| matches!(p.kind(), PolicyKind::CacheAware | PolicyKind::PrefixHash));
    if !by_tokens || info.text.is_empty() {
        return Ok(());
    }
    info.text = if info.form == TextForm::SpacedIds {
        token_text(&parse_ids(&info.text))
    } else if info.text.len() <= INLINE_BYTES {
        t.routing_text(&info.text)?
    } else {
        let (t, text) = (t.clone(), std::mem::take(&mut info.text));
        tokio::task::spawn_blocking(move || t.routing_text(&text))
            .await
            .map_err(|e| TokenizeError::Encode(e.to_string()))??
    };
    info.form = TextForm::TokenChars;
    Ok(())
}

/// `/v1/tokenize`: `prompt` (or `text`), a string or a list of them.
#[derive(serde::Deserialize)]
struct TokenizeBody {
    #[serde(alias = "text")]
    prompt: Value,
    #[serde(default = "yes")]
    add_special_tokens: bool,
}

/// `/v1/detokenize`: `tokens`, a list of ids or a list of such lists.
#[derive(serde::Deserialize)]
struct DetokenizeBody {
    tokens: Value,
    #[serde(default = "yes")]
    skip_special_tokens: bool,
}

fn yes() -> bool {
    true
}

fn no_tokenizer() -> Response {
    error_response(
        StatusCode::NOT_IMPLEMENTED,
        "invalid_request_error",
        "no local tokenizer: start the router with --tokenizer-path (a tokenizer.json)",
        "",
    )
}

/// The tokenizer and the request body, or the answer why not.
#[allow(clippy::result_large_err)]
fn tokenizer_and<T: serde::de::DeserializeOwned>(
    s: &Shared,
    body: &[u8],
) -> Result<(Arc<Tokenizer>, T), Response> {
    let t = s.routing.tokenizer.clone().ok_or_else(no_tokenizer)?;
    let req = serde_json::from_slice(body).map_err(|e| bad(&format!("request body: {e}")))?;
    Ok((t, req))
}

/// Mooncake Conductor's indexer API over the router's global KV index (`precise_prefix`):
/// `POST /query` (token ids) and `POST /query_by_hash` (SGLang's block hashes).
async fn conductor_query(State(s): S, body: axum::body::Bytes) -> Response {
    let Some(index) = s.routing.kv_index.clone() else {
        return bad("no KV index: it is kept with --policy precise_prefix");
    };
    // Reading a long query and hashing its blocks is CPU work: off the runtime threads, one
    // query at a time per core at most, so that queries cannot stall the requests routed.
    let Ok(_turn) = s.limits.cpu_work.acquire().await else {
        return bad("the router is stopping");
    };
    let answered = tokio::task::spawn_blocking(move || {
        let q: crate::router::kv_index::ConductorQuery =
            serde_json::from_slice(&body).map_err(|e| format!("not a Conductor query: {e}"))?;
        drop(body);
        index.conductor(&q)
    });
    match answered.await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => bad(&e),
        Err(e) => bad(&format!("the query failed: {e}")),
    }
}

async fn tokenize(State(s): S, body: axum::body::Bytes) -> Response {
    let (t, req): (_, TokenizeBody) = match tokenizer_and(&s, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let encode = |text: &str| t.encode(text, req.add_special_tokens);
    let answer = match &req.prompt {
        Value::String(text) => encode(text).map(|ids| json!({"tokens": ids, "count": ids.len()})),
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .map(encode)
            .collect::<Result<Vec<_>, _>>()
            .map(|all| {
                let counts: Vec<usize> = all.iter().map(Vec::len).collect();
                json!({"tokens": all, "count": counts})
            }),
        _ => return bad("prompt: a string or a list of strings"),
    };
    match answer {
        Ok(v) => Json(v).into_response(),
        Err(e) => bad(&e.to_string()),
    }
}

async fn detokenize(State(s): S, body: axum::body::Bytes) -> Response {
    let (t, req): (_, DetokenizeBody) = match tokenizer_and(&s, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    let decode = |ids: &[u32]| t.decode(ids, req.skip_special_tokens);
    let answer = if let Some(one) = ids(&req.tokens) {
        decode(&one).map(|text| json!({"text": text}))
    } else if let Some(many) = req
        .tokens
        .as_array()
        .and_then(|l| l.iter().map(ids).collect::<Option<Vec<_>>>())
    {
        many.iter()
            .map(|x| decode(x))
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| json!({"text": texts}))
    } else {
        return bad("tokens: a list of token ids, or a list of such lists");
    };
    match answer {
        Ok(v) => Json(v).into_response(),
        Err(e) => bad(&e.to_string()),
    }
}

fn bad(msg: &str) -> Response {
    error_response(StatusCode::BAD_REQUEST, "invalid_request_error", msg, "")
}

fn spec_from(s: &Shared, a: AddWorker) -> Result<WorkerSpec, String> {
    let url = config::normalize_url("url", &a.url).map_err(|e| e.to_string())?;
    let worker_type = match a
        .worker_type
        .as_deref()
        .unwrap_or(if s.pd() { "" } else { "regular" })
    {
        "regular" => WorkerType::Regular,
        "prefill" => WorkerType::Prefill,
        "decode" => WorkerType::Decode,
        "" => return Err("worker_type: a PD router needs \"prefill\" or \"decode\"".into()),
        other => {
            return Err(format!(
                "worker_type: expected regular, prefill or decode, got {other:?}"
            ))
        }
    };
    if s.pd() == (worker_type == WorkerType::Regular) {
        return Err(format!(
            "worker_type: a {} router does not take {} workers",
            if s.pd() { "PD" } else { "regular" },
            worker_type.name()
        ));
    }
    let kv_connector = match a.kv_connector.as_deref() {
        None => None,
        Some(c) => match Connector::parse(c) {
            Ok(c) => Some(c),
            Err(e) => {
                s.metrics
                    .vllm_kv_transfer_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(worker = %url, "{e}");
                return Err(format!("kv_connector: {e}"));
            }
        },
    };
    Ok(WorkerSpec {
        url,
        worker_type,
        bootstrap_port: a.bootstrap_port,
        api_key: a.api_key,
        model_id: a.model_id,
        kv_connector,
        kv_engine_id: a.kv_engine_id,
        dp_rank: None,
    })
}

fn added(s: &Arc<Shared>, w: &Arc<Worker>) {
    background::learn_about(s.clone(), w.clone());
}

/// Adds a worker through the API (with `--dp-aware`, one per rank: the first is returned).
async fn register(s: &Arc<Shared>, spec: WorkerSpec) -> Result<Arc<Worker>, Response> {
    let ranks = s.dp_specs(&spec).await.map_err(|e| {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "worker_unavailable",
            &e,
            "",
        )
    })?;
    let mut first = None;
    for rank in ranks {
        let w = s
            .workers
            .registry
            .add(rank, Source::Api)
            .map_err(conflict)?;
        added(s, &w);
        first.get_or_insert(w);
    }
    first.ok_or_else(|| bad("the worker has no ranks"))
}

/// A duplicate URL.
fn conflict(e: crate::router::worker::RegistryError) -> Response {
    error_response(StatusCode::CONFLICT, "conflict", &e.to_string(), "")
}

async fn add_worker(State(s): S, body: axum::body::Bytes) -> Response {
    let a: AddWorker = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return bad(&format!("request body: {e}")),
    };
    let spec = match spec_from(&s, a) {
        Ok(x) => x,
        Err(e) => return bad(&e),
    };
    match register(&s, spec).await {
        Ok(w) => (
            StatusCode::ACCEPTED,
            Json(json!({
                "status": "accepted",
                "worker_id": w.id,
                "url": &*w.url,
                "location": format!("/workers/{}", w.id),
                "message": "Worker added",
            })),
        )
            .into_response(),
        Err(e) => e,
    }
}

async fn list_workers(State(s): S) -> Json<Value> {
    let workers: Vec<Value> = s
        .workers
        .registry
        .snapshot()
        .iter()
        .map(|w| worker_json(&s, w))
        .collect();
    Json(json!({"workers": workers, "total": workers.len()}))
}

#[derive(Deserialize)]
struct PageQuery {
    part: Option<String>,
}

/// The status page (`super::ui`): the same workers as `GET /workers`, drawn.
async fn status_page(State(s): S, Query(q): Query<PageQuery>) -> Response {
    let now = std::time::Instant::now();
    let workers = s
        .workers
        .registry
        .snapshot()
        .iter()
        .map(|w| super::ui::WorkerRow {
            url: w.url.to_string(),
            worker_type: w.worker_type.name(),
            healthy: w.healthy(),
            circuit: w.circuit(&s.cfg.breaker, now).name(),
            load: w.load(),
            processed: w.processed(),
            model: w.model_id.read().clone(),
        })
        .collect();
    let view = super::ui::View {
        policy: if s.pd() {
            format!(
                "prefill: {}, decode: {}",
                s.routing.prefill_policy.name(),
                s.routing.decode_policy.name()
            )
        } else {
            s.routing.policy.name().to_string()
        },
        pd: s.pd(),
        workers,
        tenants: s.access.tenants.as_ref().map(|t| t.admission.rows()),
    };
    let part = crate::report::live::Part::from_query(q.part.as_deref());
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        super::ui::render(&view, part),
    )
        .into_response()
}

async fn get_worker(State(s): S, Path(id): Path<String>) -> Response {
    match s.workers.registry.get(&id) {
        Some(w) => Json(worker_json(&s, &w)).into_response(),
        None => unknown_worker(&id),
    }
}

fn unknown_worker(id: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("no worker {id:?} (see GET /workers)"),
        "",
    )
}

async fn delete_worker(State(s): S, Path(id): Path<String>) -> Response {
    match s.workers.registry.remove(&id) {
        Ok(gone) => {
            for w in &gone {
                s.forget(&w.url);
            }
            let w = &gone[0];
            (
                StatusCode::ACCEPTED,
                Json(
                    json!({"status": "accepted", "worker_id": w.id, "url": &*w.url,
                    "removed": gone.iter().map(|w| &*w.url).collect::<Vec<_>>(),
                    "message": "Worker removed"}),
                ),
            )
                .into_response()
        }
        Err(_) => unknown_worker(&id),
    }
}

#[derive(Deserialize)]
struct UrlQuery {
    url: Option<String>,
}

async fn add_worker_legacy(State(s): S, Query(q): Query<UrlQuery>) -> Response {
    let Some(url) = q.url else {
        return bad("missing ?url=");
    };
    let a = AddWorker {
        url,
        worker_type: None,
        bootstrap_port: None,
        api_key: None,
        model_id: None,
        kv_connector: None,
        kv_engine_id: None,
    };
    let spec = match spec_from(&s, a) {
        Ok(x) => x,
        Err(e) => return bad(&e),
    };
    match register(&s, spec).await {
        Ok(w) => (
            StatusCode::OK,
            format!("Successfully added worker: {}", w.url),
        )
            .into_response(),
        Err(e) => e,
    }
}

async fn remove_worker_legacy(State(s): S, Query(q): Query<UrlQuery>) -> Response {
    let Some(url) = q.url else {
        return bad("missing ?url=");
    };
    let url = config::normalize_url("url", &url).unwrap_or(url);
    match s.workers.registry.remove(&url) {
        Ok(gone) => {
            for w in &gone {
                s.forget(&w.url);
            }
            (
                StatusCode::OK,
                format!("Successfully removed worker: {url}"),
            )
                .into_response()
        }
        Err(_) => unknown_worker(&url),
    }
}

async fn list_worker_urls(State(s): S) -> Json<Value> {
    let urls: Vec<String> = s
        .workers
        .registry
        .snapshot()
        .iter()
        .map(|w| w.url.to_string())
        .collect();
    Json(json!({"urls": urls}))
}

// ---------------------------------------------------------------------------------------------
// Fan-out admin calls

async fn flush_cache(State(s): S) -> Response {
    let workers = s.workers.registry.snapshot();
    let mut set = tokio::task::JoinSet::new();
    for w in workers.iter().cloned() {
        let s = s.clone();
        set.spawn(async move {
            let r = s
                .call(&w, Method::POST, "/flush_cache", Duration::from_secs(30))
                .await;
            (w.url.to_string(), r)
        });
    }
    let mut results = Vec::new();
    let mut all_ok = true;
    while let Some(Ok((url, r))) = set.join_next().await {
        let (ok, detail) = match r {
            Ok((st, _)) if st.is_success() => (true, st.as_u16().to_string()),
            Ok((st, body)) => (false, format!("{st}: {}", String::from_utf8_lossy(&body))),
            Err(e) => (false, e),
        };
        all_ok &= ok;
        results.push(json!({"worker": url, "ok": ok, "detail": detail}));
    }
    let status = if all_ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_GATEWAY
    };
    let message = if all_ok {
        "Cache flushed on all workers"
    } else {
        "Cache flush failed on some workers"
    };
    (
        status,
        Json(json!({"message": message, "workers": results})),
    )
        .into_response()
}

/// Tokens a worker's `/get_load` reports (an object, or a list of per-rank objects).
fn tokens_of(v: &Value) -> Option<i64> {
    match v {
        Value::Array(items) => items.iter().map(tokens_of).sum(),
        Value::Object(o) => o.get("num_tokens").and_then(Value::as_i64),
        _ => None,
    }
}

async fn get_loads(State(s): S) -> Json<Value> {
    let workers = s.workers.registry.snapshot();
    let mut set = tokio::task::JoinSet::new();
    for (i, w) in workers.iter().cloned().enumerate() {
        let s = s.clone();
        set.spawn(async move {
            let r = s
                .call(&w, Method::GET, "/get_load", Duration::from_secs(5))
                .await;
            let load = match r {
                Ok((st, body)) if st.is_success() => serde_json::from_slice::<Value>(&body)
                    .ok()
                    .as_ref()
                    .and_then(tokens_of)
                    .unwrap_or(-1),
                _ => -1,
            };
            (
                i,
                json!({"worker": &*w.url, "worker_type": w.worker_type, "load": load,
                "requests_in_flight": w.load()}),
            )
        });
    }
    let mut out: Vec<(usize, Value)> = Vec::new();
    while let Some(Ok(x)) = set.join_next().await {
        out.push(x);
    }
    out.sort_by_key(|(i, _)| *i);
    Json(json!({"workers": out.into_iter().map(|(_, v)| v).collect::<Vec<_>>()}))
}

/// Counts every request in SMG's `smg_http_*` families, under its route's pattern.
async fn http_metrics(State(s): S, req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    // A cheap clone (the pattern is shared), kept past `next.run`.
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let resp = next.run(req).await;
    let code = resp
        .extensions()
        .get::<crate::router::metrics::ErrorCode>()
        .map_or("", |c| c.0.as_str());
    s.metrics.http.observe(
        &method,
        route.as_ref().map_or("unmatched", |m| m.as_str()),
        resp.status().as_u16(),
        code,
        started.elapsed(),
    );
    resp
}

async fn not_found(State(s): S, req: Request) -> Response {
    let resp = error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("no route {} {}", req.method(), req.uri().path()),
        "",
    );
    let took = std::time::Duration::ZERO;
    (s.metrics.http).observe(req.method(), "unmatched", 404, "not_found", took);
    resp
}

/// The router's routes.
pub fn app(shared: Arc<Shared>) -> Router {
    let protected = Router::new()
        .route("/generate", post(generate))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/rerank", post(rerank))
        .route("/v1/score", post(score))
        .route("/v1/responses", post(responses))
        .merge(answered_here(&shared))
        // Runs a generation on a worker, or tells what the workers are and how loaded.
        .route("/health_generate", get(health_generate))
        .route("/get_server_info", get(server_info))
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            require_caller,
        ));
    let control = Router::new()
        .route("/workers", post(add_worker).get(list_workers))
        .route("/workers/{id}", get(get_worker).delete(delete_worker))
        .route("/add_worker", post(add_worker_legacy))
        .route("/remove_worker", post(remove_worker_legacy))
        .route("/list_workers", get(list_worker_urls))
        .route("/flush_cache", post(flush_cache))
        .route("/get_loads", get(get_loads))
        // Fetches every worker's /metrics: as much the control plane's as the workers are.
        .route("/engine_metrics", get(engine_metrics))
        .route("/ui", get(status_page))
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            require_control_key,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/liveness", get(health))
        .route("/readiness", get(readiness))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/get_model_info", get(model_info))
        .route("/metrics", get(metrics))
        .merge(protected)
        .merge(control)
        .route_layer(middleware::from_fn_with_state(shared.clone(), http_metrics))
        .fallback(not_found)
        .layer(cors(&shared.cfg.server.cors_allowed_origins))
        .with_state(shared)
}

/// The routes the router answers itself from a body (tokenizing, Conductor's queries), with a
/// body limit of their own: far below the inference routes', whose bodies are forwarded.
fn answered_here(shared: &Shared) -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/tokenize", post(tokenize))
        .route("/tokenize", post(tokenize))
        .route("/v1/detokenize", post(detokenize))
        .route("/detokenize", post(detokenize))
        .route("/query", post(conductor_query))
        .route("/query_by_hash", post(conductor_query))
        .layer(axum::extract::DefaultBodyLimit::max(
            shared.cfg.limits.max_query_payload_size,
        ))
}

/// CORS as sglang-router answers it: the listed origins, or any origin when none is listed.
pub(super) fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
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

/// Waits until every worker given at start answers its health check, checking every
/// `worker_startup_check_interval`; an error naming those that did not answer within
/// `worker_startup_timeout_secs` (as sglang-router's startup check, except that the router
/// serves meanwhile, its readiness saying whether any worker is there).
pub async fn await_startup(s: Arc<Shared>) -> Result<(), RouterError> {
    let health = !s.cfg.health.disabled;
    let (timeout, every) = (
        s.cfg.health.startup_timeout.0,
        s.cfg.health.startup_check_interval.0,
    );
    let started = std::time::Instant::now();
    let mut waiting: Vec<Arc<Worker>> = s
        .workers
        .registry
        .snapshot()
        .iter()
        .filter(|w| health && w.source == Source::Flags)
        .cloned()
        .collect();
    // --dp-aware: workers given at start are added once they tell their ranks.
    let mut unranked = if s.cfg.server.dp_aware {
        s.flag_specs()
    } else {
        Vec::new()
    };
    loop {
        let mut still_unranked = Vec::new();
        for spec in unranked {
            match s.dp_specs(&spec).await {
                Ok(ranks) => {
                    for rank in ranks {
                        match s.workers.registry.add(rank, Source::Flags) {
                            Ok(w) => {
                                added(&s, &w);
                                if health {
                                    waiting.push(w);
                                }
                            }
                            Err(e) => tracing::warn!("{e}"),
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!("{e}");
                    still_unranked.push(spec);
                }
            }
        }
        unranked = still_unranked;
        let mut still = Vec::new();
        for w in waiting {
            let check = every.min(Duration::from_secs(5));
            match s.call(&w, Method::GET, &s.cfg.health.endpoint, check).await {
                Ok((st, _)) if st.is_success() => {}
                _ => still.push(w),
            }
        }
        waiting = still;
        if waiting.is_empty() && unranked.is_empty() {
            tracing::info!(after = ?started.elapsed(), "the workers given at start answer");
            return Ok(());
        }
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            let urls: Vec<&str> = waiting
                .iter()
                .map(|w| &*w.url)
                .chain(unranked.iter().map(|spec| spec.url.as_str()))
                .collect();
            return Err(RouterError::Startup(format!(
                "workers did not answer {} within {timeout:?} (--worker-startup-timeout-secs): {}",
                s.cfg.health.endpoint,
                urls.join(", ")
            )));
        }
        tracing::info!(waiting = waiting.len(), left = ?left, "waiting for the workers given at start");
        tokio::time::sleep(every.min(left)).await;
    }
}

/// Starts what runs beside the API: health checks, tree eviction, and worker discovery.
pub async fn start_background(shared: &Arc<Shared>) -> Result<(), RouterError> {
    background::start(shared);
    if let Some(t) = &shared.access.tenants {
        t.watch();
    }
    for w in shared.workers.registry.snapshot().iter() {
        added(shared, w);
    }
    if shared.cfg.discovery.rbg_config.is_some() {
        discovery::start(shared.clone());
    }
    if shared.cfg.discovery.kubernetes {
        kube::start(shared.clone())?;
    }
    Ok(())
}

/// The API's limits: bodies, connections (shared by every thread's listener), grace.
fn http_limits(shared: &Shared) -> crate::http_server::HttpLimits {
    let grace = shared
        .cfg
        .server
        .shutdown_grace_period
        .0
        .min(Duration::from_secs(86_400));
    crate::http_server::HttpLimits {
        max_body_bytes: shared.cfg.limits.max_payload_size,
        max_connections: crate::router::MAX_CONNECTIONS,
        max_connections_per_peer: crate::router::MAX_CONNECTIONS_PER_PEER,
        body_budget: Some(shared.limits.body_budget.clone()),
        grace,
        ..Default::default()
    }
}

/// Serves the API (and the separate metrics listener) until `shutdown` fires; requests in
/// flight then get up to `shutdown_grace_period_secs` to finish.
pub async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    metrics_listener: Option<tokio::net::TcpListener>,
    lanes: crate::http_server::lanes::Handoff,
    shutdown: Shutdown,
) {
    if let Some(ml) = metrics_listener {
        let mapp = Router::new()
            .route("/metrics", get(metrics))
            .route("/health", get(health))
            .with_state(shared.clone());
        tokio::spawn(crate::http_server::serve(ml, mapp, shutdown.clone()));
    }
    tracing::info!(
        local = ?listener.local_addr().ok(),
        policy = shared.routing.policy.name(),
        pd = shared.pd(),
        workers = shared.workers.registry.snapshot().len(),
        runtime = ?shared.cfg.server.runtime,
        threads = lanes.lanes(),
        "router listening"
    );
    let announce = shutdown.clone();
    let grace = http_limits(&shared).grace;
    tokio::spawn(async move {
        announce.wait().await;
        tracing::info!(?grace, "shutting down: finishing requests in flight");
    });
    let (front, limits) = front(&shared);
    let tls = shared.access.server_tls.clone();
    let open = Some(shared.metrics.http.connections.clone());
    let lanes = Some(lanes);
    crate::http_server::serve_service(listener, front, shutdown, limits, tls, open, lanes).await
}

/// Serves the connections handed to one more lane of a thread-per-core router, counted against
/// the router's one limit.
pub async fn serve_lane(
    shared: Arc<Shared>,
    lane: crate::http_server::lanes::Lane,
    shutdown: Shutdown,
) {
    let (front, limits) = front(&shared);
    let tls = shared.access.server_tls.clone();
    let open = Some(shared.metrics.http.connections.clone());
    crate::http_server::serve_lane(lane, front, shutdown, limits, tls, open).await
}

/// The API's service on one thread: the inference routes' fast path in front of the rest.
fn front(shared: &Arc<Shared>) -> (crate::router::front::Front, crate::http_server::HttpLimits) {
    let limits = http_limits(shared);
    let rest = crate::http_server::guarded(app(shared.clone()), &limits);
    (
        crate::router::front::Front::new(shared.clone(), rest, &limits),
        limits,
    )
}
