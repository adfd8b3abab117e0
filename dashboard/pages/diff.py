"""`/diff?before=<id>&after=<id>`: two runs compared with analyzer.diff.compare: what each finding did (fixed,
new, changed, unchanged), step time, utilization, idle by cause, syncs and allocator calls."""
from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from analyzer.api import compare, is_improvement, predicted_text, render_diff_markdown
from analyzer.errors import UsageError
from analyzer.units import fmt_pct, fmt_peak_bytes, fmt_us
from dashboard.figures import GRAPH_CONFIG, TIMELINE_CONFIG, diff_figure, diff_steps_figure, diff_timeline_figure
from dashboard.pages.common import (X_AXIS_RELAYOUT_JS, badge, error_card, markdown_block, run_href,
                                   window_from_relayout)
from analyzer.api import RunStore

STATUS_COLORS = {"fixed": "#009E73", "new": "#D55E00", "changed": "#E69F00", "unchanged": "#999999"}


def layout(store: RunStore, before: str | None, after: str | None) -> html.Div:
    runs = store.runs()
    options = [{"label": f"{r.run_id}", "value": r.run_id} for r in runs]
    ids = [r.run_id for r in runs]
    unknown = [f"{side}={value!r}" for side, value in (("before", before), ("after", after))
               if value is not None and value not in ids]
    if unknown:
        return error_card(f"no such run: {', '.join(unknown)} (pick from the {len(ids)} runs under {store.root})",
                          title="cannot compare", back=True)
    before = before or (ids[1] if len(ids) > 1 else None)
    after = after or (ids[0] if ids else None)
    return html.Div([
        html.H1("Compare two runs"),
        html.P("Pick the run before a fix and the run after it. Runs not analyzed yet are analyzed now.",
               className="hint"),
        html.Div([
            html.Label(["before", dcc.Dropdown(id="diff-before", options=options, value=before, clearable=False)]),
            html.Label(["after", dcc.Dropdown(id="diff-after", options=options, value=after, clearable=False)]),
        ], className="diff-pickers"),
        dcc.Loading(html.Div(id="diff-body"), delay_show=150),
    ], className="page-diff")


def _change(before, after, fmt, metric: str | None = None) -> list:
    """before → after and the change in percent, green when it is an improvement and red when not."""
    if before is None and after is None:
        return ["–"]
    text = f"{fmt(before) if before is not None else '–'} → {fmt(after) if after is not None else '–'}"
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and before:
        pct = f"{100 * (after - before) / abs(before):+.0f}%"
        good = is_improvement(metric, before, after) if metric else None
        # a change that reads "+0%" is coloured as none: red beside "+0%" reads as a wrong number
        tone = "muted" if good is None or pct in ("+0%", "-0%") else "delta good" if good else "delta bad"
        return [text, html.Span(f" ({pct})", className=tone)]
    return [text]


def _summary_table(d: dict) -> html.Table:
    s, steps, sy, al = d["summary"], d["per_step_median"], d["syncs"], d["allocator"]
    rows = [("GPU utilization", "gpu_utilization", s["gpu_utilization"], fmt_pct),
            ("step time p50, unprofiled", "step_unprofiled_p50_us", s["step_unprofiled_p50_us"], fmt_us),
            ("step time p50, profiled", "step_profiled_p50_us", s["step_profiled_p50_us"], fmt_us),
            ("median step wall (profiled)", "wall_us", steps["wall_us"], fmt_us),
            ("median step GPU busy", "busy_us", steps["busy_us"], fmt_us),
            ("median step GPU idle", "idle_us", steps["idle_us"], fmt_us),
            ("GPU busy, whole trace", "gpu_busy_us", s["gpu_busy_us"], fmt_us),
            ("GPU idle, whole trace", "gpu_idle_us", s["gpu_idle_us"], fmt_us),
            ("steps", "steps", s["steps"], str), ("blocking host syncs", "blocking_calls", sy["blocking_calls"], str),
            ("GPU drain after syncs", "drain_us", sy["drain_us"], fmt_us),
            ("cudaMalloc calls", "cuda_malloc", al["cuda_malloc"], str),
            ("cudaFree calls", "cuda_free", al["cuda_free"], str),
            ("reserved peak", "reserved_peak_bytes", al["reserved_peak_bytes"], fmt_peak_bytes)]
    return html.Table([html.Thead(html.Tr([html.Th("metric"), html.Th("before → after")])),
                       html.Tbody([html.Tr([html.Td(name), html.Td(_change(v["before"], v["after"], fmt, metric))],
                                           **{"data-metric": metric})
                                   for name, metric, v, fmt in rows])], className="kv")


def _findings_table(d: dict) -> html.Table | html.P:
    if not d["findings"]:
        return html.P("Neither run has findings.", className="empty")
    head = html.Thead(html.Tr([html.Th(h, title=t) for h, t in (
        ("status", None), ("finding", None), ("call site", None), ("GPU idle", None), ("count", None),
        ("predicted saving", "for a fixed finding: what the run before predicted fixing it saves per step; the "
                             "measured change is the step time above"))]))
    rows = [html.Tr([html.Td(badge(f["status"], STATUS_COLORS[f["status"]])),
                     html.Td(f["title_after"] or f["title_before"]),
                     html.Td(html.Code(f["call_site"] or "–")),
                     html.Td(_change(f["impact_before_us"], f["impact_after_us"], fmt_us, "gpu_idle_us")),
                     html.Td(_change(f["count_before"], f["count_after"], str)),
                     html.Td(predicted_text(f), className="num")],
                    className=f"diff-finding {f['status']}", **{"data-status": f["status"]})
            for f in d["findings"]]
    return html.Table([head, html.Tbody(rows)], className="findings")


def register(app: dash.Dash, store: RunStore) -> None:
    @app.callback(Output("url", "search", allow_duplicate=True), Input("diff-before", "value"),
                  Input("diff-after", "value"), prevent_initial_call=True)
    def remember_pair(before_id, after_id):
        """The pair in the URL: a link to this comparison, and Back to the previous pair."""
        return "?" + urlencode({"before": before_id, "after": after_id})

    @app.callback(Output("diff-body", "children"), Input("diff-before", "value"), Input("diff-after", "value"))
    def show_diff(before_id, after_id):
        if not before_id or not after_id:
            return html.P("Pick two runs.", className="hint")
        reports = []
        for run_id in (before_id, after_id):
            run = store.find(run_id)
            if run is None:
                return error_card(f"no run {run_id!r}")
            try:
                reports.append(store.report(run))
            except UsageError as exc:
                return error_card(str(exc), title=f"cannot analyze {run_id}")
        d = compare(before_id, reports[0], after_id, reports[1])
        names = {"before": before_id, "after": after_id}
        sides = {"before": reports[0], "after": reports[1]}
        timelines = {side: store.timeline(store.find(names[side])) for side in names}
        verdict = d["verdict"]
        return html.Div([
            html.P([dcc.Link(before_id, href=run_href(before_id)), " → ",
                    dcc.Link(after_id, href=run_href(after_id))],
                   className="diff-title"),
            html.P(verdict["headline"], className=f"verdict {verdict['outcome']}",
                   **{"data-outcome": verdict["outcome"]}),
            html.Div([html.Div([html.H2("Summary"), _summary_table(d)], className="diff-summary"),
                      html.Div(dcc.Graph(figure=diff_figure(d), config=GRAPH_CONFIG), className="diff-chart")],
                     className="diff-row"),
            html.H2("Findings"), _findings_table(d),
            html.H2("Steps and timelines"),
            dcc.Graph(id="diff-steps", figure=diff_steps_figure(names, sides), config=GRAPH_CONFIG),
            dcc.Graph(id="diff-timeline", figure=diff_timeline_figure(names, timelines), config=TIMELINE_CONFIG),
            dcc.Store(id="diff-timeline-relayout"),
            markdown_block(render_diff_markdown(d), "diff-md", "this comparison"),
        ])

    app.clientside_callback(X_AXIS_RELAYOUT_JS, Output("diff-timeline-relayout", "data"),
                            Input("diff-timeline", "relayoutData"), prevent_initial_call=True)

    @app.callback(Output("diff-timeline", "figure"), Input("diff-timeline-relayout", "data"),
                  State("diff-before", "value"), State("diff-after", "value"), prevent_initial_call=True)
    def refine_diff_timeline(relayout, before_id, after_id):
        """Both runs' lanes recomputed for the zoomed window (as the run page's timeline)."""
        window = window_from_relayout(relayout)
        names = {"before": before_id, "after": after_id}
        runs = {side: store.find(run_id) for side, run_id in names.items()}
        if window is None or None in runs.values():
            raise PreventUpdate
        data = {side: store.timeline(run) for side, run in runs.items()}
        if window == "full":
            return diff_timeline_figure(names, data)
        return diff_timeline_figure(names, data, min(window) * 1e6, max(window) * 1e6)
