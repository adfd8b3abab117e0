"""Buffers that grow every step (analyzer/views/growing.py), read against the raw [memory] events of real captures:
alloc_churn's torch.cat onto a kept buffer (32 MiB more each decode step) and fragmentation's workspace (1 MiB more
each step), and no such buffer in the traces nobody here made."""
import re
from pathlib import Path

import pytest

from conftest import report_of
from rawtrace import raw_events

HERE = Path(__file__).resolve().parents[1]
EXTERNAL = HERE.parents[1] / "shared" / "traces" / "external"


def largest_per_step(run: Path, op: str) -> list[int]:
    """Per decode step of the trace, the largest device allocation made while `op` ran on the same thread."""
    raw = raw_events(run / "rank0.trace.json.gz")
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") == "user_annotation"
                   and re.match(r"decode_step#\d+$", e["name"]))
    spans = [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") == "cpu_op" and e["name"] == op]
    sizes = []
    for a, b in steps:
        inside = [e["args"]["Bytes"] for e in raw if e.get("name") == "[memory]" and a <= e["ts"] < b
                  and e["args"].get("Device Type") == 1 and e["args"]["Bytes"] > 0
                  and any(t == e["tid"] and s <= e["ts"] <= f for t, s, f in spans)]
        sizes.append(max(inside, default=0))
    return sizes


@pytest.mark.parametrize("run,op,growth,function", [
    ("h100_rounds12/alloc_churn", "aten::cat", 32 << 20, "decode_alloc_churn.py"),
    ("h200_alloc/fragmentation", "aten::empty", 1 << 20, "decode_fragmentation.py")])
def test_a_buffer_that_grows_every_step_is_named_with_its_growth(run, op, growth, function):
    path = HERE / "fixtures" / run
    sizes = largest_per_step(path, op)
    assert len(sizes) >= 3 and all(b - a == growth for a, b in zip(sizes, sizes[1:]))
    report = report_of(path)
    (g,) = report["allocator"]["growing"]
    assert (g["op"], g["steps"], g["first_bytes"], g["last_bytes"]) == (op, len(sizes), sizes[0], sizes[-1])
    assert g["growth_per_step_bytes"] == growth
    churn = next(f for f in report["findings"] if f["id"] == "allocator")
    # named by where it was called: the op, in the user's function that called it
    assert re.search(rf"A buffer grows every decode step here: {op}'s allocation in step\(\) \(defined at "
                     rf"workloads/{re.escape(function)}:\d+\) went from", churn["advice"])
    assert ("copies the whole buffer" in churn["advice"]) == (op == "aten::cat")


@pytest.mark.skipif(not EXTERNAL.is_dir(), reason=f"{EXTERNAL} not present")
@pytest.mark.parametrize("path", sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else [],
                         ids=lambda p: p.name)
def test_no_growing_buffer_in_foreign_traces(path):
    """None of these has a device allocation at one op that grows in three steps running."""
    assert report_of(path)["allocator"]["growing"] == []
