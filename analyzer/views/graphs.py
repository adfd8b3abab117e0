"""CUDA / HIP graphs in a trace: graph replays (one launch call runs many kernels) and graph captures (launch calls
between Begin/EndCapture are recorded into a graph, not executed: they have no GPU activity)."""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.views import apis
from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys

BEGIN_CAPTURE = frozenset({"cudaStreamBeginCapture", "cudaStreamBeginCaptureToGraph", "cuStreamBeginCapture",
                           "cuStreamBeginCapture_v2", "hipStreamBeginCapture", "hipStreamBeginCaptureToGraph"})
END_CAPTURE = frozenset({"cudaStreamEndCapture", "cuStreamEndCapture", "hipStreamEndCapture"})
INSTANTIATE = frozenset({"cudaGraphInstantiate", "cudaGraphInstantiateWithFlags", "cudaGraphInstantiateWithParams",
                         "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams",
                         "hipGraphInstantiate", "hipGraphInstantiateWithFlags", "hipGraphInstantiateWithParams"})


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
    if len(begins):
        begin_key, end_key = thread_keys([rt.pid[begins], rt.pid[ends]], [rt.tid[begins], rt.tid[ends]])
        for b, key in zip(begins.tolist(), begin_key.tolist()):
            later = ends[(end_key == key) & (rt.start_ns[ends] >= rt.start_ns[b])]
            stop = int(rt.end_ns[later[0]]) if len(later) else int(rt.end_ns.max())
            starts.append(int(rt.start_ns[b]))
            stops.append(stop)
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
                    capture_pid, capture_tid)
