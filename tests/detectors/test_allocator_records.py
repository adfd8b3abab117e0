"""The caching allocator's own records (memory_snapshot.pickle.gz beside two H200 captures): allocating lines, the
join with the trace's cudaMalloc/cudaFree, segment counts and the reserved peak, each checked against the raw
pickle read here with nothing but gzip and pickle; and a report that is the same without the snapshot apart
from what the snapshot adds."""
import collections
import dataclasses
import gzip
import pickle
from pathlib import Path

import pytest

from analyzer import api
from analyzer.cli import main
from rawtrace import count_named, raw_events

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h200_alloc"
REPO = FIX.parents[2]
NAMES = ("alloc_churn", "fragmentation")


def raw_snapshot(name: str) -> dict:
    with gzip.open(FIX / name / "memory_snapshot.pickle.gz") as f:
        return pickle.load(f)


def raw_entries(name: str) -> list[dict]:
    return [e for trace in raw_snapshot(name)["device_traces"] for e in trace]


def first_user_line(frames: list[dict], script: str) -> str | None:
    """The innermost frame in `script` (a path under workloads/), as file:line."""
    for f in frames:
        if f["filename"].endswith(script):
            return f"{script}:{f['line']}"
    return None


def source_line(site: str) -> str:
    path, line = site.rsplit(":", 1)
    return (REPO / path).read_text().splitlines()[int(line) - 1]


@pytest.fixture(scope="module")
def analyses():
    out = {}
    for name in NAMES:
        (item,) = api.find(FIX / name, "/nonexistent-out")
        assert item.snapshot is not None
        with_records = api.analyze(api.load(item, cache=False)).report
        without = api.analyze(api.load(dataclasses.replace(item, snapshot=None), cache=False)).report
        out[name] = (with_records, without)
    return out


def records(analyses, name) -> dict:
    return analyses[name][0]["allocator"]["snapshot"]


@pytest.mark.parametrize("name", NAMES)
def test_entry_and_segment_counts_match_the_raw_pickle(analyses, name):
    raw, snap = raw_snapshot(name), records(analyses, name)
    entries = raw_entries(name)
    for action in ("alloc", "segment_alloc", "segment_free", "free_completed"):
        assert snap["entries"].get(action, 0) == sum(e["action"] == action for e in entries), action
    assert len(snap["segments"]["at_end"]) == len(raw["segments"])
    assert sum(s["total"] for s in snap["segments"]["at_end"]) == sum(s["total_size"] for s in raw["segments"])
    assert (FIX / name / "memory_snapshot.pickle.gz").stat().st_size <= 2_000_000


@pytest.mark.parametrize("name", NAMES)
def test_reserved_peak_is_the_replayed_maximum(analyses, name):
    """Reserved bytes replayed backwards from the final segments through every segment_alloc/free."""
    raw, snap = raw_snapshot(name), records(analyses, name)
    reserved = sum(s["total_size"] for s in raw["segments"])
    peak = reserved
    for e in reversed(raw_entries(name)):
        if e["action"] == "segment_alloc":
            reserved -= e["size"]
        elif e["action"] == "segment_free":
            reserved += e["size"]
        peak = max(peak, reserved)
    assert snap["history_consistent"] and reserved >= 0
    assert snap["peak"]["reserved_bytes"] == peak
    at_peak = snap["segments"]["at_peak"]
    assert len(at_peak) == snap["peak"]["segments"]
    assert sum(s["total"] for s in at_peak) == peak


@pytest.mark.parametrize("name", NAMES)
def test_every_cuda_malloc_and_free_in_the_window_finds_its_entry(analyses, name):
    raw = raw_events(FIX / name / "rank0.trace.json.gz")
    align = records(analyses, name)["alignment"]
    assert align["calls"] == count_named(raw, "cudaMalloc") + count_named(raw, "cudaFree")
    # one cudaFree may have no entry (a segment freed by the profiler's own flush), never more
    assert align["calls"] - 1 <= align["matched"] <= align["calls"]
    assert abs(align["median_entry_after_call_end_us"]) < 50


def test_alloc_churn_names_the_growing_buffer_and_empty_cache_lines(analyses):
    snap = records(analyses, "alloc_churn")
    entries = raw_entries("alloc_churn")
    script = "workloads/decode_alloc_churn.py"
    sites = {s["call_site"]: s for s in snap["sites"]}
    for action, key, text in (("segment_alloc", "segment_allocs", "torch.cat"),
                              ("segment_free", "segment_frees", "empty_cache")):
        lines = {first_user_line(e["frames"], script) for e in entries if e["action"] == action} - {None}
        (line,) = {ln for ln in lines if text in source_line(ln)}
        expected = sum(e["action"] == action and first_user_line(e["frames"], script) == line for e in entries)
        assert sites[line][key] == expected > 0
    cat_line = next(ln for ln in sites if ln.startswith(script) and "torch.cat" in source_line(ln))
    report = analyses["alloc_churn"][0]
    children = [f for f in report["findings"] if f["id"].startswith("allocator.")]
    assert {f["call_site"] for f in children} >= {cat_line}
    parent = next(f for f in report["findings"] if f["id"] == children[0]["parent"])
    assert sum(f["impact_us"] for f in children) <= parent["impact_us"] + 1e-6
    assert snap["empty_cache"]["segments_released"] == sum(e["action"] == "segment_free" for e in entries)
    # each allocator gap among the largest names its exact line: the growing buffer's or empty_cache()'s
    gaps = [g for g in report["gaps"]["top"] if g["cause"] == "allocator"]
    assert gaps and all(g["allocating_line"].startswith(script) for g in gaps)
    assert {source_line(g["allocating_line"]).strip().split("(")[0] for g in gaps} <= {
        "self.kept = torch.cat", "torch.cuda.empty_cache"}


def test_fragmentation_finding_names_the_line_whose_size_changes_every_step(analyses):
    report = analyses["fragmentation"][0]
    (frag,) = [f for f in report["findings"] if f["kind"] == "allocator_fragmentation"]
    assert "a new size every step" in source_line(frag["call_site"])
    assert frag["impact_us"] == 0 and frag["detail"]["wasted_bytes"] == report["allocator"]["snapshot"]["peak"][
        "cached_bytes"] > 0
    missed = report["allocator"]["snapshot"]["fragmentation"]
    assert missed["largest_missed_request_site"] == frag["call_site"]
    assert missed["reserves_despite_cache"] >= 1


@pytest.mark.parametrize("name", NAMES)
def test_the_snapshot_adds_to_the_report_and_changes_no_number(analyses, name):
    with_records, without = analyses[name]
    assert "snapshot" not in without["allocator"]
    assert with_records["summary"]["idle_partition"] == without["summary"]["idle_partition"]
    top = lambda r: [(f["kind"], f["impact_us"]) for f in r["findings"] if not f.get("parent")  # noqa: E731
                     and f["kind"] != "allocator_fragmentation"]
    assert top(with_records) == top(without)
    assert with_records["summary"]["steps"] == without["summary"]["steps"]
    joined = ("allocating_line", "segment_bytes", "segment_action")  # what the records add to a gap piece
    plain = [{k: v for k, v in g.items() if k not in joined} for g in with_records["gaps"]["top"]]
    assert plain == without["gaps"]["top"] and not any(k in g for g in without["gaps"]["top"] for k in joined)
    assert {k: v for k, v in with_records["gaps"].items() if k != "top"} == {
        k: v for k, v in without["gaps"].items() if k != "top"}
    assert with_records["syncs"] == without["syncs"]


def test_analyze_cli_takes_a_snapshot_from_elsewhere_and_refuses_a_bad_one(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for f in ("rank0.trace.json.gz", "meta.json"):
        (run / f).write_bytes((FIX / "fragmentation" / f).read_bytes())
    assert main(["analyze", str(run), "--out", str(tmp_path / "plain"), "--no-cache"]) == 0
    assert "Allocator records" not in (tmp_path / "plain" / "report.md").read_text()
    assert main(["analyze", str(run), "--out", str(tmp_path / "joined"), "--no-cache",
                 "--memory-snapshot", str(FIX / "fragmentation" / "memory_snapshot.pickle.gz")]) == 0
    md = (tmp_path / "joined" / "report.md").read_text()
    assert "Allocator records (memory_snapshot.pickle.gz)" in md and "workloads/decode_fragmentation.py:22" in md
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps(collections.OrderedDict(segments=[])))  # names a class: refused unread
    capsys.readouterr()
    assert main(["analyze", str(run), "--out", str(tmp_path / "bad"), "--no-cache", "--memory-snapshot", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.pickle" in err and not (tmp_path / "bad").exists()


@pytest.mark.parametrize("folder,retries", [("h100_rounds12", 3), ("h200_alloc", 0)])
def test_cache_flushes_before_the_window_are_named_beside_the_window_s_price(folder, retries):
    """The fragmentation pathology's workspace grows over the whole process: on the 80 GB H100 reserved memory reached
    the device's size three times before the window (meta.json profiled.memory_stats_after, the process's counters),
    on the 139 GB H200 never. The growth finding says so, since its saving prices the window's calls only."""
    run = FIX.parent / folder / "fragmentation"
    report = api.analyze(api.load(run, cache=False)).report
    (growth,) = [f for f in report["findings"] if f["kind"] == "allocator_churn" and not f.get("parent")]
    process = api.read_meta(run / "meta.json").data["profiled"]["memory_stats_after"]
    assert report["allocator"]["memory_stats_process"]["num_alloc_retries"] == process["num_alloc_retries"] == retries
    if retries:
        peak = process["reserved_bytes.all.peak"] / 2 ** 30
        assert (f"ran out of device memory {retries} times (reserved memory peaked at {peak:.1f} GiB)"
                in growth["advice"])
        assert f"({process['num_device_free']} cudaFree in the process in all)" in growth["advice"]
    else:
        assert "ran out of device memory" not in growth["advice"]
