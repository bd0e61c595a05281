//! The router's background work: health checks of every worker on a timer, trimming of the
//! cache-aware tree, and reading each new worker's served model name (for `/v1/models`).

use crate::backoff::Backoff;
use crate::router::config::Backend;
use crate::router::kv_index::EventsOf;
use crate::router::worker::Worker;
use crate::router::Router;
use http::Method;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Starts the health checker and the tree eviction timer.
pub fn start(router: &Arc<Router>) {
    if let Some(url) = router.cfg.policy.kv_events_pool_snapshot_url.clone() {
        let s = router.clone();
        tokio::spawn(async move { pool_snapshot(s, url).await });
    }
    if !router.cfg.health.disabled {
        let s = router.clone();
        tokio::spawn(async move { health_loop(s).await });
    }
    let s = router.clone();
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
async fn pool_snapshot(s: Arc<Router>, url: String) {
    let started = std::time::Instant::now();
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
    for attempt in 0..6u32 {
        if attempt > 0 {
            tokio::time::sleep(backoff.next_delay()).await;
        }
        let mut headers = http::HeaderMap::new();
        if let Some(file) = &s.cfg.policy.kv_events_pool_auth_token_file {
            match crate::auth::Secret::from_file(file)
                .map(|secret| http::HeaderValue::from_str(&secret.bearer()))
            {
                Ok(Ok(v)) => {
                    headers.insert(http::header::AUTHORIZATION, v);
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "the pool's secret is not a header value"),
                Err(e) => tracing::warn!(error = %e, "cannot read the pool's secret"),
            }
        }
        let req = crate::router::upstream::Outgoing {
            method: Method::POST,
            base: url.as_str().into(),
            path: "/api/v1/kv_events/snapshot".into(),
            headers,
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

async fn health_loop(s: Arc<Router>) {
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

/// What the router learns of a new worker in the background: the models it serves and its
/// engine (`/v1/models`, else `/server_info`; three tries over about 7 s), and with
/// `precise_prefix` where its KV events are published (the same `/server_info`, read once for
/// both), for as long as the worker is registered (`follow_events_of`). Nothing is
/// downloaded: the router never resolves tokenizers or model paths.
pub fn learn_about(s: Arc<Router>, w: Arc<Worker>) {
    let openai = s.cfg.server.backend == Backend::Openai;
    let mut want_model = w.model_id.read().is_none() || openai;
    let want_events = s.routing.kv_index.is_some() && !openai;
    if !want_model && !want_events {
        return;
    }
    // Until the first look at its events ends, the router's readiness may wait for them.
    let settle = s.routing.kv_index.clone().map(|index| {
        index.expect(&w.url);
        Settle(index, w.url.clone())
    });
    tokio::spawn(async move {
        let mut settle = settle;
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(8));
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            if want_model {
                want_model = !read_models(&s, &w).await;
            }
            if openai || !want_model {
                break;
            }
            if let Some(info) = server_info(&s, &w).await {
                if let Some(m) = model_from_server_info(&info) {
                    tracing::debug!(worker = %w.url, model = %m, "worker model");
                    *w.model_id.write() = Some(m);
                    want_model = false;
                }
                if want_events {
                    // Read once for both: the events are followed at once.
                    follow_kv_events(&s, &w, &info).await;
                    settle = None;
                }
            }
            if !want_model {
                break;
            }
        }
        if want_events {
            follow_events_of(s, w, settle).await;
        }
    });
}

/// Longest wait between two looks at a worker whose KV events are not followed.
const EVENTS_RETRY_MAX: Duration = Duration::from_secs(30);
/// How often a followed worker's subscriptions are checked for a source gone quiet after a
/// disconnection (an engine started again on other ports).
const EVENTS_CHECK: Duration = Duration::from_secs(5);

/// With `precise_prefix`, for as long as `w` is registered: follows its KV events as its
/// `/server_info` describes them, trying again with a growing wait (to
/// [`EVENTS_RETRY_MAX`]) while it does not answer (an engine loading its model for minutes);
/// and when a followed worker's connection dropped and nothing came since, reads its
/// descriptor again and follows where it now publishes (an engine started again elsewhere:
/// the router follows the engine, not its old ports).
async fn follow_events_of(s: Arc<Router>, w: Arc<Worker>, mut settle: Option<Settle>) {
    let Some(index) = s.routing.kv_index.clone() else {
        return;
    };
    let mut backoff = Backoff::new(Duration::from_secs(1), EVENTS_RETRY_MAX);
    loop {
        let registered = s
            .workers
            .registry
            .snapshot()
            .iter()
            .any(|x| Arc::ptr_eq(x, &w));
        if !registered {
            return;
        }
        let wait = match index.state_of(&w.url) {
            EventsOf::Followed => EVENTS_CHECK,
            EventsOf::NonePublished => return,
            EventsOf::Quiet => {
                tracing::info!(worker = %w.url, "the worker's KV events went quiet after a disconnection: reading where it publishes now");
                if let Some(info) = server_info(&s, &w).await {
                    follow_kv_events(&s, &w, &info).await;
                }
                EVENTS_CHECK
            }
            EventsOf::NotFollowed => {
                let settled = match server_info(&s, &w).await {
                    Some(info) => follow_kv_events(&s, &w, &info).await,
                    None => false,
                };
                if settled {
                    backoff.reset();
                    EVENTS_CHECK
                } else {
                    index.not_followed(&w.url);
                    backoff.next_delay()
                }
            }
        };
        // The first look is over: readiness no longer waits for this worker.
        drop(settle.take());
        tokio::time::sleep(wait).await;
    }
}

/// Marks a worker's events settled in the index when dropped (however `learn_about` ends).
struct Settle(
    Arc<crate::router::kv_index::KvIndex>,
    crate::router::policy::tree::Tenant,
);

impl Drop for Settle {
    fn drop(&mut self) {
        self.0.settled(&self.1);
    }
}

/// Reads the worker's `/v1/models`: the models it serves, and with vLLM (which serves no
/// server info) its engine and model. Whether the model is known now.
async fn read_models(s: &Router, w: &Worker) -> bool {
    let Ok((st, body)) = s
        .call(w, Method::GET, "/v1/models", Duration::from_secs(5))
        .await
    else {
        return false;
    };
    let Some(v) = st
        .is_success()
        .then(|| serde_json::from_slice::<Value>(&body).ok())
        .flatten()
    else {
        return false;
    };
    let ids = model_ids(&v);
    if !ids.is_empty() {
        tracing::debug!(worker = %w.url, models = ?ids, "worker models");
        *w.served_models.write() = ids;
    }
    if s.cfg.server.backend == Backend::Openai {
        return true;
    }
    if v.pointer("/data/0/owned_by").and_then(Value::as_str) == Some("vllm") {
        tracing::info!(worker = %w.url, "a vLLM engine");
        *w.engine.write() = Some(Backend::Vllm);
        if let Some(m) = v.pointer("/data/0/id").and_then(Value::as_str) {
            *w.model_id.write() = Some(m.to_string());
            return true;
        }
    }
    false
}

/// The worker's `/server_info` (or SGLang's older `/get_server_info`), when it answers one.
async fn server_info(s: &Router, w: &Worker) -> Option<Value> {
    for path in ["/server_info", "/get_server_info"] {
        let Ok((st, body)) = s.call(w, Method::GET, path, Duration::from_secs(5)).await else {
            continue;
        };
        if let Some(info) = st
            .is_success()
            .then(|| serde_json::from_slice::<Value>(&body).ok())
            .flatten()
        {
            return Some(info);
        }
    }
    None
}

/// With `precise_prefix`: follows the worker's KV events as its server info describes them
/// (or, when it publishes elsewhere than it did, where it publishes now), on a blocking thread
/// (opening a subscription's sockets waits on libzmq). Whether that is settled (followed, or
/// none published).
async fn follow_kv_events(s: &Router, w: &Worker, info: &Value) -> bool {
    let Some(index) = s.routing.kv_index.clone() else {
        return true;
    };
    let (url, host, info, rank) = (w.url.clone(), w.host.clone(), info.clone(), w.dp_rank);
    let followed =
        tokio::task::spawn_blocking(move || index.follow(&url, &host, &info, rank)).await;
    match followed {
        Ok(Ok(true)) => true,
        Ok(Ok(false)) => {
            tracing::info!(worker = %w.url, "the worker publishes no KV events: precise_prefix falls back for it");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(worker = %w.url, error = %e, "cannot follow the worker's KV events");
            false
        }
        Err(e) => {
            tracing::warn!(worker = %w.url, error = %e, "following the worker's KV events failed");
            false
        }
    }
}
