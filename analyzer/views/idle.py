"""Why the GPU sat idle: every idle interval cut into pieces, each with one cause.

A gap ends when the GPU gets its next work. If that work had already been launched when the gap began, nothing on
the CPU kept the GPU waiting:
- queued: GPU-side latency between queued work (between a replayed graph's kernels, waits on other streams, work
  launched before the profiling window began).
Otherwise the gap is cut by what the thread that launched the next work was doing during it; the first matching
layer wins, time that none covers is `cpu_launch`:
- profiler: the profiler's own code, or this tool's capture code (instrumentation: absent from unprofiled runs);
- setup: inside a library op's set-up for an input shape it had not run yet, where new shapes keep arriving (or
  nothing shows they stop: analyzer.views.setup); a set-up whose shape recurs at the usual cost is warmup (one-time).
  Everything inside such a call is its set-up, an algorithm search's synchronizing calls too (but one-time calls
  inside it, such as a kernel's first launch loading its module, which are warmup);
- sync: a blocking call (stream/device/event synchronize, a synchronous or pageable copy);
- allocator: cudaMalloc / cudaFree / cuMem* / pinned host allocation (cudaFree also synchronizes);
- warmup: one-time costs (analyzer.views.onetime) and CUDA-graph capture;
- input_wait: inside a DataLoader's `__next__`: waiting for worker processes to deliver the next batch, or
  loading it on this thread (num_workers=0);
- event_loop_idle: parked in an event loop's selector (asyncio sleeping or waiting for I/O);
- thread_hop: waiting for another thread to hand it work (a worker pool's queue, a lock, a future);
- host_compute: an op that made no CUDA call at all and ran at least 50 µs: math on host tensors, not launch
  overhead (CUDA graphs cannot take it out);
- cpu_launch: the CPU running Python, the dispatcher and the launch call itself (eager overhead) - or
  thread_hop, when the work came from another thread than the work before the gap.
- unknown: the next work's launch call is not in the trace, though it was made inside the window (work launched
  before the window began, by correlation id, is `queued`).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.views import waits
from analyzer.views.graphs import GraphUse
from analyzer.views.instrumentation import PROFILER_FRAME
from analyzer.views.onetime import FIRST_TIME_FRAME
from analyzer.views.replay import NEVER
from analyzer.views.timeline import GpuTimeline
from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys

CAUSES = ("cpu_launch", "sync", "allocator", "warmup", "queued", "event_loop_idle", "thread_hop", "profiler",
          "unknown", "input_wait", "host_compute", "setup", "host_work")
CPU_LAUNCH, SYNC, ALLOCATOR, WARMUP, QUEUED, EVENT_LOOP_IDLE, THREAD_HOP, PROFILER, UNKNOWN, INPUT_WAIT, \
    HOST_COMPUTE, SETUP, HOST_WORK = range(13)
PARKED_MIN_NS = 50_000
# torch's DataLoader: the record_function its iterators open around each batch, and the Python frame
INPUT_WAIT_OP = re.compile(r"^enumerate\(DataLoader\)#")
INPUT_WAIT_FRAME = re.compile(r"(?:^|/)torch/utils/data/dataloader\.py\(\d+\): __next__$")


@dataclasses.dataclass(frozen=True)
class Gaps:
    """Every idle interval of every device (overhead removed), in device order."""
    start_ns: np.ndarray
    end_ns: np.ndarray
    device: np.ndarray
    next_gpu: np.ndarray  # the GPU row that ends the gap, -1 for the window's tail (no work ends it)
    launch: np.ndarray  # the runtime row that launched it, -1 unknown (and for the tail)
    thread_row: np.ndarray  # the runtime row on whose thread the gap is carved: its launch; the tail's, the last work's
    prev_gpu: np.ndarray  # the GPU row whose end opened the gap, -1 for the window's head (no work before it)

    def __len__(self) -> int:
        return len(self.start_ns)

    @property
    def head(self) -> np.ndarray:
        """Whether each gap is (part of) the window's head: from the host's first event to the first GPU work."""
        return self.prev_gpu < 0

    @property
    def tail(self) -> np.ndarray:
        """Whether each gap is the window's tail: after the last GPU work, until the host's last recorded event."""
        return self.next_gpu < 0


@dataclasses.dataclass(frozen=True)
class IdlePieces:
    """Gaps cut by cause; together they cover every idle nanosecond exactly once. Sorted by gap, then time."""
    start_ns: np.ndarray
    end_ns: np.ndarray
    cause: np.ndarray  # int8 code into CAUSES
    row: np.ndarray  # the runtime row responsible (the blocking call, the allocation, the next launch), -1 none
    frame: np.ndarray  # the Python frame responsible (a wait, a profiler frame, an import), -1 none
    op: np.ndarray  # the op responsible (a first call that paid for set-up), -1 none
    gap: np.ndarray  # index into Gaps

    def __len__(self) -> int:
        return len(self.start_ns)

    @property
    def duration_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    def total_ns(self, cause: int) -> int:
        sel = self.cause == cause
        return int((self.end_ns[sel] - self.start_ns[sel]).sum())


@dataclasses.dataclass(frozen=True)
class _Layer:
    cause: int
    key: np.ndarray  # thread key per interval
    start: np.ndarray
    end: np.ndarray
    row: np.ndarray
    frame: np.ndarray
    op: np.ndarray


def collect_gaps(model: TraceModel, timeline: GpuTimeline) -> Gaps:
    devices = timeline.devices
    if not devices:
        empty = np.zeros(0, np.int64)
        return Gaps(empty, empty, empty, empty, empty, empty, empty)
    start = np.concatenate([d.idle_starts for d in devices])
    next_gpu = np.concatenate([d.idle_next_gpu for d in devices]).astype(np.int64)
    prev_gpu = np.concatenate([d.idle_prev_gpu for d in devices]).astype(np.int64)
    launch_of = model.gpu.launch
    launch = np.where(next_gpu >= 0, launch_of[np.maximum(next_gpu, 0)], -1) if len(next_gpu) else \
        np.zeros(0, np.int64)
    thread_row = np.where(next_gpu >= 0, launch, launch_of[np.maximum(prev_gpu, 0)]) if len(next_gpu) else launch
    return Gaps(start, np.concatenate([d.idle_ends for d in devices]),
                np.concatenate([np.full(len(d.idle_starts), d.device) for d in devices]), next_gpu, launch,
                thread_row, prev_gpu)


@dataclasses.dataclass(frozen=True)
class OpRoles:
    """Op rows that cut idle pieces (the analysis context computes each once)."""
    warmup: np.ndarray  # first calls that paid for set-up, compiles seen as ops
    host_compute: np.ndarray  # outermost ops that made no CUDA call and ran long enough to be host math
    setup_once: np.ndarray  # library ops' set-up for a new shape that recurs at the usual cost (analyzer.views.setup)
    setup: np.ndarray  # ... for shapes that keep coming, or with nothing to show they stop


@dataclasses.dataclass(frozen=True)
class CallRoles:
    """What each runtime row is, as the layers need it (the analysis context computes each once)."""
    classes: np.ndarray  # analyzer.views.apis class codes
    blocking: np.ndarray  # bool: blocks the CPU until GPU work finishes
    one_time: np.ndarray  # analyzer.views.onetime label codes (0: steady state)
    instrumentation: np.ndarray  # bool: the measurement's own call
    in_setup: np.ndarray  # bool: made inside a library op's set-up for a new shape (analyzer.views.setup)


def classify_idle(model: TraceModel, timeline: GpuTimeline, roles: CallRoles, op_roles: OpRoles,
                  graphs: GraphUse) -> tuple[Gaps, IdlePieces]:
    gaps = collect_gaps(model, timeline)
    rt = model.runtime
    a, b, launch = gaps.start_ns, gaps.end_ns, gaps.launch
    known = launch >= 0
    safe = np.maximum(launch, 0)
    queued = np.zeros(len(gaps), bool)
    if len(rt) and known.any():
        graph_codes = [c for c, n in enumerate(model.names) if n in apis.GRAPH_LAUNCH]
        is_graph = np.isin(rt.name[safe], graph_codes)
        later_node = is_graph & (rt.gpu[safe] != gaps.next_gpu)  # not the first kernel the graph launch ran
        queued = known & (later_node | (rt.end_ns[safe] <= a))
    # work launched before the profiling window began (its correlation id is below every recorded call's) was
    # queued before any gap in the window
    calls = rt.correlation[rt.correlation >= 0]
    tail = gaps.tail
    corr = np.where(tail, -1, model.gpu.correlation[np.maximum(gaps.next_gpu, 0)]) if len(gaps) else \
        np.zeros(0, np.int64)
    queued |= ~known & (corr >= 0) & (corr < (calls.min() if len(calls) else 0))
    # the tail: the host's time after the last work, carved on the thread that launched it (the rest is its own
    # time, as between two launches)
    remainder = np.where(known | tail, CPU_LAUNCH, UNKNOWN).astype(np.int8)
    remainder[queued] = QUEUED
    remainder[known & ~queued & _moved(model, timeline, launch)] = THREAD_HOP
    carved = (known & ~queued) | (tail & (gaps.thread_row >= 0))
    fr = model.frames
    # one call, so that equal threads get equal keys across the tables
    ops = model.ops
    input_ops = input_wait_ops(model)
    layer_ops = np.unique(np.concatenate([op_roles.warmup, op_roles.host_compute, input_ops, op_roles.setup_once,
                                          op_roles.setup]).astype(np.int64))
    rt_key, fr_key, some_op_key, capture_key = thread_keys(
        [rt.pid, fr.pid, ops.pid[layer_ops], graphs.capture_pid], [rt.tid, fr.tid, ops.tid[layer_ops],
                                                                   graphs.capture_tid])
    op_key = np.full(len(ops), -1, np.int64)  # only the ops that cut pieces need a key
    op_key[layer_ops] = some_op_key
    gap_key = np.where(carved, rt_key[np.maximum(gaps.thread_row, 0)] if len(rt) else -1, -1)
    layers = _layers(model, roles, op_roles, input_ops, graphs, rt_key, fr_key, op_key, capture_key)
    pieces = _carve(a, b, gap_key, remainder, launch, layers)
    return gaps, _tail_context(model, gaps, _no_drain_at_head(gaps, pieces))


def _no_drain_at_head(gaps: Gaps, idle: IdlePieces) -> IdlePieces:
    """Before the window's first GPU work nothing ran on the GPU for a blocking call to wait for: such a call is the
    host's own time there (cpu_launch, named by the launch that ends the head), not a drain."""
    moved = gaps.head[idle.gap] & (idle.cause == SYNC) if len(idle) else np.zeros(0, bool)
    if not moved.any():
        return idle
    cause, row = idle.cause.copy(), idle.row.copy()
    cause[moved] = CPU_LAUNCH
    row[moved] = gaps.launch[idle.gap[moved]]
    return dataclasses.replace(idle, cause=cause, row=row)


def _tail_context(model: TraceModel, gaps: Gaps, idle: IdlePieces) -> IdlePieces:
    """The window's tail pieces that no layer claimed have no launch to name them: give each the innermost Python
    frame and op running at its middle on the thread of the last work's launch (the code the host ran after it)."""
    sel = np.flatnonzero(gaps.tail[idle.gap] & (idle.row < 0) & (idle.frame < 0) & (idle.op < 0)) if len(idle) else ()
    if not len(sel):
        return idle
    rt, frame, op = model.runtime, idle.frame.copy(), idle.op.copy()
    for i in sel.tolist():
        r = int(gaps.thread_row[idle.gap[i]])
        if r < 0:
            continue
        mid = (int(idle.start_ns[i]) + int(idle.end_ns[i])) // 2
        for table, out in ((model.frames, frame), (model.ops, op)):
            hold = np.flatnonzero((table.pid == rt.pid[r]) & (table.tid == rt.tid[r]) & (table.start_ns <= mid)
                                  & (table.end_ns > mid)) if len(table) else ()
            if table is model.ops and len(hold):
                hold = hold[~table.is_annotation[hold]]
            if len(hold):
                out[i] = hold[np.argmax(table.start_ns[hold])]
    return dataclasses.replace(idle, frame=frame, op=op)


def _moved(model: TraceModel, timeline: GpuTimeline, launch: np.ndarray) -> np.ndarray:
    """Whether the work after each gap was launched from another thread than the work before it."""
    rt = model.runtime
    if not len(launch) or not len(rt):
        return np.zeros(len(launch), bool)
    prev = np.concatenate([d.idle_prev_gpu for d in timeline.devices]).astype(np.int64) if timeline.devices else \
        np.zeros(0, np.int64)
    prev_launch = np.where(prev >= 0, model.gpu.launch[np.maximum(prev, 0)], -1) if len(prev) else \
        np.zeros(0, np.int64)  # (the head: no work before it)
    both = (launch >= 0) & (prev_launch >= 0)
    p, q = np.maximum(launch, 0), np.maximum(prev_launch, 0)
    return both & ((rt.pid[p] != rt.pid[q]) | (rt.tid[p] != rt.tid[q]))


def _layers(model: TraceModel, roles: CallRoles, op_roles: OpRoles, input_ops: np.ndarray, graphs: GraphUse,
            rt_key: np.ndarray, fr_key: np.ndarray, op_key: np.ndarray, capture_key: np.ndarray) -> list[_Layer]:
    rt, fr, ops = model.runtime, model.frames, model.ops
    classes, one_time, tool = roles.classes, roles.one_time, roles.instrumentation

    def none(n: int) -> np.ndarray:
        return np.full(n, -1, np.int64)

    def calls(cause: int, mask: np.ndarray) -> _Layer:
        rows = np.flatnonzero(mask)
        return _Layer(cause, rt_key[rows], rt.start_ns[rows], rt.end_ns[rows], rows, none(len(rows)), none(len(rows)))

    def frame_layer(cause: int, rows: np.ndarray) -> _Layer:
        return _Layer(cause, fr_key[rows], fr.start_ns[rows], fr.end_ns[rows], none(len(rows)), rows, none(len(rows)))

    def op_layer(cause: int, rows: np.ndarray) -> _Layer:
        rows = np.asarray(rows, np.int64)
        return _Layer(cause, op_key[rows], ops.start_ns[rows], ops.end_ns[rows], none(len(rows)), none(len(rows)), rows)

    memory = (classes == apis.IS_ALLOC) | (classes == apis.IS_HOST_ALLOC)
    blocking = roles.blocking & ~memory
    layers = [
        frame_layer(PROFILER, waits.matching_frames(model, PROFILER_FRAME)),
        calls(PROFILER, tool),
        calls(SYNC, blocking & ~tool),
        # a graph capture's own allocations (torch.cuda.graph empties the cache, its private pool) are the capture's
        calls(ALLOCATOR, memory & (one_time == 0) & ~tool & ~graphs.in_capture & ~roles.in_setup),
        calls(WARMUP, (one_time > 0) & ~tool),
        # a set-up call's whole span (the syncs of an algorithm search are not `blocking`; the calls inside a one-time
        # set-up are labelled one-time), but for one-time calls inside it (a kernel's module loaded at its launch)
        op_layer(WARMUP, op_roles.setup_once),
        op_layer(SETUP, op_roles.setup),
        _Layer(WARMUP, capture_key, graphs.capture_starts_ns, graphs.capture_ends_ns, none(graphs.captures),
               none(graphs.captures), none(graphs.captures)),
        frame_layer(WARMUP, waits.matching_frames(model, FIRST_TIME_FRAME)),
        op_layer(WARMUP, op_roles.warmup),
        op_layer(INPUT_WAIT, input_ops),
        frame_layer(INPUT_WAIT, waits.matching_frames(model, INPUT_WAIT_FRAME)),
        frame_layer(EVENT_LOOP_IDLE, _parked(model, waits.EVENT_LOOP_WAIT)),
        frame_layer(THREAD_HOP, _parked(model, waits.HANDOFF_WAIT)),
        op_layer(HOST_COMPUTE, op_roles.host_compute),
    ]
    return [layer for layer in layers if len(layer.start)]


def input_wait_ops(model: TraceModel) -> np.ndarray:
    """Rows of the DataLoader iterators' own annotations (`enumerate(DataLoader)#..._DataLoaderIter.__next__`)."""
    ops = model.ops
    if not len(ops):
        return np.zeros(0, np.int64)
    table = np.zeros(len(model.names), bool)
    for c in waits.present_codes(ops.name, len(model.names)).tolist():
        table[c] = bool(INPUT_WAIT_OP.match(model.names[c]))
    return np.flatnonzero(table[ops.name])


# A call of the multiprocessing iterator no longer than this times its thread's fastest did not wait: the fastest
# is a batch that was already there (the call's own work: taking it off the queue, unpickling its tensors' handles),
# and that work's own spread stays within it.
OWN_SPREAD = 2.0


def worker_input_waits(model: TraceModel) -> np.ndarray:
    """(tid, start_ns, end_ns, ready_ns) of each call for a batch from a DataLoader's worker processes (the
    multiprocessing iterator's `__next__`): the batch arrives when the workers deliver it, however early the thread
    asks. ready_ns is when it arrived, the call's own work after it; NEVER (replay.NEVER) where the call did not
    wait (the batch was already queued, at a time the trace does not show), so that asking earlier gets it earlier.
    With Python stacks, the wait is the time in the call's waiting frames (its queue's poll, a lock, a condition);
    without, a call waited if it took over OWN_SPREAD times its thread's fastest call, that fastest being its own
    work."""
    rows = input_wait_ops(model)
    ops = model.ops
    rows = rows[["_MultiProcessingDataLoaderIter" in model.names[c] for c in ops.name[rows]]] if len(rows) else rows
    if not len(rows):
        return np.zeros((0, 4), np.int64)
    tid, start, end = ops.tid[rows], ops.start_ns[rows], ops.end_ns[rows]
    dur = end - start
    fastest = np.zeros(len(rows), np.int64)
    for t in distinct(tid).tolist():
        fastest[tid == t] = dur[tid == t].min()
    fr = model.frames
    mine, framed = thread_keys([ops.pid[rows], fr.pid], [tid, fr.tid])
    stacked = np.isin(mine, framed)
    waiting = np.union1d(waits.matching_frames(model, waits.EVENT_LOOP_WAIT),
                         waits.matching_frames(model, waits.HANDOFF_WAIT))
    waited_ns = waits.covered_ns(model, waiting, ops.pid[rows], tid, start, end)
    own = np.where(stacked, dur - waited_ns, np.minimum(fastest, dur))
    waited = np.where(stacked, waited_ns >= PARKED_MIN_NS, dur > OWN_SPREAD * fastest)
    ready = np.where(waited, end - own, NEVER)
    return np.stack([tid, start, end, ready], axis=1).reshape(-1, 4).astype(np.int64)


def _parked(model: TraceModel, pattern) -> np.ndarray:
    """Wait frames long enough to be a parked thread; a selector polled with a zero timeout between callbacks, or a
    lock taken uncontended, is the loop's own work."""
    rows = waits.matching_frames(model, pattern)
    fr = model.frames
    return rows[fr.end_ns[rows] - fr.start_ns[rows] >= PARKED_MIN_NS]


def _merged(layer: _Layer):
    """The layer's intervals merged per thread key, sorted by (key, start); each keeps its first member's row."""
    order = np.lexsort((-layer.end, layer.start, layer.key))
    key, s, e = layer.key[order], layer.start[order], layer.end[order]
    reach = e.copy()
    new = np.ones(len(s), bool)
    # running maximum of the end within each key
    bounds = np.flatnonzero(np.diff(key)) + 1
    for lo, hi in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(s)].tolist()):
        reach[lo:hi] = np.maximum.accumulate(e[lo:hi])
        new[lo + 1:hi] = s[lo + 1:hi] > reach[lo:hi - 1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(s)] - 1
    return key[first], s[first], reach[last], layer.row[order][first], layer.frame[order][first], \
        layer.op[order][first]


def _carve(a, b, gap_key, remainder, launch, layers: list[_Layer]) -> IdlePieces:
    """Pieces of every gap: the gaps no layer touches stay whole; the others are swept point by point."""
    seg = {k: [] for k in ("gap", "start", "end", "layer", "row", "frame", "op")}
    carved = np.flatnonzero(gap_key >= 0)
    for rank, layer in enumerate(layers):
        key, s, e, row, frame, op = _merged(layer)
        for k in np.intersect1d(distinct(gap_key[carved]), key).tolist():
            g = carved[gap_key[carved] == k]
            lo_i, hi_i = np.searchsorted(key, k, "left"), np.searchsorted(key, k, "right")
            ks, ke = s[lo_i:hi_i], e[lo_i:hi_i]
            first = np.searchsorted(ke, a[g], side="right")  # the first interval ending after the gap starts
            stop = np.searchsorted(ks, b[g], side="left")  # intervals starting before the gap ends
            n = np.maximum(stop - first, 0)
            if not n.sum():
                continue
            gi = np.repeat(g, n)
            ii = lo_i + np.repeat(first, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
            seg["gap"].append(gi)
            seg["start"].append(np.maximum(s[ii], a[gi]))
            seg["end"].append(np.minimum(e[ii], b[gi]))
            seg["layer"].append(np.full(len(gi), rank))
            seg["row"].append(row[ii])
            seg["frame"].append(frame[ii])
            seg["op"].append(op[ii])
    if seg["gap"]:
        parts = {k: np.concatenate(v) for k, v in seg.items()}
        keep = parts["end"] > parts["start"]
        parts = {k: v[keep] for k, v in parts.items()}
    else:
        parts = {k: np.zeros(0, np.int64) for k in seg}
    causes = np.array([layer.cause for layer in layers], np.int8)
    touched = np.zeros(len(a), bool)
    touched[parts["gap"]] = True
    whole = np.flatnonzero(~touched)
    pieces = [(a[whole], b[whole], remainder[whole], launch[whole], np.full(len(whole), -1, np.int64),
               np.full(len(whole), -1, np.int64), whole)]
    if len(parts["gap"]):
        pieces.append(_sweep(a, b, remainder, launch, parts, causes, len(layers)))
    start, end, cause, row, frame, op, gap = (np.concatenate(c) for c in zip(*pieces))
    order = np.lexsort((start, gap))
    return IdlePieces(start[order], end[order], cause[order].astype(np.int8), row[order], frame[order], op[order],
                      gap[order])


def _sweep(a, b, remainder, launch, parts: dict, causes: np.ndarray, n_layers: int):
    """Elementary intervals between all segment bounds of each touched gap, each given the highest-priority layer
    covering it (or the gap's remainder cause), then merged where neighbours agree."""
    gaps = distinct(parts["gap"])
    n_seg = len(parts["gap"])
    ev_gap = np.concatenate([parts["gap"], parts["gap"], gaps, gaps])
    ev_t = np.concatenate([parts["start"], parts["end"], a[gaps], b[gaps]])
    ev_layer = np.concatenate([parts["layer"], parts["layer"], np.full(2 * len(gaps), -1)])
    ev_delta = np.concatenate([np.ones(n_seg, np.int64), -np.ones(n_seg, np.int64), np.zeros(2 * len(gaps), np.int64)])
    ev_seg = np.concatenate([np.arange(n_seg), np.arange(n_seg), np.full(2 * len(gaps), -1)])
    order = np.lexsort((ev_t, ev_gap))
    ev_gap, ev_t, ev_layer, ev_delta, ev_seg = (x[order] for x in (ev_gap, ev_t, ev_layer, ev_delta, ev_seg))
    n = len(order)
    last_of_point = np.ones(n, bool)
    last_of_point[:-1] = (ev_gap[1:] != ev_gap[:-1]) | (ev_t[1:] != ev_t[:-1])
    idx = np.arange(n)
    chosen = np.full(n, -1, np.int64)  # per event: the segment of the winning layer after it
    for layer in range(n_layers - 1, -1, -1):  # lower rank = higher priority, so it is applied last
        mine = ev_layer == layer
        active = np.cumsum(np.where(mine, ev_delta, 0))
        latest = np.maximum.accumulate(np.where(mine & (ev_delta > 0), idx, -1))
        on = active > 0
        chosen[on] = ev_seg[latest[on]]
    points = np.flatnonzero(last_of_point)
    p_gap, p_t, p_seg = ev_gap[points], ev_t[points], chosen[points]
    same_gap = p_gap[1:] == p_gap[:-1]
    lo, hi, g, s = p_t[:-1][same_gap], p_t[1:][same_gap], p_gap[:-1][same_gap], p_seg[:-1][same_gap]
    keep = hi > lo
    lo, hi, g, s = lo[keep], hi[keep], g[keep], s[keep]
    covered = s >= 0
    safe = np.maximum(s, 0)
    cause = np.where(covered, causes[parts["layer"][safe]], remainder[g]).astype(np.int8)
    row = np.where(covered, parts["row"][safe], launch[g])
    frame = np.where(covered, parts["frame"][safe], -1)
    op = np.where(covered, parts["op"][safe], -1)
    # merge neighbours of one gap with the same cause and responsible row/frame/op
    new = np.ones(len(lo), bool)
    new[1:] = (g[1:] != g[:-1]) | (cause[1:] != cause[:-1]) | (row[1:] != row[:-1]) | (frame[1:] != frame[:-1]) \
        | (op[1:] != op[:-1]) | (lo[1:] != hi[:-1])
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(lo)] - 1
    return lo[first], hi[last], cause[first], row[first], frame[first], op[first], g[first]
