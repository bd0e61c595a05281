"""SGLang's own code against a live pool (issue 40, items 28 to 33).

Run with an interpreter that has SGLang (``.ci/run`` makes one: sglang 0.5.23 from PyPI, its
pinned torch on the CPU; ``tests/it/python.rs`` runs this file with ``$RBGCTL_SGLANG_PYTHON``).
Nothing here stands in for SGLang: its ``StorageBackendFactory`` loads ``rbgctl.hicache``
through the ``dynamic`` backend from its own ``HiCacheStorageConfig``; its host KV pools (MHA and
MLA, ``layer_first`` and ``page_first``, built over its device pools on the CPU) hold the
pages; its ``HiCacheController``'s page functions back them up and prefetch them, on the
zero-copy path and on the generic one; its ``StorageMetrics`` and v2 pool types
(``PoolTransfer``, ``PoolTransferResult``) are what the backend answers with. Pages are checked
byte for byte, across paths too. Separate from the unittest suite, which installs a stand-in for
``sglang`` in its process.
"""

from __future__ import annotations

import sys
import types
import unittest
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

from harness import LivePool  # noqa: E402

PAGE = 4
PAGES = 24
LAYERS = 3


def storage_metrics_class():
    for module in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        try:
            return getattr(__import__(module, fromlist=["StorageMetrics"]), "StorageMetrics")
        except (ImportError, AttributeError):
            continue
    raise AssertionError("this SGLang has no StorageMetrics class")


def host_pool(mla: bool, layout: str):
    """SGLang's host pool over its device pool, on the CPU; random bytes in every page."""
    tokens = PAGES * PAGE
    if mla:
        dev = MLATokenToKVPool(
            size=tokens, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=16,
            qk_rope_head_dim=8, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
        )
        host = MLATokenToKVPoolHost(
            dev._mla_buffer_info(), host_to_device_ratio=2.0, host_size=0, page_size=PAGE,
            layout=layout, pin_memory=False, device="cpu", device_capacity_tokens=tokens,
            start_layer=0, end_layer=LAYERS, target_layer_num=LAYERS,
        )
    else:
        dev = MHATokenToKVPool(
            size=tokens, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8,
            layer_num=LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False,
        )
        host = MHATokenToKVPoolHost(
            dev._mha_buffer_info(), host_to_device_ratio=2.0, host_size=0, page_size=PAGE,
            layout=layout, pin_memory=False, device="cpu", device_capacity_tokens=tokens,
            start_layer=0, end_layer=LAYERS,
        )
    host.kv_buffer.view(torch.uint8).copy_(
        torch.randint(0, 256, host.kv_buffer.view(torch.uint8).shape, dtype=torch.uint8)
    )
    return host


def storage_config(host, mla: bool, extra_config: dict) -> HiCacheStorageConfig:
    """SGLang's storage config for one rank of a TP-1 model over `host`."""
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=True,
        is_page_first_layout=host.layout.startswith("page_first"), model_name="Qwen/Qwen3-0.6B",
        extra_config=extra_config,
    )


def backend_for(master: str, host, mla: bool, zero_copy: bool, **extra):
    """SGLang's factory, from SGLang's storage config, as its controller attaches one."""
    ec = {
        "backend_name": "rbgctl",
        "module_path": "rbgctl.hicache",
        "class_name": "RbgctlHiCacheStorage",
        "interface_v1": int(zero_copy),
        "master": master,
        # SGLang's own keys (--file-storage-path adds this one).
        "file_storage_path": "/tmp/hicache-unused",
    }
    ec.update(extra)
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(host, mla, ec), host)
    backend.register_mem_pool_host(host)
    return backend


def controller(backend, host, zero_copy: bool):
    """The controller's page functions over this backend and pool (its storage loops call
    them with these attributes)."""
    ctl = types.SimpleNamespace(storage_backend=backend, storage_host_pool=host, page_size=PAGE)
    if zero_copy:
        put = lambda keys, idx: HiCacheController._page_set_zero_copy(ctl, keys, idx)  # noqa: E731
        get = lambda keys, idx: HiCacheController._page_get_zero_copy(ctl, OPERATION, keys, idx)  # noqa: E731
    else:
        put = lambda keys, idx: HiCacheController._generic_page_set(ctl, keys, idx)  # noqa: E731
        get = lambda keys, idx: HiCacheController._generic_page_get(ctl, OPERATION, keys, idx)  # noqa: E731
    return put, get


class _Operation:
    request_id = "rbgctl-e2e"

    def is_terminated(self) -> bool:
        return False


OPERATION = _Operation()


def page_bytes(host, slot: int) -> bytes:
    return bytes(host.get_data_page(slot * PAGE).contiguous().view(torch.uint8).numpy())


class SGLangDrivesThePool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pool = LivePool(stores=2, segment="64MiB")

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()

    def round_trip(self, mla: bool, layout: str, write_zero_copy: bool, read_zero_copy: bool):
        tag = f"{'mla' if mla else 'mha'}-{layout}-{int(write_zero_copy)}{int(read_zero_copy)}"
        keys = [f"{tag}-{i:04d}" + "0" * 40 for i in range(PAGES)]
        idx = torch.arange(PAGES * PAGE, dtype=torch.int64)
        src = host_pool(mla, layout)
        writer = backend_for(self.pool.master, src, mla, write_zero_copy)
        put, _ = controller(writer, src, write_zero_copy)
        self.assertTrue(put(keys, idx), tag)
        self.assertEqual(writer.batch_exists(keys), PAGES, tag)
        dst = host_pool(mla, layout)
        reader = backend_for(self.pool.master, dst, mla, read_zero_copy)
        _, get = controller(reader, dst, read_zero_copy)
        self.assertEqual(get(keys, idx), PAGES, tag)
        for s in range(PAGES):
            self.assertEqual(page_bytes(src, s), page_bytes(dst, s), f"{tag}: page {s}")
        stats = reader.get_stats()
        self.assertIsInstance(stats, storage_metrics_class(), tag)
        self.assertEqual(sum(stats.prefetch_pgs), PAGES, tag)
        self.assertIsInstance(writer.get_stats(), storage_metrics_class(), tag)
        writer.close()
        reader.close()

    def test_pages_round_trip_on_both_paths_and_across_them(self):
        for mla in (False, True):
            for layout in ("layer_first", "page_first"):
                for w, r in ((True, True), (False, False), (True, False), (False, True)):
                    with self.subTest(mla=mla, layout=layout, write_zero_copy=w, read_zero_copy=r):
                        self.round_trip(mla, layout, w, r)

    def test_the_v2_pool_api_moves_and_finds_side_pool_pages(self):
        kv = host_pool(False, "page_first")
        side = host_pool(False, "layer_first")  # a second pool, as a hybrid model's side pool
        backend = backend_for(self.pool.master, kv, False, True)
        backend.register_mem_host_pool_v2(kv, PoolName.KV)
        backend.register_mem_host_pool_v2(side, PoolName.SWA)
        keys = [f"v2-{i:04d}" + "1" * 40 for i in range(8)]
        idx = torch.arange(8 * PAGE, dtype=torch.int64)
        out = backend.batch_set_v2(
            [PoolTransfer(PoolName.KV, host_indices=idx, keys=keys),
             PoolTransfer(PoolName.SWA, host_indices=idx[-2 * PAGE:], keys=keys[-2:])]
        )
        self.assertEqual(out[PoolName.KV], [True] * 8)
        self.assertEqual(out[PoolName.SWA], [True] * 2)
        found = backend.batch_exists_v2(
            keys, [PoolTransfer(PoolName.SWA, keys=keys[-2:], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        )
        self.assertIsInstance(found, PoolTransferResult)
        self.assertEqual(found.kv_hit_pages, 8)
        # Every page of the side pool is asked for: only the last two are there.
        found = backend.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys)])
        self.assertEqual(found.kv_hit_pages, 0)
        kv2, side2 = host_pool(False, "page_first"), host_pool(False, "layer_first")
        reader = backend_for(self.pool.master, kv2, False, True)
        reader.register_mem_host_pool_v2(kv2, PoolName.KV)
        reader.register_mem_host_pool_v2(side2, PoolName.SWA)
        got = reader.batch_get_v2(
            [PoolTransfer(PoolName.KV, host_indices=idx, keys=keys),
             PoolTransfer(PoolName.SWA, host_indices=idx[-2 * PAGE:], keys=keys[-2:])]
        )
        self.assertEqual(got[PoolName.KV], [True] * 8)
        self.assertEqual(got[PoolName.SWA], [True] * 2)
        for s in range(8):
            self.assertEqual(page_bytes(kv, s), page_bytes(kv2, s), f"kv page {s}")
        for s in (6, 7):
            self.assertEqual(page_bytes(side, s), page_bytes(side2, s), f"side page {s}")
        backend.close()
        reader.close()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
