"""Blocking connections to a master or store, and a pool of idle ones per peer.

Requests go out with one ``sendmsg`` of header, meta and the caller's buffers (no copy into a
frame); reply payloads are received with ``recv_into`` straight into the caller's buffers.
Several requests may be sent before their replies are read (pipelining): replies come in order.
"""

from __future__ import annotations

import errno
import socket
import threading
from typing import Callable, List, Sequence, Tuple, TypeVar

from .errors import ObjectNotFound, ProtocolError, RemoteError, TransportError
from .protocol import (
    HEADER_LEN,
    Header,
    Opcode,
    Status,
    decode,
    error_message,
    pack_header,
    unpack_header,
)

T = TypeVar("T")

# sendmsg takes at most IOV_MAX (1024 on Linux) buffers at once.
_IOV_MAX = 1024
# Most idle connections kept per peer.
MAX_IDLE = 64
_DISCARD_CHUNK = 1 << 20
_STALE_ERRNOS = {errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED}


class StaleConnection(TransportError):
    """The peer closed a connection before answering (it restarted, or closed an idle one)."""


class Connection:
    """One TCP connection speaking protocol version 1. Not thread-safe: one user at a time."""

    def __init__(self, addr: str, connect_timeout: float, io_timeout: float):
        host, _, port = addr.rpartition(":")
        self.addr = addr
        self.broken = False
        self._next_id = 1
        self._header = bytearray(HEADER_LEN)
        try:
            self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=connect_timeout)
        except OSError as e:
            raise TransportError(addr, f"cannot connect: {e}") from None
        self.sock.settimeout(io_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.broken = True
        try:
            self.sock.close()
        except OSError:
            pass

    def _fail(self, e: BaseException, what: str) -> TransportError:
        self.close()
        if isinstance(e, OSError) and e.errno in _STALE_ERRNOS:
            return StaleConnection(self.addr, f"{what}: {e}")
        if isinstance(e, socket.timeout):
            return TransportError(self.addr, f"{what}: timed out")
        return TransportError(self.addr, f"{what}: {e}")

    # ---- sending ----

    def send(self, opcode: int, meta: bytes, data: Sequence[memoryview] = ()) -> int:
        """Sends one request; ``data`` is the payload, sent from the caller's buffers."""
        request_id = self._next_id
        self._next_id += 1
        data_len = 0
        for d in data:
            data_len += d.nbytes
        head = pack_header(opcode, request_id, len(meta), data_len) + meta
        self._sendv([memoryview(head), *data])
        return request_id

    def _sendv(self, bufs: List[memoryview]) -> None:
        i = 0
        try:
            while i < len(bufs):
                sent = self.sock.sendmsg(bufs[i : i + _IOV_MAX])
                while sent > 0:
                    n = bufs[i].nbytes
                    if sent >= n:
                        sent -= n
                        i += 1
                    else:
                        bufs[i] = bufs[i][sent:]
                        sent = 0
                while i < len(bufs) and bufs[i].nbytes == 0:
                    i += 1
        except OSError as e:
            raise self._fail(e, "send") from None

    # ---- receiving ----

    def _recv_exact(self, view: memoryview, what: str, stale_if_empty: bool = False) -> None:
        pos, n = 0, view.nbytes
        try:
            while pos < n:
                got = self.sock.recv_into(view[pos:], n - pos)
                if got == 0:
                    self.close()
                    if stale_if_empty and pos == 0:
                        raise StaleConnection(self.addr, f"{what}: connection closed by the peer")
                    raise TransportError(self.addr, f"{what}: connection closed by the peer")
                pos += got
        except OSError as e:
            raise self._fail(e, what) from None

    def recv_reply(self, request_id: int, opcode: int) -> Tuple[Header, bytearray]:
        """Reads the reply header and meta of request ``request_id``. A non-OK status raises
        :class:`RemoteError` (the connection stays usable unless the frame was malformed)."""
        self._recv_exact(memoryview(self._header), "reply", stale_if_empty=True)
        try:
            h = unpack_header(self._header)
        except ProtocolError:
            self.close()
            raise
        if not h.is_reply or h.request_id != request_id or h.opcode != int(opcode):
            self.close()
            raise ProtocolError(
                f"{self.addr}: expected the reply to request {request_id} ({Opcode(opcode).name}), "
                f"got frame {h.request_id} opcode {h.opcode:#x} reply={h.is_reply}"
            )
        meta = bytearray(h.meta_len)
        if h.meta_len:
            self._recv_exact(memoryview(meta), "reply meta")
        if h.status != Status.OK:
            self.discard(h.data_len)
            if h.status == Status.MALFORMED_FRAME:
                self.close()  # the server closes it too
            message = error_message(meta)
            if h.status == Status.OBJECT_NOT_FOUND:
                raise ObjectNotFound(h.status, message)
            raise RemoteError(h.status, message)
        return h, meta

    def recv_data_into(self, h: Header, views: Sequence[memoryview]) -> None:
        """Receives a reply's payload into ``views``, which must add up to its length."""
        want = sum(v.nbytes for v in views)
        if h.data_len != want:
            self.close()
            raise ProtocolError(f"{self.addr}: peer sent {h.data_len} bytes, expected {want}")
        for v in views:
            if v.nbytes:
                self._recv_exact(v, "reply data")

    def discard(self, n: int) -> None:
        if n <= 0:
            return
        scratch = memoryview(bytearray(min(n, _DISCARD_CHUNK)))
        while n > 0:
            k = min(n, scratch.nbytes)
            self._recv_exact(scratch[:k], "reply data")
            n -= k

    def call(self, opcode: int, meta: bytes, parse: Callable) -> T:
        """One request without payload; its reply's meta decoded with ``parse``."""
        request_id = self.send(opcode, meta)
        h, reply = self.recv_reply(request_id, opcode)
        if h.data_len:
            self.close()
            raise ProtocolError(
                f"{self.addr}: unexpected {h.data_len}-byte payload in a {Opcode(opcode).name} reply"
            )
        try:
            return decode(reply, parse)
        except ProtocolError as e:
            self.close()
            raise ProtocolError(f"{self.addr}: {Opcode(opcode).name} reply: {e}") from None


class Pool:
    """Idle connections to one peer, shared by threads."""

    def __init__(self, addr: str, connect_timeout: float, io_timeout: float):
        self.addr = addr
        self._timeouts = (connect_timeout, io_timeout)
        self._idle: List[Connection] = []
        self._lock = threading.Lock()

    def get(self) -> Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return Connection(self.addr, *self._timeouts)

    def put(self, conn: Connection) -> None:
        """Returns a connection in a clean state (every reply read); a broken one is dropped."""
        if conn.broken:
            return
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def call(self, opcode: int, meta: bytes, parse: Callable) -> T:
        """A request on a pooled connection. A reused connection the peer had closed (it
        restarted) is replaced by a fresh one and the request sent once more."""
        with self._lock:
            reused = self._idle.pop() if self._idle else None
        if reused is not None:
            try:
                out = reused.call(opcode, meta, parse)
                self.put(reused)
                return out
            except StaleConnection:
                self.clear()
            except RemoteError:
                self.put(reused)
                raise
        conn = Connection(self.addr, *self._timeouts)
        try:
            out = conn.call(opcode, meta, parse)
        except RemoteError:
            self.put(conn)
            raise
        self.put(conn)
        return out
