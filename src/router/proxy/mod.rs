//! The router's request path, one `impl Router`: choosing workers (`choose`, `choose_pair`),
//! dispatching (`dispatch`: retries with backoff on a worker chosen anew, the circuit
//! breaker's outcomes, through the mode's `route::RouteMode::attempt`), sending (`send`,
//! `call`) and relaying (`relay`: the response body frame by frame as the worker sends it, a
//! stream cut by its worker ended with an SSE error event, never a hang; `relay.rs`).

use crate::router::config::Backend;
use crate::router::dp;
use crate::router::limiter::Slot;
use crate::router::policy::{self, Candidate, LoadBalancingPolicy, RouteInput};
use crate::router::request;
use crate::router::request::{error_body, Endpoint, RouteInfo};
use crate::router::upstream::{Outgoing, UpstreamBody};
use crate::router::worker::{LoadGuard, Prefill, Worker, WorkerType};
use crate::router::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The request id's header, as workers get it.
const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// At most this many of a worker's data frames already received are merged into one.
const MERGE_FRAMES: usize = 64;
/// ... and up to this many bytes.
const MERGE_BYTES: usize = 256 * 1024;

/// An error of any kind, as a body stream gives it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

mod relay;
use relay::Relay;
pub(crate) use relay::{Companion, Held};

/// Request headers passed on to workers (sglang-router's list, plus `accept`).
fn forwarded(name: &str) -> bool {
    matches!(
        name,
        "authorization"
            | "x-correlation-id"
            | "traceparent"
            | "tracestate"
            | "x-smg-routing-key"
            | "accept"
    ) || name.starts_with("x-request-id-")
}

/// Response headers that belong to one connection and are not relayed.
pub(crate) fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
    )
}

/// A JSON error response.
pub fn error_response(status: StatusCode, kind: &str, message: &str, rid: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(error_body(status.as_u16(), kind, message)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(rid) {
        h.insert("x-request-id", v);
    }
    r.extensions_mut()
        .insert(crate::router::metrics::ErrorCode(kind.to_string()));
    r
}

/// One request, as each attempt needs it, and what the attempts before it left.
pub(crate) struct Call<'a> {
    pub(crate) endpoint: Endpoint,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) body: &'a Bytes,
    pub(crate) info: &'a RouteInfo,
    pub(crate) input: RouteInput<'a>,
    pub(crate) rid: &'a str,
    /// The workers the attempts before this one tried.
    pub(crate) tried: &'a [Arc<str>],
    /// The request's admission slot, until an answer's body takes it (held to the body's end).
    pub(crate) slot: &'a mut Option<Slot>,
}

/// A leg that failed: what the client gets, and why in one line.
pub(crate) struct LegFailure {
    pub(crate) answer: Attempt,
    pub(crate) reason: String,
}

/// What one attempt came to.
pub(crate) enum Attempt {
    /// The answer for the client (success, or an error not worth retrying).
    Done(Response<Body>),
    /// Worth another try on another worker; the response to give if none is left.
    Retry {
        tried: Vec<Arc<str>>,
        fallback: Response<Body>,
    },
}

/// The workers serving `model`; if none says it does, those that have not said what they
/// serve (an upstream whose model list could not be read yet).
fn serving(workers: Vec<Arc<Worker>>, model: &str) -> Vec<Arc<Worker>> {
    let (mut serving, mut unknown) = (Vec::new(), Vec::new());
    for w in workers {
        match w.serves(model) {
            Some(true) => serving.push(w),
            Some(false) => {}
            None => unknown.push(w),
        }
    }
    if serving.is_empty() {
        unknown
    } else {
        serving
    }
}

impl Router {
    /// The available workers of one type, leaving out those already tried when others remain.
    fn candidates(&self, t: WorkerType, tried: &[Arc<str>]) -> Vec<Arc<Worker>> {
        let now = Instant::now();
        let all: Vec<Arc<Worker>> = self
            .workers
            .registry
            .snapshot()
            .iter()
            .filter(|w| w.worker_type == t && w.available(&self.cfg.breaker, now))
            .cloned()
            .collect();
        if tried.is_empty() {
            return all;
        }
        let fresh: Vec<Arc<Worker>> = all
            .iter()
            .filter(|w| !tried.iter().any(|t| **t == *w.url))
            .cloned()
            .collect();
        if fresh.is_empty() {
            all
        } else {
            fresh
        }
    }

    /// Whether requests go only to the workers serving their `model`.
    fn routes_by_model(&self) -> bool {
        self.cfg.server.enable_igw || self.cfg.server.backend == Backend::Openai
    }

    /// `--enable-igw`: the policy of `model` for workers of type `t` (of the kind `like` is).
    fn model_policy(
        &self,
        model: &str,
        t: WorkerType,
        like: &dyn LoadBalancingPolicy,
    ) -> Arc<dyn LoadBalancingPolicy> {
        self.routing
            .model_policies
            .lock()
            .entry((model.to_string(), t))
            .or_insert_with(|| self.routing.policy_settings.build(like.kind()))
            .clone()
    }

    /// A worker of type `t` for the request, counted in flight (and what it is predicted to
    /// prefill counted queued there) until the guard says otherwise or drops.
    pub(crate) fn choose(
        &self,
        policy: &dyn LoadBalancingPolicy,
        t: WorkerType,
        input: &RouteInput,
        tried: &[Arc<str>],
    ) -> Option<LoadGuard> {
        let mut workers = self.candidates(t, tried);
        let mut per_model = None;
        if let Some(model) = input.model.filter(|_| self.routes_by_model()) {
            workers = serving(workers, model);
            if self.cfg.server.enable_igw {
                per_model = Some(self.model_policy(model, t, policy));
            }
        }
        let policy = per_model.as_deref().unwrap_or(policy);
        let queued = policy.reads_queued_prefill();
        let cands: Vec<Candidate> = workers
            .iter()
            .map(|w| Candidate {
                url: w.url.clone(),
                load: w.load(),
                processed: w.processed(),
                vouched: w.vouched(),
                queued_prefill: if queued {
                    w.queued_prefill(input.band)
                } else {
                    0
                },
            })
            .collect();
        let placed = policy::choose(policy, &cands, input, Instant::now())?;
        let worker = &workers[placed.index];
        worker.counters.selected.fetch_add(1, Ordering::Relaxed);
        // A decode worker is sent its prompt's KV, not asked to compute it.
        let prefill = placed
            .prefill_tokens
            .filter(|_| t != WorkerType::Decode)
            .map(|tokens| Prefill {
                band: input.band,
                tokens,
            });
        Some(worker.begin(prefill))
    }

    /// A prefill and a decode worker for a PD request, or the answer that there is none.
    #[allow(clippy::result_large_err)]
    pub(crate) fn choose_pair(
        &self,
        input: &RouteInput,
        tried: &[Arc<str>],
        rid: &str,
    ) -> Result<(LoadGuard, LoadGuard), Attempt> {
        let prefill = self
            .choose(
                &*self.routing.prefill_policy,
                WorkerType::Prefill,
                input,
                tried,
            )
            .ok_or_else(|| Attempt::Done(no_workers("prefill ", rid)))?;
        let decode = self
            .choose(
                &*self.routing.decode_policy,
                WorkerType::Decode,
                input,
                tried,
            )
            .ok_or_else(|| Attempt::Done(no_workers("decode ", rid)))?;
        Ok((prefill, decode))
    }

    /// The request for `worker`: the client's forwarded headers (its key only without
    /// tenants), the request id, the worker's key unless the client's is passed, and the rank
    /// with `--dp-aware`.
    pub(crate) fn upstream_request(
        &self,
        worker: &Worker,
        method: Method,
        path: impl Into<std::borrow::Cow<'static, str>>,
        client_headers: &HeaderMap,
        rid: &str,
        body: Bytes,
    ) -> Outgoing {
        // --dp-aware: the rank the worker stands for rides in the body.
        let body = match worker.dp_rank {
            Some(r) if !body.is_empty() => {
                match request::set_fields(&body, &[(dp::RANK_FIELD, r.into())]) {
                    Ok(b) => Bytes::from(b),
                    Err(_) => body,
                }
            }
            _ => body,
        };
        let mut headers = HeaderMap::with_capacity(4);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Ok(v) = HeaderValue::from_str(rid) {
            headers.insert(X_REQUEST_ID, v);
        }
        // With tenants, the client's key is its tenant's, the router's own credential: never
        // passed on (the worker gets its own key, if it has one).
        let client_key = self.access.tenants.is_none();
        for (name, value) in client_headers {
            if forwarded(name.as_str()) && (client_key || name != header::AUTHORIZATION) {
                headers.append(name.clone(), value.clone());
            }
        }
        if !(client_key && client_headers.contains_key(header::AUTHORIZATION)) {
            if let Some(v) = worker
                .api_key
                .as_ref()
                .and_then(|key| HeaderValue::from_str(&format!("Bearer {key}")).ok())
            {
                headers.insert(header::AUTHORIZATION, v);
            }
        }
        Outgoing {
            method,
            base: worker.base_url.clone(),
            path: path.into(),
            headers,
            body,
        }
    }

    /// Sends and waits for the response headers, within the request timeout.
    pub(crate) async fn send(&self, req: Outgoing) -> Result<Response<UpstreamBody>, String> {
        match tokio::time::timeout(
            self.cfg.limits.request_timeout.0,
            self.workers.upstream.send(req),
        )
        .await
        {
            Ok(Ok(r)) => {
                self.metrics.upstream(r.status().as_u16());
                Ok(r)
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no response headers within {:?}",
                self.cfg.limits.request_timeout.0
            )),
        }
    }

    /// Proxies an inference request, retrying as configured.
    pub async fn dispatch(
        self: &Arc<Self>,
        endpoint: Endpoint,
        headers: &HeaderMap,
        body: Bytes,
        info: &RouteInfo,
        rid: &str,
        slot: Option<Slot>,
    ) -> Response<Body> {
        let started = Instant::now();
        self.metrics
            .request(endpoint, info.stream, info.model.as_deref());
        let header_str = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        // A namespaced request's blocks are published under hashes only its engine knows: the
        // index finds an adapter's by its name, and for the rest `cache_aware`'s tree decides.
        let tokens = match &self.routing.kv_index {
            Some(k) if !info.namespaced || info.adapter.is_some() => {
                crate::router::kv_index::tokens_of(&info.text, info.form, k.simulated())
            }
            _ => None,
        };
        let input = RouteInput {
            text: &info.text,
            form: info.form,
            tokens: tokens.as_deref(),
            adapter: info.adapter.as_deref(),
            routing_key: header_str("x-smg-routing-key").or_else(|| header_str("x-session-id")),
            target_worker: header_str("x-smg-target-worker"),
            model: info.model.as_deref(),
            band: info.band,
        };
        let retries = self.cfg.retry.retries();
        let refused = if let Some(why) = self.routing.route.refuses(endpoint) {
            Some(why)
        } else if self.cfg.server.backend == Backend::Openai && endpoint == Endpoint::Generate {
            Some(
                "/generate is SGLang's: an OpenAI-compatible upstream (--backend openai) serves \
                 /v1/chat/completions and /v1/completions"
                    .to_string(),
            )
        } else {
            None
        };
        if let Some(why) = refused {
            self.metrics.error(endpoint.name(), "not_implemented");
            return error_response(
                StatusCode::NOT_IMPLEMENTED,
                "invalid_request_error",
                &why,
                rid,
            );
        }
        let mut slot = slot;
        let mut tried: Vec<Arc<str>> = Vec::new();
        let mut last = None;
        for attempt in 0..=retries {
            if attempt > 0 {
                self.metrics.retries.fetch_add(1, Ordering::Relaxed);
                let wait = self
                    .cfg
                    .retry
                    .backoff()
                    .nth_jittered(attempt, fastrand::f64());
                tokio::time::sleep(wait).await;
            }
            let mut call = Call {
                endpoint,
                headers,
                body: &body,
                info,
                input,
                rid,
                tried: &tried,
                slot: &mut slot,
            };
            let outcome = self.routing.route.attempt(self, &mut call).await;
            match outcome {
                Attempt::Done(r) => {
                    self.metrics.duration(endpoint, started.elapsed());
                    if !r.status().is_success() {
                        self.metrics.error(endpoint.name(), error_kind(r.status()));
                    }
                    return r;
                }
                Attempt::Retry { tried: t, fallback } => {
                    tried.extend(t);
                    last = Some(fallback);
                }
            }
        }
        self.metrics
            .retries_exhausted
            .fetch_add(1, Ordering::Relaxed);
        self.metrics.duration(endpoint, started.elapsed());
        let r = last.unwrap_or_else(|| {
            error_response(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "no attempt was made",
                rid,
            )
        });
        self.metrics.error(endpoint.name(), error_kind(r.status()));
        r
    }

    // The legs end in `Result<_, Attempt>`: the error is what the client gets, already a
    // response, so its size is that of a response.

    /// GET `path` on one available worker (regular, else decode, else prefill) and relays the
    /// answer; used for `/get_server_info`, `/get_model_info`, `/health_generate`.
    pub async fn proxy_get(self: &Arc<Self>, path: &'static str, rid: &str) -> Response<Body> {
        let worker = [WorkerType::Regular, WorkerType::Decode, WorkerType::Prefill]
            .into_iter()
            .find_map(|t| self.candidates(t, &[]).into_iter().next());
        let Some(worker) = worker else {
            return no_workers("", rid);
        };
        let req = self.upstream_request(
            &worker,
            Method::GET,
            path,
            &HeaderMap::new(),
            rid,
            Bytes::new(),
        );
        match self.send(req).await {
            Ok(resp) => buffered(resp, rid).await,
            Err(e) => error_response(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                &format!("worker {}: {e}", worker.url),
                rid,
            ),
        }
    }

    /// A simple request to one worker with a deadline: status and body.
    pub async fn call(
        &self,
        worker: &Worker,
        method: Method,
        path: &str,
        timeout: std::time::Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        let req = self.upstream_request(
            worker,
            method,
            path.to_string(),
            &HeaderMap::new(),
            "health",
            Bytes::new(),
        );
        let fut = async {
            let resp = self
                .workers
                .upstream
                .send(req)
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
    }

    /// The client's response: the worker's status and headers (minus hop-by-hop ones), the
    /// request id, and the body relayed as it arrives (cut if `companion` fails meanwhile).
    pub(in crate::router) fn relay(
        self: &Arc<Self>,
        resp: Response<UpstreamBody>,
        worker: Arc<Worker>,
        held: Held,
        companion: Option<Companion>,
        rid: &str,
    ) -> Response<Body> {
        let (mut parts, inner) = resp.into_parts();
        let sse = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = Relay::new(inner, sse, worker, self.clone(), held, companion);
        let mut out = Response::new(Body::new(body));
        *out.status_mut() = parts.status;
        // The worker's headers as they are, less those of its connection (rarely any).
        let hops: Vec<http::HeaderName> = parts
            .headers
            .keys()
            .filter(|n| hop_by_hop(n.as_str()))
            .cloned()
            .collect();
        for name in hops {
            parts.headers.remove(name);
        }
        let h = out.headers_mut();
        *h = parts.headers;
        if let Ok(v) = HeaderValue::from_str(rid) {
            h.insert("x-request-id", v);
        }
        out
    }
}

pub(crate) fn no_workers(kind: &str, rid: &str) -> Response<Body> {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_available_workers",
        &format!("no available {kind}workers (all unhealthy, circuit open, or none registered)"),
        rid,
    )
}

pub(crate) fn error_kind(s: StatusCode) -> &'static str {
    match s.as_u16() {
        400 => "bad_request",
        401 => "unauthorized",
        404 => "not_found",
        408 => "timeout",
        413 => "payload_too_large",
        429 => "rate_limited",
        502 => "upstream_error",
        503 => "no_available_workers",
        504 => "gateway_timeout",
        s if s >= 500 => "server_error",
        _ => "client_error",
    }
}

/// A worker's (error) response read fully, so that it can be kept across retries.
pub(crate) async fn buffered(resp: Response<UpstreamBody>, rid: &str) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                &format!(
                    "worker answered {} and then cut the body: {e}",
                    parts.status
                ),
                rid,
            )
        }
    };
    let mut out = Response::new(Body::from(bytes));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !hop_by_hop(name.as_str()) && name != header::CONTENT_LENGTH {
            out.headers_mut().append(name, value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(rid) {
        out.headers_mut().insert("x-request-id", v);
    }
    out
}

/// A prefill worker's error, with its body, named as the prefill side's.
pub(crate) async fn prefixed(
    resp: Response<UpstreamBody>,
    role: &str,
    rid: &str,
) -> Response<Body> {
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    error_response(
        status,
        &format!("{role}_server_error"),
        &format!("{role} worker answered {status}: {}", text.trim()),
        rid,
    )
}
