"""What each MCP tool answers, as plain functions of the roots and the arguments: the run list, a run's analysis and
one finding from the RunStore (analyzer.api, the dashboard's own), a comparison of two runs, the dataset's tables and
SQL over an analyze-many dataset. Every answer is a JSON-able dict (the structured content) with a one-line `text`
and its `content`: the answer as text within texts.BUDGET characters (analyzer.mcp.texts). A bad argument raises
BadArgument, whose message names the argument. The server (analyzer.mcp.server) turns these into MCP tools."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from analyzer import api
from analyzer.errors import UsageError
from analyzer.mcp import texts
from analyzer.mcp.texts import compact, one_line, paged, table
from analyzer.units import fmt_pct, fmt_us

PAGE = 50  # rows of a list answered at once, unless asked otherwise
MAX_PAGE = 500
QUERY_ROWS = 100
QUERY_TIMEOUT_S = 10.0
OCCURRENCES = 20  # a finding's occurrences shown, the rest counted
TEXT_LINE = 400  # characters of the one-line text
ECHO = 200  # characters of a refused value said back
REPO = Path(__file__).resolve().parents[2]


class BadArgument(ValueError):
    """A tool argument the server refuses; the message names the argument and says why, on one line."""

    def __init__(self, argument: str, why: str):
        super().__init__(f"{argument}: {' '.join(str(why).split())}")


def shown(value) -> str:
    """A value as a refusal says it back: its repr, cut to ECHO characters."""
    text = repr(value)
    return text if len(text) <= ECHO else f"{text[:ECHO]}… ({len(text):,} characters)"


@dataclasses.dataclass
class Roots:
    """What the server may read: the traces folder (runs, their reports) and an analyze-many dataset; whether it
    may run captures (they run the workload's code); how long a query may run."""
    traces: Path
    dataset: Path | None = None
    allow_capture: bool = False
    query_timeout_s: float = QUERY_TIMEOUT_S
    store: api.RunStore = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.traces = Path(self.traces).resolve()
        self.dataset = Path(self.dataset).resolve() if self.dataset else None
        self.store = api.RunStore(self.traces, writes=False)  # tools marked read-only write nothing there

    def scrub(self, text: str) -> str:
        """`text` with the server's folders left out: paths under the traces root relative to it, the dataset's
        as <dataset>/..., the repository's relative to it (an error never shows where the server keeps things)."""
        # (folder, what a path inside it starts with, what the folder itself is called), the longest folder first
        names = [(self.traces, "", "the traces root"), (REPO, "", ".")]
        names += [(self.dataset, "<dataset>/", "<dataset>")] if self.dataset else []
        for folder, inside, itself in sorted(names, key=lambda n: -len(str(n[0]))):
            text = text.replace(f"{folder}/", inside)
            text = re.sub(re.escape(str(folder)) + r"(?![\w.-])", itself, text)
        return text


def page_of(items: list, offset: int, limit: int, what: str, tool: str) -> tuple[list, dict]:
    """items[offset:offset+limit] and the paging keys: the total, the next offset, and a note on how to get the
    rest where some are left."""
    if offset < 0:
        raise BadArgument("offset", f"must be 0 or more, not {offset}")
    if not 1 <= limit <= MAX_PAGE:
        raise BadArgument("limit", f"must be 1 to {MAX_PAGE}, not {limit}")
    part = items[offset:offset + limit]
    following = offset + len(part)
    left = len(items) - following
    paging = {"total": len(items), "offset": offset,
              "next_offset": following if left > 0 else None,
              "note": f"{left} more {what}: call {tool} again with offset={following}" if left > 0 else None}
    return part, paging


def _checked_path(value: str, argument: str) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise BadArgument(argument, "empty")
    if "\x00" in value:
        raise BadArgument(argument, "holds a NUL byte")
    path = Path(value)
    if ".." in path.parts:
        raise BadArgument(argument, f"{shown(value)} climbs out with '..'")
    return path


def resolve_run(roots: Roots, value: str, argument: str = "run") -> api.Run:
    """A run by its id (as list_runs gives it), or by the path of its folder or trace inside the traces root."""
    path = _checked_path(value, argument)
    store = roots.store
    run = store.find(value.strip("/"))
    if run is not None:
        return run
    real = (path if path.is_absolute() else roots.traces / path).resolve()
    if not api.is_within(real, roots.traces):
        raise BadArgument(argument, f"{shown(value)} is outside the traces root")
    for run in store.runs():
        if real in (run.trace.resolve(), run.trace.parent.resolve()):
            return run
    raise BadArgument(argument, f"no run {shown(value)} under the traces root (list_runs names them)")


def report_of(roots: Roots, run: api.Run, argument: str = "run") -> dict:
    try:
        return roots.store.report(run)
    except UsageError as exc:
        raise BadArgument(argument, f"{run.run_id}: {roots.scrub(str(exc))}") from None


def _line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= TEXT_LINE else text[:TEXT_LINE - 1] + "…"


def _saving(f: dict) -> dict:
    w = f.get("what_if") or {}
    return {"saving_ms": w.get("saving_ms"), "saving_share": w.get("saving_share"), "fix": w.get("fix"),
            "why_no_saving": w.get("why")}


def rows_of(report: dict) -> dict[str, str]:
    """Each finding's row number in report.md's findings table ('2', '1.1'), by id."""
    return {f["id"]: n for n, f in api.numbered(api.ranked(report["findings"]))}


def finding_brief(f: dict, row: str | None = None) -> dict:
    """A finding as the ranked list shows it."""
    return {"id": f["id"], "row": row, "kind": f["kind"], "severity": f["severity"], "title": f["title"],
            "call_site": f.get("call_site"), "parent": f.get("parent"), "gpu_idle_us": f["impact_us"],
            "count": f["count"], "confidence": f["confidence"], **_saving(f)}


def _findings_table(findings: list[dict]) -> tuple[list[str], list[str]]:
    return table(["#", "id", "severity", "confidence", "saving", "GPU idle", "count", "finding", "call site",
                  "fix (or why no saving)"],
                 [[f["row"], f["id"], f["severity"], f["confidence"], _saving_text(f), fmt_us(f["gpu_idle_us"]),
                   f["count"], f["title"], f["call_site"], f["fix"] or f["why_no_saving"]] for f in findings])


def _saving_text(f: dict) -> str:
    if f["saving_ms"] is None:
        return "–"
    return fmt_us(f["saving_ms"] * 1e3) + (f" ({f['saving_share']:.0%})" if f["saving_share"] is not None else "")


def run_row(row: api.RunRow) -> dict:
    best = row.best_saving or {}
    return {"run": row.run.run_id, "workload": row.workload, "model": row.model, "device": row.device,
            "created": row.created, "status": row.status, "error": row.error,
            "gpu_utilization": row.utilization, "top_finding": row.top_finding,
            "biggest_saving": {"finding": best.get("id"), "title": best.get("title"),
                               "saving_ms": best.get("saving_ms"), "saving_share": best.get("saving_share")}
            if best else None}


def list_runs(roots: Roots, offset: int = 0, limit: int = PAGE) -> dict:
    """The runs under the traces root, newest first, from the reports already analyzed (a run not yet analyzed
    says so; `analyze` analyzes it)."""
    every = roots.store.rows()
    rows, paging = page_of(every, offset, limit, "runs", "list_runs")
    out = {"text": f"{len(every)} runs under the traces root, newest first; "
                   f"{sum(1 for r in every if r.status == 'analyzed')} of them analyzed.",
           "runs": [run_row(r) for r in rows], **paging}
    if not every:
        out["text"] = ("0 runs: no *.json or *.json.gz trace in the traces root itself (the layout of "
                       "torch.profiler.tensorboard_trace_handler) nor in folders one or two levels under it.")
    for r in out["runs"]:
        if r["error"]:
            r["error"] = roots.scrub(r["error"])
    head, lines = table(["run", "workload", "model", "device", "created", "status", "GPU util", "biggest saving"],
                        [[r["run"], r["workload"], r["model"], r["device"], r["created"],
                          r["status"] + (f": {r['error']}" if r["error"] else ""), fmt_pct(r["gpu_utilization"]),
                          _best_text(r["biggest_saving"])] for r in out["runs"]])
    out["content"] = paged([out["text"], *head], lines, out, "runs", "runs", "list_runs")
    return out


def _best_text(best: dict | None) -> str:
    if not best or best["saving_ms"] is None:
        return "–"
    return f"{fmt_us(best['saving_ms'] * 1e3)}: {best['title']} ({best['finding']})"


def analyze(roots: Roots, run: str, offset: int = 0, limit: int = PAGE) -> dict:
    """A run's summary, trace checks and top-level findings ranked by what their fix buys (analyzed on first use,
    then read back by its trace key)."""
    found = resolve_run(roots, run)
    report = report_of(roots, found)
    summary = report["summary"]
    rows = rows_of(report)
    tops = [f for f in api.ranked(report["findings"]) if not f.get("parent")]
    part, paging = page_of(tops, offset, limit, "top-level findings", "analyze")
    validity = report["validity"]
    checks = [{"name": c["name"], "status": c["status"], "meaning": c["meaning"]}
              for c in validity["checks"] if c["status"] != "ok"]
    what_if = report.get("what_if") or {}
    util = summary.get("gpu_utilization")
    lead = tops[0] if tops else None
    text = (f"{found.run_id}: GPU busy {util:.0%} of {summary['window_us'] / 1e3:.1f} ms" if util is not None else
            f"{found.run_id}: no GPU activity")
    if lead is not None:
        saving = (lead.get("what_if") or {}).get("saving_ms")
        unit = f"per {what_if.get('step_label')}" if what_if.get("measure") == "step" else "over the window"
        text += f"; first finding: {lead['title']}" + (f" (its fix saves {saving:.2f} ms {unit})" if saving else "")
    if validity["failed"]:
        text += f"; trace checks failed: {', '.join(validity['failed'])}"
    out = {"text": _line(text), "run": found.run_id, "trace": found.trace.relative_to(roots.traces).as_posix(),
           "summary": {k: summary.get(k) for k in ("gpu_utilization", "window_us", "gpu_busy_us", "gpu_idle_us",
                                                   "steps", "step_word", "top_finding", "step_time_us")},
           "idle_partition": summary["idle_partition"],
           "what_if": {k: what_if.get(k) for k in ("available", "basis", "measure", "step_label", "step_ms",
                                                   "gpu_busy_per_step_ms", "all_fixed", "limits")},
           "what_if_text": api.what_if_summary(report),
           "checks": checks, "checks_failed": validity["failed"], "checks_warned": validity["warned"],
           "findings": [finding_brief(f, rows.get(f["id"])) for f in part], **paging}
    head = [out["text"], f"trace: {out['trace']}", f"summary: {compact(out['summary'])}",
            f"idle partition: {compact(out['idle_partition'])}", out["what_if_text"] or "what a fix buys: no estimate",
            f"what-if: {compact(out['what_if'])}"]
    head += ["trace checks that warn or fail:", *(f"- {c['status']} {c['name']}: {c['meaning']}" for c in checks)] \
        if checks else ["trace checks: all ok"]
    head += [f"top-level findings, ranked by what fixing each saves ({paging['total']} in all, from offset {offset}; "
             "# is the row in report.md; `finding` with an id or a # gives one in full, with the findings that "
             "refine it):"]
    table_head, lines = _findings_table(out["findings"])
    out["content"] = paged([*head, *table_head], lines, out, "findings", "top-level findings", "analyze")
    return out


_ROW = re.compile(r"#?(\d+)(?:\.(\d+))?\.?")


def _find(report: dict, finding_id: str) -> dict | None:
    """A finding by its id, or by its row number in report.md's table ('2', '#2', '1.1')."""
    match = next((f for f in report["findings"] if f["id"] == finding_id), None)
    number = _ROW.fullmatch(finding_id.strip())
    if match is None and number:
        row = str(int(number[1])) + (f".{int(number[2])}" if number[2] else "")
        rows = rows_of(report)
        match = next((f for f in report["findings"] if rows[f["id"]] == row), None)
    return match


def finding(roots: Roots, run: str, finding_id: str) -> dict:
    """One finding in full: its call site, Python frames, source lines, advice, what its fix buys and its first
    occurrences."""
    found = resolve_run(roots, run)
    report = report_of(roots, found)
    match = _find(report, finding_id)
    if match is None:
        rows = rows_of(report)
        some = ", ".join(f"{f['id']} (#{rows[f['id']]})" for f in api.ranked(report["findings"])[:12])
        raise BadArgument("finding_id", f"{shown(finding_id)} is not a finding of {found.run_id}: give an id as "
                                        f"analyze lists it, or a row number of report.md's findings table; its "
                                        f"findings: {some}")
    rows = rows_of(report)
    detail = match.get("detail") or {}
    occurrences = match.get("occurrences_us") or []
    children = [finding_brief(f, rows.get(f["id"])) for f in report["findings"] if f.get("parent") == match["id"]]
    site = match.get("call_site")
    text = match["title"] + (f" at {site}" if site and site not in match["title"] else "")
    out = {"text": _line(text), "run": found.run_id, **finding_brief(match, rows.get(match["id"])),
           "library_site": match.get("library_site"), "advice": match["advice"],
           "confidence_checks": match.get("confidence_checks") or [],
           "python_frames": detail.get("context") or [], "source_lines": detail.get("source_lines") or [],
           "what_if": match.get("what_if"),
           "what_if_text": api.what_if_line(match, report.get("what_if")) or None, "refined_by": children,
           "occurrences_us": occurrences[:OCCURRENCES], "occurrences_total": len(occurrences),
           "occurrences_note": f"{len(occurrences) - OCCURRENCES} more occurrences in the run's report.json"
           if len(occurrences) > OCCURRENCES else None,
           "detail": {k: v for k, v in detail.items() if k not in ("context", "source_lines")}}
    lines = [out["text"],
             f"id {out['id']} (#{out['row']} in report.md), kind {out['kind']}, severity {out['severity']}, "
             f"confidence {out['confidence']}" + (f" (lowered by the trace checks {', '.join(out['confidence_checks'])})"
                                                  if out["confidence_checks"] else "")
             + f"; GPU idle {fmt_us(out['gpu_idle_us'])} over {out['count']} occurrences"
             + (f"; refines {out['parent']}" if out["parent"] else ""),
             f"call site: {out['call_site'] or '–'}" + (f"; library: {out['library_site']}" if out["library_site"]
                                                         else ""),
             out["what_if_text"] or f"what fixing it buys: {_saving_text(out)}",
             f"advice: {out['advice']}"]
    if out["python_frames"]:
        lines += ["Python frames:", *(f"  {one_line(frame)}" for frame in out["python_frames"])]
    if out["source_lines"]:
        lines += ["source:", *(f"  {one_line(compact(s))}" for s in out["source_lines"])]
    if children:
        head, rows_text = _findings_table(children)
        lines += ["refined by:", *head, *rows_text]
    lines.append(f"first occurrences [start µs, duration µs]: {compact(out['occurrences_us'])} "
                 f"({out['occurrences_total']} in all)")
    lines.append(f"detail: {compact(out['detail'])}")
    out["content"] = texts.cap("\n".join(lines))
    return out


def compare(roots: Roots, before: str, after: str, offset: int = 0) -> dict:
    """Did the change work: the verdict, whose headline leads with what differs between the runs besides the change
    (GPU, model, workload, torch) and follows the measured step change and its noise; each fixed finding's predicted
    saving beside the measured change (the verdict's attribution); then the diff (diff.md) from line `offset`."""
    if offset < 0:
        raise BadArgument("offset", f"must be 0 or more, not {offset}")
    a, b = resolve_run(roots, before, "before"), resolve_run(roots, after, "after")
    diff = api.compare(a.run_id, report_of(roots, a, "before"), b.run_id, report_of(roots, b, "after"))
    verdict = diff.get("verdict") or {}
    differences = verdict.get("differences") or []
    warnings = [str(w) for source in (verdict, diff) for w in source.get("warnings") or []]
    fixed = [{"kind": f["kind"], "title": f["title_before"], "call_site": f.get("call_site"),
              "predicted_saving_ms": f.get("saving_before_ms"), "gpu_idle_before_us": f.get("impact_before_us")}
             for f in diff["findings"] if f["status"] == "fixed" and not f.get("child")]
    new = [{"kind": f["kind"], "title": f["title_after"], "gpu_idle_us": f.get("impact_after_us")}
           for f in diff["findings"] if f["status"] == "new" and not f.get("child")]
    markdown = api.render_diff_markdown(diff)
    headline = verdict.get("headline") or f"{a.run_id} -> {b.run_id}"
    body = [line for line in markdown.splitlines() if line.strip("*") != headline]  # the headline leads instead
    out = {"text": _line(headline), "before": a.run_id, "after": b.run_id, "differences": differences,
           "warnings": warnings, "verdict": verdict, "summary": diff["summary"], "fixed": fixed, "new": new,
           "markdown": markdown, "total": len(body), "offset": offset, "next_offset": None, "note": None}
    head = ([] if differences else ["The reports record no difference between the runs in GPU, model, workload, "
                                    "batch size or torch."])
    head += [headline, *(f"Warning: {w}" for w in warnings),
             f"diff.md ({len(body)} lines, from line {offset}):"]
    out["content"] = paged(head, body[offset:], out, None, "lines of diff.md", "compare")
    return out


def capture(roots: Roots, workload: str, overrides: list[str] | None = None, timeout_s: float = 3600) -> dict:
    """`python -m analyzer capture WORKLOAD --out TRACES --set ...`, in a process of its own: refused unless the
    server was started with --allow-capture (it runs the workload's code)."""
    if not roots.allow_capture:
        raise BadArgument("workload", "capture is off: start the server with --allow-capture to let it run code")
    path = _checked_path(workload, "workload")
    real = (path if path.is_absolute() else REPO / path).resolve()
    if real.suffix not in (".yaml", ".yml") or not real.is_file():
        raise BadArgument("workload", f"{shown(workload)} is not a workload YAML file")
    if not (api.is_within(real, REPO / "workloads") or api.is_within(real, roots.traces)):
        raise BadArgument("workload", f"{shown(workload)} is outside workloads/ and the traces root")
    args = [sys.executable, "-m", "analyzer", "capture", str(real), "--out", str(roots.traces)]
    for item in overrides or []:
        if not isinstance(item, str) or "=" not in item or item.startswith("-"):
            raise BadArgument("overrides", f"{shown(item)} is not KEY=VALUE")
        args += ["--set", item]
    before = {r.run_id for r in roots.store.runs()}
    try:
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BadArgument("workload", f"the capture ran past {timeout_s:.0f} s and was stopped") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise BadArgument("workload", f"capture exited {done.returncode}: {roots.scrub(last)}")
    new = [r.run_id for r in api.discover_runs(roots.traces) if r.run_id not in before]
    out = {"text": _line(f"captured {workload}: run {', '.join(new) or '?'}"), "runs": new,
           "stdout": roots.scrub(done.stdout[-4000:])}
    out["content"] = texts.cap(f"{out['text']}\n{out['stdout']}")
    return out


def _dataset(roots: Roots, argument: str) -> Path:
    if roots.dataset is None:
        raise BadArgument(argument, "no dataset: start the server with --dataset DIR (an analyze-many --out folder)")
    return roots.dataset


def tables(roots: Roots, table_name: str | None = None) -> dict:
    """The dataset's tables with their rows and columns; with `table_name`, that table's columns with their types
    and meanings."""
    dataset = _dataset(roots, "table")
    from analyzer.fleet.query import describe_sandboxed
    try:
        found = describe_sandboxed(dataset, roots.query_timeout_s)
    except UsageError as exc:
        raise BadArgument("table", roots.scrub(str(exc).removeprefix("tables: "))) from None
    if table_name is not None and table_name not in found:
        raise BadArgument("table", f"{shown(table_name)} is not a table of the dataset (its tables: "
                                   f"{', '.join(found)})")
    picked = [table_name] if table_name else list(found)
    counts = ", ".join(f"{t} ({v['rows']} rows)" for t, v in found.items())
    out = {"text": f"{len(found)} tables in the dataset: {counts}",
           "tables": [{"table": t, "rows": found[t]["rows"],
                       "columns": [{"name": n, "type": kind, "meaning": meaning}
                                   for n, kind, meaning in found[t]["columns"]]} for t in picked]}
    if table_name:
        head, lines = table(["column", "type", "meaning"], [[c["name"], c["type"], c["meaning"]]
                                                            for c in out["tables"][0]["columns"]])
        head = [f"table {table_name}: {found[table_name]['rows']} rows; every table joins `traces` on content_key",
                *head]
    else:
        head, lines = table(["table", "rows", "columns"],
                            [[t["table"], t["rows"], ", ".join(c["name"] for c in t["columns"])]
                             for t in out["tables"]])
        head = [out["text"], "query runs one SELECT over them; `tables` with table=NAME gives a table's columns "
                "with their types and meanings", *head]
    out["content"] = texts.cap("\n".join([*head, *lines]))
    return out


def query(roots: Roots, sql: str, limit: int = QUERY_ROWS, offset: int = 0) -> dict:
    """Read-only SQL (one SELECT) over the analyze-many dataset the server was started with: at most `limit` rows
    from row `offset`, each value cut to texts.CELL characters and the rows to what fits in texts.BUDGET, stopped
    after the server's time limit."""
    dataset = _dataset(roots, "sql")
    if not isinstance(sql, str) or not sql.strip():
        raise BadArgument("sql", "empty")
    if not 1 <= limit <= MAX_PAGE:
        raise BadArgument("limit", f"must be 1 to {MAX_PAGE}, not {limit}")
    if offset < 0:
        raise BadArgument("offset", f"must be 0 or more, not {offset}")
    from analyzer.fleet.query import query_sandboxed
    try:
        columns, rows, more = query_sandboxed(dataset, sql, limit, offset, roots.query_timeout_s)
    except UsageError as exc:
        why = roots.scrub(str(exc).removeprefix("sql: "))
        if why.startswith("stopped after"):
            why += ": make it cheaper (a join condition, a WHERE, fewer rows) or ask for fewer rows"
        raise BadArgument("sql", why) from None
    cells = [[_cell(v) for v in row] for row in rows]
    out = {"text": "", "columns": columns, "rows": cells, "offset": offset,
           "next_offset": offset + len(cells) if more else None, "total": None,
           "note": f"more rows: call query again with offset={offset + len(cells)}, or narrow the SQL" if more
           else None}
    head, lines = table(columns, cells)
    content = paged(["", *head], lines, out, "rows", "rows", "query")  # the line above it says how many fit
    out["truncated"] = out["next_offset"] is not None
    out["cells_cut"] = cut = sum(1 for row in rows[:len(out["rows"])] for v in row
                                 if not (v is None or isinstance(v, (bool, int, float))) and len(str(v)) > texts.CELL)
    out["text"] = (f"{len(out['rows'])} rows from row {offset}" + (" (more left)" if out["truncated"] else "")
                   + (f"; {cut} values cut to {texts.CELL} characters" if cut else ""))
    out.pop("total")
    out["content"] = out["text"] + content
    return out


def _cell(value):
    """A value as JSON carries it (numbers, text, booleans and nulls; anything else as text), text cut to
    texts.CELL characters."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = str(value)
    return text if len(text) <= texts.CELL else text[:texts.CELL - 1] + "…"
