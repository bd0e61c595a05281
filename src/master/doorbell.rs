//! A thread's doorbell: rung when work arrives, waited on with a timeout between rounds (the
//! notifier, the mover and the hand-over copier sleep on one each).

use parking_lot::{Condvar, Mutex};
use std::time::Duration;

/// A flag and a condition variable: a ring is never lost, even before the wait.
#[derive(Default)]
pub struct Doorbell {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Doorbell {
    /// Work arrived: the waiting thread goes now rather than at its timeout.
    pub fn ring(&self) {
        *self.rung.lock() = true;
        self.cv.notify_one();
    }

    /// Waits until rung (at once if rung since the last wait) or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let mut rung = self.rung.lock();
        if !*rung {
            self.cv.wait_for(&mut rung, timeout);
        }
        *rung = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_ring_before_the_wait_is_not_lost() {
        let bell = Doorbell::default();
        bell.ring();
        let t = Instant::now();
        bell.wait(Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        let t = Instant::now();
        bell.wait(Duration::from_millis(20));
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "the ring was taken"
        );
    }
}
