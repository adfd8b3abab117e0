"""Capture of a serving workload (kind "serve"): whole sessions of requests instead of single steps.

A warm-up session, then one unprofiled session (per-request TTFT / TPOT and throughput), then the same traffic under
the profiler with every engine step annotated, then (CUDA) a sampling session for memory per step and sync sites.
Imports only torch, pyyaml and the standard library, like capture.py.
"""
from __future__ import annotations

import time

from analyzer.capture import (REPO_ROOT, TRACE_FILE, _memory_sample, _memory_stats, _summarize_ms, _sync,
                              memory_stats_delta, profiler_options)
from analyzer.progress import Progress
from analyzer.runfolder import RunFolder
from analyzer.workload import Workload


def make_serving_workload(workload_cls, model, sampling, workload: Workload):
    p = workload
    return workload_cls(model, max_batch=p["batch_size"], sampling=sampling, seed=p["seed"],
                        requests=p["serve.requests"], arrival=p["serve.arrival"], rate=float(p["serve.rate"]),
                        prompt_len=(p["serve.prompt_min"], p["serve.prompt_max"]),
                        output_len=(p["serve.output_min"], p["serve.output_max"]),
                        yield_s=float(p["serve.yield_s"]), to_thread=p["serve.to_thread"],
                        readback=p["serve.token_readback"])


def _advance_per_request(progress: Progress):
    return lambda step: progress.advance(step.finished)


def capture_serving(workload_cls, model, sampling, workload: Workload, device, run: RunFolder, progress: Progress,
                    meta: dict) -> None:
    from workloads.serving.metrics import lifetimes_unix_ns, summarize
    wl = make_serving_workload(workload_cls, model, sampling, workload)
    count = workload["serve.requests"]
    for _ in range(workload["serve.warmup_sessions"]):
        progress.phase("warm-up session", count, "requests")
        wl.session(on_step=_advance_per_request(progress))
        _sync(device)

    session, served = _timed_sessions(wl, device, workload["serve.timed_sessions"], count, progress)
    step_ms = [(s.ended_at - s.started_at) * 1e3 for s in session.steps]
    meta["unprofiled"] = {
        "steps": len(step_ms), "step_label": wl.step_label, "prefill_ms": None,
        "step_ms": _summarize_ms(step_ms), "per_step_ms": step_ms, "wall_s": served["wall_s"],
        "tokens_per_s": served["throughput_tokens_per_s"],
        "clock": "time.perf_counter around each engine step on the event loop (admission, prefills, decode, token "
                 "readback, and the hop to and from a worker thread with serve.to_thread)",
    }
    meta["serving"] = {"options": {k: workload[f"serve.{k}"] for k in
                                   ("requests", "arrival", "rate", "yield_s", "to_thread", "token_readback")},
                       "max_batch": workload["batch_size"], "unprofiled": served}

    meta["profiled"], profiled = _profile_session(wl, workload, device, run, progress, meta["notes"])
    meta["serving"]["profiled"] = {**{k: v for k, v in summarize(profiled).items() if k != "per_request"},
                                   "lifetimes_unix_ns": lifetimes_unix_ns(profiled)}

    if device.type == "cuda":
        meta["memory_per_step"], sites = _sampling_session(wl, device, workload["sync_debug_pass"], count, progress)
        if workload["sync_debug_pass"]:
            meta["sync_sites"], meta["sync_debug_steps"] = sites, len(meta["memory_per_step"])


def _timed_sessions(wl, device, sessions: int, count: int, progress: Progress):
    """The same traffic `sessions` times without the profiler; the session of median throughput is reported, with
    every session's headline figures beside it (a short session's numbers vary with arrival timing)."""
    from workloads.serving.metrics import summarize
    progress.phase("serving (no profiler)", count * sessions, "requests")
    runs = []
    for _ in range(sessions):
        runs.append(wl.session(on_step=_advance_per_request(progress)))
        _sync(device)
    summaries = [summarize(s) for s in runs]
    chosen = sorted(range(sessions), key=lambda i: summaries[i]["throughput_tokens_per_s"])[sessions // 2]
    served = summaries[chosen]
    served["sessions"] = [{"ttft_p50_ms": s["ttft_ms"]["p50"], "tpot_p50_ms": (s["tpot_ms"] or {}).get("p50"),
                           "throughput_tokens_per_s": s["throughput_tokens_per_s"]} for s in summaries]
    served["reported_session"] = chosen
    return runs[chosen], served


def _profile_session(wl, workload: Workload, device, run: RunFolder, progress: Progress, notes: list[str]):
    from torch.profiler import profile
    progress.phase("profiling (whole session)", workload["serve.requests"], "requests")
    _sync(device)
    stats_before = _memory_stats(device)
    t0 = time.perf_counter()
    with profile(**profiler_options(workload, device, notes)) as prof:
        session = wl.session(annotate=True, on_step=_advance_per_request(progress))
        _sync(device)
    window_s = time.perf_counter() - t0
    stats_after = _memory_stats(device)
    progress.phase("writing trace", 1)
    prof.export_chrome_trace(str(run.path(TRACE_FILE)))
    progress.advance()
    annotations = [f"{wl.step_label}#{s.index}" for s in session.steps]
    delta = memory_stats_delta(stats_before, stats_after)
    return {"trace": TRACE_FILE, "recorded_steps": len(annotations), "schedule": None, "annotations": annotations,
            "window_wall_s": window_s, "memory_stats_delta": delta}, session


def _sampling_session(wl, device, sync_debug: bool, count: int, progress: Progress):
    """memory_allocated / memory_reserved after each engine step and, when asked, the file:line of every
    synchronizing call, in an unprofiled session of the same traffic."""
    import contextlib
    from analyzer.syncdebug import SyncSiteRecorder
    progress.phase("sync-debug session" if sync_debug else "memory sampling session", count, "requests")
    samples = []
    recorder = SyncSiteRecorder(REPO_ROOT) if sync_debug else contextlib.nullcontext()

    def on_step(step) -> None:
        samples.append({"step": f"{wl.step_label}#{step.index}", **_memory_sample(device)})
        progress.advance(step.finished)

    with recorder:
        if sync_debug:
            recorder.phase = "step"
        wl.session(on_step=on_step)
        _sync(device)
    return samples, (recorder.results() if sync_debug else [])
