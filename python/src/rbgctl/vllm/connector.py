"""``RbgctlConnector``: vLLM's KV connector (API v1, vLLM 0.33) over the rbgctl pool.

vLLM constructs the class twice: in its scheduler (role ``SCHEDULER``), which asks the pool how
much of a prompt it holds and plans each step's loads and saves (``plan.Planner``), and in every
worker (role ``WORKER``), which moves the planned blocks between its KV cache and the pool. Loads
run before the step's forward, saves after it; both are synchronous, one batched call each.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ..config import ClientConfig, _number
from ..engine import attach, leading_true, missing, put_missing, put_pages
from ..errors import ConfigError, RbgctlError
from .keys import KeySpace, check_hash_algorithm
from .layout import LayerBlocks, block_regions
from .plan import Planner, Transfer
from .staging import Staging

log = logging.getLogger("rbgctl.vllm")

# kv_connector_extra_config keys this connector reads itself; the rest are the client's
# (``ClientConfig.KEYS``: master, replica_num, auth_token_file, ...).
OWN_KEYS = frozenset({"namespace", "model_tag", "connect_timeout", "load_failure_policy", "staging_bytes"})
POLICIES = ("recompute", "fail")


@dataclass(frozen=True)
class Settings:
    """The connector's own settings, from ``kv_connector_extra_config``."""

    namespace: str = ""
    model_tag: str = ""
    connect_timeout: float = 30.0
    load_failure_policy: str = "recompute"
    staging_bytes: int = 256 << 20

    @classmethod
    def from_extra(cls, extra: dict) -> "Settings":
        src = "kv_connector_extra_config"
        policy = str(extra.get("load_failure_policy", "recompute"))
        if policy not in POLICIES:
            raise ConfigError(f"{src}: load_failure_policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        return cls(
            namespace=str(extra.get("namespace", "")),
            model_tag=str(extra.get("model_tag", "")),
            connect_timeout=_number(f"{src}: connect_timeout", extra.get("connect_timeout", 30.0), float, 0),
            load_failure_policy=policy,
            staging_bytes=_number(f"{src}: staging_bytes", extra.get("staging_bytes", 256 << 20), int, 1),
        )


@dataclass
class RbgctlMetadata(KVConnectorMetadata):
    """One step's plan, from the scheduler to the workers."""

    loads: List[Transfer] = field(default_factory=list)
    saves: List[Transfer] = field(default_factory=list)


def key_space(vllm_config: Any, kv_cache_config: Any, settings: Settings, block_size: int) -> KeySpace:
    """The keys' parts that every process of one deployment works out alike from its config."""
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if (getattr(parallel, name, 1) or 1) > 1:
            raise ConfigError(f"the rbgctl connector does not support {name} > 1 yet: its blocks are split over ranks")
    dtype = cache_config.cache_dtype
    if dtype in (None, "auto"):
        dtype = str(model_config.dtype).replace("torch.", "")
    layout = getattr(kv_cache_config, "kv_cache_layout", None) or getattr(cache_config, "kv_cache_layout", None)
    return KeySpace(
        model=settings.model_tag or str(model_config.model),
        kv_dtype=str(dtype),
        layout=str(layout or "default"),
        block_size=block_size,
        tp_size=parallel.tensor_parallel_size,
        pp_size=parallel.pipeline_parallel_size,
        mla=bool(getattr(model_config, "use_mla", False)),
        namespace=settings.namespace,
    )


def block_sizes(vllm_config: Any, kv_cache_config: Any) -> Tuple[int, int]:
    """vLLM's (block size, hash block size): the tokens of a block, and of each hash."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    return resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)


def model_order(names: Sequence[str]) -> List[str]:
    """Layer names in the model's order (vLLM's layer index, then the name; the first number in
    the name where vLLM cannot tell)."""
    from vllm.model_executor.models.utils import extract_layer_index

    def index(name: str) -> Tuple[int, str]:
        try:
            return extract_layer_index(name), name
        except (AssertionError, ValueError):
            digits = re.findall(r"\d+", name)
            return (int(digits[0]) if digits else -1), name

    return sorted(names, key=index)


class RbgctlConnector(KVConnectorBase_V1):
    """vLLM's KV connector over the rbgctl pool. Loaded by vLLM from::

        --kv-transfer-config '{"kv_connector": "RbgctlConnector", "kv_connector_module_path": "rbgctl.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": {"master": "10.0.0.1:50051"}}'
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        extra = dict(transfer.kv_connector_extra_config or {})
        self.client_config = ClientConfig.from_mapping(extra, source="kv_connector_extra_config", extra_keys=OWN_KEYS)
        self.settings = Settings.from_extra(extra)
        check_hash_algorithm(vllm_config.cache_config.prefix_caching_hash_algo, os.environ.get("PYTHONHASHSEED"))
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise ConfigError(
                f"the rbgctl connector moves one KV cache group; this model has {len(groups)} (a hybrid model)"
            )
        if transfer.kv_load_failure_policy != self.settings.load_failure_policy:
            # A block the pool evicted between the lookup and the load is then recomputed, not
            # the request failed.
            log.info(
                "kv_load_failure_policy: %s (kv_connector_extra_config load_failure_policy)",
                self.settings.load_failure_policy,
            )
            transfer.kv_load_failure_policy = self.settings.load_failure_policy
        self.block_size, hash_block_size = block_sizes(vllm_config, kv_cache_config)
        self.space = key_space(vllm_config, kv_cache_config, self.settings, self.block_size)
        self.client = attach(
            self.client_config,
            self.settings.connect_timeout,
            "raise connect_timeout in kv_connector_extra_config",
        )
        # kv_producer engines only save, kv_consumer engines only load, kv_both do both.
        self.loads = bool(getattr(transfer, "is_kv_consumer", True))
        self.saves = bool(getattr(transfer, "is_kv_producer", True))
        if role == KVConnectorRole.SCHEDULER:
            self.planner = Planner(self.block_size, self.block_size // hash_block_size)
            self.rank_prefixes = self.space.rank_prefixes()
            log.info("rbgctl connector (scheduler): master %s, keys %s*", self.client_config.master, self.rank_prefixes[0])
        else:
            self.tp_rank, self.pp_rank = _ranks(self.space)
            self.prefix = self.space.prefix(self.tp_rank, self.pp_rank)
            self.num_blocks = kv_cache_config.num_blocks
            self.layers: List[LayerBlocks] = []
            self.staging: Optional[Staging] = None
            self.load_errors: set = set()
            log.info("rbgctl connector (worker): master %s, keys %s*", self.client_config.master, self.prefix)

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        hashes = self.planner.candidates(request, num_computed_tokens) if self.loads else []
        hits = self._held(hashes) if hashes else 0
        return self.planner.matched(request.request_id, num_computed_tokens, hits), False

    def _held(self, hashes: List[bytes]) -> int:
        """How many blocks from the first the pool holds for every rank; errors read as none."""
        per = len(self.rank_prefixes)
        keys = [p + h.hex() for h in hashes for p in self.rank_prefixes]
        try:
            flags = self.client.batch_exists(keys)
        except RbgctlError as e:
            log.warning("lookup of %d blocks: %s (read as a miss)", len(hashes), e)
            return 0
        return leading_true([all(flags[i * per : (i + 1) * per]) for i in range(len(hashes))])

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.planner.allocated(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        loads, saves = self.planner.step(scheduler_output.num_scheduled_tokens, self._block_ids)
        return RbgctlMetadata(loads, saves if self.saves else [])

    def _block_ids(self, req_id: str) -> List[int]:
        return self._kv_cache_manager.get_block_ids(req_id)[0]

    def update_connector_output(self, connector_output: Any) -> None:
        invalid = getattr(connector_output, "invalid_block_ids", None)
        if invalid:
            n = self.planner.load_failed(invalid)
            log.warning("blocks the workers could not load from the pool: %d; vLLM recomputes them, then they are saved again", n)

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        self.planner.finished(request.request_id)
        return False, None

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        tensors, seen = [], set()
        for name in model_order(list(kv_caches)):
            t = kv_caches[name]
            if t.data_ptr() in seen:  # a layer sharing another's KV cache
                continue
            seen.add(t.data_ptr())
            tensors.append((name, t))
        if not tensors:
            return
        num_blocks = self.num_blocks
        if tensors[0][1].device.type == "cpu":
            self.layers = [
                LayerBlocks.of(n, t.data_ptr(), list(t.shape), list(t.stride()), t.element_size(), num_blocks)
                for n, t in tensors
            ]
            block_bytes = sum(layer.block_bytes for layer in self.layers)
        else:
            self.staging = Staging([t for _, t in tensors], num_blocks, self.settings.staging_bytes, pin=True)
            block_bytes = self.staging.block_bytes
        log.info(
            "rbgctl connector: %d layers on %s, %d blocks of %d bytes",
            len(tensors), tensors[0][1].device, num_blocks, block_bytes,
        )

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        keys, ids = self._named(meta.loads)
        if not keys:
            return
        ok = self._load(keys, ids)
        failed = {b for b, good in zip(ids, ok) if not good}
        if failed:
            log.warning("%d of %d blocks could not be loaded from the pool", len(failed), len(ids))
        self.load_errors |= failed

    def _load(self, keys: List[str], ids: List[int]) -> List[bool]:
        def fetch(targets: List[List[Tuple[int, int]]], names: List[str]) -> List[bool]:
            want = [sum(n for _, n in t) for t in targets]
            try:
                got = self.client.batch_get_into(names, targets)
            except RbgctlError as e:
                log.warning("load of %d blocks: %s", len(names), e)
                return [False] * len(names)
            return [isinstance(r, int) and r == w for r, w in zip(got, want)]

        if self.staging is not None:
            return self.staging.load(ids, lambda batch, regions: fetch([[r] for r in regions], [keys[i] for i in batch]))
        return fetch([block_regions(self.layers, b) for b in ids], keys)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # whole blocks are loaded before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # whole blocks are saved after the forward

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if self.space.mla and self.tp_rank != 0:
            return  # MLA's KV is the same on every rank: rank 0 stores it
        keys, ids = self._named(meta.saves)
        if not keys:
            return
        if self.staging is None:
            put_missing(self.client, keys, [block_regions(self.layers, b) for b in ids])
            return
        todo = missing(self.client, keys)
        self.staging.save(
            [ids[i] for i in todo],
            lambda batch, regions: put_pages(self.client, [keys[todo[i]] for i in batch], [[r] for r in regions]),
        )

    def _named(self, transfers: List[Transfer]) -> Tuple[List[str], List[int]]:
        keys, ids = [], []
        for t in transfers:
            keys.extend(self.prefix + h.hex() for h in t.hashes)
            ids.extend(t.block_ids)
        return keys, ids

    def get_block_ids_with_load_errors(self) -> set:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def shutdown(self) -> None:
        self.client.close()


def _ranks(space: KeySpace) -> Tuple[int, int]:
    """This worker's tensor- and pipeline-parallel ranks, from vLLM's parallel state."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
    except (AssertionError, AttributeError):
        if space.tp_size == 1 and space.pp_size == 1:
            return 0, 0  # a single worker without vLLM's distributed state (tests, tools)
        raise
