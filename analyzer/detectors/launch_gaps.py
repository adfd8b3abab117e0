"""Launch gaps: GPU idle while the CPU had not yet launched the next work (eager launch overhead): the gaps under a
millisecond (the longer ones are host work, analyzer.detectors.host_work); plus the idle by cause, the largest
pieces and the call sites, launch statistics, the per-step table and a CUDA-graph estimate (report.json `gaps`)."""
from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for, share_text
from analyzer.units import fmt_us, plural, us
from analyzer.views.idle import CAUSES, CPU_LAUNCH, HOST_COMPUTE, INPUT_WAIT, SETUP
from analyzer.views.host_during import LONG_NS
from analyzer.views.sites import describe_site, piece_site_keys
from analyzer.views.setup import RECURRING
from analyzer.views.waits import present_codes
from analyzer.views.whatif import Fix, graph_node_gap_ns, graph_steps_ns, measure_for, pieces_fix

MAX_SITES = 50
MINOR_SHARE = 0.05  # launch gaps below this share of the window get no launch-overhead advice
CHILD_SHARE = 0.10  # a launch site is shown under the launch finding when it holds this share
OPTIMIZER_SHARE = 0.25  # the optimizer's code holds this share of the launch gaps: its own launches are named
OPTIMIZER_STEP = re.compile(r"Optimizer\.step#|_single_tensor_\w+")  # torch.optim's annotation; its per-tensor loop
HOST_BOUND_SHARE = 0.10  # host math and input waits this share of the idle: the step cannot be one CUDA graph


def detect(ctx: AnalysisContext, *, top_n: int = 25) -> DetectorResult:
    idle = ctx.idle
    window_us = ctx.timeline.window_ns / 1e3
    by_cause = {c: us(idle.total_ns(i)) for i, c in enumerate(CAUSES)}
    gap_cause = distinct(idle.gap * len(CAUSES) + idle.cause)  # each (gap, cause) pair once
    per_cause = np.bincount(gap_cause % len(CAUSES), minlength=len(CAUSES))
    counts = {c: int(per_cause[i]) for i, c in enumerate(CAUSES)}
    short = idle.cause == CPU_LAUNCH
    short[ctx.graph_break_pieces] = False  # the graph-breaks detector's
    short &= idle.duration_ns < LONG_NS  # the longer ones: host work
    per_step = ctx.step_table
    graph = _graph_estimate(ctx, per_step)
    data = {
        "by_cause": by_cause,
        "count_by_cause": counts,
        "top": _top(ctx, top_n),
        "sites": _sites(ctx),
        "per_step": per_step,
        "step_source": ctx.steps.source,
        "launch_stats": launch_stats(ctx),
        "cuda_graph_estimate": graph,
        "graphs": ctx.graphs.as_dict(),
        "long_gap_us": LONG_NS / 1e3,
    }
    findings = _launch_findings(ctx, short, window_us, graph, LONG_NS / 1e3, per_step)
    return DetectorResult({"gaps": data}, tuple(findings))


def _sites(ctx: AnalysisContext) -> list[dict]:
    """Idle time by (cause, call site, library site), all in numpy; the details only for what is reported."""
    idle, rt = ctx.idle, ctx.model.runtime
    if not len(idle):
        return []
    keys = piece_site_keys(ctx, np.arange(len(idle)))
    dur_us = idle.duration_ns / 1e3
    site_codes, site_index = np.unique(keys, return_inverse=True)
    groups, inverse = np.unique(site_index.reshape(-1) * len(CAUSES) + idle.cause, return_inverse=True)
    groups = np.stack([groups % len(CAUSES), site_codes[groups // len(CAUSES)]])
    inverse = inverse.reshape(-1)
    total = np.bincount(inverse, weights=dur_us, minlength=groups.shape[1])
    count = np.bincount(inverse, minlength=groups.shape[1])
    largest = np.zeros(groups.shape[1])
    np.maximum.at(largest, inverse, dur_us)
    ranked = np.argsort(-total, kind="stable")[:MAX_SITES]
    out = []
    for g in ranked.tolist():
        members = np.flatnonzero(inverse == g)
        members = members[np.argsort(-dur_us[members], kind="stable")]
        lead = int(members[0])
        row = int(idle.row[lead])
        frame = int(rt.frame[row]) if row >= 0 and len(rt) else -1
        site = describe_site(ctx, int(groups[1, g]), frame)
        out.append({
            "cause": CAUSES[groups[0, g]], "call_site": site["label"], "site": site,
            "library_site": site["library_below"], "count": int(count[g]), "idle_us": round(float(total[g]), 3),
            "max_us": round(float(largest[g]), 3), "context": ctx.frames.context(frame),
            "occurrences": [(us(idle.start_ns[i]), us(idle.end_ns[i])) for i in members[:8].tolist()],
        })
    return out


def _top(ctx: AnalysisContext, top_n: int) -> list[dict]:
    idle, model = ctx.idle, ctx.model
    rt = model.runtime
    biggest = np.argsort(-idle.duration_ns, kind="stable")[:top_n]
    steps = ctx.steps
    # the step that launched the awaited work, as the per-step table counts it; else the step at the gap's start
    step_of = np.full(len(biggest), -1)
    if len(steps):
        launch = ctx.gaps.launch[idle.gap[biggest]]
        step_of = np.where(launch >= 0, steps.index_at(rt.start_ns[np.maximum(launch, 0)]) if len(rt) else -1,
                           steps.index_at(idle.start_ns[biggest]))
    keys = piece_site_keys(ctx, biggest)
    out = []
    for i, k, key in zip(biggest.tolist(), step_of.tolist(), keys.tolist()):
        r = int(idle.row[i])
        frame = int(rt.frame[r]) if r >= 0 else -1
        op = int(rt.op[r]) if r >= 0 else -1
        outer = int(ctx.outermost_ops[op]) if op >= 0 else -1
        site = describe_site(ctx, key, frame)
        out.append({"ts_us": us(idle.start_ns[i]), "dur_us": us(idle.end_ns[i] - idle.start_ns[i]),
                    "cause": CAUSES[idle.cause[i]], "device": int(ctx.gaps.device[idle.gap[i]]),
                    "op": model.names[model.ops.name[outer]] if outer >= 0 else None,
                    "call_site": site["label"], "library_site": site["library_below"],
                    "context": ctx.frames.context(frame),
                    "runtime_call": model.names[rt.name[r]] if r >= 0 else None,
                    "step": steps.names[k] if k >= 0 else None, **_allocating_line(ctx, r)})
    return out


def _allocating_line(ctx: AnalysisContext, row: int) -> dict:
    """For a cudaMalloc/cudaFree joined to the allocator's records: the exact line and the segment's size (only
    with a snapshot, so that a trace without one reports as before)."""
    records = ctx.allocator_records
    return (records.record_of_call(row) if records is not None else None) or {}


def launch_stats(ctx: AnalysisContext) -> dict:
    model, rt, gpu = ctx.model, ctx.model.runtime, ctx.model.gpu
    rows = np.flatnonzero(ctx.runtime_classes == apis.IS_LAUNCH)
    by_api = defaultdict(int)
    for code in rt.name[rows].tolist():
        by_api[model.names[code]] += 1
    call_us = (rt.end_ns[rows] - rt.start_ns[rows]) / 1e3
    kernels = np.flatnonzero((gpu.launch >= 0) & np.isin(gpu.launch, rows))
    launch = gpu.launch[kernels]
    delay_us = (gpu.start_ns[kernels] - rt.end_ns[launch]) / 1e3  # HTA's launch delay: call return -> start
    kernel_us = (gpu.end_ns[kernels] - gpu.start_ns[kernels]) / 1e3
    shorter = kernel_us < (rt.end_ns[launch] - rt.start_ns[launch]) / 1e3

    def dist(x):
        if len(x) == 0:
            return None
        return {"mean": round(float(x.mean()), 3), "p50": round(float(np.median(x)), 3),
                "p90": round(float(np.percentile(x, 90)), 3), "max": round(float(x.max()), 3)}

    return {
        "launches": int(len(rows)), "by_api": dict(sorted(by_api.items(), key=lambda kv: -kv[1])),
        "gpu_activities_launched": int(len(kernels)),
        "launch_call_us": dist(call_us), "launch_to_start_us": dist(delay_us), "kernel_us": dist(kernel_us),
        "kernels_shorter_than_launch_share": round(float(shorter.mean()), 4) if len(kernels) else None,
        "definition": "launch_to_start = GPU start - launch call return (HTA's launch delay); "
                      "short = GPU duration < its launch call's duration",
    }


def _graph_estimate(ctx: AnalysisContext, per_step: list[dict]) -> dict | None:
    """A CUDA graph replays the step's GPU work back to back: its step time is the GPU busy time plus one graph
    node's gap per activity (the same estimate as the launch finding's what_if). Only for eager inference traces (a
    graph run already replays; a training step is not one graph)."""
    traits = ctx.traits
    if traits.graphs.replayed or traits.graphs.captured or traits.training or not ctx.timeline.devices:
        return None
    steps = [s for s, cold in zip(per_step, ctx.cold_steps) if s["gpu_span_us"] is not None and not cold]
    repeated = [s for s in steps if not s["step"].startswith(("prefill", "ProfilerStep#"))] or steps
    if not repeated:
        return None
    busy = float(np.median([s["busy_us"] for s in repeated]))
    period = float(np.median([s["gpu_period_us"] for s in repeated]))
    meta = ctx.meta
    unprofiled_ms = meta.get("unprofiled", "step_ms", "p50") if meta else None
    eager_us = unprofiled_ms * 1e3 if unprofiled_ms and meta.get("workload", "mode") == "eager" else period
    node_gap_us = None
    measure = measure_for(ctx)
    if measure.kind == "step" and not ctx.replay.limits:  # as the launch finding's what_if prices it
        gap_ns, _ = graph_node_gap_ns(ctx.replay)
        graph_us, node_gap_us = graph_steps_ns(ctx, ctx.replay, measure, gap_ns) / 1e3, gap_ns / 1e3
        basis = "the launch finding's replay"
    else:  # a graph takes out the launch gaps and those between queued work; the step's syncs and waits stay
        # (the window's head and tail lie outside the step's GPU period: not in it, not freed from it)
        freed = float(np.median([sum(s["idle_by_cause_us"][c] - s.get("window_edge_us", {}).get(c, 0.0)
                                     for c in ("cpu_launch", "queued")) for s in repeated]))
        kept = float(np.median([s["idle_us"] - sum(s.get("window_edge_us", {}).values()) for s in repeated])) - freed
        graph_us = max(busy, eager_us - freed)
        basis = "the step's launch and queued gaps taken out" + (
            f"; its other {fmt_us(kept)} of idle kept ({_kept_causes(repeated)})" if kept >= 1.0 else "")
    est = {
        "steps_used": len(repeated), "gpu_busy_per_step_us": round(busy, 3),
        "profiled_step_us": round(period, 3), "eager_step_us": round(eager_us, 3),
        "eager_step_source": "meta.json unprofiled p50" if eager_us != period else "profiled trace",
        "estimated_graph_step_us": round(graph_us, 3), "graph_step_basis": basis, "graph_node_gap_us": node_gap_us,
        "estimated_speedup": round(eager_us / graph_us, 2) if graph_us > 0 else None,
        "recoverable_us_per_step": round(max(eager_us - graph_us, 0.0), 3),
    }
    if meta and meta.get("mode_comparison"):
        mc = meta.data["mode_comparison"]
        est["measured"] = {"eager_step_us": round(mc["eager_step_ms"] * 1e3, 3),
                           "cuda_graph_step_us": round(mc["cuda_graph_step_ms"] * 1e3, 3),
                           "speedup": round(mc["eager_over_graph"], 2)}
    return est


def _kept_causes(steps: list[dict]) -> str:
    """The step idle a graph keeps, by cause, largest first (a mean over the steps): what the estimate leaves in."""
    total: dict[str, float] = {}
    for s in steps:
        for cause, v in s["idle_by_cause_us"].items():
            if cause not in ("cpu_launch", "queued") and v:
                total[cause] = total.get(cause, 0.0) + v / len(steps)
    return ", ".join(f"{cause} {fmt_us(v)}" for cause, v in sorted(total.items(), key=lambda kv: -kv[1])[:4])


def _launch_advice(ctx: AnalysisContext, graph: dict | None, per_step: list[dict], share: float,
                   compiled: bool = False) -> str:
    traits = ctx.traits
    g = traits.graphs
    word = traits.graph_word
    if g.captured:
        return (f"This window records {word} capture ({g.captures} captures, {g.captured_launches} launches recorded "
                f"into graphs, not executed): the GPU waits while the CPU runs the capture and the eager warm-up "
                f"passes before it. That is a one-time cost; profile the steady state, where the captured graphs "
                f"are replayed, to see what launch overhead remains.")
    if g.replayed:
        return (f"The run already replays {word}s ({g.replays} replays running {g.replay_kernels} GPU activities, "
                f"whose own gaps are `queued`). These gaps come from the {g.eager_launches} launches made eagerly "
                f"outside the graphs{_where_eager(per_step)}: capture those too (a graph per prefill shape bucket, "
                f"sampling inside the graph), or take that work off the step's critical path.")
    if share < MINOR_SHARE:
        busy = ctx.timeline.busy_ns >= 0.5 * ctx.timeline.window_ns
        return (f"Launch gaps are a small share of this window (under {MINOR_SHARE:.0%})"
                + (": the CPU keeps work queued most of the time." if busy else
                   ": the GPU's idle time is mostly elsewhere.") + " Look at the larger findings first.")
    if traits.training:
        compile_advice = ("The model already runs torch.compile graphs (CompiledFunction), whose kernels are still "
                          f"launched one by one: mode=\"reduce-overhead\" replays them as {traits.graph_word}s"
                          if traits.compiled else
                          f"torch.compile the model (mode=\"reduce-overhead\" adds {traits.graph_word}s)")
        return ("The GPU finishes each kernel before the CPU has launched the next: the training step is bound by "
                f"launch overhead (Python, autograd, dispatcher, the launch call). {compile_advice}; use fused / "
                "foreach optimizer implementations, and raise the per-step work (batch size) so kernels outlast "
                "their launches.")
    step = traits.step_word
    if compiled:
        return (f"The GPU finishes each kernel before the CPU has launched the next, and most of these launches come "
                f"from a torch.compile graph: its kernels are fused but still launched one by one from Python. "
                f"Compile with mode=\"reduce-overhead\" to replay the {step} as a {word} (keep its inputs at static "
                f"addresses), or batch more work per step." + _engine_hint(ctx))
    loop = ctx.inner_loop
    if loop is not None and _host_bound_share(ctx) < HOST_BOUND_SHARE:
        capture = (f"Each {step} runs a loop of its own ({loop.segments} segments between host syncs whose kernels "
                   f"recur, {loop.share:.0%} of its launches; e.g. one forward per generated token): capture one "
                   f"iteration in a {word} and replay it per iteration, with its inputs and cache at fixed addresses "
                   f"(torch.cuda.CUDAGraph, or torch.compile(mode=\"reduce-overhead\") on the iteration's function; "
                   f"in transformers, generate() with cache_implementation=\"static\" compiles the forward it runs per "
                   f"new token so). The work that "
                   f"runs once per {step} (the prefill) stays eager; a single graph of the whole {step} cannot hold "
                   f"the host syncs between iterations.")
    else:
        capture = (f"Capture the {step} in a {word} (torch.cuda.CUDAGraph / torch.compile(mode=\"reduce-overhead\")), "
                   f"batch more work per step, or fuse small ops.")
    advice = (f"The GPU finishes each kernel before Python has launched the next: the {step} is bound by eager "
              f"launch overhead (Python, dispatcher, the launch call). {capture}"
              + (" Parts of the model run as torch.compile graphs already, but most of these gaps come "
                 "before work launched eagerly." if traits.compiled else "") + _engine_hint(ctx))
    if _host_bound_share(ctx) >= HOST_BOUND_SHARE:
        idle = ctx.idle
        present = [what for what, cause in (("computes on host tensors (the host-compute finding)", HOST_COMPUTE),
                                            ("waits for input (the input-wait finding)", INPUT_WAIT),
                                            ("sets a library up for input shapes that keep changing (the shape "
                                             "set-up finding; a graph replays only the shapes it captured)", SETUP))
                   if idle.total_ns(cause)]
        advice += (f" The {step} also " + (", ".join(present[:-1]) + " and " + present[-1] if len(present) > 1
                                           else present[0])
                   + f": a {word} holds only GPU work at the shapes it captured, so that host work has to go (or "
                   f"move off the step's path) before the {step} can be captured; until then only the launches' own "
                   f"time goes.")
    if graph and graph.get("measured"):
        m = graph["measured"]
        advice += (f" Measured on this run: {m['eager_step_us'] / 1e3:.2f} ms eager, "
                   f"{m['cuda_graph_step_us'] / 1e3:.2f} ms as a graph ({m['speedup']:.1f}x).")
    return advice


def _host_bound_share(ctx: AnalysisContext) -> float:
    """The share of the idle the host spent in work no graph of GPU launches can hold: math on host tensors, waits
    for input, and set-up for input shapes that keep changing (a graph replays the shapes it captured)."""
    idle = ctx.idle
    total = int(idle.duration_ns.sum())
    return (idle.total_ns(HOST_COMPUTE) + idle.total_ns(INPUT_WAIT) + idle.total_ns(SETUP)) / total if total else 0.0


def _compiled_share(ctx: AnalysisContext, pieces: np.ndarray) -> float:
    """The share of these idle pieces whose awaited work was launched from inside a torch.compile graph."""
    idle, rt = ctx.idle, ctx.model.runtime
    row = idle.row[pieces]
    if not len(pieces) or not len(rt):
        return 0.0
    frame = np.where(row >= 0, rt.frame[np.maximum(row, 0)], -1)
    inside = np.zeros(len(pieces), bool)
    has = frame >= 0
    inside[has] = ctx.frames.generated_frame[frame[has]] >= 0
    weights = idle.duration_ns[pieces]
    return float(weights[inside].sum() / weights.sum()) if weights.sum() else 0.0


def _engine_hint(ctx: AnalysisContext) -> str:
    """Where a serving engine's own CUDA-graph switch is, when its code is in the trace."""
    files = [ctx.model.names[c] for c in present_codes(ctx.model.frames.name, len(ctx.model.names)).tolist()]
    if any(f.startswith("vllm/") or "/vllm/" in f for f in files):
        return " vLLM captures CUDA graphs for decode unless it runs with enforce_eager=True (--enforce-eager)."
    if any(f.startswith("sglang/") or "/sglang/" in f for f in files):
        return " SGLang captures CUDA graphs unless it runs with --disable-cuda-graph."
    return ""


def _where_eager(per_step: list[dict]) -> str:
    """`, most of them in prefill (8.17 ms)`: the step that waits longest on eager launches."""
    ranked = sorted(per_step, key=lambda s: -s["idle_by_cause_us"]["cpu_launch"])
    if not ranked or not ranked[0]["idle_by_cause_us"]["cpu_launch"]:
        return " (e.g. the prefill, sampling, input preparation)"
    top = ranked[0]
    return f" ({top['step']} waits longest on them: {top['idle_by_cause_us']['cpu_launch'] / 1e3:.2f} ms)"


def _launch_findings(ctx: AnalysisContext, short: np.ndarray, window_us: float, graph: dict | None,
                     long_gap_us: float, per_step: list[dict]) -> list[Finding]:
    idle, rt = ctx.idle, ctx.model.runtime
    impact = us(idle.duration_ns[short].sum())
    if impact <= 0:
        return []
    rows = np.flatnonzero(short)
    gaps = int(len(distinct(idle.gap[rows])))
    keys = piece_site_keys(ctx, rows)
    codes, inverse = np.unique(keys, return_inverse=True)
    per_site = np.bincount(inverse.reshape(-1), weights=idle.duration_ns[rows] / 1e3, minlength=len(codes))
    counts = np.bincount(inverse.reshape(-1), minlength=len(codes))
    ranked = np.argsort(-per_site, kind="stable")
    top_sites = []
    for g in ranked[:5].tolist():
        members = rows[inverse.reshape(-1) == g]
        lead = int(members[np.argmax(idle.duration_ns[members])])
        r = int(idle.row[lead])
        frame = int(rt.frame[r]) if r >= 0 and len(rt) else -1
        site = describe_site(ctx, int(codes[g]), frame)
        worst = members[np.argsort(-idle.duration_ns[members], kind="stable")[:8]]
        top_sites.append({"call_site": site["label"], "library_site": site["library_below"], "site": site,
                          "idle_us": round(float(per_site[g]), 3), "count": int(counts[g]),
                          "context": ctx.frames.context(frame),
                          "occurrences": [(us(idle.start_ns[i]), us(idle.end_ns[i])) for i in worst.tolist()]})
    top = top_sites[0]
    parent = Finding(
        kind="launch_gap", severity=severity_for(impact, window_us),
        title=f"GPU idle {share_text(impact, window_us)} of the window waiting for the CPU to launch work "
              f"({plural(gaps, 'gap')} under {long_gap_us / 1e3:g} ms)",
        call_site=top["call_site"], library_site=top["library_site"], impact_us=impact,
        advice=_launch_advice(ctx, graph, per_step, impact / window_us if window_us else 0.0,
                              compiled=_compiled_share(ctx, rows) >= 0.5) + _optimizer_hint(top, impact), count=gaps,
        id="launch_overhead",
        detail={"share_of_window": round(impact / window_us, 4) if window_us else None,
                "top_sites": [{k: s[k] for k in ("call_site", "library_site", "idle_us", "count")} for s in top_sites]},
        occurrences_us=tuple(tuple(o) for o in top["occurrences"]), fix=_launch_fix(ctx, rows))
    children = []
    if len(top_sites) > 1 and impact >= MINOR_SHARE * window_us:
        for k, s in enumerate(top_sites):
            if s["idle_us"] < CHILD_SHARE * impact:
                continue
            children.append(Finding(
                kind="launch_gap", severity=severity_for(s["idle_us"], window_us),
                title=f"of which {share_text(s['idle_us'], impact)} waiting for launches {s['site']['phrase']}",
                call_site=s["call_site"], library_site=s["library_site"],
                impact_us=s["idle_us"], count=s["count"], id=f"launch_overhead.{k}", parent="launch_overhead",
                advice="The launches from this code keep the GPU waiting most: fuse, batch or graph-capture here first.",
                detail={"context": s["context"], "site": s["site"]},
                occurrences_us=tuple(tuple(o) for o in s["occurrences"])))
    return [parent, *children]


def _optimizer_hint(top: dict, impact_us: float) -> str:
    """The optimizer's own launches, where its code is the site most of the launch gaps wait on: zeroing gradients in
    place (one fill per parameter) or a per-parameter step loop."""
    if top["idle_us"] < OPTIMIZER_SHARE * impact_us:
        return ""
    names = " ".join(filter(None, (top["call_site"], top["library_site"], top["site"].get("op"))))
    share = share_text(top["idle_us"], impact_us)
    if "zero_grad" in names:
        return (f" {share} of these gaps wait on launches in {top['call_site']}: zero_grad() zeroes each gradient in "
                f"place, one launch per parameter, unless set_to_none=True (the default since torch 2.0), which "
                f"launches nothing.")
    if OPTIMIZER_STEP.search(names):
        return (f" {share} of these gaps wait on launches in {top['call_site']}: an optimizer step over one "
                f"parameter at a time launches several kernels per parameter; foreach=True (one launch per group of "
                f"tensors) or fused=True (one kernel for the whole step) cut that.")
    return ""


def _launch_fix(ctx: AnalysisContext, pieces: np.ndarray) -> Fix | None:
    """Inference launched eagerly: the steps replayed as CUDA graphs. A run that replays graphs already, or a
    training step (not one graph): the eager launches' gaps taken out. A window recording capture: none."""
    traits = ctx.traits
    if traits.graphs.captured:
        return None
    if traits.graphs.replayed or traits.training:
        return pieces_fix(ctx, pieces, "the CPU time before each eagerly launched kernel taken out")
    if (ctx.shape_setup.recurrence == RECURRING).any():  # new shapes every step: a graph replays only its own
        return pieces_fix(ctx, pieces, "the launch gaps' CPU time taken out (a library op sees a new input shape "
                                       f"every {traits.step_word}: a {traits.graph_word} replays only the shapes it "
                                       "captured)")
    if _host_bound_share(ctx) >= HOST_BOUND_SHARE:  # a graph cannot hold the step's host math or input waits
        return pieces_fix(ctx, pieces, "the launch gaps' CPU time taken out (the host math, input waits and set-up "
                                       f"for new shapes in the step stay: a {traits.graph_word} cannot hold them)")
    gaps = pieces_fix(ctx, pieces, "")
    return Fix(f"the {traits.step_word}s replayed as {traits.graph_word}s (their GPU work back to back)",
               gaps.removed if gaps else np.zeros((0, 3), np.int64), as_graphs=True)


