"""The pool's names for vLLM's KV blocks.

One object per full block of ``block_size`` tokens, per rank that holds different bytes for it::

    [<namespace>/]vllm/<model>/<kv dtype>/<layout>/b<block size>/<tp>/pp<rank>of<size>/<block hash>

``<tp>`` is ``tp<rank>of<size>`` (each tensor-parallel rank holds its own KV heads), or ``mla`` for
MLA models, whose latent KV is the same on every rank. ``<block hash>`` is the hex of vLLM's own
chained hash of the block (``Request.block_hashes``): it covers every token up to the block's end
and folds in the LoRA adapter, multimodal inputs and ``cache_salt``. The parts before it name
everything else that changes a block's bytes: the model's weights (``<model>``, which a
``namespace`` separates further where one name serves different weights), the element type of the
KV cache (fp8 variants included), the physical layout vLLM chose for it, the block size and the
rank's share of heads and layers. docs/vllm.md has the collision argument in full.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..errors import ConfigError

# vLLM's non-cryptographic prefix-cache hashes: without PYTHONHASHSEED each process seeds them at
# random, so two engines never name a block alike.
NON_CRYPTO_HASHES = frozenset({"xxhash", "xxhash_cbor"})

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def part(text: str) -> str:
    """One path component of a key: runs of anything but letters, digits, ``.``, ``_`` and ``-``
    become ``--`` (so ``org/model`` reads ``org--model``, as in Hugging Face's cache)."""
    cleaned = _UNSAFE.sub("--", text.strip()).strip("-")
    return cleaned or "-"


def check_hash_algorithm(algorithm: str, pythonhashseed: Optional[str]) -> None:
    """Refuses a prefix-cache hash whose block hashes differ from process to process."""
    if algorithm in NON_CRYPTO_HASHES and pythonhashseed is None:
        raise ConfigError(
            f"prefix_caching_hash_algo={algorithm} seeds its block hashes at random in each "
            "process unless PYTHONHASHSEED is set, so no other engine could find the blocks this "
            "one stores: set PYTHONHASHSEED to the same value on every engine that shares the "
            "pool, or use --prefix-caching-hash-algo sha256 (vLLM's default)"
        )


@dataclass(frozen=True)
class KeySpace:
    """Everything in a block's key but its hash and the rank's part."""

    model: str
    kv_dtype: str
    layout: str
    block_size: int
    tp_size: int
    pp_size: int
    mla: bool
    namespace: str = ""

    def prefix(self, tp_rank: int, pp_rank: int) -> str:
        """The part of a key before the block hash, for one rank."""
        tp = "mla" if self.mla else f"tp{tp_rank}of{self.tp_size}"
        head = f"{part(self.namespace)}/" if self.namespace else ""
        return (
            f"{head}vllm/{part(self.model)}/{part(self.kv_dtype)}/{part(self.layout)}/"
            f"b{self.block_size}/{tp}/pp{pp_rank}of{self.pp_size}/"
        )

    def rank_prefixes(self) -> List[str]:
        """The prefixes of every rank that stores its own copy of a block: a block is in the
        pool for this deployment only when each of them holds it."""
        tp_ranks = [0] if self.mla else range(self.tp_size)
        return [self.prefix(t, p) for p in range(self.pp_size) for t in tp_ranks]


def block_hash(hashes: Sequence[bytes], block: int, per_block: int) -> bytes:
    """The hash naming block ``block`` (0-based) when vLLM hashes every ``block_size /
    per_block`` tokens: the hash at the block's end, which chains all before it."""
    return hashes[(block + 1) * per_block - 1]


def full_blocks(num_hashes: int, per_block: int) -> int:
    """How many whole blocks the hashes cover."""
    return num_hashes // per_block
