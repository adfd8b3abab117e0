"""Side by side on one GPU, in one process: our eager decode step, our CUDA-graph step and Hugging Face
transformers' eager `Qwen2ForCausalLM` step, plus the bf16 logit difference between the two implementations.

    python3 benchmarks/runtime_vs_transformers.py [--preset qwen2-0.5b] [--steps 64] [--json OUT.json]

Needs CUDA and transformers. A benchmark, not a test: it prints figures and ratios measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workloads.qwen2 import PRESETS, Generator, KVCache, random_model  # noqa: E402


def hf_from_ours(ours):
    import transformers
    c = ours.config
    hf_config = transformers.Qwen2Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings, max_position_embeddings=c.max_position_embeddings,
        rope_theta=c.rope_theta, rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta})
    with torch.device("meta"):
        hf = transformers.Qwen2ForCausalLM(hf_config)
    hf = hf.to_empty(device=ours.device).to(ours.dtype).eval()
    hf.load_state_dict(ours.state_dict(), strict=False)
    hf.tie_weights()
    # to_empty leaves buffers (rotary inv_freq) uninitialised: recompute them as HF does.
    rotary = hf.model.rotary_emb
    inv_freq, _ = rotary.compute_default_rope_parameters(hf_config, device=ours.device)
    rotary.inv_freq.copy_(inv_freq)
    if hasattr(rotary, "original_inv_freq"):
        rotary.original_inv_freq = inv_freq.clone()
    return hf, transformers.__version__


def timed(fn, steps: int) -> float:
    """Milliseconds per call, synchronising around the timed region only."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


@torch.no_grad()
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2-0.5b")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    ours = random_model(PRESETS[args.preset], dev, dtype, seed=0)
    hf, hf_version = hf_from_ours(ours)
    prompt = torch.randint(0, ours.config.vocab_size, (1, args.prompt), device=dev,
                           generator=torch.Generator(dev).manual_seed(1))
    capacity = args.prompt + 3 * args.steps + 16

    # Correctness in bf16: full-prompt logits of both implementations.
    ours.prepare(capacity + 3)
    got = ours(prompt, torch.arange(args.prompt, device=dev), KVCache(ours.config, 1, capacity, dev, dtype),
               last_only=False).float()
    ref = hf(prompt).logits.float()
    diff = (got - ref).abs()
    argmax_agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()

    # Greedy tokens: eager vs CUDA graph (must be identical), and vs transformers' greedy generate.
    eager, graph = Generator(ours, 1, capacity, mode="eager"), Generator(ours, 1, capacity, mode="cuda_graph")
    for g in (eager, graph):
        g.prefill(prompt)
        for _ in range(args.steps):
            g.step()
    same_tokens = torch.equal(eager.tokens(), graph.tokens())
    hf_tokens = hf.generate(prompt, max_new_tokens=args.steps + 1, min_new_tokens=args.steps + 1,
                            do_sample=False, pad_token_id=0, eos_token_id=None)
    hf_token_agree = (hf_tokens[0, args.prompt:] == eager.tokens()[0, args.prompt:]).float().mean().item()

    # Speed: one decode step at batch 1.
    eager.prefill(prompt)
    graph.prefill(prompt)
    eager_ms = timed(eager.step, args.steps)
    graph_ms = timed(graph.step, args.steps)
    out = hf(prompt, use_cache=True)
    state = {"past": out.past_key_values, "next": out.logits[:, -1:].argmax(-1)}

    def hf_step():
        o = hf(state["next"], past_key_values=state["past"], use_cache=True)
        state["past"], state["next"] = o.past_key_values, o.logits[:, -1:].argmax(-1)

    for _ in range(5):
        hf_step()
    hf_ms = timed(hf_step, args.steps)

    result = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": hf_version,
        "preset": args.preset, "dtype": "bfloat16", "batch": 1, "prompt": args.prompt, "steps": args.steps,
        "bf16_logits_max_abs_diff": diff.max().item(), "bf16_logits_mean_abs_diff": diff.mean().item(),
        "logit_scale_max_abs": ref.abs().max().item(), "prefill_argmax_agreement": argmax_agree,
        "greedy_tokens_agree_with_transformers": hf_token_agree, "eager_and_graph_tokens_identical": same_tokens,
        "ours_eager_step_ms": eager_ms, "ours_graph_step_ms": graph_ms, "transformers_eager_step_ms": hf_ms,
        "ours_eager_over_transformers": eager_ms / hf_ms, "eager_over_graph": eager_ms / graph_ms,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
