"""`python -m analyzer mcp`: a Model Context Protocol server (the official `mcp` SDK's MCPServer) over the runs under
a traces folder, their reports and diffs, and an analyze-many dataset.

Tools answer with structured content (the dicts of analyzer.mcp.answers) and a one-line text; a bad argument is a
tool error whose one line names the argument, and the server keeps serving. Resources: each run's report.md.
Prompts: diagnose a run, and did my fix work.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Annotated, Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from analyzer import __version__
from analyzer.mcp import answers, shapes
from analyzer.mcp.answers import BadArgument, Roots

INSTRUCTIONS = (
    "Why a PyTorch inference workload leaves the GPU idle, from torch.profiler traces. list_runs names the runs; "
    "analyze gives a run's GPU utilization, trace checks and findings ranked by what their fix saves (ms per step, "
    "replayed in the unprofiled run); finding explains one (call site, Python frames, source, advice); compare "
    "says whether a change worked (measured step change against its noise, and what the fixed findings predicted); "
    "query runs read-only SQL over an analyze-many dataset; capture (when allowed) profiles a workload YAML.")
LOG = logging.getLogger("analyzer.mcp")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


def _result(answer: Callable[[], dict]) -> CallToolResult:
    """The answer as structured content plus its one-line text; a refused argument, or anything that went wrong
    inside, as a one-line tool error, and the server keeps serving (a bug's traceback goes to the server's log on
    stderr, never to the client)."""
    try:
        out = answer()
    except BadArgument as exc:
        raise ToolError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - one line for the assistant, whatever broke
        LOG.warning("internal error", exc_info=True)
        raise ToolError(" ".join(f"internal error: {exc.__class__.__name__}: {exc}".split())) from None
    return CallToolResult(content=[TextContent(type="text", text=out["text"])], structured_content=out)


# pydantic's report of arguments that fail the tool's input schema: per error, the argument, then its message
_INVALID = re.compile(r"^(?P<arg>[^\s][^\n]*)\n  (?P<msg>.+?) \[type=[^,\]]+(?:, input_value=(?P<value>.*?), "
                      r"input_type=\w+)?\]", re.M)


def one_line_error(text: str) -> str:
    """A tool error on one line; an argument the input schema refused named first, as our own refusals are."""
    head, _, rest = text.partition(": ")
    if " validation error" in rest:
        found = [f"{m['arg']}: {m['msg']}" + (f" (given {m['value']})" if m["value"] and m["msg"] != "Field required"
                                              else "") for m in _INVALID.finditer(rest)]
        if found:
            text = f"{head}: " + "; ".join(found)
    return " ".join(text.split())


async def one_line_tool_errors(ctx, call_next):
    """Middleware: every tool error reaches the client on one line (the SDK passes pydantic's multi-line report
    of a refused argument through as it is)."""
    result = await call_next(ctx)
    if ctx.method == "tools/call" and isinstance(result, CallToolResult) and result.is_error:
        for block in result.content:
            if isinstance(block, TextContent):
                block.text = one_line_error(block.text)
    elif ctx.method == "tools/call" and isinstance(result, dict) and result.get("isError"):
        for block in result.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "text":
                block["text"] = one_line_error(block["text"])
    return result


def build_server(traces: Path, dataset: Path | None = None, allow_capture: bool = False) -> MCPServer:
    roots = Roots(traces, dataset, allow_capture)
    server = MCPServer("gpu-idle-analyzer", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING",
                       middleware=[one_line_tool_errors])

    @server.tool(annotations=READ_ONLY)
    def list_runs(offset: int = 0, limit: int = answers.PAGE) -> Annotated[CallToolResult, shapes.RunList]:
        """The runs under the traces folder, newest first: workload, device, GPU utilization, and the finding
        whose fix saves the most, from the reports already analyzed (a run not analyzed yet says so)."""
        return _result(lambda: answers.list_runs(roots, offset, limit))

    @server.tool(annotations=READ_ONLY)
    def analyze(run: str, offset: int = 0, limit: int = answers.PAGE) -> Annotated[CallToolResult, shapes.Analysis]:
        """A run (its id from list_runs, or the path of its folder or trace under the traces folder): summary,
        trace checks that warn or fail, and top-level findings ranked by what fixing them saves, with confidence.
        Analyzes the trace on first use; later calls read the report back."""
        return _result(lambda: answers.analyze(roots, run, offset, limit))

    @server.tool(annotations=READ_ONLY)
    def finding(run: str, finding_id: str) -> Annotated[CallToolResult, shapes.FindingFull]:
        """One finding of a run in full: call site, Python frames, source lines, advice, what its fix buys, the
        findings that refine it, and its first occurrences."""
        return _result(lambda: answers.finding(roots, run, finding_id))

    @server.tool(annotations=READ_ONLY)
    def compare(before: str, after: str) -> Annotated[CallToolResult, shapes.Comparison]:
        """Did the change work: two runs (before, after) compared: the verdict, the measured step change and its
        noise, and each fixed finding's predicted saving beside it."""
        return _result(lambda: answers.compare(roots, before, after))

    @server.tool(annotations=READ_ONLY)
    def query(sql: str, limit: int = 100) -> Annotated[CallToolResult, shapes.QueryResult]:
        """Read-only SQL (one SELECT; DuckDB) over the analyze-many dataset given at start (tables as in
        docs/fleet.md: traces, findings, steps, ...), at most `limit` rows."""
        return _result(lambda: answers.query(roots, sql, limit))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                             open_world_hint=False))
    def capture(workload: str, overrides: list[str] | None = None) -> Annotated[CallToolResult, shapes.Captured]:
        """Profile a workload YAML (under workloads/ or the traces folder) with `--set KEY=VALUE` overrides into a
        new run under the traces folder. Runs the workload's code: refused unless the server was started with
        --allow-capture."""
        return _result(lambda: answers.capture(roots, workload, overrides))

    @server.resource("gpu-idle://run/{+run}/report.md", mime_type="text/markdown",
                     description="A run's report.md (analyzed on first use)")
    def report_md(run: str) -> str:
        try:
            found = answers.resolve_run(roots, run)
            answers.report_of(roots, found)
            return roots.store.report_text(found, "report.md")
        except BadArgument as exc:
            raise ValueError(str(exc)) from None

    @server.prompt(description="Diagnose why a run leaves the GPU idle")
    def diagnose(run: str) -> str:
        return (f"Call analyze with run={json.dumps(run)}. Explain, for an ML-systems engineer, where the GPU's idle "
                "time goes (the idle partition), which trace checks warn or fail and what they mean for trusting "
                "the numbers, then the top findings by saving: for each, call finding, quote its call site and "
                "source line, and say what the fix is and what it buys per step.")

    @server.prompt(description="Did my fix work? Compare a run before and after a change")
    def did_my_fix_work(before: str, after: str) -> str:
        return (f"Call compare with before={json.dumps(before)} and after={json.dumps(after)}. Say whether the step "
                "time changed by more than the noise, whether the fixed findings' predicted savings explain the "
                "change, and which findings are new; if it is unclear, say which capture settings would settle it.")

    return server


def run(traces: Path, dataset: Path | None, allow_capture: bool, http_port: int | None, host: str) -> None:
    server = build_server(traces, dataset, allow_capture)
    if http_port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=http_port)
