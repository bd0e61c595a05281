"""rbgctl transfer protocol, version 1, as written in ``docs/protocol.md``.

Frames, field encoding and the messages the client sends and receives. Nothing here touches a
socket, so every encoder and decoder is tested on plain bytes.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Callable, List, Sequence, Tuple, TypeVar

from .errors import ProtocolError
from .status import Status, status_name  # noqa: F401  (part of this module's API)

MAGIC = b"RBGT"
VERSION = 1
HEADER = struct.Struct("<4sBBHQHHIQ")
HEADER_LEN = HEADER.size
FLAG_REPLY = 1
# On a reply: the meta starts with the answering master's leadership epoch (u64, little-endian).
FLAG_EPOCH = 2
MAX_META = 16 << 20
MAX_STR = 4096
MAX_LIST = 1 << 20
# Bytes of a grant: the master's permission for one replica write, opaque to the client.
GRANT_LEN = 16

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

T = TypeVar("T")


class Opcode(enum.IntEnum):
    PING = 0x01
    MOUNT_SEGMENT = 0x02
    UNMOUNT_SEGMENT = 0x03
    LIST_SEGMENTS = 0x04
    REPORT_OBJECTS = 0x05
    LEAVE = 0x06
    LEASE = 0x07  # store to master: a read lease for its segment
    AUTH_HELLO = 0x08  # the cluster secret's handshake (not yet sent by this client)
    AUTH_PROOF = 0x09
    PUT_START = 0x10
    PUT_END = 0x11
    PUT_REVOKE = 0x12
    GET_REPLICAS = 0x13
    EXISTS = 0x14
    REMOVE = 0x15
    REMOVE_ALL = 0x16
    REPORT_CORRUPT = 0x17
    LIST_KEYS = 0x18
    BATCH_PUT_START = 0x20
    BATCH_PUT_END = 0x21
    BATCH_PUT_REVOKE = 0x22
    BATCH_GET_REPLICAS = 0x23
    BATCH_EXISTS = 0x24
    BATCH_REMOVE = 0x25
    BATCH_PUT_COMMIT = 0x26  # the Rust client's commit that also reserves space; this client sends BATCH_PUT_END
    OBJECTS_HASHED = 0x27  # store to master: checksums of objects recorded before they were hashed
    WRITE = 0x40
    READ = 0x41
    STORE_INFO = 0x42
    SEAL = 0x43
    FORGET = 0x44
    WRITE_CHECKED = 0x45  # the Rust client's write with a trailing CRC; this client sends WRITE
    READ_VERSION = 0x46  # the Rust client's read from a cached location; this client asks the master
    FORGET_LEASE = 0x47  # master to store: forget records (its lease field is ignored)
    MOVE = 0x48  # master to store: copy objects between its memory and disk tiers
    RDMA_CONNECT = 0x49  # the Rust client's RDMA queue pair set-up; this client uses TCP
    SEAL_CHECKED = 0x4A  # the Rust client's seal after RDMA WRITE
    CHECK_VERSION = 0x4B  # the Rust client's version check beside an RDMA READ
    SEAL_DEFERRED = 0x4C  # master to store: record what Mooncake's Transfer Engine wrote, hash later


REFUSAL_ID = (1 << 64) - 1


# ---- frames -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    opcode: int
    flags: int
    request_id: int
    status: int
    meta_len: int
    data_len: int

    @property
    def is_reply(self) -> bool:
        return bool(self.flags & FLAG_REPLY)


def pack_header(
    opcode: int, request_id: int, meta_len: int, data_len: int, status: int = 0, flags: int = 0
) -> bytes:
    if meta_len > MAX_META:
        raise ProtocolError(f"meta of {meta_len} bytes is over the {MAX_META}-byte limit")
    return HEADER.pack(MAGIC, VERSION, int(opcode), flags, request_id, status, 0, meta_len, data_len)


def unpack_header(buf) -> Header:
    if len(buf) != HEADER_LEN:
        raise ProtocolError(f"a header is {HEADER_LEN} bytes, got {len(buf)}")
    magic, version, opcode, flags, request_id, status, _reserved, meta_len, data_len = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r} (not an rbgctl peer?)")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}; this client speaks {VERSION}")
    if meta_len > MAX_META:
        raise ProtocolError(f"meta of {meta_len} bytes is over the {MAX_META}-byte limit")
    return Header(opcode, flags, request_id, status, meta_len, data_len)


# ---- field encoding -----------------------------------------------------------------------


class Encoder:
    """Builds a meta: little-endian integers, length-prefixed strings and lists."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def u8(self, v: int) -> "Encoder":
        if not 0 <= v <= 0xFF:
            raise ProtocolError(f"{v} does not fit in a u8")
        self.buf.append(v)
        return self

    def u16(self, v: int) -> "Encoder":
        self.buf += _U16.pack(v)
        return self

    def u32(self, v: int) -> "Encoder":
        self.buf += _U32.pack(v)
        return self

    def u64(self, v: int) -> "Encoder":
        self.buf += _U64.pack(v)
        return self

    def bool(self, v: bool) -> "Encoder":
        self.buf.append(1 if v else 0)
        return self

    def str(self, v: str) -> "Encoder":
        raw = v.encode("utf-8")
        if len(raw) > MAX_STR:
            raise ProtocolError(f"string of {len(raw)} bytes is over the {MAX_STR}-byte limit: {v[:40]!r}…")
        self.buf += _U16.pack(len(raw))
        self.buf += raw
        return self

    def raw(self, v: bytes) -> "Encoder":
        """A fixed-size field's bytes as they are (the reader knows its size)."""
        self.buf += v
        return self

    def count(self, n: int) -> "Encoder":
        if n > MAX_LIST:
            raise ProtocolError(f"list of {n} items is over the {MAX_LIST}-item limit")
        return self.u32(n)

    def list(self, items: Sequence[T], item: Callable[["Encoder", T], None]) -> "Encoder":
        """A count, then each item as ``item(encoder, value)`` writes it."""
        self.count(len(items))
        for v in items:
            item(self, v)
        return self

    def result(self, value: "T | Failed", item: Callable[["Encoder", T], None]) -> "Encoder":
        """``result<T>``: status 0 then the item, or the failed item's status alone."""
        if isinstance(value, Failed):
            return self.u16(value.status)
        self.u16(0)
        item(self, value)
        return self

    def bytes(self) -> bytes:
        if len(self.buf) > MAX_META:
            raise ProtocolError(f"meta of {len(self.buf)} bytes is over the {MAX_META}-byte limit")
        return bytes(self.buf)


class Decoder:
    """Reads a meta; every read is bounds-checked and :meth:`finish` rejects trailing bytes."""

    __slots__ = ("view", "pos")

    def __init__(self, meta) -> None:
        self.view = (
            memoryview(meta).cast("B") if not isinstance(meta, (bytes, bytearray)) else memoryview(meta)
        )
        self.pos = 0

    def _take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.view):
            raise ProtocolError(f"meta ends at byte {len(self.view)}, wanted {n} more at {self.pos}")
        out = self.view[self.pos : end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self._take(1)[0]

    def u16(self) -> int:
        return _U16.unpack(self._take(2))[0]

    def u32(self) -> int:
        return _U32.unpack(self._take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self._take(8))[0]

    def bool(self) -> bool:
        v = self.u8()
        if v > 1:
            raise ProtocolError(f"bool byte {v} is neither 0 nor 1")
        return v == 1

    def str(self) -> str:
        n = self.u16()
        if n > MAX_STR:
            raise ProtocolError(f"string of {n} bytes is over the {MAX_STR}-byte limit")
        try:
            return str(self._take(n), "utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"string is not UTF-8: {e}") from None

    def raw(self, n: int) -> bytes:
        """A fixed-size field of ``n`` bytes."""
        return bytes(self._take(n))

    def grant(self) -> bytes:
        return self.raw(GRANT_LEN)

    def list(self, item: Callable[["Decoder"], T]) -> List[T]:
        n = self.u32()
        if n > MAX_LIST:
            raise ProtocolError(f"list of {n} items is over the {MAX_LIST}-item limit")
        return [item(self) for _ in range(n)]

    def result(self, item: Callable[["Decoder"], T]) -> "T | Failed":
        """``result<T>``: the decoded T, or :class:`Failed` with the non-zero status."""
        status = self.u16()
        if status != 0:
            return Failed(status)
        return item(self)

    def finish(self) -> None:
        if self.pos != len(self.view):
            raise ProtocolError(f"{len(self.view) - self.pos} trailing bytes after the meta's fields")


@dataclass(frozen=True)
class Failed:
    """One failed item of a batch answer: its status code."""

    status: int


def decode(meta, parse: Callable[[Decoder], T]) -> T:
    d = Decoder(meta)
    out = parse(d)
    d.finish()
    return out


# ---- structures ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentInfo:
    name: str
    endpoint: str
    size: int
    shm_path: str
    shm_token: int
    host_id: str
    segment_uuid: int
    tier: int = 0  # 0 memory, 1 disk (the disk tier); reads go to the endpoint either way
    persistent: bool = False  # the store keeps its objects across its own restarts
    te_endpoint: str = ""  # Mooncake's name for it (host:handshake_port) when served over TE
    te_data_port: int = 0  # the Transfer Engine's data port on te_endpoint's host
    te_base: int = 0  # the segment's first address in the Transfer Engine's addresses

    @staticmethod
    def decode(d: Decoder) -> "SegmentInfo":
        return SegmentInfo(
            d.str(), d.str(), d.u64(), d.str(), d.u64(), d.str(), d.u64(), d.u8(), d.bool(),
            d.str(), d.u32(), d.u64(),
        )

    def encode(self, e: Encoder) -> None:
        e.str(self.name).str(self.endpoint).u64(self.size).str(self.shm_path).u64(self.shm_token)
        e.str(self.host_id).u64(self.segment_uuid).u8(self.tier).bool(self.persistent)
        e.str(self.te_endpoint).u32(self.te_data_port).u64(self.te_base)


@dataclass(frozen=True)
class SegmentEntry:
    id: int
    info: SegmentInfo
    used: int

    @staticmethod
    def decode(d: Decoder) -> "SegmentEntry":
        return SegmentEntry(d.u64(), SegmentInfo.decode(d), d.u64())

    def encode(self, e: Encoder) -> None:
        e.u64(self.id)
        self.info.encode(e)
        e.u64(self.used)


@dataclass(frozen=True)
class ReplicaLoc:
    segment_id: int
    offset: int

    @staticmethod
    def decode(d: Decoder) -> "ReplicaLoc":
        return ReplicaLoc(d.u64(), d.u64())

    def encode(self, e: Encoder) -> None:
        e.u64(self.segment_id).u64(self.offset)


@dataclass(frozen=True)
class ReplicateConfig:
    """Where and how many times a put is stored.

    ``replica_num``: copies on distinct segments (0 means 1). ``soft_pin``: keep the object out of
    eviction for ``soft_pin_ttl_ms`` (0 = the master's default). ``preferred_segment``: a segment
    name to place the first replica on when it has room (e.g. the local store). ``reach``: the
    data paths the putter writes by, and so the segments its replicas may go to (0 rbgctl's
    stores only; 1 Mooncake's Transfer Engine; 2 both, this client's default: it reaches
    segments Mooncake's processes mounted through their Transfer Engine).
    """

    replica_num: int = 1
    soft_pin: bool = False
    soft_pin_ttl_ms: int = 0
    preferred_segment: str = ""
    reach: int = 2

    def encode(self, e: Encoder) -> None:
        if not 0 <= self.replica_num <= 255:
            raise ProtocolError(f"replica_num {self.replica_num} is not in 0..255")
        e.u8(self.replica_num).bool(self.soft_pin).u64(self.soft_pin_ttl_ms).str(self.preferred_segment)
        e.u8(self.reach)


@dataclass(frozen=True)
class ObjectDesc:
    """Where a readable object is. ``unhashed``: no CRC-32C was taken of it (Mooncake's client
    wrote it onto a Mooncake process's segment), so ``checksum`` means nothing."""

    size: int
    checksum: int
    lease_ttl_ms: int
    version: int
    replicas: Tuple[ReplicaLoc, ...] = field(default_factory=tuple)
    unhashed: bool = False

    @staticmethod
    def decode(d: Decoder) -> "ObjectDesc":
        return ObjectDesc(d.u64(), d.u32(), d.u64(), d.u64(), tuple(d.list(ReplicaLoc.decode)), d.bool())

    def encode(self, e: Encoder) -> None:
        e.u64(self.size).u32(self.checksum).u64(self.lease_ttl_ms).u64(self.version)
        e.list(self.replicas, lambda e, r: r.encode(e))
        e.bool(self.unhashed)

    def holds(self, crc: Callable[[], int]) -> bool:
        """Whether bytes read for this object are its value: their CRC-32C (``crc()``, asked
        only when there is one to check against) is the putter's."""
        return self.unhashed or crc() == self.checksum


@dataclass(frozen=True)
class StoredObject:
    key: str
    version: int
    offset: int
    size: int
    checksum: int

    def encode(self, e: Encoder) -> None:
        e.str(self.key).u64(self.version).u64(self.offset).u64(self.size).u32(self.checksum)


@dataclass(frozen=True)
class PutStart:
    """A started put: its version, where its replicas go, and for each the master's grant,
    which the store checks before it takes the bytes."""

    object_id: int
    replicas: Tuple[ReplicaLoc, ...]
    grants: Tuple[bytes, ...]

    @staticmethod
    def decode(d: Decoder) -> "PutStart":
        return PutStart(d.u64(), tuple(d.list(ReplicaLoc.decode)), tuple(d.list(Decoder.grant)))

    def encode(self, e: Encoder) -> None:
        e.u64(self.object_id).list(self.replicas, lambda e, r: r.encode(e))
        e.list(self.grants, Encoder.raw)


# ---- requests (meta bytes) and replies (parsers) ------------------------------------------


def ping(client_id: int) -> bytes:
    return Encoder().u64(client_id).bytes()


def auth_hello_req(nonce: bytes) -> bytes:
    """``AUTH_HELLO``: the client's nonce, as list<u8>."""
    return Encoder().list(list(nonce), Encoder.u8).bytes()


def auth_proof_req(proof: bytes) -> bytes:
    """``AUTH_PROOF``: the client's proof, as list<u8>."""
    return Encoder().list(list(proof), Encoder.u8).bytes()


def parse_auth_challenge(d: "Decoder") -> Tuple[bytes, bytes]:
    """The server's nonce and proof (empty when the server holds no secret)."""
    nonce = bytes(d.list(Decoder.u8))
    proof = bytes(d.list(Decoder.u8))
    return nonce, proof


def key_req(key: str) -> bytes:
    return Encoder().str(key).bytes()


def keys_req(keys: Sequence[str]) -> bytes:
    e = Encoder().count(len(keys))
    for k in keys:
        e.str(k)
    return e.bytes()


def remove_req(key: str, force: bool) -> bytes:
    return Encoder().str(key).bool(force).bytes()


def remove_all_req(force: bool, tenant: str) -> bytes:
    """REMOVE_ALL: every readable object of ``tenant``."""
    return Encoder().bool(force).str(tenant).bytes()


def batch_remove_req(keys: Sequence[str], force: bool) -> bytes:
    e = Encoder().bool(force).count(len(keys))
    for k in keys:
        e.str(k)
    return e.bytes()


def report_corrupt_req(key: str, version: int, segment_id: int) -> bytes:
    return Encoder().str(key).u64(version).u64(segment_id).bytes()


def batch_put_start_req(client_id: int, config: ReplicateConfig, items: Sequence[Tuple[str, int]]) -> bytes:
    e = Encoder().u64(client_id)
    config.encode(e)
    e.count(len(items))
    for key, size in items:
        e.str(key).u64(size)
    return e.bytes()


def batch_put_end_req(client_id: int, items: Sequence[Tuple[str, int, int, bool]]) -> bytes:
    """BATCH_PUT_END and BATCH_PUT_REVOKE: (key, object_id, checksum, unhashed) items."""
    e = Encoder().u64(client_id).count(len(items))
    for key, object_id, checksum, unhashed in items:
        e.str(key).u64(object_id).u32(checksum).bool(unhashed)
    return e.bytes()


def write_req(offset: int, key: str, version: int, checksum: int, grant: bytes) -> bytes:
    return Encoder().u64(offset).str(key).u64(version).u32(checksum).raw(_grant(grant)).bytes()


def _grant(grant: bytes) -> bytes:
    if len(grant) != GRANT_LEN:
        raise ProtocolError(f"a grant is {GRANT_LEN} bytes, not {len(grant)}")
    return grant


def read_req(offset: int, length: int) -> bytes:
    return Encoder().u64(offset).u64(length).bytes()


def seal_req(objects: Sequence[StoredObject], grants: Sequence[bytes]) -> bytes:
    """SEAL: the objects, then the master's grant for each (in the same order)."""
    if len(grants) != len(objects):
        raise ProtocolError(f"{len(grants)} grants for {len(objects)} objects")
    e = Encoder().count(len(objects))
    for o in objects:
        o.encode(e)
    e.count(len(grants))
    for g in grants:
        e.raw(_grant(g))
    return e.bytes()


def parse_bool(d: Decoder) -> bool:
    return d.bool()


def parse_u64(d: Decoder) -> int:
    return d.u64()


def parse_empty(d: Decoder) -> None:
    return None


def list_keys_req(pattern: str, limit: int, tenant: str) -> bytes:
    """LIST_KEYS: ``tenant``'s readable keys a regular expression (Rust's ``regex`` syntax)
    matches anywhere in them, at most ``limit``, as the tenant names them."""
    return Encoder().str(pattern).u32(limit).str(tenant).bytes()


def parse_list_keys(d: Decoder) -> Tuple[List[str], bool]:
    """The keys LIST_KEYS found (sorted) and whether more matched."""
    keys = d.list(Decoder.str)
    return keys, d.bool()


def parse_bools(d: Decoder) -> List[bool]:
    return d.list(Decoder.bool)


def parse_statuses(d: Decoder) -> List[int]:
    return d.list(Decoder.u16)


def parse_segments(d: Decoder) -> List[SegmentEntry]:
    return d.list(SegmentEntry.decode)


def parse_object_desc(d: Decoder) -> ObjectDesc:
    return ObjectDesc.decode(d)


def parse_batch_descs(d: Decoder) -> List["ObjectDesc | Failed"]:
    return d.list(lambda x: x.result(ObjectDesc.decode))


def parse_batch_put_start(d: Decoder) -> List["PutStart | Failed"]:
    return d.list(lambda x: x.result(PutStart.decode))


def error_message(meta) -> str:
    return bytes(meta).decode("utf-8", errors="replace")
