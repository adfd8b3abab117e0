"""`python -m analyzer mcp`: a Model Context Protocol server (the official `mcp` SDK's MCPServer) over the runs under
a traces folder, their reports and diffs, and an analyze-many dataset.

Tools answer with structured content (the dicts of analyzer.mcp.answers) and the same answer as text (clients that
pass only the text to the model), within analyzer.mcp.texts.BUDGET characters, paged beyond. Arguments are checked
strictly (types as declared, no unknown names); a bad one is a tool error whose one line names it, and the server
keeps serving. Resources: each run's report.md. Prompts: diagnose a run, and did my fix work. Over HTTP: a bearer
token for any address but loopback, and the Host/Origin checks against DNS rebinding always on.
"""
from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import sys
from pathlib import Path
from typing import Annotated, Callable

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from analyzer import __version__
from analyzer.errors import UsageError
from analyzer.mcp import answers, shapes
from analyzer.mcp.answers import BadArgument, Roots

INSTRUCTIONS = (
    "Why a PyTorch inference workload leaves the GPU idle, from torch.profiler traces. list_runs names the runs; "
    "analyze gives a run's GPU utilization, trace checks and findings ranked by what their fix saves (ms per step, "
    "replayed in the unprofiled run); finding explains one (call site, Python frames, source, advice); compare "
    "says whether a change worked (what else differs between the runs, then the measured step change against its "
    "noise, and what the fixed findings predicted); tables and query read an analyze-many dataset with read-only "
    "SQL; capture (when allowed) profiles a workload YAML. A long answer is paged: it says which offset to ask "
    "for next.")
LOG = logging.getLogger("analyzer.mcp")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
TOKEN_ENV = "GPU_IDLE_MCP_TOKEN"
ERROR_CHARS = 1000  # the longest error line a client gets

# the tools' arguments: strict (no "5" for 5, no true for 1), described in the published input schema
Run = Annotated[str, Field(strict=True, max_length=4096, description=(
    "a run: its id as list_runs gives it (e.g. 'item_sync'; a folder under the traces folder, plus '/<trace>' "
    "where a folder holds several traces), or the path of its folder or trace under the traces folder"))]
Offset = Annotated[int, Field(strict=True, ge=0, description=(
    "where the page starts (0: the first); an answer that left some out gives the next offset"))]


def _limit(what: str, default: int) -> object:
    return Annotated[int, Field(strict=True, ge=1, le=answers.MAX_PAGE,
                                description=f"at most this many {what} (default {default})")]


def _result(roots: Roots, answer: Callable[[], dict]) -> CallToolResult:
    """The answer as text (its `content`) and as structured content; a refused argument, or anything that went wrong
    inside, as a one-line tool error that names no folder of the server's, and the server keeps serving (a bug's
    traceback goes to the server's log on stderr, never to the client)."""
    try:
        out = answer()
    except BadArgument as exc:
        raise ToolError(roots.scrub(str(exc))) from None
    except Exception as exc:  # noqa: BLE001 - one line for the assistant, whatever broke
        LOG.warning("internal error", exc_info=True)
        raise ToolError(roots.scrub(" ".join(f"internal error: {exc.__class__.__name__}: {exc}".split()))) from None
    content = out.pop("content")
    return CallToolResult(content=[TextContent(type="text", text=content)], structured_content=out)


# pydantic's report of arguments that fail the tool's input schema: per error, the argument, then its message
_INVALID = re.compile(r"^(?P<arg>[^\s][^\n]*)\n  (?P<msg>.+?) \[type=[^,\]]+(?:, input_value=(?P<value>.*?), "
                      r"input_type=\w+)?\]", re.M)


def one_line_error(text: str) -> str:
    """A tool error on one line, at most ERROR_CHARS long; an argument the input schema refused named first, as
    our own refusals are, with what was given cut to answers.ECHO characters."""
    head, _, rest = text.partition(": ")
    if " validation error" in rest:
        found = [f"{m['arg']}: {m['msg']}" + (f" (given {_cut(m['value'])})"
                                              if m["value"] and m["msg"] != "Field required" else "")
                 for m in _INVALID.finditer(rest)]
        if found:
            text = f"{head}: " + "; ".join(found)
    text = " ".join(text.split())
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 1] + "…"


def _cut(value: str) -> str:
    return value if len(value) <= answers.ECHO else f"{value[:answers.ECHO]}… ({len(value):,} characters)"


def _is_error(result) -> bool:
    return isinstance(result, CallToolResult) and result.is_error or isinstance(result, dict) and result.get("isError")


def _text_blocks(result) -> list:
    """The text blocks of a tool result, whether the SDK hands it on as a model or as the wire's dict."""
    blocks = result.content if isinstance(result, CallToolResult) else result.get("content") or []
    return [b for b in blocks if isinstance(b, TextContent) or isinstance(b, dict) and b.get("type") == "text"]


def strict_arguments(server: MCPServer):
    """Middleware: a tool call that names an argument the tool does not take is refused on one line (the SDK
    ignores unknown names, so a misspelt `ofset` would silently read page one), every tool error reaches the client
    on one line (the SDK passes pydantic's multi-line report through as it is), and the published input schemas
    say that no other argument is taken."""
    known: dict[str, list[str]] = {}

    async def middleware(ctx, call_next):
        if ctx.method == "tools/call" and isinstance(ctx.params, dict):
            if not known:
                known.update({t.name: list(t.input_schema.get("properties") or {}) for t in await server.list_tools()})
            name, given = ctx.params.get("name"), ctx.params.get("arguments") or {}
            unknown = [k for k in given if k not in known.get(name, given)] if isinstance(given, dict) else []
            if unknown:
                return CallToolResult(is_error=True, content=[TextContent(type="text", text=one_line_error(
                    f"Error executing tool {name}: {_cut(unknown[0])}: not an argument of {name} (it takes: "
                    f"{', '.join(known[name]) or 'none'})"))])
        result = await call_next(ctx)
        if ctx.method == "tools/call" and _is_error(result):
            for block in _text_blocks(result):
                if isinstance(block, TextContent):
                    block.text = one_line_error(block.text)
                else:
                    block["text"] = one_line_error(block["text"])
        elif ctx.method == "tools/list":
            for tool in result.tools if hasattr(result, "tools") else result.get("tools") or []:
                schema = tool.input_schema if hasattr(tool, "input_schema") else tool.get("inputSchema")
                schema["additionalProperties"] = False
        return result
    return middleware


class BearerToken:
    """The SDK's TokenVerifier for one shared secret: the token the server was started with."""

    def __init__(self, token: str):
        self.token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self.token.encode()):
            return AccessToken(token=token, client_id="bearer", scopes=[])
        return None


def build_server(traces: Path, dataset: Path | None = None, allow_capture: bool = False,
                 query_timeout_s: float = answers.QUERY_TIMEOUT_S, token: str | None = None,
                 url: str = "http://127.0.0.1") -> MCPServer:
    """The server; with `token`, its HTTP transport takes only requests that bear it (`url`: where it is served)."""
    roots = Roots(traces, dataset, allow_capture, query_timeout_s)
    auth = dict(token_verifier=BearerToken(token), auth=AuthSettings(issuer_url=url, resource_server_url=None)) \
        if token else {}
    server = MCPServer("gpu-idle-analyzer", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING",
                       **auth)
    server.middleware.append(strict_arguments(server))

    @server.tool(annotations=READ_ONLY)
    def list_runs(offset: Offset = 0,
                  limit: _limit("runs", answers.PAGE) = answers.PAGE) -> Annotated[CallToolResult, shapes.RunList]:
        """The runs under the traces folder, newest first: workload, device, GPU utilization, and the finding
        whose fix saves the most, from the reports already analyzed (a run not analyzed yet says so)."""
        return _result(roots, lambda: answers.list_runs(roots, offset, limit))

    @server.tool(annotations=READ_ONLY)
    def analyze(run: Run, offset: Offset = 0, limit: _limit("top-level findings", answers.PAGE) = answers.PAGE
                ) -> Annotated[CallToolResult, shapes.Analysis]:
        """A run: summary, trace checks that warn or fail, and top-level findings ranked by what fixing them saves,
        with confidence, each with its id and its row (#) in report.md. Analyzes the trace on first use (kept in
        the server's memory: nothing is written into the traces folder); later calls read it back."""
        return _result(roots, lambda: answers.analyze(roots, run, offset, limit))

    @server.tool(annotations=READ_ONLY)
    def finding(run: Run, finding_id: Annotated[str, Field(strict=True, max_length=200, description=(
            "the finding: its id as analyze lists it (kind, then '.N' for the Nth of that kind, e.g. 'sync.0', "
            "'launch_overhead.1'), or its row number in report.md's findings table (e.g. '2', '1.1')"))]
                ) -> Annotated[CallToolResult, shapes.FindingFull]:
        """One finding of a run in full: call site, Python frames, source lines, advice, what its fix buys, the
        findings that refine it, and its first occurrences."""
        return _result(roots, lambda: answers.finding(roots, run, finding_id))

    @server.tool(annotations=READ_ONLY)
    def compare(before: Run, after: Run, offset: Annotated[int, Field(strict=True, ge=0, description=(
            "the line of the diff (diff.md) to start from, for the rest of a long one (0: the start)"))] = 0
                ) -> Annotated[CallToolResult, shapes.Comparison]:
        """Did the change work: two runs (before, after) compared. First what differs between them besides the
        change (device, workload, torch version, ...), then the verdict: the measured step change and its noise,
        and each fixed finding's predicted saving beside it; then the diff."""
        return _result(roots, lambda: answers.compare(roots, before, after, offset))

    @server.tool(annotations=READ_ONLY)
    def tables(table: Annotated[str | None, Field(strict=True, max_length=200, description=(
            "a table's name, for its columns with their types and meanings; left out: every table, its rows and "
            "its column names"))] = None) -> Annotated[CallToolResult, shapes.Tables]:
        """The tables of the analyze-many dataset given at start (--dataset), which `query` reads: their rows and
        columns."""
        return _result(roots, lambda: answers.tables(roots, table))

    @server.tool(annotations=READ_ONLY)
    def query(sql: Annotated[str, Field(strict=True, max_length=50_000, description=(
            "one SELECT (DuckDB SQL) over the dataset's tables (`tables` lists them and their columns)"))],
              limit: _limit("rows", answers.QUERY_ROWS) = answers.QUERY_ROWS, offset: Offset = 0
              ) -> Annotated[CallToolResult, shapes.QueryResult]:
        """Read-only SQL (one SELECT; DuckDB) over the analyze-many dataset given at start: at most `limit` rows
        from row `offset` (add an ORDER BY for stable pages), each value cut to 300 characters and the rows to what
        fits in one answer; a query that runs past the server's time limit is stopped."""
        return _result(roots, lambda: answers.query(roots, sql, limit, offset))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                             open_world_hint=False))
    def capture(workload: Annotated[str, Field(strict=True, max_length=4096, description=(
            "a workload YAML under workloads/ (e.g. 'workloads/tiny.yaml') or under the traces folder"))],
                overrides: Annotated[list[str] | None, Field(strict=True, max_length=100, description=(
                    "KEY=VALUE settings, as `capture --set` takes them (e.g. 'decode_steps=4')"))] = None
                ) -> Annotated[CallToolResult, shapes.Captured]:
        """Profile a workload YAML with `--set KEY=VALUE` overrides into a new run under the traces folder (it
        writes there). Runs the workload's code: refused unless the server was started with --allow-capture."""
        return _result(roots, lambda: answers.capture(roots, workload, overrides))

    @server.resource("gpu-idle://run/{+run}/report.md", mime_type="text/markdown",
                     description="A run's report.md (analyzed on first use, kept in the server's memory)")
    def report_md(run: str) -> str:
        try:
            found = answers.resolve_run(roots, run)
        except BadArgument as exc:
            raise ResourceNotFoundError(roots.scrub(str(exc))) from None
        try:
            answers.report_of(roots, found)
            return roots.store.report_text(found, "report.md")
        except BadArgument as exc:
            raise ResourceError(roots.scrub(str(exc))) from None

    def known_run(argument: str, value: str) -> None:
        """A prompt names a run that exists, or the client hears why not (the SDK would say only that the prompt
        failed)."""
        try:
            answers.resolve_run(roots, value, argument)
        except BadArgument as exc:
            raise MCPError(code=INVALID_PARAMS, message=roots.scrub(str(exc))) from None

    @server.prompt(description="Diagnose why a run leaves the GPU idle")
    def diagnose(run: str) -> str:
        known_run("run", run)
        return (f"Call analyze with run={json.dumps(run)}. Explain, for an ML-systems engineer, where the GPU's idle "
                "time goes (the idle partition), which trace checks warn or fail and what they mean for trusting "
                "the numbers, then the top findings by saving: for each, call finding, quote its call site and "
                "source line, and say what the fix is and what it buys per step.")

    @server.prompt(description="Did my fix work? Compare a run before and after a change")
    def did_my_fix_work(before: str, after: str) -> str:
        known_run("before", before)
        known_run("after", after)
        return (f"Call compare with before={json.dumps(before)} and after={json.dumps(after)}. First say what differs "
                "between the two runs besides the change (device, workload, torch version) and whether that makes "
                "the comparison unfair; then whether the step time changed by more than the noise, whether the "
                "fixed findings' predicted savings explain the change, and which findings are new; if it is "
                "unclear, say which capture settings would settle it.")

    return server


# ------------------------------------------------------------------------------------------------------- HTTP

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    address = _address(host)
    return host == "localhost" or address is not None and address.is_loopback


@dataclasses.dataclass
class HttpPlan:
    """How the HTTP server is reached and guarded: its URL, the token (None: none asked, loopback only), where the
    token came from, and the Host headers it answers (DNS rebinding: a page elsewhere that resolves its own name to
    this address gets 421)."""
    url: str
    token: str | None
    token_from: str | None
    security: TransportSecuritySettings

    def banner(self, allow_capture: bool) -> str:
        hosts = ", ".join(self.security.allowed_hosts)
        auth = (f"clients send 'Authorization: Bearer <token>' (the token from {self.token_from})" if self.token
                else "no token (loopback only)")
        return (f"gpu-idle-analyzer MCP server: {self.url} (streamable HTTP; {auth}; Host headers answered: {hosts}; "
                f"--allow-host adds one)" + ("; capture is on: clients can run workload code" if allow_capture else ""))


def http_plan(host: str, port: int, token_file: str | None = None, allow_hosts: list[str] | None = None,
              environ=os.environ) -> HttpPlan:
    """The URL, token and Host checks for `--http PORT --host HOST`. A token comes from --token-file or the
    GPU_IDLE_MCP_TOKEN variable; an address other than loopback is refused without one."""
    token, token_from = None, None
    if token_file:
        try:
            token, token_from = Path(token_file).read_text(encoding="utf-8").strip(), f"--token-file {token_file}"
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--token-file {token_file}: {getattr(exc, 'strerror', None) or exc}") from None
    elif environ.get(TOKEN_ENV, "").strip():
        token, token_from = environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    if token is not None and len(token) < 16:
        raise UsageError(f"{token_from}: the token is {len(token)} characters; use 16 or more (e.g. the output of "
                         "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    if token is None and not is_loopback(host):
        raise UsageError(f"--host {host}: reachable from other machines, so a bearer token is required: set "
                         f"{TOKEN_ENV} or give --token-file FILE (clients send 'Authorization: Bearer <token>')")
    address = _address(host)
    named = f"[{host.strip('[]')}]" if address is not None and address.version == 6 else host
    names = list(LOOPBACK_NAMES)
    if address is not None and address.is_unspecified:  # every address of this machine: its name too
        names.append(socket.gethostname())
        named = socket.gethostname()
    elif named not in names:
        names.append(named)
    hosts = [f"{name}:{port}" for name in names]
    for extra in allow_hosts or []:  # NAME alone: on this port, or with no port (behind a proxy on 80/443)
        hosts += [extra] if re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]+):(\d+|\*)", extra) else [extra, f"{extra}:{port}"]
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=[f"{s}://{h}" for h in hosts for s in ("http", "https")])
    return HttpPlan(f"http://{named}:{port}/mcp", token, token_from, security)


def run(traces: Path, dataset: Path | None, allow_capture: bool, http_port: int | None, host: str,
        token_file: str | None = None, allow_hosts: list[str] | None = None,
        query_timeout_s: float = answers.QUERY_TIMEOUT_S) -> None:
    if http_port is None:
        build_server(traces, dataset, allow_capture, query_timeout_s).run("stdio")
        return
    plan = http_plan(host, http_port, token_file, allow_hosts)
    server = build_server(traces, dataset, allow_capture, query_timeout_s, plan.token, plan.url)
    print(plan.banner(allow_capture), file=sys.stderr, flush=True)
    server.run("streamable-http", host=host.strip("[]"), port=http_port, transport_security=plan.security)
