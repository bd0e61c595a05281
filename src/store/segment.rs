//! Segment memory: one shared file mapping (by default under `/dev/shm`), so that a client on the
//! same host can map the same pages and copy without a socket.
//!
//! A *persistent* segment keeps its file when the process stops (or dies), and a restarted store
//! maps the same file again: the bytes survive, and the durable index (`index.rs`) says what they
//! are. Its space is reserved with `fallocate`, so a full directory is a start-up error rather
//! than a SIGBUS later. A non-persistent segment's files are removed on stop; when its directory
//! cannot hold it, anonymous memory is used instead and same-host sharing is off.

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Why the segment's directory or file could not be made, sized or mapped.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("segment file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot map {size} bytes of segment memory: {source}")]
    Map { size: u64, source: std::io::Error },
    #[error(
        "segment directory {dir} has no room for a {size}-byte segment ({free} bytes free); \
         free space, shrink segment_size or choose another shm_dir. In a container /dev/shm is \
         64 MiB unless given more: `docker run --shm-size`, or in Kubernetes a volume \
         `emptyDir: {{medium: Memory, sizeLimit: ...}}` mounted at /dev/shm, as large as the \
         segment (it counts against the pod's memory)"
    )]
    NoRoom { dir: PathBuf, size: u64, free: u64 },
    #[error(
        "segment files {path} are in use by another running store; two stores cannot share \
         one segment (give each its own name or directory)"
    )]
    InUse { path: PathBuf },
}

enum Backing {
    File {
        _map: memmap2::MmapRaw,
        path: PathBuf,
        token_path: PathBuf,
        /// Keep the files when the segment is dropped.
        persistent: bool,
    },
    Anonymous {
        _map: memmap2::MmapMut,
    },
}

/// A segment's bytes. Ranges handed out by the master never overlap, so concurrent requests
/// touch disjoint bytes; the accessors take raw ranges for that reason.
pub struct SegmentMemory {
    ptr: *mut u8,
    size: u64,
    token: u64,
    backing: Backing,
    /// Bytes from the start whose pages are faulted in (see `prefault`).
    prefaulted: AtomicU64,
    /// `prefault` has finished (done, stopped, or not supported by the kernel).
    prefault_ended: AtomicBool,
}

/// Pages faulted in per step of `prefault`.
const PREFAULT_STEP: u64 = 64 << 20;

// SAFETY: the mapping lives as long as the struct; callers access disjoint ranges (the master's
// allocator guarantees it), and a misbehaving peer can at worst produce torn bytes, which the
// object checksums catch.
unsafe impl Send for SegmentMemory {}
unsafe impl Sync for SegmentMemory {}

/// File-name form of a segment name (`host:port` → `host_port`).
pub fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl SegmentMemory {
    /// Creates the segment in `dir` as `<name>.seg`, with `<name>.token` beside it holding the
    /// random token that same-host clients check. Falls back to anonymous memory when `dir`'s
    /// file system has less free space than `size`.
    pub fn create(dir: &Path, name: &str, size: u64) -> Result<SegmentMemory, SegmentError> {
        let dir_err = |source| SegmentError::Dir {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        let free = nix::sys::statvfs::statvfs(dir)
            .map(|s| s.blocks_available() * s.fragment_size())
            .map_err(|e| dir_err(e.into()))?;
        let token = fastrand::u64(1..);
        if free < size {
            tracing::warn!(dir = %dir.display(), free, size,
                "segment directory has less free space than the segment; using private memory \
                 (same-host clients will use TCP)");
            return Self::anonymous(size, token);
        }
        let (path, token_path) = file_paths(dir, &file_stem(name));
        let file = open_file(&path, true)?;
        file.set_len(size).map_err(file_err(&path))?;
        Self::map_file(file, path, token_path, size, false)
    }

    /// Opens `<dir>/<stem>.seg` for a persistent segment. With `reuse`, an existing file of
    /// exactly `size` bytes is mapped as it is (its bytes are the objects of the last run);
    /// otherwise the file is created anew, once the directory is seen to have room for it.
    /// Returns the memory and whether the old bytes were kept.
    pub fn open_persistent(
        dir: &Path,
        stem: &str,
        size: u64,
        reuse: bool,
    ) -> Result<(SegmentMemory, bool), SegmentError> {
        let (path, token_path) = file_paths(dir, stem);
        let existing = std::fs::metadata(&path).ok().map(|m| m.len());
        let kept = reuse && existing == Some(size);
        let file = if kept {
            open_file(&path, false)?
        } else {
            // Room is checked, not reserved: reserving (fallocate) clears every page of the
            // segment before the store can mount (about 2 s for 8 GiB on tmpfs). The pages are
            // faulted in behind the mount instead (`prefault`).
            let free = free_bytes(dir).unwrap_or(u64::MAX);
            if free < size {
                return Err(SegmentError::NoRoom {
                    dir: dir.to_path_buf(),
                    size,
                    free,
                });
            }
            let file = open_file(&path, true)?;
            if let Err(e) = file.set_len(size) {
                let _ = std::fs::remove_file(&path);
                return Err(SegmentError::File { path, source: e });
            }
            file
        };
        Self::map_file(file, path, token_path, size, true).map(|m| (m, kept))
    }

    /// Maps `file` shared and writes a new token beside it.
    fn map_file(
        file: File,
        path: PathBuf,
        token_path: PathBuf,
        size: u64,
        persistent: bool,
    ) -> Result<SegmentMemory, SegmentError> {
        // Not populated here (that took 18 s for 8 GiB before the store could mount): the store
        // prefaults the pages in the background once it serves (`prefault`).
        let map = memmap2::MmapOptions::new()
            .len(size as usize)
            .map_raw(&file)
            .map_err(|source| SegmentError::Map { size, source })?;
        let token = fastrand::u64(1..);
        let mut t = File::create(&token_path).map_err(file_err(&token_path))?;
        writeln!(t, "{token:016x}").map_err(file_err(&token_path))?;
        Ok(SegmentMemory {
            ptr: map.as_mut_ptr(),
            size,
            token,
            backing: Backing::File {
                _map: map,
                path,
                token_path,
                persistent,
            },
            prefaulted: AtomicU64::new(0),
            prefault_ended: AtomicBool::new(false),
        })
    }

    /// A segment of `size` bytes in anonymous memory (not persistent), its token `token`.
    pub fn anonymous(size: u64, token: u64) -> Result<SegmentMemory, SegmentError> {
        let mut map = memmap2::MmapOptions::new()
            .len(size as usize)
            .map_anon()
            .map_err(|source| SegmentError::Map { size, source })?;
        Ok(SegmentMemory {
            ptr: map.as_mut_ptr(),
            size,
            token,
            backing: Backing::Anonymous { _map: map },
            prefaulted: AtomicU64::new(0),
            prefault_ended: AtomicBool::new(false),
        })
    }

    /// Faults every page in, writable, a step at a time (`MADV_POPULATE_WRITE`: the bytes are
    /// not touched, so a segment holding objects keeps them, and writes may go on meanwhile),
    /// until done or `stop`. Without it the first write to each page would pay its fault
    /// (tens of microseconds on virtual machines). A kernel without it (before 5.14) leaves the
    /// pages to be faulted in by those writes. Answers the bytes prefaulted.
    pub fn prefault(&self, stop: impl Fn() -> bool) -> u64 {
        let mut done = 0u64;
        while done < self.size && !stop() {
            let len = PREFAULT_STEP.min(self.size - done);
            // SAFETY: the range is within the mapping, which lives as long as `self`;
            // MADV_POPULATE_WRITE only faults pages in and changes no byte.
            let rc = unsafe {
                libc::madvise(
                    self.ptr.add(done as usize).cast(),
                    len as usize,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINVAL) {
                    tracing::info!(error = %e, prefaulted = done,
                        "this kernel cannot prefault the segment; its pages fault in on first write");
                } else {
                    tracing::warn!(error = %e, prefaulted = done,
                        "cannot fault the segment's pages in (is its file system full?); \
                         writes to the rest may fail");
                }
                break;
            }
            done += len;
            self.prefaulted.store(done, Ordering::Relaxed);
        }
        self.prefault_ended.store(true, Ordering::Relaxed);
        done
    }

    /// Says that no `prefault` will run: each page faults in on its first write.
    pub fn leave_pages_to_fault(&self) {
        self.prefault_ended.store(true, Ordering::Relaxed);
    }

    /// Whether `prefault` has finished (whatever it managed).
    pub fn prefault_ended(&self) -> bool {
        self.prefault_ended.load(Ordering::Relaxed)
    }

    /// Bytes from the start of the segment whose pages are faulted in.
    pub fn prefaulted(&self) -> u64 {
        self.prefaulted.load(Ordering::Relaxed)
    }

    /// The segment's bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The backing file and its token, when same-host clients can map it.
    pub fn shared_file(&self) -> Option<(&Path, u64)> {
        match &self.backing {
            Backing::File { path, .. } => Some((path, self.token)),
            Backing::Anonymous { .. } => None,
        }
    }

    /// Checks that `[offset, offset + len)` lies inside the segment.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), String> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(format!(
                "range [{offset}, {offset}+{len}) is outside the segment of {} bytes",
                self.size
            )),
        }
    }

    /// The bytes at `[offset, offset + len)`, which `check` must have accepted.
    ///
    /// # Safety
    /// No one may write the range while the slice is alive (the master's allocation rules).
    pub unsafe fn slice(&self, offset: u64, len: u64) -> &[u8] {
        debug_assert!(self.check(offset, len).is_ok());
        std::slice::from_raw_parts(self.ptr.add(offset as usize), len as usize)
    }

    /// Mutable bytes at `[offset, offset + len)`, which `check` must have accepted.
    ///
    /// # Safety
    /// The range must not be accessed by anyone else while the slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        debug_assert!(self.check(offset, len).is_ok());
        std::slice::from_raw_parts_mut(self.ptr.add(offset as usize), len as usize)
    }
}

impl SegmentMemory {
    /// Removes a non-persistent segment's files (the mapping stays valid for whoever still
    /// uses it); a persistent segment's are kept. Idempotent.
    pub fn unlink(&self) {
        if let Backing::File {
            path,
            token_path,
            persistent: false,
            ..
        } = &self.backing
        {
            let _ = std::fs::remove_file(token_path);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for SegmentMemory {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// The segment file and its token file for `stem` in `dir`.
fn file_paths(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{stem}.seg")),
        dir.join(format!("{stem}.token")),
    )
}

fn file_err(path: &Path) -> impl FnOnce(std::io::Error) -> SegmentError {
    let path = path.to_path_buf();
    move |source| SegmentError::File { path, source }
}

/// Opens a segment file read-write; `fresh` creates or truncates it.
fn open_file(path: &Path, fresh: bool) -> Result<File, SegmentError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(fresh)
        .truncate(fresh)
        .open(path)
        .map_err(file_err(path))
}

fn free_bytes(dir: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(dir)
        .ok()
        .map(|s| s.blocks_available() * s.fragment_size())
}

/// An exclusive lock on `<dir>/<stem>.lock`, held while the store runs, so that two processes
/// never use the same segment files. The kernel releases it when the process dies, which is
/// how same-host clients tell a running store from a dead one (`client::datapath::shm`) and
/// how a starting store tells stale files from live ones ([`sweep_stale`]).
pub struct DirLock {
    _lock: Flock<File>,
    /// Removed with the lock (a non-persistent store leaves nothing behind).
    remove: Option<PathBuf>,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if let Some(p) = &self.remove {
            let _ = std::fs::remove_file(p);
            // A takeover's guard, if this store took its lock over from readers.
            let _ = std::fs::remove_file(p.with_extension("takeover"));
        }
    }
}

/// The lock file beside a segment file (`<stem>.seg` → `<stem>.lock`).
pub fn lock_path(segment_file: &Path) -> PathBuf {
    segment_file.with_extension("lock")
}

/// Removes the files of non-persistent segments whose store is gone: a `<stem>.lock` that
/// nobody holds, with no durable index (`<stem>.idx`) beside it, takes its `<stem>.seg` and
/// `<stem>.token` along. A persistent store's files are never touched. Returns the bytes freed.
pub fn sweep_stale(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut freed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("lock") {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if dir.join(format!("{stem}.idx")).exists() {
            continue;
        }
        // Held: a running store. Free: its store died; the lock is ours while we sweep.
        let Ok(lock) = DirLock::acquire(dir, stem) else {
            continue;
        };
        let (seg, token) = file_paths(dir, stem);
        let bytes = std::fs::metadata(&seg).map_or(0, |m| m.len());
        if std::fs::remove_file(&seg).is_ok() {
            freed += bytes;
            tracing::info!(file = %seg.display(), bytes, "removed the segment file of a dead non-persistent store");
        }
        let _ = std::fs::remove_file(&token);
        let _ = std::fs::remove_file(&path);
        drop(lock);
    }
    freed
}

impl DirLock {
    /// Takes the lock, or fails with `InUse` while another process holds it.
    pub fn acquire(dir: &Path, stem: &str) -> Result<DirLock, SegmentError> {
        Self::take(dir, stem, false)
    }

    /// As `acquire`, and the lock file goes when the lock is dropped.
    pub fn acquire_ephemeral(dir: &Path, stem: &str) -> Result<DirLock, SegmentError> {
        Self::take(dir, stem, true)
    }

    fn take(dir: &Path, stem: &str, ephemeral: bool) -> Result<DirLock, SegmentError> {
        let path = dir.join(format!("{stem}.lock"));
        // A lock file replaced under us (a takeover, below) is opened again; bounded.
        for _ in 0..3 {
            match lock_retrying(open_lock(&path)?, FlockArg::LockExclusiveNonblock) {
                Ok(lock) if same_inode(&lock, &path) => {
                    return Ok(DirLock {
                        _lock: lock,
                        remove: ephemeral.then_some(path),
                    })
                }
                Ok(_replaced) => continue,
                Err((_, Errno::EWOULDBLOCK)) => return Self::take_over(dir, stem, path, ephemeral),
                Err((_, e)) => {
                    return Err(SegmentError::File {
                        path,
                        source: e.into(),
                    })
                }
            }
        }
        Err(SegmentError::InUse { path })
    }

    /// The lock is held. A store holds it exclusively; readers (a same-host client checking
    /// whether the store lives, or any process of this user that opened the file) hold it
    /// shared. When a shared lock can be had, no store holds it: the file is replaced by a new
    /// one locked by us, so that readers cannot keep a store from starting. Takeovers are
    /// serialized by `<stem>.takeover`, and a store that locked the old file finds it replaced.
    fn take_over(
        dir: &Path,
        stem: &str,
        path: PathBuf,
        ephemeral: bool,
    ) -> Result<DirLock, SegmentError> {
        let file_err = |path: &Path, e: Errno| SegmentError::File {
            path: path.to_path_buf(),
            source: e.into(),
        };
        // A store holds it (no shared lock can be had): in use, and nothing is created.
        match Flock::lock(open_lock(&path)?, FlockArg::LockSharedNonblock) {
            Ok(_probe) => {}
            Err((_, Errno::EWOULDBLOCK)) => return Err(SegmentError::InUse { path }),
            Err((_, e)) => return Err(file_err(&path, e)),
        }
        let guard_path = dir.join(format!("{stem}.takeover"));
        let _guard = match lock_retrying(open_lock(&guard_path)?, FlockArg::LockExclusiveNonblock) {
            Ok(g) => g,
            Err((_, Errno::EWOULDBLOCK)) => return Err(SegmentError::InUse { path }),
            Err((_, e)) => return Err(file_err(&guard_path, e)),
        };
        // Again under the guard: another store may have taken over meanwhile.
        let readers = match Flock::lock(open_lock(&path)?, FlockArg::LockSharedNonblock) {
            Ok(shared) => shared,
            Err((_, Errno::EWOULDBLOCK)) => return Err(SegmentError::InUse { path }),
            Err((_, e)) => return Err(file_err(&path, e)),
        };
        tracing::warn!(lock = %path.display(),
            "the lock file is held shared (by a reader, not a store): replacing it");
        let fresh_path = dir.join(format!("{stem}.lock.{}", std::process::id()));
        let fresh = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&fresh_path)
                .map_err(|source| SegmentError::File {
                    path: fresh_path.clone(),
                    source,
                })?
        };
        let lock = Flock::lock(fresh, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| file_err(&fresh_path, e))?;
        std::fs::rename(&fresh_path, &path).map_err(|source| {
            let _ = std::fs::remove_file(&fresh_path);
            SegmentError::File {
                path: path.clone(),
                source,
            }
        })?;
        drop(readers);
        if !same_inode(&lock, &path) {
            return Err(SegmentError::InUse { path });
        }
        Ok(DirLock {
            _lock: lock,
            remove: ephemeral.then_some(path),
        })
    }
}

/// Opens (creating) a lock file, the store's alone.
fn open_lock(path: &Path) -> Result<File, SegmentError> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| SegmentError::File {
            path: path.to_path_buf(),
            source,
        })
}

/// `flock` with a few short retries: a same-host client checking whether the store lives
/// holds a shared lock for a few microseconds.
fn lock_retrying(mut file: File, how: FlockArg) -> Result<Flock<File>, (File, Errno)> {
    let mut tries = 0;
    loop {
        match Flock::lock(file, how) {
            Err((f, Errno::EWOULDBLOCK)) if tries < 10 => {
                tries += 1;
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// Whether `path` still names the file `lock` holds (it was not replaced meanwhile).
fn same_inode(lock: &Flock<File>, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (lock.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefaulting_keeps_the_bytes_and_can_be_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let seg = SegmentMemory::create(dir.path(), "pf", PREFAULT_STEP * 2 + 4096).unwrap();
        // SAFETY: test-only, one thread.
        unsafe { seg.slice_mut(PREFAULT_STEP + 7, 3) }.copy_from_slice(b"abc");
        assert!(!seg.prefault_ended());
        assert_eq!(seg.prefault(|| true), 0, "stopped before the first step");
        assert!(seg.prefault_ended());
        let done = seg.prefault(|| false);
        assert!(done == seg.size() || done % PREFAULT_STEP == 0, "{done}");
        assert_eq!(seg.prefaulted(), done);
        // SAFETY: as above.
        assert_eq!(unsafe { seg.slice(PREFAULT_STEP + 7, 3) }, b"abc");
    }

    #[test]
    fn file_backed_segment_is_shared_and_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let seg = SegmentMemory::create(dir.path(), "127.0.0.1:7000", 1 << 20).unwrap();
        let (path, token) = seg
            .shared_file()
            .map(|(p, t)| (p.to_path_buf(), t))
            .unwrap();
        assert!(path.ends_with("127.0.0.1_7000.seg"));
        let written = std::fs::read_to_string(dir.path().join("127.0.0.1_7000.token")).unwrap();
        assert_eq!(u64::from_str_radix(written.trim(), 16).unwrap(), token);
        // SAFETY: the test's own segment, the range inside it, nobody else using it.
        unsafe { seg.slice_mut(4096, 5) }.copy_from_slice(b"hello");
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[4096..4101], b"hello");
        assert!(seg.check(1 << 20, 1).is_err());
        assert!(
            seg.check(u64::MAX, 2).is_err(),
            "overflow is out of bounds, not a wrap"
        );
        assert!(seg.check(0, 1 << 20).is_ok());
        drop(seg);
        assert!(!path.exists());
    }

    #[test]
    fn persistent_segment_keeps_its_bytes_and_refuses_a_second_owner() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(dir.path(), "s").unwrap();
        assert!(matches!(
            DirLock::acquire(dir.path(), "s"),
            Err(SegmentError::InUse { .. })
        ));
        let (seg, kept) = SegmentMemory::open_persistent(dir.path(), "s", 1 << 20, true).unwrap();
        assert!(!kept);
        // SAFETY: the test's own segment, the range inside it, nobody else using it.
        unsafe { seg.slice_mut(64, 5) }.copy_from_slice(b"hello");
        drop(seg);
        drop(lock);
        let _lock = DirLock::acquire(dir.path(), "s").unwrap();
        let (seg, kept) = SegmentMemory::open_persistent(dir.path(), "s", 1 << 20, true).unwrap();
        assert!(kept);
        // SAFETY: the test's own segment, the range inside it, nobody else using it.
        assert_eq!(unsafe { seg.slice(64, 5) }, b"hello");
        // Without reuse the file starts over.
        drop(seg);
        let (seg, kept) = SegmentMemory::open_persistent(dir.path(), "s", 1 << 20, false).unwrap();
        assert!(!kept);
        // SAFETY: the test's own segment, the range inside it, nobody else using it.
        assert_eq!(unsafe { seg.slice(64, 5) }, [0u8; 5]);
    }

    #[test]
    fn a_reader_holding_the_lock_shared_cannot_keep_a_store_out_but_a_store_does() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), "s").unwrap();
        let e = DirLock::acquire(dir.path(), "s").err().unwrap();
        assert!(matches!(e, SegmentError::InUse { .. }), "{e}");
        drop(first);
        // A reader's shared lock, held as long as it likes (flock(1) -s, a stopped client).
        let reader = Flock::lock(
            File::open(dir.path().join("s.lock")).unwrap(),
            FlockArg::LockSharedNonblock,
        )
        .unwrap();
        let store = DirLock::acquire(dir.path(), "s").expect("the reader does not keep it out");
        // The store's lock is on the file now at the path: a second store is refused.
        let e = DirLock::acquire(dir.path(), "s").err().unwrap();
        assert!(matches!(e, SegmentError::InUse { .. }), "{e}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("s.lock"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "nobody else may open the lock");
        drop((reader, store));
        DirLock::acquire(dir.path(), "s").unwrap();
    }

    #[test]
    fn unusable_directories_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing_parent = dir.path().join("no/such");
        let access = super::super::access::Access::default();
        let e = access.prepare_dir(&missing_parent).unwrap_err().to_string();
        assert!(e.contains("parent directory does not exist"), "{e}");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = access.prepare_dir(&file).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        access.prepare_dir(&dir.path().join("new")).unwrap();
        // Far more than any test machine has.
        let e = SegmentMemory::open_persistent(dir.path(), "big", 1 << 50, false)
            .err()
            .unwrap();
        assert!(matches!(e, SegmentError::NoRoom { .. }), "{e}");
        assert!(!dir.path().join("big.seg").exists());
    }
}
