"""`python -m dashboard [--traces DIR] [--host 127.0.0.1] [--port 8050]`: the Dash app over a folder of runs.

Pages: `/` the run list, `/run/<run id>` one run, `/diff?before=<id>&after=<id>` two runs compared, `/job/<folder>`
the job report of an `analyze-many` dataset folder under DIR (ranks, stragglers, the ranks x steps heatmap). All state
lives in the URL and the server's caches (RunStore), so several tabs work side by side; `/_cache` says (as JSON)
how much those caches hold against --cache-mb.
"""
from __future__ import annotations

import argparse
import ipaddress
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qs, unquote

import dash
from dash import Input, Output, dcc, html

from dashboard import downloads, plotly_lite
from dashboard.pages import diff, job, run, runlist
from dashboard.pages.common import clipped, error_card
from analyzer.api import RunStore

ASSETS = Path(__file__).resolve().parent / "assets"
LOADING_TEXT = "Loading… a run opened for the first time is analyzed now (seconds); its report is then cached."


def create_app(traces_dir: Path, timeline_cache_bytes: int = 1 << 30) -> dash.Dash:
    store = RunStore(Path(traces_dir), timeline_cache_bytes)
    app = dash.Dash(__name__, title="GPU idle dashboard", update_title=None, assets_folder=str(ASSETS),
                    suppress_callback_exceptions=True)
    app.layout = html.Div([
        dcc.Location(id="url", refresh="callback-nav"),  # pages write their state into the URL without a reload
        html.Nav([dcc.Link("GPU idle dashboard", href="/", className="brand"),
                  dcc.Link("Runs", href="/"), dcc.Link("Compare two runs", href="/diff"),
                  html.Span(f"runs under {store.root}", className="nav-dir")], className="nav"),
        dcc.Loading(html.Main(id="page"), target_components={"page": "children"}, delay_show=150,
                    custom_spinner=html.Div([html.Div(className="spinner"), html.P(LOADING_TEXT)],
                                            className="loading-card")),
    ])

    @app.callback(Output("page", "children"), Input("url", "pathname"), Input("url", "search"))
    def route(pathname, search):
        path = unquote(pathname or "/")
        query = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items()}
        if path in ("/", ""):
            return runlist.layout(store)
        if path.startswith("/run/"):
            return run.layout(store, path[len("/run/"):], query)
        if path.startswith("/job/"):
            return job.layout(store, path[len("/job/"):].rstrip("/"))
        if path.rstrip("/") == "/diff":
            return diff.layout(store, query.get("before"), query.get("after"))
        return error_card(f"{clipped(path)}: no such page", back=True)

    runlist.register(app, store)
    run.register(app, store)
    diff.register(app, store)
    job.register(app, store)
    downloads.register(app.server, store)
    app.server.add_url_rule("/_cache", "cache_stats", store.cache_stats)
    app.server.add_url_rule("/_plotly-lite.js", "plotly_lite", serve_plotly_lite)
    threading.Thread(target=plotly_lite.served, daemon=True).start()  # ready before the first page asks for it
    return app


def serve_plotly_lite():
    """plotly.js without the trace types the dashboard never draws (dashboard/plotly_lite.py); revalidated by ETag
    on each page load, so a plotly upgrade is picked up at once."""
    from flask import Response, request
    body, etag = plotly_lite.served()
    response = Response(body, mimetype="application/javascript", headers={"Cache-Control": "no-cache"})
    response.set_etag(etag)
    return response.make_conditional(request)


def exposure_warning(host: str, traces_dir: Path) -> str | None:
    """A warning when the server listens beyond this machine (anything but a loopback address)."""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost"
    if local:
        return None
    return (f"warning: listening on {host}: the traces and reports under {traces_dir.resolve()} will be readable by "
            f"anyone who can reach this port")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="traces", help="folder of run folders (default: traces)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this "
                                                             "machine only)")
    parser.add_argument("--port", type=int, default=8050, help="port (default: 8050)")
    parser.add_argument("--cache-mb", type=int, default=1024,
                        help="memory in MB for loaded traces kept between requests, least recently used dropped first "
                             "(default: 1024)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `python -m analyzer dashboard -- --port N` passes the separator along
        argv = argv[1:]
    args = parser.parse_args(argv)
    traces = Path(args.traces)
    if not traces.is_dir():
        print(f"error: {traces}: no such folder of runs", file=sys.stderr)
        return 2
    warning = exposure_warning(args.host, traces)
    if warning:
        print(warning, file=sys.stderr)
    app = create_app(traces, args.cache_mb << 20)
    print(f"dashboard: http://{args.host}:{args.port}/ (runs under {traces.resolve()})", file=sys.stderr)
    app.run(host=args.host, port=args.port, debug=False)
    return 0
