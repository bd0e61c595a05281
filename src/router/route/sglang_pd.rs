//! SGLang's prefill/decode contract: the same request, with the prefill's bootstrap host, port
//! and room added, sent to a prefill and a decode worker at once; the decode's answer relayed.

use crate::router::proxy::{buffered, error_response, prefixed, Attempt, Call, Held};
use crate::router::request::{inject_bootstrap, random_room, retryable, Endpoint};
use crate::router::route::RouteMode;
use crate::router::worker::Worker;
use crate::router::Router;
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// SGLang's prefill/decode contract.
pub struct SglangPd;

impl RouteMode for SglangPd {
    fn name(&self) -> &'static str {
        "sglang_pd"
    }

    fn refuses(&self, endpoint: Endpoint) -> Option<String> {
        super::pd_refuses(endpoint)
    }

    async fn attempt(&self, router: &Arc<Router>, call: &mut Call<'_>) -> Attempt {
        let (endpoint, headers, body, info, rid) =
            (call.endpoint, call.headers, call.body, call.info, call.rid);
        let input = &call.input;
        let (p_guard, d_guard) = match router.choose_pair(input, call.tried, rid) {
            Ok(pair) => pair,
            Err(a) => return a,
        };
        let (prefill, decode) = (p_guard.worker().clone(), d_guard.worker().clone());
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
        let build = |w: &Worker| {
            router.upstream_request(
                w,
                Method::POST,
                endpoint.path(),
                headers,
                rid,
                pd_body.clone(),
            )
        };
        let (p_req, d_req) = (build(&prefill), build(&decode));
        router.metrics.pd_dispatches.fetch_add(1, Ordering::Relaxed);
        let (p_res, d_res) = tokio::join!(router.send(p_req), router.send(d_req));
        let fail = |w: &Arc<Worker>, role: &str, e: &str| {
            w.record_outcome(&router.cfg.breaker, false);
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
        prefill.record_outcome(&router.cfg.breaker, outcome(p_status));
        decode.record_outcome(&router.cfg.breaker, outcome(d_status));
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
            slot: call.slot.take(),
        };
        Attempt::Done(router.relay(d_resp, decode, held, None, rid))
    }
}
