"""CUDA graph replays timed on the GPU without the profiler: the recorded window run twice more, each
`torch.cuda.CUDAGraph.replay()` between two CUDA events; the first time behind a sleeping kernel, the second not.

Under CUPTI a graph's nodes run further apart than without it, by an amount that depends on the graph (0.11-0.2 µs a
node in synthetic graphs, 0.29 µs in a 588-node decode graph), and its first node starts later after the launch
call, so the probe's figures cannot price the user's own graphs. Behind the sleeping kernel the stream is busy until
the replay's launch has arrived: the start event completes the moment the graph's first node can start, and the
events time the graph's GPU work alone. Without it, a replay on an idle stream (after a sync) is timed from when the
host asked for it: the difference is the launch's latency (meta.json `graph_replays`; analyzer.views.profiler_cost
compares both with the trace's replays).
"""
from __future__ import annotations

import torch

SLEEP_CYCLES = 400_000  # ~0.2 ms at an H100's clock: longer than launching any graph takes the host
MAX_KEPT = 4096  # replays whose times meta.json keeps
IDLE_MS = 0.001  # a replay that took this much longer without the sleeping kernel started on an idle stream


class NoProfiler:
    """What the kind's run_profiled steps where the profiler would be."""

    def step(self) -> None:
        pass


class ReplayTimer:
    """While entered, every CUDAGraph.replay() is timed on the GPU, behind a sleeping kernel or not (`ms()` once
    the device is synchronized)."""

    def __init__(self, sleep: bool):
        self.sleep = sleep
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._original = None

    def __enter__(self) -> ReplayTimer:
        original = self._original = torch.cuda.CUDAGraph.replay
        pairs, sleep = self.pairs, self.sleep

        def replay(graph, *args, **kwargs):
            if sleep:
                torch.cuda._sleep(SLEEP_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = original(graph, *args, **kwargs)
            end.record()
            pairs.append((start, end))
            return result

        torch.cuda.CUDAGraph.replay = replay
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.CUDAGraph.replay = self._original

    def ms(self) -> list[float]:
        return [start.elapsed_time(end) for start, end in self.pairs]


def replay_results(behind: list[float], alone: list[float]) -> dict:
    """meta.json's `graph_replays`: the replays' GPU time (behind a sleeping kernel) and, from the pass without
    it, the launch latency: the median of what each replay took more there, over the replays whose stream was idle
    when the host asked (the others started when the work before them ended, their latency hidden)."""
    mean = sum(behind) / len(behind)
    waited = sorted(a - b for a, b in zip(alone, behind) if a - b > IDLE_MS) if len(alone) == len(behind) else []
    latency = waited[len(waited) // 2] if waited else None
    return {"replays": len(behind), "gpu_ms": [round(t, 5) for t in behind[:MAX_KEPT]], "mean_ms": round(mean, 5),
            "launch_latency_ms": round(latency, 5) if latency is not None else None, "idle_stream_replays": len(waited),
            "how": "the recorded window twice more without the profiler, each CUDAGraph.replay() between two CUDA "
                   "events: behind a sleeping kernel (the graph's GPU work alone: gpu_ms, mean_ms), then not (the "
                   "median of what a replay took more, where its stream was idle: launch_latency_ms)"}
