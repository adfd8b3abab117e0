"""`/`: the runs under DIR, newest first: workload, model, device, date, GPU utilization and top finding."""
from __future__ import annotations

from dash import dcc, html

from analyzer.units import fmt_pct
from dashboard.pages.common import error_card, run_href, severity_badge
from dashboard.runs import RunRow, RunStore

HEADERS = ("run", "workload", "model", "device", "captured", "GPU utilization", "top finding")


def _row(r: RunRow) -> html.Tr:
    run_cell = html.Td(dcc.Link(r.run.run_id, href=run_href(r.run.run_id)), className="run-id")
    facts = [html.Td(r.workload), html.Td(r.model or "–"), html.Td(r.device or "–"), html.Td(r.created or "–")]
    if r.status == "error":
        return html.Tr([run_cell, *facts, html.Td(error_card(r.error, title="cannot analyze"), colSpan=2)],
                       className="run-row error", **{"data-run": r.run.run_id, "data-status": r.status})
    if r.status == "not analyzed":
        util = html.Td(html.Span("not analyzed", className="muted", title="analyzed when you open it"))
        top = html.Td("–")
    else:
        util = html.Td(fmt_pct(r.utilization), className="num")
        top = html.Td([severity_badge(r.top_severity), " ", r.top_finding] if r.top_finding else "no findings")
    return html.Tr([run_cell, *facts, util, top], className="run-row",
                   **{"data-run": r.run.run_id, "data-status": r.status})


def layout(store: RunStore) -> html.Div:
    rows = store.rows()
    if not rows:
        body = html.P(["No run folders (folders holding a *.json or *.json.gz trace) one or two levels under ",
                       html.Code(str(store.root)), ". Capture one with ",
                       html.Code("python -m analyzer capture workloads/decode.yaml"), "."], className="empty")
    else:
        body = html.Table([html.Thead(html.Tr([html.Th(h) for h in HEADERS])),
                           html.Tbody([_row(r) for r in rows])], className="runs")
    return html.Div([
        html.H1(f"Runs ({len(rows)})"),
        html.P(["Newest first. Open a run for its findings, timeline and memory; ",
                dcc.Link("compare two runs", href="/diff"), " to see what a fix changed."], className="hint"),
        body,
    ], className="page-runs")
