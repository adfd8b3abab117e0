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


def renumber_steps(trace: dict, offset: int) -> dict:
    """Every `name#N` annotation (ProfilerStep#N, decode_step#N) renumbered N + offset: the same window, taken later
    in the run."""
    import re
    out = copy.deepcopy(trace)
    for e in out["traceEvents"]:
        if e.get("cat") in ("user_annotation", "gpu_user_annotation") and isinstance(e.get("name"), str):
            e["name"] = re.sub(r"#(\d+)$", lambda m: f"#{int(m.group(1)) + offset}", e["name"])
    return out


def shift_clock(trace: dict, shift_us: float) -> dict:
    """Every event moved by shift_us: the same run, recorded against another clock origin."""
    out = copy.deepcopy(trace)
    for e in out["traceEvents"]:
        if "ts" in e and isinstance(e["ts"], (int, float)):
            e["ts"] = e["ts"] + shift_us
    return out


def drop_memory_events(trace: dict) -> tuple[dict, int]:
    """The [memory] (and [OutOfMemory]) instants dropped: the trace profile_memory=False would write."""
    out = copy.deepcopy(trace)
    keep = [e for e in out["traceEvents"] if e.get("name") not in ("[memory]", "[OutOfMemory]")]
    dropped = len(out["traceEvents"]) - len(keep)
    out["traceEvents"] = keep
    return out, dropped


def scale_spans(trace: dict, annotation_prefix: str, frame_suffix: str, factor: float) -> tuple[dict, int]:
    """Every CPU annotation whose name starts with `annotation_prefix`, and every Python frame whose name ends with
    `frame_suffix`, made `factor` times as long (their starts kept): a wait that ended sooner. Returns the trace
    and the number of annotations changed."""
    out = copy.deepcopy(trace)
    n = 0
    for e in out["traceEvents"]:
        name = str(e.get("name", ""))
        if "dur" not in e:
            continue
        if e.get("cat") == "user_annotation" and name.startswith(annotation_prefix):
            e["dur"] = e["dur"] * factor
            n += 1
        elif e.get("cat") == "python_function" and name.endswith(frame_suffix):
            e["dur"] = e["dur"] * factor
    return out, n


def duplicate_last_step(trace: dict, step_prefix: str = "ProfilerStep#") -> tuple[dict, str]:
    """The last `step_prefix` step run once more right after the window: every complete event inside its span (CPU
    and GPU) copied, moved past the last event, its ids (correlation, External id, Python id) made new, the step
    renumbered. Returns the trace and the new step's name."""
    import re
    out = copy.deepcopy(trace)
    events = out["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(step_prefix)]
    last = max(steps, key=lambda e: e["ts"])
    lo = last["ts"]
    gpu_lo = min((e["ts"] for e in events if _is_gpu(e) and e.get("ph") == "X" and e["ts"] >= lo), default=lo)
    hi = max(e["ts"] + e.get("dur", 0) for e in events if e.get("ph") == "X" and e["ts"] >= lo)
    shift = hi - lo + 10.0
    n = int(re.search(r"#(\d+)$", last["name"]).group(1))
    name = f"{step_prefix}{n + 1}"
    big = 10 ** 9
    copies = []
    for e in events:
        if e.get("ph") != "X" or e.get("ts", -1) < min(lo, gpu_lo) or e.get("cat") == "Trace":
            continue
        c = copy.deepcopy(e)
        c["ts"] = e["ts"] + shift
        args = c.get("args") if isinstance(c.get("args"), dict) else None
        if args is not None:
            for key in ("correlation", "External id", "Python id", "Python parent id"):
                if isinstance(args.get(key), int):
                    args[key] += big
        if c.get("name") == last["name"]:
            c["name"] = name
        copies.append(c)
    events.extend(copies)
    for e in events:
        if e.get("cat") == "Trace" and "dur" in e:
            e["dur"] = max(e["dur"], hi + shift - e["ts"])
    return out, name
