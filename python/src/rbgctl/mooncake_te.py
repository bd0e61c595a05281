"""Segments a Mooncake process mounted (a wheel process with a global segment, Mooncake's store
service), read and written through that process's Transfer Engine TCP transport: the frames
Mooncake's own clients send, so a pool of rbgctl stores and Mooncake processes works both ways.

The segment's Transfer Engine is found as Mooncake's clients find it: by a P2P handshake with
the port in the segment's name (``P2PHANDSHAKE``), or from the HTTP metadata server the process
publishes to (``MOONCAKE_TE_META_DATA_SERVER``, ``http://host:port/metadata``). Its descriptor
gives the data port and the buffers it serves; each request is checked against them before it
is sent. A request is a 24-byte header (bytes to move, the absolute address, the opcode: READ 0,
WRITE 1, ``| 0x80`` for protocol v2); v2 answers an 8-byte status frame, after a WRITE's bytes
are in place or before a READ's bytes. Nothing on this path is authenticated or checksummed by
the peer: the reader checks the CRC-32C against the master's, as on every path.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import urllib.parse
from typing import List, Optional, Sequence, Tuple

from .errors import ProtocolError, RemoteError, TransportError
from .status import Status

log = logging.getLogger("rbgctl.mooncake_te")

HEADER = struct.Struct("<QQB7x")
STATUS = struct.Struct("<Q")
STATUS_OK = 0x4D435456_00000000
STATUS_REFUSED = 0x4D435456_00000001
READ, WRITE, V2 = 0, 1, 0x80
# The handshake: a u64 length (type byte and JSON), the type (Metadata is 1), the JSON.
METADATA = 1
MAX_FRAME = 1 << 20
# Connections kept idle per segment for the next request.
KEEP_IDLE = 4


def discovery_of(setting: Optional[str]) -> Optional[str]:
    """Mooncake's metadata setting as this client uses it: the ``http://`` URL of a metadata
    server, or ``None``: by P2P handshake (``P2PHANDSHAKE``, unset, or a store this client does
    not read, etcd or redis, which is logged)."""
    if not setting or setting == "P2PHANDSHAKE":
        return None
    if setting.startswith("http://"):
        return setting
    log.warning(
        "metadata server %r: rbgctl's clients read only http:// metadata servers; segments that "
        "Mooncake's processes mounted are found by P2P handshake",
        setting,
    )
    return None


class Peer:
    """What a peer's descriptor says: its data address, protocol v2, the buffers it serves."""

    def __init__(self, name: str, d: dict):
        if not isinstance(d, dict) or d.get("protocol") != "tcp":
            raise ProtocolError(f"{name}: the segment descriptor's protocol is not tcp")
        port = d.get("tcp_data_port")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ProtocolError(f"{name}: the segment descriptor has no tcp_data_port")
        host = d.get("tcp_data_host") or name.rsplit(":", 1)[0].strip("[]")
        self.addr: Tuple[str, int] = (host, port)
        self.v2 = int(d.get("tcp_proto_version", 1)) >= 2
        buffers = d.get("buffers")
        if not isinstance(buffers, list):
            raise ProtocolError(f"{name}: the segment descriptor has no buffers")
        self.buffers = [
            (b["addr"], b["length"])
            for b in buffers
            if isinstance(b, dict) and isinstance(b.get("addr"), int) and isinstance(b.get("length"), int)
        ]

    def covers(self, addr: int, length: int) -> bool:
        return any(a <= addr and addr + length <= a + n for a, n in self.buffers)


def _recv_exact(sock: socket.socket, view: memoryview, what: str) -> None:
    pos, n = 0, view.nbytes
    while pos < n:
        got = sock.recv_into(view[pos:], n - pos)
        if got == 0:
            raise ConnectionError(f"{what}: connection closed by the peer")
        pos += got


def handshake(name: str, timeout_s: float) -> dict:
    """A P2P handshake as a client: sends a minimal descriptor of this side to the port in
    ``name`` (``host:port``) and reads the peer's."""
    host, _, port = name.rpartition(":")
    own = json.dumps({"name": "rbgctl-client", "protocol": "tcp", "buffers": []}).encode() + b"\n"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as s:
            s.sendall(struct.pack("<QB", 1 + len(own), METADATA) + own)
            head = bytearray(9)
            _recv_exact(s, memoryview(head), "handshake")
            length, kind = struct.unpack("<QB", head)
            if kind != METADATA or not 0 < length <= MAX_FRAME:
                raise ProtocolError(f"{name}: handshake answer of type {kind}, {length} bytes")
            body = bytearray(length - 1)
            _recv_exact(s, memoryview(body), "handshake")
    except (OSError, ValueError) as e:
        raise TransportError(name, f"Mooncake handshake for its segment descriptor: {e}") from None
    try:
        return json.loads(body)
    except ValueError as e:
        raise ProtocolError(f"{name}: the handshake's descriptor is not JSON: {e}") from None


def from_metadata_server(url: str, name: str, timeout_s: float) -> Optional[dict]:
    """``mooncake/ram/<name>`` from an HTTP metadata server; ``None`` when it has no such key."""
    import urllib.error
    import urllib.request

    query = urllib.parse.urlencode({"key": f"mooncake/ram/{name}"})
    try:
        with urllib.request.urlopen(f"{url}?{query}", timeout=timeout_s) as r:
            return json.loads(r.read(MAX_FRAME))
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise TransportError(url, f"answered {e.code} for {name}'s descriptor") from None
    except (OSError, ValueError) as e:
        raise TransportError(url, f"reading {name}'s descriptor: {e}") from None


class TeSegment:
    """One segment a Mooncake process mounted: ``name`` its Transfer Engine name (the master's
    ``te_endpoint``), ``base`` and ``length`` its addresses in that process."""

    def __init__(
        self,
        name: str,
        base: int,
        length: int,
        metadata_server: Optional[str],
        connect_timeout_s: float,
        io_timeout_s: float,
    ):
        self.name, self.base, self.length = name, base, length
        self.metadata_server = metadata_server
        self.connect_timeout_s, self.io_timeout_s = connect_timeout_s, io_timeout_s
        self._lock = threading.Lock()
        self._peer: Optional[Peer] = None
        self._idle: List[socket.socket] = []

    def _resolve(self) -> Peer:
        with self._lock:
            if self._peer is not None:
                return self._peer
        d = None
        if self.metadata_server:
            d = from_metadata_server(self.metadata_server, self.name, self.connect_timeout_s)
        if d is None:
            d = handshake(self.name, self.connect_timeout_s)
        peer = Peer(self.name, d)
        if not peer.covers(self.base, self.length):
            raise ProtocolError(
                f"{self.name}'s Transfer Engine does not serve the segment the master describes "
                f"([{self.base:#x}, +{self.length}) is in none of its buffers)"
            )
        with self._lock:
            self._peer = peer
        return peer

    def _connection(self, peer: Peer) -> Tuple[socket.socket, bool]:
        """A kept connection (and ``True``), or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        try:
            s = socket.create_connection(peer.addr, timeout=self.connect_timeout_s)
        except OSError as e:
            with self._lock:
                self._peer = None
            raise TransportError(f"{peer.addr[0]}:{peer.addr[1]}", e) from None
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(self.io_timeout_s)
        return s, False

    def _keep(self, s: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < KEEP_IDLE:
                self._idle.append(s)
                return
        s.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()

    def _request(self, op: int, offset: int, views: Sequence[memoryview]) -> None:
        size = sum(v.nbytes for v in views)
        if size == 0:
            return
        peer = self._resolve()
        addr = self.base + offset
        if offset < 0 or offset + size > self.length or not peer.covers(addr, size):
            raise RemoteError(
                Status.INVALID_PARAMS,
                f"range [{offset}, +{size}) is outside segment {self.name} ({self.length} bytes)",
            )
        head = HEADER.pack(size, addr, op | (V2 if peer.v2 else 0))
        for attempt in (1, 2):
            s, kept = self._connection(peer)
            try:
                self._exchange(s, head, op, views, peer.v2)
            except OSError as e:
                s.close()
                if kept and attempt == 1:
                    # A kept connection the peer closed meanwhile (it restarted?): once more
                    # on a new one.
                    self.close()
                    continue
                with self._lock:
                    self._peer = None
                raise TransportError(self.name, e) from None
            except BaseException:
                s.close()
                raise
            self._keep(s)
            return

    def _exchange(self, s: socket.socket, head: bytes, op: int, views: Sequence[memoryview], v2: bool) -> None:
        """One request on ``s``: the header, a WRITE's bytes, v2's status, a READ's bytes."""
        s.sendall(head)
        if op == WRITE:
            for v in views:
                s.sendall(v)
        if v2:
            frame = bytearray(8)
            _recv_exact(s, memoryview(frame), "status")
            (status,) = STATUS.unpack(frame)
            if status == STATUS_REFUSED:
                size, addr, _ = HEADER.unpack(head)
                raise RemoteError(Status.INVALID_PARAMS, f"{self.name}: the Transfer Engine refused [{addr:#x}, +{size})")
            if status != STATUS_OK:
                raise ProtocolError(f"{self.name}: status frame {status:#018x} is neither OK nor a refusal")
        if op == READ:
            for v in views:
                if v.nbytes:
                    _recv_exact(s, v, "read")

    def write(self, offset: int, views: Sequence[memoryview]) -> None:
        self._request(WRITE, offset, views)

    def read(self, offset: int, views: Sequence[memoryview]) -> None:
        self._request(READ, offset, views)
