"""The command line: `python -m analyzer {capture,analyze,analyze-many,query,diff,check,dashboard,mcp,schema} ...`, one function per subcommand.

Only this module knows about exit codes and stderr: the layers below raise UsageError (exit status 2, one line) and
keep their tracebacks for bugs. Subcommands import their layers lazily, so `capture` needs only torch, pyyaml and
the standard library, and `schema` not even torch.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from analyzer.errors import UsageError

TOP_PRINTED = 5
CHILDREN_PRINTED = 2


def cmd_capture(args) -> int:
    from analyzer.capture import run_capture
    return run_capture(args.workload, args.set or [], Path(args.out), sys.argv[1:])


def cmd_analyze(args) -> int:
    """Load, analyze and render every trace PATH names before writing any report, so a bad rank leaves none."""
    from analyzer import api
    items = api.find(api.latest_run(args.path) if args.latest else args.path, args.out)
    if args.memory_snapshot:
        if len(items) != 1:
            raise UsageError(f"{args.path}: holds {len(items)} traces; --memory-snapshot belongs to one of them")
        snapshot = Path(args.memory_snapshot)
        if not snapshot.is_file():
            raise UsageError(f"{snapshot}: no such memory snapshot file")
        items = [dataclasses.replace(items[0], snapshot=snapshot)]
    done = [api.analyze(_load(item, cache=not args.no_cache), user_code=tuple(args.user_code or ()), hta=args.hta)
            for item in items]
    for analysis in done:
        analysis.files  # noqa: B018 (rendered now: a failure leaves nothing written)
    _refuse_foreign_reports([item.out_dir for item in items])
    meta_warned = set()  # ranks beside one meta.json share it: its warning once
    for n, analysis in enumerate(done):
        report = analysis.report
        if n:
            print()
        if warning := warning_line(report):
            print(warning, file=sys.stderr)
        if (warning := meta_warning_line(report)) and warning not in meta_warned:
            meta_warned.add(warning)
            print(warning, file=sys.stderr)
        print_summary(report, api.write(analysis))
        if args.annotate:
            print(f"annotated: {api.annotate(analysis)} (our diagnosis on tracks of its own; opens in Perfetto)")
    return 0


def _load(item, cache: bool):
    from analyzer import api
    from analyzer.progress import Ticker
    with Ticker(f"parsing {item.trace.name}", item.trace.stat().st_size) as ticker:
        return api.load(item, cache=cache, progress=ticker.update)


def cmd_diff(args) -> int:
    import json
    from analyzer import api
    from analyzer.compare.diff import render_diff_html
    if args.fail_on is not None:  # a bad rule is refused before any work
        from analyzer.compare.gate import parse_fail_on
        rules = parse_fail_on(args.fail_on)
    name_a, a = load_report(args.before)
    name_b, b = load_report(args.after)
    d = api.compare(name_a, a, name_b, b)
    out_dir = Path(args.out) if args.out else Path(f"diff-{name_a}-vs-{name_b}")
    written = api.write_reports(out_dir, {"diff.json": json.dumps(d, indent=1) + "\n",
                                          "diff.md": api.render_diff_markdown(d), "diff.html": render_diff_html(d)})
    print(api.render_diff_markdown(d).split("\n", 1)[1].split("\n| per step")[0].rstrip())
    print("reports: " + ", ".join(str(p) for p in written))
    if args.fail_on is None:
        return 0
    from analyzer.compare.gate import diff_gate
    return _gate_exit("diff", diff_gate(d, rules), args)


def cmd_check(args) -> int:
    """One run against fixed limits: exit 1 with a line per failed rule."""
    from analyzer.compare.gate import check_gate, percent
    limit = percent(args.max_idle_share, "--max-idle-share") if args.max_idle_share else None
    _, report = load_report(args.path)
    return _gate_exit("check", check_gate(report, limit, args.no_finding_kind or []), args)


def _gate_exit(suite: str, results, args) -> int:
    from analyzer.compare.gate import github_annotations, junit_xml
    from analyzer.report.files import write_reports
    for r in results:
        print(r.line())
    if args.junit:
        path = Path(args.junit)
        write_reports(path.parent, {path.name: junit_xml(suite, results)})
    if args.github_annotations:
        sys.stdout.write(github_annotations(results))
    failed = [r for r in results if not r.passed]
    if failed:
        print(f"gate: {len(failed)} of {len(results)} rules failed", file=sys.stderr)
    return 1 if failed else 0


def _needs_fleet(command: str, modules: tuple[str, ...]) -> None:
    """A one-line install hint, not an ImportError's traceback, when the [fleet] extra is not installed."""
    import importlib
    missing = []
    for name in modules:  # imported now, as the command would: the same answer, an install hint instead
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UsageError(f"{command} needs the fleet extra, which is not installed (no module named "
                         f"{', '.join(missing)}): pip install -e '.[fleet]'")


def cmd_analyze_many(args) -> int:
    """Every trace PATHs name, analysed on a Dask cluster into a Parquet dataset: exit 0 when every trace was
    processed (a trace that cannot be analysed is a row with its error), 1 when a task failed after its retries."""
    _needs_fleet("analyze-many", ("distributed", "pyarrow", "duckdb", "pandas", "psutil"))
    from analyzer import fleet
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: give at least 1")
    result = fleet.analyze_many(args.paths, args.out, job=args.job, scheduler=args.scheduler,
                                scheduler_file=args.scheduler_file, workers=args.workers,
                                processes=not args.threads)
    errors = result.errors
    print(f"analyze-many: {result.inputs} traces: {len(result.results) - len(errors)} analysed, {len(errors)} "
          f"with an error, {len(result.skipped)} skipped (already in {args.out}), {len(result.failures)} failed "
          f"in {result.seconds:.1f} s")
    for r in errors[:TOP_PRINTED]:
        print(f"  error: {r['error'] if r['source'] in r['error'] else r['source'] + ': ' + r['error']}")
    if len(errors) > TOP_PRINTED:
        print(f"  ... {len(errors) - TOP_PRINTED} more: python -m analyzer query {args.out} "
              f"\"SELECT source, error FROM traces WHERE error IS NOT NULL\"")
    for line in result.failures:
        print(f"failed: {line}", file=sys.stderr)
    if result.job_report:
        print("job report: " + ", ".join(str(p) for p in result.job_report))
    if result.job_report_error:
        print(f"warning: job report not written: {result.job_report_error}", file=sys.stderr)
    print(f"dataset: {args.out} (python -m analyzer query {args.out} \"SELECT job, rank, utilization FROM traces\")")
    return 1 if result.failures else 0


def cmd_query(args) -> int:
    _needs_fleet("query", ("duckdb", "pyarrow"))
    from analyzer.fleet.query import query, render
    columns, rows = query(args.dir, args.sql)
    if columns:
        sys.stdout.write(render(columns, rows, args.format))
    return 0


def cmd_dashboard(args) -> int:
    from dashboard.app import main as dashboard_main
    return dashboard_main(args.dashboard_args)


def cmd_mcp(args) -> int:
    """The MCP server over the runs under --traces (stdio, or streamable HTTP with --http PORT)."""
    try:
        import mcp  # noqa: F401 - the [mcp] extra: an install hint, not an ImportError's traceback
    except ImportError:
        raise UsageError("mcp needs the mcp extra, which is not installed (no module named mcp): "
                         "pip install -e '.[mcp]'") from None
    traces = Path(args.traces)
    if not traces.is_dir():
        raise UsageError(f"--traces {traces}: no such folder of runs")
    if args.dataset is not None:
        if not (Path(args.dataset) / "traces").is_dir():
            raise UsageError(f"--dataset {args.dataset}: not an analyze-many dataset (no traces/ folder in it)")
        _needs_fleet("mcp --dataset", ("duckdb", "pyarrow"))
    if not args.query_timeout > 0:
        raise UsageError(f"--query-timeout {args.query_timeout:g}: must be more than 0 seconds")
    if args.http is None and (args.token_file or args.allow_host):
        raise UsageError("--token-file and --allow-host guard --http; stdio needs neither")
    from analyzer.mcp.server import run as serve
    serve(traces, Path(args.dataset) if args.dataset else None, args.allow_capture, args.http, args.host,
          args.token_file, args.allow_host, args.query_timeout)
    return 0


def cmd_schema(args) -> int:
    from analyzer.capture.config import describe_schema, script_names
    print(describe_schema())
    print(f"\nscripts: {', '.join(script_names())}")
    return 0


def load_report(path: str | Path) -> tuple[str, dict]:
    """A report.json, or a run folder / trace to analyze now (the report beside it is reused when it is the report
    of the trace as it is now)."""
    from analyzer import api
    path = Path(path)
    if path.is_file() and path.name == "report.json":
        return path.parent.name, api.read_report(path)
    try:
        items = api.find(path)
    except UsageError:
        if path.is_dir() and (path / "report.json").is_file():  # a folder of reports, its trace elsewhere
            return path.name, api.read_report(path / "report.json")
        raise
    if len(items) != 1:
        raise UsageError(f"{path}: holds {len(items)} traces; diff one trace (or report.json) against another")
    stored = api.fresh_report(items[0].trace, [items[0].out_dir])
    if stored is not None:
        return path.name, api.read_report(stored)
    return path.name, api.analyze(_load(items[0], cache=True)).report


def print_summary(report: dict, written: list[Path]) -> None:
    from analyzer.report.markdown import headline, numbered, partition_line
    from analyzer.report.validity_text import MARK, validity_items, validity_line
    from analyzer.report.whatif_text import ranked, saving_cell, summary_line
    from analyzer.units import fmt_us
    print(f"trace:   {report['source']['trace']}")
    print("summary: " + headline(report).replace("**", ""))
    findings = report["findings"]
    if report["summary"].get("gpu_utilization") is None and not report["trace"].get("foreign_activity"):
        print("hint:    real H200 runs ship with the project: python -m analyzer analyze traces/examples/item_sync "
              "--out /tmp/item_sync-report, or python -m analyzer dashboard")
    if not findings:
        print("findings: none")
    if check := validity_line(report):
        print("checks:  " + check)
        for status, name, text in validity_items(report):
            print(f"         {MARK[status]} {name}: {text}")
    if part := partition_line(report):
        print("idle:    " + part)
    if buys := summary_line(report):
        print("fixes:   " + buys)
    if findings:
        print(f"  {'#':<4} {'sev':<6} {'trust':<6} {'saving':>14} {'GPU idle':>10}  finding")
    shown = [(n, f) for n, f in numbered(ranked(findings))
             if n.count(".") == 0 or int(n.split(".")[1]) <= CHILDREN_PRINTED]
    top = [n for n, f in shown if not f.get("parent")][:TOP_PRINTED]
    for n, f in shown:
        if n.split(".")[0] not in top:
            continue
        site = f.get("library_site") or f.get("call_site")
        site = f" [{site}]" if site and site not in f["title"] else ""
        label = f"     {n:<5}" if f.get("parent") else f"  {n + '.':<4}"
        trust = "" if f.get("parent") else f.get("confidence", "")
        print(f"{label} {f['severity']:<6} {trust:<6} {saving_cell(f):>14} {fmt_us(f['impact_us']):>10}  "
              f"{f['title']}{site}")
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


def _gate_outputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--junit", metavar="FILE", help="also write the rules' results as JUnit XML")
    parser.add_argument("--github-annotations", action="store_true",
                        help="also print a GitHub Actions ::error annotation per failed rule")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analyzer",
                                     description="Capture PyTorch inference workloads and explain GPU idle time.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cap = sub.add_parser("capture", help="run a workload YAML under torch.profiler and write a run folder")
    cap.add_argument("workload", help="workload YAML file, e.g. workloads/decode.yaml")
    cap.add_argument("--out", default="traces", help="folder that receives the run folder (default: traces)")
    cap.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a workload key, e.g. --set batch_size=4 --set profiler.active=4")
    cap.set_defaults(func=cmd_capture)
    ana = sub.add_parser("analyze", help="explain the GPU idle time of a run folder, a trace file or a folder of traces")
    ana.add_argument("path", help="run folder, .json / .json.gz Kineto trace, or folder of traces")
    ana.add_argument("--out", help="folder for report.json / report.md / report.html (default: the run folder, "
                                   "or <trace name>.report/ beside a trace file)")
    ana.add_argument("--hta", action="store_true", help="also run HolisticTraceAnalysis and put its figures beside ours")
    ana.add_argument("--latest", action="store_true", help="PATH is a folder of runs (e.g. traces): analyze the newest")
    ana.add_argument("--no-cache", action="store_true",
                     help="parse the trace even if a columnar cache of it exists (and write none)")
    ana.add_argument("--user-code", action="append", metavar="PREFIX",
                     help="a path prefix of your own code (repeatable), e.g. --user-code vllm/ when you work on vLLM:"
                          " its frames become call sites instead of library context")
    ana.add_argument("--annotate", action="store_true",
                     help="also write <trace>.annotated.trace.json.gz: the trace plus idle intervals by cause and "
                          "every finding's occurrences as tracks of their own, for Perfetto / chrome://tracing")
    ana.add_argument("--memory-snapshot", metavar="PICKLE",
                     help="a torch.cuda.memory._snapshot() pickle of the same run (default: memory_snapshot.pickle "
                          "beside the trace): joins the allocator's own records to the trace")
    ana.set_defaults(func=cmd_analyze)
    dif = sub.add_parser("diff", help="compare two runs (before / after a fix): findings, steps, utilization")
    dif.add_argument("before", help="run folder, trace file or report.json")
    dif.add_argument("after", help="run folder, trace file or report.json")
    dif.add_argument("--out", help="folder for diff.json / diff.md / diff.html (default: ./diff-A-vs-B)")
    dif.add_argument("--fail-on", metavar="RULES",
                     help="exit 1 if any rule fails: new-finding[=SEVERITY] (a new top-level finding, of at least that "
                          "severity if given: high, medium, low), util-drop=N%% (GPU utilization fell by more than N points), "
                          "step-time=N%% (the step grew by more than N%%), comma-separated")
    _gate_outputs(dif)
    chk = sub.add_parser("check", help="gate one run: exit 1 if its idle share or its findings break the limits")
    chk.add_argument("path", help="run folder, trace file or report.json")
    chk.add_argument("--max-idle-share", metavar="N%", help="fail if the GPU is idle for more than N%% of the window")
    chk.add_argument("--no-finding-kind", action="append", metavar="KIND",
                     help="fail if the run has a finding of this kind (repeatable), e.g. sync, allocator_churn")
    _gate_outputs(chk)
    chk.set_defaults(func=cmd_check)
    dif.set_defaults(func=cmd_diff)
    many = sub.add_parser("analyze-many", help="analyse many traces (ranks, runs) on a Dask cluster into a Parquet "
                                               "dataset for `query`")
    many.add_argument("paths", nargs="+", metavar="PATH",
                      help="run folders, trace files, folders of runs or traces, globs (e.g. 'runs/*/rank*.json.gz')")
    many.add_argument("--out", default="fleet", help="the dataset folder (default: ./fleet); re-runs add to it")
    where = many.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler, e.g. tcp://10.0.0.5:8786")
    where.add_argument("--scheduler-file", metavar="FILE", help="a Dask scheduler file (dask-jobqueue, dask-mpi)")
    many.add_argument("--workers", type=int, metavar="N",
                      help="worker processes of the local cluster (default: min(cores, traces), fewer if RAM is short)")
    many.add_argument("--threads", action="store_true",
                      help="run the local cluster's workers as threads of this process instead of processes")
    many.add_argument("--job", metavar="NAME", help="the job every trace belongs to (default: its run folder's name)")
    many.set_defaults(func=cmd_analyze_many)
    qry = sub.add_parser("query", help="run SQL (DuckDB) over an analyze-many dataset")
    qry.add_argument("dir", metavar="DIR", help="the dataset folder analyze-many wrote")
    qry.add_argument("sql", metavar="SQL", help="one statement over the views traces, steps, gaps_by_site, syncs, "
                                                "allocator_sites, findings, collectives")
    qry.add_argument("--format", choices=("table", "csv", "json"), default="table")
    qry.set_defaults(func=cmd_query)
    dash = sub.add_parser("dashboard", help="the Dash dashboard over a folder of runs (same as python -m dashboard)",
                          add_help=False)
    dash.add_argument("dashboard_args", nargs=argparse.REMAINDER, help="--traces DIR --host HOST --port PORT")
    dash.set_defaults(func=cmd_dashboard)
    mcp = sub.add_parser("mcp", help="a Model Context Protocol server over the runs, reports, diffs and dataset, for "
                                     "an assistant (stdio; streamable HTTP with --http)")
    mcp.add_argument("--traces", default="traces", help="folder of run folders (default: traces)")
    mcp.add_argument("--dataset", metavar="DIR", help="an analyze-many dataset for the query tool")
    mcp.add_argument("--allow-capture", action="store_true",
                     help="let the capture tool run workloads (it runs their code; off by default)")
    mcp.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1",
                     help="address for --http (default: 127.0.0.1); any other than loopback needs a token")
    mcp.add_argument("--token-file", metavar="FILE",
                     help="the bearer token HTTP clients must send (else $GPU_IDLE_MCP_TOKEN; required off loopback)")
    mcp.add_argument("--allow-host", action="append", metavar="NAME[:PORT]",
                     help="also answer requests whose Host header is this (repeatable; the bound address and "
                          "loopback names always are)")
    mcp.add_argument("--query-timeout", type=float, default=10.0, metavar="SECONDS",
                     help="stop a query tool's SQL after this long (default: 10)")
    mcp.set_defaults(func=cmd_mcp)
    schema = sub.add_parser("schema", help="print the workload YAML schema")
    schema.set_defaults(func=cmd_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dashboard"]:  # the dashboard parses its own options (argparse REMAINDER drops "--x" ones)
        try:
            from dashboard.app import main as dashboard_main
            return dashboard_main(argv[1:])
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def run() -> int:
    try:
        return main()
    except KeyboardInterrupt:  # before a run folder existed (capture handles it once one does)
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; exit quietly as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
