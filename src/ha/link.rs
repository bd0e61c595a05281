//! A client's (or store's) connection to "the master": a fixed address, or the leader of an
//! elected group that it finds and follows.
//!
//! For `etcd://` and `k8s://` addresses a watcher thread keeps the pool pointed at the current
//! leader (an etcd watch on the leader key; the Lease looked at four times per second) and sets
//! the epoch fence to the leader's epoch, so that answers from a deposed master are refused.
//! A call that fails because the master may have moved looks the leader up at once, and is
//! sent again if it surely did nothing (it never reached a leader, or was refused by one that
//! is not).

use super::etcd::Etcd;
use super::kube_lease::{leader_of, LeaseApi};
use super::lease::LeaderHint;
use super::{HaError, MasterAddress, MasterView};
use crate::shutdown::Shutdown;
use crate::transfer::{ConnOptions, Connection, Pool, TransferError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a failing call may look the leader up itself (the watcher does the rest).
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// How long one look-up may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// TCP keepalive on the connections to the master: a master host that vanished ends them
/// after about twice this without traffic, and the heartbeat then connects anew.
const MASTER_KEEPALIVE: Duration = Duration::from_secs(10);

/// The longest wait between a call's tries while the master is failing over.
const FAILOVER_MAX_WAIT: Duration = Duration::from_millis(200);

/// The waits between a call's tries while the master is failing over: from 10 ms up to
/// [`FAILOVER_MAX_WAIT`], each moved by up to half of itself at random. A failover interrupts
/// every client of the cluster at the same moment; waits in step would bring them all back at
/// the same instants, thousands of connections at once on the new leader.
fn failover_backoff() -> crate::backoff::Backoff {
    crate::backoff::Backoff::new(Duration::from_millis(10), FAILOVER_MAX_WAIT).jittered_by(0.5)
}

/// The wait before a call's first try on a leader it has just learnt of (every client learns
/// of it at about the same moment): `unit` (in [0, 1), at random) of [`FAILOVER_MAX_WAIT`].
fn first_try_on_new_leader(unit: f64) -> Duration {
    FAILOVER_MAX_WAIT.mul_f64(unit.clamp(0.0, 1.0))
}

/// Where the leader is looked up.
enum Lookup {
    Etcd { etcd: Etcd, key: String },
    Kube(Box<Mutex<LeaseApi>>),
}

impl Lookup {
    fn new(addr: &MasterAddress) -> Result<Option<Lookup>, HaError> {
        Ok(match addr {
            MasterAddress::Direct(_) => None,
            MasterAddress::Etcd {
                endpoints,
                cluster_id,
            } => Some(Lookup::Etcd {
                etcd: Etcd::new(endpoints.clone(), LOOKUP_TIMEOUT)?,
                key: super::view_key(cluster_id),
            }),
            MasterAddress::Kube { namespace, lease } => Some(Lookup::Kube(Box::new(Mutex::new(
                LeaseApi::from_env(namespace, lease)?,
            )))),
        })
    }

    /// Why no leader is found: for etcd, the cluster id looked under and those that have one.
    fn no_leader(&self) -> String {
        match self {
            Lookup::Etcd { etcd, key } => {
                let id = super::cluster_of_view_key(key).unwrap_or(key);
                let others = etcd.keys_with_prefix(super::VIEW_PREFIX, 20).map(|keys| {
                    keys.iter()
                        .filter_map(|k| super::cluster_of_view_key(k))
                        .map(|c| format!("{c:?}"))
                        .collect::<Vec<_>>()
                });
                match others {
                    Ok(o) if o.is_empty() => format!(
                        "no master leader is elected under cluster id {id:?} (etcd key {key}), \
                         and none under any other cluster id yet"
                    ),
                    Ok(o) => format!(
                        "no master leader is elected under cluster id {id:?} (etcd key {key}); \
                         leaders are elected under {}: give this process the masters' cluster \
                         id (etcd://ENDPOINTS/CLUSTER_ID)",
                        o.join(", ")
                    ),
                    Err(e) => format!(
                        "no master leader is elected under cluster id {id:?}, and etcd cannot be \
                         reached: {e}"
                    ),
                }
            }
            Lookup::Kube(_) => "no master leader holds the Lease yet".to_string(),
        }
    }

    /// The current leader, and the revision to watch after (etcd).
    fn leader(&self) -> Result<(Option<LeaderHint>, i64), HaError> {
        match self {
            Lookup::Etcd { etcd, key } => match etcd.get(key)? {
                (None, revision) => Ok((None, revision)),
                (Some(kv), revision) => {
                    let view = MasterView::from_json(key, &kv.value)?;
                    Ok((Some(view.hint(kv.create_revision as u64)), revision))
                }
            },
            Lookup::Kube(api) => {
                let lease = api.lock().get()?;
                Ok((lease.as_ref().and_then(leader_of), 0))
            }
        }
    }

    /// Waits (bounded) for the leader to change.
    fn wait(&self, after: i64, stop: &Shutdown) {
        match self {
            Lookup::Etcd { etcd, key } => {
                // Any change, or the wait's end, means looking again; a watch that fails (etcd
                // down) is retried after a pause.
                if etcd.watch(key, after, super::WATCH_WAIT).is_err() {
                    stop.sleep(Duration::from_millis(250));
                }
            }
            Lookup::Kube(_) => {
                stop.sleep(Duration::from_millis(250));
            }
        }
    }
}

struct Shared {
    spec: String,
    pool: Pool,
    fence: Arc<AtomicU64>,
    lookup: Option<Lookup>,
    last_refresh: Mutex<Option<Instant>>,
    /// The leader as last looked up.
    leader: Mutex<Option<LeaderHint>>,
    /// Why no leader was found at the last look-up.
    no_leader: Mutex<Option<String>>,
}

impl Shared {
    /// Points the pool at `hint` (if it moved); answers whether it moved.
    fn follow(&self, hint: Option<LeaderHint>) -> bool {
        let why = match (&hint, &self.lookup) {
            (None, Some(lookup)) => Some(lookup.no_leader()),
            _ => None,
        };
        *self.no_leader.lock() = why;
        let mut leader = self.leader.lock();
        if *leader == hint {
            return false;
        }
        if let Some(h) = &hint {
            // The backend is the authority on the epoch: it may even go down (etcd rebuilt
            // empty, the Lease recreated), and then the new leader must still be heard.
            self.fence.store(h.epoch, Ordering::Release);
            if *self.pool.addr() != *h.rpc {
                tracing::info!(master = %h.rpc, epoch = h.epoch, spec = %self.spec, "following the master leader");
                self.pool.set_addr(&h.rpc);
            }
        }
        *leader = hint;
        true
    }

    /// Looks the leader up now, unless that was done moments ago; answers whether it moved.
    fn refresh(&self) -> bool {
        let Some(lookup) = &self.lookup else {
            return false;
        };
        {
            let mut last = self.last_refresh.lock();
            if last.is_some_and(|t| t.elapsed() < REFRESH_AT_MOST_EVERY) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match lookup.leader() {
            Ok((hint, _)) => self.follow(hint),
            Err(e) => {
                tracing::debug!(error = %e, spec = %self.spec, "cannot look the master leader up");
                false
            }
        }
    }
}

/// A connection pool to the master that follows the leader.
pub struct MasterLink {
    shared: Arc<Shared>,
    stop: Shutdown,
    watcher: Option<std::thread::JoinHandle<()>>,
    /// How long a call that reached no leader keeps trying for one.
    failover_wait: Duration,
}

impl MasterLink {
    /// Parses `spec` (`host:port`, `etcd://…`, `k8s://…`) and, for an elected master, looks
    /// the leader up (a leader not yet elected is no error: calls fail until there is one) and
    /// starts following it.
    pub fn new(spec: &str, opts: ConnOptions) -> Result<MasterLink, HaError> {
        let addr = MasterAddress::parse(spec)?;
        let failover_wait = opts.io_timeout;
        let fence = Arc::new(AtomicU64::new(0));
        let first = match &addr {
            MasterAddress::Direct(a) => a.clone(),
            _ => String::new(),
        };
        let shared = Arc::new(Shared {
            spec: spec.to_string(),
            pool: Pool::new(first, opts)
                .with_fence(fence.clone())
                .with_keepalive(MASTER_KEEPALIVE),
            fence,
            lookup: Lookup::new(&addr)?,
            last_refresh: Mutex::new(None),
            leader: Mutex::new(None),
            no_leader: Mutex::new(None),
        });
        let stop = Shutdown::new();
        let watcher = match &shared.lookup {
            None => None,
            Some(lookup) => {
                match lookup.leader() {
                    Ok((hint, _)) => {
                        shared.follow(hint);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, spec, "cannot look the master leader up yet; will keep trying")
                    }
                }
                let (shared, stop) = (shared.clone(), stop.clone());
                Some(
                    std::thread::Builder::new()
                        .name("master-leader-watch".into())
                        .spawn(move || watch(&shared, &stop))
                        .map_err(|e| HaError::Kube(format!("cannot start a thread: {e}")))?,
                )
            }
        };
        Ok(MasterLink {
            shared,
            stop,
            watcher,
            failover_wait,
        })
    }

    /// The current master's address (the leader's, as last looked up).
    pub fn addr(&self) -> Arc<str> {
        let a = self.shared.pool.addr();
        if a.is_empty() {
            Arc::from(format!("{} (no leader known yet)", self.shared.spec))
        } else {
            a
        }
    }

    /// The current master's address, if one is known (the leader, as last looked up).
    pub fn leader_addr(&self) -> Option<Arc<str>> {
        Some(self.shared.pool.addr()).filter(|a| !a.is_empty())
    }

    /// The address as given (`etcd://…` for an elected master).
    pub fn spec(&self) -> &str {
        &self.shared.spec
    }

    /// The leadership epoch of the answers accepted (0 for a master without HA).
    pub fn epoch(&self) -> u64 {
        self.shared.fence.load(Ordering::Acquire)
    }

    /// Whether the master is elected (found through etcd or Kubernetes) rather than given.
    pub fn is_elected(&self) -> bool {
        self.shared.lookup.is_some()
    }

    /// Runs `f` on a connection to the master. When the master may have moved, the leader is
    /// looked up; while the call surely did nothing (no leader reached, or a standby or fenced
    /// master refused it), it is sent again, to the new leader once there is one, for up to
    /// the failover wait (the connections' I/O timeout): a call during a failover waits for
    /// the next leader instead of failing at once.
    pub fn with<T>(
        &self,
        mut f: impl FnMut(&mut Connection) -> Result<T, TransferError>,
    ) -> Result<T, TransferError> {
        let deadline = Instant::now() + self.failover_wait;
        let backoff = failover_backoff();
        let mut retries = 0;
        loop {
            let r = self.once(&mut f);
            let Err(e) = &r else { return r };
            if !(self.is_elected() && e.leader_may_have_moved()) {
                return r;
            }
            let moved = self.shared.refresh();
            if !e.not_done_by_a_leader() {
                return r;
            }
            let pause = match moved {
                // To the new leader, after a moment of its own, while the wait lasts.
                true => first_try_on_new_leader(fastrand::f64()),
                false => {
                    retries += 1;
                    backoff.nth_jittered(retries, fastrand::f64())
                }
            };
            if Instant::now() + pause > deadline {
                return r;
            }
            std::thread::sleep(pause);
        }
    }

    /// Runs `f` once on a connection to the master as last looked up: no look-up, no second
    /// try. For the heartbeat, which has its own ticks: a failover reaches every client at the
    /// same moment, and each idle one looking the leader up again and again until the new one
    /// is elected would make a stampede of etcd reads, while the leader watch moves the
    /// connections anyway.
    pub fn try_once<T>(
        &self,
        mut f: impl FnMut(&mut Connection) -> Result<T, TransferError>,
    ) -> Result<T, TransferError> {
        self.once(&mut f)
    }

    fn once<T>(
        &self,
        f: &mut impl FnMut(&mut Connection) -> Result<T, TransferError>,
    ) -> Result<T, TransferError> {
        if self.shared.pool.addr().is_empty() {
            return Err(TransferError::Connect {
                addr: self.shared.spec.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    self.shared.no_leader.lock().clone().unwrap_or_else(|| {
                        "no master leader is elected yet (or the election backend cannot be \
                         reached)"
                            .into()
                    }),
                ),
            });
        }
        self.shared.pool.with(f)
    }

    /// Drops idle connections (after the master is known to have gone).
    pub fn clear(&self) {
        self.shared.pool.clear();
    }

    /// How many connections to the master were opened and closed (the leader moving closes
    /// them all): unchanged while the same ones stay open.
    pub fn connection_changes(&self) -> u64 {
        self.shared.pool.changes()
    }

    /// Drops idle connections the master closed (it restarted, or its host vanished and the
    /// keepalive gave up), without waiting for a call to find out.
    pub fn prune_closed(&self) {
        self.shared.pool.prune_closed();
    }
}

impl Drop for MasterLink {
    fn drop(&mut self) {
        self.stop.trigger();
        // The watcher wakes within one watch wait; it is not joined, so a drop never blocks
        // on etcd.
        drop(self.watcher.take());
    }
}

fn watch(shared: &Shared, stop: &Shutdown) {
    let Some(lookup) = &shared.lookup else {
        return;
    };
    while !stop.is_triggered() {
        let after = match lookup.leader() {
            Ok((hint, revision)) => {
                shared.follow(hint);
                revision
            }
            Err(e) => {
                tracing::debug!(error = %e, spec = %shared.spec, "cannot look the master leader up");
                if stop.sleep(Duration::from_millis(250)) {
                    return;
                }
                continue;
            }
        };
        lookup.wait(after, stop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients interrupted by one failover come back spread out: a thousand of them, each
    /// with its own random numbers, retry and try the new leader over the whole window rather
    /// than at the same instants, and no wait is longer than the bound.
    #[test]
    fn clients_a_failover_interrupts_together_come_back_spread_out() {
        let mut rng = fastrand::Rng::with_seed(46);
        let ms = Duration::from_millis;
        let backoff = failover_backoff();
        for n in 1..=8 {
            let waits: Vec<Duration> = (0..1000)
                .map(|_| backoff.nth_jittered(n, rng.f64()))
                .collect();
            let (lo, hi) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
            let base = backoff.nth(n);
            assert!(
                *lo >= base / 2 && *hi <= base * 3 / 2,
                "try {n}: {lo:?}..{hi:?}"
            );
            assert!(
                *hi - *lo >= base * 9 / 10,
                "try {n}: in step ({lo:?}..{hi:?})"
            );
        }
        assert_eq!(backoff.nth(8), FAILOVER_MAX_WAIT);
        let first: Vec<Duration> = (0..1000)
            .map(|_| first_try_on_new_leader(rng.f64()))
            .collect();
        assert!(first.iter().all(|d| *d < FAILOVER_MAX_WAIT));
        // Spread over the window: each tenth of it holds some of them.
        for tenth in 0..10 {
            let (from, to) = (ms(20 * tenth), ms(20 * (tenth + 1)));
            let n = first.iter().filter(|d| **d >= from && **d < to).count();
            assert!((50..=150).contains(&n), "{n} in {from:?}..{to:?}");
        }
        assert_eq!(first_try_on_new_leader(1.5), FAILOVER_MAX_WAIT);
    }
}
