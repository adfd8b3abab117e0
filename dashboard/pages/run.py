"""`/run/<run id>`: header, downloads, ranked findings (filter by kind; click one to zoom the timeline to its
occurrences and read its call site, frames and advice), the timeline refined on every zoom, per-step bars."""
from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlencode

import dash
from dash import ALL, Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from analyzer.errors import UsageError
from analyzer.api import TimelineData, numbered, ranked, saving_cell, validity_items, validity_line, what_if_line
from analyzer.units import fmt_pct, fmt_us, plural
from dashboard.figures import (GRAPH_CONFIG, MEMORY_POINT, TIMELINE_CONFIG, has_memory, memory_note, segments_figure,
                               steps_figure, timeline_figure)
from dashboard.pages.common import (X_AXIS_RELAYOUT_JS, badge, cause_badge, download_href, error_card,
                                    markdown_block, quoted, run_href, severity_badge, window_bar,
                                    window_from_relayout, window_parts)
from analyzer.api import RunStore, format_created

FINDING = "finding"
OCCURRENCE = "occurrence"
MIN_PAD_US = 20.0
MAX_OCCURRENCE_BUTTONS = 16
# The per-step chart is below the timeline: drawn once the timeline is (plotly draws one graph at a time on the
# page's one thread, and the two interleaved made the timeline's first paint wait for both)
STEPS_PENDING = {"data": [], "layout": {"height": 360, "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                        "annotations": [{"text": "per-step chart: drawn after the timeline",
                                                         "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper",
                                                         "yref": "paper"}]}}
STEPS_AFTER_TIMELINE_S = 15  # drawn anyway after this long, should the timeline never finish
TIMELINE_TOP_SHARE = 0.5  # a zoom scrolls the page when the timeline starts lower than this share of the window
TIMELINE_HINT = ("Drag across any panel, or turn the wheel over it, to zoom all of them (the server recomputes "
                 "what the new window shows); keys: + and - zoom, ← and → pan, 0 shows it all; "
                 "double-click to see the whole trace; hover for kernel, op, call site and duration.")


# ------------------------------------------------------------------ layout

def layout(store: RunStore, run_id: str, query: dict | None = None) -> html.Div:
    """The run page; `query` (the URL's finding / occ / t0 / t1) restores a selected finding and a zoom."""
    run = store.find(run_id)
    if run is None:
        return error_card(f"no run {quoted(run_id)} under the traces folder", back=True)
    try:
        report = store.report(run)
        data = store.timeline(run)
        markdown = store.report_text(run, "report.md")
    except UsageError as exc:
        return error_card(str(exc), title="cannot analyze this run", back=True)
    findings = report.get("findings") or []
    state = _state_from_query(report, data, query or {}, run.run_id)
    lo, hi = state["window_ns"] or data.full_range()
    figure = timeline_figure(data, data.view(lo, hi), state["highlights_ns"])
    kinds = sorted({f["kind"] for f in findings})
    memory = has_memory(data)
    steps = (report.get("gaps") or {}).get("per_step") or []
    # One screen: the header, the findings (one line each) and the timeline on the left, the selected finding's
    # detail in a column on the right that stays in view while the page scrolls.
    return html.Div([
        dcc.Store(id="run-id", data=run.run_id),
        dcc.Store(id="zoom", data=None),
        dcc.Store(id="selection", data=state["selection"]),
        dcc.Store(id="url-sync"),
        dcc.Store(id="scrolled"),
        dcc.Store(id="timeline-relayout", data=None),
        dcc.Store(id="shown-window", data=[lo, hi]),
        _header(report, run.run_id, store.row(run).device),
        *([error_card(state["problem"], title="this link")] if state["problem"] else []),
        html.Div([
            html.Div([
                html.Div([html.H2(f"Findings ({len(findings)})"),
                          dcc.Checklist(id="kind-filter", options=kinds, value=kinds, inline=True,
                                        className="kind-filter")], className="section-head"),
                html.Div(_findings_table(findings, run.run_id), className="findings-scroll"),
                html.Div([html.H2("Timeline"),
                          html.Span("how to zoom", title=TIMELINE_HINT, className="hint timeline-hint"),
                          # kept without memory curves (hidden): the timeline's callback reads it
                          dcc.Checklist(id="memory-fit", options=[{"label": " fit the memory axis to memory_reserved "
                                                                            "in the window", "value": "fit"}],
                                        value=[], className="memory-fit",
                                        style=None if memory else {"display": "none"})], className="section-head"),
                html.Div(dcc.Loading(dcc.Graph(id="timeline", figure=figure, config=TIMELINE_CONFIG,
                                               style={"width": "100%"}),
                                     delay_show=400, overlay_style={"visibility": "visible", "opacity": 0.6}),
                         id="timeline-box"),
                *([] if memory else [html.P(f"Memory: {memory_note(data)}.", className="hint no-memory")]),
                _segments_block(data),
                *([dcc.Store(id="steps-figure", data=steps_figure(report)),
                   dcc.Graph(id="steps-graph", figure=STEPS_PENDING, config=GRAPH_CONFIG)] if steps else
                  [html.P("Per step: no steps in this trace (no ProfilerStep#N or other <label>#N annotations).",
                          className="hint no-steps")]),
                markdown_block(markdown, "report-md", "the report"),
            ], className="run-main"),
            html.Aside(state["detail"] or _overview(report), id="finding-detail", className="detail-col"),
        ], className="run-grid"),
    ], className="page-run")


def _window(report: dict) -> tuple[float | None, dict[str, float], float | None]:
    """GPU busy, idle by cause (those with time), and the profiled window, in µs."""
    s = report.get("summary") or {}
    by_cause = {c: us for c, us in ((report.get("gaps") or {}).get("by_cause") or {}).items() if us}
    return s.get("gpu_busy_us"), by_cause, s.get("window_us")


def _overview(report: dict) -> list:
    """The detail column before a finding is picked: where the window went, and what a click does."""
    busy, by_cause, window = _window(report)
    rows = [html.Tr([html.Td(html.Span(className="swatch", style={"background": color})), html.Td(name),
                     html.Td(fmt_us(us), className="num"), html.Td(fmt_pct(us / window) if window else "–",
                                                                   className="num")])
            for name, us, color in window_parts(busy, by_cause)]
    return [html.H3("Where the profiled window went"),
            html.Table(html.Tbody(rows), className="overview"),
            html.P("Click a finding to zoom the timeline to its largest occurrence (all of them shaded) and read its "
                   "call site, Python frames and advice here.", className="hint")]


def _header(report: dict, run_id: str, listed_device: str | None = None) -> html.Header:
    """`listed_device`: the device the run list shows (meta.json's, else the trace's deviceProperties): the page
    names the same one, also for a bare trace whose report.json's run section has none."""
    run, s = report.get("run") or {}, report.get("summary") or {}
    workload = Path(run["workload"]).stem if run.get("workload") else None
    device = listed_device or run.get("device")
    title = " · ".join(str(p) for p in (workload, run.get("model"), device) if p) or run_id
    if not workload and device:  # a bare trace: its run id names it
        title = f"{run_id} · {title}"
    facts = [f"{k} {run[k]}" for k in ("torch", "cuda_runtime", "dtype", "mode") if run.get(k)]
    if run.get("batch_size") is not None:
        facts.append(f"batch {run['batch_size']}")
    if run.get("created_utc"):
        facts.append(f"captured {format_created(run['created_utc'])}")
    st = s.get("step_time_us")
    if st and st.get("profiler_dilation") is not None:
        step = [html.B(fmt_us(st.get("unprofiled_p50"))), " unprofiled vs ", html.B(fmt_us(st.get("profiled_p50"))),
                f" profiled (dilation {st.get('profiler_dilation')}×)"]
    elif st:
        step = [html.B(fmt_us(st.get("unprofiled_p50"))), f" unprofiled (no profiled match: {st.get('omitted')})"]
    else:
        step = ["unknown (no meta.json timings)"]
    busy, by_cause, window = _window(report)
    downloads = html.Div([html.A(name, href=download_href(run_id, key), className="button", download="")
                          for name, key in (("report.md", "report.md"), ("report.html", "report.html"),
                                            ("raw trace", "trace"))], className="downloads")
    return html.Header([
        html.Div([html.H1(title, **{"data-device": device or ""}), downloads], className="title-row"),
        html.P([html.Code(run_id), *([" · ", " · ".join(facts)] if facts else [])], className="run-facts"),
        html.P(["GPU utilization ", html.B(fmt_pct(s.get("gpu_utilization"))),
                f" · busy {fmt_us(s.get('gpu_busy_us'))} · idle {fmt_us(s.get('gpu_idle_us'))} of a "
                f"{fmt_us(s.get('window_us'))} profiled window · {plural(s.get('steps', 0), 'step')} · step p50 ",
                *step],
               className="summary"),
        html.Div([window_bar(busy, by_cause, window, className="window-bar wide"),
                  html.Span([cause_badge(c, f"{c} {fmt_us(v)}") for c, v in by_cause.items()], className="chips")],
                 className="window-row"),
        html.P(f"Of the busy time, {fmt_us(comm['comm_us'])} ({fmt_pct(comm['share_of_busy'])}) was communication "
               f"({plural(comm['kernels'], 'NCCL/RCCL kernel')}): a rank waiting inside a collective counts as busy",
               className="summary communication") if (comm := s.get("communication")) else None,
        _validity(report),
        html.P(s["note"], className="note") if s.get("note") else None,
        *[html.P(f"meta.json: {w}", className="note meta-warning")
          for w in (report.get("source") or {}).get("meta_warnings") or []],
    ])


def _segments_block(data: TimelineData) -> html.Div:
    """The segment view, only for a run with the allocator's records (a figure that would say "none" costs the
    page a plotly graph to draw)."""
    state = data.allocator_segments()
    if state is None:
        return html.P("Allocator segments: no snapshot with history for this run (capture with "
                      "memory_history.enabled, or analyze --memory-snapshot).", className="hint")
    return dcc.Graph(id="segments-graph", figure=segments_figure(state), config=GRAPH_CONFIG)


def _state_from_query(report: dict, data: TimelineData, query: dict, run_id: str) -> dict:
    """What a link's query selects: `finding` (its id), `occ` (1-based occurrence), `t0` / `t1` (ms on the
    timeline's axis). Values that name nothing in this run are said, not silently ignored."""
    state = {"window_ns": None, "highlights_ns": [], "detail": None, "selection": None}
    problems = []
    findings = report.get("findings") or []
    fid = query.get("finding")
    if fid is not None:
        index = next((i for i, f in enumerate(findings) if f.get("id") == fid), None)
        if index is None:
            problems.append(f"no finding {quoted(fid)} in this run ({len(findings)} findings)")
        else:
            f = findings[index]
            occ = f.get("occurrences_us") or []
            n = _int(query.get("occ"))
            if n is not None and not 1 <= n <= len(occ):
                problems.append(f"finding {quoted(fid)} has no occurrence {quoted(query.get('occ'))} "
                                f"({len(occ)} shown)")
                n = None
            state.update(detail=_detail(f, index, run_id, data, report.get("what_if")),
                         selection={"finding": fid, "occ": n})
            if occ:
                zoom = _zoom(_window_ns(data, [occ[n - 1] if n else _largest(occ)], 0.0 if n else 0.05), occ, data)
                state.update(window_ns=zoom["window_ns"], highlights_ns=zoom["highlights_ns"])
    t0, t1 = _float(query.get("t0")), _float(query.get("t1"))
    if (query.get("t0"), query.get("t1")) != (None, None):
        if t0 is None or t1 is None or not t0 < t1:
            problems.append(f"t0={quoted(query.get('t0'))}, t1={quoted(query.get('t1'))}: not a time window in ms")
        else:
            state["window_ns"] = [t0 * 1e6, t1 * 1e6]  # a link restores the view it was made from
    state["problem"] = "; ".join(problems) or None
    return state


def _int(text) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float(text) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value == value and abs(value) != float("inf") else None


def _largest(occurrences: list) -> tuple[float, float]:
    return max(occurrences, key=lambda o: o[1] - o[0])


def _validity(report: dict) -> html.Details | None:
    """The trace checks in one line; the checks that did not pass below it, open when one failed."""
    line = validity_line(report)
    if not line:
        return None
    items = validity_items(report)
    failed = any(status == "fail" for status, _, _ in items)
    return html.Details([html.Summary(line), html.Ul([html.Li([html.B(status.upper() if status == "fail" else status),
                                                               " ", html.Code(name), f": {text}"])
                                                      for status, name, text in items])],
                        open=failed, className="validity failed" if failed else "validity")


def finding_href(run_id: str, finding_id: str, occ: int | None = None) -> str:
    return f"{run_href(run_id)}?" + urlencode({"finding": finding_id, **({"occ": occ} if occ else {})})


FINDING_COLUMNS = (("#", "col-num"), ("severity", "col-sev"), ("finding", "col-title"),
                   ("your code → library", "col-site"), ("count", "col-count"), ("saving", "col-saving"),
                   ("GPU idle", "col-idle"), ("", "col-link"))
COLUMN_TITLES = {"saving": "what fixing it buys: the step time saved when the trace is replayed without this "
                           "finding's cause (– : no estimate; hover the finding's detail for why)",
                 "GPU idle": "the GPU idle time this finding explains"}


def _findings_table(findings: list[dict], run_id: str) -> html.Table | html.P:
    """One line per finding (the whole text on hover and in the detail column), so that a run's findings and its
    timeline fit on one screen."""
    if not findings:
        return html.P("No findings: nothing in this trace explains a significant share of GPU idle time.",
                      className="empty")
    head = html.Thead(html.Tr([html.Th(h, className=c, title=COLUMN_TITLES.get(h)) for h, c in FINDING_COLUMNS]))
    order = ranked(findings)  # by saving; a row's index stays its position in report.json
    position = {id(f): i for i, f in enumerate(findings)}
    rows = []
    for n, f in numbered(order):
        i = position[id(f)]
        title = ("↳ " if f.get("parent") else "") + f["title"]
        rows.append(html.Tr([
            html.Td(n), html.Td(severity_badge(f["severity"]),
                                title=f"confidence {f.get('confidence', 'high')}"
                                      + (f" ({', '.join(f['confidence_checks'])})" if f.get("confidence_checks") else "")),
            html.Td(title, title=f"{f['kind']}: {f['title']}", className="title"), _where_cell(f),
            html.Td(str(f.get("count", "–")), className="num"), html.Td(saving_text(f), className="num saving"),
            html.Td(fmt_us(f.get("impact_us")), className="num"),
            html.Td(html.A("link", href=finding_href(run_id, f["id"]), className="permalink",
                           title="a link to this finding, to paste into an issue"))],
            id={"type": FINDING, "index": i, "kind": f["kind"]}, n_clicks=0,
            className="finding-row child" if f.get("parent") else "finding-row",
            **{"data-kind": f["kind"], "data-finding": f.get("id") or ""}))
    return html.Table([html.Colgroup([html.Col(className=c) for _, c in FINDING_COLUMNS]), head, html.Tbody(rows)],
                      className="findings")


def _where_cell(f: dict) -> html.Td:
    call, lib = f.get("call_site"), f.get("library_site")
    text = " → ".join(x for x in (call, lib) if x)
    return html.Td(html.Code(text) if text else "–", className="call-site", title=text or None)


def saving_text(f: dict) -> str:
    """The saving cell (analyzer.api.saving_cell) with its unit: `1.21 ms/step (75%)` for a per-step saving,
    `930.73 ms/window (96%)` for one over the profiled window (a trace without repeated steps)."""
    cell = saving_cell(f)
    w = f.get("what_if") or {}
    number = fmt_us(w["saving_ms"] * 1e3) if w.get("saving_ms") is not None else None
    if not number or not cell.startswith(number):
        return cell
    return number + ("/step" if w.get("measure") == "step" else "/window") + cell[len(number):]


def _detail(f: dict, index: int, run_id: str | None = None, data: TimelineData | None = None,
            what_if: dict | None = None) -> list:
    """`what_if`: the report's what_if section, whose basis the sentence names (the estimated unprofiled step or
    window, where the header's numbers are the profiled ones)."""
    detail = f.get("detail") or {}
    line = what_if_line(f, what_if)
    out = [html.H3(f["title"]),
           html.P([severity_badge(f["severity"]), " ", badge(f["kind"], "#555555"),
                   f" · GPU idle {fmt_us(f.get('impact_us'))} · count {f.get('count', '–')}"]),
           *([html.P(line, className="what-if")] if line else []),
           html.P([html.B("call site "), html.Code(f.get("call_site") or "–")]
                  + ([html.B(" library "), html.Code(f["library_site"])] if f.get("library_site") else []))]
    if detail.get("context"):
        out += [html.H4("Python frames (innermost first)"), html.Pre("\n".join(map(str, detail["context"])))]
    if detail.get("source_lines"):
        out += [html.H4("Source"), html.Pre("\n".join(f"{s.get('file')}:{s.get('line')}: {s.get('code')}"
                                                      for s in detail["source_lines"]))]
    if detail.get("top_sites"):
        out += [html.H4("Top call sites"), html.Ul([
            html.Li([html.Code(s["call_site"]), f": {fmt_us(s.get('idle_us'))} in {plural(s.get('count'), 'gap')}"])
            for s in detail["top_sites"]])]
    if detail.get("stack"):
        out += [html.H4("Allocating stack (the allocator's own records, innermost first)"),
                html.Pre("\n".join(map(str, detail["stack"])), className="alloc-stack")]
    out += [html.H4("Advice"), html.P(f.get("advice") or "–", className="advice")]
    occ = f.get("occurrences_us") or []
    if occ and data is not None:
        covered = data.covering(occ)
        rows = [html.Li([html.Code(name), f" {fmt_us(us)}", html.Span(f" ({what})", className="muted")])
                for what in ("ops", "code") for name, us in covered[what]]
        if rows:
            out += [html.H4("On the CPU during its occurrences (the threads shown on the timeline)"),
                    html.Ul(rows, className="covering")]
    if occ:
        out += [html.H4(f"Occurrences ({len(occ)} shown; all shaded on the timeline)"), html.Div([
            html.Span([html.Button(f"#{k + 1} {fmt_us(e - s)}", id={"type": OCCURRENCE, "finding": index, "index": k},
                                   n_clicks=0, className="occurrence", title="zoom to this occurrence"),
                       *([html.A("link", href=finding_href(run_id, f["id"], k + 1), className="permalink",
                                 title="a link to this occurrence")] if run_id and f.get("id") else [])],
                      className="occurrence-item")
            for k, (s, e) in enumerate(occ[:MAX_OCCURRENCE_BUTTONS])], className="occurrences")]
    return out


# ------------------------------------------------------------------ zoom

def _window_ns(data: TimelineData, spans_us: list, pad_share: float = 0.05, context: bool = True) -> list[float]:
    """[lo, hi] in ns since t0 covering the µs spans, padded (with `context`: by twice the longest span, so a
    short occurrence shows what came before and after it)."""
    lo = min(s for s, _ in spans_us)
    hi = max(e for _, e in spans_us)
    longest = max(e - s for s, e in spans_us) if context else 0.0
    pad = max((hi - lo) * pad_share, 2 * longest, MIN_PAD_US)
    return [(lo - pad - data.t0_us) * 1e3, (hi + pad - data.t0_us) * 1e3]


def inside(data: TimelineData, window_ns) -> list[float]:
    """The window moved inside the run's whole range (the timeline's full view), its width kept; the whole range
    where it is wider. A finding, occurrence or step selected never zooms out past the trace: a one-time cost of
    630 ms in a 979 ms window, padded by twice its length, asked for -500 to 2,200 ms."""
    full_lo, full_hi = data.full_range()
    lo, hi = min(window_ns), max(window_ns)
    width = hi - lo
    if width >= full_hi - full_lo:
        return [full_lo, full_hi]
    if lo < full_lo:
        return [full_lo, full_lo + width]
    if hi > full_hi:
        return [full_hi - width, full_hi]
    return [lo, hi]


def _zoom(window_ns, highlights_us, data: TimelineData) -> dict:
    return {"window_ns": inside(data, window_ns), "highlights_ns": [[(s - data.t0_us) * 1e3, (e - data.t0_us) * 1e3]
                                                      for s, e in highlights_us], "at": time.time()}


# ------------------------------------------------------------------ callbacks

def register(app: dash.Dash, store: RunStore) -> None:
    def timeline_data(run_id) -> tuple[dict, TimelineData]:
        run = store.find(run_id)
        if run is None:
            raise PreventUpdate
        return store.report(run), store.timeline(run)

    @app.callback(Output({"type": FINDING, "index": ALL, "kind": ALL}, "style"), Input("kind-filter", "value"))
    def filter_findings(kinds):
        shown = set(kinds or [])
        return [None if o["id"]["kind"] in shown else {"display": "none"} for o in ctx.outputs_list]

    @app.callback(Output("zoom", "data"), Output("finding-detail", "children"), Output("selection", "data"),
                  Input({"type": FINDING, "index": ALL, "kind": ALL}, "n_clicks"), State("run-id", "data"),
                  prevent_initial_call=True)
    def select_finding(clicks, run_id):
        """Zoom to the finding's largest occurrence (all of them shaded): a finding spread over the whole trace
        still zooms to something one can read."""
        if not ctx.triggered or not ctx.triggered[0]["value"]:
            raise PreventUpdate
        index = ctx.triggered_id["index"]
        report, data = timeline_data(run_id)
        f = report["findings"][index]
        occ = f.get("occurrences_us") or []
        zoom = _zoom(_window_ns(data, [_largest(occ)]), occ, data) if occ else dash.no_update
        return zoom, _detail(f, index, run_id, data, report.get("what_if")), {"finding": f.get("id"), "occ": None}

    @app.callback(Output("zoom", "data", allow_duplicate=True), Output("selection", "data", allow_duplicate=True),
                  Input({"type": OCCURRENCE, "finding": ALL, "index": ALL}, "n_clicks"), State("run-id", "data"),
                  prevent_initial_call=True)
    def zoom_to_occurrence(clicks, run_id):
        if not ctx.triggered or not ctx.triggered[0]["value"]:
            raise PreventUpdate
        report, data = timeline_data(run_id)
        f = report["findings"][ctx.triggered_id["finding"]]
        occ = f["occurrences_us"]
        s, e = occ[ctx.triggered_id["index"]]
        return (_zoom(_window_ns(data, [(s, e)], 0.0), occ, data),
                {"finding": f.get("id"), "occ": ctx.triggered_id["index"] + 1})

    # The page's state goes into the address bar (history.pushState, no reload): a reload or a pasted link
    # restores it, and Back / Forward walk the zooms and selections (the URL change re-renders the page).
    app.clientside_callback(
        """function(shown, selection, runId) {
            if (!shown) { return window.dash_clientside.no_update; }
            const q = new URLSearchParams();
            if (selection && selection.finding) { q.set('finding', selection.finding); }
            if (selection && selection.occ) { q.set('occ', selection.occ); }
            q.set('t0', (shown[0] / 1e6).toFixed(3));
            q.set('t1', (shown[1] / 1e6).toFixed(3));
            const search = '?' + q.toString();
            if (window.location.search !== search) {
                window.history.pushState({}, '', window.location.pathname + search);
            }
            return window.dash_clientside.no_update;
        }""", Output("url-sync", "data"), Input("shown-window", "data"), Input("selection", "data"),
        State("run-id", "data"), prevent_initial_call=True)

    app.clientside_callback(
        """function(figure) {
            const start = Date.now();
            return new Promise(resolve => {
                const drawn = () => {
                    const el = document.getElementById('timeline');
                    const gd = el && el.querySelector('.js-plotly-plot');
                    const pending = !gd || !gd._fullData || el.querySelector('.dash-graph--pending') ||
                        el.classList.contains('dash-graph--pending');
                    if (!pending || Date.now() - start > %d) {
                        requestAnimationFrame(() => resolve(figure));
                    } else {
                        setTimeout(drawn, 40);
                    }
                };
                drawn();
            });
        }""" % (STEPS_AFTER_TIMELINE_S * 1000), Output("steps-graph", "figure"), Input("steps-figure", "data"))

    @app.callback(Output("zoom", "data", allow_duplicate=True), Input("steps-graph", "clickData"),
                  State("run-id", "data"), prevent_initial_call=True)
    def zoom_to_step(click, run_id):
        if not click or not click.get("points"):
            raise PreventUpdate
        report, data = timeline_data(run_id)
        first, last = click["points"][0]["customdata"]
        steps = report["gaps"]["per_step"]
        span = (steps[first]["ts_us"], steps[last]["ts_us"] + steps[last]["wall_us"])
        return _zoom(_window_ns(data, [span], 0.02, context=False), [], data)

    # A zoom asked for from a finding, an occurrence or a step brings the timeline into view when its top is off
    # screen or low on it (the detail column stays where it is: it is sticky).
    app.clientside_callback(
        """function(zoom) {
            const box = document.getElementById('timeline-box');
            if (zoom && box) {
                const top = box.getBoundingClientRect().top;
                if (top < 0 || top > window.innerHeight * %s) {
                    window.scrollTo({top: window.scrollY + top - 6, behavior: 'instant'});
                }
            }
            return window.dash_clientside.no_update;
        }""" % TIMELINE_TOP_SHARE, Output("scrolled", "data"), Input("zoom", "data"), prevent_initial_call=True)

    app.clientside_callback(X_AXIS_RELAYOUT_JS, Output("timeline-relayout", "data"), Input("timeline", "relayoutData"),
                            prevent_initial_call=True)

    @app.callback(Output("timeline", "figure"), Output("shown-window", "data"), Input("timeline-relayout", "data"),
                  Input("zoom", "data"), Input("memory-fit", "value"), State("shown-window", "data"),
                  State("run-id", "data"), prevent_initial_call=True)
    def refine_timeline(relayout, zoom, fit, shown, run_id):
        report, data = timeline_data(run_id)
        highlights = (zoom or {}).get("highlights_ns") or []
        if ctx.triggered_id == "memory-fit":
            lo, hi = shown or data.full_range()
        elif ctx.triggered_id == "zoom":
            if not zoom:
                raise PreventUpdate
            lo, hi = zoom["window_ns"]
        else:
            window = window_from_relayout(relayout)
            if window is None:
                raise PreventUpdate
            # a drag or pan shows what it asked for; only the zooms the page asks for itself are kept inside
            lo, hi = data.full_range() if window == "full" else (window[0] * 1e6, window[1] * 1e6)
        lo, hi = min(lo, hi), max(lo, hi)
        return timeline_figure(data, data.view(lo, hi), highlights, fit_memory="fit" in (fit or [])), [lo, hi]

    @app.callback(Output("segments-graph", "figure"), Input("timeline", "clickData"), State("run-id", "data"),
                  prevent_initial_call=True)
    def segments_at_click(click, run_id):
        points = [p for p in (click or {}).get("points") or []
                  if isinstance(p.get("customdata"), list) and p["customdata"][:1] == [MEMORY_POINT]]
        if not points:
            raise PreventUpdate
        _, data = timeline_data(run_id)
        state = data.allocator_segments(float(points[0]["x"]) * 1e6, device=int(points[0]["customdata"][1]))
        if state is None:
            raise PreventUpdate
        return segments_figure(state)
