"""Read a Kineto trace file and decode its events into light msgspec Structs.

Only the fields the model needs are declared; msgspec skips everything else
without building Python objects for it, which is what makes loading fast.
"""

from __future__ import annotations

import decimal
import gc
import gzip
import math
import mmap
import os
import re
import zlib
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Union

import msgspec

from .errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
_BLANK = re.compile(rb"\s*\Z")

# Every category kineto's ActivityType knows, the flow and span ones, and the spellings of older kineto (torch
# 1.8/1.9: "Operator", "Runtime", "Kernel", ...; 2021: "gpu_user_Annotation"). Literal values decode without
# allocating a string. A file with a category not listed here is decoded again with the category as a plain string
# (still typed, a little slower); only odd values send it down the lenient path.
KnownCategory = Literal[
    "", "cpu_op", "user_annotation", "gpu_user_annotation", "gpu_memcpy", "gpu_memset",
    "kernel", "external_correlation", "cuda_runtime", "cuda_driver", "cpu_instant_event",
    "python_function", "overhead", "cuda_sync", "cuda_profiler_range", "mtia_runtime",
    "mtia_ccp_events", "mtia_insight", "mtia_counters", "glow_runtime", "hpu_op", "xpu_runtime", "xpu_driver",
    "collective_comm", "gpu_pm_counter", "privateuse1_runtime", "privateuse1_driver",
    "ac2g", "fwdbwd", "Trace", "gpu_idle_analyzer",  # the last: `analyze --annotate`'s own events, skipped
    "Operator", "Runtime", "Driver", "Kernel", "Memcpy", "Memset", "Python", "User annotation",
    "gpu_user_Annotation",
]

# Older kineto's category names, lower-cased, -> today's. Categories are matched case-insensitively.
CATEGORY_ALIASES = {
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "python": "python_function",
    "user annotation": "user_annotation",
}
# Activity of devices other than CUDA and HIP GPUs (which kineto files under the CUDA names), by category prefix.
FOREIGN_DEVICE_PREFIXES = {
    "mtia_": "MTIA", "glow_": "Glow", "xpu_": "XPU", "hpu_": "HPU", "privateuse1_": "PrivateUse1",
}


def canonical_category(cat: str) -> str:
    """Today's name of a category: lower-cased, older spellings mapped ("Kernel" -> "kernel", "Runtime" ->
    "cuda_runtime", "Operator" -> "cpu_op")."""
    lower = cat.strip().lower()
    return CATEGORY_ALIASES.get(lower, lower)


def foreign_device(category: str) -> str | None:
    """The device type ("MTIA", "XPU", ...) whose activity a (canonical) category records; None for the rest."""
    for prefix, device in FOREIGN_DEVICE_PREFIXES.items():
        if category.startswith(prefix):
            return device
    return None


Id = Union[int, str]
Number = Union[int, float]

MISSING = -1
NO_VALUE = -(2**63)  # for columns where -1 is a real value (signed Bytes, stream -1 of a Context Sync)


def _arg(key: str, default: Any = MISSING) -> Any:
    return msgspec.field(default=default, name=key)


# Missing keys decode straight to sentinel numbers (not None), so whole columns can
# go to numpy with np.fromiter in one C pass.
class Args(msgspec.Struct, gc=False, frozen=True):
    external_id: int = _arg("External id")
    external_id_lower: int = _arg("external id")  # torch 1.8/1.9 runtime and GPU events
    correlation: int = _arg("correlation")
    python_id: int = _arg("Python id")
    python_parent_id: Optional[int] = _arg("Python parent id")  # null at the root frame
    alloc_bytes: int = _arg("Bytes", NO_VALUE)
    total_allocated: int = _arg("Total Allocated")
    total_reserved: int = _arg("Total Reserved")
    device_type: int = _arg("Device Type")
    device_id: int = _arg("Device Id")
    addr: int = _arg("Addr")
    nbytes: Id = _arg("bytes")  # ROCm runtime calls write it as a decimal string ("128")
    stream: Id = _arg("stream", NO_VALUE)  # ROCm runtime events write it as a hex string
    cbid: int = _arg("cbid")
    # record_shapes: the op's input shapes, kept as their JSON text (no list per op is built)
    input_dims: msgspec.Raw = _arg("Input Dims", msgspec.Raw(b""))


NO_ARGS = Args()


class _Phase(msgspec.Struct, gc=False, tag_field="ph"):
    pass


class Complete(_Phase, tag="X"):
    cat: KnownCategory = ""
    name: str = ""
    pid: Id = ""
    tid: Id = ""
    ts: Number = math.nan
    dur: Number = math.nan
    args: Args = NO_ARGS


class Instant(Complete, tag="i"):
    """Same fields as Complete (dur stays NaN), so every modelled event reads alike."""


class LegacyInstant(Complete, tag="I"):
    pass


class AnyCategoryComplete(_Phase, tag="X"):
    """Complete with the category as any string: for files with a category KnownCategory does not list."""

    cat: str = ""
    name: str = ""
    pid: Id = ""
    tid: Id = ""
    ts: Number = math.nan
    dur: Number = math.nan
    args: Args = NO_ARGS


class AnyCategoryInstant(AnyCategoryComplete, tag="i"):
    pass


class AnyCategoryLegacyInstant(AnyCategoryComplete, tag="I"):
    pass


COMPLETE_TYPES = (Complete, AnyCategoryComplete)


class _Skipped(_Phase):
    """Flows, metadata and the rest: every key is skipped. The class-level (not decoded)
    category lets one attrgetter("cat") pass over all events tell what to keep."""

    cat = ""


_SKIPPED_PHASES = ("s", "f", "t", "M", "B", "E", "C", "b", "e", "n", "P", "O", "N", "D", "R", "c")
_SKIPPED = tuple(msgspec.defstruct(f"Skipped_{ph}", [], bases=(_Skipped,), tag=ph) for ph in _SKIPPED_PHASES)
Event = Union[(Complete, Instant, LegacyInstant, *_SKIPPED)]
AnyCategoryEvent = Union[(AnyCategoryComplete, AnyCategoryInstant, AnyCategoryLegacyInstant, *_SKIPPED)]


class LenientArgs(msgspec.Struct, gc=False, frozen=True):
    external_id: Any = _arg("External id", None)
    external_id_lower: Any = _arg("external id", None)
    correlation: Any = _arg("correlation", None)
    python_id: Any = _arg("Python id", None)
    python_parent_id: Any = _arg("Python parent id", None)
    alloc_bytes: Any = _arg("Bytes", None)
    total_allocated: Any = _arg("Total Allocated", None)
    total_reserved: Any = _arg("Total Reserved", None)
    device_type: Any = _arg("Device Type", None)
    device_id: Any = _arg("Device Id", None)
    addr: Any = _arg("Addr", None)
    nbytes: Any = _arg("bytes", None)
    stream: Any = _arg("stream", None)
    cbid: Any = _arg("cbid", None)
    input_dims: Any = _arg("Input Dims", None)


class LenientEvent(msgspec.Struct, gc=False):
    """Accepts "inf", "N/A", nulls, unknown categories and the like; the model treats odd values as missing."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Union[LenientArgs, None, list, str, int, float, bool] = None  # anything but an object: no args


_KNOWN_PHASES = frozenset(("X", "i", "I", *_SKIPPED_PHASES))
# Anything that is not an object in the event list is skipped (and counted), not a reason to give up on the file.
_LenientItem = Union[LenientEvent, None, list, str, int, float, bool]


_NO_LENIENT_ARGS = LenientArgs()

METADATA_KEYS = (
    "schemaVersion", "deviceProperties", "distributedInfo", "cuda_driver_version",
    "cuda_runtime_version", "cupti_version", "with_stack", "profile_memory", "record_shapes",
    "with_modules", "with_flops", "baseTimeNanoseconds", "displayTimeUnit", "traceName",
    "trace_id", "host_name",
)


def _trace_struct(event_type: type) -> type:
    fields = [(key, Any, msgspec.UNSET) for key in METADATA_KEYS]
    return msgspec.defstruct(
        "Trace", [("traceEvents", list[event_type]), *fields], gc=False,
    )


_STRICT = msgspec.json.Decoder(Union[_trace_struct(Event), list[Event]])
_STRICT_ANY_CATEGORY = msgspec.json.Decoder(Union[_trace_struct(AnyCategoryEvent), list[AnyCategoryEvent]])
_LENIENT = msgspec.json.Decoder(Union[_trace_struct(_LenientItem), list[_LenientItem]])


@contextmanager
def trace_text(path: Path) -> Iterator[bytes | mmap.mmap]:
    """The file's JSON text: the file mapped into memory, or its gunzipped bytes when it
    starts with the gzip magic bytes. Mapping avoids copying a large file before decoding. The mapping is private
    (copy on write): decoded_chunks writes brackets into it, and puts back what was there."""
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                raise TraceError(f"{path}: empty file, expected a Kineto trace (JSON)")
            text = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as error:
        raise TraceError(f"{path}: cannot read file ({error.strerror or error})") from None
    try:
        if text[:2] == GZIP_MAGIC:
            try:
                unzipped = gzip.decompress(text)
            except (EOFError, OSError, zlib.error) as error:
                raise TraceError(f"{path}: corrupt or truncated gzip data ({error})") from None
            text.close()
            text = unzipped
        if text[:3] == UTF8_BOM:  # a trace re-saved by an editor that marks UTF-8
            stripped = text[3:]
            if isinstance(text, mmap.mmap):
                text.close()
            text = stripped
        if _BLANK.match(text):
            raise TraceError(f"{path}: empty file, expected a Kineto trace (JSON)")
        yield text
    finally:
        if isinstance(text, mmap.mmap):
            try:
                text.close()
            except BufferError:  # a decoded value still points into it (see _release): unmapped when it goes
                pass


class _ExactTs(msgspec.Struct, gc=False):
    ts: Any = None


_ExactItem = Union[_ExactTs, None, list, str, int, float, bool]  # as the lenient decoder: non-objects are skipped
_EXACT_TS = msgspec.json.Decoder(
    Union[msgspec.defstruct("Trace", [("traceEvents", list[_ExactItem])], gc=False), list[_ExactItem]],
    float_hook=decimal.Decimal,
)


def decode_exact_ts(data: bytes | mmap.mmap) -> list:
    """Every event's ts, in file order, as int or exact Decimal (a second, slower pass over valid JSON)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        top = _EXACT_TS.decode(data)
    finally:
        if gc_was_enabled:
            gc.enable()
    return [event.ts for event in (top if isinstance(top, list) else top.traceEvents) if type(event) is _ExactTs]


def decode(data: bytes | mmap.mmap, path: Path) -> tuple[list, dict[str, Any], bool]:
    """Events (strict or lenient Structs), top-level metadata, and whether the lenient types were needed."""
    return decode_trace(data, path)[:3]


REPAIRED_WARNING = "event names with unescaped double quotes, repaired (pytorch#146900)"


def decode_trace(data: bytes | mmap.mmap, path: Path) -> tuple[list, dict[str, Any], bool, bytes | mmap.mmap,
                                                                 Counter, Counter]:
    """decode(), plus the text actually decoded (names with unescaped quotes repaired, if that was needed), counts
    of what was wrong in the file and skipped or repaired on the way (reason -> count), and counts of what was
    read in an older but valid way (notes: reason -> count)."""
    problems: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    try:
        top, lenient = _decode_top(data, path)
    except msgspec.DecodeError as error:
        repaired_text, repaired = repair_unescaped_quotes(bytes(data))
        if not repaired:
            raise TraceError(_json_error(path, data, error)) from None
        try:
            top, lenient = _decode_top(repaired_text, path)
        except msgspec.DecodeError:  # still broken: say where the original text first broke
            raise TraceError(_json_error(path, data, error)) from None
        data = repaired_text
        problems[REPAIRED_WARNING] += repaired
    events = top if isinstance(top, list) else top.traceEvents
    if lenient:
        notes[LENIENT_NOTE] += 1
        junk = sum(1 for event in events if type(event) is not LenientEvent)
        if junk:
            problems["events: not a JSON object, skipped"] += junk
            events = [event for event in events if type(event) is LenientEvent]
        unknown_phase = bad_args = bad_category = 0
        for event in events:  # make them read like the strict Structs
            modelled_phase = event.ph in ("X", "i", "I")
            if type(event.args) is not LenientArgs:
                bad_args += modelled_phase and event.args is not None
                event.args = _NO_LENIENT_ARGS
            if type(event.cat) is not str:
                bad_category += modelled_phase and event.cat is not None
                event.cat = None
            if event.ph != "X":
                event.dur = None
                if not modelled_phase:
                    if event.cat and not (type(event.ph) is str and event.ph in _KNOWN_PHASES):
                        unknown_phase += 1
                    event.cat = None
        if unknown_phase:
            problems["events: missing or unknown ph, skipped"] += unknown_phase
        if bad_args:
            problems["events: args not a JSON object, ignored"] += bad_args
        if bad_category:
            problems["events: cat not a string, skipped"] += bad_category
    if isinstance(top, list):
        if legacy := adopt_legacy_events(events):
            notes[LEGACY_NOTE] += legacy
        return events, {}, lenient, data, problems, notes
    metadata = {key: getattr(top, key) for key in METADATA_KEYS if getattr(top, key) is not msgspec.UNSET}
    return events, metadata, lenient, data, problems, notes


LENIENT_NOTE = "events decoded with lenient types (the slower path for odd values)"


def _decode_top(data: bytes | mmap.mmap, path: Path):
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            return _STRICT.decode(data), False
        except msgspec.ValidationError:
            pass
        try:  # a category KnownCategory does not list: still typed
            return _STRICT_ANY_CATEGORY.decode(data), False
        except msgspec.ValidationError:
            return _LENIENT.decode(data), True
    except msgspec.ValidationError as error:
        raise TraceError(f"{path}: not a Kineto trace ({error})") from None
    except RecursionError:
        raise TraceError(f"{path}: not a Kineto trace (JSON nested too deeply)") from None
    finally:
        if gc_was_enabled:
            gc.enable()


# ---------------------------------------------------------------- decoding in chunks
# A large file is decoded a few MB of events at a time, so the Structs of only one chunk are alive at once. The
# split points are found by a byte search, which cannot tell JSON structure apart from string contents; the decoder
# can: a chunk split anywhere but between two events of the array fails to decode (it ends inside a string or an
# open object or array), and then the file is decoded in one piece as before.

CHUNK_BYTES = 4 << 20  # small enough for a chunk's text and Structs to stay in the CPU caches
_EVENTS_KEY = b'"traceEvents"'
_JSON_BLANK_BYTES = b" \t\r\n"
_JSON_BLANKS = re.compile(rb"[ \t\r\n]*")
_EVENTS_VALUE = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\[")
_KEY_BEFORE = re.compile(rb"[{,][ \t\r\n]*\Z")
_EVENT_GAP = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")  # between two events, or inside a string: the decode tells
# Stands in for the event array when the rest of the file is decoded; its odd spacing makes it recognisable.
_ARRAY_STANDIN = b"[ \t\t ]"
_TAIL_CANDIDATES = 8  # `]`s after a `}` tried, from the end, as the array's end
_SPLIT_RETRIES = 8
_CHUNK = msgspec.json.Decoder(list[Event])
_CHUNK_ANY_CATEGORY = msgspec.json.Decoder(list[AnyCategoryEvent])


def decode_chunk(chunk: bytes | memoryview) -> list:
    """A chunk's events as strict Structs, the category as any string if KnownCategory does not list one.
    Raises msgspec.ValidationError for odd values, msgspec.DecodeError for broken JSON."""
    try:
        return _CHUNK.decode(chunk)
    except msgspec.ValidationError:
        return _CHUNK_ANY_CATEGORY.decode(chunk)


def _skeleton_struct() -> type:
    fields = [(key, Any, msgspec.UNSET) for key in METADATA_KEYS]
    return msgspec.defstruct("Trace", [("traceEvents", msgspec.Raw), *fields], gc=False)


_SKELETON = msgspec.json.Decoder(_skeleton_struct())


@dataclass(frozen=True)
class EventArray:
    """Where the event array lies in the text: its items are text[start:end]."""

    start: int
    end: int
    metadata: dict[str, Any]
    bare: bool  # the file is the array itself (legacy exporter)


def find_event_array(text: bytes | mmap.mmap) -> EventArray | None:
    """The traceEvents array and the top-level metadata, found without decoding the events; None when the
    file does not look like a well-formed trace (the whole-file decode then says what is wrong)."""
    first = _JSON_BLANKS.match(text).end()
    if text[first : first + 1] == b"[":
        last = _end_without_blanks(text)
        if text[last - 1 : last] != b"]":
            return None
        return EventArray(first + 1, last - 1, {}, bare=True)
    start = _events_key_end(text)
    if start is None:
        return None
    head = text[: start - 1]
    for end in _array_end_candidates(text, start):
        try:
            top = _SKELETON.decode(head + _ARRAY_STANDIN + text[end + 1 :])
        except (msgspec.DecodeError, RecursionError):
            continue
        if bytes(top.traceEvents) == _ARRAY_STANDIN:
            metadata = {key: getattr(top, key) for key in METADATA_KEYS if getattr(top, key) is not msgspec.UNSET}
            return EventArray(start, end, metadata, bare=False)
    return None


def _array_end_candidates(text: bytes | mmap.mmap, start: int):
    """From the end of the file back, the `]`s that may close the event array: those right after an event's `}`
    (or the opening `[`). Keys after the array (kineto's "INFO" log lines) hold many other `]`s."""
    end, tried = len(text), 0
    while tried < _TAIL_CANDIDATES:
        end = text.rfind(b"]", start, end)
        if end < 0:
            return
        before = end
        while before > start and text[before - 1] in _JSON_BLANK_BYTES:
            before -= 1
        if before == start or (text[before - 1] == ord("}") and _ends_an_event(text, start, end)):
            tried += 1
            yield end


def _ends_an_event(text: bytes | mmap.mmap, start: int, end: int, window: int = 1 << 16) -> bool:
    """Whether the text before `end` is whole events: what follows one of the last gaps between events (a gap
    may be inside a string) decodes as an array of events."""
    window_start = max(start, end - window)
    gaps = list(_EVENT_GAP.finditer(text, window_start, end))
    firsts = [gap.end() - 1 for gap in gaps[::-1][:_SPLIT_RETRIES]] or ([start] if window_start == start else [])
    if not firsts:
        return True  # one event larger than the window: the chunked decode will tell
    for first in firsts:
        try:
            _CHUNK_ANY_CATEGORY.decode(chunk_json(text, first, end))
            return True
        except (msgspec.DecodeError, RecursionError):
            continue
    return False


def _events_key_end(text: bytes | mmap.mmap, tries: int = 16) -> int | None:
    """Offset just past the `[` that opens the value of a "traceEvents" key (one that follows `{` or `,`, so
    not inside a string)."""
    position = 0
    for _ in range(tries):
        position = text.find(_EVENTS_KEY, position)
        if position < 0:
            return None
        value = _EVENTS_VALUE.match(text, position + len(_EVENTS_KEY))
        if value and _KEY_BEFORE.search(text[max(0, position - 256) : position]):
            return value.end()
        position += len(_EVENTS_KEY)
    return None


def _end_without_blanks(text: bytes | mmap.mmap) -> int:
    end = len(text)
    while end > 0 and text[end - 1] in _JSON_BLANK_BYTES:
        end -= 1
    return end


class NotChunkable(Exception):
    """The file has to be decoded in one piece: odd values (lenient types), a break in the JSON, or a column
    whose reading depends on all of its values (string thread ids)."""


def decoded_chunks(text: bytes | mmap.mmap, array: EventArray):
    """(events as strict Structs, start, end) for consecutive spans text[start:end] of the array, each about
    CHUNK_BYTES long, in file order. Raises NotChunkable."""
    chunk_bytes, start = CHUNK_BYTES, array.start
    # Unmapped text (gunzipped) is copied into this buffer, reused: fresh memory for every chunk costs a page fault
    # per 4 KiB.
    buffer = bytearray(0 if isinstance(text, mmap.mmap) else 2 * chunk_bytes)
    while True:
        end, next_start = split_after(text, start + chunk_bytes, array.end)
        for _ in range(_SPLIT_RETRIES):
            if end - start + 2 > len(buffer) and not isinstance(text, mmap.mmap):
                buffer = bytearray(end - start + 2)
            # the events are handed out while the chunk is held: their Raw fields (Input Dims) point into it, and
            # the caller drops them before asking for the next chunk
            with _as_array(text, start, end, buffer) as chunk:
                try:
                    events = decode_chunk(chunk)
                except msgspec.ValidationError:
                    raise NotChunkable from None
                except msgspec.DecodeError:  # split inside a string, perhaps: try the next split point
                    if end == array.end:
                        raise NotChunkable from None
                    end, next_start = split_after(text, next_start, array.end)
                    continue
                except RecursionError:
                    raise NotChunkable from None
                yield events, start, end
                del events
            if not isinstance(text, mmap.mmap) and not _released(chunk):
                buffer = bytearray(len(buffer))  # the old one is still read (see _release)
            break
        else:
            raise NotChunkable
        if end == array.end:
            return
        start = next_start


def split_after(text: bytes | mmap.mmap, at: int, end: int) -> tuple[int, int]:
    """(end of a chunk, start of the next) at the first gap between two events after `at`; (end, end) if none."""
    gap = _EVENT_GAP.search(text, at, end) if at < end else None
    return (gap.start() + 1, gap.end() - 1) if gap else (end, end)


@contextmanager
def _as_array(text: bytes | mmap.mmap, start: int, end: int, buffer: bytearray) -> Iterator[memoryview]:
    """text[start:end] as a JSON array. In a mapped file, in place: `[` and `]` are written over the bytes just
    outside the span (the array's own bracket, or a comma or blank between two events) and put back afterwards,
    which spares copying every chunk (the mapping is private to this process). Else copied into buffer."""
    if not isinstance(text, mmap.mmap):
        chunk = chunk_json(text, start, end, buffer)
        try:
            yield chunk
        finally:
            _release(chunk)
        return
    before, after = text[start - 1], text[end]
    text[start - 1], text[end] = ord("["), ord("]")
    view = memoryview(text)
    chunk = view[start - 1 : end + 1]
    try:
        yield chunk
    finally:
        text[start - 1], text[end] = before, after
        _release(chunk)
        _release(view)


def _release(view: memoryview) -> bool:
    """Release a view whose decoded Raw values the caller has dropped; False where some are still referenced, and
    the view is left to go when they do. That happens where another thread holds a frame of the decoding thread
    (a sampling profiler's `sys._current_frames()`, as Dask's workers run one beside each task): a frame object that
    outlives its call keeps the call's locals, here a batch of events. Each such value holds the buffer, so the
    memory behind it stays valid: trace_text leaves unmapping to the last one, and decoded_chunks takes a fresh
    buffer rather than overwrite one still read."""
    try:
        view.release()
        return True
    except BufferError:
        return False


def _released(view: memoryview) -> bool:
    try:
        view.nbytes
        return False
    except ValueError:
        return True


def chunk_json(text: bytes | mmap.mmap, start: int, end: int, buffer: bytearray | None = None) -> memoryview:
    """text[start:end] as a JSON array, written at the start of buffer (which must be large enough)."""
    if buffer is None:
        buffer = bytearray(end - start + 2)
    chunk = memoryview(buffer)[: end - start + 2]
    chunk[0], chunk[-1] = ord("["), ord("]")
    with memoryview(text) as view:
        chunk[1:-1] = view[start:end]
    return chunk


_BYTE_OFFSET = re.compile(r"\s*\(byte (\d+)\)\s*$")


def _json_error(path: Path, data: bytes | mmap.mmap, error: msgspec.DecodeError) -> str:
    """One line saying where the JSON broke: line, column and byte offset (in the gunzipped text for .gz)."""
    message = str(error)
    match = _BYTE_OFFSET.search(message)
    if match:
        offset, reason = int(match.group(1)), message[: match.start()]
    else:  # "Input data was truncated": it broke at the end
        offset, reason = len(data), message
    reason = reason.removeprefix("JSON is malformed: ").rstrip(".") or "malformed"
    offset = min(offset, len(data))
    head = data[:offset]
    line = head.count(b"\n") + 1
    column = offset - (head.rfind(b"\n") + 1) + 1
    gunzipped = False
    if not isinstance(data, mmap.mmap):
        try:
            with open(path, "rb") as file:
                gunzipped = file.read(2) == GZIP_MAGIC
        except OSError:
            pass
    where = f"line {line}, column {column} (byte {offset}{' of the gunzipped text' if gunzipped else ''})"
    return f"{path}: invalid JSON at {where}: {reason}"


# Kineto before #1459 wrote `"` inside names unescaped (pytorch#146900). A name value runs from `"name": "` to the
# first quote on the same line (names have their newlines stripped) that is followed by the next key, the end of
# the line, or the end of the event object (`}` then `,`, `]` or the line's end).
_NAME_START = re.compile(rb'"name"\s*:\s*"')
_NAME_END = re.compile(rb'"(?=[ \t]*(?:,\s*"[^"\r\n]{0,200}"\s*:|[,}\]]?[ \t\r]*\Z|[}\]]\s*(?:[,}\]]|\Z)))')
_BARE_QUOTE = re.compile(rb'(?<!\\)"')


def repair_unescaped_quotes(data: bytes) -> tuple[bytes, int]:
    """The text with bare double quotes inside "name" values escaped, and how many names were repaired."""
    pieces, position, repaired = [], 0, 0
    for match in _NAME_START.finditer(data):
        start = match.end()
        if start < position:
            continue
        line_end = data.find(b"\n", start)
        end = _NAME_END.search(data, start, len(data) if line_end < 0 else line_end)
        if end is None:
            continue
        value = data[start : end.start()]
        if b'"' not in value:
            continue
        fixed = _BARE_QUOTE.sub(rb'\\"', value)
        if fixed != value:
            pieces += [data[position:start], fixed]
            position = end.start()
            repaired += 1
    if not repaired:
        return data, 0
    pieces.append(data[position:])
    return b"".join(pieces), repaired


LEGACY_CATEGORIES = {"CPU functions": "cpu_op", "CUDA functions": "kernel"}
LEGACY_NOTE = 'legacy exporter events (pid "CPU functions" / "CUDA functions") read as cpu_op / kernel'


def adopt_legacy_events(events: list) -> int:
    """The legacy exporter (torch.autograd.profiler, a bare array) writes ops and kernels without a category, on pids
    "CPU functions" and "CUDA functions" (tid: the thread, or the kernel's device). Give them their categories."""
    adopted = 0
    for event in events:
        if event.cat or not (type(event) in COMPLETE_TYPES or (type(event) is LenientEvent and event.ph == "X")):
            continue
        if type(event.pid) is not str or event.pid not in LEGACY_CATEGORIES:
            continue
        event.cat = LEGACY_CATEGORIES[event.pid]
        if event.cat == "kernel":
            event.pid, event.tid = event.tid, 0  # device index; the stream is not recorded
        adopted += 1
    return adopted
