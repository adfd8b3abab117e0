"""GPU busy time as the union of activity over all streams of a device, and the idle intervals between.

GPU activity is kernels, memcpys and memsets; `cuda_sync` rows are waits, not work, and are left out. Idle time
is measured from the first to the last activity of each device, minus the union of activity, minus Kineto
`overhead` intervals (time the profiler itself spent, not the workload).
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
    idle_next_gpu: np.ndarray  # gpu row that starts right after each idle interval
    idle_prev_gpu: np.ndarray  # gpu row whose end opened the gap (the last to finish before it)
    overhead_ns: int

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


def build_timeline(model: TraceModel) -> GpuTimeline:
    gpu = model.gpu
    active = activity_mask(model)
    overhead_s, overhead_e = merge_intervals(model.overhead.start_ns, model.overhead.end_ns)
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
        idle_s, idle_e = subtract_intervals(gap_s, gap_e, overhead_s, overhead_e)
        if len(idle_s) != len(gap_s):  # overhead split or removed gaps: map each piece to its gap's rows
            owner = np.searchsorted(gap_s, idle_s, side="right") - 1
            next_rows, prev_rows = next_rows[owner], prev_rows[owner]
        overhead_in_window = overlap_ns(overhead_s, overhead_e, int(busy_s[0]), int(busy_e[-1]))
        devices.append(DeviceTimeline(int(device), int(busy_s[0]), int(busy_e[-1]), busy_s, busy_e,
                                      idle_s, idle_e, np.asarray(next_rows, np.int64), np.asarray(prev_rows, np.int64),
                                      overhead_in_window))
    return GpuTimeline(tuple(devices))
