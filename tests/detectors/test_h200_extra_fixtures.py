"""Third-party code on the H200 (transformers generate(), torch.compile of the decode step in both modes) and a
24-layer CUDA-graph decode whose CPU races ahead of the GPU: exact counts from the raw events, and diagnoses that
fit what the code is."""
from collections import Counter
from pathlib import Path

import pytest

from analyzer.trace.runmeta import read_meta
from rawtrace import count_named, raw_events
from conftest import report_of

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h200_extra"
NAMES = ("hf_generate", "compile_decode", "compile_decode_reduce_overhead", "graph_decode_24", "host_work")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


@pytest.fixture(scope="module")
def reports():
    return {name: report_of(FIX / name) for name in NAMES}


def events(name):
    return raw_events(FIX / name / "rank0.trace.json.gz")


def top_level(report, kind):
    return [f for f in report["findings"] if f["kind"] == kind and not f["parent"]]


@pytest.mark.parametrize("name", NAMES)
def test_launch_counts_and_size(reports, name):
    raw = events(name)
    assert reports[name]["gaps"]["launch_stats"]["launches"] == sum(count_named(raw, n) for n in LAUNCHES)
    assert (FIX / name / "rank0.trace.json.gz").stat().st_size <= 2_000_000


def test_hf_generate_blocks_at_two_library_sites_per_token(reports):
    report, raw = reports["hf_generate"], events("hf_generate")
    tokens = read_meta(FIX / "hf_generate" / "meta.json").data["script_info"]["tokens_per_generate"]
    steps = [e["name"] for e in raw if e.get("cat") == "user_annotation" and e["name"].startswith("generate#")]
    assert report["gaps"]["step_source"] == "annotations" and len(steps) == report["summary"]["steps"] == 2
    items = [s for s in report["syncs"] if s["kind"] in ("item", "branch")]
    assert sum(s["count"] for s in items) == count_named(raw, "aten::_local_scalar_dense")
    per_token = [s for s in items if s["count"] == tokens * len(steps)]
    # both are a Python `if` on a GPU tensor (aten::is_nonzero over the scalar read), named so, not ".item()"
    assert {s["kind"] for s in per_token} == {"branch"} and {s["op"] for s in per_token} == {"aten::is_nonzero"}
    assert all(f["title"].startswith("`if` / bool() on a GPU tensor blocks the CPU")
               for f in report["findings"] if f["kind"] == "sync" and f["detail"]["kind"] == "branch")
    # the mask helper and the stopping check: two library sites under the same user line, never merged
    libraries = sorted(s["library_site"].split(":")[0] for s in per_token)
    assert libraries == ["transformers/generation/utils.py", "transformers/masking_utils.py"]
    assert {s["call_site"] for s in per_token} == {"workloads/hf_generate.py:102"}
    assert all(s["per_step"] == {step: tokens for step in steps} for s in per_token)
    findings = [f for f in report["findings"] if f["kind"] == "sync" and f["library_site"]]
    assert len({f["library_site"] for f in findings}) == len(findings) >= 2
    # eager transformers decoding is launch-bound; the steps are generate() calls, not decode steps
    launch = top_level(report, "launch_gap")[0]
    assert launch["impact_us"] > 0.8 * report["summary"]["gpu_idle_us"]
    assert report["summary"]["step_word"] == "step" and "decode" not in launch["advice"]
    assert any("transformers/" in (f["library_site"] or "") for f in report["findings"] if f["parent"])


def test_compiled_decode_is_attributed_to_the_user_call_of_the_graph(reports):
    report, raw = reports["compile_decode"], events("compile_decode")
    steps = [e for e in raw if e.get("cat") == "user_annotation" and e["name"].startswith("decode_step#")]
    calls = [e for e in raw if e.get("cat") == "python_function" and "torchinductor_" in e["name"]
             and e["name"].endswith("): call")]
    assert len(calls) == len(steps) == 6  # one compiled-graph call per decode step
    child = next(f for f in report["findings"] if f["parent"] == "launch_overhead")
    assert child["call_site"] == "_decode() (defined at workloads/qwen2/generate.py:99)"
    assert "(Inductor output)" in child["title"] and "torchinductor_" not in child["title"]
    assert 'mode="reduce-overhead"' in top_level(report, "launch_gap")[0]["advice"]


def test_reduce_overhead_replays_one_graph_per_step(reports):
    report, raw = reports["compile_decode_reduce_overhead"], events("compile_decode_reduce_overhead")
    steps = [s for s in report["gaps"]["per_step"] if s["step"].startswith("decode_step")]
    assert count_named(raw, "cudaGraphLaunch") == len(steps) == 6
    assert report["summary"]["traits"]["graphs"]["replays"] == 6
    assert report["gaps"]["cuda_graph_estimate"] is None
    advice = top_level(report, "launch_gap")[0]["advice"]
    assert "already replays CUDA graphs" in advice and "Capture the" not in advice
    queued = [f for f in report["findings"] if f["kind"] == "queued"]
    assert queued and all("CUDA graphs)" not in f["advice"] for f in queued)  # no graph advice to a graph run


def test_graph_backlog_stays_with_the_step_that_launched_it(reports):
    """24 layers: the CPU queues each replay in ~0.6 ms while the GPU needs ~1.6 ms for it. Every decode step
    owns exactly the kernels of its own cudaGraphLaunch, and the dilation compares GPU periods with the capture's
    CUDA-event timing."""
    report, raw = reports["graph_decode_24"], events("graph_decode_24")
    graph_corr = [e["args"]["correlation"] for e in raw if e.get("name") == "cudaGraphLaunch"]
    per_graph = Counter(e["args"]["correlation"] for e in raw
                        if e.get("cat") == "kernel" and e["args"].get("correlation") in set(graph_corr))
    steps = [s for s in report["gaps"]["per_step"] if s["step"].startswith("decode_step")]
    assert len(steps) == len(graph_corr) == 8 and len(set(per_graph.values())) == 1
    busy = [s["busy_us"] for s in steps]
    assert max(busy) < 1.05 * min(busy)
    assert all(s["gpu_span_us"] > s["cpu_us"] for s in steps[1:])  # the GPU is the slower side here
    dilation = report["summary"]["step_time_us"]
    assert "GPU period" in dilation["profiled_measure"] and 0.8 < dilation["profiler_dilation"] < 1.5
    queued = report["gaps"]["by_cause"]["queued"]
    assert queued > 0 and all(s["idle_by_cause_us"]["cpu_launch"] < 0.2 * s["idle_us"] for s in steps[2:])


def test_host_work_names_the_helper_not_its_generator_expression(reports):
    """position_checksum() runs a generator expression after every decode step while the GPU has nothing queued:
    one finding, for the helper (not the <genexpr> frames, not the step() that calls it)."""
    report, raw = reports["host_work"], events("host_work")
    calls = sorted((e for e in raw if e.get("cat") == "python_function"
                    and e["name"].endswith("): position_checksum")), key=lambda e: e["ts"])
    genexpr = sum(1 for e in raw if e.get("cat") == "python_function" and e["name"].endswith("): <genexpr>"))
    assert len(calls) == 6 and genexpr >= 6 * 3000  # one frame per resume of the generator
    host = [f for f in report["findings"] if f["kind"] == "host_work"]
    assert [f["call_site"] for f in host] == ["position_checksum() (defined at workloads/decode_host_work.py:8)"]
    # every call leaves one long gap: the last one at the window's tail, after the last step's GPU work
    assert host[0]["count"] == len(calls)
    assert host[0]["impact_us"] >= 0.5 * sum(e["dur"] for e in calls)
    assert not any("genexpr" in (f["title"] + (f["call_site"] or "")) for f in report["findings"])
