"""Where a CPU thread was parked rather than running: waiting in an event loop's selector, or waiting for another
thread to hand it work. Read from python_function frames (the profiler's with_stack), by name.

Kineto names a C call `<built-in method NAME of TYPE object at 0x...>` and a Python frame `file.py(line): func`.
"""
from __future__ import annotations

import re

import numpy as np

from analyzer.arrays import distinct
from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys

# The event loop with nothing ready to run: asyncio's selector (epoll / poll / select / kqueue) blocking.
EVENT_LOOP_WAIT = re.compile(
    r"^<built-in method (?:poll|select|control) of select\.(?:epoll|poll|devpoll|kqueue) object"
    r"|^<built-in function select>$"
    r"|(?:^|/)selectors\.py\(\d+\): select$"
)
# A thread waiting for another one: a worker pool's queue, a lock, a condition, an event, a future's result.
HANDOFF_WAIT = re.compile(
    r"^<built-in method (?:get|acquire) of _queue\.SimpleQueue object"
    r"|^<built-in method acquire of _thread\.(?:lock|RLock) object"
    r"|^<method 'acquire' of '_thread\.(?:lock|RLock)' objects>$"
    r"|(?:^|/)threading\.py\(\d+\): wait$"
    r"|(?:^|/)queue\.py\(\d+\): get$"
)


def matching_frames(model: TraceModel, pattern: re.Pattern) -> np.ndarray:
    """Rows of model.frames whose name matches."""
    frames = model.frames
    if not len(frames):
        return np.zeros(0, np.int64)
    table = np.zeros(len(model.names), bool)
    for c in present_codes(frames.name, len(model.names)).tolist():
        table[c] = bool(pattern.search(model.names[c]))
    return np.flatnonzero(table[frames.name])


def present_codes(codes: np.ndarray, n_names: int) -> np.ndarray:
    """The distinct name codes in a column (a count per code is cheaper than hashing for unique)."""
    return np.flatnonzero(np.bincount(codes, minlength=n_names)) if len(codes) else np.zeros(0, np.int64)


def covered_ns(model: TraceModel, rows: np.ndarray, pid: np.ndarray, tid: np.ndarray, lo: np.ndarray,
               hi: np.ndarray) -> np.ndarray:
    """For each query i: the ns of [lo[i], hi[i]) that thread (pid[i], tid[i]) spent inside the frames `rows`
    (nested or overlapping frames counted once)."""
    out = np.zeros(len(lo), np.int64)
    if not len(rows) or not len(lo):
        return out
    frames = model.frames
    frame_keys, query_keys = thread_keys([frames.pid[rows], pid], [frames.tid[rows], tid])
    for key in distinct(frame_keys).tolist():
        q = np.flatnonzero(query_keys == key)
        if not len(q):
            continue
        sel = rows[frame_keys == key]
        order = np.argsort(frames.start_ns[sel], kind="stable")
        merged = _merge(frames.start_ns[sel][order], frames.end_ns[sel][order])
        out[q] = _overlap(*merged, lo[q], hi[q])
    return out


def _merge(starts: np.ndarray, ends: np.ndarray):
    """Disjoint sorted intervals covering the same time as the given ones (sorted by start), with a prefix sum of
    their lengths."""
    if not len(starts):
        return starts, ends, np.zeros(1, np.int64)
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), bool)
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(starts)) - 1
    m_start, m_end = starts[first], reach[last]
    return m_start, m_end, np.concatenate(([0], np.cumsum(m_end - m_start)))


def _overlap(starts, ends, cum, lo, hi) -> np.ndarray:
    """Total overlap of each [lo, hi) with disjoint sorted intervals."""
    i0 = np.searchsorted(ends, lo, side="right")  # first interval ending after lo
    i1 = np.searchsorted(starts, hi, side="left") - 1  # last interval starting before hi
    total = np.zeros(len(lo), np.int64)
    ok = i0 <= i1
    a, b = i0[ok], i1[ok]
    full = cum[b + 1] - cum[a]
    head = np.maximum(0, lo[ok] - starts[a])
    tail = np.maximum(0, ends[b] - hi[ok])
    total[ok] = full - head - tail
    return total
