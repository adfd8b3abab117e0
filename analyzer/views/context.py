"""The analysis context: the trace model, the run's metadata, and every view derived from them, each computed once
on first use and shared by the detectors, the report and the dashboard's lanes."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from analyzer.arrays import distinct
from analyzer.trace import GpuKind, TraceModel
from analyzer.trace.joins import thread_keys
from analyzer.trace.runmeta import RunMeta
from analyzer.trace.snapshot import MemorySnapshot
from analyzer.views import apis
from analyzer.views.allocations import AllocatorRecords
from analyzer.views.compiles import Compiles, compiles
from analyzer.views.frames import FrameIndex
from analyzer.views.graph_breaks import GraphBreaks, graph_breaks
from analyzer.views.graphs import GraphUse, graph_use
from analyzer.views.idle import CPU_LAUNCH, HOST_WORK, WARMUP, CallRoles, Gaps, IdlePieces, OpRoles, classify_idle, \
    worker_input_waits
from analyzer.views.host_during import LONG_NS, HostDuring, cold_steps, first_invocations, host_during, \
    one_time_untraced
from analyzer.views.instrumentation import instrumentation_rows
from analyzer.views.onetime import SHAPE_SETUP, first_call_ops, one_time_rows, start_up_calls
from analyzer.views.setup import ONE_TIME, ShapeSetup, own_time_ns, shape_setup
from analyzer.views.queued import QueuedWaits, queued_waits
from analyzer.views.graphable import InnerLoop
from analyzer.views.replay import ReplayModel, build_replay
from analyzer.views.stackless import HostGaps, host_gaps
from analyzer.views.steps import StepRanges, step_ranges
from analyzer.views.steptable import step_table
from analyzer.views.timeline import GpuTimeline, build_timeline, merge_intervals
from analyzer.views.traits import TraceTraits, is_compiled_region, trace_traits
from analyzer.views.whatif import loop_of, measure_for


HOST_OP_MIN_NS = 50_000  # a host-only op this long is math, not the dispatcher's few µs of launch overhead
DISPATCH_NS = 20_000  # an op that only dispatches (a view, a metadata query) costs less, even profiled
RULE_CALLS = 2  # an op's calls that make its median a rule, not one call's accident


@dataclasses.dataclass(frozen=True)
class MemorySeries:
    """One device's CUDA [memory] events in time order: allocated and reserved bytes after each."""
    device: int
    rows: np.ndarray  # rows of model.memory
    ts_ns: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray


def _inside_spans(model: TraceModel, rows: np.ndarray, start, end, pid, tid) -> np.ndarray:
    """The runtime rows among `rows` (sorted) that lie inside one of the spans (start, end) on their own thread."""
    rt = model.runtime
    if not len(start) or not len(rows):
        return np.zeros(0, np.int64)
    # only the rows starting inside the spans' union take part (the runtime table is sorted by start)
    u_start, u_end = merge_intervals(np.asarray(start, np.int64), np.asarray(end, np.int64))
    k = np.searchsorted(u_start, rt.start_ns[rows], side="right") - 1
    rows = rows[(k >= 0) & (rt.start_ns[rows] < u_end[np.maximum(k, 0)])]
    if not len(rows):
        return rows
    span_key, row_key = thread_keys([pid, rt.pid[rows]], [tid, rt.tid[rows]])
    inside = np.zeros(len(rows), bool)
    for key in distinct(span_key).tolist():  # per thread: the spans' union, searched by each call's start
        s, e = merge_intervals(start[span_key == key], end[span_key == key])
        mine = np.flatnonzero(row_key == key)
        i = np.searchsorted(s, rt.start_ns[rows[mine]], side="right") - 1
        inside[mine] = (i >= 0) & (rt.end_ns[rows[mine]] <= e[np.maximum(i, 0)])
    return rows[inside]


class AnalysisContext:
    """The trace model plus what is derived from it once and read by several detectors."""

    def __init__(self, model: TraceModel, meta: RunMeta | None = None, *, user_code: tuple[str, ...] = (),
                 snapshot: MemorySnapshot | None = None, stackless: TraceModel | None = None,
                 stackless_error: str | None = None):
        self.model = model
        self.stackless = stackless  # the capture's stackless pass over the same window (analyzer.views.stackless)
        self.stackless_error = stackless_error  # why the one beside the trace could not be read
        self.meta = meta
        self.user_code = tuple(user_code)
        self.snapshot = snapshot  # the caching allocator's own records, when the run has them

    @functools.cached_property
    def stackless_gaps(self) -> HostGaps | None:
        return host_gaps(self.model, self.stackless) if self.stackless is not None else None

    @functools.cached_property
    def timeline(self) -> GpuTimeline:
        return build_timeline(self.model)

    @functools.cached_property
    def frames(self) -> FrameIndex:
        return FrameIndex(self.model, self.user_code)

    @functools.cached_property
    def runtime_classes(self) -> np.ndarray:
        return apis.runtime_classes(self.model)

    @functools.cached_property
    def steps(self) -> StepRanges:
        return step_ranges(self.model)

    @functools.cached_property
    def graphs(self) -> GraphUse:
        return graph_use(self.model, self.runtime_classes)

    @functools.cached_property
    def traits(self) -> TraceTraits:
        return trace_traits(self.model, self.graphs, self.steps.names, bool((self.frames.generated_frame >= 0).any()))

    @functools.cached_property
    def one_time(self) -> np.ndarray:
        """Per runtime row: its analyzer.views.onetime label code (0: a steady-state call); the calls made inside a
        one-time set-up for a new shape are that set-up's."""
        label = one_time_rows(self.model, self.runtime_classes, self.outermost_ops, self.steps, self.start_up)
        setup, ops = self.shape_setup, self.model.ops
        once = setup.of(ONE_TIME)
        if len(once):
            inside = _inside_spans(self.model, np.arange(len(label)), ops.start_ns[once], ops.end_ns[once],
                                   ops.pid[once], ops.tid[once])
            label[inside[label[inside] == 0]] = SHAPE_SETUP
        return label

    @functools.cached_property
    def instrumentation(self) -> np.ndarray:
        """Per runtime row: the measurement's own call (analyzer.views.instrumentation), not the workload's."""
        return instrumentation_rows(self.model, self.frames, self.runtime_classes)

    @functools.cached_property
    def _classified(self) -> tuple[Gaps, IdlePieces]:
        roles = CallRoles(self.runtime_classes, self.blocking, self.one_time, self.instrumentation, self.in_setup)
        setup = self.shape_setup
        return classify_idle(self.model, self.timeline, roles,
                             OpRoles(self.warmup_ops, self.host_compute_ops, setup.of(ONE_TIME),
                                     setup.rows[setup.recurrence != ONE_TIME]), self.graphs)

    @functools.cached_property
    def shape_setup(self) -> ShapeSetup:
        """Library ops' set-up for input shapes they had not run yet (analyzer.views.setup)."""
        return shape_setup(self.model, self.steps, self.runtime_classes, self.own_time)

    @functools.cached_property
    def own_time(self) -> np.ndarray:
        """Per op row: its own host time (analyzer.views.setup.own_time_ns)."""
        return own_time_ns(self.model)

    @functools.cached_property
    def start_up(self) -> np.ndarray:
        """Per runtime row: a call of its process's start-up (analyzer.views.onetime.start_up_calls)."""
        return start_up_calls(self.model)

    @functools.cached_property
    def in_setup(self) -> np.ndarray:
        """Per runtime row: made inside a library op's set-up for a new shape (its search's syncs, its trial
        workspaces' allocations): the set-up's, not the workload's syncs or allocator churn."""
        mask = np.zeros(len(self.model.runtime), bool)
        mask[self._inside_setup] = True
        return mask

    @functools.cached_property
    def _inside_setup(self) -> np.ndarray:
        """Runtime rows made inside a set-up call (any recurrence): its own calls, an algorithm search's syncs and
        trial allocations included."""
        setup, ops = self.shape_setup, self.model.ops
        rows = setup.rows
        return _inside_spans(self.model, np.arange(len(self.model.runtime)), ops.start_ns[rows], ops.end_ns[rows],
                             ops.pid[rows], ops.tid[rows]) if len(rows) else np.zeros(0, np.int64)

    @functools.cached_property
    def warmup_ops(self) -> np.ndarray:
        """Op rows of one-time work: first calls that paid for set-up, and compiles seen as ops (no Python stacks)."""
        c = self.compiles
        return np.union1d(first_call_ops(self.model, self.outermost_ops), c.ops[c.ops >= 0])

    @functools.cached_property
    def host_during(self) -> HostDuring:
        """What the launching thread did during each long launch-gap piece (analyzer.views.host_during)."""
        gaps, idle = self._classified
        long = np.flatnonzero((idle.cause == CPU_LAUNCH) & (idle.duration_ns >= LONG_NS))
        return host_during(self.model, gaps, idle, long)

    @functools.cached_property
    def untraced_one_time(self) -> tuple[np.ndarray, list[tuple[str, str]]]:
        """Untraced launch-gap pieces that a warmed-up process would not spend again (a cold step's, a JIT compile
        before a built kernel's first launch, a kernel's runs before it settles, a scripted function's first call:
        analyzer.views.host_during), with why: cause warmup."""
        gaps, idle = self._classified
        return one_time_untraced(self.model, gaps, idle, self.host_during, self.outermost_ops,
                                 lambda: first_invocations(self.model, self.outermost_ops), self.steps,
                                 self.recompile_spans, bool(self.start_up.any()))

    @functools.cached_property
    def _idle(self) -> tuple[Gaps, IdlePieces]:
        """The classified pieces with two causes refined: untraced time a warmed-up process would not spend again is
        warmup, and a launch gap of LONG_NS or more outside a graph break's eager code is host work (the host-work
        detector's: a launch costs microseconds; a millisecond is Python, a library's set-up, another thread)."""
        gaps, idle = self._classified
        cause = idle.cause.copy()
        cause[self.untraced_one_time[0]] = WARMUP
        long = (cause == CPU_LAUNCH) & (idle.duration_ns >= LONG_NS)
        long[_in_graph_breaks(idle, self.graph_breaks)] = False
        cause[long] = HOST_WORK
        return gaps, dataclasses.replace(idle, cause=cause)

    @functools.cached_property
    def host_compute_ops(self) -> np.ndarray:
        """Outermost library ops (`ns::name`) that made no CUDA call at all (no launch, copy, allocation or sync under
        them), ran at least HOST_OP_MIN_NS with some op in the call spending more than a dispatch (DISPATCH_NS) in
        its own code, of an op whose such calls take that long as a rule (their median, over RULE_CALLS or more):
        math on host tensors, whose time no launch-side fix takes out. A view or a metadata query is as quick as the
        dispatcher, so its median is µs (one call of it that ran long lost its thread, it did not compute), and a
        composite of many such (a bucket unflattened into views) has no op doing more than dispatch. (A scripted
        function, a compiled region or Dynamo's guard check is no `ns::` op.)"""
        ops, rt = self.model.ops, self.model.runtime
        linked = rt.op >= 0
        if not len(ops) or not len(rt) or linked.mean() < 0.5:  # calls not tied to ops: which op made none is unknown
            return np.zeros(0, np.int64)
        outer = self.outermost_ops
        made_call = np.zeros(len(ops), bool)
        called = outer[rt.op[linked]]
        made_call[called[called >= 0]] = True
        own = (outer == np.arange(len(ops))) & ~ops.is_annotation.astype(bool) & ~made_call
        dur = ops.end_ns - ops.start_ns
        rows = np.flatnonzero(own & (dur >= HOST_OP_MIN_NS))
        if not len(rows):
            return rows
        longest_own = np.zeros(len(ops), np.int64)  # per outermost op: the longest own time of an op in its call
        inside = np.flatnonzero(outer >= 0)
        np.maximum.at(longest_own, outer[inside], self.own_time[inside])
        rows = rows[longest_own[rows] >= DISPATCH_NS]
        names = self.model.names
        own_rows = np.flatnonzero(own)
        own_names = ops.name[own_rows]
        computes = {}
        for c in distinct(ops.name[rows]).tolist():
            calls = dur[own_rows[own_names == c]]
            computes[c] = "::" in names[c] and len(calls) >= RULE_CALLS and float(np.median(calls)) >= HOST_OP_MIN_NS
        return rows[np.array([computes[c] for c in ops.name[rows].tolist()], bool)] if len(rows) else rows

    @property
    def gaps(self) -> Gaps:
        return self._idle[0]

    @property
    def idle(self) -> IdlePieces:
        """Every idle nanosecond of every device, cut into pieces of one cause each."""
        return self._idle[1]


    def kernel_launch_starts(self, tid: int) -> np.ndarray:
        """Sorted starts of the runtime calls on this thread that launched a kernel (cached per thread)."""
        cache = self.__dict__.setdefault("_kernel_launch_starts", {})
        if tid not in cache:
            rt, gpu = self.model.runtime, self.model.gpu
            linked = rt.gpu >= 0
            kernel = linked & (gpu.kind[np.maximum(rt.gpu, 0)] == GpuKind.KERNEL) if len(gpu) else linked
            cache[tid] = np.sort(rt.start_ns[(rt.tid == tid) & kernel])
        return cache[tid]

    @functools.cached_property
    def outermost_ops(self) -> np.ndarray:
        """For every op row: the outermost enclosing cpu_op (annotations skipped), by pointer jumping."""
        ops = self.model.ops
        is_ann = ops.is_annotation.astype(bool)
        best = np.where(is_ann, -1, np.arange(len(ops)))
        live = np.flatnonzero(ops.parent >= 0)
        up = ops.parent[live]
        while len(live):  # one level up per round, for the rows whose chain goes on
            take = ~is_ann[up]
            best[live[take]] = up[take]
            up = ops.parent[up]
            more = up >= 0
            live, up = live[more], up[more]
        return best

    def name(self, code: int) -> str:
        return self.model.names[code]

    @functools.cached_property
    def step_table(self) -> list[dict]:
        """report.json's gaps.per_step: each step's CPU span, the GPU work it launched and the idle before it."""
        return step_table(self)

    @functools.cached_property
    def cold_steps(self) -> np.ndarray:
        """Per step: a cold one, at least half of whose CPU span the GPU sat idle on one-time costs (a process's first
        iteration: module loading, library set-up, autotuning, compiles). Step statistics leave them out: they say
        nothing of the steps after them."""
        return cold_steps(self.idle, self.steps, self.recompile_spans)

    @functools.cached_property
    def recompile_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """The recompiles' spans, merged: compile time that recurs in the loop, not warm-up."""
        c = self.compiles
        return merge_intervals(c.start_ns[c.recompile], c.end_ns[c.recompile])

    @functools.cached_property
    def allocator_records(self) -> AllocatorRecords | None:
        """The allocator's own records joined to the trace, when the run has a memory snapshot."""
        return AllocatorRecords(self.model, self.snapshot, self.runtime_classes) if self.snapshot else None

    @functools.cached_property
    def blocking(self) -> np.ndarray:
        """Per runtime row: a call that blocks the CPU until GPU work finishes (synchronize, synchronous copy, or
        an async copy to or from pageable memory)."""
        classes = self.runtime_classes
        rows = (classes == apis.IS_SYNC) | (classes == apis.IS_SYNC_COPY)
        rows[apis.blocking_copy_rows(self.model)] = True
        rows[self._inside_first_compiles(np.flatnonzero(rows))] = False
        rows[self.graphs.in_capture] = False  # torch.cuda.graph's own synchronize: part of the one-time capture
        rows[self._inside_setup] = False  # a library's set-up for a new shape (an algorithm search's syncs)
        return rows

    def _inside_first_compiles(self, rows: np.ndarray) -> np.ndarray:
        """The runtime rows among these made inside a first compile on their thread, or inside the first call of a
        compiled region that paid for set-up (Inductor's autotuning benchmarks, its copies of example inputs): part of
        that one-time compile, not syncs of the workload. (An ordinary op's slow first call stays as it is: a sync
        inside it may be what made it slow.)"""
        c, model = self.compiles, self.model
        fr, ops = model.frames, model.ops
        first = np.flatnonzero(~c.recompile)
        by_frame = c.frames[first] >= 0
        regions = self.warmup_ops[[is_compiled_region(model.names[n]) for n in ops.name[self.warmup_ops].tolist()]] \
            if len(self.warmup_ops) else self.warmup_ops
        frame_rows, op_rows = c.frames[first][by_frame], np.union1d(c.ops[first][~by_frame], regions)
        op_rows = op_rows[op_rows >= 0]
        spans = [(fr.start_ns[frame_rows], fr.end_ns[frame_rows], fr.pid[frame_rows], fr.tid[frame_rows]),
                 (ops.start_ns[op_rows], ops.end_ns[op_rows], ops.pid[op_rows], ops.tid[op_rows])]
        start, end, pid, tid = (np.concatenate(x) for x in zip(*spans))
        return _inside_spans(model, rows, start, end, pid, tid)

    @functools.cached_property
    def compiles(self) -> Compiles:
        """torch.compile's compilations in the window, recompiles marked (analyzer.views.compiles)."""
        steps_before = self.meta.get("unprofiled", "steps", default=0) if self.meta else 0
        return compiles(self.model, self.frames, after_warmup=bool(steps_before))

    @functools.cached_property
    def recompile_pieces(self) -> np.ndarray:
        """Idle pieces of cause warmup that lie inside a recompile: the recompiles detector owns them, not warmup."""
        idle, c = self.idle, self.compiles
        sel = np.flatnonzero(idle.cause == WARMUP)
        if not c.recompile.any() or not len(sel):
            return np.zeros(0, np.int64)
        s, e = self.recompile_spans
        mid = idle.start_ns[sel] + (idle.end_ns[sel] - idle.start_ns[sel]) // 2
        i = np.searchsorted(s, mid, side="right") - 1
        return sel[(i >= 0) & (mid < e[np.maximum(i, 0)])]

    @functools.cached_property
    def graph_breaks(self) -> GraphBreaks:
        """torch.compile graph breaks taken in the window (analyzer.views.graph_breaks)."""
        return graph_breaks(self.model)

    @functools.cached_property
    def graph_break_pieces(self) -> np.ndarray:
        """Launch-gap idle pieces inside a graph break's eager section: the graph-breaks detector owns them."""
        return _in_graph_breaks(self.idle, self.graph_breaks)

    @functools.cached_property
    def queued_waits(self) -> QueuedWaits:
        """What each queued idle piece waited for (analyzer.views.queued)."""
        return queued_waits(self.model, self.gaps, self.idle)

    @functools.cached_property
    def replay(self) -> ReplayModel:
        """The trace as a replay model: `replay.run(removed=..., no_wait=...)` replays it with CPU time taken out."""
        return build_replay(self.model, self.blocking, self.steps, worker_input_waits(self.model))

    @functools.cached_property
    def inner_loop(self) -> InnerLoop | None:
        """The loop inside the measured steps that CUDA graphs would replay (analyzer.views.graphable), None where the
        whole step is the graph or the replay cannot model the trace: what the launch fix prices and advises."""
        if self.replay.limits:
            return None
        return loop_of(self, self.replay, measure_for(self))

    @functools.cached_property
    def memory_series(self) -> tuple[MemorySeries, ...]:
        mem = self.model.memory
        cuda = (mem.device_type == 1) & ~mem.is_oom
        out = []
        for device in sorted(set(mem.device_id[cuda].tolist())):
            rows = np.flatnonzero(cuda & (mem.device_id == device))
            rows = rows[np.argsort(mem.ts_ns[rows], kind="stable")]
            out.append(MemorySeries(int(device), rows, mem.ts_ns[rows], mem.total_allocated[rows],
                                    mem.total_reserved[rows]))
        return tuple(out)


def _in_graph_breaks(idle: IdlePieces, breaks) -> np.ndarray:
    """Launch-gap pieces (cause cpu_launch) whose middle lies inside a graph break's eager section."""
    sel = np.flatnonzero(idle.cause == CPU_LAUNCH)
    if not len(breaks) or not len(sel):
        return np.zeros(0, np.int64)
    s, e = merge_intervals(breaks.eager_start_ns, breaks.eager_end_ns)
    mid = idle.start_ns[sel] + (idle.end_ns[sel] - idle.start_ns[sel]) // 2
    i = np.searchsorted(s, mid, side="right") - 1
    return sel[(i >= 0) & (mid < e[np.maximum(i, 0)])]
