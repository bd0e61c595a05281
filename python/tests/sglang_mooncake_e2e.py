"""SGLang's own ``mooncake`` HiCache backend on rbgctl's pool (issue 63).

Run with an interpreter that has SGLang and Mooncake's wheel (``.ci/run`` puts the pinned
``mooncake-transfer-engine-non-cuda`` and ``ninja`` into the SGLang venv; ``tests/it/python.rs``
runs this file with ``$RBGCTL_SGLANG_PYTHON``). Nothing stands in for SGLang or Mooncake:
SGLang's ``StorageBackendFactory`` makes its ``MooncakeStore`` from ``--hicache-storage-backend
mooncake`` settings (its extra config), which sets up Mooncake's client against rbgctl's master;
its ``HiCacheController``'s page functions (the zero-copy ones it picks for this backend) back
pages up and prefetch them, and the bytes move through Mooncake's Transfer Engine into rbgctl's
stores. MHA and MLA, in both discovery modes (``P2PHANDSHAKE``, SGLang's default, and the HTTP
metadata server), byte for byte, across two backends (a writer and a reader).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
import unittest
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

from harness import LivePool, free_port  # noqa: E402
from sglang_e2e import PAGE, PAGES, controller, host_pool, page_bytes, storage_config  # noqa: E402

# Mooncake's client advertises the first non-loopback address unless told.
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")


def mooncake_backend(pool: LivePool, host, mla: bool, metadata: str):
    """SGLang's factory with the settings `--hicache-storage-backend mooncake
    --hicache-storage-backend-extra-config` gives it."""
    ec = {
        "master_server_address": pool.master,
        "metadata_server": metadata,
        "protocol": "tcp",
        "local_hostname": "127.0.0.1",
        # A pure client: rbgctl's stores hold the pages.
        "global_segment_size": 0,
        "master_metrics_port": pool.metrics_port,
        "check_server": True,
    }
    backend = StorageBackendFactory.create_backend("mooncake", storage_config(host, mla, ec), host)
    backend.register_mem_pool_host(host)
    return backend


class SGLangsMooncakeBackendOnThePool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pool = LivePool(stores=2, segment="64MiB", metadata_port=free_port())

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()

    def round_trip(self, mla: bool, layout: str, metadata: str):
        tag = f"{'mla' if mla else 'mha'}-{layout}-{'p2p' if metadata == 'P2PHANDSHAKE' else 'http'}"
        keys = [f"{tag}-{i:04d}" + "0" * 40 for i in range(PAGES)]
        idx = torch.arange(PAGES * PAGE, dtype=torch.int64)
        src = host_pool(mla, layout)
        writer = mooncake_backend(self.pool, src, mla, metadata)
        put, _ = controller(writer, src, zero_copy=True)
        self.assertTrue(put(keys, idx), tag)
        self.assertEqual(writer.batch_exists(keys), PAGES, tag)
        dst = host_pool(mla, layout)
        reader = mooncake_backend(self.pool, dst, mla, metadata)
        _, get = controller(reader, dst, zero_copy=True)
        self.assertEqual(get(keys, idx), PAGES, tag)
        for s in range(PAGES):
            self.assertEqual(page_bytes(src, s), page_bytes(dst, s), f"{tag}: page {s}")
        writer.close()
        reader.close()

    def test_pages_round_trip_through_mooncakes_client_on_rbgctls_stores(self):
        for metadata in ("P2PHANDSHAKE", self.pool.metadata_url):
            # SGLang refuses MHA `layer_first` with this backend; MLA serves both layouts.
            for mla, layout in ((False, "page_first"), (True, "page_first"), (True, "layer_first")):
                with self.subTest(mla=mla, layout=layout, metadata=metadata):
                    self.round_trip(mla, layout, metadata)

    def test_the_pages_are_rbgctl_objects(self):
        """What SGLang backed up through Mooncake's client, rbgctl's own client lists and reads."""
        from rbgctl.client import Client

        src = host_pool(False, "page_first")
        writer = mooncake_backend(self.pool, src, False, "P2PHANDSHAKE")
        put, _ = controller(writer, src, zero_copy=True)
        keys = [f"seen-{i:04d}" + "2" * 40 for i in range(4)]
        self.assertTrue(put(keys, torch.arange(4 * PAGE, dtype=torch.int64)))
        url = f"http://127.0.0.1:{self.pool.metrics_port}/api/v1/keys?limit=10000"
        with urllib.request.urlopen(url, timeout=10) as r:
            listed = json.load(r)["keys"]
        stored = [k for k in listed if "seen-" in k]
        self.assertEqual(len(stored), 8, stored)  # K and V of each MHA page
        with Client(self.pool.master) as c:
            self.assertTrue(all(len(c.get(k)) > 0 for k in stored))
        writer.close()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
