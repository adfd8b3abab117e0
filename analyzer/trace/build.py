"""Assemble a TraceModel from decoded events: columns, sorting, then the joins."""

from __future__ import annotations

import re
from collections import Counter
from itertools import compress, repeat
from operator import attrgetter
from os import PathLike
from pathlib import Path
from typing import Sequence

import numpy as np

from . import joins
from .columns import StringTable, ThreadIds, exact_ns, int_columns, ints, lost_precision, microseconds, to_ns
from .errors import TraceError
from .model import Frames, Gpu, GpuAnnotations, GpuKind, Memory, Ops, Overhead, Runtime, Steps, TraceModel
from .parse import MISSING, NO_VALUE, decode_exact_ts, decode_trace, trace_text

MODELLED_CATEGORIES = (
    "cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel",
    "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation", "overhead", "cpu_instant_event",
)
CATEGORY_CODE = {cat: code for code, cat in enumerate(MODELLED_CATEGORIES, start=1)}  # 0: not modelled
GPU_KINDS = {"kernel": GpuKind.KERNEL, "gpu_memcpy": GpuKind.MEMCPY, "gpu_memset": GpuKind.MEMSET, "cuda_sync": GpuKind.SYNC}
MEMORY_EVENTS = ("[memory]", "[OutOfMemory]")
STEP_NAME = re.compile(r"^(\w+)#(\d+)$|^prefill$")
# Read together for all slices: one visit per event is cheaper than one pass per field.
_SHARED_INT_FIELDS = ("pid", "tid", "args.external_id", "args.correlation", "args.cbid", "args.nbytes")
_MEMORY_INT_FIELDS = (
    "pid", "tid", "args.alloc_bytes", "args.total_allocated", "args.total_reserved",
    "args.device_type", "args.device_id", "args.addr",
)
_SKIP_REASONS = ("missing or invalid ts", "missing or invalid dur", "negative dur")


def load_trace(path: str | PathLike, *, cache: bool = False) -> TraceModel:
    """Load a Kineto trace (.json or gzipped .json). Raises TraceError for a file that is not one.

    With `cache=True` the columns are reopened from (or saved to) the columnar cache beside the trace.
    """
    path = Path(path)
    if cache and path.is_file():
        from .cache import load_cached, save_cached
        model = load_cached(path)
        if model is None:
            model = parse_trace(path)
            save_cached(path, model)
        return model
    return parse_trace(path)


def parse_trace(path: Path) -> TraceModel:
    with trace_text(path) as text:
        events, metadata, lenient, text, notes = decode_trace(text, path)
        if not events:
            raise TraceError(f"{path}: trace has no events")
        builder = _Builder(events, lenient)
        builder.warnings.update(notes)
        del events
        if builder.lost_precision:
            builder.use_exact_ts(decode_exact_ts(text))
    return builder.model(str(path), metadata)


def _take(events: Sequence, rows: np.ndarray) -> list:
    return [events[i] for i in rows.tolist()]


class _Builder:
    """Reads the columns every slice table shares in one pass per field over all slices in file order.

    Events of one category are scattered through the file (runtime calls sit
    between kernels and flows), so reading them per table misses the CPU cache on
    nearly every row; a pass in file order is several times faster.
    """

    def __init__(self, events: list, lenient: bool) -> None:
        self.lenient = lenient
        self.warnings: Counter[str] = Counter()
        if lenient:
            self.warnings["decoded with lenient types (odd values or unknown categories)"] += 1
        self.strings = StringTable()
        self.threads = ThreadIds()

        categories = np.fromiter(
            map(CATEGORY_CODE.get, map(attrgetter("cat"), events), repeat(0)), dtype=np.int8, count=len(events)
        )
        is_slice = (categories > 0) & (categories != CATEGORY_CODE["cpu_instant_event"])
        self.slice_rows = np.flatnonzero(is_slice)
        self.slices = list(compress(events, is_slice.tolist()))
        self.category = categories[is_slice]
        instant_rows = np.flatnonzero(categories == CATEGORY_CODE["cpu_instant_event"])
        instants = _take(events, instant_rows)
        is_memory = [e.name in MEMORY_EVENTS for e in instants]
        self.memory_rows = instant_rows[np.array(is_memory, dtype=bool)]
        self.memory_events = list(compress(instants, is_memory))

        start_us = microseconds(self.slices, attrgetter("ts"), lenient=lenient)
        memory_us = microseconds(self.memory_events, attrgetter("ts"), lenient=lenient)
        self.lost_precision = lost_precision(start_us) or lost_precision(memory_us)
        self.start, self.has_start = to_ns(start_us)
        self.memory_ts, self.memory_has_ts = to_ns(memory_us)
        self.duration, self.dur_valid = to_ns(microseconds(self.slices, attrgetter("dur"), lenient=lenient))
        self._set_end()
        self.pid, self.tid, self.external_id, self.correlation, self.cbid, self.bytes = self._ints(
            self.slices, _SHARED_INT_FIELDS
        )
        self.name = self.strings.codes(self.slices, attrgetter("name"), lenient=lenient)

    def use_exact_ts(self, ts: list) -> None:
        """Replace ts read through doubles by ts decoded exactly (epoch-based µs with ns digits)."""
        self.start, self.has_start = exact_ns([ts[i] for i in self.slice_rows.tolist()])
        self.memory_ts, self.memory_has_ts = exact_ns([ts[i] for i in self.memory_rows.tolist()])
        self._set_end()

    def _set_end(self) -> None:
        """end = start + dur; a dur whose end would not fit in int64 ns is invalid, not a wrapped-around end."""
        overflow = (self.duration > 0) & (self.start > np.iinfo(np.int64).max - self.duration)
        self.has_duration = self.dur_valid & ~overflow
        self.end = np.where(overflow, self.start, self.start + self.duration)

    def _ints(self, rows: Sequence, fields: Sequence[str], missing: int = MISSING) -> list[np.ndarray]:
        def one_field(field: str) -> np.ndarray:
            if field in ("pid", "tid"):
                return self.threads.column(rows, attrgetter(field), lenient=self.lenient)
            return ints(rows, attrgetter(field), lenient=self.lenient, missing=missing)

        return int_columns(rows, fields, lenient=self.lenient, fallback=one_field)

    def _rows(self, table: str, *categories: str) -> np.ndarray:
        """Indices into self.slices of the table's placeable rows, sorted by (start, longest first)."""
        rows = np.flatnonzero(np.isin(self.category, [CATEGORY_CODE[c] for c in categories]))
        has_start, has_duration = self.has_start[rows], self.has_duration[rows]
        negative = has_duration & (self.duration[rows] < 0)
        for mask, reason in zip((~has_start, has_start & ~has_duration, has_start & negative), _SKIP_REASONS):
            if mask.any():
                self.warnings[f"{table}: {reason}"] += int(mask.sum())
        rows = rows[has_start & has_duration & ~negative]
        end = self.end[rows]
        return rows[np.lexsort((-end, self.start[rows]))]

    def _shared(self, rows: np.ndarray, *columns: str) -> dict[str, np.ndarray]:
        return {column: getattr(self, column.removesuffix("_ns"))[rows] for column in columns}

    def _ops(self) -> dict[str, np.ndarray]:
        rows = self._rows("ops", "cpu_op", "user_annotation")
        columns = self._shared(rows, "start_ns", "end_ns", "pid", "tid", "name", "external_id")
        columns["is_annotation"] = self.category[rows] == CATEGORY_CODE["user_annotation"]
        return columns

    def _frames(self) -> dict[str, np.ndarray]:
        rows = self._rows("frames", "python_function")
        columns = self._shared(rows, "start_ns", "end_ns", "pid", "tid", "name")
        columns["python_id"], columns["parent_python_id"] = self._ints(
            _take(self.slices, rows), ("args.python_id", "args.python_parent_id")
        )
        return columns

    def _runtime(self) -> dict[str, np.ndarray]:
        rows = self._rows("runtime", "cuda_runtime", "cuda_driver")
        columns = self._shared(rows, "start_ns", "end_ns", "pid", "tid", "name", "correlation", "external_id", "cbid")
        columns["is_driver"] = self.category[rows] == CATEGORY_CODE["cuda_driver"]
        return columns

    def _gpu(self) -> dict[str, np.ndarray]:
        rows = self._rows("gpu", *GPU_KINDS)
        columns = self._shared(rows, "start_ns", "end_ns", "pid", "tid", "name", "correlation", "external_id", "bytes")
        columns["device"] = columns.pop("pid")
        # tid is not always the stream: a Context Sync (stream -1) is drawn at tid 1 (or -1), and newer
        # kineto draws a Stream Sync at stream + 1000000. Older kineto writes stream -1 as uint32.
        stream = ints(_take(self.slices, rows), attrgetter("args.stream"), lenient=self.lenient, missing=NO_VALUE)
        stream = np.where(stream == 2**32 - 1, -1, stream)
        columns["stream"] = np.where(stream == NO_VALUE, columns.pop("tid"), stream)
        kind_by_code = np.zeros(len(MODELLED_CATEGORIES) + 1, dtype=np.int8)
        for cat, kind in GPU_KINDS.items():
            kind_by_code[CATEGORY_CODE[cat]] = kind
        columns["kind"] = kind_by_code[self.category[rows]]
        return columns

    def _gpu_annotations(self) -> dict[str, np.ndarray]:
        rows = self._rows("gpu_annotations", "gpu_user_annotation")
        columns = self._shared(rows, "start_ns", "end_ns", "pid", "tid", "name", "external_id")
        columns["device"], columns["stream"] = columns.pop("pid"), columns.pop("tid")
        return columns

    def _overhead(self) -> dict[str, np.ndarray]:
        return self._shared(self._rows("overhead", "overhead"), "start_ns", "end_ns", "name")

    def _memory(self) -> dict[str, np.ndarray]:
        events = self.memory_events
        pid, tid, alloc_bytes, *totals = self._ints(events, _MEMORY_INT_FIELDS, NO_VALUE)
        has_ts, has_bytes = self.memory_has_ts, alloc_bytes != NO_VALUE
        for mask, reason in ((~has_ts, "missing or invalid ts"), (has_ts & ~has_bytes, "missing or invalid Bytes")):
            if mask.any():
                self.warnings[f"memory: {reason}"] += int(mask.sum())
        rows = np.flatnonzero(has_ts & has_bytes)
        rows = rows[np.argsort(self.memory_ts[rows], kind="stable")]
        columns = {"ts_ns": self.memory_ts, "pid": pid, "tid": tid, "bytes": alloc_bytes}
        for column, values in zip(("total_allocated", "total_reserved", "device_type", "device_id", "addr"), totals):
            values[values == NO_VALUE] = MISSING
            columns[column] = values
        columns["is_oom"] = np.array([e.name == "[OutOfMemory]" for e in events], dtype=bool)
        return {column: values[rows] for column, values in columns.items()}

    def model(self, path: str, metadata: dict) -> TraceModel:
        ops, frames, runtime, gpu = self._ops(), self._frames(), self._runtime(), self._gpu()
        memory, gpu_annotations, overhead = self._memory(), self._gpu_annotations(), self._overhead()
        self.slices = self.memory_events = []  # frees the decoded events before the joins
        self._join_threads(ops, frames, runtime, memory)
        self._join_correlations(runtime, gpu)
        names = self.strings.strings()
        steps = self._steps(ops, names)
        del frames["parent_python_id"]
        return TraceModel(
            path=path, metadata=metadata, names=names,
            ops=Ops(**ops), frames=Frames(**frames), runtime=Runtime(**runtime), gpu=Gpu(**gpu),
            gpu_annotations=GpuAnnotations(**gpu_annotations), memory=Memory(**memory),
            overhead=Overhead(**overhead), steps=Steps(**steps),
            warnings=dict(self.warnings), synthetic_ids=self.threads.names(),
        )

    def _join_threads(self, ops: dict, frames: dict, runtime: dict, memory: dict) -> None:
        tables = (ops, frames, runtime, memory)
        ops_key, frames_key, runtime_key, memory_key = joins.thread_keys(
            [t["pid"] for t in tables], [t["tid"] for t in tables]
        )
        op_intervals = joins.Intervals(ops_key, ops["start_ns"], ops["end_ns"], sorted_by_start=True)
        frame_intervals = joins.Intervals(frames_key, frames["start_ns"], frames["end_ns"], sorted_by_start=True)
        ops["parent"] = op_intervals.parents()
        ops["depth"] = joins.depth_from_parent(ops["parent"])
        ops["frame"] = frame_intervals.innermost_enclosing(ops_key, ops["start_ns"], ops["end_ns"])
        runtime["frame"] = frame_intervals.innermost_enclosing(runtime_key, runtime["start_ns"], runtime["end_ns"])

        cpu_rows = np.flatnonzero(~ops["is_annotation"])
        cpu_intervals = joins.Intervals(
            ops_key[cpu_rows], ops["start_ns"][cpu_rows], ops["end_ns"][cpu_rows], sorted_by_start=True
        )
        for table, key, start, end in (
            (runtime, runtime_key, runtime["start_ns"], runtime["end_ns"]),
            (memory, memory_key, memory["ts_ns"], memory["ts_ns"]),
        ):
            inner = cpu_intervals.innermost_enclosing(key, start, end)
            table["op"] = np.where(inner >= 0, cpu_rows[np.maximum(inner, 0)] if len(cpu_rows) else -1, -1)

        frames["parent"] = joins.first_row_with_key(frames["python_id"], frames["parent_python_id"])
        if repeated := joins.repeated_count(frames["python_id"]):
            self.warnings["frames: repeated Python id (parent links use the first)"] += repeated

    def _join_correlations(self, runtime: dict, gpu: dict) -> None:
        runtime["gpu"] = joins.first_row_with_key(gpu["correlation"], runtime["correlation"])
        gpu["launch"] = joins.first_row_with_key(runtime["correlation"], gpu["correlation"])
        if repeated := joins.repeated_count(runtime["correlation"]):
            self.warnings["runtime: repeated correlation id (joins use the earliest)"] += repeated
        # A CUDA/HIP graph launch owns all of its kernels under one correlation id: that is expected, not odd.
        names = self.strings.strings()
        graph_codes = [c for c, n in enumerate(names) if n in ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")]
        launch = gpu["launch"]
        by_graph = (launch >= 0) & np.isin(runtime["name"][np.clip(launch, 0, None)], graph_codes) \
            if len(runtime["name"]) else np.zeros(len(launch), bool)
        if repeated := joins.repeated_count(np.where(by_graph, -1, gpu["correlation"])):
            self.warnings["gpu: rows sharing a correlation id (one launch, several GPU rows)"] += repeated
        if unlaunched := int(((gpu["correlation"] >= 0) & (gpu["launch"] < 0)).sum()):
            self.warnings["gpu: no runtime call with its correlation id"] += unlaunched

    def _steps(self, ops: dict, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        annotation_codes = np.unique(ops["name"][ops["is_annotation"]])
        step_codes = [code for code in annotation_codes.tolist() if STEP_NAME.match(names[code])]
        rows = np.flatnonzero(ops["is_annotation"] & np.isin(ops["name"], step_codes))
        return {"start_ns": ops["start_ns"][rows], "end_ns": ops["end_ns"][rows], "name": ops["name"][rows], "op": rows}
