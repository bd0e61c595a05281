"""HiCache page throughput from Python: ``batch_set_v1`` / ``batch_get_v1`` of whole batches of
pages between a host KV pool and the pool, as SGLang's cache controller calls them.

    python -m rbgctl.bench --master 127.0.0.1:50051 --pages 128 --page-size 262144 --json

The host pool here is host memory in SGLang's MHA ``page_first`` layout (a page is two regions,
its K and its V), allocated with ctypes; ``rbgctl bench hicache`` runs this beside the Rust
client on the same pool.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace
from typing import List

from .checksum import IMPLEMENTATION
from .hicache import RbgctlHiCacheStorage


class HostPool:
    """Host memory for ``pages`` pages in the ``page_first`` layout: all K halves, then all V."""

    def __init__(self, pages: int, page_bytes: int, page_size: int = 1):
        if page_bytes % 2:
            raise ValueError("a page is a K half and a V half: page bytes must be even")
        self.page_size = page_size
        self.half = page_bytes // 2
        self.memory = (ctypes.c_ubyte * (pages * page_bytes))()
        self.base = ctypes.addressof(self.memory)
        self.v_base = self.base + pages * self.half
        self.kv_buffer = self.memory

    def get_page_buffer_meta(self, indices):
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            slot = indices[i] // self.page_size
            ptrs += [self.base + slot * self.half, self.v_base + slot * self.half]
        return ptrs, [self.half] * len(ptrs)

    def fill(self, seed: int) -> None:
        data = os.urandom(4096)
        view = memoryview(self.memory).cast("B")
        for off in range(0, len(view), 4096):
            n = min(4096, len(view) - off)
            view[off : off + n] = data[:n]
        view[:8] = seed.to_bytes(8, "little")


def _stats(op: str, path: str, pages: int, page_bytes: int, samples: List[float], errors: int) -> dict:
    samples = sorted(samples)
    spent = sum(samples)
    n = len(samples)
    return {
        "client": "python",
        "path": path,
        "op": op,
        "pages": pages,
        "page_bytes": page_bytes,
        "batches": n,
        "errors": errors,
        "pages_per_s": pages * n / spent if spent else 0.0,
        "gb_per_s": pages * page_bytes * n / spent / 1e9 if spent else 0.0,
        "p50_ms": statistics.median(samples) * 1e3 if n else 0.0,
        "p99_ms": samples[min(n - 1, int(n * 0.99))] * 1e3 if n else 0.0,
    }


def run(master: str, pages: int, page_bytes: int, rounds: int, max_seconds: float, shm: bool) -> List[dict]:
    extra = {"master": master, "same_host_shm": shm}
    cfg = SimpleNamespace(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="bench",
        should_split_heads=False,
        extra_config=extra,
    )
    backend = RbgctlHiCacheStorage(cfg, {})
    src, dst = HostPool(pages, page_bytes), HostPool(pages, page_bytes)
    src.fill(1)
    indices = list(range(pages))
    run_id = os.urandom(6).hex()
    set_t, get_t, set_err, get_err = [], [], 0, 0
    deadline = time.monotonic() + max_seconds
    try:
        for r in range(rounds):
            if r > 0 and time.monotonic() > deadline:
                break
            keys = [f"{run_id}-{r}-{i:06d}" for i in range(pages)]
            backend.register_mem_pool_host(src)
            t = time.perf_counter()
            ok = backend.batch_set_v1(keys, indices)
            set_t.append(time.perf_counter() - t)
            set_err += ok.count(False)
            backend.register_mem_pool_host(dst)
            t = time.perf_counter()
            ok = backend.batch_get_v1(keys, indices)
            get_t.append(time.perf_counter() - t)
            get_err += ok.count(False)
            if r == 0 and bytes(src.memory) != bytes(dst.memory):
                raise SystemExit("pages read back differ from the pages written")
            backend.client.batch_remove([backend.storage_key(k) for k in keys], force=True)
    finally:
        backend.close()
    path = "shm" if shm else "tcp"
    return [
        _stats("batch_set_v1", path, pages, page_bytes, set_t, set_err),
        _stats("batch_get_v1", path, pages, page_bytes, get_t, get_err),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rbgctl.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True, help="host:port of the master")
    ap.add_argument("--pages", type=int, default=128, help="pages per batch (SGLang: 128)")
    ap.add_argument("--page-size", type=int, default=256 << 10, help="bytes per page")
    ap.add_argument("--rounds", type=int, default=20, help="most batches of each kind")
    ap.add_argument("--max-seconds", type=float, default=10.0, help="stop starting rounds after this")
    ap.add_argument(
        "--path", choices=["tcp", "shm"], default="tcp", help="shm: same-host shared memory allowed"
    )
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    results = run(a.master, a.pages, a.page_size, a.rounds, a.max_seconds, a.path == "shm")
    if a.json:
        print(json.dumps({"crc32c": IMPLEMENTATION, "results": results}))
    else:
        print(f"CRC-32C: {IMPLEMENTATION}")
        for r in results:
            print(
                f"{r['path']:<4} {r['op']:<13} {r['pages_per_s']:>9.0f} pages/s {r['gb_per_s']:>6.2f} GB/s "
                f"p50 {r['p50_ms']:.1f} ms  errors {r['errors']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
