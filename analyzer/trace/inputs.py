"""What `analyze PATH` accepts: a run folder, a .json / .json.gz trace file, or a folder of traces."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Iterator

from analyzer.errors import UsageError

TRACE_SUFFIXES = (".json", ".json.gz")
NOT_TRACES = {"meta.json", "report.json"}
SNAPSHOT_NAMES = ("memory_snapshot.pickle", "memory_snapshot.pickle.gz")
ANNOTATED = ".annotated."  # analyzer.report.annotate.annotated_name
STACKLESS = ".stackless."  # the capture's stackless pass beside a trace: rank0.trace.json.gz -> rank0.stackless.trace...
REPORT_FOLDER = ".report"  # `analyze TRACE` writes <trace name>.report/ beside a bare trace


@dataclasses.dataclass(frozen=True)
class TraceInput:
    trace: Path
    meta: Path | None  # meta.json beside the trace, written by `capture`
    out_dir: Path  # where report.* go by default
    snapshot: Path | None = None  # the allocator's memory snapshot beside it (capture writes one on CUDA)


def snapshot_beside(folder: Path) -> Path | None:
    return next((folder / n for n in SNAPSHOT_NAMES if (folder / n).is_file()), None)


def is_trace_file(path: Path) -> bool:
    """A trace a folder walk should pick up: not our own reports, not hidden, not the copy `analyze --annotate`
    writes beside its original (it analyses as the original) and not the capture's stackless pass (it times the
    trace beside it); named explicitly, either is still read."""
    name = path.name
    return (path.is_file() and name.endswith(TRACE_SUFFIXES) and name not in NOT_TRACES and not name.startswith(".")
            and ANNOTATED not in name and STACKLESS not in name)


def stackless_beside(trace: Path) -> Path | None:
    """The capture's stackless pass over the same window as `trace` (rank<N>.stackless.trace.json.gz beside
    rank<N>.trace.json.gz), where it is there."""
    name = trace.name
    if STACKLESS in name or not name.endswith(".trace.json.gz"):
        return None
    found = trace.with_name(name[:-len(".trace.json.gz")] + STACKLESS + "trace.json.gz")
    return found if found.is_file() else None


def trace_stem(path: Path) -> str:
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def resolve_inputs(path: str | Path, out: str | Path | None = None) -> list[TraceInput]:
    """Every trace under PATH with its meta.json and default report folder.

    A run folder (or any folder) with one trace writes its reports into the folder; a folder with several traces
    (ranks) writes one sub-folder per trace; a bare trace file writes into a sibling `<trace name>.report/`.
    """
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    if path.is_file():
        if not path.name.endswith(TRACE_SUFFIXES):
            raise UsageError(f"{path}: not a trace file (expected .json or .json.gz)")
        meta = path.parent / "meta.json"
        default_out = path.parent / f"{trace_stem(path)}.report"
        return [TraceInput(path, meta if meta.is_file() else None, Path(out) if out else default_out,
                           snapshot_beside(path.parent))]
    traces = sorted(p for p in path.iterdir() if is_trace_file(p))
    if not traces:
        raise UsageError(f"{path}: no trace files (*.json, *.json.gz) in this folder")
    meta = path / "meta.json"
    meta = meta if meta.is_file() else None
    base = Path(out) if out else path
    if len(traces) == 1:
        return [TraceInput(traces[0], meta, base, snapshot_beside(path))]
    return [TraceInput(t, meta, base / f"{trace_stem(t)}.report") for t in traces]


def is_within(path: Path, root: Path) -> bool:
    """Whether path's real location is under root (root resolved); False for a symlink loop."""
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a symlink loop
        return False


def walk_traces(root: str | Path, *, min_depth: int = 0, max_depth: int | None = None,
                within: Path | None = None) -> Iterator[tuple[Path, list[TraceInput]]]:
    """Each folder under root that holds traces (root itself is depth 0), in path order, with its traces as
    resolve_inputs gives them. Hidden folders and the `.report` folders of bare traces are not entered; with
    `within`, neither is a folder, nor kept a trace, whose real path leaves it (a symlink out of the served tree)."""
    root = Path(root)
    within = within.resolve() if within is not None else None
    for folder, dirs, files in os.walk(root, followlinks=max_depth is not None):  # bounded: links are safe
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not d.endswith(REPORT_FOLDER)
                         and (max_depth is None or depth < max_depth)
                         and (within is None or is_within(here / d, within)))
        if depth < min_depth or not any(is_trace_file(here / f) for f in files):
            continue
        items = [item for item in resolve_inputs(here)
                 if within is None or is_within(item.trace, within)]
        if items:
            yield here, items


def latest_run(folder: str | Path) -> Path:
    """The newest run folder (by modification time) under `folder` that holds a trace."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder of runs")
    runs = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
            and any(is_trace_file(f) for f in p.iterdir())]
    if not runs:
        raise UsageError(f"{folder}: no run folders with a trace (capture one first)")
    return max(runs, key=lambda p: (p.stat().st_mtime, p.name))
