//! The lock around the master's state, measured: how often it is taken, how long takers wait,
//! how long it is held, and how often one holder keeps it longer than a millisecond. Every
//! metadata operation takes it once, so these figures say whether the master serializes its
//! clients (`rbgctl bench master` reports them per phase).

use super::state::MasterState;
use crate::telemetry::{Family, PromText};
use parking_lot::{Mutex, MutexGuard};
use std::ops::{Deref, DerefMut};
use std::time::Duration;

// The `/metrics` families this file writes, each declared once.
const STATE_LOCK_ACQUISITIONS_TOTAL: Family = Family::counter(
    "rbgctl_master_state_lock_acquisitions_total",
    "Times the master's state lock was taken (once per metadata operation).",
);
const STATE_LOCK_HELD_SECONDS_TOTAL: Family = Family::counter(
    "rbgctl_master_state_lock_held_seconds_total",
    "Time the master's state lock was held.",
);
const STATE_LOCK_LONGEST_HOLD_SECONDS: Family = Family::gauge(
    "rbgctl_master_state_lock_longest_hold_seconds",
    "The longest single hold of the master's state lock since start.",
);
const STATE_LOCK_LONG_HOLDS_TOTAL: Family = Family::counter(
    "rbgctl_master_state_lock_long_holds_total",
    "Times the master's state lock was held longer than 1 ms.",
);
const STATE_LOCK_WAIT_SECONDS_TOTAL: Family = Family::counter(
    "rbgctl_master_state_lock_wait_seconds_total",
    "Time spent waiting for the master's state lock.",
);

/// A hold longer than this is counted as long.
pub const LONG_HOLD: Duration = Duration::from_millis(1);

/// The lock's figures, kept under the lock itself by whoever holds it: no atomic shared by
/// every taker (whose cache line would bounce between their cores).
#[derive(Debug, Default)]
struct LockStats {
    acquisitions: u64,
    wait_ns: u64,
    held_ns: u64,
    long_holds: u64,
    longest_ns: u64,
}

/// What the lock's statistics say at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LockFigures {
    pub acquisitions: u64,
    pub wait: Duration,
    pub held: Duration,
    pub long_holds: u64,
    pub longest: Duration,
}

struct Held {
    state: MasterState,
    stats: LockStats,
}

/// The lock around the master's state, with its waits and holds measured.
pub struct StateLock {
    held: Mutex<Held>,
    /// Times waits and holds: the CPU's cycle counter where it is steady (a few instructions
    /// a read, where the system clock costs about a hundred), the system clock elsewhere.
    clock: quanta::Clock,
}

/// The master's state, locked; its hold is measured when it is dropped.
pub struct StateGuard<'a> {
    guard: MutexGuard<'a, Held>,
    clock: &'a quanta::Clock,
    /// The clock's raw reading when the lock was taken.
    since: u64,
}

impl StateLock {
    /// The master's state behind its one lock, with the lock's figures from zero.
    pub fn new(state: MasterState) -> StateLock {
        StateLock {
            held: Mutex::new(Held {
                state,
                stats: LockStats::default(),
            }),
            clock: quanta::Clock::new(),
        }
    }

    /// Takes the lock, timing the wait (when there is one) and the hold.
    pub fn lock(&self) -> StateGuard<'_> {
        let clock = &self.clock;
        // Free (the common case): no wait to time.
        let (mut guard, asked) = match self.held.try_lock() {
            Some(guard) => (guard, None),
            None => {
                let asked = clock.raw();
                (self.held.lock(), Some(asked))
            }
        };
        let since = clock.raw();
        let s = &mut guard.stats;
        s.acquisitions += 1;
        if let Some(asked) = asked {
            s.wait_ns += clock.delta_as_nanos(asked, since);
        }
        StateGuard {
            guard,
            clock,
            since,
        }
    }

    /// The figures so far (taking the lock a moment, not counted).
    pub fn figures(&self) -> LockFigures {
        let held = self.held.lock();
        let s = &held.stats;
        LockFigures {
            acquisitions: s.acquisitions,
            wait: Duration::from_nanos(s.wait_ns),
            held: Duration::from_nanos(s.held_ns),
            long_holds: s.long_holds,
            longest: Duration::from_nanos(s.longest_ns),
        }
    }

    /// Writes the lock's figures: acquisitions, time waited and held, long holds.
    pub fn render(&self, p: &mut PromText) {
        let f = self.figures();
        p.single(&STATE_LOCK_ACQUISITIONS_TOTAL, f.acquisitions as f64)
            .single(&STATE_LOCK_WAIT_SECONDS_TOTAL, f.wait.as_secs_f64())
            .single(&STATE_LOCK_HELD_SECONDS_TOTAL, f.held.as_secs_f64())
            .single(&STATE_LOCK_LONG_HOLDS_TOTAL, f.long_holds as f64)
            .single(&STATE_LOCK_LONGEST_HOLD_SECONDS, f.longest.as_secs_f64());
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let ns = self.clock.delta_as_nanos(self.since, self.clock.raw());
        let s = &mut self.guard.stats;
        s.held_ns += ns;
        s.long_holds += u64::from(ns > nanos(LONG_HOLD));
        s.longest_ns = s.longest_ns.max(ns);
    }
}

impl Deref for StateGuard<'_> {
    type Target = MasterState;
    fn deref(&self) -> &MasterState {
        &self.guard.state
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut MasterState {
        &mut self.guard.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::config::MasterConfig;

    #[test]
    fn holds_are_counted_and_a_long_hold_is_noticed() {
        let lock = StateLock::new(MasterState::with_system_clock(MasterConfig::default()));
        drop(lock.lock());
        let held = lock.lock();
        std::thread::sleep(LONG_HOLD * 5);
        drop(held);
        let f = lock.figures();
        assert_eq!((f.acquisitions, f.long_holds), (2, 1), "{f:?}");
        assert!(f.longest >= LONG_HOLD * 5 && f.held >= f.longest, "{f:?}");
        let mut p = PromText::new();
        lock.render(&mut p);
        let text = p.finish();
        assert!(
            text.contains("rbgctl_master_state_lock_long_holds_total 1"),
            "{text}"
        );
    }
}
