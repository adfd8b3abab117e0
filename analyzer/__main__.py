"""Command line: `python -m analyzer {capture,analyze,diff,dashboard,schema} ...`. Subcommands import their heavy
modules lazily."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from analyzer.errors import UsageError


def _cmd_capture(args) -> int:
    from analyzer.capture import run_capture
    return run_capture(args.workload, args.set or [], Path(args.out), sys.argv[1:])


def _cmd_analyze(args) -> int:
    from analyzer.cli_analyze import run_analyze
    return run_analyze(args.path, args.out, args.hta, args.latest, not args.no_cache,
                       user_code=tuple(args.user_code or ()))


def _cmd_diff(args) -> int:
    from analyzer.report.diff import run_diff
    return run_diff(args.before, args.after, args.out)


def _cmd_dashboard(args) -> int:
    from dashboard.app import main as dashboard_main
    return dashboard_main(args.dashboard_args)


def _cmd_schema(args) -> int:
    from analyzer.capture.config import describe_schema, script_names
    print(describe_schema())
    print(f"\nscripts: {', '.join(script_names())}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analyzer",
                                     description="Capture PyTorch inference workloads and explain GPU idle time.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cap = sub.add_parser("capture", help="run a workload YAML under torch.profiler and write a run folder")
    cap.add_argument("workload", help="workload YAML file, e.g. workloads/decode.yaml")
    cap.add_argument("--out", default="traces", help="folder that receives the run folder (default: traces)")
    cap.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a workload key, e.g. --set batch_size=4 --set profiler.active=4")
    cap.set_defaults(func=_cmd_capture)
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
    ana.set_defaults(func=_cmd_analyze)
    dif = sub.add_parser("diff", help="compare two runs (before / after a fix): findings, steps, utilization")
    dif.add_argument("before", help="run folder, trace file or report.json")
    dif.add_argument("after", help="run folder, trace file or report.json")
    dif.add_argument("--out", help="folder for diff.json / diff.md / diff.html (default: ./diff-A-vs-B)")
    dif.set_defaults(func=_cmd_diff)
    dash = sub.add_parser("dashboard", help="the Dash dashboard over a folder of runs (same as python -m dashboard)",
                          add_help=False)
    dash.add_argument("dashboard_args", nargs=argparse.REMAINDER, help="--traces DIR --host HOST --port PORT")
    dash.set_defaults(func=_cmd_dashboard)
    schema = sub.add_parser("schema", help="print the workload YAML schema")
    schema.set_defaults(func=_cmd_schema)
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


if __name__ == "__main__":
    sys.exit(run())
