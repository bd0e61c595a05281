//! Carries out the master's moves between tiers (`tiering.rs`): takes the queued ones, sends
//! each store its `MOVE`s (stores in parallel, each store's in order, a bounded number of bytes
//! per request) and reports every outcome back to the state machine as it comes, so memory is
//! freed while a long queue drains. A store that does not answer fails its moves: the objects
//! stay where they were.

use super::doorbell::Doorbell;
use super::lock::StateLock;
use super::state::MoveJob;
use super::store_pools::StorePools;
use crate::shutdown::Shutdown;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{MoveItem, MoveReq};
use crate::transfer::rpc;
use crate::transfer::{Pool, Status};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often queued moves are looked for when nobody said so: a safety net, since operations
/// that queue moves wake the mover, and so does the housekeeper's tick while any are queued;
/// rarely, so that an idle master stays idle.
const TICK: Duration = Duration::from_secs(1);
/// Most bytes copied per `MOVE` request: small enough that memory is freed as a long queue
/// drains, large enough that a request's round trip is small beside its copying.
const REQUEST_BYTES: u64 = 8 << 20;
/// Most items per `MOVE` request.
const REQUEST_ITEMS: usize = 256;
/// Requests in flight to one store at once.
const STREAMS: usize = 2;

/// The thread that carries out the master's moves between tiers.
pub struct Mover {
    state: Arc<StateLock>,
    leadership: Arc<crate::ha::lease::Leadership>,
    /// The cluster secret, proven on each connection to a store.
    /// Connections to the stores, proving the cluster secret.
    stores: StorePools,
    /// Set (and signalled) when moves were queued.
    /// Rung when there is work.
    bell: Doorbell,
    /// Counts batches of outcomes reported; signalled with each.
    reported: Mutex<u64>,
    reported_cv: Condvar,
    /// Moves sent, and those that failed (no answer, or refused).
    pub sent: AtomicU64,
    pub failed: AtomicU64,
}

/// `items` cut into requests of at most `REQUEST_BYTES` (at least one item each) and
/// `REQUEST_ITEMS`.
fn requests(items: Vec<MoveItem>) -> Vec<Vec<MoveItem>> {
    let mut out: Vec<Vec<MoveItem>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let full = out
            .last()
            .is_none_or(|r| r.len() >= REQUEST_ITEMS || bytes + item.size > REQUEST_BYTES);
        if full {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += item.size;
        if let Some(r) = out.last_mut() {
            r.push(item);
        }
    }
    out
}

impl Mover {
    /// `auth`: the cluster secret its connections to stores prove.
    pub fn new(
        state: Arc<StateLock>,
        leadership: Arc<crate::ha::lease::Leadership>,
        auth: Option<Arc<crate::auth::Secret>>,
    ) -> Arc<Mover> {
        Arc::new(Mover {
            state,
            leadership,
            stores: StorePools::new(auth, Duration::from_secs(10)),
            bell: Doorbell::default(),
            reported: Mutex::new(0),
            reported_cv: Condvar::new(),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// Starts the mover's thread; it returns once `shutdown` fires.
    pub fn spawn(self: &Arc<Self>, shutdown: Shutdown) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("master-mover".into())
            .spawn(move || {
                while !shutdown.is_triggered() {
                    if me.leadership.check(Instant::now()).is_ok() {
                        me.run_once();
                    }
                    me.bell.wait(TICK);
                }
            })
    }

    /// Moves were queued: send them now rather than at the next tick.
    pub fn wake(&self) {
        self.bell.ring();
    }

    /// Waits until the next outcomes are reported, or `deadline`; false when it passed.
    pub fn wait_reported(&self, deadline: Instant) -> bool {
        let mut n = self.reported.lock();
        let seen = *n;
        while *n == seen {
            if self.reported_cv.wait_until(&mut n, deadline).timed_out() {
                return *n != seen;
            }
        }
        true
    }

    /// Sends every queued move and reports the outcomes; returns how many were sent.
    pub fn run_once(&self) -> usize {
        let jobs = self.state.lock().take_moves(Instant::now());
        let total = jobs.iter().map(|j| j.items.len()).sum();
        if total == 0 {
            return 0;
        }
        std::thread::scope(|scope| {
            for job in jobs {
                scope.spawn(move || self.send(job));
            }
        });
        total
    }

    /// Sends a store its moves over `STREAMS` connections at once, so that one request's
    /// disk I/O overlaps another's copying.
    fn send(&self, job: MoveJob) {
        let pool = self.stores.get(&job.endpoint);
        let mut streams: Vec<Vec<Vec<MoveItem>>> = (0..STREAMS).map(|_| Vec::new()).collect();
        for (i, r) in requests(job.items).into_iter().enumerate() {
            streams[i % STREAMS].push(r);
        }
        let (endpoint, key) = (job.endpoint.as_str(), &job.key);
        std::thread::scope(|scope| {
            for requests in streams.into_iter().filter(|s| !s.is_empty()) {
                let pool = &pool;
                scope.spawn(move || self.send_stream(endpoint, key, pool, requests));
            }
        });
    }

    fn send_stream(
        &self,
        endpoint: &str,
        key: &GrantKey,
        pool: &Pool,
        requests: Vec<Vec<MoveItem>>,
    ) {
        for items in requests {
            let req = MoveReq { items };
            let order = |c: &mut crate::transfer::Connection| c.order::<rpc::Move>(key, &req);
            let statuses = match pool.with(order) {
                Ok(r) if r.items.len() == req.items.len() => r.items,
                Ok(r) => {
                    tracing::warn!(
                        store = endpoint,
                        sent = req.items.len(),
                        answered = r.items.len(),
                        "a store answered a different number of moves than it was sent"
                    );
                    vec![Status::Internal; req.items.len()]
                }
                Err(e) => {
                    tracing::warn!(store = endpoint, error = %e, moves = req.items.len(),
                        "moves between tiers failed");
                    pool.clear();
                    vec![Status::Internal; req.items.len()]
                }
            };
            let failed = statuses.iter().filter(|s| **s != Status::Ok).count();
            self.sent
                .fetch_add(req.items.len() as u64, Ordering::Relaxed);
            self.failed.fetch_add(failed as u64, Ordering::Relaxed);
            let results: Vec<(u64, Status)> =
                req.items.iter().map(|m| m.version).zip(statuses).collect();
            self.state.lock().moved(&results, Instant::now());
            *self.reported.lock() += 1;
            self.reported_cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_are_cut_into_bounded_requests() {
        let item = |size| MoveItem {
            size,
            ..MoveItem::default()
        };
        let sizes = |r: &Vec<Vec<MoveItem>>| -> Vec<usize> { r.iter().map(Vec::len).collect() };
        assert!(requests(Vec::new()).is_empty());
        let r = requests(vec![item(20 << 20), item(20 << 20), item(1)]);
        assert_eq!(sizes(&r), [1, 1, 1], "8 MiB a request");
        let r = requests(vec![item(5 << 20), item(3 << 20), item(1)]);
        assert_eq!(sizes(&r), [2, 1]);
        let r = requests(vec![item(64 << 20), item(1)]);
        assert_eq!(sizes(&r), [1, 1], "a large item goes alone");
        let r = requests((0..600).map(|_| item(1)).collect());
        assert_eq!(sizes(&r), [256, 256, 88]);
    }
}
