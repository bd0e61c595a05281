"""rbgctl: a pure-Python client for the rbgctl KV-cache pool, and an SGLang HiCache backend.

    from rbgctl import Client
    with Client("127.0.0.1:50051") as c:      # or Client() with RBGCTL_MASTER / MOONCAKE_MASTER
        c.put("k", b"value")
        buf = bytearray(5)
        c.get_into("k", buf)

The wire protocol is ``docs/protocol.md`` of the rbgctl repository; the HiCache backend is
:class:`rbgctl.hicache.RbgctlHiCacheStorage` (see ``docs/hicache.md``).
"""

from .client import Client, Stats
from .config import ClientConfig
from .errors import (
    BufferTooSmall,
    ChecksumError,
    ConfigError,
    ObjectNotFound,
    ProtocolError,
    RbgctlError,
    RemoteError,
    TransportError,
    Unreadable,
)
from .protocol import ReplicateConfig, SegmentEntry, SegmentInfo, Status

__version__ = "0.1.0"

__all__ = [
    "BufferTooSmall",
    "ChecksumError",
    "Client",
    "ClientConfig",
    "ConfigError",
    "ObjectNotFound",
    "ProtocolError",
    "RbgctlError",
    "RemoteError",
    "ReplicateConfig",
    "SegmentEntry",
    "SegmentInfo",
    "Stats",
    "Status",
    "TransportError",
    "Unreadable",
]
