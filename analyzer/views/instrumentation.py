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


def instrumentation_rows(model: TraceModel, frames: FrameIndex, classes: np.ndarray) -> np.ndarray:
    """Per runtime row: made by this tool's capture code, or an explicit synchronize (outside any op) issued by a
    function whose name says it runs the profiler (`run_torch_profiler`, `profile_step`)."""
    rt = model.runtime
    out = np.zeros(len(rt), bool)
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
