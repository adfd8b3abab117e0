"""`python -m analyzer analyze PATH [--out DIR] [--hta]`: load, detect, render, write, print the top findings."""
from __future__ import annotations

from pathlib import Path

from analyzer.errors import UsageError
from analyzer.inputs import TraceInput, resolve_inputs

TOP_PRINTED = 5


def build_report(item: TraceInput, with_hta: bool = False, cache: bool = True) -> dict:
    from analyzer.analysis import analyze_model
    from analyzer.runmeta import read_meta
    from analyzer.trace import TraceError, load_trace
    meta = read_meta(item.meta) if item.meta else None
    try:
        model = load_trace(item.trace, cache=cache)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    report = analyze_model(model, meta, item.trace)
    if with_hta:
        from analyzer.hta_compare import run_hta
        report["hta"] = run_hta(item.trace, report)
    return report


def render_all(report: dict) -> dict[str, str]:
    from analyzer.render.html import render_html
    from analyzer.render.markdown import render_markdown
    from analyzer.report_files import report_json_text
    html = render_html(report)
    html = html.replace("<head>", '<head><meta name="generator" content="gpu-idle-analyzer">', 1)
    return {"report.json": report_json_text(report),
            "report.md": "<!-- gpu-idle-analyzer report -->\n" + render_markdown(report),
            "report.html": html}


def print_summary(report: dict, written: list[Path]) -> None:
    from analyzer.render.markdown import headline
    from analyzer.render.units import fmt_us
    print(f"trace:   {report['source']['trace']}")
    print("summary: " + headline(report).replace("**", ""))
    findings = report["findings"]
    if not findings:
        print("findings: none")
    for i, f in enumerate(findings[:TOP_PRINTED]):
        site = f" [{f['call_site']}]" if f["call_site"] else ""
        print(f"  {i + 1}. {f['severity']:<6} {fmt_us(f['impact_us']):>10}  {f['title']}{site}")
    if len(findings) > TOP_PRINTED:
        print(f"  ... {len(findings) - TOP_PRINTED} more in the report")
    print("reports: " + ", ".join(str(p) for p in written))


def run_analyze(path: str, out: str | None, with_hta: bool, latest: bool = False, cache: bool = True) -> int:
    from analyzer.inputs import latest_run
    from analyzer.report_files import write_reports
    items = resolve_inputs(latest_run(path) if latest else path, out)
    for n, item in enumerate(items):
        if n:
            print()
        report = build_report(item, with_hta, cache)
        written = write_reports(item.out_dir, render_all(report))
        print_summary(report, written)
    return 0
