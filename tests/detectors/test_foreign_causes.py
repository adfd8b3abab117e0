"""What the host did in each gap, on traces nobody here wrote (../shared/traces/external; skipped where absent):
DataLoader waits, one-time JIT and first-call costs in cold windows, untraced host time named as such, serving
engines' step annotations. The facts each test checks are read from the raw events (rawtrace), not the analyzer."""
import re
import json
from pathlib import Path

import pytest

from analyzer import api
from conftest import report_of
from rawtrace import raw_events

EXTERNAL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "external"
pytestmark = pytest.mark.skipif(not EXTERNAL.is_dir(), reason=f"{EXTERNAL} not present")


def trace(name: str) -> Path:
    return EXTERNAL / f"{name}.json.gz"


def spans(path: Path, pattern: str) -> list[tuple[float, float]]:
    """CPU-side annotation spans whose name matches (a GPU-side copy of an annotation is not a second one)."""
    rx = re.compile(pattern)
    return [(e["ts"], e["ts"] + e["dur"]) for e in raw_events(path)
            if e.get("ph") == "X" and e.get("cat") == "user_annotation" and rx.search(e["name"])]


def finding(report: dict, kind: str) -> dict:
    return next(f for f in report["findings"] if f["kind"] == kind and not f.get("parent"))


@pytest.mark.parametrize("name,kind", [("rtx3080-toy-mlp-dataloader-no-workers", "in-thread"),
                                       ("rtx3080-toy-mlp-dataloader-8-workers", "worker processes")])
def test_idle_inside_the_dataloader_is_an_input_wait_and_says_which_loader(name, kind):
    """Every input-wait occurrence lies inside one of the trace's `enumerate(DataLoader)#...__next__` spans, and the
    advice follows the iterator the annotation names (num_workers=0: use workers; workers: more of them)."""
    report = report_of(trace(name))
    wait = finding(report, "input_wait")
    loaders = spans(trace(name), r"^enumerate\(DataLoader\)#")
    assert loaders and wait["impact_us"] > 0
    for a, b in wait["occurrences_us"]:
        assert any(s - 0.001 <= a and b <= e + 0.001 for s, e in loaders), (a, b)
    assert wait["detail"]["loader"] == kind
    assert ("num_workers=0" in wait["title"]) == (kind == "in-thread")
    assert report["gaps"]["by_cause"]["input_wait"] == pytest.approx(wait["impact_us"], abs=0.01)


def test_a_cold_first_forward_leads_with_one_time_costs():
    """The process's first forward: a 629.6 ms cudaLaunchKernel (lazy module loading) and 292.9 ms of host time in
    which nothing is recorded, before the first call of the TorchScript function delta_r2. Both are one-time: the
    warm-up finding leads, and its fix (a warmed-up run) buys them back; no host-work finding names delta_r2."""
    path = trace("a100-particle-transformer-first-forward")
    launch = max((e for e in raw_events(path) if e.get("name") == "cudaLaunchKernel"), key=lambda e: e["dur"])
    report = report_of(path)
    top = report["findings"][0]
    assert top["kind"] == "warmup" and "delta_r2" in top["title"] and "cudaLaunchKernel (first call)" in top["title"]
    assert top["impact_us"] >= launch["dur"] + 290_000
    assert top["what_if"]["saving_ms"] >= 0.95 * top["impact_us"] / 1e3
    assert not any(f["kind"] == "host_work" and "delta_r2" in f["title"] for f in report["findings"])


def test_the_second_forward_compiles_its_fusion_groups_in_the_window():
    """The second forward: TorchScript compiles each fusion group before its kernel's first launch (cuLaunchKernel
    of a `fused_*` kernel), 145-149 ms each with nothing recorded inside delta_r2 before them: one-time JIT work."""
    path = trace("a100-particle-transformer-second-forward-torchscript-fusion")
    fused = [e for e in raw_events(path) if e.get("cat") == "kernel" and e["name"].startswith("fused_")]
    report = report_of(path)
    top = report["findings"][0]
    assert top["kind"] == "warmup" and top["impact_us"] > 290_000
    parts = [p for p in top["detail"]["breakdown"] if p["kind"] == "untraced JIT compilation"]
    assert {p["api"].split()[-1] for p in parts} == {e["name"] for e in fused}
    # no compile is left to host work: the one host-work gap is the window's head, the first op's own 1.1 ms
    work = [f for f in report["findings"] if f["kind"] == "host_work"]
    assert [f["detail"]["tail_op"]["op"] for f in work] == ["aten::_to_copy"] and work[0]["impact_us"] < 1200


def test_the_warm_forward_has_no_one_time_costs():
    report = report_of(trace("a100-particle-transformer-warm-forward"))
    assert not any(f["kind"] in ("warmup", "host_work") for f in report["findings"])


def test_untraced_time_that_holds_a_large_host_release_names_it():
    """The large-batch DataLoader loop: ~2 ms per step in which main() records no call at all on the launching
    thread, only the [memory] event of the previous batch's release (a DataLoader worker's batch, in shared memory,
    whose release is the OS's work). The finding says so, with the released size, instead of "nothing recorded"."""
    path = trace("rtx3080-toy-mlp-dataloader-8-workers-large-batch")
    report = report_of(path)
    work = finding(report, "host_work")
    released = [e for e in raw_events(path) if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0
                and e["args"]["Bytes"] <= -(1 << 20)]
    inside = [e for e in released if any(a <= e["ts"] <= b for a, b in work["occurrences_us"])]
    assert len(inside) == work["count"] == 3
    size = -max(e["args"]["Bytes"] for e in inside)
    assert work["detail"]["host_memory"]["bytes"] == -size
    assert f"release of a {size / (1 << 20):.2f} MiB host tensor" in work["title"] and "main()" in work["title"]
    assert "shared-memory" in work["advice"] and "nothing recorded" not in work["title"]


def test_a_gemms_first_call_at_a_shape_is_its_set_up_and_a_lone_call_stays_hedged():
    """vLLM eager on a B200 (record_shapes on): three long gaps in which the launching thread entered an aten GEMM op
    and stayed in it, with nothing recorded under it, up to its kernel's launch. Two are aten::addmm's first calls at
    their shapes, whose later calls at the same shapes took ~50 us: cuBLASLt's set-up for a new shape, paid once per
    shape, so the warmup finding's. The third is aten::mm's only call in the window: no usual cost to compare with,
    so it stays host work, named as the op's own host time with the hedge (a first call at a shape, or a thread that
    lost its core)."""
    path = trace("b200-vllm-eager")
    raw = raw_events(path)
    report = report_of(path)
    warmup = finding(report, "warmup")
    (gemm,) = [p for p in warmup["detail"]["breakdown"] if p["kind"] == "shape set-up" and p["api"] == "aten::addmm"]
    assert gemm["text"] == "cuBLAS / cuBLASLt set-up for a new input shape in aten::addmm"
    addmm = [e for e in raw if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    by_shape = {}
    for e in sorted(addmm, key=lambda e: e["ts"]):
        by_shape.setdefault(json.dumps(e["args"]["Input Dims"]), []).append(e)
    slow = [calls[0] for calls in by_shape.values() if calls[0]["dur"] > 1000]
    assert len(slow) == 3 and all(len(by_shape[json.dumps(e["args"]["Input Dims"])]) > 1 for e in slow)
    # the GPU sat idle through nearly all of the three slow first calls: that idle is the set-up's
    assert 0.8 * sum(e["dur"] for e in slow) <= gemm["idle_us"] <= sum(e["dur"] for e in slow)
    work = [f for f in report["findings"] if f["kind"] == "host_work" and f["detail"]["tail_op"]]
    assert [f["detail"]["tail_op"]["op"] for f in work] == ["aten::mm"]
    op = work[0]["detail"]["tail_op"]
    assert op["other_calls"] == 0 and "once per shape" in work[0]["advice"] and "losing its core" in work[0]["advice"]


def test_an_allocation_working_through_recorded_stream_events_says_so():
    """DDP training on a V100: in the longest host-work gap the thread sat in aten::clone's allocation, which
    queried hundreds of CUDA events (the caching allocator taking back blocks that NCCL's stream used)."""
    path = trace("v100-ddp-training-with-memory")
    raw = raw_events(path)
    clone = next(f for f in report_of(path)["findings"] if f["kind"] == "host_work" and "aten::clone" in f["title"])
    a, b = max(clone["occurrences_us"], key=lambda o: o[1] - o[0])
    op = next(e for e in raw if e.get("name") == "aten::clone" and a <= e["ts"] < b and e["ts"] + e["dur"] >= b)
    queries = [e for e in raw if e.get("name") == "cudaEventQuery" and e["tid"] == op["tid"]
               and op["ts"] <= e["ts"] < b]
    assert len(queries) >= 50
    assert clone["detail"]["tail_op"]["allocator_event_queries"] == len(queries)
    assert f"cudaEventQuery {len(queries)}x" in clone["advice"] and "TORCH_NCCL_AVOID_RECORD_STREAMS=1" in \
        clone["advice"]


def test_a_model_run_on_the_cpu_of_a_gpu_host_states_no_finding():
    report = report_of(trace("a100-particle-transformer-cpu-device-forward-no-kernels"))
    assert report["summary"]["gpu_utilization"] is None and report["findings"] == []
    assert report["validity"]["checks"] == []  # no launch call recorded: a CPU run, not a broken GPU recording


@pytest.mark.parametrize("name,engine,batch", [
    ("b200-vllm-eager", "vLLM", {"prefill_requests": 1, "prefill_tokens": 888, "decode_requests": 0}),
    ("mi300x-vllm-piecewise-graph-replay", "vLLM", {"prefill_requests": 9, "prefill_tokens": 8155,
                                                     "decode_requests": 37, "decode_tokens": 37}),
    ("mi300x-sglang-qwen3-prefill-decode", "SGLang", {"prefill_requests": 15, "prefill_tokens": 15360})])
def test_engine_step_annotations_are_steps_with_their_batch(name, engine, batch):
    """vLLM's `execute_...context_<n>(<tokens>...)_generation_<n>(...)` are the engines' steps: one per outermost
    annotation in these traces, with the batch the name states. SGLang writes its steps in the same format: the
    engine is the one whose code ran (the SGLang trace's frames are under sglang/)."""
    path = trace(name)
    outer = spans(path, r"^execute_(\d+_)?context_\d+\(")
    report = report_of(path)
    steps = report["gaps"]["per_step"]
    assert len(steps) == len(outer) == 1
    assert "engine step annotations" in report["gaps"]["step_source"]
    assert {k: steps[0]["batch"][k] for k in batch} == batch
    served = report["serving"]["engine"]
    assert report["serving"]["is_serving"] and served["steps"] == 1 and served["engine"] == engine.lower()
    (phase,) = served["by_phase"].values()
    assert phase["prefill_tokens"] == batch["prefill_tokens"]
    assert phase["busy_us"] == pytest.approx(steps[0]["busy_us"], abs=0.01)
    assert f"Engine steps from {engine}'s own annotations" in api.render(report)["report.md"]
    assert report["gaps"]["step_source"] == f"{engine.lower()} engine step annotations"
