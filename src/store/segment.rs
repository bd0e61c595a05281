//! Segment memory: one shared file mapping (by default under `/dev/shm`), so that a client on the
//! same host can map the same pages and copy without a socket. When the directory cannot hold the
//! segment, anonymous memory is used instead and same-host sharing is off.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

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
}

enum Backing {
    File {
        _map: memmap2::MmapRaw,
        path: PathBuf,
        token_path: PathBuf,
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
}

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
        let stem = file_stem(name);
        let path = dir.join(format!("{stem}.seg"));
        let token_path = dir.join(format!("{stem}.token"));
        let file_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SegmentError::File { path, source }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(file_err(&path))?;
        file.set_len(size).map_err(file_err(&path))?;
        // Populate now: first-touch faults on fresh tmpfs pages cost tens of microseconds each on
        // virtual machines, which would land on the first writes of every object.
        let map = memmap2::MmapOptions::new()
            .len(size as usize)
            .populate()
            .map_raw(&file)
            .map_err(|source| SegmentError::Map { size, source })?;
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
            },
        })
    }

    pub fn anonymous(size: u64, token: u64) -> Result<SegmentMemory, SegmentError> {
        let mut map = memmap2::MmapOptions::new()
            .len(size as usize)
            .populate()
            .map_anon()
            .map_err(|source| SegmentError::Map { size, source })?;
        Ok(SegmentMemory {
            ptr: map.as_mut_ptr(),
            size,
            token,
            backing: Backing::Anonymous { _map: map },
        })
    }

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

impl Drop for SegmentMemory {
    fn drop(&mut self) {
        if let Backing::File {
            path, token_path, ..
        } = &self.backing
        {
            let _ = std::fs::remove_file(token_path);
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
