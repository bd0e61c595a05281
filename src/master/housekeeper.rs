//! The master's housekeeper: one thread that expires what runs out (clients, unfinished puts,
//! reservations, soft pins, stores away too long), evicts above the watermark, publishes the
//! pool's KV events, wakes the notifier and the mover when they have work, takes the walks over
//! every object a step at a time, samples the history and logs the summary line when it
//! changes.
//!
//! It ticks every 50 ms while anything waits on the clock, and once a second when the state is
//! quiet (`MasterState::quiet`); an operation that changes the state wakes it (`poke`), so a
//! master at rest wakes once a second rather than 20 times.

use super::lock::StateLock;
use super::mover::Mover;
use super::notifier::Notifier;
use super::ui::History;
use super::{publish_pool_events, state, summary_line};
use crate::shutdown::Shutdown;
use crate::telemetry::OpStats;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The tick while something waits on the clock.
const TICK: Duration = Duration::from_millis(50);
/// The tick of a quiet state.
const QUIET_TICK: Duration = Duration::from_secs(1);

/// What the housekeeper's thread works on.
pub struct Parts {
    pub state: Arc<StateLock>,
    pub mover: Arc<Mover>,
    pub notifier: Arc<Notifier>,
    pub history: Arc<Mutex<History>>,
    pub stats: Arc<OpStats>,
    pub events: Option<crate::kv_events::Publisher>,
    /// How often the summary line may be logged.
    pub summary_interval: Duration,
    /// The tenants file, read again when it changes.
    pub tenants_file: Option<super::tenants_file::TenantsFile>,
}

/// The master's housekeeping thread: expiry, eviction and publishing, woken when needed.
#[derive(Default)]
pub struct Housekeeper {
    /// The last tick found the state quiet: the thread sleeps a second.
    quiet: AtomicBool,
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Housekeeper {
    /// A housekeeper with nothing to do yet.
    pub fn new() -> Arc<Housekeeper> {
        Arc::new(Housekeeper::default())
    }

    /// The state changed: a housekeeper sleeping out a quiet tick goes again now. Costs one
    /// atomic load unless it was quiet.
    pub fn poke(&self) {
        if self.quiet.load(Ordering::Relaxed) && self.quiet.swap(false, Ordering::Relaxed) {
            self.wake();
        }
    }

    /// Wakes the thread now (to see the state, or the stop).
    pub fn wake(&self) {
        *self.woken.lock() = true;
        self.cv.notify_one();
    }

    fn sleep(&self, d: Duration) {
        let mut woken = self.woken.lock();
        if !*woken {
            self.cv.wait_for(&mut woken, d);
        }
        *woken = false;
    }

    /// Starts the thread; it returns once `shutdown` fires (and `wake` is called, or its tick
    /// passes).
    pub fn spawn(
        self: &Arc<Self>,
        parts: Parts,
        shutdown: Shutdown,
    ) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("master-housekeeper".into())
            .spawn(move || me.run(parts, shutdown))
    }

    fn run(&self, parts: Parts, shutdown: Shutdown) {
        let Parts {
            state,
            mover,
            notifier,
            history,
            stats,
            events,
            summary_interval,
            mut tenants_file,
        } = parts;
        let mut last_summary = Instant::now();
        // Said when it changed: an idle master stays quiet.
        let mut last_said = String::new();
        let mut tick = TICK;
        loop {
            self.sleep(tick);
            if shutdown.is_triggered() {
                return;
            }
            let now = Instant::now();
            let quotas = tenants_file.as_mut().and_then(|f| f.changed(now));
            let mut st = state.lock();
            if let Some(q) = quotas {
                st.set_tenants(q);
            }
            st.housekeeping(now);
            if let Some(publisher) = &events {
                publish_pool_events(publisher, st.pool_events.take());
            }
            if st.has_queued_moves() {
                mover.wake();
            }
            if st.forgets_pending() {
                notifier.wake();
            }
            if now.duration_since(last_summary) >= summary_interval {
                last_summary = now;
                let line = summary_line(&st, now);
                if line != last_said {
                    tracing::info!("{line}");
                    last_said = line;
                }
            }
            let mut h = history.lock();
            if h.due(now) {
                h.record(super::ui::sample(&stats, &st.counters, now));
            }
            drop(h);
            // A store that left or came back: its replicas are dropped or confirmed a step at
            // a time, the lock let go between steps.
            while st.walking() {
                drop(st);
                st = state.lock();
                st.walk_step(state::WALK_STEP);
            }
            // Decided under the lock: an operation that changes the state after it is let go
            // sees `quiet` set, and pokes.
            let quiet = st.quiet();
            self.quiet.store(quiet, Ordering::Relaxed);
            drop(st);
            tick = if quiet { QUIET_TICK } else { TICK };
        }
    }
}
