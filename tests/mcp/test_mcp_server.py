"""The MCP server (analyzer/mcp/) through the official SDK's in-process client: every tool on real runs (the H200
examples and an external trace nobody here made), paging, the run's report.md as a resource, the prompts; hostile
paths and SQL refused on one line while the server keeps serving; capture refused without --allow-capture and run
on the CPU with it; and the stdio transport as an assistant starts it (`python -m analyzer mcp`)."""
import asyncio
import json
import shutil
import sys

import pytest

pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402

from analyzer.mcp.server import build_server, one_line_error  # noqa: E402
from conftest import REPO, run_cli  # noqa: E402

EXAMPLES = REPO / "traces" / "examples"
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
EXTERNAL_TRACE = EXTERNAL / "rtx3080-toy-mlp-dataloader-no-workers.json.gz"
EXTERNAL_TWIN = EXTERNAL / "rtx3080-toy-mlp-dataloader-8-workers.json.gz"  # the same script with 8 workers


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """A traces root of three copied example runs (item_sync, decode: a fix and its twin; host_work), an external
    trace in a folder of its own where the shared folder is there, and a folder outside the root that a symlink
    inside points to."""
    root = tmp_path_factory.mktemp("traces")
    for name in ("item_sync", "decode", "host_work"):
        shutil.copytree(EXAMPLES / name, root / name)
    if EXTERNAL_TRACE.is_file():
        for folder, trace in (("external", EXTERNAL_TRACE), ("external_workers", EXTERNAL_TWIN)):
            (root / folder).mkdir()
            shutil.copy(trace, root / folder / trace.name)
    outside = tmp_path_factory.mktemp("outside")
    shutil.copytree(EXAMPLES / "graph_decode", outside / "graph_decode")
    (root / "escape").symlink_to(outside / "graph_decode", target_is_directory=True)
    return root, outside


def client(server) -> Client:
    """The SDK's in-memory transport: JSON-RPC over memory streams, after the initialize handshake."""
    return Client(server, mode="legacy")


def call(server, tool: str, args: dict):
    async def go():
        async with client(server) as session:
            return await session.call_tool(tool, args)
    return asyncio.run(go())


def ok(result) -> dict:
    assert not result.is_error, result.content[0].text
    text = result.content[0].text
    assert "\n" not in text and text == result.structured_content["text"]
    return result.structured_content


def refused(result) -> str:
    assert result.is_error
    text = result.content[0].text
    assert "\n" not in text and "Traceback" not in text
    return text


def test_tools_have_typed_input_schemas(roots):
    async def go():
        async with client(build_server(roots[0])) as session:
            return {t.name: t for t in (await session.list_tools()).tools}
    tools = asyncio.run(go())
    assert set(tools) == {"list_runs", "analyze", "finding", "compare", "query", "capture"}
    analyze = tools["analyze"].input_schema
    assert analyze["required"] == ["run"] and analyze["properties"]["run"]["type"] == "string"
    assert analyze["properties"]["limit"]["type"] == "integer"
    assert tools["list_runs"].annotations.read_only_hint and not tools["capture"].annotations.read_only_hint
    out = tools["analyze"].output_schema  # typed structured content, which the SDK checks every answer against
    assert out["properties"]["findings"]["items"] == {"$ref": "#/$defs/FindingBrief"}
    assert {"saving_ms", "gpu_idle_us", "confidence", "call_site"} <= set(out["$defs"]["FindingBrief"]["properties"])


def test_list_runs_pages_and_names_what_is_left(roots):
    server = build_server(roots[0])
    first = ok(call(server, "list_runs", {"limit": 2}))
    total = 5 if EXTERNAL_TRACE.is_file() else 3  # the symlink out of the root is not a run
    assert first["total"] == total and len(first["runs"]) == 2 and first["next_offset"] == 2
    assert first["note"] == f"{total - 2} more runs: call list_runs again with offset=2"
    rest = ok(call(server, "list_runs", {"offset": 2}))
    ids = [r["run"] for r in first["runs"] + rest["runs"]]
    assert sorted(ids) == sorted(["item_sync", "decode", "host_work"] +
                                 (["external", "external_workers"] if total == 5 else []))
    assert rest["next_offset"] is None and rest["note"] is None
    row = next(r for r in first["runs"] + rest["runs"] if r["run"] == "item_sync")
    assert row["device"] == "NVIDIA H200" and row["workload"] == "item_sync"


def test_analyze_ranks_findings_by_saving_and_reuses_the_report(roots):
    server = build_server(roots[0])
    out = ok(call(server, "analyze", {"run": "item_sync"}))
    report = json.loads((roots[0] / "item_sync" / "report.json").read_text())  # written once, then read back
    assert out["summary"]["gpu_utilization"] == pytest.approx(report["summary"]["gpu_utilization"])
    savings = [f["saving_ms"] for f in out["findings"] if f["saving_ms"] is not None]
    assert savings == sorted(savings, reverse=True) and savings
    assert all(f["parent"] is None and f["confidence"] in ("high", "medium", "low") for f in out["findings"])
    assert {f["id"] for f in out["findings"]} == {f["id"] for f in report["findings"] if not f["parent"]}
    assert out["idle_partition"]["idle_us"] == pytest.approx(report["summary"]["idle_partition"]["idle_us"])
    assert out["text"].startswith("item_sync: GPU busy") and out["what_if_text"].startswith("What a fix buys")
    listed = ok(call(server, "list_runs", {}))  # the run list now reads that report by its trace key
    row = next(r for r in listed["runs"] if r["run"] == "item_sync")
    assert row["status"] == "analyzed" and row["biggest_saving"]["saving_ms"] == pytest.approx(savings[0])
    by_path = ok(call(server, "analyze", {"run": str(roots[0] / "item_sync" / "rank0.trace.json.gz"), "limit": 1}))
    assert by_path["run"] == "item_sync" and len(by_path["findings"]) == 1 and by_path["next_offset"] == 1


def test_finding_gives_the_call_site_its_frames_and_source(roots):
    out = ok(call(build_server(roots[0]), "finding", {"run": "item_sync", "finding_id": "sync.0"}))
    assert out["call_site"] == "workloads/decode_item_sync.py:11" and out["kind"] == "sync"
    assert any(".item()" in line["code"] for line in out["source_lines"])
    assert any("decode_item_sync.py" in frame for frame in out["python_frames"])
    assert out["advice"] and out["what_if"]["saving_ms"] is not None and out["occurrences_total"] >= 1


def test_compare_says_whether_the_fix_worked(roots):
    out = ok(call(build_server(roots[0]), "compare", {"before": "item_sync", "after": "decode"}))
    assert out["verdict"]["outcome"] in ("better", "worse", "mixed", "unchanged")
    assert out["verdict"]["headline"].startswith(out["text"][:60])
    assert any(f["kind"] == "sync" and f["predicted_saving_ms"] is not None for f in out["fixed"])
    assert "### GPU idle diff: `item_sync` → `decode`" in out["markdown"]


@pytest.mark.skipif(not EXTERNAL_TRACE.is_file(), reason="no ../shared/traces/external")
def test_a_trace_nobody_here_made(roots):
    server = build_server(roots[0])
    out = ok(call(server, "analyze", {"run": "external"}))
    # a training step: the replay follows the backward on autograd's thread, so its findings are priced
    assert out["findings"] and out["what_if"]["available"] is True
    assert out["what_if_text"].startswith("What a fix buys") and "no estimates" not in out["what_if_text"]
    first = out["findings"][0]["id"]
    assert ok(call(server, "finding", {"run": "external", "finding_id": first}))["id"] == first
    diff = ok(call(server, "compare", {"before": "external", "after": "external_workers"}))
    assert diff["verdict"]["outcome"] in ("better", "worse", "mixed", "unchanged") and diff["before"] == "external"


def test_hostile_paths_are_refused_and_the_server_keeps_serving(roots):
    root, outside = roots
    server = build_server(root)
    assert refused(call(server, "analyze", {"run": "../outside"})).endswith("climbs out with '..'")
    assert "outside the traces root" in refused(call(server, "analyze", {"run": str(outside / "graph_decode")}))
    assert "'escape' is outside the traces root" in refused(call(server, "analyze", {"run": "escape"}))  # a symlink
    assert "outside the traces root" in refused(call(server, "analyze", {"run": "/etc/passwd"}))
    assert refused(call(server, "finding", {"run": "item_sync", "finding_id": "nope"})).startswith(
        "Error executing tool finding: finding_id: 'nope' is not a finding of item_sync")
    assert refused(call(server, "analyze", {"run": "item_sync", "limit": "x"})) == (
        "Error executing tool analyze: limit: Input should be a valid integer, unable to parse string as an "
        "integer (given 'x')")
    assert refused(call(server, "analyze", {})) == "Error executing tool analyze: run: Field required"
    assert refused(call(server, "list_runs", {"limit": 0})).endswith("limit: must be 1 to 500, not 0")
    assert ok(call(server, "list_runs", {}))["total"] >= 3


def test_report_md_resource_and_prompts(roots):
    async def go():
        async with client(build_server(roots[0])) as session:
            templates = (await session.list_resource_templates()).resource_templates
            text = (await session.read_resource("gpu-idle://run/item_sync/report.md")).contents[0].text
            prompts = {p.name for p in (await session.list_prompts()).prompts}
            diagnose = (await session.get_prompt("diagnose", {"run": "item_sync"})).messages[0].content.text
            return templates, text, prompts, diagnose
    templates, text, prompts, diagnose = asyncio.run(go())
    assert [t.uri_template for t in templates] == ["gpu-idle://run/{+run}/report.md"]
    assert text.startswith("<!-- gpu-idle-analyzer report -->") and "GPU idle report" in text
    assert prompts == {"diagnose", "did_my_fix_work"} and '"item_sync"' in diagnose


def test_capture_is_refused_unless_allowed(roots):
    text = refused(call(build_server(roots[0]), "capture", {"workload": "workloads/tiny.yaml"}))
    assert text == ("Error executing tool capture: workload: capture is off: start the server with --allow-capture "
                    "to let it run code")


@pytest.mark.torch
def test_capture_runs_on_the_cpu_when_allowed(tmp_path):
    pytest.importorskip("torch")
    server = build_server(tmp_path, allow_capture=True)
    assert "is not a workload YAML file" in refused(call(server, "capture", {"workload": "/etc/hostname"}))
    out = ok(call(server, "capture", {"workload": "workloads/tiny.yaml",
                                      "overrides": ["profiler.active=2", "timing.sessions=1", "decode_steps=4"]}))
    (run,) = out["runs"]
    assert run.startswith("tiny-") and (tmp_path / run / "meta.json").is_file()
    assert ok(call(server, "list_runs", {}))["runs"][0]["run"] == run
    assert "KEY=VALUE" in refused(call(server, "capture", {"workload": "workloads/tiny.yaml",
                                                           "overrides": ["--out=/"]}))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    pytest.importorskip("duckdb")
    out = tmp_path_factory.mktemp("dataset") / "ds"
    result = run_cli("analyze-many", str(EXAMPLES / "item_sync"), "--out", str(out), "--workers", "1")
    assert result.returncode == 0, result.stderr
    return out


def test_query_reads_the_dataset_and_nothing_else(roots, dataset, tmp_path):
    server = build_server(roots[0], dataset=dataset)
    out = ok(call(server, "query", {"sql": "SELECT count(*) AS n FROM traces"}))
    assert out["columns"] == ["n"] and out["rows"] == [[1]] and not out["truncated"]
    cut = ok(call(server, "query", {"sql": "SELECT * FROM findings", "limit": 1}))
    assert len(cut["rows"]) == 1 and cut["truncated"] and "LIMIT" in cut["note"]
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    for sql, why in [(f"SELECT * FROM read_csv('{secret}')", "Permission Error"),
                     (f"COPY traces TO '{tmp_path / 'x.csv'}'", "only a SELECT"),
                     (f"ATTACH '{tmp_path / 'x.db'}'", "only a SELECT"),
                     ("INSTALL httpfs", "only a SELECT"),
                     ("CREATE TABLE t AS SELECT 1", "only a SELECT"),
                     ("SELECT 1; SELECT 2", "one statement, not 2"),
                     (f"SELECT * FROM glob('{tmp_path}/*')", "Permission Error")]:
        assert why in refused(call(server, "query", {"sql": sql})), sql
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x.db").exists()
    assert "no dataset" in refused(call(build_server(roots[0]), "query", {"sql": "SELECT 1"}))


def test_the_stdio_server_an_assistant_starts(roots):
    params = StdioServerParameters(command=sys.executable, args=["-m", "analyzer", "mcp", "--traces", str(roots[0])],
                                   cwd=str(REPO))

    async def go():
        async with Client(params) as client:
            return await client.call_tool("list_runs", {"limit": 1})
    out = ok(asyncio.run(go()))
    assert len(out["runs"]) == 1 and out["total"] >= 3


def test_one_line_error_keeps_our_own_refusals():
    assert one_line_error("Error executing tool x: run: no run 'a'\n under b") == \
        "Error executing tool x: run: no run 'a' under b"


def test_mcp_command_refuses_a_missing_traces_folder(tmp_path):
    result = run_cli("mcp", "--traces", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: --traces {tmp_path / 'nope'}: no such folder of runs"


def test_streamable_http_on_a_flag(roots):
    """`--http PORT`: the same tools over streamable HTTP (the server is up once its port takes a connection)."""
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", "mcp", "--traces", str(roots[0]), "--http", str(port)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:  # until it listens, or it died
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                try:  # a tenth of a second for it to start, or its exit status
                    proc.wait(timeout=0.1)
                    pytest.fail(f"the server exited {proc.returncode}: {proc.stderr.read().decode()[-500:]}")
                except subprocess.TimeoutExpired:
                    pass

        async def go():
            async with Client(f"http://127.0.0.1:{port}/mcp") as session:
                return await session.call_tool("list_runs", {"limit": 1})
        out = ok(asyncio.run(go()))
        assert len(out["runs"]) == 1 and out["total"] >= 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
