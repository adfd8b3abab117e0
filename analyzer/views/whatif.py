"""What a fix buys: each top-level finding's cause taken out of the trace's replay (analyzer.views.replay), and the
step time that is left.

The replay runs in the unprofiled world: the profiler's own cost, measured per recorded event
(analyzer.views.profiler_cost: the capture's probe, else the project's table; Python code timed against the
capture's stackless pass where it ran one), is taken out of every thread first, so that a saving is stated in the
time the user's program runs in, not in the trace's dilated time. Where meta.json times the same steps unprofiled
(the p50, on the same clock), that step checks the world the costs build; the probed costs (the GPU side's too, not
the stackless pass's measured ones) are scaled only where it misses by more than CHECK_TOLERANCE.

A detector states its finding's fix as a `Fix`: CPU intervals taken out of their threads (host work, allocator
calls, a print), blocking calls that no longer wait (the GPU work they waited for still runs), or the steps replayed
as CUDA graphs (their GPU work back to back, a graph node's gap apart).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.views.graphable import InnerLoop, inner_loop
from analyzer.views.profiler_cost import ProfilerCost, event_costs
from analyzer.views.replay import STREAM_BOUND, ReplayModel, Replayed

GRAPH_NODE_GAP_NS = 690  # an H200's gap between a replayed graph's kernels (median, 24-layer decode graph)
PARTIAL_SAVING_NS = 10_000  # a median saving under this, with a mean saving over it: the fix changes some steps
MAX_STEPS = 64  # the repeated steps a step time is the median of: the first ones, so that a long trace's replay
# stops after them
CHECK_TOLERANCE = 0.05  # the probed costs stand where their world's step is within this share of the measured one
SCALE_RANGE = (0.5, 150.0)  # how far the probed costs may be scaled to meet the measured step (150: an op
# costing ~250 µs, beyond any profiler's cost per event: a step that will not come down is not dilation)
SCALE_ROUNDS = 14
SCALE_RESOLUTION = 0.002  # of the measured step: a scale whose world's step is this near it is the one asked for
# Where the costs are the project's probes (no probe of this capture's) and no unprofiled step checks them, the
# profiler's cost on the trace's host is a guess: prices are also given at these multiples of the probed costs,
# the span the project's own H100 captures measured for the recorded calls against the probe's tight-loop figures
# (0.9x to 2.7x, docs/cli.md). A finding whose saving moves by more than GUESS_SHARE of itself across it, and
# GUESS_MIN_NS, depends on the guess.
GUESS_SCALES = (0.9, 2.7)
# Python code's own bytecode under the profiler's stack tracer (with_stack=True) ran this many times its unprofiled
# time in the project's H100 captures (torch 2.11, Python 3.12): 1.0x for an integer loop (decode_host_work's
# helper, timed by the stackless pass), 1.7x for a tokenizer's string matching, 3.1x for a detokenizer's character
# loop (tests/fixtures/h100_host_reasons, against their unprofiled timings). No recorded event says which; where a
# fix removes Python code from a guessed trace with stacks, its saving's low end is this much lower.
PYTHON_UNDER_STACKS = 3.1
GUESS_SHARE = 0.2
GUESS_MIN_NS = 10_000


@dataclasses.dataclass(frozen=True, eq=False)
class Fix:
    """What the replay changes to take a finding's cause away."""
    what: str  # one line for the report
    removed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 3), np.int64))  # (tid, start, end)
    no_wait: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))  # runtime rows
    as_graphs: bool = False  # the steps' launches replaced by graph replays (where the trace has no steps to
    # replay as graphs, `removed` stands in: the launch gaps' CPU time taken out)
    one_time: bool = False  # a cost paid once (warm-up): priced over the whole window too, not only per step
    averaged: bool = False  # a cost in whichever steps another thread's work happened to overlap, not in each:
    # priced on the mean step (the median step is a stalled one or a free one by chance)
    python_code: bool = False  # what it removes is Python code (slowed by the stack tracer where stacks were on)


def intervals_fix(what: str, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> Fix:
    return Fix(what, np.stack([np.asarray(tid, np.int64), np.asarray(start, np.int64),
                               np.asarray(end, np.int64)], axis=1).reshape(-1, 3))


def pieces_fix(ctx, pieces: np.ndarray, what: str) -> Fix | None:
    """The CPU time of these idle pieces taken out of the thread that launched the work the GPU waited for (at the
    window's tail: the last work)."""
    idle, rt = ctx.idle, ctx.model.runtime
    launch = ctx.gaps.thread_row[idle.gap[pieces]] if len(pieces) else np.zeros(0, np.int64)
    pieces = pieces[launch >= 0]
    if not len(pieces) or not len(rt):
        return None
    return intervals_fix(what, rt.tid[launch[launch >= 0]], idle.start_ns[pieces], idle.end_ns[pieces])


@dataclasses.dataclass(frozen=True)
class Measure:
    """What a step time is: the median GPU period of the repeated steps (not the prefill, not the last, whose
    period is only its own span), or the GPU's whole span where the trace has no such steps."""
    kind: str  # "step" | "window"
    steps: np.ndarray  # step indexes used (kind "step")
    label: str  # what the steps are called
    until_ns: int | None = None  # what happens after this cannot change the measured steps' periods
    busy_ns: np.ndarray | None = None  # per measured step: its GPU work's busy time, the least its period can be

    def of(self, model: ReplayModel, replayed: Replayed) -> float:
        if self.kind == "step":
            return float(np.median(self.periods(replayed)))
        return float(replayed.gpu_end_ns[model.rows].max() - replayed.gpu_start_ns[model.rows].min())

    def periods(self, replayed: Replayed) -> np.ndarray:
        """Each measured step's replayed GPU period (kind "step"), never below its GPU busy time: where the host
        runs ahead of the GPU, a step's first work (a copy on a stream of its own) can start before the previous
        step's work is done, and its start no longer marks when the GPU moved on to it."""
        periods = replayed.step_gpu_period_ns[self.steps].astype(float)
        return periods if self.busy_ns is None else np.maximum(periods, self.busy_ns)


def measure_for(ctx) -> Measure:
    table, cold = ctx.step_table, ctx.cold_steps
    with_gpu = [k for k, s in enumerate(table) if s.get("gpu_period_us") is not None]
    repeated = [k for k in with_gpu[:-1] if not table[k]["step"].startswith("prefill") and not cold[k]]
    if not repeated and len(with_gpu) > 1:
        repeated = [k for k in with_gpu[:-1] if not cold[k]]
    if not repeated:
        return Measure("window", np.zeros(0, np.int64), "window")
    repeated = repeated[:MAX_STEPS]
    label = table[repeated[0]]["step"].rstrip("0123456789#_ -") or "step"
    # a step's period ends where the next step's GPU work starts, launched before the step after that began
    lo = ctx.steps.lo_ns
    until = int(lo[repeated[-1] + 2]) if repeated[-1] + 2 < len(lo) else None
    busy = np.array([table[k]["busy_us"] * 1e3 for k in repeated], float)
    return Measure("step", np.asarray(repeated, np.int64), label, until, busy)


def graph_node_gap_ns(model: ReplayModel) -> tuple[int, str]:
    """The gap between consecutive activities of one graph replay (one launch, one stream), measured in the trace
    where it has replays, else the H200 constant."""
    same = (model.launch_ns[1:] == model.launch_ns[:-1]) & (model.stream[1:] == model.stream[:-1]) & \
        (model.thread[1:] >= 0) & (model.bound[1:] == STREAM_BOUND)
    if same.sum() >= 16:
        start = model.gpu_start_ns[model.rows[1:][same]]
        prev_end = model.gpu_end_ns[model.rows[:-1][same]]
        return int(np.median(np.maximum(start - prev_end, 0))), "this trace's graph replays"
    return GRAPH_NODE_GAP_NS, "an H200's graph replays (no replays in this trace)"


def graph_steps_ns(ctx, model: ReplayModel, measure: Measure, node_gap: int) -> float:
    """The measured steps as graph replays: their GPU work back to back, a node's gap between activities."""
    table = ctx.step_table
    if measure.kind == "step":
        counts = np.bincount(model.step[model.step >= 0], minlength=len(table))
        per = [table[k]["busy_us"] * 1e3 + max(counts[k] - 1, 0) * node_gap for k in measure.steps.tolist()]
        return float(np.median(per))
    return float(ctx.timeline.busy_ns + max(len(model.rows) - 1, 0) * node_gap)


def loop_of(ctx, model: ReplayModel, measure: Measure) -> InnerLoop | None:
    """The loop inside the measured steps whose iterations graphs would replay (analyzer.views.graphable)."""
    if measure.kind != "step":
        return None
    gpu, rt = ctx.model.gpu, ctx.model.runtime
    launch = gpu.launch[model.rows]
    launch_end = np.where(launch >= 0, rt.end_ns[np.maximum(launch, 0)], model.launch_ns) if len(rt) else \
        model.launch_ns
    return inner_loop(model, measure.steps, gpu.name[model.rows], launch_end)


def busy_per_step_ns(ctx, measure: Measure) -> float:
    if measure.kind == "step":
        return float(np.median([ctx.step_table[k]["busy_us"] * 1e3 for k in measure.steps.tolist()]))
    return float(ctx.timeline.busy_ns)


def _unprofiled_target_ns(ctx, measure: Measure) -> tuple[float, str] | tuple[None, None]:
    """meta.json's unprofiled p50 step, where it times the same steps on the GPU's clock, and which timing gave
    it: the fix comparison's rounds of this workload where the capture ran them (the last timing before the
    profiled window, so the nearest to the host's state in it, and the baseline its measured fix is compared
    against), else the timing phase."""
    meta = ctx.meta
    p50 = meta.get("unprofiled", "step_ms", "p50") if meta else None
    label = (meta.get("unprofiled", "step_label", default="") or "") if meta else ""
    clock = str(meta.get("unprofiled", "clock", default="") or "") if meta else ""
    if not p50 or measure.kind != "step" or "cuda" not in clock.lower() or not label:
        return None, None
    if not all(ctx.step_table[k]["step"].startswith(label) for k in measure.steps.tolist()):
        return None, None
    compared = meta.get("fix_comparison", "step_ms")
    if compared and compared > 0 and \
            str(meta.get("fix_comparison", "statistic", default="")).startswith("p50"):
        return float(compared) * 1e6, "fix_comparison"
    return float(p50) * 1e6, "unprofiled"


def _scale_to(measure: Measure, cost: ProfilerCost, target: float, probe_step: float):
    """The probed costs checked against the measured step: where the world they build replays the step within
    CHECK_TOLERANCE of it, they stand (scale 1); else the smallest scale of them, within SCALE_RANGE, whose world's
    step is at most the measured one (bisection: the step falls as the scale grows, and stops falling where the GPU
    becomes the bound, so the smallest such scale is the least dilation the measurement asks for). Returns (scale,
    step)."""
    if abs(probe_step - target) <= CHECK_TOLERANCE * target:
        return 1.0, probe_step

    def step(scale: float) -> float:
        world = cost.world(scale)
        return measure.of(world, world.run(overhead=cost.cut(scale), cpu=False, until_ns=measure.until_ns))

    lo, hi = (1.0, SCALE_RANGE[1]) if probe_step > target else (SCALE_RANGE[0], 1.0)
    at_lo, at_hi = (probe_step, step(hi)) if probe_step > target else (step(lo), probe_step)
    if at_hi > target:
        return hi, at_hi
    if at_lo <= target:
        return lo, at_lo
    for _ in range(SCALE_ROUNDS):
        if at_hi >= (1 - SCALE_RESOLUTION) * target:
            break
        mid = (lo + hi) / 2
        at_mid = step(mid)
        if at_mid > target:
            lo, at_lo = mid, at_mid
        else:
            hi, at_hi = mid, at_mid
    return hi, at_hi


def _headroom_ns(ctx, model: ReplayModel, measure: Measure, overhead, target: float | None,
                 world_step: float, cost: ProfilerCost) -> tuple[float, float | None]:
    """How much a fix of the CPU side can save at most: the measured unprofiled step less the GPU's own time per
    step in the world (every thread's CPU time taken out, so that each step's GPU work runs as soon as its stream
    and its graph's nodes allow). Unbounded where no step was measured, where the world replays the step no
    slower than measured, or where the world's GPU time is the probe's guess at CUPTI's cost on graph nodes (the
    replays not timed unprofiled: that guess runs short, and the bound would be too tight). Returns (the headroom,
    the GPU's time per step in the world or None)."""
    if not target or world_step <= target or measure.kind != "step":
        return np.inf, None
    if cost.graph_replays is None and cost.graph_node_gpu_ns and cost.replays_graphs:
        return np.inf, None
    m = ctx.model
    lo = min(int(m.ops.start_ns.min()) if len(m.ops) else 0, int(m.runtime.start_ns.min()) if len(m.runtime) else 0)
    hi = max(int(m.ops.end_ns.max()) if len(m.ops) else 0, int(m.runtime.end_ns.max()) if len(m.runtime) else 0)
    everything = np.array([[tid, lo, hi + 1] for tid in model.tids.tolist()], np.int64).reshape(-1, 3)
    floor = measure.of(model, model.run(everything, (), overhead, cpu=False, until_ns=measure.until_ns))
    return max(target - floor, 0.0), floor


def evaluate(ctx, findings) -> tuple[dict, dict[str, dict]]:
    """report.json's `what_if` section and, per top-level finding id, its `what_if`."""
    model = ctx.replay
    if model.limits:
        why = "; ".join(model.limits)
        return ({"available": False, "limits": list(model.limits)},
                {f.id: {"saving_ms": None, "why": f"the replay cannot model this trace: {why}"}
                 for f in findings if not f.parent})
    measure = measure_for(ctx)
    profiled = measure.of(model, model.unchanged())
    costs = event_costs(ctx)
    target, target_source = _unprofiled_target_ns(ctx, measure)
    cost = ProfilerCost(ctx, model, costs, measure.until_ns, target, measure.label)
    trace_model = model
    world = cost.world()
    probe_step = measure.of(world, world.run(overhead=cost.cut(), cpu=False, until_ns=measure.until_ns))
    scale, world_step = _scale_to(measure, cost, target, probe_step) if target else (1.0, probe_step)
    model = cost.world(scale)  # from here on, the replay with CUPTI's GPU-side gaps taken out
    overhead = cost.cut(scale)
    profiler = {"per_event_us": costs.per_event_us, "costs_from": costs.label, "estimated": costs.estimated,
                "events": cost.events(), "probe_step_ms": _ms(probe_step),
                "measured_unprofiled_step_ms": _ms(target) if target else None,
                "measured_by": {"fix_comparison": "meta.json fix_comparison.step_ms (its rounds of this workload)",
                                "unprofiled": "meta.json unprofiled.step_ms.p50"}.get(target_source),
                "probe_over_measured": round(probe_step / target, 3) if target else None,
                "scale": round(scale, 3), **({"stackless": cost.stackless} if cost.stackless else {}),
                **({"graph_replays": cost.graph_replays} if cost.graph_replays else {})}
    basis = "estimated" if costs.estimated and not target else "unprofiled"
    busy = busy_per_step_ns(ctx, measure)
    node_gap, gap_source = graph_node_gap_ns(trace_model)
    if cost.graph_node_gpu_ns:  # as probed, unscaled: the scale fits this trace's world, not graphs it never ran
        node_gap = max(node_gap - cost.graph_node_gpu_ns, 0)
        gap_source += ", less CUPTI's time per node (the probe's)"
    loop = ctx.inner_loop if any(getattr(f, "fix", None) and f.fix.as_graphs for f in findings) else None

    def fixed_step(fix: Fix, model: ReplayModel = model, overhead=overhead) -> tuple[float, Replayed | None]:
        if fix.as_graphs and loop is not None:
            return measure.of(model, model.run(loop.removed, (), overhead, cpu=False, until_ns=measure.until_ns,
                                               gap_ns=loop.gap_ns(model, node_gap))), None
        if fix.as_graphs and measure.kind == "step":
            return graph_steps_ns(ctx, model, measure, node_gap), None
        replayed = model.run(fix.removed, fix.no_wait, overhead, cpu=False, until_ns=measure.until_ns)
        return measure.of(model, replayed), replayed

    baselines: dict = {}  # per world (None: this one; a guessed cost's scale): its step periods, replayed once

    def mean_saving_ns(replayed: Replayed, world: ReplayModel = model, cut=overhead, key: float | None = None) -> float:
        """A fix that shortens only some steps can leave the median step alone: its saving per step on average."""
        if key not in baselines:
            baselines[key] = measure.periods(world.run((), (), cut, cpu=False, until_ns=measure.until_ns))
        return float(np.mean(baselines[key] - measure.periods(replayed)))

    headroom, floor = _headroom_ns(ctx, model, measure, overhead, target, world_step, cost)
    per_finding: dict[str, dict] = {}
    fixes = []
    for f in findings:
        if f.parent:
            continue
        fix = getattr(f, "fix", None)
        if fix is None:
            per_finding[f.id] = {"saving_ms": None, "why": _no_fix_why(f)}
            continue
        fixes.append(fix)
        fixed, fixed_replay = fixed_step(fix)
        after = min(fixed, world_step)
        replayed = world_step - after
        if not fix.as_graphs:
            after = max(after, world_step - headroom)
        if fix.averaged and fixed_replay is not None and measure.kind == "step" and len(measure.steps) > 1:
            after = world_step - max(min(mean_saving_ns(fixed_replay), headroom), 0.0)
        per_finding[f.id] = _saving(world_step, after, fix, measure)
        if measure.kind == "step":
            per_finding[f.id]["steps_in_window"] = len(ctx.steps)
        if fixed_replay is not None and measure.kind == "step" and len(measure.steps) > 1 and not fix.one_time \
                and not fix.averaged and world_step - after < PARTIAL_SAVING_NS:
            mean = min(mean_saving_ns(fixed_replay), headroom)
            if mean >= PARTIAL_SAVING_NS:
                per_finding[f.id]["mean_saving_ms"] = _ms(mean)
        if world_step - after < replayed:
            per_finding[f.id]["replayed_saving_ms"] = _ms(replayed)
        if fix.one_time and measure.kind == "step":  # paid once: what a warmed-up run saves over the window
            whole = Measure("window", np.zeros(0, np.int64), "window")
            before_ns = whole.of(model, model.run((), (), overhead, cpu=False))
            after_ns = whole.of(model, model.run(fix.removed, fix.no_wait, overhead, cpu=False))
            per_finding[f.id]["once_ms"] = _ms(max(before_ns - after_ns, 0.0))
            per_finding[f.id]["window_ms"] = _ms(before_ns)
        if fix.as_graphs and measure.kind != "step":
            per_finding[f.id]["fix"] = "the launch gaps' CPU time taken out (no repeated steps to replay as graphs)"
        elif fix.as_graphs and loop is not None:
            per_finding[f.id]["fix"] = (
                f"the work between host syncs that recurs inside each {measure.label} replayed as CUDA graphs "
                f"({loop.segments} segments, {loop.share:.0%} of its launches; the work that runs once per "
                f"{measure.label}, such as a prefill, stays eager)")
        kept = model.sync_cost_ns[np.isin(model.sync_rows, fix.no_wait)].sum() if len(fix.no_wait) else 0
        if kept:
            per_finding[f.id]["kept_cost_ms"] = _ms(kept)  # the blocking calls' own time, after the GPU was done
    guessed = costs.estimated and not target and fixes
    if guessed:  # the profiler's cost on this host is a guess: the prices at the ends of its plausible span
        tops = [f for f in findings if not f.parent and getattr(f, "fix", None) is not None]
        steps, savings = [], {f.id: [] for f in tops}
        for guess in GUESS_SCALES:
            world_g, overhead_g = cost.world(guess), cost.cut(guess)
            step_g = measure.of(world_g, world_g.run(overhead=overhead_g, cpu=False, until_ns=measure.until_ns))
            steps.append(step_g)
            for f in tops:
                fixed_g, replayed_g = fixed_step(f.fix, world_g, overhead_g)
                saving_g = step_g - min(fixed_g, step_g)
                if f.fix.averaged and replayed_g is not None and measure.kind == "step" and len(measure.steps) > 1:
                    saving_g = mean_saving_ns(replayed_g, world_g, overhead_g, guess)
                savings[f.id].append(max(saving_g, 0.0))
        stacks = len(ctx.model.frames) > 0
        for f in tops:
            at_all = savings[f.id] + [per_finding[f.id]["saving_ms"] * 1e6]
            if f.fix.python_code and stacks:
                at_all.append(per_finding[f.id]["saving_ms"] * 1e6 / PYTHON_UNDER_STACKS)
                per_finding[f.id]["python_under_stacks"] = [1.0, PYTHON_UNDER_STACKS]
            low, high = min(at_all), max(at_all)
            per_finding[f.id]["saving_range_ms"] = [_ms(low), _ms(high)]
            per_finding[f.id]["depends_on_guess"] = bool(high - low > max(GUESS_SHARE * high, GUESS_MIN_NS))
        profiler["guess"] = {"scales": list(GUESS_SCALES), "step_ms": [_ms(min(steps)), _ms(max(steps))],
                             "why": "no probe of this capture and no unprofiled step time to check the project's "
                                    "probes against"}
    if any(fix.as_graphs for fix in fixes) and measure.kind == "step":
        together = graph_steps_ns(ctx, model, measure, node_gap)
    elif fixes:
        removed = np.concatenate([fix.removed for fix in fixes])
        no_wait = np.concatenate([fix.no_wait for fix in fixes])
        together = measure.of(model, model.run(removed, no_wait, overhead, cpu=False, until_ns=measure.until_ns))
    else:
        together = world_step
    if not any(fix.as_graphs for fix in fixes):
        together = max(together, world_step - headroom)
    together = min(max(together, busy), world_step)
    section = {
        "available": True, "basis": basis, "measure": measure.kind, "step_label": measure.label,
        "steps_used": int(len(measure.steps)), "step_ms": _ms(world_step), "profiled_step_ms": _ms(profiled),
        "gpu_busy_per_step_ms": _ms(busy), "graph_node_gap_us": round(node_gap / 1e3, 3),
        **({"headroom_ms": _ms(headroom), "gpu_floor_ms": _ms(floor)} if np.isfinite(headroom) else {}),
        "graph_node_gap_source": gap_source, "profiler": profiler,
        "all_fixed": {"fixed_step_ms": _ms(together), "saving_ms": _ms(world_step - together),
                      "bound": "GPU busy time per step: no fix of the CPU side goes below it"},
        "ranking": [fid for fid, w in sorted(per_finding.items(), key=lambda kv: -(kv[1]["saving_ms"] or -1))],
        "definition": ("saving = the replayed step minus the replayed step with the finding's cause taken out, "
                       + "in the unprofiled world: the profiler's cost per recorded event, "
                       + ("probed by this capture" if not costs.estimated else f"from {costs.label}")
                       + (" (Python code's from the capture's pass without stacks)" if cost.stackless else "")
                       + ", taken out of every thread first"
                       + (", checked against meta.json's unprofiled p50 (scaled where the world it builds misses "
                          f"that step by more than {CHECK_TOLERANCE:.0%}; a saving of the CPU side no more than that "
                          "step less the GPU's own work per step, where the world's GPU work was measured)"
                          if target else
                          " (no unprofiled step time of the same steps to check it against)")
                       + "; step = " + (f"the median GPU period of the first {MAX_STEPS} repeated steps (all where "
                                        f"fewer)" if measure.kind == "step"
                                        else "the GPU's span over the whole window")),
    }
    return section, per_finding


def _saving(before: float, after: float, fix: Fix, measure: Measure) -> dict:
    saving = before - after
    return {"measure": measure.kind, "step_ms": _ms(before), "fixed_step_ms": _ms(after),
            "saving_ms": _ms(saving), "saving_share": round(saving / before, 4) if before > 0 else None,
            "fix": fix.what}


def _no_fix_why(finding) -> str:
    if finding.kind == "queued":
        return "GPU-side waits between work already queued: no CPU-side change removes them"
    if finding.kind == "launch_gap":
        return "the window records CUDA-graph capture: a one-time cost the replay does not rebuild"
    return "no fix the replay can model"


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 4)
