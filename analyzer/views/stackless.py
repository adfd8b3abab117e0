"""The host's time between recorded calls, measured without Python stacks: the capture's stackless pass (the same
window run again under the same profiler settings but `with_stack=False`, meta.json `stackless_pass`).

With Python stacks, every Python call and every builtin call is an event, and a helper of pure Python code runs
several times slower in the trace than it does unprofiled: its unprofiled time is the small difference of two large
numbers (the traced time less the probed cost of its events), which a probe run in a slow spell of the host
over-cuts. Without stacks, the same code records nothing: the host's time between two recorded calls is what the
code took. Here each step's recorded calls on the thread that runs the steps (cpu_ops, annotations and runtime
calls, at any depth: a compiled region is one op with the wrapper's Python inside) are lined up with the stackless
pass's steps of the same sequence of call boundaries; the gaps between boundaries, position by position, give the
time the stacked trace's gap took without its Python events (the median over those steps). How that time is laid
over the gap's events is analyzer.views.profiler_cost's.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.trace import TraceModel

STEP_PREFIX = "ProfilerStep#"
StepGaps = tuple[bytes, np.ndarray, np.ndarray]  # a step's key (its sequence of call boundaries), its gaps' lo and hi


@dataclasses.dataclass(frozen=True)
class HostGaps:
    """The stacked trace's host gaps that the stackless pass times: on thread `tid`, from `start_ns` to `end_ns`,
    and `stackless_ns` long without Python stacks."""
    tid: int
    start_ns: np.ndarray
    end_ns: np.ndarray
    stackless_ns: np.ndarray
    steps_matched: int
    steps: int


def _step_rows(model: TraceModel) -> np.ndarray:
    """The steps both passes mark alike: ProfilerStep#N where the trace has them, else every step annotation."""
    names = np.array([model.names[c] for c in model.steps.name], dtype=object)
    profiler = np.flatnonzero([str(n).startswith(STEP_PREFIX) for n in names])
    return profiler if len(profiler) else np.arange(len(model.steps))


def _boundaries(model: TraceModel, tid: int) -> tuple[np.ndarray, np.ndarray]:
    """Every start and end of the thread's recorded calls (cpu_ops, annotations and runtime calls, at any depth: a
    record_function's bounds split the gaps around it), in time order, and what each is: the call's name code,
    doubled, plus one at its end. At one instant an end comes before a start, an enclosing call's start before its
    children's and its end after theirs, so that both passes order their boundaries alike."""
    ops, rt = model.ops, model.runtime
    mine_ops = ops.tid == tid
    mine_rt = rt.tid == tid
    start = np.concatenate([ops.start_ns[mine_ops], rt.start_ns[mine_rt]])
    end = np.concatenate([ops.end_ns[mine_ops], rt.end_ns[mine_rt]])
    name = np.concatenate([ops.name[mine_ops], rt.name[mine_rt]]).astype(np.int64)
    ts = np.r_[start, end]
    is_end = np.r_[np.zeros(len(start), np.int64), np.ones(len(end), np.int64)]
    nesting = np.r_[-end, -start]  # a start: the longer call first; an end: the later-started (inner) call first
    order = np.lexsort((nesting, is_end - 1, ts)) if len(ts) else np.zeros(0, np.int64)
    return ts[order], (np.r_[name, name] * 2 + is_end)[order]


def _step_gaps(model: TraceModel, vocabulary: dict[str, int]) -> tuple[int, list[StepGaps]] | None:
    """The steps' thread and, per step, what bounds its host gaps and the gaps: the step's start to the first
    boundary, each boundary to the next, the last to the next step's start (the last step's: its end; gap k runs
    from lo[k] to hi[k]). A step's sequence of boundaries is its key: each boundary's name, less a trailing number
    (ProfilerStep#3, decode_step#2: the passes count their steps apart), as an id of `vocabulary` (shared by both
    passes, whose name tables differ), doubled, plus one at an end, as bytes."""
    rows = _step_rows(model)
    if not len(rows):
        return None
    tids = model.ops.tid[model.steps.op[rows]]
    tid = int(np.bincount(tids - tids.min()).argmax() + tids.min())
    ts, label = _boundaries(model, tid)
    ids = np.array([vocabulary.setdefault(re.sub(r"#?\d+$", "", n), len(vocabulary)) for n in model.names], np.int64)
    label = ids[label >> 1] * 2 + (label & 1) if len(label) else label
    out = []
    mine = rows[tids == tid]
    mine = mine[np.argsort(model.steps.start_ns[mine], kind="stable")]
    # a step's gaps run to the next step's start: the loop's code between two steps (prof.step() in it) is timed too
    his = np.r_[model.steps.start_ns[mine[1:]], model.steps.end_ns[mine[-1:]]]
    for row, hi in zip(mine.tolist(), his.tolist()):
        lo, hi = int(model.steps.start_ns[row]), max(int(hi), int(model.steps.end_ns[row]))
        a, b = np.searchsorted(ts, lo, side="left"), np.searchsorted(ts, hi, side="right")
        out.append((label[a:b].tobytes(), np.r_[lo, ts[a:b]], np.r_[ts[a:b], hi]))
    return tid, out


def host_gaps(stacked: TraceModel, stackless: TraceModel) -> HostGaps | None:
    """The stacked trace's step gaps timed by the stackless pass: each step whose sequence of call boundaries some
    stackless step repeats, its gaps against the median of those steps' gaps at the same positions."""
    vocabulary: dict[str, int] = {}
    mine, theirs = _step_gaps(stacked, vocabulary), _step_gaps(stackless, vocabulary)
    if mine is None or theirs is None:
        return None
    by_sequence: dict[bytes, list[np.ndarray]] = {}
    for names, lo, hi in theirs[1]:
        by_sequence.setdefault(names, []).append(hi - lo)
    reference = {names: np.median(np.stack(gaps), axis=0) for names, gaps in by_sequence.items()}
    starts, ends, timed, matched = [], [], [], 0
    for names, lo, hi in mine[1]:
        if names not in reference:
            continue
        matched += 1
        starts.append(lo)
        ends.append(hi)
        timed.append(reference[names])
    if not matched:
        return HostGaps(mine[0], *(np.zeros(0, np.int64),) * 3, 0, len(mine[1]))
    return HostGaps(mine[0], np.concatenate(starts), np.concatenate(ends),
                    np.concatenate(timed).astype(np.int64), matched, len(mine[1]))
