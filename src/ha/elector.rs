//! The master's side of an election: campaign while standing by, renew while leading, step
//! down the moment the lease may be gone. One thread per master; the backend (etcd or a
//! Kubernetes Lease) only answers the questions below.

use super::etcd::{Campaign, Etcd, WatchOutcome};
use super::lease::{self, LeaderHint, Leadership};
use super::{HaError, MasterView};
use crate::shutdown::Shutdown;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a campaign found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This master leads as `epoch` until `until`.
    Won { epoch: u64, until: Instant },
    /// Another master leads (its hint, when its view could be read).
    Held(Option<LeaderHint>),
}

/// An election backend.
pub trait Backend: Send {
    /// Tries to take the leadership with `view`.
    fn campaign(&mut self, view: &MasterView) -> Result<Outcome, HaError>;
    /// Renews the leadership won last; `Ok(None)` when it is gone.
    fn renew(&mut self) -> Result<Option<Instant>, HaError>;
    /// Waits at most `max` for the leadership to change hands (or look vacant).
    fn wait_for_change(&mut self, max: Duration, shutdown: &Shutdown) -> Result<(), HaError>;
    /// Gives the leadership up (clean stop), so a standby takes over at once.
    fn resign(&mut self);
    /// For logs: where the election happens.
    fn describe(&self) -> String;
}

/// What the master does when it wins or loses. `elected` runs before the first answer as
/// leader; `deposed` runs after the last.
pub trait Hooks: Send {
    fn elected(&mut self, epoch: u64);
    fn deposed(&mut self);
}

/// Election figures for `/metrics`.
#[derive(Default)]
pub struct ElectionStats {
    pub elections_won: AtomicU64,
    pub leadership_lost: AtomicU64,
    pub backend_errors: AtomicU64,
    /// Milliseconds from seeing the leader gone to leading, at the last election won after
    /// one (0: none yet).
    pub last_takeover_ms: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

/// How long a standby that cannot reach the backend waits before trying again.
const RETRY: Duration = Duration::from_millis(250);

/// Runs the election until `shutdown`; then resigns if leading.
pub fn run(
    mut backend: Box<dyn Backend>,
    view: MasterView,
    leadership: Arc<Leadership>,
    mut hooks: Box<dyn Hooks>,
    stats: Arc<ElectionStats>,
    ttl: Duration,
    shutdown: Shutdown,
) {
    let span = tracing::info_span!("election", backend = %backend.describe(), id = %view.id);
    let _enter = span.enter();
    let mut leading: Option<Instant> = None; // the deadline while leading
    let mut vacant_since: Option<Instant> = None;
    let mut warned = Instant::now() - Duration::from_secs(60);
    let mut error = |e: &HaError, stats: &ElectionStats| {
        stats.backend_errors.fetch_add(1, Ordering::Relaxed);
        *stats.last_error.lock() = Some(e.to_string());
        if warned.elapsed() >= Duration::from_secs(5) {
            warned = Instant::now();
            tracing::warn!(error = %e, "election backend");
        }
    };
    while !shutdown.is_triggered() {
        let Some(deadline) = leading else {
            match backend.campaign(&view) {
                Ok(Outcome::Won { epoch, until }) => {
                    hooks.elected(epoch);
                    leadership.lead(epoch, until);
                    leadership.set_hint(Some(view.hint(epoch)));
                    stats.elections_won.fetch_add(1, Ordering::Relaxed);
                    if let Some(t) = vacant_since.take() {
                        stats
                            .last_takeover_ms
                            .store(t.elapsed().as_millis() as u64, Ordering::Relaxed);
                    }
                    tracing::info!(epoch, "elected leader");
                    leading = Some(until);
                }
                Ok(Outcome::Held(hint)) => {
                    if hint.as_ref().map(|h| h.rpc.as_str())
                        != leadership.hint().as_ref().map(|h| h.rpc.as_str())
                    {
                        tracing::info!(leader = ?hint.as_ref().map(|h| &h.rpc), epoch = ?hint.as_ref().map(|h| h.epoch), "standing by");
                    }
                    leadership.set_hint(hint);
                    if let Err(e) = backend.wait_for_change(super::WATCH_WAIT, &shutdown) {
                        error(&e, &stats);
                        shutdown.sleep(RETRY);
                    }
                    // The takeover is timed from the end of the last wait: the moment a
                    // change (the leader gone) was seen.
                    vacant_since = Some(Instant::now());
                }
                Err(e) => {
                    error(&e, &stats);
                    shutdown.sleep(RETRY);
                }
            }
            continue;
        };
        // Leading: renew three times per TTL; retry sooner after a failure.
        let now = Instant::now();
        if now >= deadline {
            step_down(
                &leadership,
                &mut *hooks,
                &stats,
                "the lease ran out before a renewal went through",
            );
            leading = None;
            continue;
        }
        if shutdown.sleep(lease::renew_every(ttl).min(deadline - now)) {
            break;
        }
        match backend.renew() {
            Ok(Some(until)) => {
                leadership.extend(until);
                leading = Some(until.max(deadline));
            }
            Ok(None) => {
                step_down(&leadership, &mut *hooks, &stats, "the lease is gone");
                leading = None;
            }
            Err(e) => {
                error(&e, &stats);
                if Instant::now() >= deadline {
                    step_down(
                        &leadership,
                        &mut *hooks,
                        &stats,
                        "the backend did not answer in time",
                    );
                    leading = None;
                } else {
                    shutdown.sleep(RETRY.min(deadline.saturating_duration_since(Instant::now())));
                }
            }
        }
    }
    if leading.is_some() {
        leadership.step_down();
        hooks.deposed();
        backend.resign();
        tracing::info!("resigned the leadership");
    }
}

fn step_down(leadership: &Leadership, hooks: &mut dyn Hooks, stats: &ElectionStats, why: &str) {
    leadership.step_down();
    leadership.set_hint(None);
    hooks.deposed();
    stats.leadership_lost.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        why,
        epoch = leadership.epoch(),
        "stepped down: no longer the leader"
    );
}

/// Election on an etcd key held with a lease: the key's create revision is the epoch.
pub struct EtcdBackend {
    etcd: Etcd,
    key: String,
    ttl: Duration,
    /// The lease and epoch while leading.
    held: Option<(i64, i64)>,
    /// The revision of the holder's key last seen (watches start after it).
    seen_revision: i64,
}

impl EtcdBackend {
    /// Elections through `etcd` for cluster `cluster_id`, the lease held for `ttl`.
    pub fn new(etcd: Etcd, cluster_id: &str, ttl: Duration) -> EtcdBackend {
        EtcdBackend {
            etcd,
            key: super::view_key(cluster_id),
            ttl,
            held: None,
            seen_revision: 0,
        }
    }
}

impl Backend for EtcdBackend {
    fn campaign(&mut self, view: &MasterView) -> Result<Outcome, HaError> {
        let sent = Instant::now();
        let lease_id = self.etcd.grant(self.ttl)?;
        match self.etcd.campaign(&self.key, &view.to_json(), lease_id) {
            Ok(Campaign::Won { epoch }) => {
                self.held = Some((lease_id, epoch));
                self.seen_revision = epoch;
                Ok(Outcome::Won {
                    epoch: epoch as u64,
                    until: lease::deadline(sent, self.ttl),
                })
            }
            Ok(Campaign::Held(kv)) => {
                let _ = self.etcd.revoke(lease_id);
                self.seen_revision = kv.mod_revision;
                let hint = MasterView::from_json(&self.key, &kv.value)
                    .map(|v| v.hint(kv.create_revision as u64))
                    .map_err(|e| tracing::warn!(error = %e, "cannot read the leader's view"))
                    .ok();
                Ok(Outcome::Held(hint))
            }
            Err(e) => {
                let _ = self.etcd.revoke(lease_id);
                Err(e.into())
            }
        }
    }

    fn renew(&mut self) -> Result<Option<Instant>, HaError> {
        let Some((lease_id, epoch)) = self.held else {
            return Ok(None);
        };
        let sent = Instant::now();
        let Some(ttl) = self.etcd.keep_alive(lease_id)? else {
            self.held = None;
            return Ok(None);
        };
        // The key must still be the one this leader created: deleted by hand, a standby may
        // already have won it.
        match self.etcd.get(&self.key)?.0 {
            Some(kv) if kv.create_revision == epoch => Ok(Some(lease::deadline(sent, ttl))),
            _ => {
                let _ = self.etcd.revoke(lease_id);
                self.held = None;
                Ok(None)
            }
        }
    }

    fn wait_for_change(&mut self, max: Duration, shutdown: &Shutdown) -> Result<(), HaError> {
        if shutdown.is_triggered() {
            return Ok(());
        }
        match self.etcd.watch(&self.key, self.seen_revision, max)? {
            WatchOutcome::Deleted { revision } | WatchOutcome::Put { revision } => {
                self.seen_revision = revision;
            }
            WatchOutcome::Quiet => {}
        }
        Ok(())
    }

    fn resign(&mut self) {
        if let Some((lease_id, _)) = self.held.take() {
            if let Err(e) = self.etcd.revoke(lease_id) {
                tracing::warn!(error = %e, "could not revoke the leadership lease; a standby takes over when it expires");
            }
        }
    }

    fn describe(&self) -> String {
        format!("etcd {} key {}", self.etcd.endpoints().join(";"), self.key)
    }
}
