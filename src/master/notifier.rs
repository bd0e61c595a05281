//! Delivers the master's forgets to the stores and renews their read leases.
//!
//! When an object's record must go (replaced, removed, evicted, revoked), the store that holds it
//! drops the record, so that a restarted master does not bring the object back and a client
//! that cached the object's location is told to ask the master. Each delivery (`FORGET_LEASE`)
//! also extends the store's read lease: how long it may answer reads of cached locations. A
//! store is renewed only by a request that carries every forget it is owed, so a store the
//! master cannot reach keeps stale records only until its lease runs out.
//!
//! One thread drains the outbox whenever it is woken (after a remove) or every 20 ms, and renews
//! idle stores every quarter lease. Forgets a live store did not take are kept and sent again.
//! A remove or replace waits (`settle`) until its forgets are delivered, or, when a store could
//! not be reached, until that store's lease has run out.

use super::lock::StateLock;
use crate::shutdown::Shutdown;
use crate::transfer::message::{ForgetItem, ForgetLeaseReq, ForgetReq};
use crate::transfer::{ConnOptions, Opcode, Pool, Status, TransferError};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Forgets per request.
const CHUNK: usize = 16_384;
const TICK: Duration = Duration::from_millis(20);
/// Most forgets kept for one store that does not take them; past it the store's lease is no
/// longer renewed (until it mounts again), since what it was owed is lost.
const BACKLOG_LIMIT: usize = 1 << 20;

/// One store endpoint as the notifier sees it.
struct Endpoint {
    pool: Arc<Pool>,
    /// Forgets not yet taken, in order.
    backlog: Vec<ForgetItem>,
    /// When the store last acknowledged a renewal: its lease runs out by this plus the lease.
    renewed: Option<Instant>,
    last_sent: Option<Instant>,
    /// The store answered `UNKNOWN_OPCODE` to `FORGET_LEASE`: it predates cached locations and
    /// gets plain `FORGET`s.
    legacy: bool,
    /// Forgets were lost (backlog overflow): never renewed again.
    poisoned: bool,
    /// The last delivery failed: the next try waits a renewal period.
    failing: bool,
}

#[derive(Default)]
struct Delivered {
    /// Highest outbox sequence number delivered (or given up on).
    seq: u64,
    /// Until when some store may still answer a cached location that the master has retired
    /// (it could not be told): the latest such lease end seen.
    stale_until: Option<Instant>,
}

pub struct Notifier {
    state: Arc<StateLock>,
    /// Only a leader (or a master without HA) tells stores anything.
    leadership: Arc<crate::ha::lease::Leadership>,
    lease: Duration,
    delivered: Mutex<Delivered>,
    delivered_cv: Condvar,
    wake: Mutex<bool>,
    wake_cv: Condvar,
    endpoints: Mutex<HashMap<String, Endpoint>>,
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub renewals: AtomicU64,
}

impl Notifier {
    /// `lease`: the stores' read lease (0: never renewed, cached locations off).
    pub fn new(
        state: Arc<StateLock>,
        leadership: Arc<crate::ha::lease::Leadership>,
        lease: Duration,
    ) -> Arc<Notifier> {
        Arc::new(Notifier {
            state,
            leadership,
            lease,
            delivered: Mutex::new(Delivered::default()),
            delivered_cv: Condvar::new(),
            wake: Mutex::new(false),
            wake_cv: Condvar::new(),
            endpoints: Mutex::new(HashMap::new()),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
        })
    }

    /// Starts the delivery thread; it delivers what is queued and returns once `shutdown` fires.
    pub fn spawn(self: &Arc<Self>, shutdown: Shutdown) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("master-notifier".into())
            .spawn(move || {
                while !shutdown.is_triggered() {
                    {
                        let mut w = me.wake.lock();
                        if !*w {
                            me.wake_cv.wait_for(&mut w, TICK);
                        }
                        *w = false;
                    }
                    if me.leadership.check(Instant::now()).is_ok() {
                        me.flush();
                    }
                }
            })
    }

    /// Forgets everything owed (the master's state was reset: it was elected or deposed).
    pub fn reset(&self) {
        self.endpoints.lock().clear();
        *self.delivered.lock() = Delivered::default();
        self.delivered_cv.notify_all();
    }

    pub fn wake(&self) {
        *self.wake.lock() = true;
        self.wake_cv.notify_one();
    }

    /// Waits until no store can serve a location retired up to outbox sequence `seq` any more:
    /// the forgets are delivered (waited for at most `timeout`), and where a store could not
    /// be told, its read lease has run out.
    pub fn settle(&self, seq: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let stale_until = {
            let mut d = self.delivered.lock();
            while d.seq < seq {
                if self.delivered_cv.wait_until(&mut d, deadline).timed_out() {
                    break;
                }
            }
            if d.seq < seq {
                // Still undelivered: any store's lease runs out within one lease from now.
                Some(Instant::now() + self.lease)
            } else {
                d.stale_until
            }
        };
        if let Some(until) = stale_until {
            let now = Instant::now();
            if until > now {
                tracing::debug!(
                    wait_ms = (until - now).as_millis() as u64,
                    "a store could not be told of a removal; waiting for its read lease to end"
                );
                std::thread::sleep(until - now);
            }
        }
    }

    /// Drains the outbox once, sends every store its forgets, and renews idle stores' leases.
    pub fn flush(&self) {
        let outbox = self.state.lock().take_outbox();
        let mut stale_until: Option<Instant> = None;
        let mut later = |t: Instant| stale_until = Some(stale_until.map_or(t, |s| s.max(t)));
        {
            let mut endpoints = self.endpoints.lock();
            // Stores no longer live (gone, away, recovering) are forgotten here once their
            // forgets are out; a store that mounts again starts afresh.
            for ep in &outbox.unreachable {
                if let Some(renewed) = endpoints.get(ep).and_then(|e| e.renewed) {
                    later(renewed + self.lease);
                }
            }
            endpoints.retain(|ep, e| {
                let keep = outbox.live.contains(ep) || outbox.forgets.contains_key(ep);
                if !keep {
                    if let Some(renewed) = e.renewed {
                        later(renewed + self.lease);
                    }
                }
                keep
            });
            for (ep, items) in outbox.forgets {
                let e = endpoints
                    .entry(ep.clone())
                    .or_insert_with(|| Endpoint::new(&ep));
                e.backlog.extend(items);
                if e.backlog.len() > BACKLOG_LIMIT {
                    tracing::error!(store = %ep, forgets = e.backlog.len(),
                        "a store has not taken its forgets for too long; it will serve no cached locations until it mounts again");
                    e.backlog.clear();
                    e.poisoned = true;
                }
            }
            for ep in &outbox.live {
                endpoints
                    .entry(ep.clone())
                    .or_insert_with(|| Endpoint::new(ep));
            }
            let renew_every = self.lease / 4;
            for (ep, e) in endpoints.iter_mut() {
                let live = outbox.live.contains(ep);
                let waited = e.last_sent.is_none_or(|t| t.elapsed() >= renew_every);
                let due = live && !self.lease.is_zero() && !e.poisoned && waited;
                if (e.backlog.is_empty() && !due) || (e.failing && !waited) {
                    continue;
                }
                let lease = if live && !e.poisoned {
                    self.lease
                } else {
                    Duration::ZERO
                };
                let result = self.deliver(e, lease);
                e.failing = result.is_err();
                match result {
                    Ok(()) => {}
                    Err(err) => {
                        self.failed
                            .fetch_add(e.backlog.len().max(1) as u64, Ordering::Relaxed);
                        e.pool.clear();
                        tracing::debug!(store = %ep, error = %err, "cannot deliver forgets; keeping them");
                        if let Some(renewed) = e.renewed {
                            later(renewed + self.lease);
                        }
                    }
                }
            }
        }
        self.state
            .lock()
            .forgets_delivered(outbox.seq, Instant::now());
        let mut d = self.delivered.lock();
        d.seq = d.seq.max(outbox.seq);
        d.stale_until = match (d.stale_until, stale_until) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.delivered_cv.notify_all();
    }

    /// Sends `e` its whole backlog, the last request extending its lease by `lease` (0: not
    /// at all). The backlog is emptied only once the store took all of it.
    fn deliver(&self, e: &mut Endpoint, lease: Duration) -> Result<(), TransferError> {
        e.last_sent = Some(Instant::now());
        let mut chunks: Vec<&[ForgetItem]> = e.backlog.chunks(CHUNK).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let lease_ms = if i == last {
                lease.as_millis() as u64
            } else {
                0
            };
            if !e.legacy {
                let req = ForgetLeaseReq {
                    items: chunk.to_vec(),
                    lease_ms,
                };
                match e.pool.with(|c| c.call::<_, ()>(Opcode::ForgetLease, &req)) {
                    Ok(()) => {}
                    Err(err) if err.status() == Some(Status::UnknownOpcode) => {
                        tracing::info!(store = %e.pool.addr(), "the store does not know FORGET_LEASE; sending it FORGET (no cached locations there)");
                        e.legacy = true;
                    }
                    Err(err) => return Err(err),
                }
            }
            if e.legacy && !chunk.is_empty() {
                let req = ForgetReq {
                    items: chunk.to_vec(),
                };
                e.pool.with(|c| c.call::<_, ()>(Opcode::Forget, &req))?;
            }
        }
        self.sent
            .fetch_add(e.backlog.len() as u64, Ordering::Relaxed);
        e.backlog.clear();
        if !lease.is_zero() && !e.legacy {
            e.renewed = Some(Instant::now());
            self.renewals.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Endpoint {
    fn new(endpoint: &str) -> Endpoint {
        Endpoint {
            pool: Arc::new(Pool::new(
                endpoint.to_string(),
                ConnOptions {
                    connect_timeout: Duration::from_secs(1),
                    io_timeout: Duration::from_secs(2),
                    spin: Duration::ZERO,
                },
            )),
            backlog: Vec::new(),
            renewed: None,
            last_sent: None,
            legacy: false,
            poisoned: false,
            failing: false,
        }
    }
}
