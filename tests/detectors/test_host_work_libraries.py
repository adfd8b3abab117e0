"""One cause, one finding: host work in one user function is one top-level finding, whatever library code it was in
at the middle of each idle piece; the third-party library frames it called are its children, by time. Real H100 /
H200 captures of the numpy_sampler workload (top-p sampling with numpy on the host) and of transformers' generate()."""
from pathlib import Path

import numpy as np
import pytest

from analyzer.detectors.base import AnalysisContext
from analyzer.detectors.host_work import _responsible
from conftest import analysis_of, report_of
from rawtrace import raw_events

HERE = Path(__file__).resolve().parents[1]
SAMPLERS = [HERE / "fixtures" / "h100_compile" / "numpy_sampler", HERE / "fixtures" / "h100_rounds12" / "numpy_sampler"]


def analyzed(run: Path):
    analysis = analysis_of(run)
    return analysis.trace, report_of(run)


@pytest.mark.parametrize("run", SAMPLERS, ids=[f"{p.parent.name}/{p.name}" for p in SAMPLERS])
def test_host_work_in_one_function_is_one_finding_with_its_library_calls_below(run):
    trace, report = analyzed(run)
    tops = [f for f in report["findings"] if f["kind"] == "host_work" and not f["parent"]]
    (top,) = tops
    assert top["call_site"].startswith("top_p_sample()") and top["library_site"] is None
    children = [f for f in report["findings"] if f["parent"] == top["id"]]
    assert children and children[0]["library_site"].startswith("argsort()")
    assert all("numpy/" in c["library_site"] for c in children)
    assert sum(c["impact_us"] for c in children) <= top["impact_us"] + 0.01
    assert [c["impact_us"] for c in children] == sorted((c["impact_us"] for c in children), reverse=True)
    libraries = top["detail"]["libraries"]
    assert {c["library_site"] for c in children} <= {lib["library_site"] for lib in libraries}


def test_pieces_whose_middles_fall_in_different_libraries_of_one_function_share_one_site():
    """The split the grouping used to make: a piece whose middle falls in numpy's argsort and one whose middle falls
    in take_along_axis, both inside one top_p_sample() run, are one site (the library is a child, not the key)."""
    trace, _ = analyzed(SAMPLERS[0])
    ctx = AnalysisContext(trace.model, trace.meta)
    fr, names = trace.model.frames, trace.model.names
    sampler = int(np.flatnonzero(fr.name == next(c for c, n in enumerate(names) if n.endswith(": top_p_sample")))[0])
    inside = (fr.start_ns >= fr.start_ns[sampler]) & (fr.end_ns <= fr.end_ns[sampler])
    keys, libraries = set(), set()
    for wanted in (": argsort", ": take_along_axis"):
        row = int(np.flatnonzero(inside & np.isin(fr.name, [c for c, n in enumerate(names) if n.endswith(wanted)]))[0])
        key, span, owner = _responsible(ctx, row, int(fr.start_ns[row]), int(fr.end_ns[row]), -1, -1)
        keys.add(key)
        libraries.add(ctx.frames.library_frame_of(row))
        assert owner == sampler and span == (int(fr.start_ns[sampler]), int(fr.end_ns[sampler]))
    assert len(libraries) == 2 and len(keys) == 1


def test_library_children_never_count_nested_library_time_twice():
    _, report = analyzed(HERE / "fixtures" / "h200_extra" / "hf_generate")
    (top,) = [f for f in report["findings"] if f["kind"] == "host_work" and not f["parent"]]
    children = [f for f in report["findings"] if f["parent"] == top["id"]]
    assert children[0]["library_site"].startswith("generate()") and "transformers/" in children[0]["library_site"]
    assert sum(c["impact_us"] for c in children) <= top["impact_us"] + 0.01


def test_a_gap_with_nothing_recorded_under_its_function_is_untraced_time():
    """torch.compile decode on an H100 recorded without Python stacks beyond the runtime's: the long gaps inside
    _decode() hold no op, runtime call or frame that covers half of them, neither ended inside nor still running at
    the gap's end (a compiled region's span, which is no library op, says nothing of what ran in it). The finding
    says it is untraced time, not that _decode() ran, and has no op to name."""
    run = HERE / "fixtures" / "h100_stackless" / "compile_decode"
    raw = [e for e in raw_events(run / "rank0.trace.json.gz") if e.get("ph") == "X"]
    report = report_of(run)
    (work,) = [f for f in report["findings"] if f["kind"] == "host_work" and not f["parent"]]
    assert work["title"].endswith("in untraced host time inside _decode() (defined at workloads/qwen2/generate.py:99) "
                                  "(nothing recorded under it)")
    assert work["detail"]["tail_op"] is None and work["detail"]["host_memory"] is None and "py-spy" in work["advice"]
    for a, b in work["occurrences_us"]:
        inside = [e for e in raw if (e.get("cat") in ("cuda_runtime", "cuda_driver") or e.get("cat") == "cpu_op"
                                     and "::" in e["name"]) and a <= e["ts"] < b]
        assert not any(min(e["ts"] + e["dur"], b) - e["ts"] >= (b - a) / 2 for e in inside), (a, b)
