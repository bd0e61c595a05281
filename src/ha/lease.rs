//! The leader's right to answer, as a deadline on its own monotonic clock.
//!
//! A master leads while it holds a lease in the election backend. Each renewal that the backend
//! confirms extends the deadline to *when the renewal was sent* plus the lease's TTL, less a
//! margin: the backend starts the TTL only when the renewal arrives, so the leader's deadline
//! always falls before the backend can let the lease expire and a standby can win. Every answer
//! is checked against the deadline just before it is written, so a leader that was paused,
//! partitioned from the backend or starved answers nothing as leader once its lease may be
//! gone — even an answer computed before the pause.

use crate::transfer::Fence;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The part of a lease a leader does not count on: a tenth of the TTL, at least 50 ms (clock
/// rates of two hosts differ by far less).
pub fn margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(50)).min(ttl / 2)
}

/// Until when a renewal sent at `sent_at` and confirmed with `ttl` lets the leader answer.
pub fn deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl - margin(ttl)
}

/// How often a leader renews a lease of `ttl`: three times per TTL, so that two renewals may
/// fail before the deadline passes.
pub fn renew_every(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// The current leader as a standby knows it, for the hint in its answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderHint {
    pub epoch: u64,
    /// `host:port` of the leader's RPC server.
    pub rpc: String,
    /// `host:port` of its admin API (`/metrics`, `/health`).
    pub admin: String,
    /// `host:port` of its HTTP metadata server, if it runs one.
    pub metadata: Option<String>,
}

/// Why this master may not answer as leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLeader {
    pub leader: Option<LeaderHint>,
    /// This master's lease ran out (it was the leader).
    pub expired: bool,
}

impl std::fmt::Display for NotLeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.expired {
            "this master's leadership lease ran out"
        } else {
            "this master is a standby"
        };
        match &self.leader {
            Some(l) => write!(f, "{what}; the leader is {} (epoch {})", l.rpc, l.epoch),
            None => write!(f, "{what}; no leader is known yet, retry shortly"),
        }
    }
}

/// The role as the metrics and `/health` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// HA is off: the only master, always answering, epoch 0.
    Single,
    Leader,
    Standby,
}

impl Role {
    /// The role as metrics and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Single => "single",
            Role::Leader => "leader",
            Role::Standby => "standby",
        }
    }
}

/// Shared between the election thread (which grants and renews) and every request (which
/// checks). Lock-free on the request path.
pub struct Leadership {
    ha: bool,
    base: Instant,
    epoch: AtomicU64,
    /// Nanoseconds after `base` until which this master leads; 0 while it does not.
    until_ns: AtomicU64,
    /// Set once a lease ran out (cleared on the next election).
    expired: std::sync::atomic::AtomicBool,
    hint: RwLock<Option<LeaderHint>>,
}

impl Leadership {
    /// A master without HA: always leading, epoch 0, answers not stamped.
    pub fn single() -> Leadership {
        Leadership::new(false)
    }

    /// A master taking part in elections: a standby until it wins.
    pub fn elected() -> Leadership {
        Leadership::new(true)
    }

    fn new(ha: bool) -> Leadership {
        Leadership {
            ha,
            base: Instant::now(),
            epoch: AtomicU64::new(0),
            until_ns: AtomicU64::new(0),
            expired: Default::default(),
            hint: RwLock::new(None),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Whether this master may answer now, and with what stamp (`None` without HA).
    #[inline]
    pub fn check(&self, now: Instant) -> Result<Option<Fence>, NotLeader> {
        if !self.ha {
            return Ok(None);
        }
        self.check_elected(now)
    }

    fn check_elected(&self, now: Instant) -> Result<Option<Fence>, NotLeader> {
        let until = self.until_ns.load(Ordering::Acquire);
        if until != 0 && self.ns(now) < until {
            return Ok(Some(Fence {
                epoch: self.epoch.load(Ordering::Acquire),
                until: self.base + Duration::from_nanos(until),
            }));
        }
        Err(NotLeader {
            leader: self.hint.read().clone(),
            expired: self.expired.load(Ordering::Relaxed) || until != 0,
        })
    }

    /// Won an election: leads as `epoch` until `until`.
    pub fn lead(&self, epoch: u64, until: Instant) {
        self.expired.store(false, Ordering::Relaxed);
        self.epoch.store(epoch, Ordering::Release);
        self.until_ns
            .store(self.ns(until).max(1), Ordering::Release);
    }

    /// A renewal confirmed: leads until `until` (never shortened by a late confirmation).
    pub fn extend(&self, until: Instant) {
        self.until_ns.fetch_max(self.ns(until), Ordering::AcqRel);
    }

    /// Stops leading at once (lease lost, or shutting down).
    pub fn step_down(&self) {
        if self.until_ns.swap(0, Ordering::AcqRel) != 0 {
            self.expired.store(true, Ordering::Relaxed);
        }
    }

    /// What to tell clients of who leads (`None`: nothing known).
    pub fn set_hint(&self, hint: Option<LeaderHint>) {
        *self.hint.write() = hint;
    }

    /// What clients are told of who leads.
    pub fn hint(&self) -> Option<LeaderHint> {
        self.hint.read().clone()
    }

    /// The epoch of the last election this master won (0: never).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// This master's role at `now`: single without HA, else leader while its lease holds.
    pub fn role(&self, now: Instant) -> Role {
        match (self.ha, self.check(now).is_ok()) {
            (false, _) => Role::Single,
            (true, true) => Role::Leader,
            (true, false) => Role::Standby,
        }
    }

    /// Whether this master elects a leader with others.
    pub fn is_ha(&self) -> bool {
        self.ha
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_falls_before_the_backend_can_expire_the_lease() {
        let t = Instant::now();
        for ttl in [1, 2, 5, 30].map(Duration::from_secs) {
            let d = deadline(t, ttl);
            assert!(d < t + ttl, "{ttl:?}");
            assert!(d >= t + ttl * 8 / 10, "{ttl:?}: margin not too large");
            assert!(renew_every(ttl) * 2 < d - t, "two renewals may fail");
        }
    }

    #[test]
    fn a_leader_answers_only_until_its_deadline_and_a_standby_names_the_leader() {
        let l = Leadership::elected();
        let now = Instant::now();
        let e = l.check(now).unwrap_err();
        assert!(!e.expired);
        assert!(e.to_string().contains("no leader is known"), "{e}");
        l.set_hint(Some(LeaderHint {
            epoch: 7,
            rpc: "10.0.0.1:50051".into(),
            ..Default::default()
        }));
        assert!(l
            .check(now)
            .unwrap_err()
            .to_string()
            .contains("10.0.0.1:50051 (epoch 7)"));

        l.lead(9, now + Duration::from_secs(2));
        let s = l.check(now + Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!(s.epoch, 9);
        assert_eq!(l.role(now), Role::Leader);
        // A late confirmation never shortens the lease.
        l.extend(now + Duration::from_secs(1));
        assert!(l.check(now + Duration::from_millis(1500)).is_ok());
        let e = l.check(now + Duration::from_secs(2)).unwrap_err();
        assert!(e.expired, "past the deadline the leader is fenced");
        assert_eq!(l.role(now + Duration::from_secs(3)), Role::Standby);

        l.lead(10, now + Duration::from_secs(5));
        l.step_down();
        assert!(l.check(now).unwrap_err().expired);
    }

    #[test]
    fn a_single_master_always_answers_unstamped() {
        let l = Leadership::single();
        assert_eq!(l.check(Instant::now()), Ok(None));
        assert_eq!(l.role(Instant::now()), Role::Single);
    }
}
