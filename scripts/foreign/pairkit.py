"""What the fix-pair scripts beside this file share: a plain torch.profiler window over the pathological variant (no
Python stacks unless asked: most users' traces have none), then every variant timed without the profiler in
interleaved rounds (the order alternating each round), and truth.json beside the trace:

    {"pair": {"pathology": NAME, "fix": NAME, "finding": [KIND, SUBKIND or null]}, "rounds": N,
     "ms_per_step": {variant: [one median per round]}, "paired_saving_ms": [pathology - fix, per round], ...}

benchmarks/what_if.py reads it as a pair: the analyzer's price for the finding against the measured saving.
A script gives make(variant) -> a step function (its state built once, warmed up by the caller)."""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, schedule

device = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _export(path: str):
    def handler(prof):
        raw = path[:-3]
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        print("wrote", path, os.path.getsize(path), "bytes", flush=True)
    return handler


def _timed(step: Callable[[], None], n: int) -> float:
    """ms per step over n steps, the GPU drained before and after."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def main(doc: str, variants: tuple[str, str], finding: tuple[str, str | None],
         make: Callable[[str], Callable[[], None]], *, profiled_steps: int = 6, steps: int = 12,
         extra: Callable[[], dict] | None = None, step_label: str = "step") -> None:
    """variants: (pathology, fix). Profiles the pathology (warm-up 2 steps, `profiled_steps` active, each in a
    record_function(`step_label`#k)), then times both."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=steps, help="steps per timed round")
    ap.add_argument("--with-stack", action="store_true", help="record Python stacks (off: as most users' traces)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    steppers = {v: make(v) for v in variants}
    for step in steppers.values():
        _timed(step, 3)  # warm-up: lazy loading, allocator, autotuning, compiles
    bad = steppers[variants[0]]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=2, active=profiled_steps, repeat=1),
                 on_trace_ready=_export(os.path.join(args.out_dir, "trace.json.gz")), record_shapes=True,
                 with_stack=args.with_stack) as prof:
        for k in range(2 + profiled_steps):
            with torch.profiler.record_function(f"{step_label}#{k}"):
                bad()
            prof.step()
    per_round: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            per_round[v].append(_timed(steppers[v], args.steps))
    paired = [a - b for a, b in zip(per_round[variants[0]], per_round[variants[1]])]
    truth = {"pair": {"pathology": variants[0], "fix": variants[1], "finding": list(finding)},
             "torch": torch.__version__, "python": sys.version.split()[0],
             "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "profiled_steps": profiled_steps, "step_label": step_label, "rounds": args.rounds,
             "steps_per_round": args.steps, "ms_per_step": per_round,
             "median_ms_per_step": {v: statistics.median(x) for v, x in per_round.items()} if args.rounds else None,
             "paired_saving_ms": paired, **(extra() if extra else {})}
    with open(os.path.join(args.out_dir, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps({"median_ms_per_step": truth["median_ms_per_step"],
                      "saving_ms": statistics.median(paired) if paired else None}), flush=True)
