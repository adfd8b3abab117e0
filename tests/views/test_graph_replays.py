"""The capture's unprofiled timing of the window's CUDA graph replays (analyzer/capture/graph_timing.py, meta.json
`graph_replays`) against the trace's replays, on real H100 captures (tests/fixtures/h100_graph_timing: a 588-node
decode graph at batch 8): the world the what-if replays runs each graph as long as it ran unprofiled, and starts it
as soon after its launch call."""
from pathlib import Path

import numpy as np
import pytest

from analyzer import api
from analyzer.views.context import AnalysisContext
from analyzer.views.profiler_cost import ProfilerCost, event_costs
from analyzer.views.replay import GRAPH_LAUNCHES

PAIRS = Path(__file__).resolve().parents[1] / "fixtures" / "h100_graph_timing"
GRAPH_PAIRS = ["graph_sync_host_vs_no_host_work", "graph_sync_host_vs_no_item", "graph_pageable_upload"]


def context(name: str) -> AnalysisContext:
    trace = api.load(PAIRS / name, cache=False)
    return AnalysisContext(trace.model, trace.meta, stackless=trace.stackless)


def replay_spans(ctx, gpu_start, gpu_end) -> np.ndarray:
    """Each graph launch's first node's start to its last node's end."""
    m = ctx.model
    launches = np.flatnonzero(np.isin(m.runtime.name, [c for c, n in enumerate(m.names) if n in GRAPH_LAUNCHES]))
    return np.array([gpu_end[m.gpu.launch == r].max() - gpu_start[m.gpu.launch == r].min() for r in launches])


@pytest.mark.parametrize("name", GRAPH_PAIRS)
def test_the_world_runs_each_graph_as_long_as_it_ran_unprofiled(name):
    """Under CUPTI the graph's 588 nodes run 0.29 µs further apart each (2.18 ms a replay against 2.01 timed
    without the profiler), where the probe's own graph measured 0.19-0.20: the world takes the measured
    difference off, and each replay's span lands on the unprofiled one."""
    ctx = context(name)
    measured = ctx.meta.get("graph_replays")
    assert measured["replays"] > 0 and len(measured["gpu_ms"]) == measured["replays"]
    unprofiled_ns = measured["mean_ms"] * 1e6
    traced = replay_spans(ctx, ctx.model.gpu.start_ns, ctx.model.gpu.end_ns)
    assert (traced > 1.05 * unprofiled_ns).all()  # CUPTI's cost on this graph: over 5%
    cost = ProfilerCost(ctx, ctx.replay, event_costs(ctx))
    world = cost.world()
    replayed = world.run(overhead=cost.cut(), cpu=False)
    spans = replay_spans(ctx, replayed.gpu_start_ns, replayed.gpu_end_ns)
    assert spans == pytest.approx(np.full(len(spans), unprofiled_ns), rel=0.01)
    summary = cost.graph_replays
    assert 0.2 < summary["per_node_ns"] / 1e3 < 0.4
    assert summary["unprofiled_ms"] == pytest.approx(measured["mean_ms"], abs=1e-4)
    # the launch: a replay after a sync starts ~20 µs after its call unprofiled, ~30 µs in the trace
    assert summary["launch_latency_unprofiled_us"] < summary["launch_latency_traced_us"]


def test_a_capture_without_graph_replays_records_none():
    """An eager decode replays no graph: the phase leaves nothing in meta.json, and the probe's figures stand."""
    trace = api.load(PAIRS.parent / "h100_recapture" / "host_work", cache=False)
    ctx = AnalysisContext(trace.model, trace.meta, stackless=trace.stackless)
    assert ctx.meta.get("graph_replays") is None
    assert ProfilerCost(ctx, ctx.replay, event_costs(ctx)).graph_replays is None


def test_the_profilers_own_step_is_cut_whole():
    """From one ProfilerStep#N's end to the next one's start, the thread runs torch.profiler's step() and nothing
    else (both bounds are set inside it): an unprofiled run has none of it, so the world cuts all of it, measured,
    whatever the probe says of the few events it records (33-55 µs a step here, 19-32 µs without stacks)."""
    from analyzer.views.instrumentation import PROFILER_FRAME
    from analyzer.views.timed_gaps import between_profiler_steps
    ctx = context("graph_sync_host_vs_no_item")
    m = ctx.model
    tid, start, length = between_profiler_steps(m)
    steps = [k for k, c in enumerate(m.steps.name) if m.names[c].startswith("ProfilerStep#")]
    assert len(start) == len(steps) - 1 and (length > 0).all()
    step_frames = np.flatnonzero([bool(PROFILER_FRAME.search(m.names[c])) and m.names[c].endswith(": step")
                                  for c in m.frames.name])
    for s, n in zip(start.tolist(), length.tolist()):
        inside = step_frames[(m.frames.start_ns[step_frames] <= s) & (m.frames.end_ns[step_frames] >= s + n)]
        assert len(inside) == 1  # one prof.step() call holds the whole interval
    cost = ProfilerCost(ctx, ctx.replay, event_costs(ctx))
    code = int(np.flatnonzero(ctx.replay.tids == tid[0])[0])
    cut_start, cut_end, _ = cost.cut()[code]
    for s, n in zip(start.tolist(), length.tolist()):
        inside = np.clip(np.minimum(cut_end, s + n) - np.maximum(cut_start, s), 0, None).sum()
        assert inside == n
