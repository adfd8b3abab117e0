"""The trace model against real Kineto traces, checked with counts computed independently (stdlib json)."""

import gzip
import json
import re
from collections import Counter, defaultdict
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from analyzer.trace import GpuKind, TraceError, TraceModel, load_trace

EXTERNAL = Path(__file__).resolve().parents[3] / "shared/traces/external"
EXTERNAL_TRACES = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
# ProfilerStep#N, the capture's own steps, and serving engines' step annotations: vLLM's
# execute_[<tokens>_]context_<n>(...)_generation_<n>(...), SGLang's step[<MODE> ...]
STEP = re.compile(r"^(\w+)#(\d+)$|^prefill$|^execute_(\d+_)?context_\d+\(.+\)_generation_\d+\(.+\)$"
                  r"|^step\[[A-Z]+[^\]]*\]$")
TABLES = ("ops", "frames", "runtime", "gpu", "gpu_annotations", "memory", "overhead", "steps")


def external(name: str) -> Path:
    path = EXTERNAL / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@lru_cache(maxsize=None)
def model_of(path: Path) -> TraceModel:
    return load_trace(path)


# torch 1.8/1.9 category names (lower-cased) -> today's; "Operator" ranges named like steps are annotations
OLD_CATEGORIES = {"operator": "cpu_op", "runtime": "cuda_runtime", "driver": "cuda_driver", "memcpy": "gpu_memcpy",
                  "memset": "gpu_memset", "python": "python_function", "user annotation": "user_annotation"}


def today(event: dict) -> dict:
    """The event with today's category name and integer CPU tids (torch 1.8 wrote "Operator", tid "3004819264")."""
    cat = event.get("cat")
    if isinstance(cat, str):
        lower = cat.lower()
        step = lower == "operator" and STEP.match(event.get("name", ""))
        name = "user_annotation" if step else OLD_CATEGORIES.get(lower, lower)
        if name != cat:
            event = dict(event, cat=name)
    if isinstance(event.get("tid"), str) and event["tid"].isdigit():
        event = dict(event, tid=int(event["tid"]))
    return event


@lru_cache(maxsize=None)
def raw_events(path: Path) -> tuple:
    """The trace's events by stdlib json, floats as exact Decimals, categories by today's names."""
    document = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    return tuple(today(e) for e in (document["traceEvents"] if isinstance(document, dict) else document))


def ns(value) -> int:
    return int(Decimal(value) * 1000)


def expected_rows(events) -> dict[str, int]:
    cats = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    return {
        "ops": cats["cpu_op"] + cats["user_annotation"],
        "frames": cats["python_function"],
        "runtime": cats["cuda_runtime"] + cats["cuda_driver"],
        "gpu": cats["kernel"] + cats["gpu_memcpy"] + cats["gpu_memset"] + cats["cuda_sync"],
        "gpu_annotations": cats["gpu_user_annotation"],
        "memory": sum(e.get("name") in ("[memory]", "[OutOfMemory]") for e in events if e.get("ph") == "i"),
        "overhead": cats["overhead"],
        "steps": sum(bool(STEP.match(e["name"])) for e in events if e.get("cat") == "user_annotation"),
    }


by_trace = pytest.mark.parametrize("path", EXTERNAL_TRACES, ids=lambda p: p.name.split(".")[0])


@by_trace
def test_row_counts_match_stdlib_counts(path):
    model = model_of(path)
    assert {table: len(getattr(model, table)) for table in TABLES} == expected_rows(raw_events(path))
    assert model.warnings == {}


@by_trace
def test_gpu_kinds_and_annotation_flags_match_categories(path):
    model, events = model_of(path), raw_events(path)
    cats = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    kinds = Counter(model.gpu.kind.tolist())
    assert [kinds[k] for k in GpuKind] == [cats["kernel"], cats["gpu_memcpy"], cats["gpu_memset"], cats["cuda_sync"]]
    assert int(model.ops.is_annotation.sum()) == cats["user_annotation"]
    assert int(model.runtime.is_driver.sum()) == cats["cuda_driver"]


@by_trace
def test_times_are_exact_nanoseconds(path):
    model, events = model_of(path), raw_events(path)
    kernels = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in events if e.get("cat") == "kernel")
    rows = model.gpu.kind == GpuKind.KERNEL
    assert sorted(zip(model.gpu.start_ns[rows].tolist(), model.gpu.end_ns[rows].tolist())) == kernels
    ops = sorted(ns(e["ts"]) for e in events if e.get("cat") in ("cpu_op", "user_annotation"))
    assert model.ops.start_ns.tolist() == ops


@by_trace
def test_tables_are_sorted_by_start_and_read_only(path):
    model = model_of(path)
    for table in ("ops", "frames", "runtime", "gpu", "gpu_annotations", "overhead", "steps"):
        start = getattr(model, table).start_ns
        assert (np.diff(start) >= 0).all(), table
    assert (np.diff(model.memory.ts_ns) >= 0).all()
    with pytest.raises(ValueError):
        model.ops.start_ns[:1] = 0


@by_trace
def test_start_order_and_distinct_agree_with_numpy(path):
    """The loader's fast sort by (start, longest first) and its distinct values (analyzer.arrays) give what np.lexsort
    and np.unique give: on the trace's ops in a shuffled order, with starts cut to whole µs so that many tie."""
    from analyzer.arrays import distinct
    from analyzer.trace.joins import start_order
    model = model_of(path)
    shuffled = np.random.default_rng(0).permutation(len(model.ops))
    start, end = model.ops.start_ns[shuffled] // 1000, model.ops.end_ns[shuffled] // 1000
    assert np.array_equal(start_order(start, end), np.lexsort((-end, start)))
    assert np.array_equal(start_order(np.sort(start), end), np.lexsort((-end, np.sort(start))))
    for values in (start, model.ops.name, model.gpu.stream, model.frames.name):
        assert np.array_equal(distinct(values), np.unique(values))


@by_trace
def test_instants_are_enclosed_by_the_same_frame_when_only_rows_holding_them_are_searched(path):
    """joins.holding_any keeps every interval that can enclose an instant: the innermost frame (and op) at the
    middle of every launch call's gap to the next call is the same as over the whole table."""
    from analyzer.trace.joins import Intervals, holding_any, thread_keys
    model = model_of(path)
    rt = model.runtime
    if len(rt) < 2:
        return
    t = rt.end_ns[:-1] + (rt.start_ns[1:] - rt.end_ns[:-1]) // 2
    for table in (model.frames, model.ops):
        keys, query = thread_keys([table.pid, rt.pid[:-1]], [table.tid, rt.tid[:-1]])
        whole = Intervals(keys, table.start_ns, table.end_ns, sorted_by_start=True).innermost_enclosing(query, t, t + 1)
        near = np.flatnonzero(holding_any(table.start_ns, table.end_ns, t))
        found = Intervals(keys[near], table.start_ns[near], table.end_ns[near], sorted_by_start=True
                          ).innermost_enclosing(query, t, t + 1)
        assert np.array_equal(whole, np.where(found >= 0, near[np.maximum(found, 0)] if len(near) else -1, -1))


@by_trace
def test_correlation_joins_pair_equal_ids(path):
    model, events = model_of(path), raw_events(path)
    gpu, runtime = model.gpu, model.runtime
    launched = gpu.launch >= 0
    assert (runtime.correlation[gpu.launch[launched]] == gpu.correlation[launched]).all()
    called = runtime.gpu >= 0
    assert (gpu.correlation[runtime.gpu[called]] == runtime.correlation[called]).all()
    runtime_ids = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    gpu_ids = [e["args"]["correlation"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")]
    assert int(launched.sum()) == sum(c in runtime_ids for c in gpu_ids)


@by_trace
def test_parents_and_enclosing_ops_match_a_stack_sweep(path):
    """Reference: the classic per-thread stack sweep over the raw events."""
    model, events = model_of(path), raw_events(path)

    def sweep(intervals, queries):
        by_thread = defaultdict(list)
        for kind, items in ((0, intervals), (1, queries)):
            for item in items:
                by_thread[item[:2]].append((item[2], 0 if kind == 0 else 1, -item[3], kind, item))
        found = {}
        for rows in by_thread.values():
            stack = []
            for start, _, neg_end, kind, item in sorted(rows):
                threshold = start if -neg_end > start else start - 1
                while stack and stack[-1][3] <= threshold:
                    stack.pop()
                found[item] = stack[-1] if stack else None
                if kind == 0:
                    stack.append(item)
        return found

    def span(e):
        return (e["pid"], e["tid"], ns(e["ts"]), ns(e["ts"]) + ns(e.get("dur", 0)), e["name"])

    ops = [span(e) for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    cpu_ops = [span(e) for e in events if e.get("cat") == "cpu_op"]
    calls = [span(e) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    parents, op_of_call = sweep(ops, []), sweep(cpu_ops, calls)

    def key(table, row):
        return (int(table.pid[row]), int(table.tid[row]), int(table.start_ns[row]), int(table.end_ns[row]),
                model.names[table.name[row]])

    def row_key(table, row):
        return None if row < 0 else key(table, row)

    assert [row_key(model.ops, p) for p in model.ops.parent] == [parents[key(model.ops, i)] for i in range(len(model.ops))]
    assert [row_key(model.ops, o) for o in model.runtime.op] == [
        op_of_call[key(model.runtime, i)] for i in range(len(model.runtime))
    ]
    depth = model.ops.depth
    assert (depth[model.ops.parent < 0] == 0).all()
    assert (depth[model.ops.parent >= 0] == depth[model.ops.parent[model.ops.parent >= 0]] + 1).all()


def test_memory_events_keep_their_values_and_enclosing_op():
    path = external("v100-ddp-training-with-memory.json.gz")
    model, events = model_of(path), raw_events(path)
    raw = [e for e in events if e.get("name") == "[memory]"]
    memory = model.memory
    assert sorted(memory.bytes.tolist()) == sorted(e["args"]["Bytes"] for e in raw)
    assert sorted(memory.addr.tolist()) == sorted(e["args"]["Addr"] for e in raw)
    assert Counter(memory.device_type.tolist()) == Counter(e["args"]["Device Type"] for e in raw)
    assert not memory.is_oom.any()
    placed = memory.op >= 0
    assert placed.mean() > 0.9
    ops = model.ops
    op = memory.op[placed]
    assert ((ops.start_ns[op] <= memory.ts_ns[placed]) & (memory.ts_ns[placed] <= ops.end_ns[op])).all()
    assert not ops.is_annotation[op].any()
    assert (ops.tid[op] == memory.tid[placed]).all()


def test_cpu_only_trace_has_no_gpu_activity():
    model = model_of(external("cpu-only.json.gz"))
    assert len(model.gpu) == len(model.runtime) == 0
    assert model.gpu_window() is None
    assert [model.names[c] for c in model.steps.name] == ["ProfilerStep#551"]


def test_gpu_window_spans_all_gpu_activity():
    path = external("a100-simple-add-cuda-sync-events.json.gz")
    events = [e for e in raw_events(path) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")]
    first, last = model_of(path).gpu_window()
    assert first == min(ns(e["ts"]) for e in events)
    assert last == max(ns(e["ts"]) + ns(e["dur"]) for e in events)


def test_mi250_hip_launches_are_joined_to_their_kernels():
    model = model_of(external("mi250-toy-training-rocm.json.gz"))
    gpu, runtime = model.gpu, model.runtime
    kernels = gpu.kind == GpuKind.KERNEL
    assert kernels.sum() == 14 and (gpu.launch[kernels] >= 0).all()
    launchers = {model.names[runtime.name[r]] for r in gpu.launch[kernels]}
    assert launchers == {"hipLaunchKernel", "hipExtModuleLaunchKernel"}
    copies = gpu.kind == GpuKind.MEMCPY
    assert {model.names[runtime.name[r]] for r in gpu.launch[copies]} == {"hipMemcpyWithStream"}
    assert [model.names[c] for c in model.gpu_annotations.name] == ["ProfilerStep#1", "Optimizer.step#SGD.step"]


def test_cuda_sync_events_are_gpu_rows_of_kind_sync():
    path = external("a100-simple-add-cuda-sync-events.json.gz")
    model, events = model_of(path), raw_events(path)
    raw = [e for e in events if e.get("cat") == "cuda_sync"]
    syncs = model.gpu.kind == GpuKind.SYNC
    assert syncs.sum() == len(raw) == 41
    assert Counter(model.names[c] for c in model.gpu.name[syncs]) == Counter(e["name"] for e in raw)
    # the Context Syncs say stream 4294967295 (uint32 -1) and are drawn at tid -1
    assert Counter(model.gpu.stream[syncs].tolist()) == Counter({7: 32, 20: 4, -1: 5})
    assert Counter(e["args"]["stream"] for e in raw) == Counter({7: 32, 20: 4, 2**32 - 1: 5})
    launchers = {model.names[model.runtime.name[r]] for r in model.gpu.launch[syncs]}
    assert launchers <= {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent"}


def test_triton_kernel_is_joined_to_its_driver_launch():
    model = model_of(external("triton-cuLaunchKernel.json.gz"))
    (launch,) = model.gpu.launch
    assert model.runtime.is_driver[launch] and model.names[model.runtime.name[launch]] == "cuLaunchKernel"
    assert model.runtime.gpu[launch] == 0


def test_ns_resolution_trace_keeps_sub_microsecond_digits():
    path = external("v100-resnet-ddp-ns-resolution.json.gz")
    model, events = model_of(path), raw_events(path)
    assert (model.ops.start_ns % 1000 != 0).mean() > 0.9
    first = min((e for e in events if e.get("cat") == "kernel"), key=lambda e: Decimal(e["ts"]))
    assert int(model.gpu.start_ns[model.gpu.kind == GpuKind.KERNEL][0]) == ns(first["ts"])
    assert str(first["ts"]).split(".")[1] != "000"


def test_bare_array_trace_loads_like_the_object_form(tmp_path):
    source = external("v100-resnet-ddp-ns-resolution.json.gz")
    document = json.loads(gzip.decompress(source.read_bytes()))
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps(document["traceEvents"]))
    model, reference = load_trace(legacy), model_of(source)
    assert {t: len(getattr(model, t)) for t in TABLES} == {t: len(getattr(reference, t)) for t in TABLES}
    assert model.metadata == {}
    assert model.metadata is not reference.metadata and "distributedInfo" in reference.metadata


def test_metadata_keeps_the_top_level_keys():
    metadata = model_of(external("triton-cuLaunchKernel.json.gz")).metadata
    assert metadata["cuda_runtime_version"] == 12000 and metadata["cupti_version"] == 18
    assert metadata["baseTimeNanoseconds"] == 1727743122000000000


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_python_frames_link_to_parents_ops_and_calls(tmp_path):
    """A small with_stack-style trace: frames nest by Python parent id, ops sit inside the innermost frame."""
    def event(cat, name, ts, dur, tid=2, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        event("python_function", "p.py(6): st", 0, 100, **{"Python id": 1, "Python parent id": None}),
        event("python_function", "nn.Module: Linear_0", 10, 50, **{"Python id": 2, "Python parent id": 1}),
        event("python_function", "<built-in function linear>", 20, 30, **{"Python id": 3, "Python parent id": 2}),
        event("cpu_op", "aten::linear", 21, 28, **{"External id": 5}),
        event("cpu_op", "aten::mm", 22, 20, **{"External id": 6}),
        event("cuda_runtime", "cudaLaunchKernel", 25, 5, **{"External id": 6, "correlation": 9}),
        event("kernel", "gemm", 40, 10, tid=7, **{"External id": 6, "correlation": 9, "stream": 7}),
        event("cpu_op", "aten::item", 70, 5, **{"External id": 7}),
        event("python_function", "other thread", 0, 100, tid=3, **{"Python id": 4, "Python parent id": None}),
    ]
    model = load_trace(write(tmp_path / "stack.json", json.dumps({"traceEvents": events})))
    frame_names = [model.names[c] for c in model.frames.name]
    assert frame_names == ["p.py(6): st", "other thread", "nn.Module: Linear_0", "<built-in function linear>"]
    assert model.frames.parent.tolist() == [-1, -1, 0, 2]
    assert model.frame_chain(model.ops.frame[1]) == ["<built-in function linear>", "nn.Module: Linear_0", "p.py(6): st"]
    assert [frame_names[f] for f in model.ops.frame] == ["<built-in function linear>"] * 2 + ["p.py(6): st"]
    assert model.ops.parent.tolist() == [-1, 0, -1] and model.ops.depth.tolist() == [0, 1, 0]
    assert model.runtime.frame.tolist() == [3] and model.runtime.op.tolist() == [1]
    assert model.gpu.launch.tolist() == [0] and model.runtime.gpu.tolist() == [0]
    assert model.frame_chain(-1) == []


def test_odd_values_are_skipped_and_counted(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "no dur", "pid": 1, "tid": 1, "ts": 2},
        {"ph": "X", "cat": "cpu_op", "name": "inf dur", "pid": 1, "tid": 1, "ts": 2, "dur": "inf"},
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1, "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 3, "dur": 1,
         "args": {"correlation": "N/A", "blocks per SM": "inf"}},
        {"ph": "X", "cat": "brand_new_category", "name": "x", "pid": "Spans", "tid": "", "ts": 1, "dur": 1},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2.25,
         "args": {"Bytes": -512, "Total Allocated": 0, "Device Type": 1, "Device Id": 0}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2.5, "args": {}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 2},
    ]
    model = load_trace(write(tmp_path / "odd.json", json.dumps({"traceEvents": events})))
    assert [model.names[c] for c in model.ops.name] == ["ok"]
    assert model.ops.start_ns.tolist() == [1500] and model.ops.end_ns.tolist() == [3500]
    assert model.warnings == {  # what is wrong, each said: the unknown category is not
        "kernel: args.correlation not an integer, read as missing": 1,
        "ops: missing or invalid dur": 2, "ops: missing or invalid ts": 1, "memory: missing or invalid Bytes": 1,
    }
    assert model.notes == {"events decoded with lenient types (the slower path for odd values)": 1}
    assert model.gpu.correlation.tolist() == [-1] and model.gpu.launch.tolist() == [-1]
    assert model.synthetic_ids[int(model.gpu.stream[0])] == "stream 7"
    assert model.memory.bytes.tolist() == [-512] and model.memory.op.tolist() == [0]


def test_repeated_correlation_ids_join_the_earliest_and_are_counted(tmp_path):
    def call(ts):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                "dur": 1, "args": {"correlation": 4}}

    kernels = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 10 + i, "dur": 1,
                "args": {"correlation": 4}} for i in range(3)]
    model = load_trace(write(tmp_path / "dup.json", json.dumps({"traceEvents": [call(5), call(1), *kernels]})))
    assert model.runtime.start_ns.tolist() == [1000, 5000]
    assert model.gpu.launch.tolist() == [0, 0, 0] and model.runtime.gpu.tolist() == [0, 0]
    assert model.warnings == {
        "runtime: repeated correlation id (joins use the earliest)": 1,
        "gpu: rows sharing a correlation id (one launch, several GPU rows)": 2,
    }


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("empty.json", b"", "empty file"),
        ("blank.json", b"  \n", "empty file"),
        ("truncated.json", b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "na', "invalid JSON"),
        ("odd_then_truncated.json", b'{"traceEvents": [{"ph": "X", "ts": "inf"}, {"ph": "X", "cat": "cp', "invalid JSON"),
        ("no_events.json", b'{"schemaVersion": 1, "deviceProperties": []}', "not a Kineto trace"),
        ("number.json", b"42", "not a Kineto trace"),
        ("empty_events.json", b'{"traceEvents": []}', "trace has no events"),
    ],
)
def test_bad_inputs_raise_one_line_trace_errors(tmp_path, name, content, reason):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError) as raised:
        load_trace(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and reason in message and "\n" not in message


def test_truncated_gzip_raises_a_trace_error(tmp_path):
    whole = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a" * 5000}]}).encode())
    path = tmp_path / "truncated.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceError, match=r"truncated\.json\.gz: corrupt or truncated gzip"):
        load_trace(path)


def test_missing_file_raises_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="nope.json: cannot read file"):
        load_trace(tmp_path / "nope.json")


def test_gzip_is_detected_by_magic_bytes_not_by_name(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, '
                                   b'"tid": 1, "ts": 1, "dur": 1}]}'))
    assert len(load_trace(path).ops) == 1
