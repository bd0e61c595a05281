//! Delivers the master's forgets to the stores: when an object's record must go (replaced,
//! removed, evicted, revoked), the store that holds it drops the record from its durable index,
//! so that a restarted master does not bring the object back.
//!
//! One thread drains the outbox whenever it is woken (after a remove) or every 20 ms. A remove
//! waits, for at most a second, until its forgets are delivered, so that a remove that returned
//! is not undone by a master crash right after it. A store that cannot be reached loses its
//! forgets: when it reports its records again, the master rejects those it no longer has.

use super::state::MasterState;
use crate::shutdown::Shutdown;
use crate::transfer::message::ForgetReq;
use crate::transfer::{ConnOptions, Opcode, Pool};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Forgets per request.
const CHUNK: usize = 16_384;
const TICK: Duration = Duration::from_millis(20);

pub struct Notifier {
    state: Arc<Mutex<MasterState>>,
    /// Highest outbox sequence number delivered (or given up on).
    delivered: Mutex<u64>,
    delivered_cv: Condvar,
    wake: Mutex<bool>,
    wake_cv: Condvar,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    pub sent: AtomicU64,
    pub failed: AtomicU64,
}

impl Notifier {
    pub fn new(state: Arc<Mutex<MasterState>>) -> Arc<Notifier> {
        Arc::new(Notifier {
            state,
            delivered: Mutex::new(0),
            delivered_cv: Condvar::new(),
            wake: Mutex::new(false),
            wake_cv: Condvar::new(),
            pools: Mutex::new(HashMap::new()),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// Starts the delivery thread; it delivers what is queued and returns once `shutdown` fires.
    pub fn spawn(self: &Arc<Self>, shutdown: Shutdown) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("master-notifier".into())
            .spawn(move || {
                while !shutdown.is_triggered() {
                    {
                        let mut w = me.wake.lock();
                        if !*w {
                            me.wake_cv.wait_for(&mut w, TICK);
                        }
                        *w = false;
                    }
                    me.flush();
                }
            })
    }

    pub fn wake(&self) {
        *self.wake.lock() = true;
        self.wake_cv.notify_one();
    }

    /// Waits until every forget queued up to `seq` was delivered, or `timeout`.
    pub fn wait_delivered(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut d = self.delivered.lock();
        while *d < seq {
            if self.delivered_cv.wait_until(&mut d, deadline).timed_out() {
                return *d >= seq;
            }
        }
        true
    }

    /// Drains the outbox once and sends every store its forgets.
    pub fn flush(&self) {
        let (seq, batches) = {
            let mut st = self.state.lock();
            (st.outbox_seq, st.take_outbox())
        };
        for (endpoint, items) in batches {
            let pool = {
                let mut pools = self.pools.lock();
                if pools.len() > 1024 {
                    pools.clear();
                }
                pools
                    .entry(endpoint.clone())
                    .or_insert_with(|| {
                        Arc::new(Pool::new(
                            endpoint.clone(),
                            ConnOptions {
                                connect_timeout: Duration::from_secs(1),
                                io_timeout: Duration::from_secs(2),
                                spin: Duration::ZERO,
                            },
                        ))
                    })
                    .clone()
            };
            for chunk in items.chunks(CHUNK) {
                let req = ForgetReq {
                    items: chunk.to_vec(),
                };
                match pool.with(|c| c.call::<_, ()>(Opcode::Forget, &req)) {
                    Ok(()) => {
                        self.sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.failed.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        pool.clear();
                        tracing::debug!(%endpoint, error = %e, "cannot deliver forgets");
                    }
                }
            }
        }
        let mut d = self.delivered.lock();
        *d = (*d).max(seq);
        self.delivered_cv.notify_all();
    }
}
