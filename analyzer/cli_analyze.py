"""`python -m analyzer analyze PATH [--out DIR] [--hta]`: load, detect, render, write, print the top findings."""
from __future__ import annotations

from pathlib import Path

from analyzer.errors import UsageError
from analyzer.trace.inputs import TraceInput, resolve_inputs

TOP_PRINTED = 5
CHILDREN_PRINTED = 2


def build_report(item: TraceInput, with_hta: bool = False, cache: bool = True,
                 user_code: tuple[str, ...] = ()) -> dict:
    import numpy as np
    from analyzer.report.assemble import analyze_model
    from analyzer.trace.runmeta import read_meta
    from analyzer.trace import TraceError, load_trace
    meta = read_meta(item.meta) if item.meta else None
    try:
        from analyzer.progress import Ticker
        with Ticker(f"parsing {item.trace.name}", item.trace.stat().st_size) as ticker:
            model = load_trace(item.trace, cache=cache, progress=ticker.update)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    with np.errstate(all="ignore"):  # absurd values (int64 overflow) must not add numpy's lines to stderr
        report = analyze_model(model, meta, item.trace, user_code=user_code)
    if with_hta:
        from analyzer.report.hta import run_hta
        report["hta"] = run_hta(item.trace, report)
    return report


def render_all(report: dict) -> dict[str, str]:
    from analyzer.report.html import render_html
    from analyzer.report.markdown import render_markdown
    from analyzer.report.files import report_json_text
    html = render_html(report)
    html = html.replace("<head>", '<head><meta name="generator" content="gpu-idle-analyzer">', 1)
    return {"report.json": report_json_text(report),
            "report.md": "<!-- gpu-idle-analyzer report -->\n" + render_markdown(report),
            "report.html": html}


def print_summary(report: dict, written: list[Path]) -> None:
    from analyzer.report.markdown import headline, numbered, partition_line
    from analyzer.units import fmt_us
    print(f"trace:   {report['source']['trace']}")
    print("summary: " + headline(report).replace("**", ""))
    findings = report["findings"]
    if report["summary"].get("gpu_utilization") is None and not report["trace"].get("foreign_activity"):
        print("hint:    real H200 runs ship with the project: python -m analyzer analyze traces/examples/item_sync "
              "--out /tmp/item_sync-report, or python -m analyzer dashboard")
    if not findings:
        print("findings: none")
    if part := partition_line(report):
        print("idle:    " + part)
    shown = [(n, f) for n, f in numbered(findings) if n.count(".") == 0 or int(n.split(".")[1]) <= CHILDREN_PRINTED]
    top = [n for n, f in shown if not f.get("parent")][:TOP_PRINTED]
    for n, f in shown:
        if n.split(".")[0] not in top:
            continue
        site = f.get("library_site") or f.get("call_site")
        site = f" [{site}]" if site and site not in f["title"] else ""
        label = f"     {n:<5}" if f.get("parent") else f"  {n + '.':<4}"
        print(f"{label} {f['severity']:<6} {fmt_us(f['impact_us']):>10}  {f['title']}{site}")
    hidden = sum(1 for f in findings if not f.get("parent")) - len(top)
    if hidden > 0:
        print(f"  ... {hidden} more in the report")
    print("reports: " + ", ".join(str(p) for p in written))


_SKIP_REASONS = ("missing or invalid ts", "missing or invalid dur", "negative dur", "missing or invalid Bytes")


def warning_line(report: dict) -> str | None:
    """`warning: <trace>: skipped 12 ops rows with missing or invalid ts; ...` from report.json's trace.warnings."""
    warnings = report["trace"].get("warnings") or {}
    if not warnings:
        return None
    parts = []
    for reason, count in warnings.items():
        table, sep, what = reason.partition(": ")
        parts.append(f"skipped {count} {table} rows with {what}" if sep and what in _SKIP_REASONS
                     else f"{reason} ({count})")
    return f"warning: {report['source']['trace']}: " + "; ".join(parts)


def meta_warning_line(report: dict) -> str | None:
    """`warning: <run>/meta.json: ignored unprofiled.steps (a string, not an integer)`: what analysis left out."""
    source = report["source"]
    warnings = source.get("meta_warnings")
    return f"warning: {source['meta']}: " + "; ".join(warnings) if warnings else None


def _refuse_foreign_reports(out_dirs: list[Path]) -> None:
    """Check every output folder before writing any, so one foreign report.* leaves none of ours behind."""
    from analyzer.report.files import REPORT_FILES, _is_ours
    for out_dir in out_dirs:
        for name in REPORT_FILES:
            target = out_dir / name
            if target.exists() and not _is_ours(target):
                raise UsageError(f"{target}: exists and was not written by gpu-idle-analyzer; not overwriting "
                                 f"(choose another --out)")


def run_analyze(path: str, out: str | None, with_hta: bool, latest: bool = False, cache: bool = True,
                user_code: tuple[str, ...] = ()) -> int:
    import sys
    from analyzer.trace.inputs import latest_run
    from analyzer.report.files import write_reports
    items = resolve_inputs(latest_run(path) if latest else path, out)
    # every trace is loaded, analyzed and rendered before anything is written: a bad rank leaves no reports
    done = [(item, report, render_all(report)) for item in items
            for report in (build_report(item, with_hta, cache, user_code),)]
    _refuse_foreign_reports([item.out_dir for item in items])
    meta_warned = set()  # ranks beside one meta.json share it: its warning once
    for n, (item, report, contents) in enumerate(done):
        if n:
            print()
        if warning := warning_line(report):
            print(warning, file=sys.stderr)
        if (warning := meta_warning_line(report)) and warning not in meta_warned:
            meta_warned.add(warning)
            print(warning, file=sys.stderr)
        written = write_reports(item.out_dir, contents)
        print_summary(report, written)
    return 0
