"""A warmed-up sampling loop whose profiled window opens on kernels never launched before.

The model's forward is warmed up before profiling, but its sampler (temperature, top-k, multinomial) runs for the
first time in the window, at the start of its first step: under lazy module loading (CUDA_MODULE_LOADING unset: lazy
since CUDA 12.2 on Linux) each new kernel's module is loaded by its first launch, before any GPU work of the window.
Profiled with torch.profiler's defaults (CPU and CUDA activity, no stacks, no shapes, no memory), 4 steps, no
warm-up in the schedule.

    python3 first_launch_window.py OUT_DIR
"""
import argparse
import gzip
import json
import os
import shutil
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule

device = "cuda" if torch.cuda.is_available() else "cpu"


def export_gz(out_path):
    def handler(prof):
        raw = out_path[:-3]
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(out_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        print("wrote", out_path, os.path.getsize(out_path), "bytes")
    return handler


def sample(logits, temperature=0.8, k=50):
    top, idx = torch.topk(logits / temperature, k, dim=-1)
    probs = torch.softmax(top, dim=-1)
    choice = torch.multinomial(probs, 1)
    return torch.gather(idx, -1, choice).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    embed = nn.Embedding(32000, 1024).to(device)
    body = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024),
                         nn.Linear(1024, 32000)).to(device).eval()
    tokens = torch.randint(0, 32000, (8,), device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        for _ in range(3):  # the forward warmed up; the sampler is not
            logits = body(embed(tokens))
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=4, repeat=1),
                     on_trace_ready=export_gz(os.path.join(args.out_dir, "trace.json.gz"))) as prof:
            for i in range(4):
                tokens = sample(logits)
                logits = body(embed(tokens))
                prof.step()
        if device == "cuda":
            torch.cuda.synchronize()
        window_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        for _ in range(4):
            tokens = sample(logits)
            logits = body(embed(tokens))
        if device == "cuda":
            torch.cuda.synchronize()
        warm_ms = (time.perf_counter() - t0) * 1e3 / 4
    truth = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING", "(unset)"),
             "profiled_ms_with_export": window_ms, "warm_unprofiled_ms_per_step": warm_ms}
    with open(os.path.join(args.out_dir, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
