"""Host compute: GPU idle while the launching thread ran ops that made no CUDA call at all (math on host tensors,
e.g. attention over a KV cache kept on the CPU), grouped by op and call site. Owns the idle pieces of cause
host_compute. CUDA graphs cannot help here: the fix is to move the work to the GPU or overlap it with GPU work."""
from __future__ import annotations

import numpy as np

from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, SiteTable, severity_for
from analyzer.units import fmt_us, plural, us
from analyzer.views.idle import HOST_COMPUTE
from analyzer.views.sites import describe_site, site_keys
from analyzer.views.whatif import pieces_fix

MAX_GROUPS = 5
RANDOM_OPS = frozenset({"aten::randn", "aten::rand", "aten::randint", "aten::randperm"})  # factories with device=


def detect(ctx: AnalysisContext) -> DetectorResult:
    idle, model = ctx.idle, ctx.model
    sel = np.flatnonzero(idle.cause == HOST_COMPUTE)
    if not len(sel):
        return DetectorResult({"host_compute": {"idle_us": 0.0, "count": 0, "groups": []}})
    ops = model.ops
    op = idle.op[sel]
    frame = ops.frame[op]
    keys = site_keys(ctx, frame, np.full(len(sel), -1), np.full(len(sel), -1))
    table = SiteTable(sums=("idle_us",), count=None, max_occurrences=8)
    for i, k, o, f in zip(sel.tolist(), keys.tolist(), op.tolist(), frame.tolist()):
        name = model.names[ops.name[o]]
        row = table.add((name, k), lambda name=name, k=k, f=f: {
            "op": name, "site": describe_site(ctx, k, f), "gaps": set(), "pieces": []},
            (us(idle.start_ns[i]), us(idle.end_ns[i])), idle_us=(idle.end_ns[i] - idle.start_ns[i]) / 1e3)
        row["gaps"].add(int(idle.gap[i]))
        row["pieces"].append(i)
    groups = table.rows(lambda r: -r["idle_us"])
    fixes = []
    for g in groups:
        g["count"] = len(g.pop("gaps"))
        label = g["site"]["label"]
        g["call_site"] = label if label != "(unknown)" else None
        fixes.append(np.asarray(g.pop("pieces"), np.int64))
    data = {"idle_us": us(idle.duration_ns[sel].sum()), "count": int(len(np.unique(idle.gap[sel]))),
            "groups": groups}
    return DetectorResult({"host_compute": data}, tuple(_findings(ctx, groups, fixes)))


def _findings(ctx: AnalysisContext, groups: list[dict], fixes: list[np.ndarray]) -> list[Finding]:
    window_us = ctx.timeline.window_ns / 1e3
    out = []
    if len(groups) > MAX_GROUPS:  # the rest as one finding, so that every idle µs stays owned
        rest = groups[MAX_GROUPS - 1:]
        ops = sorted({g["op"] for g in rest})
        groups = groups[:MAX_GROUPS - 1] + [{
            "op": f"{len(ops)} other ops ({', '.join(ops[:3])}{', ...' if len(ops) > 3 else ''})",
            "call_site": None, "site": {"library_below": None}, "idle_us": round(sum(g["idle_us"] for g in rest), 3),
            "count": sum(g["count"] for g in rest), "occurrences": rest[0]["occurrences"]}]
        fixes = fixes[:MAX_GROUPS - 1] + [np.concatenate(fixes[MAX_GROUPS - 1:])]
    for k, (g, pieces) in enumerate(zip(groups, fixes)):
        where = f" at {g['call_site']}" if g["call_site"] else ""
        out.append(Finding(
            kind="host_compute", severity=severity_for(g["idle_us"], window_us),
            title=f"GPU idle {fmt_us(g['idle_us'])} while the CPU computed in {g['op']}{where} "
                  f"({plural(g['count'], 'gap')}; no {ctx.traits.runtime_word} call in it: math on host tensors)",
            call_site=g["call_site"], library_site=g["site"]["library_below"], impact_us=g["idle_us"],
            count=g["count"], id=f"host_compute.{k}",
            advice=_advice(ctx, g["op"]),
            detail={"op": g["op"], "site": g["site"]},
            occurrences_us=tuple(tuple(o) for o in g["occurrences"]),
            fix=pieces_fix(ctx, pieces, f"{g['op']}{where} moved to the GPU or overlapped with GPU work")))
    return out


def _advice(ctx: AnalysisContext, op: str) -> str:
    traits = ctx.traits
    example = "a KV cache or lookup table allocated on the device" if traits.decode and not traits.training else \
        "a lookup table or mask built on the device"
    made = (f"{op} made no {traits.runtime_word} call (no launch, copy or allocation): it computed on host tensors "
            f"while nothing was queued on the GPU. Fewer launches or {traits.graph_word}s cannot take this out.")
    if op in RANDOM_OPS:
        return (f"{made} Draw the random tensor on the GPU (torch.{op.split('::')[-1]}(..., device=...)) instead of "
                f"on the host and copying it, or queue the next GPU work before it so the two overlap.")
    return (f"{made} Keep the tensors on the GPU (e.g. {example}), queue the next GPU work before this math so the "
            f"two overlap, or batch a per-item loop of such ops into one.")
