//! `rbgctl bench fake-worker` (test kit builds only): a FAKE SGLang-compatible worker for router
//! tests and benchmarks. There is no model: every request is answered at once with canned tokens
//! ("tok0 tok1 ..."), streamed as SSE or as one JSON object, in SGLang's and OpenAI's shapes.
//! It can inject failures (`POST /fake/fail?count=N&status=503`), pace streamed tokens, burn
//! CPU per request, and it records the last requests it received (`GET /fake/requests`) so that
//! tests can check what the router forwarded.

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use clap::Args;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

/// `rbgctl bench fake-worker`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct FakeWorkerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0: the kernel chooses (reported through `RBGCTL_READY_FILE`).
    #[arg(long, default_value_t = 31000)]
    pub port: u16,
    /// Name reported in the `x-fake-worker` response header.
    #[arg(long, default_value = "fake-worker")]
    pub name: String,
    /// Model name reported by `/get_server_info` and `/v1/models`.
    #[arg(long, default_value = "fake-model")]
    pub model: String,
    /// Tokens per reply when the request does not ask for a number.
    #[arg(long, default_value_t = 8)]
    pub tokens: usize,
    /// Pause between streamed tokens, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub token_delay_ms: f64,
    /// CPU time burnt per request, in microseconds (to model a heavier worker).
    #[arg(long, default_value_t = 0)]
    pub cpu_us: u64,
    /// Runtime threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The engine it pretends to be: `sglang`, or `vllm` (no `/generate`; `/v1/models` owned
    /// by vllm; a prefill answer to `kv_transfer_params.do_remote_decode` carries NIXL-style
    /// `kv_transfer_params`).
    #[arg(long, default_value = "sglang")]
    pub engine: String,
    /// vLLM Mooncake: also serve the KV bootstrap (`GET /query`) on this port.
    #[arg(long)]
    pub kv_bootstrap_port: Option<u16>,
    /// ... answering 503 until this many milliseconds after start.
    #[arg(long, default_value_t = 0)]
    pub kv_bootstrap_ready_after_ms: u64,
    /// Hold every inference answer (an injected failure too) this long before its headers (a
    /// slow leg). A request whose client goes away before its answer ended is counted as
    /// cancelled (`/fake/stats`).
    #[arg(long, default_value_t = 0)]
    pub headers_delay_ms: u64,
    /// More models `/v1/models` lists (as an OpenAI-compatible upstream serving several).
    #[arg(long, value_delimiter = ',')]
    pub extra_models: Vec<String>,
    /// Data-parallel ranks reported as `dp_size` by `/get_server_info`.
    #[arg(long, default_value_t = 1)]
    pub dp_size: usize,
    /// What `/server_info` says under `kv_events` (a JSON object: where a test publishes KV
    /// events for this worker, SGLang's descriptor shape). Default: nothing.
    #[arg(long)]
    pub kv_events_descriptor: Option<String>,
    /// Serve HTTPS with this PEM certificate (with --tls-key).
    #[arg(long)]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<std::path::PathBuf>,
    /// With --tls-cert: serve only clients presenting a certificate this CA signed.
    #[arg(long)]
    pub tls_client_ca: Option<std::path::PathBuf>,
}

struct Recorded {
    path: String,
    headers: Value,
    body: Bytes,
    /// When it arrived, in microseconds since the Unix epoch: comparable between workers on
    /// one host, so a test tells concurrent requests from sequential ones by their times.
    received_us: u64,
}

fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

struct Fake {
    args: FakeWorkerArgs,
    fail_remaining: AtomicU32,
    fail_status: AtomicU32,
    requests: AtomicU64,
    flushes: AtomicU64,
    inflight: AtomicUsize,
    /// Requests whose client went away before the answer ended.
    cancelled: AtomicU64,
    recent: Mutex<VecDeque<Recorded>>,
}

/// Counts a request as cancelled unless it got to answer.
struct CancelGuard(Arc<Fake>, bool);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

const RECENT: usize = 256;

#[derive(Deserialize)]
struct FailQuery {
    count: u32,
    #[serde(default = "default_fail_status")]
    status: u16,
}

fn default_fail_status() -> u16 {
    503
}

/// Held by an answer's body: in flight until it is dropped, cancelled if dropped before its
/// last event was taken.
struct BodyGuard {
    fake: Arc<Fake>,
    sent: usize,
    total: usize,
}

impl BodyGuard {
    fn took_one(&mut self) {
        self.sent += 1;
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        self.fake.inflight.fetch_sub(1, Ordering::Relaxed);
        if self.sent < self.total {
            self.fake.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn burn(us: u64) {
    if us == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_micros(us);
    let mut x = 0u64;
    while Instant::now() < until {
        for i in 0..64u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
    }
}

fn prompt_tokens(v: &Value) -> usize {
    if let Some(ids) = v.get("input_ids").and_then(Value::as_array) {
        return ids.len();
    }
    let text_len: usize = ["text", "prompt"]
        .iter()
        .filter_map(|k| v.get(k).and_then(Value::as_str))
        .map(str::len)
        .sum::<usize>()
        + v.get("messages")
            .and_then(Value::as_array)
            .map(|ms| {
                ms.iter()
                    .filter_map(|m| m.get("content").and_then(Value::as_str))
                    .map(str::len)
                    .sum()
            })
            .unwrap_or(0);
    text_len.div_ceil(4)
}

fn wanted_tokens(v: &Value, default: usize) -> usize {
    v.pointer("/sampling_params/max_new_tokens")
        .or_else(|| v.get("max_tokens"))
        .or_else(|| v.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .unwrap_or(default)
        .clamp(1, 4096)
}

fn sse(v: Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The reply to an inference request, in the endpoint's shape.
fn reply(path: &str, req: &Value, n: usize, model: &str, rid: &str) -> (bool, Vec<Bytes>) {
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let prompt = prompt_tokens(req);
    let tokens: Vec<String> = (0..n).map(|i| format!("tok{i} ")).collect();
    let full: String = tokens.concat();
    let usage =
        json!({"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n});
    let other = match path {
        "/v1/embeddings" => Some(json!({"object": "list", "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 1.0]}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt}})),
        "/v1/rerank" => Some(json!({"id": rid, "model": model,
            "results": [{"index": 0, "relevance_score": 0.9}, {"index": 1, "relevance_score": 0.1}]})),
        "/v1/score" => Some(json!({"id": rid, "model": model, "scores": [0.75]})),
        "/v1/responses" => Some(json!({"id": format!("resp_{rid}"), "object": "response",
            "model": model, "status": "completed", "output_text": full})),
        _ => None,
    };
    if let Some(body) = other {
        return (false, vec![Bytes::from(body.to_string())]);
    }
    if !stream {
        let body = match path {
            "/generate" => json!({"text": full, "output_ids": (0..n).collect::<Vec<_>>(),
                "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": n},
                    "prompt_tokens": prompt, "completion_tokens": n, "cached_tokens": 0}}),
            "/v1/chat/completions" => json!({"id": rid, "object": "chat.completion", "created": 0,
                "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": full},
                "finish_reason": "length"}], "usage": usage}),
            _ => json!({"id": rid, "object": "text_completion", "created": 0, "model": model,
                "choices": [{"index": 0, "text": full, "finish_reason": "length"}], "usage": usage}),
        };
        return (false, vec![Bytes::from(body.to_string())]);
    }
    let mut events = Vec::with_capacity(n + 2);
    let mut text = String::new();
    for (i, t) in tokens.iter().enumerate() {
        text.push_str(t);
        let last = i + 1 == n;
        let finish = if last { json!("length") } else { Value::Null };
        let ev = match path {
            "/generate" => json!({"text": text, "output_ids": (0..=i).collect::<Vec<_>>(),
                "meta_info": {"id": rid, "finish_reason": if last { json!({"type": "length", "length": n}) } else { Value::Null },
                "prompt_tokens": prompt, "completion_tokens": i + 1, "cached_tokens": 0}}),
            "/v1/chat/completions" => {
                json!({"id": rid, "object": "chat.completion.chunk", "created": 0,
                "model": model, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": finish}]})
            }
            _ => json!({"id": rid, "object": "text_completion", "created": 0, "model": model,
                "choices": [{"index": 0, "text": t, "finish_reason": finish}]}),
        };
        events.push(sse(ev));
    }
    let include_usage = req
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if include_usage && path != "/generate" {
        events.push(sse(
            json!({"id": rid, "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [], "usage": usage}),
        ));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    (true, events)
}

async fn inference(
    State(f): State<Arc<Fake>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = f.requests.fetch_add(1, Ordering::Relaxed);
    let path = uri.path().to_string();
    {
        let keep = [
            "authorization",
            "x-request-id",
            "x-smg-routing-key",
            "content-type",
            "traceparent",
        ];
        let h: serde_json::Map<String, Value> = keep
            .iter()
            .filter_map(|k| {
                headers
                    .get(*k)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| (k.to_string(), json!(v)))
            })
            .collect();
        let mut r = f.recent.lock();
        if r.len() == RECENT {
            r.pop_front();
        }
        r.push_back(Recorded {
            path: path.clone(),
            headers: Value::Object(h),
            body: body.clone(),
            received_us: unix_micros(),
        });
    }
    let name = f.args.name.clone();
    // The delay comes first: an injected failure then arrives late too.
    if f.args.headers_delay_ms > 0 {
        let mut guard = CancelGuard(f.clone(), false);
        tokio::time::sleep(Duration::from_millis(f.args.headers_delay_ms)).await;
        guard.1 = true;
    }
    let fail = f
        .fail_remaining
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
        .is_ok();
    if fail {
        let status = StatusCode::from_u16(f.fail_status.load(Ordering::Relaxed) as u16)
            .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return (
            status,
            [("x-fake-worker", name)],
            Json(json!({"error": {"message": "injected failure (fake worker)", "code": status.as_u16()}})),
        )
            .into_response();
    }
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                [("x-fake-worker", name)],
                Json(json!({"error": {"message": format!("fake worker: bad JSON: {e}")}})),
            )
                .into_response()
        }
    };
    burn(f.args.cpu_us);
    let vllm = f.args.engine == "vllm";
    if vllm && path == "/generate" {
        return (
            StatusCode::NOT_FOUND,
            [("x-fake-worker", name)],
            "vLLM serves no /generate",
        )
            .into_response();
    }
    let rid = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| format!("fake-{n}"));
    let tokens = wanted_tokens(&req, f.args.tokens);
    let (stream, mut events) = reply(&path, &req, tokens, &f.args.model, &rid);
    // A vLLM prefill asked to keep its KV for a remote decode answers where to find it.
    let remote_decode = req.pointer("/kv_transfer_params/do_remote_decode") == Some(&json!(true));
    if vllm && remote_decode && !stream {
        if let Ok(mut v) = serde_json::from_slice::<Value>(&events[0]) {
            v["kv_transfer_params"] = json!({"do_remote_prefill": true, "do_remote_decode": false,
                "remote_engine_id": format!("{name}-engine"), "remote_block_ids": [0, 1, 2],
                "remote_host": f.args.host, "remote_port": 5600, "tp_size": 1});
            events[0] = Bytes::from(v.to_string());
        }
    }
    f.inflight.fetch_add(1, Ordering::Relaxed);
    let mut guard = BodyGuard {
        fake: f.clone(),
        sent: 0,
        total: events.len(),
    };
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    // The events, paced by the token delay; the in-flight count drops with the body.
    let delay = Duration::from_secs_f64(f.args.token_delay_ms.max(0.0) / 1e3);
    let paced = tokio_stream::iter(events).throttle(delay).map(move |e| {
        guard.took_one();
        Ok::<Bytes, std::convert::Infallible>(e)
    });
    let body = Body::from_stream(paced);
    (
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::HeaderName::from_static("x-fake-worker"), name),
        ],
        body,
    )
        .into_response()
}

async fn fail(State(f): State<Arc<Fake>>, Query(q): Query<FailQuery>) -> Json<Value> {
    f.fail_status.store(q.status as u32, Ordering::Relaxed);
    f.fail_remaining.store(q.count, Ordering::Relaxed);
    Json(json!({"failing_next": q.count, "status": q.status}))
}

async fn recent(State(f): State<Arc<Fake>>) -> Json<Value> {
    let r = f.recent.lock();
    let list: Vec<Value> = r
        .iter()
        .map(|x| {
            json!({"path": x.path, "headers": x.headers,
                   "body": String::from_utf8_lossy(&x.body), "received_us": x.received_us})
        })
        .collect();
    Json(json!({"requests": list}))
}

async fn stats(State(f): State<Arc<Fake>>) -> Json<Value> {
    Json(json!({
        "name": f.args.name,
        "requests": f.requests.load(Ordering::Relaxed),
        "flushes": f.flushes.load(Ordering::Relaxed),
        "inflight": f.inflight.load(Ordering::Relaxed),
        "cancelled": f.cancelled.load(Ordering::Relaxed),
    }))
}

async fn server_info(State(f): State<Arc<Fake>>) -> Json<Value> {
    let mut info = json!({"model_path": f.args.model, "served_model_name": f.args.model,
        "tp_size": 1, "dp_size": f.args.dp_size, "fake_worker": true, "version": "fake"});
    if let Some(d) = &f.args.kv_events_descriptor {
        info["kv_events"] = serde_json::from_str(d).unwrap_or(Value::Null);
    }
    Json(info)
}

async fn model_info(State(f): State<Arc<Fake>>) -> Json<Value> {
    Json(json!({"model_path": f.args.model, "is_generation": true, "model_type": "fake"}))
}

async fn load(State(f): State<Arc<Fake>>) -> Json<Value> {
    let n = f.inflight.load(Ordering::Relaxed);
    Json(json!({"num_reqs": n, "num_tokens": n * 100, "dp_rank": 0}))
}

async fn flush(State(f): State<Arc<Fake>>) -> &'static str {
    f.flushes.fetch_add(1, Ordering::Relaxed);
    "Cache flushed (fake worker)"
}

async fn models(State(f): State<Arc<Fake>>) -> Json<Value> {
    let owner = if f.args.engine == "vllm" {
        "vllm"
    } else {
        "fake"
    };
    let data: Vec<Value> = std::iter::once(&f.args.model)
        .chain(&f.args.extra_models)
        .map(|m| json!({"id": m, "object": "model", "owned_by": owner}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn metrics(State(f): State<Arc<Fake>>) -> String {
    format!(
        "# TYPE fake_worker_requests_total counter\nfake_worker_requests_total {}\n",
        f.requests.load(Ordering::Relaxed)
    )
}

/// Where a FAKE worker listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Addrs {
    pub http: std::net::SocketAddr,
    /// Its Mooncake bootstrap server, with `--kv-bootstrap-port` (0: the kernel chooses).
    #[serde(default)]
    pub kv_bootstrap: Option<std::net::SocketAddr>,
}

/// Starts a FAKE worker as a child process (`rbgctl bench fake-worker`) on `host:port` (port
/// 0: the kernel chooses), with `extra` flags; returns once it listens.
pub fn spawn(
    launcher: &crate::launch::Launcher,
    host: &str,
    port: u16,
    name: &str,
    extra: &[&str],
) -> Result<crate::launch::Spawned<Addrs>, crate::launch::LaunchError> {
    let port = port.to_string();
    let argv: Vec<String> = [
        "bench",
        "fake-worker",
        "--host",
        host,
        "--port",
        &port,
        "--name",
        name,
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(String::from)
    .collect();
    launcher.spawn_argv(&format!("worker-{name}"), &argv)
}

/// Runs a FAKE worker until SIGINT or SIGTERM.
pub fn run(args: FakeWorkerArgs) -> std::io::Result<()> {
    let listener = crate::role::bind("fake worker", &args.host, args.port)
        .map_err(|e| std::io::Error::new(e.source.kind(), e.to_string()))?;
    let mut addrs = Addrs {
        http: listener.local_addr()?,
        kv_bootstrap: None,
    };
    let shutdown = crate::shutdown::Shutdown::on_signals()?;
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = args.threads {
        rt.worker_threads(t.max(1));
    }
    let rt = rt.enable_all().build()?;
    rt.block_on(async move {
        let listener = crate::role::async_listener(listener)?;
        eprintln!(
            "FAKE worker {} (no model; canned tokens) listening on {}",
            args.name, addrs.http
        );
        let (tls_cert, tls_key, tls_client_ca) = (
            args.tls_cert.clone(),
            args.tls_key.clone(),
            args.tls_client_ca.clone(),
        );
        let f = Arc::new(Fake {
            args,
            fail_remaining: AtomicU32::new(0),
            fail_status: AtomicU32::new(503),
            requests: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            inflight: AtomicUsize::new(0),
            cancelled: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::new()),
        });
        if let Some(port) = f.args.kv_bootstrap_port {
            let listener = tokio::net::TcpListener::bind((f.args.host.as_str(), port)).await?;
            addrs.kv_bootstrap = Some(listener.local_addr()?);
            let ready_at =
                Instant::now() + Duration::from_millis(f.args.kv_bootstrap_ready_after_ms);
            let engine = format!("{}-engine", f.args.name);
            let worker_addr = format!("{}:{}", f.args.host, addrs.http.port());
            let query = Router::new().route(
                "/query",
                get(move || {
                    let (engine, worker_addr) = (engine.clone(), worker_addr.clone());
                    async move {
                        if Instant::now() < ready_at {
                            return (
                                StatusCode::SERVICE_UNAVAILABLE,
                                "bootstrap not ready (fake)",
                            )
                                .into_response();
                        }
                        Json(json!({"0": {"engine_id": engine,
                                          "worker_addr": {"0": {"0": worker_addr}}}}))
                        .into_response()
                    }
                }),
            );
            tokio::spawn(async move { axum::serve(listener, query).await });
        }
        let app = Router::new()
            .route("/generate", post(inference))
            .route("/v1/chat/completions", post(inference))
            .route("/v1/completions", post(inference))
            .route("/v1/embeddings", post(inference))
            .route("/v1/rerank", post(inference))
            .route("/v1/score", post(inference))
            .route("/v1/responses", post(inference))
            .route("/health", get(|| async { "OK" }))
            .route("/health_generate", get(|| async { "OK" }))
            .route("/get_server_info", get(server_info))
            .route("/server_info", get(server_info))
            .route("/get_model_info", get(model_info))
            .route("/model_info", get(model_info))
            .route("/get_load", get(load))
            .route("/flush_cache", post(flush))
            .route("/v1/models", get(models))
            .route("/metrics", get(metrics))
            .route("/fake/fail", post(fail))
            .route("/fake/requests", get(recent))
            .route("/fake/stats", get(stats))
            .with_state(f);
        crate::role::announce("fake-worker", &addrs);
        if let (Some(cert), Some(key)) = (&tls_cert, &tls_key) {
            let tls = crate::tls::server_config(cert, key, tls_client_ca.as_deref())
                .map_err(std::io::Error::other)?;
            let limits = crate::http_server::HttpLimits {
                max_connections: 16_384,
                max_connections_per_peer: 16_384,
                ..Default::default()
            };
            crate::http_server::serve_tls(listener, app, shutdown, limits, Some(tls), None).await;
            return Ok(());
        }
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_have_sglang_and_openai_shapes() {
        let req = json!({"text": "abcdefgh", "stream": true});
        let (stream, ev) = reply("/generate", &req, 3, "m", "r");
        assert!(stream);
        assert_eq!(ev.len(), 4);
        let first: Value = serde_json::from_slice(&ev[0][6..]).unwrap();
        assert_eq!(first["meta_info"]["prompt_tokens"], 2);
        assert_eq!(&ev[3][..], b"data: [DONE]\n\n");
        let req = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
            "stream_options": {"include_usage": true}, "max_tokens": 2});
        let (_, ev) = reply(
            "/v1/chat/completions",
            &req,
            wanted_tokens(&req, 8),
            "m",
            "r",
        );
        assert_eq!(ev.len(), 4, "2 tokens, usage, DONE");
        let (stream, ev) = reply("/v1/completions", &json!({"prompt": "x"}), 2, "m", "r");
        assert!(!stream);
        let v: Value = serde_json::from_slice(&ev[0]).unwrap();
        assert_eq!(v["choices"][0]["text"], "tok0 tok1 ");
    }
}
