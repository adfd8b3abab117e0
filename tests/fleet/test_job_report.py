"""The job report across ranks, on synthetic jobs made from a real 2xV100 DDP trace (benchmarks/replicate_trace.py
--ranks): a planted late rank must be found with its step, the others' waits inside the collective after it must be
the planted delay, a slow collective must be told apart from a straggler, and a job with nothing planted (only
clock skew) must have no straggler.

Tolerance of the waits: every rank is a copy of one trace, so a collective's transfer takes exactly as long on
every rank and the only difference in a matched kernel's duration is what was planted; timestamps are rounded to
1 ns when written, so the waits must equal the delay to within 1 µs. The 1% allowed below only keeps the test
meaningful if the generator ever adds jitter."""
import gzip
import importlib.util
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from analyzer.fleet import job_tables
from analyzer.fleet.job import (job_summary, match_collectives, normalise,
                                 render_job_html, render_job_markdown, write_job_report)
from analyzer.report.mdsafe import _CODE_SPAN
from analyzer.views.idle import CAUSES
from rawtrace import _ns, is_gpu_work, raw_events

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT.parent / "shared" / "traces" / "external" / "v100-ddp-training-with-memory.json.gz"
ITEM_SYNC = ROOT / "tests" / "fixtures" / "h200" / "item_sync"
DELAY_MS, SLOW_MS, RANKS = 30.0, 25.0, 3

pytestmark = pytest.mark.skipif(not DDP.is_file(), reason="../shared/traces/external is absent")


def _replicate():
    spec = importlib.util.spec_from_file_location("replicate_trace", ROOT / "benchmarks" / "replicate_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Job `late`: 3 ranks, steps 1..3 of the DDP trace, rank 2 late by 30 ms in step 1, the first collective of
    step 2 slow by 25 ms on every rank. Job `even`: 3 ranks, 2 steps, only clock skew."""
    rep = _replicate()
    root = tmp_path_factory.mktemp("jobs")
    source = rep._load(DDP)  # read once, replicated twice
    planted = rep.replicate_ranks(source, root / "late", RANKS, skew_ms=3.0, straggler=(2, 1, DELAY_MS),
                                  slow=(2, SLOW_MS), steps=(1, 3), flows=False)
    rep.replicate_ranks(source, root / "even", RANKS, skew_ms=4.0, steps=(1, 2), flows=False)
    tables = {}
    for name in ("late", "even"):
        one = job_tables(sorted((root / name).glob("rank*.trace.json.gz")))
        tables = one if not tables else {t: pd.concat([tables[t], one[t]], ignore_index=True) for t in one}
    return root, planted, tables


def _job(summary, name):
    return next(j for j in summary["jobs"] if j["job"] == name)


def test_planted_straggler_is_found_with_its_step_and_the_waits_it_caused(jobs):
    _, planted, tables = jobs
    late = _job(job_summary(**tables), "late")
    assert planted["straggler"] == {"rank": 2, "step": 1, "delay_ms": DELAY_MS}
    assert [s["rank"] for s in late["stragglers"]] == [2]
    s = late["stragglers"][0]
    assert s["kind"] == "late_arrival" and s["steps"] == [1]
    delay_us = DELAY_MS * 1e3
    assert s["late_us"] == pytest.approx(delay_us, rel=0.01)
    assert s["others_waited_us"] == pytest.approx(delay_us, rel=0.01)
    waits = {r["rank"]: r["wait_us"] for r in late["per_rank"]}
    assert waits[2] == 0 and waits[0] == pytest.approx(delay_us, rel=0.01) == waits[1]
    # the wait sits in one collective: the first one after the late rank's arrival, in the planted step
    matched, how = match_collectives(tables["collectives"][tables["collectives"]["job"] == "late"])
    assert how == "seq"
    waited = matched[matched["wait_us"] > 1.0]
    assert set(waited["rank"]) == {0, 1} and waited["key"].nunique() == 1 and set(waited["step"]) == {1}
    # the cause on the late rank: its GPU sat idle for the delay, more than the others did in that step
    assert s["cause"]["idle_cause"] in CAUSES
    assert s["cause"]["idle_excess_us"] == pytest.approx(delay_us, rel=0.05)
    grid = late["heatmap"]["idle_us"]
    assert grid[2][1] - grid[0][1] == pytest.approx(delay_us, rel=0.05)


def test_slow_collective_is_not_a_straggler(jobs):
    _, planted, tables = jobs
    late = _job(job_summary(**tables), "late")
    slow = late["slow_collectives"]
    assert [c["seq"] for c in slow] == [planted["slow_collective"]["seq"]]
    assert slow[0]["step"] == 2 and slow[0]["excess_us"] == pytest.approx(SLOW_MS * 1e3, rel=0.01)
    assert all(2 not in s["steps"] for s in late["stragglers"])


def test_no_straggler_when_none_was_planted(jobs):
    _, _, tables = jobs
    even = _job(job_summary(**tables), "even")
    assert even["stragglers"] == [] and even["slow_collectives"] == []
    assert even["collectives"]["matched_by"] == "seq" and even["collectives"]["matched"] > 0
    assert even["collectives"]["wait_us"] == 0  # clock skew alone makes no wait: durations need no common clock
    assert len({r["step_us"]["median"] for r in even["per_rank"]}) == 1


def test_rank_tables_against_the_raw_rank_files(jobs):
    root, _, tables = jobs
    path = root / "late" / "rank1.trace.json.gz"
    events = raw_events(path)
    kernels = [e for e in events if is_gpu_work(e) and "nccl" in e["name"].lower()]
    seqs = sorted(e["args"]["Seq"] for e in events if e.get("name") == "record_param_comms" and "Seq" in e["args"])
    info = json.loads(gzip.open(path, "rt").read(4096).split('"traceEvents"')[0].rstrip(", \n") + "}")
    assert info["distributedInfo"] == {"backend": "nccl", "rank": 1, "world_size": RANKS}
    coll = tables["collectives"]
    mine = coll[(coll["job"] == "late") & (coll["rank"] == 1)]
    assert len(mine) == len(kernels) and sorted(mine["seq"]) == seqs
    assert set(mine["group_size"]) == {RANKS} and set(mine["pg"]) == {"0"}
    trace = tables["traces"][(tables["traces"]["job"] == "late") & (tables["traces"]["rank"] == 1)].iloc[0]
    assert trace["comm_us"] == pytest.approx(sum(_ns(e["dur"]) for e in kernels) / 1e3)  # one stream: no overlap
    assert trace["world_size"] == RANKS and trace["error"] is None
    assert trace["comm_us"] + trace["compute_us"] == pytest.approx(trace["busy_us"])


def test_parquet_dataset_report(jobs, tmp_path):
    """write_job_report over a hive-partitioned dataset named as analyze-many writes it (job and rank only in the
    folder names; the steps and findings columns under analyzer/fleet/tables.py's names), plus a trace that failed and a
    real H200 trace with an `.item()` sync, so the findings population has a finding in 1 of 7 traces."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    _, _, tables = jobs
    extra = job_tables([ITEM_SYNC / "rank0.trace.json.gz"], job="h200")
    bad = tmp_path / "broken" / "rank0.trace.json.gz"
    bad.parent.mkdir()
    bad.write_bytes(b"not a trace")
    broken = job_tables([bad])
    assert broken["traces"]["error"].notna().all()
    rename = {"steps": {"step": "position", "step_name": "step", "start_us": "ts_us", "dur_us": "wall_us",
                        "gpu_busy_us": "busy_us"},
              "findings": {"site": "call_site", "gpu_idle_us": "impact_us"}, "traces": {"span_us": "window_us"}}
    out = tmp_path / "dataset"
    for source in (tables, extra, broken):
        for name, df in source.items():
            for (job, rank), part in df.groupby(["job", "rank"]):
                folder = out / name / f"job={job}" / f"rank={rank}"
                folder.mkdir(parents=True, exist_ok=True)
                part = part.drop(columns=["job", "rank"]).rename(columns=rename.get(name, {}))
                if name == "steps":  # the dataset's step_name is the label's word: ProfilerStep
                    part["step_name"] = part["step"].str.split("#").str[0]
                pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / "key.parquet")
    written = write_job_report(out)
    assert sorted(p.name for p in written) == ["report.html", "report.json", "report.md"]
    summary = json.loads((out / "report.json").read_text())
    assert summary["traces"] == 8 and summary["analysed"] == 7
    assert [(e["job"], e["rank"]) for e in summary["errors"]] == [("broken", 0)]
    assert [s["rank"] for s in _job(summary, "late")["stragglers"]] == [2]
    assert _job(summary, "late")["stragglers"][0]["steps"] == [1]
    assert _job(summary, "even")["stragglers"] == []
    syncs = [p for p in summary["population"] if p["kind"] == "sync"]
    assert syncs and all(p["traces"] == 1 and p["share"] == pytest.approx(1 / 7, abs=1e-4) for p in syncs)
    launch = [p for p in summary["population"] if p["kind"] == "launch_gap" and p["traces"] == 6]
    assert launch and launch[0]["share"] == pytest.approx(6 / 7, abs=1e-4)
    md = (out / "report.md").read_text()
    assert md.startswith("<!-- gpu-idle-analyzer") and "rank 2 arrived 30.000 ms late" in md
    page = (out / "report.html").read_text()
    assert '"type":"heatmap"' in page and "cdn." not in page.split("<script>")[0]
    write_job_report(out)  # our own files are rewritten


def test_strings_from_traces_cannot_break_the_pages(jobs):
    _, _, tables = jobs
    evil = "x | <img src=x onerror=alert(1)> `tick`\nnext"
    findings = tables["findings"].copy()
    findings.loc[findings.index[0], ["title", "site"]] = [evil, evil]
    summary = job_summary(tables["traces"], tables["steps"], tables["collectives"], findings)
    md = render_job_markdown(summary)
    assert "\nnext" not in md and "&lt;img src=x" in md  # escaped in plain text
    assert "<img" not in _CODE_SPAN.sub("", md)  # kept only inside code spans, which GitHub shows literally
    header = None
    for line in md.splitlines():  # every table row has as many cells as its header
        cells = len(re.findall(r"(?<!\\)\|", line))
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = cells
        else:
            assert cells == header, line
    page = render_job_html(summary)
    assert "<img src=x" not in page and "&lt;img src=x" in page


def test_normalise_fills_missing_columns():
    t = normalise({"traces": pd.DataFrame({"job": ["j"], "rank": ["3"], "error": [None]})})
    assert t["traces"]["rank"].tolist() == [3] and "comm_us" in t["traces"] and t["steps"].empty
    summary = job_summary(t["traces"], t["steps"], t["collectives"], t["findings"])
    assert summary["jobs"][0]["stragglers"] == [] and summary["population"] == []


def test_a_rank_claimed_twice_is_reported_and_counted_once(jobs):
    _, _, tables = jobs
    twice = {}
    for name, df in tables.items():
        again = df[(df["job"] == "late") & (df["rank"] == 1)].assign(content_key="another window")
        twice[name] = pd.concat([df, again], ignore_index=True)
    late = _job(job_summary(**twice), "late")
    assert late["duplicate_ranks"] == [1] and late["ranks"] == [0, 1, 2]
    assert [s["rank"] for s in late["stragglers"]] == [2]
    assert [r["wait_us"] for r in late["per_rank"]] == [r["wait_us"] for r in _job(job_summary(**tables),
                                                                                     "late")["per_rank"]]


def test_two_ranks_one_late_in_every_step(jobs):
    """Two ranks, rank 1 late by 30 ms at the first collective of every step (rank 0 waits there): with two ranks
    half of the (rank, step) values are late, so only the per-collective baseline (aligned again after the first
    collective) can tell. Made from the `even` job's tables by lengthening rank 0's waiting kernels."""
    _, _, tables = jobs
    two = {name: df[(df["job"] == "even") & (df["rank"] < 2)].copy() for name, df in tables.items()}
    coll = two["collectives"]
    first = (coll["rank"] == 0) & (coll["ordinal"] == 0)
    coll.loc[first, "dur_us"] += DELAY_MS * 1e3
    even = _job(job_summary(**two), "even")
    assert [(s["rank"], s["steps"]) for s in even["stragglers"]] == [(1, [0, 1])]
    assert even["stragglers"][0]["late_us"] == pytest.approx(DELAY_MS * 1e3, rel=0.01)


def test_inference_job_with_inserted_collectives(tmp_path):
    """A real H200 decode trace has no collectives: replicate_trace inserts one all-reduce per step (record_param_comms
    with torch >= 2.1's args, its launch, the NCCL kernel), like a tensor-parallel job's. A rank 2 ms late in
    decode_step#2 is found there, and the 1 MiB bf16 message is read back from the args."""
    rep = _replicate()
    rep.replicate_ranks(ROOT / "tests" / "fixtures" / "h200" / "decode", tmp_path / "tp", 3, skew_ms=1.0,
                        straggler=(1, 3, 2.0), insert_us=40.0, insert_bytes=1 << 20)
    tables = job_tables(sorted((tmp_path / "tp").glob("rank*.trace.json.gz")))
    job = _job(job_summary(**tables), "tp")
    coll = tables["collectives"]
    assert set(coll["name"]) == {"allreduce"} and set(coll["bytes"]) == {1 << 20} and set(coll["group_size"]) == {3}
    assert coll.groupby("rank").size().tolist() == [len(job["heatmap"]["steps"])] * 3  # one per step on every rank
    assert [(s["rank"], s["steps"]) for s in job["stragglers"]] == [(1, [3])]
    assert job["heatmap"]["step_names"][3] == "decode_step#2"
    assert job["stragglers"][0]["others_waited_us"] == pytest.approx(2000.0, rel=0.01)
    assert job["slow_collectives"] == []
