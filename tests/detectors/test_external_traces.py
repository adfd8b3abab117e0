"""Traces from other projects (other GPUs, torch versions, HIP, CPU-only): no crash, and numbers that agree with
an independent count of the raw events. Skipped where ../shared/traces/external is absent."""
import re
from pathlib import Path

import pytest

from rawtrace import count_named, gpu_utilization, raw_events
from conftest import report_of

EXTERNAL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "external"
TRACES = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
               "hipLaunchKernel", "hipExtLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel",
               "hipGraphLaunch")
SYNC_APIS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "hipDeviceSynchronize",
             "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpyWithStream")


def blocking_calls(raw) -> int:
    """Synchronizes and synchronous copies, plus copies to or from pageable memory that are not followed directly
    (the next runtime call on their thread) by a synchronize: each is one time the CPU blocked. A synchronize inside
    torch.cuda.graph's __enter__ / __exit__ is the graph capture's set-up, not a block of the workload."""
    runtime = sorted((e for e in raw if e.get("ph") == "X"
                      and str(e.get("cat")).lower() in ("cuda_runtime", "cuda_driver", "runtime", "driver")),
                     key=lambda e: (str(e.get("pid")), str(e.get("tid")), float(e["ts"])))
    copies = {(e.get("args") or {}).get("correlation"): e["name"] for e in raw
              if str(e.get("cat")).lower() in ("gpu_memcpy", "memcpy")}
    capture_setup = [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") == "python_function"
                     and re.search(r"torch/cuda/graphs\.py\(\d+\): __(enter|exit)__$", e["name"])]
    count = 0
    for k, e in enumerate(runtime):
        if e["name"] in SYNC_APIS:
            count += not any(tid == e.get("tid") and s <= e["ts"] < t for tid, s, t in capture_setup)
        elif "Pageable" in copies.get((e.get("args") or {}).get("correlation"), ""):
            nxt = runtime[k + 1] if k + 1 < len(runtime) else None
            same_thread = nxt is not None and (nxt.get("pid"), nxt.get("tid")) == (e.get("pid"), e.get("tid"))
            count += not (same_thread and nxt["name"] in SYNC_APIS)
    return count


pytestmark = pytest.mark.skipif(not TRACES, reason=f"{EXTERNAL} not present")


def analyzed(path):
    return report_of(path)


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_numbers_agree_with_raw_events(path):
    report = analyzed(path)
    raw = raw_events(path)
    expected, window_ns = gpu_utilization(raw)
    summary = report["summary"]
    if expected is None:
        assert summary["gpu_utilization"] is None and report["findings"] == []
        return
    assert summary["gpu_utilization"] == pytest.approx(expected, abs=1e-3)
    assert summary["window_us"] == pytest.approx(window_ns / 1e3, rel=1e-6)
    assert report["gaps"]["launch_stats"]["launches"] == sum(count_named(raw, n) for n in LAUNCH_APIS)
    assert report["allocator"]["cuda_malloc"] == count_named(raw, "cudaMalloc") + count_named(raw, "hipMalloc")
    # every synchronize is one block; pageable copies followed by their own stream sync count once
    assert report["sync_totals"]["total_blocking_calls"] == blocking_calls(raw)
    assert sum(report["gaps"]["by_cause"].values()) == pytest.approx(summary["gpu_idle_us"], rel=1e-6)
    assert sum(s["drain_us"] for s in report["syncs"]) == pytest.approx(report["gaps"]["by_cause"]["sync"], abs=0.01)


def test_cpu_only_trace_is_a_clean_report():
    path = EXTERNAL / "cpu-only.json.gz"
    report = analyzed(path)
    assert report["summary"]["gpu_utilization"] is None
    assert "no GPU activity" in report["summary"]["note"]
    assert report["findings"] == [] and report["syncs"] == []


def test_hip_trace_launches_and_syncs():
    report = analyzed(EXTERNAL / "mi250-toy-training-rocm.json.gz")
    assert set(report["gaps"]["launch_stats"]["by_api"]) == {"hipLaunchKernel", "hipExtModuleLaunchKernel"}
    kinds = {(s["api"], s["kind"]) for s in report["syncs"]}
    # its one hipDeviceSynchronize is the last call of its thread: the profiler's stop
    assert ("hipMemcpyWithStream", "pageable_h2d") in kinds and ("hipDeviceSynchronize", "profiler") in kinds


@pytest.mark.parametrize("path", [p for p in TRACES if p.name.startswith("mi")], ids=lambda p: p.name)
def test_a_hip_trace_is_advised_in_hip_words(path):
    """ROCm traces (their runtime calls are hip*): no title or advice names a CUDA-only knob, library or API."""
    assert count_named(raw_events(path), "hipLaunchKernel") or count_named(raw_events(path), "hipGraphLaunch")
    report = analyzed(path)
    text = " ".join(f"{f['title']} {f['advice']}" for f in report["findings"])
    for cuda_only in ("CUDA_MODULE_LOADING", "cuDNN", "cuBLAS", "no CUDA call", "CUDA graph", "PYTORCH_CUDA_ALLOC_CONF",
                      "cudaMalloc", "cudaFree"):
        assert cuda_only not in text, cuda_only


def test_a_hip_first_launch_and_a_host_random_draw_get_their_own_advice():
    """The MI250 training trace: its first hipLaunchKernel loads code objects (HIP's deferred loading), and
    aten::randn draws on the host with no HIP call in it."""
    report = analyzed(EXTERNAL / "mi250-toy-training-rocm.json.gz")
    warmup = next(f for f in report["findings"] if f["kind"] == "warmup")
    assert "hipLaunchKernel (first call)" in warmup["title"] and "HIP_ENABLE_DEFERRED_LOADING=0" in warmup["advice"]
    randn = next(f for f in report["findings"] if f["kind"] == "host_compute" and "aten::randn" in f["title"])
    assert "no HIP call" in randn["title"] and "torch.randn(..., device=...)" in randn["advice"]


def test_blocks_that_all_fall_in_one_step_say_so():
    """The MI250 trace's two pageable uploads (hipMemcpyWithStream) both run in the first of its two ProfilerSteps:
    the sync finding says "all in 1 of 2 steps", not a per-step rate."""
    raw = raw_events(EXTERNAL / "mi250-toy-training-rocm.json.gz")
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")]
    copies = [e for e in raw if e.get("name") == "hipMemcpyWithStream"]
    holding = {k for k, (a, b) in enumerate(steps) for e in copies if a <= e["ts"] < b}
    assert len(steps) == 2 and len(copies) == 2 and len(holding) == 1
    sync = next(f for f in analyzed(EXTERNAL / "mi250-toy-training-rocm.json.gz")["findings"]
                if f["kind"] == "sync" and "pageable" in f["title"])
    assert "blocks the CPU 2x, all in 1 of 2 steps " in sync["title"]


def test_launch_gaps_in_an_in_place_zero_grad_name_set_to_none():
    """The 2021 ResNet-50 training trace (torch 1.8): each step's Optimizer.zero_grad span launches one fill per
    parameter (161 a step), and most launch gaps wait there. The launch finding says what takes those launches out."""
    path = EXTERNAL / "v100-resnet50-torch18-categories.json.gz"
    raw = raw_events(path)
    spans = [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in raw
             if e.get("name", "").startswith("Optimizer.zero_grad")]
    inside = [e for e in raw if e.get("name") == "cudaLaunchKernel"
              and any(t == e["tid"] and a <= e["ts"] < b for t, a, b in spans)]
    assert len(spans) == 6 and len(inside) == 966
    launch = next(f for f in analyzed(path)["findings"] if f["id"] == "launch_overhead")
    assert "zero_grad" in launch["call_site"] and "set_to_none=True" in launch["advice"]
    top = launch["detail"]["top_sites"][0]
    assert top["count"] <= len(inside) and top["idle_us"] >= 0.5 * launch["impact_us"]


def test_cuda_sync_events_trace():
    report = analyzed(EXTERNAL / "a100-simple-add-cuda-sync-events.json.gz")
    raw = raw_events(EXTERNAL / "a100-simple-add-cuda-sync-events.json.gz")
    assert report["sync_totals"]["cuda_sync_events"] == sum(1 for e in raw if e.get("cat") == "cuda_sync")
    pageable = next(s for s in report["syncs"] if s["kind"] == "pageable_h2d")
    assert pageable["copy"] == "Memcpy HtoD (Pageable -> Device)"
    # without Python stacks the call site falls back to the op that made the call
    assert pageable["call_site"].startswith("aten::")


def test_triton_cu_launch_kernel_counts_as_a_launch():
    report = analyzed(EXTERNAL / "triton-cuLaunchKernel.json.gz")
    assert report["gaps"]["launch_stats"]["by_api"] == {"cuLaunchKernel": 1}
    assert report["gaps"]["launch_stats"]["gpu_activities_launched"] == 1


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_findings_read_well_without_python_stacks(path):
    """Traces without with_stack have no call sites to name: no finding may print 'None' in their place, and a
    serving cause needs the evidence it is defined by (no event-loop idle without a selector frame)."""
    report = analyzed(path)
    for finding in report["findings"]:
        assert "None" not in finding["title"], finding["title"]
    names = " ".join(raw.get("name", "") for raw in raw_events(path) if raw.get("cat") == "python_function")
    if "select.epoll" not in names and "select.poll" not in names:
        assert report["serving"]["event_loop_idle"]["count"] == 0


def test_unsupported_device_is_named_not_called_cpu_only():
    path = EXTERNAL / "mtia-inference-no-gpu.json.gz"
    report = analyzed(path)
    raw = raw_events(path)
    mtia = sum(1 for e in raw if str(e.get("cat", "")).startswith("mtia_"))
    assert report["summary"]["gpu_utilization"] is None and report["findings"] == []
    assert report["summary"]["note"].startswith("GPU activity of an unsupported device type: MTIA")
    assert sum(report["trace"]["foreign_activity"].values()) == mtia > 0


def test_a_wait_for_no_recorded_gpu_work_is_said_and_an_ordinary_pageable_copy_is_not():
    """SGLang on an MI300X: two hipMemcpyWithStream calls idle the GPU 493 ms though it had finished its work before
    they began and their own copy takes microseconds: the finding says the wait is for nothing the trace recorded.
    The a100 trace's 16 pageable copies (~0.1 ms each, their staging) stay plain pageable-copy findings."""
    sglang = EXTERNAL / "mi300x-sglang-qwen3-prefill-decode.json.gz"
    a100 = EXTERNAL / "a100-simple-add-first-call.json.gz"
    if not (sglang.is_file() and a100.is_file()):
        pytest.skip(f"{EXTERNAL} not present")
    copy = next(f for f in report_of(sglang)["findings"]
                if f["kind"] == "sync" and f["detail"]["kind"] == "pageable_h2d")
    assert copy["detail"]["unrecorded_wait_us"] == pytest.approx(copy["impact_us"], rel=0.01)
    assert copy["detail"]["unrecorded_wait_us"] > 400_000
    assert "waiting for no recorded GPU work" in copy["title"] and "Nsight Systems" in copy["advice"]
    plain = next(f for f in report_of(a100)["findings"]
                 if f["kind"] == "sync" and f["detail"]["kind"] == "pageable_h2d")
    assert plain["detail"]["unrecorded_wait_us"] == 0 and "recorded GPU work" not in plain["title"]


@pytest.mark.parametrize("name", ["mi300x-sglang-qwen3-prefill-decode", "b200-vllm-eager"])
def test_the_graph_estimate_keeps_the_idle_a_graph_cannot_take_out(name):
    """A graph replays the step's launches back to back; a host sync or a wait on something outside the trace stays
    in the step. The SGLang step idles 493 ms in two copies waiting for unrecorded work and only 1.2 ms in launch
    gaps: graphs buy about nothing, not the 2x that GPU busy against the step would say."""
    path = EXTERNAL / f"{name}.json.gz"
    if not path.is_file():
        pytest.skip(f"{EXTERNAL} not present")
    report = report_of(path)
    estimate, (step,) = report["gaps"]["cuda_graph_estimate"], report["gaps"]["per_step"]
    # the window's head and tail lie outside the step's GPU period: a graph frees only the gaps inside it
    edges = step.get("window_edge_us", {})
    freed = sum(step["idle_by_cause_us"][c] - edges.get(c, 0.0) for c in ("cpu_launch", "queued"))
    assert estimate["estimated_graph_step_us"] == pytest.approx(step["gpu_period_us"] - freed, rel=1e-3)
    assert estimate["estimated_graph_step_us"] >= estimate["gpu_busy_per_step_us"] + step["idle_by_cause_us"]["sync"]
    assert "kept" in estimate["graph_step_basis"]
    # the launch gaps hold the launch finding's idle and the host work between launches that other findings name
    tops = {k: sum(f["impact_us"] for f in report["findings"] if not f.get("parent") and f["kind"] == k)
            for k in ("launch_gap", "queued", "host_work")}
    edge = edges.get("cpu_launch", 0.0) + edges.get("queued", 0.0)
    assert tops["launch_gap"] + tops["queued"] - edge - 1.0 <= estimate["recoverable_us_per_step"] \
        <= sum(tops.values()) + 1.0


def test_torch_cuda_graph_set_up_is_part_of_the_one_time_capture():
    """vLLM capturing 25 piecewise graphs on an MI300X: before each capture torch.cuda.graph's __enter__ synchronizes
    the device and empties the allocator's cache; inside it the capture's private pool allocates. Those calls are the
    capture's own one-time cost: no sync finding to 'remove from the hot loop', no churn finding of them."""
    path = EXTERNAL / "mi300x-vllm-piecewise-graph-capture.json.gz"
    if not path.is_file():
        pytest.skip(f"{EXTERNAL} not present")
    raw = raw_events(path)
    enters = [(e["ts"], e["ts"] + e["dur"], e["tid"]) for e in raw
              if e.get("cat") == "python_function" and e["name"].endswith("torch/cuda/graphs.py(240): __enter__")]
    in_enter = [e for e in raw if e.get("name") in ("hipDeviceSynchronize", "hipFree")
                and any(s <= e["ts"] < t and e["tid"] == tid for s, t, tid in enters)]
    assert len(enters) == 25 and count_named(in_enter, "hipDeviceSynchronize") == 25
    report = report_of(path)
    assert not [s for s in report["syncs"] if any("torch/cuda/graphs.py" in c for c in s["context"])]
    assert not [f for f in report["findings"] if f["kind"] == "sync" and f["detail"]["api"] == "hipDeviceSynchronize"]
    allocator = report["allocator"]
    assert allocator["capture_calls"] >= count_named(in_enter, "hipFree") == 12
    churn = [f for f in report["findings"] if f["kind"] == "allocator_churn"]
    assert all(f["count"] == allocator["cuda_malloc"] + allocator["cuda_free"] - allocator["capture_calls"]
               - allocator["warmup_calls"] for f in churn)
    warmup = next(f for f in report["findings"] if f["kind"] == "warmup")
    assert "HIP graph capture" in warmup["title"] and "torch.cuda.graph's synchronize" in warmup["advice"]
    partition = report["summary"]["idle_partition"]
    assert partition["findings_us"] + partition["instrumentation_us"] + partition["unexplained_us"] == \
        pytest.approx(partition["idle_us"], abs=0.01)


@pytest.mark.parametrize("name", ["a100-particle-transformer-first-forward", "v100-resnet-ddp-ns-resolution",
                                  "a100-particle-transformer-second-forward-torchscript-fusion"])
def test_the_profilers_stop_synchronize_is_the_measurements_not_a_finding(name):
    """torch.profiler synchronizes the device as it stops: without Python stacks, a cudaDeviceSynchronize outside any
    op, the last runtime call of its thread with no op after it. It is listed as the profiler's, with no finding."""
    path = EXTERNAL / f"{name}.json.gz"
    if not path.is_file():
        pytest.skip(f"{EXTERNAL} not present")
    raw = raw_events(path)
    runtime = [e for e in raw if e.get("ph") == "X" and str(e.get("cat")).lower() in ("cuda_runtime", "runtime")]
    last = max((e for e in runtime if e["name"] == "cudaDeviceSynchronize"), key=lambda e: e["ts"])
    assert not [e for e in runtime if e["tid"] == last["tid"] and e["ts"] > last["ts"]]
    report = report_of(path)
    assert [s["kind"] for s in report["syncs"] if s["api"] == "cudaDeviceSynchronize"] == ["profiler"]
    assert not [f for f in report["findings"] if f["kind"] == "sync" and f["detail"]["api"] == "cudaDeviceSynchronize"]


def test_a_sync_that_idled_the_gpu_for_nothing_says_so():
    """vLLM's synchronize_input_prep() blocks on an event while the replayed graphs keep the GPU busy: the finding
    says it cost no GPU idle in this window instead of only 'remove it from the hot loop'."""
    replay = EXTERNAL / "mi300x-vllm-piecewise-graph-replay.json.gz"
    sglang = EXTERNAL / "mi300x-sglang-qwen3-prefill-decode.json.gz"
    if not (replay.is_file() and sglang.is_file()):
        pytest.skip(f"{EXTERNAL} not present")
    (free,) = [f for f in report_of(replay)["findings"] if f["kind"] == "sync"]
    assert free["impact_us"] == 0 and "cost no GPU idle time" in free["advice"]
    costly = [f for f in report_of(sglang)["findings"] if f["kind"] == "sync"]
    assert costly and all(f["impact_us"] > 0 and "cost no GPU idle time" not in f["advice"] for f in costly)
