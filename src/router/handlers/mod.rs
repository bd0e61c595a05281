//! The router's HTTP API (sglang-router 0.3.2's routes), its handlers grouped by concern:
//! who may call (`access`), inference, health and metrics, worker management, fan-out admin
//! calls, and the routes answered from the tokenizer and KV index. Start-up and serving are
//! apart (`super::server`).

use crate::router::proxy::error_response;
use crate::router::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};

use http::StatusCode;
use std::sync::Arc;

pub mod access;
pub mod admin;
pub mod health;
pub mod inference;
pub mod tokenize;
pub mod workers;

/// Every handler's state: the router.
pub(in crate::router) type S = State<Arc<Router>>;

use self::access::{cors, require_caller, require_control_key};
use self::admin::{engine_metrics, flush_cache, get_loads};
use self::health::{
    health, health_generate, metrics, model, model_info, models, readiness, server_info,
};
use self::tokenize::{conductor_query, detokenize, tokenize};
use self::workers::{
    add_worker, add_worker_legacy, delete_worker, get_worker, list_worker_urls, list_workers,
    remove_worker_legacy, status_page,
};

/// Counts every request in SMG's `smg_http_*` families, under its route's pattern.
pub(in crate::router) async fn http_metrics(State(s): S, req: Request, next: Next) -> Response {
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
pub(in crate::router) async fn not_found(State(s): S, req: Request) -> Response {
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
/// The router's routes but inference's, which `super::front` answers.
pub fn app(router: Arc<Router>) -> axum::Router {
    // The inference routes are answered in front of this app (`front`).
    let protected = answered_here(&router)
        // Runs a generation on a worker, or tells what the workers are and how loaded.
        .route("/health_generate", get(health_generate))
        .route("/get_server_info", get(server_info))
        .route_layer(middleware::from_fn_with_state(
            router.clone(),
            require_caller,
        ));
    let control = axum::Router::new()
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
            router.clone(),
            require_control_key,
        ));
    axum::Router::new()
        .route("/health", get(health))
        .route("/liveness", get(health))
        .route("/readiness", get(readiness))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/get_model_info", get(model_info))
        .route("/metrics", get(metrics))
        .merge(protected)
        .merge(control)
        .route_layer(middleware::from_fn_with_state(router.clone(), http_metrics))
        .fallback(not_found)
        .layer(cors(&router.cfg.server.cors_allowed_origins))
        .with_state(router)
}
/// The routes the router answers itself from a body (tokenizing, Conductor's queries), with a
/// body limit of their own: far below the inference routes', whose bodies are forwarded.
pub(in crate::router) fn answered_here(router: &Router) -> axum::Router<Arc<Router>> {
    axum::Router::new()
        .route("/v1/tokenize", post(tokenize))
        .route("/tokenize", post(tokenize))
        .route("/v1/detokenize", post(detokenize))
        .route("/detokenize", post(detokenize))
        .route("/query", post(conductor_query))
        .route("/query_by_hash", post(conductor_query))
        .layer(axum::extract::DefaultBodyLimit::max(
            router.cfg.limits.max_query_payload_size,
        ))
}
