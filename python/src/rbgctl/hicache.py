"""SGLang HiCache L3 storage backend over the rbgctl pool.

SGLang loads it with its dynamic backend loader::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "rbgctl",
            "module_path": "rbgctl.hicache", "class_name": "RbgctlHiCacheStorage",
            "master": "10.0.0.1:50051", "interface_v1": 1}'

(``"master": "etcd://h1:2379;h2:2379/cluster_id"`` follows elected masters, see ``rbgctl.leader``.)

With ``interface_v1`` SGLang calls :meth:`batch_get_v1` / :meth:`batch_set_v1`, which move each
page between the host KV pool and the store with no copy in Python: the pool's page pointers
(``get_page_buffer_meta``) are sent with ``sendmsg`` and filled with ``recv_into`` (or copied
straight from/to the mapped segment of a store on the same host). Without it, the generic
:meth:`batch_get` / :meth:`batch_set` move flat page tensors.

Keys. SGLang names a page by the chained SHA-256 of its tokens. One object per page is stored
under ``[<extra_backend_tag>_]<page hash>_<model>[_<tp_rank>_<tp_size>][_<pp_size>_<pp_rank>]
[_cp<rank>_<size>]`` (HiCacheFile's suffix): each tensor-parallel rank of an MHA model stores its
own heads, while MLA models, whose latent KV is the same on every rank, share one copy. A page's
object holds the page as the generic path's flat page lays it out: the K of every layer, then
the V of every layer. The ``page_first`` layouts list a page's regions in that order already;
the MHA ``layer_first`` layout lists them layer by layer (K0 V0 K1 V1 ...), and the zero-copy
path puts them in the flat page's order, so servers using either path, in any layout, share
pages byte for byte.

Attaching: the backend connects to the master when SGLang constructs it. A master that does not
answer yet is waited for up to ``connect_timeout`` seconds (extra config, default 30); then the
constructor raises, and SGLang does not start. Once attached, failures are never raised: they
read as misses and are logged.

Hybrid models (Mamba, SWA, DSA and DeepSeek V4 side pools) use SGLang's v2 pool API
(:meth:`batch_exists_v2`, :meth:`batch_get_v2`, :meth:`batch_set_v2`): each registered pool's
page is one object, the KV page under its usual key (so v1, generic and v2 servers share KV
pages) and a side pool's under ``<page hash>.<pool>`` with the same suffix (Mamba states, which
every TP rank shards, keep the TP rank in it even for MLA models), each holding the pool's flat
page. Existence follows the pools' hit policies: every page (``all_pages``) or the trailing
window (``trailing_pages``); a policy this backend does not know reads as a miss.
"""

from __future__ import annotations

import importlib
import logging
import time
import types
from typing import Any, List, Optional, Sequence

from .buffers import regions, total
from .config import ClientConfig
from .engine import attach, leading_true, put_missing
from .errors import ObjectNotFound, RbgctlError

log = logging.getLogger("rbgctl.hicache")

try:  # the real base class when running inside SGLang (its loader checks the subclass)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # type: ignore
except ImportError:  # outside SGLang: benchmarks, scripts

    class HiCacheStorage:  # type: ignore[no-redef]
        """Stand-in base used when SGLang is not installed."""

        def register_mem_pool_host(self, mem_pool_host) -> None:
            self.mem_pool_host = mem_pool_host


# extra-config keys that belong to SGLang (its loader and prefetch policy) or that this backend
# reads itself; everything else must be a client setting (see ClientConfig.KEYS).
SGLANG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "prefetch_threshold",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "prefetch_timeout_max",
        "hicache_storage_pass_prefix_keys",
        "tp_lcm_size",
        # Added by SGLang when --file-storage-path is given (HiCacheFile's directory).
        "file_storage_path",
    }
)
OWN_KEYS = frozenset({"extra_backend_tag", "connect_timeout"})


class StorageMetrics:
    """SGLang's ``StorageMetrics`` shape (four lists), for an SGLang whose class cannot be
    imported."""

    def __init__(self):
        self.prefetch_pgs: List[int] = []
        self.backup_pgs: List[int] = []
        self.prefetch_bandwidth: List[float] = []
        self.backup_bandwidth: List[float] = []


def storage_metrics_class():
    """SGLang's own ``StorageMetrics`` class: ``sglang.srt.observability.metrics_collector``
    (0.5.2x) or ``sglang.srt.metrics.collector`` (0.5.5), whose ``log_storage_metrics`` checks
    the type; this module's stand-in outside SGLang."""
    for module in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        try:
            return getattr(importlib.import_module(module), "StorageMetrics")
        except (ImportError, AttributeError):
            continue
    return StorageMetrics


def key_suffix(storage_config: Any, tp_sharded: bool = False) -> str:
    """The per-server key suffix (HiCacheFile's scheme): model, then the TP rank and size unless
    the model is MLA (or ``tp_sharded``: state every rank holds a shard of), the PP size and rank
    with pipeline parallelism, the attention-CP rank and size with context parallelism."""
    if storage_config is None:
        return ""
    model = getattr(storage_config, "model_name", None) or ""
    suffix = "_" + "-".join(model.split("/")) if model else ""
    if tp_sharded or not getattr(storage_config, "is_mla_model", False):
        suffix += f"_{storage_config.tp_rank}_{storage_config.tp_size}"
    pp_size = getattr(storage_config, "pp_size", 1) or 1
    if pp_size > 1:
        suffix += f"_{pp_size}_{storage_config.pp_rank}"
    cp_size = getattr(storage_config, "attn_cp_size", 1) or 1
    if cp_size > 1:
        suffix += f"_cp{storage_config.attn_cp_rank}_{cp_size}"
    return suffix


class RbgctlHiCacheStorage(HiCacheStorage):
    """HiCache storage over the rbgctl pool; constructed by SGLang as ``cls(storage_config,
    kwargs)``. Every method reports failures as misses (``False``/``None``/``0``) and logs them:
    SGLang calls it from daemon threads that must not die."""

    def __init__(self, storage_config: Any = None, kwargs: Optional[dict] = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.client_config = ClientConfig.from_mapping(
            extra, source="hicache extra config", extra_keys=SGLANG_KEYS | OWN_KEYS
        )
        tag = extra.get("extra_backend_tag")
        self.prefix = f"{tag}_" if tag else ""
        self.suffix = key_suffix(storage_config)
        self.tp_suffix = key_suffix(storage_config, tp_sharded=True)
        self.registered_pools: dict = {}
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.enable_storage_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        if getattr(storage_config, "should_split_heads", False):
            log.info("tp_lcm_size is set: pages are shared only between servers of the same TP size")
        self.mem_pool_host = None
        self.client = attach(
            self.client_config,
            float(extra.get("connect_timeout", 30)),
            "raise connect_timeout in --hicache-storage-backend-extra-config",
        )
        self.prefetch_pgs: List[int] = []
        self.backup_pgs: List[int] = []
        self.prefetch_bandwidth: List[float] = []
        self.backup_bandwidth: List[float] = []
        log.info(
            "rbgctl HiCache backend: master %s, key suffix %r, replicas %d",
            self.client_config.master,
            self.suffix,
            self.client_config.replicate.replica_num,
        )

    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        self.registered_pools[_pool_name(host_pool_name)] = host_pool

    def storage_key(self, key: str) -> str:
        return f"{self.prefix}{key}{self.suffix}"

    def component_key(self, key: str, pool_name: Any = None) -> str:
        """The object of one pool's page: the KV page's usual key, or ``<hash>.<pool>`` with
        the suffix (the TP-sharded one for Mamba states)."""
        name = _pool_name(pool_name)
        if name in ("", "kv", "__default__"):
            return self.storage_key(key)
        suffix = self.tp_suffix if name == "mamba" else self.suffix
        return f"{self.prefix}{key}.{name}{suffix}"

    # ---- existence ----

    def exists(self, key: str) -> bool:
        try:
            return self.client.exists(self.storage_key(key))
        except RbgctlError as e:
            log.warning("exists: %s", e)
            return False

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many keys from the start are stored (the cached prefix, in pages)."""
        if not keys:
            return 0
        try:
            return leading_true(self.client.batch_exists([self.storage_key(k) for k in keys]))
        except RbgctlError as e:
            log.warning("batch_exists: %s", e)
            return 0

    # ---- zero-copy (v1) ----

    def _page_regions(self, keys: Sequence[str], host_indices) -> List[list]:
        """Each page's memory as a list of ``(ptr, size)`` regions, from the host pool."""
        pool = self.mem_pool_host
        if pool is None:
            raise RbgctlError("register_mem_pool_host was not called")
        page_size = getattr(pool, "page_size", 1) or 1
        if len(host_indices) != len(keys) * page_size:
            raise RbgctlError(f"{len(host_indices)} host indices for {len(keys)} pages of {page_size} tokens")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if isinstance(sizes, int):
            sizes = [sizes] * len(ptrs)
        if len(ptrs) != len(sizes) or len(ptrs) % len(keys):
            raise RbgctlError(
                f"host pool gave {len(ptrs)} pointers and {len(sizes)} sizes for {len(keys)} pages"
            )
        per = len(ptrs) // len(keys)
        pages = [
            [(int(ptrs[i * per + j]), int(sizes[i * per + j])) for j in range(per)] for i in range(len(keys))
        ]
        if getattr(pool, "layout", "") == "layer_first" and not self.is_mla and per % 2 == 0:
            # K0 V0 K1 V1 ... as the pool lists them; K of every layer, then V, as stored.
            pages = [page[0::2] + page[1::2] for page in pages]
        return pages

    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        """Reads pages straight into the host pool; per page, whether it was read."""
        if not keys:
            return []
        if getattr(self.mem_pool_host, "kv_buffer", True) is None:
            return [True] * len(keys)  # a logical KV anchor: the data lives in v2 side pools
        try:
            targets = self._page_regions(keys, host_indices)
        except RbgctlError as e:
            log.error("batch_get_v1: %s", e)
            return [False] * len(keys)
        start = time.perf_counter()
        results = self.client.batch_get_into([self.storage_key(k) for k in keys], targets)
        elapsed = time.perf_counter() - start
        ok = [isinstance(r, int) and r == sum(s for _, s in t) for r, t in zip(results, targets)]
        self._log_failures("batch_get_v1", keys, results, ok)
        if self.enable_storage_metrics:
            self._record(self.prefetch_pgs, self.prefetch_bandwidth, targets, ok, elapsed)
        return ok

    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        """Stores the pages not stored yet, straight from the host pool; per page, whether it
        is stored."""
        if not keys:
            return []
        if getattr(self.mem_pool_host, "kv_buffer", True) is None:
            return [True] * len(keys)
        try:
            sources = self._page_regions(keys, host_indices)
        except RbgctlError as e:
            log.error("batch_set_v1: %s", e)
            return [False] * len(keys)
        start = time.perf_counter()
        ok = put_missing(self.client, [self.storage_key(k) for k in keys], sources)
        if self.enable_storage_metrics:
            self._record(self.backup_pgs, self.backup_bandwidth, sources, ok, time.perf_counter() - start)
        return ok

    # ---- generic ----

    @staticmethod
    def _target(location, size):
        if isinstance(location, int) and isinstance(size, int):
            return (location, size)  # a raw pointer and size, Mooncake-style
        return location

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        """The page into ``target_location`` (a flat page tensor, a buffer or a pointer with
        ``target_sizes``), returned; or a new ``bytearray`` without a target; ``None`` on a miss."""
        out = self.batch_get(
            [key],
            None if target_location is None else [target_location],
            None if target_sizes is None else [target_sizes],
        )
        return out[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> list:
        if not keys:
            return []
        skeys = [self.storage_key(k) for k in keys]
        if target_locations is None:
            try:
                got = self.client.batch_get(skeys)
            except RbgctlError as e:
                log.warning("batch_get: %s", e)
                return [None] * len(keys)
            return [g if isinstance(g, bytearray) else None for g in got]
        sizes = target_sizes if target_sizes is not None else [None] * len(keys)
        if len(target_locations) != len(keys) or len(sizes) != len(keys):
            log.error("batch_get: %d keys but %d targets", len(keys), len(target_locations))
            return [None] * len(keys)
        targets = [self._target(t, s) for t, s in zip(target_locations, sizes)]
        start = time.perf_counter()
        try:
            results = self.client.batch_get_into(skeys, targets)
        except RbgctlError as e:
            log.warning("batch_get: %s", e)
            return [None] * len(keys)
        elapsed = time.perf_counter() - start
        if self.enable_storage_metrics:
            ok = [isinstance(r, int) and r == _nbytes(t) for r, t in zip(results, targets)]
            sizes_read = [[(0, _nbytes(t))] for t in targets]
            self._record(self.prefetch_pgs, self.prefetch_bandwidth, sizes_read, ok, elapsed)
        out = []
        for key, r, t, loc in zip(keys, results, targets, target_locations):
            if isinstance(r, int) and r == _nbytes(t):
                out.append(loc)
            else:
                if isinstance(r, int):
                    log.warning("%s: stored page is %d bytes, the target %d", key, r, _nbytes(t))
                elif not isinstance(r, ObjectNotFound):
                    log.warning("batch_get %s: %s", key, r)
                out.append(None)
        return out

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set(
            [key],
            None if value is None else [value],
            None if target_location is None else [target_location],
            None if target_sizes is None else [target_sizes],
        )

    def batch_set(
        self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Stores the pages not stored yet; true when every page is stored."""
        if not keys:
            return False
        if values is not None:
            sources = list(values)
        elif target_locations is not None:
            sizes = target_sizes if target_sizes is not None else [None] * len(keys)
            sources = [self._target(t, s) for t, s in zip(target_locations, sizes)]
        else:
            log.error("batch_set: neither values nor target locations")
            return False
        if len(sources) != len(keys):
            log.error("batch_set: %d keys but %d values", len(keys), len(sources))
            return False
        start = time.perf_counter()
        ok = put_missing(self.client, [self.storage_key(k) for k in keys], sources)
        if self.enable_storage_metrics:
            layout = [[(0, _source_nbytes(src))] for src in sources]
            self._record(self.backup_pgs, self.backup_bandwidth, layout, ok, time.perf_counter() - start)
        return all(ok)

    # ---- hybrid pools (v2) ----

    def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None, extra_info: Any = None):
        """The usable prefix (``PoolTransferResult``): the leading KV pages present, cut where a
        side pool's hit policy is not met."""
        transfers = list(pool_transfers or [])
        names = ["kv"] + [_pool_name(t.name) for t in transfers]
        wanted = [self.component_key(k, n) for n in names for k in keys]
        try:
            flags = self.client.batch_exists(wanted) if wanted else []
        except RbgctlError as e:
            log.warning("batch_exists_v2: %s", e)
            flags = [False] * len(wanted)
        present = {n: flags[i * len(keys) : (i + 1) * len(keys)] for i, n in enumerate(names)}
        kv_pages = leading_true(present["kv"])
        hits = {"kv": kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t in transfers:
            if not restorable:
                break
            name, have = _pool_name(t.name), present[_pool_name(t.name)]
            policy = _pool_name(getattr(t, "hit_policy", "all_pages")) or "all_pages"
            if policy == "all_pages":
                boundary = leading_true(have[:kv_pages])
                ok = set(range(1, boundary + 1))
            elif policy == "trailing_pages":
                window = max(1, len(t.keys) if t.keys else 1)
                ok = {p for p in range(1, kv_pages + 1) if all(have[max(0, p - window) : p])}
                boundary = max(ok, default=0)
            else:
                log.warning("batch_exists_v2: hit policy %r of pool %s is not supported: a miss", policy, name)
                ok, boundary = set(), 0
            if boundary:
                hits[t.name] = boundary
            restorable = [p for p in restorable if p in ok]
        return _pool_transfer_result(restorable[-1] if restorable else 0, hits, restorable)

    def _pool_of(self, name: str):
        pool = self.registered_pools.get(name)
        if pool is None and name == "kv":
            pool = self.mem_pool_host
        return pool

    def _v2_pages(self, transfer):
        """The pool, the keys and each page's first host index of a transfer; ``None`` (logged)
        when they do not fit together."""
        name = _pool_name(transfer.name)
        pool = self._pool_of(name)
        keys = list(transfer.keys or [])
        indices = transfer.host_indices
        page = getattr(pool, "page_size", 1) or 1
        count = _index_count(indices)
        if pool is None or count != len(keys) * page:
            log.error("v2 transfer of pool %s: %s keys, %s host indices, pool %s", name, len(keys), count,
                      "registered" if pool is not None else "not registered")
            return None
        firsts = [_index_at(indices, i * page) for i in range(len(keys))]
        return pool, keys, firsts

    def _each_transfer(self, transfers: List[Any], move) -> dict:
        """``move(pool, keys, first host index of each page, pool name)`` for each transfer
        that fits together; per pool, per page, whether it was moved."""
        out = {}
        for t in transfers:
            fit = self._v2_pages(t)
            out[t.name] = [False] * len(t.keys or []) if fit is None else move(*fit, t.name)
        return out

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> dict:
        """Each transfer's pages into its host pool (flat pages)."""

        def read(pool, keys, firsts, name) -> List[bool]:
            pages = [pool.get_dummy_flat_data_page() for _ in keys]
            ok = []
            for first, page in zip(firsts, self._get_components(keys, name, pages)):
                if page is not None:
                    pool.set_from_flat_data_page(first, page)
                ok.append(page is not None)
            return ok

        return self._each_transfer(transfers, read)

    def _get_components(self, keys: List[str], pool_name: Any, pages: list) -> list:
        skeys = [self.component_key(k, pool_name) for k in keys]
        try:
            results = self.client.batch_get_into(skeys, pages)
        except RbgctlError as e:
            log.warning("batch_get_v2 %s: %s", _pool_name(pool_name), e)
            return [None] * len(keys)
        return [p if isinstance(r, int) and r == _nbytes(p) else None for r, p in zip(results, pages)]

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> dict:
        """Each transfer's pages from its host pool, those not stored yet."""

        def write(pool, keys, firsts, name) -> List[bool]:
            pages = [pool.get_data_page(first, flat=True) for first in firsts]
            return put_missing(self.client, [self.component_key(k, name) for k in keys], pages)

        return self._each_transfer(transfers, write)

    # ---- shared ----

    @staticmethod
    def _log_failures(op: str, keys, results, ok) -> None:
        bad = [
            (k, r) for k, r, good in zip(keys, results, ok) if not good and not isinstance(r, ObjectNotFound)
        ]
        if bad:
            log.warning("%s: %d of %d pages unreadable (first: %s: %s)", op, len(bad), len(keys), *bad[0])

    @staticmethod
    def _record(pages: list, bandwidth: list, layout: list, ok: List[bool], elapsed: float) -> None:
        done = sum(1 for x in ok if x)
        if not done or elapsed <= 0:
            return
        nbytes = sum(sum(s for _, s in r) for r, good in zip(layout, ok) if good)
        pages.append(done)
        bandwidth.append(nbytes / elapsed / (1 << 30))

    def clear(self) -> None:
        """Removes every unleased object of the pool (as Mooncake's backend does)."""
        try:
            n = self.client.remove_all(force=False)
            log.info("cleared %d objects from the pool", n)
        except RbgctlError as e:
            log.warning("clear: %s", e)

    def get_stats(self):
        """SGLang's ``StorageMetrics`` (its own class, on every version the docs name) with what
        was moved since the last call; ``None`` with metrics off."""
        if not self.enable_storage_metrics:
            return None
        stats = storage_metrics_class()()
        stats.prefetch_pgs.extend(self.prefetch_pgs)
        stats.backup_pgs.extend(self.backup_pgs)
        stats.prefetch_bandwidth.extend(self.prefetch_bandwidth)
        stats.backup_bandwidth.extend(self.backup_bandwidth)
        for x in (self.prefetch_pgs, self.backup_pgs, self.prefetch_bandwidth, self.backup_bandwidth):
            x.clear()
        return stats

    def close(self) -> None:
        self.client.close()


def _nbytes(target) -> int:
    return total(regions(target, writable=True))


def _source_nbytes(source) -> int:
    """Bytes of a value to store: a buffer, a list of buffers (a page's K and V), a tensor."""
    try:
        return total(regions(source, writable=False))
    except (TypeError, ValueError):
        return 0


def _pool_name(name: Any) -> str:
    """A pool's name as a string (SGLang passes its ``PoolName`` enum)."""
    if name is None:
        return ""
    return str(getattr(name, "value", name))


def _index_count(indices) -> int:
    if indices is None:
        return 0
    numel = getattr(indices, "numel", None)
    return int(numel()) if callable(numel) else len(indices)


def _index_at(indices, i: int) -> int:
    v = indices[i]
    item = getattr(v, "item", None)
    return int(item()) if callable(item) else int(v)


def _pool_transfer_result(final_pages: int, hits: dict, restorable: List[int]):
    """SGLang's ``PoolTransferResult`` (with the restorable prefixes where its version has
    them); a plain stand-in outside SGLang."""
    try:
        from sglang.srt.mem_cache.hicache_storage import PoolTransferResult  # type: ignore
    except ImportError:
        PoolTransferResult = None
    if PoolTransferResult is None:
        return types.SimpleNamespace(
            kv_hit_pages=final_pages, extra_pool_hit_pages=hits, restorable_prefix_pages=restorable
        )
    try:
        return PoolTransferResult(final_pages, hits, restorable)
    except TypeError:
        return PoolTransferResult(final_pages, hits)
