//! The same-host path: a store's segment file mapped into the client, so that reads and writes of
//! local replicas are memory copies instead of socket transfers.

use crate::transfer::message::SegmentInfo;
use std::fs::OpenOptions;
use std::path::Path;

pub struct LocalSegment {
    _map: memmap2::MmapRaw,
    ptr: *mut u8,
    size: u64,
}

// SAFETY: as for the store's own mapping: callers touch ranges the master gave them.
unsafe impl Send for LocalSegment {}
unsafe impl Sync for LocalSegment {}

impl LocalSegment {
    /// Maps the segment if it is on this host and its token matches; `None` otherwise (the
    /// client then uses TCP).
    pub fn open(info: &SegmentInfo, host_id: &str) -> Option<LocalSegment> {
        if info.shm_path.is_empty() || info.host_id.is_empty() || info.host_id != host_id {
            return None;
        }
        let path = Path::new(&info.shm_path);
        let token_path = path.with_extension("token");
        let token = std::fs::read_to_string(&token_path).ok()?;
        if u64::from_str_radix(token.trim(), 16).ok()? != info.shm_token {
            tracing::debug!(path = %path.display(), "segment token differs: not the same file");
            return None;
        }
        let file = OpenOptions::new().read(true).write(true).open(path).ok()?;
        if file.metadata().ok()?.len() != info.size {
            return None;
        }
        let map = memmap2::MmapOptions::new()
            .len(info.size as usize)
            .map_raw(&file)
            .ok()?;
        tracing::debug!(segment = %info.name, "mapped same-host segment");
        Some(LocalSegment {
            ptr: map.as_mut_ptr(),
            _map: map,
            size: info.size,
        })
    }

    fn check(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    pub fn read(&self, offset: u64, dst: &mut [u8]) -> bool {
        if !self.check(offset, dst.len() as u64) {
            return false;
        }
        // SAFETY: bounds checked; the object is under a read lease.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.add(offset as usize),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        true
    }

    pub fn write(&self, offset: u64, src: &[u8]) -> bool {
        if !self.check(offset, src.len() as u64) {
            return false;
        }
        // SAFETY: bounds checked; the master allocated the range to this put.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset as usize), src.len())
        };
        true
    }
}
