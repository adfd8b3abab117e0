"""The one door to the analyzer, for the command line, the dashboard and the MCP server: find traces, load one,
analyze it (the analysis keeps the trace model and its views, so the dashboard's lanes reuse them), render and write
the reports, compare two reports, serve the timeline's lanes (`core`), and the runs under a traces folder with their
reports analyzed once and cached (`runs.RunStore`: the one run list every front end reads).

    trace = api.load(path)                   # a Trace: the model, its run's meta.json, where reports go
    analysis = api.analyze(trace)            # report.json's dictionary in analysis.report
    api.write(analysis)                      # report.json / report.md / report.html, atomically
    data = api.timeline(analysis)            # the dashboard's lanes; data.view(lo_ns, hi_ns)
    store = api.RunStore(traces_dir)         # store.rows(), store.report(store.find(run_id))
"""
from analyzer.api.core import *  # noqa: F401,F403 - the door's names, listed in core.__all__
from analyzer.api.core import __all__ as _core
from analyzer.api.runs import CACHE_DIR_NAME, Run, RunRow, RunStore, discover_runs, format_created

__all__ = [*_core, "CACHE_DIR_NAME", "Run", "RunRow", "RunStore", "discover_runs", "format_created"]
