"""The profiler's own cost in a trace, from costs measured per recorded event: this capture's probe
(meta.json `profiler_cost`, analyzer.capture.probe), else the project's own probes on the nearest torch version with
the same settings (profiler_costs.json), which makes the unprofiled world an estimate.

Each recorded event costs its kind's time from its start: a cpu_op or annotation, a Python call, a C function's call
(a `<built-in ...>` frame), a runtime call (CUPTI's callback, measured on kernel launches), an allocator [memory]
event, and a CUDA graph launch call a cost per node of its graph on top (CUPTI traces each node; the nodes are the GPU
activities the call launched); where the capture ran a stackless pass, the Python events of each host gap it timed
cost what that gap lost to them (analyzer.views.stackless), laid where it was paid: the profiler's own code first,
the rest by the events' probed costs. Where events crowd, the times overlap and count once, so the cost of a span
never exceeds the span. On the GPU, CUPTI lengthens the gap between kernels that run back to
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

from analyzer.views.instrumentation import PROFILER_FRAME
from analyzer.views.replay import GRAPH_LAUNCHES, LAUNCH_BOUND, WAITS, ReplayModel
from analyzer.views.stackless import STEP_PREFIX

TABLE_FILE = Path(__file__).with_name("profiler_costs.json")
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
    multiplies every probed cost alike, the GPU's included; what was measured (a timed gap's loss, a graph's replays
    timed without the profiler) it leaves alone, and a probed cost it moves stops where a timed gap starts.

    Where the capture ran a stackless pass (analyzer.views.stackless), the Python events in a host gap it timed cost
    together what the gap lost to them: the gap's length less its stackless length, measured, not probed, laid where
    it was paid (_shares). The ratio of that to their probed cost (`stackless["measured_over_probed"]`) then scales
    the probed cost of the Python events no such gap holds."""

    def __init__(self, ctx, model: ReplayModel, costs: EventCosts, until_ns: int | None = None):
        self.costs = costs
        m = ctx.model
        horizon = np.iinfo(np.int64).max if until_ns is None else until_ns
        us = costs.per_event_us
        builtin = np.array([n.startswith("<built-in") for n in m.names], bool)
        frame_ns = np.where(builtin[m.frames.name], us["c_call"], us["python_call"]) * 1e3 if len(m.frames) else \
            np.zeros(0)
        kept = _profiler_code_kept(m, ctx.stackless) if ctx.stackless is not None else 0.0
        frame_ns, gaps, self.stackless = _stackless_frames(m, frame_ns, ctx.stackless_gaps, kept)
        if ctx.stackless_error:
            self.stackless = {"unreadable": ctx.stackless_error}
        rt, gpu = m.runtime, m.gpu
        nodes = np.bincount(gpu.launch[gpu.launch >= 0], minlength=len(rt))[:len(rt)] if len(rt) else np.zeros(0)
        graph_launch = np.isin(rt.name, [c for c, n in enumerate(m.names) if n in GRAPH_LAUNCHES])
        runtime_ns = (us["launch"] + np.where(graph_launch, nodes * us["graph_node"], 0.0)) * 1e3
        sources = ((m.ops.tid, m.ops.start_ns, np.full(len(m.ops), us["op"] * 1e3), False),
                   (m.frames.tid, m.frames.start_ns, frame_ns, False),
                   (rt.tid, rt.start_ns, runtime_ns, False),
                   (m.memory.tid, m.memory.ts_ns, np.full(len(m.memory), us["memory_event"] * 1e3), False),
                   (*gaps, True), (*_between_profiler_steps(m), True))
        launch = gpu.launch[model.rows]
        in_graph = (launch >= 0) & graph_launch[np.maximum(launch, 0)] if len(rt) else np.zeros(len(launch), bool)
        gpu_gap_ns = np.where(in_graph, us["gpu_graph_node"], us["gpu_queued_kernel"]) * 1e3
        graph_cut, self.graph_replays = _graph_replays(ctx, model, launch, in_graph)
        if graph_cut is not None:  # the user's own graphs timed without CUPTI: measured, not probed or scaled
            gpu_gap_ns = np.where(in_graph, 0.0, gpu_gap_ns)
        self._model, self._gpu_gap_ns = model, gpu_gap_ns
        self._gpu_measured_ns, self._ready_ns = graph_cut if graph_cut is not None else (np.zeros(len(gpu_gap_ns)), 0)
        self.graph_node_gpu_ns = int(us["gpu_graph_node"] * 1e3)
        self.by_thread = []
        timed = self._timed_gaps(ctx.stackless_gaps, gaps)
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
            if len(timed) and tid == ctx.stackless_gaps.tid:
                k = np.searchsorted(timed, t, side="right")
                room = np.where(k < len(timed), timed[np.minimum(k, len(timed) - 1)] - t, np.inf)
            self.by_thread.append((t, c, np.where(fixed, np.inf, room), fixed))

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
        for t, c, room, fixed in self.by_thread:
            if not len(t):
                out.append((t, t, t))
                continue
            end = np.maximum.accumulate(t + np.minimum(np.where(fixed, c, c * scale), room).astype(np.int64))
            first = np.flatnonzero(np.r_[True, t[1:] > end[:-1]])
            s, e = t[first], end[np.r_[first[1:], len(t)] - 1]
            out.append((s, e, np.cumsum(e - s) - (e - s)))
        return out


def _between_profiler_steps(m) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch.profiler's own step(): from one ProfilerStep#N's end to the next one's start on the same thread, both
    inside the same `prof.step()` call, is code no unprofiled run has. Returns (tid, start, its whole length) to cut,
    measured."""
    rows = np.flatnonzero([m.names[c].startswith(STEP_PREFIX) for c in m.steps.name])
    if len(rows) < 2:
        return (np.zeros(0, np.int64),) * 2 + (np.zeros(0),)
    tid = m.ops.tid[m.steps.op[rows]]
    order = np.lexsort((m.steps.start_ns[rows], tid))
    rows, tid = rows[order], tid[order]
    start, end = m.steps.end_ns[rows[:-1]], m.steps.start_ns[rows[1:]]
    keep = (tid[1:] == tid[:-1]) & (end > start)
    return tid[:-1][keep], start[keep], (end - start)[keep].astype(np.float64)


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


RATIO_RANGE = (0.25, 4.0)  # how far the stackless pass's ratio may move the probed cost of the other Python events
RATIO_EVIDENCE_NS = 100_000  # the probed cost the timed gaps must hold before their ratio applies elsewhere


def _profiler_code_kept(stacked, stackless) -> float:
    """How much of its traced time the profiler's own Python still takes without stacks: prof.step() between two
    steps (nothing else runs there) in the stackless pass over the same in the trace; 0 where either has none."""
    with_stacks = _between_profiler_steps(stacked)[2].sum()
    without = _between_profiler_steps(stackless)[2].sum()
    return float(min(without / with_stacks, 1.0)) if with_stacks > 0 and without > 0 else 0.0


def _stackless_frames(m, frame_ns: np.ndarray, gaps, kept: float = 0.0) -> tuple[np.ndarray, tuple, dict | None]:
    """The Python events' costs with the stackless pass's timing: (each frame's probed cost, zero where a timed gap
    holds it and the gap's measured cost stands for it, else scaled by the measured-over-probed ratio), the gaps'
    measured costs as (tid, start, cost) cuts laid where they were paid (_shares) and the report's summary (None
    without a stackless pass)."""
    none = (np.zeros(0, np.int64),) * 3
    if gaps is None:
        return frame_ns, none, None
    summary = {"steps_matched": gaps.steps_matched, "steps": gaps.steps, "gaps": 0, "python_events": 0,
               "probed_ms": 0.0, "measured_ms": 0.0, "measured_over_probed": None}
    mine = np.flatnonzero(m.frames.tid == gaps.tid) if len(frame_ns) else np.zeros(0, np.int64)
    mine = mine[np.argsort(m.frames.start_ns[mine], kind="stable")]
    k = np.searchsorted(gaps.start_ns, m.frames.start_ns[mine], side="right") - 1
    inside = (k >= 0) & (m.frames.start_ns[mine] < gaps.end_ns[np.maximum(k, 0)]) if len(gaps.start_ns) else \
        np.zeros(len(mine), bool)
    if not inside.any():
        return frame_ns, none, summary
    held, k = mine[inside], k[inside]
    probed = np.bincount(k, weights=frame_ns[held], minlength=len(gaps.start_ns))
    timed = np.flatnonzero(probed > 0)
    if not len(timed):
        return frame_ns, none, summary
    length = gaps.end_ns - gaps.start_ns
    measured = np.clip(length - gaps.stackless_ns, 0, length)
    ratio = float(measured[timed].sum() / probed[timed].sum())
    summary.update(gaps=int(len(timed)), python_events=int(len(held)),
                   probed_ms=round(float(probed[timed].sum()) / 1e6, 4),
                   measured_ms=round(float(measured[timed].sum()) / 1e6, 4), measured_over_probed=round(ratio, 3))
    out = frame_ns.copy()
    if probed[timed].sum() >= RATIO_EVIDENCE_NS:
        out *= min(max(ratio, RATIO_RANGE[0]), RATIO_RANGE[1])
    start, gap, share = _shares(m, gaps, held, k, frame_ns[held], measured, kept)
    starts = _packed(start, share, gap, gaps.start_ns, length)
    out[held] = 0.0
    return out, (np.full(len(starts), gaps.tid, np.int64), starts, share), summary


def _shares(m, gaps, held: np.ndarray, gap: np.ndarray, probed: np.ndarray, measured: np.ndarray,
            kept: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each gap's cost was paid, as (start, gap, share) in start order: the profiler's own code
    (PROFILER_FRAME, its outermost frames, cut to the gaps they cross) first, its whole traced time, since an
    unprofiled run has none of it: what the gap lost (`measured`) and the share `kept` of that code's traced time
    that it still took without stacks (_profiler_code_kept), which the stackless pass's length still holds; the rest
    of the loss over the gap's other Python events (`held`, in start order, and their gaps) by their probed cost, so
    that taking a function's run out of a gap takes out the part of the cost its own events paid (a pure-Python
    helper's, not a C call's beside it that the profiler barely slows)."""
    on_thread = np.flatnonzero(m.frames.tid == gaps.tid)
    on_thread = on_thread[np.argsort(m.frames.start_ns[on_thread], kind="stable")]
    own = np.array([bool(PROFILER_FRAME.search(n)) for n in m.names], bool)[m.frames.name[on_thread]]
    f_start, f_end = m.frames.start_ns[on_thread], m.frames.end_ns[on_thread]
    reach = np.maximum.accumulate(np.where(own, f_end, np.iinfo(np.int64).min)) if len(own) else f_end
    outer = own & np.r_[True, f_start[1:] >= reach[:-1]]
    p_start, p_end = f_start[outer], f_end[outer]
    # each outermost profiler frame cut to every gap it crosses
    lo = np.searchsorted(gaps.end_ns, p_start, side="right")
    hi = np.searchsorted(gaps.start_ns, p_end, side="left")
    count = np.maximum(hi - lo, 0)  # (a gap no Python event starts in is not timed: nothing of it is laid)
    piece_gap = np.repeat(lo, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
    piece_start = np.maximum(np.repeat(p_start, count), gaps.start_ns[piece_gap])
    piece_ns = (np.minimum(np.repeat(p_end, count), gaps.end_ns[piece_gap]) - piece_start).astype(np.float64)
    piece_ns[~np.isin(piece_gap, gap)] = 0.0
    per_gap = np.bincount(piece_gap, weights=piece_ns, minlength=len(measured))
    # the held events the profiler's frames hold are in their pieces
    at = np.searchsorted(p_start, m.frames.start_ns[held], side="right") - 1
    under = (at >= 0) & (m.frames.start_ns[held] < p_end[np.maximum(at, 0)]) if len(p_start) else \
        np.zeros(len(held), bool)
    rest = np.where(under, 0.0, probed)
    rest_gap = np.bincount(gap, weights=rest, minlength=len(measured))
    length = (gaps.end_ns - gaps.start_ns).astype(np.float64)
    measured = np.minimum(measured + kept * per_gap, length)
    left = np.maximum(measured - per_gap, 0.0)
    start = np.r_[piece_start, m.frames.start_ns[held]]
    gap_of = np.r_[piece_gap, gap]
    # the profiler's code takes at most its own time, unless the gap holds no other event to lay the rest on
    fill = measured / np.maximum(per_gap, 1.0)
    share = np.r_[piece_ns * np.where(rest_gap > 0, np.minimum(fill, 1.0), fill)[piece_gap],
                  rest * (left / np.maximum(rest_gap, 1e-9))[gap]]
    order = np.lexsort((start, gap_of))
    return start[order], gap_of[order], share[order]


def _packed(start: np.ndarray, share: np.ndarray, gap: np.ndarray, gap_start: np.ndarray,
            gap_ns: np.ndarray) -> np.ndarray:
    """Where each event's share of its gap's cost is laid (events in start order, gap by gap): from its start, or
    right after the share before it where they crowd, and never so late that the gap's later shares run past its
    end."""
    at = (start - gap_start[gap]).astype(np.float64)
    first = np.r_[True, gap[1:] != gap[:-1]]
    group = np.cumsum(first) - 1
    total = np.cumsum(share)
    before = total - share
    laid = before - before[first][group]  # the gap's shares laid before this event
    in_gap = total[np.r_[np.flatnonzero(first)[1:], len(gap)] - 1][group] - before[first][group]
    # end_i = laid_i + share_i + max over the gap's earlier events j of (at_j - laid_j): one cumulative maximum over
    # all gaps, each lifted above the ones before it
    lift = (group + 1) * (2.0 * float(gap_ns.max()) + 2.0 * float(in_gap.max()) + 1.0)
    packed = np.maximum.accumulate(at - laid + lift) - lift + laid
    latest = gap_ns[gap] - (in_gap - laid)  # the last start that leaves room for the gap's later shares
    return (gap_start[gap] + np.minimum(packed, latest)).astype(np.int64)
