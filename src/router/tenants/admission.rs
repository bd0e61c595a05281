//! Admission by tenant and class: each tenant's rates and concurrency cap first (429 with
//! `Retry-After` past them), then the service's capacity (`--max-concurrent-requests`): while it
//! is full, requests wait in their class's bounded queue, at most the class's TTL (503 past
//! either). A freed slot goes to the first class with requests waiting and, inside it, to the
//! tenant with the fewest requests of that class running for its weight (ties: the request
//! that came first), so that one tenant's flood cannot take a class from the others.
//!
//! The decisions are made under one lock by [`Core`], which takes `now` and is tested without a
//! runtime; [`Admission`] adds the waiting (a oneshot per queued request) and the
//! [`Ticket`] that holds a slot until the answer is sent, then settles its output tokens.

use super::table::{Limits, Table};
use crate::telemetry::{Family, Histogram, PromText};
use crate::token_bucket::Bucket;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

// The `/metrics` families this file writes, each declared once.
const CLASS_QUEUED: Family = Family::gauge(
    "rbgctl_router_class_queued",
    "Requests waiting in each priority class's queue.",
);
const CLASS_WAIT_SECONDS: Family = Family::histogram(
    "rbgctl_router_class_wait_seconds",
    "Time requests waited in their class's queue before a slot.",
);
const TENANT_REQUESTS_TOTAL: Family = Family::counter(
    "rbgctl_router_tenant_requests_total",
    "Each tenant's requests by outcome: admitted, or refused (rate, concurrency: 429; \
             queue_full, expired: 503).",
);
const TENANT_TOKENS_TOTAL: Family = Family::counter(
    "rbgctl_router_tenant_tokens_total",
    "Each tenant's tokens: prompt (counted on admission) and output (settled when the \
             answer ends).",
);

/// Tenants with series of their own in `/metrics`, in the file's order; the rest are summed
/// under `tenant="other"`, so that a large file cannot flood a Prometheus server.
pub const MAX_TENANT_SERIES: usize = 1000;

/// Why a request was not admitted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("tenant {tenant:?} is over its {what} rate; retry after {retry_after:?}")]
    OverRate {
        tenant: Arc<str>,
        what: &'static str,
        retry_after: Duration,
    },
    #[error("tenant {tenant:?} has {max} requests running or waiting, its max_concurrent")]
    OverConcurrency { tenant: Arc<str>, max: usize },
    #[error("the service is at capacity and class {class:?}'s queue of {size} is full")]
    QueueFull { class: Arc<str>, size: usize },
    #[error(
        "waited {ttl:?} in class {class:?}'s queue (its TTL) while the service was at capacity"
    )]
    Expired { class: Arc<str>, ttl: Duration },
    #[error("class {class:?} was removed from the tenants file while the request waited in it")]
    ClassRemoved { class: Arc<str> },
}

impl Refusal {
    /// 429 for a tenant over its own limits, 503 for a service that could not take it in time.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::OverRate { .. } | Refusal::OverConcurrency { .. } => 429,
            _ => 503,
        }
    }

    /// Whole seconds for `Retry-After` (at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            Refusal::OverRate { retry_after, .. } => {
                retry_after.as_secs_f64().ceil().max(1.0) as u64
            }
            _ => 1,
        }
    }

    /// The error code of the answer and of the metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::OverRate { .. } => "tenant_rate_limited",
            Refusal::OverConcurrency { .. } => "tenant_concurrency_limited",
            Refusal::QueueFull { .. } => "class_queue_full",
            Refusal::Expired { .. } => "class_queue_ttl_expired",
            Refusal::ClassRemoved { .. } => "class_removed",
        }
    }
}

/// One request asking in.
#[derive(Clone, Debug)]
pub struct Ask {
    /// Index into the table's tenants.
    pub tenant: usize,
    /// Index into the table's classes.
    pub class: usize,
    /// Prompt tokens, as the router counts them.
    pub prompt_tokens: u64,
}

/// What a tenant did, for `/metrics` and the status page.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantCounts {
    pub admitted: u64,
    pub refused_rate: u64,
    pub refused_concurrency: u64,
    pub refused_queue_full: u64,
    pub expired: u64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
}

impl TenantCounts {
    fn add(&mut self, o: &TenantCounts) {
        self.admitted += o.admitted;
        self.refused_rate += o.refused_rate;
        self.refused_concurrency += o.refused_concurrency;
        self.refused_queue_full += o.refused_queue_full;
        self.expired += o.expired;
        self.prompt_tokens += o.prompt_tokens;
        self.output_tokens += o.output_tokens;
    }
}

struct TenantState {
    name: Arc<str>,
    weight: f64,
    limits: Limits,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    running: usize,
    queued: usize,
    /// Running, by class name.
    running_in: Vec<(Arc<str>, usize)>,
    counts: TenantCounts,
}

impl TenantState {
    fn running_in(&self, class: &str) -> usize {
        self.running_in
            .iter()
            .find(|(c, _)| **c == *class)
            .map_or(0, |(_, n)| *n)
    }

    fn add_running(&mut self, class: &Arc<str>, delta: isize) {
        self.running = self.running.saturating_add_signed(delta);
        match self.running_in.iter_mut().find(|(c, _)| *c == *class) {
            Some((_, n)) => *n = n.saturating_add_signed(delta),
            None if delta > 0 => self.running_in.push((class.clone(), delta as usize)),
            None => {}
        }
    }

    fn idle(&self) -> bool {
        self.running == 0 && self.queued == 0
    }
}

fn bucket(rate: Option<super::table::Rate>, now: Instant) -> Option<Bucket> {
    rate.map(|r| Bucket::new(r.per_second, r.burst, now))
}

fn retune(b: &mut Option<Bucket>, rate: Option<super::table::Rate>, now: Instant) {
    match (b.as_mut(), rate) {
        (Some(b), Some(r)) => b.retune(r.per_second, r.burst, now),
        (_, r) => *b = bucket(r, now),
    }
}

struct Waiter {
    id: u64,
    tenant: Arc<str>,
    prompt_tokens: u64,
    since: Instant,
    tx: oneshot::Sender<()>,
}

struct ClassQueue {
    name: Arc<str>,
    size: usize,
    ttl: Duration,
    /// Its cap on running requests (its share for this replica).
    max_running: Option<usize>,
    running: usize,
    len: usize,
    /// Waiting requests by tenant, each in arrival order; a tenant leaves when it has none.
    by_tenant: Vec<(Arc<str>, VecDeque<Waiter>)>,
    /// Time waited by the requests that got a slot.
    waited: Histogram,
    granted: u64,
    expired: u64,
    refused_full: u64,
}

impl ClassQueue {
    fn new(c: &super::table::Class, replicas: usize) -> ClassQueue {
        let mut q = ClassQueue {
            name: c.name.clone(),
            size: 0,
            ttl: Duration::ZERO,
            max_running: None,
            running: 0,
            len: 0,
            by_tenant: Vec::new(),
            waited: Histogram::with_buckets(&WAIT_BUCKETS_S),
            granted: 0,
            expired: 0,
            refused_full: 0,
        };
        q.set(c, replicas);
        q
    }

    /// Takes `c`'s settings (its cap as this replica's share).
    fn set(&mut self, c: &super::table::Class, replicas: usize) {
        self.size = c.queue_size;
        self.ttl = c.ttl;
        self.max_running = c.max_running.map(|m| super::table::share_of(m, replicas));
    }

    /// Whether it may start another request (below its own cap).
    fn open(&self) -> bool {
        self.max_running.is_none_or(|m| self.running < m)
    }

    /// Takes waiter `id` out, if it still waits.
    fn remove(&mut self, id: u64) -> Option<Waiter> {
        for i in 0..self.by_tenant.len() {
            let q = &mut self.by_tenant[i].1;
            if let Some(pos) = q.iter().position(|w| w.id == id) {
                let w = q.remove(pos);
                if q.is_empty() {
                    self.by_tenant.swap_remove(i);
                }
                self.len -= 1;
                return w;
            }
        }
        None
    }
}

/// Upper bounds (seconds) of the queue-wait histograms.
const WAIT_BUCKETS_S: [f64; 10] = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// The decisions, made under one lock.
pub struct Core {
    /// Requests running at once, all tenants together (`None`: no bound, no queue).
    capacity: Option<usize>,
    /// The router replicas sharing each tenant's limits.
    replicas: usize,
    running: usize,
    queues: Vec<ClassQueue>,
    tenants: HashMap<Arc<str>, TenantState, foldhash::fast::RandomState>,
    /// The table the queues and limits were last made from (its address).
    table: usize,
    next_id: u64,
}

/// A queued request's turn: its id, and the class it waits in.
pub struct Queued {
    pub id: u64,
    pub class: Arc<str>,
    pub ttl: Duration,
    rx: oneshot::Receiver<()>,
}

/// What [`Core::ask`] decided.
pub enum Decision {
    Run { tenant: Arc<str>, class: Arc<str> },
    Wait(Queued),
}

impl Core {
    /// Admission for `capacity` requests running at once (`None`: no limit) over `replicas`
    /// router replicas.
    pub fn new(capacity: Option<usize>, replicas: usize) -> Core {
        Core {
            capacity,
            replicas: replicas.max(1),
            running: 0,
            queues: Vec::new(),
            tenants: HashMap::default(),
            table: 0,
            next_id: 0,
        }
    }

    /// Brings the queues and the tenants' limits in line with `table` when it is a new one:
    /// queues of classes that are gone are emptied (their requests answered 503), tenants
    /// that are gone and idle forgotten.
    fn sync(&mut self, table: &Arc<Table>, now: Instant) {
        let addr = Arc::as_ptr(table) as usize;
        if self.table == addr {
            return;
        }
        self.table = addr;
        let mut old: Vec<ClassQueue> = std::mem::take(&mut self.queues);
        for c in &table.classes {
            let q = match old.iter().position(|q| q.name == c.name) {
                Some(i) => {
                    let mut q = old.swap_remove(i);
                    q.set(c, self.replicas);
                    q
                }
                None => ClassQueue::new(c, self.replicas),
            };
            self.queues.push(q);
        }
        for q in old {
            // Their senders dropped: each waiter is told its class is gone.
            for (tenant, waiters) in q.by_tenant {
                if let Some(t) = self.tenants.get_mut(&tenant) {
                    t.queued -= waiters.len();
                }
            }
        }
        let replicas = self.replicas;
        self.tenants.retain(|name, st| match table.by_name(name) {
            Some(i) => {
                let t = &table.tenants[i];
                let limits = t.limits.share(replicas);
                retune(&mut st.requests, limits.requests, now);
                retune(&mut st.tokens, limits.tokens, now);
                st.limits = limits;
                st.weight = t.weight;
                true
            }
            None => !st.idle(),
        });
    }

    fn tenant_mut(&mut self, table: &Table, i: usize, now: Instant) -> &mut TenantState {
        let t = &table.tenants[i];
        let replicas = self.replicas;
        self.tenants.entry(t.name.clone()).or_insert_with(|| {
            let limits = t.limits.share(replicas);
            TenantState {
                name: t.name.clone(),
                weight: t.weight,
                requests: bucket(limits.requests, now),
                tokens: bucket(limits.tokens, now),
                limits,
                running: 0,
                queued: 0,
                running_in: Vec::new(),
                counts: TenantCounts::default(),
            }
        })
    }

    /// Decides on `ask` at `now`: run at once, wait in its class's queue, or refused.
    pub fn ask(
        &mut self,
        table: &Arc<Table>,
        ask: &Ask,
        now: Instant,
    ) -> Result<Decision, Refusal> {
        self.sync(table, now);
        let class = self.queues[ask.class].name.clone();
        let t = self.tenant_mut(table, ask.tenant, now);
        let tenant = t.name.clone();
        if let Some(max) = t.limits.max_concurrent {
            if t.running + t.queued >= max {
                t.counts.refused_concurrency += 1;
                return Err(Refusal::OverConcurrency { tenant, max });
            }
        }
        if let Some(wait) = t.requests.as_mut().and_then(|b| b.take_n(1.0, now)) {
            t.counts.refused_rate += 1;
            return Err(Refusal::OverRate {
                tenant,
                what: "request",
                retry_after: wait,
            });
        }
        if let Some(wait) = t
            .tokens
            .as_mut()
            .and_then(|b| b.take_n(ask.prompt_tokens as f64, now))
        {
            // The request token taken above is given back: this request does not go.
            Self::give_back(t, 0, now);
            t.counts.refused_rate += 1;
            return Err(Refusal::OverRate {
                tenant,
                what: "token",
                retry_after: wait,
            });
        }
        let free = self.capacity.is_none_or(|c| self.running < c) && self.queues[ask.class].open();
        let ahead = self.queues[..=ask.class]
            .iter()
            .any(|q| q.len > 0 && q.open());
        if free && !ahead {
            self.running += 1;
            self.queues[ask.class].running += 1;
            let t = self.tenants.get_mut(&tenant).expect("made above");
            t.add_running(&class, 1);
            t.counts.admitted += 1;
            t.counts.prompt_tokens += ask.prompt_tokens;
            return Ok(Decision::Run { tenant, class });
        }
        let q = &mut self.queues[ask.class];
        if q.len >= q.size {
            q.refused_full += 1;
            let size = q.size;
            let t = self.tenants.get_mut(&tenant).expect("made above");
            Self::give_back(t, ask.prompt_tokens, now);
            t.counts.refused_queue_full += 1;
            return Err(Refusal::QueueFull { class, size });
        }
        let (tx, rx) = oneshot::channel();
        self.next_id += 1;
        let id = self.next_id;
        let waiter = Waiter {
            id,
            tenant: tenant.clone(),
            prompt_tokens: ask.prompt_tokens,
            since: now,
            tx,
        };
        match q.by_tenant.iter_mut().find(|(n, _)| *n == tenant) {
            Some((_, w)) => w.push_back(waiter),
            None => q.by_tenant.push((tenant.clone(), VecDeque::from([waiter]))),
        }
        q.len += 1;
        let ttl = q.ttl;
        self.tenants.get_mut(&tenant).expect("made above").queued += 1;
        Ok(Decision::Wait(Queued { id, class, ttl, rx }))
    }

    /// A request refused after its tokens were taken gets them back.
    fn give_back(t: &mut TenantState, prompt_tokens: u64, now: Instant) {
        if let Some(b) = t.requests.as_mut() {
            b.settle(-1.0, now);
        }
        if let Some(b) = t.tokens.as_mut() {
            b.settle(-(prompt_tokens as f64), now);
        }
    }

    /// Takes waiter `id` of `class` out of its queue (its wait ended: TTL, or the client
    /// left). `false` when it is not there any more: it was given a slot meanwhile.
    pub fn leave(&mut self, class: &str, id: u64, expired: bool, now: Instant) -> bool {
        let Some(q) = self.queues.iter_mut().find(|q| *q.name == *class) else {
            return false;
        };
        let Some(w) = q.remove(id) else {
            return false;
        };
        if expired {
            q.expired += 1;
        }
        if let Some(t) = self.tenants.get_mut(&w.tenant) {
            t.queued -= 1;
            Self::give_back(t, w.prompt_tokens, now);
            if expired {
                t.counts.expired += 1;
            }
        }
        true
    }

    /// A running request of `tenant` in `class` ended, having produced `output_tokens`: its
    /// slot goes to the next request waiting.
    pub fn release(
        &mut self,
        tenant: &Arc<str>,
        class: &Arc<str>,
        output_tokens: u64,
        now: Instant,
    ) {
        self.running = self.running.saturating_sub(1);
        if let Some(q) = self.queues.iter_mut().find(|q| q.name == *class) {
            q.running = q.running.saturating_sub(1);
        }
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.add_running(class, -1);
            t.counts.output_tokens += output_tokens;
            if let Some(b) = t.tokens.as_mut() {
                b.settle(output_tokens as f64, now);
            }
        }
        self.grant(now);
    }

    /// Gives free slots to waiting requests: the first class with any, in it the tenant
    /// furthest below its weighted share.
    fn grant(&mut self, now: Instant) {
        while self.capacity.is_none_or(|c| self.running < c) {
            let Some(q) = self.queues.iter_mut().find(|q| q.len > 0 && q.open()) else {
                return;
            };
            let tenants = &mut self.tenants;
            let share = |name: &Arc<str>| {
                tenants
                    .get(name)
                    .map_or(0.0, |t| t.running_in(&q.name) as f64 / t.weight)
            };
            let pick = (0..q.by_tenant.len())
                .min_by(|&a, &b| {
                    let (ta, wa) = &q.by_tenant[a];
                    let (tb, wb) = &q.by_tenant[b];
                    share(ta)
                        .total_cmp(&share(tb))
                        .then(wa[0].id.cmp(&wb[0].id))
                })
                .expect("a queue with requests has a tenant");
            let w = q.by_tenant[pick].1.pop_front().expect("never empty");
            if q.by_tenant[pick].1.is_empty() {
                q.by_tenant.swap_remove(pick);
            }
            q.len -= 1;
            let Some(t) = tenants.get_mut(&w.tenant) else {
                continue;
            };
            t.queued -= 1;
            if w.tx.send(()).is_err() {
                // Its client left: the slot goes to the next.
                Self::give_back(t, w.prompt_tokens, now);
                continue;
            }
            t.add_running(&q.name, 1);
            t.counts.admitted += 1;
            t.counts.prompt_tokens += w.prompt_tokens;
            q.granted += 1;
            q.running += 1;
            q.waited.observe(now.saturating_duration_since(w.since));
            self.running += 1;
        }
    }

    /// Requests running now.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Requests waiting now, all classes together.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(|q| q.len).sum()
    }
}

/// A class's state, for the metrics and the status page.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassRow {
    pub name: Arc<str>,
    pub running: usize,
    pub max_running: Option<usize>,
    pub queued: usize,
    pub queue_size: usize,
    pub ttl: Duration,
    pub granted: u64,
    pub expired: u64,
    pub refused_full: u64,
}

/// A tenant's state, for the metrics and the status page.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantRow {
    pub name: Arc<str>,
    pub running: usize,
    pub queued: usize,
    pub counts: TenantCounts,
}

/// Admission with waiting: what the request path calls.
pub struct Admission {
    core: Mutex<Core>,
}

/// A slot held until the answer is sent; dropping it frees the slot and settles the output
/// tokens counted into it.
pub struct Ticket {
    admission: Arc<Admission>,
    tenant: Arc<str>,
    class: Arc<str>,
    output_tokens: AtomicU64,
}

impl Ticket {
    /// The tenant admitted.
    pub fn tenant(&self) -> &Arc<str> {
        &self.tenant
    }

    /// The priority class it was admitted in.
    pub fn class(&self) -> &Arc<str> {
        &self.class
    }

    /// Records the answer's output tokens (the largest count seen wins).
    pub fn output_tokens(&self, n: u64) {
        self.output_tokens.fetch_max(n, Ordering::Relaxed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let n = self.output_tokens.load(Ordering::Relaxed);
        self.admission
            .core
            .lock()
            .release(&self.tenant, &self.class, n, Instant::now());
    }
}

/// A queued request's place: given up (the client left) it leaves the queue, or, when a slot
/// was given to it at that moment, frees the slot again.
struct Waiting<'a> {
    admission: &'a Arc<Admission>,
    class: Arc<str>,
    tenant: Arc<str>,
    id: u64,
    rx: oneshot::Receiver<()>,
    done: bool,
}

impl Waiting<'_> {
    /// Under the core's lock, where the request stands: still waiting, given a slot, or its
    /// class gone (the sender dropped by a reload).
    fn granted(&mut self) -> bool {
        self.rx.try_recv().is_ok()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut core = self.admission.core.lock();
        let now = Instant::now();
        if !core.leave(&self.class, self.id, false, now) && self.granted() {
            core.release(&self.tenant, &self.class, 0, now);
        }
    }
}

impl Admission {
    /// Admission for `capacity` requests running at once (`None`: no limit) over `replicas`
    /// router replicas.
    pub fn new(capacity: Option<usize>, replicas: usize) -> Arc<Admission> {
        Arc::new(Admission {
            core: Mutex::new(Core::new(capacity, replicas)),
        })
    }

    /// Admits `ask` under `table`, waiting in its class's queue while the service is full.
    pub async fn admit(self: &Arc<Self>, table: &Arc<Table>, ask: &Ask) -> Result<Ticket, Refusal> {
        let decision = self.core.lock().ask(table, ask, Instant::now())?;
        let (tenant, class) = match decision {
            Decision::Run { tenant, class } => (tenant, class),
            Decision::Wait(q) => {
                let mut w = Waiting {
                    admission: self,
                    class: q.class.clone(),
                    tenant: table.tenants[ask.tenant].name.clone(),
                    id: q.id,
                    rx: q.rx,
                    done: false,
                };
                let outcome = tokio::time::timeout(q.ttl, &mut w.rx).await;
                w.done = true;
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err(Refusal::ClassRemoved { class: q.class }),
                    Err(_) => {
                        let mut core = self.core.lock();
                        if core.leave(&q.class, q.id, true, Instant::now()) {
                            return Err(Refusal::Expired {
                                class: q.class,
                                ttl: q.ttl,
                            });
                        }
                        // Out of the queue already: given a slot as its time ran out, or
                        // its class removed by a reload.
                        if !w.granted() {
                            return Err(Refusal::ClassRemoved { class: q.class });
                        }
                    }
                }
                (w.tenant.clone(), q.class)
            }
        };
        Ok(Ticket {
            admission: self.clone(),
            tenant,
            class,
            output_tokens: AtomicU64::new(0),
        })
    }

    /// Requests running and waiting now.
    pub fn load(&self) -> (usize, usize) {
        let c = self.core.lock();
        (c.running(), c.queued())
    }

    /// Each class's and each known tenant's state (tenants by name).
    pub fn rows(&self) -> (Vec<ClassRow>, Vec<TenantRow>) {
        let c = self.core.lock();
        let classes = c
            .queues
            .iter()
            .map(|q| ClassRow {
                name: q.name.clone(),
                running: q.running,
                max_running: q.max_running,
                queued: q.len,
                queue_size: q.size,
                ttl: q.ttl,
                granted: q.granted,
                expired: q.expired,
                refused_full: q.refused_full,
            })
            .collect();
        let mut tenants: Vec<TenantRow> = c
            .tenants
            .values()
            .map(|t| TenantRow {
                name: t.name.clone(),
                running: t.running,
                queued: t.queued,
                counts: t.counts.clone(),
            })
            .collect();
        tenants.sort_by(|a, b| a.name.cmp(&b.name));
        (classes, tenants)
    }

    /// The admission families of `/metrics`: per class and per tenant (at most
    /// [`MAX_TENANT_SERIES`] tenants by name, in `table`'s order, the rest as `other`).
    pub fn render(&self, table: &Table, p: &mut PromText) {
        let (classes, tenants) = self.rows();
        p.family(&CLASS_QUEUED);
        for c in &classes {
            p.sample(&CLASS_QUEUED, &[("class", &c.name)], c.queued as f64);
        }
        for (name, help, f) in [
            (
                "rbgctl_router_class_granted_total",
                "Requests of each class that got a slot after waiting.",
                (|c: &ClassRow| c.granted) as fn(&ClassRow) -> u64,
            ),
            (
                "rbgctl_router_class_expired_total",
                "Requests of each class answered 503 after waiting the class's TTL.",
                |c| c.expired,
            ),
            (
                "rbgctl_router_class_queue_full_total",
                "Requests of each class answered 503 because its queue was full.",
                |c| c.refused_full,
            ),
        ] {
            let family = Family::counter(name, help);
            p.family(&family);
            for c in &classes {
                p.sample(&family, &[("class", &c.name)], f(c) as f64);
            }
        }
        {
            let core = self.core.lock();
            for q in &core.queues {
                p.histogram(&CLASS_WAIT_SECONDS, &[("class", &q.name)], &q.waited);
            }
        }
        // Tenants named in the file within the first MAX_TENANT_SERIES; the rest summed.
        let named = |n: &str| table.by_name(n).is_some_and(|i| i < MAX_TENANT_SERIES);
        let (mut rows, rest): (Vec<TenantRow>, Vec<TenantRow>) =
            tenants.into_iter().partition(|t| named(&t.name));
        if !rest.is_empty() {
            let mut other = TenantRow {
                name: "other".into(),
                running: 0,
                queued: 0,
                counts: TenantCounts::default(),
            };
            for t in &rest {
                other.running += t.running;
                other.queued += t.queued;
                other.counts.add(&t.counts);
            }
            rows.push(other);
        }
        for (name, help, f) in [
            (
                "rbgctl_router_tenant_running",
                "Each tenant's requests holding a slot.",
                (|r: &TenantRow| r.running) as fn(&TenantRow) -> usize,
            ),
            (
                "rbgctl_router_tenant_queued",
                "Each tenant's requests waiting in a class's queue.",
                |r| r.queued,
            ),
        ] {
            let family = Family::gauge(name, help);
            p.family(&family);
            for r in &rows {
                p.sample(&family, &[("tenant", &r.name)], f(r) as f64);
            }
        }
        p.family(&TENANT_REQUESTS_TOTAL);
        for r in &rows {
            let c = &r.counts;
            for (outcome, n) in [
                ("admitted", c.admitted),
                ("rate", c.refused_rate),
                ("concurrency", c.refused_concurrency),
                ("queue_full", c.refused_queue_full),
                ("expired", c.expired),
            ] {
                p.sample(
                    &TENANT_REQUESTS_TOTAL,
                    &[("tenant", &r.name), ("outcome", outcome)],
                    n as f64,
                );
            }
        }
        p.family(&TENANT_TOKENS_TOTAL);
        for r in &rows {
            let c = &r.counts;
            for (kind, n) in [("prompt", c.prompt_tokens), ("output", c.output_tokens)] {
                p.sample(
                    &TENANT_TOKENS_TOTAL,
                    &[("tenant", &r.name), ("kind", kind)],
                    n as f64,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::key_entry;
    use super::*;

    fn table(extra: &str) -> Arc<Table> {
        let text = format!(
            "[[class]]\nname = \"interactive\"\nqueue_size = 2\nqueue_ttl_secs = 5\n\
             [[class]]\nname = \"batch\"\nqueue_size = 3\nqueue_ttl_secs = 5\n\
             [[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\nclasses = [\"interactive\", \"batch\"]\n\
             [[tenant]]\nname = \"b\"\nclasses = [\"batch\"]\n{extra}",
            key_entry("ka")
        );
        Arc::new(Table::parse(&text).unwrap())
    }

    fn ask(t: &Table, tenant: &str, class: &str) -> Ask {
        Ask {
            tenant: t.by_name(tenant).unwrap(),
            class: t.class_named(class).unwrap(),
            prompt_tokens: 10,
        }
    }

    fn run(d: Result<Decision, Refusal>) -> (Arc<str>, Arc<str>) {
        match d {
            Ok(Decision::Run { tenant, class }) => (tenant, class),
            Ok(Decision::Wait(_)) => panic!("queued"),
            Err(e) => panic!("refused: {e}"),
        }
    }

    fn wait(d: Result<Decision, Refusal>) -> Queued {
        match d {
            Ok(Decision::Wait(q)) => q,
            Ok(Decision::Run { .. }) => panic!("ran"),
            Err(e) => panic!("refused: {e}"),
        }
    }

    #[test]
    fn interactive_goes_before_batch_and_full_queues_refuse() {
        let t = table("");
        let now = Instant::now();
        let mut c = Core::new(Some(1), 1);
        let (ta, ca) = run(c.ask(&t, &ask(&t, "b", "batch"), now));
        let mut b1 = wait(c.ask(&t, &ask(&t, "b", "batch"), now));
        let mut i1 = wait(c.ask(&t, &ask(&t, "a", "interactive"), now));
        // The slot frees: interactive goes first, though batch came first.
        c.release(&ta, &ca, 0, now);
        assert!(i1.rx.try_recv().is_ok());
        assert!(b1.rx.try_recv().is_err());
        assert_eq!(c.running(), 1);
        c.release(&"a".into(), &"interactive".into(), 0, now);
        assert!(b1.rx.try_recv().is_ok());
        // Batch's queue of 3 fills; the fourth is refused with 503.
        let _held: Vec<Queued> = (0..3)
            .map(|_| wait(c.ask(&t, &ask(&t, "b", "batch"), now)))
            .collect();
        let e = c.ask(&t, &ask(&t, "b", "batch"), now).err().unwrap();
        assert_eq!(
            e,
            Refusal::QueueFull {
                class: "batch".into(),
                size: 3
            }
        );
        assert_eq!(e.status(), 503);
        // Interactive has its own queue.
        let _i = wait(c.ask(&t, &ask(&t, "a", "interactive"), now));
    }

    #[test]
    fn a_class_cap_keeps_the_rest_of_the_capacity_for_the_others() {
        let text = format!(
            "[[class]]\nname = \"interactive\"\n[[class]]\nname = \"batch\"\nmax_running = 2\n\
             [[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\nclasses = [\"interactive\", \"batch\"]\n",
            key_entry("ka")
        );
        let t = Arc::new(Table::parse(&text).unwrap());
        let now = Instant::now();
        let mut c = Core::new(Some(3), 1);
        let b1 = run(c.ask(&t, &ask(&t, "a", "batch"), now));
        run(c.ask(&t, &ask(&t, "a", "batch"), now));
        // Batch is at its cap of 2 though the capacity has room: the next batch one waits ...
        let mut bq = wait(c.ask(&t, &ask(&t, "a", "batch"), now));
        // ... while interactive takes the slot kept for it.
        let i1 = run(c.ask(&t, &ask(&t, "a", "interactive"), now));
        let mut iq = wait(c.ask(&t, &ask(&t, "a", "interactive"), now));
        // A batch slot frees: interactive's waiter goes first, then batch's on the next.
        c.release(&b1.0, &b1.1, 0, now);
        assert!(iq.rx.try_recv().is_ok());
        assert!(bq.rx.try_recv().is_err());
        c.release(&i1.0, &i1.1, 0, now);
        assert!(bq.rx.try_recv().is_ok());
        // Two routers share the cap: one each.
        let mut half = Core::new(Some(3), 2);
        run(half.ask(&t, &ask(&t, "a", "batch"), now));
        let _w = wait(half.ask(&t, &ask(&t, "a", "batch"), now));
    }

    #[test]
    fn a_freed_slot_goes_to_the_tenant_furthest_below_its_weighted_share() {
        let t = table("[[tenant]]\nname = \"c\"\nclasses = [\"batch\"]\nweight = 3\n");
        let now = Instant::now();
        let mut c = Core::new(Some(4), 1);
        // b holds all four slots, then floods the queue; c asks after.
        let held: Vec<_> = (0..4)
            .map(|_| run(c.ask(&t, &ask(&t, "b", "batch"), now)))
            .collect();
        let mut bq = wait(c.ask(&t, &ask(&t, "b", "batch"), now));
        let mut cq: Vec<Queued> = (0..2)
            .map(|_| wait(c.ask(&t, &ask(&t, "c", "batch"), now)))
            .collect();
        // c runs nothing: the slots go to c until c is at its share (3 of weight 3 vs 4 of 1).
        c.release(&held[0].0, &held[0].1, 0, now);
        assert!(cq[0].rx.try_recv().is_ok());
        c.release(&held[1].0, &held[1].1, 0, now);
        assert!(cq[1].rx.try_recv().is_ok());
        assert!(
            bq.rx.try_recv().is_err(),
            "b waits while c is below its share"
        );
        c.release(&held[2].0, &held[2].1, 0, now);
        assert!(bq.rx.try_recv().is_ok());
    }

    #[test]
    fn a_tenant_over_its_limits_is_refused_with_retry_after_and_gets_its_tokens_back() {
        let t = table(
            "[[tenant]]\nname = \"r\"\nrequests_per_second = 2\n\
             [[tenant]]\nname = \"k\"\ntokens_per_second = 100\n\
             [[tenant]]\nname = \"m\"\nmax_concurrent = 2\n",
        );
        let now = Instant::now();
        let mut c = Core::new(None, 1);
        for _ in 0..2 {
            run(c.ask(&t, &ask(&t, "r", "interactive"), now));
        }
        let e = c.ask(&t, &ask(&t, "r", "interactive"), now).err().unwrap();
        assert!(
            matches!(
                e,
                Refusal::OverRate {
                    what: "request",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!((e.status(), e.retry_after_secs()), (429, 1));
        run(c.ask(
            &t,
            &ask(&t, "r", "interactive"),
            now + Duration::from_millis(500),
        ));
        // Tokens: 100 a second, burst 100; 10 per prompt.
        let k = ask(&t, "k", "interactive");
        let (kt, kc) = run(c.ask(
            &t,
            &Ask {
                prompt_tokens: 90,
                ..k.clone()
            },
            now,
        ));
        run(c.ask(&t, &k, now));
        // The answer's 300 output tokens put the tenant 300 in debt: 3 s to wait.
        c.release(&kt, &kc, 300, now);
        let e = c.ask(&t, &k, now).err().unwrap();
        assert!(matches!(e, Refusal::OverRate { what: "token", .. }), "{e}");
        assert_eq!(e.retry_after_secs(), 4, "310 tokens short at 100 a second");
        // Concurrency: running and waiting count together.
        let m = ask(&t, "m", "interactive");
        let (mt, mc) = run(c.ask(&t, &m, now));
        run(c.ask(&t, &m, now));
        let e = c.ask(&t, &m, now).err().unwrap();
        assert_eq!(
            e,
            Refusal::OverConcurrency {
                tenant: "m".into(),
                max: 2
            }
        );
        c.release(&mt, &mc, 0, now);
        run(c.ask(&t, &m, now));
        let rows = c.tenants.get("m").unwrap().counts.clone();
        assert_eq!((rows.admitted, rows.refused_concurrency), (3, 1));
    }

    #[test]
    fn a_waiter_that_leaves_or_expires_frees_its_place_and_a_reload_keeps_the_rest() {
        let t = table("");
        let now = Instant::now();
        let mut c = Core::new(Some(1), 1);
        let (ta, ca) = run(c.ask(&t, &ask(&t, "a", "interactive"), now));
        let q1 = wait(c.ask(&t, &ask(&t, "a", "interactive"), now));
        let mut q2 = wait(c.ask(&t, &ask(&t, "a", "interactive"), now));
        assert!(c.leave("interactive", q1.id, true, now));
        assert_eq!(c.queued(), 1);
        assert!(!c.leave("interactive", q1.id, true, now), "only once");
        assert_eq!(c.tenants.get("a").unwrap().counts.expired, 1);
        // A reload that drops the batch class keeps interactive's waiters.
        let t2 = Arc::new(
            Table::parse(&format!(
                "[[class]]\nname = \"interactive\"\nqueue_size = 2\n\
                 [[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\n",
                key_entry("ka")
            ))
            .unwrap(),
        );
        let _ = c.ask(&t2, &ask(&t2, "a", "interactive"), now);
        c.release(&ta, &ca, 0, now);
        assert!(q2.rx.try_recv().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn queued_requests_wait_then_run_or_expire_with_503() {
        let t = table("");
        let adm = Admission::new(Some(1), 1);
        let held = adm.admit(&t, &ask(&t, "a", "interactive")).await.unwrap();
        assert_eq!(&**held.tenant(), "a");
        let (a2, t2) = (adm.clone(), t.clone());
        let waiter = tokio::spawn(async move {
            let ticket = a2.admit(&t2, &ask(&t2, "b", "batch")).await?;
            Ok::<_, Refusal>(ticket.class().clone())
        });
        tokio::task::yield_now().await;
        assert_eq!(adm.load(), (1, 1));
        held.output_tokens(7);
        drop(held);
        assert_eq!(&*waiter.await.unwrap().unwrap(), "batch");
        assert_eq!(
            adm.load(),
            (0, 0),
            "the waiter's ticket was dropped with its task"
        );
        // Held past the TTL: 503.
        let held = adm.admit(&t, &ask(&t, "a", "interactive")).await.unwrap();
        let e = adm
            .admit(&t, &ask(&t, "a", "interactive"))
            .await
            .err()
            .unwrap();
        assert_eq!(
            e,
            Refusal::Expired {
                class: "interactive".into(),
                ttl: Duration::from_secs(5)
            }
        );
        assert_eq!(e.status(), 503);
        // A waiter dropped before its turn leaves the queue.
        let (a3, t3) = (adm.clone(), t.clone());
        let gone =
            tokio::spawn(async move { a3.admit(&t3, &ask(&t3, "a", "interactive")).await.is_ok() });
        tokio::task::yield_now().await;
        assert_eq!(adm.load(), (1, 1));
        gone.abort();
        let _ = gone.await;
        assert_eq!(adm.load(), (1, 0));
        drop(held);
        let (_, tenants) = adm.rows();
        let a = tenants.iter().find(|r| &*r.name == "a").unwrap();
        assert_eq!((a.counts.admitted, a.counts.expired), (2, 1));
        let b = tenants.iter().find(|r| &*r.name == "b").unwrap();
        assert_eq!(b.counts.output_tokens, 0);
        let a_out = a.counts.output_tokens;
        assert_eq!(a_out, 7);
        let mut p = PromText::new();
        adm.render(&t, &mut p);
        let text = p.finish();
        assert!(
            text.contains(
                "rbgctl_router_tenant_requests_total{tenant=\"a\",outcome=\"expired\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("rbgctl_router_class_expired_total{class=\"interactive\"} 1"),
            "{text}"
        );
    }
}
