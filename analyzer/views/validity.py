"""What the trace can and cannot show, checked before any finding is stated: named checks, each with what it
measured and what it means for the findings, and the confidence each finding keeps after them.

A check's status is `ok`, `warn` (the findings it touches are less certain: confidence medium) or `fail` (they rest
on data the trace does not hold: confidence low, and the title says so). Every check reads the trace's own
structure (Kineto's correlation ids between launch calls and GPU work, streams, pids, step annotations) and
meta.json where the capture wrote one; none is tuned to one workload.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from analyzer.arrays import distinct
from analyzer.trace import GpuKind
from analyzer.units import fmt_us, plural, us
from analyzer.views import apis
from analyzer.views.idle import PROFILER
from analyzer.views.settings import setting_checks
from analyzer.views.sites import describe_site, site_keys
from analyzer.views.timeline import CLOCK_LAG_NS, first_start_delay_ns

CLOCK_LEAD_NS = 5_000  # GPU work starting this long before its launch call began cannot be one clock
CLOCK_SHARE = 0.01  # ... and this share of linked work doing so fails the check
MISSING_SHARE = 0.01  # launches without GPU work: this share of launches (or any graph launch) fails the check
OVERLAP_SHARE = 0.5  # kernels on one stream overlapping by more than half the shorter one look duplicated
DILATION_WARN = 2.0  # the profiled step this many times the unprofiled one: CPU-side idle is inflated
CUT_STEP_SHARE = 0.5  # a last step shorter than this share of the median step looks cut by the window's end
EXAMPLES = 8
RECENT_LAUNCHES = 16  # the queue's recent delay: over the last linked launches

# finding kinds whose idle is CPU time (inflated by the profiler's dilation of the CPU)
CPU_SIDE = frozenset({"launch_gap", "host_work", "warmup", "recompile", "graph_break", "event_loop_idle",
                      "thread_hop", "allocator_churn", "input_wait", "host_compute", "shape_setup"})
# finding kinds that rest on the GPU timeline being complete (idle between GPU work the trace holds)
TIMELINE = CPU_SIDE | {"sync", "queued"}


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    measured: dict
    meaning: str
    affects: frozenset = frozenset()  # finding kinds whose confidence it lowers (when not ok)

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "measured": self.measured, "meaning": self.meaning,
                "affects": sorted(self.affects)}


def validity_checks(ctx, dilation: dict | None) -> list[Check]:
    model = ctx.model
    if not len(model.gpu):
        launches = int((ctx.runtime_classes == apis.IS_LAUNCH).sum())
        return [_gpu_side_missing(ctx, launches)] if launches else []
    return [_launches_without_work(ctx), _work_without_launch(model), _host_side(model), _clock_agreement(model),
            _profiler_overhead(ctx, dilation), _window_edges(ctx), _stream_overlap(model), _processes(model),
            *setting_checks(ctx, Check)]


def _gpu_side_missing(ctx, launches: int) -> Check:
    """Launch calls recorded and not one GPU activity: the GPU side was not recorded (CUDA activity off, or CUPTI
    unable to record it), not a run that kept the GPU idle."""
    model = ctx.model
    rows = np.flatnonzero(ctx.runtime_classes == apis.IS_LAUNCH)
    by_api = Counter(model.names[c] for c in model.runtime.name[rows].tolist())
    what = ", ".join(plural(n, api + " call") for api, n in by_api.most_common())
    return Check("gpu_activity_recorded", "fail", {"launches": launches, "gpu_activities": 0, "by_api": dict(by_api)},
                 f"{what} recorded and no GPU activity (kernels, copies, memsets): the GPU side of this run was not "
                 f"recorded, so when the GPU was idle is unknown and no idle finding can be stated. Record it with "
                 f"activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]; if that was set, CUPTI could not record "
                 f"activity: another profiler (Nsight Systems / Compute, DCGM profiling) holding it, or a driver that "
                 f"restricts GPU counters to admin users (NVreg_RestrictProfilingToAdminUsers=0, or run as root)",
                 TIMELINE)


def _host_side(model) -> Check:
    """GPU work without any CPU op or Python frame: each gap can be tied to the launch call that ended it and nothing
    more (which code ran, what the host waited for)."""
    ops, frames = len(model.ops), len(model.frames)
    measured = {"cpu_ops": ops, "python_frames": frames, "runtime_calls": len(model.runtime)}
    if ops or frames:
        return Check("host_side_recorded", "ok", measured,
                     f"the host side is recorded ({plural(ops, 'CPU op')}, {plural(frames, 'Python frame')})",
                     CPU_SIDE)
    return Check("host_side_recorded", "warn", measured,
                 "no CPU ops or Python frames are recorded (ProfilerActivity.CPU off): a gap can be tied only to the "
                 "launch call that ended it, not to the code that ran or waited during it; record with "
                 "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] (and with_stack=True for the lines)",
                 CPU_SIDE)


def _call_site(ctx, row: int) -> str | None:
    rt = ctx.model.runtime
    key = site_keys(ctx, rt.frame[[row]], rt.op[[row]], rt.name[[row]])[0]
    label = describe_site(ctx, int(key))["label"]
    return None if label == "(unknown)" else label


def _unworked_launches(ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Launch calls, those without GPU work in the trace (launches recorded into a graph under stream capture run
    nothing: left out), and which of those are at the window's end: launched so late that, at the queue's recent
    delay (the largest launch-to-start delay of the last linked launches), their work would start after the
    recording ended; their work may simply have run after recording stopped."""
    model, graphs = ctx.model, ctx.graphs
    rt, gpu, ops = model.runtime, model.gpu, model.ops
    launch = np.flatnonzero(ctx.runtime_classes == apis.IS_LAUNCH)
    captured = np.zeros(len(launch), bool)
    for s, e, p, t in zip(graphs.capture_starts_ns.tolist(), graphs.capture_ends_ns.tolist(),
                          graphs.capture_pid.tolist(), graphs.capture_tid.tolist()):
        captured |= (rt.start_ns[launch] >= s) & (rt.start_ns[launch] < e) & (rt.pid[launch] == p) & \
            (rt.tid[launch] == t)
    launch = launch[~captured]
    worked = launch[rt.gpu[launch] >= 0]
    missing = launch[rt.gpu[launch] < 0]
    recent = worked[-RECENT_LAUNCHES:]
    delay = int((gpu.start_ns[rt.gpu[recent]] - rt.start_ns[recent]).max()) if len(recent) else 0
    end = max(int(rt.end_ns.max()) if len(rt) else 0, int(gpu.end_ns.max()), int(ops.end_ns.max()) if len(ops) else 0)
    return launch, missing, rt.start_ns[missing] + max(delay, 0) >= end


def _launches_without_work(ctx) -> Check:
    model = ctx.model
    rt = model.runtime
    launch, missing, at_edge = _unworked_launches(ctx)
    inside, edge = missing[~at_edge], missing[at_edge]
    names = model.names
    by_api = Counter(names[rt.name[r]] for r in inside.tolist())
    graph = sum(n for api, n in by_api.items() if api in apis.GRAPH_LAUNCH)
    share = len(inside) / len(launch) if len(launch) else 0.0
    status = "fail" if graph or (share > MISSING_SHARE and len(inside) >= 3) else "warn" if len(inside) else "ok"
    t0 = min(d.window_start_ns for d in ctx.timeline.devices) if ctx.timeline.devices else 0
    examples = [{"api": names[rt.name[r]], "at_us": us(rt.start_ns[r]),
                 "after_first_gpu_work_ms": round((rt.start_ns[r] - t0) / 1e6, 3), "call_site": _call_site(ctx, r)}
                for r in inside[:EXAMPLES].tolist()]
    if status == "ok":
        meaning = f"every launch call's GPU work is in the trace ({plural(len(launch), 'launch')})"
    else:
        what = ", ".join(f"{plural(n, api + ' call')}" for api, n in by_api.most_common())
        meaning = (f"the GPU work of {what} is not in the trace ({share:.1%} of launches): the GPU ran work the "
                   f"trace does not show, so busy time and utilization are understated and idle between the "
                   f"recorded work may have been busy")
        if graph:
            meaning += (f"; {plural(graph, 'graph launch', 'graph launches')} without their kernels is what a "
                        f"profiler without graph-node tracing writes (CUPTI records graph kernels per node only when "
                        f"asked)")
    return Check("launches_without_gpu_work", status,
                 {"launches": int(len(launch)), "without_gpu_work": int(len(inside)), "by_api": dict(by_api),
                  "at_window_end": int(len(edge)), "examples": examples},
                 meaning, TIMELINE)


def _work_without_launch(model) -> Check:
    gpu, rt = model.gpu, model.runtime
    real = gpu.kind != GpuKind.SYNC
    linked = gpu.correlation >= 0
    unlinked = real & (gpu.launch < 0)
    calls = rt.correlation[rt.correlation >= 0]
    before = unlinked & linked & (gpu.correlation < calls.min()) if len(calls) else np.zeros(len(gpu), bool)
    inside = unlinked & ~before
    n_real = int(real.sum())
    share = int(inside.sum()) / n_real if n_real else 0.0
    status = "warn" if inside.any() else "ok"
    meaning = (f"{plural(int(inside.sum()), 'GPU activity', 'GPU activities')} ({share:.1%}) match no launch call: "
               f"the idle before them cannot be tied to CPU code (it stays unexplained)" if inside.any() else
               "every GPU activity matches a launch call in the trace")
    if before.any():
        meaning += (f"; {int(before.sum())} were launched before the window began (correlation ids below every "
                    f"recorded call's), which is expected when the GPU was behind")
    return Check("gpu_work_without_launch", status,
                 {"gpu_activities": n_real, "without_launch": int(inside.sum()),
                  "launched_before_window": int(before.sum())}, meaning, frozenset({"queued"}))


def _clock_agreement(model) -> Check:
    gpu, rt = model.gpu, model.runtime
    rows = np.flatnonzero(gpu.launch >= 0)
    lead = rt.start_ns[gpu.launch[rows]] - gpu.start_ns[rows] if len(rows) else np.zeros(0, np.int64)
    early = lead > CLOCK_LEAD_NS
    share = float(early.mean()) if len(rows) else 0.0
    status = "fail" if share > CLOCK_SHARE else "warn" if early.any() else "ok"
    # the other way: a device's first work starting long after its launch returned (a clock behind the host's)
    active = np.flatnonzero(gpu.kind != GpuKind.SYNC)
    lags = {int(d): first_start_delay_ns(model, active[gpu.device[active] == d]) for d in distinct(gpu.device[active])}
    behind = {d: v for d, v in lags.items() if v is not None and v >= CLOCK_LAG_NS}
    measured = {"linked": int(len(rows)), "starting_before_launch": int(early.sum()),
                "max_lead_us": us(int(lead.max())) if len(rows) and lead.max() > 0 else 0.0,
                "median_lead_us": us(int(np.median(lead[early]))) if early.any() else 0.0,
                "first_start_delay_us": {str(d): us(v) for d, v in lags.items() if v is not None}}
    if behind and status == "ok":
        status = "warn"
        meaning = (f"the first GPU work of {plural(len(behind), 'device')} starts "
                   f"{fmt_us(us(min(behind.values())))} after its launch call returned, with nothing recorded running "
                   f"before it, though a GPU with nothing running starts queued work within microseconds: its clock is "
                   f"behind the CPU's, or the trace misses the work it ran first; the host's time before the first GPU "
                   f"work and after the last is not counted as idle, and which CPU code a gap lines up with may be "
                   f"off")
    elif status == "ok":
        meaning = "GPU work never starts before its launch call: the CPU and GPU clocks agree"
    else:
        meaning = (f"{plural(int(early.sum()), 'GPU activity', 'GPU activities')} ({share:.1%}) start before their "
                   f"launch call began, by up to {fmt_us(measured['max_lead_us'])} (median "
                   f"{fmt_us(measured['median_lead_us'])}): the GPU clock is offset from the CPU's, so which CPU "
                   f"code a gap lines up with, and every sync wait, is off by that much")
    return Check("clock_agreement", status, measured, meaning, TIMELINE)


def _profiler_overhead(ctx, dilation: dict | None) -> Check:
    instrumentation = us(int(ctx.idle.total_ns(PROFILER)))
    idle = us(ctx.timeline.idle_ns)
    factor = dilation.get("profiler_dilation") if dilation else None
    measured = {"instrumentation_idle_us": instrumentation, "idle_us": idle, "dilation": factor,
                "frames": int(len(ctx.model.frames))}
    if factor is not None and factor >= DILATION_WARN:
        status = "warn"
        meaning = (f"the profiled step took {factor:g}x the unprofiled one: the profiler slowed the CPU, so CPU-side "
                   f"causes (launch gaps, host work, compiles) are inflated in GPU idle; the saving column is "
                   f"calibrated to the unprofiled step, the idle column is not")
    elif factor is not None:
        status = "ok"
        meaning = f"the profiled step took {factor:g}x the unprofiled one: CPU-side idle is close to the real run's"
    else:
        status = "ok"
        meaning = ("no unprofiled step time to compare (meta.json): the profiler's dilation of the CPU is unknown"
                   if not ctx.meta else "meta.json's unprofiled step could not be matched to the profiled steps")
    if instrumentation:
        meaning += f"; {fmt_us(instrumentation)} of idle is the profiler's own code (not counted as any cause)"
    return Check("profiler_overhead", status, measured, meaning, CPU_SIDE)


def _window_edges(ctx) -> Check:
    steps, cold = ctx.step_table, ctx.cold_steps
    durations = [s["wall_us"] for s, c in zip(steps, cold) if s.get("wall_us") and not c]
    cut = False
    if len(durations) >= 3:
        median = float(np.median(durations[:-1]))
        cut = durations[-1] < CUT_STEP_SHARE * median
    edge_launches = _launches_at_end(ctx)
    status = "warn" if cut else "ok"
    measured = {"steps": len(steps), "last_step_cut": bool(cut), "launches_after_last_gpu_work": edge_launches}
    if cut:
        meaning = (f"the last step ({fmt_us(durations[-1])}) is under half the median step "
                   f"({fmt_us(float(np.median(durations[:-1])))}): the window ended mid-step, so per-step figures "
                   f"leave it out and its idle is partial")
    else:
        meaning = "the window holds whole steps" if steps else "no step annotations: no per-step figures to cut"
    if edge_launches:
        meaning += (f"; the last {plural(edge_launches, 'launch', 'launches')} have no GPU work in the trace "
                    f"(it ran after recording stopped)")
    return Check("window_edges", status, measured, meaning, frozenset())


def _launches_at_end(ctx) -> int:
    return int(_unworked_launches(ctx)[2].sum())


def _stream_overlap(model) -> Check:
    gpu = model.gpu
    rows = np.flatnonzero(gpu.kind != GpuKind.SYNC)
    order = rows[np.lexsort((gpu.start_ns[rows], gpu.stream[rows], gpu.device[rows]))]
    s, e = gpu.start_ns[order], gpu.end_ns[order]
    same = (gpu.device[order][1:] == gpu.device[order][:-1]) & (gpu.stream[order][1:] == gpu.stream[order][:-1])
    overlap = np.minimum(e[:-1], e[1:]) - s[1:]
    shorter = np.minimum(e[:-1] - s[:-1], e[1:] - s[1:])
    dup = same & (overlap > 0) & (overlap > OVERLAP_SHARE * np.maximum(shorter, 1))
    status = "warn" if dup.any() else "ok"
    measured = {"overlapping_pairs": int(dup.sum()), "overlap_us": us(int(overlap[dup].sum())) if dup.any() else 0.0,
                "streams": int(len(np.unique(gpu.device[rows] * 1_000_003 + gpu.stream[rows]))) if len(rows) else 0}
    meaning = ("no two activities on one stream overlap by more than half: busy time is a union of intervals"
               if not dup.any() else
               f"{plural(int(dup.sum()), 'pair')} of activities on one stream overlap by more than half the shorter "
               f"({fmt_us(measured['overlap_us'])}): duplicated or mis-timed events (work on one stream runs in "
               f"order). Busy time is computed as a union, never a sum, so it is not inflated, but durations and "
               f"counts of those kernels are")
    return Check("stream_overlap", status, measured, meaning, frozenset())


def _processes(model) -> Check:
    rt, gpu = model.runtime, model.gpu
    launching = np.unique(rt.pid[rt.gpu >= 0]) if len(rt) else np.zeros(0, np.int64)
    devices = np.unique(gpu.device)
    status = "warn" if len(launching) > 1 else "ok"
    meaning = (f"{len(launching)} processes launch GPU work in this file: the idle of a device shared by several "
               f"processes is the union of their work, and the what-if replay gives no number"
               if len(launching) > 1 else "one process launches the GPU work")
    if len(devices) > 1:
        meaning += f"; {len(devices)} devices, each with its own timeline"
    return Check("processes_and_devices", status,
                 {"launching_processes": int(len(launching)), "devices": [int(d) for d in devices]}, meaning,
                 frozenset())


CONFIDENCE = ("high", "medium", "low")


def confidence(kind: str, checks: list[Check]) -> tuple[str, list[str]]:
    """A finding's confidence after the checks, and the checks that lowered it."""
    level, why = 0, []
    for c in checks:
        if c.status == "ok" or kind not in c.affects:
            continue
        level = max(level, 2 if c.status == "fail" else 1)
        why.append(c.name)
    return CONFIDENCE[level], why


SHORT = {"launches_without_gpu_work": "GPU work missing from the trace",
         "gpu_activity_recorded": "the GPU side was not recorded", "host_side_recorded": "no CPU ops recorded", "clock_agreement": "CPU/GPU clocks disagree",
         "profiler_overhead": "CPU dilated by the profiler", "gpu_work_without_launch": "GPU work without its launch"}


def title_prefix(checks: list[Check], why: list[str]) -> str:
    """What a low-confidence title starts with: the failed checks it rests on."""
    failed = [SHORT.get(c.name, c.name) for c in checks if c.name in why and c.status == "fail"]
    return f"[unreliable: {'; '.join(failed)}] " if failed else ""
