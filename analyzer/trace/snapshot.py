"""The caching allocator's own records: a `torch.cuda.memory._snapshot()` pickle (memory_snapshot.pickle, written
by `capture`, or a user's own; gzip accepted), read into plain tables.

A snapshot holds the allocator's segments at the moment it was taken (each split into blocks, with the Python
stack that allocated each block) and, when history was recorded, every action before it per device: alloc,
free_requested, free_completed, segment_alloc (a cudaMalloc), segment_free (a cudaFree), segment_map/unmap
(expandable segments), oom, snapshot; each with its address, size, stream, stack and `time_us` (Unix epoch µs).

Unpickling runs code named in the file, so the reader admits no class or function at all: a snapshot is built from
dicts, lists, tuples, strings and numbers only, and anything else is refused as not a snapshot.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import pickle
from pathlib import Path

import numpy as np

from .errors import TraceError

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot")
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, OOM, SNAPSHOT = \
    range(len(ACTIONS))
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")  # as torch writes them


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refers to {module}.{name}")


@dataclasses.dataclass(frozen=True)
class Entries:
    """The recorded actions of every device, in recording order per device."""
    device: np.ndarray
    action: np.ndarray  # int8 code into ACTIONS
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    time_ns: np.ndarray  # Unix epoch ns (time_us * 1000); -1 where absent
    stack: np.ndarray  # index into MemorySnapshot.stacks, -1 none

    def __len__(self) -> int:
        return len(self.action)


@dataclasses.dataclass(frozen=True)
class Block:
    address: int
    size: int
    requested_size: int
    state: str
    stack: int


@dataclasses.dataclass(frozen=True)
class Segment:
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    stream: int
    segment_type: str
    expandable: bool
    blocks: tuple[Block, ...]


@dataclasses.dataclass(frozen=True)
class MemorySnapshot:
    path: str
    segments: tuple[Segment, ...]  # the allocator's state when the snapshot was taken
    entries: Entries
    stacks: tuple[tuple[tuple[str, int, str], ...], ...]  # (filename, line, function) innermost first
    settings: dict

    @property
    def has_history(self) -> bool:
        return len(self.entries) > 0


def read_snapshot(path: str | Path) -> MemorySnapshot:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the memory snapshot ({exc.strerror or exc})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceError(f"{path}: corrupt gzip data ({exc})") from None
    try:
        data = _DataOnly(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError) as exc:
        raise TraceError(f"{path}: not a torch.cuda.memory._snapshot() pickle ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise TraceError(f"{path}: not a memory snapshot: no 'segments' list")
    traces = data.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise TraceError(f"{path}: not a memory snapshot: 'device_traces' is not a list per device")
    stacks = _Stacks()
    try:
        segments = tuple(_segment(s, stacks) for s in data["segments"])
        entries = _entries(traces, stacks)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{path}: malformed memory snapshot ({exc.__class__.__name__}: {exc})") from None
    settings = data.get("allocator_settings") if isinstance(data.get("allocator_settings"), dict) else {}
    return MemorySnapshot(str(path), segments, entries, tuple(stacks.rows), settings)


class _Stacks:
    """Stacks deduplicated: one id per distinct (filename, line, function) sequence."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self.rows: list[tuple] = []

    def id(self, frames) -> int:
        if not frames:
            return -1
        key = tuple((str(f.get("filename", "")), int(f.get("line", 0)), str(f.get("name", ""))) for f in frames
                    if isinstance(f, dict))
        if key not in self.ids:
            self.ids[key] = len(self.rows)
            self.rows.append(key)
        return self.ids[key]


def _segment(s: dict, stacks: _Stacks) -> Segment:
    blocks = tuple(Block(int(b["address"]), int(b["size"]), int(b.get("requested_size", b["size"])),
                         str(b.get("state", "")), stacks.id(b.get("frames"))) for b in s.get("blocks", []))
    return Segment(int(s.get("device", 0)), int(s["address"]), int(s["total_size"]), int(s.get("allocated_size", 0)),
                   int(s.get("active_size", 0)), int(s.get("stream", 0)), str(s.get("segment_type", "")),
                   bool(s.get("is_expandable", False)), blocks)


def _entries(traces: list, stacks: _Stacks) -> Entries:
    code = {name: i for i, name in enumerate(ACTIONS)}
    cols: dict[str, list] = {k: [] for k in ("device", "action", "addr", "size", "stream", "time_ns", "stack")}
    for device, trace in enumerate(traces):
        for e in trace:
            action = code.get(e.get("action"))
            if action is None:
                continue
            cols["device"].append(device)
            cols["action"].append(action)
            cols["addr"].append(int(e.get("addr", -1)))
            cols["size"].append(int(e.get("size", 0)))
            cols["stream"].append(int(e.get("stream", 0)))
            t = e.get("time_us")
            cols["time_ns"].append(int(t) * 1000 if isinstance(t, (int, float)) else -1)
            cols["stack"].append(stacks.id(e.get("frames")))
    return Entries(np.asarray(cols["device"], np.int32), np.asarray(cols["action"], np.int8),
                   np.asarray(cols["addr"], np.int64), np.asarray(cols["size"], np.int64),
                   np.asarray(cols["stream"], np.int64), np.asarray(cols["time_ns"], np.int64),
                   np.asarray(cols["stack"], np.int64))
