"""`/diff?before=<id>&after=<id>`: two runs compared with analyzer.diff.compare: first what makes the runs unlike
(device, workload, torch), then what each finding did (fixed, new, changed, unchanged), step time, utilization, idle
by cause, syncs and allocator calls. Without both runs named it asks for them: it never picks two itself."""
from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from analyzer.api import compare, is_improvement, predicted_text, render_diff_markdown
from analyzer.errors import UsageError
from analyzer.units import fmt_pct, fmt_peak_bytes, fmt_us
from dashboard.figures import GRAPH_CONFIG, TIMELINE_CONFIG, diff_figure, diff_steps_figure, diff_timeline_figure
from dashboard.pages.common import (X_AXIS_RELAYOUT_JS, badge, error_card, markdown_block, quoted, run_href,
                                   window_from_relayout)
from analyzer.api import RunStore

STATUS_COLORS = {"fixed": "#009E73", "new": "#D55E00", "changed": "#E69F00", "unchanged": "#999999"}
# A change of a time or of utilization is coloured when it is larger than the run-to-run noise the verdict measured
# on the step time (half its steps' 95% interval, or the sessions' spread, the larger), else than this share.
DEFAULT_NOISE_SHARE = 0.05
EXACT_METRICS = {"steps", "blocking_calls", "cuda_malloc", "cuda_free", "reserved_peak_bytes"}  # counted, not timed


def layout(store: RunStore, before: str | None, after: str | None) -> html.Div:
    runs = store.runs()
    options = [{"label": f"{r.run_id}", "value": r.run_id} for r in runs]
    ids = [r.run_id for r in runs]
    unknown = [f"{side}={quoted(value)}" for side, value in (("before", before), ("after", after))
               if value is not None and value not in ids]
    if unknown:
        return error_card(f"no such run: {', '.join(unknown)} (pick from the {len(ids)} runs under {store.root})",
                          title="cannot compare", back=True)
    return html.Div([
        html.H1("Compare two runs"),
        html.P("Pick the run before a fix and the run after it. Runs not analyzed yet are analyzed now.",
               className="hint"),
        html.Div([
            html.Label(["before", dcc.Dropdown(id="diff-before", options=options, value=before, clearable=False,
                                               placeholder="the run before the fix…")]),
            html.Label(["after", dcc.Dropdown(id="diff-after", options=options, value=after, clearable=False,
                                              placeholder="the run after it…")]),
        ], className="diff-pickers"),
        dcc.Loading(html.Div(id="diff-body"), delay_show=150),
    ], className="page-diff")


def noise_share(d: dict) -> tuple[float, str]:
    """The relative change within which a time or utilization is not coloured, and where it comes from."""
    step = (d.get("verdict") or {}).get("step") or {}
    bands = []
    if step.get("interval"):
        lo, hi = step["interval"]
        bands.append((hi - lo) / 2)
    if step.get("session_spread") is not None:
        bands.append(step["session_spread"])
    if bands:
        return max(bands), "the run-to-run noise of the step time"
    return DEFAULT_NOISE_SHARE, "no run-to-run noise measured for these runs: 5% taken"


def _delta(before, after, fmt, metric: str | None) -> str:
    """The change as the table shows its values: points of utilization, a count's difference, else percent (one
    decimal under 1%)."""
    if metric == "gpu_utilization":
        return f"{round(100 * after, 1) - round(100 * before, 1):+.1f} pt"
    if fmt is str:
        return f"{after - before:+d}" if isinstance(before, int) and isinstance(after, int) else "changed"
    if not before:
        return "new"
    pct = 100 * (after - before) / abs(before)
    return f"{pct:+.1f}%" if abs(pct) < 1 else f"{pct:+.0f}%"


def _change(before, after, fmt, metric: str | None = None, noise: tuple[float, str] | None = None) -> list:
    """before → after and the change, at the precision shown: values that read the same are no change. The change
    is green when it is an improvement and red when not, only when it is real: any change of a count; a time or
    utilization beyond the noise (`noise`: noise_share)."""
    if before is None and after is None:
        return ["–"]
    shown = (fmt(before) if before is not None else "–", fmt(after) if after is not None else "–")
    text = f"{shown[0]} → {shown[1]}"
    if not (isinstance(before, (int, float)) and isinstance(after, (int, float))):
        return [text]
    if shown[0] == shown[1]:
        return [text, html.Span(" (no change)", className="muted", **{"data-change": "none"})]
    share, where = noise or (DEFAULT_NOISE_SHARE, "")
    exact = fmt is str or metric in EXACT_METRICS
    beyond = exact or not before or abs(after - before) / abs(before) > share
    good = is_improvement(metric, before, after) if metric else None
    tone = "muted" if good is None or not beyond else "delta good" if good else "delta bad"
    title = None if exact else (f"{'beyond' if beyond else 'within'} the noise: ±{100 * share:.1f}% ({where})")
    return [text, html.Span(f" ({_delta(before, after, fmt, metric)})", className=tone, title=title,
                            **{"data-change": "beyond" if beyond else "within"})]


def _summary_table(d: dict) -> html.Table:
    s, steps, sy, al = d["summary"], d["per_step_median"], d["syncs"], d["allocator"]
    noise = noise_share(d)
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
                       html.Tbody([html.Tr([html.Td(name), html.Td(_change(v["before"], v["after"], fmt, metric,
                                                                            noise))],
                                           **{"data-metric": metric})
                                   for name, metric, v, fmt in rows])], className="kv")


def comparison_warnings(d: dict) -> list[str]:
    """What makes the two runs unlike, to read before any number: the verdict's `differences` (analyzer.compare:
    GPU, model, workload, batch size, torch; None where a run does not say)."""
    differ = [(x.get("what"), x.get("before"), x.get("after")) for x in (d.get("verdict") or {}).get("differences") or []]
    if not differ:
        return []
    text = "; ".join(f"{what} {before or 'not recorded'} → {after or 'not recorded'}" for what, before, after in differ)
    return [f"These runs differ in more than a fix: {text}. Changes below may come from that as much as from the fix."]


def _findings_table(d: dict) -> html.Table | html.P:
    noise = noise_share(d)
    if not d["findings"]:
        return html.P("Neither run has findings.", className="empty")
    head = html.Thead(html.Tr([html.Th(h, title=t) for h, t in (
        ("status", None), ("finding", None), ("call site", None), ("GPU idle", None), ("count", None),
        ("predicted saving", "for a fixed finding: what the run before predicted fixing it saves per step; the "
                             "measured change is the step time above"))]))
    rows = [html.Tr([html.Td(badge(f["status"], STATUS_COLORS[f["status"]])),
                     html.Td(f["title_after"] or f["title_before"]),
                     html.Td(html.Code(f["call_site"] or "–")),
                     html.Td(_change(f["impact_before_us"], f["impact_after_us"], fmt_us, "gpu_idle_us", noise)),
                     html.Td(_change(f["count_before"], f["count_after"], str)),
                     html.Td(predicted_text(f), className="num")],
                    className=f"diff-finding {f['status']}", **{"data-status": f["status"]})
            for f in d["findings"]]
    return html.Table([head, html.Tbody(rows)], className="findings")


def register(app: dash.Dash, store: RunStore) -> None:
    @app.callback(Output("url", "search", allow_duplicate=True), Input("diff-before", "value"),
                  Input("diff-after", "value"), prevent_initial_call=True)
    def remember_pair(before_id, after_id):
        """The pair in the URL: a link to this comparison, and Back to the previous pair (a side not picked yet is
        left out)."""
        picked = {k: v for k, v in (("before", before_id), ("after", after_id)) if v}
        if not picked:
            raise PreventUpdate
        return "?" + urlencode(picked)

    @app.callback(Output("diff-body", "children"), Input("diff-before", "value"), Input("diff-after", "value"))
    def show_diff(before_id, after_id):
        if not before_id or not after_id:
            missing = " and ".join(side for side, v in (("before", before_id), ("after", after_id)) if not v)
            return html.P(f"Pick two runs to compare (still to pick: {missing}).", className="hint pick-two",
                          role="status")
        reports, runs = [], []
        for run_id in (before_id, after_id):
            run = store.find(run_id)
            if run is None:
                return error_card(f"no run {quoted(run_id)}")
            try:
                reports.append(store.report(run))
            except UsageError as exc:
                return error_card(str(exc), title=f"cannot analyze {run_id}")
            runs.append(run)
        d = compare(before_id, reports[0], after_id, reports[1])
        names = {"before": before_id, "after": after_id}
        sides = {"before": reports[0], "after": reports[1]}
        timelines = {side: store.timeline(run) for side, run in zip(names, runs)}
        warnings = comparison_warnings(d)
        verdict = d["verdict"]
        return html.Div([
            html.P([dcc.Link(before_id, href=run_href(before_id)), " → ",
                    dcc.Link(after_id, href=run_href(after_id))],
                   className="diff-title"),
            *[html.P(w, className="note diff-warning", role="alert") for w in warnings],
            html.P(verdict.get("verdict_line") or verdict["headline"], className=f"verdict {verdict['outcome']}",
                   **{"data-outcome": verdict["outcome"]}),
            html.Div([html.Div([html.H2("Summary"), _summary_table(d)], className="diff-summary"),
                      html.Div(dcc.Graph(figure=diff_figure(d), config=GRAPH_CONFIG), className="diff-chart")],
                     className="diff-row"),
            html.H2("Findings"), _findings_table(d),
            html.H2("Steps and timelines"),
            dcc.Graph(id="diff-steps", figure=diff_steps_figure(names, sides), config=GRAPH_CONFIG),
            dcc.Graph(id="diff-timeline", figure=diff_timeline_figure(names, timelines),
                      config=TIMELINE_CONFIG),
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
