"""What each MCP tool answers, as plain functions of the roots and the arguments: the run list, a run's analysis and
one finding from the RunStore (analyzer.api, the dashboard's own), a comparison of two runs, SQL over an
analyze-many dataset. Every answer is a JSON-able dict with a one-line `text`; a bad argument raises BadArgument,
whose message names the argument. The server (analyzer.mcp.server) turns these into MCP tools."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from analyzer import api
from analyzer.errors import UsageError

PAGE = 50  # rows of a list answered at once, unless asked otherwise
MAX_PAGE = 500
OCCURRENCES = 20  # a finding's occurrences shown, the rest counted
TEXT_LINE = 400  # characters of the one-line text


class BadArgument(ValueError):
    """A tool argument the server refuses; the message names the argument and says why, on one line."""

    def __init__(self, argument: str, why: str):
        super().__init__(f"{argument}: {' '.join(str(why).split())}")


@dataclasses.dataclass
class Roots:
    """What the server may read: the traces folder (runs, their reports) and an analyze-many dataset; whether it
    may run captures (they run the workload's code)."""
    traces: Path
    dataset: Path | None = None
    allow_capture: bool = False
    store: api.RunStore = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.traces = Path(self.traces).resolve()
        self.dataset = Path(self.dataset).resolve() if self.dataset else None
        self.store = api.RunStore(self.traces)


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
        raise BadArgument(argument, f"{value!r} climbs out with '..'")
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
        raise BadArgument(argument, f"{value!r} is outside the traces root {roots.traces}")
    for run in store.runs():
        if real in (run.trace.resolve(), run.trace.parent.resolve()):
            return run
    raise BadArgument(argument, f"no run {value!r} under {roots.traces} (list_runs names them)")


def report_of(roots: Roots, run: api.Run, argument: str = "run") -> dict:
    try:
        return roots.store.report(run)
    except UsageError as exc:
        raise BadArgument(argument, f"{run.run_id}: {exc}") from None


def _line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= TEXT_LINE else text[:TEXT_LINE - 1] + "…"


def _saving(f: dict) -> dict:
    w = f.get("what_if") or {}
    return {"saving_ms": w.get("saving_ms"), "saving_share": w.get("saving_share"), "fix": w.get("fix"),
            "why_no_saving": w.get("why")}


def finding_brief(f: dict) -> dict:
    """A finding as the ranked list shows it."""
    return {"id": f["id"], "kind": f["kind"], "severity": f["severity"], "title": f["title"],
            "call_site": f.get("call_site"), "parent": f.get("parent"), "gpu_idle_us": f["impact_us"],
            "count": f["count"], "confidence": f["confidence"], **_saving(f)}


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
    rows, paging = page_of(roots.store.rows(), offset, limit, "runs", "list_runs")
    runs = [run_row(r) for r in rows]
    analyzed = sum(1 for r in runs if r["status"] == "analyzed")
    text = (f"{paging['total']} runs under {roots.traces}; {len(runs)} listed from offset {offset}, "
            f"{analyzed} of them analyzed.")
    return {"text": text, "runs": runs, **paging}


def analyze(roots: Roots, run: str, offset: int = 0, limit: int = PAGE) -> dict:
    """A run's summary, trace checks and top-level findings ranked by what their fix buys (analyzed on first use,
    then read back by its trace key)."""
    found = resolve_run(roots, run)
    report = report_of(roots, found)
    summary = report["summary"]
    tops = [f for f in api.ranked(report["findings"]) if not f.get("parent")]
    part, paging = page_of(tops, offset, limit, "top-level findings", "analyze")
    validity = report["validity"]
    checks = [{"name": c["name"], "status": c["status"], "meaning": c["meaning"]}
              for c in validity["checks"] if c["status"] != "ok"]
    what_if = report.get("what_if") or {}
    util = summary.get("gpu_utilization")
    lead = part[0] if part else None
    text = (f"{found.run_id}: GPU busy {util:.0%} of {summary['window_us'] / 1e3:.1f} ms" if util is not None else
            f"{found.run_id}: no GPU activity")
    if lead is not None:
        saving = (lead.get("what_if") or {}).get("saving_ms")
        unit = f"per {what_if.get('step_label')}" if what_if.get("measure") == "step" else "over the window"
        text += f"; first finding: {lead['title']}" + (f" (its fix saves {saving:.2f} ms {unit})" if saving else "")
    if validity["failed"]:
        text += f"; trace checks failed: {', '.join(validity['failed'])}"
    return {"text": _line(text), "run": found.run_id, "trace": str(found.trace.relative_to(roots.traces)),
            "summary": {k: summary.get(k) for k in ("gpu_utilization", "window_us", "gpu_busy_us", "gpu_idle_us",
                                                    "steps", "step_word", "top_finding", "step_time_us")},
            "idle_partition": summary["idle_partition"],
            "what_if": {k: what_if.get(k) for k in ("available", "basis", "measure", "step_label", "step_ms",
                                                    "gpu_busy_per_step_ms", "all_fixed", "limits")},
            "what_if_text": api.what_if_summary(report),
            "checks": checks, "checks_failed": validity["failed"], "checks_warned": validity["warned"],
            "findings": [finding_brief(f) for f in part], **paging}


def finding(roots: Roots, run: str, finding_id: str) -> dict:
    """One finding in full: its call site, Python frames, source lines, advice, what its fix buys and its first
    occurrences."""
    found = resolve_run(roots, run)
    report = report_of(roots, found)
    match = next((f for f in report["findings"] if f["id"] == finding_id), None)
    if match is None:
        ids = ", ".join(f["id"] for f in report["findings"][:12])
        raise BadArgument("finding_id", f"{finding_id!r} is not a finding of {found.run_id} (its findings: {ids})")
    detail = match.get("detail") or {}
    occurrences = match.get("occurrences_us") or []
    children = [finding_brief(f) for f in report["findings"] if f.get("parent") == finding_id]
    site = match.get("call_site")
    text = match["title"] + (f" at {site}" if site and site not in match["title"] else "")
    return {"text": _line(text), "run": found.run_id, **finding_brief(match),
            "library_site": match.get("library_site"), "advice": match["advice"],
            "confidence_checks": match.get("confidence_checks") or [],
            "python_frames": detail.get("context") or [], "source_lines": detail.get("source_lines") or [],
            "what_if": match.get("what_if"),
            "what_if_text": api.what_if_line(match, report.get("what_if")) or None, "refined_by": children,
            "occurrences_us": occurrences[:OCCURRENCES], "occurrences_total": len(occurrences),
            "occurrences_note": f"{len(occurrences) - OCCURRENCES} more occurrences in the run's report.json"
            if len(occurrences) > OCCURRENCES else None,
            "detail": {k: v for k, v in detail.items() if k not in ("context", "source_lines")}}


def compare(roots: Roots, before: str, after: str) -> dict:
    """Did the change work: the verdict with its measured change and noise, and each fixed finding's predicted
    saving beside the measured change (the verdict's attribution)."""
    a, b = resolve_run(roots, before, "before"), resolve_run(roots, after, "after")
    diff = api.compare(a.run_id, report_of(roots, a, "before"), b.run_id, report_of(roots, b, "after"))
    verdict = diff.get("verdict") or {}
    fixed = [{"kind": f["kind"], "title": f["title_before"], "call_site": f.get("call_site"),
              "predicted_saving_ms": f.get("saving_before_ms"), "gpu_idle_before_us": f.get("impact_before_us")}
             for f in diff["findings"] if f["status"] == "fixed" and not f.get("child")]
    new = [{"kind": f["kind"], "title": f["title_after"], "gpu_idle_us": f.get("impact_after_us")}
           for f in diff["findings"] if f["status"] == "new" and not f.get("child")]
    return {"text": _line(verdict.get("headline") or f"{a.run_id} -> {b.run_id}"), "before": a.run_id,
            "after": b.run_id, "verdict": verdict, "summary": diff["summary"], "fixed": fixed, "new": new,
            "markdown": api.render_diff_markdown(diff)}


def capture(roots: Roots, workload: str, overrides: list[str] | None = None, timeout_s: float = 3600) -> dict:
    """`python -m analyzer capture WORKLOAD --out TRACES --set ...`, in a process of its own: refused unless the
    server was started with --allow-capture (it runs the workload's code)."""
    if not roots.allow_capture:
        raise BadArgument("workload", "capture is off: start the server with --allow-capture to let it run code")
    path = _checked_path(workload, "workload")
    repo = Path(__file__).resolve().parents[2]
    real = (path if path.is_absolute() else repo / path).resolve()
    if real.suffix not in (".yaml", ".yml") or not real.is_file():
        raise BadArgument("workload", f"{workload!r} is not a workload YAML file")
    if not (api.is_within(real, repo / "workloads") or api.is_within(real, roots.traces)):
        raise BadArgument("workload", f"{workload!r} is outside workloads/ and the traces root")
    args = [sys.executable, "-m", "analyzer", "capture", str(real), "--out", str(roots.traces)]
    for item in overrides or []:
        if not isinstance(item, str) or "=" not in item or item.startswith("-"):
            raise BadArgument("overrides", f"{item!r} is not KEY=VALUE")
        args += ["--set", item]
    before = {r.run_id for r in roots.store.runs()}
    try:
        done = subprocess.run(args, cwd=repo, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BadArgument("workload", f"the capture ran past {timeout_s:.0f} s and was stopped") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise BadArgument("workload", f"capture exited {done.returncode}: {last}")
    new = [r.run_id for r in api.discover_runs(roots.traces) if r.run_id not in before]
    return {"text": _line(f"captured {workload}: run {', '.join(new) or '?'}"), "runs": new,
            "stdout": done.stdout[-4000:]}


def query(roots: Roots, sql: str, limit: int = 100) -> dict:
    """Read-only SQL (one SELECT) over the analyze-many dataset the server was started with, at most `limit`
    rows."""
    if roots.dataset is None:
        raise BadArgument("sql", "no dataset: start the server with --dataset DIR (an analyze-many --out folder)")
    if not isinstance(sql, str) or not sql.strip():
        raise BadArgument("sql", "empty")
    if not 1 <= limit <= MAX_PAGE:
        raise BadArgument("limit", f"must be 1 to {MAX_PAGE}, not {limit}")
    from analyzer.fleet.query import query_sandboxed
    try:
        columns, rows, more = query_sandboxed(roots.dataset, sql, limit)
    except UsageError as exc:
        raise BadArgument("sql", str(exc).removeprefix("sql: ")) from None
    cells = [[_cell(v) for v in row] for row in rows]
    note = f"more than {limit} rows: add a LIMIT/OFFSET to the SQL, or raise limit (at most {MAX_PAGE})" \
        if more else None
    return {"text": f"{len(cells)} rows" + (" (cut)" if more else ""), "columns": columns, "rows": cells,
            "truncated": more, "note": note}


def _cell(value):
    """A cell as JSON carries it: numbers, text, booleans and nulls as they are, anything else as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
