"""Set-up inside a library op for an input shape it has not run yet, read from the shapes the trace recorded
(record_shapes=True: each op's Input Dims).

A library op's own host time (its duration less its child ops and the runtime calls it made itself) is a few µs to
tens of µs of dispatch and argument handling. Libraries that choose or build their kernel per input configuration do
it on the first call at a shape and cache the result: cuDNN builds an execution plan (its attention graphs, its
convolution heuristics; with cudnn.benchmark it times every candidate algorithm on the GPU), cuBLASLt runs its
heuristics, MIOpen searches. So a call is set-up when it is the op's first call at its shape in the window and its own
time is far above the op's usual (the median of its calls at a shape already seen): OUTLIER_FACTOR times it and
OUTLIER_MIN_NS more, the thresholds of analyzer.views.onetime's first-call outliers, for the same reason (set-up is
orders of magnitude above a dispatch).

Whether it comes back is read from the window:
- recurring: new shapes keep arriving: set-up calls of the op in at least half of the steps after the first, at
  least two of them (a sequence length that grows every step; that the step's later layers reuse the step's plan
  does not make it one-time);
- one-time: otherwise, where the shape recurs later in the window at the usual cost (the library kept what it
  built); a lone slow call at a shape that never comes back is not called set-up (it could as well be a thread that
  lost its core);
- unknown: neither (no steps, or too few of them, and shapes that do not recur): nothing says it does not recur.
An op with no call at a seen shape has no usual cost to compare with: its calls are set-up only where the call shows
the search itself, timing candidates on the GPU (SEARCH_CALLS or more synchronizing calls and as many launches made
inside one op call: cudnn.benchmark's algorithm search, which a library op's single kernel never needs), with
OUTLIER_MIN_NS of its own time.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.trace import TraceModel
from analyzer.views import apis
from analyzer.views.onetime import OUTLIER_FACTOR, OUTLIER_MIN_NS
from analyzer.views.steps import StepRanges
from analyzer.views.waits import present_codes

SEARCH_CALLS = 4  # syncs (and launches) inside one call that time candidates: a search, not an op's own read-back
SHAPES_RECORDED = 0.5  # at least this share of library ops carry Input Dims: the trace recorded shapes
ONE_TIME, RECURRING, UNKNOWN = range(3)
RECURRENCE = ("one-time", "recurring", "unknown")
NO_TENSOR = re.compile(r"^\[(?:\[\],?)*\]$")
GEMM = re.compile(r"^aten::(_?(add)?b?mm|baddbmm|matmul|linear|addmv|_scaled_mm)$")


@dataclasses.dataclass(frozen=True)
class ShapeSetup:
    shapes_recorded: bool  # the trace holds Input Dims for most library ops (record_shapes=True)
    rows: np.ndarray  # op rows of set-up calls, in time order
    own_ns: np.ndarray  # each one's own host time
    usual_ns: np.ndarray  # its op's usual own time (median of its calls at a shape already seen)
    recurrence: np.ndarray  # int8: ONE_TIME / RECURRING / UNKNOWN (per op name: all of an op's calls alike)
    distinct_shapes: dict[int, int]  # op name code -> distinct shapes it ran at in the window
    calls: dict[int, int]  # op name code -> its calls in the window

    def __len__(self) -> int:
        return len(self.rows)

    def of(self, recurrence: int) -> np.ndarray:
        return self.rows[self.recurrence == recurrence]


def own_time_ns(model: TraceModel) -> np.ndarray:
    """Per op row: its duration less its direct child ops and the runtime calls it made itself (not below 0)."""
    ops, rt = model.ops, model.runtime
    dur = ops.end_ns - ops.start_ns
    inner = np.zeros(len(ops), np.int64)
    has = np.flatnonzero(ops.parent >= 0)
    np.add.at(inner, ops.parent[has], dur[has])
    if len(rt):
        mine = np.flatnonzero(rt.op >= 0)
        np.add.at(inner, rt.op[mine], (rt.end_ns - rt.start_ns)[mine])
    return np.maximum(dur - inner, 0)


def _empty(recorded: bool) -> ShapeSetup:
    empty = np.zeros(0, np.int64)
    return ShapeSetup(recorded, empty, empty, empty, np.zeros(0, np.int8), {}, {})


def shape_setup(model: TraceModel, steps: StepRanges, classes: np.ndarray, own: np.ndarray | None = None) -> ShapeSetup:
    """The set-up calls (the module's docstring); `own`: own_time_ns(model), where the caller has it."""
    ops, names = model.ops, model.names
    if not len(ops):
        return _empty(False)
    library = np.zeros(len(names), bool)
    for code in present_codes(ops.name, len(names)).tolist():
        library[code] = "::" in names[code]
    lib = np.flatnonzero(library[ops.name] & ~ops.is_annotation.astype(bool))
    with_shape = lib[ops.shape[lib] >= 0]
    if not len(lib) or len(with_shape) < SHAPES_RECORDED * len(lib):
        return _empty(False)
    own = own_time_ns(model) if own is None else own
    # only the ops with a call long enough to be set-up take part (a few names, not every op of a large trace)
    slow_names = np.zeros(len(names), bool)
    slow_names[ops.name[with_shape][own[with_shape] >= OUTLIER_MIN_NS]] = True
    with_shape = with_shape[slow_names[ops.name[with_shape]]]
    if not len(with_shape):
        return _empty(True)
    # an op without a tensor input (only scalars and lists: `[[],[],[]]`) records no shape to tell calls apart
    tensor = np.zeros(len(names), bool)
    for code in np.unique(ops.shape[with_shape]).tolist():
        tensor[code] = not NO_TENSOR.match(names[code])
    with_shape = with_shape[tensor[ops.shape[with_shape]]]
    name, shape, start = ops.name[with_shape], ops.shape[with_shape], ops.start_ns[with_shape]
    order = np.lexsort((start, shape, name))
    n, s = name[order], shape[order]
    first = np.r_[True, (n[1:] != n[:-1]) | (s[1:] != s[:-1])]  # each (op, shape)'s first call in the window
    rows, t = with_shape[order], own[with_shape[order]]
    out_rows, out_own, out_usual, out_rec = [], [], [], []
    distinct_shapes, calls = {}, {}
    bounds = np.flatnonzero(np.r_[True, n[1:] != n[:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        repeat = ~first[lo:hi]
        if repeat.any():
            usual = float(np.median(t[lo:hi][repeat]))
            slow = first[lo:hi] & (t[lo:hi] >= OUTLIER_FACTOR * usual) & (t[lo:hi] - usual >= OUTLIER_MIN_NS)
        else:  # every call at a new shape: no usual cost to compare with, but a search shows itself
            usual = 0.0
            slow = (t[lo:hi] >= OUTLIER_MIN_NS) & _searching(model, classes, rows[lo:hi])
        if not slow.any():
            continue
        code = int(n[lo])
        distinct_shapes[code], calls[code] = int(first[lo:hi].sum()), hi - lo
        # the shape's later calls: a fast one says the library kept what it built (per shape: runs of equal s)
        shape_run = np.cumsum(first[lo:hi]) - 1
        fast_later = np.zeros(int(shape_run[-1]) + 1, bool)
        np.logical_or.at(fast_later, shape_run[repeat], ~(t[lo:hi][repeat] >= OUTLIER_FACTOR * usual))
        found = np.flatnonzero(slow)
        recurs = fast_later[shape_run[found]]
        if (~recurs).sum() == 1:  # one slow call at a shape that never came back: set-up, or the thread preempted?
            found, recurs = found[recurs], recurs[recurs]
            if not len(found):
                continue
        # new shapes that keep arriving make the set-up recur, whether or not each shape comes back later in the
        # window (a growing sequence length: every layer after the first reuses the step's plan)
        arriving = _recurrence(start[order][lo:hi][found], steps)
        rec = np.where(arriving == RECURRING, RECURRING, np.where(recurs, ONE_TIME, arriving))
        out_rows.append(rows[lo:hi][found])
        out_own.append(t[lo:hi][found])
        out_usual.append(np.full(len(found), int(usual)))
        out_rec.append(np.asarray(rec, np.int8))
    if not out_rows:
        return _empty(True)
    rows = np.concatenate(out_rows)
    # a set-up call inside another (aten::_convolution around aten::cudnn_convolution): the inner one is where the
    # library worked; the outer's span would claim the inner's time for the outer
    outer = _ancestors_of(ops.parent, rows)
    keep = ~np.isin(rows, outer)
    out_own, out_usual, out_rec = ([np.concatenate(x)[keep]] for x in (out_own, out_usual, out_rec))
    rows = rows[keep]
    by_time = np.argsort(ops.start_ns[rows], kind="stable")
    return ShapeSetup(True, rows[by_time], np.concatenate(out_own)[by_time], np.concatenate(out_usual)[by_time],
                      np.concatenate(out_rec)[by_time], distinct_shapes, calls)


def _searching(model: TraceModel, classes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per op row: at least SEARCH_CALLS synchronizing calls and as many launches made inside it on its thread."""
    out = np.zeros(len(rows), bool)
    for k, row in enumerate(rows.tolist()):
        inside = calls_inside(model, classes, row)
        out[k] = inside["syncs"] >= SEARCH_CALLS and inside["launches"] >= SEARCH_CALLS
    return out


def _ancestors_of(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Every op row above these rows (their parents, up the chain)."""
    found, up = [], parent[rows]
    for _ in range(256):  # the bound also guards a malformed (cyclic) parent chain
        up = up[up >= 0]
        if not len(up):
            break
        found.append(up)
        up = parent[up]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)


def _recurrence(starts: np.ndarray, steps: StepRanges) -> int:
    """For an op's set-up calls: RECURRING where they fall in at least two steps and half of the steps after the
    first, else UNKNOWN (for those at shapes that never recur, nothing shows that new shapes stop arriving)."""
    if not len(starts) or len(steps) < 3:
        return UNKNOWN
    at = steps.index_at(starts)
    later = np.unique(at[at >= 1])
    return RECURRING if len(later) >= 2 and len(later) * 2 >= len(steps) - 1 else UNKNOWN


def library_of(op_name: str, hip: bool) -> str | None:
    """The library whose set-up an op's own time is, from the op's name: cuDNN's and MIOpen's ops name their library;
    a GEMM goes to cuBLAS / cuBLASLt (hipBLASLt / rocBLAS on ROCm)."""
    lower = op_name.lower()
    if "cudnn" in lower:
        return "cuDNN"
    if "miopen" in lower:
        return "MIOpen"
    if GEMM.match(op_name):
        return "hipBLASLt / rocBLAS" if hip else "cuBLAS / cuBLASLt"
    return None


def calls_inside(model: TraceModel, classes: np.ndarray, row: int) -> dict[str, int]:
    """Runtime calls made on the op's thread during its span, by what they do: launches, synchronizing calls,
    allocations."""
    ops, rt = model.ops, model.runtime
    if not len(rt):
        return {"launches": 0, "syncs": 0, "allocations": 0}
    inside = np.flatnonzero((rt.pid == ops.pid[row]) & (rt.tid == ops.tid[row]) & (rt.start_ns >= ops.start_ns[row])
                            & (rt.end_ns <= ops.end_ns[row]))
    c = classes[inside]
    return {"launches": int((c == apis.IS_LAUNCH).sum()),
            "syncs": int(((c == apis.IS_SYNC) | (c == apis.IS_SYNC_COPY)).sum()),
            "allocations": int(((c == apis.IS_ALLOC) | (c == apis.IS_HOST_ALLOC)).sum())}
