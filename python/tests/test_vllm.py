"""The vLLM connector's plain-Python parts: keys, block layout, the scheduler's plan (issue 64).

vLLM itself drives the connector in ``vllm_e2e.py``; these need neither vLLM nor torch.
"""

import types
import unittest

from rbgctl.errors import ConfigError
from rbgctl.vllm.keys import KeySpace, block_hash, check_hash_algorithm, full_blocks, part
from rbgctl.vllm.layout import LayerBlocks, block_dim, block_regions, memory_order, runs
from rbgctl.vllm.plan import Planner


def space(**kw) -> KeySpace:
    base = dict(model="org/model", kv_dtype="bfloat16", layout="LBHNC", block_size=16, tp_size=2, pp_size=1, mla=False)
    base.update(kw)
    return KeySpace(**base)


class Keys(unittest.TestCase):
    def test_every_part_that_changes_the_bytes_is_in_the_key(self):
        ref = space().prefix(1, 0)
        self.assertEqual(ref, "vllm/org--model/bfloat16/LBHNC/b16/tp1of2/pp0of1/")
        others = [
            space(model="org/other").prefix(1, 0),
            space(kv_dtype="fp8_e4m3").prefix(1, 0),
            space(layout="LBNHC").prefix(1, 0),
            space(block_size=32).prefix(1, 0),
            space().prefix(0, 0),
            space(tp_size=4).prefix(1, 0),
            space(pp_size=2).prefix(1, 1),
            space(namespace="tenant-a").prefix(1, 0),
        ]
        self.assertEqual(len(set(others + [ref])), len(others) + 1, others)

    def test_mla_shares_one_copy_across_tensor_parallel_ranks(self):
        s = space(mla=True, tp_size=8)
        self.assertEqual(s.prefix(0, 0), s.prefix(7, 0))
        self.assertIn("/mla/", s.prefix(3, 0))
        self.assertEqual(s.rank_prefixes(), [s.prefix(0, 0)])
        self.assertEqual(len(space(tp_size=2, pp_size=2).rank_prefixes()), 4)

    def test_a_component_cannot_forge_another(self):
        self.assertEqual(part("/models/llama 3"), "models--llama--3")
        self.assertEqual(part("a/../b"), "a--..--b")
        parts = space(model="x/y/z", namespace="n/s").prefix(0, 0).split("/")
        self.assertEqual(parts[:3], ["n--s", "vllm", "x--y--z"])
        self.assertEqual(len(parts), len(space().prefix(0, 0).split("/")) + 1)

    def test_hash_algorithms_that_differ_per_process_are_refused(self):
        check_hash_algorithm("sha256", None)
        check_hash_algorithm("sha256_cbor", None)
        check_hash_algorithm("xxhash", "0")
        with self.assertRaisesRegex(ConfigError, "PYTHONHASHSEED"):
            check_hash_algorithm("xxhash", None)
        with self.assertRaisesRegex(ConfigError, "sha256"):
            check_hash_algorithm("xxhash_cbor", None)

    def test_a_block_is_named_by_the_hash_at_its_end(self):
        hashes = [bytes([i]) for i in range(8)]
        self.assertEqual(block_hash(hashes, 0, 1), b"\x00")
        self.assertEqual(block_hash(hashes, 1, 4), b"\x07")
        self.assertEqual(full_blocks(7, 4), 1)


class Layout(unittest.TestCase):
    def test_k_and_v_apart_are_two_runs_together_one(self):
        # [2, blocks, block, heads, head] float32, contiguous.
        shape, nb = [2, 8, 16, 2, 4], 8
        strides = [8 * 128, 128, 8, 4, 1]
        self.assertEqual(block_dim(shape, nb), 1)
        layer = LayerBlocks.of("l0", 1000, shape, strides, 4, nb)
        self.assertEqual(layer.runs, ((0, 512), (8 * 128 * 4, 512)))
        self.assertEqual(layer.regions(3), [(1000 + 3 * 512, 512), (1000 + 3 * 512 + 4096, 512)])
        # [blocks, 2, block, heads, head]: one run per block, the same bytes in the same order.
        together = LayerBlocks.of("l0", 0, [8, 2, 16, 2, 4], [256, 128, 8, 4, 1], 4, 8)
        self.assertEqual(together.runs, ((0, 1024),))
        self.assertEqual(together.block_bytes, layer.block_bytes)

    def test_a_permuted_layout_is_read_in_memory_order(self):
        # HND: logical [2, blocks, block, heads, head] over memory [2, blocks, heads, block, head].
        shape = [2, 4, 16, 2, 8]
        strides = [4 * 256, 256, 8, 128, 1]
        self.assertEqual(memory_order(shape, strides), [0, 1, 3, 2, 4])
        layer = LayerBlocks.of("l", 0, shape, strides, 2, 4)
        self.assertEqual(layer.runs, ((0, 512), (2048, 512)))

    def test_two_blocks_and_mla(self):
        self.assertEqual(block_dim([2, 2, 16, 1, 8], 2), 1)  # K/V first even with two blocks
        mla = LayerBlocks.of("l", 0, [10, 16, 576], [16 * 576, 576, 1], 2, 10)
        self.assertEqual(mla.runs, ((0, 16 * 576 * 2),))
        with self.assertRaisesRegex(ConfigError, "no dimension of 7 blocks"):
            block_dim([2, 8, 16], 7)

    def test_overlapping_strides_are_refused(self):
        with self.assertRaisesRegex(ConfigError, "overlaps"):
            runs([4, 8], [4, 1], 2)
        with self.assertRaisesRegex(ConfigError, "plainly"):
            runs([4, 8], [0, 1], 2)

    def test_a_blocks_object_is_every_layers_runs_in_order(self):
        a = LayerBlocks.of("a", 0, [4, 8], [8, 1], 1, 4)
        b = LayerBlocks.of("b", 100, [4, 8], [8, 1], 1, 4)
        self.assertEqual(block_regions([a, b], 2), [(16, 8), (116, 8)])


def request(req_id, tokens, computed=0, hashes=None):
    return types.SimpleNamespace(
        request_id=req_id,
        num_tokens=tokens,
        num_computed_tokens=computed,
        block_hashes=hashes if hashes is not None else [bytes([i]) * 4 for i in range(tokens // 16)],
    )


class Plan(unittest.TestCase):
    def test_lookup_leaves_a_token_to_compute(self):
        p = Planner(16)
        self.assertEqual(len(p.candidates(request("r", 96), 0)), 5)  # not all 6: one token to compute
        self.assertEqual(len(p.candidates(request("r", 100), 0)), 6)
        self.assertEqual(len(p.candidates(request("r", 100), 32)), 4)

    def test_loads_then_saves_each_whole_block_once(self):
        p = Planner(16)
        r = request("r", 120)
        self.assertEqual(p.matched("r", 16, 3), 48)
        ids = list(range(100, 108))
        p.allocated(r, ids, 48)
        r.num_computed_tokens = 64
        loads, saves = p.step({"r": 120 - 64}, lambda _: ids)
        self.assertEqual([(t.req_id, t.block_ids) for t in loads], [("r", [101, 102, 103])])
        self.assertEqual(loads[0].hashes, [r.block_hashes[i] for i in (1, 2, 3)])
        # Block 0 was the engine's own cache hit, 1-3 came from the pool: 4-6 are new.
        self.assertEqual([t.block_ids for t in saves], [[104, 105, 106]])
        r.num_computed_tokens = 120
        loads, saves = p.step({"r": 1}, lambda _: ids)
        self.assertEqual((loads, saves), ([], []))

    def test_decode_blocks_are_saved_as_they_fill(self):
        p = Planner(16)
        r = request("r", 30)
        p.allocated(r, [7, 8], 0)
        self.assertEqual([t.block_ids for t in p.step({"r": 30}, lambda _: [7, 8])[1]], [[7]])
        r.num_computed_tokens, r.num_tokens = 30, 32
        r.block_hashes = r.block_hashes + [b"h2"]
        self.assertEqual([t.block_ids for t in p.step({"r": 2}, lambda _: [7, 8])[1]], [[8]])

    def test_drafts_are_not_saved(self):
        p = Planner(16)
        r = request("r", 31, computed=0)
        p.allocated(r, [1, 2], 0)
        # 33 tokens scheduled (two speculative): only the request's own 31 count.
        self.assertEqual([t.block_ids for t in p.step({"r": 33}, lambda _: [1, 2])[1]], [[1]])

    def test_a_failed_load_is_saved_again_after_the_recompute(self):
        p = Planner(16)
        r = request("r", 80)
        p.matched("r", 0, 4)
        p.allocated(r, [10, 11, 12, 13, 14], 64)
        r.num_computed_tokens = 64
        loads, saves = p.step({"r": 16}, lambda _: [10, 11, 12, 13, 14])
        self.assertEqual(loads[0].block_ids, [10, 11, 12, 13])
        self.assertEqual([t.block_ids for t in saves], [[14]])
        self.assertEqual(p.load_failed({11, 99}), 1)
        r.num_computed_tokens = 16  # vLLM rewinds to the first failed block
        _, saves = p.step({"r": 64}, lambda _: [10, 11, 12, 13, 14])
        self.assertEqual([t.block_ids for t in saves], [[11]])

    def test_finished_requests_are_forgotten(self):
        p = Planner(16)
        p.allocated(request("r", 32), [1, 2], 0)
        p.finished("r")
        self.assertIsNone(p.tracked("r"))
        self.assertEqual(p.step({"r": 32}, lambda _: [1, 2]), ([], []))


if __name__ == "__main__":
    unittest.main()
