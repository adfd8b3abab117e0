"""Property-based fuzzing of the analyzer with mutated real traces: whatever hypothesis does to a trace (drop,
duplicate or shuffle events, retype or delete fields, add junk keys and categories, truncate or corrupt the bytes),
loading, analyzing and rendering it either succeeds or raises one of the documented errors (TraceError /
UsageError). Anything else is a bug in the analyzer.

CI runs a fixed, derandomized profile. For a long local hunt:
    FUZZ_EXAMPLES=3000 FUZZ_RANDOM=1 python -m pytest -q tests/trace/test_fuzz_traces.py
"""
from __future__ import annotations

import copy
import functools
import gzip
import json
import os
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.api import render
from analyzer.cli import warning_line
from analyzer.errors import UsageError
from analyzer.trace import TraceError, load_trace
from make_corpus import cut_trace, load_fixture
from conftest import analyze_loaded

EXTERNAL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "external"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))  # per test: 300 in all
DERANDOMIZE = not os.environ.get("FUZZ_RANDOM")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
                suppress_health_check=list(HealthCheck))

FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s", "bp")
ARG_KEYS = ("External id", "correlation", "Python id", "Python parent id", "Bytes", "Total Allocated",
            "Total Reserved", "Device Type", "Device Id", "Addr", "bytes", "stream", "cbid", "device", "Ev Idx")
CATEGORIES = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy",
              "gpu_memset", "cuda_sync", "gpu_user_annotation", "overhead", "cpu_instant_event", "ac2g", "Trace",
              "fwdbwd", "brand_new_category", "")
PHASES = ("X", "i", "I", "s", "f", "M", "B", "E", "C", "Z", "", "x")
NAMES = ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaMalloc", "cudaFree", "cudaGraphLaunch", "cudaMemcpyAsync",
         "hipLaunchKernel", "Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pageable -> Device)", "[memory]",
         "[OutOfMemory]", "ProfilerStep#1", "decode_step#0", "prefill", "aten::item", "aten::nonzero",
         "aten::_local_scalar_dense", "x.py(3): f", "nn.Module: M_0", "torch/_tensor.py(1): __repr__", "")

ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 1, 7, 2**31, 2**53 + 1, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e300, -1e300, 5e-324, -0.0, 9.2e15]),
    st.text(max_size=6), st.sampled_from(["inf", "-inf", "N/A", "nan", "NaN", "0x7", "-1", "1.5", "Spans", ""]),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.sampled_from(ARG_KEYS), st.integers(-3, 3),
                                                             max_size=2),
)


@functools.lru_cache(maxsize=None)
def bases() -> tuple[tuple[str, dict], ...]:
    """Real traces, parsed once and cut to part of a decode step (a few hundred to ~1000 events) for speed."""
    out = [("item_sync", cut_trace(load_fixture("item_sync"), "decode_step#1", last=0.5)),
           ("alloc_churn", cut_trace(load_fixture("alloc_churn"), "ProfilerStep#3", last=0.3)),
           ("graph_decode", cut_trace(load_fixture("graph_decode"), "ProfilerStep#4"))]
    for name in ("mi250-toy-training-rocm", "cpu-only", "triton-cuLaunchKernel", "a100-simple-add-cuda-sync-events",
                 "v100-resnet-ddp-ns-resolution"):  # the last: epoch µs with ns digits (the exact-ts path)
        path = EXTERNAL / f"{name}.json.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                top = json.load(f)
            events = top["traceEvents"]
            if len(events) > 1500:  # the events of one stretch of time in the middle
                ts = sorted(e["ts"] for e in events if type(e.get("ts")) in (int, float))
                lo, hi = ts[len(ts) // 2], ts[min(len(ts) // 2 + 1200, len(ts) - 1)]
                top = dict(top, traceEvents=[e for e in events if e.get("ph") == "M" or (
                    type(e.get("ts")) in (int, float) and lo <= e["ts"] <= hi)])
            out.append((name, top))
    return tuple(out)


def _rows(rng: random.Random, events: list, share: float) -> list[int]:
    return [i for i in range(len(events)) if rng.random() < share]


def _retyped(value, mode: str, odd):
    if mode == "str":
        return str(value)
    if mode == "list":
        return [value]
    if mode == "null":
        return None
    if mode == "negate" and type(value) in (int, float):
        return -value
    if mode == "scale" and type(value) in (int, float):
        return value * 1e9
    if mode == "number" and isinstance(value, str):
        return len(value)
    return odd


def mutate(events: list, op: str, rng: random.Random, share: float, key: str, arg_key: str, odd, cat: str,
           phase: str, name: str, mode: str) -> list:
    """One mutation of the event list (a mutated copy; the base stays untouched)."""
    if op == "drop":
        gone = set(_rows(rng, events, share))
        return [e for i, e in enumerate(events) if i not in gone]
    if op == "duplicate":
        out = []
        for e in events:
            out.append(e)
            if rng.random() < share:
                out.append(copy.deepcopy(e))
        return out
    if op == "keep_only":  # one or two kinds of event alone: kernels without launches, ops without frames...
        kinds = {cat} if share >= 0.5 else {cat, CATEGORIES[rng.randrange(len(CATEGORIES))]}
        return [e for e in events if isinstance(e, dict) and e.get("cat", "") in kinds]
    if op == "shuffle":
        out = list(events)
        rng.shuffle(out)
        return out
    if op == "junk_events":
        out = list(events)
        for _ in range(1 + int(share * 10)):
            out.insert(rng.randrange(len(out) + 1), odd if rng.random() < 0.5 else {key: odd})
        return out
    out = list(events)
    for i in _rows(rng, events, share):
        e = out[i]
        if not isinstance(e, dict):
            continue
        e = out[i] = dict(e)
        args = e["args"] = dict(e["args"]) if isinstance(e.get("args"), dict) else e.get("args", {})
        if op == "retype" and key in e:
            e[key] = _retyped(e[key], mode, odd)
        elif op == "retype_arg" and isinstance(args, dict):
            args[arg_key] = _retyped(args.get(arg_key, 0), mode, odd)
        elif op == "delete":
            e.pop(key, None)
        elif op == "delete_arg" and isinstance(args, dict):
            args.pop(arg_key, None)
        elif op == "junk_key":
            e[f"junk_{key}"] = odd
            if isinstance(args, dict):
                args[f"junk {arg_key}"] = odd
        elif op == "category":
            e["cat"] = cat
        elif op == "phase":
            e["ph"] = phase
        elif op == "rename":
            e["name"] = name
        elif op == "rebase" and type(e.get("ts")) in (int, float):  # epoch-based µs with ns digits
            e["ts"] = round(e["ts"] + 1.7e15 + rng.randrange(1000) / 1000, 3)
        elif op == "shift":  # move it in time: ties, overlaps, events before everything else
            if type(e.get("ts")) in (int, float):
                e["ts"] = e["ts"] + rng.choice([-1e6, -1, -0.001, 0.001, 1, 1e3, 1e6])
            if type(e.get("dur")) in (int, float):
                e["dur"] = rng.choice([0, 0.001, e["dur"] * 10, 1e9])
    return out


MUTATION = st.tuples(
    st.sampled_from(["drop", "keep_only", "duplicate", "shuffle", "retype", "retype_arg", "delete", "delete_arg", "junk_key",
                     "category", "phase", "rename", "shift", "rebase", "junk_events"]),
    st.integers(0, 2**32 - 1), st.sampled_from([0.01, 0.1, 0.3, 0.7, 1.0]), st.sampled_from(FIELDS),
    st.sampled_from(ARG_KEYS), ODD_VALUES, st.sampled_from(CATEGORIES), st.sampled_from(PHASES),
    st.sampled_from(NAMES), st.sampled_from(["str", "list", "null", "negate", "scale", "number", "odd"]),
)
TOP_LEVEL = st.sampled_from(["object", "bare_array", "odd_metadata", "no_metadata"])
BYTES = st.tuples(
    st.booleans(),  # gzip
    st.booleans(),  # pretty-printed (one event per line, as kineto) or compact
    st.one_of(st.none(), st.floats(0, 1)),  # truncate at this share of the bytes
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),  # put a bare double quote into a name (pytorch#146900)
    st.booleans(),  # truncate the gzip stream rather than the JSON in it
)


def serialize(top: dict, events: list, shape: str, odd, layout: tuple) -> bytes:
    gz, pretty, cut, quote_seed, cut_compressed = (*layout, False)[:5]
    if shape == "bare_array":
        doc = events
    elif shape == "odd_metadata":
        doc = dict(top, traceEvents=events, deviceProperties=odd, distributedInfo=odd, baseTimeNanoseconds=odd)
    elif shape == "no_metadata":
        doc = {"traceEvents": events}
    else:
        doc = dict(top, traceEvents=events)
    if pretty and isinstance(doc, dict):
        head = json.dumps({k: v for k, v in doc.items() if k != "traceEvents"})[:-1]
        text = head + (", " if len(doc) > 1 else "") + '"traceEvents": [\n' + ",\n".join(
            json.dumps(e) for e in events) + "\n]}"
    else:
        text = json.dumps(doc)
    data = text.encode()
    if quote_seed is not None:
        starts = [i for i in range(len(data)) if data.startswith(b'"name": "', i)][:200]
        if starts:
            at = random.Random(quote_seed).choice(starts) + len(b'"name": "')
            data = data[:at] + b'x"y" ' + data[at:]
    if cut is not None and not (gz and cut_compressed):
        data = data[: int(len(data) * cut)]
    if gz:
        data = gzip.compress(data, 1, mtime=0)
    if cut is not None and gz and cut_compressed:
        data = data[: int(len(data) * cut)]
    return data


def analyze_bytes(data: bytes, suffix: str) -> None:
    """load_trace + analyze + every renderer, as `analyze` runs them; documented errors are fine."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"fuzz{suffix}"
        path.write_bytes(data)
        try:
            model = load_trace(path)
            report = analyze_loaded(model, path)
            pages = render(report)
            warning_line(report)
        except (TraceError, UsageError) as error:
            message = str(error)
            assert "\n" not in message and str(path) in message, message
            return
        assert set(pages) == {"report.json", "report.md", "report.html"}
        json.loads(pages["report.json"])


@FUZZ
@given(base=st.integers(0, 100), mutations=st.lists(MUTATION, min_size=1, max_size=4), shape=TOP_LEVEL,
       odd=ODD_VALUES, layout=st.tuples(st.booleans(), st.booleans(), st.none(), st.none()))
def test_mutated_traces_analyze_or_fail_cleanly(base, mutations, shape, odd, layout):
    _, top = bases()[base % len(bases())]
    events = top["traceEvents"]
    for op, seed, share, key, arg_key, value, cat, phase, new_name, mode in mutations:
        events = mutate(events, op, random.Random(seed), share, key, arg_key, value, cat, phase, new_name, mode)
    analyze_bytes(serialize(top, events, shape, odd, layout), ".json.gz" if layout[0] else ".json")


@FUZZ
@given(base=st.integers(0, 100), shape=TOP_LEVEL, odd=ODD_VALUES, layout=BYTES,
       mutation=st.one_of(st.none(), MUTATION))
def test_corrupted_bytes_analyze_or_fail_cleanly(base, shape, odd, layout, mutation):
    _, top = bases()[base % len(bases())]
    events = top["traceEvents"]
    if mutation:
        events = mutate(events, mutation[0], random.Random(mutation[1]), *mutation[2:])
    analyze_bytes(serialize(top, events, shape, odd, layout), ".json.gz" if layout[0] else ".json")


@pytest.mark.parametrize("index", range(3))
def test_unmutated_bases_give_reports(index):
    """The fuzz inputs start from traces that analyze cleanly."""
    name, top = bases()[index]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.json"
        path.write_text(json.dumps(top))
        report = analyze_loaded(load_trace(path), path)
        assert report["trace"]["events"]["kernels"] > 0


def _kernel(ts, corr=1, **extra):
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts, "dur": 1.5,
            "args": {"correlation": corr}, **extra}


def _launch(ts, corr=1, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def _frame(ts, dur, pid=1):
    return {"ph": "X", "cat": "python_function", "name": "x.py(1): f", "pid": pid, "tid": 1, "ts": ts, "dur": dur,
            "args": {"Python id": 1, "Python parent id": None}}


# Inputs that broke the analyzer (found by the fuzzing above or by hand), each a minimal trace: they must analyze
# (or fail with a documented error) from now on.
REGRESSIONS = {
    "kernels_without_any_runtime_call": {"traceEvents": [_kernel(10), _kernel(20, 2), _kernel(3000, 3)]},
    "long_gap_with_frames_but_no_runtime_call": {
        "traceEvents": [_kernel(10), _kernel(5000, 2), _frame(0, 6000, pid=0)]},
    "device_properties_not_a_list": {"deviceProperties": True, "traceEvents": [_kernel(10), _launch(5)]},
    "junk_items_in_an_epoch_ns_trace": {"traceEvents": [
        _kernel(1700000000000000.123), 5, "x", _launch(1699999999999990.456)]},
    "end_beyond_int64_ns": {"traceEvents": [
        dict(_kernel(9.1e15), dur=9.1e15), _kernel(-9.1e15, 2), _launch(0), _launch(-9.1e15, 2)]},
    "args_and_name_of_odd_types": {"traceEvents": [
        dict(_kernel(10), args=[1, 2]), dict(_launch(5), name=7), dict(_kernel(20, 2), cat=["kernel"], ph=None)]},
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regressions(name):
    analyze_bytes(json.dumps(REGRESSIONS[name]).encode(), ".json")


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"traceEvents": [{"ph": "X", "args": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}]}", "nested too deeply"),
    ('{"traceEvents": [{"ph": "X", "ts": NaN}]}', r"invalid JSON at line 1, column 36 \(byte 35\): invalid character"),
])
def test_unreadable_json_is_a_trace_error(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        load_trace(path)
