"""The fragmentation pair step by step, without the profiler (CUDA only): each step's time, the caching allocator's
device allocations and frees in it, and reserved memory, for workloads/decode_fragmentation.py and its fixed twin
(the plain decode), binned by 64 steps.

    python benchmarks/fragmentation_steps.py [SEQUENCES]    (default 30 sequences of 32 steps each)

Why: the what-if prices the fragmentation fix at the window's cudaMalloc calls (one a step, ~284 µs at ~800 MiB on an
H100: 0.27 ms a step) while its 12 rounds measured 0.55 ms, with smaller requests (392-776 MiB). Reserved memory
grows by the workspace every step and should reach the device's size inside the rounds, where the allocator frees its
cache and retries: a regime the window never sees. The bins show where the step's cost grows and whether frees (and
retries) come with it."""
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workloads.qwen2 import PRESETS, Sampling, random_model  # noqa: E402

BIN = 64


def steps(script: str, model, sequences: int) -> list[tuple[float, int, int, float, int]]:
    """(ms, device allocs, device frees, reserved GiB, alloc retries so far) per step."""
    workload = importlib.import_module(f"workloads.{script}").Workload(
        model, batch_size=1, prompt_length=128, capacity=2048, sampling=Sampling(0.0, 0), mode="eager", seed=0)
    rows = []
    for _ in range(sequences):
        workload.new_sequence()
        for _ in range(32):
            before = torch.cuda.memory_stats()
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            workload.step()
            torch.cuda.synchronize()
            ms = (time.perf_counter_ns() - t0) / 1e6
            after = torch.cuda.memory_stats()
            rows.append((ms, after["num_device_alloc"] - before["num_device_alloc"],
                         after["num_device_free"] - before["num_device_free"],
                         after["reserved_bytes.all.current"] / 2**30, after.get("num_alloc_retries", 0)))
    return rows


def main(sequences: int) -> None:
    model = random_model(PRESETS["qwen2-0.5b"], torch.device("cuda"), torch.bfloat16, 0)
    out = {}
    for script in ("decode_fragmentation", "decode"):
        rows = steps(script, model, sequences)
        out[script] = [{"steps": f"{i}-{i + len(b)}", "p50_ms": round(statistics.median(r[0] for r in b), 3),
                        "max_ms": round(max(r[0] for r in b), 2), "allocs": sum(r[1] for r in b),
                        "frees": sum(r[2] for r in b), "reserved_gib": round(b[-1][3], 1), "retries": b[-1][4]}
                       for i in range(0, len(rows), BIN) for b in [rows[i:i + BIN]]]
        torch.cuda.empty_cache()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
