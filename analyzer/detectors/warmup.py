"""One-time costs inside the profiled window (analyzer.views.onetime): context / stream / handle creation, module loading
at a first launch, first-call set-up, the allocator's cache filling up, CUDA-graph capture."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from analyzer.arrays import distinct
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, SiteTable, severity_for
from analyzer.units import us
from analyzer.views.frames import describe_frame
from analyzer.views.compiles import COMPILE_OP
from analyzer.views.idle import WARMUP
from analyzer.views.onetime import LABELS, SHAPE_SETUP
from analyzer.views.setup import ONE_TIME, library_of
from analyzer.units import fmt_us
from analyzer.views.whatif import pieces_fix


def detect(ctx: AnalysisContext) -> DetectorResult:
    idle, model = ctx.idle, ctx.model
    rt = model.runtime
    sel = np.setdiff1d(np.flatnonzero(idle.cause == WARMUP), ctx.recompile_pieces)  # recompiles recur: not one-time
    parts = SiteTable(sums=("idle_us",), count=None, max_occurrences=8)
    untraced = dict(zip(ctx.untraced_one_time[0].tolist(), ctx.untraced_one_time[1]))
    setup = set(ctx.shape_setup.of(ONE_TIME).tolist())
    for i in sel.tolist():
        r, frame, op = int(idle.row[i]), int(idle.frame[i]), int(idle.op[i])
        if r >= 0 and ctx.one_time[r] == SHAPE_SETUP:  # a call the set-up made: the set-up's own entry
            r, op = -1, _enclosing(model.ops.parent, int(rt.op[r]), setup)
        if i in untraced:
            what, api = untraced[i]
            text = {"JIT compilation": f"untraced host time {api} (a JIT compile)",
                    "first run": f"untraced host time {api}",
                    "cold step": f"untraced host time {api}",
                    "first call": f"untraced host time before the first {api} call (a scripted or compiled "
                                  f"function's first call)"}[what]
            what = f"untraced {what}"
        elif r >= 0:
            what, api = LABELS[ctx.one_time[r]], model.names[rt.name[r]]
            text = f"{api} ({what})"
        elif op in setup:
            api = model.names[model.ops.name[op]]
            library = library_of(api, ctx.traits.hip)
            what = "shape set-up"
            text = f"{library} set-up for a new input shape in {api}" if library else \
                f"the first {api} call at a new input shape"
        elif op >= 0 and COMPILE_OP.match(model.names[model.ops.name[op]]):
            what, api = "JIT compilation", "torch.compile (Dynamo)"
            text = f"{what} in {api}"
        elif op >= 0:
            what, api = "first call", model.names[model.ops.name[op]]
            text = f"the first {api} call's CPU time"
        elif frame >= 0:
            name = model.names[model.frames.name[frame]]
            if name.startswith("<frozen importlib"):
                what = api = text = "imports"
            else:
                what, api = "JIT compilation", describe_frame(name)
                text = f"{what} in {api}"
        else:
            what, api = "graph capture", f"{ctx.traits.graph_word} capture"
            text = api
        entry = parts.add((what, api), lambda what=what, api=api, text=text: {
            "kind": what, "api": api, "text": text, "calls": set()}, (us(idle.start_ns[i]), us(idle.end_ns[i])),
            idle_us=(idle.end_ns[i] - idle.start_ns[i]) / 1e3)
        entry["calls"].add(r)
    breakdown = parts.rows(lambda p: -p["idle_us"])
    for p in breakdown:
        p["calls"] = len(p["calls"])
    calls = defaultdict(int)
    for label in ctx.one_time[ctx.one_time > 0].tolist():
        calls[LABELS[label]] += 1
    data = {"idle_us": us(idle.duration_ns[sel].sum()), "breakdown": breakdown, "one_time_calls": dict(calls),
            "graph_captures": ctx.graphs.captures}
    return DetectorResult({"warmup": data}, tuple(_findings(ctx, data, sel)))


def _enclosing(parent: np.ndarray, op: int, rows: set) -> int:
    """The first of `rows` at or above op (-1 none)."""
    hops = 0
    while op >= 0 and op not in rows and hops < 256:
        op, hops = int(parent[op]), hops + 1
    return op if op in rows else -1


def _findings(ctx: AnalysisContext, data: dict, sel: np.ndarray) -> list[Finding]:
    impact = data["idle_us"]
    if impact <= 0:
        return []
    idle = ctx.idle
    window_us = ctx.timeline.window_ns / 1e3
    what = ", ".join(f"{p['text']} {fmt_us(p['idle_us'])}" for p in data["breakdown"][:4])
    worst = sel[np.argsort(-idle.duration_ns[sel], kind="stable")[:8]]
    libraries = "MIOpen/hipBLAS" if ctx.traits.hip else "cuDNN/cuBLAS"
    advice = ("These costs are paid once per process: context, stream and library-handle creation, module loading at "
              f"a kernel's first launch, {libraries} set-up, the caching allocator filling up. They say nothing "
              "about the steady state and hide what does: run warm-up iterations before recording, e.g. "
              "torch.profiler.schedule(wait=1, warmup=2, active=N) or start the profiler after the first steps.")
    if ctx.graphs.captured:
        setup = (" (torch.cuda.graph's synchronize and empty_cache before each capture, and the allocations inside "
                 "it, are counted with it)" if ctx.graphs.captures_with_setup else "")
        advice += (f" {ctx.traits.graph_word} capture is start-up work too{setup}: profile a window where the captured "
                   f"graphs are replayed.")
    advice += _specific_advice(ctx, data["breakdown"])
    return [Finding(
        kind="warmup", severity=severity_for(impact, window_us),
        title=f"One-time costs in the profiled window: {what}",
        call_site=None, impact_us=impact, count=int(len(distinct(idle.gap[sel]))), advice=advice, id="warmup",
        detail={"breakdown": data["breakdown"]},
        occurrences_us=tuple((us(idle.start_ns[i]), us(idle.end_ns[i])) for i in worst.tolist()),
        fix=_once(pieces_fix(ctx, sel, "the one-time costs paid before the window (a warmed-up run)")))]


LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "hipLaunchKernel",
               "hipModuleLaunchKernel")


def _specific_advice(ctx: AnalysisContext, breakdown: list[dict]) -> str:
    """What fits the one-time costs this window holds: compiles, lazy module loading, a serving engine's first
    requests."""
    kinds = {p["kind"] for p in breakdown}
    out = ""
    if kinds & {"JIT compilation", "untraced JIT compilation", "untraced first call"}:
        out += (" Compile before the profiled region: call the compiled (or scripted) function on representative "
                "inputs first, so Dynamo/Inductor/Triton's compile, or TorchScript's profiling runs and fusion on a "
                "scripted function's first two calls, stay out of the window.")
    if any(p["kind"] == "first call" and p["api"] in LAUNCH_APIS for p in breakdown):
        out += (" A kernel's first launch loads its code object lazily (HIP_ENABLE_DEFERRED_LOADING=1, the "
                "default): HIP_ENABLE_DEFERRED_LOADING=0 moves that to start-up, at some start-up time and memory."
                if ctx.traits.hip else
                " A kernel's first launch loads its module lazily (CUDA_MODULE_LOADING=LAZY, the default since CUDA "
                "12.2): CUDA_MODULE_LOADING=EAGER moves that to start-up, at some start-up time and memory.")
    if "shape set-up" in kinds:
        out += (" A library op's first call at each input shape builds or chooses its kernel (cuDNN plans and "
                "algorithm searches, cuBLASLt heuristics) and later calls at that shape reuse it: run each shape once "
                "before profiling, and keep the shapes few (pad or bucket batch and sequence sizes).")
    if "engine step annotations" in ctx.steps.source:
        out += " For a serving engine, send warm-up requests (each batch and prompt-length bucket) before profiling."
    return out


def _once(fix):
    return dataclasses.replace(fix, one_time=True) if fix is not None else None
