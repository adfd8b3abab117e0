"""Assemble a TraceModel from decoded events: columns, sorting, then the joins."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import mmap
import re
from collections import Counter
from itertools import compress
from operator import attrgetter
from os import PathLike
from pathlib import Path
from typing import Callable, Sequence

import msgspec
import numpy as np

from analyzer.arrays import distinct
from . import joins
from .columns import Codes, StringTable, ThreadIds, exact_ns, ints, lost_precision, microseconds, to_ns
from .commargs import COMM_OP, comm_op_args
from .errors import TraceError
from .model import Frames, Gpu, GpuAnnotations, GpuKind, Memory, Ops, Overhead, Runtime, Steps, TraceModel
from .helper import NOT_CHUNKABLE, Helper, available_cpus, can_fork
from .parse import (
    LEGACY_NOTE, MISSING, NO_VALUE, EventArray, NotChunkable, adopt_legacy_events, canonical_category, chunk_json,
    decode_exact_ts, decode_trace, decoded_chunks, find_event_array, foreign_device, split_after, trace_text,
)

MODELLED_CATEGORIES = (
    "cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel",
    "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation", "overhead", "cpu_instant_event", "trace",
)
CATEGORY_CODE = {cat: code for code, cat in enumerate(MODELLED_CATEGORIES, start=1)}  # 0: not modelled
# Older kineto (torch 1.8/1.9) filed record_function ranges, ProfilerStep#N included, as "Operator" like ops: such
# an event is an annotation when its name is a step's, an op otherwise (as TensorBoard's profiler plugin did).
LEGACY_OPERATOR = len(MODELLED_CATEGORIES) + 1
_MAX_FOREIGN = 127
OTHER_FOREIGN = "(other categories of unsupported devices)"


class _CategoryCodes(dict):
    """Category as written in the trace -> code: > 0 a modelled category (matched case-insensitively, older names
    mapped), < 0 activity of a device that is neither CUDA nor HIP (-1 - index into `foreign`), 0 the rest."""

    def __init__(self) -> None:
        super().__init__()
        self[None] = 0  # the lenient decoder's events without a (string) category
        self.foreign: list[str] = []

    def __missing__(self, cat) -> int:
        if type(cat) is not str:
            return 0
        canonical = canonical_category(cat)
        code = CATEGORY_CODE.get(canonical, 0)
        if canonical == "cpu_op" and cat.strip().lower() == "operator":
            code = LEGACY_OPERATOR
        if not code and foreign_device(canonical):
            if canonical not in self.foreign and len(self.foreign) < _MAX_FOREIGN:
                self.foreign.append(canonical)
            code = -1 - (self.foreign.index(canonical) if canonical in self.foreign else _MAX_FOREIGN)
        if len(self) < 100_000:  # a file with ever new categories must not grow this without bound
            self[cat] = code
        return code

    def foreign_name(self, code: int) -> str:
        return self.foreign[-1 - code] if -1 - code < len(self.foreign) else OTHER_FOREIGN


CATEGORY_CODES = _CategoryCodes()
GPU_KINDS = {"kernel": GpuKind.KERNEL, "gpu_memcpy": GpuKind.MEMCPY, "gpu_memset": GpuKind.MEMSET, "cuda_sync": GpuKind.SYNC}
MEMORY_EVENTS = ("[memory]", "[OutOfMemory]")
# "<label>#<n>": a label of any characters but "#"; and serving engines' own step annotations (analyzer.views.steps)
STEP_NAME = re.compile(r"^(\S[^#]*)#(\d+)$|^prefill$"
                       r"|^execute_(?:\d+_)?context_\d+\(.*\)_generation_\d+\(.*\)$|^execute_new_\d+_cached_\d+$"
                       r"|^step\[[A-Z_]+(?: [^\]]*)?\]$|^(?:prefill|decode)\[bs=[^\]]*\]$")
_MEMORY_ARGS = ("alloc_bytes", "total_allocated", "total_reserved", "device_type", "device_id", "addr")
# Args fields by the categories whose tables use them -> the slice column that holds them.
_ARGS_BY_CATEGORY = tuple(
    ([CATEGORY_CODE[c] for c in categories], fields) for categories, fields in (
        (("cpu_op", "user_annotation", "gpu_user_annotation"), ("external_id",)),
        (("cuda_runtime", "cuda_driver"), ("external_id", "correlation", "cbid")),
        (tuple(GPU_KINDS), ("external_id", "correlation", "nbytes", "stream")),
        (("python_function",), ("python_id", "python_parent_id")),
    )
)
_JSON_BLANKS = b" \t\r\n"
_SHAPES_GROUP = 0  # the ops' group: their Input Dims' texts follow the names in the model's string table
_ARGS_GROUP_OF_CATEGORY = np.full(LEGACY_OPERATOR + 1, -1, dtype=np.int8)
for _group, (_codes, _) in enumerate(_ARGS_BY_CATEGORY):
    _ARGS_GROUP_OF_CATEGORY[_codes] = _group
_ARGS_COLUMNS = {field: field for field in ("external_id", "correlation", "cbid", "python_id", "python_parent_id")}
_ARGS_COLUMNS["nbytes"] = "bytes"
_ARGS_COLUMNS["stream"] = "stream"
_ARGS_MISSING = {"stream": NO_VALUE}  # -1 is a real stream (a Context Sync's)
_ARGS_KEYS = {"external_id": "External id", "correlation": "correlation", "cbid": "cbid", "python_id": "Python id",
              "python_parent_id": "Python parent id", "nbytes": "bytes", "total_allocated": "Total Allocated",
              "total_reserved": "Total Reserved", "device_type": "Device Type", "device_id": "Device Id",
              "addr": "Addr", "stream": "stream"}
_THREAD_COLUMNS = ("pid", "tid", "memory_pid", "memory_tid")
_ARGS_ROWS = re.compile(r"args\d+_rows")
_MEMORY_COLUMNS = tuple(f"memory_{field}" for field in ("pid", "tid", *_MEMORY_ARGS))
_SKIP_REASONS = ("missing or invalid ts", "missing or invalid dur", "negative dur")
NOTE_LAUNCHED_BEFORE_WINDOW = ("gpu: rows launched before the profiling window began (correlation id below every "
                               "recorded runtime call's)")
WARNING_LAUNCH_MISSING = ("gpu: rows launched inside the profiling window with no runtime call of their "
                          "correlation id in the trace")
Progress = Callable[[int, int], None]


def load_trace(path: str | PathLike, *, cache: bool = False, progress: Progress | None = None) -> TraceModel:
    """Load a Kineto trace (.json or gzipped .json). Raises TraceError for a file that is not one.

    With `cache=True` the columns are reopened from (or saved to) the columnar cache beside the trace.
    `progress(done, total)` is told, now and then, how many bytes of the JSON text have been read.
    """
    path = Path(path)
    if cache and path.is_file():
        from .cache import load_cached, save_cached
        model = load_cached(path)
        if model is None:
            model = parse_trace(path, progress)
            save_cached(path, model)
        return model
    return parse_trace(path, progress)


def parse_trace(path: Path, progress: Progress | None = None) -> TraceModel:
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the decoded Structs hold no cycles; tracking the lists of them only costs time
    try:
        with trace_text(path) as text:
            builder, metadata = _read_in_chunks(text, path, progress) or _read_whole(text, path)
        model = builder.model(str(path), metadata)
        del builder
        release_free_memory()
        return model
    finally:
        if gc_was_enabled:
            gc.enable()


def _read_whole(text: bytes | mmap.mmap, path: Path) -> tuple[_Builder, dict]:
    """Decode all events at once: files the chunked reader leaves alone (lenient types, repairs, errors)."""
    events, metadata, lenient, text, problems, notes = decode_trace(text, path)
    if not events:
        raise TraceError(f"{path}: trace has no events")
    columns = EventColumns(lenient=lenient)
    columns.add(events)
    del events
    if columns.last_batch_names(COMM_OP):
        columns.add_comm_args(comm_op_args(text))
    builder = _Builder(columns)
    builder.warnings.update(problems)
    builder.notes.update(notes)
    if builder.lost_precision:
        ts = decode_exact_ts(text)
        builder.use_exact_ts(*([ts[i] for i in rows.tolist()] for rows in builder.exact_rows()))
    return builder, metadata


def _read_in_chunks(text: bytes | mmap.mmap, path: Path, progress: Progress | None) -> tuple[_Builder, dict] | None:
    """Decode the events a chunk at a time, keeping only their columns; None when the file needs _read_whole.
    A large file's second part is read at the same time by a helper process."""
    array = find_event_array(text)
    if array is None:
        return None
    columns = EventColumns(lenient=False)
    own, helper = _share_with_helper(text, path, array)
    try:
        spans, legacy = read_events(text, own, columns, _scaled(progress, own, array))
        if helper:
            helped = helper.join_into(columns)
            more_spans, more_legacy = helped if helped else read_events(text, helper.array, columns)
            spans, legacy = spans + more_spans, legacy + more_legacy
    except NotChunkable:
        return None
    finally:
        if helper:
            helper.stop()
    if progress:
        progress(len(text), len(text))
    if not columns.events:
        raise TraceError(f"{path}: trace has no events")
    release_free_memory()
    builder = _Builder(columns)
    if legacy:
        builder.notes[LEGACY_NOTE] += legacy
    if builder.lost_precision:
        builder.use_exact_ts(*_exact_ts_in_chunks(text, spans, builder))
    return builder, array.metadata


def read_events(text: bytes | mmap.mmap, array: EventArray, columns: EventColumns,
                progress: Progress | None = None) -> tuple[list[tuple[int, int]], int]:
    """Decode the array's events a chunk at a time into columns: (the chunks' spans, legacy events adopted).
    Raises NotChunkable."""
    spans, legacy = [], 0
    for events, start, end in decoded_chunks(text, array):
        if array.bare:
            legacy += adopt_legacy_events(events)
        columns.add(events)
        if columns.last_batch_names(COMM_OP):
            columns.add_comm_args(comm_op_args(text, start, end))
        spans.append((start, end))
        del events
        _release_pages(text, start)
        if progress:
            progress(end - array.start, array.end - array.start)
    return spans, legacy


def read_part(text: bytes | mmap.mmap, array: EventArray) -> dict | str:
    """What a helper sends back: the array's events as exported columns, or NOT_CHUNKABLE."""
    columns = EventColumns(lenient=False)
    try:
        spans, legacy = read_events(text, array, columns)
    except NotChunkable:
        return NOT_CHUNKABLE
    return {"columns": columns.export(), "spans": spans, "legacy": legacy}


PARALLEL_MIN_BYTES = 64 << 20
# A helper that is not a fork starts its interpreter while this process already reads: it gets a little less than
# half.
HELPER_HEAD_START_BYTES = 32 << 20


def _share_with_helper(text: bytes | mmap.mmap, path: Path, array: EventArray) -> tuple[EventArray, Helper | None]:
    """(the part of the array this process reads, the helper process reading the rest, if any)."""
    size = array.end - array.start
    if not isinstance(text, mmap.mmap) or size < PARALLEL_MIN_BYTES or available_cpus() < 2:
        return array, None
    fork = can_fork()
    head_start = 0 if fork else HELPER_HEAD_START_BYTES
    own_end, helper_start = split_after(text, array.start + (size + head_start) // 2, array.end)
    if own_end == array.end:
        return array, None
    helper = Helper(path, text, dataclasses.replace(array, start=helper_start), fork=fork, read_part=read_part)
    return dataclasses.replace(array, end=own_end), helper


def _scaled(progress: Progress | None, part: EventArray, whole: EventArray) -> Progress | None:
    """Progress through part as progress through the whole array (the helper keeps about the same pace)."""
    if progress is None:
        return None
    whole_size, part_size = whole.end - whole.start, max(part.end - part.start, 1)
    return lambda done, _total: progress(done * whole_size // part_size, whole_size)


def _exact_ts_in_chunks(text: bytes | mmap.mmap, spans: list, builder: _Builder) -> list[list]:
    """Exact ts of the slices, memory events and profiler spans, decoding a chunk at a time again."""
    all_rows = builder.exact_rows()
    found: list[list] = [[] for _ in all_rows]
    first_row = 0
    for start, end in spans:
        ts = decode_exact_ts(chunk_json(text, start, end))
        for rows, out in zip(all_rows, found):
            local = rows[(rows >= first_row) & (rows < first_row + len(ts))] - first_row
            out += [ts[i] for i in local.tolist()]
        first_row += len(ts)
    return found


def _release_pages(text: bytes | mmap.mmap, below: int) -> None:
    """Let the kernel drop the mapped file pages already decoded (they are still in the page cache), so a
    large trace does not stay resident in this process."""
    if isinstance(text, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        text.madvise(mmap.MADV_DONTNEED, 0, below - below % mmap.PAGESIZE)


def release_free_memory() -> None:
    """Hand freed heap memory back to the OS. glibc keeps freed pages of its heap mapped (numpy's per-chunk columns
    and the decoded Structs live there), so without this the process's RSS would stay at its peak for good."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; other C libraries have no such call
    except (OSError, AttributeError):
        return None


def _same(value):
    return value


def _take(events: Sequence, rows: np.ndarray) -> list:
    return [events[i] for i in rows.tolist()]


class EventColumns:
    """The modelled events' fields as numpy columns, read a batch of decoded events at a time, in file order.

    A batch's fields are read while its Structs are fresh in the CPU caches. Every batch converts on its own, so a
    file read in chunks (and partly in a helper process) gives the columns reading it whole gives; string
    pids/tids get provisional ids here, renumbered by name when the model is built. Times are converted to ns
    here, a batch at a time. An args field is kept only for the slices of the categories whose tables use it:
    column `args<g>_rows` holds the slice indices of group g of _ARGS_BY_CATEGORY, `args<g>_<column>` its values.
    """

    def __init__(self, *, lenient: bool) -> None:
        self.lenient = lenient
        self.strings = StringTable()
        self.shapes = Codes({b"": 0})  # Input Dims' texts (b"": none) -> code; appended to the names at the end
        self.spans: list[tuple[int, int, int]] = []  # the profiler's spans (category Trace): (event row, start, dur) ns
        self.threads = ThreadIds()
        self.events = 0
        self.slices = 0
        self.lost_precision = False  # some ts had sub-µs digits a double cannot hold (see use_exact_ts)
        self.comm_args: dict[int, dict] = {}  # External id -> args of a record_param_comms op (analyzer.trace.commargs)
        self.foreign: Counter[str] = Counter()  # category of a device neither CUDA nor HIP -> events
        self.problems: Counter[str] = Counter()  # odd values read as missing: reason -> count
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, events: list) -> None:
        categories = np.fromiter(
            map(CATEGORY_CODES.__getitem__, map(attrgetter("cat"), events)), dtype=np.int8, count=len(events)
        )
        if categories.min(initial=0) < 0:
            self._count_foreign(categories)
        spans = np.flatnonzero(categories == CATEGORY_CODE["trace"])
        if len(spans):  # the profiler's own span: kept apart (its string pid and tid would slow the thread ids)
            self._profiler_spans(_take(events, spans), spans + self.events)
            categories[spans] = 0
        is_slice = (categories > 0) & (categories != CATEGORY_CODE["cpu_instant_event"])
        slices = list(compress(events, is_slice.tolist()))
        category = categories[is_slice]
        if categories.max(initial=0) == LEGACY_OPERATOR:
            self._legacy_operators(slices, category)
        instant_rows = np.flatnonzero(categories == CATEGORY_CODE["cpu_instant_event"])
        instants = _take(events, instant_rows)
        is_memory = [e.name in MEMORY_EVENTS for e in instants]
        memory_events = list(compress(instants, is_memory))
        pid, tid = self._thread_ids(slices, "pid"), self._thread_ids(slices, "tid")
        bad_names = [] if self.lenient else None
        start_us = microseconds(slices, attrgetter("ts"), lenient=self.lenient)
        memory_us = microseconds(memory_events, attrgetter("ts"), lenient=self.lenient)
        self.lost_precision = self.lost_precision or lost_precision(start_us) or lost_precision(memory_us)
        (start_ns, has_start), (dur_ns, dur_valid) = to_ns(start_us), to_ns(
            microseconds(slices, attrgetter("dur"), lenient=self.lenient))
        memory_ns, memory_has_ts = to_ns(memory_us)
        self._append(
            slice_rows=np.flatnonzero(is_slice) + self.events,
            category=category,
            start_ns=start_ns, has_start=has_start, dur_ns=dur_ns, dur_valid=dur_valid,
            pid=pid,
            tid=tid,
            name=self.strings.codes(slices, attrgetter("name"), lenient=self.lenient, bad=bad_names),
            memory_rows=instant_rows[np.array(is_memory, dtype=bool)] + self.events,
            memory_ns=memory_ns, memory_has_ts=memory_has_ts,
            memory_is_oom=np.array([e.name == "[OutOfMemory]" for e in memory_events], dtype=bool),
        )
        if bad_names and bad_names[0]:
            self.problems["events: name not a string, read as empty"] += bad_names[0]
        self._append(**self._args_by_category(slices, category))
        self._append(**self._memory_columns(memory_events))
        self.events += len(events)
        self.slices += len(slices)

    def _profiler_spans(self, events: list, rows: np.ndarray) -> None:
        start_us = microseconds(events, attrgetter("ts"), lenient=self.lenient)
        self.lost_precision = self.lost_precision or lost_precision(start_us)
        start, has_start = to_ns(start_us)
        dur, has_dur = to_ns(microseconds(events, attrgetter("dur"), lenient=self.lenient))
        ok = has_start & has_dur & (dur >= 0)
        self.spans += list(zip(rows[ok].tolist(), start[ok].tolist(), dur[ok].tolist()))

    def last_batch_names(self, name: str) -> bool:
        """Whether a slice of the batch added last is named `name`."""
        code = self.strings.code_of(name)
        return code is not None and bool((self._parts["name"][-1] == code).any())

    def add_comm_args(self, found: dict[int, dict]) -> None:
        for ext, args in found.items():
            self.comm_args.setdefault(ext, args)

    @staticmethod
    def _legacy_operators(slices: list, category: np.ndarray) -> None:
        rows = category == LEGACY_OPERATOR
        is_step = [type(e.name) is str and bool(STEP_NAME.match(e.name)) for e in compress(slices, rows.tolist())]
        category[rows] = np.where(is_step, CATEGORY_CODE["user_annotation"], CATEGORY_CODE["cpu_op"])

    def _count_foreign(self, categories: np.ndarray) -> None:
        codes, counts = np.unique(categories[categories < 0], return_counts=True)
        for code, count in zip(codes.tolist(), counts.tolist()):
            self.foreign[CATEGORY_CODES.foreign_name(code)] += count

    def _args_by_category(self, slices: list, category: np.ndarray) -> dict[str, np.ndarray]:
        """The args columns of each group of categories, read only for that group's slices."""
        columns = {}
        for group, (codes, fields) in enumerate(_ARGS_BY_CATEGORY):
            rows = np.isin(category, codes)
            columns[f"args{group}_rows"] = np.flatnonzero(rows) + self.slices
            args = list(map(attrgetter("args"), compress(slices, rows.tolist())))
            for field in fields:
                bad: list[np.ndarray] = []
                values = ints(args, attrgetter(field), lenient=self.lenient, missing=_ARGS_MISSING.get(field, MISSING),
                              bad=None if field == "stream" else bad)
                if bad:
                    self._count_odd(bad[0], category[rows], f"args.{_ARGS_KEYS[field]}")
                if field == "external_id":  # torch 1.8/1.9 wrote "external id" on runtime and GPU events
                    missing = values == MISSING
                    if missing.any():
                        bad = []
                        values[missing] = ints(list(compress(args, missing.tolist())),
                                               attrgetter("external_id_lower"), lenient=self.lenient, bad=bad)
                        if bad:
                            self._count_odd(bad[0], category[rows][missing], "args.external id")
                columns[f"args{group}_{_ARGS_COLUMNS[field]}"] = values
            if group == _SHAPES_GROUP:
                columns[f"args{group}_shape"] = self._shape_codes(args)
        return columns

    def _shape_codes(self, args: list) -> np.ndarray:
        """Per op: the code of its Input Dims (their JSON text, as bytes: interned as they are, tidied once per
        distinct text when the model is built), -1 where it has none."""
        if self.lenient:
            dims = [b"" if a.input_dims is None else msgspec.json.encode(a.input_dims) for a in args]
        elif args:  # one join and one split in C make the batch's bytes faster than a bytes() per Raw
            dims = b"\0".join(map(attrgetter("input_dims"), args)).split(b"\0")
        else:
            dims = []
        return np.fromiter(map(self.shapes.__getitem__, dims), np.int32, count=len(args)) - 1

    def _count_odd(self, odd: np.ndarray, category: np.ndarray, key: str) -> None:
        """Count values that are there but not integers (read as missing), by category."""
        codes, counts = np.unique(category[odd], return_counts=True)
        for code, count in zip(codes.tolist(), counts.tolist()):
            self.problems[f"{MODELLED_CATEGORIES[code - 1]}: {key} not an integer, read as missing"] += count

    def _memory_columns(self, events: list) -> dict[str, np.ndarray]:
        args = list(map(attrgetter("args"), events))
        columns = {"memory_pid": self._thread_ids(events, "pid"), "memory_tid": self._thread_ids(events, "tid")}
        for field in _MEMORY_ARGS:
            bad: list[np.ndarray] = []
            columns[f"memory_{field}"] = ints(args, attrgetter(field), lenient=self.lenient, missing=NO_VALUE, bad=bad)
            if bad and field != "alloc_bytes":  # a Bytes that is not an integer skips the event, counted then
                self.problems[f"[memory]: args.{_ARGS_KEYS[field]} not an integer, read as missing"] += int(
                    bad[0].sum())
        return columns

    def _thread_ids(self, rows: Sequence, field: str) -> np.ndarray:
        return self.threads.column(rows, attrgetter(field), lenient=self.lenient)

    def export(self) -> dict:
        """All columns, the name table and the event count, for extend() in another process."""
        exported = {name: self.column(name) for name in list(self._parts)}
        return dict(exported, names=self.strings.strings(), shapes=list(self.shapes), spans=self.spans,
                    events=self.events,
                    slices=self.slices,
                    lost_precision=self.lost_precision, thread_names=self.threads.export(), foreign=dict(self.foreign),
                    problems=dict(self.problems), comm_args=self.comm_args)

    def extend(self, exported: dict) -> None:
        """Append the columns another EventColumns exported: the events that follow this one's in the file."""
        exported = dict(exported)
        codes = self.strings.codes(exported.pop("names"), _same, lenient=False)
        # the helper's shape codes (its table's index - 1; -1 none) -> this table's, [-1] staying -1
        shape_codes = np.r_[np.fromiter(map(self.shapes.__getitem__, exported.pop("shapes")), np.int32)[1:] - 1,
                            MISSING]
        thread_names = exported.pop("thread_names")
        self.spans += [(row + self.events, start, dur) for row, start, dur in exported.pop("spans")]
        self.foreign.update(exported.pop("foreign"))
        self.problems.update(exported.pop("problems"))
        self.lost_precision = self.lost_precision or exported.pop("lost_precision")
        self.add_comm_args(exported.pop("comm_args"))
        for name, values in exported.items():
            if name in ("slice_rows", "memory_rows"):
                values = values + self.events
            elif _ARGS_ROWS.fullmatch(name):
                values = values + self.slices
            elif name == "name":
                values = codes[values]
            elif name == f"args{_SHAPES_GROUP}_shape":
                values = shape_codes[values]
            elif name in _THREAD_COLUMNS:
                values = self.threads.adopt(thread_names, values)
            if name not in ("events", "slices"):
                self._append(**{name: values})
        self.events += exported["events"]
        self.slices += exported["slices"]

    def _append(self, **columns: np.ndarray) -> None:
        for name, values in columns.items():
            self._parts.setdefault(name, []).append(values)

    def column(self, name: str) -> np.ndarray:
        """All batches' values of one column, handed over once (the parts are dropped)."""
        parts = self._parts.pop(name)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class _Builder:
    """Sorts the columns into the model's tables and joins them."""

    def __init__(self, columns: EventColumns) -> None:
        self.lenient = columns.lenient
        self.warnings: Counter[str] = Counter(columns.problems)  # what is wrong in the trace
        self.notes: Counter[str] = Counter()  # what is worth knowing but not wrong
        self.foreign = columns.foreign
        self.comm_args = columns.comm_args
        self.strings, self.threads, self.shapes = columns.strings, columns.threads, columns.shapes
        self.spans = columns.spans
        self.slice_rows, self.memory_rows = columns.column("slice_rows"), columns.column("memory_rows")
        self.category = columns.column("category")
        self.lost_precision = columns.lost_precision
        self.start, self.has_start = columns.column("start_ns"), columns.column("has_start")
        self.memory_ts, self.memory_has_ts = columns.column("memory_ns"), columns.column("memory_has_ts")
        self.duration, self.dur_valid = columns.column("dur_ns"), columns.column("dur_valid")
        self._set_end()
        self.pid = self.threads.canonical(columns.column("pid"))
        self.tid = self.threads.canonical(columns.column("tid"))
        self.name = columns.column("name")
        # A slice's args are at args_position in the values of the one group of _ARGS_BY_CATEGORY its category is in.
        self.args: dict[str, list[tuple[int, np.ndarray]]] = {}  # column -> [(group, values)]
        self.args_position = np.zeros(len(self.category), dtype=np.int32)
        for group, (_, fields) in enumerate(_ARGS_BY_CATEGORY):
            rows = columns.column(f"args{group}_rows")
            self.args_position[rows] = np.arange(len(rows), dtype=np.int32)
            for field in fields:
                column = _ARGS_COLUMNS[field]
                self.args.setdefault(column, []).append((group, columns.column(f"args{group}_{column}")))
            if group == _SHAPES_GROUP:
                self.args["shape"] = [(group, columns.column(f"args{group}_shape"))]
        self.memory_columns = {name: columns.column(name) for name in (*_MEMORY_COLUMNS, "memory_is_oom")}
        for name in ("memory_pid", "memory_tid"):
            self.memory_columns[name] = self.threads.canonical(self.memory_columns[name])

    def exact_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The event rows whose ts use_exact_ts takes, in its order: slices, memory events, profiler spans."""
        return self.slice_rows, self.memory_rows, np.array([row for row, _, _ in self.spans], dtype=np.int64)

    def use_exact_ts(self, slice_ts: list, memory_ts: list, span_ts: list) -> None:
        """Replace ts read through doubles by ts decoded exactly (epoch-based µs with ns digits)."""
        self.start, self.has_start = exact_ns(slice_ts)
        self.memory_ts, self.memory_has_ts = exact_ns(memory_ts)
        span_start, has_span_start = exact_ns(span_ts)
        self.spans = [(row, start if ok else old, dur) for (row, old, dur), start, ok
                      in zip(self.spans, span_start.tolist(), has_span_start.tolist())]
        self._set_end()

    def _set_end(self) -> None:
        """end = start + dur; a dur whose end would not fit in int64 ns is invalid, not a wrapped-around end."""
        overflow = (self.duration > 0) & (self.start > np.iinfo(np.int64).max - self.duration)
        self.has_duration = self.dur_valid & ~overflow
        self.negative = self.has_duration & (self.duration < 0)
        self.end = np.where(overflow, self.start, self.start + self.duration)

    def _rows(self, table: str, *categories: str) -> np.ndarray:
        """Indices into the slice columns of the table's placeable rows, sorted by (start, longest first)."""
        rows = np.flatnonzero(np.isin(self.category, [CATEGORY_CODE[c] for c in categories]))
        has_start, has_duration = self.has_start[rows], self.has_duration[rows]
        negative = self.negative[rows]
        for mask, reason in zip((~has_start, has_start & ~has_duration, has_start & negative), _SKIP_REASONS):
            if mask.any():
                self.warnings[f"{table}: {reason}"] += int(mask.sum())
        rows = rows[has_start & has_duration & ~negative]
        end = self.end[rows]
        return rows[joins.start_order(self.start[rows], end)]

    def _shared(self, rows: np.ndarray, *columns: str) -> dict[str, np.ndarray]:
        return {column: self._values(column.removesuffix("_ns"), rows) for column in columns}

    def _values(self, column: str, rows: np.ndarray) -> np.ndarray:
        """One column's values at the given slice rows; an args column is looked up in the groups that hold it."""
        if column not in self.args:
            return getattr(self, column)[rows]
        values = np.full(len(rows), _ARGS_MISSING.get(column, MISSING))
        group_of_rows, position = _ARGS_GROUP_OF_CATEGORY[self.category[rows]], self.args_position[rows]
        for group, group_values in self.args[column]:
            here = group_of_rows == group
            values[here] = group_values[position[here]]
        return values

    def _ops(self) -> dict[str, np.ndarray]:
        rows = self._rows("ops", "cpu_op", "user_annotation")
        columns = self._shared(rows, "start_ns", "end_ns", "pid", "tid", "name", "external_id")
        columns["is_annotation"] = self.category[rows] == CATEGORY_CODE["user_annotation"]
        shape = self._values("shape", rows).astype(np.int32)
        # the shapes' texts follow the names in the model's string table
        columns["shape"] = np.where(shape >= 0, shape + len(self.strings.strings()), MISSING).astype(np.int32)
        return columns

    def _profiler_span(self) -> tuple[int, int] | None:
        """(start, end) ns of the profiler's own span(s) (`PyTorch Profiler (N)`, category Trace): the window it
        recorded; None where the trace has none."""
        return (min(s for _, s, _ in self.spans), max(s + d for _, s, d in self.spans)) if self.spans else None

    def _frames(self) -> dict[str, np.ndarray]:
        rows = self._rows("frames", "python_function")
        columns = self._shared(rows, "start_ns", "end_ns", "pid", "tid", "name")
        columns["python_id"] = self._values("python_id", rows)
        columns["parent_python_id"] = self._values("python_parent_id", rows)
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
        stream = self._values("stream", rows)
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
        pid, tid, alloc_bytes, *totals = (self.memory_columns[name] for name in _MEMORY_COLUMNS)
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
        columns["is_oom"] = self.memory_columns["memory_is_oom"]
        return {column: values[rows] for column, values in columns.items()}

    def model(self, path: str, metadata: dict) -> TraceModel:
        self.slice_rows = self.memory_rows = self.duration = self.dur_valid = None  # needed only before this
        ops, frames, runtime, gpu = self._ops(), self._frames(), self._runtime(), self._gpu()
        memory, gpu_annotations, overhead = self._memory(), self._gpu_annotations(), self._overhead()
        span = self._profiler_span()
        self._drop_event_columns()
        self._join_threads(ops, frames, runtime, memory)
        self._join_correlations(runtime, gpu)
        names = self.strings.strings() + tuple(d.translate(None, _JSON_BLANKS).decode(errors="replace")
                                               for d in list(self.shapes)[1:])
        steps = self._steps(ops, names)
        del frames["parent_python_id"]
        return TraceModel(
            path=path, metadata=metadata, names=names,
            ops=Ops(**ops), frames=Frames(**frames), runtime=Runtime(**runtime), gpu=Gpu(**gpu),
            gpu_annotations=GpuAnnotations(**gpu_annotations), memory=Memory(**memory),
            overhead=Overhead(**overhead), steps=Steps(**steps),
            warnings=dict(self.warnings), synthetic_ids=self.threads.names(), notes=dict(self.notes),
            foreign_activity=dict(sorted(self.foreign.items())), comm_args=self.comm_args, profiler_span_ns=span,
        )

    def _drop_event_columns(self) -> None:
        """Free the columns of every event once the tables hold their rows: on a 1 GB trace they are about a third
        of the peak memory, and the joins that follow need as much again."""
        for name in ("category", "start", "has_start", "memory_ts", "memory_has_ts", "has_duration", "negative", "end",
                     "pid", "tid", "name", "args", "args_position", "memory_columns"):
            setattr(self, name, None)
        release_free_memory()

    def _join_threads(self, ops: dict, frames: dict, runtime: dict, memory: dict) -> None:
        tables = (ops, frames, runtime, memory)
        ops_key, frames_key, runtime_key, memory_key = joins.thread_keys(
            [t["pid"] for t in tables], [t["tid"] for t in tables]
        )
        # One Intervals at a time: each holds copies of its table's columns.
        op_intervals = joins.Intervals(ops_key, ops["start_ns"], ops["end_ns"], sorted_by_start=True)
        ops["parent"] = op_intervals.parents()
        del op_intervals
        ops["depth"] = joins.depth_from_parent(ops["parent"])
        frame_intervals = joins.Intervals(frames_key, frames["start_ns"], frames["end_ns"], sorted_by_start=True)
        ops["frame"] = frame_intervals.innermost_enclosing(ops_key, ops["start_ns"], ops["end_ns"])
        runtime["frame"] = frame_intervals.innermost_enclosing(runtime_key, runtime["start_ns"], runtime["end_ns"])
        del frame_intervals

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
        # A CUDA/HIP graph launch owns all of its kernels under one correlation id: that is expected, not odd; so is
        # a replay launched before the window began (no launch call in the trace: counted by _unlaunched).
        names = self.strings.strings()
        graph_codes = [c for c, n in enumerate(names) if n in ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")]
        launch = gpu["launch"]
        by_graph = (launch >= 0) & np.isin(runtime["name"][np.clip(launch, 0, None)], graph_codes) \
            if len(runtime["name"]) else np.zeros(len(launch), bool)
        if repeated := joins.repeated_count(np.where(by_graph | (launch < 0), -1, gpu["correlation"])):
            self.warnings["gpu: rows sharing a correlation id (one launch, several GPU rows)"] += repeated
        unlaunched = (gpu["correlation"] >= 0) & (gpu["launch"] < 0)
        if unlaunched.any():
            self._unlaunched(unlaunched, runtime, gpu)

    def _unlaunched(self, unlaunched: np.ndarray, runtime: dict, gpu: dict) -> None:
        """Count GPU rows whose correlation id no runtime call in the trace has, by why.

        Correlation ids grow with every call. GPU work launched before the profiling window began still runs
        inside it when the GPU was behind (its queue full): its ids lie below every recorded call's. Work launched
        by an unsupported device type's runtime calls (xpu_runtime, ...) has no CUDA/HIP call to join. Otherwise
        the call should be in the trace: it is missing.
        """
        calls = runtime["correlation"][runtime["correlation"] >= 0]
        before = unlaunched & (gpu["correlation"] < calls.min()) if len(calls) else np.zeros_like(unlaunched)
        if count := int(before.sum()):
            self.notes[NOTE_LAUNCHED_BEFORE_WINDOW] += count
        rest = unlaunched & ~before
        if not (count := int(rest.sum())):
            return
        foreign_calls = sorted(c for c in self.foreign if c.endswith(("_runtime", "_driver")))
        if not len(calls) and foreign_calls:
            self.notes[f"gpu: rows launched by calls the model does not read ({', '.join(foreign_calls)})"] += count
        elif not len(calls):
            self.warnings["gpu: rows launched by runtime calls that are all missing (the trace has no "
                          "cuda_runtime or cuda_driver events)"] += count
        else:
            self.warnings[WARNING_LAUNCH_MISSING] += count

    def _steps(self, ops: dict, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        annotation_codes = distinct(ops["name"][ops["is_annotation"]])
        step_codes = [code for code in annotation_codes.tolist() if STEP_NAME.match(names[code])]
        rows = np.flatnonzero(ops["is_annotation"] & np.isin(ops["name"], step_codes))
        return {"start_ns": ops["start_ns"][rows], "end_ns": ops["end_ns"][rows], "name": ops["name"][rows], "op": rows}
