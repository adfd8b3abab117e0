"""report.html's figures as plain dicts in plotly.js's JSON schema: the GPU timeline sharing one time axis with the
memory curves, and the per-step bars (written as make_subplots and go.Figure would write them: building them through
plotly.graph_objects validates every property and costs more than the analysis)."""
from __future__ import annotations

import html

import numpy as np

from analyzer.report.palette import ALLOCATED_COLOR, BUSY_COLOR, CAUSE_COLORS, RESERVED_COLOR, STEP_COLORS
from analyzer.report.plotly_json import template
from analyzer.units import fmt_pct, fmt_us
from analyzer.views.idle import CAUSES

MAX_STEP_LINES = 60  # step boundaries drawn as layout shapes; past this only the step lane shows them
MAX_STEP_LABELS = 12  # more labels than this overlap at 1400 px


def mem_unit(peak_bytes: float) -> tuple[str, float]:
    """Axis unit for a memory curve: GiB once the peak reaches 1 GiB, else MiB."""
    return ("GiB", float(1 << 30)) if peak_bytes >= (1 << 30) else ("MiB", float(1 << 20))


def figure_dicts(report: dict) -> tuple[dict, dict]:
    """(timeline, steps) as plotly figure dictionaries: GPU activity over memory on one shared time axis, and
    per-step bars."""
    return _timeline_figure(report), _steps_figure(report)


def window_start_us(report: dict) -> float:
    return _origin(report)[0]


def _origin(report: dict) -> tuple[float, str]:
    """Time zero of the x axis and its name: the window's start (its host's first event, or the first GPU work),
    else the first memory sample, else the first step (CPU-only traces)."""
    devices = (report.get("timeline") or {}).get("devices") or {}
    starts = [d["window_us"][0] if d.get("window_us") else iv[0]  # reports written before window_us: approximate
              for d in devices.values() for key in ("busy_us", "idle_us") for iv in d.get(key, [])]
    if starts:
        return min(starts), "window start"
    mem = ((report.get("allocator") or {}).get("timeline") or {}).values()
    starts = [m["ts_us"][0] for m in mem if m.get("ts_us")]
    if starts:
        return min(starts), "first memory event"
    starts = [s["ts_us"] for s in (report.get("gaps") or {}).get("per_step") or [] if s.get("ts_us") is not None]
    return (min(starts), "first step start") if starts else (0.0, "trace start")


def _x(t_us: float, t0: float) -> float:
    return round((t_us - t0) / 1e3, 4)


def _segments(intervals, t0: float) -> tuple[np.ndarray, np.ndarray]:
    """Line x values (s, e, NaN per interval: NaN breaks the line) and the interval midpoints for hover markers.
    numpy arrays travel to plotly.js as compact base64 instead of lists of numbers."""
    if not len(intervals):
        return np.empty(0), np.empty(0)
    arr = np.array([(iv[0], iv[1]) for iv in intervals], dtype=float)
    s, e = (arr[:, 0] - t0) / 1e3, (arr[:, 1] - t0) / 1e3
    xs = np.column_stack([s, e, np.full(len(s), np.nan)]).ravel()
    return xs, (s + e) / 2


def _scatter(row: int | None = None, **properties) -> dict:
    """A scatter trace; row 1 or 2 puts it on that subplot of the timeline."""
    trace = {**properties, "type": "scatter"}
    if row:
        trace["xaxis"], trace["yaxis"] = ("x", "y") if row == 1 else (f"x{row}", f"y{row}")
    return trace


def _lane(data: list, intervals, t0, y, color, name, meta, legend_shown, **hover) -> None:
    """One colour of a lane: a thick line with NaN separators (x alone breaks the line), plus invisible
    midpoint markers that carry the hover, since lines only hover at their vertices."""
    xs, mids = _segments(intervals, t0)
    data.append(_scatter(1, hoverinfo="skip", legendgroup=name, line={"color": color, "simplify": False, "width": 16},
                         meta=meta, mode="lines", name=name, showlegend=not legend_shown, x=xs,
                         y=np.full(len(xs), float(y))))
    data.append(_scatter(1, **hover, legendgroup=name, marker={"color": color, "opacity": 0, "size": 14},
                         mode="markers", name=name, showlegend=False, x=mids, y=np.full(len(mids), float(y))))


def _idle_lookup(report: dict) -> dict:
    """Idle interval start (rounded µs) -> hover lines naming op and call site, for the intervals the report's
    sites and largest gaps name (the timeline's own intervals carry only their cause)."""
    gaps = report.get("gaps") or {}
    found = {}
    named = [(o, site) for site in gaps.get("sites") or [] for o in site.get("occurrences") or []]
    named += [((g["ts_us"],), g) for g in gaps.get("top") or []]
    for occ, info in named:
        lines = [f"op {html.escape(str(info.get('op')))}" if info.get("op") else "",
                 f"call site {html.escape(str(info.get('call_site')))}" if info.get("call_site") else ""]
        found[round(occ[0], 3)] = "".join(f"<br>{line}" for line in lines if line)
    return found


def _idle_hover(report: dict, lookup: dict, iv: list) -> str:
    """Hover lines for one idle interval: its own call site when the report names it, else the lookup."""
    sites = report["timeline"].get("sites") or []
    if len(iv) > 3 and 0 <= iv[3] < len(sites):
        return f"<br>call site {html.escape(str(sites[iv[3]]))}"
    return lookup.get(round(iv[0], 3), "")


def _add_device_lanes(data: list, report, t0, y_of) -> None:
    # Hover data are numbers plus short strings (customdata), not one formatted text per interval: the report
    # may hold 5000 intervals per device and this keeps the page dominated by plotly.js.
    lookup = _idle_lookup(report)
    causes = report["timeline"].get("causes") or CAUSES
    for n, (dev, device) in enumerate(report["timeline"]["devices"].items()):
        y = y_of[dev]
        busy = device.get("busy_us") or []
        _lane(data, busy, t0, y, BUSY_COLOR, "GPU busy", {"kind": "busy", "device": dev}, n > 0,
              customdata=[round(e - s, 1) for s, e in busy],
              hovertemplate=f"<b>GPU {html.escape(dev)} busy</b> %{{customdata:,.1f}} µs"
                            "<br>centre at %{x:.3f} ms<extra></extra>")
        for cause in causes:
            idle = [iv for iv in device.get("idle_us") or [] if iv[2] == cause]
            _lane(data, idle, t0, y, CAUSE_COLORS.get(cause, "#999999"), f"idle: {cause}",
                  {"kind": "idle", "cause": cause, "device": dev}, n > 0,
                  customdata=[[round(iv[1] - iv[0], 1), _idle_hover(report, lookup, iv)] for iv in idle],
                  hovertemplate=f"<b>GPU {html.escape(dev)} idle: {cause}</b> %{{customdata[0]:,.1f}} µs"
                                "<br>centre at %{x:.3f} ms%{customdata[1]}<extra></extra>")


def _add_sync_markers(data: list, report, t0, y) -> None:
    xs, texts, symbols = [], [], []
    for site in report.get("syncs") or []:
        for s, e in site.get("occurrences") or []:
            xs.append(_x(s, t0))
            symbols.append("x-thin-open" if site.get("kind") == "profiler" else "diamond")
            texts.append("<br>".join([
                f"<b>sync: {html.escape(str(site.get('kind')))}</b> {fmt_us(e - s)}",
                f"api {html.escape(str(site.get('api')))}", f"op {html.escape(str(site.get('op') or '–'))}",
                f"call site {html.escape(str(site.get('call_site')))}", f"at {_x(s, t0):.3f} ms"]))
    data.append(_scatter(1, hovertemplate="%{text}<extra></extra>",
                         marker={"color": CAUSE_COLORS["sync"], "line": {"color": CAUSE_COLORS["sync"], "width": 2},
                                 "size": 11, "symbol": symbols},
                         meta={"kind": "sync"}, mode="markers", name="host sync call", text=texts, x=xs,
                         y=[y] * len(xs)))


def _add_steps(data: list, layout: dict, report, t0, y) -> None:
    steps = [s for s in (report.get("gaps") or {}).get("per_step") or [] if s.get("ts_us") is not None]
    for parity in (0, 1):
        chosen = steps[parity::2]
        _lane(data, [(s["ts_us"], s["ts_us"] + s["wall_us"]) for s in chosen], t0, y, STEP_COLORS[parity],
              "step", {"kind": "steps"}, True, hovertemplate="%{text}<extra></extra>",
              text=[f"<b>{html.escape(s['step'])}</b> wall {fmt_us(s['wall_us'])}<br>GPU busy "
                    f"{fmt_us(s.get('busy_us'))} ({fmt_pct(s.get('gpu_utilization'))})" for s in chosen])
    if 0 < len(steps) <= MAX_STEP_LABELS:
        span = max(s["ts_us"] + s["wall_us"] for s in steps) - min(s["ts_us"] for s in steps)
        # Label only the steps wide enough for their name on a ~1000 px plot; hover names the others.
        labels = [html.escape(s["step"]) if span and s["wall_us"] / span * 1000 >= 7 * len(s["step"]) + 8 else ""
                  for s in steps]
        data.append(_scatter(1, hoverinfo="skip", mode="text", showlegend=False, text=labels,
                             textfont={"color": "#222", "size": 11},
                             x=[_x(s["ts_us"] + s["wall_us"] / 2, t0) for s in steps], y=[y] * len(steps)))
    if 0 < len(steps) <= MAX_STEP_LINES:
        edges = [s["ts_us"] for s in steps] + [steps[-1]["ts_us"] + steps[-1]["wall_us"]]
        # Vertical lines over the lanes only, as plotly's add_vline draws them while the memory panel is empty.
        layout.setdefault("shapes", []).extend(
            {"layer": "below", "line": {"color": "#777", "dash": "dot", "width": 1}, "type": "line",
             "x0": _x(t, t0), "x1": _x(t, t0), "xref": "x", "y0": 0, "y1": 1, "yref": "y domain"} for t in edges)


def _add_memory(data: list, report, t0) -> str:
    alloc = report.get("allocator") or {}
    timeline = alloc.get("timeline") or {}
    peak = max([alloc.get("reserved_peak_bytes") or 0]
               + [max(m.get("reserved_bytes") or [0]) for m in timeline.values()])
    unit, div = mem_unit(peak)
    for n, (dev, m) in enumerate(timeline.items()):
        x = (np.asarray(m.get("ts_us") or [], dtype=float) - t0) / 1e3
        dash = ("solid", "dash", "dot", "dashdot")[n % 4]
        for key, color, label in (("reserved_bytes", RESERVED_COLOR, "reserved"),
                                  ("allocated_bytes", ALLOCATED_COLOR, "allocated")):
            data.append(_scatter(
                2, hovertemplate=f"{label} GPU {html.escape(dev)}: %{{y:.2f}} {unit}<br>at %{{x:.3f}} ms<extra></extra>",
                legend="legend2", line={"color": color, "dash": dash, "shape": "hv", "width": 2},
                meta={"kind": label, "device": dev, "unit": unit}, mode="lines", name=f"{label} GPU {dev}", x=x,
                y=np.asarray(m.get(key) or [], dtype=float) / div))
    _add_alloc_markers(data, alloc, t0, div)
    return unit


def _alloc_api(site: dict) -> str:
    if not site.get("cuda_free"):
        return "cudaMalloc"
    return "cudaFree" if not site.get("cuda_malloc") else "cudaMalloc/cudaFree"


def _add_alloc_markers(data: list, alloc, t0, div) -> None:
    first = next(iter((alloc.get("timeline") or {}).values()), None)
    mem_x = np.array([_x(t, t0) for t in first["ts_us"]]) if first and first.get("ts_us") else None
    symbols = {"cudaMalloc": "triangle-up", "cudaFree": "triangle-down", "cudaMalloc/cudaFree": "x"}
    for api, symbol in symbols.items():
        occ = [(s, o) for s in alloc.get("sites") or [] for o in s.get("occurrences") or []
               if (o[2] if len(o) > 2 else _alloc_api(s)) == api]
        if not occ:
            continue
        xs = [_x(o[0], t0) for _, o in occ]
        if mem_x is not None:
            # Sit each marker on the reserved curve so it reads as the moment reserved memory changed.
            idx = np.clip(np.searchsorted(mem_x, xs, side="right") - 1, 0, len(mem_x) - 1)
            ys = [round(first["reserved_bytes"][i] / div, 4) for i in idx.tolist()]
        else:
            ys = [0.0] * len(xs)
        texts = ["<br>".join([f"<b>{api}</b> call {fmt_us(o[1] - o[0])}",
                              f"op {html.escape(str(s.get('op') or '–'))}",
                              f"call site {html.escape(str(s.get('call_site')))}", f"at {_x(o[0], t0):.3f} ms"])
                 for s, o in occ]
        data.append(_scatter(2, hovertemplate="%{text}<extra></extra>", legend="legend2",
                             marker={"color": CAUSE_COLORS["allocator"], "line": {"color": "#333", "width": 1},
                                     "size": 13, "symbol": symbol},
                             meta={"kind": "alloc_call", "api": api}, mode="markers", name=api, text=texts, x=xs,
                             y=ys))


def _timeline_figure(report: dict) -> dict:
    devices = list(((report.get("timeline") or {}).get("devices") or {}).keys())
    # Lanes from the top: steps, host syncs, then one per GPU.
    y_of = {dev: len(devices) - 1 - i for i, dev in enumerate(devices)}
    sync_y, steps_y = len(devices), len(devices) + 1
    lanes_px = 48 + 38 * (len(devices) + 2)
    mem_px = 300 if (report.get("allocator") or {}).get("timeline") else 110
    height = lanes_px + mem_px + 190
    layout = _two_rows(lanes_px, mem_px, 90 / height, ("GPU activity: busy, idle by cause, host syncs, steps",
                                                       "GPU memory (caching allocator)"))
    data: list[dict] = []
    t0, origin = _origin(report)
    if devices:
        _add_device_lanes(data, report, t0, y_of)
    _add_sync_markers(data, report, t0, sync_y)
    _add_steps(data, layout, report, t0, steps_y)
    unit = _add_memory(data, report, t0)
    layout["yaxis"].update(title={"text": "lane"}, range=[-0.6, steps_y + 0.6], fixedrange=True,
                           tickvals=[*y_of.values(), sync_y, steps_y],
                           ticktext=[*(f"GPU {d}" for d in devices), "host syncs", "steps"], showgrid=False)
    layout["yaxis2"]["title"] = {"text": f"memory ({unit})"}
    layout["xaxis2"]["title"] = {"text": f"time since {origin} (ms)"}
    layout["xaxis"]["showticklabels"] = True
    _layout(layout, height)
    # Paper coordinates: plotly.js misplaces "x2 domain" references on a subplot that holds no trace.
    if not devices:
        _note(layout, "no GPU activity recorded in this trace", layout["yaxis"]["domain"], 0.6)
    if not (report.get("allocator") or {}).get("timeline"):
        _note(layout, "no memory events recorded", layout["yaxis2"]["domain"], 0.5)
    top2 = layout["yaxis2"]["domain"][1]
    layout.update(legend={"title": {"text": "GPU lane"}, "y": 1.0, "yanchor": "top", "x": 1.01},
                  legend2={"y": top2, "yanchor": "top", "x": 1.01, "title": {"text": "memory"}},
                  hovermode="closest")
    return {"data": data, "layout": layout}


def _two_rows(top_px: int, bottom_px: int, spacing: float, titles: tuple[str, str]) -> dict:
    """The layout make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=spacing,
    row_heights=[top_px, bottom_px], subplot_titles=titles) starts from (same arithmetic, same floats)."""
    usable, total = 1.0 - spacing, float(top_px + bottom_px)
    top_height, bottom_height = usable * (top_px / total), usable * (bottom_px / total)
    top = [bottom_height + spacing, min(bottom_height + spacing + top_height, 1.0)]
    bottom = [0.0, bottom_height]
    title = {"font": {"size": 16}, "showarrow": False, "x": 0.5, "xanchor": "center", "xref": "paper",
             "yanchor": "bottom", "yref": "paper"}
    return {
        "xaxis": {"anchor": "y", "domain": [0.0, 1.0], "matches": "x2", "showticklabels": False},
        "yaxis": {"anchor": "x", "domain": top},
        "xaxis2": {"anchor": "y2", "domain": [0.0, 1.0]},
        "yaxis2": {"anchor": "x2", "domain": bottom},
        "annotations": [dict(title, text=titles[0], y=top[1]), dict(title, text=titles[1], y=bottom[1])],
    }


def _note(layout: dict, text: str, domain, at: float) -> None:
    layout["annotations"].append({"font": {"color": "#555", "size": 14}, "showarrow": False, "text": text,
                                  "x": 0.5, "xref": "paper", "y": domain[0] + at * (domain[1] - domain[0]),
                                  "yref": "paper"})


def _layout(layout: dict, height: int) -> None:
    layout.update(template=template("plotly_white"), height=height,
                  margin={"l": 80, "r": 20, "t": 40, "b": 60},
                  font={"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 13},
                  hoverlabel={"align": "left"})


def _steps_figure(report: dict) -> dict:
    steps = (report.get("gaps") or {}).get("per_step") or []
    names = [s["step"] for s in steps]
    data = [{"hovertemplate": "%{x}<br>GPU busy %{y:.3f} ms<extra></extra>", "marker": {"color": BUSY_COLOR},
             "name": "GPU busy", "x": names, "y": [round((s.get("busy_us") or 0) / 1e3, 4) for s in steps],
             "type": "bar"}]
    for cause in CAUSES:
        data.append({"hovertemplate": f"%{{x}}<br>idle: {cause} %{{y:.3f}} ms<extra></extra>",
                     "marker": {"color": CAUSE_COLORS[cause]}, "name": f"idle: {cause}", "x": names,
                     "y": [round(((s.get("idle_by_cause_us") or {}).get(cause) or 0) / 1e3, 4) for s in steps],
                     "type": "bar"})
    data.append(_scatter(hovertemplate="%{x}<br>wall %{y:.3f} ms<extra></extra>",
                         marker={"color": "#000", "line": {"width": 2}, "size": 28, "symbol": "line-ew-open"},
                         mode="markers", name="step wall time", x=names,
                         y=[round(s.get("wall_us", 0) / 1e3, 4) for s in steps]))
    layout = {"title": {"text": "Per step: GPU busy and idle by cause", "x": 0}, "legend": {"x": 1.01, "y": 1},
              "barmode": "stack", "xaxis": {"title": {"text": "step"}},
              "yaxis": {"title": {"text": "time per step (ms)"}}}
    _layout(layout, 420)
    layout["margin"]["t"] = 50
    return {"data": data, "layout": layout}
