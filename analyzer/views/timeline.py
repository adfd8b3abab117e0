"""GPU busy time as the union of activity over all streams of a device, and the idle intervals between.

GPU activity is kernels, memcpys and memsets; `cuda_sync` rows are waits, not work, and are left out. A device's
window is the window the user profiled: from the first to the last event its host recorded (the ops, Python frames
and runtime calls of the processes that launched work onto it, within the profiler's own span), widened to its first
and last activity where those lie outside. Idle time is that window minus the union of activity, minus Kineto
`overhead` intervals (time the profiler itself spent, not the workload). Two idle intervals lie at the window's
edges: the head, before the first activity (until the call that launched it returned; from then on the work was
queued), and the tail, after the last activity (no work ends it: `idle_next_gpu` -1, carved on the thread that
launched the last work).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.arrays import distinct
from analyzer.trace import GpuKind, TraceModel


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted, disjoint (starts, ends)."""
    if len(starts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running_end = np.maximum.accumulate(e)
    new_group = np.empty(len(s), dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > running_end[:-1]
    group_starts = np.flatnonzero(new_group)
    group_ends = np.append(group_starts[1:], len(s)) - 1
    return s[group_starts], running_end[group_ends]


def intersect_intervals(a_starts: np.ndarray, a_ends: np.ndarray, b_starts: np.ndarray,
                        b_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The time two sets of sorted, disjoint [start, end) intervals share, as sorted, disjoint (starts, ends)."""
    if not len(a_starts) or not len(b_starts):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    points = np.concatenate([a_starts, a_ends, b_starts, b_ends])
    n_a, n_b = len(a_starts), len(b_starts)
    in_a = np.concatenate([np.ones(n_a, np.int64), -np.ones(n_a, np.int64), np.zeros(2 * n_b, np.int64)])
    in_b = np.concatenate([np.zeros(2 * n_a, np.int64), np.ones(n_b, np.int64), -np.ones(n_b, np.int64)])
    order = np.argsort(points, kind="stable")
    points, both = points[order], (np.cumsum(in_a[order]) > 0) & (np.cumsum(in_b[order]) > 0)
    # segment k runs from points[k] to points[k + 1]: shared where both sets cover it after point k
    seg = np.flatnonzero(both[:-1] & (points[1:] > points[:-1]))
    return merge_intervals(points[seg], points[seg + 1])


def subtract_intervals(starts, ends, cut_starts, cut_ends) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals minus another disjoint sorted set (both as numpy arrays)."""
    if len(cut_starts) == 0 or len(starts) == 0:
        return starts, ends
    out_s, out_e = [], []
    j = 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        while j < len(cut_ends) and cut_ends[j] <= s:
            j += 1
        k, cur = j, s
        while k < len(cut_starts) and cut_starts[k] < e:
            if cut_starts[k] > cur:
                out_s.append(cur)
                out_e.append(int(cut_starts[k]))
            cur = max(cur, int(cut_ends[k]))
            k += 1
        if cur < e:
            out_s.append(cur)
            out_e.append(e)
    return np.asarray(out_s, np.int64), np.asarray(out_e, np.int64)


def overlap_ns(starts, ends, lo: int, hi: int) -> int:
    """Total overlap of disjoint sorted intervals with [lo, hi)."""
    if len(starts) == 0 or hi <= lo:
        return 0
    i = int(np.searchsorted(ends, lo, side="right"))
    j = int(np.searchsorted(starts, hi, side="left"))
    if j <= i:
        return 0
    s = np.clip(starts[i:j], lo, hi)
    e = np.clip(ends[i:j], lo, hi)
    return int((e - s).sum())


def overlaps_ns(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """overlap_ns for many windows [lo, hi) at once: covered length before hi minus covered length before lo."""
    if len(starts) == 0:
        return np.zeros(len(lo), dtype=np.int64)
    covered = np.concatenate([[0], np.cumsum(ends - starts)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        last = np.searchsorted(starts, t, side="right") - 1  # the last interval starting at or before t
        at = np.maximum(last, 0)
        return np.where(last >= 0, covered[at] + np.minimum(ends[at], t) - starts[at], 0)

    return np.where(hi > lo, covered_before(hi) - covered_before(lo), 0)


@dataclasses.dataclass(frozen=True)
class DeviceTimeline:
    device: int
    window_start_ns: int
    window_end_ns: int
    busy_starts: np.ndarray
    busy_ends: np.ndarray
    idle_starts: np.ndarray  # gaps between busy intervals, overhead removed
    idle_ends: np.ndarray
    idle_next_gpu: np.ndarray  # gpu row that starts right after each idle interval, -1 for the tail
    idle_prev_gpu: np.ndarray  # gpu row whose end opened the gap (the last to finish before it), -1 for the head
    overhead_ns: int
    head_ns: int = 0  # idle before the first activity (the host's time before any GPU work), overhead removed
    tail_ns: int = 0  # idle after the last activity

    @property
    def window_ns(self) -> int:
        return self.window_end_ns - self.window_start_ns

    @property
    def busy_ns(self) -> int:
        return int((self.busy_ends - self.busy_starts).sum())

    @property
    def idle_ns(self) -> int:
        return int((self.idle_ends - self.idle_starts).sum())


@dataclasses.dataclass(frozen=True)
class GpuTimeline:
    devices: tuple[DeviceTimeline, ...]

    @property
    def window_ns(self) -> int:
        return sum(d.window_ns for d in self.devices)

    @property
    def busy_ns(self) -> int:
        return sum(d.busy_ns for d in self.devices)

    @property
    def idle_ns(self) -> int:
        return sum(d.idle_ns for d in self.devices)


def activity_mask(model: TraceModel) -> np.ndarray:
    kind = model.gpu.kind
    return (kind != GpuKind.SYNC) & (model.gpu.end_ns >= model.gpu.start_ns)


def host_windows(model: TraceModel) -> dict[int, tuple[int, int]]:
    """Per pid: (first start, last end) of its recorded ops, Python frames and runtime calls, clipped to the
    profiler's own span where the trace has one (an annotation left open can outlast the recording)."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for table in (model.ops, model.frames, model.runtime):
        if not len(table):
            continue
        pids = distinct(table.pid)
        if len(pids) == 1:
            groups = [(int(pids[0]), table.start_ns, table.end_ns)]
        else:
            groups = [(int(p), table.start_ns[table.pid == p], table.end_ns[table.pid == p]) for p in pids.tolist()]
        for pid, start, end in groups:
            lo[pid] = min(lo.get(pid, int(start.min())), int(start.min()))
            hi[pid] = max(hi.get(pid, int(end.max())), int(end.max()))
    span = model.profiler_span_ns
    if span:
        lo = {p: max(v, span[0]) for p, v in lo.items()}
        hi = {p: min(v, span[1]) for p, v in hi.items()}
    return {p: (lo[p], hi[p]) for p in lo if hi[p] > lo[p]}


# A GPU with nothing running starts queued work microseconds after the launch call returns: where a device's first
# work in the window (nothing recorded running before it) starts this long after, its clock runs behind the host's,
# or the trace misses what it ran first.
CLOCK_LAG_NS = 1_000_000


def first_start_delay_ns(model: TraceModel, rows: np.ndarray) -> int | None:
    """The delay from the launch call's return to the start of the first of these GPU rows (None: not linked)."""
    if not len(rows):
        return None
    first = rows[np.argmin(model.gpu.start_ns[rows])]
    launch = int(model.gpu.launch[first])
    return int(model.gpu.start_ns[first] - model.runtime.end_ns[launch]) if launch >= 0 else None


def _edges(model: TraceModel, rows: np.ndarray, hosts: dict[int, tuple[int, int]], first: int, last: int):
    """The head's and the tail's (start, end, next row, prev row) for a device whose activity is `rows` and spans
    [first, last): the head from its hosts' first event to the first activity (only up to the return of the call
    that launched it, then a second piece: from there the work was queued), the tail from the last activity to
    its hosts' last event. Only where the activity at that edge was launched by a call in the trace, and the device's
    clock keeps up with the host's (first_start_delay_ns under CLOCK_LAG_NS)."""
    gpu, rt = model.gpu, model.runtime
    delay = first_start_delay_ns(model, rows)
    if delay is None or delay >= CLOCK_LAG_NS:
        return []
    launched = gpu.launch[rows]
    pids = distinct(rt.pid[launched[launched >= 0]]) if len(rt) else np.zeros(0, np.int64)
    mine = [hosts[p] for p in pids.tolist() if p in hosts]
    if not mine:
        return []
    lo, hi = min(w[0] for w in mine), max(w[1] for w in mine)
    out = []
    head_row = rows[np.argmin(gpu.start_ns[rows])]
    launch = int(gpu.launch[head_row])
    if launch >= 0 and lo < first:
        returned = int(rt.end_ns[launch])
        if lo < returned < first:
            out.append((lo, returned, head_row, -1))
            out.append((returned, first, head_row, -1))
        else:
            out.append((lo, first, head_row, -1))
    tail_row = rows[np.argmax(gpu.end_ns[rows])]
    if gpu.launch[tail_row] >= 0 and hi > last:
        out.append((last, hi, -1, tail_row))
    return out


def build_timeline(model: TraceModel) -> GpuTimeline:
    gpu = model.gpu
    active = activity_mask(model)
    overhead_s, overhead_e = merge_intervals(model.overhead.start_ns, model.overhead.end_ns)
    hosts = host_windows(model) if active.any() else {}
    devices = []
    for device in distinct(gpu.device[active]).tolist():
        rows = np.flatnonzero(active & (gpu.device == device))
        starts, ends = gpu.start_ns[rows], gpu.end_ns[rows]
        busy_s, busy_e = merge_intervals(starts, ends)
        gap_s, gap_e = busy_e[:-1], busy_s[1:]
        # the gpu row that ends each gap: the earliest-starting activity at the gap's end
        by_start = rows[np.argsort(starts, kind="stable")]
        sorted_starts = gpu.start_ns[by_start]
        next_rows = by_start[np.searchsorted(sorted_starts, gap_e, side="left")] if len(gap_e) else np.empty(0, np.int64)
        by_end = rows[np.argsort(ends, kind="stable")]
        prev_rows = by_end[np.searchsorted(gpu.end_ns[by_end], gap_s, side="right") - 1] if len(gap_s) else \
            np.empty(0, np.int64)
        edges = _edges(model, rows, hosts, int(busy_s[0]), int(busy_e[-1]))
        head = [e for e in edges if e[3] < 0]
        tail = [e for e in edges if e[2] < 0]
        def with_edges(k: int, values: np.ndarray) -> np.ndarray:  # (int64 throughout: epoch ns exceed a double's)
            return np.concatenate([np.array([e[k] for e in head], np.int64), np.asarray(values, np.int64),
                                   np.array([e[k] for e in tail], np.int64)])

        gap_s, gap_e, next_rows, prev_rows = (with_edges(k, v) for k, v in enumerate((gap_s, gap_e, next_rows,
                                                                                     prev_rows)))
        idle_s, idle_e = subtract_intervals(gap_s, gap_e, overhead_s, overhead_e)
        if len(idle_s) != len(gap_s) or (idle_s != gap_s).any():  # overhead split or removed gaps: map each piece
            owner = np.searchsorted(gap_s, idle_s, side="right") - 1
            next_rows, prev_rows = next_rows[owner], prev_rows[owner]
        lo, hi = int(gap_s[0]) if head else int(busy_s[0]), int(gap_e[-1]) if tail else int(busy_e[-1])
        overhead_in_window = overlap_ns(overhead_s, overhead_e, lo, hi)
        head_ns = int((np.minimum(idle_e, busy_s[0]) - idle_s)[idle_s < busy_s[0]].sum())
        tail_ns = int((idle_e - np.maximum(idle_s, busy_e[-1]))[idle_e > busy_e[-1]].sum())
        devices.append(DeviceTimeline(int(device), lo, hi, busy_s, busy_e, idle_s, idle_e,
                                      np.asarray(next_rows, np.int64), np.asarray(prev_rows, np.int64),
                                      overhead_in_window, head_ns, tail_ns))
    return GpuTimeline(tuple(devices))
