"""The dashboard's timeline (served through analyzer.api.timeline): every lane of the trace kept whole in memory,
and `view(lo, hi)` reducing it to what one zoom level shows. Built from the analysis context's views, never
re-deriving them.

Lanes: GPU busy / idle by cause per device (the analyzer's GpuTimeline and gap causes), kernels / memcpy / memset
per stream, CUDA runtime calls per CPU thread, steps, and for serving runs the requests (waiting, then in their
batch row from admission to the last token, as the analyzer placed them on the trace clock). A view holds, per lane, the share of each of BINS
equal bins covered by each state (exact at any zoom: a bin narrower than an interval is all one state), plus the
intervals themselves for hover when at most EXACT_LIMIT of them are visible; host sync and cudaMalloc/cudaFree
calls as markers (the longest MARKER_LIMIT); the memory curves thinned to first/min/max/last sample per bin.

Times are float64 ns relative to the report's GPU window start (`t0_ns`): exact to the ns for 100 days of trace.
"""
from __future__ import annotations

import dataclasses
import html
from dataclasses import fields

import numpy as np

from analyzer.arrays import distinct
from analyzer.codepaths import FrameKind
from analyzer.report.figures import window_start_us
from analyzer.units import fmt_bytes, fmt_pct, fmt_us
from analyzer.views import apis
from analyzer.views.context import AnalysisContext
from analyzer.views.frames import outermost_op
from analyzer.views.idle import CAUSES
from analyzer.views.sites import runtime_site
from analyzer.views.timeline import activity_mask, merge_intervals

BINS = 1200
EXACT_LIMIT = 800
MARKER_LIMIT = 400
STREAM_LANES_PER_DEVICE = 4  # the busiest streams; the rest share one "other streams" lane
CPU_LANES = 2  # the threads with the most runtime calls
STEP_LINES_LIMIT = 40
NAME_CHARS = 90

DEVICE_STATES = ("busy", *(f"idle: {c}" for c in CAUSES))
STREAM_STATES = ("kernel", "memcpy", "memset")
CPU_STATES = ("launch call", "blocking sync call", "cudaMalloc/cudaFree", "other runtime call")
OP_STATES = ("cpu op",)  # the outermost cpu_op (annotations skipped): what the thread ran
CODE_STATES = ("your code",)  # the innermost frame of the user's code (generator expressions etc. in their function)
REQUEST_STATES = ("waiting", "prefill to first token", "decoding")
REQUEST_ROW_LANES = 16  # batch rows with a lane of their own; requests in higher rows share one
STEP_STATES = ("step", "step ")  # alternate shades; the trailing space keeps the legend groups apart


@dataclasses.dataclass
class Lane:
    key: str
    label: str
    kind: str  # device | stream | cpu | steps
    states: tuple[str, ...]
    starts: np.ndarray  # float64 ns since t0, sorted
    ends: np.ndarray
    state: np.ndarray  # int index into states
    ref: np.ndarray  # gpu row (stream), runtime row (cpu; idle: the responsible call), step index, or -1

    def __post_init__(self):
        order = np.argsort(self.starts, kind="stable")
        for f in ("starts", "ends", "state", "ref"):
            setattr(self, f, getattr(self, f)[order])
        self.reach = np.maximum.accumulate(self.ends) if len(self.ends) else self.ends
        self.merged = []  # per state: disjoint (starts, ends, covered length before each)
        for k in range(len(self.states)):
            mask = self.state == k
            s, e = merge_intervals(self.starts[mask], self.ends[mask])
            self.merged.append((s, e, np.concatenate([[0.0], np.cumsum(e - s)[:-1]]) if len(s) else s))

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything the lane holds as named arrays (what analyzer.timeline.cache saves)."""
        out = {f: getattr(self, f) for f in ("starts", "ends", "state", "ref", "reach")}
        for k, (s, e, before) in enumerate(self.merged):
            out.update({f"merged{k}.starts": s, f"merged{k}.ends": e, f"merged{k}.before": before})
        return out

    @classmethod
    def restore(cls, key: str, label: str, kind: str, states: tuple[str, ...], arrays: dict) -> "Lane":
        """A lane from its `arrays()`, already sorted and merged (no __post_init__)."""
        lane = cls.__new__(cls)
        lane.key, lane.label, lane.kind, lane.states = key, label, kind, tuple(states)
        for f in ("starts", "ends", "state", "ref", "reach"):
            setattr(lane, f, arrays[f])
        lane.merged = [tuple(arrays[f"merged{k}.{f}"] for f in ("starts", "ends", "before"))
                       for k in range(len(states))]
        return lane

    def visible(self, lo: float, hi: float, limit: int | None = None) -> np.ndarray | None:
        """Rows of the intervals that overlap (lo, hi), in start order; None when there are more than `limit`
        (counted without reading every row: only those that start at or before lo can end at or before it)."""
        i0 = int(np.searchsorted(self.reach, lo, side="right"))
        i1 = max(i0, int(np.searchsorted(self.starts, hi, side="left")))
        j = min(max(i0, int(np.searchsorted(self.starts, lo, side="right"))), i1)
        if limit is not None and (i1 - i0) - int(np.count_nonzero(self.ends[i0:j] <= lo)) > limit:
            return None
        rows = np.arange(i0, i1)
        return rows[self.ends[rows] > lo]


@dataclasses.dataclass
class LaneView:
    lane: Lane
    edges: np.ndarray  # BINS + 1 bin edges, ns since t0
    shares: np.ndarray  # (BINS, states) share of each bin covered by each state
    counts: np.ndarray  # intervals starting in each bin
    rows: np.ndarray | None  # visible intervals when few enough for one hover point each


@dataclasses.dataclass
class Markers:
    starts: np.ndarray  # ns since t0
    ends: np.ndarray
    rows: np.ndarray  # runtime rows


@dataclasses.dataclass
class MemoryCurve:
    device: int
    ts: np.ndarray  # ns since t0
    allocated: np.ndarray  # bytes
    reserved: np.ndarray


@dataclasses.dataclass
class TimelineView:
    lo: float
    hi: float
    lanes: list[LaneView]
    syncs: Markers
    allocs: Markers
    memory: list[MemoryCurve]  # thinned to the window
    step_edges: np.ndarray  # step boundaries to draw as lines (empty when too many are visible)


def _covered_before(starts, ends, before, t):
    """Covered length of disjoint sorted intervals up to each time t."""
    if len(starts) == 0:
        return np.zeros(len(t))
    j = np.searchsorted(starts, t, side="right") - 1
    jj = np.clip(j, 0, None)
    partial = np.clip(t - starts[jj], 0, ends[jj] - starts[jj])
    return np.where(j >= 0, before[jj] + partial, 0.0)


def _innermost(starts: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nested intervals (one thread's frames) flattened: each stretch of time goes to the innermost interval
    open then, so the result does not overlap. Returns (starts, ends, row of each piece)."""
    order = np.lexsort((-ends, starts))
    out_s, out_e, out_r = [], [], []
    stack: list[tuple[int, int]] = []  # (end, row) of the open intervals, innermost last
    cur = None

    def close_until(t):
        nonlocal cur
        while stack and stack[-1][0] <= t:
            end, row = stack.pop()
            if end > cur:
                out_s.append(cur), out_e.append(end), out_r.append(row)
                cur = end

    for s, e, r in zip(starts[order].tolist(), ends[order].tolist(), rows[order].tolist()):
        close_until(s)
        if stack and s > cur:
            out_s.append(cur), out_e.append(s), out_r.append(stack[-1][1])
        cur = s if not stack or s > cur else cur
        stack.append((e, r))
    close_until(float("inf"))
    return (np.asarray(out_s, np.int64), np.asarray(out_e, np.int64), np.asarray(out_r, np.int64))


def lane_view(lane: Lane, lo: float, hi: float, bins: int = BINS) -> LaneView:
    edges = np.linspace(lo, hi, bins + 1)
    width = (hi - lo) / bins
    shares = np.zeros((bins, len(lane.states)), np.float32)
    for k, (s, e, before) in enumerate(lane.merged):
        if len(s):
            shares[:, k] = np.diff(_covered_before(s, e, before, edges)) / width
    counts = np.diff(np.searchsorted(lane.starts, edges))
    return LaneView(lane, edges, shares, counts, lane.visible(lo, hi, EXACT_LIMIT))


def thin_curve(ts: np.ndarray, values: np.ndarray, lo: float, hi: float, bins: int = BINS):
    """Indices of the samples to draw for [lo, hi]: the one before the window, the ones in it (at most the first,
    min, max and last of each bin), and the one after, so a step curve reads the same as the whole."""
    i0 = max(int(np.searchsorted(ts, lo, side="left")) - 1, 0)
    i1 = min(int(np.searchsorted(ts, hi, side="right")) + 1, len(ts))
    idx = np.arange(i0, i1)
    if len(idx) <= 4 * bins:
        return idx
    group = np.clip(((ts[idx] - lo) * (bins / (hi - lo))).astype(np.int64), -1, bins)
    starts = np.flatnonzero(np.diff(group, prepend=group[0] - 1))
    last = np.append(starts[1:], len(idx)) - 1
    by_value = np.lexsort((values[idx], group))  # within each group, ascending value
    group_of_sorted = group[by_value]
    firsts = np.flatnonzero(np.diff(group_of_sorted, prepend=group_of_sorted[0] - 1))
    lasts = np.append(firsts[1:], len(idx)) - 1
    keep = distinct(np.concatenate([starts, last, by_value[firsts], by_value[lasts]]))
    return idx[keep]


BUILT = ("gpu_lanes", "cpu_lanes", "sync_rows", "alloc_rows", "memory", "memory_source")


class TimelineData:
    """One run's lanes, markers and memory curves, built once from the trace model and kept in the LRU."""

    def __init__(self, ctx: AnalysisContext, report: dict, saved: dict | None = None):
        """`saved`: what `built()` returned for the same trace and report (analyzer.timeline.cache keeps it
        beside the trace's columnar cache), so that a fresh process skips the idle pieces and the lane merges."""
        model = ctx.model
        self.model = model
        self.ctx = ctx
        self.t0_us = window_start_us(report)
        self.t0_ns = int(round(self.t0_us * 1000))
        self._sites: dict[int, str] = {}
        self._ops: dict[int, str] = {}
        self.steps = [s for s in (report.get("gaps") or {}).get("per_step") or [] if s.get("ts_us") is not None]
        self.requests = (report.get("serving") or {}).get("requests") or []
        if saved is None:
            classes, blocking = ctx.runtime_classes, ctx.blocking
            self.gpu_lanes = [self._steps_lane(), *self._request_lanes(), *self._device_and_stream_lanes()]
            self.cpu_lanes = self._cpu_lanes(classes, blocking)
            self.sync_rows = np.flatnonzero(blocking)
            self.alloc_rows = np.flatnonzero(classes == apis.IS_ALLOC)
            self.memory = self._memory()
        else:
            for name in BUILT:
                setattr(self, name, saved[name])
            self._sites.update(saved["sites"])
        rt = model.runtime
        self._rt_starts = self._rel(rt.start_ns)
        self._rt_ends = self._rel(rt.end_ns)
        self.report_allocator = report.get("allocator") or {}
        self.reserved_peak_bytes = max([int((report.get("allocator") or {}).get("reserved_peak_bytes") or 0)]
                                       + [int(m.reserved.max()) for m in self.memory if len(m.reserved)])
        spans = [(lane.starts[0], lane.reach[-1]) for lane in self.lanes if len(lane.starts)]
        spans += [(m.ts[0], m.ts[-1]) for m in self.memory if len(m.ts)]
        self.extent = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0.0, 1e6)

    @property
    def lanes(self) -> list[Lane]:
        return self.gpu_lanes + self.cpu_lanes

    def built(self) -> dict:
        """What the constructor computed from the views (the `saved` of another TimelineData of this trace), and
        the call sites of the markers the whole trace's view shows (their hover would otherwise build the frame
        index: a third of a second of a 1M-event run's first paint)."""
        lo, hi = self.full_range()
        shown = np.concatenate([self._markers(rows, lo, hi).rows for rows in (self.sync_rows, self.alloc_rows)])
        return {**{name: getattr(self, name) for name in BUILT},
                "sites": {int(r): self.site(int(r)) for r in shown.tolist()}}

    def nbytes(self) -> int:
        model_bytes = sum(getattr(getattr(self.model, f.name), c.name).nbytes
                          for f in fields(self.model) if f.name in ("ops", "frames", "runtime", "gpu", "memory",
                                                                    "overhead", "steps", "gpu_annotations")
                          for c in fields(getattr(self.model, f.name)))
        own = sum(lane.nbytes() for lane in self.lanes) + sum(
            m.ts.nbytes * 3 for m in self.memory) + self._rt_starts.nbytes * 2
        return model_bytes + own

    def _rel(self, ns: np.ndarray) -> np.ndarray:
        return (np.asarray(ns, np.int64) - self.t0_ns).astype(np.float64)

    # ------------------------------------------------------------ lanes

    def _steps_lane(self) -> Lane:
        ts = np.array([s["ts_us"] for s in self.steps], np.float64)
        wall = np.array([s["wall_us"] for s in self.steps], np.float64)
        starts = (ts - self.t0_us) * 1e3
        n = len(self.steps)
        return Lane("steps", "steps", "steps", STEP_STATES, starts, starts + wall * 1e3,
                    np.arange(n) % 2, np.arange(n))

    def _request_lanes(self) -> list[Lane]:
        """One lane of waiting requests, then one per batch row: prefill to first token, then decoding."""
        reqs = self.requests
        if not reqs:
            return []

        def at(key: str) -> np.ndarray:
            return (np.array([r[key] for r in reqs], np.float64) - self.t0_us) * 1e3

        arrived, admitted, first, finished = at("arrived_us"), at("admitted_us"), at("first_token_us"), at(
            "finished_us")
        index = np.arange(len(reqs))
        lanes = [Lane("requests waiting", "requests waiting", "request", REQUEST_STATES, arrived, admitted,
                      np.zeros(len(reqs), np.int64), index)]
        rows = np.array([r["row"] if isinstance(r.get("row"), int) else -1 for r in reqs])
        shown = sorted(set(rows[(rows >= 0) & (rows < REQUEST_ROW_LANES)].tolist()))
        groups = [(f"batch row {row}", rows == row) for row in shown]
        if (rows >= REQUEST_ROW_LANES).any():
            groups.append((f"batch rows {REQUEST_ROW_LANES}+", rows >= REQUEST_ROW_LANES))
        for label, mask in groups:
            sel = index[mask]
            lanes.append(Lane(label, label, "request", REQUEST_STATES,
                              np.concatenate([admitted[sel], first[sel]]), np.concatenate([first[sel], finished[sel]]),
                              np.repeat([1, 2], len(sel)), np.concatenate([sel, sel])))
        return lanes

    def _device_and_stream_lanes(self) -> list[Lane]:
        model, gpu = self.model, self.model.gpu
        lanes = []
        active = activity_mask(model)
        idle = self.ctx.idle
        piece_device = self.ctx.gaps.device[idle.gap] if len(idle) else np.zeros(0, np.int64)
        for dev in self.ctx.timeline.devices:
            nb = len(dev.busy_starts)
            mine = np.flatnonzero(piece_device == dev.device)
            lanes.append(Lane(
                f"gpu{dev.device}", f"GPU {dev.device}", "device", DEVICE_STATES,
                self._rel(np.concatenate([dev.busy_starts, idle.start_ns[mine]])),
                self._rel(np.concatenate([dev.busy_ends, idle.end_ns[mine]])),
                np.concatenate([np.zeros(nb, np.int64), 1 + np.asarray(idle.cause[mine], np.int64)]),
                np.concatenate([np.full(nb, -1, np.int64), np.asarray(idle.row[mine], np.int64)])))
            rows = np.flatnonzero(active & (gpu.device == dev.device))
            streams, inverse = np.unique(gpu.stream[rows], return_inverse=True)
            busy = np.bincount(inverse, weights=(gpu.end_ns[rows] - gpu.start_ns[rows]).astype(np.float64))
            ranked = streams[np.argsort(-busy, kind="stable")]
            own = ranked[:STREAM_LANES_PER_DEVICE]
            groups = [(f"GPU {dev.device} · stream {s}", rows[gpu.stream[rows] == s]) for s in sorted(own)]
            if len(ranked) > len(own):
                groups.append((f"GPU {dev.device} · {len(ranked) - len(own)} other streams",
                               rows[~np.isin(gpu.stream[rows], own)]))
            for label, sel in groups:
                kind = np.asarray(gpu.kind[sel], np.int64)
                lanes.append(Lane(f"{label}", label, "stream", STREAM_STATES, self._rel(gpu.start_ns[sel]),
                                  self._rel(gpu.end_ns[sel]), kind, sel.astype(np.int64)))
        return lanes

    def _cpu_lanes(self, classes: np.ndarray, blocking: np.ndarray) -> list[Lane]:
        rt = self.model.runtime
        if not len(rt):
            return []
        state = np.full(len(rt), 3, np.int64)
        state[classes == apis.IS_LAUNCH] = 0
        state[classes == apis.IS_ALLOC] = 2
        state[blocking] = 1
        tids, counts = np.unique(rt.tid, return_counts=True)
        lanes = []
        for tid in tids[np.argsort(-counts, kind="stable")][:CPU_LANES].tolist():
            rows = np.flatnonzero(rt.tid == tid)
            rows = rows[np.argsort(rt.start_ns[rows], kind="stable")]
            # a driver call inside the runtime call that made it (cuLaunchKernel in cudaLaunchKernel) is one call
            ends = rt.end_ns[rows]
            reach_before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]])
            rows = rows[rt.start_ns[rows] >= reach_before]
            name = self.model.synthetic_ids.get(tid, str(tid))
            lanes.append(Lane(f"cpu{tid}", f"CPU thread {name}", "cpu", CPU_STATES, self._rel(rt.start_ns[rows]),
                              self._rel(rt.end_ns[rows]), state[rows], rows.astype(np.int64)))
            lanes += self._context_lanes(tid, name)
        return lanes

    def _context_lanes(self, tid, name: str) -> list[Lane]:
        """What the thread was doing between runtime calls: its outermost cpu_ops, and the innermost frames of
        the user's code (each such frame that holds no other of them, so the lane's intervals do not nest)."""
        lanes = []
        ops = self.model.ops
        if len(ops):
            outer = self.ctx.outermost_ops
            rows = np.flatnonzero((ops.tid == tid) & (outer == np.arange(len(ops))))
            if len(rows):
                lanes.append(Lane(f"ops{tid}", f"CPU thread {name} · ops", "cpu_op", OP_STATES,
                                  self._rel(ops.start_ns[rows]), self._rel(ops.end_ns[rows]),
                                  np.zeros(len(rows), np.int64), rows.astype(np.int64)))
        frames = self.model.frames
        if len(frames):
            index = self.ctx.frames
            owners = np.flatnonzero((index.user_frame == np.arange(len(frames))) & (frames.tid == tid))
            starts, ends, rows = _innermost(frames.start_ns[owners], frames.end_ns[owners], owners)
            mine = index.kind[rows] != FrameKind.TOOL if len(rows) else np.zeros(0, bool)
            if mine.any():
                lanes.append(Lane(f"code{tid}", f"CPU thread {name} · your code", "code", CODE_STATES,
                                  self._rel(starts[mine]), self._rel(ends[mine]),
                                  np.zeros(int(mine.sum()), np.int64), rows[mine].astype(np.int64)))
        return lanes

    def covering(self, spans_us, limit: int = 6) -> dict[str, list[tuple[str, float]]]:
        """The ops and user frames that ran on the CPU lanes' threads during the spans (trace µs), the longest
        first: {"ops": [(name, µs)], "code": [(name, µs)]}."""
        out = {}
        for kind, key in (("cpu_op", "ops"), ("code", "code")):
            table = self.model.ops if kind == "cpu_op" else self.model.frames
            total: dict[str, float] = {}
            for lane in (lane for lane in self.cpu_lanes if lane.kind == kind):
                for s_us, e_us in spans_us:
                    lo, hi = (s_us - self.t0_us) * 1e3, (e_us - self.t0_us) * 1e3
                    rows = lane.visible(lo, hi)
                    cover = np.minimum(lane.ends[rows], hi) - np.maximum(lane.starts[rows], lo)
                    for r, c in zip(lane.ref[rows].tolist(), cover.tolist()):
                        label = self.model.names[table.name[r]]
                        total[label] = total.get(label, 0.0) + c / 1e3
            out[key] = sorted(total.items(), key=lambda kv: -kv[1])[:limit]
        return out

    def _memory(self) -> list[MemoryCurve]:
        """The [memory] events' curves, with each reserved drop moved to the end of the cudaFree (cuMemUnmap,
        ...) that caused it: a release emits no [memory] event of its own, so the new reserved value would
        otherwise first show at the next allocation."""
        rt, names = self.model.runtime, self.model.names
        releases = np.flatnonzero(self.ctx.runtime_classes == apis.IS_ALLOC)
        releases = releases[[names[c] not in apis.ALLOC_RESERVE for c in rt.name[releases]]]
        ends = np.sort(rt.end_ns[releases])
        out = []
        if not self.ctx.memory_series:
            return self._memory_fallback()
        self.memory_source = "[memory] events"
        for m in self.ctx.memory_series:
            ts, alloc, res = m.ts_ns, np.asarray(m.allocated), np.asarray(m.reserved)
            if len(ends) and len(ts):
                nxt = np.searchsorted(ts, ends, side="right")  # the first [memory] event after each release
                ok = (nxt > 0) & (nxt < len(ts))
                ok[ok] &= res[nxt[ok]] < res[nxt[ok] - 1]  # the reserved value did drop across the release
                at, nxt = ends[ok], nxt[ok]
                ts = np.concatenate([ts, at])
                alloc = np.concatenate([alloc, alloc[nxt - 1]])
                res = np.concatenate([res, res[nxt]])
                order = np.argsort(ts, kind="stable")
                ts, alloc, res = ts[order], alloc[order], res[order]
            out.append(MemoryCurve(m.device, self._rel(ts), alloc, res))
        return out

    def _memory_fallback(self) -> list[MemoryCurve]:
        """Without [memory] events (profile_memory off): the allocator's own records when a snapshot came with
        the trace, else meta.json's per-step samples at their steps' ends, else nothing (never a false 0 B)."""
        records = self.ctx.allocator_records
        if records is not None and records.snapshot.has_history and records.base_ns is not None:
            self.memory_source = f"allocator records ({records.snapshot.path.rsplit('/', 1)[-1]})"
            out = []
            for device, s in records.series.items():
                rows = s["rows"][records.entry_ns[s["rows"]] >= 0]
                keep = np.isin(s["rows"], rows)
                out.append(MemoryCurve(device, self._rel(records.entry_ns[rows]), s["allocated"][keep],
                                       s["reserved"][keep]))
            return out
        samples = (self.ctx.meta.get("memory_per_step") if self.ctx.meta else None) or []
        samples = samples if isinstance(samples, list) else []
        steps = self.ctx.steps
        ends = {name: int(end) for name, end in zip(steps.names, steps.cpu_end_ns.tolist())}
        points = sorted((ends[x["step"]], x.get("allocated_bytes"), x.get("reserved_bytes")) for x in samples
                        if isinstance(x, dict) and x.get("step") in ends
                        and isinstance(x.get("allocated_bytes"), int) and isinstance(x.get("reserved_bytes"), int))
        if not points:
            self.memory_source = None
            return []
        self.memory_source = ("meta.json: memory at the end of each step of the capture's unprofiled sample pass, "
                              "drawn at the end of the profiled step of the same name")
        ts, alloc, res = (np.array(col, np.int64) for col in zip(*points))
        return [MemoryCurve(0, self._rel(ts), alloc, res)]

    def allocator_segments(self, t_ns: float | None = None, device: int | None = None) -> dict | None:
        """The allocator's segments and live blocks at `t_ns` (ns since t0), each block with its allocating line;
        None without a snapshot that has history on the trace clock. `t_ns` None: the report's reserved peak when it
        lies on the timeline, else the highest memory_reserved on it (`why`: "peak"), else the timeline's start
        ("start"): a time the user can find on the timeline, never one before it."""
        records = self.ctx.allocator_records
        if records is None or not records.snapshot.has_history or records.base_ns is None:
            return None
        peak = ((self.report_allocator.get("snapshot") or {}).get("peak") or {})
        if device is None:
            device = peak.get("device", next(iter(records.series), 0))
        why = None
        if t_ns is None:
            t_ns, why = self._peak_on_timeline(records, device, peak)
        row = records.entry_at(device, self.t0_ns + t_ns)
        segments = records.segments_at(device, row)
        for seg in segments:
            for b in seg["blocks"]:
                b["line"] = records.site(b["stack"]).label if b["stack"] >= 0 else "(allocated before the history)"
        return {"device": device, "t_ns": float(t_ns), "segments": segments, "entry": row, "why": why}

    def _peak_on_timeline(self, records, device: int, peak: dict) -> tuple[float, str]:
        """(ns since t0, why) of the highest memory_reserved on the timeline [extent]: the report's peak when it lies
        there, else the first entry inside that reaches the highest value, else the timeline's start (the value it
        starts with is the highest: reached before it)."""
        lo, hi = self.extent
        at_us = peak.get("ts_us") if peak.get("device", device) == device else None
        if at_us is not None and lo <= (at_us - self.t0_us) * 1e3 <= hi:
            return (at_us - self.t0_us) * 1e3, "peak"
        at_start = sum(seg["total"] for seg in records.segments_at(device, records.entry_at(device, self.t0_ns + lo)))
        series = records.series.get(device)
        if series is not None and len(series["rows"]):
            ns = records.entry_ns[series["rows"]]
            inside = np.flatnonzero((ns >= 0) & (ns - self.t0_ns >= lo) & (ns - self.t0_ns <= hi))
            if len(inside):
                best = inside[int(np.argmax(series["reserved"][inside]))]  # argmax: the first of equal highs
                if series["reserved"][best] > at_start:
                    return float(ns[best] - self.t0_ns), "peak"
        return float(lo), "start"

    # ------------------------------------------------------------ views

    def full_range(self) -> tuple[float, float]:
        lo, hi = self.extent
        pad = max((hi - lo) * 0.01, 1e3)
        return lo - pad, hi + pad

    def view(self, lo: float, hi: float, bins: int = BINS) -> TimelineView:
        hi = max(hi, lo + 10.0)  # 10 ns: a narrower window has nothing more to show
        lanes = [lane_view(lane, lo, hi, bins) for lane in self.lanes]
        memory = []
        end = self.extent[1]
        for m in self.memory:
            keep = np.union1d(thin_curve(m.ts, m.reserved, lo, hi, bins), thin_curve(m.ts, m.allocated, lo, hi, bins))
            ts, alloc, res = m.ts[keep], m.allocated[keep], m.reserved[keep]
            if len(ts):  # values hold until the next event: carried to the window's edges and past the last one
                before = ts <= lo
                first = int(np.flatnonzero(before)[-1]) if before.any() else 0
                edge_lo, edge_hi = max(lo, float(ts[0])), max(hi if hi < end else end, float(ts[-1]))
                last = int(np.searchsorted(ts, edge_hi, side="right")) - 1
                ts = np.concatenate([[edge_lo], ts[(ts > edge_lo) & (ts < edge_hi)], [edge_hi]])
                inside = (m.ts[keep] > edge_lo) & (m.ts[keep] < edge_hi)
                alloc = np.concatenate([[alloc[first]], alloc[inside], [alloc[last]]])
                res = np.concatenate([[res[first]], res[inside], [res[last]]])
            memory.append(MemoryCurve(m.device, ts, alloc, res))
        steps = self.gpu_lanes[0]
        shown = steps.visible(lo, hi, STEP_LINES_LIMIT)
        edges = distinct(np.concatenate([steps.starts[shown], steps.ends[shown]])) \
            if shown is not None and len(shown) else np.zeros(0)
        return TimelineView(lo, hi, lanes, self._markers(self.sync_rows, lo, hi),
                            self._markers(self.alloc_rows, lo, hi), memory, edges)

    def _markers(self, rows: np.ndarray, lo: float, hi: float) -> Markers:
        s, e = self._rt_starts[rows], self._rt_ends[rows]
        inside = (e >= lo) & (s <= hi)
        rows, s, e = rows[inside], s[inside], e[inside]
        if len(rows) > MARKER_LIMIT:
            keep = np.sort(np.argsort(-(e - s), kind="stable")[:MARKER_LIMIT])
            rows, s, e = rows[keep], s[keep], e[keep]
        return Markers(s, e, rows)

    # ------------------------------------------------------------ hover text (HTML-escaped)

    def site(self, runtime_row: int) -> str:
        if runtime_row not in self._sites:
            self._sites[runtime_row] = runtime_site(self.ctx, runtime_row)["label"]
        return self._sites[runtime_row]

    def op(self, runtime_row: int) -> str | None:
        if runtime_row < 0:
            return None
        if runtime_row not in self._ops:
            op = int(self.model.runtime.op[runtime_row])
            top = outermost_op(self.model, op) if op >= 0 else -1
            self._ops[runtime_row] = self.model.names[self.model.ops.name[top]] if top >= 0 else None
        return self._ops[runtime_row]

    def name(self, code: int) -> str:
        name = self.model.names[code]
        return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"

    def hover_key(self, lane: Lane, i: int) -> str:
        """Hover text of interval i of a lane, without its duration (intervals sharing it share one hover
        trace, so each text is sent once)."""
        state, ref = lane.states[lane.state[i]], int(lane.ref[i])
        esc = html.escape
        if lane.kind == "device":
            lines = [f"<b>{esc(lane.label)} {esc(state)}</b>"]
            if ref >= 0:
                op = self.op(ref)
                call = esc(self.model.names[self.model.runtime.name[ref]])
                lines += [f"call {call}" + (f" in {esc(op)}" if op else ""), f"call site {esc(self.site(ref))}"]
            return "<br>".join(lines)
        if lane.kind == "stream":
            launch = int(self.model.gpu.launch[ref])
            lines = [f"<b>{esc(state)}</b> {esc(self.name(int(self.model.gpu.name[ref])))}"]
            if launch >= 0:
                lines.append(f"launched from {esc(self.site(launch))}")
            return "<br>".join(lines)
        if lane.kind == "cpu_op":
            op = self.model.ops
            frame = self.ctx.frames.user_frame_of(int(op.frame[ref])) if len(self.model.frames) else -1
            return "<br>".join([f"<b>{esc(self.name(int(op.name[ref])))}</b> (cpu op)",
                                f"in {esc(self.ctx.frames.name(frame))}" if frame >= 0 else "no Python frame"])
        if lane.kind == "code":
            return f"<b>{esc(self.name(int(self.model.frames.name[ref])))}</b> (your code)"
        if lane.kind == "cpu":
            op = self.op(ref)
            return "<br>".join([f"<b>{esc(self.name(int(self.model.runtime.name[ref])))}</b>",
                                f"op {esc(op)}" if op else "outside any op", f"call site {esc(self.site(ref))}"])
        if lane.kind == "request":
            r = self.requests[ref]
            return (f"<b>request {esc(str(r.get('id')))}</b> {esc(state)}<br>prompt {r.get('prompt_tokens')} tokens, "
                    f"{r.get('output_tokens')} output tokens, batch row {r.get('row')}<br>queued "
                    f"{fmt_us(r['admitted_us'] - r['arrived_us'])}, TTFT {fmt_us(r.get('ttft_us'))}, latency "
                    f"{fmt_us(r.get('latency_us'))} (profiled)")
        step = self.steps[ref]
        causes = step.get("idle_by_cause_us") or {}
        idle = ", ".join(f"{c} {fmt_us(v)}" for c, v in causes.items() if v)
        return (f"<b>{esc(step['step'])}</b><br>GPU busy {fmt_us(step.get('busy_us'))}"
                f" ({fmt_pct(step.get('gpu_utilization'))})" + (f"<br>idle: {idle}" if idle else ""))

    def reserves(self, rows: np.ndarray) -> np.ndarray:
        """Per runtime row: a call that reserves device memory (cudaMalloc, cuMemMap, ...), not one that releases it."""
        names = self.model.names
        return np.array([names[c] in apis.ALLOC_RESERVE for c in self.model.runtime.name[rows]], bool)

    def describe_call(self, row: int) -> str:
        """Hover text for a runtime call marker (host sync, cudaMalloc/cudaFree)."""
        rt, esc = self.model.runtime, html.escape
        op = self.op(row)
        lines = [f"<b>{esc(self.name(int(rt.name[row])))}</b> {fmt_us((rt.end_ns[row] - rt.start_ns[row]) / 1e3)}",
                 f"op {esc(op)}" if op else "outside any op", f"call site {esc(self.site(row))}"]
        records = self.ctx.allocator_records
        record = records.record_of_call(row) if records is not None else None
        if record:  # the allocator's own record of this cudaMalloc/cudaFree
            lines.append(f"{fmt_bytes(record['segment_bytes'])} segment, allocator records: "
                         f"{esc(record['allocating_line'] or 'no stack')}")
        return "<br>".join(lines)
