"""The columnar trace model: one table of equal-length numpy columns per kind of event.

Every table's rows are sorted by start time. Cross-references between tables are
int64 row indices, -1 where there is none; names are int32 codes into `names`.
Times are integer nanoseconds on the trace's own clock (ts * 1000).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

import numpy as np


class GpuKind(enum.IntEnum):
    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    SYNC = 3


@dataclass(frozen=True, repr=False)
class Table:
    """Columns of one length, made read-only on construction."""

    def __post_init__(self) -> None:
        lengths = {f.name: len(getattr(self, f.name)) for f in fields(self)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{type(self).__name__}: columns differ in length: {lengths}")
        for f in fields(self):
            getattr(self, f.name).flags.writeable = False

    def __len__(self) -> int:
        return len(getattr(self, fields(self)[0].name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rows={len(self)}, columns={[f.name for f in fields(self)]})"


@dataclass(frozen=True, repr=False)
class Ops(Table):
    """cpu_op and user_annotation slices; parents precede their children."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    name: np.ndarray
    external_id: np.ndarray
    is_annotation: np.ndarray  # bool: user_annotation (record_function, ProfilerStep#N)
    parent: np.ndarray  # innermost enclosing op (annotations included) on the same thread
    depth: np.ndarray  # int32, 0 at the root
    frame: np.ndarray  # innermost python frame on the same thread enclosing the op
    shape: np.ndarray  # int32 code into names of the op's Input Dims as written (record_shapes=True), -1 none


@dataclass(frozen=True, repr=False)
class Frames(Table):
    """python_function slices (with_stack=True)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    name: np.ndarray
    python_id: np.ndarray
    parent: np.ndarray  # the frame whose Python id is this frame's Python parent id


@dataclass(frozen=True, repr=False)
class Runtime(Table):
    """cuda_runtime and cuda_driver calls (HIP calls too: ROCm traces file them as cuda_runtime)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    name: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    cbid: np.ndarray
    is_driver: np.ndarray  # bool: cuda_driver (cuLaunchKernel, ...)
    op: np.ndarray  # innermost enclosing cpu_op (annotations excluded) on the same thread
    frame: np.ndarray  # innermost enclosing python frame on the same thread
    gpu: np.ndarray  # first gpu row with the same correlation; all of them point back via gpu.launch


@dataclass(frozen=True, repr=False)
class Gpu(Table):
    """Kernels, memcpys, memsets and cuda_sync waits on the device."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    device: np.ndarray
    stream: np.ndarray  # args.stream where it is an integer (-1: Context Sync), else tid
    kind: np.ndarray  # int8 GpuKind
    name: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    bytes: np.ndarray  # memcpy/memset size, -1 absent
    launch: np.ndarray  # runtime row with the same correlation


@dataclass(frozen=True, repr=False)
class GpuAnnotations(Table):
    start_ns: np.ndarray
    end_ns: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    name: np.ndarray
    external_id: np.ndarray  # equals the CPU user_annotation's External id


@dataclass(frozen=True, repr=False)
class Memory(Table):
    """[memory] allocator events (and [OutOfMemory]); pid/tid are the allocating CPU thread."""

    ts_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    bytes: np.ndarray  # signed: > 0 alloc, < 0 free
    total_allocated: np.ndarray
    total_reserved: np.ndarray
    device_type: np.ndarray  # c10::DeviceType: 0 CPU, 1 CUDA
    device_id: np.ndarray  # -1 for CPU
    addr: np.ndarray  # -1 absent
    is_oom: np.ndarray  # bool: [OutOfMemory]
    op: np.ndarray  # innermost cpu_op on the same thread open at ts


@dataclass(frozen=True, repr=False)
class Overhead(Table):
    start_ns: np.ndarray
    end_ns: np.ndarray
    name: np.ndarray


@dataclass(frozen=True, repr=False)
class Steps(Table):
    """User annotations marking steps: ProfilerStep#N, prefill, decode_step#N, any `word#N`."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    name: np.ndarray
    op: np.ndarray  # the annotation's row in ops


@dataclass(frozen=True, repr=False)
class TraceModel:
    path: str
    metadata: dict  # top-level keys: deviceProperties, distributedInfo, cuda_*_version, ...
    names: tuple[str, ...]
    ops: Ops
    frames: Frames
    runtime: Runtime
    gpu: Gpu
    gpu_annotations: GpuAnnotations
    memory: Memory
    overhead: Overhead
    steps: Steps
    # What is wrong in the trace: reason -> count (skipped rows, odd values, duplicates, missing launch calls).
    warnings: dict[str, int] = field(default_factory=dict)
    synthetic_ids: dict[int, str] = field(default_factory=dict)  # negative pid/tid -> the string in the trace
    # What is worth knowing but not wrong: reason -> count (GPU work launched before the window began, the legacy
    # exporter's layout, the slower lenient decode).
    notes: dict[str, int] = field(default_factory=dict)
    # Activity of devices that are neither CUDA nor HIP GPUs: category (lower case, e.g. "mtia_runtime") -> events.
    foreign_activity: dict[str, int] = field(default_factory=dict)
    # External id -> args of each record_param_comms op (a collective's name, Seq, process group, sizes, dtype).
    comm_args: dict[int, dict] = field(default_factory=dict)
    # (start, end) ns of the profiler's own span (`PyTorch Profiler (N)`): the window it recorded, None if absent
    profiler_span_ns: tuple[int, int] | None = None

    def __repr__(self) -> str:
        tables = ("ops", "frames", "runtime", "gpu", "gpu_annotations", "memory", "overhead", "steps")
        counts = ", ".join(f"{t}={len(getattr(self, t))}" for t in tables)
        return f"TraceModel({self.path!r}, {counts})"

    def frame_chain(self, frame_row: int, limit: int | None = None) -> list[str]:
        """Names of the frame and its callers, innermost first (at most `limit` of them)."""
        chain: list[str] = []
        row = int(frame_row)
        parents, names, codes = self.frames.parent, self.names, self.frames.name
        bound = len(parents) if limit is None else min(limit, len(parents))  # also guards a cyclic parent
        while row >= 0 and len(chain) < bound:
            chain.append(names[codes[row]])
            row = int(parents[row])
        return chain

    @property
    def foreign_device_types(self) -> tuple[str, ...]:
        """The device types behind foreign_activity ("MTIA", "XPU", "HPU", "Glow", "PrivateUse1"), sorted."""
        from .parse import foreign_device
        return tuple(sorted({foreign_device(c) or "unknown" for c in self.foreign_activity}))

    def gpu_window(self) -> tuple[int, int] | None:
        """(first GPU activity start, last GPU activity end) in ns, or None on a CPU-only trace."""
        if len(self.gpu) == 0:
            return None
        return int(self.gpu.start_ns.min()), int(self.gpu.end_ns.max())
