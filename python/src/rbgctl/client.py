"""The pool client: what an inference engine uses to keep KV pages in the rbgctl pool.

A put asks the master for space (``BATCH_PUT_START``), writes every replica straight from the
caller's buffers (to the store over TCP, or by memory copy when the segment is on this host), then
commits (``BATCH_PUT_END``) with the CRC-32C of the value. A get asks the master where the object
is, reads one replica straight into the caller's buffers (``recv_into``), and checks the CRC; a
failing replica is reported and the next one tried. Batch forms pipeline the transfers to each
store on one connection.

One :class:`Client` per process is enough; it is thread-safe.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import protocol as p
from .buffers import regions, total
from .checksum import crc32c_of
from .config import ClientConfig, held_key
from .connection import MasterPool, Pool
from .errors import (
    BufferTooSmall,
    ChecksumError,
    ObjectNotFound,
    ProtocolError,
    RbgctlError,
    RemoteError,
    TransportError,
    Unreadable,
)
from .protocol import (
    Failed,
    ObjectDesc,
    Opcode,
    ReplicateConfig,
    SegmentEntry,
    SegmentInfo,
    Status,
    StoredObject,
)
from .mooncake_te import TeSegment, discovery_of
from .shm import LocalSegment, local_host_id

log = logging.getLogger("rbgctl.client")

# Most requests in flight on one connection in a batch.
PIPELINE_WINDOW = 128

Views = List[memoryview]


@dataclass
class Route:
    info: SegmentInfo
    pool: Pool
    local: Optional[LocalSegment]
    # A segment a Mooncake process mounted: its Transfer Engine.
    te: Optional[TeSegment] = None

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        if self.te is not None:
            self.te.close()


@dataclass
class Target:
    segment_id: int
    route: Route
    offset: int


class Stats:
    """Counters of what the client moved and how (read them to see which path was taken)."""

    FIELDS = (
        "puts",
        "gets",
        "bytes_written_tcp",
        "bytes_written_shm",
        "bytes_read_tcp",
        "bytes_read_shm",
        "checksum_failures",
        "replica_failures",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **counts: int) -> None:
        """Adds to several counters at once (one lock per batch, not per item)."""
        with self._lock:
            for name, n in counts.items():
                self._values[name] += n

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._values)


def _status_error(status: int, key: str) -> RemoteError:
    message = f"{key!r}: {p.status_name(status).lower().replace('_', ' ')}"
    if status == Status.OBJECT_NOT_FOUND:
        return ObjectNotFound(status, message)
    return RemoteError(status, message)


def _prefix(views: Views, n: int) -> Views:
    """The first ``n`` bytes of a list of regions."""
    out: Views = []
    for v in views:
        if n <= 0:
            break
        k = min(n, v.nbytes)
        out.append(v if k == v.nbytes else v[:k])
        n -= k
    return out


class Client:
    """A connection to the pool. ``Client()`` reads the master address from the environment
    (``MOONCAKE_CONFIG_PATH``, ``RBGCTL_MASTER``, ``MOONCAKE_MASTER``); ``Client("host:port")``
    or ``Client(ClientConfig(...))`` name it."""

    def __init__(self, config: Union[ClientConfig, str, None] = None):
        if config is None:
            config = ClientConfig.from_env()
        elif isinstance(config, str):
            config = ClientConfig(master=config)
        self.config = config
        self.id = random.SystemRandom().randrange(1, 1 << 63)
        self.stats = Stats()
        self._host_id = local_host_id()
        # How segments Mooncake's processes mounted are found (their metadata server, or None).
        self._te_metadata = discovery_of(self.config.metadata_server)
        self._secret = config.auth_secret()
        self._master = MasterPool(config.master, config.connect_timeout_s, config.io_timeout_s, self._secret)
        self._routes: Dict[int, Route] = {}
        self._pools: Dict[str, Pool] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # The first heartbeat checks that the master is there (and lets us in).
        try:
            self._master_call(Opcode.PING, p.ping(self.id), p.parse_bool)
        except BaseException:
            self._master.clear()
            raise
        # Nothing else runs yet: the connection that ping went on is the one it bound.
        bound = self._master.pool.changes
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, args=(bound,), name="rbgctl-heartbeat", daemon=True
        )
        self._heartbeat.start()
        log.debug("connected to master %s as client %x", config.master, self.id)

    # ---- lifecycle ----

    def close(self) -> None:
        """Stops heartbeats and closes every connection and mapping."""
        self._stop.set()
        if self._heartbeat.is_alive() and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=5)
        try:  # tell the master we are gone, so that it need not wait for us to expire
            self._master_call(Opcode.LEAVE, p.ping(self.id), p.parse_empty)
        except Exception:  # noqa: BLE001 - leaving is best effort
            pass
        self._master.clear()
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
            routes, self._routes = list(self._routes.values()), {}
        for pool in pools:
            pool.clear()
        for r in routes:
            r.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _heartbeat_loop(self, bound: int) -> None:
        """Keeps this client known to the master. A ping binds the connection it goes on to
        this client, and the master counts a client without segments live while that
        connection is open: so a tick pings only when the connections to the master changed
        since the last ping answered (``bound``: their count of changes then), after it closed
        the idle ones the master closed. Ticks are ``heartbeat_interval_s`` moved by up to half
        of itself at random, so that clients cut off together come back spread out."""
        pool = self._master.pool
        while not self._stop.wait(self.config.heartbeat_interval_s * (0.5 + random.random())):
            pool.prune_closed()
            changes = pool.changes
            if changes == bound:
                continue
            try:
                self._master_call(Opcode.PING, p.ping(self.id), p.parse_bool)
                bound = changes
            except RbgctlError as e:
                log.debug("heartbeat failed: %s", e)

    # ---- single objects ----

    def _held(self, key: str) -> str:
        """``key`` as the master holds it: in this client's tenant's namespace."""
        return held_key(self.config.tenant, key)

    def _held_all(self, keys: Sequence[str]) -> List[str]:
        return [held_key(self.config.tenant, k) for k in keys]

    def put(self, key: str, value, config: Optional[ReplicateConfig] = None) -> None:
        """Stores ``value`` (a buffer, ``(ptr, size)``, tensor, or a list of them) under ``key``,
        replacing any previous value."""
        err = self.batch_put([key], [value], config)[0]
        if err is not None:
            raise err

    def get(self, key: str) -> bytearray:
        """The value of ``key`` in a new buffer. Raises :class:`ObjectNotFound` when absent."""
        key = self._held(key)
        desc = self._describe(key)
        buf = bytearray(desc.size)
        self._read_object(key, desc, [memoryview(buf)])
        return buf

    def get_into(self, key: str, target) -> int:
        """Reads ``key`` into the caller's memory (a writable buffer, ``(ptr, size)``, a tensor or
        a list of them, filled in order); returns the value's length."""
        views = regions(target, writable=True)
        key = self._held(key)
        desc = self._describe(key)
        have = total(views)
        if have < desc.size:
            raise BufferTooSmall(key, desc.size, have)
        self._read_object(key, desc, _prefix(views, desc.size))
        return desc.size

    def get_size(self, key: str) -> int:
        return self._describe(self._held(key)).size

    def describe(self, key: str) -> ObjectDesc:
        """Size, checksum, version and replica locations of ``key`` (takes a read lease)."""
        return self._describe(self._held(key))

    def exists(self, key: str) -> bool:
        return self._master_call(Opcode.EXISTS, p.key_req(self._held(key)), p.parse_bool)

    def remove(self, key: str, force: bool = False) -> None:
        """Removes ``key``; refused (``OBJECT_HAS_LEASE``) while a reader holds a lease, unless
        ``force``."""
        key = self._held(key)
        self._master_call(Opcode.REMOVE, p.remove_req(key, force), p.parse_empty, key)

    def remove_all(self, force: bool = False) -> int:
        """Removes every object of this client's tenant (leased ones only with ``force``);
        returns how many."""
        req = p.remove_all_req(force, self.config.tenant)
        return self._master_call(Opcode.REMOVE_ALL, req, p.parse_u64)

    def keys(self, pattern: str = "", limit: int = 1000) -> Tuple[List[str], bool]:
        """Up to ``limit`` of this client's tenant's readable keys that ``pattern`` (a regular
        expression, Rust's ``regex`` syntax) matches anywhere in them, sorted, and whether more
        match."""
        req = p.list_keys_req(pattern, limit, self.config.tenant)
        return self._master_call(Opcode.LIST_KEYS, req, p.parse_list_keys)

    def segments(self) -> List[SegmentEntry]:
        """The live segments, as the master lists them."""
        return self._master_call(Opcode.LIST_SEGMENTS, b"", p.parse_segments)

    # ---- batches ----

    def batch_exists(self, keys: Sequence[str]) -> List[bool]:
        if not keys:
            return []
        keys = self._held_all(keys)
        out = self._master_call(Opcode.BATCH_EXISTS, p.keys_req(keys), p.parse_bools)
        if len(out) != len(keys):
            raise ProtocolError(f"master answered {len(out)} items for {len(keys)} keys")
        return out

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[Optional[RbgctlError]]:
        if not keys:
            return []
        keys = self._held_all(keys)
        statuses = self._master_call(Opcode.BATCH_REMOVE, p.batch_remove_req(keys, force), p.parse_statuses)
        if len(statuses) != len(keys):
            raise ProtocolError(f"master answered {len(statuses)} items for {len(keys)} keys")
        return [None if s == Status.OK else _status_error(s, k) for s, k in zip(statuses, keys)]

    def batch_get(self, keys: Sequence[str]) -> List[Union[bytearray, RbgctlError]]:
        """Each value in a new buffer, or the error that kept it from being read."""
        keys = self._held_all(keys)
        descs = self._batch_describe(keys)
        bufs = [bytearray(d.size) if isinstance(d, ObjectDesc) else bytearray() for d in descs]
        results = self._batch_read(keys, descs, [[memoryview(b)] for b in bufs])
        return [b if isinstance(r, int) else r for r, b in zip(results, bufs)]

    def batch_get_into(self, keys: Sequence[str], targets: Sequence) -> List[Union[int, RbgctlError]]:
        """Reads each key into its target (as for :meth:`get_into`); per key, the value's length
        or the error."""
        if len(keys) != len(targets):
            raise ValueError(f"{len(keys)} keys but {len(targets)} targets")
        views: List[Optional[Views]] = []
        bad: Dict[int, RbgctlError] = {}
        for i, t in enumerate(targets):
            try:
                views.append(regions(t, writable=True))
            except RbgctlError as e:
                views.append(None)
                bad[i] = e
        keys = self._held_all(keys)
        descs = self._batch_describe(keys)
        fitted: List[Views] = []
        for i, d in enumerate(descs):
            if i in bad:
                descs[i] = bad[i]
                fitted.append([])
                continue
            if isinstance(d, ObjectDesc):
                have = total(views[i])
                if have < d.size:
                    descs[i] = BufferTooSmall(keys[i], d.size, have)
                    fitted.append([])
                    continue
                fitted.append(_prefix(views[i], d.size))
            else:
                fitted.append([])
        return self._batch_read(keys, descs, fitted)

    def batch_put(
        self, keys: Sequence[str], values: Sequence, config: Optional[ReplicateConfig] = None
    ) -> List[Optional[RbgctlError]]:
        """Puts several values with one master round trip to start, pipelined writes to each store
        and one round trip to commit. Per key: ``None`` when stored, else the error."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        keys = self._held_all(keys)
        config = config or self.config.replicate
        results: List[Optional[RbgctlError]] = [None] * len(keys)
        views: List[Views] = [[] for _ in keys]
        failed = [False] * len(keys)
        for i, v in enumerate(values):
            try:
                views[i] = regions(v, writable=False)
            except RbgctlError as e:
                results[i], failed[i] = e, True
        sizes = [total(v) for v in views]
        todo = [i for i in range(len(keys)) if not failed[i]]
        if not todo:
            return results
        try:
            meta = p.batch_put_start_req(self.id, config, [(keys[i], sizes[i]) for i in todo])
            started = self._master_call(Opcode.BATCH_PUT_START, meta, p.parse_batch_put_start)
        except RbgctlError as e:
            for i in todo:
                results[i] = e
            return results
        if len(started) != len(todo):
            err = ProtocolError(f"master answered {len(started)} items for {len(todo)} puts")
            for i in todo:
                results[i] = err
            return results

        object_ids: Dict[int, int] = {}
        checksums: Dict[int, int] = {}
        # Each replica write with the master's grant for it: (item, offset, grant).
        remote: Dict[str, Tuple[Pool, List[Tuple[int, int, bytes]]]] = {}
        seals: Dict[str, Tuple[Pool, List[Tuple[int, StoredObject, bytes]]]] = {}
        shm_bytes = tcp_bytes = 0
        for i, s in zip(todo, started):
            if isinstance(s, Failed):
                results[i] = _status_error(s.status, keys[i])
                continue
            object_ids[i] = s.object_id
            checksums[i] = crc32c_of(views[i])
            size = sizes[i]
            if len(s.grants) != len(s.replicas):
                results[i] = ProtocolError(f"the master sent {len(s.grants)} grants for {len(s.replicas)} replicas")
                continue
            for r, grant in zip(s.replicas, s.grants):
                try:
                    route = self._route(r.segment_id)
                except RbgctlError as e:
                    results[i] = e
                    continue
                if route.te is not None:
                    try:
                        route.te.write(r.offset, views[i])
                        tcp_bytes += size
                    except RbgctlError as e:
                        results[i] = e
                elif route.local is not None and route.local.write(r.offset, views[i]):
                    shm_bytes += size
                    if route.info.segment_uuid != 0:
                        obj = StoredObject(keys[i], s.object_id, r.offset, size, checksums[i])
                        seals.setdefault(route.info.endpoint, (route.pool, []))[1].append((i, obj, grant))
                else:
                    remote.setdefault(route.info.endpoint, (route.pool, []))[1].append((i, r.offset, grant))

        for endpoint, (pool, items) in seals.items():
            self._seal(endpoint, pool, items, keys, results)
        for pool, items in remote.values():
            outcome = self._pipelined_writes(pool, items, keys, views, object_ids, checksums)
            for (i, _, _), err in zip(items, outcome):
                if err is None:
                    tcp_bytes += sizes[i]
                elif results[i] is None:
                    results[i] = err

        commit = [i for i in object_ids if results[i] is None]
        revoke = [i for i in object_ids if results[i] is not None]
        if revoke:
            try:
                meta = p.batch_put_end_req(self.id, [(keys[i], object_ids[i], 0, False) for i in revoke])
                self._master_call(Opcode.BATCH_PUT_REVOKE, meta, p.parse_statuses)
            except RbgctlError as e:
                log.warning("revoking failed puts: %s; the master reclaims them later", e)
        if commit:
            try:
                meta = p.batch_put_end_req(self.id, [(keys[i], object_ids[i], checksums[i], False) for i in commit])
                statuses = self._master_call(Opcode.BATCH_PUT_END, meta, p.parse_statuses)
                if len(statuses) != len(commit):
                    raise ProtocolError(f"master answered {len(statuses)} items for {len(commit)} commits")
                for i, st in zip(commit, statuses):
                    if st != Status.OK:
                        results[i] = _status_error(st, keys[i])
            except RbgctlError as e:
                for i in commit:
                    results[i] = e
        self.stats.add(
            puts=sum(1 for i in commit if results[i] is None),
            bytes_written_shm=shm_bytes,
            bytes_written_tcp=tcp_bytes,
        )
        return results

    # ---- internals: master ----

    def _master_call(self, opcode: int, meta: bytes, parse, key: Optional[str] = None):
        try:
            return self._master.call(opcode, meta, parse)
        except ObjectNotFound as e:
            if key is not None:
                raise ObjectNotFound(e.status, f"key {key!r} not found") from None
            raise

    def _describe(self, key: str) -> ObjectDesc:
        return self._master_call(Opcode.GET_REPLICAS, p.key_req(key), p.parse_object_desc, key)

    def _batch_describe(self, keys: Sequence[str]) -> list:
        """Per key an :class:`ObjectDesc` or the error; a failed call fails every key."""
        if not keys:
            return []
        try:
            descs = self._master_call(Opcode.BATCH_GET_REPLICAS, p.keys_req(keys), p.parse_batch_descs)
        except RbgctlError as e:
            return [e] * len(keys)
        if len(descs) != len(keys):
            err = ProtocolError(f"master answered {len(descs)} items for {len(keys)} keys")
            return [err] * len(keys)
        return [_status_error(d.status, k) if isinstance(d, Failed) else d for d, k in zip(descs, keys)]

    # ---- internals: routes ----

    def _pool_for(self, endpoint: str) -> Pool:
        with self._lock:
            pool = self._pools.get(endpoint)
            if pool is None:
                pool = Pool(
                    endpoint,
                    self.config.connect_timeout_s,
                    self.config.io_timeout_s,
                    secret=self._secret,
                )
                self._pools[endpoint] = pool
            return pool

    def _refresh_routes(self) -> None:
        entries = self.segments()
        live = {e.id for e in entries}
        with self._lock:
            gone = [sid for sid in self._routes if sid not in live]
            known = set(self._routes)
        closed = []
        for e in entries:
            if e.id in known:
                continue
            # A disk tier segment (tier 1) is read over TCP: its file is meant for O_DIRECT reads.
            if not e.info.endpoint:
                # A segment a Mooncake process mounted: no rbgctl store serves it.
                te = TeSegment(
                    e.info.te_endpoint,
                    e.info.te_base,
                    e.info.size,
                    self._te_metadata,
                    self.config.connect_timeout_s,
                    self.config.io_timeout_s,
                )
                route = Route(e.info, self._pool_for(e.info.endpoint), None, te)
            else:
                shareable = self.config.same_host_shm and e.info.tier == 0
                local = LocalSegment.open(e.info, self._host_id) if shareable else None
                route = Route(e.info, self._pool_for(e.info.endpoint), local)
            with self._lock:
                if e.id in self._routes:
                    closed.append(route)
                else:
                    self._routes[e.id] = route
        with self._lock:
            for sid in gone:
                r = self._routes.pop(sid, None)
                if r is not None:
                    closed.append(r)
        for r in closed:
            r.close()

    def _route(self, segment_id: int) -> Route:
        with self._lock:
            route = self._routes.get(segment_id)
        if route is not None:
            return route
        self._refresh_routes()
        with self._lock:
            route = self._routes.get(segment_id)
        if route is None:
            raise RemoteError(Status.SEGMENT_NOT_FOUND, f"segment {segment_id} is not mounted")
        return route

    def _targets(self, desc: ObjectDesc) -> List[Target]:
        """The object's replicas resolved, local ones first."""
        out: List[Target] = []
        last: Optional[RbgctlError] = None
        for r in desc.replicas:
            try:
                route = self._route(r.segment_id)
            except RbgctlError as e:
                last = e
                continue
            out.append(Target(r.segment_id, route, r.offset))
        if not out:
            raise last or Unreadable("object has no replicas")
        out.sort(key=lambda t: t.route.local is None)
        return out

    # ---- internals: reads ----

    def _read_remote(self, pool: Pool, offset: int, views: Views) -> None:
        conn = pool.get()
        request_id = conn.send(Opcode.READ, p.read_req(offset, total(views)))
        try:
            h, _ = conn.recv_reply(request_id, Opcode.READ)
            conn.recv_data_into(h, views)
        finally:
            pool.put(conn)

    def _read_object(self, key: str, desc: ObjectDesc, views: Views) -> None:
        """Reads one object into ``views``, trying each replica (local first) until one passes
        its CRC check."""
        last = "no replica tried"
        bad_checksum = False
        for t in self._targets(desc):
            try:
                if t.route.te is not None:
                    t.route.te.read(t.offset, views)
                    self.stats.add(bytes_read_tcp=desc.size)
                elif t.route.local is not None and t.route.local.read(t.offset, views):
                    self.stats.add(bytes_read_shm=desc.size)
                else:
                    self._read_remote(t.route.pool, t.offset, views)
                    self.stats.add(bytes_read_tcp=desc.size)
            except RbgctlError as e:
                last = str(e) if isinstance(e, TransportError) else f"{t.route.info.endpoint}: {e}"
                self.stats.add(replica_failures=1)
                if isinstance(e, TransportError):
                    t.route.pool.clear()
                continue
            if desc.holds(lambda: crc32c_of(views)):
                self.stats.add(gets=1)
                return
            bad_checksum = True
            self.stats.add(checksum_failures=1)
            log.warning("%r: checksum mismatch on segment %s; trying another replica", key, t.route.info.name)
            try:  # the master drops the corrupt replica so that no one is sent to it again
                self._master_call(
                    Opcode.REPORT_CORRUPT,
                    p.report_corrupt_req(key, desc.version, t.segment_id),
                    p.parse_empty,
                )
            except RbgctlError as e:
                log.debug("cannot report a corrupt replica: %s", e)
        if bad_checksum:
            raise ChecksumError(f"{key!r}: checksum mismatch on every readable replica")
        raise Unreadable(f"{key!r}: no replica could be read ({last})")

    def _batch_read(
        self, keys: Sequence[str], descs: list, views: List[Views]
    ) -> List[Union[int, RbgctlError]]:
        results: List[Union[None, bool, RbgctlError]] = [None] * len(keys)
        remote: Dict[str, Tuple[Pool, List[Tuple[int, int]]]] = {}
        shm_bytes = tcp_bytes = gets = 0
        for i, d in enumerate(descs):
            if not isinstance(d, ObjectDesc):
                results[i] = d
                continue
            try:
                first = self._targets(d)[0]
            except RbgctlError as e:
                results[i] = e
                continue
            if first.route.te is not None:
                continue  # read one by one below, through the Mooncake process's Transfer Engine
            if first.route.local is not None and first.route.local.read(first.offset, views[i]):
                shm_bytes += d.size
                results[i] = True
            else:
                remote.setdefault(first.route.info.endpoint, (first.route.pool, []))[1].append(
                    (i, first.offset)
                )
        for pool, items in remote.values():
            for (i, _), ok in zip(items, self._pipelined_reads(pool, items, views)):
                if ok:
                    tcp_bytes += descs[i].size
                    results[i] = True
        out: List[Union[int, RbgctlError]] = []
        for i, d in enumerate(descs):
            r = results[i]
            if not isinstance(d, ObjectDesc):
                out.append(r)  # type: ignore[arg-type]
            elif r is True and d.holds(lambda: crc32c_of(views[i])):
                gets += 1
                out.append(d.size)
            elif isinstance(r, RbgctlError):
                out.append(r)
            else:  # unread, or read with a bad checksum: the careful path over every replica
                try:
                    self._read_object(keys[i], d, views[i])
                    out.append(d.size)
                except RbgctlError as e:
                    out.append(e)
        self.stats.add(bytes_read_shm=shm_bytes, bytes_read_tcp=tcp_bytes, gets=gets)
        return out

    def _pipelined_reads(self, pool: Pool, items: List[Tuple[int, int]], views: List[Views]) -> List[bool]:
        """READs in windows on one connection, each payload received straight into its views.
        Per item, whether it was read."""
        ok = [False] * len(items)
        try:
            conn = pool.get()
        except TransportError:
            return ok
        try:
            for start in range(0, len(items), PIPELINE_WINDOW):
                window = range(start, min(start + PIPELINE_WINDOW, len(items)))
                ids = [
                    conn.send(Opcode.READ, p.read_req(items[j][1], total(views[items[j][0]]))) for j in window
                ]
                for j, request_id in zip(window, ids):
                    try:
                        h, _ = conn.recv_reply(request_id, Opcode.READ)
                        conn.recv_data_into(h, views[items[j][0]])
                        ok[j] = True
                    except RemoteError as e:
                        log.debug("read %d from %s: %s", j, pool.addr, e)
        except (TransportError, ProtocolError) as e:
            log.debug("pipelined reads from %s stopped: %s", pool.addr, e)
            pool.clear()
        finally:
            pool.put(conn)
        return ok

    # ---- internals: writes ----

    def _pipelined_writes(
        self,
        pool: Pool,
        items: List[Tuple[int, int, bytes]],
        keys: Sequence[str],
        views: List[Views],
        object_ids: Dict[int, int],
        checksums: Dict[int, int],
    ) -> List[Optional[RbgctlError]]:
        """WRITEs in windows on one connection, payloads sent from the caller's buffers."""
        out: List[Optional[RbgctlError]] = []
        try:
            conn = pool.get()
        except TransportError as e:
            return [e] * len(items)
        try:
            for start in range(0, len(items), PIPELINE_WINDOW):
                window = range(start, min(start + PIPELINE_WINDOW, len(items)))
                ids = []
                for j in window:
                    i, offset, grant = items[j]
                    meta = p.write_req(offset, keys[i], object_ids[i], checksums[i], grant)
                    ids.append(conn.send(Opcode.WRITE, meta, views[i]))
                for request_id in ids:
                    try:
                        conn.recv_reply(request_id, Opcode.WRITE)
                        out.append(None)
                    except RemoteError as e:
                        out.append(e)
        except (TransportError, ProtocolError) as e:
            pool.clear()
            out.extend([e] * (len(items) - len(out)))
        finally:
            pool.put(conn)
        return out

    def _seal(
        self,
        endpoint: str,
        pool: Pool,
        items: List[Tuple[int, StoredObject, bytes]],
        keys: Sequence[str],
        results: List[Optional[RbgctlError]],
    ) -> None:
        """Has a persistent store record objects copied into its segment through shared memory."""
        try:
            meta = p.seal_req([o for _, o, _ in items], [g for _, _, g in items])
            statuses = pool.call(Opcode.SEAL, meta, p.parse_statuses)
            if len(statuses) != len(items):
                raise ProtocolError(
                    f"{endpoint}: store answered {len(statuses)} items for {len(items)} seals"
                )
        except RbgctlError as e:
            for i, _, _ in items:
                results[i] = e
            return
        for (i, _, _), st in zip(items, statuses):
            if st != Status.OK:
                results[i] = _status_error(st, keys[i])
