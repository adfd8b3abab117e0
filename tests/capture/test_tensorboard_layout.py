"""torch.profiler.tensorboard_trace_handler(dir) writes <worker>.<time>.pt.trace.json files straight into dir. Such a
folder, passed as the traces root, lists each file as a run: in the run list that the dashboard and the MCP server
share, and in analyze-many."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from analyzer.api import RunStore, discover_runs
from analyzer.fleet.inputs import expand
from conftest import run_cli


def _profile_into(folder: Path, worker: str, use_gzip: bool) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 64)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    handler = torch.profiler.tensorboard_trace_handler(str(folder), worker_name=worker, use_gzip=use_gzip)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=handler) as prof:
        for _ in range(4):
            with torch.no_grad():
                model(x).sum()
            prof.step()


def test_a_folder_written_by_tensorboard_trace_handler_lists_each_trace_as_a_run(tmp_path):
    logs = tmp_path / "log"
    _profile_into(logs, "worker0", use_gzip=False)
    _profile_into(logs, "worker1", use_gzip=True)
    files = sorted(p.name for p in logs.iterdir())
    assert len(files) == 2 and all(".pt.trace.json" in f for f in files), files

    runs = discover_runs(logs)
    assert sorted(r.trace.name for r in runs) == files
    assert sorted(r.run_id for r in runs) == sorted(f.removesuffix(".gz").removesuffix(".json") for f in files)
    assert all(r.out_dir.parent == logs.resolve() and r.out_dir.name.endswith(".report") for r in runs)
    assert sorted(Path(f.trace.trace).name for f in expand([str(logs)])) == files

    store = RunStore(logs)
    run = store.find(runs[0].run_id)
    assert run is not None and store.report(run)["schema"].startswith("gpu-idle-analyzer/report/")
    assert sorted(p.name for p in logs.iterdir() if p.is_file()) == files  # nothing written loose beside them

    out = tmp_path / "many"
    result = run_cli("analyze-many", str(logs), "--out", str(out), "--threads")
    assert result.returncode == 0, result.stderr
    assert (out / "report.json").is_file()


def _list_runs(folder: Path) -> dict:
    mcp = pytest.importorskip("mcp")
    from analyzer.mcp.server import build_server

    async def go():
        async with mcp.Client(build_server(folder), mode="legacy") as session:
            return await session.call_tool("list_runs", {})
    result = asyncio.run(go())
    assert not result.is_error, result.content[0].text
    return result.structured_content


def test_the_mcp_server_lists_them_and_says_where_it_looked_when_there_are_none(tmp_path):
    logs = tmp_path / "log"
    _profile_into(logs, "worker0", use_gzip=True)
    listed = _list_runs(logs)
    assert [r["run"] for r in listed["runs"]] == [p.name.removesuffix(".json.gz") for p in logs.iterdir()]
    empty = tmp_path / "empty"
    empty.mkdir()
    text = _list_runs(empty)["text"]
    assert text.startswith("0 runs: no *.json or *.json.gz trace in the traces root itself")
    assert "tensorboard_trace_handler" in text
