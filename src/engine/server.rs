//! HTTP side of the SIMULATED engine: SGLang's native endpoints and the OpenAI-compatible ones,
//! with the request's life modelled step by step (cache lookup, L3 prefetch, queued prefill,
//! paced decode, cache insert and L3 backup).

use super::cache::Tiers;
use super::cost::CostModel;
use super::device::Device;
use super::l3::L3;
use super::{EngineConfig, Mode};
use crate::simulated_tokens as tokens;
use crate::telemetry::{Family, PromText};
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tracing::Instrument as _;

// The `/metrics` families this file writes, each declared once.
const CACHED_TOKENS_TOTAL: Family = Family::counter(
    "sglang:cached_tokens_total",
    "Prompt tokens served from cache (simulated engine).",
);
const CACHED_TOKENS_TOTAL_2: Family = Family::counter(
    "rbgctl_sim_cached_tokens_total",
    "Cached prompt tokens by the tier that held them.",
);
const CACHE_HIT_RATE: Family = Family::gauge(
    "sglang:cache_hit_rate",
    "Cached over prompt tokens since start (simulated engine).",
);
const E2E_REQUEST_LATENCY_SECONDS: Family = Family::histogram(
    "sglang:e2e_request_latency_seconds",
    "Time from a request's arrival to its last token (simulated engine).",
);
const GENERATION_TOKENS_TOTAL: Family = Family::counter(
    "sglang:generation_tokens_total",
    "Generated tokens (simulated engine).",
);
const L3_BACKUPS_IN_FLIGHT: Family = Family::gauge(
    "rbgctl_sim_l3_backups_in_flight",
    "L3 backups queued or being written.",
);
const L3_BACKUPS_SKIPPED_TOTAL: Family = Family::counter(
    "rbgctl_sim_l3_backups_skipped_total",
    "Backups dropped because too many were running.",
);
const L3_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_sim_l3_bytes_total",
    "KV bytes moved to or from the rbgctl pool.",
);
const L3_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_sim_l3_errors_total",
    "Pool reads that failed or returned wrong bytes, and failed writes.",
);
const L3_PAGES_TOTAL: Family = Family::counter(
    "rbgctl_sim_l3_pages_total",
    "KV pages moved to or from the rbgctl pool.",
);
const NUM_QUEUE_REQS: Family = Family::gauge(
    "sglang:num_queue_reqs",
    "Requests waiting for the device or computing their prefill (simulated engine).",
);
const NUM_RUNNING_REQS: Family = Family::gauge(
    "sglang:num_running_reqs",
    "Requests being served (simulated engine).",
);
const PROMPT_TOKENS_TOTAL: Family = Family::counter(
    "sglang:prompt_tokens_total",
    "Prompt tokens (simulated engine).",
);
const REQUESTS_TOTAL: Family = Family::counter(
    "rbgctl_sim_requests_total",
    "Requests received by the simulated engine.",
);
const REQUEST_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_sim_request_errors_total",
    "Requests refused or failed.",
);
const TIME_TO_FIRST_TOKEN_SECONDS: Family = Family::histogram(
    "sglang:time_to_first_token_seconds",
    "Time from a request's arrival to its first token (simulated engine).",
);

/// Upper bound on generated tokens per request.
const MAX_NEW_TOKENS: usize = 16_384;
/// Upper bound on prompt tokens per request.
const MAX_PROMPT_TOKENS: usize = 1 << 20;
/// How long a decode engine waits for its prefill, and a finished prefill is remembered.
const ROOM_WAIT: Duration = Duration::from_secs(60);
/// L3 backups written at once, as HiCache's storage writers.
const BACKUP_WRITERS: usize = 4;
/// L3 backups waiting or being written; past it more are skipped (counted), as a full write
/// queue drops them.
const BACKUP_QUEUE: usize = 256;

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    cached_device: AtomicU64,
    cached_host: AtomicU64,
    cached_storage: AtomicU64,
    backups_skipped: AtomicU64,
    running: AtomicI64,
    waiting: AtomicI64,
    tokens_in_flight: AtomicI64,
    /// From the request's start to its first token, and to its last (SGLang's histograms).
    ttft: crate::telemetry::Histogram,
    e2e: crate::telemetry::Histogram,
}

struct Room {
    prompt_tokens: usize,
    cached_tokens: usize,
    at: Instant,
}

/// A SIMULATED engine: its caches, queue, L3 and counters, shared by its handlers.
pub struct Engine {
    cfg: EngineConfig,
    cost: CostModel,
    tiers: Mutex<Tiers>,
    /// One device: prefills run one chunk at a time.
    device: Device,
    l3: Option<Arc<L3>>,
    /// A place in the write queue for each backup waiting or being written.
    backup_queue: Arc<Semaphore>,
    /// A writer for each backup being written.
    backup_writers: Arc<Semaphore>,
    rooms: Mutex<HashMap<u64, Room>>,
    room_ready: Notify,
    http: reqwest::Client,
    m: Counters,
    next_id: AtomicU64,
    /// With `kv_events_config`: the publisher of the caches' events, and its settings.
    events: Option<(
        crate::kv_events::Publisher,
        crate::kv_events::KvEventsConfig,
    )>,
}

type S = State<Arc<Engine>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Generate,
    Completions,
    Chat,
}

/// A request, parsed.
#[derive(Debug)]
struct Req {
    api: Api,
    tokens: Vec<u32>,
    /// SGLang's `priority` (with priority scheduling: higher first, unless configured lower).
    priority: i64,
    max_new: usize,
    stream: bool,
    include_usage: bool,
    rid: String,
    bootstrap: Option<(String, u16, u64)>,
}

fn bad(msg: impl Into<String>) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": {"message": msg.into(), "type": "BadRequest", "code": 400}})),
    )
        .into_response()
}

fn parse(api: Api, v: &Value, default_max: usize, next_id: u64) -> Result<Req, String> {
    let obj = v.as_object().ok_or("the body must be a JSON object")?;
    let tokens = match api {
        Api::Generate => match (obj.get("input_ids"), obj.get("text")) {
            (Some(ids), _) => ids_of(ids)?,
            (None, Some(Value::String(t))) => tokens::encode(t),
            (None, Some(_)) => {
                return Err("`text` must be a string (batches are not supported)".into())
            }
            (None, None) => return Err("`input_ids` or `text` is required".into()),
        },
        Api::Completions => match obj.get("prompt") {
            Some(Value::String(t)) => tokens::encode(t),
            Some(ids @ Value::Array(_)) => ids_of(ids)?,
            _ => return Err("`prompt` (a string or token ids) is required".into()),
        },
        Api::Chat => {
            let msgs = obj
                .get("messages")
                .and_then(Value::as_array)
                .ok_or("`messages` (an array) is required")?;
            let mut text = String::new();
            for m in msgs {
                let content = match m.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join(" "),
                    Some(Value::Null) | None => String::new(),
                    Some(_) => return Err("a message's `content` must be a string or parts".into()),
                };
                text.push_str(&content);
                text.push(' ');
            }
            tokens::encode(&text)
        }
    };
    if tokens.is_empty() {
        return Err("the prompt is empty".into());
    }
    if tokens.len() > MAX_PROMPT_TOKENS {
        return Err(format!(
            "the prompt has {} tokens; at most {MAX_PROMPT_TOKENS}",
            tokens.len()
        ));
    }
    let max = match api {
        Api::Generate => v.pointer("/sampling_params/max_new_tokens"),
        _ => obj
            .get("max_completion_tokens")
            .or_else(|| obj.get("max_tokens")),
    };
    let max_new = match max {
        None | Some(Value::Null) => default_max,
        Some(x) => x
            .as_u64()
            .ok_or("the maximum number of new tokens must be a non-negative integer")?
            as usize,
    }
    .clamp(1, MAX_NEW_TOKENS);
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("`stream` must be a boolean".into()),
    };
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => 0,
        Some(p) => p.as_i64().ok_or("`priority` must be an integer")?,
    };
    let rid = obj
        .get("rid")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("sim-{next_id}"));
    let bootstrap = match obj.get("bootstrap_room") {
        None | Some(Value::Null) => None,
        Some(room) => {
            let room = room.as_u64().ok_or("`bootstrap_room` must be an integer")?;
            let host = obj
                .get("bootstrap_host")
                .and_then(Value::as_str)
                .ok_or("`bootstrap_host` is required with `bootstrap_room`")?;
            let port = obj
                .get("bootstrap_port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or("`bootstrap_port` (a port) is required with `bootstrap_room`")?;
            Some((host.to_string(), port, room))
        }
    };
    Ok(Req {
        api,
        tokens,
        priority,
        max_new,
        stream,
        include_usage,
        rid,
        bootstrap,
    })
}

fn ids_of(v: &Value) -> Result<Vec<u32>, String> {
    let a = v
        .as_array()
        .ok_or("token ids must be an array of integers")?;
    a.iter()
        .map(|x| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n < tokens::VOCAB)
                .ok_or_else(|| {
                    format!(
                        "token ids must be integers below {} (batches are not supported)",
                        tokens::VOCAB
                    )
                })
        })
        .collect()
}

/// What the prefill found and did.
#[derive(Debug, Clone, Copy, Default)]
struct Prefilled {
    cached_tokens: usize,
}

/// Decrements a gauge when dropped.
struct Gauge<'a>(&'a AtomicI64, i64);

impl<'a> Gauge<'a> {
    fn up(g: &'a AtomicI64, by: i64) -> Gauge<'a> {
        g.fetch_add(by, Ordering::Relaxed);
        Gauge(g, by)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl Engine {
    /// `keys` (the pages of `tokens`) are on the device now; their events are published at
    /// once, under the lock, so batches leave in the order the caches changed.
    fn cache_insert(&self, keys: &[String], tokens: &[u32]) {
        let mut tiers = self.tiers.lock();
        tiers.insert(keys, tokens, self.cfg.page_size);
        self.publish(&mut tiers);
    }

    fn publish(&self, tiers: &mut Tiers) {
        if let Some((p, _)) = &self.events {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            if let Some(batch) = tiers.take_events(ts) {
                p.publish(batch);
            }
        }
    }

    fn page_bytes(&self) -> usize {
        self.cfg.page_size * self.cfg.bytes_per_token
    }

    /// Cache lookup, L3 prefetch, then the prefill itself on the device.
    async fn prefill(&self, prompt: &[u32], priority: i64) -> Prefilled {
        let keys = tokens::page_keys(prompt, self.cfg.page_size);
        let m = self.tiers.lock().lookup(&keys);
        let mut from_storage = 0;
        if let Some(l3) = &self.l3 {
            let rest: Vec<String> = keys[m.pages()..].to_vec();
            if !rest.is_empty() {
                let l3 = l3.clone();
                from_storage = tokio::task::spawn_blocking(move || l3.fetch_prefix(&rest))
                    .await
                    .unwrap_or(0);
            }
        }
        let page = self.cfg.page_size;
        // The last prompt token is always computed, as SGLang does.
        let cached = ((m.pages() + from_storage) * page).min(prompt.len() - 1);
        let loaded = ((m.host + from_storage) * page).min(cached);
        {
            let _waiting = Gauge::up(&self.m.waiting, 1);
            let place = self.device.place(self.cfg.device_priority(priority));
            let computed = prompt.len() - cached;
            let total = self.cost.prefill(computed, loaded);
            let chunk = Device::chunk_time(total, computed, self.cfg.chunked_prefill_size);
            self.device.prefill(place, total, chunk).await;
            drop(_waiting);
            self.cache_insert(&keys, prompt);
        }
        let dev = (m.device * page).min(cached);
        let host = (m.host * page).min(cached - dev);
        self.m
            .cached_device
            .fetch_add(dev as u64, Ordering::Relaxed);
        self.m.cached_host.fetch_add(host as u64, Ordering::Relaxed);
        self.m
            .cached_storage
            .fetch_add((cached - dev - host) as u64, Ordering::Relaxed);
        Prefilled {
            cached_tokens: cached,
        }
    }

    /// Decode side of PD: waits for the prefill through its bootstrap server, then for the KV
    /// transfer.
    async fn await_prefill(
        &self,
        host: &str,
        port: u16,
        room: u64,
        prompt: usize,
    ) -> Result<Prefilled, String> {
        let url = format!("http://{host}:{port}/sim/bootstrap/{room}");
        let resp = self
            .http
            .get(&url)
            .timeout(ROOM_WAIT + Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| format!("bootstrap {url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("bootstrap {url}: {}", resp.status()));
        }
        let v: Value = resp
            .json()
            .await
            .map_err(|e| format!("bootstrap {url}: {e}"))?;
        let cached = v["cached_tokens"].as_u64().unwrap_or(0) as usize;
        tokio::time::sleep(self.cost.kv_transfer(prompt * self.cfg.bytes_per_token)).await;
        Ok(Prefilled {
            cached_tokens: cached.min(prompt),
        })
    }

    /// After a request: its whole sequence is in the prefix cache (as SGLang's radix tree
    /// keeps it) and is backed up to L3 in the background.
    fn finish(&self, prompt: &[u32], out: &[u32]) {
        let mut seq = prompt.to_vec();
        seq.extend_from_slice(out);
        let keys = tokens::page_keys(&seq, self.cfg.page_size);
        self.cache_insert(&keys, &seq);
        if let Some(l3) = &self.l3 {
            match self.backup_queue.clone().try_acquire_owned() {
                Ok(place) => {
                    let l3 = l3.clone();
                    let writers = self.backup_writers.clone();
                    tokio::spawn(async move {
                        let Ok(writer) = writers.acquire_owned().await else {
                            return;
                        };
                        let _ = tokio::task::spawn_blocking(move || l3.backup(&keys)).await;
                        drop((writer, place));
                    });
                }
                Err(_) => {
                    self.m.backups_skipped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn remember_room(&self, room: u64, prompt_tokens: usize, cached_tokens: usize) {
        let mut rooms = self.rooms.lock();
        rooms.retain(|_, r| r.at.elapsed() < ROOM_WAIT);
        rooms.insert(
            room,
            Room {
                prompt_tokens,
                cached_tokens,
                at: Instant::now(),
            },
        );
        drop(rooms);
        self.room_ready.notify_waiters();
    }
}

/// One streamed piece, or the whole answer when `last` and not streaming.
fn chunk(e: &Engine, r: &Req, out: &[u32], cached: usize, last: bool, stream: bool) -> Value {
    let n = out.len();
    let prompt = r.tokens.len();
    let finish = |openai: bool| {
        if !last {
            Value::Null
        } else if openai {
            json!("length")
        } else {
            json!({"type": "length", "length": n})
        }
    };
    let usage = json!({"prompt_tokens": prompt, "completion_tokens": n,
        "total_tokens": prompt + n, "prompt_tokens_details": {"cached_tokens": cached}});
    match (r.api, stream) {
        (Api::Generate, _) => json!({"text": tokens::decode(out), "output_ids": out,
            "meta_info": {"id": r.rid, "finish_reason": finish(false), "prompt_tokens": prompt,
                "completion_tokens": n, "cached_tokens": cached}}),
        (Api::Chat, true) => {
            let t = out
                .last()
                .map(|&t| tokens::decode_one(t))
                .unwrap_or_default();
            let mut delta = json!({"content": t});
            if n == 1 {
                delta["role"] = json!("assistant");
            }
            json!({"id": r.rid, "object": "chat.completion.chunk", "created": created(),
                "model": e.cfg.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish(true)}]})
        }
        (Api::Chat, false) => {
            json!({"id": r.rid, "object": "chat.completion", "created": created(),
            "model": e.cfg.model, "choices": [{"index": 0, "message": {"role": "assistant",
            "content": tokens::decode(out)}, "finish_reason": "length"}], "usage": usage})
        }
        (Api::Completions, true) => {
            let t = out
                .last()
                .map(|&t| tokens::decode_one(t))
                .unwrap_or_default();
            json!({"id": r.rid, "object": "text_completion", "created": created(), "model": e.cfg.model,
                "choices": [{"index": 0, "text": t, "finish_reason": finish(true)}]})
        }
        (Api::Completions, false) => json!({"id": r.rid, "object": "text_completion",
            "created": created(), "model": e.cfg.model, "choices": [{"index": 0,
            "text": tokens::decode(out), "finish_reason": "length"}], "usage": usage}),
    }
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Runs one request to its end; with `tx`, streams it. Returns the final answer when not
/// streaming. A client that goes away stops the generation.
async fn run(e: Arc<Engine>, r: Req, tx: Option<mpsc::Sender<Bytes>>) -> Result<Value, String> {
    let _running = Gauge::up(&e.m.running, 1);
    let _tokens = Gauge::up(&e.m.tokens_in_flight, (r.tokens.len() + r.max_new) as i64);
    let started = Instant::now();
    let prompt = r.tokens.len();
    let (pre, n) = match (e.cfg.mode, &r.bootstrap) {
        (Mode::Decode, Some((host, port, room))) => {
            (e.await_prefill(host, *port, *room, prompt).await?, r.max_new)
        }
        (Mode::Decode, None) => {
            return Err("this is a decode engine: the request needs bootstrap_host, bootstrap_port and bootstrap_room (send it through the router in PD mode)".into())
        }
        (Mode::Prefill, b) => {
            let pre = e.prefill(&r.tokens, r.priority).await;
            if let Some((_, _, room)) = b {
                e.remember_room(*room, prompt, pre.cached_tokens);
            }
            (pre, 1)
        }
        (Mode::Regular, _) => (e.prefill(&r.tokens, r.priority).await, r.max_new),
    };
    e.m.prompt_tokens
        .fetch_add(prompt as u64, Ordering::Relaxed);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        if i > 0 {
            tokio::time::sleep(e.cost.decode_step()).await;
        }
        out.push(tokens::output_token(&r.tokens, i));
        if i == 0 {
            e.m.ttft.observe(started.elapsed());
        }
        if let Some(tx) = &tx {
            let v = chunk(&e, &r, &out, pre.cached_tokens, i + 1 == n, true);
            if tx.send(sse(&v)).await.is_err() {
                break;
            }
        }
    }
    e.m.generated_tokens
        .fetch_add(out.len() as u64, Ordering::Relaxed);
    e.m.e2e.observe(started.elapsed());
    if e.cfg.mode != Mode::Decode {
        e.finish(&r.tokens, &out);
    }
    if let Some(tx) = &tx {
        if r.include_usage && r.api != Api::Generate {
            let n = out.len();
            let usage = json!({"id": r.rid, "object": "chat.completion.chunk", "created": created(),
                "model": e.cfg.model, "choices": [], "usage": {"prompt_tokens": prompt,
                "completion_tokens": n, "total_tokens": prompt + n,
                "prompt_tokens_details": {"cached_tokens": pre.cached_tokens}}});
            let _ = tx.send(sse(&usage)).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        return Ok(Value::Null);
    }
    Ok(chunk(&e, &r, &out, pre.cached_tokens, true, false))
}

async fn infer(State(e): S, uri: Uri, body: Bytes) -> Response {
    let api = match uri.path() {
        "/generate" => Api::Generate,
        "/v1/completions" => Api::Completions,
        _ => Api::Chat,
    };
    let id = e.next_id.fetch_add(1, Ordering::Relaxed);
    e.m.requests.fetch_add(1, Ordering::Relaxed);
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(err) => {
            e.m.errors.fetch_add(1, Ordering::Relaxed);
            return bad(format!("simulated engine: the body is not JSON: {err}"));
        }
    };
    let r = match parse(api, &v, e.cfg.default_max_tokens, id) {
        Ok(r) => r,
        Err(msg) => {
            e.m.errors.fetch_add(1, Ordering::Relaxed);
            return bad(format!("simulated engine: {msg}"));
        }
    };
    // The span follows the request's futures, not the thread (which serves others meanwhile).
    let span =
        tracing::debug_span!("request", rid = %r.rid, prompt = r.tokens.len(), max_new = r.max_new);
    if r.stream {
        let (tx, rx) = mpsc::channel(64);
        let e2 = e.clone();
        let streaming = async move {
            if let Err(msg) = run(e2.clone(), r, Some(tx.clone())).await {
                e2.m.errors.fetch_add(1, Ordering::Relaxed);
                let err = json!({"error": {"message": format!("simulated engine: {msg}")}});
                let _ = tx.send(sse(&err)).await;
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            }
        };
        tokio::spawn(streaming.instrument(span));
        return (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (
                    header::HeaderName::from_static("x-simulated-engine"),
                    "true",
                ),
            ],
            Body::from_stream(ReceiverStream::new(rx).map(Ok::<Bytes, Infallible>)),
        )
            .into_response();
    }
    match run(e.clone(), r, None).instrument(span).await {
        Ok(v) => (
            [(
                header::HeaderName::from_static("x-simulated-engine"),
                "true",
            )],
            Json(v),
        )
            .into_response(),
        Err(msg) => {
            e.m.errors.fetch_add(1, Ordering::Relaxed);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": {"message": format!("simulated engine: {msg}")}})),
            )
                .into_response()
        }
    }
}

/// Prefill side of PD: answers when the room's prefill is done.
async fn bootstrap(State(e): S, Path(room): Path<u64>) -> Response {
    let deadline = tokio::time::Instant::now() + ROOM_WAIT;
    loop {
        let notified = e.room_ready.notified();
        if let Some(r) = e.rooms.lock().remove(&room) {
            return Json(json!({"room": room, "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens}))
            .into_response();
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return (
                StatusCode::NOT_FOUND,
                Json(json!({"error": {"message": format!("simulated engine: no prefill for room {room}")}})),
            )
                .into_response();
        }
    }
}

async fn server_info(State(e): S) -> Json<Value> {
    let a = &e.cfg;
    Json(json!({
        "simulated": true,
        "version": concat!("rbgctl-sim-", env!("CARGO_PKG_VERSION")),
        "model_path": a.model, "served_model_name": a.model,
        "disaggregation_mode": match a.mode { Mode::Regular => "null", Mode::Prefill => "prefill", Mode::Decode => "decode" },
        "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
        "page_size": a.page_size,
        "device_cache_tokens": a.device_cache_tokens,
        "enable_hierarchical_cache": a.host_cache_tokens > 0,
        "hicache_storage_backend": a.l3_master.as_ref().map(|_| "rbgctl"),
        "host_cache_tokens": a.host_cache_tokens,
        "bytes_per_token": a.bytes_per_token,
        "kv_events": e.events.as_ref().and_then(|(p, c)| crate::kv_events::config::descriptor(
            c, &p.endpoint, p.replay_endpoint.as_deref(), a.page_size)),
    }))
}

async fn model_info(State(e): S) -> Json<Value> {
    Json(
        json!({"model_path": e.cfg.model, "tokenizer_path": e.cfg.model,
        "is_generation": true, "simulated": true}),
    )
}

async fn models(State(e): S) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": e.cfg.model, "object": "model",
        "owned_by": "rbgctl (simulated engine)"}]}),
    )
}

async fn flush(State(e): S) -> Json<Value> {
    {
        let mut tiers = e.tiers.lock();
        tiers.clear();
        e.publish(&mut tiers);
    }
    Json(json!({"message": "simulated engine: device and host caches flushed"}))
}

async fn load(State(e): S) -> Json<Value> {
    Json(json!({
        "num_reqs": e.m.running.load(Ordering::Relaxed),
        "num_waiting_reqs": e.m.waiting.load(Ordering::Relaxed),
        "num_tokens": e.m.tokens_in_flight.load(Ordering::Relaxed),
    }))
}

async fn metrics(State(e): S) -> Response {
    let m = &e.m;
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    let model = [("model_name", e.cfg.model.as_str())];
    let mut p = PromText::new();
    let cached = c(&m.cached_device) + c(&m.cached_host) + c(&m.cached_storage);
    let prompt = c(&m.prompt_tokens);
    p.family(&PROMPT_TOKENS_TOTAL)
        .sample(&PROMPT_TOKENS_TOTAL, &model, prompt);
    p.family(&GENERATION_TOKENS_TOTAL).sample(
        &GENERATION_TOKENS_TOTAL,
        &model,
        c(&m.generated_tokens),
    );
    p.family(&CACHED_TOKENS_TOTAL)
        .sample(&CACHED_TOKENS_TOTAL, &model, cached);
    p.family(&CACHE_HIT_RATE).sample(
        &CACHE_HIT_RATE,
        &model,
        if prompt > 0.0 { cached / prompt } else { 0.0 },
    );
    p.family(&NUM_RUNNING_REQS).sample(
        &NUM_RUNNING_REQS,
        &model,
        m.running.load(Ordering::Relaxed) as f64,
    );
    p.family(&NUM_QUEUE_REQS).sample(
        &NUM_QUEUE_REQS,
        &model,
        m.waiting.load(Ordering::Relaxed) as f64,
    );
    p.histogram(&TIME_TO_FIRST_TOKEN_SECONDS, &model, &m.ttft);
    p.histogram(&E2E_REQUEST_LATENCY_SECONDS, &model, &m.e2e);
    p.atomic(&REQUESTS_TOTAL, &m.requests);
    p.atomic(&REQUEST_ERRORS_TOTAL, &m.errors);
    p.family(&CACHED_TOKENS_TOTAL_2);
    for (tier, a) in [
        ("device", &m.cached_device),
        ("host", &m.cached_host),
        ("storage", &m.cached_storage),
    ] {
        p.sample(&CACHED_TOKENS_TOTAL_2, &[("tier", tier)], c(a));
    }
    if let Some((publisher, _)) = &e.events {
        publisher.stats.render("rbgctl_sim", &mut p);
    }
    if let Some(l3) = &e.l3 {
        let s = &l3.stats;
        p.family(&L3_PAGES_TOTAL);
        p.sample(&L3_PAGES_TOTAL, &[("op", "read")], c(&s.pages_read));
        p.sample(&L3_PAGES_TOTAL, &[("op", "write")], c(&s.pages_written));
        p.family(&L3_BYTES_TOTAL);
        p.sample(&L3_BYTES_TOTAL, &[("op", "read")], c(&s.bytes_read));
        p.sample(&L3_BYTES_TOTAL, &[("op", "write")], c(&s.bytes_written));
        p.family(&L3_ERRORS_TOTAL);
        p.sample(&L3_ERRORS_TOTAL, &[("op", "read")], c(&s.bad_reads));
        p.sample(&L3_ERRORS_TOTAL, &[("op", "write")], c(&s.write_errors));
        p.atomic(&L3_BACKUPS_SKIPPED_TOTAL, &m.backups_skipped);
        p.single(
            &L3_BACKUPS_IN_FLIGHT,
            BACKUP_QUEUE.saturating_sub(e.backup_queue.available_permits()) as f64,
        );
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        p.finish(),
    )
        .into_response()
}

/// The SIMULATED engine's HTTP routes: SGLang's native endpoints and OpenAI's.
pub fn router(e: Arc<Engine>) -> Router {
    Router::new()
        .route("/generate", post(infer))
        .route("/v1/completions", post(infer))
        .route("/v1/chat/completions", post(infer))
        .route("/health", get(|| async { "ok (simulated engine)" }))
        .route(
            "/health_generate",
            get(|| async { "ok (simulated engine)" }),
        )
        .route("/get_server_info", get(server_info))
        .route("/server_info", get(server_info))
        .route("/get_model_info", get(model_info))
        .route("/model_info", get(model_info))
        .route("/v1/models", get(models))
        .route("/flush_cache", post(flush).get(flush))
        .route("/get_load", get(load))
        .route("/metrics", get(metrics))
        .route("/sim/bootstrap/{room}", get(bootstrap))
        .with_state(e)
}

/// The engine's HTTP app: every endpoint over one engine state.
pub fn app(
    cfg: EngineConfig,
    l3: Option<L3>,
    events: Option<(
        crate::kv_events::Publisher,
        crate::kv_events::KvEventsConfig,
    )>,
    addrs: &super::Addrs,
) -> Router {
    let page = cfg.page_size.max(1);
    let tiers = Tiers::new(cfg.device_cache_tokens / page, cfg.host_cache_tokens / page);
    let e = Arc::new(Engine {
        cost: cfg.cost(),
        tiers: Mutex::new(match events {
            Some(_) => tiers.record(),
            None => tiers,
        }),
        events,
        device: Default::default(),
        l3: l3.map(Arc::new),
        backup_queue: Arc::new(Semaphore::new(BACKUP_QUEUE)),
        backup_writers: Arc::new(Semaphore::new(BACKUP_WRITERS)),
        rooms: Mutex::new(HashMap::new()),
        room_ready: Notify::new(),
        http: reqwest::Client::new(),
        m: Counters::default(),
        next_id: AtomicU64::new(0),
        cfg,
    });
    tracing::info!(
        addr = %addrs.http,
        bootstrap = ?addrs.bootstrap,
        mode = ?e.cfg.mode,
        l1_tokens = e.cfg.device_cache_tokens,
        l2_tokens = e.cfg.host_cache_tokens,
        l3 = e.cfg.l3_master.as_deref().unwrap_or("off"),
        page_bytes = e.page_bytes(),
        "SIMULATED engine serving (no model, no GPU: timing from a cost model)"
    );
    router(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_in_every_shape_and_bad_ones_are_refused() {
        let r = parse(Api::Generate, &json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 7}, "stream": true}), 128, 0).unwrap();
        assert_eq!((r.tokens.len(), r.max_new, r.stream), (3, 7, true));
        let r = parse(Api::Chat, &json!({"messages": [{"role": "user", "content": "t1 t2"}, {"role": "assistant", "content": "t3"}], "max_tokens": 4}), 128, 0).unwrap();
        assert_eq!(r.tokens, vec![1, 2, 3]);
        let r = parse(Api::Completions, &json!({"prompt": "a b c d"}), 9, 0).unwrap();
        assert_eq!((r.tokens.len(), r.max_new), (4, 9));
        let r = parse(Api::Generate, &json!({"text": "x", "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 5}), 1, 0).unwrap();
        assert_eq!(r.bootstrap, Some(("127.0.0.1".into(), 8998, 5)));
        for (api, bad) in [
            (Api::Generate, json!([1])),
            (Api::Generate, json!({})),
            (Api::Generate, json!({"input_ids": [[1, 2]]})),
            (Api::Generate, json!({"input_ids": [99999999]})),
            (Api::Generate, json!({"input_ids": []})),
            (Api::Generate, json!({"input_ids": [1], "stream": "yes"})),
            (
                Api::Generate,
                json!({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}),
            ),
            (
                Api::Generate,
                json!({"input_ids": [1], "bootstrap_room": 3}),
            ),
            (Api::Chat, json!({"messages": "hi"})),
            (Api::Completions, json!({"prompt": 5})),
        ] {
            assert!(parse(api, &bad, 1, 0).is_err(), "{bad}");
        }
    }
}
