"""CRC-32C (Castagnoli), the checksum every stored value carries.

The ``crc32c`` package computes it in C (with SSE4.2/ARMv8 instructions) over any buffer, without
copying; it is this package's one dependency. Where it is missing the pure-Python table version
below is used, correct but slow, and a warning says so once.
"""

from __future__ import annotations

import logging
from typing import Iterable

log = logging.getLogger("rbgctl.checksum")

_POLY = 0x82F63B78  # reflected 0x1EDC6F41


def _table() -> list:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        out.append(c)
    return out


_TABLE = _table()


def crc32c_python(data, crc: int = 0) -> int:
    """Pure-Python CRC-32C of ``data`` continuing from ``crc`` (0 to start)."""
    table = _TABLE
    c = crc ^ 0xFFFFFFFF
    for b in memoryview(data).cast("B"):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


try:
    import crc32c as _native  # type: ignore

    def crc32c(data, crc: int = 0) -> int:
        return _native.crc32c(data, crc)

    IMPLEMENTATION = "crc32c (native)"
except ImportError:  # pragma: no cover - depends on the environment
    _warned = False

    def crc32c(data, crc: int = 0) -> int:
        global _warned
        if not _warned:
            _warned = True
            log.warning(
                "the crc32c package is not installed: CRC-32C runs in pure Python, which is "
                "very slow for KV pages; install it with `pip install crc32c`"
            )
        return crc32c_python(data, crc)

    IMPLEMENTATION = "pure Python"


def crc32c_of(regions: Iterable) -> int:
    """CRC-32C of the concatenation of several buffers."""
    c = 0
    for r in regions:
        c = crc32c(r, c)
    return c
