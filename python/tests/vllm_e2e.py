"""vLLM's own scheduler and worker code on a live pool (issue 64, tests 1 and 2).

Run with an interpreter that has vLLM 0.33.0 (``.ci/run`` makes one: vllm from PyPI and its
pinned torch, no GPU; ``tests/it/python.rs`` runs this file with ``$RBGCTL_VLLM_PYTHON``). Nothing
here stands in for vLLM's logic: its ``Scheduler`` builds the scheduler-side ``RbgctlConnector``
through ``KVConnectorFactory`` from ``kv_connector_module_path``, asks it for external hits,
allocates blocks and plans the steps; the worker-side connector is driven by vLLM's own
``KVConnectorModelRunnerMixin`` inside ``set_forward_context``, as the GPU and CPU model runners
drive it; vLLM's ``update_from_output`` takes the results, load errors included. The one thing
a test must supply is the forward itself (no model runs here): it writes each scheduled token's
K and V in every layer as a function of the token's whole prefix, so a block's right bytes are
known, and a block loaded from the pool can be checked against a fresh computation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import sys
import tempfile
import time
import unittest
import warnings

warnings.filterwarnings("ignore")
logging.getLogger("vllm").setLevel(logging.ERROR)

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin  # noqa: E402

from harness import LivePool  # noqa: E402
from rbgctl import Client  # noqa: E402

BLOCK = 16
BLOCKS = 64
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
KV_HEADS = 2
HEAD = 16
# One block of one layer: K and V, each BLOCK tokens x KV_HEADS x HEAD float32.
BLOCK_BYTES = len(LAYERS) * 2 * BLOCK * KV_HEADS * HEAD * 4


def tiny_model(directory: str) -> str:
    """A 2-layer Llama's config.json (no weights: nothing runs the model)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": KV_HEADS * HEAD * 2,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": KV_HEADS,
                "head_dim": HEAD,
                "num_hidden_layers": len(LAYERS),
                "vocab_size": 1024,
                "max_position_embeddings": 512,
                "torch_dtype": "float32",
                "rms_norm_eps": 1e-5,
            },
            f,
        )
    return directory


def token_kv(prefix: list) -> torch.Tensor:
    """The K and V of the prefix's last token in every layer, ``[layers, 2, heads, head]``: a
    function of the whole prefix, as attention's are."""
    digest = hashlib.sha256(struct.pack(f"{len(prefix)}I", *prefix)).digest()
    base = int.from_bytes(digest[:4], "little") / 2**32
    n = len(LAYERS) * 2 * KV_HEADS * HEAD
    return (base + torch.arange(n, dtype=torch.float32) / n).view(len(LAYERS), 2, KV_HEADS, HEAD)


class Instance:
    """One vLLM engine's scheduler and worker, in this process, on the pool at ``master``."""

    def __init__(self, model: str, master: str, extra: dict | None = None, hash_algo: str = "sha256"):
        transfer = KVTransferConfig(
            kv_connector="RbgctlConnector",
            kv_connector_module_path="rbgctl.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"master": master, "connect_timeout": 10, **(extra or {})},
        )
        self.config = VllmConfig(
            model_config=ModelConfig(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=512),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True, prefix_caching_hash_algo=hash_algo),
            scheduler_config=SchedulerConfig(
                max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512, is_encoder_decoder=False,
                async_scheduling=False,
            ),
            device_config=DeviceConfig("cpu"),
            kv_transfer_config=transfer,
        )
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD, dtype=torch.float32)
        self.config.cache_config.num_gpu_blocks = BLOCKS  # as vLLM sets it after profiling
        self.kv_config = KVCacheConfig(
            num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)]
        )
        self.scheduler = Scheduler(
            vllm_config=self.config,
            kv_cache_config=self.kv_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BLOCK,
            log_stats=True,
        )
        self.worker = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER, self.kv_config)
        self.kv = {name: torch.zeros(2, BLOCKS, BLOCK, KV_HEADS, HEAD) for name in LAYERS}
        self.worker.register_kv_caches(self.kv)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.first_outputs = {}  # req id -> its first SchedulerOutput's view
        self.stats = []

    def add(self, req_id: str, prompt: list, max_tokens: int = 1) -> Request:
        request = Request(
            request_id=req_id,
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self.scheduler.add_request(request)
        return request

    def step(self, between=None):
        """One engine step; ``between()`` runs after the scheduler's plan, before the worker."""
        out = self.scheduler.schedule()
        if between is not None:
            between()
        for new in out.scheduled_new_reqs:
            self.first_outputs.setdefault(new.req_id, (new.num_computed_tokens, out.num_scheduled_tokens[new.req_id]))
        kv_transfer_state._KV_CONNECTOR_AGENT = self.worker  # the worker's transfer group
        try:
            with set_forward_context(None, self.config):
                with KVConnectorModelRunnerMixin._get_kv_connector_output(out) as kv_out:
                    sampled = self.forward(out)
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = None
        req_ids = list(out.num_scheduled_tokens)
        result = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[sampled.get(r, []) for r in req_ids],
            kv_connector_output=kv_out,
        )
        engine_outputs = self.scheduler.update_from_output(out, result)
        for outputs in engine_outputs.values():
            if outputs.scheduler_stats is not None:
                self.stats.append(outputs.scheduler_stats)
        return out

    def forward(self, out) -> dict:
        """Writes the scheduled tokens' K and V; samples a token for each request whose prompt
        is done."""
        sampled = {}
        for req_id, n in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[req_id]
            end = request.num_computed_tokens  # schedule() already counted this step's tokens
            start = end - n
            ids = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            tokens = request.all_token_ids
            for pos in range(start, end):
                kv = token_kv(tokens[: pos + 1])
                block, slot = ids[pos // BLOCK], pos % BLOCK
                for layer, name in enumerate(LAYERS):
                    self.kv[name][:, block, slot] = kv[layer]
            if end >= request.num_tokens:
                sampled[req_id] = [sum(tokens) % 1000]
        return sampled

    def run(self, limit: int = 50) -> None:
        """Steps until every request has finished."""
        for _ in range(limit):
            if not self.scheduler.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("requests did not finish")

    def block_bytes(self, block_id: int) -> bytes:
        """A block as the connector stores it: per layer, K then V."""
        return b"".join(self.kv[name][:, block_id].contiguous().numpy().tobytes() for name in LAYERS)

    def close(self) -> None:
        self.scheduler.connector.shutdown()
        self.worker.shutdown()


def expected_block(tokens: list, index: int) -> bytes:
    """The bytes block ``index`` of ``tokens`` must hold, computed from scratch."""
    out = []
    for layer in range(len(LAYERS)):
        ks, vs = [], []
        for pos in range(index * BLOCK, (index + 1) * BLOCK):
            kv = token_kv(tokens[: pos + 1])
            ks.append(kv[layer, 0])
            vs.append(kv[layer, 1])
        out.append(torch.stack(ks).numpy().tobytes() + torch.stack(vs).numpy().tobytes())
    return b"".join(out)


def block_hashes(tokens: list) -> list:
    """vLLM's chained hashes of the whole blocks of ``tokens``."""
    hasher = get_request_block_hasher(BLOCK, sha256)
    return Request("hashes", tokens, SamplingParams(max_tokens=1), None, block_hasher=hasher).block_hashes


def prompt(seed: int, n: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 1000, (n,), generator=g).tolist()


class VllmOnThePool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        init_none_hash(sha256)
        cls.dir = tempfile.TemporaryDirectory(prefix="rbgctl-vllm-")
        cls.model = tiny_model(os.path.join(cls.dir.name, "tiny-llama"))

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_a_second_engine_loads_the_prefix_a_first_one_saved(self):
        with LivePool(stores=1) as pool:
            a = Instance(self.model, pool.master)
            self.assertEqual(type(a.scheduler.connector).__module__, "rbgctl.vllm.connector")
            shared = prompt(1, 100)
            a.add("a", shared)
            a.run()
            self.assertEqual(a.first_outputs["a"], (0, 100), "a cold pool gives no hit")
            with Client(pool.master) as c:
                keys, _ = c.keys("vllm/", 100)
                self.assertEqual(len(keys), 6, keys)  # 6 whole blocks of 16 in 100 tokens
                prefix = a.worker.prefix
                self.assertTrue(prefix.startswith("vllm/"), prefix)
                self.assertIn("/float32/", prefix)
                self.assertIn(f"/b{BLOCK}/tp0of1/pp0of1/", prefix)
                request_hashes = block_hashes(shared)
                for i in range(6):
                    key = prefix + request_hashes[i].hex()
                    self.assertIn(key, keys)
                    value = bytes(c.get(key))
                    self.assertEqual(len(value), BLOCK_BYTES)
                    self.assertEqual(value, expected_block(shared, i), f"block {i}")
            a.close()

            b = Instance(self.model, pool.master)
            longer = shared + prompt(2, 20)
            b.add("b", longer, max_tokens=2)
            b.step()
            self.assertEqual(b.first_outputs["b"], (96, 24), "vLLM's scheduler took 96 tokens from the pool")
            ids = b.scheduler.kv_cache_manager.get_block_ids("b")[0]
            for i in range(6):
                self.assertEqual(b.block_bytes(ids[i]), expected_block(longer, i), f"loaded block {i}")
            b.run()
            hits = [s.connector_prefix_cache_stats for s in b.stats if s.connector_prefix_cache_stats]
            self.assertEqual(sum(h.hits for h in hits), 96, "vLLM's own stats count the connector's hits")
            self.assertEqual(sum(h.queries for h in hits), 120)
            with Client(pool.master) as c:
                keys, _ = c.keys("vllm/", 100)
                self.assertEqual(len(keys), 7, "B saved its one new whole block")

            b.add("unrelated", prompt(3, 60))
            b.step()
            self.assertEqual(b.first_outputs["unrelated"], (0, 60), "an unrelated prompt misses")
            b.run()

            # The pool goes away: lookups read as misses, saves fail quietly, requests finish.
            pool.close()
            b.add("after", prompt(4, 50) + shared)
            b.run()
            self.assertEqual(b.first_outputs["after"], (0, 150))
            b.close()

    def test_a_block_evicted_between_lookup_and_load_is_recomputed_and_saved_again(self):
        with LivePool(stores=1) as pool:
            a = Instance(self.model, pool.master)
            shared = prompt(5, 64)
            a.add("a", shared)
            a.run()
            a.close()
            b = Instance(self.model, pool.master)
            self.assertEqual(b.config.kv_transfer_config.kv_load_failure_policy, "recompute")
            longer = shared + prompt(6, 10)
            b.add("b", longer)
            victim = b.worker.prefix + block_hashes(shared)[1].hex()

            def evict():  # after vLLM's scheduler looked block 1 up, before its worker loads it
                with Client(pool.master) as c:
                    c.remove(victim, force=True)
                    self.assertFalse(c.exists(victim))

            b.step(between=evict)
            self.assertEqual(b.first_outputs["b"], (64, 10), "the lookup found 4 blocks")
            b.run()
            self.assertFalse(b.scheduler.has_unfinished_requests(), "the request completed")
            with Client(pool.master) as c:
                self.assertTrue(c.exists(victim), "the recomputed block is saved again")
                self.assertEqual(bytes(c.get(victim)), expected_block(longer, 1))
            b.close()


    def test_a_master_that_never_answers_a_typo_and_per_process_hashes_are_refused_at_start(self):
        from harness import free_port
        from rbgctl.errors import ConfigError, RbgctlError

        t0 = time.monotonic()
        with self.assertRaisesRegex(RbgctlError, "did not answer within 1 s.*connect_timeout in kv_connector_extra_config"):
            Instance(self.model, f"127.0.0.1:{free_port()}", extra={"connect_timeout": 1})
        self.assertGreaterEqual(time.monotonic() - t0, 0.9, "the master was waited for")
        with LivePool(stores=1) as pool:
            with self.assertRaisesRegex(ConfigError, "unknown key.*namspace"):
                Instance(self.model, pool.master, extra={"namspace": "a"})
            os.environ.pop("PYTHONHASHSEED", None)
            with self.assertRaisesRegex(ConfigError, "PYTHONHASHSEED"):
                Instance(self.model, pool.master, hash_algo="xxhash")


class Staging(unittest.TestCase):
    """The GPU path's host staging, run on CPU tensors: the same bytes as the direct path."""

    def test_staged_blocks_are_the_direct_paths_bytes_in_bounded_batches(self):
        from rbgctl.buffers import pointer_view
        from rbgctl.errors import ConfigError
        from rbgctl.vllm.layout import LayerBlocks, block_regions
        from rbgctl.vllm.staging import Staging as HostStaging

        g = torch.Generator().manual_seed(0)
        # K and V apart in one layer, together in the other, the second permuted (HND).
        apart = torch.randn(2, 8, BLOCK, KV_HEADS, HEAD, generator=g)
        together = torch.randn(8, 2, KV_HEADS, BLOCK, HEAD, generator=g).permute(0, 1, 3, 2, 4)
        layers = [apart, together]
        direct = [
            LayerBlocks.of(str(i), t.data_ptr(), list(t.shape), list(t.stride()), t.element_size(), 8)
            for i, t in enumerate(layers)
        ]
        expected = {b: b"".join(bytes(pointer_view(p, n)) for p, n in block_regions(direct, b)) for b in range(8)}

        one = sum(layer.block_bytes for layer in direct)
        staging = HostStaging(layers, 8, capacity=2 * one + 5, pin=False)
        self.assertEqual(staging.per_batch, 2)
        batches, stored = [], {}

        def store(batch, regions):
            batches.append(list(batch))
            for i, (ptr, size) in zip(batch, regions):
                stored[blocks[i]] = bytes(pointer_view(ptr, size))
            return [True] * len(batch)

        blocks = [5, 0, 7, 3, 2]
        self.assertEqual(staging.save(blocks, store), [True] * 5)
        self.assertEqual(batches, [[0, 1], [2, 3], [4]])
        self.assertEqual(stored, {b: expected[b] for b in blocks})

        # Loads: zero the tensors, read back through the buffer, block 7 missing.
        for t in layers:
            t.zero_()

        def fetch(batch, regions):
            ok = []
            for i, (ptr, size) in zip(batch, regions):
                if blocks[i] == 7:
                    ok.append(False)
                    continue
                pointer_view(ptr, size)[:] = stored[blocks[i]]
                ok.append(True)
            return ok

        self.assertEqual(staging.load(blocks, fetch), [True, True, False, True, True])
        for b in blocks:
            got = b"".join(bytes(pointer_view(p, n)) for p, n in block_regions(direct, b))
            self.assertEqual(got, bytes(len(got)) if b == 7 else expected[b], f"block {b}")
        with self.assertRaisesRegex(ConfigError, "staging_bytes"):
            HostStaging(layers, 8, capacity=one - 1, pin=False)


if __name__ == "__main__":
    unittest.main(verbosity=2, argv=sys.argv[:1])
