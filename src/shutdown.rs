//! One shutdown token per role instance, created once and cloned to every thread and task that
//! must stop with it. Sync threads sleep on it ([`Shutdown::sleep`]), async tasks await it
//! ([`Shutdown::wait`]); nothing registers a signal listener per loop pass (a listener created
//! late misses a signal that came before it).
//!
//! [`Shutdown::on_signals`] is the process's token: the first call starts one thread that turns
//! SIGINT and SIGTERM into a trigger (a second signal exits at once); later calls return the
//! same token.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A role instance's shutdown token: triggered once, seen by every thread and task.
#[derive(Clone, Default)]
pub struct Shutdown(Arc<Inner>);

#[derive(Default)]
struct Inner {
    fired: AtomicBool,
    notify: tokio::sync::Notify,
    lock: Mutex<()>,
    cv: Condvar,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown")
            .field("triggered", &self.is_triggered())
            .finish()
    }
}

static PROCESS: OnceLock<Shutdown> = OnceLock::new();

impl Shutdown {
    /// A token that only [`Shutdown::trigger`] fires.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// The process's token, fired by SIGINT or SIGTERM. The signal thread is started by the first
    /// call; a signal that arrives at any time after it is never lost.
    pub fn on_signals() -> std::io::Result<Shutdown> {
        if let Some(s) = PROCESS.get() {
            return Ok(s.clone());
        }
        let token = Shutdown::new();
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])?;
        if PROCESS.set(token.clone()).is_err() {
            // Another thread won the race; its listener is the one.
            return Ok(PROCESS.get().cloned().unwrap_or(token));
        }
        let fire = token.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if fire.is_triggered() {
                        eprintln!("second stop signal ({sig}): exiting at once");
                        std::process::exit(130);
                    }
                    tracing::info!(signal = sig, "stop requested");
                    fire.trigger();
                }
            })?;
        Ok(token)
    }

    /// Fires the token: every waiter wakes, every later wait returns at once.
    pub fn trigger(&self) {
        self.0.fired.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
        let _guard = self.0.lock.lock();
        self.0.cv.notify_all();
    }

    /// Whether it has fired.
    pub fn is_triggered(&self) -> bool {
        self.0.fired.load(Ordering::SeqCst)
    }

    /// Resolves once the token has fired.
    pub async fn wait(&self) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a trigger in between is not missed.
            notified.as_mut().enable();
            if self.is_triggered() {
                return;
            }
            notified.await;
        }
    }

    /// Blocks this thread for `d` or until the token fires; true if it fired.
    pub fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut guard = self.0.lock.lock();
        while !self.is_triggered() {
            if self.0.cv.wait_until(&mut guard, deadline).timed_out() {
                break;
            }
        }
        self.is_triggered()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_returns_at_once_when_triggered_from_another_thread() {
        let s = Shutdown::new();
        assert!(!s.sleep(Duration::from_millis(5)), "not fired yet");
        let t = s.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            t.trigger();
        });
        let t0 = Instant::now();
        assert!(s.sleep(Duration::from_secs(30)));
        assert!(t0.elapsed() < Duration::from_secs(10));
        h.join().unwrap();
        assert!(s.sleep(Duration::from_secs(30)), "stays fired");
    }

    #[tokio::test]
    async fn wait_sees_a_trigger_that_came_before_it_and_one_that_comes_after() {
        let s = Shutdown::new();
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait().await }
        });
        tokio::task::yield_now().await;
        s.trigger();
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .unwrap();
        // Already fired: returns at once.
        tokio::time::timeout(Duration::from_secs(10), s.wait())
            .await
            .expect("returns at once");
    }
}
