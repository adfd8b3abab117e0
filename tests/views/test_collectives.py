"""views.collectives on real traces: the collective kernels and comm time of a real DDP trace against its raw events
(tests/rawtrace.py, read independently), the comm / compute / idle partition of the GPU window against report.json,
and traces without collectives (the H200 fixtures, a one-rank DDP run whose NCCL calls launch no kernel)."""
import re
from pathlib import Path

import pytest

from analyzer import api
from analyzer.fleet.collectives import collective_table
from analyzer.views.collectives import collective_name, comm_totals
from rawtrace import _ns, is_gpu_work, raw_events
from conftest import analysis_of

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = ROOT.parent / "shared" / "traces" / "external"
DDP = EXTERNAL / "v100-ddp-training-with-memory.json.gz"
RESNET_DDP = EXTERNAL / "v100-resnet-ddp-ns-resolution.json.gz"
FIXTURES = sorted(p for p in (ROOT / "tests" / "fixtures" / "h200").iterdir() if p.is_dir())
NCCL = re.compile(r"nccl|rccl", re.I)

needs_external = pytest.mark.skipif(not DDP.is_file(), reason="../shared/traces/external is absent")


def _union_ns(spans):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            total += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0 if cur_e is None else cur_e - cur_s)


def _analysis(path):
    return analysis_of(path)


@pytest.fixture(scope="module")
def ddp():
    return _analysis(DDP)


@needs_external
def test_ddp_collectives_match_the_raw_kernels(ddp):
    events = raw_events(DDP)
    kernels = [e for e in events if is_gpu_work(e) and e.get("cat") == "kernel" and NCCL.search(e["name"])]
    table = collective_table(ddp.context)
    assert len(kernels) == 2020 and len(table) == len(kernels)
    assert table["dur_us"].sum() == pytest.approx(sum(_ns(e["dur"]) for e in kernels) / 1e3)
    assert set(table["name"]) == {"allreduce"}  # ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)
    assert set(table["stream"]) == {e["args"]["stream"] for e in kernels}
    # torch < 2.1: record_param_comms has no args, so no Seq, size or group name
    assert (table["seq"] == -1).all() and (table["bytes"] == -1).all()
    assert set(table["pg"]) == {f"stream {e['args']['stream']}" for e in kernels}
    # the step each was launched in, from the raw launch calls and ProfilerStep annotations
    launch_ts = {e["args"]["correlation"]: _ns(e["ts"]) for e in events
                 if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})}
    marks = sorted(_ns(e["ts"]) for e in events if e.get("cat") == "user_annotation"
                   and str(e["name"]).startswith("ProfilerStep#"))
    raw_steps = sorted(sum(t >= m for m in marks) - 1 for t in (launch_ts[k["args"]["correlation"]] for k in kernels))
    assert sorted(table["step"]) == raw_steps
    first = table[table["step"] == 0]
    assert list(first["ordinal"]) == list(range(len(first)))


@needs_external
def test_ddp_comm_totals_partition_the_window(ddp):
    events = raw_events(DDP)
    work = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), bool(NCCL.search(e["name"]))) for e in events
            if is_gpu_work(e)]
    comm_ns = _union_ns([(s, e) for s, e, c in work if c])
    busy_ns = _union_ns([(s, e) for s, e, _ in work])
    totals = comm_totals(ddp.context)
    s = ddp.report["summary"]
    assert totals["comm_us"] == pytest.approx(comm_ns / 1e3)
    assert totals["compute_us"] == pytest.approx((busy_ns - comm_ns) / 1e3)
    assert totals["busy_us"] == pytest.approx(s["gpu_busy_us"]) and totals["idle_us"] == pytest.approx(s["gpu_idle_us"])
    parts = totals["comm_us"] + totals["compute_us"] + totals["idle_us"] + totals["profiler_us"]
    assert parts == pytest.approx(totals["window_us"], abs=1e-3)
    assert totals["window_us"] == pytest.approx(s["window_us"])
    assert round(totals["busy_us"] / totals["window_us"], 4) == s["gpu_utilization"]
    assert totals["overlap_us"] + totals["comm_only_us"] == pytest.approx(totals["comm_us"])
    assert 0.3 < totals["comm_share"] < 0.4  # 357 ms of NCCL kernels in 1.0 s busy
    # report.json says it too, and report.md in a sentence
    comm = s["communication"]
    assert comm["kernels"] == sum(c for _, _, c in work) == 2020
    assert comm["comm_us"] == pytest.approx(comm_ns / 1e3, abs=1e-3) and comm["share_of_busy"] == totals["comm_share"]
    assert "was communication (2020 NCCL/RCCL kernels" in api.render(ddp.report)["report.md"]


@needs_external
def test_single_rank_ddp_has_no_collective_kernels():
    """world_size 1: c10d::allreduce_ and record_param_comms (with args) on the CPU, no NCCL kernel on the GPU."""
    events = raw_events(RESNET_DDP)
    assert any(e.get("name") == "record_param_comms" for e in events)
    assert not any(is_gpu_work(e) and NCCL.search(e["name"]) for e in events)
    a = _analysis(RESNET_DDP)
    assert collective_table(a.context).empty
    totals = comm_totals(a.context)
    assert totals["comm_us"] == 0 and totals["compute_us"] == pytest.approx(a.report["summary"]["gpu_busy_us"])


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_h200_fixtures_have_no_collectives(fixture):
    a = _analysis(fixture)
    table = collective_table(a.context)
    assert table.empty and list(table.columns)[:5] == ["seq", "name", "pg", "group_size", "bytes"]
    totals = comm_totals(a.context)
    s = a.report["summary"]
    assert totals["comm_us"] == 0 and totals["overlap_us"] == 0 and "communication" not in a.report["summary"]
    assert totals["compute_us"] + totals["idle_us"] + totals["profiler_us"] == pytest.approx(totals["window_us"])
    assert round(totals["busy_us"] / totals["window_us"], 4) == s["gpu_utilization"]


@pytest.mark.parametrize("kernel, name", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "allreduce"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "allreduce"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "allgather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reducescatter"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "sendrecv"),
    ("void ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "generic"),
])
def test_collective_names(kernel, name):
    assert collective_name(kernel) == name


@needs_external
@pytest.mark.parametrize("chunked", [True, False], ids=["in chunks", "whole file"])
def test_comm_op_args_are_read_with_the_trace(monkeypatch, tmp_path, chunked):
    """record_param_comms args (torch >= 2.1: Collective name, In msg nelems, Group size, ...) against the raw events:
    read while the trace is decoded, a chunk far smaller than the file at a time (so that chunks hold none, one or
    several such ops) and by the whole-file decode; kept through the columnar cache."""
    import shutil
    import analyzer.trace.build as build
    import analyzer.trace.parse as parse
    from analyzer.trace import load_trace
    raw = {e["args"]["External id"]: e["args"] for e in raw_events(RESNET_DDP) if e.get("name") == "record_param_comms"}
    assert len(raw) == 45 and all("Collective name" in a for a in raw.values())
    monkeypatch.setattr(parse, "CHUNK_BYTES", 40_000)
    if not chunked:
        monkeypatch.setattr(build, "find_event_array", lambda text: None)
    trace = tmp_path / RESNET_DDP.name
    shutil.copy(RESNET_DDP, trace)
    assert load_trace(trace).comm_args == raw
    load_trace(trace, cache=True)
    assert load_trace(trace, cache=True).comm_args == raw  # reopened from the cache


@needs_external
def test_the_run_page_says_how_much_of_busy_was_communication(tmp_path):
    import shutil
    from dashboard.pages import run as run_page
    from analyzer.api import RunStore
    (tmp_path / "ddp").mkdir()
    shutil.copy(DDP, tmp_path / "ddp" / DDP.name)
    page = str(run_page.layout(RunStore(tmp_path), "ddp", {}).to_plotly_json())
    assert "357.34 ms (35.7%) was communication (2020 NCCL/RCCL kernels)" in page
