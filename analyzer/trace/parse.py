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
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Union

import msgspec

from .errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
_BLANK = re.compile(rb"\s*\Z")

# Every category kineto's ActivityType knows, plus the flow and span ones. Literal
# values decode without allocating a string; an unknown one sends the whole file
# down the lenient path, which is slower but accepts anything.
KnownCategory = Literal[
    "", "cpu_op", "user_annotation", "gpu_user_annotation", "gpu_memcpy", "gpu_memset",
    "kernel", "external_correlation", "cuda_runtime", "cuda_driver", "cpu_instant_event",
    "python_function", "overhead", "cuda_sync", "cuda_profiler_range", "mtia_runtime",
    "mtia_ccp_events", "mtia_insight", "glow_runtime", "hpu_op", "xpu_runtime", "xpu_driver",
    "collective_comm", "gpu_pm_counter", "privateuse1_runtime", "privateuse1_driver",
    "ac2g", "fwdbwd", "Trace",
]
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
    correlation: int = _arg("correlation")
    python_id: int = _arg("Python id")
    python_parent_id: Optional[int] = _arg("Python parent id")  # null at the root frame
    alloc_bytes: int = _arg("Bytes", NO_VALUE)
    total_allocated: int = _arg("Total Allocated")
    total_reserved: int = _arg("Total Reserved")
    device_type: int = _arg("Device Type")
    device_id: int = _arg("Device Id")
    addr: int = _arg("Addr")
    nbytes: int = _arg("bytes")
    stream: Id = _arg("stream", NO_VALUE)  # ROCm runtime events write it as a hex string
    cbid: int = _arg("cbid")


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


class _Skipped(_Phase):
    """Flows, metadata and the rest: every key is skipped. The class-level (not decoded)
    category lets one attrgetter("cat") pass over all events tell what to keep."""

    cat = ""


_SKIPPED_PHASES = ("s", "f", "t", "M", "B", "E", "C", "b", "e", "n", "P", "O", "N", "D", "R", "c")
_SKIPPED = tuple(msgspec.defstruct(f"Skipped_{ph}", [], bases=(_Skipped,), tag=ph) for ph in _SKIPPED_PHASES)
Event = Union[(Complete, Instant, LegacyInstant, *_SKIPPED)]


class LenientArgs(msgspec.Struct, gc=False, frozen=True):
    external_id: Any = _arg("External id", None)
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


class LenientEvent(msgspec.Struct, gc=False):
    """Accepts "inf", "N/A", nulls, unknown categories and the like; the model treats odd values as missing."""

    ph: Optional[str] = None
    cat: Optional[str] = None
    name: Optional[str] = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Optional[LenientArgs] = None


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
_LENIENT = msgspec.json.Decoder(Union[_trace_struct(LenientEvent), list[LenientEvent]])


@contextmanager
def trace_text(path: Path) -> Iterator[bytes | mmap.mmap]:
    """The file's JSON text: the file mapped into memory, or its gunzipped bytes when it
    starts with the gzip magic bytes. Mapping avoids copying a large file before decoding."""
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                raise TraceError(f"{path}: empty file, expected a Kineto trace (JSON)")
            text = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
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
        if _BLANK.match(text):
            raise TraceError(f"{path}: empty file, expected a Kineto trace (JSON)")
        yield text
    finally:
        if isinstance(text, mmap.mmap):
            text.close()


class _ExactTs(msgspec.Struct, gc=False):
    ts: Any = None


_EXACT_TS = msgspec.json.Decoder(
    Union[msgspec.defstruct("Trace", [("traceEvents", list[_ExactTs])], gc=False), list[_ExactTs]],
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
    return [event.ts for event in (top if isinstance(top, list) else top.traceEvents)]


def decode(data: bytes | mmap.mmap, path: Path) -> tuple[list, dict[str, Any], bool]:
    """Events (strict or lenient Structs), top-level metadata, and whether the lenient types were needed."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            top, lenient = _STRICT.decode(data), False
        except msgspec.ValidationError:
            top, lenient = _LENIENT.decode(data), True
    except msgspec.ValidationError as error:
        raise TraceError(f"{path}: not a Kineto trace ({error})") from None
    except msgspec.DecodeError as error:
        raise TraceError(f"{path}: invalid JSON ({error})") from None
    finally:
        if gc_was_enabled:
            gc.enable()
    events = top if isinstance(top, list) else top.traceEvents
    if lenient:
        for event in events:  # make them read like the strict Structs
            if event.args is None:
                event.args = _NO_LENIENT_ARGS
            if event.ph != "X":
                event.dur = None
                if event.ph not in ("i", "I"):
                    event.cat = None
    if isinstance(top, list):
        return events, {}, lenient
    metadata = {key: getattr(top, key) for key in METADATA_KEYS if getattr(top, key) is not msgspec.UNSET}
    return events, metadata, lenient
