//! A request to one regular worker, chosen by the policy.

use crate::router::proxy::{buffered, error_response, no_workers, Attempt, Call, Held};
use crate::router::request::retryable;
use crate::router::route::RouteMode;
use crate::router::worker::WorkerType;
use crate::router::Router;
use http::{Method, StatusCode};
use std::sync::Arc;

/// To one regular worker.
pub struct Regular;

impl RouteMode for Regular {
    fn name(&self) -> &'static str {
        "regular"
    }

    async fn attempt(&self, router: &Arc<Router>, call: &mut Call<'_>) -> Attempt {
        let (endpoint, headers, body, rid) = (call.endpoint, call.headers, call.body, call.rid);
        let input = &call.input;
        let Some(guard) = router.choose(
            &*router.routing.policy,
            WorkerType::Regular,
            input,
            call.tried,
        ) else {
            return Attempt::Done(no_workers("", rid));
        };
        let worker = guard.worker().clone();
        let req = router.upstream_request(
            &worker,
            Method::POST,
            endpoint.path(),
            headers,
            rid,
            body.clone(),
        );
        match router.send(req).await {
            Err(e) => {
                worker.record_outcome(&router.cfg.breaker, false);
                tracing::warn!(worker = %worker.url, error = %e, request_id = rid, "worker request failed");
                Attempt::Retry {
                    tried: vec![worker.url.clone()],
                    fallback: error_response(
                        StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        &format!("worker {}: {e}", worker.url),
                        rid,
                    ),
                }
            }
            Ok(resp) => {
                let status = resp.status();
                let ok = !retryable(status.as_u16()) && !status.is_server_error();
                worker.record_outcome(&router.cfg.breaker, ok);
                if retryable(status.as_u16()) {
                    tracing::warn!(worker = %worker.url, %status, request_id = rid, "worker answered with a retryable status");
                    return Attempt::Retry {
                        tried: vec![worker.url.clone()],
                        fallback: buffered(resp, rid).await,
                    };
                }
                let held = Held {
                    _load: vec![guard],
                    slot: call.slot.take(),
                };
                Attempt::Done(router.relay(resp, worker, held, None, rid))
            }
        }
    }
}
