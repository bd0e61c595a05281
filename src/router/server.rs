//! Start-up and serving of the router's API (its routes and handlers: `super::handlers`):
//! the wait for the workers given at start, the work beside the API, and the listeners.
//! Accepted sockets get TCP_NODELAY, so a streamed chunk leaves at once instead of waiting
//! for the client's delayed ACK (the peer's 43 ms stall).

use crate::router::handlers::app;
use crate::router::handlers::health::{health, metrics};
use crate::router::handlers::workers::added;
use crate::router::worker::{Source, Worker};
use crate::router::{background, discovery, kube, Router, RouterError};
use crate::shutdown::Shutdown;
use axum::routing::get;

use http::Method;
use std::sync::Arc;
use std::time::Duration;

/// Waits until every worker given at start answers its health check, checking every
/// `worker_startup_check_interval`; an error naming those that did not answer within
/// `worker_startup_timeout_secs` (as sglang-router's startup check, except that the router
/// serves meanwhile, its readiness saying whether any worker is there).
pub async fn await_startup(s: Arc<Router>) -> Result<(), RouterError> {
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
            match crate::router::dp::rank_specs(&s, &spec).await {
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
pub async fn start_background(router: &Arc<Router>) -> Result<(), RouterError> {
    background::start(router);
    if let Some(t) = &router.access.tenants {
        t.watch();
    }
    for w in router.workers.registry.snapshot().iter() {
        added(router, w);
    }
    if router.cfg.discovery.rbg_config.is_some() {
        discovery::start(router.clone());
    }
    if router.cfg.discovery.kubernetes {
        kube::start(router.clone())?;
    }
    Ok(())
}
/// The API's limits: bodies, connections (shared by every thread's listener), grace.
fn http_limits(router: &Router) -> crate::http_server::HttpLimits {
    let grace = router
        .cfg
        .server
        .shutdown_grace_period
        .0
        .min(Duration::from_secs(86_400));
    crate::http_server::HttpLimits {
        max_body_bytes: router.cfg.limits.max_payload_size,
        max_connections: crate::router::MAX_CONNECTIONS,
        max_connections_per_peer: crate::router::MAX_CONNECTIONS_PER_PEER,
        body_budget: Some(router.limits.body_budget.clone()),
        grace,
        ..Default::default()
    }
}
/// Serves the API (and the separate metrics listener) until `shutdown` fires; requests in
/// flight then get up to `shutdown_grace_period_secs` to finish.
pub async fn serve(
    router: Arc<Router>,
    listener: tokio::net::TcpListener,
    metrics_listener: Option<tokio::net::TcpListener>,
    lanes: crate::http_server::lanes::Handoff,
    shutdown: Shutdown,
) {
    if let Some(ml) = metrics_listener {
        let mapp = axum::Router::new()
            .route("/metrics", get(metrics))
            .route("/health", get(health))
            .with_state(router.clone());
        tokio::spawn(crate::http_server::serve(ml, mapp, shutdown.clone()));
    }
    tracing::info!(
        local = ?listener.local_addr().ok(),
        policy = router.routing.policy.name(),
        pd = router.pd(),
        workers = router.workers.registry.snapshot().len(),
        runtime = ?router.cfg.server.runtime,
        threads = lanes.lanes(),
        "router listening"
    );
    let announce = shutdown.clone();
    let grace = http_limits(&router).grace;
    tokio::spawn(async move {
        announce.wait().await;
        tracing::info!(?grace, "shutting down: finishing requests in flight");
    });
    let (front, limits) = front(&router);
    let tls = router.access.server_tls.clone();
    let open = Some(router.metrics.http.connections.clone());
    let lanes = Some(lanes);
    crate::http_server::serve_service(listener, front, shutdown, limits, tls, open, lanes).await
}
/// Serves the connections handed to one more lane of a thread-per-core router, counted against
/// the router's one limit.
pub async fn serve_lane(
    router: Arc<Router>,
    lane: crate::http_server::lanes::Lane,
    shutdown: Shutdown,
) {
    let (front, limits) = front(&router);
    let tls = router.access.server_tls.clone();
    let open = Some(router.metrics.http.connections.clone());
    crate::http_server::serve_lane(lane, front, shutdown, limits, tls, open).await
}
/// The API's service on one thread: the inference routes' fast path in front of the rest.
fn front(router: &Arc<Router>) -> (crate::router::front::Front, crate::http_server::HttpLimits) {
    let limits = http_limits(router);
    let rest = crate::http_server::guarded(app(router.clone()), &limits);
    (
        crate::router::front::Front::new(router.clone(), rest, &limits),
        limits,
    )
}
