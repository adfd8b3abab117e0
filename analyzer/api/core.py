"""One trace at a time (analyzer.api re-exports all of it): find traces, load one, analyze it (the analysis keeps
the trace model and its views, so the dashboard's lanes reuse them), render and write the reports, compare two
reports, and serve the timeline's lanes."""
from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path

import numpy as np

from analyzer.errors import UsageError
from analyzer.report.assemble import REPORT_SCHEMA, assemble_report
from analyzer.compare.diff import compare, predicted_text, render_diff_markdown
from analyzer.compare.verdict import is_improvement
from analyzer.report.files import write_reports
from analyzer.report.figures import mem_unit, window_start_us
from analyzer.timeline.cache import load_lanes, save_lanes
from analyzer.timeline.lanes import (BINS, EXACT_LIMIT, MARKER_LIMIT, REQUEST_STATES, LaneView, TimelineData,
                                   TimelineView)
from analyzer.report.markdown import numbered
from analyzer.report.validity_text import validity_items, validity_line
from analyzer.report.whatif_text import ranked, saving_cell, summary_line as what_if_summary, what_if_line
from analyzer.report.plotly_json import packed
from analyzer.report.stored import fresh_report, is_report_of, read_report, read_report_listing, read_report_or_none
from analyzer.trace import TraceError, TraceModel, load_trace
from analyzer.trace.inputs import (TraceInput, is_trace_file, is_within, latest_run, resolve_inputs, stackless_beside,
                                   trace_stem, walk_traces)
from analyzer.trace.runmeta import RunMeta, read_meta
from analyzer.trace.snapshot import MemorySnapshot, read_snapshot
from analyzer.views.context import AnalysisContext
from analyzer.views.idle import CAUSES

__all__ = [
    "Analysis", "BINS", "CAUSES", "EXACT_LIMIT", "LaneView", "MARKER_LIMIT", "REPORT_SCHEMA", "REQUEST_STATES",
    "RunMeta", "TimelineData", "TimelineView", "Trace", "TraceInput", "analyze", "annotate", "compare", "find",
    "fresh_report", "is_improvement", "is_report_of", "is_trace_file", "is_within", "latest_run", "load",
    "load_model", "mem_unit", "numbered", "packed", "predicted_text", "ranked", "read_meta", "read_report",
    "read_report_listing", "read_report_or_none", "render", "render_diff_markdown", "saving_cell", "timeline",
    "trace_stem", "validity_items", "validity_line", "views", "walk_traces", "what_if_line", "what_if_summary",
    "window_start_us", "write", "write_reports",
]


@dataclasses.dataclass(frozen=True)
class Trace:
    """A loaded trace with its run's metadata, the allocator's snapshot when there is one, and where its reports
    go."""
    source: TraceInput
    model: TraceModel
    meta: RunMeta | None
    snapshot: MemorySnapshot | None = None
    stackless: TraceModel | None = None  # the capture's stackless pass over the same window (views.stackless)
    stackless_error: str | None = None  # why the stackless pass beside the trace could not be read


@dataclasses.dataclass
class Analysis:
    """One trace analyzed: report.json's dictionary, and the context (model and views) it was computed from."""
    trace: Trace
    context: AnalysisContext
    report: dict

    @functools.cached_property
    def files(self) -> dict[str, str]:
        return render(self.report)


def find(path: str | Path, out: str | Path | None = None) -> list[TraceInput]:
    """The traces a path names (a run folder, a trace file, a folder of traces), each with its meta.json and the
    folder its reports go to. Raises UsageError naming the path when it holds none."""
    return resolve_inputs(path, out)


def load_model(path: str | Path, *, cache: bool = True, progress=None) -> TraceModel:
    """The columnar trace model of one trace file; a bad trace is a one-line UsageError."""
    try:
        return load_trace(path, cache=cache, progress=progress)
    except TraceError as exc:
        raise UsageError(str(exc)) from None


def load(item: TraceInput | str | Path, *, cache: bool = True, progress=None, snapshot: str | Path | None = None,
         meta: RunMeta | None = None) -> Trace:
    """One trace, its meta.json (or `meta` already read) and its memory snapshot (`snapshot`, else the one beside
    it). A bad trace or snapshot is a one-line UsageError."""
    if not isinstance(item, TraceInput):
        items = find(item)
        if len(items) != 1:
            raise UsageError(f"{item}: holds {len(items)} traces; name one")
        item = items[0]
    if snapshot is not None:
        item = dataclasses.replace(item, snapshot=Path(snapshot))
    if meta is None and item.meta:
        meta = read_meta(item.meta)
    model = load_model(item.trace, cache=cache, progress=progress)
    try:
        memory = read_snapshot(item.snapshot) if item.snapshot else None
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    path = stackless_beside(item.trace) if meta is not None and meta.get("stackless_pass") else None
    stackless, stackless_error = None, None
    try:  # an aid to the what-if only: a broken one leaves the probed costs, and the report says why
        stackless = load_model(path, cache=cache) if path else None
    except UsageError as exc:
        stackless_error = str(exc)
    return Trace(item, model, meta, memory, stackless, stackless_error)


def analyze(trace: Trace, *, user_code: tuple[str, ...] = (), hta: bool = False) -> Analysis:
    started = time.perf_counter()
    context = AnalysisContext(trace.model, trace.meta, user_code=user_code, snapshot=trace.snapshot,
                              stackless=trace.stackless, stackless_error=trace.stackless_error)
    with np.errstate(all="ignore"):  # absurd values (int64 overflow) must not add numpy's lines to stderr
        report = assemble_report(context, trace.source.trace, started)
    if hta:
        from analyzer.report.hta import run_hta
        report["hta"] = run_hta(trace.source.trace, report)
    return Analysis(trace, context, report)


def render(report: dict) -> dict[str, str]:
    """report.json, report.md and report.html as text."""
    from analyzer.report.files import report_json_text
    from analyzer.report.html import render_html
    from analyzer.report.markdown import render_markdown
    page = render_html(report).replace("<head>", '<head><meta name="generator" content="gpu-idle-analyzer">', 1)
    return {"report.json": report_json_text(report),
            "report.md": "<!-- gpu-idle-analyzer report -->\n" + render_markdown(report), "report.html": page}


def write(analysis: Analysis, out_dir: Path | None = None) -> list[Path]:
    return write_reports(out_dir or analysis.trace.source.out_dir, analysis.files)


def annotate(analysis: Analysis, out_dir: Path | None = None) -> Path:
    """The trace with our diagnosis spliced in (analyzer.report.annotate), beside the reports."""
    from analyzer.report.annotate import annotated_name, annotation_events, write_annotated
    source = analysis.trace.source
    out_dir = Path(out_dir or source.out_dir)
    return write_annotated(source.trace, out_dir / annotated_name(source.trace),
                           annotation_events(analysis.context, analysis.report))


def timeline(analysis: Analysis, report: dict | None = None, *, cache: bool = False) -> TimelineData:
    """The dashboard's lanes of an analyzed trace, from the views its analysis already computed (`report`: a report
    of the same trace read from disk, when the analysis was made only for its context). `cache`: read them from
    beside the trace's columnar cache when they were saved for this trace and report, else build and save them."""
    report = report or analysis.report
    trace = Path(analysis.trace.source.trace)
    saved = load_lanes(trace, report) if cache else None
    data = TimelineData(analysis.context, report, saved)
    if cache and saved is None:
        save_lanes(trace, report, data.built())
    return data


def views(trace: Trace, *, user_code: tuple[str, ...] = ()) -> Analysis:
    """An analysis whose views are computed only as they are asked for (no detectors run): for the timeline of a
    trace whose report is already on disk."""
    return Analysis(trace, AnalysisContext(trace.model, trace.meta, user_code=user_code, snapshot=trace.snapshot,
                                           stackless=trace.stackless, stackless_error=trace.stackless_error), {})
