"""Vectorised joins: innermost enclosing interval on the same thread, and key lookups."""

from __future__ import annotations

from typing import Sequence

import numpy as np

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def thread_keys(pids: Sequence[np.ndarray], tids: Sequence[np.ndarray]) -> list[np.ndarray]:
    """One int64 per (pid, tid) pair, equal across the given tables exactly when the pair is."""
    pid, tid = np.concatenate(pids), np.concatenate(tids)
    fits = len(pid) == 0 or (
        min(pid.min(), tid.min()) >= _INT32_MIN and max(pid.max(), tid.max()) <= _INT32_MAX
    )
    if fits:
        keys = (pid << 32) | (tid & 0xFFFFFFFF)
    else:
        _, pid_code = np.unique(pid, return_inverse=True)
        tid_values, tid_code = np.unique(tid, return_inverse=True)
        keys = pid_code.astype(np.int64) * len(tid_values) + tid_code
    return np.split(keys, np.cumsum([len(p) for p in pids])[:-1])


def start_order(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """np.lexsort((-end, start)): by start, the longest first among equal starts, else as given. A stable sort of
    start alone (fast on the nearly sorted order of a trace file), then a lexsort of only the rows that share a
    start."""
    order = np.argsort(start, kind="stable")
    by_start = start[order]
    same = by_start[1:] == by_start[:-1]
    if not same.any():
        return order
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    at = np.flatnonzero(tied)  # runs of equal starts, each contiguous, in ascending start
    order[at] = order[at][np.lexsort((-end[order[at]], by_start[at]))]
    return order


def _is_sorted(values: np.ndarray) -> bool:
    return bool((values[1:] >= values[:-1]).all())


def _threshold(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """An enclosing interval must end after this: after the start, or at a zero-length event's instant."""
    return np.where(end > start, start, start - 1)


class Intervals:
    """Intervals grouped by thread key, each linked to its innermost enclosing interval.

    Interval j encloses i when j starts no later (ties: j is the longer) and ends
    after i starts (zero-length i: at or after its instant). The innermost is the
    one among those started last. When intervals overlap without nesting ("event
    bleed") that is the most recently started one still open, as a stack sweep
    would find.
    """

    def __init__(self, key: np.ndarray, start: np.ndarray, end: np.ndarray, *, sorted_by_start: bool = False) -> None:
        """sorted_by_start: rows already ordered by (start, longest first), as every model table is."""
        if sorted_by_start and _is_sorted(key):  # one thread, or threads one after the other: no copies needed
            self.order = np.arange(len(key))
            self.key, self.start, self.end = key, start, end
        else:
            self.order = np.argsort(key, kind="stable") if sorted_by_start else np.lexsort((-end, start, key))
            self.key, self.start, self.end = key[self.order], start[self.order], end[self.order]
        self.parent_sorted = self._link_parents()

    def _link_parents(self) -> np.ndarray:
        """Pointer jumping: each row starts at its predecessor and skips back, through the
        predecessors' own (possibly unfinished) skip pointers, over rows that ended too early.
        Every pointer only ever skips rows that cannot enclose it, so in-place updates stay
        correct, and the number of rounds grows with log(rows), not with rows."""
        n = len(self.key)
        threshold = _threshold(self.start, self.end)
        pointer = np.arange(-1, n - 1, dtype=np.int64)
        if n:
            pointer[np.flatnonzero(np.diff(self.key)) + 1] = -1
        active = np.flatnonzero(pointer >= 0)
        while len(active):
            active = active[self.end[pointer[active]] <= threshold[active]]
            pointer[active] = pointer[pointer[active]]
            active = active[pointer[active] >= 0]
        return pointer

    def parents(self) -> np.ndarray:
        """Per interval in the caller's order: the innermost enclosing interval, -1 at a root."""
        parent = np.full(len(self.order), -1, dtype=np.int64)
        linked = self.parent_sorted >= 0
        parent[self.order[linked]] = self.order[self.parent_sorted[linked]]
        return parent

    def innermost_enclosing(self, key: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per query interval: the innermost of these intervals on the same key enclosing it, -1 if none.

        From the last interval that started no later than the query, walk up the
        enclosing chain while the interval ended before the query started.
        """
        result = np.full(len(key), -1, dtype=np.int64)
        if len(self.key) == 0 or len(key) == 0:
            return result
        candidate = self._last_started(key, start) - 1
        threshold = _threshold(start, end)
        active = np.flatnonzero(candidate >= 0)
        while len(active):
            ended = self.end[candidate[active]] <= threshold[active]
            done = active[~ended]
            result[done] = self.order[candidate[done]]
            active = active[ended]
            candidate[active] = self.parent_sorted[candidate[active]]
            active = active[candidate[active] >= 0]
        return result

    def _last_started(self, key: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Per query: one past the last sorted interval on its key with start <= the query's
        (the first interval of its key if none); 0 where the key has no intervals (walks stop at -1)."""
        position = np.zeros(len(key), dtype=np.int64)
        by_key = np.argsort(key, kind="stable")
        sorted_keys = key[by_key]
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(sorted_keys)) + 1, [len(key)]])
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            this_key = sorted_keys[lo]
            first = np.searchsorted(self.key, this_key, side="left")
            last = np.searchsorted(self.key, this_key, side="right")
            if first == last:
                continue
            rows = by_key[lo:hi]
            after = first + np.searchsorted(self.start[first:last], start[rows], side="right")
            # a query before the key's first interval must not walk into the previous key
            position[rows] = np.where(after > first, after, 0)
        return position


def holding_any(start: np.ndarray, end: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Rows whose [start, end) holds at least one of the times: the only intervals that can enclose an instant
    query (t, t + 1), so that a few such queries need Intervals over these rows only."""
    times = np.sort(times)
    return np.searchsorted(times, start, side="left") < np.searchsorted(times, end, side="left")


def first_row_with_key(table_keys: np.ndarray, query_keys: np.ndarray) -> np.ndarray:
    """For each query key >= 0, the lowest table row holding the same key; -1 where none or key < 0."""
    if len(table_keys) == 0:
        return np.full(len(query_keys), -1, dtype=np.int64)
    order = np.argsort(table_keys, kind="stable")
    sorted_keys = table_keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, query_keys, side="left"), len(order) - 1)
    found = (sorted_keys[pos] == query_keys) & (query_keys >= 0)
    return np.where(found, order[pos], -1)


def repeated_count(keys: np.ndarray) -> int:
    """How many keys >= 0 repeat an earlier one."""
    valid = np.sort(keys[keys >= 0])
    return int((valid[1:] == valid[:-1]).sum())


def depth_from_parent(parent: np.ndarray) -> np.ndarray:
    """Number of ancestors of each row, following a parent column (-1 at roots) that has no cycles."""
    depth = np.zeros(len(parent), dtype=np.int32)
    rows = np.flatnonzero(parent >= 0)
    ancestor = parent[rows]
    while len(rows):
        depth[rows] += 1
        keep = parent[ancestor] >= 0
        rows, ancestor = rows[keep], parent[ancestor[keep]]
    return depth
