"""torch.compile awareness (analyzer/views/compiles.py, analyzer/views/graph_breaks.py and their detectors).

On real captures: the compile_recompile workload on the CPU (Dynamo recompiles there as on CUDA; aot_eager skips
kernel generation) and on an H100 with and without Python stacks, and the compile_graph_break workload (a
data-dependent `.item()` inside a compiled sampler) on the CPU and on an H100. A compile in the window after the
capture's own unprofiled steps is never a one-time cost; a graph break is one finding at the line that broke."""
import gzip
import json
import re
from pathlib import Path

import pytest

from analyzer import api
from analyzer.trace.runmeta import RunMeta
from analyzer.views.graph_breaks import graph_breaks
from conftest import run_cli
from rawtrace import raw_events

HERE = Path(__file__).resolve().parents[1]
H100 = HERE / "fixtures" / "h100_compile"
TINY = ["--set", "model.preset=tiny", "--set", "batch_size=2", "--set", "prompt_length=8", "--set", "decode_steps=8",
        "--set", "compile.backend=aot_eager", "--set", "timing.warmup_steps=1", "--set", "profiler.warmup=1",
        "--set", "profiler.active=4"]


def capture(tmp_path_factory, workload: str) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp(workload)
    result = run_cli("capture", f"workloads/{workload}.yaml", "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = list(out.iterdir())
    return folder


@pytest.fixture(scope="module")
def recompile_run(tmp_path_factory):
    return capture(tmp_path_factory, "compile_recompile")


def compile_ids(run: Path) -> list[str]:
    with gzip.open(run / "rank0.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    return sorted({m.group(1) for e in events if e.get("cat") == "user_annotation"
                   for m in [re.match(r"dynamo_data: compile_id=(\d+/\d+)", e["name"])] if m},
                  key=lambda i: int(i.split("/")[1]))


def analyze(run: Path, *, meta: bool = True) -> dict:
    trace = api.load(run, cache=False) if meta else api.load(run, cache=False, meta=RunMeta(run / "meta.json", {}))
    return api.analyze(trace).report


def recompile_findings(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == "recompile"]


def test_every_compile_after_the_captures_own_steps_is_a_recompile_of_one_call_site(recompile_run):
    ids = compile_ids(recompile_run)
    assert len(ids) >= 3 and ids[0].endswith("/0")  # a cold cache (reset per sequence), then one per new length
    report = analyze(recompile_run)
    (f,) = recompile_findings(report)  # one calling function, one finding
    # the capture ran the same steps unprofiled first: even the window's first compile is one they did not make
    assert f["count"] == len(ids) and f["detail"]["compile_ids"] == ids
    steps = json.loads((recompile_run / "meta.json").read_text())["unprofiled"]["steps"]
    assert f"after {steps} unprofiled steps of the same workload" in f["title"]
    assert "decode_recompile.py" in f["call_site"] and "step()" in f["call_site"]
    assert "dynamic=True" in f["advice"] and "recompile_limit" in f["advice"]
    assert report["recompiles"]["recompiles"] == report["recompiles"]["compiles"] == len(ids)
    assert not any("decode_recompile" in w["title"] for w in report["findings"] if w["kind"] == "warmup")


def test_without_meta_only_the_first_compile_of_a_caller_may_be_one_time(recompile_run):
    ids = compile_ids(recompile_run)
    (f,) = recompile_findings(analyze(recompile_run, meta=False))
    assert f["count"] == len(ids) - 1 and f["detail"]["compile_ids"] == ids[1:]
    assert "unprofiled steps" not in f["title"] and f["title"].startswith("torch.compile recompiled")


def test_recompiles_are_found_from_dynamos_own_ops_when_the_trace_has_no_stacks():
    run = H100 / "compile_recompile_nostack"
    report = analyze(run)
    (f,) = recompile_findings(report)
    assert f["count"] == 6 and f["detail"]["compile_ids"] == [f"0/{n}" for n in range(6)]
    assert f["call_site"] is None and "no Python stacks name the function" in f["title"]
    assert f["severity"] == "high" and f["impact_us"] > 0.8 * report["summary"]["gpu_idle_us"]
    # the compile's tail (guards, caches) after Dynamo's inner compile op is the compile's, not host work in "dynamo"
    assert not [g for g in report["findings"] if g["kind"] in ("host_work", "warmup") and "dynamo" in g["title"]]


def test_a_single_compile_in_a_window_after_warm_up_is_not_a_one_time_cost():
    report = analyze(H100 / "compile_recompile")
    (f,) = recompile_findings(report)
    assert f["count"] == 1 and f["detail"]["compile_ids"] == ["0/0"] and "step()" in f["call_site"]
    assert not [w for w in report["findings"] if w["kind"] == "warmup"]


def test_a_run_without_compiles_in_the_window_reports_none():
    report = analyze(HERE / "fixtures" / "h200_extra" / "compile_decode")
    assert report["recompiles"]["compiles"] == 0 and not recompile_findings(report)
    assert report["graph_breaks"]["breaks"] == 0


def test_a_graph_break_is_one_finding_at_the_line_that_broke_with_its_sync_named():
    report = analyze(H100 / "compile_graph_break")
    (f,) = [g for g in report["findings"] if g["kind"] == "graph_break"]
    assert f["call_site"] == "workloads/decode_graph_break.py:17" and f["count"] == 6
    assert "confident_sample()" in f["title"] and "fullgraph=True" in f["advice"] and "torch.where" in f["advice"]
    assert f["impact_us"] > 0 and f["detail"]["sync_idle_us"] > 0
    (sync,) = [g for g in report["findings"] if g["kind"] == "sync"]
    assert sync["call_site"] == "workloads/decode_graph_break.py:17"  # the sync stays the syncs detector's
    assert report["graph_breaks"]["breaks"] == 6


def test_graph_breaks_are_found_on_a_cpu_capture(tmp_path_factory):
    run = capture(tmp_path_factory, "compile_graph_break")
    trace = api.load(run, cache=False)
    breaks = graph_breaks(trace.model)
    assert len(breaks) >= 4 and set(breaks.site) == {"workloads/decode_graph_break.py:17"}
    assert set(breaks.function) == {"confident_sample"}
    assert (breaks.eager_end_ns > breaks.eager_start_ns).all()


def test_the_finding_names_the_function_dynamo_compiled_and_its_caller():
    """With Python stacks the compiled function's own frame runs right after Dynamo's callback, under the same
    torch.compile wrapper: the finding names it (repetition_penalty, the compiled helper), not only the function
    that called it (step)."""
    trace = H100 / "compile_recompile" / "rank0.trace.json.gz"
    raw = [e for e in raw_events(trace) if e.get("cat") == "python_function"]
    assert any(e["name"].endswith(": repetition_penalty") for e in raw)
    (f,) = recompile_findings(analyze(H100 / "compile_recompile"))
    assert f["detail"]["function"].startswith("repetition_penalty() (defined at workloads/decode_recompile.py:")
    assert "compiled repetition_penalty()" in f["title"] and "called from step()" in f["title"]
