"""Input waits: GPU idle while the launching thread was inside a DataLoader's `__next__`, waiting for worker processes
to deliver the next batch or loading it itself (num_workers=0). Owns the idle pieces of cause input_wait."""
from __future__ import annotations

import dataclasses

import numpy as np

from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, SiteTable, severity_for
from analyzer.units import fmt_us, plural, us
from analyzer.views.idle import INPUT_WAIT, input_wait_ops
from analyzer.views.sites import describe_site, site_keys
from analyzer.views.whatif import Fix, pieces_fix

IN_THREAD, WORKERS, UNKNOWN = "in-thread", "worker processes", "unknown"


def detect(ctx: AnalysisContext) -> DetectorResult:
    idle, model = ctx.idle, ctx.model
    sel = np.flatnonzero(idle.cause == INPUT_WAIT)
    if not len(sel):
        return DetectorResult({"input_wait": {"idle_us": 0.0, "count": 0, "loaders": []}})
    ops, fr = model.ops, model.frames
    op, frame = idle.op[sel], idle.frame[sel]
    # the code that asked for the batch: the Python frame around the iterator's annotation, or the frame itself
    where = np.where(op >= 0, ops.frame[np.maximum(op, 0)] if len(ops) else -1, frame)
    parent = np.where(where >= 0, fr.parent[np.maximum(where, 0)] if len(fr) else -1, -1)
    keys = site_keys(ctx, np.where(op >= 0, where, parent), np.full(len(sel), -1), np.full(len(sel), -1))
    table = SiteTable(sums=("idle_us",), count=None, max_occurrences=8)
    for i, k, o, w in zip(sel.tolist(), keys.tolist(), op.tolist(), where.tolist()):
        kind = _loader_kind(model.names[ops.name[o]]) if o >= 0 else UNKNOWN
        row = table.add((k, kind), lambda k=k, w=w, kind=kind: {
            "site": describe_site(ctx, k, w), "loader": kind, "gaps": set()},
            (us(idle.start_ns[i]), us(idle.end_ns[i])), idle_us=(idle.end_ns[i] - idle.start_ns[i]) / 1e3)
        row["gaps"].add(int(idle.gap[i]))
    loaders = table.rows(lambda r: -r["idle_us"])
    for r in loaders:
        r["count"] = len(r.pop("gaps"))
        r["call_site"] = r["site"]["label"] if r["site"]["label"] != "(unknown)" else None
    total = us(idle.duration_ns[sel].sum())
    data = {"idle_us": total, "count": int(len(np.unique(idle.gap[sel]))), "loaders": loaders}
    return DetectorResult({"input_wait": data}, tuple(_findings(ctx, data, sel)))


def _loader_kind(annotation: str) -> str:
    if "_SingleProcessDataLoaderIter" in annotation:
        return IN_THREAD
    if "_MultiProcessingDataLoaderIter" in annotation:
        return WORKERS
    return UNKNOWN


ADVICE = {
    WORKERS: "The launching thread waited in the DataLoader for its worker processes to deliver the next batch: "
             "they produce batches more slowly than the GPU consumes them. Raise num_workers (up to the cores you "
             "have) and prefetch_factor, keep persistent_workers=True so workers are not started again every epoch, "
             "and make __getitem__ / collate_fn cheaper (pre-processed data, decoding or augmentation on the GPU). "
             "With pin_memory=True the copy to the GPU can be non_blocking=True.",
    IN_THREAD: "The DataLoader runs with num_workers=0: each batch is read and collated on the launching thread "
               "while nothing is queued on the GPU. Set num_workers > 0 so worker processes prepare the next "
               "batches while the GPU runs, with prefetch_factor, persistent_workers=True and pin_memory=True.",
    UNKNOWN: "The launching thread was inside the DataLoader's __next__ while nothing was queued on the GPU: input "
             "is the bottleneck. With num_workers=0, use worker processes; with workers, raise num_workers and "
             "prefetch_factor, keep persistent_workers=True and make __getitem__ / collate_fn cheaper.",
}


def _findings(ctx: AnalysisContext, data: dict, sel: np.ndarray) -> list[Finding]:
    window_us = ctx.timeline.window_ns / 1e3
    lead = data["loaders"][0]
    kinds = {r["loader"] for r in data["loaders"]} - {UNKNOWN}
    kind = kinds.pop() if len(kinds) == 1 else UNKNOWN
    how = {WORKERS: "waiting for the DataLoader's worker processes to deliver the next batch",
           IN_THREAD: "while the DataLoader loaded the next batch on the launching thread (num_workers=0)",
           UNKNOWN: "inside the DataLoader's __next__ (waiting for input)"}[kind]
    return [Finding(
        kind="input_wait", severity=severity_for(data["idle_us"], window_us),
        title=f"GPU idle {fmt_us(data['idle_us'])} {how} ({plural(data['count'], 'gap')})",
        call_site=lead["call_site"], impact_us=data["idle_us"], count=data["count"], id="input_wait",
        advice=ADVICE[kind],
        detail={"loader": kind, "sites": [{k: r[k] for k in ("call_site", "loader", "idle_us", "count")}
                                          for r in data["loaders"][:5]]},
        occurrences_us=tuple(tuple(o) for o in lead["occurrences"]),
        fix=_fix(ctx, sel))]


def _fix(ctx: AnalysisContext, pieces: np.ndarray) -> Fix | None:
    """The waits' idle time taken out; a call for a batch from worker processes (which the replay holds to when the
    batch arrived in the trace) ready when asked; and a batch loaded on the launching thread (num_workers=0) loaded
    by workers instead: every such call's time off that thread, not only the part the GPU sat idle in (the loading
    that overlapped GPU work also delays the next launches)."""
    fix = pieces_fix(ctx, pieces, "the next batch ready when the GPU needs it (the input pipeline keeps up)")
    if fix is None or ctx.replay.limits:
        return fix
    ready = ctx.replay.outside_waits_over(ctx.idle.start_ns[pieces], ctx.idle.end_ns[pieces])
    ops, names = ctx.model.ops, ctx.model.names
    rows = input_wait_ops(ctx.model)
    rows = rows[[_loader_kind(names[c]) == IN_THREAD for c in ops.name[rows].tolist()]] if len(rows) else rows
    rows = rows[np.isin(ops.tid[rows], ctx.replay.tids)]
    loads = np.stack([ops.tid[rows], ops.start_ns[rows], ops.end_ns[rows]], axis=1).astype(np.int64)
    what = fix.what if not len(rows) else \
        "the batches loaded ahead by worker processes (the loading taken off the launching thread)"
    return dataclasses.replace(fix, what=what, removed=np.concatenate([fix.removed, loads.reshape(-1, 3)]),
                               no_wait=np.concatenate([fix.no_wait, ready]))
