"""Set-up that comes back with new input shapes: the idle pieces of cause `setup` (analyzer.views.setup), one finding
per library op: how many of its calls paid set-up at a shape they had not run yet, in how many steps, what one such
call costs against the op's usual call, what the library did inside it, and what keeps the shapes from changing.
A set-up whose shape recurs at the usual cost is one-time (the warmup finding's)."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for
from analyzer.units import fmt_us, plural, us
from analyzer.views.idle import SETUP
from analyzer.views.setup import ONE_TIME, RECURRING, calls_inside, library_of
from analyzer.views.sites import describe_site, site_keys
from analyzer.views.whatif import pieces_fix

SEARCH_SYNCS = 2  # synchronizing calls inside a set-up call its usual calls do not make: timing candidate kernels


def detect(ctx: AnalysisContext) -> DetectorResult:
    idle, setup, model = ctx.idle, ctx.shape_setup, ctx.model
    sel = np.flatnonzero(idle.cause == SETUP)
    if not len(sel):
        return DetectorResult({"shape_setup": _section(ctx, [])})
    ops = model.ops
    by_op: dict[int, list[int]] = defaultdict(list)
    for i in sel.tolist():
        by_op[int(ops.name[idle.op[i]])].append(i)
    groups = []
    for code, pieces in by_op.items():
        mine = np.flatnonzero((ops.name[setup.rows] == code) & (setup.recurrence != ONE_TIME))
        groups.append(_group(ctx, code, np.asarray(pieces, np.int64), mine))
    groups.sort(key=lambda g: -g["idle_us"])
    return DetectorResult({"shape_setup": _section(ctx, groups)}, tuple(_finding(ctx, g, k) for k, g in
                                                                         enumerate(groups)))


def _section(ctx: AnalysisContext, groups: list[dict]) -> dict:
    setup = ctx.shape_setup
    return {"shapes_recorded": setup.shapes_recorded,
            "one_time_calls": int((setup.recurrence == ONE_TIME).sum()),
            "ops": [{k: v for k, v in g.items() if k not in ("pieces", "fix")} for g in groups],
            "definition": "a library op's first call at an input shape it had not run in the window, its own host time "
                          "(less child ops and runtime calls) at least 20x the op's usual (its calls at a shape already "
                          "seen) and 0.5 ms more; listed here where the shapes keep changing (or nothing shows they "
                          "stop), one-time ones are the warmup finding's"}


def _group(ctx: AnalysisContext, code: int, pieces: np.ndarray, mine: np.ndarray) -> dict:
    setup, model, idle = ctx.shape_setup, ctx.model, ctx.idle
    ops, names = model.ops, model.names
    rows = setup.rows[mine]
    steps_hit = sorted({int(k) for k in ctx.steps.index_at(ops.start_ns[rows]).tolist() if k >= 0}) \
        if len(ctx.steps) else []
    lead = int(rows[np.argmax(setup.own_ns[mine])])
    usual = [r for r in np.flatnonzero(ops.name == code).tolist() if r not in set(setup.rows.tolist())]
    inside, usual_inside = calls_inside(model, ctx.runtime_classes, lead), \
        calls_inside(model, ctx.runtime_classes, usual[0]) if usual else None
    key = int(site_keys(ctx, ops.frame[lead:lead + 1], np.array([lead]), np.array([-1]))[0])
    site = describe_site(ctx, key, int(ops.frame[lead]))
    recurring = bool((setup.recurrence[mine] == RECURRING).any())
    once = (ops.name[setup.rows] == code) & (setup.recurrence == ONE_TIME)
    return {"op": names[code], "library": library_of(names[code], ctx.traits.hip), "call_site": site["label"],
            "site": site, "setup_calls": int(len(rows)), "calls": setup.calls.get(code, 0),
            "distinct_shapes": setup.distinct_shapes.get(code, 0),
            "steps_with_setup": len(steps_hit), "steps": len(ctx.steps),
            "recurrence": "recurring" if recurring else "unknown",
            "one_time_calls": int(once.sum()), "one_time_us": us(int(setup.own_ns[once].sum())),
            "own_us_median": us(float(np.median(setup.own_ns[mine]))), "usual_us": us(int(setup.usual_ns[mine][0])),
            "inside": inside, "usual_inside": usual_inside,
            "shapes": [names[s] for s in ops.shape[rows[:3]].tolist()],
            "idle_us": us(int(idle.duration_ns[pieces].sum())), "pieces": pieces,
            "occurrences": [(us(idle.start_ns[p]), us(idle.end_ns[p])) for p in
                            pieces[np.argsort(-idle.duration_ns[pieces], kind="stable")][:8].tolist()]}


def _finding(ctx: AnalysisContext, g: dict, k: int) -> Finding:
    library = f"{g['library']} " if g["library"] else ""
    where = (f"in {g['steps_with_setup']} of {g['steps']} {ctx.traits.step_word}s" if g["steps_with_setup"] else
             "outside the window's steps" if g["steps"] else "in a window without steps")
    usual = (f"its calls at a shape already seen: {fmt_us(g['usual_us'])}" if g["usual_us"] else
             "no call at a shape already seen to compare with; each searched, "
             f"{plural(g['inside']['launches'], 'launch', 'launches')} and {plural(g['inside']['syncs'], 'sync')} "
             f"in the longest")
    title = (f"{library}set-up for each new input shape in {g['op']}: {plural(g['setup_calls'], 'call')} at a new "
             f"shape {where}, {fmt_us(g['own_us_median'])} each ({usual})")
    return Finding(
        kind="shape_setup", severity=severity_for(g["idle_us"], ctx.timeline.window_ns / 1e3), title=title,
        call_site=g["call_site"], library_site=g["site"]["library_below"], impact_us=g["idle_us"],
        count=g["setup_calls"], id=f"shape_setup.{k}", advice=_advice(ctx, g),
        detail={k2: g[k2] for k2 in ("op", "library", "setup_calls", "calls", "distinct_shapes", "steps_with_setup",
                                     "recurrence", "one_time_calls", "one_time_us", "own_us_median", "usual_us",
                                     "inside", "usual_inside", "shapes")},
        occurrences_us=tuple(g["occurrences"]),
        fix=pieces_fix(ctx, g["pieces"], f"{g['op']}'s set-up paid once (a fixed or bucketed shape)"))


def _advice(ctx: AnalysisContext, g: dict) -> str:
    op, inside, usual = g["op"], g["inside"], g["usual_inside"] or {}
    against = (f"against {fmt_us(g['usual_us'])} for a call at a shape it had run" if g["usual_us"] else
               "(no call at a shape it had already run, to compare with)")
    text = (f"{g['op']} ran at {plural(g['distinct_shapes'], 'distinct input shape')} in {plural(g['calls'], 'call')} "
            f"in this window, and its first call at each new shape cost {fmt_us(g['own_us_median'])} of its own host "
            f"time (median) {against}: the library builds or chooses its kernel per input configuration and caches "
            f"it by shape, so a shape that changes keeps paying for it.")
    if g["one_time_calls"]:
        text += (f" (Its first set-up, {fmt_us(g['one_time_us'])} of own host time, came before any other call of "
                 f"the op and is counted with the one-time costs.)" if g["one_time_calls"] == 1 else
                 f" ({plural(g['one_time_calls'], 'set-up')} of {fmt_us(g['one_time_us'])} in all, at shapes it ran "
                 f"again at the usual cost, are counted with the one-time costs.)")
    text += (" New shapes kept arriving through the window: the cost is per step, not warm-up." if
             g["recurrence"] == "recurring" else
             " The window cannot tell whether new shapes stop arriving (too few steps, and none of these shapes "
             "came back): profile more steps to see.")
    searched = inside["syncs"] - usual.get("syncs", 0) >= SEARCH_SYNCS and \
        inside["launches"] > usual.get("launches", 0)
    if searched:
        text += (f" Inside the longest one it launched {plural(inside['launches'], 'kernel')} and synchronized "
                 f"{plural(inside['syncs'], 'time')}" + (f" (a usual call: {usual.get('launches', 0)} and "
                                                         f"{usual.get('syncs', 0)})" if usual else "") +
                 ": timing candidate algorithms on the GPU")
        text += (", which torch.backends.cudnn.benchmark=True does for every new input configuration: turn it off "
                 "where shapes vary, or pad / bucket the inputs to a few sizes." if "cudnn" in op.lower() or
                 "conv" in op.lower() else ": keep the shapes few (pad or bucket them) so the search runs once each.")
    elif "attention" in op and g["library"] == "cuDNN":
        text += (" cuDNN's attention builds an execution plan for each new shape: a sequence length that grows "
                 "every step (attention over k_cache[:, :, :pos + 1]) builds one per step. Attend over a fixed-size "
                 "cache with a mask of the valid positions (one shape), pad the length to a few buckets, or choose "
                 "another backend for decode with torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION, "
                 "SDPBackend.EFFICIENT_ATTENTION]); recent torch has TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 to reuse "
                 "one plan across lengths.")
    else:
        text += (" Keep the shapes this op sees few: pad or bucket the dimension that changes (batch, sequence "
                 "length), so each shape's set-up is paid once, before profiling.")
    text += f" {ctx.traits.graph_word}s do not help here: a graph replays the shapes it captured."
    return text
