"""Where one block of vLLM's KV cache lies in memory.

vLLM hands the connector one tensor per attention layer, e.g. ``[2, num_blocks, block_size,
heads, head_size]`` (K and V apart), ``[num_blocks, 2, ...]`` (K and V together) or MLA's
``[num_blocks, block_size, dim]``, possibly permuted so that memory runs in another order (the
``HND`` layouts). A block of a layer is the tensor with its block index fixed; in memory it is a
few contiguous runs (two for K and V apart, one otherwise). A block's object in the pool is the
runs of every layer, each layer's in memory order, layers in model order: the same bytes whether
K and V lie apart or together, so engines with either share blocks.

Pure arithmetic on shapes and strides (in elements), tested without torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from ..errors import ConfigError


def block_dim(shape: Sequence[int], num_blocks: int) -> int:
    """The dimension of a layer's KV tensor that counts blocks: the first of size
    ``num_blocks`` that is not a leading K/V pair (``[2, num_blocks, ...]`` when there are two
    blocks)."""
    candidates = [d for d, n in enumerate(shape) if n == num_blocks]
    if len(shape) > 1 and shape[0] == 2 and shape[1] == num_blocks:
        return 1
    if not candidates:
        raise ConfigError(f"a KV cache tensor of shape {list(shape)} has no dimension of {num_blocks} blocks")
    return candidates[0]


def memory_order(shape: Sequence[int], strides: Sequence[int]) -> List[int]:
    """The dimensions from the outermost in memory to the innermost; size-1 dimensions, whose
    stride says nothing, last."""
    return sorted(range(len(shape)), key=lambda d: (shape[d] == 1, -strides[d], d))


def runs(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> List[Tuple[int, int]]:
    """The contiguous runs ``(byte offset, bytes)`` a strided block occupies, in memory order.
    Refuses overlapping or negative strides."""
    dims = [d for d in memory_order(shape, strides) if shape[d] > 1]
    if any(strides[d] <= 0 for d in dims):
        raise ConfigError(f"a KV cache block with strides {list(strides)} is not laid out plainly in memory")
    run = 1  # elements in one run
    while dims and strides[dims[-1]] == run:
        run *= shape[dims.pop()]
    outer = dims
    for inner, out in zip(outer[1:], outer):
        if strides[out] < strides[inner] * shape[inner]:
            raise ConfigError(f"a KV cache block with shape {list(shape)} and strides {list(strides)} overlaps")
    if outer and strides[outer[-1]] < run:
        raise ConfigError(f"a KV cache block with shape {list(shape)} and strides {list(strides)} overlaps")
    offsets = [
        sum(i * strides[d] for i, d in zip(index, outer)) for index in itertools.product(*(range(shape[d]) for d in outer))
    ]
    return [(off * itemsize, run * itemsize) for off in offsets]


@dataclass(frozen=True)
class LayerBlocks:
    """One layer's KV tensor seen as blocks: a block's runs, relative to the block's start."""

    name: str
    base: int  # address of the tensor's first element
    block_stride: int  # bytes from one block to the next
    runs: Tuple[Tuple[int, int], ...]

    @classmethod
    def of(
        cls, name: str, base: int, shape: Sequence[int], strides: Sequence[int], itemsize: int, num_blocks: int
    ) -> "LayerBlocks":
        d = block_dim(shape, num_blocks)
        inner_shape = [n for i, n in enumerate(shape) if i != d]
        inner_strides = [s for i, s in enumerate(strides) if i != d]
        return cls(name, base, strides[d] * itemsize, tuple(runs(inner_shape, inner_strides, itemsize)))

    @property
    def block_bytes(self) -> int:
        return sum(n for _, n in self.runs)

    def regions(self, block_id: int) -> List[Tuple[int, int]]:
        """The ``(address, bytes)`` runs of one block."""
        start = self.base + block_id * self.block_stride
        return [(start + off, n) for off, n in self.runs]


def block_regions(layers: Sequence[LayerBlocks], block_id: int) -> List[Tuple[int, int]]:
    """A block's object as memory: every layer's runs, in the layers' order."""
    return [r for layer in layers for r in layer.regions(block_id)]
