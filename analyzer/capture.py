"""`python -m analyzer capture WORKLOAD.yaml`: time the workload without the profiler, then profile it, then
record the source line of each synchronizing call; write a run folder under traces/.

Imports only torch, pyyaml and the standard library (it must run on a bare GPU machine from the repo root).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

from analyzer.errors import UsageError
from analyzer.progress import Progress
from analyzer.runfolder import RunFolder, utc_stamp, write_json_atomic
from analyzer.workload import Workload

TRACE_FILE = "rank0.trace.json.gz"
META_FILE = "meta.json"
META_SCHEMA = "gpu-idle-analyzer/run-meta/1"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _torch():
    import torch  # deferred: `python -m analyzer --help` and the analyzer must not pay for it
    return torch


def resolve_device(workload: Workload, notes: list[str]):
    torch = _torch()
    requested = workload["device"]
    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        if has_cuda:
            requested = "cuda"
        else:
            notes.append("device: auto resolved to CPU because torch sees no CUDA device; "
                         "timings and traces describe the CPU run")
            requested = "cpu"
    if requested.startswith("cuda"):
        if not has_cuda:
            raise UsageError(f"{workload.path}: key 'device': {requested!r} needs CUDA, but torch "
                             f"{torch.__version__} sees no CUDA device; allowed here: auto, cpu")
        index = int(requested.split(":")[1]) if ":" in requested else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise UsageError(f"{workload.path}: key 'device': {requested!r} does not exist; "
                             f"{torch.cuda.device_count()} CUDA device(s) visible")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if workload["mode"] == "cuda_graph":
        raise UsageError(f"{workload.path}: key 'mode': 'cuda_graph' needs a CUDA device; allowed on CPU: eager")
    return torch.device("cpu")


def resolve_dtype(workload: Workload, device):
    torch = _torch()
    name = workload["dtype"]
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else "float32"
    return getattr(torch, name)


def build_model(workload: Workload, device, dtype):
    from workloads.qwen2 import PRESETS, CheckpointError, load_checkpoint, random_model
    layers = workload["model.layers"]
    if workload["model.checkpoint"]:
        try:
            return load_checkpoint(workload["model.checkpoint"], device, dtype, layers)
        except CheckpointError as exc:
            raise UsageError(f"{workload.path}: key 'model.checkpoint': {exc}") from None
    return random_model(PRESETS[workload["model.preset"]].with_layers(layers), device, dtype, workload["seed"])


def load_script(workload: Workload):
    path = workload.script_path()
    module_name = f"workloads.{path.stem}" if path.parent == REPO_ROOT / "workloads" else f"_workload_{path.stem}"
    try:
        if module_name.startswith("workloads."):
            module = importlib.import_module(module_name)
        else:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except UsageError as exc:  # the script's own one-line message, e.g. an optional dependency it lacks
        raise UsageError(f"{workload.path}: key 'script': {exc}") from None
    except Exception as exc:  # a broken script is the user's input: report it on one line
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise UsageError(f"{workload.path}: key 'script': {path} failed to import at "
                         f"{frame.filename}:{frame.lineno}: {exc.__class__.__name__}: {exc}") from None
    if not hasattr(module, "Workload"):
        raise UsageError(f"{workload.path}: key 'script': {path} defines no `Workload` class")
    return module.Workload


def _sync(device) -> None:
    if device.type == "cuda":
        _torch().cuda.synchronize(device)


def _summarize_ms(values: list[float]) -> dict:
    ordered = sorted(values)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"mean": statistics.fmean(values), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
            "min": ordered[0], "max": ordered[-1]}


def tokens_per_step(wl) -> int | None:
    """Tokens one step() adds per sequence: the script's `tokens_per_step`, else 1 for a decode step."""
    tokens = getattr(wl, "tokens_per_step", None)
    return tokens if tokens is not None else (1 if wl.step_label == "decode_step" else None)


def time_unprofiled(wl, device, steps: int, warmup_steps: int, batch_size: int, progress: Progress) -> dict:
    """Per-step latency without the profiler. On CUDA, events between step starts give the per-step times and a
    synchronize brackets the timed region only."""
    torch = _torch()
    progress.phase("warm-up", warmup_steps + 1)
    wl.new_sequence()
    progress.advance()
    for _ in range(warmup_steps):
        wl.step()
        progress.advance()
    _sync(device)
    progress.phase("timing (no profiler)", steps + 1)
    t0 = time.perf_counter()
    wl.new_sequence()
    _sync(device)
    prefill_ms = (time.perf_counter() - t0) * 1e3 if wl.has_prefill else None
    progress.advance()
    cuda = device.type == "cuda"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else []
    cpu_marks = [0.0] * (steps + 1)
    t0 = time.perf_counter()
    for i in range(steps):
        cpu_marks[i] = time.perf_counter()
        if cuda:
            events[i].record()
        wl.step()
        progress.advance()
    cpu_marks[steps] = time.perf_counter()
    if cuda:
        events[steps].record()
    _sync(device)
    wall_s = time.perf_counter() - t0
    cpu_ms = [(b - a) * 1e3 for a, b in zip(cpu_marks, cpu_marks[1:])]
    step_ms = [events[i].elapsed_time(events[i + 1]) for i in range(steps)] if cuda else cpu_ms
    return {
        "steps": steps, "step_label": wl.step_label, "prefill_ms": prefill_ms,
        "step_ms": _summarize_ms(step_ms), "per_step_ms": step_ms,
        "cpu_issue_ms": _summarize_ms(cpu_ms),
        "wall_s": wall_s,
        "tokens_per_step": tokens_per_step(wl),
        "tokens_per_s": batch_size * steps * tokens_per_step(wl) / wall_s if tokens_per_step(wl) else None,
        "clock": "cuda events between step starts" if cuda else "time.perf_counter",
    }


def _memory_sample(device) -> dict:
    if device.type != "cuda":
        return {}
    torch = _torch()
    return {"allocated_bytes": torch.cuda.memory_allocated(device),
            "reserved_bytes": torch.cuda.memory_reserved(device)}


def _memory_stats(device) -> dict:
    if device.type != "cuda":
        return {}
    return {k: v for k, v in _torch().cuda.memory_stats(device).items() if isinstance(v, (int, float))}


def memory_stats_delta(before: dict, after: dict) -> dict:
    """The counters that changed over the profiled window (peaks and current values are not counters)."""
    return {k: after[k] - before.get(k, 0) for k in after
            if after[k] != before.get(k, 0) and not k.endswith((".peak", ".current"))}


def _experimental_config(enabled: bool, notes: list[str]):
    if not enabled:
        return None
    torch = _torch()
    try:
        return torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except (AttributeError, TypeError):
        notes.append(f"profiler.cuda_sync_events: torch {torch.__version__} has no enable_cuda_sync_events; "
                     "the trace has no cuda_sync events")
        return None


def profiler_options(workload: Workload, device, notes: list[str]) -> dict:
    from torch.profiler import ProfilerActivity
    return {"activities": [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else []),
            "record_shapes": workload["profiler.record_shapes"], "profile_memory": workload["profiler.profile_memory"],
            "with_stack": workload["profiler.with_stack"],
            "experimental_config": _experimental_config(workload["profiler.cuda_sync_events"] and
                                                        device.type == "cuda", notes)}


def profile_run(wl, workload: Workload, device, trace_path: Path, progress: Progress, notes: list[str]) -> dict:
    from torch.profiler import profile, record_function, schedule
    wait, warmup, active = workload["profiler.wait"], workload["profiler.warmup"], workload["profiler.active"]
    recorded = active + (1 if wl.has_prefill else 0)
    progress.phase("profiling", wait + warmup + recorded)
    _sync(device)
    # Nothing but the workload runs inside the recorded window: memory_stats() alone costs ~1 ms of Python per
    # call, which would show up as a GPU gap in every step. Stats are read at the window's edges only.
    stats_before = _memory_stats(device) if wait + warmup == 0 else None
    t0 = time.perf_counter()
    with profile(schedule=schedule(wait=wait, warmup=warmup, active=recorded, repeat=1),
                 **profiler_options(workload, device, notes)) as prof:
        if wait + warmup:
            wl.new_sequence()
        for i in range(wait + warmup):
            wl.step()
            if i == wait + warmup - 1:
                stats_before = _memory_stats(device)  # before the step() that starts the recorded window
            prof.step()
            progress.advance()
        if wl.has_prefill:
            with record_function("prefill"):
                wl.new_sequence()
            prof.step()
            progress.advance()
        for k in range(active):
            with record_function(f"{wl.step_label}#{k}"):
                wl.step()
            prof.step()
            progress.advance()
    _sync(device)
    window_s = time.perf_counter() - t0
    stats_after = _memory_stats(device)
    progress.phase("writing trace", 1)
    prof.export_chrome_trace(str(trace_path))
    progress.advance()
    delta = memory_stats_delta(stats_before, stats_after)
    return {
        "trace": trace_path.name, "recorded_steps": recorded, "schedule": {"wait": wait, "warmup": warmup,
                                                                           "active": recorded},
        "annotations": (["prefill"] if wl.has_prefill else []) + [f"{wl.step_label}#{k}" for k in range(active)],
        "window_wall_s": window_s,
        "memory_stats_delta": delta,
        "memory_stats_after": {k: v for k, v in stats_after.items()
                               if k.startswith(("num_", "allocated_bytes.all", "reserved_bytes.all",
                                                "inactive_split_bytes.all", "requested_bytes.all"))},
    }


def sampling_pass(wl, device, steps: int, sync_debug: bool, progress: Progress) -> tuple[list[dict], list[dict]]:
    """A separate unprofiled pass: memory_allocated / memory_reserved after each step and, when asked, the
    file:line of every synchronizing call (torch.cuda.set_sync_debug_mode)."""
    from analyzer.syncdebug import SyncSiteRecorder
    progress.phase("sync-debug pass" if sync_debug else "memory sampling pass", steps + 1)
    samples = []
    recorder = SyncSiteRecorder(REPO_ROOT) if sync_debug else contextlib.nullcontext()
    with recorder:
        if sync_debug:
            recorder.phase = "new_sequence"
        wl.new_sequence()
        samples.append({"step": "prefill" if wl.has_prefill else "start", **_memory_sample(device)})
        progress.advance()
        if sync_debug:
            recorder.phase = "step"
        for k in range(steps):
            wl.step()
            samples.append({"step": f"{wl.step_label}#{k}", **_memory_sample(device)})
            progress.advance()
        _sync(device)
    return samples, (recorder.results() if sync_debug else [])


def environment(device) -> dict:
    torch = _torch()
    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "cuda_runtime": torch.version.cuda, "hip": getattr(torch.version, "hip", None), "device": str(device),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu_name=props.name, gpu_count=torch.cuda.device_count(),
                   gpu_memory_bytes=props.total_memory, gpu_capability=f"{props.major}.{props.minor}",
                   cuda_driver=_cuda_driver_version())
    return env


def _cuda_driver_version() -> str | None:
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    return None


def _model_meta(workload: Workload, model) -> dict:
    import dataclasses
    return {"preset": None if workload["model.checkpoint"] else workload["model.preset"],
            "checkpoint": workload["model.checkpoint"], "dtype": str(model.dtype).replace("torch.", ""),
            "parameters": model.config.parameter_count(), "config": dataclasses.asdict(model.config)}


def capture(workload: Workload, out_dir: Path, argv: list[str]) -> int:
    torch = _torch()
    notes: list[str] = []
    device = resolve_device(workload, notes)
    dtype = resolve_dtype(workload, device)
    workload_cls = load_script(workload)
    if hasattr(workload_cls, "check_workload"):
        workload_cls.check_workload(workload, device)
    torch.manual_seed(workload["seed"])
    model = build_model(workload, device, dtype)
    from workloads.qwen2 import Sampling
    sampling = Sampling(workload["sampling.temperature"], workload["sampling.top_k"])
    run = RunFolder(out_dir, workload.name)
    meta = {"schema": META_SCHEMA, "complete": False, "error": None, "created_utc": utc_stamp(),
            "command": ["python", "-m", "analyzer", *argv], "workload_file": str(workload.path),
            "workload": workload.nested(), "environment": environment(device), "model": _model_meta(workload, model),
            "notes": notes}
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    progress = Progress()
    exit_code = 0
    try:
        if getattr(workload_cls, "kind", None) == "serve":
            from analyzer.capture_serve import capture_serving
            capture_serving(workload_cls, model, sampling, workload, device, run, progress, meta)
        else:
            _capture_steps(workload_cls, model, sampling, workload, device, run, progress, meta)
        meta["complete"] = True
    except KeyboardInterrupt:
        meta["error"] = "interrupted (KeyboardInterrupt)"
        exit_code = 130
    except Exception as exc:  # the workload failed mid-run: keep what was captured, mark it incomplete
        meta["error"] = f"{exc.__class__.__name__}: {exc}".strip()
        meta["traceback"] = traceback.format_exc()
        exit_code = 1
    finally:
        progress.close()
        meta["files"] = sorted(f.name for f in run.staging.iterdir() if not f.name.startswith("."))
        write_json_atomic(run.path(META_FILE), meta)
        final = run.publish()
    _print_summary(final, meta, device)
    return exit_code


def _capture_steps(workload_cls, model, sampling, workload: Workload, device, run: RunFolder, progress: Progress,
                   meta: dict) -> None:
    """A workload of steps: time them unprofiled, profile a window of them, then the sampling pass (CUDA)."""
    p, notes = workload, meta["notes"]
    capacity = p["prompt_length"] + 1 + max(p["decode_steps"], p["timing.warmup_steps"],
                                            p["profiler.wait"] + p["profiler.warmup"], p["profiler.active"])

    sections = getattr(workload_cls, "option_sections", ())
    options = {"options": {k: v for k, v in p.values.items() if k.split(".")[0] in sections}} if sections else {}

    def make(mode: str):
        return workload_cls(model, batch_size=p["batch_size"], prompt_length=p["prompt_length"], capacity=capacity,
                            sampling=sampling, mode=mode, seed=p["seed"], **options)

    wl = make(p["mode"])
    meta["unprofiled"] = time_unprofiled(wl, device, p["decode_steps"], p["timing.warmup_steps"],
                                         p["batch_size"], progress)
    if p["timing.compare_modes"] and device.type == "cuda" and wl.step_label == "decode_step":
        other_mode = "eager" if p["mode"] == "cuda_graph" else "cuda_graph"
        other = time_unprofiled(make(other_mode), device, p["decode_steps"], p["timing.warmup_steps"],
                                p["batch_size"], progress)
        by_mode = {p["mode"]: meta["unprofiled"]["step_ms"]["p50"], other_mode: other["step_ms"]["p50"]}
        meta["mode_comparison"] = {"eager_step_ms": by_mode["eager"], "cuda_graph_step_ms": by_mode["cuda_graph"],
                                   "eager_over_graph": by_mode["eager"] / by_mode["cuda_graph"],
                                   "statistic": "p50 of unprofiled steps", "other_mode_timing": other}
    elif p["timing.compare_modes"]:
        notes.append("timing.compare_modes needs CUDA and a decode workload; skipped")
    meta["profiled"] = profile_run(wl, workload, device, run.path(TRACE_FILE), progress, notes)
    if device.type == "cuda":
        steps = min(p["profiler.active"], 8)
        sync_debug = p["sync_debug_pass"]
        meta["memory_per_step"], sites = sampling_pass(wl, device, steps, sync_debug, progress)
        if sync_debug:
            meta["sync_sites"], meta["sync_debug_steps"] = sites, steps
    tokens = wl.tokens()
    if tokens is not None:
        meta["sample_tokens"] = tokens[0, -8:].tolist()
    info = wl.describe() if hasattr(wl, "describe") else None
    if info:
        meta["script_info"] = info


def _print_summary(final: Path, meta: dict, device) -> None:
    shown = os.path.relpath(final) if not os.path.relpath(final).startswith("..") else str(final)
    env, model = meta["environment"], meta["model"]
    where = f"{env.get('gpu_name')} ({env['device']})" if device.type == "cuda" else f"CPU ({env['cpu']})"
    name = model["preset"] or model["checkpoint"]
    print(f"run:     {shown}{'' if meta['complete'] else '   INCOMPLETE: ' + str(meta['error'])}")
    print(f"device:  {where}, torch {env['torch']}, {model['dtype']}, {name} "
          f"({model['config']['num_hidden_layers']} layers), batch {meta['workload']['batch_size']}")
    timing = meta.get("unprofiled")
    if timing:
        s = timing["step_ms"]
        rate = f", {timing['tokens_per_s']:.1f} tokens/s" if timing["tokens_per_s"] else ""
        print(f"step:    {timing['step_label']} p50 {s['p50']:.2f} ms, p90 {s['p90']:.2f} ms{rate} "
              f"(no profiler, {timing['steps']} steps)")
    serving = meta.get("serving", {}).get("unprofiled")
    if serving:
        print(f"serving: {serving['requests']} requests, TTFT p50 {serving['ttft_ms']['p50']:.1f} ms, "
              f"TPOT p50 {(serving['tpot_ms'] or {}).get('p50', float('nan')):.2f} ms, "
              f"{serving['throughput_tokens_per_s']:.0f} tokens/s, mean batch {serving['mean_batch']}")
    if "mode_comparison" in meta:
        m = meta["mode_comparison"]
        print(f"modes:   eager {m['eager_step_ms']:.2f} ms vs CUDA graph {m['cuda_graph_step_ms']:.2f} ms "
              f"per step ({m['eager_over_graph']:.1f}x)")
    if meta.get("sync_sites"):
        top = meta["sync_sites"][0]
        print(f"syncs:   {sum(s['count'] for s in meta['sync_sites'])} synchronizing calls in the sync-debug pass; "
              f"most at {top['call_site']}")
    if meta["complete"]:
        print(f"analyze: python -m analyzer analyze {shown}")
