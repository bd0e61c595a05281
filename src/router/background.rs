//! The router's background work: health checks of every worker on a timer, trimming of the
//! cache-aware tree, and reading each new worker's served model name (for `/v1/models`).

use crate::backoff::Backoff;
use crate::router::config::Backend;
use crate::router::worker::Worker;
use crate::router::Shared;
use http::Method;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Starts the health checker and the tree eviction timer.
pub fn start(shared: &Arc<Shared>) {
    if let Some(url) = shared.cfg.policy.kv_events_pool_snapshot_url.clone() {
        let s = shared.clone();
        tokio::spawn(async move { pool_snapshot(s, url).await });
    }
    if !shared.cfg.health.disabled {
        let s = shared.clone();
        tokio::spawn(async move { health_loop(s).await });
    }
    let s = shared.clone();
    tokio::spawn(async move {
        let every = s.cfg.cache.eviction_interval.0;
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = std::time::Instant::now();
            s.routing.policy.evict(now);
            s.routing.prefill_policy.evict(now);
            s.routing.decode_policy.evict(now);
            let per_model: Vec<_> = s.routing.model_policies.lock().values().cloned().collect();
            for p in per_model {
                p.evict(now);
            }
        }
    });
}

/// A router that follows the pool's events asks its master for a snapshot of them at start
/// (its stream then carries every page, whatever the replay buffer still holds): a few tries
/// over about 15 s while the master is not up yet.
async fn pool_snapshot(s: Arc<Shared>, url: String) {
    let started = std::time::Instant::now();
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
    for attempt in 0..6u32 {
        if attempt > 0 {
            tokio::time::sleep(backoff.next_delay()).await;
        }
        let req = crate::router::upstream::Outgoing {
            method: Method::POST,
            base: url.as_str().into(),
            path: "/api/v1/kv_events/snapshot".into(),
            headers: Default::default(),
            body: Default::default(),
        };
        let sent = tokio::time::timeout(Duration::from_secs(5), s.workers.upstream.send(req));
        match sent.await.map_err(|_| "no answer within 5 s".to_string()) {
            Ok(Ok(resp)) if resp.status().is_success() => {
                let body = http_body_util::BodyExt::collect(resp.into_body())
                    .await
                    .map(|b| b.to_bytes());
                let pages = body
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| v["pages"].as_u64());
                tracing::info!(?pages, took = ?started.elapsed(), "the pool's KV event snapshot is on its way");
                return;
            }
            Ok(Ok(resp)) => {
                tracing::debug!(status = %resp.status(), %url, "pool snapshot refused; trying again")
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, %url, "pool snapshot not reached; trying again")
            }
            Err(e) => tracing::debug!(error = %e, %url, "pool snapshot not reached; trying again"),
        }
    }
    tracing::warn!(%url, "the pool's master gave no KV event snapshot: its blocks come in as they change");
}

async fn health_loop(s: Arc<Shared>) {
    let (every, timeout) = (s.cfg.health.interval.0, s.cfg.health.timeout.0);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut set = tokio::task::JoinSet::new();
        for w in s.workers.registry.snapshot().iter() {
            let (s, w) = (s.clone(), w.clone());
            set.spawn(async move {
                let ok = matches!(
                    s.call(&w, Method::GET, &s.cfg.health.endpoint, timeout).await,
                    Ok((st, _)) if st.is_success()
                );
                w.record_health(&s.cfg.health, ok);
            });
        }
        while set.join_next().await.is_some() {}
    }
}

/// The model a worker serves, from its server info (`served_model_name`, else `model_path`).
pub fn model_from_server_info(v: &Value) -> Option<String> {
    ["served_model_name", "model_path"]
        .iter()
        .find_map(|k| v.get(k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The ids of an OpenAI `/v1/models` answer.
pub fn model_ids(v: &Value) -> Vec<String> {
    v.get("data")
        .and_then(Value::as_array)
        .map(|models| {
            models
                .iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// With `precise_prefix`: reads a new worker's `/server_info` (three tries over about 7 s) and,
/// when it publishes KV events, follows them into the global index.
pub fn follow_kv_events(s: Arc<Shared>, w: Arc<Worker>) {
    let Some(index) = s.routing.kv_index.clone() else {
        return;
    };
    tokio::spawn(async move {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(8));
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            for path in ["/server_info", "/get_server_info"] {
                let Ok((st, body)) = s.call(&w, Method::GET, path, Duration::from_secs(5)).await
                else {
                    continue;
                };
                let Some(info) = st
                    .is_success()
                    .then(|| serde_json::from_slice::<Value>(&body).ok())
                    .flatten()
                else {
                    continue;
                };
                match index.follow(&w.url, &w.host, &info) {
                    Ok(true) => return,
                    Ok(false) => {
                        tracing::info!(worker = %w.url, "the worker publishes no KV events: precise_prefix falls back for it");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(worker = %w.url, error = %e, "cannot follow the worker's KV events");
                    }
                }
            }
        }
    });
}

/// Reads a new worker's model name in the background (three tries over about 7 s). Nothing is
/// downloaded: the router never resolves tokenizers or model paths.
pub fn discover_metadata(s: Arc<Shared>, w: Arc<Worker>) {
    if w.model_id.read().is_some() && s.cfg.server.backend != Backend::Openai {
        return;
    }
    tokio::spawn(async move {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(8));
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            // vLLM serves no server info; its /v1/models names the model and the engine.
            if let Ok((st, body)) = s
                .call(&w, Method::GET, "/v1/models", Duration::from_secs(5))
                .await
            {
                if st.is_success() {
                    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                        let ids = model_ids(&v);
                        if !ids.is_empty() {
                            tracing::debug!(worker = %w.url, models = ?ids, "worker models");
                            *w.served_models.write() = ids;
                        }
                        if s.cfg.server.backend == Backend::Openai {
                            return;
                        }
                        if v.pointer("/data/0/owned_by").and_then(Value::as_str) == Some("vllm") {
                            tracing::info!(worker = %w.url, "a vLLM engine");
                            *w.engine.write() = Some(Backend::Vllm);
                            if let Some(m) = v.pointer("/data/0/id").and_then(Value::as_str) {
                                *w.model_id.write() = Some(m.to_string());
                                return;
                            }
                        }
                    }
                }
            }
            if s.cfg.server.backend == Backend::Openai {
                continue;
            }
            for path in ["/server_info", "/get_server_info"] {
                if let Ok((st, body)) = s.call(&w, Method::GET, path, Duration::from_secs(5)).await
                {
                    if st.is_success() {
                        let model = serde_json::from_slice::<Value>(&body)
                            .ok()
                            .as_ref()
                            .and_then(model_from_server_info);
                        if let Some(m) = model {
                            tracing::debug!(worker = %w.url, model = %m, "worker model");
                            *w.model_id.write() = Some(m);
                            return;
                        }
                    }
                }
            }
        }
    });
}
