"""Real traces changed in ways that must not change the verdict, or must change it in a known way (tests/tracecuts.py):
what must not be claimed is asserted as much as what must."""
from pathlib import Path

import pytest

import tracecuts
from conftest import report_of

HERE = Path(__file__).resolve().parents[1]
EXTERNAL = HERE.parents[1] / "shared" / "traces" / "external"
HOST_WORK = HERE / "fixtures/h200_extra/host_work/rank0.trace.json.gz"
COLD = HERE / "fixtures/h200_foreign/cold_first_forward/trace.json.gz"
CHURN = HERE / "fixtures/h100_rounds12/alloc_churn/rank0.trace.json.gz"


def cut_report(tmp_path, trace: dict, name: str = "cut.json.gz") -> dict:
    return report_of(tracecuts.write(trace, tmp_path / name))


def verdict(report: dict) -> list[tuple[str, str]]:
    return [(f["kind"], f["title"]) for f in report["findings"]]


def partition_adds_up(report: dict) -> bool:
    p = report["summary"]["idle_partition"]
    return abs(p["findings_us"] + p["instrumentation_us"] + p["unexplained_us"] - p["idle_us"]) <= 0.01


def test_without_python_stacks_no_function_is_blamed_for_a_gap(tmp_path):
    """A pure-Python helper runs between decode steps; without with_stack the gaps show no Python at all. The host
    work finding must not name a Python function, nor say the CPU 'ran' the op that launched after the gap (it did
    not span it): the time is untraced, and the python_stacks check lowers the finding's confidence."""
    cut, dropped = tracecuts.drop_category(tracecuts.read(HOST_WORK), "python_function")
    assert dropped > 30_000
    report = cut_report(tmp_path, cut)
    work = [f for f in report["findings"] if f["kind"] == "host_work" and not f.get("parent")]
    assert work and partition_adds_up(report)
    for f in work:
        assert "defined at" not in f["title"] and "position_checksum" not in f["title"]
        assert "while the CPU ran" not in f["title"] and "untraced host time" in f["title"]
        assert f["confidence"] == "medium" and "python_stacks" in f["confidence_checks"]


def test_a_clock_shift_changes_nothing_but_the_times(tmp_path):
    """The same run against another clock origin: every number and every finding the same."""
    before = report_of(HOST_WORK)
    after = cut_report(tmp_path, tracecuts.shift_clock(tracecuts.read(HOST_WORK), 3_600e6))
    assert verdict(after) == verdict(before)
    for key in ("gpu_utilization", "gpu_idle_us", "window_us", "gpu_busy_us"):
        assert after["summary"][key] == pytest.approx(before["summary"][key], abs=0.01)
    assert after["gaps"]["by_cause"] == pytest.approx(before["gaps"]["by_cause"], abs=0.01)


def test_steps_taken_late_in_the_run_are_no_first_iteration(tmp_path):
    """The cold first forward's allocator calls all fall in its first step, ProfilerStep#0: the pool settling. The
    same window numbered #500-#502 is not a process's first iteration, so those calls are not called 'first step
    only'; everything else stands."""
    before = report_of(COLD)
    assert before["warmup"]["one_time_calls"].get("first step only", 0) > 0
    after = cut_report(tmp_path, tracecuts.renumber_steps(tracecuts.read(COLD), 500))
    assert [s["step"] for s in after["gaps"]["per_step"]] == ["ProfilerStep#500", "ProfilerStep#501",
                                                              "ProfilerStep#502"]
    assert "first step only" not in after["warmup"]["one_time_calls"]
    assert after["summary"]["gpu_idle_us"] == pytest.approx(before["summary"]["gpu_idle_us"], abs=0.01)
    assert partition_adds_up(after)


def test_without_memory_events_sizes_are_unknown_and_churn_still_counted(tmp_path):
    """alloc_churn without its [memory] events: the growing buffer cannot be seen (its sizes were in those events),
    the memory_events check says so, and the churn finding, read from the cudaMalloc/cudaFree calls, keeps its
    count."""
    before = report_of(CHURN)
    cut, dropped = tracecuts.drop_memory_events(tracecuts.read(CHURN))
    assert dropped > 100
    after = cut_report(tmp_path, cut)
    assert before["allocator"]["growing"] and after["allocator"]["growing"] == []
    check = next(c for c in after["validity"]["checks"] if c["name"] == "memory_events")
    assert check["status"] == "warn" and "profile_memory=True" in check["meaning"]
    churn = [(f["count"], f["impact_us"]) for f in after["findings"] if f["kind"] == "allocator_churn"]
    assert churn == [(f["count"], f["impact_us"]) for f in before["findings"] if f["kind"] == "allocator_churn"]
    assert "A buffer grows" not in " ".join(f["advice"] for f in after["findings"])


@pytest.mark.skipif(not EXTERNAL.is_dir(), reason=f"{EXTERNAL} not present")
def test_a_shorter_dataloader_wait_moves_its_idle_out_of_input_wait(tmp_path):
    """The DataLoader's __next__ (num_workers=0: its annotation and its Python frame) made half as long: the input
    wait shrinks, the host time it gave up goes to another cause, and the partition stays exact."""
    path = EXTERNAL / "rtx3080-toy-mlp-dataloader-no-workers.json.gz"
    before = report_of(path)
    cut, n = tracecuts.scale_spans(tracecuts.read(path), "enumerate(DataLoader)#", "torch/utils/data/dataloader.py(729): __next__",
                                   0.5)
    assert n == 3
    after = cut_report(tmp_path, cut)
    assert 0 < after["gaps"]["by_cause"]["input_wait"] < before["gaps"]["by_cause"]["input_wait"]
    assert after["summary"]["gpu_idle_us"] == pytest.approx(before["summary"]["gpu_idle_us"], abs=0.01)
    assert partition_adds_up(after)


def test_one_more_step_changes_no_finding(tmp_path):
    """item_sync (a .item() every decode step) with its last decode step run once more (every event of it copied
    after the window with new ids): the same findings in the same order, the sync once more per step, the partition
    exact."""
    path = HERE / "fixtures/h200/item_sync/rank0.trace.json.gz"
    before = report_of(path)
    cut, name = tracecuts.duplicate_last_step(tracecuts.read(path), "decode_step#")
    after = cut_report(tmp_path, cut)
    assert [s["step"] for s in after["gaps"]["per_step"]][-1] == name
    assert len(after["gaps"]["per_step"]) == len(before["gaps"]["per_step"]) + 1
    assert [f["kind"] for f in after["findings"] if not f.get("parent")] == \
        [f["kind"] for f in before["findings"] if not f.get("parent")]
    item = [f for f in after["findings"] if f["kind"] == "sync" and "item" in f["title"]]
    was = [f for f in before["findings"] if f["kind"] == "sync" and "item" in f["title"]]
    assert item and item[0]["count"] == was[0]["count"] + 1
    assert partition_adds_up(after)
