"""`python -m analyzer capture` end to end on the CPU: real torch.profiler traces of the tiny preset."""
import gzip
import json
import statistics
from collections import Counter

import pytest

from conftest import REPO

pytest.importorskip("torch")


def only_run(out):
    runs = [p for p in out.iterdir()]
    assert len(runs) == 1, runs
    return runs[0]


def load_trace(run):
    with gzip.open(run / "rank0.trace.json.gz") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from conftest import run_cli
    out = tmp_path_factory.mktemp("traces")
    result = run_cli("capture", "workloads/tiny.yaml", "--out", str(out), "--set", "profiler.active=3")
    assert result.returncode == 0, result.stderr
    return only_run(out), result


def test_run_folder_layout(tiny_run):
    run, result = tiny_run
    assert run.name.startswith("tiny-") and run.name.endswith("Z")
    assert sorted(p.name for p in run.iterdir()) == ["meta.json", "rank0.stackless.trace.json.gz",
                                                     "rank0.trace.json.gz"]
    assert f"analyze {run}" in result.stdout or "analyze " in result.stdout
    assert "auto resolved to CPU" in result.stderr  # the visible note


def test_meta_records_what_only_the_capture_knows(tiny_run):
    run, _ = tiny_run
    meta = json.loads((run / "meta.json").read_text())
    assert meta["complete"] is True and meta["error"] is None
    assert meta["workload"]["model"]["preset"] == "tiny"
    assert meta["workload"]["profiler"]["active"] == 3
    assert meta["environment"]["torch"] and meta["environment"]["device"] == "cpu"
    timing = meta["unprofiled"]
    sessions = meta["workload"]["timing"]["sessions"]
    assert sessions == 3 and timing["sessions"] == 3 and len(timing["session_p50_ms"]) == 3
    assert timing["steps"] == 8 * 3 and len(timing["per_step_ms"]) == 8 * 3
    assert 0 < timing["step_ms"]["min"] <= timing["step_ms"]["p50"] <= timing["step_ms"]["max"]
    assert timing["tokens_per_s"] > 0 and timing["prefill_ms"] > 0
    assert meta["profiled"]["annotations"] == ["prefill", "decode_step#0", "decode_step#1", "decode_step#2"]
    assert meta["model"]["config"]["num_hidden_layers"] == 2


def test_trace_is_plain_kineto_with_annotations(tiny_run):
    run, _ = tiny_run
    trace = load_trace(run)
    events = trace["traceEvents"]
    cats = Counter(e.get("cat") for e in events)
    assert cats["cpu_op"] > 0 and cats["python_function"] > 0  # with_stack
    annotations = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    for name in ("prefill", "decode_step#0", "decode_step#1", "decode_step#2"):
        assert annotations.count(name) == 1
    assert sum(a.startswith("ProfilerStep#") for a in annotations) == 4
    memory = [e for e in events if e.get("name") == "[memory]"]
    assert memory and all(e["args"]["Device Type"] == 0 for e in memory)  # CPU allocations
    ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert {"aten::linear", "aten::scaled_dot_product_attention", "aten::index_copy_", "aten::argmax"} <= ops
    assert "aten::item" not in ops and "aten::_local_scalar_dense" not in ops  # the clean loop never syncs


def test_never_overwrites(tmp_path, cli):
    out = tmp_path / "traces"
    for _ in range(2):
        result = cli("capture", "workloads/tiny.yaml", "--out", str(out), "--set", "profiler.active=1",
                     "--set", "decode_steps=2")
        assert result.returncode == 0, result.stderr
    runs = sorted(p.name for p in out.iterdir())
    assert len(runs) == 2 and len(set(runs)) == 2
    assert not any(name.startswith(".") for name in runs)


def test_failure_mid_run_leaves_incomplete_run(tmp_path, cli):
    (tmp_path / "boom.py").write_text(
        "from workloads.base import DecodeWorkload\n"
        "class Workload(DecodeWorkload):\n"
        "    def step(self):\n"
        "        super().step()\n"
        "        if self.steps_done == 3 and getattr(self, 'profiling', False):\n"
        "            raise RuntimeError('boom at step 3')\n"
        "        if self.steps_done == 2:\n"
        "            self.profiling = True\n")
    (tmp_path / "boom.yaml").write_text("script: boom.py\nmodel: {preset: tiny}\nprompt_length: 8\n"
                                        "decode_steps: 2\ntiming: {warmup_steps: 1}\nprofiler: {warmup: 1, active: 4}\n")
    out = tmp_path / "traces"
    result = cli("capture", str(tmp_path / "boom.yaml"), "--out", str(out))
    assert result.returncode == 1
    assert "INCOMPLETE" in result.stdout and "boom at step 3" in result.stdout
    run = only_run(out)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["complete"] is False and "boom at step 3" in meta["error"]
    assert "unprofiled" in meta  # what ran before the failure is kept


def test_a_script_builds_its_own_model_through_the_build_model_hook(tmp_path, cli):
    """Workload.build_model(workload, device, dtype, tp) replaces the default Qwen2 builder (workloads/runtime.py):
    here one layer whatever model.layers says, which meta.json's model shape shows."""
    (tmp_path / "own.py").write_text(
        "from workloads.base import DecodeWorkload\n"
        "from workloads.qwen2 import PRESETS, random_model\n"
        "class Workload(DecodeWorkload):\n"
        "    @classmethod\n"
        "    def build_model(cls, workload, device, dtype, tp=None):\n"
        "        return random_model(PRESETS['tiny'].with_layers(1), device, dtype, workload.seed, tp=tp)\n")
    (tmp_path / "own.yaml").write_text("script: own.py\nmodel: {preset: tiny, layers: 3}\nprompt_length: 8\n"
                                       "decode_steps: 2\nprofiler: {active: 2}\n")
    out = tmp_path / "traces"
    result = cli("capture", str(tmp_path / "own.yaml"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    meta = json.loads((only_run(out) / "meta.json").read_text())
    assert meta["model"]["config"]["num_hidden_layers"] == 1, meta["model"]


@pytest.mark.parametrize("name", ["decode", "prefill", "batch_decode", "item_sync", "print_tensor", "alloc_churn"])
def test_every_shipped_workload_runs_on_cpu(tmp_path, cli, name):
    """The shipped YAMLs with the tiny preset swapped in, so CI runs each script for real."""
    out = tmp_path / "traces"
    result = cli("capture", f"workloads/{name}.yaml", "--out", str(out), "--set", "model.preset=tiny",
                 "--set", "decode_steps=2", "--set", "profiler.active=2", "--set", "prompt_length=8")
    assert result.returncode == 0, result.stderr
    run = only_run(out)
    events = load_trace(run)["traceEvents"]
    ops = Counter(e["name"] for e in events if e.get("cat") == "cpu_op")
    if name == "item_sync":
        assert ops["aten::item"] == 2  # one per recorded decode step: the PATHOLOGY line
    elif name == "prefill":
        assert [e["name"] for e in events if e.get("cat") == "user_annotation" and "#" in e["name"]
                and not e["name"].startswith("ProfilerStep")] == ["prefill#0", "prefill#1"]
    else:
        assert ops["aten::item"] == 0 or name == "print_tensor"


def test_ctrl_c_leaves_a_clearly_incomplete_run(tmp_path):
    """SIGINT mid-run: the run folder is published, marked incomplete, with no half-written file under a final
    name, and the command exits 130."""
    import os
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "traces"
    # SIGINT at its default in the child: pytest started in the background (`cmd &` in a script) ignores SIGINT, and
    # a child would inherit that and run to the end
    proc = subprocess.Popen(
        [sys.executable, "-m", "analyzer", "capture", "workloads/tiny.yaml", "--out", str(out),
         "--set", "decode_steps=3000", "--set", "prompt_length=8"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    for line in proc.stderr:  # phase lines arrive as the run goes (stderr is not a terminal)
        if "timing (no profiler)" in line or time.monotonic() > deadline:
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout
    run = only_run(out)
    assert not run.name.startswith(".")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["complete"] is False and "interrupted" in meta["error"]
    assert sorted(p.name for p in run.iterdir()) == ["meta.json"]  # no trace: the profiler never started
    assert "INCOMPLETE" in stdout


def test_diff_against_a_cpu_run_calls_its_gpu_memory_peak_unknown_not_zero(tiny_run):
    """A CPU trace has no CUDA [memory] events: its reserved peak is unknown, and a diff says so."""
    from analyzer import api
    from conftest import REPO
    run, _ = tiny_run
    cpu = api.analyze(api.load(run)).report
    gpu = api.analyze(api.load(REPO / "tests" / "fixtures" / "h200" / "alloc_churn")).report
    d = api.compare("cpu", cpu, "h200", gpu)
    peak = d["allocator"]["reserved_peak_bytes"]
    assert peak == {"before": None, "after": gpu["allocator"]["reserved_peak_bytes"]} and peak["after"] > 0
    assert "peak reserved unknown (no [memory] events) → " in api.render_diff_markdown(d)


def test_diff_verdict_weighs_step_time_against_the_runs_own_session_noise(tiny_run, tmp_path, cli):
    """The same run against itself: no change, within noise. Against the same workload with 32x the layers: slower,
    and judged beyond or within the noise by the rule, on what the two runs measured. They are separate processes
    timed minutes apart, so how noisy they are depends on what else the machine runs (under heavy load a tiny run's
    sessions were 18x apart): the test checks the weighing, never how fast this machine was."""
    from analyzer import api
    run, _ = tiny_run
    same = api.compare("a", api.analyze(api.load(run)).report, "b", api.analyze(api.load(run)).report)["verdict"]
    assert same["outcome"] == "unchanged" and "within the noise" in same["headline"]
    out = tmp_path / "slow"
    result = cli("capture", "workloads/tiny.yaml", "--out", str(out), "--set", "model.layers=64",
                 "--set", "profiler.active=1", "--set", "profiler.with_stack=false",
                 "--set", "sync_debug_pass=false")
    assert result.returncode == 0, result.stderr
    slow = api.analyze(api.load(only_run(out))).report
    fast = api.analyze(api.load(run)).report
    d = api.compare("tiny", fast, "tiny-64-layers", slow)
    step, verdict = d["verdict"]["step"], d["verdict"]
    assert step["measure"] == "unprofiled step" and step["session_spread"] is not None
    assert step["ratio"] > 1  # 32x the ops per step
    spreads = [(max(m) - min(m)) / statistics.median(m) for m in
               (r["run"]["unprofiled"]["session_p50_ms"] for r in (fast, slow))]
    assert step["session_spread"] == pytest.approx(max(spreads), abs=1e-4)  # the noisier run's sessions
    beyond = step["interval"][0] > 1 and step["ratio"] - 1 > step["session_spread"]
    if beyond:
        assert verdict["outcome"] == "worse" and "beyond the noise" in verdict["headline"]
        assert api.render_diff_markdown(d).split("\n")[3].startswith("**Worse: the median unprofiled step went ")
    else:  # the step time alone decides nothing then (findings that came or went still may)
        assert "within the noise" in verdict["headline"]


def test_compare_fix_times_the_fixed_twin_in_interleaved_sessions(tmp_path, cli):
    """item_sync against decode (its fix) on one model in one process: rounds of one session each, alternating which
    goes first; meta.json's fix_comparison holds both sides' session medians and their paired differences."""
    out = tmp_path / "traces"
    result = cli("capture", "workloads/item_sync.yaml", "--out", str(out), "--set", "model.preset=tiny",
                 "--set", "decode_steps=3", "--set", "profiler.active=1", "--set", "prompt_length=8",
                 "--set", "timing.sessions=2", "--set", "timing.compare_fix=decode")
    assert result.returncode == 0, result.stderr
    fix = json.loads((only_run(out) / "meta.json").read_text())["fix_comparison"]
    assert fix["fixed_script"] == "decode"
    assert len(fix["session_p50_ms"]) == len(fix["fixed_session_p50_ms"]) == len(fix["paired_saving_ms"]) == 2
    assert fix["paired_saving_ms"] == pytest.approx([a - b for a, b in zip(fix["session_p50_ms"],
                                                                           fix["fixed_session_p50_ms"])])
    assert fix["saving_ms"] == pytest.approx(fix["step_ms"] - fix["fixed_step_ms"])
    assert min(fix["paired_saving_ms"]) == fix["paired_saving_range_ms"][0]
    for k in (1, 2):
        assert f"fix comparison, round {k} of 2: decode" in result.stderr
        assert f"fix comparison, round {k} of 2: as captured" in result.stderr


def test_compare_fix_compile_mode_needs_compile_decode_as_the_twin(tmp_path, cli):
    result = cli("capture", "workloads/item_sync.yaml", "--out", str(tmp_path), "--set", "timing.compare_fix=decode",
                 "--set", "timing.compare_fix_compile_mode=reduce-overhead")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "key 'timing.compare_fix_compile_mode'" in result.stderr and "'decode'" in result.stderr
    assert not any(tmp_path.iterdir())


def test_compare_fix_names_an_unknown_script_on_one_line(tmp_path, cli):
    result = cli("capture", "workloads/item_sync.yaml", "--out", str(tmp_path), "--set", "timing.compare_fix=nope")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "key 'timing.compare_fix': unknown script 'nope'" in result.stderr
    assert not any(tmp_path.iterdir())


def test_capture_probes_the_profilers_cost(tiny_run):
    """The probe times its loops with and without the profiler (this run's settings) before the window: a Python
    call, a builtin's call and an op each cost something under with_stack, an op more than a Python call (it records
    shapes and its own event besides the call's)."""
    run, _ = tiny_run
    meta = json.loads((run / "meta.json").read_text())
    probe = meta["profiler_cost"]
    costs = probe["per_event_us"]
    assert probe["settings"] == {"record_shapes": True, "profile_memory": True, "with_stack": True, "cuda": False}
    assert costs["python_call"] > 0 and costs["c_call"] > 0 and costs["op"] > costs["python_call"]
    assert not {"launch", "graph_node", "gpu_queued_kernel", "gpu_graph_node"} & set(costs)  # CPU: no launches
    loops = probe["loop_ms"]
    assert all(loops[k]["profiled_p50"] > loops[k]["unprofiled_p50"] for k in ("python_call", "c_call", "op"))
    assert probe["probe_s"] > 0


def test_stackless_pass_records_the_same_window_without_python_events(tiny_run):
    """The window runs once more under the same settings but without Python stacks: no python_function event, the
    same steps and, step by step, the same sequence of call boundaries, so every step lines up with the trace's;
    a folder walk still finds one trace, and the analysis reads the stackless pass beside it."""
    import numpy as np
    from analyzer import api
    from analyzer.views.stackless import host_gaps
    run, _ = tiny_run
    meta = json.loads((run / "meta.json").read_text())
    assert meta["stackless_pass"]["trace"] == "rank0.stackless.trace.json.gz"
    assert meta["stackless_pass"]["recorded_steps"] == meta["profiled"]["recorded_steps"]
    assert [i.trace.name for i in api.find(run)] == ["rank0.trace.json.gz"]
    trace = api.load(run, cache=False)
    assert trace.stackless is not None and len(trace.stackless.frames) == 0 and len(trace.model.frames) > 0
    assert len(trace.stackless.steps) == len(trace.model.steps)
    gaps = host_gaps(trace.model, trace.stackless)
    assert gaps.steps == meta["profiled"]["recorded_steps"] and gaps.steps_matched == gaps.steps
    assert (gaps.end_ns >= gaps.start_ns).all() and (gaps.stackless_ns >= 0).all()
    # every Python event the recorded steps hold on their thread lies in a gap the stackless pass times (how much
    # shorter the gaps run without stacks is the host's timing, which a busy machine moves: not asserted here)
    m = trace.model
    frames = np.flatnonzero((m.frames.tid == gaps.tid) & (m.frames.start_ns >= gaps.start_ns[0])
                            & (m.frames.start_ns < gaps.end_ns[-1]))
    k = np.searchsorted(gaps.start_ns, m.frames.start_ns[frames], side="right") - 1
    assert len(frames) > 100 and (m.frames.start_ns[frames] < gaps.end_ns[k]).all()


def test_stackless_pass_times_a_pure_python_helper(tmp_path):
    """decode_host_work's helper (3,000 iterations of a generator expression) records ~6,000 Python events a step
    with stacks; the stackless pass times the gap that holds it. What the gaps lost to their Python events, over their probed cost, is the ratio the what-if
    scales the other Python events by."""
    import numpy as np
    from conftest import run_cli
    from analyzer import api
    from analyzer.views.profiler_cost import event_costs
    from analyzer.views.timed_gaps import timed_costs
    from analyzer.views.context import AnalysisContext
    result = run_cli("capture", "workloads/host_work.yaml", "--out", str(tmp_path), "--set", "model.preset=tiny",
                     "--set", "profiler.active=3", "--set", "timing.sessions=1")
    assert result.returncode == 0, result.stderr
    trace = api.load(only_run(tmp_path), cache=False)
    ctx = AnalysisContext(trace.model, trace.meta, stackless=trace.stackless)
    gaps, m = ctx.stackless_gaps, trace.model
    assert gaps.steps_matched == gaps.steps == 4  # the prefill and 3 decode steps
    helper = [k for k, n in enumerate(m.names) if n.startswith("workloads/decode_host_work.py") and "position_checksum"
              in n]
    starts = m.frames.start_ns[np.isin(m.frames.name, helper)]
    at = np.searchsorted(gaps.start_ns, starts, side="right") - 1
    assert len(at) == 3 and (starts < gaps.end_ns[at]).all()  # one call a decode step, each inside a timed gap
    # each gap measured in the pass without stacks (how much shorter it ran there is a timing, which a busy machine
    # moves: the what-if reads the ratio, the test only that it was measured)
    assert (gaps.stackless_ns[at] > 0).all() and (gaps.end_ns[at] > gaps.start_ns[at]).all()
    us = event_costs(ctx).per_event_us
    builtin = np.array([n.startswith("<built-in") for n in m.names], bool)
    probed = np.where(builtin[m.frames.name], us["c_call"], us["python_call"]) * 1e3
    timed = timed_costs(m, probed, (), gaps)
    measured, summary = timed.cuts[2], timed.summary
    assert summary["python_events"] > 3 * 6000
    assert 0 < summary["measured_ms"] <= measured.sum() / 1e6 * (1 + 1e-3)
    # what the timed gaps lost, over their events' probed cost: a ratio of two times measured a few seconds apart
    # (how far it sits from 1 depends on the host's load then; the what-if clips the ratio it applies elsewhere)
    assert summary["measured_over_probed"] == pytest.approx(summary["measured_ms"] / summary["probed_ms"], rel=1e-2)
    assert summary["measured_ms"] > 0 and (measured >= 0).all()
