//! A token bucket in front of every API write, as client-go's `--kube-api-qps` and
//! `--kube-api-burst`: up to `burst` writes at once, then `qps` per second. The bucket is pure
//! (`crate::token_bucket`); [`Throttle::wait`] sleeps as it says.

use crate::token_bucket::Bucket;
use parking_lot::Mutex;
use std::time::Instant;

/// The token bucket in front of every API write (`--kube-api-qps`, `--kube-api-burst`).
pub struct Throttle(Mutex<Bucket>);

impl Throttle {
    /// A pace of `qps` writes per second, `burst` at once.
    pub fn new(qps: f64, burst: f64) -> Throttle {
        Throttle(Mutex::new(Bucket::new(qps, burst, Instant::now())))
    }

    /// Returns once a write may go.
    pub async fn wait(&self) {
        loop {
            let wait = self.0.lock().take(Instant::now());
            match wait {
                None => return,
                Some(d) => tokio::time::sleep(d).await,
            }
        }
    }
}
