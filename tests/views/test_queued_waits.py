"""Queued idle broken down by what the next work waited for (analyzer/views/queued.py), on real traces: the
breakdown adds up to the queued idle exactly, the idle partition still holds, and each kind of wait is found where
the trace shows it. External traces are skipped where ../shared/traces/external is absent."""
from pathlib import Path

import pytest

from conftest import report_of

HERE = Path(__file__).resolve().parents[1]
FIXTURES = sorted(p.parent for p in (HERE / "fixtures").glob("*/*/rank0.trace.json.gz"))
EXTERNAL = HERE.parents[1] / "shared" / "traces" / "external"
EXTERNAL_TRACES = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
needs_external = pytest.mark.skipif(not EXTERNAL_TRACES, reason="no ../shared/traces/external")


def waits_of(report: dict) -> dict[str, dict]:
    queued = next((f for f in report["findings"] if f["id"] == "queued"), None)
    return {w["reason"]: w for w in queued["detail"]["waits"]} if queued else {}


@pytest.mark.parametrize("path", FIXTURES + EXTERNAL_TRACES, ids=[f"{p.parent.name}/{p.name}" for p in
                                                                   FIXTURES + EXTERNAL_TRACES])
def test_breakdown_adds_up_to_the_queued_idle(path):
    report = report_of(path)
    queued = next((f for f in report["findings"] if f["id"] == "queued"), None)
    if queued is None:
        assert not report["gaps"]["by_cause"].get("queued")
        return
    waits = queued["detail"]["waits"]
    assert sum(w["idle_us"] for w in waits) == pytest.approx(queued["impact_us"], abs=0.01 * len(waits) + 0.01)
    assert sum(w["count"] for w in waits) >= queued["count"]  # a gap cut into pieces counts each piece
    children = [f for f in report["findings"] if f.get("parent") == "queued"]
    assert sum(c["impact_us"] for c in children) <= queued["impact_us"] + 0.01
    p = report["summary"]["idle_partition"]  # children never count twice
    assert p["findings_us"] + p["instrumentation_us"] + p["unexplained_us"] == pytest.approx(p["idle_us"], abs=0.01)


def test_a_graph_replay_waits_between_its_nodes():
    waits = waits_of(report_of(HERE / "fixtures" / "h200_extra" / "graph_decode_24"))
    assert max(waits.values(), key=lambda w: w["idle_us"])["reason"] == "graph_node"


@needs_external
@pytest.mark.parametrize("name,stream", [("mi300-resnet-training-checkpoint", 4), ("v100-ddp-training-with-memory", 7)])
def test_stream_waits_name_the_other_stream(name, stream):
    """Distributed training: the next work was made to wait (cudaStreamWaitEvent / hipStreamWaitEvent) on another
    stream; the breakdown says so and names that stream's last work."""
    w = waits_of(report_of(EXTERNAL / f"{name}.json.gz"))["event_wait"]
    assert w["idle_us"] > 100 and w["example"].endswith(f"on stream {stream}")


@needs_external
def test_work_launched_before_the_window_is_its_own_wait():
    report = report_of(EXTERNAL / "h100-hf-qwen1.5-0.5b.json.gz")
    w = waits_of(report)
    assert w["before_window"]["idle_us"] == pytest.approx(727.6, abs=0.1)
    assert any(f["title"].startswith("of which 30% behind work launched before the window") for f in report["findings"])
