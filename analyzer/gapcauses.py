"""Why the GPU sat idle: each idle interval's cause, judged from what the CPU was doing when the GPU ran dry.

- sync: a blocking call (stream/device/event synchronize, synchronous or pageable copy) was waiting when the GPU
  finished its work, i.e. it drained the queue
- allocator: cudaMalloc / cudaFree / cuMem* ran during the gap
- cpu_launch: the launch of the next GPU work was still in progress when the GPU went idle (eager overhead:
  Python, dispatcher, launch call)
- other: the next work was already queued (GPU-side latency, e.g. between a CUDA graph's kernels), or nothing
  launched it that the trace shows
- event_loop_idle: the thread that launched the next work spent most of the gap parked in an event loop's
  selector (asyncio sleeping or waiting for I/O: no Python ready to run)
- thread_hop: that thread spent most of the gap waiting for another thread to hand it work (a worker pool's queue,
  a lock, a future), or the work moved to another thread across the gap

The last two need Python frames (with_stack) and win over sync and cpu_launch when they fill most of the gap: the
blocking call ended early in it, and what kept the GPU idle afterwards was the parked thread.
"""
from __future__ import annotations

import numpy as np

from analyzer import apis, waits
from analyzer.timeline import DeviceTimeline
from analyzer.trace import TraceModel

CAUSES = ("cpu_launch", "sync", "allocator", "other", "event_loop_idle", "thread_hop")
CPU_LAUNCH, SYNC, ALLOCATOR, OTHER, EVENT_LOOP_IDLE, THREAD_HOP = range(6)
SYNC_TOLERANCE_NS = 2_000  # CPU and GPU clocks agree to about a microsecond


def _covering(starts: np.ndarray, ends: np.ndarray, rows: np.ndarray, t_lo: np.ndarray, t_hi: np.ndarray):
    """For each query [t_lo, t_hi]: the row among `rows` (sorted by start) with start < t_hi and the latest end,
    if that end >= t_lo; else -1."""
    if len(rows) == 0:
        return np.full(len(t_lo), -1, np.int64)
    order = rows[np.argsort(starts[rows], kind="stable")]
    s, e = starts[order], ends[order]
    best = np.maximum.accumulate(e)
    arg = np.zeros(len(e), np.int64)
    running = 0
    for i in range(1, len(e)):  # index of the running maximum
        if e[i] >= e[running]:
            running = i
        arg[i] = running
    idx = np.searchsorted(s, t_hi, side="left") - 1
    ok = (idx >= 0) & (best[np.clip(idx, 0, None)] >= t_lo)
    return np.where(ok, order[arg[np.clip(idx, 0, None)]], -1)


def classify_gaps(model: TraceModel, device_timeline: DeviceTimeline):
    """(cause code, responsible runtime row) for every idle interval of one device."""
    rt = model.runtime
    a, b = device_timeline.idle_starts, device_timeline.idle_ends
    classes = apis.runtime_classes(model)
    blocking = np.zeros(len(rt), bool)
    blocking[(classes == apis.IS_SYNC) | (classes == apis.IS_SYNC_COPY)] = True
    blocking[apis.blocking_copy_rows(model)] = True
    sync_row = _covering(rt.start_ns, rt.end_ns, np.flatnonzero(blocking), a - SYNC_TOLERANCE_NS, a)
    alloc_row = _covering(rt.start_ns, rt.end_ns, np.flatnonzero(classes == apis.IS_ALLOC), a + 1, b)
    launch_row = model.gpu.launch[device_timeline.idle_next_gpu] if len(a) else np.zeros(0, np.int64)
    safe = np.clip(launch_row, 0, None)
    graph_codes = [c for c, n in enumerate(model.names) if n in apis.GRAPH_LAUNCH]
    if len(rt):
        is_graph = np.isin(rt.name[safe], graph_codes)
        # A kernel launch still in progress when the GPU ran dry is launch overhead. A graph launch returns while
        # its kernels run, so gaps between a graph's own kernels are GPU-side unless the launch began after the gap.
        late_launch = (launch_row >= 0) & np.where(is_graph, rt.start_ns[safe] >= a - SYNC_TOLERANCE_NS,
                                                   rt.end_ns[safe] > a)
    else:  # GPU rows without any runtime call (kernels only): nothing on the CPU launched them
        late_launch = np.zeros(len(a), bool)
    cause = np.full(len(a), OTHER, np.int8)
    cause[late_launch] = CPU_LAUNCH
    cause[alloc_row >= 0] = ALLOCATOR
    cause[sync_row >= 0] = SYNC
    responsible = np.where(sync_row >= 0, sync_row, np.where(alloc_row >= 0, alloc_row, launch_row))
    loop_idle, hop = _parked(model, a, b, launch_row, cause)
    cause[loop_idle] = EVENT_LOOP_IDLE
    cause[hop] = THREAD_HOP
    responsible[loop_idle | hop] = launch_row[loop_idle | hop]
    return cause, responsible


def _parked(model: TraceModel, a: np.ndarray, b: np.ndarray, launch_row: np.ndarray, cause: np.ndarray):
    """Masks of the gaps whose next launching thread sat in an event-loop wait / a thread hand-off wait for at
    least half the gap, or (hop) that opened a busy period on another thread than the previous one did."""
    rt = model.runtime
    none = np.zeros(len(a), bool)
    if not len(a) or not len(rt):
        return none, none
    known = launch_row >= 0
    safe = np.clip(launch_row, 0, None)
    pid, tid = rt.pid[safe], rt.tid[safe]
    half = (b - a + 1) // 2
    loop_ns = waits.covered_ns(model, waits.matching_frames(model, waits.EVENT_LOOP_WAIT), pid, tid, a, b)
    handoff_ns = waits.covered_ns(model, waits.matching_frames(model, waits.HANDOFF_WAIT), pid, tid, a, b)
    eligible = known & (cause != ALLOCATOR)
    loop_idle = eligible & (loop_ns >= half) & (loop_ns >= handoff_ns)
    moved = np.zeros(len(a), bool)
    prev_known = known[:-1] & known[1:]
    moved[1:] = prev_known & ((pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1]))
    moved &= np.isin(cause, (CPU_LAUNCH, OTHER))
    hop = eligible & ~loop_idle & ((handoff_ns >= half) | moved)
    return loop_idle, hop


