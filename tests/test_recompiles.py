"""torch.compile recompiles (analyzer/views/compiles.py, analyzer/detectors/recompiles.py) on a real capture: the
compile_recompile workload on the CPU (Dynamo recompiles there as on CUDA; aot_eager skips kernel generation). Its
compiled helper sees a new length every step, so every profiled step but the first compiles again: one finding for
the calling function, with Dynamo's own compile ids, and none of it reported as a one-time cost."""
import gzip
import json
import re

import pytest

from analyzer import api
from conftest import run_cli

pytest.importorskip("torch")

TINY = ["--set", "model.preset=tiny", "--set", "batch_size=2", "--set", "prompt_length=8", "--set", "decode_steps=8",
        "--set", "compile.backend=aot_eager", "--set", "timing.warmup_steps=1", "--set", "profiler.warmup=1",
        "--set", "profiler.active=4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("recompile")
    result = run_cli("capture", "workloads/compile_recompile.yaml", "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = list(out.iterdir())
    return folder


def test_every_new_length_is_reported_as_a_recompile_of_one_call_site(run):
    with gzip.open(run / "rank0.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    ids = sorted({m.group(1) for e in events if e.get("cat") == "user_annotation"
                  for m in [re.match(r"dynamo_data: compile_id=(\d+/\d+)", e["name"])] if m},
                 key=lambda i: int(i.split("/")[1]))
    assert len(ids) >= 3 and ids[0].endswith("/0")  # a cold cache: the first compile, then one per new length
    report = api.analyze(api.load(run, cache=False)).report
    findings = [f for f in report["findings"] if f["kind"] == "recompile"]
    assert len(findings) == 1  # one calling function, one finding
    f = findings[0]
    assert f["count"] == len(ids) - 1 and f["detail"]["compile_ids"] == ids[1:]
    assert "decode_recompile.py" in f["call_site"] and "step()" in f["call_site"]
    assert "dynamic=True" in f["advice"] and "recompile_limit" in f["advice"]
    assert report["recompiles"]["recompiles"] == len(ids) - 1 and report["recompiles"]["compiles"] == len(ids)
    # the first compile alone may be a one-time cost; the recompiles never are
    assert not any("JIT compilation" in w["title"] and "decode_recompile" in w["title"]
                   for w in report["findings"] if w["kind"] == "warmup")


def test_a_run_without_recompiles_reports_none():
    report = api.analyze(api.load(api.find("tests/fixtures/h200_extra/compile_decode")[0], cache=False)).report
    assert report["recompiles"]["recompiles"] == 0
    assert not [f for f in report["findings"] if f["kind"] == "recompile"]
