"""Which part of a step CUDA graphs can replay: the iterations of a loop inside the step, where it has one.

A graph holds the GPU work between two host syncs (a host read cannot be captured) and is replayed for work that
recurs with the same shapes. A decode loop whose step is one forward graphs the whole step. A step with a loop of
its own (transformers' generate(): a prefill forward, then a decode forward per token, each iteration ended by the
host's stopping check) graphs the loop's iterations: the segments between the step's host syncs whose kernel
sequences recur within the step. The segments that run once per step (the prefill, whose shapes differ) stay eager,
as every engine that graphs decode leaves them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.views.replay import ReplayModel

SAME_KERNELS = 0.05  # two segments recur when at most this share of their kernels differ position by position
# (an elementwise kernel picked by its operand's alignment flips from one token to the next)
LOOP_SHARE = 0.5  # the loop's iterations must hold at least this share of the step's launches


@dataclasses.dataclass(frozen=True)
class InnerLoop:
    """The activities graphs would replay and the CPU time their launches no longer take."""
    graphed: np.ndarray  # bool per replay-model activity
    first: np.ndarray  # bool: the first activity of its graph (launched by the graph launch that stays)
    removed: np.ndarray  # (tid, start_ns, end_ns): each iteration's launches after its first
    segments: int  # per step (median): the segments between host syncs that recur
    share: float  # of the steps' launches

    def gap_ns(self, model: ReplayModel, node_gap_ns: int) -> np.ndarray:
        """The replay's per-activity gap after the previous one on its stream, a graph node's inside a graph."""
        return np.where(self.graphed & ~self.first, np.minimum(model.gap_ns, node_gap_ns), model.gap_ns)


def inner_loop(model: ReplayModel, steps: np.ndarray, names: np.ndarray,
               launch_end_ns: np.ndarray) -> InnerLoop | None:
    """The inner loop of the measured steps, or None where one of them has none (the whole step is the graph).
    `names`: each replay-model activity's name code; `launch_end_ns`: when its launch call returned."""
    graphed = np.zeros(len(model.rows), bool)
    first = np.zeros(len(model.rows), bool)
    removed, segments, looped, total = [], [], 0, 0
    near = np.flatnonzero((model.step >= steps.min()) & (model.step <= steps.max())) if len(steps) else \
        np.zeros(0, np.int64)  # a long trace's measured steps are its first ones: sort only theirs
    by_step = near[np.lexsort((model.launch_ns[near], model.step[near]))]  # a step's activities in launch order
    bounds = np.searchsorted(model.step[by_step], np.stack([steps, steps + 1]))
    step_syncs = model.sync_start_ns[(model.sync_thread == model.step_thread) & (model.sync_follows < 0)]  # in order
    for k, a, b in zip(steps.tolist(), bounds[0].tolist(), bounds[1].tolist()):
        mine = by_step[a:b]
        if not len(mine):
            return None
        syncs = step_syncs[np.searchsorted(step_syncs, model.step_lo_ns[k]):
                           np.searchsorted(step_syncs, model.step_hi_ns[k])]
        segment = np.searchsorted(syncs, model.launch_ns[mine], side="left")
        cuts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1], True])
        parts = [mine[a:b] for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())]
        recurring = _recurring(parts, names)
        in_loop = sum(len(p) for p, r in zip(parts, recurring) if r)
        if in_loop < LOOP_SHARE * len(mine):
            return None
        looped, total = looped + in_loop, total + len(mine)
        segments.append(sum(recurring))
        for part, r in zip(parts, recurring):
            if not r:
                continue
            graphed[part] = True
            first[part[0]] = True
            for code in np.unique(model.thread[part]).tolist():
                on = part[model.thread[part] == code]
                if code >= 0 and len(on) > 1:
                    removed.append((int(model.tids[code]), int(launch_end_ns[on[0]]), int(launch_end_ns[on].max())))
    return InnerLoop(graphed, first, np.asarray(removed, np.int64).reshape(-1, 3), int(np.median(segments)),
                     looped / total)


def _recurring(parts: list[np.ndarray], names: np.ndarray) -> list[bool]:
    """Per segment: whether another segment of the step has the same kernels (up to SAME_KERNELS of them)."""
    seqs = [names[p] for p in parts]
    by_length: dict[int, list[list[int]]] = {}  # segment indexes, the first one the group's representative
    for i, seq in enumerate(seqs):
        groups = by_length.setdefault(len(seq), [])
        for g in groups:
            if np.count_nonzero(seqs[g[0]] != seq) <= SAME_KERNELS * len(seq):
                g.append(i)
                break
        else:
            groups.append([i])
    recurring = [False] * len(parts)
    for g in (g for groups in by_length.values() for g in groups):
        if len(g) > 1:
            for i in g:
                recurring[i] = True
    return recurring
