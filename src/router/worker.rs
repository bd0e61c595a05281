//! Workers as the router sees them: where they are, what they do (regular, prefill, decode),
//! where they came from, and their live state (requests in flight, health, circuit breaker).
//! The health and breaker state machines are pure (time is passed in) and tested without
//! sockets; the registry is a copy-on-write list so that routing reads it without locking.

use super::config::{Backend, BreakerConfig, HealthConfig};
use super::vllm::Connector;
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What a worker serves: whole requests, or one side of prefill/decode disaggregation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerType {
    Regular,
    Prefill,
    Decode,
}

impl WorkerType {
    /// The type as sglang-router's API and labels spell it.
    pub fn name(self) -> &'static str {
        match self {
            WorkerType::Regular => "regular",
            WorkerType::Prefill => "prefill",
            WorkerType::Decode => "decode",
        }
    }
}

/// Who added a worker; discovery sources only ever remove their own workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Flags,
    Api,
    RbgFile,
    Kubernetes,
}

/// What is needed to add a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    pub url: String,
    pub worker_type: WorkerType,
    /// Prefill only.
    pub bootstrap_port: Option<u16>,
    pub api_key: Option<String>,
    pub model_id: Option<String>,
    /// vLLM PD: the engine's KV connector (else the router's `--vllm-kv-connector`).
    pub kv_connector: Option<Connector>,
    /// vLLM PD with Mooncake: the prefill engine's id, when known (else asked of `/query`).
    pub kv_engine_id: Option<String>,
    /// `--dp-aware`: the data-parallel rank this worker stands for (its URL gains `@rank`).
    pub dp_rank: Option<usize>,
}

impl WorkerSpec {
    /// A regular worker at `url`, with nothing else said of it.
    pub fn regular(url: impl Into<String>) -> WorkerSpec {
        WorkerSpec {
            url: url.into(),
            worker_type: WorkerType::Regular,
            bootstrap_port: None,
            api_key: None,
            model_id: None,
            kv_connector: None,
            kv_engine_id: None,
            dp_rank: None,
        }
    }

    /// The worker's name: its URL, with `@rank` for a data-parallel rank.
    pub fn name(&self) -> String {
        match self.dp_rank {
            Some(r) => format!("{}@{r}", self.url),
            None => self.url.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Circuit breaker

/// A worker's circuit breaker: closed (served), open (skipped), half-open (trying again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

impl CircuitState {
    /// The value of `smg_worker_cb_state`: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> f64 {
        match self {
            CircuitState::Closed => 0.0,
            CircuitState::Open => 1.0,
            CircuitState::HalfOpen => 2.0,
        }
    }
    /// The state as the status page and logs spell it.
    pub fn name(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

/// Closed → open after `failure_threshold` consecutive failures; open → half-open once
/// `timeout` has passed (checked when asked); half-open → closed after `success_threshold`
/// consecutive successes, and back to open on any failure.
#[derive(Clone, Debug)]
pub struct CircuitBreaker {
    state: CircuitState,
    failures: u32,
    successes: u32,
    opened_at: Option<Instant>,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            state: CircuitState::Closed,
            failures: 0,
            successes: 0,
            opened_at: None,
        }
    }
}

impl CircuitBreaker {
    /// The state at `now` (an open circuit whose timeout has passed turns half-open).
    pub fn state(&mut self, cfg: &BreakerConfig, now: Instant) -> CircuitState {
        if self.state == CircuitState::Open
            && self
                .opened_at
                .is_some_and(|t| now.duration_since(t) >= cfg.timeout.0)
        {
            self.state = CircuitState::HalfOpen;
            self.successes = 0;
        }
        self.state
    }

    /// Whether a request may go to the worker now (breakers off, or the circuit not open).
    pub fn can_execute(&mut self, cfg: &BreakerConfig, now: Instant) -> bool {
        cfg.disabled || self.state(cfg, now) != CircuitState::Open
    }

    /// Records an outcome; returns the transition it caused, if any.
    pub fn record(
        &mut self,
        cfg: &BreakerConfig,
        ok: bool,
        now: Instant,
    ) -> Option<(CircuitState, CircuitState)> {
        if cfg.disabled {
            return None;
        }
        let before = self.state(cfg, now);
        if ok {
            self.failures = 0;
            self.successes += 1;
            if before == CircuitState::HalfOpen && self.successes >= cfg.success_threshold {
                self.state = CircuitState::Closed;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if before == CircuitState::HalfOpen
                || (before == CircuitState::Closed && self.failures >= cfg.failure_threshold)
            {
                self.state = CircuitState::Open;
                self.opened_at = Some(now);
            }
        }
        (self.state != before).then_some((before, self.state))
    }

    /// Failures in a row counted now.
    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }
    /// Successes in a row counted now (in half-open, those toward closing).
    pub fn consecutive_successes(&self) -> u32 {
        self.successes
    }
}

// ---------------------------------------------------------------------------------------------
// Health

/// Healthy → unhealthy after `failure_threshold` consecutive failed checks, and back after
/// `success_threshold` consecutive good ones. Workers start healthy.
#[derive(Clone, Debug)]
pub struct HealthTracker {
    healthy: bool,
    failures: u32,
    successes: u32,
}

impl Default for HealthTracker {
    fn default() -> Self {
        HealthTracker {
            healthy: true,
            failures: 0,
            successes: 0,
        }
    }
}

impl HealthTracker {
    /// Whether the health checks count the worker in.
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    /// Records a check; returns the new health when it changed.
    pub fn record(&mut self, cfg: &HealthConfig, ok: bool) -> Option<bool> {
        if ok {
            self.failures = 0;
            self.successes += 1;
            if !self.healthy && self.successes >= cfg.success_threshold {
                self.healthy = true;
                return Some(true);
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.healthy && self.failures >= cfg.failure_threshold {
                self.healthy = false;
                return Some(false);
            }
        }
        None
    }
}

// ---------------------------------------------------------------------------------------------
// A worker

/// Per-worker counters for `/metrics`.
#[derive(Default)]
pub struct WorkerCounters {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub health_checks_ok: AtomicU64,
    pub health_checks_failed: AtomicU64,
    pub cb_opened: AtomicU64,
    pub cb_half_opened: AtomicU64,
    pub cb_closed: AtomicU64,
    /// Times a policy chose this worker.
    pub selected: AtomicU64,
    /// Outcomes the circuit breaker was told.
    pub cb_successes: AtomicU64,
    pub cb_failures: AtomicU64,
}

/// One worker the router sends requests to: its address, kind, health, breaker and load.
pub struct Worker {
    pub id: String,
    /// Its name: the address, with `@rank` for a data-parallel rank (`--dp-aware`).
    pub url: Arc<str>,
    /// Where requests go: the address without the rank.
    pub base_url: Arc<str>,
    /// `--dp-aware`: the rank requests are sent to (`data_parallel_rank`).
    pub dp_rank: Option<usize>,
    pub worker_type: WorkerType,
    pub bootstrap_port: Option<u16>,
    /// Host part of the URL, sent to decode workers as `bootstrap_host`.
    pub host: String,
    pub api_key: Option<String>,
    pub source: Source,
    pub model_id: RwLock<Option<String>>,
    /// vLLM PD: the engine's KV connector, when it was registered with one.
    pub kv_connector: Option<Connector>,
    /// vLLM PD with Mooncake: the engine id it was registered with.
    pub kv_engine_id: Option<String>,
    /// The engine behind it, once its `/v1/models` has said (`owned_by: vllm`).
    pub engine: RwLock<Option<Backend>>,
    /// Every model its `/v1/models` lists (an OpenAI-compatible upstream serves several).
    pub served_models: RwLock<Vec<String>>,
    inflight: AtomicUsize,
    processed: AtomicU64,
    /// Prompt tokens it is predicted to prefill for requests sent and not yet answered, by
    /// band (`predicted_ttft`).
    queued_prefill: QueuedPrefill,
    health: Mutex<HealthTracker>,
    breaker: Mutex<CircuitBreaker>,
    pub counters: WorkerCounters,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("url", &self.url)
            .field("type", &self.worker_type)
            .finish()
    }
}

/// Host of `http://host:port` (brackets of an IPv6 literal removed).
pub fn url_host(url: &str) -> String {
    url.parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_string()))
        .unwrap_or_else(|| "localhost".into())
}

fn new_id() -> String {
    let mut s = String::with_capacity(32);
    for _ in 0..2 {
        s.push_str(&format!("{:016x}", fastrand::u64(..)));
    }
    s
}

impl Worker {
    /// A worker as `spec` describes it, found by `source`, with a new id and nothing in flight.
    pub fn new(spec: WorkerSpec, source: Source) -> Worker {
        Worker {
            id: new_id(),
            host: url_host(&spec.url),
            url: spec.name().into(),
            base_url: spec.url.into(),
            dp_rank: spec.dp_rank,
            worker_type: spec.worker_type,
            bootstrap_port: spec.bootstrap_port,
            api_key: spec.api_key,
            source,
            model_id: RwLock::new(spec.model_id),
            kv_connector: spec.kv_connector,
            kv_engine_id: spec.kv_engine_id,
            engine: RwLock::new(None),
            served_models: RwLock::new(Vec::new()),
            inflight: AtomicUsize::new(0),
            processed: AtomicU64::new(0),
            queued_prefill: QueuedPrefill::default(),
            health: Mutex::new(HealthTracker::default()),
            breaker: Mutex::new(CircuitBreaker::default()),
            counters: WorkerCounters::default(),
        }
    }

    /// Whether it serves `model` (its model id, or one its `/v1/models` lists); `None` when
    /// it has not said what it serves.
    pub fn serves(&self, model: &str) -> Option<bool> {
        let id = self.model_id.read();
        let listed = self.served_models.read();
        if id.is_none() && listed.is_empty() {
            return None;
        }
        Some(id.as_deref() == Some(model) || listed.iter().any(|m| m == model))
    }

    /// Requests in flight on the worker now.
    pub fn load(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Requests sent to the worker since it was added.
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Whether what its KV events claim may outrank other workers: given by the operator
    /// (flags, the discovery file, Kubernetes), or added through the API and since sent
    /// [`TRUSTED_AFTER`](crate::router::policy::TRUSTED_AFTER) requests.
    pub fn vouched(&self) -> bool {
        self.source != Source::Api || self.processed() >= crate::router::policy::TRUSTED_AFTER
    }

    /// Counts a request in flight until the guard drops (when its response body ends), and
    /// the prompt tokens it is predicted to prefill here until its first byte comes back.
    pub fn begin(self: &Arc<Self>, prefill: Option<Prefill>) -> LoadGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.processed.fetch_add(1, Ordering::Relaxed);
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = prefill {
            self.queued_prefill.add(p);
        }
        LoadGuard {
            worker: self.clone(),
            prefill,
        }
    }

    /// Prompt tokens queued here that a request of `band` waits behind.
    pub fn queued_prefill(&self, band: Option<u8>) -> u64 {
        self.queued_prefill.ahead_of(band)
    }

    /// Prompt tokens queued here, in all.
    pub fn queued_prefill_total(&self) -> u64 {
        self.queued_prefill.ahead_of(None)
    }

    /// Whether the health checks count the worker in.
    pub fn healthy(&self) -> bool {
        self.health.lock().healthy()
    }

    /// Healthy and its circuit lets requests through.
    pub fn available(&self, cb: &BreakerConfig, now: Instant) -> bool {
        self.healthy() && self.breaker.lock().can_execute(cb, now)
    }

    /// The worker's circuit now (an open one past its timeout reads half-open).
    pub fn circuit(&self, cb: &BreakerConfig, now: Instant) -> CircuitState {
        self.breaker.lock().state(cb, now)
    }

    /// The breaker's failures and successes in a row.
    pub fn circuit_counts(&self) -> (u32, u32) {
        let b = self.breaker.lock();
        (b.consecutive_failures(), b.consecutive_successes())
    }

    /// Records a request's outcome in the circuit breaker.
    pub fn record_outcome(&self, cb: &BreakerConfig, ok: bool) {
        if !ok {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        let outcome = if ok {
            &self.counters.cb_successes
        } else {
            &self.counters.cb_failures
        };
        outcome.fetch_add(1, Ordering::Relaxed);
        let change = self.breaker.lock().record(cb, ok, Instant::now());
        if let Some((from, to)) = change {
            let c = match to {
                CircuitState::Open => &self.counters.cb_opened,
                CircuitState::HalfOpen => &self.counters.cb_half_opened,
                CircuitState::Closed => &self.counters.cb_closed,
            };
            c.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(worker = %self.url, from = from.name(), to = to.name(), "circuit breaker");
        }
    }

    /// Records a health check.
    pub fn record_health(&self, cfg: &HealthConfig, ok: bool) {
        let c = if ok {
            &self.counters.health_checks_ok
        } else {
            &self.counters.health_checks_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
        if let Some(healthy) = self.health.lock().record(cfg, ok) {
            if healthy {
                tracing::info!(worker = %self.url, "worker healthy again");
            } else {
                tracing::warn!(worker = %self.url, "worker unhealthy");
            }
        }
    }
}

/// Decrements a worker's in-flight count on drop, and its queued prefill when the first byte
/// comes back (or on drop).
pub struct LoadGuard {
    worker: Arc<Worker>,
    prefill: Option<Prefill>,
}

impl LoadGuard {
    /// The worker this request is counted on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// The worker has answered the first byte: its prefill of this request is done.
    pub fn prefilled(&mut self) {
        if let Some(p) = self.prefill.take() {
            self.worker.queued_prefill.sub(p);
        }
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.prefilled();
        self.worker.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// Queued prefill

/// Priority bands a worker's queued prefill is kept by: one per tenant class (16 at most), and
/// the last for requests sent without an engine priority.
const BANDS: usize = crate::router::tenants::table::MAX_CLASSES + 1;

/// A request's predicted prefill on the worker it was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefill {
    /// The rank of its class among the tenants' classes, when the class gives engines a
    /// priority (they then prefill it before the classes after it); `None` otherwise.
    pub band: Option<u8>,
    /// Prompt tokens the worker is predicted to compute (those it does not hold).
    pub tokens: u64,
}

impl Prefill {
    fn slot(band: Option<u8>) -> usize {
        band.map_or(BANDS - 1, |b| usize::from(b).min(BANDS - 2))
    }
}

/// Tokens queued per band.
#[derive(Default)]
struct QueuedPrefill([AtomicU64; BANDS]);

impl QueuedPrefill {
    fn add(&self, p: Prefill) {
        self.0[Prefill::slot(p.band)].fetch_add(p.tokens, Ordering::Relaxed);
    }

    fn sub(&self, p: Prefill) {
        self.0[Prefill::slot(p.band)].fetch_sub(p.tokens, Ordering::Relaxed);
    }

    /// What a request of `band` waits behind: the bands up to its own and those sent without
    /// a priority (whose place in the engine's line the router cannot know); a request
    /// without a priority waits behind everything.
    fn ahead_of(&self, band: Option<u8>) -> u64 {
        let take = |i: usize| self.0[i].load(Ordering::Relaxed);
        match band {
            None => (0..BANDS).map(take).sum(),
            Some(b) => (0..=Prefill::slot(Some(b))).map(take).sum::<u64>() + take(BANDS - 1),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The registry

/// Why a worker could not be added or removed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("worker {0} is already registered")]
    Duplicate(String),
    #[error("no worker {0}")]
    Unknown(String),
}

/// Every worker, as an immutable snapshot replaced on change.
#[derive(Default)]
pub struct Registry {
    workers: RwLock<Arc<Vec<Arc<Worker>>>>,
}

impl Registry {
    /// The workers now: a list that later changes do not touch.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Worker>>> {
        self.workers.read().clone()
    }

    /// Registers a worker; a URL already registered is refused.
    pub fn add(&self, spec: WorkerSpec, source: Source) -> Result<Arc<Worker>, RegistryError> {
        let mut w = self.workers.write();
        let name = spec.name();
        if w.iter().any(|x| *x.url == *name) {
            return Err(RegistryError::Duplicate(name));
        }
        let worker = Arc::new(Worker::new(spec, source));
        let mut next = (**w).clone();
        next.push(worker.clone());
        *w = Arc::new(next);
        tracing::info!(worker = %worker.url, worker_type = worker.worker_type.name(), ?source, "worker added");
        Ok(worker)
    }

    /// Removes by id or URL; the address of a worker split into data-parallel ranks
    /// removes every rank.
    pub fn remove(&self, id_or_url: &str) -> Result<Vec<Arc<Worker>>, RegistryError> {
        let mut w = self.workers.write();
        let (gone, kept): (Vec<Arc<Worker>>, Vec<Arc<Worker>>) = w
            .iter()
            .cloned()
            .partition(|x| x.id == id_or_url || *x.url == *id_or_url || *x.base_url == *id_or_url);
        if gone.is_empty() {
            return Err(RegistryError::Unknown(id_or_url.to_string()));
        }
        *w = Arc::new(kept);
        for x in &gone {
            tracing::info!(worker = %x.url, "worker removed");
        }
        Ok(gone)
    }

    /// The worker with this id or URL.
    pub fn get(&self, id_or_url: &str) -> Option<Arc<Worker>> {
        self.snapshot()
            .iter()
            .find(|x| x.id == id_or_url || *x.url == *id_or_url)
            .cloned()
    }

    /// Makes the workers of `source` exactly `wanted`: adds the new ones, removes the ones
    /// gone (and a worker whose type or bootstrap port changed is replaced). Returns
    /// (added, removed).
    pub fn sync(
        &self,
        source: Source,
        wanted: &[WorkerSpec],
    ) -> (Vec<Arc<Worker>>, Vec<Arc<Worker>>) {
        let mut w = self.workers.write();
        let mut next: Vec<Arc<Worker>> = Vec::with_capacity(wanted.len() + w.len());
        let mut removed = Vec::new();
        for x in w.iter() {
            let keep = x.source != source
                || wanted.iter().any(|s| {
                    *s.name() == *x.url
                        && s.worker_type == x.worker_type
                        && s.bootstrap_port == x.bootstrap_port
                });
            if keep {
                next.push(x.clone());
            } else {
                removed.push(x.clone());
            }
        }
        let mut added = Vec::new();
        for s in wanted {
            let name = s.name();
            if next.iter().any(|x| *x.url == *name) {
                continue;
            }
            let worker = Arc::new(Worker::new(s.clone(), source));
            next.push(worker.clone());
            added.push(worker);
        }
        if !added.is_empty() || !removed.is_empty() {
            *w = Arc::new(next);
            for x in &added {
                tracing::info!(worker = %x.url, ?source, "worker discovered");
            }
            for x in &removed {
                tracing::info!(worker = %x.url, ?source, "worker gone");
            }
        }
        (added, removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secs;
    use std::time::Duration;

    const CB: BreakerConfig = BreakerConfig {
        failure_threshold: 3,
        success_threshold: 2,
        timeout: Secs::from_secs(10),
        window: Secs::from_secs(120),
        disabled: false,
    };

    #[test]
    fn breaker_opens_half_opens_and_closes() {
        let mut b = CircuitBreaker::default();
        let t0 = Instant::now();
        assert_eq!(b.record(&CB, false, t0), None);
        assert_eq!(b.record(&CB, true, t0), None, "a success resets the count");
        b.record(&CB, false, t0);
        b.record(&CB, false, t0);
        assert_eq!(
            b.record(&CB, false, t0),
            Some((CircuitState::Closed, CircuitState::Open))
        );
        assert!(!b.can_execute(&CB, t0 + Duration::from_secs(9)));
        assert!(b.can_execute(&CB, t0 + Duration::from_secs(10)));
        assert_eq!(
            b.state(&CB, t0 + Duration::from_secs(10)),
            CircuitState::HalfOpen
        );
        // A failure while half-open reopens at once.
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(
            b.record(&CB, false, t1),
            Some((CircuitState::HalfOpen, CircuitState::Open))
        );
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(b.record(&CB, true, t2), None, "one success is not enough");
        assert_eq!(
            b.record(&CB, true, t2),
            Some((CircuitState::HalfOpen, CircuitState::Closed))
        );
        let off = BreakerConfig {
            disabled: true,
            ..CB
        };
        let mut b = CircuitBreaker::default();
        for _ in 0..10 {
            assert_eq!(b.record(&off, false, t0), None);
        }
        assert!(b.can_execute(&off, t0));
    }

    #[test]
    fn health_needs_consecutive_results() {
        let cfg = HealthConfig {
            failure_threshold: 2,
            success_threshold: 2,
            ..HealthConfig::default()
        };
        let mut h = HealthTracker::default();
        assert_eq!(h.record(&cfg, false), None);
        assert_eq!(h.record(&cfg, true), None);
        assert_eq!(h.record(&cfg, false), None);
        assert_eq!(h.record(&cfg, false), Some(false));
        assert!(!h.healthy());
        assert_eq!(h.record(&cfg, true), None);
        assert_eq!(h.record(&cfg, true), Some(true));
    }

    #[test]
    fn queued_prefill_counts_what_a_band_waits_behind_until_the_first_byte_or_the_end() {
        let w = Arc::new(Worker::new(
            WorkerSpec::regular("http://w:1"),
            Source::Flags,
        ));
        let sent = |band, tokens| w.begin(Some(Prefill { band, tokens }));
        let mut interactive = sent(Some(0), 100);
        let batch = sent(Some(1), 1000);
        let unbanded = sent(None, 10);
        let plain = w.begin(None);
        // The first class waits behind itself and the unbanded; the second behind both
        // classes; an unbanded request behind everything.
        assert_eq!(w.queued_prefill(Some(0)), 110);
        assert_eq!(w.queued_prefill(Some(1)), 1110);
        assert_eq!(w.queued_prefill(Some(9)), 1110);
        assert_eq!(w.queued_prefill(None), 1110);
        assert_eq!(w.load(), 4);
        // The first byte ends a request's prefill; it stays in flight.
        interactive.prefilled();
        interactive.prefilled();
        assert_eq!(w.queued_prefill_total(), 1010);
        assert_eq!(w.load(), 4);
        // The end of a request ends both.
        drop((batch, unbanded, plain));
        assert_eq!(w.queued_prefill_total(), 0);
        assert_eq!(w.load(), 1);
        drop(interactive);
        assert_eq!((w.queued_prefill_total(), w.load()), (0, 0));
        // A band past the last class counts as the last class.
        let far = sent(Some(200), 5);
        assert_eq!(w.queued_prefill(Some(15)), 5);
        assert_eq!(w.queued_prefill(Some(0)), 0);
        drop(far);
    }

    #[test]
    fn registry_sync_touches_only_its_source() {
        let r = Registry::default();
        r.add(WorkerSpec::regular("http://a:1"), Source::Flags)
            .unwrap();
        assert_eq!(
            r.add(WorkerSpec::regular("http://a:1"), Source::Api)
                .unwrap_err(),
            RegistryError::Duplicate("http://a:1".into())
        );
        let (added, removed) = r.sync(
            Source::RbgFile,
            &[
                WorkerSpec::regular("http://b:1"),
                WorkerSpec::regular("http://c:1"),
            ],
        );
        assert_eq!((added.len(), removed.len()), (2, 0));
        let (added, removed) = r.sync(Source::RbgFile, &[WorkerSpec::regular("http://c:1")]);
        assert_eq!((added.len(), removed.len()), (0, 1));
        assert_eq!(&*removed[0].url, "http://b:1");
        let urls: Vec<String> = r.snapshot().iter().map(|w| w.url.to_string()).collect();
        assert_eq!(urls, ["http://a:1", "http://c:1"]);
        assert!(r.remove("http://nope:1").is_err());
        let id = r.get("http://c:1").unwrap().id.clone();
        assert_eq!(&*r.remove(&id).unwrap()[0].url, "http://c:1");
        assert_eq!(url_host("http://[::1]:8000"), "::1");
        assert_eq!(url_host("http://10.1.2.3:8000"), "10.1.2.3");
    }
}
