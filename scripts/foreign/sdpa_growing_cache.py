"""A small decoder whose attention reads a growing slice of its KV cache.

Each decode step attends over `k_cache[:, :, :pos + 1]`: a new sequence length every step. Where
`scaled_dot_product_attention` picks cuDNN's backend (bf16 on an H100/H200 with recent torch), cuDNN builds an
execution plan for each new shape, so the set-up recurs every step. Variants (--variant):

  growing   the slice above (the pathology)
  fixed     the whole preallocated cache every step, with a boolean mask of the valid positions (the fix: one shape)
  backend   the growing slice with cuDNN's backend left out (sdpa_kernel: flash / efficient / math)

The profiled window is 6 decode steps after 2 unprofiled ones (record_shapes on, with_stack on). Then the three
variants are timed without the profiler in interleaved rounds, each decoding lengths it has not seen, and the
per-step times go to truth.json beside the trace.

    python3 sdpa_growing_cache.py OUT_DIR [--variant growing] [--force-cudnn]
"""
import argparse
import gzip
import json
import os
import shutil
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, schedule

device = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if device == "cuda" else torch.float32
HIDDEN, HEADS, LAYERS, VOCAB, CAPACITY, PROMPT = 1024, 16, 4, 32000, 2048, 128
HEAD_DIM = HIDDEN // HEADS
NOT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.up, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x, cache, pos, variant, mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        k_cache, v_cache = cache
        k_cache[:, :, pos:pos + t] = k
        v_cache[:, :, pos:pos + t] = v
        if t > 1:  # the prompt: causal attention over itself
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif variant == "fixed":
            a = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        else:
            a = F.scaled_dot_product_attention(q, k_cache[:, :, :pos + 1], v_cache[:, :, :pos + 1])
        x = x + self.out(a.transpose(1, 2).reshape(b, t, HIDDEN))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)


class Generation:
    """One sequence: its KV cache, its position and (for the fixed variant) the mask of valid positions."""

    def __init__(self, model, variant, force_cudnn=False):
        self.model, self.variant = model, variant
        self.backends = NOT_CUDNN if variant == "backend" else [SDPBackend.CUDNN_ATTENTION] \
            if force_cudnn and variant == "growing" else None
        shape = (1, HEADS, CAPACITY, HEAD_DIM)
        self.cache = [(torch.zeros(shape, device=device, dtype=DTYPE), torch.zeros(shape, device=device, dtype=DTYPE))
                      for _ in range(LAYERS)]
        self.mask = torch.zeros(1, 1, 1, CAPACITY, dtype=torch.bool, device=device)
        prompt = torch.randint(0, VOCAB, (1, PROMPT), device=device)
        self.pos = 0
        self.token = self.forward(prompt)

    def forward(self, ids):
        t = ids.shape[1]
        self.mask[..., self.pos:self.pos + t] = True
        x = self.model.embed(ids)
        for layer, cache in zip(self.model.layers, self.cache):
            x = layer(x, cache, self.pos, self.variant, self.mask)
        self.pos += t
        return self.model.head(self.model.norm(x[:, -1:])).argmax(dim=-1)

    def step(self):
        if self.backends:
            with sdpa_kernel(self.backends):
                self.token = self.forward(self.token)
        else:
            self.token = self.forward(self.token)


def median(values):
    values = list(values)
    return statistics.median(values) if values else None  # --rounds 0: no timing


def export_gz(out_path):
    def handler(prof):
        raw = out_path[:-3]
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(out_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        print("wrote", out_path, os.path.getsize(out_path), "bytes")
    return handler


def sync():
    if device == "cuda":
        torch.cuda.synchronize()


def timed_steps(gen, n):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        gen.step()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--variant", default="growing", choices=["growing", "fixed", "backend"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--force-cudnn", action="store_true", help="the growing variant on cuDNN's backend only")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = Decoder().to(device=device, dtype=DTYPE).eval()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        gen = Generation(model, args.variant, args.force_cudnn)
        for _ in range(2):
            gen.step()
        with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=6, repeat=1),
                     on_trace_ready=export_gz(os.path.join(args.out_dir, "trace.json.gz")),
                     record_shapes=True, with_stack=True) as prof:
            for _ in range(8):
                gen.step()
                prof.step()
        attention = sorted({e.key for e in prof.key_averages() if "attention" in e.key})
        print("attention ops:", attention)
        # unprofiled: each variant in its own sequence, rounds interleaved, every round at lengths not seen before
        gens = {v: Generation(model, v, args.force_cudnn) for v in ("growing", "fixed", "backend")}
        for g in gens.values():
            timed_steps(g, 2)
        per_round = {v: [] for v in gens}
        for _ in range(args.rounds):
            for v, g in gens.items():
                per_round[v].append(timed_steps(g, args.steps))
    truth = {"variant": args.variant, "force_cudnn": args.force_cudnn, "attention_ops": attention,
             "torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "profiled_steps": 6, "rounds": args.rounds, "steps_per_round": args.steps,
             "ms_per_step": per_round,
             "median_ms_per_step": {v: median(r) for v, r in per_round.items()},
             "saving_fixed_ms": median(g - f for g, f in zip(per_round["growing"], per_round["fixed"])),
             "saving_backend_ms": median(g - b for g, b in zip(per_round["growing"], per_round["backend"]))}
    with open(os.path.join(args.out_dir, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps({k: truth[k] for k in ("median_ms_per_step", "saving_fixed_ms", "saving_backend_ms")}))


if __name__ == "__main__":
    main()
