"""The same-host path: a store's segment file mapped into this process, so that replicas on this
host are read and written with memory copies instead of socket transfers.

A segment is shareable when its ``host_id`` is this machine's boot id and the file at
``shm_path`` exists beside ``<shm_path minus extension>.token`` holding ``shm_token`` as 16 hex
digits (so a file of the same name from another store incarnation is never used).
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import Optional

from .protocol import SegmentInfo

log = logging.getLogger("rbgctl.shm")


def local_host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _not_ours(info: SegmentInfo, e: OSError) -> None:
    log.warning(
        "same-host segment %s (%s) cannot be opened by this user (%s); using TCP. A store's "
        "files are private to the user it runs as: run this client as that user, or start the "
        "store with --shm-group GROUP and make this user a member of GROUP",
        info.name,
        info.shm_path,
        e.strerror or e,
    )


class LocalSegment:
    """A mapped segment; ``read``/``write`` copy between it and caller buffers."""

    def __init__(self, info: SegmentInfo, mm: mmap.mmap):
        self.info = info
        self._mm = mm
        self._view = memoryview(mm)
        self.size = info.size

    @staticmethod
    def open(info: SegmentInfo, host_id: str) -> Optional["LocalSegment"]:
        """Maps the segment if it is on this host and its token matches; ``None`` otherwise
        (the client then uses TCP)."""
        if not info.shm_path or not info.host_id or info.host_id != host_id:
            return None
        token_path = os.path.splitext(info.shm_path)[0] + ".token"
        try:
            with open(token_path) as f:
                token = int(f.read().strip(), 16)
        except PermissionError as e:
            _not_ours(info, e)
            return None
        except (OSError, ValueError):
            return None
        if token != info.shm_token:
            log.debug("segment %s: token differs, not the same file", info.name)
            return None
        try:
            fd = os.open(info.shm_path, os.O_RDWR)
        except PermissionError as e:
            _not_ours(info, e)
            return None
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != info.size:
                return None
            mm = mmap.mmap(fd, info.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        log.debug("mapped same-host segment %s", info.name)
        return LocalSegment(info, mm)

    def _in_bounds(self, offset: int, length: int) -> bool:
        return 0 <= offset and offset + length <= self.size

    def read(self, offset: int, views) -> bool:
        """Copies ``[offset, offset + total)`` into the views in order."""
        n = sum(v.nbytes for v in views)
        if not self._in_bounds(offset, n):
            return False
        for v in views:
            k = v.nbytes
            v[:] = self._view[offset : offset + k]
            offset += k
        return True

    def write(self, offset: int, views) -> bool:
        n = sum(v.nbytes for v in views)
        if not self._in_bounds(offset, n):
            return False
        for v in views:
            k = v.nbytes
            self._view[offset : offset + k] = v
            offset += k
        return True

    def close(self) -> None:
        self._view.release()
        try:
            self._mm.close()
        except BufferError:  # a copy in another thread still holds a view; the GC unmaps it
            pass
