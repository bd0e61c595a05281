"""The scheduler side's bookkeeping: which blocks a request loads from the pool, which it saves.

vLLM's scheduler asks how many tokens past its own prefix cache the pool holds, allocates blocks,
then builds one step's plan for the workers. This module keeps, per request, the blocks known to
be in the pool (loaded from it, or saved to it) so that each full block is saved once, and forgets
the loaded ones a worker failed to read so that vLLM's recompute of them saves them again.

Pure: requests are anything with ``block_hashes``, ``num_tokens`` and ``num_computed_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set

from .keys import block_hash, full_blocks


@dataclass
class Transfer:
    """Blocks of one request to move: block ``i`` is named by ``hashes[i]`` and lives in the KV
    cache's block ``block_ids[i]``. Travels from the scheduler to the workers (picklable)."""

    req_id: str
    hashes: List[bytes]
    block_ids: List[int]


@dataclass
class _Tracked:
    request: Any
    first_new: int  # the first block this engine computes (earlier ones were cached)
    stored: Set[int] = field(default_factory=set)  # block indices known to be in the pool
    loaded: Dict[int, int] = field(default_factory=dict)  # block index -> block id, loaded


@dataclass
class Lookup:
    """A request's last question to the pool: blocks from ``first`` on, ``hits`` of them held."""

    first: int
    hits: int


class Planner:
    """One engine's plan of loads and saves; ``per_block`` hashes name one block."""

    def __init__(self, block_size: int, per_block: int = 1):
        self.block_size = block_size
        self.per_block = per_block
        self._lookups: Dict[str, Lookup] = {}
        self._tracked: Dict[str, _Tracked] = {}
        self._loads: List[Transfer] = []

    # ---- lookups ----

    def candidates(self, request: Any, num_computed_tokens: int) -> List[bytes]:
        """The hashes of the blocks the pool could supply past the engine's own
        ``num_computed_tokens``: whole blocks, leaving at least one token to compute."""
        first = num_computed_tokens // self.block_size
        last = min(
            (request.num_tokens - 1) // self.block_size,
            full_blocks(len(request.block_hashes), self.per_block),
        )
        return [block_hash(request.block_hashes, b, self.per_block) for b in range(first, last)]

    def matched(self, req_id: str, num_computed_tokens: int, hits: int) -> int:
        """Records that the pool holds ``hits`` blocks past ``num_computed_tokens``; the tokens
        it supplies."""
        self._lookups[req_id] = Lookup(num_computed_tokens // self.block_size, hits)
        return hits * self.block_size

    def allocated(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """vLLM allocated the request's blocks and will take ``num_external_tokens`` from the
        pool: plans their load."""
        req_id = request.request_id
        lookup = self._lookups.pop(req_id, Lookup(request.num_computed_tokens // self.block_size, 0))
        tracked = self._tracked.get(req_id)
        if tracked is None:
            tracked = self._tracked[req_id] = _Tracked(request, lookup.first)
        else:  # back after a preemption: its blocks are new
            tracked.first_new = min(tracked.first_new, lookup.first)
            tracked.loaded.clear()
        n = num_external_tokens // self.block_size
        if n <= 0:
            return
        indices = range(lookup.first, lookup.first + n)
        transfer = Transfer(
            req_id,
            [block_hash(request.block_hashes, b, self.per_block) for b in indices],
            [block_ids[b] for b in indices],
        )
        self._loads.append(transfer)
        tracked.stored.update(indices)
        tracked.loaded.update(zip(indices, transfer.block_ids))

    # ---- one step ----

    def step(
        self, scheduled: Mapping[str, int], block_ids_of: Callable[[str], Sequence[int]]
    ) -> "tuple[List[Transfer], List[Transfer]]":
        """This step's loads (planned since the last step) and saves: every block that becomes
        whole this step (``scheduled`` tokens per request) and is not known to be in the pool."""
        loads, self._loads = self._loads, []
        saves = []
        for req_id, n in scheduled.items():
            tracked = self._tracked.get(req_id)
            if tracked is None or n <= 0:
                continue
            request = tracked.request
            # Tokens past the request's own (drafts of speculative decoding) are not kept.
            done = min(request.num_computed_tokens + n, request.num_tokens)
            whole = min(done // self.block_size, full_blocks(len(request.block_hashes), self.per_block))
            todo = [b for b in range(tracked.first_new, whole) if b not in tracked.stored]
            if not todo:
                continue
            ids = block_ids_of(req_id)
            saves.append(
                Transfer(req_id, [block_hash(request.block_hashes, b, self.per_block) for b in todo], [ids[b] for b in todo])
            )
            tracked.stored.update(todo)
        return loads, saves

    def load_failed(self, block_ids: Iterable[int]) -> int:
        """Workers could not read these blocks: vLLM recomputes them, and they are saved again.
        Returns how many of the tracked requests' blocks that was."""
        bad = set(block_ids)
        n = 0
        for tracked in self._tracked.values():
            for index, block in list(tracked.loaded.items()):
                if block in bad:
                    tracked.stored.discard(index)
                    del tracked.loaded[index]
                    n += 1
        return n

    def finished(self, req_id: str) -> None:
        self._lookups.pop(req_id, None)
        self._tracked.pop(req_id, None)

    def tracked(self, req_id: str) -> Optional[_Tracked]:
        return self._tracked.get(req_id)
