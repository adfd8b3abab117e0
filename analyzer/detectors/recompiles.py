"""torch.compile recompiles: a compiled function compiled again in the window (Dynamo's compile id F/N with N >= 1,
or a second compile from the same caller), grouped by the user code that called it. It owns the warmup idle pieces
inside those recompiles (AnalysisContext.recompile_pieces): they recur for every new shape, so they are not a one-time
cost; only first compiles stay with the warmup detector."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for
from analyzer.units import fmt_us, us
from analyzer.views.frames import describe_frame
from analyzer.views.whatif import pieces_fix

ADVICE = ("Dynamo compiled this function again for a new input (or after its cache was reset): by default it specializes on shapes (and with "
          "dynamic=False it never generalizes), so every new length recompiles until "
          "torch._dynamo.config.recompile_limit (8) is reached, after which that function silently runs eagerly. In "
          "production this recurs for every new shape. Compile with dynamic=True, mark the changing dimension "
          "dynamic (torch._dynamo.mark_dynamic(tensor, dim)), or pad / bucket the input to a few sizes; "
          "TORCH_LOGS=recompiles says which guard failed.")


def detect(ctx: AnalysisContext) -> DetectorResult:
    c, fr, idle = ctx.compiles, ctx.model.frames, ctx.idle
    pieces = ctx.recompile_pieces
    # by the compiled function and its caller (names): one site, one finding
    by_caller: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k in np.flatnonzero(c.recompile).tolist():
        by_caller[(int(fr.name[c.compiled[k]]) if c.compiled[k] >= 0 else -1,
                   int(fr.name[c.caller[k]]) if c.caller[k] >= 0 else -1)].append(k)
    sites = []
    mid = idle.start_ns[pieces] + (idle.end_ns[pieces] - idle.start_ns[pieces]) // 2
    for (function, caller), ks in by_caller.items():
        inside = np.zeros(len(pieces), bool)
        for k in ks:
            inside |= (mid >= c.start_ns[k]) & (mid < c.end_ns[k])
        ids = [f"{c.dynamo_frame[k]}/{c.attempt[k]}" for k in ks if c.attempt[k] >= 0]
        sites.append({"call_site": describe_frame(ctx.model.names[caller]) if caller >= 0 else None,
                      "function": describe_frame(ctx.model.names[function]) if function >= 0 else None,
                      "count": len(ks),
                      "compile_ids": ids, "compile_us": us(int((c.end_ns[ks] - c.start_ns[ks]).sum())),
                      "idle_us": us(int(idle.duration_ns[pieces[inside]].sum())), "pieces": pieces[inside],
                      "occurrences": [(us(c.start_ns[k]), us(c.end_ns[k])) for k in ks[:16]]})
    sites.sort(key=lambda s: (-s["idle_us"], -s["count"]))
    window_us = ctx.timeline.window_ns / 1e3
    findings = []
    steps_before = ctx.meta.get("unprofiled", "steps", default=0) if ctx.meta else 0
    for k, s in enumerate(sites):
        where = f", called from {s['call_site']}" if s["call_site"] else " (no Python stacks name the function)"
        ids = s["compile_ids"]
        span = f" (compile ids {ids[0]}–{ids[-1]})" if len(ids) > 1 else f" (compile id {ids[0]})" if ids else ""
        verb = "recompiled" if ids and all(not i.endswith("/0") for i in ids) else "compiled"
        after = f" after {steps_before} unprofiled steps of the same workload" if c.after_warmup else ""
        what = f" {s['function']}" if s["function"] else ""
        findings.append(Finding(
            kind="recompile", id=f"recompile.{k}", call_site=s["call_site"],
            severity=severity_for(s["idle_us"], window_us) if window_us else "medium",
            title=f"torch.compile {verb}{what} {s['count']}x in the window{after}{where}{span}: "
                  f"{fmt_us(s['compile_us'])} of compiling",
            impact_us=s["idle_us"], count=s["count"], advice=ADVICE,
            detail={"compile_ids": s["compile_ids"], "compile_us": s["compile_us"], "function": s["function"],
                    "first_compiles": int((~c.recompile).sum())},
            occurrences_us=tuple(s["occurrences"]),
            fix=pieces_fix(ctx, s["pieces"], "the recompiles gone (dynamic shapes, or a few padded sizes)")))
    data = {"compiles": len(c), "recompiles": int(c.recompile.sum()),
            "sites": [{key: v for key, v in s.items() if key != "pieces"} for s in sites]}
    return DetectorResult({"recompiles": data}, tuple(findings))
