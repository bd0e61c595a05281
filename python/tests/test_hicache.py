"""The HiCache backend driven the way SGLang drives it, against a live pool.

SGLang is too large to install here, so this file stands in for the parts of it the backend
meets: ``sglang.srt.mem_cache.hicache_storage`` (``HiCacheStorage`` with SGLang's method
signatures, ``HiCacheStorageConfig``, ``HiCacheStorageExtraInfo``), the dynamic backend loader,
a host KV pool in the MHA ``page_first`` layout (and an MLA one), and the cache controller's
storage loops: prefix existence in batches of 128 pages, backup, prefetch into host memory.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import sys
import time
import types
import unittest
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional

from harness import LivePool, wait_until

STORAGE_BATCH_SIZE = 128  # SGLang's pages per batched storage call


# ---- the stand-in for sglang.srt.mem_cache.hicache_storage ---------------------------------


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    """SGLang's abstract base, with its method signatures."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(
        self, keys: List[str], host_indices, extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(
        self, keys: List[str], host_indices, extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        pass

    @abstractmethod
    def batch_get(
        self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None
    ):
        pass

    @abstractmethod
    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        pass

    @abstractmethod
    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        pass

    @abstractmethod
    def exists(self, key: str) -> bool:
        pass

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        for i in range(len(keys)):
            if not self.exists(keys[i]):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None


def install_stand_in() -> None:
    names = ["sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.hicache_storage"]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    mod = sys.modules["sglang.srt.mem_cache.hicache_storage"]
    mod.HiCacheStorage = HiCacheStorage
    mod.HiCacheStorageConfig = HiCacheStorageConfig
    mod.HiCacheStorageExtraInfo = HiCacheStorageExtraInfo
    mod.STORAGE_BATCH_SIZE = STORAGE_BATCH_SIZE


install_stand_in()
import rbgctl.hicache  # noqa: E402  (after the stand-in, as inside SGLang)

importlib.reload(rbgctl.hicache)  # in case another test module imported it first


def create_backend(storage_config: HiCacheStorageConfig, host_pool) -> HiCacheStorage:
    """SGLang's StorageBackendFactory for "dynamic", then the controller's registration."""
    extra = storage_config.extra_config or {}
    for required in ("backend_name", "module_path", "class_name"):
        if required not in extra:
            raise ValueError(f"missing {required}")
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    if not issubclass(cls, HiCacheStorage):
        raise TypeError(f"{cls} is not a HiCacheStorage")
    backend = cls(storage_config, {})
    backend.register_mem_pool_host(host_pool)
    return backend


# ---- host pools -----------------------------------------------------------------------------


class PageFirstHostPool:
    """MHA host pool, ``page_first`` layout: kv_buffer (2, tokens, layers, heads, head_dim) in
    one block of host memory; a page's K and V are two regions."""

    layout = "page_first"

    def __init__(self, pages: int, page_size: int, token_bytes: int):
        self.page_size = page_size
        self.size = pages * page_size
        self.token_bytes = token_bytes
        self.memory = (ctypes.c_ubyte * (2 * self.size * token_bytes))()
        self.base = ctypes.addressof(self.memory)
        self.kv_buffer = self.memory
        self.half = self.size * token_bytes

    def page_half_bytes(self) -> int:
        return self.page_size * self.token_bytes

    def get_page_buffer_meta(self, indices):
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            k = self.base + indices[i] * self.token_bytes
            ptrs += [k, k + self.half]
        return ptrs, [self.page_half_bytes()] * len(ptrs)

    def _views(self, index: int):
        mv = memoryview(self.memory).cast("B")
        n, k = self.page_half_bytes(), index * self.token_bytes
        return mv[k : k + n], mv[self.half + k : self.half + k + n]

    def get_data_page(self, index: int, flat: bool = True):
        k, v = self._views(index)
        return bytes(k) + bytes(v) if flat else [k, v]

    def get_dummy_flat_data_page(self):
        return bytearray(2 * self.page_half_bytes())

    def set_from_flat_data_page(self, index: int, data) -> None:
        k, v = self._views(index)
        n = self.page_half_bytes()
        k[:] = data[:n]
        v[:] = data[n:]

    def fill(self, index: int, seed: int) -> None:
        k, v = self._views(index)
        k[:] = bytes((seed * 7 + i) & 0xFF for i in range(len(k)))
        v[:] = bytes((seed * 13 + i * 3) & 0xFF for i in range(len(v)))


class MLAHostPool(PageFirstHostPool):
    """MLA host pool: one latent region per page."""

    def get_page_buffer_meta(self, indices):
        ptrs = [self.base + indices[i] * self.token_bytes for i in range(0, len(indices), self.page_size)]
        return ptrs, [self.page_half_bytes()] * len(ptrs)

    def _views(self, index: int):
        mv = memoryview(self.memory).cast("B")
        n, k = self.page_half_bytes(), index * self.token_bytes
        return mv[k : k + n], mv[k + n : k + n]

    def get_dummy_flat_data_page(self):
        return bytearray(self.page_half_bytes())


class LayerFirstHostPool:
    """MHA host pool, ``layer_first`` layout, as SGLang's MHATokenToKVPoolHost lays it out:
    kv_buffer (2, layers, tokens, heads, head_dim). ``get_page_buffer_meta`` lists a page's
    regions layer by layer, K then V (K0 V0 K1 V1 ...); the flat page of ``get_data_page`` is
    ``kv_buffer[:, :, page]``: the K of every layer, then the V of every layer."""

    layout = "layer_first"
    LAYERS = 4

    def __init__(self, pages: int, page_size: int, token_bytes: int):
        self.page_size = page_size
        self.size = pages * page_size
        self.layer_bytes = token_bytes // self.LAYERS  # per token and layer, K or V
        self.memory = (ctypes.c_ubyte * (2 * self.LAYERS * self.size * self.layer_bytes))()
        self.base = ctypes.addressof(self.memory)
        self.kv_buffer = self.memory

    def _offset(self, kv: int, layer: int, token: int) -> int:
        return ((kv * self.LAYERS + layer) * self.size + token) * self.layer_bytes

    def _region(self) -> int:
        return self.page_size * self.layer_bytes

    def get_page_buffer_meta(self, indices):
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            for layer in range(self.LAYERS):
                ptrs += [self.base + self._offset(0, layer, indices[i]), self.base + self._offset(1, layer, indices[i])]
        return ptrs, [self._region()] * len(ptrs)

    def _views(self, index: int):
        mv = memoryview(self.memory).cast("B")
        n = self._region()
        return [mv[self._offset(kv, layer, index) :][:n] for kv in (0, 1) for layer in range(self.LAYERS)]

    def get_data_page(self, index: int, flat: bool = True):
        views = self._views(index)
        return b"".join(bytes(v) for v in views) if flat else views

    def get_dummy_flat_data_page(self):
        return bytearray(2 * self.LAYERS * self._region())

    def set_from_flat_data_page(self, index: int, data) -> None:
        n = self._region()
        for i, v in enumerate(self._views(index)):
            v[:] = data[i * n : (i + 1) * n]

    def fill(self, index: int, seed: int) -> None:
        for i, v in enumerate(self._views(index)):
            v[:] = bytes((seed * 7 + i * 31 + j) & 0xFF for j in range(len(v)))


# ---- the cache controller's storage loops -----------------------------------------------------


def page_hashes(tokens: List[int], page_size: int) -> List[str]:
    """SGLang's chained page keys: sha256(previous hash bytes + the page's tokens, 4 bytes LE)."""
    out, last = [], None
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = hashlib.sha256()
        if last is not None:
            h.update(bytes.fromhex(last))
        for t in tokens[i : i + page_size]:
            h.update(t.to_bytes(4, "little", signed=False))
        last = h.hexdigest()
        out.append(last)
    return out


def storage_hit_query(backend, hashes: List[str]) -> int:
    """Pages of the prefix in storage: batches of 128, stopping at the first partial batch."""
    hit = 0
    for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
        batch = hashes[i : i + STORAGE_BATCH_SIZE]
        n = backend.batch_exists(batch, HiCacheStorageExtraInfo(prefix_keys=hashes[:i]))
        hit += n
        if n < len(batch):
            break
    return hit


def page_backup(backend, pool, hashes: List[str], host_indices: List[int], v1: bool) -> bool:
    for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
        batch = hashes[i : i + STORAGE_BATCH_SIZE]
        idx = host_indices[i * pool.page_size : (i + len(batch)) * pool.page_size]
        if v1:
            ok = all(backend.batch_set_v1(batch, idx, None))
        else:
            data = [pool.get_data_page(idx[j * pool.page_size], flat=False) for j in range(len(batch))]
            ok = backend.batch_set(batch, data)
        if not ok:
            return False
    return True


def page_prefetch(backend, pool, hashes: List[str], host_indices: List[int], v1: bool) -> int:
    """Pages fetched into the host pool, in order, stopping at the first failure."""
    done = 0
    for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
        batch = hashes[i : i + STORAGE_BATCH_SIZE]
        idx = host_indices[i * pool.page_size : (i + len(batch)) * pool.page_size]
        if v1:
            results = backend.batch_get_v1(batch, idx, None)
            n = 0
            while n < len(batch) and results[n]:
                n += 1
        else:
            dsts = [pool.get_dummy_flat_data_page() for _ in batch]
            data = backend.batch_get(batch, dsts)
            n = 0
            while n < len(batch) and data[n] is not None:
                pool.set_from_flat_data_page(idx[n * pool.page_size], data[n])
                n += 1
        done += n
        if n < len(batch):
            break
    return done


# ---- the tests --------------------------------------------------------------------------------

PAGE = 4  # tokens per page
TOKEN_BYTES = 1024  # K or V bytes per token: 8 KiB per page


def config(
    master: str, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, **extra
) -> HiCacheStorageConfig:
    ec = {
        "backend_name": "rbgctl",
        "module_path": "rbgctl.hicache",
        "class_name": "RbgctlHiCacheStorage",
        "interface_v1": 1,
        "master": master,
        "prefetch_threshold": 256,
    }
    ec.update(extra)
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=True,
        is_page_first_layout=True,
        model_name="Qwen/Qwen3-8B",
        extra_config=ec,
    )


def tokens(n_pages: int, seed: int = 0) -> List[int]:
    return [(seed * 100_003 + i * 7919) % 151_000 for i in range(n_pages * PAGE)]


class ControllerDriven(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pool = LivePool(stores=2, segment="64MiB")
        cls.backends = []

    @classmethod
    def tearDownClass(cls):
        for b in cls.backends:
            b.close()
        cls.pool.close()

    def server(self, pages: int = 400, pool_cls=PageFirstHostPool, **kw):
        """One SGLang server (one rank): its host pool and the backend the loader makes."""
        host = pool_cls(pages, PAGE, TOKEN_BYTES)
        backend = create_backend(config(self.pool.master, **kw), host)
        self.backends.append(backend)
        return host, backend

    def assertSamePages(self, a, a_slots, b, b_slots):
        for x, y in zip(a_slots, b_slots):
            self.assertEqual(a.get_data_page(x * PAGE), b.get_data_page(y * PAGE), f"page at slot {x}/{y}")

    def test_backup_then_prefix_query_and_prefetch_on_another_server(self):
        host_a, a = self.server()
        hashes = page_hashes(tokens(300, seed=1), PAGE)
        slots_a = list(range(300))
        for s in slots_a:
            host_a.fill(s * PAGE, seed=s)
        self.assertEqual(storage_hit_query(a, hashes), 0)
        self.assertTrue(
            page_backup(a, host_a, hashes, [s * PAGE + t for s in slots_a for t in range(PAGE)], v1=True)
        )
        host_b, b = self.server()
        self.assertEqual(storage_hit_query(b, hashes), 300)  # 128 + 128 + 44
        slots_b = [399 - s for s in range(300)]  # somewhere else in B's host memory
        idx_b = [s * PAGE + t for s in slots_b for t in range(PAGE)]
        self.assertEqual(page_prefetch(b, host_b, hashes, idx_b, v1=True), 300)
        self.assertSamePages(host_a, slots_a, host_b, slots_b)
        stats = b.get_stats()
        self.assertEqual(sum(stats.prefetch_pgs), 300)
        self.assertTrue(all(bw > 0 for bw in stats.prefetch_bandwidth))

    def test_partial_prefix_stops_at_the_first_missing_page(self):
        host_a, a = self.server()
        seq = tokens(300, seed=2)
        stored = page_hashes(seq[: 200 * PAGE], PAGE)
        idx = [s * PAGE + t for s in range(200) for t in range(PAGE)]
        self.assertTrue(page_backup(a, host_a, stored, idx, v1=True))
        full = page_hashes(seq, PAGE)
        self.assertEqual(full[:200], stored, "keys are chained: a prefix has the same page keys")
        host_b, b = self.server()
        self.assertEqual(storage_hit_query(b, full), 200)
        got = page_prefetch(b, host_b, full, [s * PAGE + t for s in range(300) for t in range(PAGE)], v1=True)
        self.assertEqual(got, 200)
        # A sequence that diverges inside page 10 shares only the first 10 pages.
        other = list(seq)
        other[10 * PAGE + 1] += 1
        self.assertEqual(storage_hit_query(b, page_hashes(other, PAGE)), 10)

    def test_tensor_parallel_ranks_keep_their_own_pages_and_mla_shares_one(self):
        hashes = page_hashes(tokens(20, seed=3), PAGE)
        idx = [s * PAGE + t for s in range(20) for t in range(PAGE)]
        ranks = []
        for r in range(2):
            host, backend = self.server(pages=20, tp_rank=r, tp_size=2)
            for s in range(20):
                host.fill(s * PAGE, seed=1000 * (r + 1) + s)
            ranks.append((host, backend))
        self.assertTrue(page_backup(ranks[0][1], ranks[0][0], hashes, idx, v1=True))
        self.assertEqual(storage_hit_query(ranks[1][1], hashes), 0, "rank 1 does not see rank 0's heads")
        self.assertTrue(page_backup(ranks[1][1], ranks[1][0], hashes, idx, v1=True))
        for r, (_, backend) in enumerate(ranks):
            fresh = PageFirstHostPool(20, PAGE, TOKEN_BYTES)
            backend.register_mem_pool_host(fresh)
            self.assertEqual(page_prefetch(backend, fresh, hashes, idx, v1=True), 20)
            self.assertSamePages(ranks[r][0], range(20), fresh, range(20))

        mla0_host, mla0 = self.server(pages=20, pool_cls=MLAHostPool, tp_rank=0, tp_size=2, mla=True)
        for s in range(20):
            mla0_host.fill(s * PAGE, seed=7 + s)
        self.assertTrue(page_backup(mla0, mla0_host, hashes, idx, v1=True))  # rank 0 backs up
        mla1_host, mla1 = self.server(pages=20, pool_cls=MLAHostPool, tp_rank=1, tp_size=2, mla=True)
        self.assertEqual(storage_hit_query(mla1, hashes), 20, "MLA ranks share one copy")
        self.assertEqual(page_prefetch(mla1, mla1_host, hashes, idx, v1=True), 20)
        self.assertSamePages(mla0_host, range(20), mla1_host, range(20))

    def test_generic_and_zero_copy_paths_share_pages(self):
        hashes = page_hashes(tokens(50, seed=4), PAGE)
        idx = [s * PAGE + t for s in range(50) for t in range(PAGE)]
        host_g, generic = self.server(pages=50, interface_v1=0)
        for s in range(50):
            host_g.fill(s * PAGE, seed=500 + s)
        self.assertTrue(page_backup(generic, host_g, hashes[:25], idx[: 25 * PAGE], v1=False))
        host_v, v1 = self.server(pages=50)
        for s in range(25, 50):
            host_v.fill(s * PAGE, seed=500 + s)
        self.assertTrue(page_backup(v1, host_v, hashes[25:], idx[25 * PAGE :], v1=True))
        self.assertEqual(storage_hit_query(v1, hashes), 50)
        fresh_v, fresh_g = PageFirstHostPool(50, PAGE, TOKEN_BYTES), PageFirstHostPool(50, PAGE, TOKEN_BYTES)
        v1.register_mem_pool_host(fresh_v)
        generic.register_mem_pool_host(fresh_g)
        self.assertEqual(page_prefetch(v1, fresh_v, hashes, idx, v1=True), 50)
        self.assertEqual(page_prefetch(generic, fresh_g, hashes, idx, v1=False), 50)
        self.assertSamePages(host_g, range(25), fresh_v, range(25))
        self.assertSamePages(host_v, range(25, 50), fresh_g, range(25, 50))
        # The single-key forms.
        self.assertTrue(generic.exists(hashes[0]))
        page = generic.get(hashes[0], host_g.get_dummy_flat_data_page())
        self.assertEqual(bytes(page), host_g.get_data_page(0))
        self.assertIsNone(generic.get("0" * 64, host_g.get_dummy_flat_data_page()))
        self.assertTrue(generic.set("f" * 64, host_g.get_data_page(0, flat=False)))
        self.assertEqual(bytes(generic.get("f" * 64)), host_g.get_data_page(0))

    def test_layer_first_pages_are_byte_equal_across_paths(self):
        """Issue 40, item 29: a page written by the zero-copy path of a layer_first server reads
        back through the generic path (and the other way) as the same flat page."""
        hashes = page_hashes(tokens(16, seed=9), PAGE)
        idx = [s * PAGE + t for s in range(16) for t in range(PAGE)]
        host_v, v1 = self.server(pages=16, pool_cls=LayerFirstHostPool)
        host_g, generic = self.server(pages=16, pool_cls=LayerFirstHostPool, interface_v1=0)
        for s in range(16):
            (host_v if s < 8 else host_g).fill(s * PAGE, seed=900 + s)
        self.assertTrue(page_backup(v1, host_v, hashes[:8], idx[: 8 * PAGE], v1=True))
        self.assertTrue(page_backup(generic, host_g, hashes[8:], idx[8 * PAGE :], v1=False))
        fresh_v = LayerFirstHostPool(16, PAGE, TOKEN_BYTES)
        fresh_g = LayerFirstHostPool(16, PAGE, TOKEN_BYTES)
        v1.register_mem_pool_host(fresh_v)
        generic.register_mem_pool_host(fresh_g)
        self.assertEqual(page_prefetch(v1, fresh_v, hashes, idx, v1=True), 16)
        self.assertEqual(page_prefetch(generic, fresh_g, hashes, idx, v1=False), 16)
        self.assertSamePages(host_v, range(8), fresh_g, range(8))
        self.assertSamePages(host_g, range(8, 16), fresh_v, range(8, 16))
        # Stored as the flat page: what the generic path hands SGLang is get_data_page's layout.
        self.assertEqual(bytes(generic.get(hashes[0])), host_v.get_data_page(0))

    def test_the_generic_path_records_metrics_and_get_stats_is_sglangs_class(self):
        """Issue 40, items 28 and 30."""
        hashes = page_hashes(tokens(6, seed=11), PAGE)
        idx = [s * PAGE + t for s in range(6) for t in range(PAGE)]
        host, generic = self.server(pages=6, interface_v1=0)
        generic.get_stats()  # start from nothing
        self.assertTrue(page_backup(generic, host, hashes, idx, v1=False))
        self.assertEqual(page_prefetch(generic, host, hashes, idx, v1=False), 6)
        stats = generic.get_stats()
        self.assertEqual(sum(stats.backup_pgs), 6)
        self.assertEqual(sum(stats.prefetch_pgs), 6)
        self.assertTrue(all(b > 0 for b in stats.prefetch_bandwidth + stats.backup_bandwidth))
        self.assertEqual(generic.get_stats().prefetch_pgs, [], "reset after each call")
        # Each SGLang version's module path for its StorageMetrics class is found.
        for module in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
            cls = type("StorageMetrics", (rbgctl.hicache.StorageMetrics,), {})
            mod = types.ModuleType(module)
            mod.StorageMetrics = cls
            saved = {m: sys.modules.get(m) for m in (
                "sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")}
            for m in saved:
                sys.modules[m] = None  # type: ignore[assignment]  (import fails)
            sys.modules[module] = mod
            try:
                self.assertIsInstance(generic.get_stats(), cls, module)
            finally:
                for m, v in saved.items():
                    if v is None:
                        sys.modules.pop(m, None)
                    else:
                        sys.modules[m] = v

    def test_sglangs_own_extra_config_keys_are_accepted(self):
        """Issue 40, item 31: SGLang adds file_storage_path with --file-storage-path."""
        _, backend = self.server(pages=1, file_storage_path="/tmp/hicache")
        self.assertTrue(backend.batch_exists([]) == 0)

    def test_backup_skips_stored_pages(self):
        host, backend = self.server(pages=30)
        hashes = page_hashes(tokens(30, seed=5), PAGE)
        idx = [s * PAGE + t for s in range(30) for t in range(PAGE)]
        self.assertTrue(page_backup(backend, host, hashes, idx, v1=True))
        written = backend.client.stats.snapshot()
        before = written["bytes_written_tcp"] + written["bytes_written_shm"]
        self.assertTrue(page_backup(backend, host, hashes, idx, v1=True))
        again = backend.client.stats.snapshot()
        self.assertEqual(again["bytes_written_tcp"] + again["bytes_written_shm"], before)

    def test_loader_refuses_bad_extra_config(self):
        from rbgctl.errors import ConfigError

        with self.assertRaisesRegex(ConfigError, "unknown key.*master_addr"):
            create_backend(config(self.pool.master, master_addr="x"), PageFirstHostPool(1, PAGE, 8))
        cfg = config(self.pool.master)
        del cfg.extra_config["master"]
        cfg.extra_config["master_server_address"] = self.pool.master  # Mooncake's spelling works
        backend = create_backend(cfg, PageFirstHostPool(1, PAGE, 8))
        self.backends.append(backend)
        self.assertEqual(backend.client_config.master, self.pool.master)


class Failures(unittest.TestCase):
    def test_attaching_waits_for_the_master_within_a_bound(self):
        """Issue 40, item 33: a master that is not up when SGLang constructs the backend is
        waited for up to connect_timeout; past it, the constructor says why."""
        from harness import free_port
        from rbgctl.errors import RbgctlError

        cfg = config(f"127.0.0.1:{free_port()}", connect_timeout=1)
        t0 = time.monotonic()
        with self.assertRaisesRegex(RbgctlError, "did not answer within 1 s"):
            create_backend(cfg, PageFirstHostPool(1, PAGE, 8))
        self.assertGreaterEqual(time.monotonic() - t0, 0.9)
        # A master that comes up while the backend waits is attached to.
        import subprocess
        import threading

        from harness import binary, port_open

        port = free_port()
        cfg = config(f"127.0.0.1:{port}", connect_timeout=30)
        made = []
        waiter = threading.Thread(target=lambda: made.append(create_backend(cfg, PageFirstHostPool(1, PAGE, 8))))
        waiter.start()
        time.sleep(0.5)
        self.assertFalse(made, "attached to nothing")
        master = subprocess.Popen(
            [binary(), "master", "--rpc-address", "127.0.0.1", "--rpc-port", str(port),
             "--metrics-host", "127.0.0.1", "--metrics-port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until("master listening", lambda: port_open(port))
            waiter.join(timeout=40)
            self.assertFalse(waiter.is_alive())
            self.assertEqual(len(made), 1, "attached once the master answered")
            made[0].close()
        finally:
            master.kill()
            master.wait(timeout=10)

    def test_dead_store_and_dead_master_read_as_misses(self):
        with LivePool(stores=1, segment="32MiB") as pool:
            cfg = config(pool.master, same_host_shm=False, io_timeout_s=5)
            host = PageFirstHostPool(20, PAGE, TOKEN_BYTES)
            backend = create_backend(cfg, host)
            try:
                hashes = page_hashes(tokens(20, seed=6), PAGE)
                idx = [s * PAGE + t for s in range(20) for t in range(PAGE)]
                self.assertTrue(page_backup(backend, host, hashes, idx, v1=True))
                pool.stores[0].kill9()
                started = time.monotonic()
                self.assertEqual(backend.batch_get_v1(hashes, idx), [False] * 20)
                self.assertLess(time.monotonic() - started, 10)
                pool.master_proc.kill()
                pool.master_proc.wait(timeout=10)
                self.assertEqual(backend.batch_exists(hashes), 0)
                self.assertEqual(backend.batch_set_v1(hashes, idx), [False] * 20)
                self.assertFalse(backend.exists(hashes[0]))
            finally:
                backend.close()


class DiskTier(unittest.TestCase):
    def test_pages_memory_gave_to_the_disk_tier_prefetch_transparently(self):
        # 4 MiB of pool memory for 16 MiB of pages: most go to the store's disk tier.
        with LivePool(stores=1, segment="4MiB", disk_tier="64MiB") as pool:
            host_a = PageFirstHostPool(2000, PAGE, TOKEN_BYTES)
            a = create_backend(config(pool.master), host_a)
            host_b = PageFirstHostPool(2000, PAGE, TOKEN_BYTES)
            b = create_backend(config(pool.master, same_host_shm=False), host_b)
            try:
                hashes = page_hashes(tokens(2000, seed=7), PAGE)
                idx = [s * PAGE + t for s in range(2000) for t in range(PAGE)]
                for s in range(2000):
                    host_a.fill(s * PAGE, seed=s)
                self.assertTrue(page_backup(a, host_a, hashes, idx, v1=True))

                def settled():
                    return pool.master_metric("rbgctl_master_tier_moves_in_flight") == 0

                wait_until("copies between tiers finish", settled)
                self.assertGreater(pool.master_metric("rbgctl_master_demotions_total"), 1000)
                self.assertEqual(pool.master_metric("rbgctl_master_evicted_objects_total"), 0)
                self.assertEqual(storage_hit_query(b, hashes), 2000)
                self.assertEqual(page_prefetch(b, host_b, hashes, idx, v1=True), 2000)
                for s in range(2000):
                    self.assertEqual(host_a.get_data_page(s * PAGE), host_b.get_data_page(s * PAGE), f"page {s}")
                self.assertGreater(pool.master_metric("rbgctl_master_disk_hits_total"), 1000)
            finally:
                a.close()
                b.close()


if __name__ == "__main__":
    unittest.main()
