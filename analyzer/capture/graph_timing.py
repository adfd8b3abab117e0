"""CUDA graph replays timed on the GPU without the profiler: the recorded window run once more, each
`torch.cuda.CUDAGraph.replay()` between two CUDA events, behind a sleeping kernel.

Under CUPTI a graph's nodes run further apart than without it, by an amount that depends on the graph (0.11-0.2 µs a
node in synthetic graphs, 0.37 µs in a 588-node decode graph), so the probe's figure cannot price the user's own
graphs. The sleeping kernel ahead of the start event keeps the stream busy until the replay's launch has arrived:
the start event then completes the moment the graph's first node can start, and the two events time the graph's
GPU work alone, not the host's launch latency (meta.json `graph_replays`; analyzer.views.profiler_cost compares it
with the trace's replays).
"""
from __future__ import annotations

import torch

SLEEP_CYCLES = 400_000  # ~0.2 ms at an H100's clock: longer than launching any graph takes the host
MAX_KEPT = 4096  # replays whose times meta.json keeps


class NoProfiler:
    """What the kind's run_profiled steps where the profiler would be."""

    def step(self) -> None:
        pass


class ReplayTimer:
    """While entered, every CUDAGraph.replay() is timed on the GPU (`results()` once the device is synchronized)."""

    def __init__(self):
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._original = None

    def __enter__(self) -> ReplayTimer:
        original = self._original = torch.cuda.CUDAGraph.replay
        pairs = self.pairs

        def replay(graph, *args, **kwargs):
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

    def results(self) -> dict:
        ms = [start.elapsed_time(end) for start, end in self.pairs]
        return {"replays": len(ms), "gpu_ms": [round(t, 5) for t in ms[:MAX_KEPT]],
                "mean_ms": round(sum(ms) / len(ms), 5) if ms else None,
                "how": "the recorded window once more without the profiler, each CUDAGraph.replay() between two CUDA "
                       "events behind a sleeping kernel: the graph's GPU work, without the launch's latency"}
