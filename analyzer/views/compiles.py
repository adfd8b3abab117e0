"""torch.compile's compilations in the window: each Dynamo compile (the outermost `_compile` frame of
torch/_dynamo/convert_frame.py where the trace has Python stacks, else Dynamo's own `entire_frame_compile` /
`_compile.compile_inner (dynamo_timed)` ops, the outermost: `dynamo`), its compile id (`F/N` from Dynamo's `dynamo_data: compile_id=F/N` or
`entire_frame_compile_data: ..., compile_id=F/N` annotation inside it: frame F's N-th compile, N >= 1 a recompile)
and the user code that called the compiled function (stacks only).

A compile counts as a recompile when its id says so (N >= 1), when the same caller compiled before it in the window,
or when meta.json says the capture ran the same steps unprofiled before the window (a compile those steps did not
make is not a warm-up cost: a new shape, or a cache that was reset, made Dynamo compile again)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys
from analyzer.views.frames import FrameIndex

COMPILE_FRAME = re.compile(r"(^|/)torch/_dynamo/convert_frame\.py\(\d+\): _compile$")
CONVERT_FRAME = re.compile(r"(^|/)torch/_dynamo/convert_frame\.py\(\d+\): ")
TORCH_FRAME = re.compile(r"(^|/)torch/")
COMPILE_OP = re.compile(r"^(dynamo|entire_frame_compile|_compile\.compile_inner \(dynamo_timed\))$")
COMPILE_ID = re.compile(r"^(?:dynamo_data|entire_frame_compile_data): (?:.*, )?compile_id=(\d+)/(\d+)")


@dataclasses.dataclass(frozen=True)
class Compiles:
    start_ns: np.ndarray  # each compile's span, in time order
    end_ns: np.ndarray
    frames: np.ndarray  # its python frame row (stacks), else -1
    ops: np.ndarray  # its op row (no stacks), else -1
    dynamo_frame: np.ndarray  # F of compile id F/N, -1 unknown
    attempt: np.ndarray  # N of compile id F/N, -1 unknown
    caller: np.ndarray  # the user frame that called the compiled function, -1 none
    recompile: np.ndarray  # bool
    compiled: np.ndarray  # the frame of the function Dynamo compiled, run right after the compile, -1 none
    after_warmup: bool  # the capture ran the same steps unprofiled before the window (meta.json)

    def __len__(self) -> int:
        return len(self.start_ns)


def _outermost(rows: np.ndarray, parent: np.ndarray, name: np.ndarray, codes: list[int]) -> np.ndarray:
    inner = np.zeros(len(rows), bool)
    up = parent[rows].copy()
    for _ in range(512):
        live = up >= 0
        if not live.any():
            break
        inner[live] |= np.isin(name[up[live]], codes)
        up[live] = parent[up[live]]
    return rows[~inner]


def _codes(names: list[str], pattern: re.Pattern) -> list[int]:
    return [c for c, n in enumerate(names) if pattern.search(n)]


def compiles(model: TraceModel, index: FrameIndex, *, after_warmup: bool = False) -> Compiles:
    fr, ops, names = model.frames, model.ops, model.names
    codes = _codes(names, COMPILE_FRAME)
    rows = _outermost(np.flatnonzero(np.isin(fr.name, codes)), fr.parent, fr.name, codes) if codes \
        else np.zeros(0, np.int64)
    if len(rows):
        table, pid, tid, frame_rows, op_rows = fr, fr.pid[rows], fr.tid[rows], rows, np.full(len(rows), -1)
    else:  # no Python stacks: Dynamo's own ops
        op_codes = _codes(names, COMPILE_OP)
        rows = _outermost(np.flatnonzero(np.isin(ops.name, op_codes)), ops.parent, ops.name, op_codes) if op_codes \
            else np.zeros(0, np.int64)
        table, pid, tid, frame_rows, op_rows = ops, ops.pid[rows], ops.tid[rows], np.full(len(rows), -1), rows
    order = np.argsort(table.start_ns[rows], kind="stable")
    rows, pid, tid, frame_rows, op_rows = rows[order], pid[order], tid[order], frame_rows[order], op_rows[order]
    start, end = table.start_ns[rows], table.end_ns[rows]
    dyn, attempt = np.full(len(rows), -1, np.int64), np.full(len(rows), -1, np.int64)
    id_codes = {c: m for c, n in enumerate(names) if "compile_id=" in n for m in [COMPILE_ID.match(n)] if m}
    marks = np.flatnonzero(np.isin(ops.name, list(id_codes))) if id_codes else np.zeros(0, np.int64)
    if len(rows) and len(marks):
        span_key, mark_key = thread_keys([pid, ops.pid[marks]], [tid, ops.tid[marks]])
        for k in range(len(rows)):
            inside = marks[(mark_key == span_key[k]) & (ops.start_ns[marks] >= start[k])
                           & (ops.start_ns[marks] <= end[k])]
            if len(inside):
                m = id_codes[int(ops.name[inside[0]])]
                dyn[k], attempt[k] = int(m.group(1)), int(m.group(2))
    caller = np.array([index.user_frame_of(int(fr.parent[r])) if r >= 0 and fr.parent[r] >= 0 else -1
                       for r in frame_rows.tolist()], np.int64)
    recompile = (attempt >= 1) | after_warmup
    seen: set[int] = set()
    for k in range(len(rows)):
        key = int(fr.name[caller[k]]) if caller[k] >= 0 else -1
        if attempt[k] < 0 and key >= 0:
            recompile[k] |= key in seen
        seen.add(key)
    compiled = np.array([_compiled_function(model, r) for r in frame_rows.tolist()], np.int64)
    return Compiles(start, end, frame_rows, op_rows, dyn, attempt, caller, recompile, compiled, after_warmup)


def _compiled_function(model: TraceModel, compile_row: int) -> int:
    """The frame of the function a compile was for: Dynamo's frame callback (convert_frame.py's frames above
    `_compile`) runs when that function's frame is entered, and the function's own frame, now running the compiled
    bytecode, follows it under the same parent (e.g. eval_frame.py's compile_wrapper). -1 where none is recorded."""
    if compile_row < 0:
        return -1
    fr, names = model.frames, model.names
    top, hops = compile_row, 0
    while fr.parent[top] >= 0 and CONVERT_FRAME.search(names[fr.name[fr.parent[top]]]) and hops < 64:
        top, hops = int(fr.parent[top]), hops + 1
    parent = int(fr.parent[top])
    if parent < 0:
        return -1
    # the parent's children that start after the callback: frames are in start order, so search that span alone
    lo, hi = np.searchsorted(fr.start_ns, [fr.end_ns[top], fr.end_ns[parent]], side="left")
    after = lo + np.flatnonzero(fr.parent[lo:hi] == parent)
    for row in after[:8].tolist():
        name = names[fr.name[row]]
        if not name.startswith("<") and not TORCH_FRAME.search(name):
            return row
    return -1
