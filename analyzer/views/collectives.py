"""Communication on one rank: every collective kernel on the GPU, and the GPU window cut into comm, compute and idle.

Which GPU work is communication. Kineto records a collective three ways: the c10d op on the CPU (`c10d::allreduce_`,
`nccl:all_reduce` annotation), `record_param_comms` (a cpu_op carrying the collective's args on torch >= 2.1:
"Collective name", "Seq", "Process Group Name", "Group size", "In msg nelems", "Out msg nelems", "dtype"), and the
NCCL/RCCL kernel its launch put on the GPU. A GPU row is `comm` when its name is an NCCL/RCCL/MSCCL kernel
(`ncclKernel_AllReduce_RING_LL_Sum_float`, `ncclDevKernel_AllGather_RING_LL`, `ncclDevKernel_Generic`, RCCL's
`ncclDevKernel_...` alike) or when it is a kernel launched directly inside `record_param_comms` (a backend whose
kernels are not named after NCCL). Gloo and other CPU backends put nothing on the GPU: their collectives do not
appear here, only as CPU time.

The model keeps the args of every record_param_comms op (TraceModel.comm_args, read while the trace is decoded:
analyzer.trace.commargs). Without them (torch < 2.1 traces) the sequence number is -1, the process group is named by
the kernel's stream (NCCL runs one stream per communicator) and bytes are -1.

The partition of the GPU window (per device, summed like analyzer.views.timeline):
    busy = union of all activity (the timeline's busy) = comm_us + compute_us
    comm_us    = union of comm kernels (overlap with compute included)
    compute_us = union of the other activity (kernels, memcpy, memset) minus the comm union: time only compute ran
    overlap_us = comm and compute at once (a part of comm_us); comm_only_us = comm_us - overlap_us
    idle_us    = the timeline's idle (no activity, Kineto overhead removed); profiler_us = window - busy - idle
so comm_us + compute_us + idle_us + profiler_us = window_us exactly, and busy / window is report.json's utilization.
"""
from __future__ import annotations

import hashlib
import re


import numpy as np

from analyzer.trace import GpuKind
from analyzer.trace.commargs import COMM_OP
from analyzer.views.timeline import activity_mask, merge_intervals

COMM_KERNEL = re.compile(r"(?:nccl|rccl|msccl)", re.IGNORECASE)
_KERNEL_COLLECTIVE = re.compile(r"(?:nccl|rccl|msccl)\w*?Kernel_([A-Za-z]+)", re.IGNORECASE)
COLUMNS = ("seq", "name", "pg", "group_size", "bytes", "step", "ordinal", "stream", "device", "start_us", "end_us",
           "dur_us")
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
               "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "char": 1, "int8": 1,
               "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complexfloat": 8,
               "complexdouble": 16}


def collective_name(kernel_name: str) -> str:
    """allreduce, allgather, reducescatter, broadcast, sendrecv, generic, ... from an NCCL/RCCL kernel name."""
    m = _KERNEL_COLLECTIVE.search(kernel_name)
    return m.group(1).lower() if m else kernel_name.split("(")[0].lower()


def _normalised(collective: str) -> str:
    """record_param_comms' "Collective name" ("_allgather_base", "all_reduce", ...) in the kernel names' words."""
    return collective.strip("_").replace("_", "").removesuffix("base").lower()


def comm_rows(ctx) -> np.ndarray:
    """Bool per GPU row: a collective kernel (by its name, or launched directly inside record_param_comms)."""
    model = ctx.model
    gpu, names = model.gpu, model.names
    named = np.fromiter((bool(COMM_KERNEL.search(n)) for n in names), bool, len(names))
    comm = named[gpu.name] if len(gpu) else np.zeros(0, bool)
    rpc = _comm_op_code(model)
    if rpc >= 0 and len(gpu):
        op = _launch_op(model)
        comm |= (gpu.kind == GpuKind.KERNEL) & (op >= 0) & (model.ops.name[np.maximum(op, 0)] == rpc)
    return comm & activity_mask(model)


def _comm_op_code(model) -> int:
    try:
        return model.names.index(COMM_OP)
    except ValueError:
        return -1


def _launch_op(model) -> np.ndarray:
    """Per GPU row: the innermost cpu_op around its launch call, -1 without one."""
    launch = model.gpu.launch
    has = launch >= 0
    return np.where(has, model.runtime.op[np.maximum(launch, 0)] if len(model.runtime) else -1, -1)


def _comm_op_of(model, rows: np.ndarray) -> np.ndarray:
    """For the given GPU rows: the record_param_comms op enclosing their launch (its innermost op or an ancestor up
    to 3 levels), -1 without one."""
    rpc = _comm_op_code(model)
    cur = _launch_op(model)[rows]
    out = np.full(len(rows), -1, np.int64)
    if rpc < 0:
        return out
    ops = model.ops
    for _ in range(4):
        live = cur >= 0
        hit = live & (out < 0) & (ops.name[np.maximum(cur, 0)] == rpc)
        out[hit] = cur[hit]
        cur = np.where(live & (out < 0), ops.parent[np.maximum(cur, 0)], -1)
    return out


def _as_int(value, default: int = -1) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


def _pg_label(args: dict) -> str | None:
    """The process group: its name, and its ranks where the trace lists them (torch names groups by creation order,
    so two disjoint subgroups can share a name); a long list is shortened to a digest, the same on every rank."""
    name = args.get("Process Group Name", args.get("Process Group ID"))
    ranks = args.get("Process Group Ranks")
    if name is None:
        return None
    if not isinstance(ranks, str) or not ranks:
        return str(name)
    return f"{name} {ranks}" if len(ranks) <= 40 else f"{name} ranks#{hashlib.sha1(ranks.encode()).hexdigest()[:8]}"


def collective_columns(ctx) -> dict[str, np.ndarray | list] | None:
    """One entry per collective kernel on the GPU, in start order, as columns (COLUMNS less `ordinal`, which the
    fleet's table adds per process group and step); see the module's docstring for the columns' rules. None when
    the trace has no collective kernel."""
    model = ctx.model
    gpu, names = model.gpu, model.names
    rows = np.flatnonzero(comm_rows(ctx))
    rows = rows[np.argsort(gpu.start_ns[rows], kind="stable")]
    n = len(rows)
    if not n:
        return None
    start, end = gpu.start_ns[rows], gpu.end_ns[rows]
    stream = gpu.stream[rows].astype(np.int64)
    launch = gpu.launch[rows]
    when = np.where(launch >= 0, model.runtime.start_ns[np.maximum(launch, 0)] if len(model.runtime) else start,
                    start)
    step = ctx.steps.index_at(when) if len(ctx.steps) else np.full(n, -1, np.int64)
    kernel_names = [collective_name(names[c]) for c in gpu.name[rows].tolist()]
    seq = np.full(n, -1, np.int64)
    size = np.full(n, -1, np.int64)
    nbytes = np.full(n, -1, np.int64)
    pg = [f"stream {s}" for s in stream.tolist()]
    op = _comm_op_of(model, rows)
    if (op >= 0).any():
        by_ext = model.comm_args
        ext = model.ops.external_id[np.maximum(op, 0)]
        for i in np.flatnonzero(op >= 0).tolist():
            args = by_ext.get(int(ext[i]))
            if not args:
                continue
            seq[i] = _as_int(args.get("Seq"))
            size[i] = _as_int(args.get("Group size"))
            label = _pg_label(args)
            if label is not None:
                pg[i] = label
            if isinstance(args.get("Collective name"), str) and args["Collective name"]:
                kernel_names[i] = _normalised(args["Collective name"])
            elems = max(_as_int(args.get("In msg nelems")), _as_int(args.get("Out msg nelems")))
            width = DTYPE_BYTES.get(str(args.get("dtype", "")).lower().replace("torch.", ""))
            if elems >= 0 and width:
                nbytes[i] = elems * width
    return {"seq": seq, "name": kernel_names, "pg": pg, "group_size": size, "bytes": nbytes,
            "step": step.astype(np.int64), "stream": stream, "device": gpu.device[rows].astype(np.int64),
            "start_us": start / 1e3, "end_us": end / 1e3, "dur_us": (end - start) / 1e3}




def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    s, e = merge_intervals(starts, ends)
    return int((e - s).sum())


def comm_totals(ctx) -> dict:
    """The GPU window cut into comm, compute, idle and the profiler's own time (µs, summed over devices); see the
    module's docstring for the rule. comm_share = comm_us / busy_us; kernels: how many collective kernels ran."""
    model = ctx.model
    gpu = model.gpu
    active = activity_mask(model)
    comm = comm_rows(ctx)
    totals = dict.fromkeys(("window_us", "busy_us", "comm_us", "compute_us", "overlap_us", "comm_only_us",
                            "idle_us", "profiler_us"), 0.0)
    for dev in ctx.timeline.devices:
        on = gpu.device == dev.device
        c, p = np.flatnonzero(on & comm), np.flatnonzero(on & active & ~comm)
        comm_ns = _union_ns(gpu.start_ns[c], gpu.end_ns[c])
        compute_ns = _union_ns(gpu.start_ns[p], gpu.end_ns[p])
        busy_ns = dev.busy_ns
        overlap_ns = comm_ns + compute_ns - busy_ns
        parts = {"window_us": dev.window_ns, "busy_us": busy_ns, "comm_us": comm_ns, "compute_us": busy_ns - comm_ns,
                 "overlap_us": overlap_ns, "comm_only_us": comm_ns - overlap_ns, "idle_us": dev.idle_ns,
                 "profiler_us": dev.window_ns - busy_ns - dev.idle_ns}
        for key, ns in parts.items():
            totals[key] += ns / 1e3
    totals["comm_share"] = round(totals["comm_us"] / totals["busy_us"], 4) if totals["busy_us"] else None
    totals["kernels"] = int(comm.sum())
    return totals
