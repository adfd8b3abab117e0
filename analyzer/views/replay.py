"""The replay model of a trace: the GPU streams' activities and the CPU threads that launched them, with the
constraints that put each activity where it ran, so that the trace can be replayed with CPU time taken out.

GPU side, per stream: an activity starts at max(its launch + L, the previous end on its stream + q), where L and q
come from the trace so that the unchanged replay reproduces it exactly. One that started right after its stream's
previous activity is stream-bound (q = the observed gap; L = the trace's typical launch latency, capped at the
observed one); one that started after a gap is launch-bound (L = the observed latency; q = the stream's typical
back-to-back gap, capped at the observed one). One that neither explains (it waited on another stream's event) has
the same form: it keeps its observed delay from its launch. A graph replay falls out: its first activity is
launch-bound, the rest stream-bound. Activities launched before the window began stay where they ran.

CPU side, per thread: the calls keep their durations and order, except blocking calls (synchronize, synchronous or
pageable copies, cudaFree), which split into the wait for the GPU work launched before them (on their device, or
their stream where the trace says which) and their own cost. Taking CPU time out shifts everything after it on the
thread earlier, until a blocking call whose GPU work is not done absorbs the shift. A wait for something outside the
trace (a DataLoader's worker processes) is a blocking call of its own that ends no earlier than what it waited for
was ready in the trace (asking earlier does not make the batch arrive sooner), plus its own work, which the
profiler's cost inside it shortens; a call that did not wait is only its own work. Between two blocking calls each
thread's shift is constant, so the replay runs one chunk per blocking call, each chunk's stream recurrences
vectorized: with c = cumsum(q + d), end_i = c_i + max(the stream's end before the chunk, cummax(ready + d - c)).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.arrays import distinct
from analyzer.trace import GpuKind, TraceModel
from analyzer.trace.joins import thread_keys
from analyzer.views.steps import StepRanges
from analyzer.views.timeline import activity_mask, merge_intervals

NEVER = -(1 << 62)  # before every time of a trace, with room to add durations to it
JOIN_ROWS = -(1 << 40)  # sync_rows of the hand-offs between threads: JOIN_ROWS - k (outside waits: -1 - k)
STREAM_BOUND, LAUNCH_BOUND, WAITS, FIXED = range(4)
BOUNDS = ("stream", "launch", "waits", "fixed")  # names of the `bound` codes
# A gap at most this much above the stream's typical back-to-back gap still counts as back to back (a graph's
# kernels leave up to ~5 µs between them on an H200), and a latency this much above the typical one is a wait.
SLACK_NS = 10_000
# A launch call this long did more than launch (lazy module loading, a JIT compile at the first launch): time taken
# out inside it moves its activity too.
LONG_LAUNCH_NS = 1_000_000
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
SYNCING_FREES = frozenset({"cudaFree", "hipFree", "cuMemFree"})  # they synchronize the device before freeing


@dataclasses.dataclass(frozen=True)
class Replayed:
    """One replay: the times it gives, or only `limits` (why the model cannot replay this trace)."""
    limits: tuple[str, ...]
    gpu_start_ns: np.ndarray | None = None  # per model.gpu row; rows that are not activities keep their times
    gpu_end_ns: np.ndarray | None = None
    runtime_start_ns: np.ndarray | None = None  # per model.runtime row
    runtime_end_ns: np.ndarray | None = None
    step_gpu_period_ns: np.ndarray | None = None  # per step: its GPU work's start to the next step's; -1 none
    step_cpu_wall_ns: np.ndarray | None = None  # per step: its CPU span [lo, hi)
    step_cpu_end_ns: np.ndarray | None = None  # per step: when its CPU span ends (hi)


@dataclasses.dataclass(frozen=True, repr=False)
class ReplayModel:
    limits: tuple[str, ...]  # empty when the model can replay the trace
    tids: np.ndarray  # thread code -> tid: every thread with runtime calls, then the steps' thread
    runtime_rows: tuple[np.ndarray, ...]  # per thread code: its runtime rows
    # GPU activities, ordered by stream then start
    rows: np.ndarray  # model.gpu rows
    stream: np.ndarray  # stream code (index into stream_device / stream_id)
    thread: np.ndarray  # the launching thread's code; -1: launched before the window began
    launch_ns: np.ndarray  # the launch call's start; NEVER where there is none
    cut_at_ns: np.ndarray  # where CPU time taken out stops moving the activity: the launch call's start, or, for a
    # launch call that itself ran long (a module loaded, a kernel compiled at its first launch), its end
    ready_ns: np.ndarray  # launch + L: the earliest start its launch allows (its own start where FIXED)
    duration_ns: np.ndarray
    gap_ns: np.ndarray  # q: the least time after the previous activity on the stream ends
    bound: np.ndarray  # int8: what held its start in the trace (BOUNDS)
    step: np.ndarray  # the step whose CPU time launched it, -1 none
    stream_device: np.ndarray
    stream_id: np.ndarray
    # blocking calls in time order
    sync_rows: np.ndarray  # model.runtime rows; -1 - k: the k-th wait for something outside the trace
    sync_thread: np.ndarray
    sync_start_ns: np.ndarray
    sync_end_ns: np.ndarray
    sync_wait_ns: np.ndarray  # the part of the call spent waiting for the GPU
    sync_cost_ns: np.ndarray  # the rest: the call's own cost, after the GPU work was done
    sync_skew_ns: np.ndarray  # how far the GPU work ended after the call returned (clock skew), kept in replays
    sync_scopes: tuple[np.ndarray, ...]  # the stream codes each one waits on
    sync_ready_ns: np.ndarray  # when what it waits for outside the GPU is ready (NEVER: nothing outside); for a
    # join, when its thread went idle before it (NEVER: it had not run)
    sync_follows: np.ndarray  # a hand-off between threads (a zero-length join): the thread code it joins; -1 none
    sync_handed_ns: np.ndarray  # for a join: when the other thread handed over (its last event before it)
    # steps (analyzer.views.steps)
    step_lo_ns: np.ndarray
    step_hi_ns: np.ndarray
    step_thread: int  # thread code of the steps' annotations, -1 none
    # the trace's own times, for what a replay leaves in place
    gpu_start_ns: np.ndarray
    gpu_end_ns: np.ndarray
    runtime_start_ns: np.ndarray
    runtime_end_ns: np.ndarray

    def __repr__(self) -> str:
        return (f"ReplayModel(activities={len(self.rows)}, streams={len(self.stream_device)}, threads={len(self.tids)}, "
                f"blocking={len(self.sync_rows)}, limits={self.limits})")

    def run(self, removed=(), no_wait=(), overhead=(), cpu: bool = True, until_ns: int | None = None,
            gap_ns: np.ndarray | None = None) -> Replayed:
        """Replay the trace with CPU time taken out: `removed`, (tid, start_ns, end_ns) intervals cut from their
        thread's timeline; `no_wait`, runtime rows of blocking calls that no longer wait for the GPU (their cost
        stays). A blocking call that starts inside a removed interval goes with it, wait included. `overhead`:
        intervals cut like `removed`, but the blocking calls inside them stay (the profiler's own cost), or the
        same already cut (`cut(intervals)`, to replay one overhead with many fixes). With
        cpu=False only the GPU side and the steps' GPU periods are computed (the CPU times stay None), and
        `until_ns` may stop the replay at the first blocking call from then on: what was launched after it keeps
        the trace's times, so only the periods of steps that end before it are replayed. `gap_ns` replaces the
        activities' least gaps after the previous one on their stream (a graph's node gap)."""
        if until_ns is not None and cpu:
            raise ValueError("until_ns replays the GPU side only (cpu=False)")
        if self.limits:
            return Replayed(self.limits)
        removed = np.asarray(removed, np.int64).reshape(-1, 3)
        cuts = self._cuts(removed)
        drop = np.isin(self.sync_rows, np.asarray(no_wait, np.int64).reshape(-1))
        for code, cut in enumerate(cuts):
            if not len(cut[0]):
                continue
            mine = np.flatnonzero(self.sync_thread == code)
            i = np.searchsorted(cut[0], self.sync_start_ns[mine], side="right") - 1
            drop[mine] |= (i >= 0) & (self.sync_start_ns[mine] < cut[1][np.maximum(i, 0)])
        drop &= self.sync_follows < 0  # a hand-off stays wherever the time around it goes
        if drop.any():  # a wait that is gone is CPU time taken out
            waits = np.flatnonzero(drop & (self.sync_wait_ns > 0))
            extra = np.stack([self.tids[self.sync_thread[waits]], self.sync_start_ns[waits],
                              self.sync_start_ns[waits] + self.sync_wait_ns[waits]], axis=1)
            removed = np.concatenate([removed, extra])
        if drop.any():
            cuts = self._cuts(removed)
        if not isinstance(overhead, list):
            overhead = self.cut(overhead)
        cuts = [_union(mine, other) for mine, other in zip(cuts, overhead)]
        active = np.flatnonzero(~drop)
        ends, sync_start, sync_end, shift_after = self._replay_gpu(cuts, active, until_ns,
                                                                   self.gap_ns if gap_ns is None else gap_ns)

        gpu_start, gpu_end = self.gpu_start_ns.copy(), self.gpu_end_ns.copy()
        gpu_end[self.rows] = ends
        gpu_start[self.rows] = ends - self.duration_ns
        periods = self._periods(ends - self.duration_ns, ends)
        if not cpu:
            return Replayed((), gpu_start, gpu_end, step_gpu_period_ns=periods)
        blocking = [(self.sync_thread[active] == code) for code in range(len(self.tids))]

        def cpu_times(code: int, t: np.ndarray) -> np.ndarray:
            mine = blocking[code]
            return _shifted(t, cuts[code], self.sync_start_ns[active][mine], self.sync_end_ns[active][mine],
                            sync_end[mine], shift_after[mine])

        rt_start, rt_end = self.runtime_start_ns.copy(), self.runtime_end_ns.copy()
        for code, rows in enumerate(self.runtime_rows):
            rt_start[rows] = cpu_times(code, self.runtime_start_ns[rows])
            rt_end[rows] = cpu_times(code, self.runtime_end_ns[rows])
        real = self.sync_rows[active] >= 0
        rt_start[self.sync_rows[active][real]] = sync_start[real]
        rt_end[self.sync_rows[active][real]] = sync_end[real]

        lo, hi = self.step_lo_ns, self.step_hi_ns
        if self.step_thread >= 0:
            lo, hi = cpu_times(self.step_thread, lo), cpu_times(self.step_thread, hi)
        return Replayed((), gpu_start, gpu_end, rt_start, rt_end, periods, hi - lo, hi)

    def outside_waits_over(self, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
        """The ids (sync_rows, negative) of the waits for something outside the trace that overlap these intervals:
        what `no_wait` takes to make them ready when asked."""
        mine = np.flatnonzero((self.sync_rows < 0) & (self.sync_follows < 0))
        if not len(mine) or not len(start_ns):
            return np.zeros(0, np.int64)
        s, e = merge_intervals(np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64))
        i = np.searchsorted(s, self.sync_end_ns[mine], side="left")  # intervals starting before the wait ends
        j = np.searchsorted(e, self.sync_start_ns[mine], side="right")  # intervals ending at or before its start
        return self.sync_rows[mine[i > j]]

    def unchanged(self) -> Replayed:
        """What run() with nothing taken out gives (the trace's own times), without replaying."""
        if self.limits:
            return Replayed(self.limits)
        return Replayed((), self.gpu_start_ns, self.gpu_end_ns, self.runtime_start_ns, self.runtime_end_ns,
                        self._periods(self.gpu_start_ns[self.rows], self.gpu_end_ns[self.rows]),
                        self.step_hi_ns - self.step_lo_ns, self.step_hi_ns)

    def cut(self, intervals) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(tid, start_ns, end_ns) intervals merged per thread code, as run() takes `overhead`."""
        return self._cuts(np.asarray(intervals, np.int64).reshape(-1, 3))

    def _cuts(self, removed: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per thread code: the removed intervals merged, as (starts, ends, time removed before each)."""
        out = []
        for tid in self.tids.tolist():
            mine = removed[(removed[:, 0] == tid) & (removed[:, 2] > removed[:, 1])]
            s, e = merge_intervals(mine[:, 1], mine[:, 2])
            out.append((s, e, np.cumsum(e - s) - (e - s)))
        return out

    def _replay_gpu(self, cuts, active: np.ndarray, until_ns: int | None, gap_ns: np.ndarray):
        """The activities' replayed ends (in this model's order), and each active blocking call's replayed start,
        end and the thread's shift after it (the removed time before it counted back in); from the first blocking
        call at or after `until_ns` on, the trace's own times."""
        n_threads = len(self.tids)
        shift = np.zeros(n_threads + 1, np.int64)  # the last one: activities launched before the window
        thread = np.where(self.thread >= 0, self.thread, n_threads)
        ready = self.ready_ns.copy()
        for code, cut in enumerate(cuts):
            if len(cut[0]):
                mine = self.thread == code
                ready[mine] -= _removed_before(cut, self.cut_at_ns[mine])
        sync_start_orig = self.sync_start_ns[active]
        # the removed time before each blocking call's start and end, on its thread (one search per thread)
        before_start = np.zeros(len(active), np.int64)
        before_end = np.zeros(len(active), np.int64)
        codes = self.sync_thread[active]
        for code in distinct(codes).tolist():
            if len(cuts[code][0]):
                mine = codes == code
                before_start[mine] = _removed_before(cuts[code], sync_start_orig[mine])
                before_end[mine] = _removed_before(cuts[code], self.sync_end_ns[active][mine])
        chunk = _chunks(self.launch_ns, self.stream, sync_start_orig)
        order = np.argsort(chunk, kind="stable")  # chunk by chunk, each stream in order within a chunk
        ch, st, d = chunk[order], self.stream[order], self.duration_ns[order]
        step = gap_ns[order] + d
        first = np.ones(len(order), bool)
        first[1:] = (ch[1:] != ch[:-1]) | (st[1:] != st[:-1])
        group_start = np.flatnonzero(first)
        group_end = np.r_[group_start[1:], len(order)]
        total = np.cumsum(step)
        c = total - np.repeat(total[group_start] - step[group_start], group_end - group_start)
        x = ready[order] + d - c
        th = thread[order]
        by_chunk = np.searchsorted(ch[group_start], np.arange(len(active) + 2), side="left")

        ends = np.empty(len(order), np.int64)
        last_end = [NEVER] * len(self.stream_device)
        reach = np.full(len(self.stream_device), NEVER, np.int64)  # the latest end so far per stream
        new_start = np.empty(len(active), np.int64)
        new_end = np.empty(len(active), np.int64)
        shift_after = np.empty(len(active), np.int64)
        # the loop runs once per blocking call: plain Python values where it reads scalars
        bounds = by_chunk.tolist()
        g_start, g_end, g_stream = group_start.tolist(), group_end.tolist(), st[group_start].tolist()
        # a wait outside the GPU does its own work after it: the time taken out inside the call comes off that
        cost = self.sync_cost_ns[active]
        cost = np.where(self.sync_rows[active] < 0, np.maximum(cost - (before_end - before_start), 0), cost)
        code_l, skew_l, cost_l, ready_l = (codes.tolist(), self.sync_skew_ns[active].tolist(), cost.tolist(),
                                           self.sync_ready_ns[active].tolist())
        s0_l = (sync_start_orig - before_start).tolist()
        e0_l = (self.sync_end_ns[active] - before_end).tolist()
        scopes = [self.sync_scopes[k] for k in active.tolist()]
        follows_l = self.sync_follows[active].tolist()
        # a join, less the threads' shifts: where the other thread handed over, plus the time from then to the join
        # less what was taken out of that time on the joining thread (a hand-off's latency, which a fix can
        # remove); and where the joining thread itself went idle
        joined = self.sync_follows[active]
        handed, at = self.sync_handed_ns[active], sync_start_orig
        other_at = np.zeros(len(active), np.int64)
        for code in distinct(joined[joined >= 0]).tolist():
            mine = joined == code
            other_at[mine] = handed[mine] - _removed_before(cuts[code], handed[mine])
        idle_at = np.full(len(active), NEVER, np.int64)
        for code in distinct(codes[joined >= 0]).tolist():
            mine = np.flatnonzero((codes == code) & (joined >= 0))
            latency = at[mine] - handed[mine] - (_removed_before(cuts[code], at[mine]) -
                                                 _removed_before(cuts[code], handed[mine]))
            other_at[mine] += latency
            since = self.sync_ready_ns[active][mine]
            idle_at[mine] = np.where(since > NEVER, since - _removed_before(cuts[code], since), NEVER)
        other_l, idle_l = other_at.tolist(), idle_at.tolist()
        stop = len(active) if until_ns is None else int(np.searchsorted(sync_start_orig, until_ns))
        if stop < len(active):  # beyond the horizon: the trace's own times
            left = g_start[bounds[stop + 1]] if bounds[stop + 1] < len(g_start) else len(order)
            ends[left:] = self.gpu_end_ns[self.rows[order[left:]]]
            new_start[stop:] = sync_start_orig[stop:]
            new_end[stop:] = self.sync_end_ns[active][stop:]
            shift_after[stop:] = 0
        for j in range(stop + 1):
            for g in range(bounds[j], bounds[j + 1]):
                a, b, s = g_start[g], g_end[g], g_stream[g]
                e = c[a:b] + np.maximum(np.maximum.accumulate(x[a:b] + shift[th[a:b]]), last_end[s])
                ends[a:b] = e
                last_end[s] = int(e[-1])
                reach[s] = max(reach[s], e.max())
            if j == stop:
                break
            code = code_l[j]
            start = s0_l[j] + int(shift[code])
            if follows_l[j] >= 0:  # idle since idle_l: it goes on where the other thread is, or where it stopped
                own = idle_l[j] + int(shift[code]) if idle_l[j] > NEVER else NEVER
                end = max(own, other_l[j] + int(shift[follows_l[j]]))
                new_start[j], new_end[j] = start, end
                shift[code] = shift_after[j] = end - e0_l[j]
                continue
            done = max(int(reach[scopes[j]].max(initial=NEVER)), ready_l[j])
            end = max(start, done - skew_l[j]) + cost_l[j]
            new_start[j], new_end[j] = start, end
            shift[code] = shift_after[j] = end - e0_l[j]
        out = np.empty(len(order), np.int64)
        out[order] = ends
        return out, new_start, new_end, shift_after

    def _periods(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per step: the start of its GPU work to the next step's (the last: its GPU span), as
        analyzer.views.steptable's gpu_period_us; -1 where the step launched no GPU work."""
        n = len(self.step_lo_ns)
        lo = np.full(n, np.iinfo(np.int64).max)
        hi = np.full(n, np.iinfo(np.int64).min)
        mine = self.step >= 0
        np.minimum.at(lo, self.step[mine], start[mine])
        np.maximum.at(hi, self.step[mine], end[mine])
        with_gpu = np.flatnonzero(hi >= lo)
        after = np.searchsorted(with_gpu, np.arange(n), side="right")
        has_next = after < len(with_gpu)
        nxt = with_gpu[np.minimum(after, len(with_gpu) - 1)] if len(with_gpu) else np.zeros(n, np.int64)
        period = np.where(has_next, lo[nxt] - lo, hi - lo) if len(with_gpu) else np.zeros(n, np.int64)
        return np.where(hi >= lo, period, -1)


def _union(a, b):
    """Two threads' cuts as one."""
    if not len(b[0]):
        return a
    if not len(a[0]):
        return b
    s, e = merge_intervals(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    return s, e, np.cumsum(e - s) - (e - s)


def _removed_before(cut, t):
    """How much removed time lies before each time t on the thread (part of an interval t falls inside)."""
    starts, ends, before = cut
    if not len(starts):
        return np.zeros_like(t) if isinstance(t, np.ndarray) else 0
    i = np.searchsorted(starts, t, side="right") - 1
    j = np.maximum(i, 0)
    return np.where(i >= 0, before[j] + np.minimum(t - starts[j], ends[j] - starts[j]), 0)


def _shifted(t, cut, sync_start, sync_end, new_end, shift_after) -> np.ndarray:
    """CPU times of one thread in the replay: removed time before them taken out, the shift of the last blocking
    call that ended before them added; a time inside a blocking call is no later than the call's replayed end."""
    out = t - _removed_before(cut, t)
    if len(sync_start):
        k = np.searchsorted(sync_end, t, side="right")
        out = out + np.where(k > 0, shift_after[np.maximum(k - 1, 0)], 0)
        nxt = np.minimum(k, len(sync_start) - 1)
        inside = (k < len(sync_start)) & (sync_start[nxt] < t)
        out = np.where(inside, np.minimum(out, new_end[nxt]), out)
    return out


def build_replay(model: TraceModel, blocking: np.ndarray, steps: StepRanges,
                 outside_waits: np.ndarray | None = None) -> ReplayModel:
    """The replay model of a trace; `blocking`: per runtime row, whether the call waits for the GPU
    (AnalysisContext.blocking); `outside_waits`: (tid, start_ns, end_ns, ready_ns) of calls for something outside
    the trace (views.idle.worker_input_waits; ready_ns NEVER: it was there when asked), kept where their thread
    launches work and no blocking call falls inside them."""
    rt, gpu = model.runtime, model.gpu
    rows = np.flatnonzero(activity_mask(model))
    limits = []
    if not len(rows):
        limits.append("no GPU activity")
    elif not (gpu.launch[rows] >= 0).any():
        limits.append("no GPU activity joined to its launch (no correlation ids)")

    # threads: every thread with runtime calls, then the steps' thread when it has none
    rt_tids = distinct(rt.tid)
    rt_thread = np.searchsorted(rt_tids, rt.tid)
    tids, step_thread = rt_tids, -1
    step_op = model.steps.op[np.searchsorted(model.steps.start_ns, steps.cpu_start_ns[0])] if len(steps) else -1
    if step_op >= 0:
        step_tid = model.ops.tid[step_op]
        if step_tid not in rt_tids:
            tids = np.append(rt_tids, step_tid)
        step_thread = int(np.flatnonzero(tids == step_tid)[0])
    by_thread = np.argsort(rt_thread, kind="stable")
    runtime_rows = tuple(np.split(by_thread, np.searchsorted(rt_thread[by_thread], np.arange(1, len(tids)))))

    # activities by stream, then start (the gpu table is in start order)
    stream_key = thread_keys([gpu.device[rows]], [gpu.stream[rows]])[0]
    order = np.argsort(stream_key, kind="stable")
    rows, stream_key = rows[order], stream_key[order]
    first = np.ones(len(rows), bool)
    first[1:] = stream_key[1:] != stream_key[:-1]
    stream = np.cumsum(first) - 1
    n_streams = int(first.sum())
    start, end = gpu.start_ns[rows], gpu.end_ns[rows]
    launch = gpu.launch[rows]
    has = launch >= 0
    safe = np.maximum(launch, 0)
    launch_ns = np.where(has, rt.start_ns[safe], NEVER) if len(rt) else np.full(len(rows), NEVER)
    thread = np.where(has, rt_thread[safe], -1) if len(rt) else np.full(len(rows), -1)
    prev_end = np.r_[NEVER, end[:-1]]
    gap = np.where(first, 0, start - prev_end)
    latency = start - launch_ns

    if has.any():
        pids = distinct(rt.pid[launch[has]])
        if len(pids) > 1:
            limits.append(f"launches from {len(pids)} processes")
        joins = _handoffs(model, tids, step_thread)  # (code, at, other code, idle since, handed over at)
        joined = set(joins[:, 0].tolist()) | set(joins[:, 2].tolist())
        pairs = distinct(stream[has] * (len(tids) + 1) + thread[has])
        for code in np.flatnonzero(np.bincount(pairs // (len(tids) + 1), minlength=n_streams) > 1).tolist():
            threads = set((pairs[pairs // (len(tids) + 1) == code] % (len(tids) + 1)).tolist())
            if threads <= joined:  # they hand work to each other: the joins keep them in step
                continue
            row = rows[np.searchsorted(stream, code)]
            limits.append(f"several threads launch into stream {int(gpu.stream[row])} of device {int(gpu.device[row])}"
                          f" and run at the same time (no hand-off between them)")
    else:
        joins = np.zeros((0, 5), np.int64)

    # the typical launch latency: of launches that found their stream idle; the typical back-to-back gap, per
    # stream: of activities launched early enough to start as soon as the one before them ended
    idle_launch = has & (first | (launch_ns >= prev_end))
    typical_latency = int(np.median(latency[idle_launch if idle_launch.any() else has])) if has.any() else 0
    queued = has & ~first & (latency - gap >= typical_latency)
    fallback = int(np.median(gap[queued])) if queued.any() else 0
    bounds = np.r_[np.flatnonzero(first), len(rows)]
    typical_gap = np.array([np.median(gap[a:b][queued[a:b]]) if queued[a:b].any() else fallback
                            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())], np.int64)
    q0 = typical_gap[stream] if len(rows) else np.zeros(0, np.int64)
    stream_bound = has & ~first & (gap <= q0 + SLACK_NS) & (gap - q0 <= latency - typical_latency)
    bound = np.where(~has, FIXED, np.where(stream_bound, STREAM_BOUND,
                                           np.where(latency - typical_latency > SLACK_NS, WAITS, LAUNCH_BOUND)))
    ready = np.where(has, launch_ns + np.where(stream_bound, np.minimum(typical_latency, latency), latency), start)
    gap_used = np.where(first, 0, np.where(stream_bound | ~has, gap, np.minimum(q0, gap)))
    launch_end = np.where(has, rt.end_ns[safe], NEVER) if len(rt) else np.full(len(rows), NEVER)
    # only a kernel launch whose activity waited for it (one blocked by a full queue is held by the stream instead;
    # a graph launch's time is its upload and queueing, not a module load)
    graph_launch = np.isin(rt.name[safe], [c for c, n in enumerate(model.names) if n in GRAPH_LAUNCHES]) \
        if len(rt) else np.zeros(len(rows), bool)
    long_call = has & ~graph_launch & (launch_end - launch_ns >= LONG_LAUNCH_NS) & (bound != STREAM_BOUND)
    cut_at = np.where(long_call, np.minimum(ready, launch_end), launch_ns)

    # blocking calls, and the GPU work each one waits on
    frees = [c for c, n in enumerate(model.names) if n in SYNCING_FREES]
    sync_rows = np.flatnonzero(blocking | np.isin(rt.name, frees))
    stream_device = gpu.device[rows[first]]
    sync_stream, sync_device = _sync_scopes(model, sync_rows, stream_key[first])
    s, e = rt.start_ns[sync_rows], rt.end_ns[sync_rows]
    scopes = [_scope(sync_stream[k], sync_device[k], stream_device) for k in range(len(sync_rows))]
    done = _done_in_trace(stream, end, _chunks(launch_ns, stream, s), scopes, n_streams)
    wait = np.clip(done - s, 0, e - s)
    sync_thread, sync_ready = rt_thread[sync_rows], np.full(len(sync_rows), NEVER, np.int64)
    cost, skew = e - s - wait, np.maximum(done - e, 0)
    outside = _outside_waits(outside_waits, rt_tids, s, e)
    if len(outside):  # a call that waited ends no earlier than its batch arrived in the trace, then does its own work
        o_s, o_e, o_ready, none = outside[:, 1], outside[:, 2], outside[:, 3], np.zeros(len(outside), np.int64)
        o_wait = np.where(o_ready > NEVER, o_ready - o_s, 0)
        order = np.argsort(np.concatenate([s, o_s]), kind="stable")
        merged = [np.concatenate(pair)[order] for pair in (
            (sync_rows, -1 - np.arange(len(outside))), (sync_thread, np.searchsorted(rt_tids, outside[:, 0])),
            (s, o_s), (e, o_e), (wait, o_wait), (cost, o_e - o_s - o_wait), (skew, none), (sync_ready, o_ready))]
        sync_rows, sync_thread, s, e, wait, cost, skew, sync_ready = merged
        all_scopes = scopes + [none[:0]] * len(outside)  # nothing on the GPU
        scopes = [all_scopes[k] for k in order.tolist()]
    follows, handed = np.full(len(sync_rows), -1, np.int64), np.full(len(sync_rows), NEVER, np.int64)
    if len(joins):  # zero-length calls: each thread's position there is the later of its own and the other's
        at, none = joins[:, 1], np.zeros(len(joins), np.int64)
        order = np.argsort(np.concatenate([s, at]), kind="stable")
        merged = [np.concatenate(pair)[order] for pair in (
            (sync_rows, JOIN_ROWS - np.arange(len(joins))), (sync_thread, joins[:, 0]), (s, at), (e, at),
            (wait, none), (cost, none), (skew, none), (sync_ready, joins[:, 3]), (follows, joins[:, 2]),
            (handed, joins[:, 4]))]
        sync_rows, sync_thread, s, e, wait, cost, skew, sync_ready, follows, handed = merged
        all_scopes = scopes + [none[:0]] * len(joins)
        scopes = [all_scopes[k] for k in order.tolist()]
    return ReplayModel(
        limits=tuple(limits), tids=tids, runtime_rows=runtime_rows, rows=rows, stream=stream, thread=thread,
        launch_ns=launch_ns, cut_at_ns=cut_at, ready_ns=ready, duration_ns=end - start, gap_ns=gap_used,
        bound=bound.astype(np.int8),
        step=steps.index_at(launch_ns) if len(steps) else np.full(len(rows), -1), stream_device=stream_device,
        stream_id=gpu.stream[rows[first]], sync_rows=sync_rows, sync_thread=sync_thread,
        sync_start_ns=s, sync_end_ns=e, sync_wait_ns=wait, sync_cost_ns=cost,
        sync_skew_ns=skew, sync_scopes=tuple(scopes), sync_ready_ns=sync_ready, sync_follows=follows,
        sync_handed_ns=handed,
        step_lo_ns=steps.lo_ns,
        step_hi_ns=steps.hi_ns, step_thread=step_thread, gpu_start_ns=gpu.start_ns, gpu_end_ns=gpu.end_ns,
        runtime_start_ns=rt.start_ns, runtime_end_ns=rt.end_ns)


def _outside_waits(waits: np.ndarray | None, tids: np.ndarray, sync_start: np.ndarray,
                   sync_end: np.ndarray) -> np.ndarray:
    """The waits the replay can hold: on a thread that launches work, none overlapping another, no blocking call
    inside (the blocking calls stay in time order, each ending before the next begins)."""
    if waits is None or not len(waits):
        return np.zeros((0, 4), np.int64)
    waits = waits[np.isin(waits[:, 0], tids) & (waits[:, 2] > waits[:, 1])]
    waits = waits[np.argsort(waits[:, 1], kind="stable")]
    apart = waits[1:, 1] >= waits[:-1, 2]  # each one begins after the one before it ended
    alone = np.r_[True, apart] & np.r_[apart, True]
    inside = np.searchsorted(sync_start, waits[:, 2]) - np.searchsorted(sync_end, waits[:, 1], side="right")
    return waits[alone & (inside == 0)]


def _chunks(launch_ns: np.ndarray, stream: np.ndarray, sync_start: np.ndarray) -> np.ndarray:
    """Per activity: how many of these blocking calls started before its launch, never fewer than for the activity
    before it on its stream (so that each stream is replayed in order)."""
    chunk = np.searchsorted(sync_start, launch_ns, side="left")
    offset = stream.astype(np.int64) * (len(sync_start) + 1)  # streams are contiguous and ascending
    return np.maximum.accumulate(chunk + offset) - offset if len(chunk) else chunk


def _scope(sync_stream: int, sync_device: int, stream_device: np.ndarray) -> np.ndarray:
    """The stream codes a blocking call waits on."""
    if sync_stream >= 0:
        return np.array([sync_stream])
    if sync_stream == -2:
        return np.zeros(0, np.int64)
    return np.flatnonzero(stream_device == sync_device) if sync_device >= 0 else np.arange(len(stream_device))


def _sync_scopes(model: TraceModel, sync_rows: np.ndarray, stream_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per blocking call: the stream code it waits on (-1: every stream of its device; -2: a stream with no
    activity), and its device (-1: every device, where the trace does not say)."""
    gpu, rt = model.gpu, model.runtime
    sync_stream, sync_device = np.full(len(sync_rows), -1, np.int64), np.full(len(sync_rows), -1, np.int64)
    known = np.flatnonzero(rt.gpu[sync_rows] >= 0)
    g = rt.gpu[sync_rows[known]]
    sync_device[known] = gpu.device[g]
    # a Stream Sync names its stream; a copy waits for itself, which its stream runs after the work before it
    named = [c for c, name in enumerate(model.names) if name == "Stream Sync"]
    by_stream = (gpu.kind[g] != GpuKind.SYNC) | np.isin(gpu.name[g], named)
    keys = thread_keys([gpu.device[g]], [gpu.stream[g]])[0]
    at = np.minimum(np.searchsorted(stream_keys, keys), max(len(stream_keys) - 1, 0))
    found = stream_keys[at] == keys if len(stream_keys) else np.zeros(len(keys), bool)
    sync_stream[known[by_stream]] = np.where(found, at, -2)[by_stream]
    return sync_stream, sync_device


def _done_in_trace(stream: np.ndarray, end: np.ndarray, chunk: np.ndarray, scopes: list[np.ndarray],
                   n_streams: int) -> np.ndarray:
    """Per blocking call: when the GPU work in its scope launched before it ended in the trace (NEVER: none)."""
    n = len(scopes)
    done_per_stream = np.full((n_streams, n), NEVER, np.int64)
    bounds = np.searchsorted(stream, np.arange(n_streams + 1))
    for s in range(n_streams):
        a, b = bounds[s], bounds[s + 1]
        reach = np.maximum.accumulate(end[a:b])
        last = np.searchsorted(chunk[a:b], np.arange(n), side="right") - 1  # chunk k: launched before call k
        done_per_stream[s] = np.where(last >= 0, reach[np.maximum(last, 0)], NEVER)
    return np.array([done_per_stream[scope, k].max(initial=NEVER) for k, scope in enumerate(scopes)], np.int64)


def _handoffs(model: TraceModel, tids: np.ndarray, step_thread: int) -> np.ndarray:
    """(thread code, time, other thread code, idle since, handed over at) of the joins where one thread hands work to
    another and waits for it:
    autograd's device threads running a backward while the thread that called it waits, a worker thread running a
    model call another one waits on. Read from the trace's structure, not from names: each other thread's run of
    events (ops and runtime calls, merged) during which the primary thread (the steps' thread, else the one with the
    most runtime calls) starts nothing and is not inside a runtime call is work it handed off and waited for; the
    run joins the primary at its start (handed over at the primary's last event before it), and the primary joins the
    run at its end; each thread idle since its own last event before the join. A run that overlaps the primary's own
    work gets no joins (the two ran side by side)."""
    rt, ops, fr = model.runtime, model.ops, model.frames
    if len(tids) < 2:
        return np.zeros((0, 5), np.int64)
    primary = step_thread if step_thread >= 0 else int(np.argmax([(rt.tid == t).sum() for t in tids.tolist()]))
    p_tid = tids[primary]
    p_starts = np.sort(np.concatenate([ops.start_ns[ops.tid == p_tid], rt.start_ns[rt.tid == p_tid],
                                       fr.start_ns[fr.tid == p_tid] if len(fr) else np.zeros(0, np.int64)]))
    p_ends = np.sort(np.concatenate([ops.end_ns[ops.tid == p_tid], rt.end_ns[rt.tid == p_tid],
                                     fr.end_ns[fr.tid == p_tid] if len(fr) else np.zeros(0, np.int64)]))
    p_rt = np.flatnonzero(rt.tid == p_tid)  # in start order
    p_rt_start, p_rt_reach = rt.start_ns[p_rt], np.maximum.accumulate(rt.end_ns[p_rt]) if len(p_rt) else p_rt
    out = []
    for code, tid in enumerate(tids.tolist()):
        if code == primary:
            continue
        mine_ops, mine_rt = ops.tid == tid, rt.tid == tid
        starts = np.concatenate([ops.start_ns[mine_ops], rt.start_ns[mine_rt]])
        ends = np.concatenate([ops.end_ns[mine_ops], rt.end_ns[mine_rt]])
        if not len(starts):
            continue
        s, e = merge_intervals(starts, ends)
        between = np.searchsorted(p_starts, s[1:], side="left") - np.searchsorted(p_starts, e[:-1], side="right")
        first = np.r_[0, np.flatnonzero(between > 0) + 1]
        seg_s, seg_e = s[first], e[np.r_[first[1:], len(s)] - 1]
        inside = np.searchsorted(p_starts, seg_e, side="right") - np.searchsorted(p_starts, seg_s, side="left")
        k = np.searchsorted(p_rt_start, seg_s, side="left") - 1
        in_call = (k >= 0) & (p_rt_reach[np.maximum(k, 0)] > seg_s) if len(p_rt) else np.zeros(len(seg_s), bool)
        handed = (inside == 0) & ~in_call
        own_idle = np.r_[NEVER, e[first[1:] - 1]]  # where this thread's previous run ended
        p_idle = np.maximum(_last_at_or_before(p_ends, seg_s), _last_at_or_before(p_starts, seg_s))
        for a, b, own, other in zip(seg_s[handed].tolist(), seg_e[handed].tolist(), own_idle[handed].tolist(),
                                    p_idle[handed].tolist()):
            out += [(code, a, primary, own, other if other > NEVER else a), (primary, b, code, other, b)]
    return np.array(sorted(out, key=lambda j: j[1]), np.int64).reshape(-1, 5)


def _last_at_or_before(sorted_times: np.ndarray, t: np.ndarray) -> np.ndarray:
    at = np.searchsorted(sorted_times, t, side="right") - 1
    return np.where(at >= 0, sorted_times[np.maximum(at, 0)], NEVER) if len(sorted_times) else np.full(len(t), NEVER)
