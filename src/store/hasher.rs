//! Hashing, after the put was answered, the bytes that came into the segment one-sided.
//!
//! Mooncake's RDMA writer sends no checksum, and its bytes pass no CPU of the store on the way
//! in. At the put's `PutEnd` the store records such an object at once, unhashed (`SEAL_DEFERRED`,
//! so the put costs its writer one round trip and no read of the value). By default it stays
//! so, as in Mooncake, until its bytes are read anyway (a restart's `DurableIndex::verify`, a
//! mount's report, a move to the disk tier). With `hash_mooncake_writes` the seal wakes this
//! thread: it reads each unhashed object's bytes once, at the lowest CPU priority, logs its
//! CRC-32C in the records and sends the checksums to the master (`OBJECTS_HASHED`), which
//! rbgctl's readers then check.

use super::index::Records;
use super::registration::Registration;
use super::segment::SegmentMemory;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the hasher did, for `/metrics`.
#[derive(Debug, Default)]
pub struct HasherStats {
    pub objects: AtomicU64,
    pub bytes: AtomicU64,
    /// Checksums the master took (`OBJECTS_HASHED` answered).
    pub reported: AtomicU64,
    /// `OBJECTS_HASHED` requests that failed (the master keeps those objects unhashed).
    pub report_failures: AtomicU64,
}

/// The handle the data service wakes the hasher with.
pub struct Hasher {
    wake: SyncSender<()>,
    stopping: AtomicBool,
    pub stats: HasherStats,
}

impl Hasher {
    /// A hasher, and the receiver its thread waits on for wake-ups.
    pub fn new() -> (Arc<Hasher>, Receiver<()>) {
        // One wake-up queued is enough: each round hashes everything unhashed.
        let (wake, woken) = sync_channel(1);
        let hasher = Hasher {
            wake,
            stopping: AtomicBool::new(false),
            stats: HasherStats::default(),
        };
        (Arc::new(hasher), woken)
    }

    /// Has the thread hash what is unhashed now.
    pub fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    /// Starts the thread: it hashes on each wake-up until `stop`.
    pub fn spawn(
        self: &Arc<Self>,
        woken: Receiver<()>,
        records: Arc<Records>,
        memory: Arc<SegmentMemory>,
        registration: Arc<Registration>,
    ) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("store-hasher".into())
            .spawn(move || {
                lowest_priority();
                // Ends when `stop` wakes it (or every sender is gone).
                while woken.recv().is_ok() {
                    me.round(&records, &memory, &registration);
                    if me.stopping.load(Ordering::Acquire) {
                        break;
                    }
                }
            })
    }

    /// Hashes what is unhashed and tells the master.
    fn round(&self, records: &Records, memory: &SegmentMemory, registration: &Registration) {
        let hashed = match records.hash_unhashed(memory, crate::transfer::hashing::threads()) {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(error = %e, "cannot record the checksums of hashed objects");
                return;
            }
        };
        if hashed.is_empty() {
            return;
        }
        self.stats
            .objects
            .fetch_add(hashed.len() as u64, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_add(hashed.iter().map(|o| o.size).sum(), Ordering::Relaxed);
        match registration.report_hashed(&hashed) {
            Ok(n) => {
                self.stats.reported.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.report_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, objects = hashed.len(),
                    "cannot send checksums to the master; it keeps those objects unhashed");
            }
        }
    }

    /// Has the thread finish its round (hashing what is unhashed now) and end.
    pub fn stop(&self, thread: JoinHandle<()>) {
        self.stopping.store(true, Ordering::Release);
        // When one is queued already, the thread takes it and then sees the flag.
        let _ = self.wake.try_send(());
        let _ = thread.join();
    }
}

/// Hashing gives way to every other thread of the machine (the kernel's RDMA work included):
/// this thread and the threads it starts run at nice 19.
fn lowest_priority() {
    // SAFETY: plain syscalls on this thread's own id.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19)
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "hasher keeps its priority");
    }
}
