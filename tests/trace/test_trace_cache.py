"""The columnar cache beside a trace: identical model and report with and without it, invalidated by a changed
trace, and never in the way (a damaged cache is rebuilt, an unwritable folder just parses)."""
import dataclasses
import os
import shutil

import numpy as np
import pytest

from analyzer.trace import load_trace
from analyzer.trace.cache import TABLES, cache_folder
from conftest import REPO, analyze_loaded

FIX = REPO / "tests" / "fixtures" / "h200"


def same_model(a, b):
    assert a.names == b.names and a.metadata == b.metadata and a.warnings == b.warnings
    assert a.notes == b.notes and a.foreign_activity == b.foreign_activity and a.synthetic_ids == b.synthetic_ids
    for table in TABLES:
        ta, tb = getattr(a, table), getattr(b, table)
        for f in dataclasses.fields(ta):
            assert np.array_equal(getattr(ta, f.name), getattr(tb, f.name)), (table, f.name)


@pytest.fixture
def trace(tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(FIX / "print_tensor", dest, ignore=shutil.ignore_patterns(".gpu-idle-cache"))  # a local run's
    return dest / "rank0.trace.json.gz"


def test_cache_round_trip_gives_identical_model_and_report(trace):
    parsed = load_trace(trace)
    first = load_trace(trace, cache=True)  # parses and writes the cache
    assert cache_folder(trace).is_dir()
    reopened = load_trace(trace, cache=True)
    assert isinstance(reopened.ops.start_ns, np.memmap)  # really served from the cache
    same_model(parsed, first)
    same_model(parsed, reopened)
    strip = lambda r: {k: v for k, v in r.items() if k != "analysis_seconds"}  # noqa: E731
    assert strip(analyze_loaded(parsed, trace)) == strip(analyze_loaded(reopened, trace))


def test_changed_trace_invalidates_the_cache(trace, tmp_path):
    load_trace(trace, cache=True)
    other = FIX / "decode" / "rank0.trace.json.gz"
    shutil.copy(other, trace)
    os.utime(trace, ns=(1, 1))
    same_model(load_trace(trace, cache=True), load_trace(other))


def test_damaged_cache_is_rebuilt(trace):
    load_trace(trace, cache=True)
    (cache_folder(trace) / "gpu.start_ns.npy").write_bytes(b"garbage")
    same_model(load_trace(trace, cache=True), load_trace(trace))


def test_cache_that_cannot_be_written_is_skipped(trace):
    (trace.parent / ".gpu-idle-cache").write_text("a file where the cache folder would go")  # even root fails
    same_model(load_trace(trace, cache=True), load_trace(trace))
    assert (trace.parent / ".gpu-idle-cache").is_file()
