"""torch.compile's compilations in the window: each Dynamo `_compile` frame (the outermost on its thread), its
compile id (`F/N` from Dynamo's own `dynamo_data: compile_id=F/N` annotation inside it: frame F's N-th compile, N >= 1
a recompile) and the user code that called the compiled function. A compile whose id is unknown (a trace without
those annotations) counts as a recompile when the same caller compiled before it in the window."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys
from analyzer.views.frames import FrameIndex

COMPILE_FRAME = re.compile(r"(^|/)torch/_dynamo/convert_frame\.py\(\d+\): _compile$")
COMPILE_ID = re.compile(r"^dynamo_data: compile_id=(\d+)/(\d+)")


@dataclasses.dataclass(frozen=True)
class Compiles:
    frames: np.ndarray  # python frame rows of the outermost _compile frames, in time order
    dynamo_frame: np.ndarray  # F of compile id F/N, -1 unknown
    attempt: np.ndarray  # N of compile id F/N, -1 unknown
    caller: np.ndarray  # the user frame that called the compiled function, -1 none
    recompile: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.frames)


def compiles(model: TraceModel, index: FrameIndex) -> Compiles:
    fr, ops, names = model.frames, model.ops, model.names
    codes = [c for c, n in enumerate(names) if COMPILE_FRAME.search(n)]
    rows = np.flatnonzero(np.isin(fr.name, codes)) if codes else np.zeros(0, np.int64)
    if len(rows):  # the outermost: no _compile frame above it
        inner = np.zeros(len(rows), bool)
        up = fr.parent[rows].copy()
        for _ in range(512):
            live = up >= 0
            if not live.any():
                break
            inner[live] |= np.isin(fr.name[up[live]], codes)
            up[live] = fr.parent[up[live]]
        rows = rows[~inner]
        rows = rows[np.argsort(fr.start_ns[rows], kind="stable")]
    dyn, attempt = np.full(len(rows), -1, np.int64), np.full(len(rows), -1, np.int64)
    id_codes = {c: COMPILE_ID.match(n) for c, n in enumerate(names) if n.startswith("dynamo_data: compile_id=")}
    marks = np.flatnonzero(np.isin(ops.name, [c for c, m in id_codes.items() if m])) if id_codes else np.zeros(0, int)
    if len(rows) and len(marks):
        frame_key, mark_key = thread_keys([fr.pid[rows], ops.pid[marks]], [fr.tid[rows], ops.tid[marks]])
        for k, row in enumerate(rows.tolist()):
            inside = marks[(mark_key == frame_key[k]) & (ops.start_ns[marks] >= fr.start_ns[row])
                           & (ops.start_ns[marks] <= fr.end_ns[row])]
            if len(inside):
                m = id_codes[int(ops.name[inside[0]])]
                dyn[k], attempt[k] = int(m.group(1)), int(m.group(2))
    caller = np.array([index.user_frame_of(int(fr.parent[r])) if fr.parent[r] >= 0 else -1 for r in rows.tolist()],
                      np.int64)
    recompile = attempt >= 1
    seen: set[int] = set()
    for k in range(len(rows)):
        key = int(fr.name[caller[k]]) if caller[k] >= 0 else -1
        if attempt[k] < 0:
            recompile[k] = key in seen
        seen.add(key)
    return Compiles(rows, dyn, attempt, caller, recompile)
