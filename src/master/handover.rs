//! Carries out hand-overs (`state/handover.rs`): takes the copies the state machine hands
//! out, reads each object from the leaving store (only while it is still that version there)
//! and writes it, with its key, version, checksum and the master's grant, to the store taking
//! it over, which records it as a put's write would; then reports every outcome back. Bytes
//! are paced by `hand_over_bytes_per_sec`, so that a hand-over does not crowd out the pool's
//! clients; a store that does not answer fails its copies (the objects stay where they were).

use super::doorbell::Doorbell;
use super::lock::StateLock;
use super::state::HandOverJob;
use super::store_pools::StorePools;
use crate::shutdown::Shutdown;
use crate::token_bucket::Bucket;
use crate::transfer::message::{ReadVersionReq, WriteReq};
use crate::transfer::{Opcode, Pool, Status, TransferError, Wire};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often drains are looked at when nobody said so.
const TICK: Duration = Duration::from_secs(1);
/// Most copies, and about the most bytes, taken from the state at once.
const TAKE_ITEMS: usize = 64;
const TAKE_BYTES: u64 = 32 << 20;

/// The thread that makes hand-over copies, and its counts.
pub struct Copier {
    state: Arc<StateLock>,
    leadership: Arc<crate::ha::lease::Leadership>,
    /// Connections to the stores, proving the cluster secret.
    stores: StorePools,
    pace: Mutex<Bucket>,
    /// Rung when there is work.
    bell: Doorbell,
    /// Copies made, those that failed, and the bytes copied.
    pub copied: AtomicU64,
    pub failed: AtomicU64,
    pub bytes: AtomicU64,
}

impl Copier {
    /// `bytes_per_sec`: the pace of the copies (0: as fast as the stores go).
    pub fn new(
        state: Arc<StateLock>,
        leadership: Arc<crate::ha::lease::Leadership>,
        auth: Option<Arc<crate::auth::Secret>>,
        bytes_per_sec: u64,
    ) -> Arc<Copier> {
        let rate = bytes_per_sec as f64;
        Arc::new(Copier {
            state,
            leadership,
            stores: StorePools::new(auth, Duration::from_secs(10)),
            // A second's worth at once, and at least the largest value a request carries.
            pace: Mutex::new(Bucket::new(
                rate,
                rate.max(TAKE_BYTES as f64),
                Instant::now(),
            )),
            bell: Doorbell::default(),
            copied: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }

    /// Starts the copier's thread; it returns once `shutdown` fires.
    pub fn spawn(self: &Arc<Self>, shutdown: Shutdown) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("master-handover".into())
            .spawn(move || {
                while !shutdown.is_triggered() {
                    let leader = me.leadership.check(Instant::now()).is_ok();
                    if leader && me.run_once() > 0 {
                        continue;
                    }
                    me.bell.wait(TICK);
                }
            })
    }

    /// A hand-over was asked for: start now rather than at the next tick.
    pub fn wake(&self) {
        self.bell.ring();
    }

    /// Makes the copies the state hands out now and reports them; answers how many.
    pub fn run_once(&self) -> usize {
        let jobs = self
            .state
            .lock()
            .take_hand_overs(TAKE_ITEMS, TAKE_BYTES, Instant::now());
        if jobs.is_empty() {
            return 0;
        }
        let mut buf = Vec::new();
        let mut results = Vec::with_capacity(jobs.len());
        for job in &jobs {
            loop {
                let wait = self.pace.lock().take_n(job.size as f64, Instant::now());
                match wait {
                    Some(w) => std::thread::sleep(w),
                    None => break,
                }
            }
            let status = self.copy(job, &mut buf);
            match status {
                Status::Ok => {
                    self.copied.fetch_add(1, Ordering::Relaxed);
                    self.bytes.fetch_add(job.size, Ordering::Relaxed);
                }
                _ => {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            results.push((job.version, status));
        }
        self.state.lock().handed_over(&results, Instant::now());
        jobs.len()
    }

    /// One copy: read from the leaving store, check, write to the new one.
    fn copy(&self, job: &HandOverJob, buf: &mut Vec<u8>) -> Status {
        buf.resize(job.size as usize, 0);
        let src = self.stores.get(&job.from_endpoint);
        let read = ReadVersionReq {
            offset: job.from_offset,
            length: job.size,
            version: job.version,
        }
        .to_meta();
        let crc = src.with(|c| {
            let id = c.send(Opcode::ReadVersion, &read, &[])?;
            let (header, _) = c.recv(id)?;
            if header.data_len != job.size {
                return Err(TransferError::Protocol(format!(
                    "store sent {} bytes, expected {}",
                    header.data_len, job.size
                )));
            }
            c.io.read_data_into_crc(buf)
        });
        let crc = match crc {
            Ok(crc) => crc,
            Err(e) => return self.failure(job, &job.from_endpoint, &src, e),
        };
        if !job.unhashed && crc != job.checksum {
            tracing::warn!(key = %job.key, store = %job.from_endpoint,
                "the leaving store's copy does not match its checksum; not handed over");
            return Status::ChecksumMismatch;
        }
        let write = WriteReq {
            offset: job.to_offset,
            key: job.key.clone(),
            version: job.version,
            checksum: crc,
            grant: job.grant,
        }
        .to_meta();
        let dst = self.stores.get(&job.to_endpoint);
        let written = dst.with(|c| {
            let id = c.send(Opcode::Write, &write, &[buf])?;
            c.recv(id).map(drop)
        });
        match written {
            Ok(()) => Status::Ok,
            Err(e) => self.failure(job, &job.to_endpoint, &dst, e),
        }
    }

    fn failure(&self, job: &HandOverJob, store: &str, pool: &Pool, e: TransferError) -> Status {
        tracing::warn!(key = %job.key, store, error = %e, "hand-over copy failed");
        match e {
            TransferError::Remote { status, .. } => status,
            _ => {
                pool.clear();
                Status::Internal
            }
        }
    }
}
