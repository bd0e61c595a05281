//! Worker management (sglang-router's `/workers` API and its legacy routes) and the status
//! page.

use super::S;
use crate::router::config::Backend;
use crate::router::proxy::error_response;
use crate::router::vllm::Connector;
use crate::router::worker::{Source, Worker, WorkerSpec, WorkerType};
use crate::router::{background, config, Router};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

pub(in crate::router) fn worker_json(s: &Router, w: &Worker) -> Value {
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
pub(in crate::router) struct AddWorker {
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
pub(in crate::router) fn bad(msg: &str) -> Response {
    error_response(StatusCode::BAD_REQUEST, "invalid_request_error", msg, "")
}
pub(in crate::router) fn spec_from(s: &Router, a: AddWorker) -> Result<WorkerSpec, String> {
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
pub(in crate::router) fn added(s: &Arc<Router>, w: &Arc<Worker>) {
    background::learn_about(s.clone(), w.clone());
}
/// Adds a worker through the API (with `--dp-aware`, one per rank: the first is returned).
pub(in crate::router) async fn register(
    s: &Arc<Router>,
    spec: WorkerSpec,
) -> Result<Arc<Worker>, Response> {
    let ranks = crate::router::dp::rank_specs(s, &spec).await.map_err(|e| {
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
pub(in crate::router) fn conflict(e: crate::router::worker::RegistryError) -> Response {
    error_response(StatusCode::CONFLICT, "conflict", &e.to_string(), "")
}
pub(in crate::router) async fn add_worker(State(s): S, body: axum::body::Bytes) -> Response {
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
pub(in crate::router) async fn list_workers(State(s): S) -> Json<Value> {
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
pub(in crate::router) struct PageQuery {
    part: Option<String>,
}
/// The status page (`super::ui`): the same workers as `GET /workers`, drawn.
pub(in crate::router) async fn status_page(State(s): S, Query(q): Query<PageQuery>) -> Response {
    let now = std::time::Instant::now();
    let workers = s
        .workers
        .registry
        .snapshot()
        .iter()
        .map(|w| crate::router::ui::WorkerRow {
            url: w.url.to_string(),
            worker_type: w.worker_type.name(),
            healthy: w.healthy(),
            circuit: w.circuit(&s.cfg.breaker, now).name(),
            load: w.load(),
            processed: w.processed(),
            model: w.model_id.read().clone(),
        })
        .collect();
    let view = crate::router::ui::View {
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
        crate::router::ui::render(&view, part),
    )
        .into_response()
}
pub(in crate::router) async fn get_worker(State(s): S, Path(id): Path<String>) -> Response {
    match s.workers.registry.get(&id) {
        Some(w) => Json(worker_json(&s, &w)).into_response(),
        None => unknown_worker(&id),
    }
}
pub(in crate::router) fn unknown_worker(id: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("no worker {id:?} (see GET /workers)"),
        "",
    )
}
pub(in crate::router) async fn delete_worker(State(s): S, Path(id): Path<String>) -> Response {
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
pub(in crate::router) struct UrlQuery {
    url: Option<String>,
}
pub(in crate::router) async fn add_worker_legacy(
    State(s): S,
    Query(q): Query<UrlQuery>,
) -> Response {
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
pub(in crate::router) async fn remove_worker_legacy(
    State(s): S,
    Query(q): Query<UrlQuery>,
) -> Response {
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
pub(in crate::router) async fn list_worker_urls(State(s): S) -> Json<Value> {
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
