//! The concurrency limit: at most `max` requests proxied at once, up to `queue_size` more
//! waiting for a slot (429 beyond that), each for at most `timeout` (then 408). A slot is held
//! until the response body has been sent, so a long stream counts for its whole length.
//!
//! With a rate (`--rate-limit-tokens-per-second`), each request first takes a token from a
//! bucket refilled at that rate (bursts up to `max`, or one second's worth): requests beyond
//! it wait in the same queue, under the same 429 and 408.

use crate::router::tenants::admission::Ticket;
use crate::token_bucket::Bucket;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a request was not admitted: the queue is full, or it waited too long.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("too many requests: {running} running and the queue of {queue} is full")]
    QueueFull { running: usize, queue: usize },
    #[error("timed out after {0:?} waiting in the queue")]
    Timeout(Duration),
}

/// What an admitted request holds until its answer has been sent.
pub enum Slot {
    /// A slot of `--max-concurrent-requests` (no tenants).
    Permit(OwnedSemaphorePermit),
    /// A tenant's admission (`tenants::admission`), which also settles the answer's output
    /// tokens.
    Ticket(Ticket),
}

impl Slot {
    /// The tenant's ticket, when the request has one.
    pub fn ticket(&self) -> Option<&Ticket> {
        match self {
            Slot::Ticket(t) => Some(t),
            Slot::Permit(_) => None,
        }
    }
}

/// At most so many requests proxied at once, so many more waiting.
pub struct Limiter {
    /// Requests per second, with its burst.
    rate: Option<parking_lot::Mutex<Bucket>>,
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
            rate: None,
            slots: max.map(|m| Arc::new(Semaphore::new(m))),
            max: max.unwrap_or(0),
            queue_size,
            timeout,
            queued: AtomicUsize::new(0),
        }
    }

    /// Requests also take a token of a bucket refilled at `per_second` (burst: `max`, or one
    /// second's tokens without a concurrency limit).
    pub fn with_rate(mut self, per_second: f64) -> Limiter {
        let burst = if self.max > 0 {
            self.max as f64
        } else {
            per_second.ceil()
        };
        self.rate = Some(parking_lot::Mutex::new(Bucket::new(
            per_second,
            burst,
            Instant::now(),
        )));
        self
    }

    /// Joins the queue, or says it is full.
    fn enqueue(&self) -> Result<Queued<'_>, Rejected> {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.queue_size {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Rejected::QueueFull {
                running: self.running(),
                queue: self.queue_size,
            });
        }
        Ok(Queued(&self.queued))
    }

    /// Takes a rate token, waiting in the queue for one until `deadline`.
    async fn take_token(&self, deadline: Instant) -> Result<(), Rejected> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        let Some(mut wait) = rate.lock().take(Instant::now()) else {
            return Ok(());
        };
        let _queued = self.enqueue()?;
        loop {
            if Instant::now() + wait > deadline {
                return Err(Rejected::Timeout(self.timeout));
            }
            tokio::time::sleep(wait).await;
            match rate.lock().take(Instant::now()) {
                None => return Ok(()),
                Some(w) => wait = w,
            }
        }
    }

    /// Requests waiting for a slot.
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
        let deadline = Instant::now() + self.timeout;
        self.take_token(deadline).await?;
        let Some(slots) = &self.slots else {
            return Ok(None);
        };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Ok(Some(p));
        }
        let _queued = self.enqueue()?;
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, slots.clone().acquire_owned()).await {
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

    #[tokio::test]
    async fn a_rate_admits_its_burst_then_queues_at_the_rate() {
        // 20 per second, burst 2 (the concurrency limit), queue of 1 waiting up to 1 s.
        let l = Limiter::new(Some(2), 1, Duration::from_secs(1)).with_rate(20.0);
        let a = l.admit().await.unwrap();
        drop(a);
        let b = l.admit().await.unwrap();
        drop(b);
        // The burst is spent: the next waits for a token (about 50 ms), then goes.
        let t0 = Instant::now();
        assert!(l.admit().await.is_ok());
        assert!(
            t0.elapsed() >= Duration::from_millis(30),
            "{:?}",
            t0.elapsed()
        );
        // Without a queue, a request beyond the rate is turned away at once.
        let none = Limiter::new(None, 0, Duration::from_secs(1)).with_rate(1.0);
        assert!(none.admit().await.is_ok());
        assert!(matches!(
            none.admit().await,
            Err(Rejected::QueueFull { .. })
        ));
    }
}
