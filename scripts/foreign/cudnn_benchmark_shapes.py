"""A small conv net with torch.backends.cudnn.benchmark = True, fed images whose size changes.

cuDNN's benchmark mode times every candidate algorithm the first time it sees an input configuration and caches the
winner. Variants (--shapes):

  new     every batch a size not seen before (a detector on images of arbitrary size): the search recurs every step
  few     sizes drawn from three buckets: the search runs once per bucket, then never again
  fixed   every batch padded to one size (the fix for `new`): one search, before the window

The profiled window is 6 steps after 2 profiler warm-up steps (record_shapes on, with_stack on). Then the variants
are timed without the profiler in interleaved rounds (each `new` round at sizes not seen before), per-step times in
truth.json beside the trace.

    python3 cudnn_benchmark_shapes.py OUT_DIR [--shapes new]
"""
import argparse
import gzip
import itertools
import json
import os
import shutil
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

torch.backends.cudnn.benchmark = True
device = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, PAD_TO, BUCKETS = 8, 256, (128, 160, 192)


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    ).to(device).eval()


class Images:
    """Batches of random images: a new size each batch, one of a few, or padded to one."""

    def __init__(self, shapes, start):
        self.shapes = shapes
        self.sizes = itertools.count(start, 2) if shapes == "new" else itertools.cycle(BUCKETS)

    def next(self):
        size = next(self.sizes)
        x = torch.randn(BATCH, 3, size, size + 8, device=device)
        if self.shapes == "fixed":
            x = F.pad(x, (0, PAD_TO + 8 - x.shape[-1], 0, PAD_TO - x.shape[-2]))
        return x


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


def run_steps(model, images, n):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        model(images.next()).argmax(dim=-1)
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--shapes", default="new", choices=["new", "few", "fixed"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = make_model()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        model(torch.randn(BATCH, 3, 64, 72, device=device))  # the process's first conv: cuDNN's own set-up
        images = Images(args.shapes, start=96)
        with profile(activities=activities, schedule=schedule(wait=0, warmup=2, active=6, repeat=1),
                     on_trace_ready=export_gz(os.path.join(args.out_dir, "trace.json.gz")),
                     record_shapes=True, with_stack=True) as prof:
            for _ in range(8):
                model(images.next()).argmax(dim=-1)
                prof.step()
        # unprofiled: the three variants in interleaved rounds; `new` starts past every size used above
        feeds = {s: Images(s, start=400) for s in ("new", "few", "fixed")}
        for s, feed in feeds.items():
            run_steps(model, feed, 3)
        per_round = {s: [] for s in feeds}
        for _ in range(args.rounds):
            for s, feed in feeds.items():
                per_round[s].append(run_steps(model, feed, args.steps))
    truth = {"shapes": args.shapes, "torch": torch.__version__,
             "cudnn": torch.backends.cudnn.version() if device == "cuda" else None,
             "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "profiled_steps": 6, "rounds": args.rounds, "steps_per_round": args.steps, "ms_per_step": per_round,
             "median_ms_per_step": {s: median(r) for s, r in per_round.items()},
             "saving_fixed_ms": median(n - f for n, f in zip(per_round["new"], per_round["fixed"]))}
    with open(os.path.join(args.out_dir, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps({k: truth[k] for k in ("median_ms_per_step", "saving_fixed_ms")}))


if __name__ == "__main__":
    main()
