//! vLLM's prefill/decode contract (its disaggregated-serving proxy's): the prefill leg asked
//! for one token with `kv_transfer_params` requesting a remote decode, its answer's
//! `kv_transfer_params` handed to the decode leg; with Mooncake's connector both legs go at
//! once, the decode told the prefill engine's id from its bootstrap server.

use crate::router::proxy::{
    buffered, error_response, prefixed, Attempt, Call, Companion, Held, LegFailure,
};
use crate::router::request::{retryable, BadRequest, Endpoint};
use crate::router::route::RouteMode;
use crate::router::upstream::Outgoing;
use crate::router::vllm;
use crate::router::vllm::{Connector, Legs};
use crate::router::worker::{LoadGuard, Worker};
use crate::router::Router;
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Longest wait for a Mooncake prefill engine's bootstrap server to answer `GET /query`.
const BOOTSTRAP_QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// vLLM's prefill/decode contract.
pub struct VllmPd;

impl RouteMode for VllmPd {
    fn name(&self) -> &'static str {
        "vllm_pd"
    }

    fn refuses(&self, endpoint: Endpoint) -> Option<String> {
        super::pd_refuses(endpoint)
    }

    #[allow(clippy::result_large_err)]
    /// vLLM's prefill/decode contract (`vllm.rs`): NIXL sends decode after the prefill answer
    /// with its `kv_transfer_params`; Mooncake sends both legs with one transfer id, at once
    /// or one after the other. When one leg fails the other is dropped at once (which cancels
    /// its request) and the client gets the failure.
    async fn attempt(&self, router: &Arc<Router>, call: &mut Call<'_>) -> Attempt {
        let (endpoint, headers, body, rid) = (call.endpoint, call.headers, call.body, call.rid);
        let input = &call.input;
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
            router
                .metrics
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
        let (p_guard, d_guard) = match router.choose_pair(input, call.tried, rid) {
            Ok(pair) => pair,
            Err(a) => return a,
        };
        let (prefill, decode) = (p_guard.worker().clone(), d_guard.worker().clone());
        let connector = prefill
            .kv_connector
            .unwrap_or(router.cfg.pd.vllm_kv_connector);
        let transfer_failed = |msg: String| {
            router
                .metrics
                .vllm_kv_transfer_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(request_id = rid, prefill = %prefill.url, connector = connector.name(), "{msg}");
            msg
        };
        // Mooncake: the prefill engine's id, from its bootstrap server (503 until it answers).
        let engine = match connector {
            Connector::Nixl => None,
            Connector::Mooncake => match mooncake_engine(router, &prefill).await {
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
        let mut p_req = router.upstream_request(
            &prefill,
            Method::POST,
            endpoint.path(),
            headers,
            rid,
            p_body,
        );
        if let Some(rank) = engine.as_ref().and_then(|e| e.dp_rank) {
            if let Ok(v) = http::HeaderValue::from_str(&rank.to_string()) {
                p_req.headers.insert("x-data-parallel-rank", v);
            }
        }
        router.metrics.pd_dispatches.fetch_add(1, Ordering::Relaxed);
        let fail = |w: &Arc<Worker>, role: &str, e: &str| {
            w.record_outcome(&router.cfg.breaker, false);
            tracing::warn!(worker = %w.url, role, error = %e, request_id = rid, "vLLM PD leg failed");
        };
        // The prefill leg to its end: its answer's body (NIXL needs it), or what went wrong.
        let mut prefill_leg = Box::pin(prefill_leg(router, prefill.clone(), p_req, p_guard, rid));
        let decode_request = |kv: &Value| {
            vllm::decode_body(body, kv).map_err(bad).map(|b| {
                router.upstream_request(
                    &decode,
                    Method::POST,
                    endpoint.path(),
                    headers,
                    rid,
                    Bytes::from(b),
                )
            })
        };
        let decode_leg = |req: Outgoing| async {
            match router.send(req).await {
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
                        &router.cfg.breaker,
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
        let concurrent = engine.is_some() && router.cfg.pd.vllm_pd_legs == Legs::Concurrent;
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
                        router.metrics.vllm_pd_legs_cancelled.fetch_add(1, Ordering::Relaxed);
                        return f.answer;
                    }
                    Ok(_) => match d_leg.await {
                        Ok(r) => (r, None),
                        Err(a) => return a,
                    },
                },
                d = &mut d_leg => match d {
                    Err(a) => {
                        router.metrics.vllm_pd_legs_cancelled.fetch_add(1, Ordering::Relaxed);
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
            slot: call.slot.take(),
        };
        Attempt::Done(router.relay(d_resp, decode, held, companion, rid))
    }
}

/// A vLLM prefill leg to its end, owning what it needs (it may outlive the attempt that
/// started it, watched by the decode answer's relay): the answer's body, or what the
/// client gets and a one-line reason.
fn prefill_leg(
    router: &Arc<Router>,
    prefill: Arc<Worker>,
    req: Outgoing,
    load: LoadGuard,
    rid: &str,
) -> impl Future<Output = Result<Bytes, LegFailure>> + Send + 'static {
    let this = router.clone();
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
async fn mooncake_engine(
    router: &Router,
    prefill: &Worker,
) -> Result<vllm::MooncakeEngine, String> {
    if let Some(e) = router.workers.mooncake_engines.lock().get(&prefill.url) {
        return Ok(e.clone());
    }
    let port = prefill
        .bootstrap_port
        .unwrap_or(router.cfg.pd.vllm_bootstrap_port);
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
    let req = Outgoing {
        method: Method::GET,
        base: addr.as_str().into(),
        path: "/query".into(),
        headers: http::HeaderMap::new(),
        body: Bytes::new(),
    };
    let resp = match tokio::time::timeout(
        BOOTSTRAP_QUERY_TIMEOUT,
        router.workers.upstream.send(req),
    )
    .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(unready(e.to_string())),
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
    router
        .workers
        .mooncake_engines
        .lock()
        .insert(prefill.url.clone(), engine.clone());
    Ok(engine)
}
