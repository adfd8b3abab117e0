"""`/`: the runs under DIR: the run and its workload, model and device, date, GPU utilization, the window split into
busy and idle by cause (a small stacked bar, host work apart from the launch overhead), and the largest finding other
than launch overhead (what tells eager runs apart: nearly all of them are launch-bound); filtered by text, sorted,
and any two ticked runs compared. Fits a 1280 px window: long names wrap, numbers and badges never do."""
from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import ALL, Input, Output, State, ctx, dcc, html

from analyzer.units import fmt_pct, fmt_us
from dashboard.pages.common import error_card, run_href, severity_badge, window_bar
from analyzer.api import RunRow, RunStore

# (header, column class): the column widths are in style.css (a fixed layout: the table is as wide as the page)
COLUMNS = (("", "col-pick"), ("run · workload", "col-run"), ("model · device", "col-device"),
           ("captured", "col-created"), ("GPU utilization", "col-util"), ("where the window went", "col-bar"),
           ("biggest saving", "col-saving"), ("largest finding besides launch overhead", "col-other"))
HEADERS = tuple(h for h, _ in COLUMNS)
HEADER_TITLES = {"run · workload": "the run's folder under the traces folder, and the workload its meta.json names",
                 "where the window went": "the profiled window: GPU busy, then GPU idle by cause, host work apart "
                                          "from launch overhead (hover for each)",
                 "biggest saving": "the fix that buys the most: the step time it saves (the trace replayed without "
                                   "that finding's cause)",
                 "largest finding besides launch overhead": "nearly every eager run is launch-bound: the largest "
                                                            "top-level finding of another kind tells runs apart"}
PICK = "pick-run"
POLL_MS = 1500  # while runs are analyzed in the background
SORTS = {"newest": "newest first", "oldest": "oldest first", "util-low": "lowest GPU utilization first",
         "util-high": "highest GPU utilization first", "saving": "biggest saving first",
         "workload": "workload, A to Z"}


def workload_of(r: RunRow) -> str | None:
    """The workload meta.json names; None for a bare trace (the run list's fallback is the trace's file name, which
    the run id already shows)."""
    return None if r.workload in (None, r.run.trace.name) else r.workload


def _row(r: RunRow) -> html.Tr:
    pick = html.Td(dcc.Checklist(id={"type": PICK, "run": r.run.run_id}, options=[{"label": "", "value": "on"}],
                                 value=[], className="pick"), title="tick two runs to compare them")
    workload = workload_of(r)
    run_cell = html.Td([dcc.Link(r.run.run_id, href=run_href(r.run.run_id)),
                        *([html.Div(workload, className="workload muted")]
                          if workload and workload != r.run.run_id else [])], className="run-id")
    facts = [html.Td(" · ".join(x for x in (r.model, r.device) if x) or "–", className="muted device"),
             html.Td(r.created or "–", className="created")]
    marks = {"data-run": r.run.run_id, "data-status": r.status}
    if r.status == "error":
        return html.Tr([pick, run_cell, *facts, html.Td(error_card(r.error, title="cannot analyze"), colSpan=4)],
                       className="run-row error", **marks)
    if r.status in ("not analyzed", "queued", "analyzing"):
        text = {"analyzing": "analyzing…", "queued": "queued"}.get(r.status, r.status)
        cells = [html.Td(html.Span(text, className=f"muted {r.status.replace(' ', '-')}",
                                   title="analyzed in the background (or when you open it)")), html.Td("–"),
                 html.Td("–"), html.Td("–")]
    else:
        cells = [html.Td(fmt_pct(r.utilization), className="num util"),
                 html.Td(window_bar(r.busy_us, r.idle_by_cause, r.window_us), className="bar-cell"),
                 html.Td(_best_saving(r), className="best-saving"),
                 html.Td(_other_finding(r), className="other-finding")]
    return html.Tr([pick, run_cell, *facts, *cells], className="run-row", **marks)


def _best_saving(r: RunRow) -> list | html.Span:
    b = r.best_saving
    if not b:
        return html.Span("no estimate", className="muted", title="the replay cannot model this trace (see the run)")
    if not b["saving_ms"]:
        return html.Span("no fix saves measurable time", className="muted")
    share = f" ({b['saving_share']:.0%})" if b.get("saving_share") is not None else ""
    number = fmt_us(b["saving_ms"] * 1e3)
    # a number never breaks from its unit (the text may wrap before "over the window")
    text = [html.Span(f"{number}/step{share}", className="nowrap")] if b.get("measure") == "step" else \
        [html.Span(number, className="nowrap"), " over the window", html.Span(share, className="nowrap")]
    return html.Div([html.Span(text, className="impact"),
                     html.Div(b.get("title") or "", className="finding-title one-line", title=b.get("title") or "")])


def _other_finding(r: RunRow) -> list | html.Span:
    f = r.other_finding
    if not f:
        return html.Span("none: launch overhead only" if r.top_finding else "no findings", className="muted")
    return [html.Div([severity_badge(f.get("severity")), " ",
                      html.Span(fmt_us(f.get("impact_us")), className="impact")]),
            html.Div(f.get("title") or "", className="finding-title clamp", title=f.get("title") or "")]


def _text(r: RunRow) -> str:
    other = (r.other_finding or {}).get("title")
    best = (r.best_saving or {}).get("title")
    return " ".join(str(x) for x in (r.run.run_id, r.workload, r.model, r.device, r.created, r.top_finding, other,
                                     best, r.error) if x).lower()


def shown_rows(rows: list[RunRow], query: str | None, sort: str | None) -> list[RunRow]:
    """The rows whose text holds every word of the query, in the chosen order (the store's order is newest
    first; runs with no utilization sort last)."""
    words = (query or "").lower().split()
    rows = [r for r in rows if all(w in _text(r) for w in words)]
    if sort == "oldest":
        return rows[::-1]
    if sort in ("util-low", "util-high"):
        known = [r for r in rows if r.utilization is not None]
        known.sort(key=lambda r: r.utilization, reverse=sort == "util-high")
        return known + [r for r in rows if r.utilization is None]
    if sort == "saving":
        priced = [r for r in rows if r.best_saving]
        return sorted(priced, key=lambda r: -r.best_saving["saving_ms"]) + [r for r in rows if not r.best_saving]
    if sort == "workload":
        return sorted(rows, key=lambda r: (r.workload or "").lower())
    return rows


def _table(rows: list[RunRow], sort: str | None = None, query: str | None = None) -> html.Table | html.P:
    """The table says which sort and filter it was built for (data-sort, data-query): a page or test that changed
    them can wait for the table that answers them."""
    marks = {"data-sort": sort or "newest", "data-query": query or ""}
    if not rows:
        return html.P("No run matches.", className="empty", **marks)
    head = html.Thead(html.Tr([html.Th(h, title=HEADER_TITLES.get(h), className=c) for h, c in COLUMNS]))
    cols = html.Colgroup([html.Col(className=c) for _, c in COLUMNS])
    return html.Table([cols, head, html.Tbody([_row(r) for r in rows])], className="runs",
                      **marks)


def layout(store: RunStore) -> html.Div:
    store.analyze_in_background(store.runs())
    rows = store.rows()
    if not rows:
        body = html.P(["No runs: no *.json or *.json.gz trace in ", html.Code(str(store.root)),
                       " itself (torch.profiler.tensorboard_trace_handler's layout) nor in folders one or two levels "
                       "under it. Capture one with ",
                       html.Code("python -m analyzer capture workloads/decode.yaml"), "."], className="empty")
        tools = None
    else:
        body = html.Div(_table(rows), id="runs-table")
        tools = html.Div([
            dcc.Input(id="runs-filter", type="search", placeholder="filter: workload, model, GPU, finding…",
                      debounce=True, className="runs-filter"),
            dcc.Dropdown(id="runs-sort", options=[{"label": v, "value": k} for k, v in SORTS.items()],
                         value="newest", clearable=False, className="runs-sort"),
            html.Span(id="runs-compare", className="runs-compare hint"),
        ], className="runs-tools")
    jobs = store.jobs()
    return html.Div([
        html.Div([html.H2(f"Job reports ({len(jobs)})"), html.Ul([html.Li(dcc.Link(
            folder, href="/job/" + folder, className="job-link")) for folder in jobs])], className="jobs")
        if jobs else None,
        html.H1(f"Runs ({len(rows)})"),
        html.P(["Open a run for its findings, timeline and memory; tick two runs, or ",
                dcc.Link("compare two runs", href="/diff"), ", to see what a fix changed."], className="hint"),
        tools, body,
        dcc.Interval(id="runs-poll", interval=POLL_MS, disabled=not store.pending()),
        dcc.Store(id="runs-statuses", data={r.run.run_id: r.status for r in rows}),
    ], className="page-runs")


def register(app: dash.Dash, store: RunStore) -> None:
    @app.callback(Output("runs-table", "children"), Output("runs-poll", "disabled"), Output("runs-statuses", "data"),
                  Input("runs-filter", "value"), Input("runs-sort", "value"), Input("runs-poll", "n_intervals"),
                  State("runs-statuses", "data"), prevent_initial_call=True)
    def refilter(query, sort, _ticks, statuses):
        """The table again after a filter or sort, and while background analyses finish (then polling stops); a
        poll redraws only when a row's status changed (a redraw unticks the ticked runs)."""
        rows = shown_rows(store.rows(), query, sort)
        now = {r.run.run_id: r.status for r in rows}
        if ctx.triggered_id == "runs-poll" and now == statuses:
            return dash.no_update, not store.pending(), dash.no_update
        return _table(rows, sort, query), not store.pending(), now

    @app.callback(Output("runs-compare", "children"), Input({"type": PICK, "run": ALL}, "value"),
                  State({"type": PICK, "run": ALL}, "id"), prevent_initial_call=True)
    def compare_link(values, ids):
        picked = [i["run"] for i, v in zip(ids, values) if v]
        if len(picked) != 2:
            return f"{len(picked)} ticked: tick two runs to compare them" if picked else ""
        newest_first = [r.run.run_id for r in store.rows()]
        after, before = sorted(picked, key=newest_first.index)  # the older one is "before"
        return dcc.Link(f"compare {before} → {after}", href="/diff?" + urlencode({"before": before, "after": after}),
                        className="button", id="compare-picked")
