//! The router's front door: inference requests go straight to their handler, everything else
//! to the axum app.
//!
//! Inference is nearly all of a router's traffic, and through axum each request went through
//! the body guard, the CORS layer, the path router, two route layers (HTTP metrics, API key)
//! and the handler's extractors, each boxing or cloning on the way: more CPU than routing
//! itself. Here a `POST` to one of the inference paths, without an `Origin` header, gets the
//! same treatment in one place, in the same order: the body guard (`admit_body`), then the HTTP
//! metrics under its route around the API key check and the handler, and the CORS headers that
//! answer a request with no `Origin`. A request with `Origin` (a browser's, which may need the
//! full CORS answer) and every other route go to the axum app, which serves the inference
//! paths too: one behaviour, two ways in.

use crate::http_server::{admit_body, HttpLimits};
use crate::router::handlers::access::key_refusal;
use crate::router::handlers::inference::inference;
use crate::router::request::Endpoint;
use crate::router::Shared;
use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderName, HeaderValue, Method, Request};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// What the router's port serves: the fast path for inference, the axum app (already guarded) for the rest.
#[derive(Clone)]
pub struct Front {
    shared: Arc<Shared>,
    limits: Arc<HttpLimits>,
    /// The CORS headers of an answer to a request without `Origin`.
    cors: Arc<[(HeaderName, HeaderValue)]>,
    rest: axum::Router,
}

impl Front {
    pub fn new(shared: Arc<Shared>, rest: axum::Router, limits: &HttpLimits) -> Front {
        let cors = cors_without_origin(&shared.cfg.server.cors_allowed_origins).into();
        Front {
            shared,
            limits: Arc::new(limits.clone()),
            cors,
            rest,
        }
    }

    /// The inference endpoint `req` is for, when it may take the fast path.
    fn fast_endpoint<B>(req: &Request<B>) -> Option<Endpoint> {
        if req.method() != Method::POST || req.headers().contains_key(header::ORIGIN) {
            return None;
        }
        Endpoint::of_path(req.uri().path())
    }
}

/// The CORS headers the router's CORS layer (`handlers::access::cors`) gives an answer to a request
/// without `Origin`: the `Vary` that tells caches the answer depends on it, and with no origin
/// list, `Access-Control-Allow-Origin: *`.
fn cors_without_origin(origins: &[String]) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = vec![(
        header::VARY,
        HeaderValue::from_static(
            "origin, access-control-request-method, access-control-request-headers",
        ),
    )];
    if origins.iter().all(|o| o.parse::<HeaderValue>().is_err()) {
        out.push((
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        ));
    }
    out
}

/// One inference request, as the axum app would serve it.
async fn serve_inference(
    shared: Arc<Shared>,
    limits: Arc<HttpLimits>,
    cors: Arc<[(HeaderName, HeaderValue)]>,
    endpoint: Endpoint,
    req: Request<Body>,
) -> Response {
    // The body guard is outermost: its refusals are neither counted nor given CORS headers.
    let (req, ticket) = match admit_body(req, &limits) {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    // With tenants, `inference` names the caller itself (one key lookup, not two).
    let refused = match shared.access.tenants {
        Some(_) => None,
        None => key_refusal(&shared, &parts.headers),
    };
    let mut resp = match refused {
        Some(refusal) => refusal,
        None => inference(shared.clone(), endpoint, parts.headers, body).await,
    };
    drop(ticket);
    let code = resp
        .extensions()
        .get::<crate::router::metrics::ErrorCode>()
        .map_or("", |c| c.0.as_str());
    shared.metrics.http.observe(
        &Method::POST,
        endpoint.path(),
        resp.status().as_u16(),
        code,
        started.elapsed(),
    );
    let headers = resp.headers_mut();
    for (name, value) in cors.iter() {
        if name == header::VARY {
            headers.append(name, value.clone());
        } else {
            headers.insert(name, value.clone());
        }
    }
    resp
}

impl tower_service::Service<Request<Body>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        match Front::fast_endpoint(&req) {
            Some(endpoint) => {
                let (shared, limits) = (self.shared.clone(), self.limits.clone());
                let cors = self.cors.clone();
                Box::pin(
                    async move { Ok(serve_inference(shared, limits, cors, endpoint, req).await) },
                )
            }
            None => {
                let rest = self.rest.clone();
                Box::pin(tower_service::Service::call(&mut { rest }, req))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The headers the router's own CORS layer adds to an answer to a request without `Origin`.
    fn from_cors_layer(origins: &[String]) -> http::HeaderMap {
        use tower_service::Service as _;
        let layer = crate::router::handlers::access::cors(origins);
        let app = axum::Router::new()
            .route("/generate", axum::routing::post(|| async { "ok" }))
            .layer(layer);
        let req = Request::post("/generate").body(Body::empty()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let resp = rt.block_on(async { app.clone().call(req).await.unwrap() });
        resp.headers().clone()
    }

    #[test]
    fn the_fast_path_answers_with_the_cors_headers_of_the_cors_layer() {
        for origins in [vec![], vec!["https://a.example".to_string()]] {
            let want = from_cors_layer(&origins);
            let mut got = http::HeaderMap::new();
            for (n, v) in cors_without_origin(&origins) {
                got.append(n, v);
            }
            got.insert(header::CONTENT_TYPE, want[header::CONTENT_TYPE].clone());
            got.insert(header::CONTENT_LENGTH, want[header::CONTENT_LENGTH].clone());
            assert_eq!(got, want, "origins {origins:?}");
        }
    }

    #[test]
    fn only_inference_posts_without_origin_take_the_fast_path() {
        let req = |method: Method, path: &str, origin: bool| {
            let mut b = Request::builder().method(method).uri(path);
            if origin {
                b = b.header(header::ORIGIN, "https://a.example");
            }
            b.body(()).unwrap()
        };
        for e in Endpoint::ALL {
            assert_eq!(
                Front::fast_endpoint(&req(Method::POST, e.path(), false)),
                Some(e)
            );
            assert_eq!(
                Front::fast_endpoint(&req(Method::POST, e.path(), true)),
                None
            );
            assert_eq!(
                Front::fast_endpoint(&req(Method::GET, e.path(), false)),
                None
            );
        }
        for path in [
            "/generate/",
            "/v1/tokenize",
            "/workers",
            "/v1/chat/completions/x",
        ] {
            assert_eq!(Front::fast_endpoint(&req(Method::POST, path, false)), None);
        }
        assert_eq!(
            Front::fast_endpoint(&req(Method::POST, "/generate?x=1", false)),
            Some(Endpoint::Generate),
            "the query is not part of the path"
        );
    }
}
