"""Workloads of code we did not write, on the CPU: transformers' own `generate()` (hf_generate.yaml) and
torch.compile of our decode step (compile_decode.yaml). Each is captured end to end with the tiny preset and checked
in the raw trace; their greedy tokens are checked against our eager runtime's (fp32)."""
import gzip
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")

from workloads.qwen2 import PRESETS, Generator, Sampling, random_model  # noqa: E402

# batch 2, 8-token prompts, 3 warm-up steps (compile_decode's minimum), 1 traced-but-discarded and 2 recorded steps
TINY = ["--set", "model.preset=tiny", "--set", "batch_size=2", "--set", "prompt_length=8", "--set", "decode_steps=8",
        "--set", "timing.warmup_steps=3", "--set", "profiler.warmup=1", "--set", "profiler.active=2"]
# What the capture sizes the decode workloads' cache to for TINY: prompt + 1 + max(decode_steps, warm-up, ...)
TINY_CAPACITY = 8 + 1 + 8


def only_run(out):
    runs = list(out.iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def load_run(run):
    with gzip.open(run / "rank0.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    return events, json.loads((run / "meta.json").read_text())


def step_spans(events):
    """Our step annotations (not ProfilerStep#N) -> (start, end) on the trace clock."""
    return {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("cat") == "user_annotation" and not e["name"].startswith(("ProfilerStep#", "## "))
            and e.get("ph") == "X"}


def ops_within(events, span):
    start, end = span
    return Counter(e["name"] for e in events if e.get("cat") == "cpu_op" and start <= e["ts"] <= end)


def rejects(result, workload_file, out, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert workload_file in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir())


# --- hf_generate: transformers' Qwen2ForCausalLM.generate() ---------------------------------------------------

def test_capture_path_never_imports_transformers():
    code = ("import sys; import analyzer.capture.runner, analyzer.capture.config, workloads.base, workloads.decode, "
            "workloads.compile_decode; sys.exit('transformers imported' if 'transformers' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout


def test_hf_generate_without_transformers_is_one_line(tmp_path):
    """A machine without transformers: the usual one-line error naming the file and the fix, exit 2, nothing
    written (a stand-in `transformers` module that fails to import as a missing one does)."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "transformers.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'transformers'\", name='transformers')\n")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "analyzer", "capture", "workloads/hf_generate.yaml", "--out",
                             str(out), *TINY], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=f"{stub}{os.pathsep}{REPO}"))
    rejects(result, "workloads/hf_generate.yaml", out, "key 'script'", "transformers", "not installed",
            "pip install -e '.[hf]'")


def test_new_keys_validate(tmp_path, cli):
    from analyzer.capture.config import load_config
    assert load_config(REPO / "workloads/hf_generate.yaml").hf.max_new_tokens == 16
    config = load_config(REPO / "workloads/compile_decode.yaml", ["compile.mode=reduce-overhead"])
    assert config.compile.mode == "reduce-overhead" and config.as_dict()["compile"] == {"mode": "reduce-overhead",
                                                                                        "backend": "inductor"}
    # what the script's __init__ gets
    assert config.options(["compile"]) == {"compile.mode": "reduce-overhead", "compile.backend": "inductor"}
    out = tmp_path / "out"
    rejects(cli("capture", "workloads/compile_decode.yaml", "--out", str(out), "--set", "compile.mode=fast"),
            "workloads/compile_decode.yaml", out, "'compile.mode'", "allowed: default, reduce-overhead")
    rejects(cli("capture", "workloads/hf_generate.yaml", "--out", str(out), "--set", "hf.max_new_tokens=0"),
            "workloads/hf_generate.yaml", out, "'hf.max_new_tokens'", "minimum 1")
    # compile_decode's own check, before the model is built: compilation must stay out of the timed steps
    rejects(cli("capture", "workloads/compile_decode.yaml", "--out", str(out), *TINY,
                "--set", "timing.warmup_steps=1"),
            "workloads/compile_decode.yaml", out, "'timing.warmup_steps'", "3 or more")


@pytest.mark.parametrize("tied", [False, True])
def test_hf_generate_greedy_tokens_equal_runtime(tied):
    """transformers' generate() on our runtime's weights (shared, not copied) makes our runtime's greedy tokens."""
    pytest.importorskip("transformers")
    import dataclasses

    from workloads.hf_generate import Workload
    config = dataclasses.replace(PRESETS["tiny"], tie_word_embeddings=tied)
    model = random_model(config, torch.device("cpu"), torch.float32, seed=3)
    wl = Workload(model, batch_size=3, prompt_length=9, capacity=0, sampling=Sampling(), mode="eager", seed=4,
                  options={"hf.max_new_tokens": 12})
    hf_params = dict(wl.hf.named_parameters(remove_duplicate=False))
    for name, param in model.named_parameters(remove_duplicate=False):
        assert hf_params[name].data_ptr() == param.data_ptr(), name
    wl.new_sequence()
    wl.step()
    out = wl.tokens()
    assert out.shape == (3, 9 + 12)
    gen = Generator(model, batch_size=3, capacity=9 + 12)
    gen.prefill(wl.input_ids)
    for _ in range(11):
        gen.step()
    assert torch.equal(out, gen.tokens())
    assert wl.describe()["output_tokens_last_call"] == 12


def test_hf_generate_fixed_twin_reuses_one_static_cache_and_makes_the_same_tokens():
    """hf_generate_static (hf_generate's measured fix): one StaticCache, reset in place, serves every generate()
    call at the same addresses (what keeps the compiled forward's CUDA graphs valid), and the greedy tokens of each
    call equal the eager generate()'s."""
    pytest.importorskip("transformers")
    from workloads.hf_generate import Workload as Eager
    from workloads.hf_generate_static import Workload as Fixed
    model = random_model(PRESETS["tiny"], torch.device("cpu"), torch.float32, seed=3)
    kwargs = dict(batch_size=2, prompt_length=7, capacity=0, sampling=Sampling(), mode="eager", seed=4,
                  options={"hf.max_new_tokens": 5})
    eager, fixed = Eager(model, **kwargs), Fixed(model, **kwargs)
    addresses = []
    for _ in range(2):
        eager.new_sequence()
        fixed.input_ids, fixed.attention_mask = eager.input_ids, eager.attention_mask
        eager.step()
        fixed.step()
        assert torch.equal(fixed.tokens(), eager.tokens())
        addresses.append([layer.keys.data_ptr() for layer in fixed.cache.layers])
    assert addresses[0] == addresses[1]
    assert "StaticCache" in fixed.describe()["cache"]


def test_hf_generate_capture_on_cpu(tmp_path, cli):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "traces"
    result = cli("capture", "workloads/hf_generate.yaml", "--out", str(out), *TINY, "--set", "decode_steps=3",
                 "--set", "hf.max_new_tokens=4")
    assert result.returncode == 0, result.stderr
    run = only_run(out)
    assert run.name.startswith("hf_generate-")
    assert sorted(p.name for p in run.iterdir()) == ["meta.json", "rank0.stackless.trace.json.gz",
                                                     "rank0.trace.json.gz"]
    events, meta = load_run(run)
    assert meta["complete"] is True and meta["workload"]["hf"] == {"max_new_tokens": 4}
    timing = meta["unprofiled"]
    sessions = meta["workload"]["timing"]["sessions"]
    assert timing["step_label"] == "generate" and timing["prefill_ms"] is None and timing["steps"] == 3 * sessions
    assert timing["tokens_per_step"] == 4 and len(timing["session_p50_ms"]) == sessions
    assert timing["tokens_per_s"] == pytest.approx(2 * 4 * 3 * sessions / timing["wall_s"])
    assert meta["profiled"]["annotations"] == ["generate#0", "generate#1"]
    info = meta["script_info"]
    assert info["transformers"] == transformers.__version__ and info["output_tokens_last_call"] == 4
    assert info["generate_kwargs"] == {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False}
    assert len(meta["sample_tokens"]) == 8
    # The raw trace: one annotation per generate() call, each holding its 4 forward passes (prefill + 3 decode
    # iterations: one embedding lookup each), made inside transformers' generate (Python frames)
    annotations = Counter(e["name"] for e in events if e.get("cat") == "user_annotation")
    assert annotations["generate#0"] == annotations["generate#1"] == 1
    assert sum(n for name, n in annotations.items() if name.startswith("ProfilerStep#")) == 2
    spans = step_spans(events)
    assert sorted(spans) == ["generate#0", "generate#1"]
    for span in spans.values():
        assert ops_within(events, span)["aten::embedding"] == 4
    frames = {e["name"] for e in events if e.get("cat") == "python_function"}
    assert any("transformers" in f and "generate" in f for f in frames)


# --- compile_decode: torch.compile of our decode step ----------------------------------------------------------

def compile_problem():
    from workloads.compile_decode import toolchain_problem
    return toolchain_problem(torch.device("cpu"))


needs_compiler = pytest.mark.skipif(compile_problem() is not None,
                                    reason=f"torch.compile on the CPU cannot run here: {compile_problem()}")


@needs_compiler
def test_compile_decode_greedy_tokens_equal_eager():
    """The compiled step (shapes as in the capture below, so its compile is reused from inductor's cache there) makes
    the eager decode's greedy tokens, across two sequences, with one compiled graph."""
    from torch._dynamo.utils import counters

    from workloads.compile_decode import Workload
    model = random_model(PRESETS["tiny"], torch.device("cpu"), torch.float32, seed=0)
    graphs_before = counters["stats"]["unique_graphs"]
    wl = Workload(model, batch_size=2, prompt_length=8, capacity=TINY_CAPACITY, sampling=Sampling(), mode="eager",
                  seed=0, options={"compile.mode": "default"})
    eager = Generator(model, batch_size=2, capacity=TINY_CAPACITY)
    for _ in range(2):
        wl.new_sequence()
        eager.prefill(wl.generator.tokens()[:, :8].clone())
        for _ in range(TINY_CAPACITY - 9):
            wl.step()
            eager.step()
        assert torch.equal(wl.tokens(), eager.tokens())
    assert counters["stats"]["unique_graphs"] - graphs_before == 1
    assert len(wl.describe()["first_calls_s"]) == 3


@needs_compiler
def test_compile_decode_timed_against_itself_in_reduce_overhead_mode(tmp_path, cli):
    """The fix for a compiled step's launch overhead is a torch.compile mode: the twin is compile_decode itself with
    compile.mode=reduce-overhead, timed in rounds interleaved with the run (on a GPU, one graph replay per step)."""
    out = tmp_path / "traces"
    result = cli("capture", "workloads/compile_decode.yaml", "--out", str(out), *TINY, "--set", "timing.sessions=2",
                 "--set", "timing.compare_fix=compile_decode",
                 "--set", "timing.compare_fix_compile_mode=reduce-overhead")
    assert result.returncode == 0, result.stderr
    _, meta = load_run(only_run(out))
    fix = meta["fix_comparison"]
    assert fix["fixed_script"] == "compile_decode" and fix["fixed_compile_mode"] == "reduce-overhead"
    assert meta["workload"]["compile"]["mode"] == "default"  # the run itself keeps its own mode
    assert len(fix["session_p50_ms"]) == len(fix["fixed_session_p50_ms"]) == 2
    assert "fix comparison, round 2 of 2: compile_decode" in result.stderr


@needs_compiler
def test_compile_decode_capture_on_cpu(tmp_path, cli):
    out = tmp_path / "traces"
    result = cli("capture", "workloads/compile_decode.yaml", "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr
    run = only_run(out)
    events, meta = load_run(run)
    assert meta["complete"] is True and meta["workload"]["compile"] == {"mode": "default", "backend": "inductor"}
    assert meta["unprofiled"]["tokens_per_step"] == 1 and meta["unprofiled"]["tokens_per_s"] > 0
    assert meta["profiled"]["annotations"] == ["prefill", "decode_step#0", "decode_step#1"]
    info = meta["script_info"]
    assert info["compile_mode"] == "default" and info["cuda_graphs"] is False
    assert info["unique_graphs"] == 1  # compiled once, in the warm-up: no recompilation in the profiled window
    assert len(info["first_calls_s"]) == 3
    spans = step_spans(events)
    assert sorted(spans) == ["decode_step#0", "decode_step#1", "prefill"]
    assert ops_within(events, spans["prefill"])["aten::linear"] > 0  # the prefill stays eager
    for name in ("decode_step#0", "decode_step#1"):
        ops = ops_within(events, spans[name])
        assert ops["aten::linear"] == 0 and ops["aten::embedding"] == 0, ops  # inductor's kernels, not eager ops
        compiled = [e for e in events if e.get("cat") == "user_annotation" and "Compiled" in e["name"]
                    and spans[name][0] <= e["ts"] <= spans[name][1]]
        assert len(compiled) == 1, [e["name"] for e in compiled]
