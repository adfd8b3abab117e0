"""The runs under the traces folder: discovery, what the run list shows of each, and reports analyzed once and
cached on disk (report.* in the run folder, else under DIR/.gpu-idle-cache/, else in memory). The one owner of the
run list and of a run's report for the dashboard, the command line and the MCP server.

A client only ever names a run by its id (its folder relative to DIR); paths are looked up from discovery, never
built from what a client sent. Folders or files whose real path leaves DIR (symlinks) are not runs.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import re
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path

from analyzer.api import core as api
from analyzer.api.core import RunMeta, TimelineData, is_within, read_meta, trace_stem, walk_traces
from analyzer.api.lru import SizedLru
from analyzer.errors import UsageError
from analyzer.trace.inputs import REPORT_FOLDER

CACHE_DIR_NAME = ".gpu-idle-cache"
PROBE_FULL_GZIP_BYTES = 16 << 20  # larger gzipped traces are only checked when analyzed
REPORT_CACHE_ENTRIES = 16
DISCOVERY_TTL_S = 1.0
# Parsing a trace takes many times its model's memory for a while: loads wait for each other rather than add up
# (eight tabs opening eight new runs would otherwise hold eight parses at once).
TRACE_LOADS_AT_ONCE = 1
JOB_SCHEMA_PREFIX = '"schema": "gpu-idle-analyzer/job-report/'


@dataclasses.dataclass(frozen=True)
class Run:
    run_id: str  # folder relative to DIR (posix), plus "/<trace stem>" when a folder holds several traces
    trace: Path
    meta: Path | None
    out_dir: Path  # where `analyze` writes this trace's report.*
    snapshot: Path | None = None  # the allocator's memory snapshot beside the trace

    def stamp(self) -> tuple[int, int]:
        st = self.trace.stat()
        return st.st_mtime_ns, st.st_size


@dataclasses.dataclass(frozen=True)
class RunRow:
    """One line of the run list."""
    run: Run
    workload: str
    model: str | None
    device: str | None
    created: str | None  # "2026-12-02 14:52 UTC"
    status: str  # analyzed | not analyzed | queued | analyzing | error
    utilization: float | None = None
    top_finding: str | None = None
    top_severity: str | None = None
    error: str | None = None
    window_us: float | None = None
    busy_us: float | None = None
    idle_by_cause: dict[str, float] = dataclasses.field(default_factory=dict)  # µs per cause, from the report
    other_finding: dict | None = None  # the largest top-level finding that is not launch overhead
    best_saving: dict | None = None  # the top-level finding whose fix saves the most


def _subfolders(folder: Path, root: Path) -> list[Path]:
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p for p in entries if not p.name.startswith(".") and p.is_dir() and is_within(p, root)]


def discover_runs(root: Path) -> list[Run]:
    """Runs under root, in path order: run folders (folders holding a trace file) one and two levels down, and each
    trace file loose in root itself (the layout torch.profiler.tensorboard_trace_handler writes:
    <worker>.<time>.pt.trace.json directly in its folder), named by its file name without .json[.gz]."""
    root = root.resolve()
    runs, seen = [], set()
    for folder, items in walk_traces(root, min_depth=0, max_depth=2, within=root):
        rel = folder.relative_to(root).as_posix()
        for item in items:
            if folder == root:
                run_id, out_dir = trace_stem(item.trace), root / f"{trace_stem(item.trace)}{REPORT_FOLDER}"
            else:
                run_id = rel if len(items) == 1 else f"{rel}/{trace_stem(item.trace)}"
                out_dir = item.out_dir
            meta = item.meta if item.meta and is_within(item.meta, root) else None
            if run_id not in seen:
                seen.add(run_id)
                runs.append(Run(run_id, item.trace, meta, out_dir, item.snapshot))
    return runs


def format_created(created_utc: str | None) -> str | None:
    """'20261202T145205Z' -> '2026-12-02 14:52 UTC'."""
    if not created_utc:
        return None
    try:
        t = datetime.datetime.strptime(created_utc, "%Y%m%dT%H%M%SZ")
    except ValueError:
        return str(created_utc)
    return t.strftime("%Y-%m-%d %H:%M UTC")


_DEVICE_NAME = re.compile(rb'"deviceProperties"\s*:\s*\[\s*\{[^{}]*?"name"\s*:\s*"([^"]{1,120})"')
HEAD_BYTES = 1 << 18


def discover_jobs(root: Path) -> list[str]:
    """Folders one or two levels under root holding a job report (`analyze-many --out`), in path order."""
    root = root.resolve()
    found = []
    for level1 in _subfolders(root, root):
        for folder in [level1, *_subfolders(level1, root)]:
            if _job_report_path(folder) is not None:
                found.append(folder.relative_to(root).as_posix())
    return found


def _job_report_path(folder: Path) -> Path | None:
    path = folder / "report.json"
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return path if JOB_SCHEMA_PREFIX in f.read(4096) else None
    except OSError:
        return None


def trace_device(path: Path) -> str | None:
    """The first GPU's name from the trace's deviceProperties (kineto writes them before the events), read from
    the file's first 256 KiB (decompressed) only: the run list's fallback for a run without meta.json."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEAD_BYTES)
        head = zlib.decompressobj(wbits=31).decompress(raw, HEAD_BYTES) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, zlib.error):
        return None
    m = _DEVICE_NAME.search(head)
    return m.group(1).decode("utf-8", "replace") if m else None


def file_time(path: Path) -> str | None:
    try:
        t = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    except OSError:
        return None
    return t.strftime("%Y-%m-%d %H:%M UTC") + " (file)"


def probe_trace(path: Path) -> bool:
    """Whether the file looks like a whole JSON document, without parsing it: a gzip stream that ends properly
    (decompressed in full up to PROBE_FULL_GZIP_BYTES), or text that starts with { or [ and ends with } or ]."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(2)
            if head == b"\x1f\x8b":
                if size > PROBE_FULL_GZIP_BYTES:
                    return True
                f.seek(0)
                return _gzip_is_whole_json(f)
            f.seek(0)
            first = f.read(4096).lstrip()[:1]
            f.seek(max(0, size - 4096))
            last = f.read().rstrip()[-1:]
    except OSError:
        return False
    return first in (b"{", b"[") and last in (b"}", b"]")


def _gzip_is_whole_json(f) -> bool:
    inflate = zlib.decompressobj(wbits=31)
    first, last = b"", b""
    try:
        while chunk := f.read(1 << 20):
            out = inflate.decompress(chunk)
            if not first and out.strip():
                first = out.lstrip()[:1]
            if out.strip():
                last = out.rstrip()[-1:]
            if inflate.eof:
                break
    except zlib.error:
        return False
    return inflate.eof and first in (b"{", b"[") and last in (b"}", b"]")


class RunStore:
    """Everything the pages ask about runs, by run id. Safe to share between threads (browser tabs)."""

    def __init__(self, traces_dir: Path, timeline_cache_bytes: int = 1 << 30, *, writes: bool = True):
        """writes=False: nothing is written under the traces root (no report.*, no columnar or lanes cache): a
        report analyzed here stays in memory, one that `analyze` wrote beside its trace is still read back."""
        self.root = Path(traces_dir).resolve()
        self.writes = writes
        self.cache_root = self.root / CACHE_DIR_NAME
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}
        self._loads = threading.BoundedSemaphore(TRACE_LOADS_AT_ONCE)  # taken after a run lock, never before
        self._reports: OrderedDict[tuple, dict] = OrderedDict()
        self._memory_texts: dict[tuple, dict[str, str]] = {}  # reports that no folder would take
        self._errors: dict[tuple, str] = {}
        self._probes: dict[tuple, str | None] = {}
        self._metas: dict[tuple, RunMeta | None] = {}
        self._summaries: dict[tuple, dict] = {}
        self._discovery: list[Run] = []
        self._discovered_at = -1e9
        self.timelines = SizedLru(timeline_cache_bytes, TimelineData.nbytes)
        # runs the run list asked to have analyzed, one at a time, behind whatever a page asks for
        self._background = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="analyze")
        self._queued: dict[str, str] = {}  # run id -> "queued" | "analyzing"

    def analyze_in_background(self, runs: list[Run]) -> None:
        """Queue the runs with no report yet; RunRow.status says "queued" / "analyzing" until each is done."""
        for run in runs:
            with self._lock:
                if run.run_id in self._queued:
                    continue
            if self._cached_summary(run) is not None or self.known_error(run):
                continue
            with self._lock:
                self._queued[run.run_id] = "queued"
            self._background.submit(self._analyze_queued, run)

    def _analyze_queued(self, run: Run) -> None:
        with self._lock:
            self._queued[run.run_id] = "analyzing"
        try:
            self.report(run)
        except UsageError:
            pass  # recorded in _errors: the row shows it
        finally:
            with self._lock:
                self._queued.pop(run.run_id, None)

    def pending(self) -> int:
        with self._lock:
            return len(self._queued)

    # ------------------------------------------------------------ discovery

    def _discovered(self) -> list[Run]:
        """discover_runs, at most once a second (every callback looks its run up by id)."""
        with self._lock:
            if time.monotonic() - self._discovered_at > DISCOVERY_TTL_S:
                self._discovery = discover_runs(self.root)
                self._discovered_at = time.monotonic()
            return self._discovery

    def runs(self) -> list[Run]:
        """Newest first (meta.json's created_utc, else the trace's modification time)."""
        def newest(run: Run) -> str:
            meta = self._meta_or_none(run)
            created = meta.get("created_utc") if meta else None
            if isinstance(created, str) and created:
                return created
            return datetime.datetime.fromtimestamp(run.trace.stat().st_mtime, datetime.UTC).strftime(
                "%Y%m%dT%H%M%SZ")
        return sorted(self._discovered(), key=lambda r: (newest(r), r.run_id), reverse=True)

    def find(self, run_id: str | None) -> Run | None:
        if not run_id:
            return None
        return next((r for r in self._discovered() if r.run_id == run_id), None)

    def _run_lock(self, run_id: str) -> threading.Lock:
        with self._lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    # ------------------------------------------------------------ meta and the run list

    def meta(self, run: Run) -> RunMeta | None:
        """meta.json, or None; raises UsageError when it is not readable JSON."""
        if run.meta is None:
            return None
        key = (str(run.meta), run.meta.stat().st_mtime_ns)
        if key not in self._metas:
            self._metas[key] = read_meta(run.meta)
        return self._metas[key]

    def _meta_or_none(self, run: Run) -> RunMeta | None:
        try:
            return self.meta(run)
        except (UsageError, OSError):
            return None

    def row(self, run: Run) -> RunRow:
        meta_error = None
        try:
            meta = self.meta(run)
        except UsageError as exc:
            meta, meta_error = None, str(exc)
        workload = Path(meta.get("workload_file") or "").stem if meta and meta.get("workload_file") else None
        workload = workload or (meta.get("workload", "name") or meta.get("workload", "script") if meta else None)
        model = meta.get("model", "preset") or meta.get("model", "checkpoint") if meta else None
        device = meta.get("environment", "gpu_name") or meta.get("environment", "device") if meta else None
        base = dict(run=run, workload=workload or run.trace.name, model=model,
                    device=device or (trace_device(run.trace) if not meta else None),
                    created=format_created(meta.get("created_utc")) if meta else file_time(run.trace))
        if meta_error:
            return RunRow(**base, status="error", error=meta_error)
        summary = self._cached_summary(run)  # a fresh report: the trace read whole once, no probe needed
        error = self.known_error(run) if summary is None else None
        if error:
            return RunRow(**base, status="error", error=error)
        if summary is None:
            with self._lock:
                status = self._queued.get(run.run_id, "not analyzed")
            return RunRow(**base, status=status)
        summary = dict(summary)
        gpus = summary.pop("gpus", None)
        base["device"] = base["device"] or (gpus[0] if gpus else None)  # deviceProperties may sit past the head
        return RunRow(**base, status="analyzed", **summary)

    def rows(self) -> list[RunRow]:
        return [self.row(run) for run in self.runs()]

    def known_error(self, run: Run) -> str | None:
        """The one-line error of a trace that failed to analyze, or that the cheap probe finds broken."""
        key = (run.run_id, run.stamp())
        if key in self._errors:
            return self._errors[key]
        if key not in self._probes:
            self._probes[key] = None if probe_trace(run.trace) else self._load_error(run)
        return self._probes[key]

    @staticmethod
    def _load_error(run: Run) -> str | None:
        """The loader's own message for a trace the probe doubts (it fails fast on those)."""
        try:
            api.load_model(run.trace, cache=False)
        except UsageError as exc:
            return str(exc)
        return None

    def _cached_summary(self, run: Run) -> dict | None:
        path = self._cached_report_path(run)
        if path is None:
            report = self._reports.get((run.run_id, run.stamp()))
            return _summary_of(report) if report else None
        key = (str(path), path.stat().st_mtime_ns)
        if key not in self._summaries:
            report = api.read_report_listing(path)
            self._summaries[key] = _summary_of(report) if report else None
        return self._summaries[key]

    # ------------------------------------------------------------ reports

    def _report_dirs(self, run: Run) -> list[Path]:
        return [run.out_dir, self.cache_root / run.run_id]

    def _cached_report_path(self, run: Run) -> Path | None:
        """Our report.json of this trace as it is now, in the run folder or the cache folder."""
        for folder in self._report_dirs(run):
            path = folder / "report.json"
            try:
                if path.is_file() and is_within(path, self.root) and api.is_report_of(path, run.trace):
                    return path
            except OSError:
                continue
        return None

    def cached_report(self, run: Run) -> dict | None:
        key = (run.run_id, run.stamp())
        with self._lock:
            if key in self._reports:
                self._reports.move_to_end(key)
                return self._reports[key]
        path = self._cached_report_path(run)
        report = api.read_report_or_none(path) if path else None
        if report is not None:
            self._remember(key, report)
        return report

    def report(self, run: Run) -> dict:
        """The run's report, analyzing the trace on first use. Raises UsageError with the one-line reason."""
        report = self.cached_report(run)
        if report is not None:
            return report
        with self._run_lock(run.run_id):  # two tabs opening the same new run analyze it once
            report = self.cached_report(run)
            if report is None:
                with self._loads:
                    report = self._analyze(run)
        return report

    def _analyze(self, run: Run) -> dict:
        key = (run.run_id, run.stamp())
        try:
            analysis = api.analyze(self._trace(run))
        except UsageError as exc:
            self._errors[key] = str(exc)
            raise
        texts = analysis.files
        if not self._persist(run, texts):
            self._memory_texts[key] = {k: v for k, v in texts.items() if k != "report.json"}
        self._remember(key, analysis.report)
        self.timelines.put(key, api.timeline(analysis))  # the analysis's views, not computed again
        return analysis.report

    def _trace(self, run: Run) -> api.Trace:
        return api.load(api.TraceInput(run.trace, run.meta, run.out_dir, run.snapshot), cache=self.writes,
                        meta=self.meta(run))

    def _persist(self, run: Run, texts: dict[str, str]) -> bool:
        if not self.writes:
            texts.pop("report.html", None)  # kept in memory: report.md only (5 MB of plotly per run otherwise)
            return False
        for folder in self._report_dirs(run):
            try:
                api.write_reports(folder, texts)
                return True
            except (OSError, UsageError):
                continue
        return False

    def _remember(self, key: tuple, report: dict) -> None:
        with self._lock:
            self._reports[key] = report
            self._reports.move_to_end(key)
            while len(self._reports) > REPORT_CACHE_ENTRIES:
                self._reports.popitem(last=False)

    def report_text(self, run: Run, name: str) -> str:
        """report.md or report.html, analyzing first when needed."""
        self.report(run)
        path = self._cached_report_path(run)
        if path is not None and (path.parent / name).is_file():
            return (path.parent / name).read_text(encoding="utf-8")
        texts = self._memory_texts.get((run.run_id, run.stamp()))
        if texts is None:  # analyzed by an earlier process into a folder we can no longer read: render again
            texts = api.render(self.report(run))
        return texts[name]

    # ------------------------------------------------------------ timeline

    def jobs(self) -> list[str]:
        return discover_jobs(self.root)

    def job_report(self, folder: str) -> dict | None:
        """The job report.json `analyze-many` wrote into DIR/<folder> (one of jobs()), else None."""
        if folder not in self.jobs():
            return None
        report = None
        try:
            report = json.loads((self.root / folder / "report.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            pass
        return report if isinstance(report, dict) else None

    def job_report_text(self, folder: str, name: str) -> str:
        if folder not in self.jobs() or name not in ("report.md", "report.html"):
            raise UsageError(f"no job report {name} in {folder!r}")
        try:
            return (self.root / folder / name).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{self.root / folder / name}: {exc.strerror or exc}") from None

    def runs_by_trace(self) -> dict[str, str]:
        """Run id of each discovered trace, by its resolved path (a job report names its ranks' traces)."""
        return {str(run.trace.resolve()): run.run_id for run in self.runs()}

    def cache_stats(self) -> dict:
        """What the memory caches hold (GET /_cache): the timeline LRU against its byte limit, and reports."""
        lru = self.timelines
        return {"timelines": {"entries": len(lru), "bytes": lru.total_bytes, "peak_bytes": lru.peak_bytes,
                              "limit_bytes": lru.max_bytes},
                "reports": len(self._reports)}

    def timeline(self, run: Run):
        """The run's TimelineData (trace model, GPU timeline and gap causes), from the LRU or loaded now."""
        key = (run.run_id, run.stamp())
        data = self.timelines.get(key)
        if data is not None:
            return data
        report = self.report(run)
        with self._run_lock(run.run_id):
            data = self.timelines.get(key)
            if data is None:
                with self._loads:  # the report is on disk: the views the lanes read, no detectors
                    data = api.timeline(api.views(self._trace(run)), report, cache=self.writes)
                self.timelines.put(key, data)
        return data


LAUNCH_KINDS = ("launch_gap",)  # the finding nearly every eager run has: the run list looks past it


def _summary_of(report: dict) -> dict:
    """What the run list shows of a report: utilization, the window split into busy and idle by cause, the top
    finding, and the largest top-level finding of another kind (what tells launch-bound runs apart)."""
    findings = report.get("findings") or []
    summary = report.get("summary") or {}
    top = findings[0] if findings else None
    others = [f for f in findings if not f.get("parent") and f.get("kind") not in LAUNCH_KINDS]
    other = max(others, key=lambda f: f.get("impact_us") or 0, default=None)  # ties: the report's own order
    return {"utilization": summary.get("gpu_utilization"),
            "top_finding": top["title"] if top else None, "top_severity": top["severity"] if top else None,
            "window_us": summary.get("window_us"), "busy_us": summary.get("gpu_busy_us"),
            "idle_by_cause": {c: float(v) for c, v in ((report.get("gaps") or {}).get("by_cause") or {}).items()
                              if v},
            "other_finding": {k: other.get(k) for k in ("id", "kind", "title", "severity", "impact_us")}
            if other else None, "best_saving": _best_saving(findings),
            "gpus": [g for g in (report.get("trace") or {}).get("gpus") or [] if isinstance(g, str)]}


def _best_saving(findings: list[dict]) -> dict | None:
    """The top-level finding whose fix saves the most (report.json what_if), for the run list."""
    priced = [f for f in findings if not f.get("parent") and (f.get("what_if") or {}).get("saving_ms") is not None]
    best = max(priced, key=lambda f: f["what_if"]["saving_ms"], default=None)
    if best is None:
        return None
    return {"id": best.get("id"), "kind": best.get("kind"), "title": best.get("title"),
            "severity": best.get("severity"), "saving_ms": best["what_if"]["saving_ms"],
            "saving_share": best["what_if"].get("saving_share"), "measure": best["what_if"].get("measure")}
