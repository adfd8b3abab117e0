"""Traces the loader must read on its typed path without a warning: torch 1.8/1.9 category names ("Kernel",
"Runtime", "Operator", ..., any case), categories of other devices (MTIA, XPU, ...: counted in foreign_activity), and
GPU work launched before the profiling window began (a note, not a warning). Counts come from the raw JSON
(tests/rawtrace.py, or the events a test writes itself), never from the analyzer. The external traces are skipped
where ../shared/traces/external is absent."""
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from analyzer.trace import GpuKind, load_trace
from rawtrace import raw_events

EXTERNAL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "external"
TRACES = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
OLD_TRACES = ("v100-resnet50-torch18-categories.json.gz", "gpu-metrics-2021-format.json.gz")
LENIENT = "events decoded with lenient types (the slower path for odd values)"
BEFORE_WINDOW = ("gpu: rows launched before the profiling window began (correlation id below every recorded runtime "
                 "call's)")
# the raw categories of GPU work and of runtime calls, in today's and torch 1.8's spelling
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "memcpy", "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}


def external(name: str) -> Path:
    path = EXTERNAL / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def slices(events) -> list[dict]:
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def launched_before_window(events) -> int:
    """GPU rows whose correlation id no runtime call has, all below the lowest id of a recorded call."""
    xs = slices(events)
    calls = {e["args"]["correlation"] for e in xs
             if str(e.get("cat")).lower() in RUNTIME_CATS and "correlation" in e.get("args", {})}
    gpu = [e["args"]["correlation"] for e in xs
           if str(e.get("cat")).lower() in GPU_CATS and "correlation" in e.get("args", {})]
    return sum(1 for c in gpu if c not in calls and calls and c < min(calls))


@pytest.mark.parametrize("name", OLD_TRACES)
def test_torch18_categories_fill_the_tables(name):
    path = external(name)
    raw = slices(raw_events(path))
    cats = Counter(e["cat"] for e in raw)
    assert cats["Kernel"] and cats["Runtime"] and cats["Operator"]  # the old names, nothing of today's
    assert not {"kernel", "cuda_runtime", "cpu_op"} & set(cats)
    model = load_trace(path)
    kinds = Counter(model.gpu.kind.tolist())
    assert kinds[GpuKind.KERNEL] == cats["Kernel"]
    assert kinds[GpuKind.MEMCPY] == cats["Memcpy"]
    assert kinds[GpuKind.MEMSET] == cats["Memset"]
    assert len(model.gpu) == cats["Kernel"] + cats["Memcpy"] + cats["Memset"]
    assert len(model.runtime) == cats["Runtime"] and not model.runtime.is_driver.any()
    assert len(model.ops) == cats["Operator"]
    # record_function ranges were "Operator" events then: the steps among them are annotations
    steps = sorted(e["name"] for e in raw if e["cat"] == "Operator" and e["name"].startswith("ProfilerStep#"))
    assert steps and sorted(model.names[c] for c in model.steps.name) == steps
    assert int(model.ops.is_annotation.sum()) == len(steps)
    # joins: a runtime call to its GPU work by correlation, external ids from the lower-case "external id"
    gpu_ids = {e["args"]["correlation"] for e in raw if e["cat"] in ("Kernel", "Memcpy", "Memset")}
    runtime = [e for e in raw if e["cat"] == "Runtime"]
    assert int((model.runtime.gpu >= 0).sum()) == sum(e["args"]["correlation"] in gpu_ids for e in runtime)
    assert sorted(model.runtime.external_id.tolist()) == sorted(e["args"]["external id"] for e in runtime)
    # CPU tids were strings of digits: they read as the thread's number, so calls nest in their ops
    assert set(model.ops.tid.tolist()) == {int(e["tid"]) for e in raw if e["cat"] == "Operator"}
    assert (model.runtime.op >= 0).mean() > 0.9
    # typed, no warning; the GPU work queued before the window is a note
    assert model.warnings == {} and LENIENT not in model.notes
    assert model.notes.get(BEFORE_WINDOW, 0) == launched_before_window(raw)


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_well_formed_external_traces_load_typed_without_warnings(path):
    model = load_trace(path)
    assert model.warnings == {}
    assert LENIENT not in model.notes
    assert model.notes.get(BEFORE_WINDOW, 0) == launched_before_window(raw_events(path))


def test_queued_work_of_the_traces_that_warned_before_is_a_note():
    """h100/mi300 HF runs: the GPU was ~14 ms behind when profiling began; its queued kernels ran first."""
    for name, expected in (("h100-hf-qwen1.5-0.5b.json.gz", 509), ("mi300-hf-qwen1.5-0.5b.json.gz", 463)):
        path = external(name)
        assert launched_before_window(raw_events(path)) == expected
        model = load_trace(path)
        queued = (model.gpu.correlation >= 0) & (model.gpu.launch < 0)
        assert int(queued.sum()) == model.notes[BEFORE_WINDOW] == expected
        for stream in np.unique(model.gpu.stream[queued]).tolist():  # on a stream, all of it ran before the rest
            on = model.gpu.stream == stream
            assert model.gpu.start_ns[on & queued].max() < model.gpu.start_ns[on & ~queued].min()


def test_mtia_activity_is_counted_as_foreign_and_survives_the_cache(tmp_path):
    source = external("mtia-inference-no-gpu.json.gz")
    raw = slices(raw_events(source))
    expected = dict(Counter(e["cat"] for e in raw if e["cat"].startswith("mtia_")))
    assert set(expected) == {"mtia_runtime", "mtia_ccp_events"}
    trace = tmp_path / source.name
    shutil.copy(source, trace)
    parsed = load_trace(trace, cache=True)  # parses, writes the cache
    reopened = load_trace(trace, cache=True)
    assert isinstance(reopened.ops.start_ns, np.memmap)  # served from the cache
    for model in (parsed, reopened):
        assert model.foreign_activity == expected
        assert model.foreign_device_types == ("MTIA",)
        assert len(model.gpu) == 0 and len(model.runtime) == 0
        assert model.warnings == {} and model.notes == parsed.notes


def write(path: Path, events: list) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_old_categories_in_any_case(tmp_path):
    def x(cat, name, ts, dur=1, pid=100, tid="200", **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    gpu = dict(pid=0, tid="stream 7", stream=7)
    events = [
        x("Operator", "ProfilerStep#3", 0, 100, **{"External id": 1}),
        x("OPERATOR", "aten::add", 1, 20, **{"External id": 2}),
        x("operator", "aten::mul", 30, 20, **{"External id": 3}),
        x("Cpu_Op", "aten::relu", 60, 20, **{"External id": 4}),
        x("RUNTIME", "cudaLaunchKernel", 2, 5, correlation=11, **{"external id": 2}),
        x("Runtime", "cudaMemcpyAsync", 31, 5, correlation=12, **{"external id": 3}),
        x("runtime", "cudaMemsetAsync", 61, 5, correlation=13, **{"external id": 4}),
        x("Driver", "cuLaunchKernel", 62, 5, correlation=14, **{"external id": 4}),
        x("Kernel", "k1", 10, 3, correlation=11, **gpu),
        x("MemCpy", "Memcpy HtoD (Pageable -> Device)", 40, 3, correlation=12, bytes=64, **gpu),
        x("memset", "Memset (Device)", 70, 3, correlation=13, bytes="128", **gpu),  # ROCm writes bytes as a string
        x("KERNEL", "k2", 80, 3, correlation=14, **gpu),
        x("gpu_user_Annotation", "ProfilerStep#3", 9, 80, pid=0, tid=7, **{"External id": 1}),
        x("Python", "train.py(12): step", 0, 100, **{"Python id": 1}),
        x("User annotation", "forward", 1, 50, **{"External id": 5}),
        x("XPU_Runtime", "urEnqueueKernelLaunch", 90, 1, correlation=99),
        x("brand_new_category", "x", 95, 1),
        {"ph": "s", "cat": "async", "name": "launch", "id": 11, "pid": 100, "tid": 200, "ts": 2},
        {"ph": "f", "cat": "async", "name": "launch", "id": 11, "pid": 0, "tid": "stream 7", "ts": 10, "bp": "e"},
    ]
    model = load_trace(write(tmp_path / "old.json", events))
    assert model.warnings == {} and model.notes == {}  # typed, nothing wrong
    assert [model.names[c] for c in model.ops.name] == ["ProfilerStep#3", "forward", "aten::add", "aten::mul",
                                                        "aten::relu"]
    assert model.ops.is_annotation.tolist() == [True, True, False, False, False]
    assert [model.names[c] for c in model.steps.name] == ["ProfilerStep#3"]
    assert model.ops.tid.tolist() == [200] * 5 and model.ops.pid.tolist() == [100] * 5
    assert [model.names[c] for c in model.runtime.name] == ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync",
                                                            "cuLaunchKernel"]
    assert model.runtime.is_driver.tolist() == [False, False, False, True]
    assert model.runtime.external_id.tolist() == [2, 3, 4, 4]
    assert [model.names[model.ops.name[o]] for o in model.runtime.op] == ["aten::add", "aten::mul", "aten::relu",
                                                                          "aten::relu"]
    assert model.gpu.kind.tolist() == [GpuKind.KERNEL, GpuKind.MEMCPY, GpuKind.MEMSET, GpuKind.KERNEL]
    assert model.gpu.stream.tolist() == [7] * 4 and model.gpu.device.tolist() == [0] * 4
    assert model.gpu.bytes.tolist() == [-1, 64, 128, -1]
    assert model.gpu.launch.tolist() == [0, 1, 2, 3] and model.runtime.gpu.tolist() == [0, 1, 2, 3]
    assert len(model.gpu_annotations) == 1 and len(model.frames) == 1
    assert model.foreign_activity == {"xpu_runtime": 1} and model.foreign_device_types == ("XPU",)


def test_gpu_rows_without_their_launch_call(tmp_path):
    """Below every recorded call's id: launched before the window (a note). Among them: the call is missing
    (a warning, saying so)."""
    def x(cat, name, ts, correlation, pid=1, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": 1,
                "args": {"correlation": correlation}}

    events = [x("kernel", "queued", 1, 5, 0, 7), x("cuda_runtime", "cudaLaunchKernel", 2, 10),
              x("kernel", "a", 3, 10, 0, 7), x("kernel", "lost", 4, 11, 0, 7),
              x("cuda_runtime", "cudaLaunchKernel", 5, 12), x("kernel", "b", 6, 12, 0, 7)]
    model = load_trace(write(tmp_path / "t.json", events))
    assert model.notes == {BEFORE_WINDOW: 1}
    assert model.warnings == {"gpu: rows launched inside the profiling window with no runtime call of their "
                              "correlation id in the trace": 1}
    # GPU work of a device type the model does not read the runtime calls of: a note too
    xpu = [x("kernel", "k", 3, 10, 0, 7), x("xpu_runtime", "urEnqueueKernelLaunch", 2, 10)]
    model = load_trace(write(tmp_path / "xpu.json", xpu))
    assert model.warnings == {}
    assert model.notes == {"gpu: rows launched by calls the model does not read (xpu_runtime)": 1}
