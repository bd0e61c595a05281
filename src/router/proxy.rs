//! Sending a request to workers and relaying the answer: worker choice, retries with backoff on
//! a worker chosen anew, the circuit breaker's outcomes, prefill/decode dual dispatch, and the
//! response body relayed frame by frame as the worker sends it (a stream cut by its worker ends
//! with an SSE error event, never a hang).

use crate::router::config::Backend;
use crate::router::dp;
use crate::router::policy::{self, Candidate, LoadBalancingPolicy, RouteInput};
use crate::router::request;
use crate::router::request::{
    error_body, inject_bootstrap, random_room, retryable, BadRequest, Endpoint, RouteInfo,
};
use crate::router::vllm::{self, Connector, Legs};
use crate::router::worker::{LoadGuard, Worker, WorkerType};
use crate::router::Shared;
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::OwnedSemaphorePermit;

/// At most this many of a worker's data frames already received are merged into one.
const MERGE_FRAMES: usize = 64;
/// ... and up to this many bytes.
const MERGE_BYTES: usize = 256 * 1024;

/// Longest wait for a Mooncake prefill engine's bootstrap server to answer `GET /query`.
const BOOTSTRAP_QUERY_TIMEOUT: Duration = Duration::from_secs(2);

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
fn hop_by_hop(name: &str) -> bool {
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

/// Everything a request holds until its response body has been sent.
struct Held {
    _load: Vec<LoadGuard>,
    _permit: Option<OwnedSemaphorePermit>,
}

/// A leg the relayed answer depends on that is still running (vLLM Mooncake's prefill, sent
/// beside its decode): the reason it failed, if it does. The answer ends after it.
type Companion = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A worker's response body, relayed frame by frame.
struct Relay {
    /// `None` once whole, or cut (dropping it unfinished closes the worker's connection: the
    /// request is cancelled).
    inner: Option<Incoming>,
    /// Watched while the body is relayed: its failure cuts the answer at once.
    companion: Option<Companion>,
    /// What the worker's body gave after the data merged into the last frame: handed out next.
    stash: Option<Option<Result<Frame<Bytes>, hyper::Error>>>,
    sse: bool,
    done: bool,
    worker: Arc<Worker>,
    shared: Arc<Shared>,
    _held: Held,
}

impl Relay {
    /// Ends the answer with `msg`: an SSE error event, or a body error (the status line is
    /// gone already).
    fn cut(
        &mut self,
        status: u16,
        kind: &str,
        msg: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        self.inner = None;
        if self.sse {
            let event = format!("data: {}\n\n", error_body(status, kind, &msg));
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
        } else {
            Poll::Ready(Some(Err(msg.into())))
        }
    }
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(leg) = this.companion.as_mut() {
            match leg.as_mut().poll(cx) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => this.companion = None,
                Poll::Ready(Err(reason)) => {
                    this.companion = None;
                    this.shared
                        .metrics
                        .vllm_pd_legs_cancelled
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(worker = %this.worker.url, %reason, "the other leg failed: answer cut");
                    return this.cut(502, "prefill_server_error", reason);
                }
            }
        }
        // The answer ends once it is whole and the leg it depends on has succeeded (which
        // keeps that leg's resources within the client's request).
        let Some(inner) = this.inner.as_mut() else {
            return match this.companion {
                Some(_) => Poll::Pending,
                None => {
                    this.done = true;
                    Poll::Ready(None)
                }
            };
        };
        let polled = match this.stash.take() {
            Some(r) => Poll::Ready(r),
            None => Pin::new(&mut *inner).poll_frame(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let first = match frame.into_data() {
                    Ok(d) => d,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                };
                // Data the worker has sent already goes out with it: one write, not several
                // (an SSE stream's events often come together).
                let mut merged: Option<BytesMut> = None;
                for _ in 0..MERGE_FRAMES {
                    let size = merged.as_ref().map_or(first.len(), |m| m.len());
                    if size >= MERGE_BYTES {
                        break;
                    }
                    match Pin::new(&mut *inner).poll_frame(cx) {
                        Poll::Pending => break,
                        Poll::Ready(Some(Ok(f))) if f.is_data() => {
                            let m = merged.get_or_insert_with(|| BytesMut::from(&first[..]));
                            if let Ok(d) = f.into_data() {
                                m.extend_from_slice(&d);
                            }
                        }
                        Poll::Ready(other) => {
                            this.stash = Some(other);
                            break;
                        }
                    }
                }
                let data = merged.map_or(first, BytesMut::freeze);
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(None) => {
                this.inner = None;
                if this.companion.is_some() {
                    // Polled above: it wakes this body when it ends.
                    return Poll::Pending;
                }
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.shared
                    .metrics
                    .stream_errors
                    .fetch_add(1, Ordering::Relaxed);
                this.worker.record_outcome(&this.shared.cfg.breaker, false);
                tracing::warn!(worker = %this.worker.url, error = %e, "worker cut the response");
                if this.sse {
                    let msg = format!(
                        "worker {} closed the stream before it ended: {e}",
                        this.worker.url
                    );
                    this.cut(502, "upstream_error", msg)
                } else {
                    this.done = true;
                    Poll::Ready(Some(Err(Box::new(e))))
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || (self.companion.is_none()
                && self.stash.is_none()
                && self.inner.as_ref().is_none_or(|i| i.is_end_stream()))
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map(|i| i.size_hint())
            .unwrap_or_default()
    }
}

/// One request, as each attempt needs it.
struct Call<'a> {
    endpoint: Endpoint,
    headers: &'a HeaderMap,
    body: &'a Bytes,
    info: &'a RouteInfo,
    input: RouteInput<'a>,
    rid: &'a str,
}

/// A leg that failed: what the client gets, and why in one line.
struct LegFailure {
    answer: Attempt,
    reason: String,
}

/// What one attempt came to.
enum Attempt {
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

impl Shared {
    /// Whether PD requests follow vLLM's contract: `--backend vllm`, or prefill workers that
    /// are vLLM engines (their `/v1/models` says so, or they were registered with a KV
    /// connector).
    fn vllm_engines(&self) -> bool {
        self.cfg.server.backend == Backend::Vllm
            || self.registry.snapshot().iter().any(|w| {
                w.worker_type == WorkerType::Prefill
                    && (w.kv_connector.is_some() || *w.engine.read() == Some(Backend::Vllm))
            })
    }

    /// The available workers of one type, leaving out those already tried when others remain.
    fn candidates(&self, t: WorkerType, tried: &[Arc<str>]) -> Vec<Arc<Worker>> {
        let now = Instant::now();
        let all: Vec<Arc<Worker>> = self
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
        self.model_policies
            .lock()
            .entry((model.to_string(), t))
            .or_insert_with(|| self.policy_settings.build(like.kind()))
            .clone()
    }

    fn choose(
        &self,
        policy: &dyn LoadBalancingPolicy,
        t: WorkerType,
        input: &RouteInput,
        tried: &[Arc<str>],
    ) -> Option<Arc<Worker>> {
        let mut workers = self.candidates(t, tried);
        let mut per_model = None;
        if let Some(model) = input.model.filter(|_| self.routes_by_model()) {
            workers = serving(workers, model);
            if self.cfg.server.enable_igw {
                per_model = Some(self.model_policy(model, t, policy));
            }
        }
        let policy = per_model.as_deref().unwrap_or(policy);
        let cands: Vec<Candidate> = workers
            .iter()
            .map(|w| Candidate {
                url: w.url.clone(),
                load: w.load(),
                processed: w.processed(),
            })
            .collect();
        let chosen =
            policy::choose(policy, &cands, input, Instant::now()).map(|i| workers[i].clone());
        if let Some(w) = &chosen {
            w.counters.selected.fetch_add(1, Ordering::Relaxed);
        }
        chosen
    }

    /// A prefill and a decode worker for a PD request, or the answer that there is none.
    #[allow(clippy::result_large_err)]
    fn choose_pair(
        &self,
        input: &RouteInput,
        tried: &[Arc<str>],
        rid: &str,
    ) -> Result<(Arc<Worker>, Arc<Worker>), Attempt> {
        let prefill = self
            .choose(&*self.prefill_policy, WorkerType::Prefill, input, tried)
            .ok_or_else(|| Attempt::Done(no_workers("prefill ", rid)))?;
        let decode = self
            .choose(&*self.decode_policy, WorkerType::Decode, input, tried)
            .ok_or_else(|| Attempt::Done(no_workers("decode ", rid)))?;
        Ok((prefill, decode))
    }

    fn upstream_request(
        &self,
        worker: &Worker,
        method: Method,
        path: &str,
        client_headers: &HeaderMap,
        rid: &str,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, http::Error> {
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
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{}", worker.base_url, path))
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-request-id", rid);
        for (name, value) in client_headers {
            if forwarded(name.as_str()) {
                b = b.header(name, value);
            }
        }
        if !client_headers.contains_key(header::AUTHORIZATION) {
            if let Some(key) = &worker.api_key {
                b = b.header(header::AUTHORIZATION, format!("Bearer {key}"));
            }
        }
        b.body(Full::new(body))
    }

    /// Sends and waits for the response headers, within the request timeout.
    async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, String> {
        match tokio::time::timeout(
            self.cfg.limits.request_timeout.0,
            self.client().request(req),
        )
        .await
        {
            Ok(Ok(r)) => {
                self.metrics.upstream(r.status().as_u16());
                Ok(r)
            }
            Ok(Err(e)) => Err(describe(&e)),
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
        permit: Option<OwnedSemaphorePermit>,
    ) -> Response<Body> {
        let started = Instant::now();
        self.metrics
            .request(endpoint, info.stream, info.model.as_deref());
        let header_str = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let input = RouteInput {
            text: &info.text,
            routing_key: header_str("x-smg-routing-key").or_else(|| header_str("x-session-id")),
            target_worker: header_str("x-smg-target-worker"),
            model: info.model.as_deref(),
        };
        let retries = self.cfg.retry.retries();
        let refused = if self.pd && !endpoint.generates() {
            Some(format!(
                "{} is not served by a prefill/decode router: send it to a regular router",
                endpoint.path()
            ))
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
        let mut permit = permit;
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
            let call = Call {
                endpoint,
                headers,
                body: &body,
                info,
                input,
                rid,
            };
            let outcome = if self.pd && self.vllm_engines() {
                self.vllm_pd_once(&call, &tried, &mut permit).await
            } else if self.pd {
                self.pd_once(&call, &tried, &mut permit).await
            } else {
                self.once(&call, &tried, &mut permit).await
            };
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

    async fn once(
        self: &Arc<Self>,
        call: &Call<'_>,
        tried: &[Arc<str>],
        permit: &mut Option<OwnedSemaphorePermit>,
    ) -> Attempt {
        let Call {
            endpoint,
            headers,
            body,
            info: _,
            ref input,
            rid,
        } = *call;
        let Some(worker) = self.choose(&*self.policy, WorkerType::Regular, input, tried) else {
            return Attempt::Done(no_workers("", rid));
        };
        let guard = worker.begin();
        let req = match self.upstream_request(
            &worker,
            Method::POST,
            endpoint.path(),
            headers,
            rid,
            body.clone(),
        ) {
            Ok(r) => r,
            Err(e) => {
                return Attempt::Done(error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("cannot forward this request: {e}"),
                    rid,
                ))
            }
        };
        match self.send(req).await {
            Err(e) => {
                worker.record_outcome(&self.cfg.breaker, false);
                tracing::warn!(worker = %worker.url, error = %e, request_id = rid, "worker request failed");
                Attempt::Retry {
                    tried: vec![worker.url.clone()],
                    fallback: error_response(
                        StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        &format!("worker {}: {e}", worker.url),
                        rid,
                    ),
                }
            }
            Ok(resp) => {
                let status = resp.status();
                let ok = !retryable(status.as_u16()) && !status.is_server_error();
                worker.record_outcome(&self.cfg.breaker, ok);
                if retryable(status.as_u16()) {
                    tracing::warn!(worker = %worker.url, %status, request_id = rid, "worker answered with a retryable status");
                    return Attempt::Retry {
                        tried: vec![worker.url.clone()],
                        fallback: buffered(resp, rid).await,
                    };
                }
                let held = Held {
                    _load: vec![guard],
                    _permit: permit.take(),
                };
                Attempt::Done(self.relay(resp, worker, held, None, rid))
            }
        }
    }

    async fn pd_once(
        self: &Arc<Self>,
        call: &Call<'_>,
        tried: &[Arc<str>],
        permit: &mut Option<OwnedSemaphorePermit>,
    ) -> Attempt {
        let Call {
            endpoint,
            headers,
            body,
            info,
            ref input,
            rid,
        } = *call;
        let (prefill, decode) = match self.choose_pair(input, tried, rid) {
            Ok(pair) => pair,
            Err(a) => return a,
        };
        let rooms: Vec<u64> = (0..info.batch.unwrap_or(1))
            .map(|_| random_room())
            .collect();
        let pd_body =
            match inject_bootstrap(body, info, &prefill.host, prefill.bootstrap_port, &rooms) {
                Ok(b) => Bytes::from(b),
                Err(e) => {
                    return Attempt::Done(error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        &e.to_string(),
                        rid,
                    ))
                }
            };
        let p_guard = prefill.begin();
        let d_guard = decode.begin();
        let build = |w: &Worker| {
            self.upstream_request(
                w,
                Method::POST,
                endpoint.path(),
                headers,
                rid,
                pd_body.clone(),
            )
        };
        let (p_req, d_req) = match (build(&prefill), build(&decode)) {
            (Ok(p), Ok(d)) => (p, d),
            (Err(e), _) | (_, Err(e)) => {
                return Attempt::Done(error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("cannot forward this request: {e}"),
                    rid,
                ))
            }
        };
        self.metrics.pd_dispatches.fetch_add(1, Ordering::Relaxed);
        let (p_res, d_res) = tokio::join!(self.send(p_req), self.send(d_req));
        let fail = |w: &Arc<Worker>, role: &str, e: &str| {
            w.record_outcome(&self.cfg.breaker, false);
            tracing::warn!(worker = %w.url, role, error = %e, request_id = rid, "PD request failed");
        };
        // Decode first: its answer is what the client gets.
        let d_resp = match d_res {
            Err(e) => {
                fail(&decode, "decode", &e);
                return Attempt::Retry {
                    tried: vec![decode.url.clone()],
                    fallback: error_response(
                        StatusCode::BAD_GATEWAY,
                        "decode_server_error",
                        &format!("decode worker {}: {e}", decode.url),
                        rid,
                    ),
                };
            }
            Ok(r) => r,
        };
        let p_resp = match p_res {
            Err(e) => {
                fail(&prefill, "prefill", &e);
                return Attempt::Retry {
                    tried: vec![prefill.url.clone()],
                    fallback: error_response(
                        StatusCode::BAD_GATEWAY,
                        "prefill_server_error",
                        &format!("prefill worker {}: {e}", prefill.url),
                        rid,
                    ),
                };
            }
            Ok(r) => r,
        };
        let (p_status, d_status) = (p_resp.status(), d_resp.status());
        // 4xx is the client's fault, not the worker's (as sglang-router's PD router counts).
        let outcome = |s: StatusCode| !s.is_server_error() && !retryable(s.as_u16());
        prefill.record_outcome(&self.cfg.breaker, outcome(p_status));
        decode.record_outcome(&self.cfg.breaker, outcome(d_status));
        if retryable(d_status.as_u16()) {
            return Attempt::Retry {
                tried: vec![decode.url.clone()],
                fallback: buffered(d_resp, rid).await,
            };
        }
        if retryable(p_status.as_u16()) {
            return Attempt::Retry {
                tried: vec![prefill.url.clone()],
                fallback: prefixed(p_resp, "prefill", rid).await,
            };
        }
        if !d_status.is_success() {
            return Attempt::Done(buffered(d_resp, rid).await);
        }
        if !p_status.is_success() {
            return Attempt::Done(prefixed(p_resp, "prefill", rid).await);
        }
        // The prefill answer is read to its end in the background (its load counts until then);
        // the client gets the decode answer as it comes.
        let p_worker = prefill.clone();
        tokio::spawn(async move {
            let _g = p_guard;
            if let Err(e) = p_resp.into_body().collect().await {
                tracing::debug!(worker = %p_worker.url, error = %e, "prefill body cut");
            }
        });
        let held = Held {
            _load: vec![d_guard],
            _permit: permit.take(),
        };
        Attempt::Done(self.relay(d_resp, decode, held, None, rid))
    }

    // The legs end in `Result<_, Attempt>`: the error is what the client gets, already a
    // response, so its size is that of a response.
    #[allow(clippy::result_large_err)]
    /// vLLM's prefill/decode contract (`vllm.rs`): NIXL sends decode after the prefill answer
    /// with its `kv_transfer_params`; Mooncake sends both legs with one transfer id, at once
    /// or one after the other. When one leg fails the other is dropped at once (which cancels
    /// its request) and the client gets the failure.
    async fn vllm_pd_once(
        self: &Arc<Self>,
        call: &Call<'_>,
        tried: &[Arc<str>],
        permit: &mut Option<OwnedSemaphorePermit>,
    ) -> Attempt {
        let Call {
            endpoint,
            headers,
            body,
            info: _,
            ref input,
            rid,
        } = *call;
        let refuse = |status: StatusCode, kind: &str, msg: &str| {
            Attempt::Done(error_response(status, kind, msg, rid))
        };
        if endpoint == Endpoint::Generate {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "vLLM engines serve the OpenAI routes (/v1/completions, /v1/chat/completions); \
                 /generate is SGLang's",
            );
        }
        let n = vllm::choices(body);
        if n > 1 {
            self.metrics
                .vllm_pd_n_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(request_id = rid, n, "vLLM PD request with n > 1 refused");
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!(
                    "n = {n}: prefill/decode disaggregation transfers one sequence's KV cache; \
                     send n = 1 (or several requests)"
                ),
            );
        }
        let (prefill, decode) = match self.choose_pair(input, tried, rid) {
            Ok(pair) => pair,
            Err(a) => return a,
        };
        let connector = prefill
            .kv_connector
            .unwrap_or(self.cfg.pd.vllm_kv_connector);
        let transfer_failed = |msg: String| {
            self.metrics
                .vllm_kv_transfer_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(request_id = rid, prefill = %prefill.url, connector = connector.name(), "{msg}");
            msg
        };
        // Mooncake: the prefill engine's id, from its bootstrap server (503 until it answers).
        let engine = match connector {
            Connector::Nixl => None,
            Connector::Mooncake => match self.mooncake_engine(&prefill).await {
                Ok(e) => Some(e),
                Err(e) => {
                    let msg = transfer_failed(e);
                    return refuse(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", &msg);
                }
            },
        };
        let transfer = vllm::transfer_id();
        let prefill_kv = match &engine {
            None => vllm::nixl_prefill_params(),
            Some(_) => vllm::mooncake_prefill_params(&transfer),
        };
        let bad = |e: BadRequest| {
            refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &e.to_string(),
            )
        };
        let p_body = match vllm::prefill_body(body, &prefill_kv) {
            Ok(b) => Bytes::from(b),
            Err(e) => return bad(e),
        };
        let p_guard = prefill.begin();
        let d_guard = decode.begin();
        let mut p_req = match self.upstream_request(
            &prefill,
            Method::POST,
            endpoint.path(),
            headers,
            rid,
            p_body,
        ) {
            Ok(r) => r,
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("cannot forward this request: {e}"),
                )
            }
        };
        if let Some(rank) = engine.as_ref().and_then(|e| e.dp_rank) {
            if let Ok(v) = http::HeaderValue::from_str(&rank.to_string()) {
                p_req.headers_mut().insert("x-data-parallel-rank", v);
            }
        }
        self.metrics.pd_dispatches.fetch_add(1, Ordering::Relaxed);
        let fail = |w: &Arc<Worker>, role: &str, e: &str| {
            w.record_outcome(&self.cfg.breaker, false);
            tracing::warn!(worker = %w.url, role, error = %e, request_id = rid, "vLLM PD leg failed");
        };
        // The prefill leg to its end: its answer's body (NIXL needs it), or what went wrong.
        let mut prefill_leg = Box::pin(self.prefill_leg(prefill.clone(), p_req, p_guard, rid));
        let decode_request = |kv: &Value| {
            vllm::decode_body(body, kv).map_err(bad).and_then(|b| {
                self.upstream_request(
                    &decode,
                    Method::POST,
                    endpoint.path(),
                    headers,
                    rid,
                    Bytes::from(b),
                )
                .map_err(|e| {
                    refuse(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        &format!("cannot forward this request: {e}"),
                    )
                })
            })
        };
        let decode_leg = |req: Request<Full<Bytes>>| async {
            match self.send(req).await {
                Err(e) => {
                    fail(&decode, "decode", &e);
                    Err(Attempt::Retry {
                        tried: vec![decode.url.clone()],
                        fallback: error_response(
                            StatusCode::BAD_GATEWAY,
                            "decode_server_error",
                            &format!("decode worker {}: {e}", decode.url),
                            rid,
                        ),
                    })
                }
                Ok(resp) => {
                    let status = resp.status();
                    decode.record_outcome(
                        &self.cfg.breaker,
                        !status.is_server_error() && !retryable(status.as_u16()),
                    );
                    if retryable(status.as_u16()) {
                        Err(Attempt::Retry {
                            tried: vec![decode.url.clone()],
                            fallback: buffered(resp, rid).await,
                        })
                    } else if !status.is_success() {
                        Err(Attempt::Done(buffered(resp, rid).await))
                    } else {
                        Ok(resp)
                    }
                }
            }
        };
        let concurrent = engine.is_some() && self.cfg.pd.vllm_pd_legs == Legs::Concurrent;
        let (d_resp, companion) = if let (true, Some(engine)) = (concurrent, &engine) {
            let d_req = match decode_request(&vllm::mooncake_decode_params(&transfer, engine)) {
                Ok(r) => r,
                Err(a) => return a,
            };
            let d_leg = decode_leg(d_req);
            tokio::pin!(d_leg);
            // Whichever leg fails first ends both: returning drops the other leg's future,
            // which closes its connection (the engine sees the request cancelled).
            tokio::select! {
                p = &mut prefill_leg => match p {
                    Err(f) => {
                        self.metrics.vllm_pd_legs_cancelled.fetch_add(1, Ordering::Relaxed);
                        return f.answer;
                    }
                    Ok(_) => match d_leg.await {
                        Ok(r) => (r, None),
                        Err(a) => return a,
                    },
                },
                d = &mut d_leg => match d {
                    Err(a) => {
                        self.metrics.vllm_pd_legs_cancelled.fetch_add(1, Ordering::Relaxed);
                        return a;
                    }
                    // Decode answered first: as with vLLM's own proxy its answer goes to the
                    // client at once (the engine holds its tokens until the KV cache has come).
                    // The prefill leg is watched while it is relayed: its failure cuts the
                    // answer, and the answer ends only after it.
                    Ok(r) => {
                        let leg: Companion = Box::pin(async move {
                            prefill_leg.await.map(|_| ()).map_err(|f| f.reason)
                        });
                        (r, Some(leg))
                    }
                },
            }
        } else {
            let answer = match prefill_leg.await {
                Ok(b) => b,
                Err(f) => return f.answer,
            };
            let kv = match &engine {
                Some(e) => vllm::mooncake_decode_params(&transfer, e),
                None => match vllm::nixl_decode_params(&answer) {
                    Some(kv) => kv,
                    None => {
                        let msg = transfer_failed(format!(
                            "the prefill answer of {} carried no kv_transfer_params: is its \
                             kv_connector NixlConnector (--vllm-kv-connector)?",
                            prefill.url
                        ));
                        return refuse(StatusCode::BAD_GATEWAY, "prefill_server_error", &msg);
                    }
                },
            };
            let d_req = match decode_request(&kv) {
                Ok(r) => r,
                Err(a) => return a,
            };
            match decode_leg(d_req).await {
                Ok(r) => (r, None),
                Err(a) => return a,
            }
        };
        let held = Held {
            _load: vec![d_guard],
            _permit: permit.take(),
        };
        Attempt::Done(self.relay(d_resp, decode, held, companion, rid))
    }

    /// A vLLM prefill leg to its end, owning what it needs (it may outlive the attempt that
    /// started it, watched by the decode answer's relay): the answer's body, or what the
    /// client gets and a one-line reason.
    fn prefill_leg(
        self: &Arc<Self>,
        prefill: Arc<Worker>,
        req: Request<Full<Bytes>>,
        load: LoadGuard,
        rid: &str,
    ) -> impl Future<Output = Result<Bytes, LegFailure>> + Send + 'static {
        let this = self.clone();
        let rid = rid.to_string();
        async move {
            let _load = load;
            let failed = |status: StatusCode, reason: String| {
                let answer = error_response(status, "prefill_server_error", &reason, &rid);
                LegFailure {
                    answer: Attempt::Done(answer),
                    reason,
                }
            };
            let resp = match this.send(req).await {
                Ok(r) => r,
                Err(e) => {
                    prefill.record_outcome(&this.cfg.breaker, false);
                    tracing::warn!(worker = %prefill.url, role = "prefill", error = %e, request_id = %rid, "vLLM PD leg failed");
                    let reason = format!("prefill worker {}: {e}", prefill.url);
                    let fallback = error_response(
                        StatusCode::BAD_GATEWAY,
                        "prefill_server_error",
                        &reason,
                        &rid,
                    );
                    let tried = vec![prefill.url.clone()];
                    return Err(LegFailure {
                        answer: Attempt::Retry { tried, fallback },
                        reason,
                    });
                }
            };
            let status = resp.status();
            prefill.record_outcome(
                &this.cfg.breaker,
                !status.is_server_error() && !retryable(status.as_u16()),
            );
            if !status.is_success() {
                let reason = format!("prefill worker {} answered {status}", prefill.url);
                let answer = prefixed(resp, "prefill", &rid).await;
                let answer = if retryable(status.as_u16()) {
                    Attempt::Retry {
                        tried: vec![prefill.url.clone()],
                        fallback: answer,
                    }
                } else {
                    Attempt::Done(answer)
                };
                return Err(LegFailure { answer, reason });
            }
            match tokio::time::timeout(
                this.cfg.limits.request_timeout.0,
                resp.into_body().collect(),
            )
            .await
            {
                Ok(Ok(b)) => Ok(b.to_bytes()),
                Ok(Err(e)) => Err(failed(
                    StatusCode::BAD_GATEWAY,
                    format!("prefill worker {}: answer cut: {e}", prefill.url),
                )),
                Err(_) => Err(failed(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "prefill worker {}: no whole answer within {:?}",
                        prefill.url, this.cfg.limits.request_timeout.0
                    ),
                )),
            }
        }
    }

    /// The Mooncake engine of a prefill worker: from the cache, or asked of its bootstrap
    /// server (`GET http://<host>:<bootstrap port>/query`).
    async fn mooncake_engine(&self, prefill: &Worker) -> Result<vllm::MooncakeEngine, String> {
        if let Some(e) = self.mooncake_engines.lock().get(&prefill.url) {
            return Ok(e.clone());
        }
        let port = prefill
            .bootstrap_port
            .unwrap_or(self.cfg.pd.vllm_bootstrap_port);
        let addr = vllm::worker_url(&prefill.host, port);
        if let Some(id) = &prefill.kv_engine_id {
            // Registered with its engine id (SMG's `kv_engine_id`): nothing to ask.
            return Ok(vllm::MooncakeEngine {
                engine_id: id.clone(),
                bootstrap_addr: addr,
                dp_rank: None,
            });
        }
        let url = format!("{addr}/query");
        let unready = |why: String| {
            format!("prefill worker {}: its Mooncake bootstrap {url} has not answered yet ({why}); retry shortly", prefill.url)
        };
        let req = Request::get(&url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| unready(e.to_string()))?;
        let resp =
            match tokio::time::timeout(BOOTSTRAP_QUERY_TIMEOUT, self.client().request(req)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(unready(describe(&e))),
                Err(_) => {
                    return Err(unready(format!(
                        "no answer within {BOOTSTRAP_QUERY_TIMEOUT:?}"
                    )))
                }
            };
        if !resp.status().is_success() {
            return Err(unready(format!("status {}", resp.status())));
        }
        let bytes = tokio::time::timeout(BOOTSTRAP_QUERY_TIMEOUT, resp.into_body().collect())
            .await
            .map_err(|_| unready("answer cut".into()))?
            .map_err(|e| unready(e.to_string()))?
            .to_bytes();
        let answer: Value =
            serde_json::from_slice(&bytes).map_err(|e| unready(format!("not JSON: {e}")))?;
        let engine = vllm::mooncake_engine(&answer, &addr)
            .ok_or_else(|| unready("no engine_id in its answer".into()))?;
        tracing::info!(prefill = %prefill.url, engine_id = %engine.engine_id, bootstrap = %addr, "Mooncake prefill engine learnt");
        self.mooncake_engines
            .lock()
            .insert(prefill.url.clone(), engine.clone());
        Ok(engine)
    }

    /// The client's response: the worker's status and headers (minus hop-by-hop ones), the
    /// request id, and the body relayed as it arrives (cut if `companion` fails meanwhile).
    fn relay(
        self: &Arc<Self>,
        resp: Response<Incoming>,
        worker: Arc<Worker>,
        held: Held,
        companion: Option<Companion>,
        rid: &str,
    ) -> Response<Body> {
        let (parts, inner) = resp.into_parts();
        let sse = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut out = Response::new(Body::new(Relay {
            inner: Some(inner),
            companion,
            stash: None,
            sse,
            done: false,
            worker,
            shared: self.clone(),
            _held: held,
        }));
        *out.status_mut() = parts.status;
        let h = out.headers_mut();
        for (name, value) in &parts.headers {
            if !hop_by_hop(name.as_str()) {
                h.append(name, value.clone());
            }
        }
        if let Ok(v) = HeaderValue::from_str(rid) {
            h.insert("x-request-id", v);
        }
        out
    }

    /// GET `path` on one available worker (regular, else decode, else prefill) and relays the
    /// answer; used for `/get_server_info`, `/get_model_info`, `/health_generate`.
    pub async fn proxy_get(self: &Arc<Self>, path: &str, rid: &str) -> Response<Body> {
        let worker = [WorkerType::Regular, WorkerType::Decode, WorkerType::Prefill]
            .into_iter()
            .find_map(|t| self.candidates(t, &[]).into_iter().next());
        let Some(worker) = worker else {
            return no_workers("", rid);
        };
        let req = match self.upstream_request(
            &worker,
            Method::GET,
            path,
            &HeaderMap::new(),
            rid,
            Bytes::new(),
        ) {
            Ok(r) => r,
            Err(e) => {
                return error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    &e.to_string(),
                    rid,
                )
            }
        };
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
        let req = self
            .upstream_request(
                worker,
                method,
                path,
                &HeaderMap::new(),
                "health",
                Bytes::new(),
            )
            .map_err(|e| e.to_string())?;
        let fut = async {
            let resp = self.client().request(req).await.map_err(|e| describe(&e))?;
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
}

fn no_workers(kind: &str, rid: &str) -> Response<Body> {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_available_workers",
        &format!("no available {kind}workers (all unhealthy, circuit open, or none registered)"),
        rid,
    )
}

fn error_kind(s: StatusCode) -> &'static str {
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

/// A worker's (error) response read fully, so that it can be kept across retries.
async fn buffered(resp: Response<Incoming>, rid: &str) -> Response<Body> {
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
async fn prefixed(resp: Response<Incoming>, role: &str, rid: &str) -> Response<Body> {
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
