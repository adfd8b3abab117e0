"""Launch gaps: GPU idle while the CPU had not yet launched the next work (eager launch overhead), the long gaps
where it ran host code instead (one finding per responsible function), and the gaps between work that was
already queued; plus launch statistics, the per-step table and a CUDA-graph estimate."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for
from analyzer.units import us
from analyzer.views.idle import CAUSES, CPU_LAUNCH, QUEUED
from analyzer.units import fmt_fine_us, fmt_us, plural
from analyzer.views.frames import FrameKind, describe_frame
from analyzer.views.host_during import TRACED_SHARE
from analyzer.views.sites import KIND_NONE, KIND_OP, describe_site, frames_key, op_key, site_keys
from analyzer.views.timeline import merge_intervals
from analyzer.views.traits import is_compiled_region
from analyzer.trace.joins import Intervals, holding_any, thread_keys
from analyzer.views.queued import DEVICE_LATENCY_NS, REASONS as QUEUED_REASONS
from analyzer.views.waits import present_codes
from analyzer.views.whatif import Fix, graph_node_gap_ns, graph_steps_ns, measure_for, pieces_fix

MAX_SITES = 50
MINOR_SHARE = 0.05  # launch gaps below this share of the window get no launch-overhead advice
CHILD_SHARE = 0.10  # a launch site (library) is shown under the launch (host-work) finding when it holds this share
MAX_LIBRARIES = 4  # library children under one host-work finding


def detect(ctx: AnalysisContext, *, top_n: int = 25, long_gap_us: float = 1000.0) -> DetectorResult:
    idle = ctx.idle
    window_us = ctx.timeline.window_ns / 1e3
    dur = idle.duration_ns
    by_cause = {c: us(idle.total_ns(i)) for i, c in enumerate(CAUSES)}
    gap_cause = distinct(idle.gap * len(CAUSES) + idle.cause)  # each (gap, cause) pair once
    per_cause = np.bincount(gap_cause % len(CAUSES), minlength=len(CAUSES))
    counts = {c: int(per_cause[i]) for i, c in enumerate(CAUSES)}
    launch = idle.cause == CPU_LAUNCH
    launch[ctx.graph_break_pieces] = False  # the graph-breaks detector's
    long = launch & (dur >= long_gap_us * 1e3)
    short = launch & ~long
    sites = _sites(ctx)
    host_work, host_fixes = _host_work(ctx, np.flatnonzero(long))
    per_step = ctx.step_table
    graph = _graph_estimate(ctx, per_step)
    data = {
        "by_cause": by_cause,
        "count_by_cause": counts,
        "top": _top(ctx, top_n),
        "sites": sites,
        "host_work": host_work,
        "per_step": per_step,
        "step_source": ctx.steps.source,
        "launch_stats": launch_stats(ctx),
        "cuda_graph_estimate": graph,
        "graphs": ctx.graphs.as_dict(),
        "long_gap_us": long_gap_us,
    }
    findings = _launch_findings(ctx, short, window_us, graph, long_gap_us, per_step)
    findings += _host_work_findings(host_work, host_fixes, window_us, long_gap_us, ctx.traits.graphs.replayed)
    findings += _queued_finding(ctx, window_us)
    return DetectorResult({"gaps": data}, tuple(findings))


def _pieces_site_keys(ctx: AnalysisContext, sel: np.ndarray) -> np.ndarray:
    """Site keys of the runtime rows responsible for the selected idle pieces."""
    rt, idle = ctx.model.runtime, ctx.idle
    row = idle.row[sel]
    if not len(rt):
        return site_keys(ctx, idle.frame[sel], idle.op[sel], np.full(len(sel), -1))
    safe = np.maximum(row, 0)
    # a piece cut for a runtime call names the call's site; one cut for a frame or an op (a wait, an import, a
    # first call) names that frame's or op's
    return site_keys(ctx, np.where(row >= 0, rt.frame[safe], idle.frame[sel]),
                     np.where(row >= 0, rt.op[safe], idle.op[sel]), np.where(row >= 0, rt.name[safe], -1))


def _sites(ctx: AnalysisContext) -> list[dict]:
    """Idle time by (cause, call site, library site), all in numpy; the details only for what is reported."""
    idle, rt = ctx.idle, ctx.model.runtime
    if not len(idle):
        return []
    keys = _pieces_site_keys(ctx, np.arange(len(idle)))
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
    step_of = steps.index_at(idle.start_ns[biggest]) if len(steps) else np.full(len(biggest), -1)
    keys = _pieces_site_keys(ctx, biggest)
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


def _host_work(ctx: AnalysisContext, sel: np.ndarray) -> tuple[list[dict], list[Fix]]:
    """Long CPU pieces grouped by the function responsible: the innermost user function that covers at least half
    of the piece on the launching thread (a helper, not the generator expression inside it, nor its caller when
    the helper alone ran), else the op that ran, else the launch site. With each group, its fix: the responsible
    function's (or op's) whole run taken out, or only the idle piece where that run is over twice as long."""
    model, idle = ctx.model, ctx.idle
    if not len(sel):
        return [], []
    rows = idle.row[sel]
    lo, hi = idle.start_ns[sel], idle.end_ns[sel]
    middle = lo + (hi - lo) // 2
    at_middle = _innermost_at(ctx, rows, middle)
    op_at_middle = _outer_op_at(ctx, rows, middle)
    launch_keys = _launch_site_keys(ctx, rows).tolist()
    tids = model.runtime.tid[ctx.gaps.launch[idle.gap[sel]]]
    groups: dict[int, list[int]] = defaultdict(list)
    work: dict[int, set] = defaultdict(set)
    owners: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # (user frame, piece start, piece end)
    untraced: dict[int, int] = defaultdict(int)  # ns of the group's pieces that nothing recorded inside covers
    bare: dict[int, bool] = {}  # the group's pieces have no recorded context at all (named by the next launch)
    during = ctx.host_during
    for i, (piece, frame) in enumerate(zip(sel.tolist(), at_middle.tolist())):
        key, span, owner = _responsible(ctx, frame, int(lo[i]), int(hi[i]), launch_keys[i], int(op_at_middle[i]))
        groups[key].append(piece)
        d = during.of(piece)
        # an op's own time is its C++ code running (e.g. cuDNN's heuristics), not time the trace failed to record
        if d >= 0 and during.traced_share[d] < TRACED_SHARE and key >> 60 != KIND_OP:
            untraced[key] += int(hi[i] - lo[i])
        bare[key] = bare.get(key, True) and span is None
        if owner >= 0:
            owners[key].append((owner, int(lo[i]), int(hi[i])))
        a, b = span if span and span[1] - span[0] <= 2 * (hi[i] - lo[i]) else (int(lo[i]), int(hi[i]))
        work[key].add((int(tids[i]), a, b))
    out = []
    for key, members in groups.items():
        members.sort(key=lambda p: -(idle.end_ns[p] - idle.start_ns[p]))
        lead = members[0]
        lead_frame = int(at_middle[np.searchsorted(sel, lead)])
        site = describe_site(ctx, key, lead_frame)
        durations = [us(idle.end_ns[p] - idle.start_ns[p]) for p in members]
        out.append(({"call_site": site["label"], "site": site, "count": len(members),
                     "idle_us": round(sum(durations), 3), "max_us": max(durations),
                     "untraced_us": us(untraced[key]), "recorded_context": not bare[key],
                     "context": model.frame_chain(lead_frame, 8) if lead_frame >= 0 else [],
                     "launch_site": describe_site(ctx, int(_pieces_site_keys(ctx, np.array([lead]))[0]))["label"],
                     "libraries": _library_children(ctx, owners.get(key, [])),
                     "occurrences": [(us(idle.start_ns[p]), us(idle.end_ns[p])) for p in members[:16]]},
                    Fix(f"{site['label']} taken out of the step (or overlapped with GPU work)",
                        np.asarray(sorted(work[key]), np.int64).reshape(-1, 3))))
    out.sort(key=lambda h: -h[0]["idle_us"])
    return [h for h, _ in out], [f for _, f in out]


def _library_children(ctx: AnalysisContext, owned: list[tuple[int, int, int]]) -> list[dict]:
    """The idle of one host-work group by the third-party library code its function ran in: the outermost library
    frames called from that function (directly or through its own helpers), each one's overlap with the group's idle
    pieces, summed by library function, largest first."""
    if not owned:
        return []
    fr, index = ctx.model.frames, ctx.frames
    owner = np.array([o for o, _, _ in owned], np.int64)
    lo, hi = np.array([a for _, a, _ in owned], np.int64), np.array([b for _, _, b in owned], np.int64)
    found = np.zeros(0, np.int64)
    if len(fr):
        s, e = merge_intervals(lo, hi)
        i = np.maximum(np.searchsorted(s, fr.start_ns, side="right") - 1, 0)
        near = holding_any(fr.start_ns, fr.end_ns, np.r_[lo, hi - 1]) | ((fr.start_ns >= s[i]) & (fr.start_ns < e[i]))
        rows = np.flatnonzero(near & (index.kind == FrameKind.LIBRARY))
        parent = fr.parent[rows]
        outer = (parent < 0) | (index.kind[np.maximum(parent, 0)] != FrameKind.LIBRARY)
        found = rows[outer]
        # a library frame under user code that a library called (a callback, a module's forward) is inside an outer
        # library frame's time already: only the outermost in time count
        order = np.lexsort((-fr.end_ns[found], fr.start_ns[found], fr.tid[found], fr.pid[found]))
        found = found[order]
        same = np.r_[False, (fr.pid[found][1:] == fr.pid[found][:-1]) & (fr.tid[found][1:] == fr.tid[found][:-1])]
        keep = np.ones(len(found), bool)
        reach = -1
        for k, row in enumerate(found.tolist()):
            if same[k] and fr.start_ns[row] < reach:
                keep[k] = False
                continue
            reach = int(fr.end_ns[row]) if not same[k] else max(reach, int(fr.end_ns[row]))
        found = found[keep]
    totals: dict[int, int] = defaultdict(int)
    for row in found.tolist():
        user, hops = index.user_frame_of(row), 0
        while user >= 0 and hops < 64 and user not in owner:  # a helper of the owner's still counts for it
            parent = int(fr.parent[user])
            user, hops = (index.user_frame_of(parent) if parent >= 0 else -1), hops + 1
        if user < 0:
            continue
        k = np.flatnonzero(owner == user)
        overlap = np.minimum(hi[k], fr.end_ns[row]) - np.maximum(lo[k], fr.start_ns[row])
        totals[int(fr.name[row])] += int(overlap[overlap > 0].sum())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return [{"library_site": describe_frame(ctx.model.names[code]), "idle_us": us(ns)} for code, ns in ranked if ns]


def _innermost_at(ctx: AnalysisContext, rows: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """The innermost Python frame active at t on the thread of each runtime row (-1 where none)."""
    frames = ctx.model.frames
    return _enclosing_at(ctx, frames, np.arange(len(frames)), rows, t_ns)


def _enclosing_at(ctx: AnalysisContext, table, candidates: np.ndarray, rows: np.ndarray,
                  t_ns: np.ndarray) -> np.ndarray:
    """Per runtime row: the innermost of the table's candidate rows on its thread that encloses the instant t (-1
    where none). Only the candidates holding one of the instants are searched (joins.holding_any)."""
    rt = ctx.model.runtime
    if not len(candidates) or not len(rows) or not len(rt):
        return np.full(len(rows), -1, np.int64)
    near = candidates[holding_any(table.start_ns[candidates], table.end_ns[candidates], t_ns)]
    safe = np.maximum(rows, 0)
    keys, query_keys = thread_keys([table.pid[near], rt.pid[safe]], [table.tid[near], rt.tid[safe]])
    found = Intervals(keys, table.start_ns[near], table.end_ns[near], sorted_by_start=True).innermost_enclosing(
        np.where(rows >= 0, query_keys, -1), t_ns, t_ns + 1)
    return np.where((rows >= 0) & (found >= 0), near[np.maximum(found, 0)] if len(near) else -1, -1)


def _responsible(ctx: AnalysisContext, frame: int, lo: int, hi: int, launch_key: int,
                 op: int) -> tuple[int, tuple[int, int] | None, int]:
    """The site key of what ran during [lo, hi), that function's (or op's) whole run where known, and the user
    frame row responsible (-1 none). A user function is one site whatever library it was in at the middle: the
    library frames are its children (_library_children)."""
    model, index = ctx.model, ctx.frames
    fr = model.frames
    if frame >= 0:
        user = index.user_frame_of(frame)
        chosen, outermost, hops = -1, -1, 0
        while user >= 0 and hops < 256:  # the bound also guards a malformed (cyclic) parent chain
            hops += 1
            covered = min(int(fr.end_ns[user]), hi) - max(int(fr.start_ns[user]), lo)
            outermost = user
            if covered * 2 >= hi - lo:
                chosen = user
                break
            parent = int(fr.parent[user])
            user = index.user_frame_of(parent) if parent >= 0 else -1
        chosen = chosen if chosen >= 0 else outermost
        lib = index.library_frame_of(frame)  # inside the user frame at the middle, so inside `chosen` too
        lib_code = int(fr.name[lib]) if lib >= 0 else -1
        if chosen >= 0 or lib >= 0:
            run = chosen if chosen >= 0 else lib
            key = frames_key(int(fr.name[chosen]), -1) if chosen >= 0 else frames_key(-1, lib_code)
            return key, (int(fr.start_ns[run]), int(fr.end_ns[run])), chosen
    if op >= 0:
        return op_key(int(model.ops.name[op])), (int(model.ops.start_ns[op]), int(model.ops.end_ns[op])), -1
    return launch_key, None, -1


def _outer_op_at(ctx: AnalysisContext, rows: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """The outermost op running at t on the thread of each runtime row (-1 where none)."""
    ops = ctx.model.ops
    found = _enclosing_at(ctx, ops, np.flatnonzero(~ops.is_annotation.astype(bool)), rows, t_ns)
    return np.where(found >= 0, ctx.outermost_ops[np.maximum(found, 0)], -1) if len(ops) else found


def _launch_site_keys(ctx: AnalysisContext, rows: np.ndarray) -> np.ndarray:
    """Site keys of the runtime rows (a piece with none, row -1, gets the empty site)."""
    rt = ctx.model.runtime
    keys = np.full(len(rows), KIND_NONE << 60, dtype=np.int64)
    has = np.flatnonzero(rows >= 0)
    if len(has):
        at = rows[has]
        keys[has] = site_keys(ctx, rt.frame[at], rt.op[at], rt.name[at])
    return keys


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
    graph_us, node_gap_us = busy, None
    measure = measure_for(ctx)
    if measure.kind == "step" and not ctx.replay.limits:  # as the launch finding's what_if prices it
        gap_ns, _ = graph_node_gap_ns(ctx.replay)
        graph_us, node_gap_us = graph_steps_ns(ctx, ctx.replay, measure, gap_ns) / 1e3, gap_ns / 1e3
    est = {
        "steps_used": len(repeated), "gpu_busy_per_step_us": round(busy, 3),
        "profiled_step_us": round(period, 3), "eager_step_us": round(eager_us, 3),
        "eager_step_source": "meta.json unprofiled p50" if eager_us != period else "profiled trace",
        "estimated_graph_step_us": round(graph_us, 3), "graph_node_gap_us": node_gap_us,
        "estimated_speedup": round(eager_us / graph_us, 2) if graph_us > 0 else None,
        "recoverable_us_per_step": round(max(eager_us - graph_us, 0.0), 3),
    }
    if meta and meta.get("mode_comparison"):
        mc = meta.data["mode_comparison"]
        est["measured"] = {"eager_step_us": round(mc["eager_step_ms"] * 1e3, 3),
                           "cuda_graph_step_us": round(mc["cuda_graph_step_ms"] * 1e3, 3),
                           "speedup": round(mc["eager_over_graph"], 2)}
    return est


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
        return (f"Launch gaps are a small share of this window (under {MINOR_SHARE:.0%}): the CPU keeps work queued "
                f"most of the time. Look at the larger findings first.")
    if traits.training:
        compile_advice = ("The model already runs torch.compile graphs (CompiledFunction), whose kernels are still "
                          "launched one by one: mode=\"reduce-overhead\" replays them as CUDA graphs" if traits.compiled
                          else "torch.compile the model (mode=\"reduce-overhead\" adds CUDA graphs)")
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
    advice = (f"The GPU finishes each kernel before Python has launched the next: the {step} is bound by eager "
              f"launch overhead (Python, dispatcher, the launch call). Capture the {step} in a {word} "
              f"(torch.cuda.CUDAGraph / torch.compile(mode=\"reduce-overhead\")), batch more work per step, or fuse "
              f"small ops." + (" Parts of the model run as torch.compile graphs already, but most of these gaps come "
                               "before work launched eagerly." if traits.compiled else "") + _engine_hint(ctx))
    if graph and graph.get("measured"):
        m = graph["measured"]
        advice += (f" Measured on this run: {m['eager_step_us'] / 1e3:.2f} ms eager, "
                   f"{m['cuda_graph_step_us'] / 1e3:.2f} ms as a graph ({m['speedup']:.1f}x).")
    return advice


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
    keys = _pieces_site_keys(ctx, rows)
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
                              compiled=_compiled_share(ctx, rows) >= 0.5), count=gaps,
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


def _launch_fix(ctx: AnalysisContext, pieces: np.ndarray) -> Fix | None:
    """Inference launched eagerly: the steps replayed as CUDA graphs. A run that replays graphs already, or a
    training step (not one graph): the eager launches' gaps taken out. A window recording capture: none."""
    traits = ctx.traits
    if traits.graphs.captured:
        return None
    if traits.graphs.replayed or traits.training:
        return pieces_fix(ctx, pieces, "the CPU time before each eagerly launched kernel taken out")
    gaps = pieces_fix(ctx, pieces, "")
    return Fix(f"the {traits.step_word}s replayed as {traits.graph_word}s (their GPU work back to back)",
               gaps.removed if gaps else np.zeros((0, 3), np.int64), as_graphs=True)


def share_text(part: float, whole: float) -> str:
    share = 100 * part / whole if whole else 0.0
    return "<1%" if 0 < share < 1 else f"{share:.0f}%"


def _host_work_advice(site: dict, graphs_replayed: bool) -> str:
    op = site.get("op")
    if not op or site.get("call_site"):
        return ("The CPU ran this code for over a millisecond with nothing queued on the GPU: move host work (data "
                "preparation, Python bookkeeping, logging, tokenization) out of the step, precompute it, or queue "
                "the next GPU work before doing it so the two overlap.")
    if is_compiled_region(op):
        graphs = ("; under mode=\"reduce-overhead\", the CUDA-graph tree's checks of its inputs' addresses, copies "
                  "of inputs that moved and re-recording when they keep moving" if graphs_replayed else "")
        keep = ("Keep the inputs at fixed addresses across calls (one preallocated cache or buffer, reset in place). "
                if graphs_replayed else "")
        return (f"The CPU spent over a millisecond inside the compiled region {op} with nothing queued on the GPU: "
                f"torch.compile's own cost around its kernels (Dynamo's guard checks, AOT autograd's runtime "
                f"wrappers, the Python launchers of Triton kernels{graphs}), or eager code the region runs between "
                f"them. {keep}Run with TORCH_LOGS=\"recompiles,guards"
                f"{',cudagraphs' if graphs_replayed else ''}\" to see what it re-does each call; with_stack=True "
                f"shows the frames inside it.")
    advice = (f"The CPU spent over a millisecond inside {op} with nothing queued on the GPU. The trace has no Python "
              f"stack (record with with_stack=True to see the line that called it). If the op works on host tensors, "
              f"move it out of the step; if it launches many small GPU ops, its per-call CPU cost is the gap: batch "
              f"or fuse the calls (foreach / fused variants).")
    if op == "aten::zero_":
        advice += " For gradients, optimizer.zero_grad(set_to_none=True) (the default since torch 2.0) skips it."
    return advice


UNTRACED_ADVICE = (
    "The profiler recorded nothing inside this time on the thread that launches the GPU work: no op, no CUDA call, no "
    "Python call (or only the enclosing one). It is the interpreter running that code's own lines, a JIT or compiler "
    "(TorchScript's profiling executor, torch.compile, Triton), garbage collection, waiting for the GIL held by "
    "another thread, or the OS. Record with with_stack=True (and record_shapes) to see Python calls; if it happens "
    "only in the first iterations, profile after warm-up; py-spy or Nsight Systems' CPU sampling show what the "
    "thread ran.")


def _host_work_findings(host_work: list[dict], fixes: list[Fix], window_us: float,
                        long_gap_us: float, graphs_replayed: bool) -> list[Finding]:
    out = []
    for k, (h, fix) in enumerate(zip(host_work, fixes)):
        libraries = [lib for lib in h["libraries"] if lib["idle_us"] >= CHILD_SHARE * h["idle_us"]][:MAX_LIBRARIES]
        untraced = h["untraced_us"] * 2 >= h["idle_us"]
        if not untraced:
            what, advice = f"while the CPU ran {h['call_site']}", _host_work_advice(h["site"], graphs_replayed)
        elif h["recorded_context"]:
            what = f"in untraced host time inside {h['call_site']} (nothing recorded under it)"
            advice = UNTRACED_ADVICE
        else:
            what = f"in untraced host time (nothing recorded on the launching thread) before {h['call_site']}"
            advice = UNTRACED_ADVICE
        out.append(Finding(
            kind="host_work", severity=severity_for(h["idle_us"], window_us),
            title=f"GPU idle {h['count']}x for over {long_gap_us / 1e3:g} ms (max {h['max_us'] / 1e3:.1f} ms) {what}",
            call_site=h["call_site"], library_site=None if libraries else h["site"]["library_below"],
            impact_us=h["idle_us"], count=h["count"], id=f"host_work.{k}",
            advice=advice,
            detail={"context": h["context"], "launch_site": h["launch_site"], "site": h["site"],
                    "libraries": h["libraries"]},
            occurrences_us=tuple(tuple(o) for o in h["occurrences"]), fix=fix))
        for j, lib in enumerate(libraries):
            out.append(Finding(
                kind="host_work", severity=severity_for(lib["idle_us"], window_us),
                title=f"of which {share_text(lib['idle_us'], h['idle_us'])} in {lib['library_site']}",
                call_site=h["call_site"], library_site=lib["library_site"], impact_us=lib["idle_us"],
                id=f"host_work.{k}.{j}", parent=f"host_work.{k}",
                advice="Library code the function above called: a cheaper call, a smaller input, or the same work "
                       "on the GPU (torch ops on the device) removes this part.",
                detail={}))
    return out


WAIT_TEXT = {
    "before_window": "work launched before the profiling window began (the GPU was still behind the CPU when "
                     "recording started)",
    "graph_node": "between a replayed graph's nodes (the graph's own dependencies and node latency)",
    "event_wait": "waits on another stream (cudaStreamWaitEvent after the stream's previous work)",
    "host_callback": "a host function queued on the stream (cudaLaunchHostFunc / cudaStreamAddCallback)",
    "pageable_copy": "host-to-device copies from pageable memory (the driver stages them on the host first)",
    "device_latency": f"gaps under {DEVICE_LATENCY_NS / 1e3:g} µs: the device's latency between queued work",
    "unseen_wait": "waits the trace does not show (another process or device, an event recorded outside the "
                   "window)",
}
WAIT_SHORT = {"before_window": "behind work launched before the window",
              "graph_node": "between a replayed graph's nodes", "event_wait": "waiting on another stream",
              "host_callback": "behind host callbacks on the stream",
              "pageable_copy": "before pageable host-to-device copies",
              "device_latency": f"in gaps under {DEVICE_LATENCY_NS / 1e3:g} µs (device latency)",
              "unseen_wait": "on waits the trace does not show"}
WAIT_ADVICE = {
    "before_window": "Start recording after the CPU and GPU are in step (a schedule with warm-up steps).",
    "graph_node": "Fewer, larger graph nodes (fusion) or fewer memset/copy nodes shorten it.",
    "event_wait": "The work waited for what another stream was running (often a collective or a copy): overlap it "
                  "with independent work, or move the wait later, just before the result is needed.",
    "host_callback": "Host callbacks serialize the stream behind the host: move them off the stream.",
    "pageable_copy": "Pin the source (.pin_memory()) and copy with non_blocking=True.",
    "device_latency": "Fewer, larger kernels (fusion, CUDA graphs) shrink it.",
    "unseen_wait": "Profile the other ranks or processes (analyze-many) to see what it waited for.",
}


def _queued_finding(ctx: AnalysisContext, window_us: float) -> list[Finding]:
    idle = ctx.idle
    sel = idle.cause == QUEUED
    impact = us(idle.duration_ns[sel].sum())
    if impact <= 0:
        return []
    n = int(len(distinct(idle.gap[sel])))
    worst = np.flatnonzero(sel)[np.argsort(-idle.duration_ns[sel], kind="stable")[:8]]
    waits = _queued_breakdown(ctx)
    parts = "; ".join(f"{w['what']}: {fmt_us(w['idle_us'])}" for w in waits)
    parent = Finding(
        kind="queued", severity=severity_for(impact, window_us),
        title=f"GPU idle between work that was already queued ({plural(n, 'gap')}, mean {fmt_fine_us(impact / n)})",
        call_site=None, impact_us=impact, count=n, id="queued",
        advice="Nothing on the CPU delayed these: the next work had been launched before the GPU ran dry. By what "
               f"it waited for: {parts}. " + " ".join(WAIT_ADVICE[w["reason"]] for w in waits[:3]),
        detail={"before_window_us": next((w["idle_us"] for w in waits if w["reason"] == "before_window"), 0.0),
                "waits": waits},
        occurrences_us=tuple((us(idle.start_ns[i]), us(idle.end_ns[i])) for i in worst.tolist()))
    children = [Finding(
        kind="queued", severity=severity_for(w["idle_us"], window_us),
        title=f"of which {share_text(w['idle_us'], impact)} {WAIT_SHORT[w['reason']]}"
              + (f", after {w['example']}" if w.get("example") else ""),
        call_site=None, impact_us=w["idle_us"], count=w["count"], id=f"queued.{w['reason']}", parent="queued",
        advice=WAIT_ADVICE[w["reason"]], detail={"reason": w["reason"], "example": w.get("example")},
        occurrences_us=tuple(tuple(o) for o in w["occurrences"]))
        for w in waits if len(waits) > 1 and w["idle_us"] >= CHILD_SHARE * impact]
    return [parent, *children]


def _queued_breakdown(ctx: AnalysisContext) -> list[dict]:
    """Queued idle by what the next work waited for (analyzer.views.queued), largest first; an event wait names
    the work on the other stream that ran last before its longest occurrence."""
    q, idle, model = ctx.queued_waits, ctx.idle, ctx.model
    dur = idle.duration_ns[q.pieces]
    out = []
    for code, reason in enumerate(QUEUED_REASONS):
        mine = np.flatnonzero(q.reason == code)
        if not len(mine):
            continue
        longest = mine[np.argsort(-dur[mine], kind="stable")]
        entry = {"reason": reason, "what": WAIT_TEXT[reason], "idle_us": us(dur[mine].sum()),
                 "count": int(len(mine)),
                 "occurrences": [(us(idle.start_ns[q.pieces[i]]), us(idle.end_ns[q.pieces[i]]))
                                 for i in longest[:8].tolist()]}
        other = next((int(q.other_gpu[i]) for i in longest.tolist() if q.other_gpu[i] >= 0), -1)
        if other >= 0:
            entry["example"] = (f"{describe_gpu_work(model.names[model.gpu.name[other]])} on stream "
                                f"{int(model.gpu.stream[other])}")
        out.append(entry)
    return sorted(out, key=lambda w: -w["idle_us"])


def describe_gpu_work(name: str) -> str:
    """A kernel or copy name short enough for a title: a collective, a copy, else the kernel's name cut short."""
    if "nccl" in name.lower() or "rccl" in name.lower():
        return f"a collective ({name.split('(')[0][:48]})"
    if name.startswith(("Memcpy", "Memset")):
        return f"a {name.split(' (')[0]}"
    return name.removeprefix("void ").split("(")[0].split("<")[0][:48]
