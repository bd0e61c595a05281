"""Blocks of a KV cache in device memory, moved through a bounded host buffer.

The pool's client reads and writes host memory only. For KV caches on a GPU, blocks are copied
into a pinned host buffer of ``capacity`` bytes (at most one batch of blocks at a time), stored
from there, and loads come back the same way. Each block is the same bytes as the direct path
would send from host memory: every layer's block in memory order (``layout.memory_order``).

Runs on CPU tensors too, which is how it is tested: the GPU path itself was not run here (no GPU
in CI); docs/vllm.md says so.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Sequence, Tuple

import torch

from ..errors import ConfigError
from .layout import block_dim, memory_order

Region = Tuple[int, int]


class Staging:
    """A host buffer of ``capacity`` bytes between device KV tensors (one per layer, in the
    layers' order) and the pool."""

    def __init__(self, layers: Sequence, num_blocks: int, capacity: int, pin: bool):
        self.blocks = []  # per layer: the tensor, its block dimension, a block's memory order
        self.block_bytes = 0
        for t in layers:
            d = block_dim(list(t.shape), num_blocks)
            inner = [i for i in range(t.dim()) if i != d]
            order = memory_order([t.shape[i] for i in inner], [t.stride(i) for i in inner])
            self.blocks.append((t, d, order))
            self.block_bytes += t.select(d, 0).numel() * t.element_size()
        if capacity < self.block_bytes:
            raise ConfigError(
                f"staging_bytes={capacity} cannot hold one block ({self.block_bytes} bytes over all layers); "
                "raise it in kv_connector_extra_config"
            )
        self.per_batch = capacity // self.block_bytes
        self.buffer = torch.empty(self.per_batch * self.block_bytes, dtype=torch.uint8, pin_memory=pin)

    def _views(self, block_id: int) -> Iterator[Tuple[object, object]]:
        """Per layer: the block's view in the KV tensor (in memory order) and its bytes' dtype."""
        for t, d, order in self.blocks:
            yield t.select(d, block_id).permute(order), t.dtype

    def _batches(self, n: int) -> Iterator[range]:
        for start in range(0, n, self.per_batch):
            yield range(start, min(n, start + self.per_batch))

    def region(self, slot: int) -> Region:
        return (self.buffer.data_ptr() + slot * self.block_bytes, self.block_bytes)

    def _layer_slices(self, slot: int, block_id: int):
        offset = slot * self.block_bytes
        for view, dtype in self._views(block_id):
            size = view.numel() * view.element_size()
            host = self.buffer[offset : offset + size].view(dtype).view(view.shape)
            yield view, host
            offset += size

    def save(self, block_ids: Sequence[int], store: Callable[[range, List[Region]], List[bool]]) -> List[bool]:
        """Copies blocks out in batches; ``store(indices, regions)`` puts each batch from the
        buffer. Per block, whether it is stored."""
        ok: List[bool] = []
        for batch in self._batches(len(block_ids)):
            for slot, i in enumerate(batch):
                for device, host in self._layer_slices(slot, block_ids[i]):
                    host.copy_(device, non_blocking=True)
            self._sync()
            ok.extend(store(batch, [self.region(slot) for slot in range(len(batch))]))
        return ok

    def load(self, block_ids: Sequence[int], fetch: Callable[[range, List[Region]], List[bool]]) -> List[bool]:
        """``fetch(indices, regions)`` reads each batch into the buffer; the blocks read are
        copied into the KV tensors. Per block, whether it was loaded."""
        ok: List[bool] = []
        for batch in self._batches(len(block_ids)):
            got = fetch(batch, [self.region(slot) for slot in range(len(batch))])
            for slot, (i, good) in enumerate(zip(batch, got)):
                if good:
                    for device, host in self._layer_slices(slot, block_ids[i]):
                        device.copy_(host, non_blocking=True)
            self._sync()
            ok.extend(got)
        return ok

    def _sync(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()
