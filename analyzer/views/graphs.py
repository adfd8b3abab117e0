"""CUDA / HIP graphs in a trace: graph replays (one launch call runs many kernels) and graph captures (launch calls
between Begin/EndCapture are recorded into a graph, not executed: they have no GPU activity)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys

BEGIN_CAPTURE = frozenset({"cudaStreamBeginCapture", "cudaStreamBeginCaptureToGraph", "cuStreamBeginCapture",
                           "cuStreamBeginCapture_v2", "hipStreamBeginCapture", "hipStreamBeginCaptureToGraph"})
END_CAPTURE = frozenset({"cudaStreamEndCapture", "cuStreamEndCapture", "hipStreamEndCapture"})
INSTANTIATE = frozenset({"cudaGraphInstantiate", "cudaGraphInstantiateWithFlags", "cudaGraphInstantiateWithParams",
                         "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams",
                         "hipGraphInstantiate", "hipGraphInstantiateWithFlags", "hipGraphInstantiateWithParams"})


# torch.cuda.graph's context manager: before a capture it synchronizes the device, collects garbage and empties the
# allocator's cache; after it, ends the capture. Its set-up is the capture's cost, one-time like the capture.
_GRAPH_ENTER = re.compile(r"torch/cuda/graphs\.py\(\d+\): __enter__$")
_GRAPH_EXIT = re.compile(r"torch/cuda/graphs\.py\(\d+\): __exit__$")


@dataclasses.dataclass(frozen=True)
class GraphUse:
    replays: int  # graph launch calls
    replay_kernels: int  # GPU rows launched by them
    eager_launches: int  # kernel launches outside graphs that ran on the GPU
    captures: int  # Begin/EndCapture pairs
    captured_launches: int  # launch calls recorded inside a capture (no GPU work)
    capture_starts_ns: np.ndarray  # one capture region per row: [start, end) on the thread `capture_thread`
    capture_ends_ns: np.ndarray
    capture_pid: np.ndarray
    capture_tid: np.ndarray
    in_capture: np.ndarray  # per runtime row: made inside a capture region (its set-up and teardown included)
    captures_with_setup: int  # captures whose region holds torch.cuda.graph's set-up (the trace has its frames)

    @property
    def replayed(self) -> bool:
        return self.replays > 0

    @property
    def captured(self) -> bool:
        return self.captures > 0

    def as_dict(self) -> dict:
        return {"replays": self.replays, "replay_gpu_activities": self.replay_kernels,
                "eager_launches": self.eager_launches, "captures": self.captures,
                "captured_launches": self.captured_launches}


def graph_use(model: TraceModel, classes: np.ndarray) -> GraphUse:
    rt, names = model.runtime, model.names

    def rows_named(wanted: frozenset) -> np.ndarray:
        codes = [c for c, n in enumerate(names) if n in wanted]
        return np.flatnonzero(np.isin(rt.name, codes)) if codes and len(rt) else np.zeros(0, np.int64)

    graph = rows_named(apis.GRAPH_LAUNCH)
    launches = classes == apis.IS_LAUNCH
    launches[graph] = False
    replay_kernels = int(np.isin(model.gpu.launch, graph).sum()) if len(graph) else 0
    begins, ends = rows_named(BEGIN_CAPTURE), rows_named(END_CAPTURE)
    starts, stops, pids, tids = [], [], [], []
    with_setup = 0
    if len(begins):
        fr, (enter, leave) = model.frames, _setup_frames(model)
        begin_key, end_key = thread_keys([rt.pid[begins], rt.pid[ends]], [rt.tid[begins], rt.tid[ends]])
        for b, key in zip(begins.tolist(), begin_key.tolist()):
            later = ends[(end_key == key) & (rt.start_ns[ends] >= rt.start_ns[b])]
            stop = int(rt.end_ns[later[0]]) if len(later) else int(rt.end_ns.max())
            start = int(rt.start_ns[b])
            starts.append(min([start, *_enclosing(model, enter, start, rt.pid[b], rt.tid[b], fr.start_ns)]))
            stops.append(max([stop, *_enclosing(model, leave, stop, rt.pid[b], rt.tid[b], fr.end_ns)]))
            with_setup += starts[-1] < start
            pids.append(int(rt.pid[b]))
            tids.append(int(rt.tid[b]))
    capture_s, capture_e = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
    capture_pid, capture_tid = np.asarray(pids, np.int64), np.asarray(tids, np.int64)
    in_capture = np.zeros(len(rt), bool)
    for s, e, p, t in zip(starts, stops, pids, tids):
        in_capture |= (rt.start_ns >= s) & (rt.start_ns < e) & (rt.pid == p) & (rt.tid == t)
    captured = int((launches & in_capture & (rt.gpu < 0)).sum())
    eager = int((launches & (rt.gpu >= 0)).sum())
    return GraphUse(int(len(graph)), replay_kernels, eager, len(starts), captured, capture_s, capture_e,
                    capture_pid, capture_tid, in_capture, with_setup)


def _setup_frames(model: TraceModel) -> tuple[np.ndarray, np.ndarray]:
    """The frame rows of torch.cuda.graph's __enter__ and of its __exit__."""
    fr, names = model.frames, model.names
    if not len(fr):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    codes = distinct(fr.name)
    enter = [c for c in codes.tolist() if _GRAPH_ENTER.search(names[c])]
    leave = [c for c in codes.tolist() if _GRAPH_EXIT.search(names[c])]
    return np.flatnonzero(np.isin(fr.name, enter)), np.flatnonzero(np.isin(fr.name, leave))


def _enclosing(model: TraceModel, rows: np.ndarray, t: int, pid, tid, column: np.ndarray) -> list[int]:
    """column's values (a start or an end) of the frames among rows that enclose time t on the thread."""
    fr = model.frames
    mine = rows[(fr.pid[rows] == pid) & (fr.tid[rows] == tid) & (fr.start_ns[rows] <= t) & (fr.end_ns[rows] >= t)]
    return column[mine].tolist()
