"""The profiler's own cost in a trace, from costs measured per recorded event: this capture's probe
(meta.json `profiler_cost`, analyzer.capture.probe), else the project's own probes on the nearest torch version with
the same settings (profiler_costs.json), which makes the unprofiled world an estimate.

Each recorded event costs its kind's time from its start: a cpu_op or annotation, a Python call, a C function's call
(a `<built-in ...>` frame), a runtime call (CUPTI's callback, measured on kernel launches), an allocator [memory]
event, and a CUDA graph launch call a cost per node of its graph on top (CUPTI traces each node; the nodes are the GPU
activities the call launched); where the capture ran a stackless pass, the events of each host gap it timed cost
what that gap lost to stacks, and its recorded calls their probed cost calibrated on the workload's own host-bound
steps (analyzer.views.timed_gaps), laid where it was paid. Where events crowd, the times overlap and count once, so
the cost of a span never exceeds the span. On the GPU, CUPTI lengthens the gap between kernels that run back to
back (eager, or a graph's nodes): that time comes off each activity's least gap after the one before it on its
stream; where the capture timed the window's CUDA graph replays without the profiler (meta.json `graph_replays`),
the replays' measured difference replaces the probe's per-node figure, and their first node starts as soon after
the launch call as it did unprofiled.
"""
from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from analyzer.views.replay import GRAPH_LAUNCHES, LAUNCH_BOUND, WAITS, ReplayModel
from analyzer.views.timeline import intersect_intervals, merge_intervals
from analyzer.views.timed_gaps import between_profiler_steps, profiler_code_kept, timed_costs

TABLE_FILE = Path(__file__).with_name("profiler_costs.json")
COVER_BLOCK = 1 << 18  # rows of a table read at a time where a thread's recorded time is merged
KINDS = ("op", "python_call", "c_call", "launch", "memory_event", "graph_node", "gpu_queued_kernel", "gpu_graph_node")


@dataclasses.dataclass(frozen=True)
class EventCosts:
    """The profiler's cost per recorded event of each kind (µs), and where the figures come from."""
    per_event_us: dict[str, float]
    source: str  # "probe": this capture's own; "table": the project's probes (an estimate)
    label: str  # for the report: which probe

    @property
    def estimated(self) -> bool:
        return self.source != "probe"


@lru_cache(maxsize=1)
def _table() -> tuple[dict, ...]:
    return tuple(json.loads(TABLE_FILE.read_text())["probes"])


def _minor(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(version).split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return None


def event_costs(ctx) -> EventCosts:
    """This capture's probed costs, else the table's entry for the trace's settings (what it recorded: Python
    frames, [memory] events, GPU activity) on the torch version meta.json names, or the nearest one."""
    meta = ctx.meta
    probed = meta.get("profiler_cost", "per_event_us") if meta else None
    if isinstance(probed, dict) and all(isinstance(probed.get(k, 0.0), (int, float)) for k in KINDS):
        return EventCosts({k: float(probed.get(k, 0.0)) for k in KINDS}, "probe", "this capture's probe")
    model = ctx.model
    settings = {"with_stack": len(model.frames) > 0, "profile_memory": len(model.memory) > 0,
                "cuda": len(model.gpu) > 0}
    torch_version = _minor(meta.get("environment", "torch") if meta else None)
    rows = [r for r in _table() if all(r["settings"].get(k) == v for k, v in settings.items())] or list(_table())

    def preference(row) -> tuple:
        """The nearest torch version (the newest where the trace's is unknown), then shapes recorded (the default,
        which a trace does not show)."""
        major, minor = _minor(row["torch"]) or (0, 0)
        version = major * 100 + minor
        far = abs(version - torch_version[0] * 100 - torch_version[1]) if torch_version else -version
        return far, not row["settings"].get("record_shapes", True)

    row = min(rows, key=preference)
    return EventCosts({k: float(row["per_event_us"].get(k, 0.0)) for k in KINDS}, "table",
                      f"the project's probe on torch {row['torch']}, {row['host']}")


class ProfilerCost:
    """The profiler's cost on each thread the replay knows, as cuts the replay takes (ReplayModel.cut's form), and on
    the GPU: `world()`, the replay model with CUPTI's time between back-to-back kernels taken off their gaps. A scale
    multiplies every probed cost alike, the GPU's included; what was measured (a timed gap's costs, a graph's
    replays timed without the profiler) it leaves alone, and a probed cost it moves stops where a timed gap starts.

    Where the capture ran a stackless pass, the host gaps of its lined-up steps are timed (analyzer.views.timed_gaps):
    each loses what it lost to stacks, and its recorded calls cost their probed cost times the ratio measured on the
    workload's own host-bound steps against the unprofiled step `target_ns` of the steps named `label`."""

    def __init__(self, ctx, model: ReplayModel, costs: EventCosts, until_ns: int | None = None,
                 target_ns: float | None = None, label: str | None = None):
        self.costs = costs
        m = ctx.model
        horizon = np.iinfo(np.int64).max if until_ns is None else until_ns
        us = costs.per_event_us
        builtin = np.array([n.startswith("<built-in") for n in m.names], bool)
        frame_ns = np.where(builtin[m.frames.name], us["c_call"], us["python_call"]) * 1e3 if len(m.frames) else \
            np.zeros(0)
        rt, gpu = m.runtime, m.gpu
        nodes = np.bincount(gpu.launch[gpu.launch >= 0], minlength=len(rt))[:len(rt)] if len(rt) else np.zeros(0)
        graph_launch = np.isin(rt.name, [c for c, n in enumerate(m.names) if n in GRAPH_LAUNCHES])
        runtime_ns = (us["launch"] + np.where(graph_launch, nodes * us["graph_node"], 0.0)) * 1e3
        host = ((m.ops.tid, m.ops.start_ns, np.full(len(m.ops), us["op"] * 1e3)), (rt.tid, rt.start_ns, runtime_ns),
                (m.memory.tid, m.memory.ts_ns, np.full(len(m.memory), us["memory_event"] * 1e3)))
        kept = profiler_code_kept(m, ctx.stackless) if ctx.stackless is not None else 0.0
        timed = timed_costs(m, frame_ns, host, ctx.stackless_gaps, kept, ctx.stackless, target_ns, label)
        self.stackless = {"unreadable": ctx.stackless_error} if ctx.stackless_error else timed.summary
        sources = ((m.ops.tid, m.ops.start_ns, timed.host_ns[0], False),
                   (m.frames.tid, m.frames.start_ns, timed.frame_ns, False),
                   (rt.tid, rt.start_ns, timed.host_ns[1], False),
                   (m.memory.tid, m.memory.ts_ns, timed.host_ns[2], False),
                   (*timed.cuts, True), (*between_profiler_steps(m), True))
        launch = gpu.launch[model.rows]
        in_graph = (launch >= 0) & graph_launch[np.maximum(launch, 0)] if len(rt) else np.zeros(len(launch), bool)
        self.replays_graphs = bool(in_graph.any())  # the replay's GPU activities include graph nodes
        gpu_gap_ns = np.where(in_graph, us["gpu_graph_node"], us["gpu_queued_kernel"]) * 1e3
        graph_cut, self.graph_replays = _graph_replays(ctx, model, launch, in_graph)
        if graph_cut is not None:  # the user's own graphs timed without CUPTI: measured, not probed or scaled
            gpu_gap_ns = np.where(in_graph, 0.0, gpu_gap_ns)
        self._model, self._gpu_gap_ns = model, gpu_gap_ns
        self._gpu_measured_ns, self._ready_ns = graph_cut if graph_cut is not None else (np.zeros(len(gpu_gap_ns)), 0)
        self.graph_node_gpu_ns = int(us["gpu_graph_node"] * 1e3)
        self.by_thread = []
        # a guessed cost (the project's probes, not this capture's) never takes time no recorded event covers: the
        # trace shows the program ran then
        self.covered = [self._covered(m, tid) for tid in model.tids.tolist()] if costs.estimated else None
        timed_starts = self._timed_gaps(ctx.stackless_gaps, timed.cuts)
        for tid in model.tids.tolist():
            t, c, fixed = [], [], []
            for tids, start, cost, measured in sources:
                mine = (tids == tid) & (start < horizon)
                t.append(start[mine])
                c.append(cost[mine])
                fixed.append(np.full(int(mine.sum()), measured))
            t, c, fixed = np.concatenate(t), np.concatenate(c), np.concatenate(fixed)
            order = np.argsort(t, kind="stable")
            t, c, fixed = t[order], c[order], fixed[order]
            # a probed cost stops where the next timed gap starts: however far the check's scale moves it, it never
            # takes the time the stackless pass measured for the code there
            room = np.full(len(t), np.inf)
            if len(timed_starts) and tid == ctx.stackless_gaps.tid:
                k = np.searchsorted(timed_starts, t, side="right")
                room = np.where(k < len(timed_starts), timed_starts[np.minimum(k, len(timed_starts) - 1)] - t, np.inf)
            self.by_thread.append((t, c, np.where(fixed, np.inf, room), fixed))

    @staticmethod
    def _covered(m, tid: int) -> tuple[np.ndarray, np.ndarray]:
        """The time the thread's recorded events (ops, Python calls, runtime calls) span, merged. Each table is in
        start order, so each block of it merges with a running maximum (a large trace's events are never copied
        whole); the blocks' spans, far fewer, are merged at the end."""
        starts, ends = [], []
        for table in (m.ops, m.frames, m.runtime):
            for lo in range(0, len(table), COVER_BLOCK):
                mine = table.tid[lo:lo + COVER_BLOCK] == tid
                s, e = table.start_ns[lo:lo + COVER_BLOCK][mine], table.end_ns[lo:lo + COVER_BLOCK][mine]
                if not len(s):
                    continue
                running = np.maximum.accumulate(e)
                first = np.flatnonzero(np.r_[True, s[1:] > running[:-1]])
                starts.append(s[first])
                ends.append(running[np.r_[first[1:], len(s)] - 1])
        if not starts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return merge_intervals(np.concatenate(starts), np.concatenate(ends))

    @staticmethod
    def _timed_gaps(host_gaps, laid) -> np.ndarray:
        """The starts of the host gaps the stackless pass timed (those with a measured cost laid in them)."""
        if host_gaps is None or not len(laid[1]):
            return np.zeros(0, np.int64)
        k = np.unique(np.searchsorted(host_gaps.start_ns, laid[1], side="right") - 1)
        return host_gaps.start_ns[k[k >= 0]]

    def world(self, scale: float = 1.0) -> ReplayModel:
        """The replay model with CUPTI's time between back-to-back activities (times `scale`) off their gaps."""
        cut = (self._gpu_gap_ns * scale + self._gpu_measured_ns).astype(np.int64)
        return dataclasses.replace(self._model, gap_ns=np.maximum(self._model.gap_ns - cut, 0),
                                   ready_ns=self._model.ready_ns - self._ready_ns)

    def events(self) -> int:
        return int(sum(int((~fixed).sum()) for *_, fixed in self.by_thread))

    def cut(self, scale: float = 1.0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per thread code of the replay model: the cost intervals, each event's cost (times `scale` where it was
        probed, and then no further than the next timed gap) from its start, merged and sorted (the events are in
        time order, so a running maximum merges them)."""
        out = []
        for code, (t, c, room, fixed) in enumerate(self.by_thread):
            if not len(t):
                out.append((t, t, t))
                continue
            if self.covered is None:
                s, e = _packed(t, np.minimum(np.where(fixed, c, c * scale), room))
            else:  # the guessed costs packed alone, clipped to the recorded events, then the measured ones added
                s, e = intersect_intervals(*_packed(t[~fixed], np.minimum(c[~fixed] * scale, room[~fixed])),
                                           *self.covered[code])
                measured_s, measured_e = _packed(t[fixed], c[fixed])
                s, e = merge_intervals(np.concatenate([s, measured_s]), np.concatenate([e, measured_e]))
            out.append((s, e, np.cumsum(e - s) - (e - s)))
        return out


def _packed(t: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each event's cost from its start (events in time order), overlapping ones merged: (starts, ends)."""
    if not len(t):
        return t, t
    end = np.maximum.accumulate(t + cost.astype(np.int64))
    first = np.flatnonzero(np.r_[True, t[1:] > end[:-1]])
    return t[first], end[np.r_[first[1:], len(t)] - 1]


def _graph_replays(ctx, model: ReplayModel, launch: np.ndarray, in_graph: np.ndarray):
    """CUPTI's cost on the trace's CUDA graph replays, from the capture's unprofiled timing of the same window's
    replays (meta.json `graph_replays`, analyzer.capture.graph_timing). On the GPU: the traced replays' mean span
    (first node's start to last node's end) against the mean unprofiled one, each replay's share of the difference
    off the gaps between its nodes, evenly. At the launch: a replay whose first node started after its launch call
    (not right after its stream's previous work) starts no later after the call's start than the unprofiled launch
    latency. Returns ((per replay-model activity, the ns off its gap; the ns off its ready time), or None without
    the timing) and the report's summary."""
    meta = ctx.meta
    mean_ms = meta.get("graph_replays", "mean_ms") if meta else None
    if not isinstance(mean_ms, (int, float)) or mean_ms <= 0 or not in_graph.any():
        return None, None
    gpu = ctx.model.gpu
    rows = np.flatnonzero(in_graph)
    which, first_row = np.unique(launch[rows], return_index=True)
    at = np.searchsorted(which, launch[rows])
    start = np.full(len(which), np.iinfo(np.int64).max)
    end = np.full(len(which), np.iinfo(np.int64).min)
    np.minimum.at(start, at, gpu.start_ns[model.rows[rows]])
    np.maximum.at(end, at, gpu.end_ns[model.rows[rows]])
    nodes = np.bincount(at, minlength=len(which))
    span = (end - start).astype(np.float64)
    traced_ns, unprofiled_ns = float(span.mean()), float(mean_ms) * 1e6
    share = min(max(1.0 - unprofiled_ns / traced_ns, 0.0), 1.0) if traced_ns > 0 else 0.0
    per_node = share * span / np.maximum(nodes - 1, 1)
    first = rows[first_row]
    gap_cut = np.zeros(len(in_graph))
    gap_cut[rows] = per_node[at]
    gap_cut[first] = 0.0  # a replay's first node follows its launch, not a node of its own graph
    summary = {"replays_timed": int(meta.get("graph_replays", "replays") or 0), "replays_traced": int(len(which)),
               "unprofiled_ms": round(unprofiled_ns / 1e6, 4), "traced_ms": round(traced_ns / 1e6, 4),
               "per_node_ns": round(float(np.median(per_node)), 1)}
    ready_cut = np.zeros(len(in_graph), np.int64)
    latency_ms = meta.get("graph_replays", "launch_latency_ms")
    waited = first[np.isin(model.bound[first], (LAUNCH_BOUND, WAITS))]  # started after its launch, not its stream
    if isinstance(latency_ms, (int, float)) and len(waited):
        traced_latency = model.ready_ns[waited] - model.launch_ns[waited]
        ready_cut[waited] = np.maximum(traced_latency - int(latency_ms * 1e6), 0)
        summary.update(launch_latency_unprofiled_us=round(latency_ms * 1e3, 1),
                       launch_latency_traced_us=round(float(np.median(traced_latency)) / 1e3, 1))
    return (gap_cut, ready_cut), summary
