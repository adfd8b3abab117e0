"""The profiler's cost in the host gaps the capture's stackless pass timed (analyzer.views.stackless), measured there
instead of probed, and laid where it was paid.

Every gap between two recorded calls of a lined-up step loses, with Python stacks, its length less the stackless
pass's median length at the same position: what its Python events cost, and whatever else ran slower with stacks
(a gap with no Python event loses time too, and in a slow spell of the host every gap does). What the stackless gap
still holds of the profiler is the cost of recording the calls around it (cpu_ops, runtime calls, allocator events),
which the probe prices per event in a tight loop; in a real step they cost otherwise (on an H100, 0.9-1.8x the
probe's figures in eager decode steps, 2.7x in a compiled step's wrapper code). Where the stackless pass's steps
were host-bound (their thread blocked in syncs for under HOST_BOUND_SHARE of the step) that ratio is measured
(_calibration): the lined-up steps' gaps, less what they lost and less the profiler's own step() between steps,
against the unprofiled step, over the probed cost of their events. Elsewhere the probe's cost stands.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.views.instrumentation import PROFILER_FRAME
from analyzer.views.stackless import STEP_PREFIX

RATIO_RANGE = (0.25, 4.0)  # how far a measured ratio may move probed costs
RATIO_EVIDENCE_NS = 100_000  # the probed cost the timed gaps must hold before their Python ratio applies elsewhere
MIN_STEPS = 2  # lined-up steps a calibration takes the median of
HOST_BOUND_SHARE = 0.1  # a stackless step whose thread waited in syncs longer than this share of it was not host-bound
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "cudaMemcpyAsync", "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
                        "hipMemcpy", "hipMemcpyAsync"})


@dataclasses.dataclass(frozen=True)
class TimedCosts:
    """The probed costs with the stackless pass's timing: the Python events' (zero where a timed gap holds them,
    else scaled by what the timed gaps measured against their probed cost), each host source's (zero where a timed
    gap holds the event), the timed gaps' costs as (tid, start, cost) cuts laid where they were paid, and the
    report's summary (None without a stackless pass)."""
    frame_ns: np.ndarray
    host_ns: tuple[np.ndarray, ...]
    cuts: tuple[np.ndarray, np.ndarray, np.ndarray]
    summary: dict | None


def between_profiler_steps(m) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch.profiler's own step(): from one ProfilerStep#N's end to the next one's start on the same thread, both
    inside the same `prof.step()` call, is code no unprofiled run has. Returns (tid, start, its whole length) to cut,
    measured."""
    rows = np.flatnonzero([m.names[c].startswith(STEP_PREFIX) for c in m.steps.name])
    if len(rows) < 2:
        return (np.zeros(0, np.int64),) * 2 + (np.zeros(0),)
    tid = m.ops.tid[m.steps.op[rows]]
    order = np.lexsort((m.steps.start_ns[rows], tid))
    rows, tid = rows[order], tid[order]
    start, end = m.steps.end_ns[rows[:-1]], m.steps.start_ns[rows[1:]]
    keep = (tid[1:] == tid[:-1]) & (end > start)
    return tid[:-1][keep], start[keep], (end - start)[keep].astype(np.float64)


def profiler_code_kept(stacked, stackless) -> float:
    """How much of its traced time the profiler's own Python still takes without stacks: prof.step() between two
    steps (nothing else runs there) in the stackless pass over the same in the trace; 0 where either has none."""
    with_stacks = between_profiler_steps(stacked)[2].sum()
    without = between_profiler_steps(stackless)[2].sum()
    return float(min(without / with_stacks, 1.0)) if with_stacks > 0 and without > 0 else 0.0


def _held(gaps, tid: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The events on the gaps' thread that start inside a timed gap, in start order, and their gaps."""
    mine = np.flatnonzero(tid == gaps.tid)
    mine = mine[np.argsort(start[mine], kind="stable")]
    k = np.searchsorted(gaps.start_ns, start[mine], side="right") - 1
    inside = (k >= 0) & (start[mine] < gaps.end_ns[np.maximum(k, 0)])
    return mine[inside], k[inside]


def timed_costs(m, frame_ns: np.ndarray, host: tuple, gaps, kept: float = 0.0, stackless=None,
                target_ns: float | None = None, label: str | None = None) -> TimedCosts:
    """The costs of `m`'s Python events (`frame_ns`) and of its host sources (`host`: (tid, start, probed ns) each)
    with the stackless pass's `gaps` timed: each gap's loss laid where it was paid (_shares), and its recorded calls'
    probed cost times the calibrated ratio (_calibration) from their starts, packed in time order so that no share
    overlaps the next or passes the end of the run of gaps it lies in (_packed: consecutive steps' gaps run end to
    end)."""
    host_ns = tuple(cost for *_, cost in host)
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    if gaps is None:
        return TimedCosts(frame_ns, host_ns, none, None)
    summary = {"steps_matched": gaps.steps_matched, "steps": gaps.steps, "gaps": int(len(gaps.start_ns)),
               "python_events": 0, "probed_ms": 0.0, "measured_ms": 0.0, "measured_over_probed": None}
    if not len(gaps.start_ns):
        return TimedCosts(frame_ns, host_ns, none, summary)
    n = len(gaps.start_ns)
    length = gaps.end_ns - gaps.start_ns
    measured = np.clip(length - gaps.stackless_ns, 0, length)
    held, k = _held(gaps, m.frames.tid, m.frames.start_ns) if len(frame_ns) else (np.zeros(0, np.int64),) * 2
    probed = np.bincount(k, weights=frame_ns[held], minlength=n)
    with_python = probed > 0
    out = frame_ns.copy()
    if with_python.any():
        ratio = float(measured[with_python].sum() / probed[with_python].sum())
        summary.update(python_events=int(len(held)), probed_ms=round(float(probed.sum()) / 1e6, 4),
                       measured_ms=round(float(measured[with_python].sum()) / 1e6, 4),
                       measured_over_probed=round(ratio, 3))
        if probed.sum() >= RATIO_EVIDENCE_NS:
            out *= min(max(ratio, RATIO_RANGE[0]), RATIO_RANGE[1])
    out[held] = 0.0
    start, gap, share = _shares(m, gaps, held, k, frame_ns[held], measured, kept)
    left = length - np.bincount(gap, weights=share, minlength=n)
    counts, event_gap, event_start, event_cost, host_out = [], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], \
        [np.zeros(0)], []
    for tid, event_start_ns, cost in host:
        i, g = _held(gaps, tid, event_start_ns)
        event_gap.append(g)
        event_start.append(event_start_ns[i])
        event_cost.append(cost[i])
        out_cost = cost.copy()
        out_cost[i] = 0.0
        host_out.append(out_cost)
        counts.append(len(i))
    event_gap, event_start, event_cost = np.concatenate(event_gap), np.concatenate(event_start), \
        np.concatenate(event_cost)
    calibration = _calibration(m, gaps, left, np.bincount(event_gap, weights=event_cost, minlength=n), stackless,
                               target_ns, label)
    summary.update(recorded_calls=int(sum(counts)), calibration=calibration)
    start, gap = np.r_[start, event_start], np.r_[gap, event_gap]
    share = np.r_[share, event_cost * calibration.get("ratio", 1.0)]
    # the gaps of a step run end to end: a share that its gap cannot hold goes on into the next
    run = np.cumsum(np.r_[True, gaps.start_ns[1:] != gaps.end_ns[:-1]]) - 1
    first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    run_start = gaps.start_ns[first]
    run_end = gaps.end_ns[np.r_[first[1:], n] - 1]
    order = np.lexsort((start, run[gap]))
    start, gap, share = start[order], gap[order], share[order]
    starts = _packed(start, share, run[gap], run_start, run_end - run_start)
    return TimedCosts(out, tuple(host_out), (np.full(len(starts), gaps.tid, np.int64), starts, share), summary)


def _labelled_steps(m, label: str) -> tuple[int, np.ndarray, np.ndarray]:
    """The thread of `m`'s ProfilerSteps and, of those that hold a step annotation named `label` (decode_step#N),
    their starts and the next ProfilerStep's start."""
    names = [m.names[c] for c in m.steps.name]
    rows = np.flatnonzero([n.startswith(STEP_PREFIX) for n in names])
    if len(rows) < 2:
        return -1, np.zeros(0, np.int64), np.zeros(0, np.int64)
    tids = m.ops.tid[m.steps.op]
    tid = int(np.bincount(tids[rows] - tids[rows].min()).argmax() + tids[rows].min())
    rows = rows[tids[rows] == tid]
    rows = rows[np.argsort(m.steps.start_ns[rows], kind="stable")]
    lo, hi = m.steps.start_ns[rows[:-1]], m.steps.start_ns[rows[1:]]
    named = np.flatnonzero([n.startswith(label) for n in names])
    named = named[tids[named] == tid]
    holds = np.array([bool(((m.steps.start_ns[named] >= a) & (m.steps.start_ns[named] < b)).any())
                      for a, b in zip(lo.tolist(), hi.tolist())], bool)
    return tid, lo[holds], hi[holds]


def _blocked_share(m, label: str) -> float | None:
    """The median share of a `label` step that its thread spent blocked in sync calls."""
    tid, lo, hi = _labelled_steps(m, label)
    if not len(lo):
        return None
    rt = m.runtime
    sync = np.isin(rt.name, [c for c, n in enumerate(m.names) if n in SYNC_CALLS]) & (rt.tid == tid)
    at = np.searchsorted(lo, rt.start_ns[sync], side="right") - 1
    inside = (at >= 0) & (rt.start_ns[sync] < hi[np.maximum(at, 0)])
    blocked = np.bincount(at[inside], weights=(rt.end_ns - rt.start_ns)[sync][inside], minlength=len(lo))
    return float(np.median(blocked / (hi - lo)))


def _calibration(m, gaps, left_ns: np.ndarray, probed_ns: np.ndarray, stackless, target_ns: float | None,
                 label: str | None) -> dict:
    """What the recorded calls cost in this workload against their probed cost, where it can be measured: for each
    lined-up step holding a `label` annotation, its gaps' length less what they lost with stacks (`left_ns`) and
    less the profiler's own step() between steps, against the unprofiled step `target_ns`, over the gaps' calls'
    probed cost (`probed_ns`); the median over those steps, where the stackless pass's steps were host-bound."""
    if stackless is None or not target_ns or not label:
        return {"calibrated": False, "why": "no unprofiled step to measure against"}
    blocked = _blocked_share(stackless, label)
    if blocked is None:
        return {"calibrated": False, "why": f"no {label} steps in the stackless pass"}
    if blocked > HOST_BOUND_SHARE:
        return {"calibrated": False, "blocked_share": round(blocked, 3),
                "why": f"the stackless pass's steps waited on the GPU {blocked:.0%} of their time"}
    _, lo, hi = _labelled_steps(m, label)
    tid, start, own = between_profiler_steps(m)
    own_start, own_end = start[tid == gaps.tid], (start + own)[tid == gaps.tid]
    at = np.searchsorted(own_start, gaps.start_ns, side="right") - 1
    in_own = (at >= 0) & (gaps.start_ns < own_end[np.maximum(at, 0)]) if len(own_start) else \
        np.zeros(len(gaps.start_ns), bool)
    ratios = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        mine = (gaps.start_ns >= a) & (gaps.start_ns < b) & ~in_own
        if probed_ns[mine].sum() > 0:
            ratios.append((left_ns[mine].sum() - target_ns) / probed_ns[mine].sum())
    if len(ratios) < MIN_STEPS:
        return {"calibrated": False, "why": f"{len(ratios)} lined-up {label} step(s) with recorded calls, fewer than "
                                            f"{MIN_STEPS}"}
    ratio = float(np.median(ratios))
    if not RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]:  # the host's time is not what the unprofiled step measures
        return {"calibrated": False, "measured_ratio": round(ratio, 3), "blocked_share": round(blocked, 3),
                "why": f"the stackless pass's steps' host time gives {ratio:.2f}x the probed cost, outside "
                       f"{RATIO_RANGE[0]}-{RATIO_RANGE[1]}x: the unprofiled step is not the host's time"}
    return {"calibrated": True, "ratio": round(ratio, 3), "steps": len(ratios), "blocked_share": round(blocked, 3)}


def _shares(m, gaps, held: np.ndarray, gap: np.ndarray, probed: np.ndarray, measured: np.ndarray,
            kept: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each gap's cost was paid, as (start, gap, share) in start order: the profiler's own code
    (PROFILER_FRAME, its outermost frames, cut to the gaps they cross) first, its whole traced time, since an
    unprofiled run has none of it: what the gap lost (`measured`) and the share `kept` of that code's traced time
    that it still took without stacks (profiler_code_kept), which the stackless pass's length still holds; the rest
    of the loss over the gap's other Python events (`held`, in start order, and their gaps) by their probed cost, so
    that taking a function's run out of a gap takes out the part of the cost its own events paid (a pure-Python
    helper's, not a C call's beside it that the profiler barely slows)."""
    on_thread = np.flatnonzero(m.frames.tid == gaps.tid)
    on_thread = on_thread[np.argsort(m.frames.start_ns[on_thread], kind="stable")]
    own = np.array([bool(PROFILER_FRAME.search(n)) for n in m.names], bool)[m.frames.name[on_thread]]
    f_start, f_end = m.frames.start_ns[on_thread], m.frames.end_ns[on_thread]
    reach = np.maximum.accumulate(np.where(own, f_end, np.iinfo(np.int64).min)) if len(own) else f_end
    outer = own & np.r_[True, f_start[1:] >= reach[:-1]]
    p_start, p_end = f_start[outer], f_end[outer]
    # each outermost profiler frame cut to every gap it crosses
    lo = np.searchsorted(gaps.end_ns, p_start, side="right")
    hi = np.searchsorted(gaps.start_ns, p_end, side="left")
    count = np.maximum(hi - lo, 0)  # (a gap no Python event starts in is not timed: nothing of it is laid)
    piece_gap = np.repeat(lo, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
    piece_start = np.maximum(np.repeat(p_start, count), gaps.start_ns[piece_gap])
    piece_ns = (np.minimum(np.repeat(p_end, count), gaps.end_ns[piece_gap]) - piece_start).astype(np.float64)
    piece_ns[~np.isin(piece_gap, gap)] = 0.0
    per_gap = np.bincount(piece_gap, weights=piece_ns, minlength=len(measured))
    # the held events the profiler's frames hold are in their pieces
    at = np.searchsorted(p_start, m.frames.start_ns[held], side="right") - 1
    under = (at >= 0) & (m.frames.start_ns[held] < p_end[np.maximum(at, 0)]) if len(p_start) else \
        np.zeros(len(held), bool)
    rest = np.where(under, 0.0, probed)
    rest_gap = np.bincount(gap, weights=rest, minlength=len(measured))
    length = (gaps.end_ns - gaps.start_ns).astype(np.float64)
    measured = np.minimum(measured + kept * per_gap, length)
    left = np.maximum(measured - per_gap, 0.0)
    start = np.r_[piece_start, m.frames.start_ns[held]]
    gap_of = np.r_[piece_gap, gap]
    # the profiler's code takes at most its own time, unless the gap holds no other event to lay the rest on
    fill = measured / np.maximum(per_gap, 1.0)
    share = np.r_[piece_ns * np.where(rest_gap > 0, np.minimum(fill, 1.0), fill)[piece_gap],
                  rest * (left / np.maximum(rest_gap, 1e-9))[gap]]
    # a gap with no Python event to lay its loss on loses it from its start
    bare = np.flatnonzero((rest_gap <= 0) & (per_gap <= 0) & (measured > 0))
    start, gap_of, share = np.r_[start, gaps.start_ns[bare]], np.r_[gap_of, bare], np.r_[share, measured[bare]]
    order = np.lexsort((start, gap_of))
    return start[order], gap_of[order], share[order]


def _packed(start: np.ndarray, share: np.ndarray, gap: np.ndarray, gap_start: np.ndarray,
            gap_ns: np.ndarray) -> np.ndarray:
    """Where each event's share of its gap's cost is laid (events in start order, gap by gap): from its start, or
    right after the share before it where they crowd, and never so late that the gap's later shares run past its
    end."""
    at = (start - gap_start[gap]).astype(np.float64)
    first = np.r_[True, gap[1:] != gap[:-1]]
    group = np.cumsum(first) - 1
    total = np.cumsum(share)
    before = total - share
    laid = before - before[first][group]  # the gap's shares laid before this event
    in_gap = total[np.r_[np.flatnonzero(first)[1:], len(gap)] - 1][group] - before[first][group]
    # end_i = laid_i + share_i + max over the gap's earlier events j of (at_j - laid_j): one cumulative maximum over
    # all gaps, each lifted above the ones before it
    lift = (group + 1) * (2.0 * float(gap_ns.max()) + 2.0 * float(in_gap.max()) + 1.0)
    packed = np.maximum.accumulate(at - laid + lift) - lift + laid
    latest = gap_ns[gap] - (in_gap - laid)  # the last start that leaves room for the gap's later shares
    return (gap_start[gap] + np.minimum(packed, latest)).astype(np.int64)
