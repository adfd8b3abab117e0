"""The foreign-trace classes captured on a GPU from user-style scripts (tests/fixtures/h200_foreign, made by
scripts/make_foreign_fixtures.sh; counts in tests/fixtures/README.md): each is read for what it is."""
from pathlib import Path

import numpy as np
import pytest

from analyzer import api
from analyzer.views.idle import CPU_LAUNCH
from conftest import report_of
from rawtrace import raw_events

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "h200_foreign"


def report(name: str) -> dict:
    return report_of(FIXTURES / name / "trace.json.gz")


def by_idle(r: dict) -> list[dict]:
    return sorted((f for f in r["findings"] if not f.get("parent")), key=lambda f: -f["impact_us"])


def test_a_dataloader_bound_loop_leads_with_the_input_wait():
    """The main thread spends 96-98% of each step in the DataLoader's __next__ (two worker processes, a slow
    __getitem__): the input wait is the largest idle, with the workers' advice, and no CUDA-graph advice on it."""
    r = report("dataloader_bound")
    top = by_idle(r)[0]
    assert top["kind"] == "input_wait" and top["detail"]["loader"] == "worker processes"
    assert top["impact_us"] > 0.9 * r["summary"]["gpu_idle_us"]
    assert "num_workers" in top["advice"] and "graph" not in top["advice"]


def test_a_wait_for_worker_processes_ends_when_the_batch_arrived():
    """The replay holds each wait in the workers' __next__ to the time its batch arrived in the trace: taking the
    launch gaps' CPU time out (or the profiler's) makes the thread ask earlier, not the batch come sooner, so the
    launch fix buys nothing here and the input wait's fix (the batch ready when asked) buys nearly the whole step."""
    ctx = api.views(api.load(FIXTURES / "dataloader_bound" / "trace.json.gz")).context
    replay = ctx.replay
    outside = np.flatnonzero(replay.sync_rows < 0)
    assert len(outside) == 5  # one __next__ per step
    pieces = np.flatnonzero(ctx.idle.cause == CPU_LAUNCH)
    removed = np.stack([np.full(len(pieces), replay.tids[0]), ctx.idle.start_ns[pieces], ctx.idle.end_ns[pieces]], 1)
    asked_earlier = replay.run(removed=removed).step_cpu_end_ns
    ready_when_asked = replay.run(removed=removed, no_wait=replay.sync_rows[outside]).step_cpu_end_ns
    step = replay.step_hi_ns - replay.step_lo_ns
    # the batch comes when it came: only the launch gaps after the wait move a step's end (under 5% of the step)
    assert (replay.step_hi_ns - asked_earlier < 0.05 * step).all()
    # ready when asked: each step's end moves by most of the waits before it
    assert (asked_earlier - ready_when_asked > 0.5 * step).all()
    w = {f["kind"]: f["what_if"] for f in report("dataloader_bound")["findings"] if not f.get("parent")}
    assert w["launch_gap"]["saving_ms"] < 0.01 * w["launch_gap"]["step_ms"]
    assert w["input_wait"]["saving_ms"] > 0.9 * w["input_wait"]["step_ms"]


def test_host_attention_math_is_host_compute_not_launch_overhead():
    """The KV cache lives on the host: aten::cat and aten::matmul on CPU tensors make no CUDA call. They are
    host_compute findings at the script's own functions, advised to move the cache to the GPU."""
    r = report("host_math_step")
    ops = {f["detail"]["op"]: f for f in r["findings"] if f["kind"] == "host_compute"}
    assert {"aten::cat", "aten::matmul"} <= set(ops)
    assert "append()" in ops["aten::cat"]["call_site"] and "attend()" in ops["aten::matmul"]["call_site"]
    assert all("GPU" in f["advice"] and "CUDA graph" in f["advice"] for f in ops.values())  # "cannot take this out"
    assert r["gaps"]["by_cause"]["host_compute"] == pytest.approx(sum(f["impact_us"] for f in ops.values()), abs=0.01)


def test_launches_without_gpu_activity_fail_the_trace_check_and_state_nothing():
    path = FIXTURES / "launches_without_gpu_activity" / "trace.json.gz"
    launches = sum(e.get("name") in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")
                   for e in raw_events(path))
    r = report("launches_without_gpu_activity")
    assert r["findings"] == [] and r["validity"]["failed"] == ["gpu_activity_recorded"]
    check = r["validity"]["checks"][0]
    assert check["measured"]["launches"] == launches > 0 and "ProfilerActivity.CUDA" in check["meaning"]
    assert "not recorded" in r["summary"]["note"]


def test_cuda_activity_only_warns_that_the_host_side_is_missing():
    r = report("cuda_activity_only")
    assert r["trace"]["events"]["ops"] == 0 and "host_side_recorded" in r["validity"]["warned"]
    launch = next(f for f in r["findings"] if f["kind"] == "launch_gap")
    assert launch["confidence"] == "medium" and "host_side_recorded" in launch["confidence_checks"]


def test_a_compile_in_the_window_is_one_time():
    """torch.compile's first call inside the window (no stacks; the first Triton kernel runs 2.17 s in): the
    one-time finding owns the compile, and is the largest idle. The copies and synchronizes Inductor makes while it
    compiles and autotunes (inside the `dynamo` op and the compiled region's first call) are part of that compile,
    not sync findings."""
    path = FIXTURES / "compile_in_window" / "trace.json.gz"
    raw = [e for e in raw_events(path) if e.get("ph") == "X"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") == "cpu_op" and e["name"] == "dynamo"]
    inside = [e for e in raw if e.get("cat") == "cuda_runtime"
              and e["name"] in ("cudaMemcpyAsync", "cudaStreamSynchronize") and any(s <= e["ts"] <= t for s, t in spans)]
    assert spans and inside
    r = report("compile_in_window")
    top = by_idle(r)[0]
    assert top["kind"] == "warmup" and "JIT compilation" in top["title"]
    assert top["impact_us"] > 0.9 * r["summary"]["gpu_idle_us"]
    assert [f["call_site"] for f in r["findings"] if f["kind"] == "sync"] == ["cudaDeviceSynchronize (outside any op)"]


def test_a_compile_with_no_cpu_ops_recorded_is_still_named_a_jit_compile():
    """The same first compile recorded with CUDA activity only: nothing on the host but runtime calls. The long
    untraced wait before the first launch of the Triton kernel (through cuLaunchKernel) is the compile, a one-time
    cost, the largest finding; the trace check says the host side is missing."""
    path = FIXTURES / "compile_in_window_cuda_only" / "trace.json.gz"
    raw = [e for e in raw_events(path) if e.get("ph") == "X"]
    assert not any(e.get("cat") in ("cpu_op", "python_function") for e in raw)
    triton = min((e for e in raw if e.get("cat") == "kernel" and e["name"].startswith("triton_")), key=lambda e: e["ts"])
    r = report("compile_in_window_cuda_only")
    assert "host_side_recorded" in r["validity"]["warned"]
    top = by_idle(r)[0]
    assert top["kind"] == "warmup"
    jit = [p for p in top["detail"]["breakdown"] if p["kind"] == "untraced JIT compilation"]
    assert jit and triton["name"] in jit[0]["api"] and jit[0]["idle_us"] > 1e6


def test_a_cold_first_forward_is_mostly_one_time_idle():
    """A fresh process's first forward (lazy module loading, cuDNN autotuning): the one-time finding explains the
    largest share of the idle."""
    r = report("cold_first_forward")
    assert by_idle(r)[0]["kind"] == "warmup"
