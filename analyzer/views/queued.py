"""What queued idle waited for: each idle piece whose next work had been launched before the GPU ran dry (cause
`queued`), with what the trace shows held that work back, the first that applies:
- before_window: the work was launched before the profiling window began (the GPU was behind the CPU);
- graph_node: a later node of a replayed graph (the graph's own dependencies and node latency);
- event_wait: its stream was made to wait on an event (cudaStreamWaitEvent / hipStreamWaitEvent, or a `Stream Wait
  Event` record) after the stream's previous work was launched: it waited for work on another stream;
- host_callback: a host function was queued on the stream before it (cudaLaunchHostFunc, cudaStreamAddCallback);
- pageable_copy: it is a host-to-device copy from pageable memory, which waits for the driver's host-side staging;
- device_latency: a gap under DEVICE_LATENCY_NS between work already queued on the device;
- unseen_wait: the rest: the work waited on something the trace does not record (another process or device, an
  event recorded by work outside the window).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.trace import GpuKind, TraceModel
from analyzer.trace.joins import thread_keys
from analyzer.views import apis
from analyzer.views.idle import QUEUED, Gaps, IdlePieces
from analyzer.views.timeline import activity_mask

REASONS = ("before_window", "graph_node", "event_wait", "host_callback", "pageable_copy", "device_latency",
           "unseen_wait")
BEFORE_WINDOW, GRAPH_NODE, EVENT_WAIT, HOST_CALLBACK, PAGEABLE_COPY, DEVICE_LATENCY, UNSEEN_WAIT = range(7)
EXAMPLES = 8  # event waits whose awaited work is looked up
DEVICE_LATENCY_NS = 20_000  # longer than any back-to-back gap between kernels on one device
STREAM_WAITS = frozenset({"cudaStreamWaitEvent", "hipStreamWaitEvent", "cuStreamWaitEvent"})
HOST_CALLBACKS = frozenset({"cudaLaunchHostFunc", "cudaStreamAddCallback", "cuLaunchHostFunc", "cuStreamAddCallback",
                            "hipLaunchHostFunc", "hipStreamAddCallback"})


@dataclasses.dataclass(frozen=True)
class QueuedWaits:
    pieces: np.ndarray  # idle piece indexes of cause queued
    reason: np.ndarray  # int8 code into REASONS, per piece
    next_gpu: np.ndarray  # the GPU row each piece waited before
    other_gpu: np.ndarray  # for the longest event waits: the last work on another stream of the device before
    # it, -1 none


def queued_waits(model: TraceModel, gaps: Gaps, idle: IdlePieces) -> QueuedWaits:
    rt, gpu = model.runtime, model.gpu
    pieces = np.flatnonzero(idle.cause == QUEUED)
    gap = idle.gap[pieces]
    nxt, launch = gaps.next_gpu[gap], gaps.launch[gap]
    reason = np.full(len(pieces), UNSEEN_WAIT, np.int8)
    other = np.full(len(pieces), -1, np.int64)
    if not len(pieces):
        return QueuedWaits(pieces, reason, nxt, other)
    known = launch >= 0
    safe = np.maximum(launch, 0)
    names = model.names
    codes = {kind: np.array([c for c, n in enumerate(names) if n in group], np.int64)
             for kind, group in (("graph", apis.GRAPH_LAUNCH), ("wait", STREAM_WAITS), ("callback", HOST_CALLBACKS))}
    graph_node = known & np.isin(rt.name[safe], codes["graph"]) & (rt.gpu[safe] != nxt) if len(rt) else ~known
    copies = np.unique(gpu.name[nxt[gpu.kind[nxt] == GpuKind.MEMCPY]])
    direction = {c: apis.copy_direction(names[c]) for c in copies.tolist()}
    pageable_codes = [c for c, d in direction.items() if d and d[0] == "HtoD" and d[1] in ("Pageable", "Host")]
    pageable = (gpu.kind[nxt] == GpuKind.MEMCPY) & np.isin(gpu.name[nxt], pageable_codes)
    since = _previous_launch_on_stream(model, nxt)
    waited = _call_between(model, codes["wait"], launch, since) | _stream_wait_record(model, nxt, since)
    callback = _call_between(model, codes["callback"], launch, since)
    short = idle.duration_ns[pieces] < DEVICE_LATENCY_NS
    for code, hit in ((DEVICE_LATENCY, short), (PAGEABLE_COPY, pageable), (HOST_CALLBACK, callback),
                      (EVENT_WAIT, waited), (GRAPH_NODE, graph_node), (BEFORE_WINDOW, ~known)):
        reason[hit] = code  # the last assignment wins: the list runs from the weakest evidence to the strongest
    waits = np.flatnonzero(reason == EVENT_WAIT)
    for i in waits[np.argsort(-idle.duration_ns[pieces[waits]], kind="stable")[:EXAMPLES]].tolist():
        other[i] = _last_on_other_stream(model, int(nxt[i]))  # the longest waits only: one scan each
    return QueuedWaits(pieces, reason, nxt, other)


def _previous_launch_on_stream(model: TraceModel, rows: np.ndarray) -> np.ndarray:
    """Per GPU row: the start of the launch call of the activity before it on its stream (-1: none known)."""
    gpu, rt = model.gpu, model.runtime
    act = np.flatnonzero(activity_mask(model))
    key = thread_keys([gpu.device[act]], [gpu.stream[act]])[0]
    order = np.lexsort((gpu.start_ns[act], key))
    act, key = act[order], key[order]
    position = np.empty(len(gpu), np.int64)
    position[act] = np.arange(len(act))
    at = position[rows]
    prev = np.where(at > 0, act[np.maximum(at - 1, 0)], -1)
    same = (at > 0) & (key[np.maximum(at - 1, 0)] == key[at])
    prev_launch = np.where(same & (prev >= 0), gpu.launch[np.maximum(prev, 0)], -1)
    return np.where(prev_launch >= 0, rt.start_ns[np.maximum(prev_launch, 0)] if len(rt) else -1, -1)


def _call_between(model: TraceModel, codes: np.ndarray, launch: np.ndarray, since: np.ndarray) -> np.ndarray:
    """Per piece: a call of one of these APIs on the launching thread after `since` and before the launch."""
    rt = model.runtime
    calls = np.flatnonzero(np.isin(rt.name, codes)) if len(codes) and len(rt) else np.zeros(0, np.int64)
    if not len(calls):
        return np.zeros(len(launch), bool)
    safe = np.maximum(launch, 0)
    call_key, launch_key = thread_keys([rt.pid[calls], rt.pid[safe]], [rt.tid[calls], rt.tid[safe]])
    found, t = _last_before(call_key, rt.start_ns[calls], launch_key, rt.start_ns[safe], inclusive=False)
    return (launch >= 0) & found & (t > since)


def _stream_wait_record(model: TraceModel, rows: np.ndarray, since: np.ndarray) -> np.ndarray:
    """Per GPU row: a `Stream Wait Event` record (cuda_sync events) on its stream since the previous launch."""
    gpu = model.gpu
    codes = [c for c, n in enumerate(model.names) if n == "Stream Wait Event"]
    waits = np.flatnonzero((gpu.kind == GpuKind.SYNC) & np.isin(gpu.name, codes))
    if not len(waits):
        return np.zeros(len(rows), bool)
    wait_key, row_key = thread_keys([gpu.device[waits], gpu.device[rows]], [gpu.stream[waits], gpu.stream[rows]])
    found, t = _last_before(wait_key, gpu.start_ns[waits], row_key, gpu.start_ns[rows], inclusive=True)
    return found & (t >= np.maximum(since, 0))


def _last_before(key: np.ndarray, t: np.ndarray, query_key: np.ndarray, query_t: np.ndarray,
                 inclusive: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per query: whether an event of the same key lies before its time (at it too, when inclusive), and the time
    of the last such event. One sorted axis, key then time, searched once for all queries."""
    _, code = np.unique(np.concatenate([key, query_key]), return_inverse=True)
    code, query_code = code[:len(key)], code[len(key):]
    t0 = int(min(t.min(), query_t.min()))
    span = int(max(t.max(), query_t.max())) - t0 + 1
    at = code * span + (t - t0)
    order = np.argsort(at, kind="stable")
    at, code, t = at[order], code[order], t[order]
    j = np.searchsorted(at, query_code * span + (query_t - t0), side="right" if inclusive else "left") - 1
    jj = np.maximum(j, 0)
    return (j >= 0) & (code[jj] == query_code), t[jj]


def _last_on_other_stream(model: TraceModel, row: int) -> int:
    """The activity on another stream of the same device that ended last before this one started."""
    gpu = model.gpu
    mine = activity_mask(model) & (gpu.device == gpu.device[row]) & (gpu.stream != gpu.stream[row]) & \
        (gpu.end_ns <= gpu.start_ns[row])
    rows = np.flatnonzero(mine)
    return int(rows[np.argmax(gpu.end_ns[rows])]) if len(rows) else -1
