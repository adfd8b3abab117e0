"""One-time costs inside a profiled window: runtime calls that a warmed-up process would not make again.

- creation: streams, events, contexts, library handles, graph instantiation, module/library loading, device
  property queries made once;
- first call: a call at least 20x slower than its API's median (and >= 0.5 ms) inside the first invocation of the op
  that made it (lazy module loading in a first kernel launch, context set-up in a first cudaFree, cuDNN/cuBLAS
  initialisation), or, outside any op, the first call of its API on that thread;
- first allocation: the caching allocator reserving device (or pinned host) memory before anything was released in
  the window, in or before the first step: the cache filling up, not churn;
- first step only: every reserve and release of the window in its first step (a first iteration: a library's
  workspaces, autotuning's trial buffers) and none in the steps after it: the pool settling, not churn; only where
  that step can be the process's first (numbered 0 or 1, or not numbered);
- shape set-up: made inside a library op's one-time set-up for a new input shape (analyzer.views.setup; labelled by
  the analysis context, which knows those calls).
"""
from __future__ import annotations

import re

import numpy as np

from analyzer.views import apis
from analyzer.views.steps import StepRanges
from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys

LABELS = ("", "creation", "first call", "first allocation", "first step only", "shape set-up")
NONE, CREATION, FIRST_CALL, FIRST_ALLOCATION, FIRST_STEP_MEMORY, SHAPE_SETUP = range(6)
# Python code that only runs the first time: an import, a JIT compilation (Triton, Dynamo/Inductor, flashinfer).
FIRST_TIME_FRAME = re.compile(
    r"^<frozen importlib\._bootstrap>\(\d+\): _find_and_load$"
    r"|(^|/)triton/compiler/compiler\.py\(\d+\): compile$"
    r"|(^|/)torch/_dynamo/convert_frame\.py\(\d+\): _compile$"
    r"|(^|/)torch/_inductor/compile_fx\.py\(\d+\): compile_fx$"
    r"|(^|/)flashinfer/jit/")
ONE_TIME = frozenset({
    "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority", "cudaEventCreate",
    "cudaEventCreateWithFlags", "cudaGetDeviceProperties", "cudaGetDeviceCount", "cudaDriverGetVersion",
    "cudaRuntimeGetVersion", "cudaDeviceReset", "cudaSetDevice", "cudaInitDevice", "cudaGraphInstantiate",
    "cudaGraphInstantiateWithFlags", "cudaGraphInstantiateWithParams", "cudaGraphUpload", "cudaGetSymbolAddress",
    "cudaHostRegister",
    "cuInit", "cuCtxCreate", "cuCtxCreate_v2", "cuDevicePrimaryCtxRetain", "cuStreamCreate",
    "cuStreamCreateWithPriority", "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
    "cuModuleGetFunction", "cuLibraryLoadData", "cuLibraryLoadFromFile", "cuLibraryGetKernel", "cuLibraryGetModule",
    "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphUpload",
    "hipInit", "hipStreamCreate", "hipStreamCreateWithFlags", "hipStreamCreateWithPriority", "hipEventCreate",
    "hipEventCreateWithFlags", "hipModuleLoad", "hipModuleLoadData", "hipModuleLoadDataEx", "hipModuleGetFunction",
    "hipGraphInstantiate", "hipGraphInstantiateWithFlags", "hipGraphUpload", "hipGetDeviceCount", "hipSetDevice",
    "hipCtxCreate", "hipDevicePrimaryCtxRetain", "hipHostRegister",
})
OUTLIER_FACTOR = 20
OUTLIER_MIN_NS = 500_000


def one_time_rows(model: TraceModel, classes: np.ndarray, outermost_ops: np.ndarray, steps: StepRanges,
                  start_up: np.ndarray | None = None) -> np.ndarray:
    """Per runtime row: its one-time label code (NONE for steady-state calls); start_up: start_up_calls(model), where
    the caller has it."""
    rt, names = model.runtime, model.names
    label = np.zeros(len(rt), np.int8)
    if not len(rt):
        return label
    one_time_codes = [c for c, n in enumerate(names) if n in ONE_TIME]
    label[np.isin(rt.name, one_time_codes)] = CREATION
    start_up = start_up_calls(model) if start_up is None else start_up
    label[_first_call_outliers(model, outermost_ops, start_up) & (label == NONE)] = FIRST_CALL
    label[_first_allocations(model, classes, label, steps)] = FIRST_ALLOCATION
    label[_first_step_memory(model, classes, label, steps)] = FIRST_STEP_MEMORY
    return label


def _first_call_outliers(model: TraceModel, outermost_ops: np.ndarray, head_outlier: np.ndarray) -> np.ndarray:
    rt = model.runtime
    dur = rt.end_ns - rt.start_ns
    outlier = (dur >= OUTLIER_MIN_NS) & (dur >= OUTLIER_FACTOR * _median_by_api(rt.name, dur))
    outlier |= head_outlier
    if not outlier.any():
        return outlier
    # a launch that is its kernel's first in the window (its module is loaded then), and any call of the start-up
    first = _first_kernel_launch(model) | head_outlier
    (key,) = thread_keys([rt.pid], [rt.tid])
    outer = np.where(rt.op >= 0, outermost_ops[np.maximum(rt.op, 0)], -1) if len(outermost_ops) else \
        np.full(len(rt), -1)
    with_op = outer >= 0
    if with_op.any():
        ops = model.ops
        (op_key,) = thread_keys([ops.pid], [ops.tid])
        is_outer = np.zeros(len(ops), bool)
        is_outer[outer[with_op]] = True
        outer_rows = np.flatnonzero(is_outer)
        first_invocation = _first_per_group(op_key[outer_rows], ops.name[outer_rows], ops.start_ns[outer_rows],
                                            outer_rows)
        first[with_op] |= np.isin(outer[with_op], first_invocation)
    loose = ~with_op
    if loose.any():
        rows = np.flatnonzero(loose)
        first[_first_per_group(key[rows], rt.name[rows], rt.start_ns[rows], rows)] = True
    return outlier & first


def start_up_calls(model: TraceModel) -> np.ndarray:
    """Per runtime row: a call before its process's first GPU work (starting up: context, handles, libraries) at
    least OUTLIER_MIN_NS long and OUTLIER_FACTOR times the same API's calls once GPU work runs, where it makes any
    (two 4 s cudaFree calls at start-up are each other's median). A window that holds one holds its process's
    start-up."""
    rt = model.runtime
    dur = rt.end_ns - rt.start_ns
    head = _before_first_gpu_work(model)
    later = _median_by_api(rt.name[~head], dur[~head], len(model.names))
    return head & (dur >= OUTLIER_MIN_NS) & ((later[rt.name] < 0) | (dur >= OUTLIER_FACTOR * later[rt.name]))


def _median_by_api(names: np.ndarray, dur: np.ndarray, n_names: int | None = None) -> np.ndarray:
    """The median duration of each call's API, per call (n_names given: per name code instead, -1 for none)."""
    codes, inverse = np.unique(names, return_inverse=True)
    median = np.zeros(len(codes))
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(codes) + 1))
    for k in range(len(codes)):
        median[k] = np.median(dur[order[bounds[k]:bounds[k + 1]]])
    if n_names is None:
        return median[inverse]
    out = np.full(n_names, -1.0)
    out[codes] = median
    return out


def _first_kernel_launch(model: TraceModel) -> np.ndarray:
    """Per runtime row: it launched the first GPU activity of its kernel's name in the window."""
    rt, gpu = model.runtime, model.gpu
    out = np.zeros(len(rt), bool)
    linked = np.flatnonzero(gpu.launch >= 0)
    if not len(linked):
        return out
    order = np.lexsort((gpu.start_ns[linked], gpu.name[linked]))
    names = gpu.name[linked][order]
    first = linked[order][np.r_[True, names[1:] != names[:-1]]]
    out[gpu.launch[first]] = True
    return out


def _before_first_gpu_work(model: TraceModel) -> np.ndarray:
    """Per runtime row: made before the first GPU activity that its process launched (the process still starting
    up, as far as the window shows)."""
    rt, gpu = model.runtime, model.gpu
    out = np.zeros(len(rt), bool)
    linked = np.flatnonzero(gpu.launch >= 0)
    for pid in np.unique(rt.pid[gpu.launch[linked]]).tolist() if len(linked) else ():
        mine = linked[rt.pid[gpu.launch[linked]] == pid]
        out |= (rt.pid == pid) & (rt.end_ns <= gpu.start_ns[mine].min())
    return out


def first_call_ops(model: TraceModel, outermost_ops: np.ndarray) -> np.ndarray:
    """Rows of outermost ops whose first invocation on a thread took at least 20x (and >= 0.5 ms more than) the
    median of their later invocations: the first call paid for set-up (library loading, cuDNN heuristics...)."""
    ops = model.ops
    is_outer = np.zeros(len(ops), bool)
    is_outer[outermost_ops[outermost_ops >= 0]] = True
    rows = np.flatnonzero(is_outer)
    if len(rows) < 2:
        return np.zeros(0, np.int64)
    (key,) = thread_keys([ops.pid[rows]], [ops.tid[rows]])
    name, start = ops.name[rows], ops.start_ns[rows]
    dur = ops.end_ns[rows] - start
    order = np.lexsort((start, name, key))
    k, n, d = key[order], name[order], dur[order]
    new = np.ones(len(order), bool)
    new[1:] = (k[1:] != k[:-1]) | (n[1:] != n[:-1])
    first = np.flatnonzero(new)
    stop = np.r_[first[1:], len(order)]
    out = []
    for lo, hi in zip(first.tolist(), stop.tolist()):
        if hi - lo < 2:
            continue
        later = float(np.median(d[lo + 1:hi]))
        if d[lo] >= OUTLIER_FACTOR * later and d[lo] - later >= OUTLIER_MIN_NS:
            out.append(rows[order[lo]])
    return np.asarray(out, np.int64)


def _first_per_group(key: np.ndarray, name: np.ndarray, start: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The row that starts first in each (key, name) group."""
    order = np.lexsort((start, name, key))
    k, n = key[order], name[order]
    new = np.ones(len(order), bool)
    new[1:] = (k[1:] != k[:-1]) | (n[1:] != n[:-1])
    return rows[order[new]]


def _first_step_memory(model: TraceModel, classes: np.ndarray, label: np.ndarray, steps: StepRanges) -> np.ndarray:
    """The memory calls left (not yet one-time), where all of them lie in the window's first step (and steps follow it
    with none)."""
    rt = model.runtime
    rows = np.flatnonzero(((classes == apis.IS_ALLOC) | (classes == apis.IS_HOST_ALLOC)) & (label == NONE))
    if not len(rows) or len(steps) < 2 or not is_first_iteration(steps.names[0]):
        return np.zeros(0, np.int64)
    at = steps.index_at(rt.start_ns[rows])
    if (at != 0).any():  # the window's first step alone (a later step's growth is the loop's own)
        return np.zeros(0, np.int64)
    return rows


STEP_NUMBER = re.compile(r"#(\d+)$")


def is_first_iteration(step_name: str) -> bool:
    """Whether a window's first step can be its process's first iteration: numbered 0 or 1 (ProfilerStep#0, a
    loop's step#1), or not numbered (a prefill). A window starting at step #500 starts mid-run."""
    m = STEP_NUMBER.search(step_name)
    return m is None or int(m.group(1)) <= 1


def _first_allocations(model: TraceModel, classes: np.ndarray, label: np.ndarray, steps: StepRanges) -> np.ndarray:
    rt, names = model.runtime, model.names
    memory_calls = (classes == apis.IS_ALLOC) | (classes == apis.IS_HOST_ALLOC)
    reserve_codes = [c for c, n in enumerate(names) if n in apis.ALLOC_RESERVE or n in apis.HOST_RESERVE]
    reserve = memory_calls & np.isin(rt.name, reserve_codes)
    release = memory_calls & ~reserve & (label == NONE)
    first_release = rt.start_ns[release].min() if release.any() else np.iinfo(np.int64).max
    limit = first_release
    if len(steps):
        limit = min(limit, int(steps.cpu_end_ns[0]))
    return reserve & (rt.start_ns < limit) & (label == NONE)
