"""report.html: one self-contained page (plotly.js inlined once, no network) with the findings, a zoomable
GPU timeline sharing one time axis with the memory curves, per-step bars and the supporting tables."""
from __future__ import annotations

import base64
import functools
import html
import importlib.util
import json
from pathlib import Path

import numpy as np

from analyzer.views.idle import CAUSES
from analyzer.report.markdown import named_site, numbered, partition_line, trace_notes
from analyzer.report.units import fmt_bytes, fmt_pct, fmt_us

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
CAUSE_COLORS = {"cpu_launch": "#E69F00", "sync": "#D55E00", "allocator": "#CC79A7", "queued": "#999999",
                "event_loop_idle": "#882255", "thread_hop": "#44AA99",  # Paul Tol's wine and teal: no clash
                "warmup": "#DDCC77", "profiler": "#BBBBBB", "unknown": "#666666"}  # Tol's sand, greys
BUSY_COLOR = "#0072B2"
RESERVED_COLOR = "#009E73"
ALLOCATED_COLOR = "#56B4E9"
STEP_COLORS = ("#D9D9D9", "#BDBDBD")
SEVERITY_COLORS = {"high": "#D55E00", "medium": "#E69F00", "low": "#56B4E9", "info": "#999999"}
MAX_STEP_LINES = 60  # step boundaries drawn as layout shapes; past this only the step lane shows them
MAX_STEP_LABELS = 12  # more labels than this overlap at 1400 px
TIMELINE_HINT = ("<p class=hint>Drag to zoom (both panels share the time axis), double-click to reset; hover an "
                 "interval for its cause, op and call site.</p>")
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False,
               "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


# ---------------------------------------------------------------- units

def ms(value_us: float | None) -> str:
    return "–" if value_us is None else f"{value_us / 1e3:.3f}"


def mem_unit(peak_bytes: float) -> tuple[str, float]:
    """Axis unit for a memory curve: GiB once the peak reaches 1 GiB, else MiB."""
    return ("GiB", float(1 << 30)) if peak_bytes >= (1 << 30) else ("MiB", float(1 << 20))


def _times(factor) -> str:
    return "–" if factor is None else f"{factor}×"


def _esc(value) -> str:
    return "–" if value is None or value == "" else html.escape(str(value))


# ---------------------------------------------------------------- figures
# Figures are plain dicts in plotly.js's JSON schema, written as make_subplots and go.Figure would write them:
# building them through plotly.graph_objects validates every property and costs more than the analysis.

def build_figures(report: dict):
    """(timeline_fig, steps_fig) as plotly Figures: GPU activity over memory on one shared time axis, and
    per-step bars. The page itself is rendered from figure_dicts(report)."""
    import plotly.graph_objects as go
    return tuple(go.Figure(figure) for figure in figure_dicts(report))


def figure_dicts(report: dict) -> tuple[dict, dict]:
    return _timeline_figure(report), _steps_figure(report)


def window_start_us(report: dict) -> float:
    return _origin(report)[0]


def _origin(report: dict) -> tuple[float, str]:
    """Time zero of the x axis and its name: the GPU window start, else the first memory sample, else the
    first step (CPU-only traces)."""
    devices = (report.get("timeline") or {}).get("devices") or {}
    starts = [iv[0] for d in devices.values() for key in ("busy_us", "idle_us") for iv in d.get(key, [])[:1]]
    if starts:
        return min(starts), "GPU window start"
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
    layout.update(template=_template("plotly_white"), height=height,
                  margin={"l": 80, "r": 20, "t": 40, "b": 60},
                  font={"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 13},
                  hoverlabel={"align": "left"})


def _template(name: str) -> dict:
    """One of plotly's layout templates, as `template=name` puts it into a figure's JSON."""
    return json.loads(_plotly_file("package_data", "templates", f"{name}.json"))


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


# ---------------------------------------------------------------- page

def render_html(report: dict) -> str:
    timeline_fig, steps_fig = figure_dicts(report)
    body = [
        _header(report),
        _section("Findings", _findings_table(report)),
        _serving_section(report),
        _section("Timeline", TIMELINE_HINT + _figure_html(timeline_fig, "timeline") + _bounded_note(report)),
        _section("Steps", _figure_html(steps_fig, "steps")),
        _section("Largest idle gaps", _top_gaps_table(report)),
        _section("Kernel launches and CUDA-graph estimate", _launch_tables(report)),
        _section("Host synchronizations", _sync_table(report)),
        _section("Caching allocator", _allocator_tables(report)),
        _footer(report),
    ]
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{_esc(_title(report))}</title><style>{CSS}</style>"
            f"<script>{plotly_js()}</script></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


def _bounded_note(report: dict) -> str:
    """Say so when the report kept only part of the intervals, so that a sparse lane is not misread."""
    notes = []
    for dev, d in ((report.get("timeline") or {}).get("devices") or {}).items():
        if d.get("idle_total", 0) > len(d.get("idle_us") or []):
            notes.append(f"GPU {_esc(dev)}: the {len(d['idle_us'])} longest of {d['idle_total']} idle intervals")
        if d.get("busy_total", 0) > len(d.get("busy_us") or []):
            notes.append(f"GPU {_esc(dev)}: {d['busy_total']} busy intervals merged into {len(d['busy_us'])}")
    return f"<p class=hint>Shown: {'; '.join(notes)}.</p>" if notes else ""


# As plotly.io.to_html(fig, include_plotlyjs=False, full_html=False, config=..., div_id=...) writes a figure.
_FIGURE_DIV = """\
<div style="height:{height}; width:100%;">\
                \
            <div id="{id}" class="plotly-graph-div" \
style="height:100%; width:100%;"></div>\
            <script>\
                window.PLOTLYENV=window.PLOTLYENV || {{}};\
                \
                if (document.getElementById("{id}")) {{\
                    Plotly.newPlot(\
                        "{id}",\
                        {data},\
                        {layout},\
                        {config}\
                    )\
                }};\
            </script>\
        </div>"""


def _figure_html(figure: dict, div_id: str) -> str:
    return _FIGURE_DIV.format(height=f"{figure['layout']['height']}px", id=div_id, data=_plotly_json(figure["data"]),
                              layout=_plotly_json(figure["layout"]), config=json.dumps(PLOT_CONFIG))


def _plotly_json(value) -> str:
    """JSON as plotly.io writes it into a page: compact, NaN as null, float arrays as base64 typed arrays, and
    <, > and / escaped so that no string can end the <script>."""
    text = json.dumps(value, separators=(",", ":"), default=_typed_array)
    if "NaN" in text or "Infinity" in text:
        text = json.dumps(json.loads(text, parse_constant=lambda _: None), separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("/", "\\u002f")


def _typed_array(value):
    if isinstance(value, np.ndarray):
        if value.size and value.dtype == np.float64:
            return {"dtype": "f8", "bdata": base64.b64encode(value).decode("ascii")}
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def plotly_js() -> str:
    """plotly.min.js as plotly.offline.get_plotlyjs() returns it."""
    return _plotly_file("package_data", "plotly.min.js")


@functools.lru_cache(maxsize=None)
def _plotly_file(*parts: str) -> str:
    """A file of the installed plotly package, read without importing plotly (which costs more than the page)."""
    package = importlib.util.find_spec("plotly")
    return Path(package.submodule_search_locations[0], *parts).read_bytes().decode("utf-8")


def _section(title: str, content: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>\n{content}\n</section>"


def _title(report: dict) -> str:
    run = report.get("run")
    if run:
        parts = [run.get("workload"), run.get("model"), run.get("device")]
        return "GPU idle report: " + " · ".join(str(p) for p in parts if p)
    return "GPU idle report: " + str((report.get("source") or {}).get("trace") or "trace")


def _header(report: dict) -> str:
    s, run = report.get("summary") or {}, report.get("run")
    facts = [f"GPU utilization <b>{fmt_pct(s.get('gpu_utilization'))}</b>",
             f"busy <b>{ms(s.get('gpu_busy_us'))} ms</b>", f"idle <b>{ms(s.get('gpu_idle_us'))} ms</b>",
             f"window <b>{ms(s.get('window_us'))} ms</b>", f"steps <b>{_esc(s.get('steps'))}</b>"]
    st = s.get("step_time_us")
    if st and st.get("profiler_dilation") is not None:
        facts.append(f"profiler dilation <b>{_esc(st.get('profiler_dilation'))}×</b> (step p50 "
                     f"{ms(st.get('profiled_p50'))} ms profiled vs {ms(st.get('unprofiled_p50'))} ms unprofiled)")
    out = [f"<header><h1>{_esc(_title(report))}</h1>", f"<p class=summary>{' · '.join(facts)}</p>"]
    for line in (partition_line(report), trace_notes(report)):
        if line:
            out.append(f"<p class=run>{_esc(line)}</p>")
    if run:
        keys = ("dtype", "layers", "batch_size", "mode", "torch", "cuda_runtime", "created_utc")
        out.append("<p class=run>" + " · ".join(f"{k} <code>{_esc(run.get(k))}</code>" for k in keys
                                               if run.get(k) is not None) + "</p>")
    out.append(f"<p class=run>trace <code>{_esc((report.get('source') or {}).get('trace'))}</code></p>")
    if s.get("note"):
        out.append(f"<p class=note>{_esc(s['note'])}</p>")
    out.append(_cause_legend(report))
    return "\n".join(out) + "</header>"


def _cause_legend(report: dict) -> str:
    gaps = report.get("gaps") or {}
    by, count = gaps.get("by_cause") or {}, gaps.get("count_by_cause") or {}
    chips = [f"<span class=chip style='--c:{CAUSE_COLORS.get(c, '#999')}'>idle: {html.escape(c)} "
             f"<b>{ms(by.get(c))} ms</b> ({_esc(count.get(c, 0))} gaps)</span>" for c in CAUSES if by.get(c)]
    return "<p class=chips>" + "".join(chips) + "</p>" if chips else ""


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller)."""
    if not rows:
        return "<p class=empty>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _where(item: dict) -> str:
    call, lib = item.get("call_site"), item.get("library_site")
    cells = [f"<code>{_esc(call)}</code>" if call else "", f"→ <code>{_esc(lib)}</code>" if lib else ""]
    return " ".join(c for c in cells if c) or "–"


def _findings_table(report: dict) -> str:
    rows = []
    for n, f in numbered(report.get("findings") or []):
        sev = f.get("severity")
        child = bool(f.get("parent"))
        title = (("↳ " if child else "") + f"{_esc(f.get('title'))}<details><summary>advice</summary><p>"
                 f"{_esc(f.get('advice'))}</p>{_context(f.get('detail', {}).get('context'))}</details>")
        rows.append([n, f"<span class=sev style='--c:{SEVERITY_COLORS.get(sev, '#999')}'>{_esc(sev)}</span>",
                     _esc(f.get("kind")), title, _where(f),
                     _esc(f.get("count")), f"<span class=num>{ms(f.get('impact_us'))}</span>"])
    return _table(["#", "severity", "kind", "finding", "where (your code → library)", "count", "GPU idle (ms)"],
                  rows, "findings")


def _context(frames) -> str:
    if not frames:
        return ""
    return "<pre>" + "\n".join(html.escape(str(f)) for f in frames) + "</pre>"


def _top_gaps_table(report: dict, limit: int = 10) -> str:
    t0 = window_start_us(report)
    rows = [[f"<span class=num>{_x(g['ts_us'], t0):.3f}</span>", f"<span class=num>{ms(g.get('dur_us'))}</span>",
             f"<span class=chip style='--c:{CAUSE_COLORS.get(g.get('cause'), '#999')}'>{_esc(g.get('cause'))}</span>",
             _esc(g.get("step")), _esc(g.get("op")), _esc(g.get("runtime_call")),
             f"{_where(g)}<details><summary>stack</summary>{_context(g.get('context'))}"
             f"</details>"] for g in ((report.get("gaps") or {}).get("top") or [])[:limit]]
    return _table(["at (ms)", "duration (ms)", "cause", "step", "op", "runtime call", "where"], rows)


def _stats_cell(stats: dict | None) -> str:
    if not stats:
        return "–"
    return " · ".join(f"{k} {fmt_us(v)}" for k, v in stats.items())


def _launch_tables(report: dict) -> str:
    gaps = report.get("gaps") or {}
    ls, cg = gaps.get("launch_stats") or {}, gaps.get("cuda_graph_estimate") or {}
    launch_rows = [
        ["launches", _esc(ls.get("launches"))],
        ["by API", _esc(", ".join(f"{k} {v}" for k, v in (ls.get("by_api") or {}).items()) or None)],
        ["launch call", _stats_cell(ls.get("launch_call_us"))],
        ["launch → GPU start", _stats_cell(ls.get("launch_to_start_us"))],
        ["kernel duration", _stats_cell(ls.get("kernel_us"))],
        ["kernels shorter than their launch call", fmt_pct(ls.get("kernels_shorter_than_launch_share"))],
    ]
    graph_rows = [
        ["steps used", _esc(cg.get("steps_used"))],
        ["GPU busy per step", fmt_us(cg.get("gpu_busy_per_step_us"))],
        ["profiled step", fmt_us(cg.get("profiled_step_us"))],
        ["eager step", f"{fmt_us(cg.get('eager_step_us'))} ({_esc(cg.get('eager_step_source'))})"],
        ["estimated CUDA-graph step", fmt_us(cg.get("estimated_graph_step_us"))],
        ["estimated speedup", _times(cg.get("estimated_speedup"))],
        ["recoverable per step", fmt_us(cg.get("recoverable_us_per_step"))],
    ]
    measured = cg.get("measured")
    if measured:
        graph_rows.append(["measured (meta.json)", f"eager {fmt_us(measured.get('eager_step_us'))} → CUDA graph "
                           f"{fmt_us(measured.get('cuda_graph_step_us'))}, {_times(measured.get('speedup'))}"])
    if not cg:
        mc = (report.get("run") or {}).get("mode_comparison") or {}
        graphs = gaps.get("graphs") or {}
        graph_rows = [["estimate", "none: the run already replays graphs" if graphs.get("replays") else
                       "none for this trace (a graph capture, a training step, or no steps)"]]
        if mc.get("eager_over_graph"):
            graph_rows.append(["measured by the capture (meta.json)",
                               f"eager {fmt_us(mc['eager_step_ms'] * 1e3)} → CUDA graph "
                               f"{fmt_us(mc['cuda_graph_step_ms'] * 1e3)}, {mc['eager_over_graph']:.2f}×"])
    definition = f"<p class=hint>{_esc(ls.get('definition'))}</p>" if ls.get("definition") else ""
    return ("<div class=cols><div><h3>Launch statistics</h3>" + _table(["metric", "value"], launch_rows, "kv")
            + definition + "</div><div><h3>CUDA-graph estimate</h3>" + _table(["metric", "value"], graph_rows, "kv")
            + "</div></div>")


def _sync_table(report: dict) -> str:
    rows = [[_where(s) + _source_lines(s.get("source_lines")),
             _esc(s.get("kind")), _esc(s.get("api")), _esc(s.get("op")), _esc(s.get("count")),
             f"<span class=num>{ms(s.get('wait_us'))}</span>", f"<span class=num>{ms(s.get('drain_us'))}</span>"]
            for s in report.get("syncs") or []]
    totals = report.get("sync_totals") or {}
    note = (f"<p class=hint>{_esc(totals.get('total_blocking_calls'))} blocking calls; wait = host time inside "
            "the blocking call, GPU idle = the idle time while the CPU was blocked there.</p>") if totals else ""
    return _table(["where", "kind", "blocking api", "op", "count", "wait (ms)", "GPU idle (ms)"], rows) + note


def _source_lines(lines) -> str:
    if not lines:
        return ""
    return "<pre>" + "\n".join(f"{_esc(l.get('file'))}:{_esc(l.get('line'))}: {_esc(l.get('code'))}"
                               for l in lines) + "</pre>"


def _allocator_tables(report: dict) -> str:
    a = report.get("allocator") or {}
    names = a.get("api_names") or {"malloc": "cudaMalloc", "free": "cudaFree"}
    growth, drops = a.get("reserved_growth") or {}, a.get("reserved_drops") or {}
    rows = [["reserved peak", fmt_bytes(a.get("reserved_peak_bytes"))],
            ["allocated peak", fmt_bytes(a.get("allocated_peak_bytes"))],
            [f"{names['malloc']} / {names['free']}", f"{_esc(a.get('cuda_malloc'))} / {_esc(a.get('cuda_free'))}"
                                                      f" ({_esc(a.get('warmup_calls'))} first allocations)"],
            ["allocations (cache hit share)", f"{_esc(a.get('allocations'))} ({fmt_pct(a.get('cache_hit_share'))})"],
            ["reserved grew / dropped", f"{_esc(growth.get('count'))}× {fmt_bytes(growth.get('bytes'))} / "
                                        f"{_esc(drops.get('count'))}× {fmt_bytes(drops.get('bytes'))}"],
            ["GPU idle attributed to the allocator", fmt_us(a.get("gpu_idle_us"))],
            ["OOM events", _esc(a.get("oom_events"))]]
    delta = a.get("memory_stats_delta")
    if delta:
        rows.append(["torch.cuda.memory_stats delta", _esc(", ".join(f"{k} {v}" for k, v in delta.items()))])
    sites = [[_where(s), _esc(s.get("op")), _esc(s.get("cuda_malloc")),
              _esc(s.get("cuda_free")), f"<span class=num>{ms(s.get('total_us'))}</span>",
              fmt_bytes(s.get("bytes_reserved")), fmt_bytes(s.get("bytes_released"))] for s in a.get("sites") or []]
    return ("<div class=cols><div><h3>Summary</h3>" + _table(["metric", "value"], rows, "kv") + "</div></div>"
            + f"<h3>{names['malloc']} / {names['free']} call sites</h3>"
            + _table(["where", "op", names["malloc"], names["free"], "call time (ms)", "reserved", "released"], sites))


def _footer(report: dict) -> str:
    tool = report.get("tool") or {}
    return (f"<footer>{_esc(tool.get('name'))} {_esc(tool.get('version'))} · schema "
            f"<code>{_esc(report.get('schema'))}</code> · analysis {_esc(report.get('analysis_seconds'))} s · "
            f"data: <code>report.json</code></footer>")


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;padding:16px 28px;
 max-width:1800px;color:#1a1a1a;background:#fff;font-size:14px;line-height:1.45}
h1{font-size:22px;margin:4px 0 6px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #ddd;
 padding-bottom:4px}h3{font-size:15px;margin:10px 0 6px}
p{margin:4px 0}.summary{font-size:15px}.run{color:#444}.note{background:#fff4e0;border-left:4px solid #E69F00;
 padding:6px 10px}.hint{color:#555;font-size:13px}.empty{color:#777;font-style:italic}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{font-size:12px;background:#f6f6f6;padding:6px 8px;margin:4px 0;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;margin:4px 0 8px;width:100%}th,td{border:1px solid #ddd;padding:4px 8px;
 vertical-align:top;text-align:left}th{background:#f2f2f2;font-weight:600}tbody tr:nth-child(even){background:#fafafa}
table.kv td:first-child{white-space:nowrap;color:#333;width:16em}.num{font-variant-numeric:tabular-nums}
td .num{display:block;text-align:right}
details summary{cursor:pointer;color:#0072B2;font-size:13px}details p{margin:4px 0;max-width:110ch}
.sev,.chip{display:inline-block;border-left:10px solid var(--c);padding:0 6px;background:#f4f4f4;
 white-space:nowrap}.chips .chip{margin:4px 8px 0 0}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:18px}.cols>div{min-width:0}
td code{overflow-wrap:anywhere}
footer{margin:28px 0 8px;color:#666;font-size:12px;border-top:1px solid #ddd;padding-top:6px}
"""


def _serving_section(report: dict) -> str:
    """Serving runs: the capture's unprofiled per-request latency next to the profiled steps' GPU utilization."""
    serving = report.get("serving") or {}
    latency = serving.get("latency")
    parked = [(label, serving.get(key) or {}) for label, key in (("event loop parked", "event_loop_idle"),
                                                                 ("thread hand-offs", "thread_hops"))]
    if not serving.get("is_serving", latency or any(part.get("count") for _, part in parked)):
        return ""
    parts = []
    if latency:
        opts = latency.get("options") or {}
        spread = lambda s: (f"p50 {s['p50']:.1f} ms, p90 {s['p90']:.1f} ms" if s else "–")  # noqa: E731
        parts.append(f"<p>{_esc(latency.get('requests'))} requests ({_esc(opts.get('arrival'))} arrivals at "
                     f"{_esc(opts.get('rate'))}/s, at most {_esc(latency.get('max_batch'))} in a batch; engine: yield "
                     f"{_esc(opts.get('yield_s'))} s, to_thread {_esc(opts.get('to_thread'))}, token readback "
                     f"{_esc(opts.get('token_readback'))}). Without the profiler: TTFT "
                     f"<b>{_esc(spread(latency.get('ttft_ms')))}</b>; TPOT <b>{_esc(spread(latency.get('tpot_ms')))}</b>;"
                     f" <b>{_esc(latency.get('throughput_tokens_per_s'))}</b> output tokens/s; mean batch "
                     f"{_esc(latency.get('mean_batch'))}.</p>")
    for label, part in parked:
        if part.get("count"):
            site = named_site(part)
            parts.append(f"<p>GPU idle with the launching thread parked ({_esc(label)}): <b>{ms(part['idle_us'])} ms"
                         f"</b> in {_esc(part['count'])} gaps" + (f", most after <code>{_esc(site)}</code>" if site
                                                                  else "") + ".</p>")
    fmt = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    requests = (latency or {}).get("per_request") or []
    if requests:
        parts.append("<h3>Per request, without the profiler (ms)</h3>" + _table(
            ["request", "prompt", "output", "queued", "TTFT", "TPOT", "latency"],
            [[_esc(r["id"]), _esc(r["prompt_tokens"]), _esc(r["output_tokens"]), fmt(r["queue_ms"]),
              fmt(r["ttft_ms"]), fmt(r["tpot_ms"]), fmt(r["latency_ms"])] for r in requests]))
    in_batch = {s["step"]: s for s in serving.get("steps") or []}
    steps = [s for s in (report.get("gaps") or {}).get("per_step") or [] if s["step"] in in_batch]
    if steps:
        parts.append("<h3>Per engine step, profiled</h3>" + _table(
            ["step", "wall", "GPU util", "requests in batch", "waiting", "idle: event loop", "idle: thread hop",
             "idle: sync"],
            [[_esc(s["step"]), fmt_us(s["wall_us"]), fmt_pct(s["gpu_utilization"]),
              _esc(in_batch[s["step"]]["in_batch"]), _esc(in_batch[s["step"]]["waiting"]),
              fmt_us(s["idle_by_cause_us"].get("event_loop_idle")), fmt_us(s["idle_by_cause_us"].get("thread_hop")),
              fmt_us(s["idle_by_cause_us"].get("sync"))] for s in steps]))
    return _section("Serving: per-request latency and per-step GPU utilization", "\n".join(parts))
