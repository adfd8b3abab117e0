"""What in a trace is the measurement rather than the workload: the profiler's own code, this tool's capture code,
and a harness's synchronize that brackets the profiled region."""
from __future__ import annotations

import re

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.views.frames import FrameIndex, FrameKind, parse_frame
from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys

PROFILER_FRAME = re.compile(r"(^|/)torch/(profiler|autograd/profiler)")
_HARNESS_FUNCTION = re.compile(r"profil", re.IGNORECASE)



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
    codes = [c for c, n in enumerate(names) if n in apis.DEVICE_SYNC]
    if not codes or not len(rt):
        return np.zeros(0, np.int64)
    rt_key, op_key = thread_keys([rt.pid, ops.pid], [rt.tid, ops.tid])
    threads, thread_of = np.unique(rt_key, return_inverse=True)
    last = np.full(len(threads), -1, np.int64)  # each thread's last runtime call (the latest start)
    np.maximum.at(last, thread_of, rt.start_ns)
    rows = np.flatnonzero(np.isin(rt.name, codes) & (rt.op < 0) & (rt.frame < 0) & (rt.start_ns == last[thread_of]))
    return np.asarray([r for r in rows.tolist()
                       if not ((op_key == rt_key[r]) & (ops.start_ns >= rt.end_ns[r])).any()], np.int64)
