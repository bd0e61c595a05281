//! The work queue: keys, not events. A key is queued at most once; a key being reconciled
//! is never handed to a second worker, and if it changes meanwhile it is queued again when
//! the first reconcile ends. Failed keys come back after an exponential backoff.
//!
//! Keys to be queued later wait in the queue itself, ordered by when they are due (one
//! deadline per key: the earliest asked for), and the workers waiting for a key wake at the
//! first of them: no task or timer per key.

use crate::backoff::Backoff;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Default)]
struct Inner {
    ready: VecDeque<String>,
    queued: HashSet<String>,
    active: HashSet<String>,
    dirty: HashSet<String>,
    failures: HashMap<String, u32>,
    /// Keys to queue later, by when they are due.
    waiting: BTreeSet<(Instant, String)>,
    /// Each waiting key's deadline.
    due: HashMap<String, Instant>,
}

impl Inner {
    /// Queues `key` now; answers whether it went into `ready`.
    fn add(&mut self, key: &str) -> bool {
        if self.active.contains(key) {
            self.dirty.insert(key.to_string());
            return false;
        }
        if self.queued.insert(key.to_string()) {
            self.ready.push_back(key.to_string());
            return true;
        }
        false
    }

    /// Queues the waiting keys due by `now`.
    fn add_due(&mut self, now: Instant) {
        while let Some((at, _)) = self.waiting.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.waiting.pop_first() {
                self.due.remove(&key);
                self.add(&key);
            }
        }
    }
}

/// The work queue of one resource type: each key once, with its backoff and delays.
#[derive(Default)]
pub struct Queue {
    inner: Mutex<Inner>,
    notify: Notify,
}

impl Queue {
    /// An empty queue, shared by the workers and the watches that feed it.
    pub fn new() -> Arc<Queue> {
        Arc::new(Queue::default())
    }

    /// Queues `key` now: once, however often it is added before a worker takes it; a key a
    /// worker holds is queued again when that worker is done.
    pub fn add(&self, key: &str) {
        if self.inner.lock().add(key) {
            self.notify.notify_one();
        }
    }

    /// Queues `key` once `delay` has passed, unless it is already due sooner.
    pub fn add_after(&self, key: &str, delay: Duration) {
        let at = Instant::now() + delay;
        let mut i = self.inner.lock();
        if let Some(&was) = i.due.get(key) {
            if was <= at {
                return;
            }
            i.waiting.remove(&(was, key.to_string()));
        }
        i.due.insert(key.to_string(), at);
        i.waiting.insert((at, key.to_string()));
        drop(i);
        // A worker waiting for a later deadline (or for none) looks again.
        self.notify.notify_one();
    }

    /// Keys waiting to be queued later.
    pub fn waiting(&self) -> usize {
        self.inner.lock().waiting.len()
    }

    /// Queues the key again after its next backoff step (100 ms doubling to 60 s).
    pub fn retry(&self, key: &str) -> Duration {
        let n = {
            let mut i = self.inner.lock();
            let n = i.failures.entry(key.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let delay = Backoff::new(Duration::from_millis(100), Duration::from_secs(60)).nth(n);
        self.add_after(key, delay);
        delay
    }

    /// Resets `key`'s backoff (its reconcile succeeded).
    pub fn forget(&self, key: &str) {
        self.inner.lock().failures.remove(key);
    }

    /// The next key to work on; the caller must call `done` with it.
    pub async fn get(&self) -> String {
        loop {
            let notified = self.notify.notified();
            let next_due = {
                let mut i = self.inner.lock();
                i.add_due(Instant::now());
                if let Some(k) = i.ready.pop_front() {
                    i.queued.remove(&k);
                    i.active.insert(k.clone());
                    if !i.ready.is_empty() || !i.waiting.is_empty() {
                        // Another worker takes the next key, or waits for the next deadline.
                        self.notify.notify_one();
                    }
                    return k;
                }
                i.waiting.first().map(|(at, _)| *at)
            };
            match next_due {
                Some(at) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// A worker finished `key`; it is queued again if it was added meanwhile.
    pub fn done(&self, key: &str) {
        let again = {
            let mut i = self.inner.lock();
            i.active.remove(key);
            i.dirty.remove(key)
        };
        if again {
            self.add(key);
        }
    }

    /// Keys ready for a worker.
    pub fn len(&self) -> usize {
        self.inner.lock().ready.len()
    }

    /// Whether no key is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_are_deduplicated_and_never_worked_twice_at_once() {
        let q = Queue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let k = q.get().await;
        assert_eq!(k, "a");
        q.add("a"); // changed while being worked on
        assert_eq!(q.len(), 1, "not handed out again while active");
        assert_eq!(q.get().await, "b");
        q.done("b");
        q.done("a");
        assert_eq!(q.get().await, "a", "queued again after done");
        q.done("a");
        assert!(q.is_empty());
        assert_eq!(q.retry("x"), Duration::from_millis(100));
        assert_eq!(q.retry("x"), Duration::from_millis(200));
        q.forget("x");
        assert_eq!(q.retry("x"), Duration::from_millis(100));
        let got = tokio::time::timeout(Duration::from_secs(2), q.get()).await;
        assert_eq!(got.ok().as_deref(), Some("x"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_asked_for_later_waits_in_the_queue_once_at_its_earliest_deadline() {
        let q = Queue::new();
        let t0 = Instant::now();
        q.add_after("a", Duration::from_secs(5));
        q.add_after("a", Duration::from_secs(1));
        q.add_after("a", Duration::from_secs(9));
        q.add_after("b", Duration::from_secs(3));
        for _ in 0..1000 {
            q.add_after("c", Duration::from_secs(60));
        }
        assert_eq!(
            q.waiting(),
            3,
            "one deadline per key, however often it is asked"
        );
        assert!(q.is_empty(), "nothing is due yet");
        assert_eq!(q.get().await, "a");
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(1),
            "the earliest deadline asked for"
        );
        q.done("a");
        assert_eq!(q.get().await, "b");
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
        q.done("b");
        // A key due while it is worked on is queued again when that work ends.
        q.add("c");
        assert_eq!(q.get().await, "c");
        tokio::time::advance(Duration::from_secs(120)).await;
        let again = tokio::time::timeout(Duration::from_millis(10), q.get()).await;
        assert!(again.is_err(), "not handed out while active");
        q.done("c");
        assert_eq!(q.get().await, "c");
        assert_eq!(q.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_waiting_for_a_late_key_takes_an_earlier_one_asked_for_meanwhile() {
        let q = Queue::new();
        let t0 = Instant::now();
        q.add_after("late", Duration::from_secs(30));
        let worker = {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        };
        tokio::task::yield_now().await;
        q.add_after("soon", Duration::from_secs(2));
        assert_eq!(worker.await.unwrap(), "soon");
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
    }
}
