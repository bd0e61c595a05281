//! What the router says of itself and its workers: liveness, readiness, models, server info,
//! `/health_generate` and `/metrics`.

use super::access::rid_for;
use super::S;
use crate::router::proxy::error_response;
use crate::router::worker::WorkerType;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, StatusCode};
use serde_json::{json, Value};

pub(in crate::router) async fn health() -> &'static str {
    "OK"
}
pub(in crate::router) async fn readiness(State(s): S) -> Response {
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
pub(in crate::router) async fn model(State(s): S, Path(id): Path<String>) -> Response {
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
pub(in crate::router) async fn models(State(s): S) -> Json<Value> {
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
pub(in crate::router) async fn server_info(State(s): S, headers: HeaderMap) -> Response {
    let rid = rid_for(&s, &headers, None);
    s.proxy_get("/get_server_info", &rid).await
}
pub(in crate::router) async fn model_info(State(s): S, headers: HeaderMap) -> Response {
    let rid = rid_for(&s, &headers, None);
    s.proxy_get("/get_model_info", &rid).await
}
pub(in crate::router) async fn health_generate(State(s): S, headers: HeaderMap) -> Response {
    let rid = rid_for(&s, &headers, None);
    s.proxy_get("/health_generate", &rid).await
}
pub(in crate::router) async fn metrics(State(s): S) -> Response {
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
