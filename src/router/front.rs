//! The router's front door, and the one way in for inference: a request to an inference path
//! (`/generate`, `/v1/chat/completions`, ...) is answered here, everything else by the axum app.
//!
//! Inference is nearly all of a router's traffic, and through axum each request went through
//! the path router, two route layers and the handler's extractors, each boxing or cloning on
//! the way: more CPU than routing itself. Here an inference request gets, in this order: the
//! body guard (`admit_body`: its refusals are neither counted nor given CORS headers), then the
//! HTTP metrics under its route around the API key check and the one inference handler
//! (`answer`). CORS: a request with `Origin` (a browser's, which may need the full CORS answer,
//! preflights included) goes through the router's one CORS layer (`handlers::access::cors`);
//! one without gets the headers that layer gives such a request, worked out once at start.

use crate::http_server::{admit_body, HttpLimits};
use crate::router::handlers::access::{key_refusal, rid_for};
use crate::router::handlers::inference::inference;
use crate::router::proxy::error_response;
use crate::router::request::Endpoint;
use crate::router::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::{header, HeaderName, HeaderValue, Method, Request, StatusCode};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// What the router's port serves: inference here, the axum app (already guarded) for the rest.
#[derive(Clone)]
pub struct Front {
    router: Arc<Router>,
    limits: Arc<HttpLimits>,
    /// The CORS headers of an answer to a request without `Origin`.
    cors: Arc<[(HeaderName, HeaderValue)]>,
    /// Inference requests with `Origin`: `answer` behind the router's CORS layer.
    with_origin: axum::Router,
    rest: axum::Router,
}

impl Front {
    /// The front door of `router`, handing what is not inference to `rest`, its bodies bounded
    /// by `limits`.
    pub fn new(router: Arc<Router>, rest: axum::Router, limits: &HttpLimits) -> Front {
        let origins = &router.cfg.server.cors_allowed_origins;
        let cors = cors_without_origin(origins).into();
        let with_origin = axum::Router::new()
            .fallback(answer_with_origin)
            .layer(crate::router::handlers::access::cors(origins))
            .with_state(router.clone());
        Front {
            router,
            limits: Arc::new(limits.clone()),
            cors,
            with_origin,
            rest,
        }
    }

    /// One request to an inference path.
    async fn inference(mut self, endpoint: Endpoint, req: Request<Body>) -> Response {
        let (req, ticket) = match admit_body(req, &self.limits) {
            Ok(admitted) => admitted,
            Err(refusal) => return refusal,
        };
        let resp = match req.headers().contains_key(header::ORIGIN) {
            true => match tower_service::Service::call(&mut self.with_origin, req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            },
            false => {
                let mut resp = answer(self.router, endpoint, req).await;
                let headers = resp.headers_mut();
                for (name, value) in self.cors.iter() {
                    if name == header::VARY {
                        headers.append(name, value.clone());
                    } else {
                        headers.insert(name, value.clone());
                    }
                }
                resp
            }
        };
        drop(ticket);
        resp
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

/// An inference request that came with `Origin`, inside the CORS layer.
async fn answer_with_origin(State(router): State<Arc<Router>>, req: Request<Body>) -> Response {
    match Endpoint::of_path(req.uri().path()) {
        Some(endpoint) => answer(router, endpoint, req).await,
        None => crate::router::handlers::not_found(State(router), req).await,
    }
}

/// One inference request past the body guard: `POST` only, the caller's key, the inference
/// handler, counted under its route.
async fn answer(router: Arc<Router>, endpoint: Endpoint, req: Request<Body>) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let resp = if parts.method != Method::POST {
        let rid = rid_for(&router, &parts.headers, Some(endpoint));
        let msg = format!("{} takes POST, not {}", endpoint.path(), parts.method);
        let mut resp = error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            &msg,
            &rid,
        );
        let allow = HeaderValue::from_static("POST");
        resp.headers_mut().insert(header::ALLOW, allow);
        resp
    } else {
        // With tenants, `inference` names the caller itself (one key lookup, not two).
        let refused = match router.access.tenants {
            Some(_) => None,
            None => key_refusal(&router, &parts.headers),
        };
        match refused {
            Some(refusal) => refusal,
            None => inference(router.clone(), endpoint, parts.headers, body).await,
        }
    };
    let code = resp
        .extensions()
        .get::<crate::router::metrics::ErrorCode>()
        .map_or("", |c| c.0.as_str());
    router.metrics.http.observe(
        &parts.method,
        endpoint.path(),
        resp.status().as_u16(),
        code,
        started.elapsed(),
    );
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
        match Endpoint::of_path(req.uri().path()) {
            Some(endpoint) => {
                let front = self.clone();
                Box::pin(async move { Ok(front.inference(endpoint, req).await) })
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

    /// A router with no workers, its front with a marker app for the rest.
    fn front(rt: &tokio::runtime::Runtime) -> Front {
        let _guard = rt.enter();
        let router = Arc::new(Router::new(Default::default()).unwrap());
        let rest = axum::Router::new().fallback(|| async { "the rest" });
        Front::new(router, rest, &HttpLimits::default())
    }

    fn send(rt: &tokio::runtime::Runtime, front: &Front, req: Request<Body>) -> Response {
        use tower_service::Service as _;
        rt.block_on(front.clone().call(req)).unwrap()
    }

    #[test]
    fn inference_paths_are_answered_at_the_front_and_the_rest_by_the_app() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let front = front(&rt);
        let body = |r: Response| {
            let bytes = rt.block_on(http_body_util::BodyExt::collect(r.into_body()));
            String::from_utf8(bytes.unwrap().to_bytes().to_vec()).unwrap()
        };
        for e in Endpoint::ALL {
            // Without workers, a POST reaches the handler, which says there are none.
            let post = Request::post(e.path()).body(Body::from("{}")).unwrap();
            let resp = send(&rt, &front, post);
            assert_eq!(
                resp.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{}",
                e.path()
            );
            assert_eq!(resp.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
            // Any other method is refused by name, with what to send instead.
            let get = Request::get(e.path()).body(Body::empty()).unwrap();
            let resp = send(&rt, &front, get);
            assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(resp.headers()[header::ALLOW], "POST");
            assert!(body(resp).contains("takes POST, not GET"));
            // A browser's preflight is answered by the CORS layer.
            let preflight = Request::builder()
                .method(Method::OPTIONS)
                .uri(e.path())
                .header(header::ORIGIN, "https://a.example")
                .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
                .body(Body::empty())
                .unwrap();
            let resp = send(&rt, &front, preflight);
            assert!(resp.status().is_success(), "{}", resp.status());
            assert_eq!(resp.headers()[header::ACCESS_CONTROL_MAX_AGE], "3600");
            // A browser's request reaches the same handler, with the layer's CORS headers.
            let post = Request::post(e.path())
                .header(header::ORIGIN, "https://a.example")
                .body(Body::from("{}"))
                .unwrap();
            let resp = send(&rt, &front, post);
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(resp.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        }
        for path in [
            "/generate/",
            "/v1/tokenize",
            "/workers",
            "/v1/chat/completions/x",
        ] {
            let req = Request::post(path).body(Body::empty()).unwrap();
            assert_eq!(body(send(&rt, &front, req)), "the rest", "{path}");
        }
        let req = Request::post("/generate?x=1")
            .body(Body::from("{}"))
            .unwrap();
        let resp = send(&rt, &front, req);
        assert_eq!(
            resp.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "the query is not part of the path"
        );
        // Every answer above was counted under its route (preflights, answered by the CORS
        // layer, are not).
        let metrics = &front.router.metrics;
        let text = metrics.render(&[], &Default::default(), 0, 0, |_| "random");
        for method in ["GET", "POST"] {
            let sample =
                format!("smg_http_requests_total{{method=\"{method}\",path=\"/generate\"}}");
            assert!(text.contains(&sample), "{sample} in {text}");
        }
    }
}
