"""A decode loop that tokenizes incoming requests on a pool while the GPU works.

Every second step a request's text (12,000 characters) goes to a one-worker pool (the tokenizer is pure Python: a
greedy longest-match over a vocabulary dict); each step runs one eager decode step of a small model (many small
kernels, so the thread's launches are what keep the GPU busy) and picks up whatever the pool finished, without
waiting. Variants (--pool):

  thread    a ThreadPoolExecutor: the tokenizer holds the GIL in 5 ms slices (sys.getswitchinterval()), and the
            launching thread waits for it between its launches
  process   a ProcessPoolExecutor (the fix: the tokenizer runs in another interpreter)
  none      no tokenization (the GPU-side floor)

The pool's workers exist before the profiler starts, so the profiler's Python tracer records their frames too. The
profiled window is 6 steps after 2 warm-up steps (with_stack on). Then the three variants are timed without the
profiler in interleaved rounds; per-step times in truth.json beside the trace.

    python3 tokenizer_threads.py OUT_DIR [--pool thread]
"""
import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
import multiprocessing

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule

device = "cuda" if torch.cuda.is_available() else "cpu"
WIDTH, DEPTH, EVERY = 512, 48, 2


def build_vocab(seed=0):
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz "
    vocab = {c: i for i, c in enumerate(letters)}
    while len(vocab) < 20000:
        piece = "".join(rng.choice(letters) for _ in range(rng.randint(2, 6)))
        vocab.setdefault(piece, len(vocab))
    return vocab


VOCAB = build_vocab()


def tokenize(text):
    """Greedy longest match, in pure Python (no native code releases the GIL here)."""
    ids, i, end = [], 0, len(text)
    while i < end:
        for n in (6, 5, 4, 3, 2, 1):
            piece = text[i:i + n]
            if piece in VOCAB:
                ids += [VOCAB[piece]]
                i += n
                break
    return ids


def make_texts(seed, count=64, chars=12000):
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz "
    return ["".join(rng.choice(letters) for _ in range(chars)) for _ in range(count)]


TEXTS = make_texts(1)


def make_model():
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    return nn.Sequential(*layers).to(device).eval()


class Loop:
    """Every EVERY steps a request arrives and goes to the pool; finished ones are picked up without waiting."""

    def __init__(self, model, pool):
        self.model, self.pool = model, pool
        self.x = torch.randn(1, WIDTH, device=device)
        self.steps = 0
        self.pending = []
        self.tokens = 0

    def step(self):
        if self.pool is not None and self.steps % EVERY == 0:
            self.pending.append(self.pool.submit(tokenize, TEXTS[self.steps // EVERY % len(TEXTS)]))
        self.x = torch.tanh(self.model(self.x))
        done = [f for f in self.pending if f.done()]
        for f in done:
            self.tokens += len(f.result())
            self.pending.remove(f)
        self.steps += 1


def make_pool(kind):
    if kind == "thread":
        pool = ThreadPoolExecutor(max_workers=1)
    elif kind == "process":
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    else:
        return None
    list(pool.map(tokenize, ["warm up the worker"] * 2))  # start the worker now
    return pool


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


def run_steps(loop, n):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        loop.step()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--pool", default="thread", choices=["thread", "process", "none"])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = make_model()
    t0 = time.perf_counter()
    tokenize(TEXTS[0])
    tokenize_ms = (time.perf_counter() - t0) * 1e3
    pools = {kind: make_pool(kind) for kind in ("thread", "process", "none")}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        loop = Loop(model, pools[args.pool])
        for _ in range(4):
            loop.step()
        with profile(activities=activities, schedule=schedule(wait=0, warmup=2, active=6, repeat=1),
                     on_trace_ready=export_gz(os.path.join(args.out_dir, "trace.json.gz")),
                     with_stack=True) as prof:
            for _ in range(8):
                loop.step()
                prof.step()
        loops = {kind: Loop(model, pool) for kind, pool in pools.items()}
        for lp in loops.values():
            run_steps(lp, 4)
        per_round = {kind: [] for kind in loops}
        for _ in range(args.rounds):
            for kind, lp in loops.items():
                per_round[kind].append(run_steps(lp, args.steps))
    for pool in pools.values():
        if pool is not None:
            pool.shutdown()
    truth = {"pool": args.pool, "torch": torch.__version__, "python": sys.version.split()[0],
             "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "switch_interval_s": sys.getswitchinterval(), "tokenize_ms_alone": tokenize_ms,
             "profiled_steps": 6, "rounds": args.rounds, "steps_per_round": args.steps, "ms_per_step": per_round,
             "median_ms_per_step": {k: median(r) for k, r in per_round.items()},
             "saving_process_ms": median(t - p for t, p in zip(per_round["thread"], per_round["process"]))}
    with open(os.path.join(args.out_dir, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps({k: truth[k] for k in ("tokenize_ms_alone", "median_ms_per_step", "saving_process_ms")}))


if __name__ == "__main__":
    main()
