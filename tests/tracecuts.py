"""Synthetic cuts of real traces, each what a profiler that did not record something would have written: the GPU
work of graph launches dropped, the GPU clock shifted, the window cut mid-step, a stream's kernels duplicated.
Each writes a new gzipped Kineto trace beside nothing else (meta.json is not copied: the cut is of the trace)."""
from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy", "Memset"}
GRAPH_LAUNCH = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}


def read(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def write(trace: dict, path: Path) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


def _is_gpu(e: dict) -> bool:
    return e.get("cat") in GPU_CATS


def drop_graph_kernels(trace: dict) -> tuple[dict, int]:
    """Every graph launch kept, the GPU work it ran dropped (and its flow arrows). Returns the trace and the number
    of graph launches whose work is now missing."""
    out = copy.deepcopy(trace)
    events = out["traceEvents"]
    graph = {e["args"]["correlation"] for e in events if e.get("name") in GRAPH_LAUNCH
             and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    keep = []
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if _is_gpu(e) and args.get("correlation") in graph:
            continue
        if e.get("cat") == "ac2g" and e.get("id") in graph:
            continue
        keep.append(e)
    out["traceEvents"] = keep
    return out, len(graph)


def shift_gpu_clock(trace: dict, shift_us: float) -> dict:
    """Every GPU event moved by shift_us (negative: the GPU's clock reads earlier than the CPU's)."""
    out = copy.deepcopy(trace)
    for e in out["traceEvents"]:
        if _is_gpu(e) and "ts" in e:
            e["ts"] = e["ts"] + shift_us
    return out


def cut_window(trace: dict, at_us: float) -> dict:
    """Recording stopped at `at_us`: later events dropped, events open at that instant closed there."""
    out = copy.deepcopy(trace)
    keep = []
    for e in out["traceEvents"]:
        ts = e.get("ts")
        if ts is None or e.get("ph") not in ("X", "i", "s", "f"):
            keep.append(e)
            continue
        if ts >= at_us:
            continue
        if e.get("ph") == "X" and ts + e.get("dur", 0) > at_us:
            e["dur"] = at_us - ts
        keep.append(e)
    out["traceEvents"] = keep
    return out


def duplicate_stream(trace: dict, stream: int) -> tuple[dict, int]:
    """Every kernel of one stream written twice (what a buggy exporter or a merged trace does)."""
    out = copy.deepcopy(trace)
    extra = [copy.deepcopy(e) for e in out["traceEvents"] if e.get("cat") == "kernel"
             and isinstance(e.get("args"), dict) and e["args"].get("stream") == stream]
    out["traceEvents"].extend(extra)
    return out, len(extra)


def strip_arg(trace: dict, key: str) -> tuple[dict, int]:
    """One args key removed from every event (what a profiler run without that setting writes: "Input Dims" without
    record_shapes). Returns the trace and how many events lost it."""
    out = copy.deepcopy(trace)
    n = 0
    for e in out["traceEvents"]:
        if isinstance(e.get("args"), dict) and key in e["args"]:
            del e["args"][key]
            n += 1
    return out, n


def drop_category(trace: dict, cat: str) -> tuple[dict, int]:
    """Every event of one category dropped ("python_function": a trace recorded without with_stack)."""
    out = copy.deepcopy(trace)
    keep = [e for e in out["traceEvents"] if e.get("cat") != cat]
    dropped = len(out["traceEvents"]) - len(keep)
    out["traceEvents"] = keep
    return out, dropped
