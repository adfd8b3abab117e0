"""The MCP server (analyzer/mcp/) through the official SDK's in-process client: every tool on real runs (the H200
examples and an external trace nobody here made), the answer in the text content within its budget and paged beyond,
the run's report.md as a resource, the prompts; strict arguments (types, unknown names) and hostile paths and SQL
refused on one line that names no folder of the server's, while the server keeps serving and writes nothing into the
traces folder; query output cut and a runaway query stopped; capture refused without --allow-capture and run on the
CPU with it; the stdio transport as an assistant starts it, and streamable HTTP with its token and Host checks."""
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402 - the SDK's client with our headers
from mcp.shared.exceptions import MCPError  # noqa: E402

from analyzer.mcp.server import TOKEN_ENV, build_server, one_line_error  # noqa: E402
from analyzer.mcp.texts import BUDGET, CELL  # noqa: E402
from conftest import REPO, report_of, run_cli  # noqa: E402

EXAMPLES = REPO / "traces" / "examples"
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
EXTERNAL_TRACE = EXTERNAL / "rtx3080-toy-mlp-dataloader-no-workers.json.gz"
EXTERNAL_TWIN = EXTERNAL / "rtx3080-toy-mlp-dataloader-8-workers.json.gz"  # the same script with 8 workers
TOKEN = "s3cret-token-for-the-test-0123456789"


def tree(root) -> dict:
    """Every file under root with its size and modification time."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """A traces root of three copied example runs (item_sync, decode: a fix and its twin; host_work), an external
    trace in a folder of its own where the shared folder is there, a truncated trace, and a folder outside the root
    that a symlink inside points to; and what the root held before any server read it."""
    root = tmp_path_factory.mktemp("traces")
    for name in ("item_sync", "decode", "host_work"):
        shutil.copytree(EXAMPLES / name, root / name)
    if EXTERNAL_TRACE.is_file():
        for folder, trace in (("external", EXTERNAL_TRACE), ("external_workers", EXTERNAL_TWIN)):
            (root / folder).mkdir()
            shutil.copy(trace, root / folder / trace.name)
    (root / "broken").mkdir()  # a capture cut off while writing: the first 4 KiB of a real trace
    (root / "broken" / "rank0.trace.json.gz").write_bytes((EXAMPLES / "decode" / "rank0.trace.json.gz").read_bytes()[:4096])
    outside = tmp_path_factory.mktemp("outside")
    shutil.copytree(EXAMPLES / "graph_decode", outside / "graph_decode")
    (root / "escape").symlink_to(outside / "graph_decode", target_is_directory=True)
    return root, outside, tree(root)


@pytest.fixture(scope="module")
def server(roots):
    """One server for the tests that need no options: each run is analyzed once, in its memory."""
    return build_server(roots[0])


def client(server) -> Client:
    """The SDK's in-memory transport: JSON-RPC over memory streams, after the initialize handshake."""
    return Client(server, mode="legacy")


def call(server, tool: str, args: dict):
    async def go():
        async with client(server) as session:
            return await session.call_tool(tool, args)
    return asyncio.run(go())


def content(result) -> str:
    (block,) = result.content
    assert 0 < len(block.text) <= BUDGET
    return block.text


def ok(result) -> dict:
    assert not result.is_error, result.content[0].text
    content(result)
    assert "\n" not in result.structured_content["text"]
    return result.structured_content


def refused(result) -> str:
    assert result.is_error
    text = result.content[0].text
    assert "\n" not in text and "Traceback" not in text
    return text


def test_tools_have_described_strict_input_schemas(server):
    async def go():
        async with client(server) as session:
            return {t.name: t for t in (await session.list_tools()).tools}
    tools = asyncio.run(go())
    assert set(tools) == {"list_runs", "analyze", "finding", "compare", "tables", "query", "capture"}
    analyze = tools["analyze"].input_schema
    assert analyze["required"] == ["run"] and analyze["properties"]["run"]["type"] == "string"
    assert analyze["properties"]["limit"] | {"description": None} == {
        "type": "integer", "minimum": 1, "maximum": 500, "default": 50, "title": "Limit", "description": None}
    for tool in tools.values():  # every argument says what it takes; no other argument is taken
        schema = tool.input_schema
        assert schema["additionalProperties"] is False, tool.name
        assert all(len(p.get("description") or "") > 20 for p in schema["properties"].values()), tool.name
    assert "report.md" in analyze["properties"]["run"]["description"] or "list_runs" in \
        analyze["properties"]["run"]["description"]
    assert "'sync.0'" in tools["finding"].input_schema["properties"]["finding_id"]["description"]
    assert "'1.1'" in tools["finding"].input_schema["properties"]["finding_id"]["description"]
    assert tools["list_runs"].annotations.read_only_hint and not tools["capture"].annotations.read_only_hint
    out = tools["analyze"].output_schema  # typed structured content, which the SDK checks every answer against
    assert out["properties"]["findings"]["items"] == {"$ref": "#/$defs/FindingBrief"}
    assert {"saving_ms", "gpu_idle_us", "confidence", "call_site", "row"} <= set(
        out["$defs"]["FindingBrief"]["properties"])


def test_arguments_are_checked_strictly_on_one_line(server):
    for args, said in [({"run": "item_sync", "limit": True}, "limit: Input should be a valid integer (given True)"),
                       ({"run": "item_sync", "limit": "5"}, "limit: Input should be a valid integer (given '5')"),
                       ({"run": "item_sync", "limit": 5.0}, "limit: Input should be a valid integer (given 5.0)"),
                       ({"run": 5}, "run: Input should be a valid string (given 5)"),
                       ({"run": "item_sync", "ofset": 2},
                        "ofset: not an argument of analyze (it takes: run, offset, limit)")]:
        assert refused(call(server, "analyze", args)) == f"Error executing tool analyze: {said}", args
    # a huge value is said back cut, whichever check refuses it
    for tool, args in [("analyze", {"run": "x" * 100_000}), ("analyze", {"run": "y" * 4000}),
                       ("list_runs", {"z" * 100_000: 1}), ("finding", {"run": "item_sync", "finding_id": "w" * 199})]:
        text = refused(call(server, tool, args))
        assert len(text) < 700, (tool, len(text))
    assert "… (4,002 characters) under the traces root" in refused(call(server, "analyze", {"run": "y" * 4000}))
    assert ok(call(server, "list_runs", {"limit": 5}))["runs"]  # and it keeps serving


def test_list_runs_pages_and_names_what_is_left(server):
    first = ok(call(server, "list_runs", {"limit": 2}))
    total = 6 if EXTERNAL_TRACE.is_file() else 4  # the symlink out of the root is not a run; broken is one
    assert first["total"] == total and len(first["runs"]) == 2 and first["next_offset"] == 2
    assert first["note"] == f"{total - 2} more runs: call list_runs again with offset=2"
    rest = ok(call(server, "list_runs", {"offset": 2}))
    ids = [r["run"] for r in first["runs"] + rest["runs"]]
    assert sorted(ids) == sorted(["item_sync", "decode", "host_work", "broken"] +
                                 (["external", "external_workers"] if total == 6 else []))
    assert rest["next_offset"] is None and rest["note"] is None
    row = next(r for r in first["runs"] + rest["runs"] if r["run"] == "item_sync")
    assert row["device"] == "NVIDIA H200" and row["workload"] == "item_sync"


def test_the_text_content_is_the_answer(server):
    """Clients that pass only the text to the model: it holds what the structured content holds."""
    result = call(server, "analyze", {"run": "item_sync"})
    out, text = ok(result), content(result)
    assert text.startswith(out["text"] + "\ntrace: item_sync/rank0.trace.json.gz\n")
    assert out["what_if_text"] in text and f"{out['summary']['gpu_utilization']}" in text
    for check in out["checks"]:
        assert f"- {check['status']} {check['name']}: {check['meaning']}" in text
    for f in out["findings"]:  # each top-level finding is a row of the table: its number, id, title, saving
        assert f"| {f['row']} | {f['id']} | {f['severity']} | {f['confidence']} |" in text
        assert f["title"] in text
    listed = call(server, "list_runs", {})
    assert all(f"| {r['run']} | " in content(listed) for r in ok(listed)["runs"])
    one = call(server, "finding", {"run": "item_sync", "finding_id": "sync.0"})
    assert "workloads/decode_item_sync.py:11" in content(one) and ".item()" in content(one)
    assert ok(one)["advice"] in content(one)


def test_analyze_ranks_findings_by_saving_and_writes_nothing(roots, server):
    out = ok(call(server, "analyze", {"run": "item_sync"}))
    report = report_of(roots[0] / "item_sync")  # the report `analyze` makes of the same trace
    assert out["summary"]["gpu_utilization"] == pytest.approx(report["summary"]["gpu_utilization"])
    savings = [f["saving_ms"] for f in out["findings"] if f["saving_ms"] is not None]
    assert savings == sorted(savings, reverse=True) and savings
    assert all(f["parent"] is None and f["confidence"] in ("high", "medium", "low") for f in out["findings"])
    assert {f["id"] for f in out["findings"]} == {f["id"] for f in report["findings"] if not f["parent"]}
    assert [f["row"] for f in out["findings"]] == [str(n) for n in range(1, len(out["findings"]) + 1)]
    assert out["idle_partition"]["idle_us"] == pytest.approx(report["summary"]["idle_partition"]["idle_us"])
    assert out["text"].startswith("item_sync: GPU busy") and out["what_if_text"].startswith("What a fix buys")
    listed = ok(call(server, "list_runs", {}))  # the run list reads the report from the server's memory
    row = next(r for r in listed["runs"] if r["run"] == "item_sync")
    assert row["status"] == "analyzed" and row["biggest_saving"]["saving_ms"] == pytest.approx(savings[0])
    by_path = ok(call(server, "analyze", {"run": str(roots[0] / "item_sync" / "rank0.trace.json.gz"), "limit": 1}))
    assert by_path["run"] == "item_sync" and len(by_path["findings"]) == 1 and by_path["next_offset"] == 1
    for args in ({"run": "decode"}, {"run": "host_work"}):
        ok(call(server, "analyze", args))
    ok(call(server, "compare", {"before": "item_sync", "after": "decode"}))
    assert tree(roots[0]) == roots[2]  # no report, no cache: the traces folder is as it was


def test_finding_gives_the_call_site_its_frames_and_source(server):
    out = ok(call(server, "finding", {"run": "item_sync", "finding_id": "sync.0"}))
    assert out["call_site"] == "workloads/decode_item_sync.py:11" and out["kind"] == "sync"
    assert any(".item()" in line["code"] for line in out["source_lines"])
    assert any("decode_item_sync.py" in frame for frame in out["python_frames"])
    assert out["advice"] and out["what_if"]["saving_ms"] is not None and out["occurrences_total"] >= 1


def test_finding_by_its_row_in_report_md(server):
    """report.md numbers its findings table (1, 1.1, 2): the number names the same finding as its id."""
    text = asyncio.run(_read(server, "gpu-idle://run/item_sync/report.md"))
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 4 and cells[0].replace(".", "").isdigit():
            rows[cells[0]] = cells[4]  # the finding's title
    assert "1.1" in rows and "2" in rows
    for number, title in rows.items():
        for given in (number, f"#{number}"):
            out = ok(call(server, "finding", {"run": "item_sync", "finding_id": given}))
            assert out["row"] == number and out["title"].replace("|", "\\|") in title.replace("↳ ", ""), given
    said = refused(call(server, "finding", {"run": "item_sync", "finding_id": "99"}))
    assert "give an id as analyze lists it, or a row number of report.md's findings table" in said
    assert "sync.0 (#2)" in said or "sync.0 (#" in said


async def _read(server, uri: str) -> str:
    async with client(server) as session:
        return (await session.read_resource(uri)).contents[0].text


def test_compare_leads_with_what_differs_and_carries_the_verdict_in_full(server):
    result = call(server, "compare", {"before": "item_sync", "after": "decode"})
    out, text = ok(result), content(result)
    headline = out["verdict"]["headline"]
    assert text.startswith(headline + "\n")  # the headline leads, whole, with what differs first in it
    assert out["differences"] == [{"what": "workload", "before": "workloads/item_sync.yaml",
                                   "after": "workloads/decode.yaml"}]
    assert headline.startswith("The runs differ in workload (workloads/item_sync.yaml → workloads/decode.yaml).")
    assert out["verdict"]["outcome"] in ("better", "worse", "mixed", "unchanged")
    assert any(f["kind"] == "sync" and f["predicted_saving_ms"] is not None for f in out["fixed"])
    assert "### GPU idle diff: `item_sync` → `decode`" in out["markdown"] and "### GPU idle diff" in text
    later = ok(call(server, "compare", {"before": "item_sync", "after": "decode", "offset": 5}))
    body = [line for line in out["markdown"].splitlines() if line.strip("*") != headline]
    assert later["offset"] == 5 and later["total"] == len(body)
    assert content(call(server, "compare", {"before": "item_sync", "after": "decode", "offset": 5})).endswith(
        "\n".join(body[5:]))


@pytest.mark.skipif(not EXTERNAL_TRACE.is_file(), reason="no ../shared/traces/external")
def test_a_trace_nobody_here_made(server):
    out = ok(call(server, "analyze", {"run": "external"}))
    # a training step: the replay follows the backward on autograd's thread, so its findings are priced
    assert out["findings"] and out["what_if"]["available"] is True
    assert out["what_if_text"].startswith("What a fix buys") and "no estimates" not in out["what_if_text"]
    first = out["findings"][0]["id"]
    assert ok(call(server, "finding", {"run": "external", "finding_id": first}))["id"] == first
    diff = ok(call(server, "compare", {"before": "external", "after": "external_workers"}))
    assert diff["verdict"]["outcome"] in ("better", "worse", "mixed", "unchanged") and diff["before"] == "external"


def test_hostile_paths_are_refused_and_errors_name_no_folder_of_the_server(roots, server):
    root, outside, _ = roots
    assert refused(call(server, "analyze", {"run": "../outside"})).endswith("climbs out with '..'")
    assert "outside the traces root" in refused(call(server, "analyze", {"run": str(outside / "graph_decode")}))
    assert "'escape' is outside the traces root" in refused(call(server, "analyze", {"run": "escape"}))  # a symlink
    assert "outside the traces root" in refused(call(server, "analyze", {"run": "/etc/passwd"}))
    assert refused(call(server, "finding", {"run": "item_sync", "finding_id": "nope"})).startswith(
        "Error executing tool finding: finding_id: 'nope' is not a finding of item_sync")
    assert refused(call(server, "analyze", {"run": "item_sync", "limit": "x"})) == (
        "Error executing tool analyze: limit: Input should be a valid integer (given 'x')")
    assert refused(call(server, "analyze", {})) == "Error executing tool analyze: run: Field required"
    assert refused(call(server, "list_runs", {"limit": 0})) == (
        "Error executing tool list_runs: limit: Input should be greater than or equal to 1 (given 0)")
    for args in ({"run": "broken"}, {"run": "nope"}):  # the loader's own message, the path in it relative
        text = refused(call(server, "analyze", args))
        assert str(root) not in text and str(REPO) not in text, text
    assert "broken/rank0.trace.json.gz" in refused(call(server, "analyze", {"run": "broken"}))
    row = next(r for r in ok(call(server, "list_runs", {}))["runs"] if r["run"] == "broken")
    assert row["status"] == "error" and str(root) not in row["error"]
    assert ok(call(server, "list_runs", {}))["total"] >= 3


def test_report_md_resource_and_prompts(server):
    async def go():
        async with client(server) as session:
            templates = (await session.list_resource_templates()).resource_templates
            text = (await session.read_resource("gpu-idle://run/item_sync/report.md")).contents[0].text
            prompts = {p.name for p in (await session.list_prompts()).prompts}
            diagnose = (await session.get_prompt("diagnose", {"run": "item_sync"})).messages[0].content.text
            errors = []
            for ask in (lambda: session.read_resource("gpu-idle://run/nope/report.md"),
                        lambda: session.get_prompt("diagnose", {"run": "nope"}),
                        lambda: session.get_prompt("did_my_fix_work", {"before": "item_sync", "after": "../x"})):
                with pytest.raises(MCPError) as caught:
                    await ask()
                errors.append(caught.value.error.message)
            return templates, text, prompts, diagnose, errors
    templates, text, prompts, diagnose, errors = asyncio.run(go())
    assert [t.uri_template for t in templates] == ["gpu-idle://run/{+run}/report.md"]
    assert text.startswith("<!-- gpu-idle-analyzer report -->") and "GPU idle report" in text
    assert prompts == {"diagnose", "did_my_fix_work"} and '"item_sync"' in diagnose
    assert errors == ["run: no run 'nope' under the traces root (list_runs names them)",
                      "run: no run 'nope' under the traces root (list_runs names them)",
                      "after: '../x' climbs out with '..'"]


def test_capture_is_refused_unless_allowed(server):
    text = refused(call(server, "capture", {"workload": "workloads/tiny.yaml"}))
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
    assert len(cut["rows"]) == 1 and cut["truncated"] and "offset=1" in cut["note"]
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
    assert "no dataset" in refused(call(build_server(roots[0]), "tables", {}))


def test_query_output_is_cut_and_paged(roots, dataset):
    """Long values are cut to CELL characters, the rows to what fits in one answer, and the next page starts where
    the answer says; the dataset's own rows, each with a 1,000-character value."""
    server = build_server(roots[0], dataset=dataset)
    sql = ("SELECT f.id, r.range AS n, repeat('x', 1000) AS wide FROM findings f, range(100) r "
           "ORDER BY n, f.id")
    result = call(server, "query", {"sql": sql, "limit": 500})
    first, text = ok(result), content(result)
    assert all(len(row[2]) == CELL and row[2].endswith("…") for row in first["rows"])
    assert first["cells_cut"] == len(first["rows"]) and f"values cut to {CELL} characters" in first["text"]
    assert 0 < len(first["rows"]) < 500 and first["truncated"] and first["next_offset"] == len(first["rows"])
    assert text.endswith(f"call query again with offset={first['next_offset']}")
    assert len(json.dumps(result.structured_content)) < 2 * BUDGET  # the structured rows were cut with the text
    second = ok(call(server, "query", {"sql": sql, "limit": 500, "offset": first["next_offset"]}))
    assert second["offset"] == first["next_offset"] and second["rows"][0][:2] != first["rows"][-1][:2]
    whole = ok(call(server, "query", {"sql": f"SELECT id, n FROM ({sql}) t", "limit": 500}))["rows"]
    assert [r[:2] for r in first["rows"] + second["rows"]] == whole[:len(first["rows"]) + len(second["rows"])]


def test_a_runaway_query_is_stopped_by_the_time_limit(roots, dataset):
    server = build_server(roots[0], dataset=dataset, query_timeout_s=0.2)
    text = refused(call(server, "query", {"sql": "SELECT count(*) FROM findings f, range(100000000) a, "
                                                 "range(100000000) b WHERE (a.range * b.range) % 7 = 3"}))
    assert text.startswith("Error executing tool query: sql: stopped after 0.2 s, the time limit for a query: "
                           "make it cheaper"), text
    assert ok(call(server, "query", {"sql": "SELECT count(*) AS n FROM traces"}))["rows"] == [[1]]


def test_tables_name_the_columns_to_query(roots, dataset):
    server = build_server(roots[0], dataset=dataset)
    result = call(server, "tables", {})
    every, text = ok(result), content(result)
    by_name = {t["table"]: t for t in every["tables"]}
    assert {"traces", "findings", "steps"} <= set(by_name) and by_name["traces"]["rows"] == 1
    assert by_name["findings"]["rows"] == len(report_of(EXAMPLES / "item_sync")["findings"])
    assert "| findings |" in text and "call_site" in text
    one = ok(call(server, "tables", {"table": "findings"}))
    columns = {c["name"]: c for c in one["tables"][0]["columns"]}
    assert {"id", "title", "impact_us", "job", "rank"} <= set(columns) and columns["impact_us"]["type"] == "float64"
    names = ", ".join(columns)  # every column it lists can be selected
    assert ok(call(server, "query", {"sql": f"SELECT {names} FROM findings", "limit": 1}))["columns"] == list(columns)
    assert "'nope' is not a table of the dataset" in refused(call(server, "tables", {"table": "nope"}))


def test_list_runs_pages_what_does_not_fit(tmp_path):
    """A traces folder of 300 runs (hard links to one real capture): one answer holds what fits in BUDGET
    characters, and the pages cover every run once."""
    for n in range(300):
        (tmp_path / f"run-{n:03d}").mkdir()
        for name in ("rank0.trace.json.gz", "meta.json"):
            os.link(EXAMPLES / "item_sync" / name, tmp_path / f"run-{n:03d}" / name)
    server = build_server(tmp_path)
    seen, offset = [], 0
    while offset is not None:
        result = call(server, "list_runs", {"offset": offset, "limit": 500})
        out = ok(result)
        seen += [r["run"] for r in out["runs"]]
        if out["next_offset"] is not None:
            assert content(result).endswith(f"call list_runs again with offset={out['next_offset']}")
        offset = out["next_offset"]
    assert sorted(seen) == [f"run-{n:03d}" for n in range(300)] and len(seen) == 300


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


# ------------------------------------------------------------------------------------------------- HTTP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_http(traces, port: int, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`mcp --http PORT ARGS`, once it listens; and the line it printed at start."""
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", "mcp", "--traces", str(traces), "--http", str(port),
                             *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env or {k: v for k, v in os.environ.items() if k != TOKEN_ENV})
    banner = proc.stderr.readline()  # printed before it binds
    if not banner:
        proc.wait(timeout=60)
        pytest.fail(f"the server exited {proc.returncode}: {proc.stderr.read()[-500:]}")
    while True:  # until it listens, or it died
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, banner
        except OSError:
            try:  # a tenth of a second for it to start, or its exit status
                proc.wait(timeout=0.1)
                pytest.fail(f"the server exited {proc.returncode}: {proc.stderr.read()[-500:]}")
            except subprocess.TimeoutExpired:
                pass


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)
    proc.stderr.close()


def post(port: int, headers: dict) -> int:
    """The status of an initialize request to /mcp with these headers."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body.encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def list_one(url: str, headers: dict | None = None) -> dict:
    async def go():
        transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
        async with Client(transport) as session:
            return await session.call_tool("list_runs", {"limit": 1})
    return ok(asyncio.run(go()))


def test_streamable_http_on_loopback(roots):
    """`--http PORT`: the same tools over streamable HTTP on 127.0.0.1, no token asked; a page elsewhere whose
    name resolves here (DNS rebinding) is refused by its Host and Origin."""
    port = free_port()
    proc, banner = serve_http(roots[0], port)
    try:
        assert banner.strip().startswith(f"gpu-idle-analyzer MCP server: http://127.0.0.1:{port}/mcp "
                                         "(streamable HTTP; no token (loopback only);")
        out = list_one(f"http://127.0.0.1:{port}/mcp")
        assert len(out["runs"]) == 1 and out["total"] >= 3
        assert post(port, {"Host": f"evil.example:{port}"}) == 421
        assert post(port, {"Origin": "http://evil.example"}) == 403
        assert post(port, {}) == 200
    finally:
        stop(proc)


def test_streamable_http_off_loopback_needs_a_token(roots, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    started = subprocess.run([sys.executable, "-m", "analyzer", "mcp", "--traces", str(roots[0]), "--http",
                              str(port), "--host", "0.0.0.0", "--allow-capture"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 2 and started.stderr.startswith(
        "error: --host 0.0.0.0: reachable from other machines, so a bearer token is required")
    short = tmp_path / "token"
    short.write_text("abc\n")
    started = subprocess.run([sys.executable, "-m", "analyzer", "mcp", "--traces", str(roots[0]), "--http",
                              str(port), "--token-file", str(short)], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
    assert started.returncode == 2 and "the token is 3 characters; use 16 or more" in started.stderr

    proc, banner = serve_http(roots[0], port, "--host", "0.0.0.0", env={**env, TOKEN_ENV: TOKEN})
    try:
        assert f":{port}/mcp (streamable HTTP; clients send 'Authorization: Bearer <token>' (the token from " \
               f"${TOKEN_ENV})" in banner and TOKEN not in banner
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert post(port, {}) == 401  # no token
        assert post(port, {"Authorization": "Bearer not-the-token-at-all"}) == 401
        assert post(port, {**bearer, "Host": f"evil.example:{port}"}) == 421  # bound to 0.0.0.0, checked still
        assert post(port, {**bearer, "Origin": "http://evil.example"}) == 403
        assert post(port, bearer) == 200
        out = list_one(f"http://127.0.0.1:{port}/mcp", bearer)
        assert len(out["runs"]) == 1
    finally:
        stop(proc)

    token_file = tmp_path / "token-file"
    token_file.write_text(TOKEN + "\n")
    proc, banner = serve_http(roots[0], port, "--host", "0.0.0.0", "--token-file", str(token_file),
                              "--allow-host", "mcp.example", env=env)
    try:
        assert f"(the token from --token-file {token_file})" in banner and f"mcp.example:{port}" in banner
        assert post(port, {"Authorization": f"Bearer {TOKEN}", "Host": "mcp.example"}) == 200
        assert post(port, {"Authorization": f"Bearer {TOKEN}", "Host": f"mcp.example:{port}"}) == 200
    finally:
        stop(proc)
