//! The work queue: keys, not events. A key is queued at most once; a key being reconciled
//! is never handed to a second worker, and if it changes meanwhile it is queued again when
//! the first reconcile ends. Failed keys come back after an exponential backoff.

use crate::backoff::Backoff;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Default)]
struct Inner {
    ready: VecDeque<String>,
    queued: HashSet<String>,
    active: HashSet<String>,
    dirty: HashSet<String>,
    failures: HashMap<String, u32>,
}

#[derive(Default)]
pub struct Queue {
    inner: Mutex<Inner>,
    notify: Notify,
}

impl Queue {
    pub fn new() -> Arc<Queue> {
        Arc::new(Queue::default())
    }

    pub fn add(&self, key: &str) {
        let mut i = self.inner.lock();
        if i.active.contains(key) {
            i.dirty.insert(key.to_string());
            return;
        }
        if i.queued.insert(key.to_string()) {
            i.ready.push_back(key.to_string());
            drop(i);
            self.notify.notify_one();
        }
    }

    pub fn add_after(self: &Arc<Self>, key: &str, delay: Duration) {
        let (q, key) = (self.clone(), key.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(&key);
        });
    }

    /// Queues the key again after its next backoff step (100 ms doubling to 60 s).
    pub fn retry(self: &Arc<Self>, key: &str) -> Duration {
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

    pub fn forget(&self, key: &str) {
        self.inner.lock().failures.remove(key);
    }

    /// The next key to work on; the caller must call `done` with it.
    pub async fn get(&self) -> String {
        loop {
            let notified = self.notify.notified();
            {
                let mut i = self.inner.lock();
                if let Some(k) = i.ready.pop_front() {
                    i.queued.remove(&k);
                    i.active.insert(k.clone());
                    if !i.ready.is_empty() {
                        self.notify.notify_one();
                    }
                    return k;
                }
            }
            notified.await;
        }
    }

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

    pub fn len(&self) -> usize {
        self.inner.lock().ready.len()
    }

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
}
