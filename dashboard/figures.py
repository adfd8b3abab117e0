"""Plotly figures of the run and diff pages, built from a TimelineView or a report (colours and units as in the
static report.html)."""
from __future__ import annotations

import html
import math

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from analyzer.api import CAUSES, REQUEST_STATES, LaneView, TimelineData, TimelineView, mem_unit, packed
from analyzer.report.palette import (ALLOCATED_COLOR, BUSY_COLOR, CAUSE_COLORS, MEMCPY_COLOR, MEMSET_COLOR,
                                     RESERVED_COLOR, STEP_COLORS)
from analyzer.units import fmt_bytes

# the causes as drawn: host work (launch gaps of a millisecond and more) right after the launch overhead
DRAWN_CAUSES = ("cpu_launch", "host_work", *(c for c in CAUSES if c not in ("cpu_launch", "host_work")))
STATE_COLORS = {
    "busy": BUSY_COLOR, **{f"idle: {c}": CAUSE_COLORS[c] for c in DRAWN_CAUSES},
    "kernel": BUSY_COLOR, "memcpy": MEMCPY_COLOR, "memset": MEMSET_COLOR,
    "launch call": "#56B4E9", "blocking sync call": CAUSE_COLORS["sync"],
    "cudaMalloc/cudaFree": CAUSE_COLORS["allocator"], "other runtime call": "#BBBBBB",
    "cpu op": "#7B68AE", "your code": "#44AA99",
    "step": STEP_COLORS[0], "step ": STEP_COLORS[1],
    "waiting": "#DDCC77", "prefill to first token": "#AA4499", "decoding": "#332288",
}
GPU_STATES = ("busy", *(f"idle: {c}" for c in DRAWN_CAUSES), "kernel", "memcpy", "memset")
SYNC_MARKER = "host sync call"
LANE_HALF = 0.4  # of the 1-unit lane pitch
LANE_PX = 34
MEMORY_PX = 210
MEMORY_HOVER_POINTS = 400
MEMORY_POINT = "memory"  # customdata of the memory lane's hover points: a click there picks the segment view's time
HOVER_BINS = 200  # binned lanes: one hover point per group of bins
MAX_STEP_BARS = 200
MAX_NAMED_STEP_BARS = 24
STEPS_PLOT_PX = 600  # the per-step chart's plot area at the narrowest window it is laid out for (1280 px)
STEP_TICK_CHAR_PX = 7.6  # a character of a tick label at the chart's 13 px font, at most
STEP_NAME_PX = 11  # a step name that does not fit its bar at this size is not drawn
# exact lanes: a hover text shared by at least HOVER_GROUP_MIN points gets a trace of its own (the text sent once),
# at most HOVER_GROUPS of them; the rest share one trace with a text per point (plotly pays per trace: 24 groups per
# lane made the first paint of a 303 MB run a third slower for no smaller payload)
HOVER_GROUPS = 4
HOVER_GROUP_MIN = 16
# invisible points that carry hover text: a line of width 0 is one SVG path however many points it has, where
# invisible markers are one element each (thousands of them made up half the timeline's first draw); plotly
# hovers and clicks on a line trace's points all the same
HOVER_CARRIER = {"mode": "lines", "line": {"width": 0}}
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 13}
TIME_TITLE = "time since GPU window start (ms)"
WHITE_TEMPLATE = {"layout": pio.templates["plotly_white"].layout.to_plotly_json()}
GRAPH_CONFIG = {"displaylogo": False, "scrollZoom": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}
# the timeline zooms with the wheel too: plotly rescales what it has at once, the server refines the new window
TIMELINE_CONFIG = {**GRAPH_CONFIG, "scrollZoom": True}


def _ms(ns) -> np.ndarray:
    return np.asarray(ns, np.float64) / 1e6


def _scatter(row: int, **props) -> dict:
    """A scatter trace on subplot `row`, as the dict plotly.js reads; numpy arrays are packed."""
    props = {k: packed(v, "f4" if v.dtype == np.float32 else "f8") if isinstance(v, np.ndarray) else v
             for k, v in props.items()}
    suffix = "" if row == 1 else str(row)
    return {"type": "scatter", "xaxis": f"x{suffix}", "yaxis": f"y{suffix}", **props}


def _step_xy(edges: np.ndarray, values: np.ndarray) -> dict:
    """x/y of a step line (shape hv) over bins: explicit change points when that is smaller, else x0/dx over
    all bins (bins are uniform), so a dense lane costs 4 bytes a bin and a sparse one a few points."""
    changed = np.ones(len(values), bool)
    changed[1:] = values[1:] != values[:-1]
    idx = np.flatnonzero(changed)
    if len(idx) * 3 < len(values):  # 12 bytes a change point against 4 a bin
        return {"x": _ms(np.append(edges[idx], edges[-1])), "y": np.append(values[idx], values[-1])}
    return {"x0": edges[0] / 1e6, "dx": (edges[1] - edges[0]) / 1e6, "y": np.append(values, values[-1])}


def _lane_area(traces: list, lv: LaneView, y: float, row: int) -> None:
    """The lane as stacked step areas: each state's share of each bin, between y-LANE_HALF and y+LANE_HALF."""
    lane = lv.lane
    if not lv.shares.any():
        return
    cum = np.minimum(np.cumsum(lv.shares, axis=1, dtype=np.float32), np.float32(1.0))
    bottom = y - LANE_HALF
    # the first area fills down to this flat line; each other one to the area before it
    traces.append(_scatter(row, x=_ms(lv.edges[[0, -1]]), y=[bottom, bottom], mode="lines", line={"width": 0},
                           hoverinfo="skip", showlegend=False))
    for k, state in enumerate(lane.states):
        if not lv.shares[:, k].any():
            continue
        top = (bottom + 2 * LANE_HALF * cum[:, k]).astype(np.float32)
        traces.append(_scatter(
            row, **_step_xy(lv.edges, top), mode="lines", fill="tonexty",
            line={"width": 0, "shape": "hv", "color": STATE_COLORS[state]}, fillcolor=STATE_COLORS[state],
            hoverinfo="skip", showlegend=False, legendgroup=state, name=state,
            meta={"kind": "lane", "lane": lane.key, "state": state}))


def _template(text: str) -> str:
    return text.replace("%{", "% {")  # names are shown literally, never as hovertemplate fields


def _lane_hover(traces: list, data: TimelineData, lv: LaneView, y: float, row: int, lo: float, hi: float) -> None:
    """Invisible points along the lane's centre that carry its hover: one per interval when few enough are
    visible (kernel, op, call site, duration), else one per group of bins (share of each state)."""
    if lv.rows is None:
        _binned_hover(traces, lv, y, row)
        return
    lane, rows = lv.lane, lv.rows
    if not len(rows):
        return
    mids = _ms((np.maximum(lane.starts[rows], lo) + np.minimum(lane.ends[rows], hi)) / 2)
    dur_us = ((lane.ends[rows] - lane.starts[rows]) / 1e3).astype(np.float32)
    keys = [data.hover_key(lane, i) for i in rows.tolist()]
    groups: dict[str, list[int]] = {}
    for pos, key in enumerate(keys):
        groups.setdefault(key, []).append(pos)
    ranked = sorted(groups, key=lambda k: -len(groups[k]))
    tail = "<br>%{customdata:,.1f} µs at %{x:.3f} ms<extra></extra>"
    common = {**HOVER_CARRIER, "showlegend": False, "name": lane.label, "meta": {"kind": "hover", "lane": lane.key}}
    grouped = [key for key in ranked[:HOVER_GROUPS] if len(groups[key]) >= HOVER_GROUP_MIN]
    for key in grouped:  # one trace per frequent text: each text is sent once
        pos = np.array(groups[key])
        traces.append(_scatter(row, x=mids[pos], y=np.full(len(pos), y, np.float32), customdata=dur_us[pos],
                               hovertemplate=_template(key) + tail, **common,
                               hoverlabel={"bgcolor": STATE_COLORS[lane.states[lane.state[rows[pos[0]]]]]}))
    rest = [p for key in ranked[len(grouped):] for p in groups[key]]
    if rest:
        pos = np.array(rest)
        traces.append(_scatter(row, x=mids[pos], y=np.full(len(pos), y, np.float32), customdata=dur_us[pos],
                               text=[keys[p] for p in pos],
                               hovertemplate="%{text}" + tail, **common))


def _step_bars(traces: list, data: TimelineData, lv: LaneView, y: float, lo: float, hi: float) -> bool:
    """The steps lane as one bar per visible step (alternate shades), its name inside: plotly hides a name its bar
    cannot hold at the font's size (layout.uniformtext), at any zoom and page width, so names never run into each
    other. False (nothing drawn) when too many steps are visible for names: the lane is then drawn as binned areas."""
    lane = lv.lane
    if lane.kind != "steps" or lv.rows is None or not len(lv.rows):
        return False
    rows = lv.rows
    s, e = np.maximum(lane.starts[rows], lo), np.minimum(lane.ends[rows], hi)
    names = [html.escape(str(data.steps[int(lane.ref[r])]["step"])) for r in rows]
    traces.append({"type": "bar", "orientation": "h", "xaxis": "x", "yaxis": "y", "base": _ms(s).tolist(),
                   "x": _ms(e - s).tolist(), "y": [y] * len(rows), "width": 2 * LANE_HALF, "text": names,
                   "textposition": "inside", "insidetextanchor": "middle", "textangle": 0,
                   "textfont": {"size": STEP_NAME_PX, "color": "#333"},
                   "marker": {"color": [STATE_COLORS[lane.states[k]] for k in lane.state[rows].tolist()],
                              "line": {"width": 0}},
                   "hoverinfo": "skip", "showlegend": False, "meta": {"kind": "step_names"}})
    return True


def _binned_hover(traces: list, lv: LaneView, y: float, row: int) -> None:
    lane = lv.lane
    group = max(1, -(-len(lv.counts) // HOVER_BINS))
    n = len(lv.counts) // group
    shares = lv.shares[: n * group].reshape(n, group, -1).mean(axis=1)
    counts = lv.counts[: n * group].reshape(n, group).sum(axis=1)
    edges = lv.edges[: n * group + 1: group]
    keep = np.flatnonzero(shares.sum(axis=1) > 0)
    if not len(keep):
        return
    custom = np.column_stack([shares[keep], counts[keep]]).astype(np.float32)
    lines = "".join(f"<br>{html.escape(st)} %{{customdata[{k}]:.0%}}" for k, st in enumerate(lane.states))
    traces.append(_scatter(
        row, x=_ms((edges[keep] + edges[keep + 1]) / 2), y=np.full(len(keep), y, np.float32), customdata=custom,
        **HOVER_CARRIER, showlegend=False, name=lane.label,
        hovertemplate=(f"<b>{html.escape(lane.label)}</b> around %{{x:.3f}} ms (±{(edges[1] - edges[0]) / 2e6:.3g} ms)"
                       f"{lines}<br>%{{customdata[{len(lane.states)}]:,}} intervals start here: zoom in for each"
                       "<extra></extra>"),
        meta={"kind": "hover", "lane": lane.key}))


def present_states(data: TimelineData) -> set[str]:
    """The states some lane of the run holds: the legend lists only those (all nine idle causes on every run's
    legend took three rows of a laptop's screen)."""
    return {lane.states[k] for lane in data.lanes for k in range(len(lane.states)) if len(lane.merged[k][0])}


def _legend_entries(traces: list, states: list[str], legend: str = "legend") -> None:
    """Fixed legend (the data traces come and go with the zoom); clicking an entry toggles its state."""
    for state in states:
        traces.append(_scatter(1, x=[None], y=[None], mode="markers", name=state, legendgroup=state, legend=legend,
                               marker={"symbol": "square", "size": 14, "color": STATE_COLORS[state]},
                               showlegend=True, hoverinfo="skip"))


def _sync_markers(traces: list, data: TimelineData, view: TimelineView, y: float) -> None:
    m = view.syncs
    traces.append(_scatter(
        1, x=_ms(m.starts), y=np.full(len(m.starts), y, np.float32), mode="markers", name=SYNC_MARKER,
        marker={"symbol": "diamond", "size": 11, "color": CAUSE_COLORS["sync"], "line": {"width": 1, "color": "#333"}},
        text=[data.describe_call(int(r)) for r in m.rows], hovertemplate="%{text}<extra></extra>",
        meta={"kind": "sync"}))


def _memory(traces: list, data: TimelineData, view: TimelineView, row: int, highlights=()) -> str:
    unit, div = mem_unit(data.reserved_peak_bytes)
    dashes = ("solid", "dash", "dot", "dashdot")
    grid = np.linspace(view.lo, view.hi, MEMORY_HOVER_POINTS)
    for n, m in enumerate(view.memory):
        at = np.searchsorted(m.ts, grid, side="right") - 1
        inside = (at >= 0) & (grid <= m.ts[-1]) if len(m.ts) else np.zeros(len(grid), bool)
        for key, values, color in (("memory_reserved", m.reserved, RESERVED_COLOR),
                                   ("memory_allocated", m.allocated, ALLOCATED_COLOR)):
            keep = np.ones(len(values), bool)
            keep[1:-1] = values[1:-1] != values[:-2]  # a step line needs only the changes (and the last sample)
            name = f"{key} GPU {m.device}"
            traces.append(_scatter(
                row, x=_ms(m.ts[keep]), y=(values[keep] / div).astype(np.float32), mode="lines",
                line={"color": color, "width": 2, "shape": "hv", "dash": dashes[n % 4]}, name=name,
                legend="legend2", legendgroup=name, hoverinfo="skip", meta={"kind": key, "device": m.device,
                                                                             "unit": unit}))
            # the line's value at evenly spaced x, so that hovering anywhere along it reads it (a step line
            # has points only where it changes); clicking one shows the allocator's segments at that time
            traces.append(_scatter(
                row, x=_ms(grid[inside]), y=(values[at[inside]] / div).astype(np.float32), **HOVER_CARRIER,
                name=name, legend="legend2", legendgroup=name,
                showlegend=False, hovertemplate=f"{key} GPU {m.device}: %{{y:.2f}} {unit}<br>at %{{x:.3f}} ms"
                                                f"<extra></extra>", customdata=[[MEMORY_POINT, m.device]] * int(inside.sum()),
                meta={"kind": f"{key}_hover"}))
    calls = view.allocs
    if len(calls.rows):
        reserve = data.reserves(calls.rows)
        first = view.memory[0] if view.memory else None
        if first is not None and len(first.ts):
            at = np.clip(np.searchsorted(first.ts, calls.starts, side="right") - 1, 0, len(first.ts) - 1)
            ys = (first.reserved[at] / div).astype(np.float32)
        else:
            ys = np.zeros(len(calls.rows), np.float32)
        chosen = np.zeros(len(calls.rows), bool)
        for s, e in highlights:  # a selected finding's calls stand out
            chosen |= (calls.ends >= s) & (calls.starts <= e)
        for label, symbol, want in (("cudaMalloc (reserve)", "triangle-up", True),
                                    ("cudaFree (release)", "triangle-down", False)):
            pick = reserve == want
            if not pick.any():
                continue
            selected = np.flatnonzero(chosen[pick]).tolist()
            traces.append(_scatter(
                row, x=_ms(calls.starts[pick]), y=ys[pick], mode="markers", name=label, legend="legend2",
                marker={"symbol": symbol, "size": 12, "color": CAUSE_COLORS["allocator"],
                        "line": {"width": 1, "color": "#333"}},
                text=[data.describe_call(int(r)) for r in calls.rows[pick]], hovertemplate="%{text}<extra></extra>",
                meta={"kind": "alloc_call", "selected": len(selected)},
                **({"selectedpoints": selected, "selected": {"marker": {"size": 18, "color": "#D55E00"}},
                    "unselected": {"marker": {"opacity": 0.35}}} if highlights else {})))
    return unit


def _memory_axis_range(view: TimelineView, data: TimelineData, fit: bool) -> dict:
    """From 0, or (fit) around memory_reserved's values in the window, so that a few MiB of churn on top of
    gigabytes shows; memory_allocated may then run below the axis."""
    values = [m.reserved for m in view.memory if len(m.reserved)]
    if not fit or not values:
        return {"rangemode": "tozero", "autorange": True}
    _, div = mem_unit(data.reserved_peak_bytes)
    lo, hi = min(float(v.min()) for v in values) / div, max(float(v.max()) for v in values) / div
    pad = max((hi - lo) * 0.08, hi * 0.005, 1e-3)
    return {"range": [max(lo - pad, 0.0), hi + pad], "autorange": False}


NO_MEMORY = "not recorded (no [memory] events, allocator snapshot or meta.json samples): unknown, not 0"


def has_memory(data: TimelineData) -> bool:
    """Whether the run has a memory curve to draw (else the timeline has no memory panel: memory_note says why)."""
    return any(len(m.ts) for m in data.memory)


def memory_note(data: TimelineData) -> str | None:
    """Where the memory curves come from when not from [memory] events; why there are none."""
    source = data.memory_source
    if source is None or not has_memory(data):
        return NO_MEMORY
    return None if source == "[memory] events" else f"from {source}"


def _lane_axis(domain, labels: list[str]) -> dict:
    return {"domain": domain, "tickvals": list(range(len(labels) - 1, -1, -1)), "ticktext": labels,
            "range": [-0.6, len(labels) - 0.4], "fixedrange": True, "showgrid": False, "zeroline": False}


def timeline_figure(data: TimelineData, view: TimelineView, highlights=(), fit_memory: bool = False) -> dict:
    """GPU lanes (steps, host syncs, devices, streams) over CPU runtime-call lanes over memory, one time axis.
    `highlights`: (start_ns, end_ns) since t0 to shade (a selected finding's occurrences; its cudaMalloc/cudaFree
    markers are selected). `fit_memory`: the memory axis fits the window's values instead of starting at 0.
    A run without steps has no steps lane, one without memory curves no memory panel.
    A plain figure dict."""
    n_gpu = len(data.gpu_lanes)  # steps lane included
    gpu_views = view.lanes[:n_gpu]
    cpu_views = view.lanes[n_gpu:]
    steps = [gpu_views[0]] if len(data.gpu_lanes[0].starts) else []
    gpu_rows = [*steps, None, *gpu_views[1:]]  # None: the host-sync marker lane
    cpu_rows = cpu_views or [None]
    memory = has_memory(data)
    heights = [LANE_PX * len(gpu_rows) + 20, LANE_PX * len(cpu_rows) + 20] + ([MEMORY_PX] if memory else [])
    # the gap between panels holds the x ticks and the next panel's legend, on two rows where the page is narrow
    gap_px, margin = 84, {"l": 170, "r": 20, "t": 115, "b": 60}
    height = sum(heights) + (len(heights) - 1) * gap_px + margin["t"] + margin["b"]
    plot_px = height - margin["t"] - margin["b"]
    domains, top = [], 1.0
    for h in heights:
        domains.append([max(0.0, top - h / plot_px), top])
        top -= (h + gap_px) / plot_px
    traces: list[dict] = []
    requests = list(REQUEST_STATES) if data.requests else []
    # one legend per panel: the GPU's states at the top, the CPU's above the CPU panel, memory's above memory
    present = present_states(data)
    _legend_entries(traces, [s for s in [*GPU_STATES, *requests] if s in present])
    _legend_entries(traces, [s for s in ["launch call", "blocking sync call", "cudaMalloc/cudaFree",
                                         "other runtime call", "cpu op", "your code"] if s in present],
                    legend="legend3")
    lo, hi = view.lo, view.hi
    labels = {1: [], 2: []}
    for row, lanes in ((1, gpu_rows), (2, cpu_rows)):
        for i, lv in enumerate(lanes):
            labels[row].append(lv.lane.label if lv is not None else ("host syncs" if row == 1 else "no calls"))
            if lv is not None and not _step_bars(traces, data, lv, len(lanes) - 1 - i, lo, hi):
                _lane_area(traces, lv, len(lanes) - 1 - i, row)
    for row, lanes in ((1, gpu_rows), (2, cpu_rows)):  # hover points after every area: a fill reaches back
        for i, lv in enumerate(lanes):                  # to the trace just before it
            if lv is not None:
                _lane_hover(traces, data, lv, len(lanes) - 1 - i, row, lo, hi)
    _sync_markers(traces, data, view, len(gpu_rows) - 1 - gpu_rows.index(None))
    last = len(heights)
    unit = _memory(traces, data, view, 3, highlights) if memory else None
    # the whole trace's extent, so that plotly's double-click autorange asks for all of it
    traces.append(_scatter(last, x=_ms(np.array(data.full_range())), y=[0, 0], mode="markers",
                           marker={"opacity": 0}, hoverinfo="skip", showlegend=False, meta={"kind": "extent"}))
    xrange = [lo / 1e6, hi / 1e6]
    x_common = {"range": xrange, "showticklabels": True, "ticksuffix": " ms", "domain": [0, 1]}
    shapes = [{"type": "line", "x0": t / 1e6, "x1": t / 1e6, "xref": "x", "yref": "paper", "y0": 0, "y1": 1,
               "line": {"color": "#777", "width": 1, "dash": "dot"}, "layer": "below"}
              for t in view.step_edges.tolist()]
    shapes += [{"type": "rect", "x0": s / 1e6, "x1": e / 1e6, "xref": "x", "yref": "paper", "y0": 0, "y1": 1,
                "layer": "below", "fillcolor": "rgba(213,94,0,0.18)",
                "line": {"width": 1, "color": "rgba(213,94,0,0.6)"}}
               for s, e in highlights]
    note = memory_note(data) if memory else None
    titles = ["GPU: busy and idle by cause per device, kernels / memcpy / memset per stream, host syncs"
              + (", steps" if steps else ""), "CPU per thread"]
    if memory:
        titles.append("GPU memory (caching allocator)" + (f": {html.escape(note)}" if note else ""))
    layout = {
        "template": WHITE_TEMPLATE, "height": height, "font": FONT, "hovermode": "closest", "dragmode": "zoom",
        "uirevision": "timeline", "margin": margin, "hoverlabel": {"align": "left"}, "shapes": shapes,
        # a step name that does not fit its bar at full size is hidden, not shrunk into the next one
        "uniformtext": {"mode": "hide", "minsize": STEP_NAME_PX},
        "xaxis": {**x_common, "anchor": "y"}, "xaxis2": {**x_common, "anchor": "y2", "matches": "x"},
        "yaxis": {**_lane_axis(domains[0], labels[1]), "anchor": "x"},
        "yaxis2": {**_lane_axis(domains[1], labels[2]), "anchor": "x2"},
        "annotations": [{"text": t, "xref": "paper", "yref": "paper", "x": 0, "xanchor": "left", "y": d[1],
                         "yanchor": "bottom", "showarrow": False, "font": {"size": 14}}
                        for t, d in zip(titles, domains)],
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1 - 30 / height, "yanchor": "top",
                   "yref": "container", "groupclick": "togglegroup"},  # below the modebar
        "legend3": {"orientation": "h", "x": 1, "xanchor": "right", "y": domains[1][1] + 4 / plot_px,
                    "yanchor": "bottom", "font": {"size": 11}},
        "meta": {"t0_us": data.t0_us, "window_ms": xrange, "panels": len(heights), "steps_lane": bool(steps)},
    }
    if memory:
        layout.update({
            "xaxis3": {**x_common, "anchor": "y3", "matches": "x"},
            "yaxis3": {"domain": domains[2], "anchor": "x3", "title": {"text": f"memory ({unit})"}, "fixedrange": True,
                       **_memory_axis_range(view, data, fit_memory)},
            "legend2": {"orientation": "h", "x": 1, "xanchor": "right", "y": domains[2][1] + 4 / plot_px,
                        "yanchor": "bottom", "font": {"size": 11}}})
    layout[f"xaxis{last if last > 1 else ''}"]["title"] = {"text": TIME_TITLE}
    return {"data": traces, "layout": layout}


def step_groups(n_steps: int) -> list[tuple[int, int]]:
    """[first, last] step index of each bar: one step a bar, or runs of consecutive steps past MAX_STEP_BARS."""
    size = max(1, -(-n_steps // MAX_STEP_BARS))
    return [(i, min(i + size, n_steps) - 1) for i in range(0, n_steps, size)]


def steps_figure(report: dict) -> dict:
    """Stacked bars of busy and idle by cause per step (mean per step over a group when there are many); a plain
    figure dict (a go.Figure's template copies cost the page's first response a third of a second)."""
    steps = (report.get("gaps") or {}).get("per_step") or []
    if not steps:
        return {"data": [], "layout": {
            "template": WHITE_TEMPLATE, "height": 120, "font": FONT, "margin": {"l": 20, "r": 20, "t": 20, "b": 20},
            "xaxis": {"visible": False}, "yaxis": {"visible": False},
            "annotations": [{"text": "no steps in this trace (no ProfilerStep#N or other <label>#N annotations): "
                                     "nothing to show per step", "showarrow": False, "x": 0.5, "y": 0.5,
                             "xref": "paper", "yref": "paper"}]}}
    groups = step_groups(len(steps))
    names = [steps[a]["step"] if a == b else f"{steps[a]['step']} … {steps[b]['step']}" for a, b in groups]

    def idle(k: int, cause: str) -> float:
        return (steps[k].get("idle_by_cause_us") or {}).get(cause) or 0.0

    def mean(value) -> list[float]:
        return [sum(value(k) or 0 for k in range(a, b + 1)) / (b - a + 1) / 1e3 for a, b in groups]

    series = [("busy", BUSY_COLOR, lambda k: steps[k].get("busy_us"))]
    series += [(f"idle: {c}", CAUSE_COLORS[c], lambda k, c=c: idle(k, c))
               for c in DRAWN_CAUSES if any(idle(k, c) > 0 for k in range(len(steps)))]  # no empty series
    per = "" if len(groups) == len(steps) else " (mean per step)"
    # Past a few dozen bars their names would overlap: the axis counts steps and the hover names them. Below that,
    # a name every `every` bars, so that the names fit side by side at a laptop's width (decode_step#0 and
    # decode_step#1 ran into each other); every bar still names its step on hover.
    by_name = len(groups) <= MAX_NAMED_STEP_BARS
    x = names if by_name else [a for a, _ in groups]
    every = max(1, math.ceil(max(map(len, names)) * STEP_TICK_CHAR_PX / (STEPS_PLOT_PX / len(groups)))) \
        if by_name else 1
    data = [{"type": "bar", "x": x, "y": mean(value), "name": name, "marker": {"color": color},
             "customdata": groups, "hovertext": names,
             "hovertemplate": f"%{{hovertext}}<br>{name} %{{y:.3f}} ms{per}<extra></extra>"}
            for name, color, value in series]
    title = "Per step: GPU busy and idle by cause (click a step to zoom the timeline to it)"
    if per:
        title = (f"Per step: GPU busy and idle by cause, mean over runs of {groups[0][1] + 1} steps "
                 "(click a bar to zoom the timeline to its steps)")
    layout = {"barmode": "stack", "template": WHITE_TEMPLATE, "height": 360, "font": FONT,
              "title": {"text": title, "x": 0, "font": {"size": 15}}, "legend": {"x": 1.01, "y": 1},
              "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
              "yaxis": {"title": {"text": "time per step (ms)"}, "ticksuffix": " ms", "fixedrange": True},
              "xaxis": {"title": {"text": "step" if by_name else "step number (trace order)"}, "automargin": True,
                        **({"tickmode": "array", "tickvals": names[::every], "ticktext": names[::every]}
                           if by_name else {})},
              "meta": {"names_every": every}}
    if not by_name:
        layout["bargap"] = 0.1
    return {"data": data, "layout": layout}


def diff_figure(d: dict) -> go.Figure:
    """GPU idle by cause of both runs."""
    by_side = {side: {c: v[side] or 0.0 for c, v in d["idle_by_cause_us"].items()} for side in ("before", "after")}
    shown = {c for parts in by_side.values() for c, us in parts.items() if us}
    causes = [c for c in DRAWN_CAUSES if c in shown] + sorted(shown - set(DRAWN_CAUSES))
    fig = go.Figure([go.Bar(name=f"{label}: {d[side]['name']}", x=[f"idle: {c}" for c in causes],
                            y=[(by_side[side].get(c) or 0) / 1e3 for c in causes], marker_color=color,
                            hovertemplate="%{x}: %{y:.3f} ms<extra>" + html.escape(label) + "</extra>")
                     for side, label, color in (("before", "before", "#999999"), ("after", "after", BUSY_COLOR))])
    fig.update_layout(barmode="group", template="plotly_white", height=340, font=FONT,
                      title={"text": "GPU idle by cause, whole trace", "x": 0, "font": {"size": 15}},
                      yaxis_title="GPU idle (ms)", margin={"l": 70, "r": 20, "t": 50, "b": 40},
                      legend={"x": 1.01, "y": 1})
    fig.update_yaxes(ticksuffix=" ms")
    return fig


MAX_SEGMENT_BARS = 40
SEGMENTS_BEFORE_GROUPING = 12
SMALL_SEGMENT_SHARE = 1 / 64
MAX_BLOCK_BARS = 3000
SEGMENT_COLORS = {"allocated": ALLOCATED_COLOR, "inactive": "#E69F00", "free": "#CCCCCC"}


def split_small_segments(segments: list[dict]) -> tuple[list[dict], list[dict]]:
    """(shown one bar each, grouped into one bar): with more than SEGMENTS_BEFORE_GROUPING segments, those under
    SMALL_SEGMENT_SHARE of the largest (a few MiB beside GiB ones: bars too short to see) and any past
    MAX_SEGMENT_BARS share one bar. `segments` is largest first."""
    if len(segments) <= SEGMENTS_BEFORE_GROUPING:
        return segments, []
    cut = segments[0]["total"] * SMALL_SEGMENT_SHARE
    big = [s for s in segments if s["total"] >= cut][:MAX_SEGMENT_BARS]
    return big, segments[len(big):]


def segments_figure(state: dict | None) -> go.Figure:
    """The allocator's segments at one moment (TimelineData.allocator_segments): one bar per segment, its live
    blocks in their address order (hover: size and allocating line), free space inside a segment that holds live
    blocks (inactive, what fragmentation is) apart from segments with none (free: what empty_cache() returns).
    Many small segments share one bar (their allocated, inactive and free bytes summed)."""
    fig = go.Figure()
    if not state or not state["segments"]:
        text = ("no allocator snapshot with history for this trace (capture with memory_history.enabled, or analyze "
                "--memory-snapshot)" if not state else "no segment was reserved at this time")
        fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(template="plotly_white", height=160, font=FONT, xaxis_visible=False, yaxis_visible=False,
                          margin={"l": 20, "r": 20, "t": 20, "b": 20})
        return fig
    segments, small = split_small_segments(state["segments"])
    unit, div = mem_unit(segments[0]["total"])
    labels = [f"{k + 1}: {fmt_bytes(s['total'])}" for k, s in enumerate(segments)]
    free = [s for s in segments if not s["blocks"]]
    split = [s for s in segments if s["blocks"]]
    for name, group in (("inactive (free inside a segment with live blocks)", split),
                        ("free segment (no live block; empty_cache() returns it)", free)):
        if group:
            color = SEGMENT_COLORS["inactive" if group is split else "free"]
            fig.add_bar(y=[labels[segments.index(s)] for s in group], x=[s["total"] / div for s in group],
                        base=0, orientation="h", name=name, marker_color=color, legendgroup=name,
                        hovertemplate="segment %{y}<br>" + ("%{customdata}" if group is split else "no live block")
                        + "<extra></extra>",
                        customdata=[f"{fmt_bytes(s['total'] - s['allocated'])} free between "
                                    f"{len(s['blocks'])} live blocks" for s in group])
    ys, xs, bases, texts = [], [], [], []
    for k, s in enumerate(segments):
        for b in s["blocks"]:
            if len(xs) >= MAX_BLOCK_BARS:
                break
            ys.append(labels[k])
            xs.append(b["size"] / div)
            bases.append((b["address"] - s["address"]) / div)
            texts.append(f"{fmt_bytes(b['size'])} block at +{fmt_bytes(b['address'] - s['address'])}"
                         f"<br>allocated at {html.escape(b['line'])}")
    if xs:
        fig.add_bar(y=ys, x=xs, base=bases, orientation="h", name="allocated block", legendgroup="allocated",
                    marker={"color": SEGMENT_COLORS["allocated"], "line": {"width": 0.5, "color": "#fff"}},
                    hovertext=texts, hovertemplate="%{hovertext}<extra></extra>")
    order = list(labels)
    if small:
        label = f"{len(small)} smaller: {fmt_bytes(sum(s['total'] for s in small))}"
        order.append(label)
        sums = {"allocated": sum(s["allocated"] for s in small), "inactive": sum(s["inactive"] for s in small),
                "free": sum(s["free"] for s in small)}
        hover = (f"{len(small)} segments of {fmt_bytes(small[-1]['total'])} to {fmt_bytes(small[0]['total'])}, "
                 f"summed: {fmt_bytes(sums['allocated'])} allocated, {fmt_bytes(sums['inactive'])} inactive, "
                 f"{fmt_bytes(sums['free'])} in segments with no live block")
        base = 0.0
        for part in ("allocated", "inactive", "free"):
            if sums[part]:
                fig.add_bar(y=[label], x=[sums[part] / div], base=[base], orientation="h", showlegend=False,
                            legendgroup=part, marker_color=SEGMENT_COLORS[part], hovertext=[hover],
                            hovertemplate="%{hovertext}<extra></extra>", meta={"kind": "small_segments"})
                base += sums[part] / div
    fig.update_layout(
        barmode="overlay", template="plotly_white", font=FONT, height=120 + 26 * len(order),
        title={"text": f"Allocator segments of GPU {state['device']} {segments_time(state)}: click the memory lane "
                       "to choose another time", "x": 0, "font": {"size": 15}},
        xaxis_title=f"offset in segment ({unit}); the last bar: the smaller segments' bytes summed" if small
        else f"offset in segment ({unit})", legend={"orientation": "h", "y": -0.2 if len(order) > 4 else -0.6},
        margin={"l": 150, "r": 20, "t": 50, "b": 60},
        meta={"segments": len(state["segments"]), "grouped": len(small),
              "blocks": sum(len(s["blocks"]) for s in state["segments"]), "t_ms": state["t_ns"] / 1e6})
    # largest first, top to bottom, whichever trace a segment's bar is in
    fig.update_yaxes(categoryorder="array", categoryarray=order, autorange="reversed", fixedrange=True)
    return fig


def segments_time(state: dict) -> str:
    """When the segments are shown, on the timeline's own axis (ms since the GPU window start)."""
    at = f"at {state['t_ns'] / 1e6:.3f} ms"
    return {"peak": f"{at} (the highest memory_reserved on the timeline)",
            "start": f"{at} (the timeline's start: memory_reserved is highest there)"}.get(state.get("why"), at)


MAX_HEATMAP_LABELS = 40


def job_heatmap(job: dict, heatmap: dict) -> dict:
    """Ranks x steps of a job report: GPU idle per step in ms (darker: more idle); x is the column's index in
    heatmap["steps"] and y "rank N", which is what a click on a cell reports."""
    ranks, steps, names = heatmap["ranks"], heatmap["steps"], heatmap["step_names"]
    z = [[None if v is None else v / 1e3 for v in row] for row in heatmap["idle_us"]]
    label = [[html.escape(str(n)) for n in names] for _ in ranks]
    x = list(range(len(steps)))
    by_name = len(steps) <= MAX_HEATMAP_LABELS
    trace = {"type": "heatmap", "z": z, "x": x, "y": [f"rank {r}" for r in ranks],
             "text": label, "colorscale": "Reds", "colorbar": {"title": {"text": "idle (ms)"}},
             "hovertemplate": "%{y} · %{text}<br>GPU idle %{z:.3f} ms<br>click: open this rank at this step"
                              "<extra></extra>"}
    stragglers = {s.get("rank") for s in job.get("stragglers") or []}
    return {"data": [trace], "layout": {
        "template": WHITE_TEMPLATE, "font": FONT, "height": 160 + 22 * min(len(ranks), 40),
        "title": {"text": "GPU idle per rank and step (click a cell to open that rank at that step)"
                          + (f"; stragglers: {', '.join(f'rank {r}' for r in sorted(stragglers))}" if stragglers
                             else ""), "x": 0, "font": {"size": 15}},
        "xaxis": {"title": {"text": "step"}, **({"tickvals": x, "ticktext": [html.escape(str(n)) for n in names]}
                                                 if by_name else {})},
        "yaxis": {"autorange": "reversed", "fixedrange": True}, "margin": {"l": 80, "r": 20, "t": 50, "b": 60}}}


DIFF_COLORS = {"before": "#999999", "after": BUSY_COLOR}


def diff_steps_figure(names: dict[str, str], reports: dict[str, dict]) -> dict:
    """Per-step overlay of two runs (keys "before", "after"): each step's wall time and GPU idle (ms) against its
    position in its run's window, so a fix shows where in the steps it moved time."""
    traces = []
    for side in ("before", "after"):
        steps = (reports[side].get("gaps") or {}).get("per_step") or []
        x = list(range(len(steps)))
        labels = [html.escape(str(s.get("step"))) for s in steps]
        for key, label, dash in (("wall_us", "step wall", "solid"), ("idle_us", "GPU idle", "dot")):
            traces.append({"type": "scatter", "mode": "lines+markers", "x": x,
                           "y": [(s.get(key) or 0) / 1e3 for s in steps], "text": labels,
                           "name": f"{side} ({html.escape(names[side])}): {label}",
                           "line": {"color": DIFF_COLORS[side], "dash": dash, "width": 2}, "marker": {"size": 4},
                           "hovertemplate": f"{side}: %{{text}}<br>{label} %{{y:.3f}} ms<extra></extra>",
                           "meta": {"side": side, "key": key}})
    return {"data": traces, "layout": {
        "template": WHITE_TEMPLATE, "font": FONT, "height": 340, "hovermode": "closest",
        "title": {"text": "Per step, both runs: wall time and GPU idle", "x": 0, "font": {"size": 15}},
        "xaxis": {"title": {"text": "step (position in the profiled window)"}},
        "yaxis": {"title": {"text": "ms"}, "ticksuffix": " ms", "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.25}, "margin": {"l": 70, "r": 20, "t": 50, "b": 90}}}


def diff_timeline_figure(names: dict[str, str], data: dict[str, TimelineData], lo: float | None = None,
                         hi: float | None = None) -> dict:
    """Both runs' steps and GPU lanes (busy / idle by cause) stacked on one axis: ns since each run's own GPU window
    start, so the same step of the two runs lines up. [lo, hi]: the window shown (default: the longer run)."""
    if lo is None or hi is None:
        lo = min(d.full_range()[0] for d in data.values())
        hi = max(d.full_range()[1] for d in data.values())
    rows, present = [], set()
    for side in ("before", "after"):
        view = data[side].view(lo, hi)
        present |= present_states(data[side])
        rows += [(side, data[side], lv) for lv in view.lanes
                 if lv.lane.kind == "device" or (lv.lane.kind == "steps" and len(lv.lane.starts))]
    traces: list[dict] = []
    _legend_entries(traces, [s for s in GPU_STATES[:len(DRAWN_CAUSES) + 1] if s in present])
    labels = []
    for i, (side, _, lv) in enumerate(rows):
        labels.append(f"{side} · {lv.lane.label}")
        _lane_area(traces, lv, len(rows) - 1 - i, 1)
    for i, (side, d, lv) in enumerate(rows):
        _lane_hover(traces, d, lv, len(rows) - 1 - i, 1, lo, hi)
    height = LANE_PX * len(rows) + 220
    return {"data": traces, "layout": {
        "template": WHITE_TEMPLATE, "font": FONT, "height": height, "hovermode": "closest", "dragmode": "zoom",
        "uirevision": "diff-timeline", "margin": {"l": 170, "r": 20, "t": 50, "b": 120},
        "title": {"text": "Both runs on one axis (time since each run's GPU window start); drag to zoom both",
                  "x": 0, "font": {"size": 15}},
        "xaxis": {"range": [lo / 1e6, hi / 1e6], "ticksuffix": " ms", "title": {"text": TIME_TITLE}},
        "yaxis": _lane_axis([0, 1], labels),
        "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        "meta": {"window_ms": [lo / 1e6, hi / 1e6]}}}
