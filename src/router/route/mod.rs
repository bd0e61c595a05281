//! How an inference request reaches workers, chosen once at start: to one regular worker
//! (`regular`), or split over a prefill and a decode worker under SGLang's contract
//! (`sglang_pd`: bootstrap fields, both legs at once) or vLLM's (`vllm_pd`: the prefill's
//! `kv_transfer_params` handed to the decode). A prefill/decode router not told its backend
//! follows its prefill workers: vLLM's contract once one of them is a vLLM engine.
//!
//! Each mode makes one attempt (`RouteMode::attempt`); `Router::dispatch` runs the
//! attempts (retries, backoff, metrics) the same for all.

mod regular;
mod sglang_pd;
mod vllm_pd;

use crate::router::config::Backend;
use crate::router::proxy::{Attempt, Call};
use crate::router::request::Endpoint;
use crate::router::worker::WorkerType;
use crate::router::Router;
use std::sync::Arc;

pub use regular::Regular;
pub use sglang_pd::SglangPd;
pub use vllm_pd::VllmPd;

/// One way of sending a request to workers.
pub(crate) trait RouteMode {
    /// Its name, for logs.
    fn name(&self) -> &'static str;

    /// Why this mode does not serve `endpoint`, if it does not.
    fn refuses(&self, _endpoint: Endpoint) -> Option<String> {
        None
    }

    /// One attempt: a worker (or a pair) chosen leaving out `call.tried` where others remain, the
    /// request sent, and the answer to relay or the reason to try again.
    fn attempt(
        &self,
        router: &Arc<Router>,
        call: &mut Call<'_>,
    ) -> impl std::future::Future<Output = Attempt> + Send;
}

/// A prefill/decode router serves only the endpoints that generate.
fn pd_refuses(endpoint: Endpoint) -> Option<String> {
    (!endpoint.generates()).then(|| {
        format!(
            "{} is not served by a prefill/decode router: send it to a regular router",
            endpoint.path()
        )
    })
}

/// The router's mode.
pub enum Route {
    Regular(Regular),
    VllmPd(VllmPd),
    /// Prefill/decode whose contract follows the prefill workers: vLLM's once one of them is a
    /// vLLM engine (its `/v1/models` says so, or it was registered with a KV connector).
    PdByEngine(SglangPd, VllmPd),
}

impl Route {
    /// The mode `--pd-disaggregation` and `--backend` ask for.
    pub fn for_config(pd: bool, backend: Backend) -> Route {
        match (pd, backend) {
            (false, _) => Route::Regular(Regular),
            (true, Backend::Vllm) => Route::VllmPd(VllmPd),
            (true, _) => Route::PdByEngine(SglangPd, VllmPd),
        }
    }

    /// The mode's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Route::Regular(m) => m.name(),
            Route::VllmPd(m) => m.name(),
            Route::PdByEngine(..) => "pd_by_engine",
        }
    }

    /// Why this mode does not serve `endpoint`, if it does not.
    pub fn refuses(&self, endpoint: Endpoint) -> Option<String> {
        match self {
            Route::Regular(m) => m.refuses(endpoint),
            Route::PdByEngine(m, _) => m.refuses(endpoint),
            Route::VllmPd(m) => m.refuses(endpoint),
        }
    }

    /// One attempt in this mode (`RouteMode::attempt`).
    pub(crate) async fn attempt(&self, router: &Arc<Router>, call: &mut Call<'_>) -> Attempt {
        // The prefill/decode modes' futures (two legs each) are boxed: inline, their size
        // would be every request's future's, copied and allocated with it in every mode.
        match self {
            Route::Regular(m) => m.attempt(router, call).await,
            Route::VllmPd(m) => Box::pin(m.attempt(router, call)).await,
            Route::PdByEngine(sglang, vllm) => {
                if prefill_is_vllm(router) {
                    Box::pin(vllm.attempt(router, call)).await
                } else {
                    Box::pin(sglang.attempt(router, call)).await
                }
            }
        }
    }
}

/// Whether a prefill worker is a vLLM engine.
fn prefill_is_vllm(router: &Router) -> bool {
    router.workers.registry.snapshot().iter().any(|w| {
        w.worker_type == WorkerType::Prefill
            && (w.kv_connector.is_some() || *w.engine.read() == Some(Backend::Vllm))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_chosen_from_the_settings() {
        assert_eq!(Route::for_config(false, Backend::Vllm).name(), "regular");
        assert_eq!(Route::for_config(true, Backend::Vllm).name(), "vllm_pd");
        assert_eq!(
            Route::for_config(true, Backend::Sglang).name(),
            "pd_by_engine"
        );
        let pd = Route::for_config(true, Backend::Sglang);
        assert!(pd.refuses(Endpoint::Generate).is_none());
        assert!(pd
            .refuses(Endpoint::Embeddings)
            .is_some_and(|why| why.contains("/v1/embeddings")));
        assert!(Route::for_config(false, Backend::Sglang)
            .refuses(Endpoint::Embeddings)
            .is_none());
    }
}
