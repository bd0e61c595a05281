//! The disk tier's area: one preallocated file on a local filesystem, read and written in
//! 4 KiB-aligned blocks with `pread`/`pwrite` on an `O_DIRECT` descriptor.
//!
//! Why `O_DIRECT`: on the development VM a cold sequential read of 1 MiB blocks runs at
//! 1.3 GB/s with `O_DIRECT` and at 0.59 GB/s through the page cache (`dd`, same file), and the
//! page cache would hold a second copy of data the memory tier just gave up. Filesystems that
//! refuse `O_DIRECT` (tmpfs) get buffered I/O, said in `DiskArea::direct`.
//!
//! The store's disk-tier service (`tier.rs`) reads and writes objects through it.

use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Alignment and granularity of every disk-tier read and write.
pub const BLOCK: u64 = 4096;

/// `n` rounded up to whole blocks.
pub fn blocks(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// Why the disk tier's file could not be opened, sized or used.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("disk tier directory {0}: does not exist (create it, or fix --disk-tier)")]
    Missing(PathBuf),
    #[error("disk tier directory {0}: not a directory")]
    NotADirectory(PathBuf),
    #[error(
        "disk tier {path}: no room for {size} bytes on its filesystem ({why}); free space or \
         lower --disk-tier-size"
    )]
    Full {
        path: PathBuf,
        size: u64,
        why: String,
    },
    #[error(
        "disk tier {path}: the file holds {found} bytes, the configured size is {size}; restore \
         the size, or remove the file to start empty"
    )]
    SizeChanged {
        path: PathBuf,
        found: u64,
        size: u64,
    },
    #[error("disk tier {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("disk tier: {0}")]
    Range(String),
}

/// A heap buffer aligned to `BLOCK`, as `O_DIRECT` requires.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its memory exclusively.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to whole blocks.
    pub fn new(len: usize) -> AlignedBuf {
        let len = (blocks(len as u64) as usize).max(BLOCK as usize);
        let layout = Layout::from_size_align(len, BLOCK as usize).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, BLOCK as usize).expect("a valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// The disk tier's file.
pub struct DiskArea {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
}

fn open_file(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    if direct {
        o.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
    }
    o.open(path)
}

impl DiskArea {
    /// Opens (or creates and preallocates) `<dir>/<stem>.disk` of `size` bytes (whole blocks).
    /// An existing file must have that size: its records are kept across restarts.
    pub fn open(dir: &Path, stem: &str, size: u64) -> Result<DiskArea, DiskError> {
        match std::fs::metadata(dir) {
            Err(_) => return Err(DiskError::Missing(dir.to_path_buf())),
            Ok(m) if !m.is_dir() => return Err(DiskError::NotADirectory(dir.to_path_buf())),
            Ok(_) => {}
        }
        if size == 0 || size % BLOCK != 0 {
            return Err(DiskError::Range(format!(
                "size {size} must be a positive multiple of {BLOCK} bytes"
            )));
        }
        let path = dir.join(format!("{stem}.disk"));
        let io = |what| {
            let path = path.clone();
            move |source| DiskError::Io { path, what, source }
        };
        let (file, direct) = match open_file(&path, true) {
            Ok(f) => (f, true),
            // tmpfs and some others refuse O_DIRECT.
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                (open_file(&path, false).map_err(io("open"))?, false)
            }
            Err(e) => return Err(io("open")(e)),
        };
        let found = file.metadata().map_err(io("stat"))?.len();
        if found != 0 && found != size {
            return Err(DiskError::SizeChanged { path, found, size });
        }
        if found == 0 {
            // Reserve every block now: a full disk is a start-up error, never a failed write.
            use std::os::fd::AsRawFd;
            if let Err(e) = nix::fcntl::fallocate(
                file.as_raw_fd(),
                nix::fcntl::FallocateFlags::empty(),
                0,
                size as i64,
            ) {
                let _ = std::fs::remove_file(&path);
                return Err(DiskError::Full {
                    path,
                    size,
                    why: e.desc().to_string(),
                });
            }
        }
        Ok(DiskArea {
            file,
            path,
            size,
            direct,
        })
    }

    /// Opens an existing area file of `size` bytes for reading only (a same-host client reads
    /// a store's disk tier this way).
    pub fn open_existing(path: &Path, size: u64) -> Result<DiskArea, DiskError> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true);
            if direct {
                o.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
            }
            o.open(path)
        };
        let io = |what| {
            let path = path.to_path_buf();
            move |source| DiskError::Io { path, what, source }
        };
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                (open(false).map_err(io("open"))?, false)
            }
            Err(e) => return Err(io("open")(e)),
        };
        let found = file.metadata().map_err(io("stat"))?.len();
        if found != size {
            return Err(DiskError::SizeChanged {
                path: path.to_path_buf(),
                found,
                size,
            });
        }
        Ok(DiskArea {
            file,
            path: path.to_path_buf(),
            size,
            direct,
        })
    }

    /// The area's bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The area's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether reads and writes bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    fn io(&self, what: &'static str) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
        move |source| DiskError::Io {
            path: self.path.clone(),
            what,
            source,
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), DiskError> {
        if offset % BLOCK != 0 || len % BLOCK != 0 {
            return Err(DiskError::Range(format!(
                "offset {offset} and length {len} must be multiples of {BLOCK}"
            )));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(DiskError::Range(format!(
                "[{offset}, +{len}) is outside the {}-byte area",
                self.size
            )));
        }
        Ok(())
    }

    /// Direct I/O moves whole blocks between block-aligned memory and the file.
    fn check_buf(&self, buf: &[u8]) -> Result<(), DiskError> {
        if self.direct && buf.as_ptr() as u64 % BLOCK != 0 {
            return Err(DiskError::Range(format!(
                "buffer at {:p} is not {BLOCK}-byte aligned (use an AlignedBuf)",
                buf.as_ptr()
            )));
        }
        Ok(())
    }

    /// Writes the whole of `buf` (whole blocks, block-aligned, as an `AlignedBuf` is) at
    /// `offset`.
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), DiskError> {
        self.check(offset, buf.len() as u64)?;
        self.check_buf(buf)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(self.io("write"))
    }

    /// Fills the whole of `buf` (whole blocks, block-aligned) from `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        self.check(offset, buf.len() as u64)?;
        self.check_buf(buf)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(self.io("read"))
    }

    /// Makes what was written durable (`fdatasync`).
    pub fn sync(&self) -> Result<(), DiskError> {
        self.file.sync_data().map_err(self.io("sync"))
    }
}

/// What `probe` measured: bytes per second.
#[derive(Clone, Copy, Debug, Default)]
pub struct Speeds {
    pub write: f64,
    pub read: f64,
}

/// The filesystem's own sequential write and read speeds under `dir`, in bytes per second:
/// `bytes` written to a scratch file in `chunk`-byte blocks (then synced), then read back the
/// same way, the way the disk tier does it (same `O_DIRECT` choice); the file is removed. The
/// benchmark's reference lines.
pub fn probe(dir: &Path, bytes: u64, chunk: usize) -> Result<Speeds, DiskError> {
    let chunk = blocks(chunk as u64).max(BLOCK);
    let size = blocks(bytes).max(chunk);
    let stem = format!(".rbgctl-probe-{}", std::process::id());
    let area = DiskArea::open(dir, &stem, size)?;
    let mut buf = AlignedBuf::new(chunk as usize);
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let result = (|| {
        let t0 = Instant::now();
        for off in (0..size).step_by(chunk as usize) {
            area.write_at(off, &buf)?;
        }
        area.sync()?;
        let write = size as f64 / t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        for off in (0..size).step_by(chunk as usize) {
            area.read_at(off, &mut buf)?;
        }
        let read = size as f64 / t0.elapsed().as_secs_f64();
        Ok(Speeds { write, read })
    })();
    let _ = std::fs::remove_file(area.path());
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory on the disk the repository is on (not tmpfs), so O_DIRECT is exercised.
    fn disk_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("rbgctl-disk-test")
            .tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target"))
            .unwrap()
    }

    #[test]
    fn blocks_written_are_read_back_and_the_file_is_kept_across_an_open() {
        let dir = disk_dir();
        let area = DiskArea::open(dir.path(), "seg", 64 * BLOCK).unwrap();
        let mut w = AlignedBuf::new(3 * BLOCK as usize);
        w.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        area.write_at(5 * BLOCK, &w).unwrap();
        area.sync().unwrap();
        drop(area);
        let area = DiskArea::open(dir.path(), "seg", 64 * BLOCK).unwrap();
        let mut r = AlignedBuf::new(3 * BLOCK as usize);
        area.read_at(5 * BLOCK, &mut r).unwrap();
        assert_eq!(&r[..], &w[..]);
        assert_eq!(AlignedBuf::new(1).len(), BLOCK as usize, "whole blocks");
        assert_eq!(r.as_ptr() as usize % BLOCK as usize, 0, "aligned");
    }

    #[test]
    fn bad_places_sizes_and_ranges_say_what_to_fix() {
        let dir = disk_dir();
        let e = DiskArea::open(&dir.path().join("nope"), "s", BLOCK)
            .err()
            .unwrap();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = DiskArea::open(&file, "s", BLOCK).err().unwrap();
        assert!(e.to_string().contains("not a directory"), "{e}");
        let e = DiskArea::open(dir.path(), "s", 1000).err().unwrap();
        assert!(e.to_string().contains("multiple of 4096"), "{e}");
        DiskArea::open(dir.path(), "s", 4 * BLOCK).unwrap();
        let e = DiskArea::open(dir.path(), "s", 8 * BLOCK).err().unwrap();
        assert!(e.to_string().contains("restore the size"), "{e}");
        // More than any filesystem here has: refused at open, and nothing left behind.
        let e = DiskArea::open(dir.path(), "huge", 1 << 60).err().unwrap();
        assert!(e.to_string().contains("no room"), "{e}");
        assert!(!dir.path().join("huge.disk").exists());

        let area = DiskArea::open(dir.path(), "s", 4 * BLOCK).unwrap();
        let mut buf = AlignedBuf::new(BLOCK as usize);
        assert!(area.read_at(4 * BLOCK, &mut buf).is_err(), "past the end");
        assert!(area.read_at(100, &mut buf).is_err(), "unaligned");
    }

    #[test]
    fn the_read_speed_probe_measures_and_cleans_up() {
        let dir = disk_dir();
        let speed = probe(dir.path(), 8 << 20, 1 << 20).unwrap();
        assert!(speed.read > 0.0 && speed.write > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
