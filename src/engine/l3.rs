//! The SIMULATED engine's third tier: the rbgctl KV pool through the client library. Pages
//! are real objects of `page_size * bytes_per_token` bytes under their chained keys; reads are
//! real transfers into a buffer and are checked byte for byte.

use crate::client::{Client, ClientConfig, ClientError, ReplicateConfig};
use crate::simulated_tokens::{page_bytes, page_bytes_ok};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The SIMULATED engine's L3 traffic, for its `/metrics`.
#[derive(Default)]
pub struct L3Stats {
    pub pages_read: AtomicU64,
    pub pages_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Reads that failed or returned bytes other than the page's.
    pub bad_reads: AtomicU64,
    pub write_errors: AtomicU64,
}

/// The pool could not be reached in time.
#[derive(Debug, thiserror::Error)]
#[error("L3: cannot reach the master at {master}: {source}")]
pub struct L3Error {
    master: String,
    source: ClientError,
}

/// The SIMULATED engine's third tier: KV pages as objects in the pool.
pub struct L3 {
    client: Client,
    page_bytes: usize,
    pub stats: L3Stats,
}

impl L3 {
    /// Connects to the master (holding the cluster secret in `auth_token_file`, if given),
    /// retrying for up to `wait` (the pool may still be starting).
    pub fn connect(
        master: &str,
        auth_token_file: Option<&std::path::Path>,
        page_bytes: usize,
        wait: Duration,
    ) -> Result<L3, L3Error> {
        let deadline = Instant::now() + wait;
        // MOONCAKE_PROTOCOL=rdma and MOONCAKE_DEVICE, as for an engine linking Mooncake.
        let cfg = ClientConfig::new(master)
            .with_transport_from_env()
            .and_then(|c| c.with_auth_file(auth_token_file))
            .map_err(|e| L3Error {
                master: master.to_string(),
                source: ClientError::Config(Arc::new(e)),
            })?;
        loop {
            match Client::connect(cfg.clone()) {
                Ok(client) => {
                    return Ok(L3 {
                        client,
                        page_bytes,
                        stats: L3Stats::default(),
                    })
                }
                Err(source) if Instant::now() >= deadline => {
                    return Err(L3Error {
                        master: master.to_string(),
                        source,
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// How many leading `keys` the pool holds, read into memory and checked: the pages a
    /// prefetch brings back. A page that fails to read ends the prefix.
    pub fn fetch_prefix(&self, keys: &[String]) -> usize {
        if keys.is_empty() {
            return 0;
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let n = match self.client.batch_exists(&refs) {
            Ok(e) => e.iter().take_while(|x| **x).count(),
            Err(e) => {
                tracing::debug!(error = %e, "L3 exists failed");
                return 0;
            }
        };
        if n == 0 {
            return 0;
        }
        let mut buf = vec![0u8; n * self.page_bytes];
        let mut slices: Vec<&mut [u8]> = buf.chunks_mut(self.page_bytes).collect();
        let results = self.client.batch_get_into(&refs[..n], &mut slices);
        let mut ok = 0;
        for ((r, key), page) in results.iter().zip(&refs).zip(buf.chunks(self.page_bytes)) {
            match r {
                Ok(len) if *len == self.page_bytes && page_bytes_ok(key, page) => ok += 1,
                _ => {
                    self.stats.bad_reads.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        self.stats
            .pages_read
            .fetch_add(ok as u64, Ordering::Relaxed);
        self.stats
            .bytes_read
            .fetch_add((ok * self.page_bytes) as u64, Ordering::Relaxed);
        ok
    }

    /// Writes the pages of `keys` the pool does not hold yet.
    pub fn backup(&self, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let missing: Vec<&str> = match self.client.batch_exists(&refs) {
            Ok(e) => refs
                .iter()
                .zip(e)
                .filter(|(_, present)| !present)
                .map(|(k, _)| *k)
                .collect(),
            Err(_) => refs.clone(),
        };
        if missing.is_empty() {
            return;
        }
        let values: Vec<Vec<u8>> = missing
            .iter()
            .map(|k| page_bytes(k, self.page_bytes))
            .collect();
        let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let cfg = ReplicateConfig {
            replica_num: 1,
            ..ReplicateConfig::default()
        };
        for r in self.client.batch_put(&missing, &slices, &cfg) {
            match r {
                Ok(()) => {
                    self.stats.pages_written.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .bytes_written
                        .fetch_add(self.page_bytes as u64, Ordering::Relaxed);
                }
                // Another engine may be writing the same page; the pool may be full.
                Err(_) => {
                    self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
