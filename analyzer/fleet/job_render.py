"""The job report's pages: report.md (paste-safe: every string from a trace escaped by analyzer.report.mdsafe) and
report.html (self-contained: plotly.js inlined, a ranks x steps heatmap of GPU idle and per-rank comm / compute /
idle bars), both from job_summary()'s dictionary."""
from __future__ import annotations

import html

from analyzer.report import mdsafe
from analyzer.report.html import CSS, esc, figure_html, section, table
from analyzer.report.palette import BUSY_COLOR, CAUSE_COLORS
from analyzer.report.plotly_json import plotly_js
from analyzer.units import fmt_bytes, fmt_ms, fmt_pct, plural

COMM_COLOR = "#009E73"
MD_HEATMAP_LIMIT = (64, 40)  # ranks, steps: beyond that report.md leaves the matrix to report.html / report.json


def _steps_text(job: dict, steps: list[int]) -> str:
    names = dict(zip(job["heatmap"]["steps"], job["heatmap"]["step_names"]))
    return ", ".join(str(names.get(s, s)) for s in steps)


def _straggler_lines(job: dict) -> list[str]:
    """One sentence per straggler: what was late, by how much, what it cost the others, and the cause on it."""
    out = []
    for s in job["stragglers"]:
        cause = s.get("cause") or {}
        if s["kind"] == "late_arrival":
            what = (f"rank {s['rank']} arrived {fmt_ms(s['late_us'])} ms late at the collectives of "
                    f"{_steps_text(job, s['steps'])}; the other ranks waited {fmt_ms(s['others_waited_us'])} ms "
                    f"each inside them")
        else:
            what = (f"rank {s['rank']}'s {_steps_text(job, s['steps'])} took {fmt_ms(s['step_excess_us'])} ms "
                    f"longer than the other ranks'")
        if cause.get("idle_cause") and (cause.get("idle_excess_us") or 0) > 0:
            what += (f"; on that rank: {fmt_ms(cause['idle_excess_us'])} ms more GPU idle than the others, mostly "
                     f"{cause['idle_cause']}")
        if cause.get("top_finding"):
            what += f"; its top finding: {cause['top_finding']}"
        out.append(what)
    return out


def _rank_cells(r: dict) -> list[str]:
    st = r["step_us"]
    return [str(r["rank"]), fmt_pct(r["utilization"]),
            f"{fmt_ms(st['min'])} / {fmt_ms(st['median'])} / {fmt_ms(st['max'])}", fmt_ms(r["busy_us"]),
            fmt_ms(r["comm_us"]), fmt_ms(r["compute_us"]), fmt_ms(r["overlap_us"]), fmt_ms(r["idle_us"]),
            fmt_ms(r["wait_us"])]


RANK_HEADERS = ["rank", "GPU util", "step min / median / max (ms)", "busy (ms)", "comm (ms)", "compute only (ms)",
                "comm ∩ compute (ms)", "idle (ms)", "waited for late ranks (ms)"]


def _slow_cells(c: dict) -> list[str]:
    return [str(c["seq"]) if c["seq"] >= 0 else "–", c["name"] or "–", c["pg"] or "–", str(c["step"]),
            str(c["ordinal"]), fmt_bytes(c["bytes"]) if c["bytes"] >= 0 else "–", fmt_ms(c["transfer_us"]),
            fmt_ms(c["baseline_us"])]


SLOW_HEADERS = ["seq", "collective", "group", "step", "# in step", "size", "took (ms)", "usually (ms)"]


def _job_facts(job: dict) -> str:
    c = job["collectives"]
    facts = [plural(len(job["ranks"]), "rank") + f" of world size {job['world_size']}",
             f"median step {fmt_ms(job['median_step_us'])} ms" if job["median_step_us"] else "no steps"]
    if c["matched"]:
        facts.append(f"{plural(c['matched'], 'collective')} matched across ranks by "
                     f"{'Seq' if c['matched_by'] == 'seq' else 'order in the step'}, "
                     f"{fmt_ms(c['wait_us'])} ms spent waiting for late ranks")
    if job.get("duplicate_ranks"):
        facts.append(f"rank {', '.join(map(str, job['duplicate_ranks']))} claimed by more than one trace "
                     f"(the first of each kept)")
    if job["failed"]:
        facts.append(f"{plural(job['failed'], 'trace')} could not be analysed")
    return " · ".join(facts)


# ---------------------------------------------------------------- markdown

def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(mdsafe.cell(c) for c in row) + " |" for row in rows), ""]


SINGLE_HEADERS = ["job", "rank", "GPU util", "steps", "median step (ms)", "busy (ms)", "comm (ms)", "idle (ms)",
                  "top finding", "site"]


def _single_rank(summary: dict) -> tuple[list[dict], list[dict]]:
    """(jobs of several ranks, jobs of one rank): a one-rank job has nobody to wait for, so it gets a table row
    instead of a section of cross-rank answers that would all say "none"."""
    many = [j for j in summary["jobs"] if len(j["ranks"]) > 1]
    return many, [j for j in summary["jobs"] if len(j["ranks"]) <= 1 and j["per_rank"]]


def _single_cells(job: dict) -> list[str]:
    r = job["per_rank"][0]
    top = r["top_finding"] or {}
    return [job["job"], str(r["rank"]), fmt_pct(r["utilization"]), str(r["step_us"]["n"]),
            fmt_ms(r["step_us"]["median"]), fmt_ms(r["busy_us"]), fmt_ms(r["comm_us"]), fmt_ms(r["idle_us"]),
            top.get("title") or "–", top.get("site") or "–"]


def job_markdown(summary: dict) -> str:
    lines = ["<!-- gpu-idle-analyzer job report -->",
             f"# Job report: {plural(summary['traces'], 'trace')}, {plural(len(summary['jobs']), 'job')}", ""]
    many, single = _single_rank(summary)
    if single:
        lines += [f"## Jobs of one rank ({len(single)}): no other rank to compare with", ""]
        lines += _md_table(SINGLE_HEADERS, [[*c[:-1], mdsafe.code(c[-1]) if c[-1] != "–" else c[-1]]
                                            for c in map(_single_cells, single)])
    for job in many:
        lines += [f"## Job {mdsafe.code(job['job'])}", "", _job_facts(job), "", "### Stragglers", ""]
        said = _straggler_lines(job)
        lines += [f"- {line}" for line in said] or [
            f"No straggler: no rank arrived late at its collectives or took longer per step by more than "
            f"{summary['rules']['mads']:g} MADs and {fmt_ms(job['threshold_us'])} ms."]
        lines += ["", "### Ranks", ""] + _md_table(RANK_HEADERS, [_rank_cells(r) for r in job["per_rank"]])
        top = [r for r in job["per_rank"] if r["top_finding"]]
        if top:
            lines += _md_table(["rank", "top finding", "site", "GPU idle (ms)"],
                               [[str(r["rank"]), r["top_finding"]["title"], mdsafe.code(r["top_finding"]["site"]),
                                 fmt_ms(r["top_finding"]["gpu_idle_us"])] for r in top])
        hm = job["heatmap"]
        if hm["steps"] and len(hm["ranks"]) <= MD_HEATMAP_LIMIT[0] and len(hm["steps"]) <= MD_HEATMAP_LIMIT[1]:
            lines += ["### GPU idle per step (ms)", ""] + _md_table(
                ["rank", *hm["step_names"]], [[str(r), *(fmt_ms(v) for v in row)]
                                               for r, row in zip(hm["ranks"], hm["idle_us"])])
        if job["slow_collectives"]:
            lines += ["### Slow collectives (no rank late: the transfer itself was slow)", ""]
            lines += _md_table(SLOW_HEADERS, [_slow_cells(c) for c in job["slow_collectives"]])
    lines += ["## Findings across traces", ""]
    pop = summary["population"]
    lines += _md_table(["finding", "kind", "site", "traces", "share", "median GPU idle (ms)"],
                       [[p["title"], p["kind"], mdsafe.code(p["site"]), str(p["traces"]), fmt_pct(p["share"]),
                         fmt_ms(p["gpu_idle_us_median"])] for p in pop]) if pop else ["none", ""]
    if summary["errors"]:
        lines += ["## Traces not analysed", ""] + _md_table(
            ["job", "rank", "trace", "error"], [[e["job"], str(e["rank"]), mdsafe.code(e["source"]), e["error"]]
                                                for e in summary["errors"]])
    return mdsafe.finish(lines)


# ---------------------------------------------------------------- html

def _heatmap_figure(job: dict) -> dict:
    hm = job["heatmap"]
    z = [[None if v is None else round(v / 1e3, 3) for v in row] for row in hm["idle_us"]]
    return {"data": [{"type": "heatmap", "z": z, "x": hm["step_names"], "y": [f"rank {r}" for r in hm["ranks"]],
                      "colorscale": "YlOrRd", "reversescale": True, "colorbar": {"title": {"text": "idle ms"}},
                      "hovertemplate": "%{y} · %{x}<br>GPU idle %{z:.2f} ms<extra></extra>"}],
            "layout": {"height": max(220, 60 + 22 * len(hm["ranks"])), "margin": {"l": 70, "r": 20, "t": 10, "b": 60},
                       "xaxis": {"title": {"text": "step"}, "type": "category"},
                       "yaxis": {"autorange": "reversed", "type": "category"}, "template": "plotly_white"}}


def _split_figure(job: dict) -> dict:
    ranks = [f"rank {r['rank']}" for r in job["per_rank"]]
    parts = [("comm", "comm_us", COMM_COLOR), ("compute only", "compute_us", BUSY_COLOR),
             ("idle", "idle_us", CAUSE_COLORS["cpu_launch"])]
    return {"data": [{"type": "bar", "orientation": "h", "name": label, "y": ranks, "marker": {"color": color},
                      "x": [round((r[key] or 0) / 1e3, 3) for r in job["per_rank"]],
                      "hovertemplate": f"%{{y}} · {label} %{{x:.2f}} ms<extra></extra>"} for label, key, color in parts],
            "layout": {"height": max(200, 60 + 22 * len(ranks)), "barmode": "stack",
                       "margin": {"l": 70, "r": 20, "t": 10, "b": 40}, "xaxis": {"title": {"text": "ms"}},
                       "yaxis": {"autorange": "reversed", "type": "category"}, "template": "plotly_white",
                       "legend": {"orientation": "h"}}}


def _esc_row(row: list[str]) -> list[str]:
    return [esc(c) for c in row]


def job_html(summary: dict) -> str:
    title = f"Job report: {plural(summary['traces'], 'trace')}, {plural(len(summary['jobs']), 'job')}"
    body = [f"<header><h1>{esc(title)}</h1></header>"]
    many, single = _single_rank(summary)
    if single:
        body.append(section(f"Jobs of one rank ({len(single)}): no other rank to compare with", table(
            SINGLE_HEADERS, [_esc_row(_single_cells(job)) for job in single])))
    for n, job in enumerate(many):
        said = _straggler_lines(job)
        stragglers = ("<ul>" + "".join(f"<li>{esc(s)}</li>" for s in said) + "</ul>") if said else (
            f"<p class=empty>no straggler (threshold {fmt_ms(job['threshold_us'])} ms)</p>")
        parts = [f"<p class=summary>{esc(_job_facts(job))}</p>", "<h3>Stragglers</h3>", stragglers]
        if job["heatmap"]["steps"]:
            parts += ["<h3>GPU idle per rank and step</h3>", figure_html(_heatmap_figure(job), f"heat{n}")]
        parts += ["<h3>Communication, compute and idle per rank</h3>", figure_html(_split_figure(job), f"split{n}"),
                  table(RANK_HEADERS, [_esc_row(_rank_cells(r)) for r in job["per_rank"]])]
        top = [r for r in job["per_rank"] if r["top_finding"]]
        if top:
            parts.append(table(["rank", "top finding", "site", "GPU idle (ms)"],
                                [_esc_row([str(r["rank"]), r["top_finding"]["title"], r["top_finding"]["site"],
                                           fmt_ms(r["top_finding"]["gpu_idle_us"])]) for r in top]))
        if job["slow_collectives"]:
            parts += ["<h3>Slow collectives</h3>",
                      table(SLOW_HEADERS, [_esc_row(_slow_cells(c)) for c in job["slow_collectives"]])]
        body.append(section(f"Job {job['job']}", "\n".join(parts)))
    body.append(section("Findings across traces", table(
        ["finding", "kind", "site", "traces", "share", "median GPU idle (ms)"],
        [_esc_row([p["title"], p["kind"], p["site"], str(p["traces"]), fmt_pct(p["share"]),
                   fmt_ms(p["gpu_idle_us_median"])]) for p in summary["population"]])))
    if summary["errors"]:
        body.append(section("Traces not analysed", table(
            ["job", "rank", "trace", "error"],
            [_esc_row([e["job"], str(e["rank"]), e["source"], e["error"]]) for e in summary["errors"]])))
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=generator content='gpu-idle-analyzer'>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script>{plotly_js()}</script></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")
