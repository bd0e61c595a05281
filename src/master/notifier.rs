//! Delivers the master's forgets to the stores, and grants their read leases.
//!
//! When an object's record must go (replaced, removed, evicted, revoked), the store that holds it
//! drops the record, so that a restarted master does not bring the object back and a client
//! that cached the object's location is told to ask the master.
//!
//! A store answers reads of cached locations only while it holds a read lease, which it asks
//! for (`LEASE`) with each heartbeat and counts from when it sent the request: however late an
//! answer arrives, the store's lease ends no later than the master thinks. The master grants
//! one only to a live segment whose store has taken every forget queued for it (`grant`), so a
//! store the master cannot reach keeps stale records only until its last lease runs out.
//!
//! One thread drains the outbox whenever it is woken: by a remove or replace, and by the
//! housekeeper when its tick finds forgets queued (an eviction's). Forgets a live store did not
//! take are kept and sent again every 20 ms (a store that failed, every quarter lease); with
//! nothing owed to anyone the thread sleeps until woken (at most a second), so an idle master
//! does not wake it 50 times a second. A remove or replace waits (`settle`) until
//! its forgets are delivered, or, when a store could not be reached, until that store's last
//! lease has run out.

use super::doorbell::Doorbell;
use super::lock::StateLock;
use crate::shutdown::Shutdown;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{ForgetItem, ForgetReq};
use crate::transfer::rpc;
use crate::transfer::{ConnOptions, Pool, TransferError};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Forgets per request.
const CHUNK: usize = 16_384;
/// How soon the thread goes again while a store still has forgets to take.
const RETRY: Duration = Duration::from_millis(20);
/// Longest sleep with nothing owed: a safety net, since whatever queues forgets wakes it.
const IDLE: Duration = Duration::from_secs(1);
/// Most forgets kept for one store that does not take them; past it the store is granted no
/// lease (until it mounts again), since what it was owed is lost.
const BACKLOG_LIMIT: usize = 1 << 20;

/// One store endpoint as the notifier sees it.
struct Endpoint {
    pool: Arc<Pool>,
    /// The store's grant key, as its last mount gave it: forgets are orders tagged with it.
    key: Option<Arc<GrantKey>>,
    /// Forgets not yet taken, in order.
    backlog: Vec<ForgetItem>,
    last_sent: Option<Instant>,
    /// The last delivery failed: the next try waits a quarter lease.
    failing: bool,
}

/// What read leases depend on, by store endpoint. Never locked while the state lock is taken
/// inside it, nor across network I/O.
#[derive(Default)]
struct LeaseBook {
    /// The outbox sequence number up to which the store took every forget queued for it.
    taken: HashMap<String, u64>,
    /// When the master last granted the store a lease: the store's lease ends by this plus
    /// the lease.
    granted: HashMap<String, Instant>,
    /// Stores whose forgets were lost (backlog overflow): granted nothing until they mount
    /// again.
    poisoned: HashSet<String>,
    /// Until when a lease granted by a master before this one (before a restart, or the
    /// previous leader) may run.
    inherited_until: Option<Instant>,
}

#[derive(Default)]
struct Delivered {
    /// Highest outbox sequence number delivered (or given up on).
    seq: u64,
    /// Until when some store may still answer a cached location that the master has retired
    /// (it could not be told): the latest such lease end seen.
    stale_until: Option<Instant>,
}

/// Delivers forgets to the stores and grants their read leases.
pub struct Notifier {
    state: Arc<StateLock>,
    /// Only a leader (or a master without HA) tells stores anything.
    leadership: Arc<crate::ha::lease::Leadership>,
    lease: Duration,
    delivered: Mutex<Delivered>,
    delivered_cv: Condvar,
    /// Rung when there is work.
    bell: Doorbell,
    endpoints: Mutex<HashMap<String, Endpoint>>,
    book: Mutex<LeaseBook>,
    /// The cluster secret, proven on each connection to a store.
    auth: Option<Arc<crate::auth::Secret>>,
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub granted: AtomicU64,
    pub refused: AtomicU64,
}

impl Notifier {
    /// `lease`: the stores' read lease (0: never granted, cached locations off); `auth`: the
    /// cluster secret its connections to stores prove.
    pub fn new(
        state: Arc<StateLock>,
        leadership: Arc<crate::ha::lease::Leadership>,
        lease: Duration,
        auth: Option<Arc<crate::auth::Secret>>,
    ) -> Arc<Notifier> {
        Arc::new(Notifier {
            state,
            leadership,
            lease,
            delivered: Mutex::new(Delivered::default()),
            delivered_cv: Condvar::new(),
            bell: Doorbell::default(),
            endpoints: Mutex::new(HashMap::new()),
            auth,
            book: Mutex::new(LeaseBook {
                inherited_until: Some(Instant::now() + lease),
                ..LeaseBook::default()
            }),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// Starts the delivery thread; it delivers what is queued and returns once `shutdown` fires.
    pub fn spawn(self: &Arc<Self>, shutdown: Shutdown) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("master-notifier".into())
            .spawn(move || {
                let mut owed = false;
                while !shutdown.is_triggered() {
                    me.bell.wait(if owed { RETRY } else { IDLE });
                    owed = me.leadership.check(Instant::now()).is_ok() && me.flush();
                }
            })
    }

    /// Forgets everything owed (the master's state was reset: it was elected or deposed).
    /// Grants stay, and any store may hold a lease from the previous leader for one more
    /// lease.
    pub fn reset(&self) {
        self.endpoints.lock().clear();
        {
            let mut book = self.book.lock();
            book.taken.clear();
            book.poisoned.clear();
            book.inherited_until = Some(Instant::now() + self.lease);
        }
        *self.delivered.lock() = Delivered::default();
        self.delivered_cv.notify_all();
    }

    /// A read lease for the store at `endpoint`, which is owed every forget up to outbox
    /// sequence number `owed` (`MasterState::lease_terms`; the caller holds the state lock, so
    /// no forget is queued meanwhile). Returns the lease, or zero when the store has not
    /// taken all it is owed. The grant is recorded before it is answered.
    pub fn grant(&self, endpoint: &str, owed: u64, now: Instant) -> Duration {
        if self.lease.is_zero() {
            return Duration::ZERO;
        }
        let mut book = self.book.lock();
        let taken = book.taken.get(endpoint).copied().unwrap_or(0);
        if taken < owed || book.poisoned.contains(endpoint) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Duration::ZERO;
        }
        book.granted.insert(endpoint.to_string(), now);
        self.granted.fetch_add(1, Ordering::Relaxed);
        self.lease
    }

    /// Whether every store in `endpoints` has taken all forgets up to outbox sequence number
    /// `seq` (so none of them can report a removed or replaced version to a master that
    /// restarts).
    pub fn taken_by_all(&self, endpoints: &[String], seq: u64) -> bool {
        let book = self.book.lock();
        endpoints
            .iter()
            .all(|ep| book.taken.get(ep).is_some_and(|t| *t >= seq))
    }

    /// When the last lease granted to `endpoint` (by this master or, as far as it can tell,
    /// one before it) ends.
    fn lease_end(&self, endpoint: &str) -> Option<Instant> {
        let book = self.book.lock();
        let granted = book.granted.get(endpoint).map(|g| *g + self.lease);
        granted.max(book.inherited_until)
    }

    /// Has the notifier send what is queued now.
    pub fn wake(&self) {
        self.bell.ring();
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

    /// Drains the outbox once and sends every store its forgets; returns whether a store still
    /// has some to take (so the thread goes again soon).
    pub fn flush(&self) -> bool {
        let outbox = self.state.lock().take_outbox();
        let mut stale_until: Option<Instant> = None;
        let mut later = |t: Option<Instant>| {
            if let Some(t) = t {
                stale_until = Some(stale_until.map_or(t, |s| s.max(t)));
            }
        };
        let mut taken = Vec::new();
        let owed;
        {
            let mut endpoints = self.endpoints.lock();
            // Stores no longer live (gone, away, recovering) are forgotten here once their
            // forgets are out; a store that mounts again starts afresh.
            for ep in &outbox.unreachable {
                later(self.lease_end(ep));
            }
            endpoints.retain(|ep, _| {
                let keep = outbox.live.contains(ep) || outbox.forgets.contains_key(ep);
                if !keep {
                    later(self.lease_end(ep));
                    let mut book = self.book.lock();
                    book.taken.remove(ep);
                    book.poisoned.remove(ep);
                }
                keep
            });
            for (ep, items) in outbox.forgets {
                let e = endpoints
                    .entry(ep.clone())
                    .or_insert_with(|| Endpoint::new(&ep, &self.auth));
                e.backlog.extend(items);
                if e.backlog.len() > BACKLOG_LIMIT {
                    tracing::error!(store = %ep, forgets = e.backlog.len(),
                        "a store has not taken its forgets for too long; it will serve no cached locations until it mounts again");
                    e.backlog.clear();
                    self.book.lock().poisoned.insert(ep.clone());
                }
            }
            for ep in &outbox.live {
                endpoints
                    .entry(ep.clone())
                    .or_insert_with(|| Endpoint::new(ep, &self.auth));
            }
            for (ep, e) in endpoints.iter_mut() {
                if let Some(key) = outbox.keys.get(ep) {
                    e.key = Some(key.clone());
                }
            }
            let retry_every = self.lease / 4;
            for (ep, e) in endpoints.iter_mut() {
                let waited = e.last_sent.is_none_or(|t| t.elapsed() >= retry_every);
                if e.backlog.is_empty() {
                    taken.push(ep.clone());
                    continue;
                }
                if e.failing && !waited {
                    // Not tried this time: what it is owed waits, so its lease must run out.
                    later(self.lease_end(ep));
                    continue;
                }
                let result = self.deliver(e);
                e.failing = result.is_err();
                match result {
                    Ok(()) => taken.push(ep.clone()),
                    Err(err) => {
                        self.failed
                            .fetch_add(e.backlog.len().max(1) as u64, Ordering::Relaxed);
                        e.pool.clear();
                        tracing::debug!(store = %ep, error = %err, "cannot deliver forgets; keeping them");
                        later(self.lease_end(ep));
                    }
                }
            }
            owed = endpoints.values().any(|e| !e.backlog.is_empty());
        }
        {
            // Every store with nothing left in its backlog took all it was owed up to here.
            let mut book = self.book.lock();
            for ep in taken {
                let t = book.taken.entry(ep).or_default();
                *t = (*t).max(outbox.seq);
            }
            let (now, lease) = (Instant::now(), self.lease);
            book.granted.retain(|_, g| *g + lease > now);
        }
        self.state.lock().forgets_delivered(Instant::now());
        let mut d = self.delivered.lock();
        d.seq = d.seq.max(outbox.seq);
        d.stale_until = match (d.stale_until, stale_until) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.delivered_cv.notify_all();
        owed
    }

    /// Sends `e` its whole backlog; it is emptied only once the store took all of it.
    fn deliver(&self, e: &mut Endpoint) -> Result<(), TransferError> {
        e.last_sent = Some(Instant::now());
        let Some(key) = &e.key else {
            return Err(TransferError::Protocol(
                "no grant key for this store: it has not mounted with this master".into(),
            ));
        };
        for chunk in e.backlog.chunks(CHUNK) {
            let req = ForgetReq {
                items: chunk.to_vec(),
            };
            e.pool.with(|c| c.order::<rpc::Forget>(key, &req))?;
        }
        self.sent
            .fetch_add(e.backlog.len() as u64, Ordering::Relaxed);
        e.backlog.clear();
        Ok(())
    }
}

impl Endpoint {
    fn new(endpoint: &str, auth: &Option<Arc<crate::auth::Secret>>) -> Endpoint {
        Endpoint {
            pool: Arc::new(Pool::new(
                endpoint.to_string(),
                ConnOptions {
                    connect_timeout: Duration::from_secs(1),
                    io_timeout: Duration::from_secs(2),
                    spin: Duration::ZERO,
                    auth: auth.clone(),
                },
            )),
            key: None,
            backlog: Vec::new(),
            last_sent: None,
            failing: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::config::MasterConfig;
    use crate::master::state::MasterState;

    const LEASE: Duration = Duration::from_secs(2);

    fn notifier() -> Arc<Notifier> {
        let state = Arc::new(StateLock::new(MasterState::with_system_clock(
            MasterConfig::default(),
        )));
        Notifier::new(
            state,
            Arc::new(crate::ha::lease::Leadership::single()),
            LEASE,
            None,
        )
    }

    #[test]
    fn a_store_owed_forgets_it_has_not_taken_gets_no_lease() {
        let n = notifier();
        let now = Instant::now();
        assert_eq!(n.grant("s:1", 0, now), LEASE, "owed nothing");
        assert_eq!(n.grant("s:1", 3, now), Duration::ZERO, "owed forget 3");
        n.book.lock().taken.insert("s:1".into(), 3);
        assert_eq!(n.grant("s:1", 3, now), LEASE, "took everything up to 3");
        n.book.lock().poisoned.insert("s:1".into());
        assert_eq!(
            n.grant("s:1", 0, now),
            Duration::ZERO,
            "its forgets were lost"
        );
        assert_eq!(n.granted.load(Ordering::Relaxed), 2);
        assert_eq!(n.refused.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_lease_ends_no_earlier_than_the_last_grant_or_a_predecessors_could() {
        let n = notifier();
        let start = Instant::now();
        // A new master cannot know what its predecessor granted: one lease from its start.
        let inherited = n.lease_end("s:1").expect("a predecessor's lease may run");
        assert!(inherited >= start + LEASE - Duration::from_millis(50));
        let later = start + Duration::from_secs(5);
        n.grant("s:1", 0, later);
        assert_eq!(n.lease_end("s:1"), Some(later + LEASE));
        assert_eq!(n.lease_end("s:2"), Some(inherited), "never granted");
        // Never zero lease: a master with cached locations off grants nothing.
        let state = Arc::new(StateLock::new(MasterState::with_system_clock(
            MasterConfig::default(),
        )));
        let off = Notifier::new(
            state,
            Arc::new(crate::ha::lease::Leadership::single()),
            Duration::ZERO,
            None,
        );
        assert_eq!(off.grant("s:1", 0, start), Duration::ZERO);
    }
}
