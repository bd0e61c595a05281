"""Multi-turn conversations on vLLM engines without the rbgctl connector, then with it.

    python -m rbgctl.vllm.bench --model /models/tiny --master 127.0.0.1:50051 --cpu --json

Each conversation starts with a shared system prompt and its own first question; each round
appends the engine's answer and a new question. Rounds go to the engines in turn (round ``r`` of
conversation ``c`` to engine ``(c + r) % engines``), as a router without cache awareness sends
them, so an engine often serves a turn whose earlier turns another engine computed. Both passes
run the same conversations on fresh engine processes; the pass with the connector uses a
namespace of its own in the pool, so nothing stored before the run counts. Per pass: prompt
tokens, tokens the engines reported cached (their own prefix cache and the pool), tokens they
computed, time to first token; and whether both passes answered alike (greedy decoding).

``--cpu`` sets what vLLM's CPU build needs (``VLLM_TARGET_DEVICE=cpu`` and friends).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import List, Optional

CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
QUIET_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass
class EngineSpec:
    """How to start one engine: the model, the pool (none: no connector) and its settings."""

    model: str
    master: str = ""
    block_size: int = 32
    max_model_len: int = 1024
    extra: dict = field(default_factory=dict)


class EngineProcess:
    """One vLLM engine in a process of its own (this module's ``--serve``), answering greedy
    requests one at a time over its stdin and stdout."""

    def __init__(self, spec: EngineSpec, cpu: bool = False, timeout: float = 600.0):
        env = dict(os.environ, **QUIET_ENV, **(CPU_ENV if cpu else {}))
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rbgctl.vllm.bench", "--serve", json.dumps(asdict(spec))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def wait_ready(self) -> None:
        self._line("READY")

    def generate(self, tokens: List[int], max_tokens: int) -> dict:
        """The answer's tokens and log-probabilities, the tokens the engine had cached, and the
        time to the first token."""
        self.proc.stdin.write(json.dumps({"tokens": tokens, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line("RESULT "))

    def _line(self, tag: str) -> str:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read() if self.proc.poll() is not None else ""
                raise RuntimeError(f"the engine exited ({self.proc.poll()}):\n{err[-6000:]}")
            if line.startswith(tag):
                return line[len(tag):].strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(spec: EngineSpec) -> None:
    """The child's side: an engine, then one request per input line."""
    from vllm import LLM, SamplingParams

    kwargs = {}
    if spec.master:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "RbgctlConnector",
            "kv_connector_module_path": "rbgctl.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"master": spec.master, **spec.extra},
        }
    llm = LLM(
        model=spec.model, skip_tokenizer_init=True, block_size=spec.block_size, max_model_len=spec.max_model_len,
        enable_prefix_caching=True, max_num_seqs=4, disable_log_stats=False, **kwargs,
    )
    print("READY", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        params = SamplingParams(max_tokens=req["max_tokens"], temperature=0.0, logprobs=1, detokenize=False)
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": req["tokens"]}], params, use_tqdm=False)[0]
        elapsed = time.perf_counter() - start
        done = out.outputs[0]
        ttft = getattr(out.metrics, "first_token_latency", 0.0) or elapsed
        print("RESULT " + json.dumps({
            "tokens": list(done.token_ids),
            "logprobs": [step[t].logprob for step, t in zip(done.logprobs, done.token_ids)],
            "cached": out.num_cached_tokens or 0,
            "ttft": ttft,
        }), flush=True)


def random_llama(directory: str, layers: int = 2, hidden: int = 128, heads: int = 2, kv_heads: int = 1,
                 head_dim: int = 64, intermediate: int = 256, vocab: int = 1024, seed: int = 64) -> str:
    """Writes a Llama with random weights (``config.json`` and ``model.safetensors``) unless the
    directory has one: a model for benchmarks and tests that need no download. Random, not
    vLLM's dummy weights, whose uniform logits would make every answer alike."""
    import torch
    from safetensors.torch import save_file

    if os.path.exists(os.path.join(directory, "model.safetensors")):
        return directory
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(
            {
                "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
                "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_dim": head_dim, "num_hidden_layers": layers, "vocab_size": vocab,
                "max_position_embeddings": 4096, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
            },
            f,
        )
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * (1.0 / shape[-1] ** 0.5) * 3

    tensors = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": torch.ones(hidden),
               "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(intermediate, hidden),
            p + "mlp.up_proj.weight": w(intermediate, hidden),
            p + "mlp.down_proj.weight": w(hidden, intermediate),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    return directory


@dataclass
class Workload:
    conversations: int = 4
    rounds: int = 4
    system_tokens: int = 256
    question_tokens: int = 64
    answer_tokens: int = 16
    vocab: int = 1000
    seed: int = 0

    def questions(self) -> List[List[List[int]]]:
        """Per conversation, per round, the new tokens of the user's turn (the first round's
        after the shared system prompt)."""
        rng = random.Random(self.seed)
        return [
            [[rng.randrange(3, self.vocab) for _ in range(self.question_tokens)] for _ in range(self.rounds)]
            for _ in range(self.conversations)
        ]

    def system(self) -> List[int]:
        rng = random.Random(self.seed + 1)
        return [rng.randrange(3, self.vocab) for _ in range(self.system_tokens)]


def run_pass(spec: EngineSpec, engines: int, work: Workload, cpu: bool) -> dict:
    """One pass of the workload on ``engines`` fresh engine processes."""
    procs = [EngineProcess(spec, cpu) for _ in range(engines)]
    try:
        for p in procs:
            p.wait_ready()
            p.generate([1, 2, 3, 4], 2)  # a warm-up, shorter than a block: not timed, not stored
        questions = work.questions()
        history = [work.system() for _ in range(work.conversations)]
        rows, answers = [], []
        for r in range(work.rounds):
            for c in range(work.conversations):
                history[c] = history[c] + questions[c][r]
                got = procs[(c + r) % engines].generate(history[c], work.answer_tokens)
                rows.append({"round": r, "prompt": len(history[c]), "cached": got["cached"], "ttft": got["ttft"]})
                answers.append(got["tokens"])
                history[c] = history[c] + got["tokens"]
    finally:
        for p in procs:
            p.close()
    ttfts = sorted(row["ttft"] for row in rows)
    prompt = sum(row["prompt"] for row in rows)
    cached = sum(row["cached"] for row in rows)
    return {
        "requests": len(rows),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed_tokens": prompt - cached,
        "ttft_mean_s": statistics.fmean(ttfts),
        "ttft_p50_s": ttfts[len(ttfts) // 2],
        "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.9))],
        "per_round_cached": [sum(x["cached"] for x in rows if x["round"] == r) for r in range(work.rounds)],
        "answers": answers,
    }


def run(base: EngineSpec, engines: int, work: Workload, cpu: bool, namespace: Optional[str] = None) -> dict:
    """The workload without the connector, then with it (``base.master``'s pool)."""
    without = run_pass(EngineSpec(base.model, "", base.block_size, base.max_model_len), engines, work, cpu)
    extra = dict(base.extra, namespace=namespace or f"bench-{uuid.uuid4().hex[:12]}")
    spec = EngineSpec(base.model, base.master, base.block_size, base.max_model_len, extra)
    with_pool = run_pass(spec, engines, work, cpu)
    same = without.pop("answers") == with_pool.pop("answers")
    return {
        "workload": asdict(work),
        "engines": engines,
        "without_connector": without,
        "with_connector": with_pool,
        "computed_tokens_saved": without["computed_tokens"] - with_pool["computed_tokens"],
        "computed_ratio": with_pool["computed_tokens"] / max(1, without["computed_tokens"]),
        "ttft_mean_ratio": with_pool["ttft_mean_s"] / max(1e-9, without["ttft_mean_s"]),
        "same_answers": same,
    }


def render(result: dict) -> str:
    w, a, b = result["workload"], result["without_connector"], result["with_connector"]
    lines = [
        f"{w['conversations']} conversations x {w['rounds']} rounds on {result['engines']} engines "
        f"(system {w['system_tokens']}, question {w['question_tokens']}, answer {w['answer_tokens']} tokens)",
        f"{'':18}{'prompt':>9}{'cached':>9}{'computed':>10}{'TTFT mean':>11}{'p50':>9}{'p90':>9}",
    ]
    for name, row in (("without connector", a), ("with connector", b)):
        lines.append(
            f"{name:18}{row['prompt_tokens']:>9}{row['cached_tokens']:>9}{row['computed_tokens']:>10}"
            f"{row['ttft_mean_s'] * 1e3:>9.1f}ms{row['ttft_p50_s'] * 1e3:>7.1f}ms{row['ttft_p90_s'] * 1e3:>7.1f}ms"
        )
    lines.append(
        f"computed tokens saved: {result['computed_tokens_saved']} ({result['computed_ratio']:.2f}x computed), "
        f"TTFT mean {result['ttft_mean_ratio']:.2f}x, same answers: {result['same_answers']}"
    )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rbgctl.vllm.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="the model's directory or name")
    ap.add_argument("--random-model", metavar="LAYERSxHIDDEN",
                    help="write a Llama with random weights of this size (e.g. 8x1024) into --model first")
    ap.add_argument("--master", help="the pool's master, host:port")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--cpu", action="store_true", help="run vLLM's CPU build (VLLM_TARGET_DEVICE=cpu, ...)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.serve:
        serve(EngineSpec(**json.loads(args.serve)))
        return 0
    if not args.model or not args.master:
        ap.error("--model and --master are required")
    if args.engines < 1 or args.conversations < 1 or args.rounds < 1:
        ap.error("--engines, --conversations and --rounds must be at least 1")
    if args.random_model:
        layers, _, hidden = args.random_model.partition("x")
        try:
            layers, hidden = int(layers), int(hidden)
        except ValueError:
            ap.error(f"--random-model {args.random_model!r}: expected LAYERSxHIDDEN, e.g. 8x1024")
        random_llama(args.model, layers=layers, hidden=hidden, heads=max(1, hidden // 64), kv_heads=max(1, hidden // 256),
                     intermediate=hidden * 3)
    work = Workload(args.conversations, args.rounds, args.system_tokens, args.question_tokens, args.answer_tokens)
    base = EngineSpec(args.model, args.master, args.block_size, args.max_model_len)
    result = run(base, args.engines, work, args.cpu)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
