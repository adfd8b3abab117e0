"""Reading a trace a chunk at a time (and a large one's second part in a helper process) gives exactly the model
that decoding the whole file at once gives."""
import dataclasses
import gzip
import json
import mmap

import numpy as np
import pytest

import analyzer.trace.build as build
import analyzer.trace.parse as parse
from analyzer.trace import load_trace
from analyzer.trace.cache import TABLES
from conftest import REPO

FIX = REPO / "tests" / "fixtures" / "h200"
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
TRACES = sorted(FIX.glob("*/rank0.trace.json.gz")) + sorted(EXTERNAL.glob("*.json.gz"))


def same_model(a, b):
    assert (a.names, a.metadata, a.warnings, a.synthetic_ids, a.notes, a.foreign_activity) == (
        b.names, b.metadata, b.warnings, b.synthetic_ids, b.notes, b.foreign_activity)
    for table in TABLES:
        ta, tb = getattr(a, table), getattr(b, table)
        for f in dataclasses.fields(ta):
            assert np.array_equal(getattr(ta, f.name), getattr(tb, f.name)), (table, f.name)


def whole_file_model(path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(build, "find_event_array", lambda text: None)
        return load_trace(path)


@pytest.fixture
def chunk_reads(monkeypatch):
    """Small chunks, and a count of the chunks read."""
    monkeypatch.setattr(parse, "CHUNK_BYTES", 4 << 10)
    reads = []
    read_events = build.read_events
    monkeypatch.setattr(build, "read_events", lambda *a, **k: reads.append(read_events(*a, **k)) or reads[-1])
    return reads


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.parent.name if p.parent.parent == FIX else p.name)
def test_chunked_read_matches_whole_file_read(trace, chunk_reads, monkeypatch):
    model = load_trace(trace)
    assert chunk_reads and len(chunk_reads[0][0]) > 1  # several chunks, no fall-back to the whole file
    same_model(model, whole_file_model(trace, monkeypatch))


@pytest.mark.parametrize("fork", [True, False], ids=["forked helper", "fresh interpreter"])
def test_helper_process_reads_the_second_part(tmp_path, chunk_reads, monkeypatch, fork):
    trace = tmp_path / "rank0.trace.json"
    trace.write_bytes(gzip.decompress((FIX / "item_sync" / "rank0.trace.json.gz").read_bytes()))
    monkeypatch.setattr(build, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(build, "HELPER_HEAD_START_BYTES", 0)
    monkeypatch.setattr(build, "can_fork", lambda: fork)
    joined, helpers = [], []
    join_into = build.Helper.join_into
    monkeypatch.setattr(build.Helper, "join_into", lambda self, columns: helpers.append(self) or joined.append(
        join_into(self, columns)) or joined[-1])
    progress = []
    model = load_trace(trace, progress=lambda done, total: progress.append((done, total)))
    assert joined and joined[0] is not None  # the helper's columns were used
    assert (helpers[0].process is None) == fork  # a fork has no Popen
    same_model(model, whole_file_model(trace, monkeypatch))
    assert progress[-1] == (trace.stat().st_size, trace.stat().st_size)


def _write_trace(path, events, **top):
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, **top}, indent=1))
    return path


def _events():
    top = json.loads(gzip.decompress((FIX / "graph_decode" / "rank0.trace.json.gz").read_bytes()))
    return top["traceEvents"]


def test_split_point_inside_a_string_moves_to_the_next_gap(tmp_path, chunk_reads, monkeypatch):
    events = _events()
    for event in events:
        event["name"] = event.get("name", "") + ' }, {"ph": "X"} '  # a false split point in every event
    trace = _write_trace(tmp_path / "t.json", events)
    model = load_trace(trace)
    assert chunk_reads and len(chunk_reads[0][0]) > 1
    same_model(model, whole_file_model(trace, monkeypatch))


def test_keys_and_brackets_after_the_event_array(tmp_path, chunk_reads, monkeypatch):
    info = ["INFO:2024 CuptiActivityProfiler.cpp:914] [Profiler = X] done", "]", "}]"]
    trace = _write_trace(tmp_path / "t.json", _events(), INFO=info, traceName="/tmp/a]b.json",
                         deviceProperties=[{"id": 0}])
    model = load_trace(trace)
    assert chunk_reads
    assert model.metadata["traceName"] == "/tmp/a]b.json" and model.metadata["deviceProperties"] == [{"id": 0}]
    same_model(model, whole_file_model(trace, monkeypatch))


TABLE_OF = {"cpu_op": "ops", "user_annotation": "ops", "python_function": "frames", "cuda_runtime": "runtime",
            "cuda_driver": "runtime", "kernel": "gpu", "gpu_memcpy": "gpu", "gpu_memset": "gpu",
            "gpu_user_annotation": "gpu_annotations"}


def test_odd_values_fall_back_to_the_lenient_whole_file_read(tmp_path, chunk_reads, monkeypatch):
    events = _events()
    [*_, last_slice] = (e for e in events if e.get("ph") == "X" and e.get("cat") in TABLE_OF)
    last_slice["ts"] = "N/A"
    model = load_trace(_write_trace(tmp_path / "t.json", events))
    assert not chunk_reads  # the chunked read gave up
    assert model.warnings == {f"{TABLE_OF[last_slice['cat']]}: missing or invalid ts": 1}
    assert "events decoded with lenient types (the slower path for odd values)" in model.notes


def test_unknown_categories_stay_on_the_typed_chunked_read(tmp_path, chunk_reads, monkeypatch):
    events = _events()
    events[len(events) // 2:len(events) // 2] = [
        {"ph": "X", "cat": "brand_new_category", "name": "x", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "MTIA_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "KERNEL", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1, "args": {"stream": 7}},
    ]
    trace = _write_trace(tmp_path / "t.json", events)
    model = load_trace(trace)
    assert chunk_reads and len(chunk_reads[0][0]) > 1  # read in chunks, typed
    assert model.warnings == {} and model.notes == {} and model.foreign_activity == {"mtia_runtime": 1}
    assert "k" in [model.names[c] for c in model.gpu.name]
    same_model(model, whole_file_model(trace, monkeypatch))


def test_string_thread_ids_are_read_in_chunks_and_by_the_helper(tmp_path, chunk_reads, monkeypatch):
    """String pids/tids (torch 1.8's "stream 7" and digit strings, kineto's "Spans") no longer force the whole-file
    read: each part numbers them as it meets them, and the model renumbers them by name."""
    events = json.loads(gzip.decompress((FIX / "item_sync" / "rank0.trace.json.gz").read_bytes()))["traceEvents"]
    n = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        n += 1
        if e.get("cat") == "kernel":
            e["tid"] = f"stream {e['tid']}"
        elif e.get("cat") == "cpu_op" and n % 5 == 0:
            e["tid"] = str(e["tid"])
        elif e.get("cat") == "cpu_op" and n % 7 == 0:
            e["pid"], e["tid"] = ("Spans", "Traces") if n % 2 else ("Traces", f"worker {n % 3}")
    trace = _write_trace(tmp_path / "rank0.trace.json", events)
    monkeypatch.setattr(build, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(build, "HELPER_HEAD_START_BYTES", 0)
    joined = []
    join_into = build.Helper.join_into
    monkeypatch.setattr(build.Helper, "join_into", lambda self, columns: joined.append(join_into(self, columns))
                        or joined[-1])
    model = load_trace(trace)
    assert joined and joined[0] is not None and len(chunk_reads[0][0]) > 1
    assert set(model.synthetic_ids.values()) >= {"Spans", "Traces", "worker 0", "worker 1", "worker 2"}
    same_model(model, whole_file_model(trace, monkeypatch))


@pytest.mark.parametrize("mapped", [False, True], ids=["gunzipped", "mapped"])
def test_events_kept_past_their_chunk_stay_intact(tmp_path, monkeypatch, mapped):
    """A frame of the decoding thread that another thread holds (a sampling profiler's sys._current_frames(), as
    Dask's workers run beside each task) keeps a batch of events alive past its chunk: their Raw Input Dims still
    point into the chunk. Reading goes on without a BufferError, and every kept Input Dims still reads as the
    file wrote it (the buffer they point into is neither reused nor unmapped)."""
    monkeypatch.setattr(parse, "CHUNK_BYTES", 64 << 10)
    source = FIX / "batch_decode" / "rank0.trace.json.gz"
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(source.read_bytes()))
    expected = [e["args"]["Input Dims"] for e in json.loads(plain.read_text())["traceEvents"]
                if "Input Dims" in (e.get("args") or {})]
    kept = []
    with parse.trace_text(plain if mapped else source) as text:
        assert isinstance(text, mmap.mmap) == mapped
        array = parse.find_event_array(text)
        for events, _start, _end in parse.decoded_chunks(text, array):
            kept.append(events)
        assert len(kept) > 3
    dims = [json.loads(bytes(e.args.input_dims)) for batch in kept for e in batch
            if getattr(e, "args", None) is not None and bytes(e.args.input_dims)]
    assert dims == expected
