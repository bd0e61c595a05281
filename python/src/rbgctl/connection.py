"""Blocking connections to a master or store, and a pool of idle ones per peer.

Requests go out with one ``sendmsg`` of header, meta and the caller's buffers (no copy into a
frame); reply payloads are received with ``recv_into`` straight into the caller's buffers.
Several requests may be sent before their replies are read (pipelining): replies come in order.
"""

from __future__ import annotations

import errno
import socket
import threading
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

from .errors import ObjectNotFound, ProtocolError, RemoteError, TransportError
from .protocol import (
    FLAG_EPOCH,
    HEADER_LEN,
    REFUSAL_ID,
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


class ConnectFailed(TransportError):
    """No connection could be made: the request never left."""


class StaleEpoch(TransportError):
    """An answer from a master of an older leadership epoch than one already heard from."""


class Fence:
    """The highest leadership epoch heard from the elected masters a pool follows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.epoch = 0

    def observe(self, epoch: int) -> int:
        """Raises the fence to ``epoch``; returns the fence as it was (refuse if above)."""
        with self._lock:
            known = self.epoch
            self.epoch = max(known, epoch)
            return known

    def set(self, epoch: int) -> None:
        """The election backend named the leader's epoch: it is the authority."""
        with self._lock:
            self.epoch = epoch


class Connection:
    """One TCP connection speaking protocol version 1. Not thread-safe: one user at a time."""

    def __init__(
        self,
        addr: str,
        connect_timeout: float,
        io_timeout: float,
        fence: Optional[Fence] = None,
        secret: Optional[bytes] = None,
        on_close: Optional[Callable[[], None]] = None,
    ):
        host, _, port = addr.rpartition(":")
        self.addr = addr
        self.fence = fence
        self.broken = False
        self._on_close = on_close
        self._next_id = 1
        self._header = bytearray(HEADER_LEN)
        try:
            self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=connect_timeout)
        except OSError as e:
            raise ConnectFailed(addr, f"cannot connect: {e}") from None
        self.sock.settimeout(io_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if secret is not None:
            from .auth import handshake

            handshake(self, secret)

    def close(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()
        self.broken = True
        try:
            self.sock.close()
        except OSError:
            pass

    def peer_open(self) -> bool:
        """Whether this idle connection is still open, asked without blocking (a peek): an end
        of stream, an error (a keepalive that gave up) or bytes nobody asked for all say no."""
        timeout = self.sock.gettimeout()
        try:
            self.sock.setblocking(False)
            self.sock.recv(1, socket.MSG_PEEK)
            return False
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            try:
                self.sock.settimeout(timeout)
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
        if h.is_reply and h.request_id == REFUSAL_ID:
            meta = bytearray(h.meta_len)
            if h.meta_len:
                self._recv_exact(memoryview(meta), "refusal")
            self.close()
            raise RemoteError(h.status, error_message(meta))
        if not h.is_reply or h.request_id != request_id or h.opcode != int(opcode):
            self.close()
            raise ProtocolError(
                f"{self.addr}: expected the reply to request {request_id} ({Opcode(opcode).name}), "
                f"got frame {h.request_id} opcode {h.opcode:#x} reply={h.is_reply}"
            )
        meta = bytearray(h.meta_len)
        if h.meta_len:
            self._recv_exact(memoryview(meta), "reply meta")
        epoch = 0
        if h.flags & FLAG_EPOCH:
            if len(meta) < 8:
                self.close()
                raise ProtocolError(f"{self.addr}: an epoch-stamped reply shorter than its epoch")
            epoch = int.from_bytes(meta[:8], "little")
            del meta[:8]
        if self.fence is not None and h.status != Status.NOT_LEADER:
            known = self.fence.observe(epoch)
            if epoch < known:
                self.close()
                raise StaleEpoch(self.addr, f"answer of leadership epoch {epoch}, the leader's is at least {known}; refused")
        if h.status != Status.OK:
            self.discard(h.data_len)
            if h.status in (Status.MALFORMED_FRAME, Status.UNAUTHENTICATED):
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

    def __init__(
        self,
        addr: str,
        connect_timeout: float,
        io_timeout: float,
        fence: Optional[Fence] = None,
        secret: Optional[bytes] = None,
    ):
        self.addr = addr
        self._timeouts = (connect_timeout, io_timeout)
        self._idle: List[Connection] = []
        self._lock = threading.Lock()
        self.fence = fence
        self._secret = secret
        self._keepalive_s: Optional[float] = None
        # Connections opened and closed so far: a client tells from it whether the connection
        # that bound it to the master may have gone.
        self.changes = 0
        # Times the pool was cleared: a prune that took the idle connections out while it was
        # cleared closes them instead of putting them back.
        self._clears = 0

    def keep_alive(self, idle_s: float) -> None:
        """TCP keepalive on the connections made from now on: probes after ``idle_s`` without
        traffic, then every fifth of that (at least a second); five unanswered end one."""
        self._keepalive_s = idle_s

    def _changed(self) -> None:
        with self._lock:
            self.changes += 1

    def _connect(self) -> Connection:
        conn = Connection(self.addr, *self._timeouts, fence=self.fence, secret=self._secret, on_close=self._changed)
        self._changed()
        if self._keepalive_s is not None:
            idle = max(1, int(self._keepalive_s))
            sock = conn.sock
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, idle // 5))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 5)
        return conn

    def prune_closed(self) -> None:
        """Closes the idle connections whose peer closed them, found without blocking. Those
        it took out while the pool was cleared are closed too (a clear closes every idle one)."""
        with self._lock:
            idle, self._idle = self._idle, []
            clears = self._clears
        still_open = []
        for c in idle:
            if c.peer_open():
                still_open.append(c)
            else:
                c.close()
        with self._lock:
            if self._clears == clears:
                self._idle.extend(still_open)
                return
        for c in still_open:
            c.close()

    def set_addr(self, addr: str) -> None:
        """Points the pool at another peer (the new leader); idle connections go."""
        self.addr = addr
        self.clear()

    def get(self) -> Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def put(self, conn: Connection) -> None:
        """Returns a connection in a clean state (every reply read); a broken one is dropped."""
        if conn.broken:
            return
        if conn.addr != self.addr:
            conn.close()
            return
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def clear(self) -> None:
        """Closes every idle connection (those a prune holds meanwhile as well)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._clears += 1
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
        conn = self._connect()
        try:
            out = conn.call(opcode, meta, parse)
        except RemoteError:
            self.put(conn)
            raise
        self.put(conn)
        return out


# TCP keepalive on the connections to the master: a master host that vanished ends them after
# about twice this without traffic, and the heartbeat then connects anew.
MASTER_KEEPALIVE_S = 10.0


class MasterPool:
    """The master's connections, following the leader of elected masters (``etcd://``,
    ``k8s://``): a call that fails because the master may have moved looks the leader up (at most
    every 100 ms) and, when the leader moved and the call surely did nothing (it could not
    connect, or a standby refused it), sends it to the new leader."""

    REFRESH_EVERY_S = 0.1

    def __init__(self, spec: str, connect_timeout: float, io_timeout: float, secret: Optional[bytes] = None):
        from .leader import parse_master

        self.spec = spec
        self.lookup = parse_master(spec)
        self.fence = Fence() if self.lookup is not None else None
        self._last_refresh = 0.0
        self._leader = None
        self.pool = Pool("" if self.lookup else spec, connect_timeout, io_timeout, self.fence, secret)
        self.pool.keep_alive(MASTER_KEEPALIVE_S)
        if self.lookup is not None:
            try:
                self.refresh(force=True)
            except TransportError:
                pass  # no leader yet: calls fail until there is one

    @property
    def addr(self) -> str:
        return self.pool.addr or f"{self.spec} (no leader known yet)"

    def refresh(self, force: bool = False) -> bool:
        """Looks the leader up; answers whether it moved."""
        import time

        if self.lookup is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_refresh < self.REFRESH_EVERY_S:
            return False
        self._last_refresh = now
        leader = self.lookup.leader()
        if leader == self._leader:
            return False
        self._leader = leader
        if leader is not None:
            self.fence.set(leader.epoch)
            if leader.rpc != self.pool.addr:
                self.pool.set_addr(leader.rpc)
        return True

    def _once(self, opcode: int, meta: bytes, parse: Callable) -> T:
        if not self.pool.addr:
            raise ConnectFailed(self.spec, "no master leader is elected yet (or the election backend cannot be reached)")
        return self.pool.call(opcode, meta, parse)

    def call(self, opcode: int, meta: bytes, parse: Callable) -> T:
        if self.lookup is None:
            return self.pool.call(opcode, meta, parse)
        try:
            return self._once(opcode, meta, parse)
        except (TransportError, RemoteError) as e:
            if isinstance(e, RemoteError) and e.status != Status.NOT_LEADER:
                raise
            try:
                moved = self.refresh()
            except TransportError:
                raise e from None
            # Safe to send again: it never reached a leader, or one that is not refused it.
            not_done = isinstance(e, (ConnectFailed, StaleEpoch, RemoteError))
            if moved and not_done:
                return self._once(opcode, meta, parse)
            raise

    def clear(self) -> None:
        self.pool.clear()
