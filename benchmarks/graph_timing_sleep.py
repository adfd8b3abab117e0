"""Does the capture's graph timing (analyzer/capture/graph_timing.py: each replay behind a sleeping kernel) read a
graph's GPU time as the graph takes it in a loop? (CUDA only) The 24-layer decode graph at batch 8, timed with CUDA
events: 8 and 32 replays back to back behind one sleep, one replay behind sleeps of 40k, 400k and 4M cycles, and one
on an idle stream (which adds the launch latency).

    python benchmarks/graph_timing_sleep.py

Result (H100, 2026-12-06): back to back 2.670 ms a replay, behind a 400k-cycle sleep 2.669 ms, behind 4M 2.668 ms,
behind 40k 2.681 ms (too short to hide the launch), idle 2.682 ms: the sleep adds no bias."""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workloads.qwen2 import PRESETS, Generator, Sampling, random_model  # noqa: E402


def main() -> None:
    device = torch.device("cuda")
    generator = Generator(random_model(PRESETS["qwen2-0.5b"], device, torch.bfloat16, 0), 8, 2048,
                          Sampling(0.0, 0), "cuda_graph")
    generator.prefill(torch.randint(0, 1000, (8, 128), device=device))
    for _ in range(5):
        generator.step()
    torch.cuda.synchronize()
    graph = generator.graph

    def timed(replays: int, sleep_cycles: int | None) -> float:
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        else:
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / replays

    cases = {"back to back x8": (8, 400_000), "back to back x32": (32, 400_000), "behind 400k": (1, 400_000),
             "behind 4M": (1, 4_000_000), "behind 40k": (1, 40_000), "idle stream": (1, None)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(3):
        for name, (replays, cycles) in cases.items():
            times[name] += [timed(replays, cycles) for _ in range(6)]
    for name, t in times.items():
        print(f"{name:18s} median {statistics.median(t):.4f} ms  min {min(t):.4f}  max {max(t):.4f}")


if __name__ == "__main__":
    main()
