"""CUDA / HIP runtime and driver call names, by what they do to the CPU and the GPU."""
from __future__ import annotations

import numpy as np

from analyzer.trace import GpuKind, TraceModel

LAUNCH = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
    "cudaGraphLaunch", "cuGraphLaunch",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel", "hipGraphLaunch", "hipExtLaunchMultiKernelMultiDevice",
})
GRAPH_LAUNCH = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
# Calls that block the calling CPU thread until GPU work has finished.
SYNC = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
})
# The synchronizes that wait for the whole device.
DEVICE_SYNC = frozenset({"cudaDeviceSynchronize", "cuCtxSynchronize", "hipDeviceSynchronize"})
# Copies that are synchronous by API (not the *Async variants).
SYNC_COPY = frozenset({
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol", "cudaMemcpyPeer",
    "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoD",
    "hipMemcpy", "hipMemcpyWithStream", "hipMemcpyDtoH", "hipMemcpyHtoD", "hipMemcpy2D",
})
# Device memory reservation and release (the caching allocator's misses, empty_cache, expandable segments).
ALLOC = frozenset({
    "cudaMalloc", "cudaFree", "cudaMallocManaged", "cuMemAlloc", "cuMemFree", "cuMemCreate", "cuMemMap",
    "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess",
    "hipMalloc", "hipFree", "hipMallocManaged", "hipMemCreate", "hipMemMap", "hipMemUnmap", "hipMemRelease",
    "hipExtMallocWithFlags",
})
ALLOC_RESERVE = frozenset({"cudaMalloc", "cudaMallocManaged", "cuMemAlloc", "cuMemCreate", "cuMemMap", "hipMalloc",
                           "hipMallocManaged", "hipMemCreate", "hipMemMap", "hipExtMallocWithFlags"})
HOST_ALLOC = frozenset({"cudaHostAlloc", "cudaMallocHost", "cudaFreeHost", "cudaHostRegister",
                        "cudaHostUnregister", "hipHostMalloc", "hipHostFree", "hipHostRegister"})
HOST_RESERVE = frozenset({"cudaHostAlloc", "cudaMallocHost", "cudaHostRegister", "hipHostMalloc", "hipHostRegister"})

# runtime call classes (int8 codes)
OTHER, IS_LAUNCH, IS_SYNC, IS_SYNC_COPY, IS_ALLOC, IS_HOST_ALLOC = range(6)


def runtime_classes(model: TraceModel) -> np.ndarray:
    """The class code of every runtime row."""
    table = np.zeros(len(model.names), dtype=np.int8)
    for code, name in enumerate(model.names):
        if name in LAUNCH:
            table[code] = IS_LAUNCH
        elif name in SYNC:
            table[code] = IS_SYNC
        elif name in SYNC_COPY:
            table[code] = IS_SYNC_COPY
        elif name in ALLOC:
            table[code] = IS_ALLOC
        elif name in HOST_ALLOC:
            table[code] = IS_HOST_ALLOC
    return table[model.runtime.name] if len(model.runtime) else np.zeros(0, np.int8)


def copy_direction(name: str) -> tuple[str, str, str] | None:
    """('DtoH', 'Device', 'Pageable') from 'Memcpy DtoH (Device -> Pageable)'; None for other names."""
    if not name.startswith("Memcpy "):
        return None
    direction, _, rest = name[7:].partition(" ")
    src, _, dst = rest.strip("()").partition(" -> ")
    return direction, src, dst


def blocking_copy_rows(model: TraceModel) -> np.ndarray:
    """Runtime rows of async copies that still block the CPU: to or from pageable host memory."""
    rt, gpu = model.runtime, model.gpu
    if not len(rt):
        return np.zeros(0, np.int64)
    pageable = np.fromiter((("Pageable" in n) and n.startswith("Memcpy") for n in model.names), dtype=bool,
                           count=len(model.names))
    has_gpu = rt.gpu >= 0
    rows = np.flatnonzero(has_gpu)
    g = rt.gpu[rows]
    keep = (gpu.kind[g] == GpuKind.MEMCPY) & pageable[gpu.name[g]]
    return rows[keep]


def is_hip(model: TraceModel) -> bool:
    """Whether the trace's runtime calls speak HIP (ROCm) rather than CUDA."""
    codes = np.flatnonzero(np.bincount(model.runtime.name, minlength=len(model.names))) if len(model.runtime) else []
    hip = sum(1 for c in codes if model.names[c].startswith("hip"))
    cuda = sum(1 for c in codes if model.names[c].startswith(("cuda", "cu")))
    return hip > cuda
