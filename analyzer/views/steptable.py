"""Per step: its CPU span, the GPU work it launched (matched by correlation, wherever it ran on the GPU timeline),
that work's busy time and the idle time spent waiting for it, by cause.

A step owns an idle piece when the work that ended the gap was launched by that step; gaps before work whose launch
is not in the trace, and the window's tail, go to the step whose CPU time they fall in. The window's head and tail
lie outside every GPU span: a step that holds them says how much of its idle they are (`window_edge_us`). So a CUDA-graph run whose CPU races ahead still
gets one replay per step, instead of the whole backlog landing in the last step.
"""
from __future__ import annotations

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.units import us
from analyzer.views.idle import CAUSES
from analyzer.views.steps import engine_batch
from analyzer.views.timeline import activity_mask


def _grouped_union_ns(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group: the length of the union of its intervals."""
    out = np.zeros(n_groups, np.int64)
    if not len(group):
        return out
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    base = int(s.min())
    span = int(e.max()) - base + 1
    reach = np.maximum.accumulate((e - base) + g * span) - g * span + base  # running max end, reset per group
    new = np.ones(len(g), bool)
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(g)] - 1
    np.add.at(out, g[first], reach[last] - s[first])
    return out


def step_table(ctx) -> list[dict]:
    model, steps = ctx.model, ctx.steps
    if not len(steps):
        return []
    rt, gpu = model.runtime, model.gpu
    n = len(steps)
    rt_step = steps.index_at(rt.start_ns) if len(rt) else np.zeros(0, np.int64)
    launches = np.bincount(rt_step[(ctx.runtime_classes == apis.IS_LAUNCH) & (rt_step >= 0)], minlength=n) \
        if len(rt) else np.zeros(n, np.int64)
    active = activity_mask(model)
    rows = np.flatnonzero(active & (gpu.launch >= 0))
    gpu_step = rt_step[gpu.launch[rows]] if len(rt) else np.zeros(0, np.int64)
    rows, gpu_step = rows[gpu_step >= 0], gpu_step[gpu_step >= 0]
    devices = distinct(gpu.device[rows]) if len(rows) else np.zeros(0, np.int64)
    dev_index = np.searchsorted(devices, gpu.device[rows])
    busy = _grouped_union_ns(gpu_step * max(len(devices), 1) + dev_index, gpu.start_ns[rows], gpu.end_ns[rows],
                             n * max(len(devices), 1)).reshape(n, -1).sum(axis=1)
    gpu_lo = np.full(n, np.iinfo(np.int64).max)
    gpu_hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(gpu_lo, gpu_step, gpu.start_ns[rows])
    np.maximum.at(gpu_hi, gpu_step, gpu.end_ns[rows])
    has_gpu = gpu_hi >= gpu_lo

    idle = ctx.idle
    owner = np.full(len(idle), -1, np.int64)
    if len(idle):
        launch = ctx.gaps.launch[idle.gap]
        owner = np.where(launch >= 0, rt_step[np.maximum(launch, 0)] if len(rt) else -1, -1)
        unknown = launch < 0
        owner[unknown] = steps.index_at(idle.start_ns[unknown])
    idle_by_cause = np.zeros((n, len(CAUSES)), np.int64)
    edge_by_cause = np.zeros((n, len(CAUSES)), np.int64)  # the window's head and tail (outside every GPU span)
    mine = owner >= 0
    np.add.at(idle_by_cause, (owner[mine], idle.cause[mine]), idle.duration_ns[mine])
    if len(idle):
        edge = mine & (ctx.gaps.head[idle.gap] | ctx.gaps.tail[idle.gap])
        np.add.at(edge_by_cause, (owner[edge], idle.cause[edge]), idle.duration_ns[edge])

    out = []
    for k, name in enumerate(steps.names):
        step_idle = int(idle_by_cause[k].sum())
        lo, hi = int(gpu_lo[k]), int(gpu_hi[k])
        nxt = next((int(gpu_lo[j]) for j in range(k + 1, n) if has_gpu[j]), None)
        accounted = int(busy[k]) + step_idle
        out.append({
            "step": name, "ts_us": us(steps.lo_ns[k]), "wall_us": us(steps.hi_ns[k] - steps.lo_ns[k]),
            "cpu_us": us(steps.cpu_end_ns[k] - steps.cpu_start_ns[k]),
            "gpu_ts_us": us(lo) if has_gpu[k] else None, "gpu_span_us": us(hi - lo) if has_gpu[k] else None,
            "gpu_period_us": (us(nxt - lo) if nxt is not None else us(hi - lo)) if has_gpu[k] else None,
            "busy_us": us(busy[k]), "idle_us": us(step_idle),
            "idle_by_cause_us": {c: us(idle_by_cause[k, i]) for i, c in enumerate(CAUSES)},
            **({"window_edge_us": {c: us(edge_by_cause[k, i]) for i, c in enumerate(CAUSES) if edge_by_cause[k, i]}}
               if edge_by_cause[k].any() else {}),
            "gpu_utilization": round(int(busy[k]) / accounted, 4) if accounted else None,
            "launches": int(launches[k]),
            **({"batch": batch} if (batch := engine_batch(name, steps.code_engine)) else {}),
        })
    return out
