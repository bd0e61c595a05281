//! The router's Prometheus metrics. Names follow sglang-router 0.3.2 (`smg_*`) where the
//! meaning is the same, so existing dashboards keep working.

use crate::router::config::BreakerConfig;
use crate::router::request::Endpoint;
use crate::router::worker::{Worker, WorkerType};
use crate::telemetry::{Family, Histogram, PromText};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// The `/metrics` families this file writes, each declared once.
const AUTH_FAILURES_TOTAL: Family = Family::counter(
    "rbgctl_router_auth_failures_total",
    "Requests refused for a missing or wrong API key.",
);
const DISCOVERY_FILE_REJECTED_TOTAL: Family = Family::counter(
    "rbgctl_router_discovery_file_rejected_total",
    "Reads of the RBG discovery file that were unreadable or invalid (the known workers were kept).",
);
const HTTP_CONNECTIONS_ACTIVE: Family = Family::gauge(
    "smg_http_connections_active",
    "Open HTTP connections to the router's API.",
);
const HTTP_RATE_LIMIT_TOTAL: Family = Family::counter(
    "smg_http_rate_limit_total",
    "Requests turned away by the concurrency limit.",
);
const HTTP_REQUESTS_TOTAL: Family = Family::counter(
    "smg_http_requests_total",
    "HTTP requests answered, by method and route.",
);
const HTTP_REQUEST_DURATION_SECONDS: Family = Family::histogram(
    "smg_http_request_duration_seconds",
    "Time from a request's arrival to its response headers, by method and route.",
);
const HTTP_RESPONSES_TOTAL: Family = Family::counter(
    "smg_http_responses_total",
    "HTTP responses, by status and error code (empty for successes).",
);
const PD_DISPATCHES_TOTAL: Family = Family::counter(
    "rbgctl_router_pd_dispatches_total",
    "Requests sent to a prefill and a decode worker together.",
);
const QUEUED_REQUESTS: Family = Family::gauge(
    "rbgctl_router_queued_requests",
    "Requests waiting for a concurrency slot.",
);
const ROUTER_REQUESTS_TOTAL: Family = Family::counter(
    "smg_router_requests_total",
    "Inference requests received, by model, endpoint and streaming.",
);
const ROUTER_REQUEST_DURATION_SECONDS: Family = Family::histogram(
    "smg_router_request_duration_seconds",
    "Time from a request's arrival to the worker's response headers.",
);
const ROUTER_REQUEST_ERRORS_TOTAL: Family = Family::counter(
    "smg_router_request_errors_total",
    "Requests answered with an error, by endpoint and kind.",
);
const ROUTER_UPSTREAM_RESPONSES_TOTAL: Family = Family::counter(
    "smg_router_upstream_responses_total",
    "Worker answers, by status code.",
);
const RUNNING_REQUESTS: Family = Family::gauge(
    "rbgctl_router_running_requests",
    "Requests holding a concurrency slot (0 when unlimited).",
);
const STREAM_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_router_stream_errors_total",
    "Streams cut by their worker after the response had started.",
);
const VLLM_KV_TRANSFER_FAILURES_TOTAL: Family = Family::counter(
    "rbgctl_router_vllm_kv_transfer_failures_total",
    "vLLM prefill/decode requests whose KV transfer could not be set up (answered with an error, never recomputed).",
);
const VLLM_PD_LEGS_CANCELLED_TOTAL: Family = Family::counter(
    "rbgctl_router_vllm_pd_legs_cancelled_total",
    "vLLM prefill/decode requests where one leg failed and the other was cancelled.",
);
const VLLM_PD_N_REFUSED_TOTAL: Family = Family::counter(
    "rbgctl_router_vllm_pd_n_refused_total",
    "vLLM prefill/decode requests refused for asking n > 1.",
);
const WORKER_POOL_SIZE: Family = Family::gauge("smg_worker_pool_size", "Registered workers.");
const WORKER_RETRIES_EXHAUSTED_TOTAL: Family = Family::counter(
    "smg_worker_retries_exhausted_total",
    "Requests that failed after every retry.",
);
const WORKER_RETRIES_TOTAL: Family = Family::counter(
    "smg_worker_retries_total",
    "Attempts repeated on a worker chosen anew.",
);

/// Upper bounds of the duration histograms unless `--prometheus-duration-buckets` says.
pub const BUCKETS_S: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// Distinct `model` label values kept; requests naming others count as `other`, so that a
/// client cannot grow the metrics without bound.
const MAX_MODELS: usize = 64;

/// The labels SMG's dashboards group by, the same for every request of this router.
#[derive(Clone, Copy, Debug)]
pub struct RouterLabels {
    /// `http` (SMG: `grpc`, `http`, `third_party`).
    pub router_type: &'static str,
    /// `http` (SMG: `grpc`, `http`, `external`).
    pub backend_type: &'static str,
    /// `http`.
    pub connection_mode: &'static str,
}

impl Default for RouterLabels {
    fn default() -> Self {
        RouterLabels {
            router_type: "http",
            backend_type: "http",
            connection_mode: "http",
        }
    }
}

/// Counts by HTTP status code, without a lock (one counter per code from 100 to 999).
struct StatusCounts(Box<[AtomicU64]>);

impl Default for StatusCounts {
    fn default() -> Self {
        StatusCounts((100..1000).map(|_| AtomicU64::new(0)).collect())
    }
}

impl StatusCounts {
    fn add(&self, status: u16) {
        let i = usize::from(status.clamp(100, 999) - 100);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The codes seen, in order, with their counts.
    fn seen(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.0.iter().enumerate().filter_map(|(i, n)| {
            let n = n.load(Ordering::Relaxed);
            (n > 0).then_some((i as u16 + 100, n))
        })
    }
}

/// A model's requests, by endpoint × streaming.
type ModelCounts = [[AtomicU64; 2]; Endpoint::ALL.len()];

/// The request path counts without taking a lock for writing once its labels were seen: a
/// read lock finds the counters, which are atomics.
#[derive(Default)]
pub struct Metrics {
    pub labels: RouterLabels,
    /// model → requests, at most `MAX_MODELS` models (then `other`).
    by_model: RwLock<BTreeMap<String, ModelCounts>>,
    /// Worker answers by status code.
    upstream: StatusCounts,
    /// By endpoint × streaming.
    requests: [[AtomicU64; 2]; Endpoint::ALL.len()],
    /// Time to the worker's response headers, by endpoint.
    duration: Durations,
    /// (endpoint, error kind) → count.
    errors: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    pub retries: AtomicU64,
    pub retries_exhausted: AtomicU64,
    pub rate_limited_429: AtomicU64,
    pub queue_timeouts_408: AtomicU64,
    pub stream_errors: AtomicU64,
    pub pd_dispatches: AtomicU64,
    /// vLLM PD requests refused because they ask `n` > 1 (one prefill's KV serves one sequence).
    pub vllm_pd_n_refused: AtomicU64,
    /// vLLM PD requests whose KV transfer could not be set up (no engine id from the Mooncake
    /// bootstrap, or a NIXL prefill answer without `kv_transfer_params`): never recomputed
    /// silently, answered with an error.
    pub vllm_kv_transfer_failures: AtomicU64,
    /// vLLM PD requests where one leg failed and the other was cancelled.
    pub vllm_pd_legs_cancelled: AtomicU64,
    pub auth_failures: AtomicU64,
    /// Reads of the RBG discovery file that were refused (unreadable or invalid).
    pub discovery_rejected: AtomicU64,
    /// SMG's HTTP layer: every request the API answered.
    pub http: HttpMetrics,
}

/// Time to the worker's response headers, by endpoint.
struct Durations([Histogram; Endpoint::ALL.len()]);

impl Durations {
    fn new(bounds: &[f64]) -> Durations {
        Durations(std::array::from_fn(|_| Histogram::with_buckets(bounds)))
    }
}

impl Default for Durations {
    fn default() -> Self {
        Durations::new(&BUCKETS_S)
    }
}

/// A route's requests and their durations.
struct RouteStats {
    requests: AtomicU64,
    duration: Histogram,
}

/// SMG's HTTP-layer families (`smg_http_*`): requests by method and route (the route's
/// pattern, so that paths cannot grow the label set), durations to the response headers,
/// responses by status and error code, and open connections.
#[derive(Default)]
pub struct HttpMetrics {
    bounds: Option<Arc<[f64]>>,
    /// route → method → stats (looked up by `&str` under a read lock: no allocation and no
    /// write to a lock once a route was seen).
    routes: RwLock<BTreeMap<String, BTreeMap<&'static str, RouteStats>>>,
    /// Responses without an error code, by status.
    ok_responses: StatusCounts,
    /// status → error code → responses (errors only).
    error_responses: Mutex<BTreeMap<u16, BTreeMap<String, u64>>>,
    /// Open connections, kept by the HTTP server.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
}

/// `map[key]`, inserted as the default first; the key is copied only then.
fn entry<'a, V: Default>(map: &'a mut BTreeMap<String, V>, key: &str) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.to_string(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// The error code a response carries for `smg_http_responses_total` (set by
/// `error_response`).
#[derive(Clone, Debug)]
pub struct ErrorCode(pub String);

/// A method as a label: the standard ones by name, any other as `OTHER`.
fn method_label(m: &http::Method) -> &'static str {
    use http::Method;
    [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
    ]
    .iter()
    .find(|x| *x == m)
    .map_or("OTHER", |x| match *x {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        _ => "OPTIONS",
    })
}

impl HttpMetrics {
    /// A request to `route` answered `status` (with `error_code` for errors) after `took`.
    pub fn observe(
        &self,
        method: &http::Method,
        route: &str,
        status: u16,
        error_code: &str,
        took: Duration,
    ) {
        let method = method_label(method);
        let count = |stats: &RouteStats| {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            stats.duration.observe(took);
        };
        let seen = self
            .routes
            .read()
            .get(route)
            .and_then(|m| m.get(method))
            .map(count);
        if seen.is_none() {
            let mut routes = self.routes.write();
            count(
                entry(&mut routes, route)
                    .entry(method)
                    .or_insert_with(|| self.route_stats()),
            );
        }
        if error_code.is_empty() {
            self.ok_responses.add(status);
        } else {
            *entry(
                self.error_responses.lock().entry(status).or_default(),
                error_code,
            ) += 1;
        }
    }

    fn route_stats(&self) -> RouteStats {
        let bounds = self.bounds.as_deref().unwrap_or(&BUCKETS_S);
        RouteStats {
            requests: AtomicU64::new(0),
            duration: Histogram::with_buckets(bounds),
        }
    }

    fn render(&self, p: &mut PromText) {
        let held = self.routes.read();
        let routes: Vec<(&str, &'static str, &RouteStats)> = held
            .iter()
            .flat_map(|(path, by_method)| {
                by_method.iter().map(move |(m, s)| (path.as_str(), *m, s))
            })
            .collect();
        p.family(&HTTP_REQUESTS_TOTAL);
        for (path, method, s) in &routes {
            p.sample(
                &HTTP_REQUESTS_TOTAL,
                &[("method", method), ("path", path)],
                s.requests.load(Ordering::Relaxed) as f64,
            );
        }
        for (path, method, s) in &routes {
            p.histogram(
                &HTTP_REQUEST_DURATION_SECONDS,
                &[("method", method), ("path", path)],
                &s.duration,
            );
        }
        p.family(&HTTP_RESPONSES_TOTAL);
        let mut responses = self.error_responses.lock().clone();
        for (status, n) in self.ok_responses.seen() {
            responses
                .entry(status)
                .or_default()
                .insert(String::new(), n);
        }
        for (status, by_code) in &responses {
            for (code, n) in by_code {
                p.sample(
                    &HTTP_RESPONSES_TOTAL,
                    &[("status_code", &status.to_string()), ("error_code", code)],
                    *n as f64,
                );
            }
        }
        p.single(
            &HTTP_CONNECTIONS_ACTIVE,
            self.connections.load(Ordering::Relaxed) as f64,
        );
    }
}

impl Metrics {
    /// Metrics whose duration histograms have these upper bounds (seconds, increasing;
    /// empty: `BUCKETS_S`).
    pub fn with_buckets(bounds: &[f64]) -> Metrics {
        let bounds: Arc<[f64]> = if bounds.is_empty() {
            BUCKETS_S.as_slice().into()
        } else {
            bounds.into()
        };
        Metrics {
            duration: Durations::new(&bounds),
            http: HttpMetrics {
                bounds: Some(bounds.clone()),
                ..HttpMetrics::default()
            },
            ..Metrics::default()
        }
    }

    /// Counts a request to `e`, streaming or not, for `model` (`unknown` when it names none).
    pub fn request(&self, e: Endpoint, stream: bool, model: Option<&str>) {
        self.requests[e.index()][stream as usize].fetch_add(1, Ordering::Relaxed);
        let model = model.unwrap_or("unknown");
        let count = |c: &ModelCounts| c[e.index()][stream as usize].fetch_add(1, Ordering::Relaxed);
        if self.by_model.read().get(model).map(count).is_some() {
            return;
        }
        let mut m = self.by_model.write();
        let model = if m.contains_key(model) || m.len() < MAX_MODELS {
            model
        } else {
            "other"
        };
        count(entry(&mut m, model));
    }

    /// A worker answered with `status`.
    pub fn upstream(&self, status: u16) {
        self.upstream.add(status);
    }

    /// Observes how long a request to `e` took.
    pub fn duration(&self, e: Endpoint, d: Duration) {
        self.duration.0[e.index()].observe(d);
    }

    /// Counts an error of `kind` at endpoint `e`.
    pub fn error(&self, e: &'static str, kind: &'static str) {
        *self.errors.lock().entry((e, kind)).or_default() += 1;
    }

    /// Inference requests counted in all.
    pub fn requests_total(&self) -> u64 {
        self.requests
            .iter()
            .flatten()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// `policy_of` names the policy that chooses workers of a type.
    pub fn render(
        &self,
        workers: &[Arc<Worker>],
        cb: &BreakerConfig,
        running: usize,
        queued: usize,
        policy_of: impl Fn(WorkerType) -> &'static str,
    ) -> String {
        let mut p = PromText::new();
        const ENDPOINTS: [Endpoint; 7] = Endpoint::ALL;
        let l = self.labels;
        p.family(&ROUTER_REQUESTS_TOTAL);
        for (model, counts) in self.by_model.read().iter() {
            for (e, by_stream) in ENDPOINTS.iter().zip(counts) {
                for (stream, n) in [false, true].into_iter().zip(by_stream) {
                    let n = n.load(Ordering::Relaxed);
                    if n == 0 {
                        continue;
                    }
                    p.sample(
                        &ROUTER_REQUESTS_TOTAL,
                        &[
                            ("router_type", l.router_type),
                            ("backend_type", l.backend_type),
                            ("connection_mode", l.connection_mode),
                            ("model", model),
                            ("endpoint", e.name()),
                            ("streaming", if stream { "true" } else { "false" }),
                        ],
                        n as f64,
                    );
                }
            }
        }
        p.family(&ROUTER_UPSTREAM_RESPONSES_TOTAL);
        for (code, n) in self.upstream.seen() {
            p.sample(
                &ROUTER_UPSTREAM_RESPONSES_TOTAL,
                &[("status_code", &code.to_string())],
                n as f64,
            );
        }
        for e in ENDPOINTS {
            p.histogram(
                &ROUTER_REQUEST_DURATION_SECONDS,
                &[
                    ("router_type", l.router_type),
                    ("backend_type", l.backend_type),
                    ("endpoint", e.name()),
                ],
                &self.duration.0[e.index()],
            );
        }
        p.family(&ROUTER_REQUEST_ERRORS_TOTAL);
        for ((e, kind), n) in self.errors.lock().iter() {
            p.sample(
                &ROUTER_REQUEST_ERRORS_TOTAL,
                &[
                    ("router_type", l.router_type),
                    ("endpoint", e),
                    ("error_type", kind),
                ],
                *n as f64,
            );
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        p.single(&WORKER_RETRIES_TOTAL, load(&self.retries));
        p.single(
            &WORKER_RETRIES_EXHAUSTED_TOTAL,
            load(&self.retries_exhausted),
        );
        p.family(&HTTP_RATE_LIMIT_TOTAL);
        p.sample(
            &HTTP_RATE_LIMIT_TOTAL,
            &[("decision", "rejected_queue_full")],
            load(&self.rate_limited_429),
        );
        p.sample(
            &HTTP_RATE_LIMIT_TOTAL,
            &[("decision", "rejected_queue_timeout")],
            load(&self.queue_timeouts_408),
        );
        p.single(&RUNNING_REQUESTS, running as f64);
        p.single(&QUEUED_REQUESTS, queued as f64);
        p.single(&STREAM_ERRORS_TOTAL, load(&self.stream_errors));
        p.single(&PD_DISPATCHES_TOTAL, load(&self.pd_dispatches));
        p.single(&VLLM_PD_N_REFUSED_TOTAL, load(&self.vllm_pd_n_refused));
        p.single(
            &VLLM_KV_TRANSFER_FAILURES_TOTAL,
            load(&self.vllm_kv_transfer_failures),
        );
        p.single(
            &VLLM_PD_LEGS_CANCELLED_TOTAL,
            load(&self.vllm_pd_legs_cancelled),
        );
        p.single(&AUTH_FAILURES_TOTAL, load(&self.auth_failures));
        p.single(
            &DISCOVERY_FILE_REJECTED_TOTAL,
            load(&self.discovery_rejected),
        );
        p.single(&WORKER_POOL_SIZE, workers.len() as f64);
        type Col = Family<'static>;
        let cols: [Col; 12] = [
            Family::gauge(
                "smg_worker_health",
                "1 if the worker passes its health checks.",
            ),
            Family::gauge(
                "smg_worker_requests_active",
                "Requests in flight on the worker.",
            ),
            Family::counter(
                "smg_worker_requests_total",
                "Requests sent to the worker.",
            ),
            Family::counter(
                "smg_worker_errors_total",
                "Failed requests on the worker.",
            ),
            Family::gauge(
                "smg_worker_cb_state",
                "Circuit state: 0 closed, 1 open, 2 half-open.",
            ),
            Family::gauge(
                "smg_worker_cb_consecutive_failures",
                "Consecutive failures.",
            ),
            Family::gauge(
                "smg_worker_cb_consecutive_successes",
                "Consecutive successes.",
            ),
            Family::counter(
                "smg_worker_health_checks_total",
                "Health checks, by result.",
            ),
            Family::counter(
                "smg_worker_cb_transitions_total",
                "Circuit state changes, by new state.",
            ),
            Family::counter(
                "smg_worker_selection_total",
                "Times the load balancer chose the worker, by policy.",
            ),
            Family::counter(
                "smg_worker_cb_outcomes_total",
                "Outcomes the circuit breaker counted, by outcome.",
            ),
            Family::gauge(
                "rbgctl_router_worker_queued_prefill_tokens",
                "Prompt tokens predicted_ttft sent the worker to compute whose first byte has not come back.",
            ),
        ];
        let now = Instant::now();
        for (i, family) in cols.iter().enumerate() {
            p.family(family);
            for w in workers {
                let url = &*w.url;
                let t = w.worker_type.name();
                let base = [("worker", url), ("worker_type", t)];
                let c = &w.counters;
                let (fails, succs) = w.circuit_counts();
                match i {
                    0 => p.sample(family, &base, w.healthy() as u8 as f64),
                    1 => p.sample(family, &base, w.load() as f64),
                    2 => p.sample(family, &base, load(&c.requests)),
                    3 => p.sample(family, &base, load(&c.errors)),
                    4 => p.sample(family, &base, w.circuit(cb, now).gauge()),
                    5 => p.sample(family, &base, fails as f64),
                    6 => p.sample(family, &base, succs as f64),
                    7 => {
                        p.sample(
                            family,
                            &[base[0], base[1], ("result", "ok")],
                            load(&c.health_checks_ok),
                        );
                        p.sample(
                            family,
                            &[base[0], base[1], ("result", "failed")],
                            load(&c.health_checks_failed),
                        )
                    }
                    9 => p.sample(
                        family,
                        &[base[0], base[1], ("policy", policy_of(w.worker_type))],
                        load(&c.selected),
                    ),
                    10 => {
                        p.sample(
                            family,
                            &[base[0], base[1], ("outcome", "success")],
                            load(&c.cb_successes),
                        );
                        p.sample(
                            family,
                            &[base[0], base[1], ("outcome", "failure")],
                            load(&c.cb_failures),
                        )
                    }
                    11 => p.sample(family, &base, w.queued_prefill_total() as f64),
                    _ => {
                        p.sample(
                            family,
                            &[base[0], base[1], ("to", "open")],
                            load(&c.cb_opened),
                        );
                        p.sample(
                            family,
                            &[base[0], base[1], ("to", "half_open")],
                            load(&c.cb_half_opened),
                        );
                        p.sample(
                            family,
                            &[base[0], base[1], ("to", "closed")],
                            load(&c.cb_closed),
                        )
                    }
                };
            }
        }
        self.http.render(&mut p);
        p.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_labels_are_bounded() {
        let m = Metrics::default();
        for i in 0..100 {
            m.request(Endpoint::Chat, false, Some(&format!("model-{i}")));
        }
        m.request(Endpoint::Chat, false, Some("model-0"));
        let by = m.by_model.read();
        assert_eq!(by.len(), MAX_MODELS + 1, "64 named, then other");
        let chat = |model: &str| by[model][Endpoint::Chat.index()][0].load(Ordering::Relaxed);
        assert_eq!(chat("model-0"), 2);
        assert_eq!(chat("other"), 36);
    }
}
