"""`/job/<folder>`: the job report `analyze-many` wrote into a dataset folder under DIR (its report.json, read as
is): per job the stragglers, each rank's utilization, step time, communication and waits with a link to that
rank's run page, the ranks x steps heatmap of GPU idle (a click opens that rank's page zoomed to that step), slow
collectives, and the findings population across all traces."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from analyzer.api import window_start_us
from analyzer.units import fmt_pct, fmt_us
from dashboard.figures import GRAPH_CONFIG, job_heatmap
from dashboard.pages.common import badge, download_href, error_card, markdown_block, run_href
from analyzer.api import RunStore

HEATMAP = "job-heatmap"


def job_href(folder: str) -> str:
    return "/job/" + folder


def layout(store: RunStore, folder: str) -> html.Div:
    report = store.job_report(folder)
    if report is None:
        return error_card(f"no job report in {folder!r} under the traces folder (write one with python -m analyzer "
                          f"analyze-many RUNS --out {store.root}/<name>)", back=True)
    runs = store.runs_by_trace()
    jobs = report.get("jobs") or []
    return html.Div([
        dcc.Store(id="job-folder", data=folder),
        html.H1(f"Job report: {folder}"),
        html.P(f"{report.get('analysed', 0)} of {report.get('traces', 0)} traces analysed · "
               f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}", className="summary"),
        html.Div([html.A("report.md", href=download_href(folder, "job-report.md"), className="button", download=""),
                  html.A("report.html", href=download_href(folder, "job-report.html"), className="button",
                         download="")], className="downloads"),
        _single_rank_jobs([j for j in jobs if len(j.get("ranks") or []) <= 1 and j.get("per_rank")], runs),
        *[_job(job, runs) for job in jobs if len(job.get("ranks") or []) > 1],
        _population(report.get("population") or []),
        _errors(report.get("errors") or []),
        markdown_block(store.job_report_text(folder, "report.md"), "job-md", "the job report"),
    ], className="page-job")


def _rank_link(rank: dict, runs: dict[str, str]) -> html.Td:
    run_id = runs.get(str(Path(rank.get("source") or "").resolve()))
    text = f"rank {rank['rank']}"
    return html.Td(dcc.Link(text, href=run_href(run_id)) if run_id else html.Span(
        text, title=f"{rank.get('source')}: not under this dashboard's traces folder"))


def _job(job: dict, runs: dict[str, str]) -> html.Section:
    coll = job.get("collectives") or {}
    facts = (f"{len(job.get('ranks') or [])} ranks of world size {job.get('world_size')} · median step "
             f"{fmt_us(job.get('median_step_us'))} · {coll.get('matched', 0)} collectives matched across ranks"
             f" ({coll.get('matched_by') or '–'}), {fmt_us(coll.get('wait_us'))} spent waiting for late ranks")
    per_rank = job.get("per_rank") or []
    rows = []
    for r in per_rank:
        step = r.get("step_us") or {}
        top = r.get("top_finding") or {}
        rows.append(html.Tr([
            _rank_link(r, runs), html.Td(fmt_pct(r.get("utilization")), className="num"),
            html.Td(" / ".join(fmt_us(step.get(k)) for k in ("min", "median", "max")), className="num"),
            html.Td(fmt_us(r.get("comm_us")), className="num"), html.Td(fmt_us(r.get("compute_us")), className="num"),
            html.Td(fmt_us(r.get("idle_us")), className="num"), html.Td(fmt_us(r.get("wait_us")), className="num"),
            html.Td([top.get("title") or "–", *([" at ", html.Code(top["site"])] if top.get("site") else [])]),
        ], className="rank-row", **{"data-rank": str(r["rank"])}))
    heatmap = job.get("heatmap") or {}
    return html.Section([
        html.H2(f"Job {job.get('job')}"),
        html.P(facts, className="summary"),
        _stragglers(job.get("stragglers") or [], dict(zip(heatmap.get("steps") or [], heatmap.get("step_names") or []))),
        html.Table([html.Thead(html.Tr([html.Th(h) for h in (
            "rank", "GPU util", "step min / median / max", "comm", "compute only", "idle", "waited for late ranks",
            "top finding")])), html.Tbody(rows)], className="ranks"),
        dcc.Graph(id={"type": HEATMAP, "job": str(job.get("job"))}, figure=job_heatmap(job, heatmap),
                  config=GRAPH_CONFIG) if heatmap.get("ranks") else html.P("no steps: no heatmap", className="hint"),
        _slow(job.get("slow_collectives") or []),
    ], className="job")


def _single_rank_jobs(jobs: list[dict], runs: dict[str, str]) -> html.Div | None:
    """Jobs of one rank (a folder of unrelated traces): a row each, as they have no other rank to compare with."""
    if not jobs:
        return None
    rows = []
    for job in jobs:
        r = job["per_rank"][0]
        top = r.get("top_finding") or {}
        rows.append(html.Tr([html.Td(job.get("job")), _rank_link(r, runs),
                             html.Td(fmt_pct(r.get("utilization")), className="num"),
                             html.Td(str((r.get("step_us") or {}).get("n", 0)), className="num"),
                             html.Td(fmt_us(r.get("busy_us")), className="num"),
                             html.Td(fmt_us(r.get("comm_us")), className="num"),
                             html.Td(fmt_us(r.get("idle_us")), className="num"),
                             html.Td([top.get("title") or "–", *([" at ", html.Code(top["site"])]
                                                                  if top.get("site") else [])])],
                            className="single-job-row"))
    return html.Section([html.H2(f"Jobs of one rank ({len(jobs)}): no other rank to compare with"), html.Table(
        [html.Thead(html.Tr([html.Th(h) for h in ("job", "rank", "GPU util", "steps", "busy", "comm", "idle",
                                                  "top finding")])), html.Tbody(rows)], className="ranks")])


def _stragglers(stragglers: list[dict], step_names: dict) -> html.Div:
    if not stragglers:
        return html.P("No straggler: no rank arrived late at the collectives or ran its steps slower than the others "
                      "beyond the noise.", className="hint straggler-none")
    items = []
    for s in stragglers:
        cause = s.get("cause") or {}
        what = (f"arrived {fmt_us(s.get('late_us'))} late at the collectives; the others waited "
                f"{fmt_us(s.get('others_waited_us'))} each" if s.get("kind") == "late_arrival" else
                f"ran its steps {fmt_us(s.get('step_excess_us'))} slower than the others")
        why = [f"; on that rank {fmt_us(cause.get('idle_excess_us'))} more GPU idle, mostly {cause['idle_cause']}"
               if cause.get("idle_cause") else "", f"; its top finding: {cause['top_finding']}"
               if cause.get("top_finding") else ""]
        steps = ", ".join(str(step_names.get(x, x)) for x in s.get("steps") or [])
        items.append(html.Li([badge("straggler", "#D55E00"), f" rank {s.get('rank')} ({steps}) ", what, *why],
                             className="straggler", **{"data-rank": str(s.get("rank"))}))
    return html.Div([html.H3("Stragglers"), html.Ul(items)])


def _slow(slow: list[dict]) -> html.Div | None:
    if not slow:
        return None
    return html.Div([html.H3("Slow collectives"), html.Ul([html.Li(
        f"{c.get('name')} seq {c.get('seq')} on {c.get('pg')} (step {c.get('step')}): "
        f"{fmt_us(c.get('transfer_us'))} against {fmt_us(c.get('baseline_us'))} usually") for c in slow])])


def _population(population: list[dict]) -> html.Div:
    rows = [html.Tr([html.Td(p.get("title")), html.Td(p.get("kind")), html.Td(html.Code(p["site"]) if p.get("site")
                                                                             else "–"),
                     html.Td(str(p.get("traces")), className="num"), html.Td(fmt_pct(p.get("share")), className="num"),
                     html.Td(fmt_us(p.get("gpu_idle_us_median")), className="num")]) for p in population]
    return html.Div([html.H2("Findings across traces"), html.Table(
        [html.Thead(html.Tr([html.Th(h) for h in ("finding", "kind", "site", "traces", "share",
                                                  "median GPU idle")])), html.Tbody(rows)], className="population")
                     if rows else html.P("no findings", className="hint")])


def _errors(errors: list[dict]) -> html.Div | None:
    if not errors:
        return None
    return html.Div([html.H2(f"Traces that could not be analysed ({len(errors)})"), html.Ul(
        [html.Li([html.Code(e.get("source") or "?"), f" (job {e.get('job')}, rank {e.get('rank')}): {e.get('error')}"])
         for e in errors])])


def register(app: dash.Dash, store: RunStore) -> None:
    @app.callback(Output("url", "href", allow_duplicate=True),
                  Input({"type": HEATMAP, "job": dash.ALL}, "clickData"), State("job-folder", "data"),
                  prevent_initial_call=True)
    def open_rank_step(clicks, folder):
        """A heatmap cell opens that rank's run page zoomed to that step (the rank's report gives the step's
        place on its own timeline)."""
        click = next((c for c in clicks or [] if c and c.get("points")), None)
        if click is None or dash.ctx.triggered_id is None:
            raise PreventUpdate
        point = click["points"][0]  # a heatmap's click names its cell by x (column) and y (label), no customdata
        report = store.job_report(folder) or {}
        job = next((j for j in report.get("jobs") or [] if str(j.get("job")) == dash.ctx.triggered_id["job"]), {})
        heatmap = job.get("heatmap") or {}
        try:
            rank = heatmap["ranks"][[f"rank {r}" for r in heatmap["ranks"]].index(point.get("y"))]
            position = heatmap["steps"][int(point["x"])]
        except (KeyError, ValueError, IndexError, TypeError):
            raise PreventUpdate from None
        source = next((r.get("source") for r in job.get("per_rank") or [] if r.get("rank") == rank), None)
        run_id = store.runs_by_trace().get(str(Path(source or "").resolve()))
        if run_id is None:
            raise PreventUpdate
        rank_report = store.report(store.find(run_id))
        steps = (rank_report.get("gaps") or {}).get("per_step") or []
        if not isinstance(position, int) or not 0 <= position < len(steps):
            return run_href(run_id)
        step, t0 = steps[position], window_start_us(rank_report)
        lo, hi = (step["ts_us"] - t0) / 1e3, (step["ts_us"] + step["wall_us"] - t0) / 1e3
        pad = (hi - lo) * 0.02
        return run_href(run_id) + "?" + urlencode({"t0": f"{lo - pad:.3f}", "t1": f"{hi + pad:.3f}"})
