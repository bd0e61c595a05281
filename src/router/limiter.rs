//! The concurrency limit: at most `max` requests proxied at once, up to `queue_size` more
//! waiting for a slot (429 beyond that), each for at most `timeout` (then 408). A slot is held
//! until the response body has been sent, so a long stream counts for its whole length.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("too many requests: {running} running and the queue of {queue} is full")]
    QueueFull { running: usize, queue: usize },
    #[error("timed out after {0:?} waiting in the queue")]
    Timeout(Duration),
}

pub struct Limiter {
    slots: Option<Arc<Semaphore>>,
    max: usize,
    queue_size: usize,
    timeout: Duration,
    queued: AtomicUsize,
}

/// Decrements the queue count however the wait ends.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Limiter {
    /// `max` of `None` is no limit.
    pub fn new(max: Option<usize>, queue_size: usize, timeout: Duration) -> Limiter {
        Limiter {
            slots: max.map(|m| Arc::new(Semaphore::new(m))),
            max: max.unwrap_or(0),
            queue_size,
            timeout,
            queued: AtomicUsize::new(0),
        }
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Requests holding a slot now.
    pub fn running(&self) -> usize {
        self.slots
            .as_ref()
            .map(|s| self.max - s.available_permits())
            .unwrap_or(0)
    }

    /// Waits for a slot (`None` when there is no limit).
    pub async fn admit(&self) -> Result<Option<OwnedSemaphorePermit>, Rejected> {
        let Some(slots) = &self.slots else {
            return Ok(None);
        };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Ok(Some(p));
        }
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.queue_size {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Rejected::QueueFull {
                running: self.max,
                queue: self.queue_size,
            });
        }
        let _queued = Queued(&self.queued);
        match tokio::time::timeout(self.timeout, slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(Some(p)),
            // The semaphore is never closed; treat it like a timeout if it were.
            Ok(Err(_)) | Err(_) => Err(Rejected::Timeout(self.timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_queue_is_429_and_a_long_wait_408() {
        let l = Arc::new(Limiter::new(Some(1), 1, Duration::from_millis(100)));
        let held = l.admit().await.unwrap();
        assert!(held.is_some());
        assert_eq!(l.running(), 1);
        // One may wait ...
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.admit().await.map(|p| p.is_some()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(l.queued(), 1);
        // ... a second is turned away at once.
        assert_eq!(
            l.admit().await.unwrap_err(),
            Rejected::QueueFull {
                running: 1,
                queue: 1
            }
        );
        // The waiter times out (the slot is still held).
        assert_eq!(
            waiter.await.unwrap().unwrap_err(),
            Rejected::Timeout(Duration::from_millis(100))
        );
        assert_eq!(l.queued(), 0);
        // Released: the next one gets in at once; and a waiter is served when a slot frees.
        drop(held);
        let p = l.admit().await.unwrap();
        let l3 = l.clone();
        let waiter = tokio::spawn(async move { l3.admit().await.map(|p| p.is_some()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(p);
        assert_eq!(waiter.await.unwrap(), Ok(true));
        let unlimited = Limiter::new(None, 0, Duration::from_millis(1));
        assert_eq!(unlimited.admit().await.map(|p| p.is_none()), Ok(true));
    }
}
