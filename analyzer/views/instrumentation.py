"""What in a trace is the measurement rather than the workload: the profiler's own code, this tool's capture code,
and a harness's synchronize that brackets the profiled region."""
from __future__ import annotations

import re

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.views.frames import FrameIndex, FrameKind, parse_frame
from analyzer.trace import TraceModel

PROFILER_FRAME = re.compile(r"(^|/)torch/(profiler|autograd/profiler)")
_HARNESS_FUNCTION = re.compile(r"profil", re.IGNORECASE)


_DEVICE_SYNC = frozenset({"cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize"})


def instrumentation_rows(model: TraceModel, frames: FrameIndex, classes: np.ndarray) -> np.ndarray:
    """Per runtime row: made by this tool's capture code, an explicit synchronize (outside any op) issued by a
    function whose name says it runs the profiler (`run_torch_profiler`, `profile_step`), or the profiler's own
    stop (profiler_stop_sync)."""
    rt = model.runtime
    out = np.zeros(len(rt), bool)
    out[profiler_stop_sync(model)] = True
    has_frame = rt.frame >= 0
    if not has_frame.any():
        return out
    user = np.full(len(rt), -1, np.int64)
    user[has_frame] = frames.user_frame[rt.frame[has_frame]]
    known = user >= 0
    kind = np.full(len(rt), -1, np.int64)
    kind[known] = frames.kind[user[known]]
    out |= kind == FrameKind.TOOL
    explicit = (classes == apis.IS_SYNC) & (rt.op < 0) & known
    for code in distinct(model.frames.name[user[explicit]]).tolist():
        parsed = parse_frame(model.names[code])
        if parsed and _HARNESS_FUNCTION.search(parsed[2]):
            out |= explicit & (model.frames.name[np.maximum(user, 0)] == code)
    return out


def profiler_stop_sync(model: TraceModel) -> np.ndarray:
    """The runtime rows of the profiler's stop: torch.profiler synchronizes the device as it stops recording
    (profile.__exit__), the last runtime call of its thread, outside any op and with no op after it. With Python
    stacks its frame names the profiler already; without, only its place says so."""
    rt, ops, names = model.runtime, model.ops, model.names
    codes = [c for c, n in enumerate(names) if n in _DEVICE_SYNC]
    rows = np.flatnonzero(np.isin(rt.name, codes) & (rt.op < 0) & (rt.frame < 0)) if codes and len(rt) else []
    out = []
    for r in rows:
        mine = (rt.pid == rt.pid[r]) & (rt.tid == rt.tid[r])
        later_ops = (ops.pid == rt.pid[r]) & (ops.tid == rt.tid[r]) & (ops.start_ns >= rt.end_ns[r])
        if not (mine & (rt.start_ns > rt.start_ns[r])).any() and not later_ops.any():
            out.append(int(r))
    return np.asarray(out, np.int64)
