"""torch.compile graph breaks (analyzer.views.graph_breaks), one finding per statement that broke a graph: how often
it was taken, and the GPU idle of its eager sections that is not a host sync (the launch gaps of the eager code and
of Dynamo's guard checks before the resumed graph; those pieces are this detector's, not launch overhead's). A sync
in the eager section stays the syncs detector's finding, named here."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for
from analyzer.units import fmt_us, us
from analyzer.views.idle import SYNC
from analyzer.views.whatif import pieces_fix

ADVICE = ("Dynamo could not trace this statement, so each call runs the compiled code before it, the statement "
          "eagerly, Dynamo's guard checks, and a second compiled graph: two launches of compiled work instead of "
          "one, and whatever the statement waits for. TORCH_LOGS=graph_breaks (or torch._dynamo.explain) gives the "
          "reason; compile with fullgraph=True to make it an error. A branch on a GPU value (`if t.max() > x:`, "
          "`.item()`) becomes torch.where or torch.cond; with torch._dynamo.config.capture_scalar_outputs=True an "
          ".item() stays in the graph; print/logging and calls into untraceable libraries move out of the compiled "
          "function.")


def detect(ctx: AnalysisContext) -> DetectorResult:
    b, idle = ctx.graph_breaks, ctx.idle
    owned = ctx.graph_break_pieces
    owned_mid = idle.start_ns[owned] + (idle.end_ns[owned] - idle.start_ns[owned]) // 2
    syncs = np.flatnonzero(idle.cause == SYNC)
    sync_mid = idle.start_ns[syncs] + (idle.end_ns[syncs] - idle.start_ns[syncs]) // 2
    by_site: dict[str, list[int]] = defaultdict(list)
    for k, site in enumerate(b.site):
        by_site[site].append(k)
    window_us = ctx.timeline.window_ns / 1e3
    sites = []
    for site, ks in by_site.items():
        mine, sync = np.zeros(len(owned), bool), np.zeros(len(syncs), bool)
        for k in ks:
            mine |= (owned_mid >= b.eager_start_ns[k]) & (owned_mid < b.eager_end_ns[k])
            sync |= (sync_mid >= b.eager_start_ns[k]) & (sync_mid < b.eager_end_ns[k])
        sites.append({"site": site, "function": b.function[ks[0]], "count": len(ks),
                      "eager_us": us(int((b.eager_end_ns[ks] - b.eager_start_ns[ks]).sum())),
                      "idle_us": us(int(idle.duration_ns[owned[mine]].sum())),
                      "sync_idle_us": us(int(idle.duration_ns[syncs[sync]].sum())), "pieces": owned[mine],
                      "occurrences": [(us(b.eager_start_ns[k]), us(b.eager_end_ns[k])) for k in ks[:16]]})
    sites.sort(key=lambda s: (-(s["idle_us"] + s["sync_idle_us"]), -s["count"]))
    findings = []
    for k, s in enumerate(sites):
        sync = (f"; its host sync is the sync finding at that line ({fmt_us(s['sync_idle_us'])} GPU idle)"
                if s["sync_idle_us"] > 0 else "")
        findings.append(Finding(
            kind="graph_break", id=f"graph_break.{k}", call_site=s["site"],
            severity=severity_for(s["idle_us"], window_us) if window_us else "low",
            title=f"torch.compile graph break in {s['function']}() at {s['site']}, taken {s['count']}x: each call "
                  f"runs two compiled graphs with eager code between them ({fmt_us(s['eager_us'] / s['count'])} "
                  f"per call){sync}",
            impact_us=s["idle_us"], count=s["count"], advice=ADVICE,
            detail={"function": s["function"], "eager_us": s["eager_us"], "sync_idle_us": s["sync_idle_us"]},
            occurrences_us=tuple(s["occurrences"]),
            fix=pieces_fix(ctx, s["pieces"], "the function compiled as one graph (the eager section's launch gaps "
                                             "gone)")))
    data = {"breaks": len(b), "sites": [{key: v for key, v in s.items() if key != "pieces"} for s in sites]}
    return DetectorResult({"graph_breaks": data}, tuple(findings))
