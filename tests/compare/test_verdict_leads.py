"""The diff's headline leads with what a reader must know first: what differs between the two runs besides the
change (GPU, model, workload, batch, torch; or that a bare trace cannot say), then the measured step; findings that
disappeared never call a step that did not measurably move "Better". Real captures (tests/fixtures)."""
import copy
from pathlib import Path

import pytest

from analyzer import api
from conftest import REPO, report_of

FIX = Path(__file__).resolve().parents[1] / "fixtures"
B200 = REPO.parent / "shared" / "traces" / "external" / "b200-vllm-eager.json.gz"


def verdict(before, after) -> dict:
    return api.compare("before", report_of(before), "after", report_of(after))["verdict"]


def test_a_step_judged_within_the_noise_is_no_change_whatever_the_findings_say():
    """h100_rounds12 item_sync -> host_work: 12 timed sessions per run, their medians up to 53% apart, so the 32%
    change is within the noise; one finding is fixed, one is new."""
    v = verdict(FIX / "h100_rounds12" / "item_sync", FIX / "h100_rounds12" / "host_work")
    assert v["step"]["session_spread"] is not None
    assert v["outcome"] == "unchanged"
    assert "No measurable change in the step: the median unprofiled step" in v["headline"]
    assert "Better" not in v["headline"] and "Worse" not in v["headline"]


def test_a_fix_does_not_make_a_step_that_grew_better():
    """H200 item_sync -> decode: one session per run (not judged), the step grew 14% (its steps' interval all
    above zero) while the .item() finding was fixed: mixed, not better."""
    v = verdict(FIX / "h200" / "item_sync", FIX / "h200" / "decode")
    assert v["step"]["ratio"] > 1 and v["step"]["interval"][0] > 1 and v["step"]["session_spread"] is None
    assert v["outcome"] == "mixed" and "Better" not in v["headline"]


def test_runs_on_different_gpus_say_so_before_anything_else():
    v = verdict(FIX / "h100_rounds12" / "host_work", FIX / "h200" / "decode")
    assert v["headline"].startswith("The runs differ in GPU (NVIDIA H100 80GB HBM3 → NVIDIA H200), "
                                    "workload (workloads/host_work.yaml → workloads/decode.yaml).")
    assert [d["what"] for d in v["differences"]] == ["GPU", "workload"]


def test_a_run_against_itself_names_no_difference():
    v = verdict(FIX / "h200" / "decode", FIX / "h200" / "decode")
    assert v["differences"] == [] and v["headline"].startswith("No clear change: ")


@pytest.mark.parametrize("bare", [B200])
def test_a_bare_trace_against_a_capture_says_what_it_cannot_tell(bare):
    if not bare.is_file():
        pytest.skip("../shared/traces/external is absent")
    v = verdict(FIX / "h200" / "decode", bare)
    assert v["headline"].startswith("The runs differ in GPU (NVIDIA H200 → NVIDIA B200); the run after does not "
                                    "say its model, workload, batch size or torch (no meta.json). ")


def test_a_share_unchanged_at_the_precision_shown_shows_no_delta():
    before = report_of(FIX / "h200" / "decode")
    after = copy.deepcopy(before)
    after["summary"]["gpu_utilization"] = round(before["summary"]["gpu_utilization"], 3) + 0.0004  # 0.6% relative
    text = api.render_diff_markdown(api.compare("a", before, "b", after))
    line = next(x for x in text.splitlines() if x.startswith("GPU utilization"))
    assert line.startswith("GPU utilization 7.2% → 7.2%;"), line
    after["summary"]["gpu_utilization"] = round(before["summary"]["gpu_utilization"], 3) + 0.013
    text = api.render_diff_markdown(api.compare("a", before, "b", after))
    assert "GPU utilization 7.2% → 8.5% (+1.3 pt);" in text
