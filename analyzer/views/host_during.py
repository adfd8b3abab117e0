"""What the launching thread was doing during each long idle piece, read from what the trace recorded on it: the
innermost Python frame, op and runtime call that span the whole piece (its context), and how much of the piece
recorded events that ended inside it cover (its traced share). A piece with a low traced share is untraced host
time: the interpreter's own bytecode, a JIT compiler, the GIL, the OS; the trace cannot say which, but for one record
the profiler writes there (with profile_memory=True): the largest host tensor allocated or released on the thread inside
the piece. Releasing a large host tensor is the OS's work (unmapping its pages; a DataLoader worker's batch lives in
shared memory, whose release costs milliseconds) and runs outside every op. A library op that began inside the piece
and still ran at its end (its launch ended the piece) covers the piece from its start: that is the op's own host work.

It also finds untraced time that a warmed-up process would not spend again, by what follows it:
- the first launch in the window of a kernel built at run time (Triton / Inductor, TorchScript's fusers: named so by
  their builders, launched through the driver API, cuLaunchKernel / hipModuleLaunchKernel): the compile before it;
- the first call on the thread of a scripted or compiled function (an op outside every `namespace::`, e.g. a
  TorchScript function or a torch.compile region): what its first calls do (profiling runs, optimization, compile).
- a run of a kernel whose later runs do not wait a tenth as long, where no earlier run of it waited less (it was not
  yet steady: the first run, or the runs of a compile's autotuning): the same work needed the wait once; only in a
  window with steps (without them, one wait before a kernel shows nothing about the next iteration);
- any untraced wait in a cold step (a process's first iteration, at least half of it idle on one-time costs) that
  the later steps do not repeat.
None where a later run of the same kernel waited a tenth as long or more: that wait recurs, whatever it is.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable

import numpy as np

from analyzer.trace import TraceModel
from analyzer.trace.joins import Intervals, holding_any, thread_keys
from analyzer.units import short_kernel_name
from analyzer.views.frames import parse_frame
from analyzer.views.timeline import merge_intervals
from analyzer.views.waits import EVENT_LOOP_WAIT, HANDOFF_WAIT, present_codes

LONG_NS = 1_000_000  # a piece this long is worth describing (the host-work threshold)
TRACED_SHARE = 0.5  # below this share covered by recorded events inside the piece, it is untraced host time
HOST_MEMORY_BYTES = 1 << 20  # a host allocation or release this large can take the OS a millisecond
RECURRING = 10
WHOLE_RECORDING_NS = 1_000_000  # a frame this near both ends of the recording spans it whole (a stack open at start)
COLD_SHARE = 0.5  # a step at least this share of whose CPU span the GPU sat idle on one-time costs is cold
# kernels built at run time, by their builders' names: Triton / Inductor, TorchScript's NNC (`fused_*`), nvFuser
BUILT_KERNEL = re.compile(r"^(?:triton_|triton__|fused_|nvfuser_|kernel\d+$|CudaCodeGen)")
DRIVER_LAUNCH = frozenset({"cuLaunchKernel", "cuLaunchKernelEx", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel"})


@dataclasses.dataclass(frozen=True)
class HostDuring:
    pieces: np.ndarray  # the idle pieces described (index into IdlePieces)
    frame: np.ndarray  # innermost Python frame spanning the whole piece on the launching thread, -1 none
    op: np.ndarray  # innermost op (annotations included) spanning it, -1 none
    call: np.ndarray  # runtime call spanning it, -1 none
    tail_op: np.ndarray  # a library op that began inside it and still ran at its end (_tail_op), -1 none
    traced_share: np.ndarray  # share of the piece covered by events that ended inside it, or by its tail op
    untraced: np.ndarray  # bool: untraced host time (below)
    host_memory: np.ndarray  # the largest host (CPU) [memory] event on the thread inside the piece, -1 none
    other_frame: np.ndarray  # another thread of the process running Python over the piece (its innermost frame at
    # the piece's middle, a Python function's, not a wait), -1 none: while that thread runs bytecode it holds the GIL
    held: np.ndarray  # bool: the launching thread waited for the GIL that thread held: the piece is untraced, or at
    # least TRACED_SHARE of it is a torch binding's way back into Python after its ops ended (_binding_waits)
    binding: np.ndarray  # for the latter: the binding's frame (the longest wait in the piece), -1 otherwise

    def of(self, piece: int) -> int:
        """Position of an idle piece in these arrays, -1 if it is not described."""
        i = int(np.searchsorted(self.pieces, piece))
        return i if i < len(self.pieces) and self.pieces[i] == piece else -1


def host_during(model: TraceModel, gaps, idle, pieces: np.ndarray) -> HostDuring:
    pieces = np.sort(np.asarray(pieces, np.int64))
    rt = model.runtime
    launch = gaps.thread_row[idle.gap[pieces]] if len(pieces) else np.zeros(0, np.int64)
    known = launch >= 0
    pieces, launch = pieces[known], launch[known]
    lo, hi = idle.start_ns[pieces], idle.end_ns[pieces]
    if not len(pieces) or not len(rt):
        empty = np.zeros(0, np.int64)
        return HostDuring(empty, empty, empty, empty, empty, np.zeros(0), np.zeros(0, bool), empty, empty,
                          np.zeros(0, bool), empty)
    pid, tid = rt.pid[launch], rt.tid[launch]
    tables = (model.frames, model.ops, rt)
    frame, op, call = (_spanning(table, pid, tid, lo, hi) for table in tables)
    tail = _tail_op(model, pid, tid, lo, hi)
    share = _covered_inside(tables, pid, tid, lo, hi)
    # the tail op's time in the piece is its own C++ code: recorded (the events that ended inside it are its children)
    has = tail >= 0
    share[has] = np.maximum(share[has], hi[has] - model.ops.start_ns[tail[has]])
    share = share / np.maximum(hi - lo, 1)
    untraced = _untraced(model, frame, op, call, share)
    other = _other_thread_running(model, pid, tid, lo, hi)
    held, binding = (other >= 0) & untraced, np.full(len(lo), -1, np.int64)
    ask = np.flatnonzero((other >= 0) & ~untraced)  # most traces: none, and the op table is not walked
    if len(ask):
        waited, longest = _binding_waits(model, pid[ask], tid[ask], lo[ask], hi[ask])
        held[ask] = waited >= TRACED_SHARE * (hi[ask] - lo[ask])
        binding[ask] = np.where(held[ask], longest, -1)
    return HostDuring(pieces, frame, op, call, tail, share, untraced,
                      _largest_host_memory(model.memory, pid, tid, lo, hi), other, held, binding)


def _binding_waits(model: TraceModel, pid, tid, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """Per piece: ns of it (and the frame with the longest such stretch, -1 none) that the thread spent in a C
    function's frame after the last op that function
    dispatched had ended (a torch binding: its ops release the GIL while they run, and returning to Python needs
    it back: with another thread running bytecode, that is a wait for the GIL; the binding's own C++ after its
    op takes microseconds). A C function with no op inside (numpy, a tokenizer's native code) may be doing its own
    work: not counted."""
    frames, ops, names = model.frames, model.ops, model.names
    out, longest = np.zeros(len(lo), np.int64), np.full(len(lo), -1, np.int64)
    has_op = ops.frame >= 0
    if not len(lo) or not has_op.any():
        return out, longest
    last_op_end = np.full(len(frames), -1, np.int64)
    np.maximum.at(last_op_end, ops.frame[has_op], ops.end_ns[has_op])
    c_code = np.zeros(len(names), bool)
    for c in present_codes(frames.name, len(names)).tolist():
        c_code[c] = names[c].startswith(("<built-in", "<method"))
    binding = np.flatnonzero((last_op_end >= 0) & c_code[frames.name])
    if not len(binding):
        return out, longest
    tail_start, tail_end = np.maximum(last_op_end[binding], frames.start_ns[binding]), frames.end_ns[binding]
    for i in range(len(lo)):
        mine = np.flatnonzero((frames.pid[binding] == pid[i]) & (frames.tid[binding] == tid[i])
                              & (tail_start < hi[i]) & (tail_end > lo[i]))
        if len(mine):
            stretch = np.minimum(tail_end[mine], hi[i]) - np.maximum(tail_start[mine], lo[i])
            out[i], longest[i] = int(stretch.sum()), int(binding[mine[np.argmax(stretch)]])
    return out, longest


def _other_thread_running(model: TraceModel, pid, tid, lo, hi) -> np.ndarray:
    """Per piece: the innermost frame, at the piece's middle, of another thread of its process whose innermost frame
    there is a Python function's (running bytecode, so holding the GIL; a C call may have released it) and not a wait
    (a queue, a lock, an event loop's selector), spanning at least half of the piece; where several threads qualify,
    the one whose frame spans most of it. -1 none. A frame open through the whole recording is left out: the
    profiler writes the stacks threads were in when it started as frames from its start to its stop, whatever
    those threads then did (blocked in C, most often)."""
    frames, names = model.frames, model.names
    out = np.full(len(lo), -1, np.int64)
    if not len(frames) or not len(lo):
        return out
    mid = lo + (hi - lo) // 2
    best = np.zeros(len(lo), np.int64)
    running = _running_names(names, frames.name)
    first, last = int(frames.start_ns.min()), int(frames.end_ns.max())
    edge = max(WHOLE_RECORDING_NS, (last - first) // 100)
    whole = (frames.start_ns - first <= edge) & (last - frames.end_ns <= edge)
    (keys,) = thread_keys([frames.pid], [frames.tid])
    _, first = np.unique(keys, return_index=True)
    for p, t in zip(frames.pid[first].tolist(), frames.tid[first].tolist()):
        mine = np.flatnonzero((pid == p) & (tid != t))
        if not len(mine):
            continue
        row = _spanning(frames, np.full(len(mine), p), np.full(len(mine), t), mid[mine], mid[mine] + 1)
        ok = row >= 0
        span = np.where(ok, np.minimum(frames.end_ns[np.maximum(row, 0)], hi[mine])
                        - np.maximum(frames.start_ns[np.maximum(row, 0)], lo[mine]), 0)
        safe = np.maximum(row, 0)
        ok &= running[frames.name[safe]] & ~whole[safe] & (2 * span >= hi[mine] - lo[mine]) & (span > best[mine])
        out[mine[ok]], best[mine[ok]] = row[ok], span[ok]
    return out


def _running_names(names: tuple[str, ...], codes: np.ndarray) -> np.ndarray:
    """Per name code: a Python function's frame (`file(line): func`) that is not a wait."""
    table = np.zeros(len(names), bool)
    for c in present_codes(codes, len(names)).tolist():
        n = names[c]
        table[c] = parse_frame(n) is not None and not HANDOFF_WAIT.search(n) and not EVENT_LOOP_WAIT.search(n)
    return table


def _tail_op(model: TraceModel, pid, tid, lo, hi) -> np.ndarray:
    """Per piece: a library op (`ns::name`, not an annotation) on its thread that began inside the piece and still ran
    at its end: the innermost such op holding at least TRACED_SHARE of the piece, else the outermost; -1 none. Its
    launch is what ended the piece, and the piece's time from the op's start is that op's own host work before it
    (e.g. a GEMM choosing its kernel for a new shape), not untraced time."""
    ops, names = model.ops, model.names
    inner = _spanning(ops, pid, tid, np.maximum(hi - 1, lo), hi)  # the innermost op open at the piece's end
    out = np.full(len(lo), -1, np.int64)
    for i in np.flatnonzero(inner >= 0).tolist():
        r, hops = int(inner[i]), 0
        while r >= 0 and ops.start_ns[r] >= lo[i] and hops < 256:
            if not ops.is_annotation[r] and "::" in names[ops.name[r]]:
                out[i] = r
                if hi[i] - ops.start_ns[r] >= TRACED_SHARE * (hi[i] - lo[i]):
                    break
            r, hops = int(ops.parent[r]), hops + 1
    return out


def _largest_host_memory(mem, pid, tid, lo, hi) -> np.ndarray:
    """Per piece: the [memory] event of at least HOST_MEMORY_BYTES on the host (device type 0) with the largest size,
    on the piece's thread inside [lo, hi], -1 none."""
    out = np.full(len(lo), -1, np.int64)
    big = np.flatnonzero((mem.device_type == 0) & (np.abs(mem.bytes) >= HOST_MEMORY_BYTES) & ~mem.is_oom) \
        if len(mem) else np.zeros(0, np.int64)
    if not len(big):
        return out
    big = big[np.argsort(mem.ts_ns[big], kind="stable")]
    ts = mem.ts_ns[big]
    for i in range(len(lo)):
        rows = big[np.searchsorted(ts, lo[i], "left"):np.searchsorted(ts, hi[i], "right")]
        rows = rows[(mem.pid[rows] == pid[i]) & (mem.tid[rows] == tid[i])]
        if len(rows):
            out[i] = rows[np.argmax(np.abs(mem.bytes[rows]))]
    return out


def _untraced(model: TraceModel, frame, op, call, share) -> np.ndarray:
    """Untraced host time: under TRACED_SHARE covered by events that ended inside it, and not inside a recorded
    C++ call that spans it (a library op `ns::name`, a C function's frame `<built-in ...>`, a runtime call): that one's
    own code is what ran. A step annotation or a scripted function (an op outside every namespace, e.g. a TorchScript
    function) spanning it does not say what ran."""
    names = model.names
    ops, frames = model.ops, model.frames
    in_op = np.zeros(len(op), bool)
    for i in np.flatnonzero(op >= 0).tolist():
        in_op[i] = not ops.is_annotation[op[i]] and "::" in names[ops.name[op[i]]]
    in_c = np.zeros(len(frame), bool)
    for i in np.flatnonzero(frame >= 0).tolist():
        in_c[i] = names[frames.name[frame[i]]].startswith(("<built-in", "<method"))
    return (share < TRACED_SHARE) & ~in_op & ~in_c & (call < 0)


def _spanning(table, pid, tid, lo, hi) -> np.ndarray:
    """Per piece: the innermost row of the table on its thread spanning it, -1 none. Only rows holding a piece's
    start can span one (joins.holding_any), so the join runs over those alone."""
    near = np.flatnonzero(holding_any(table.start_ns, table.end_ns, lo)) if len(table) else np.zeros(0, np.int64)
    if not len(near):
        return np.full(len(lo), -1, np.int64)
    keys, query = thread_keys([table.pid[near], pid], [table.tid[near], tid])
    found = Intervals(keys, table.start_ns[near], table.end_ns[near], sorted_by_start=True).innermost_enclosing(
        query, lo, hi)
    row = np.where(found >= 0, near[np.maximum(found, 0)], -1)
    # that is the innermost holding the piece's start: up its parents (frames, ops) to one that also holds its end
    parent = getattr(table, "parent", None)
    for i in np.flatnonzero(row >= 0).tolist():
        r, hops = int(row[i]), 0
        while r >= 0 and table.end_ns[r] < hi[i] and hops < 256:
            r, hops = (int(parent[r]) if parent is not None else -1), hops + 1
        row[i] = r if r >= 0 and table.end_ns[r] >= hi[i] else -1
    return row


def _covered_inside(tables, pid, tid, lo, hi) -> np.ndarray:
    """Per piece: the ns of [lo, hi) covered by recorded events (of any table) on its thread that ended inside it:
    work the thread finished there. An event still running at the piece's end is where the launch came from, and
    one spanning the whole piece is its context; neither says what the thread did in the piece. Nor does an
    annotation (a step, a record_function range) that ended in it: it marks where the thread was, not what ran."""
    # only events that end inside some piece (on any thread) take part: a search in the pieces' union
    u_start, u_end = merge_intervals(lo, hi)
    inside = []
    for t in tables:
        k = np.searchsorted(u_start, t.end_ns, side="right") - 1
        ends_inside = (k >= 0) & (t.end_ns < u_end[np.maximum(k, 0)])
        if hasattr(t, "is_annotation"):
            ends_inside &= ~t.is_annotation.astype(bool)
        inside.append(np.flatnonzero(ends_inside))
    starts = np.concatenate([t.start_ns[r] for t, r in zip(tables, inside)])
    ends = np.concatenate([t.end_ns[r] for t, r in zip(tables, inside)])
    ev_key, q_key = thread_keys([np.concatenate([t.pid[r] for t, r in zip(tables, inside)]), pid],
                                [np.concatenate([t.tid[r] for t, r in zip(tables, inside)]), tid])
    by_end = np.lexsort((ends, ev_key))
    ke, e_sorted = ev_key[by_end], ends[by_end]
    out = np.zeros(len(lo), np.int64)
    for i in range(len(lo)):
        k, a, b = q_key[i], lo[i], hi[i]
        j0, j1 = np.searchsorted(ke, k, "left"), np.searchsorted(ke, k, "right")
        lo_i = j0 + np.searchsorted(e_sorted[j0:j1], a, "right")
        rows = by_end[lo_i:j0 + np.searchsorted(e_sorted[j0:j1], b, "left")]
        if not len(rows):
            continue
        seg_s, seg_e = np.maximum(starts[rows], a), ends[rows]
        order = np.argsort(seg_s, kind="stable")
        seg_s, seg_e = seg_s[order], seg_e[order]
        reach = np.maximum.accumulate(seg_e)
        first = np.flatnonzero(np.r_[True, seg_s[1:] > reach[:-1]])
        last = np.r_[first[1:], len(seg_s)] - 1
        out[i] = int((reach[last] - seg_s[first]).sum())
    return out


def one_time_untraced(model: TraceModel, gaps, idle, during: HostDuring, outermost_ops: np.ndarray,
                      first_invocations: Callable[[], np.ndarray], steps, recurring_spans,
                      starts_up: bool = False) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """The described pieces of untraced host time that a warmed-up process would not spend again (the rules in this
    module's docstring), and per piece its (kind, what) for the report: ("cold step", ...), ("JIT compilation",
    "before the first launch of <kernel>"), ("first run", ...) or ("first call", op). first_invocations is called
    only where a piece needs it (a sort of every outermost op). starts_up: the window holds its process's start-up
    (analyzer.views.onetime.start_up_calls), which, without steps, says what a kernel's first wait is."""
    rt, gpu, ops, names = model.runtime, model.gpu, model.ops, model.names
    first_invocations = functools.cache(first_invocations)
    untraced = np.flatnonzero(during.untraced)
    out, why = [], []
    if not len(untraced):
        return np.zeros(0, np.int64), why
    first_kernel = _first_of_name(gpu)
    driver = np.array([n in DRIVER_LAUNCH for n in names], bool)
    built = np.array([bool(BUILT_KERNEL.match(n)) for n in names], bool)
    wait_before = np.zeros(len(gpu), np.int64)  # the longest idle gap that each GPU row ended
    ends = gaps.next_gpu >= 0  # (the window's tail ends no work)
    np.maximum.at(wait_before, gaps.next_gpu[ends], (gaps.end_ns - gaps.start_ns)[ends])
    # the step that launched each GPU row (by time where the trace has no steps: each launch its own "step")
    linked = gpu.launch >= 0
    launched_at = np.where(linked, rt.start_ns[np.maximum(gpu.launch, 0)], gpu.start_ns) if len(rt) else gpu.start_ns
    step_of = steps.index_at(launched_at) if len(steps) else launched_at
    cold, piece_step = _cold_steps(idle, steps, during, recurring_spans)
    for i in untraced.tolist():
        piece = int(during.pieces[i])
        g = int(idle.gap[piece])
        nxt, launch = int(gaps.next_gpu[g]), int(gaps.launch[g])
        k = int(piece_step[i])
        if k >= 0 and cold[k]:
            out.append(piece)
            why.append(("cold step", f"in {steps.names[k]}, a cold step (later steps have no such wait)"))
            continue
        dur = idle.end_ns[piece] - idle.start_ns[piece]
        if nxt < 0 or gaps.end_ns[g] - idle.end_ns[piece] > dur:  # (the window's tail: no work follows it)  # only untraced time that (nearly) runs up to the next work
            continue
        # the same kernel's runs launched in later steps: where one waited as long (a tenth or more), the wait
        # recurs and is not one-time; where none did, the first step's wait was a first-run cost
        same = gpu.name == gpu.name[nxt]
        later = np.flatnonzero(same & (step_of > step_of[nxt]))
        if len(later) and wait_before[later].max() * RECURRING >= dur:
            continue
        if first_kernel[nxt] and driver[rt.name[launch]] and built[gpu.name[nxt]]:
            out.append(piece)
            why.append(("JIT compilation", f"before the first launch of {short_kernel_name(names[gpu.name[nxt]])}"))
            continue
        # ... and it is not yet steady: every earlier run of it waited about as long (none is the first run); only
        # where steps say what "later" is, or the window holds the process's start-up: otherwise, in a window
        # without steps, a single wait before a kernel shows nothing
        earlier = np.flatnonzero(same & (step_of < step_of[nxt]))
        if (len(steps) or starts_up) and len(later) and not (wait_before[earlier] * RECURRING < dur).any():
            out.append(piece)
            which = "the first run" if not len(earlier) else f"run {len(earlier) + 1}"
            why.append(("first run", f"before {which} of {short_kernel_name(names[gpu.name[nxt]])} (its {len(later)} later "
                                     f"runs did not wait)"))
            continue
        op = int(rt.op[launch])
        outer = int(outermost_ops[op]) if op >= 0 else -1
        if outer >= 0 and "::" not in names[ops.name[outer]] and outer in first_invocations():
            out.append(piece)
            why.append(("first call", names[ops.name[outer]]))
    order = np.argsort(out, kind="stable")
    return np.asarray(out, np.int64)[order], [why[i] for i in order.tolist()]


def cold_steps(idle, steps, recurring_spans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per step: at least COLD_SHARE of its CPU span the GPU sat idle on one-time costs (warm-up pieces, less those
    inside compiles that recur: recompiles are the loop's own)."""
    from analyzer.views.idle import WARMUP  # the idle module's cause codes (host_during is computed inside it)
    if not len(steps):
        return np.zeros(0, bool)
    warm = np.flatnonzero(idle.cause == WARMUP)
    s, e = recurring_spans
    if len(s) and len(warm):
        mid = idle.start_ns[warm] + idle.duration_ns[warm] // 2
        i = np.searchsorted(s, mid, side="right") - 1
        warm = warm[~((i >= 0) & (mid < e[np.maximum(i, 0)]))]
    at = steps.index_at(idle.start_ns[warm])
    one_time = np.bincount(at[at >= 0], weights=idle.duration_ns[warm][at >= 0], minlength=len(steps))
    return one_time >= COLD_SHARE * np.maximum(steps.hi_ns - steps.lo_ns, 1)


def _cold_steps(idle, steps, during: HostDuring, recurring_spans) -> tuple[np.ndarray, np.ndarray]:
    """Per step: cold (cold_steps), with a later step that is not, and whose untraced waits the later steps do not
    repeat (none of theirs a tenth as long as its longest); and per described piece its step (-1 outside every
    step)."""
    if not len(steps):
        return np.zeros(0, bool), np.full(len(during.pieces), -1, np.int64)
    cold = cold_steps(idle, steps, recurring_spans)
    piece_step = steps.index_at(idle.start_ns[during.pieces]) if len(during.pieces) else np.zeros(0, np.int64)
    untraced = during.untraced
    longest = np.zeros(len(steps), np.int64)
    mine = untraced & (piece_step >= 0)
    np.maximum.at(longest, piece_step[mine], idle.duration_ns[during.pieces[mine]])
    later_warm = np.r_[np.maximum.accumulate((~cold)[::-1])[::-1][1:], False]  # a step after it is not cold
    later_longest = np.r_[np.maximum.accumulate(longest[::-1])[::-1][1:], 0]
    return cold & later_warm & (later_longest * RECURRING < np.maximum(longest, 1)), piece_step


def _first_of_name(gpu) -> np.ndarray:
    """Per GPU row: the first activity of its name in the window."""
    first = np.zeros(len(gpu), bool)
    if len(gpu):
        order = np.lexsort((gpu.start_ns, gpu.name))
        new = np.r_[True, gpu.name[order][1:] != gpu.name[order][:-1]]
        first[order[new]] = True
    return first


def first_invocations(model: TraceModel, outermost_ops: np.ndarray) -> np.ndarray:
    """Rows of outermost ops that are the first of their name on their thread (sorted)."""
    ops = model.ops
    if not len(ops):
        return np.zeros(0, np.int64)
    rows = np.flatnonzero(outermost_ops == np.arange(len(ops)))
    if not len(rows):
        return rows
    (key,) = thread_keys([ops.pid[rows]], [ops.tid[rows]])
    order = np.lexsort((ops.start_ns[rows], ops.name[rows], key))
    k, n = key[order], ops.name[rows][order]
    new = np.r_[True, (k[1:] != k[:-1]) | (n[1:] != n[:-1])]
    return np.sort(rows[order[new]])
