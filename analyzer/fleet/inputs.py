"""What `analyze-many PATH...` accepts, expanded into one `FleetInput` per trace: run folders, trace files, folders
holding run folders (walked), and globs. Each input gets its job, a rank and world size guessed from the file name
and folder (the trace's own `distributedInfo` wins once it is loaded), its size, and its content key."""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from pathlib import Path

from analyzer import api
from analyzer.errors import UsageError
from analyzer.trace.cache import fingerprint

RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)
GLOB_CHARS = re.compile(r"[*?\[]")


@dataclasses.dataclass(frozen=True)
class FleetInput:
    source: str  # the path as given (a folder given: the trace's path under it)
    trace: api.TraceInput
    job: str
    rank_hint: int | None  # from `rank<N>` in the file name
    world_hint: int | None  # rank files in the trace's folder
    size: int  # bytes on disk
    content_key: str


def content_key(path: Path) -> str:
    """The columnar cache's key of the trace (analyzer/trace/cache.py: size, mtime in ns and a SHA-1 of its first and
    last 64 KiB, with the cache's format number), hashed to 20 hex digits. A copy with a new mtime is a new key."""
    return hashlib.sha1(json.dumps(fingerprint(path), sort_keys=True).encode()).hexdigest()[:20]


def expand(paths: list[str], job: str | None = None) -> list[FleetInput]:
    """Every trace the paths name, each once (by resolved path), in the order given. UsageError for a path that
    does not exist, a glob that matches nothing, or no traces at all."""
    found: dict[Path, tuple[str, api.TraceInput]] = {}
    for given in paths:
        for source, item in _traces_of(given):
            found.setdefault(item.trace.resolve(), (source, item))
    if not found:
        raise UsageError(f"{' '.join(paths)}: no traces found (*.json, *.json.gz)")
    folders: dict[Path, list[str]] = {}  # folder -> the names of its traces, listed once
    out = []
    for source, item in found.values():
        folder = item.trace.parent
        if folder not in folders:
            folders[folder] = [p.name for p in folder.iterdir() if api.is_trace_file(p)]
        m = RANK_IN_NAME.search(item.trace.name)
        rank_files = sum(1 for name in folders[folder] if RANK_IN_NAME.search(name))
        out.append(FleetInput(source=source, trace=item, job=job or _job_name(item, len(folders[folder])),
                              rank_hint=int(m.group(1)) if m else None, world_hint=rank_files or None,
                              size=item.trace.stat().st_size, content_key=content_key(item.trace)))
    return out


def _traces_of(given: str) -> list[tuple[str, api.TraceInput]]:
    path = Path(given)
    if not path.exists() and GLOB_CHARS.search(given):
        matches = sorted(glob.glob(given, recursive=True))
        if not matches:
            raise UsageError(f"{given}: matches nothing")
        return [t for m in matches for t in _traces_of(m)]
    if not path.exists():
        raise UsageError(f"{given}: no such file or folder")
    if path.is_file():
        return [(given, item) for item in api.find(path)]
    return [(os.path.join(given, os.path.relpath(item.trace, path)), item)
            for _, items in api.walk_traces(path) for item in items]


def _job_name(item: api.TraceInput, traces_in_folder: int) -> str:
    """The run folder's name for a rank file, a run's trace (meta.json beside it) or a folder's only trace; else
    (a folder of unrelated traces) the trace's own name."""
    if RANK_IN_NAME.search(item.trace.name) or item.meta or traces_in_folder == 1:
        return item.trace.parent.resolve().name
    return api.trace_stem(item.trace)


def rank_of(item: FleetInput, metadata: dict | None) -> tuple[int, int | None]:
    """(rank, world size): the trace's `distributedInfo`, else `rank<N>` in its name (else 0) and the number of rank
    files beside it."""
    info = (metadata or {}).get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank, world = info.get("rank"), info.get("world_size")
    rank = rank if isinstance(rank, int) and rank >= 0 else (item.rank_hint or 0)
    world = world if isinstance(world, int) and world > 0 else item.world_hint
    return rank, world


def uncompressed_size(path: Path, size: int) -> int:
    """A gzip file's uncompressed size from its trailer (modulo 4 GiB, so never below the compressed size)."""
    if not path.name.endswith(".gz") or size < 18:
        return size
    with path.open("rb") as f:
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    while isize < size:
        isize += 1 << 32
    return isize
