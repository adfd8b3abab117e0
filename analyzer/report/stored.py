"""report.json files on disk, read in one place (the CLI's diff / check, the dashboard): read one, checked against
report.json's typed core (analyzer.report.schema), and tell whether it is the report of a trace as that trace is
now.

A report records its trace's content key (source.trace_key): the size and a SHA-1 of the first and last 64 KiB, the
fingerprint the columnar cache is keyed by, less the modification time, so a run folder that was copied or cloned
keeps its reports, and a trace rewritten in place (even within the same second) does not.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Iterable

import msgspec

from analyzer.errors import UsageError
from analyzer.report.schema import SCHEMA_PREFIX, Source, check
from analyzer.trace.cache import fingerprint


class _SourceOnly(msgspec.Struct):
    source: Source


def _by_stat(path: Path, read):
    """read(path, mtime, size), memoized by those: a run list asks for each trace and report on every poll."""
    try:
        st = path.stat()
    except OSError:
        return None
    return read(str(path), st.st_mtime_ns, st.st_size)


def trace_key(trace: Path) -> dict | None:
    """The trace's content key (None when it cannot be read)."""
    return _by_stat(trace, _key)


@functools.lru_cache(maxsize=4096)
def _key(path: str, mtime_ns: int, size: int) -> dict | None:
    try:
        key = fingerprint(Path(path))
    except OSError:
        return None
    return {k: key[k] for k in ("format", "size", "probe_sha1")}


def _decode(data: bytes):
    try:  # msgspec's decoder: a 2 MB report in a quarter of json's time
        return msgspec.json.decode(data)
    except msgspec.DecodeError:  # NaN is not JSON, but json.dumps writes it
        return json.loads(data.decode("utf-8"))


def read_report(path: str | Path) -> dict:
    """A report.json as its dictionary; a UsageError naming the file (and the key) when it is not readable or not
    ours."""
    path = Path(path)
    try:
        report = _decode(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable report.json ({exc})") from None
    problem = check(report)
    if problem:
        raise UsageError(f"{path}: {problem}")
    return report


class _ListedWhatIf(msgspec.Struct):
    saving_ms: float | None = None
    saving_share: float | None = None
    measure: str | None = None


class _ListedFinding(msgspec.Struct):
    id: str
    kind: str
    title: str
    severity: str
    impact_us: float
    parent: str | None = None
    what_if: _ListedWhatIf | None = None


class _ListedSummary(msgspec.Struct):
    gpu_utilization: float | None = None
    window_us: float | None = None
    gpu_busy_us: float | None = None


class _ListedGaps(msgspec.Struct):
    by_cause: dict[str, float] = {}


class _ListedTrace(msgspec.Struct):
    gpus: list[str | None] = []


class _Listed(msgspec.Struct):
    """What a run list shows of a report: decoded without building the rest of its tree (a 250 KB report in a
    fifth of the time)."""
    schema: str
    summary: _ListedSummary
    gaps: _ListedGaps
    findings: list[_ListedFinding]
    trace: _ListedTrace = msgspec.field(default_factory=_ListedTrace)


def read_report_listing(path: Path) -> dict | None:
    """The parts of a report.json a run list shows (summary, idle by cause, the findings' names, sizes and
    savings) as a dictionary of report.json's shape; None where it is not one of our reports."""
    try:
        listed = msgspec.json.decode(Path(path).read_bytes(), type=_Listed)
    except OSError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError):  # NaN, or not ours: the full reader decides
        return read_report_or_none(path)
    if not listed.schema.startswith(SCHEMA_PREFIX):
        return None
    return msgspec.to_builtins(listed)


def read_report_or_none(path: Path) -> dict | None:
    try:
        return read_report(path)
    except UsageError:
        return None


def recorded_key(report_path: Path) -> dict | None:
    """source.trace_key of a report.json, without building its whole tree (None: not ours, or from before keys)."""
    return _by_stat(report_path, _recorded_key)


@functools.lru_cache(maxsize=4096)
def _recorded_key(path: str, mtime_ns: int, size: int) -> dict | None:
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=_SourceOnly).source.trace_key
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def is_report_of(report_path: Path, trace: Path) -> bool:
    """Whether report_path is our report of `trace` as it is now (same content key)."""
    key = recorded_key(report_path)
    return key is not None and key == trace_key(trace)


def fresh_report(trace: Path, folders: Iterable[Path]) -> Path | None:
    """The first report.json in `folders` that is the report of `trace` as it is now."""
    for folder in folders:
        path = Path(folder) / "report.json"
        if path.is_file() and is_report_of(path, trace):
            return path
    return None
