"""`/download/<run id>/{report.md,report.html,trace}`, `/download/<job folder>/job-report.{md,html}`, and a guard that refuses path tricks on every route.

A download names a run by id; the file is the one discovery found for that id (inside DIR), never a path the
client sent. The guard answers 403 to any request whose path has a `..` segment, a backslash, a NUL or an
encoded slash or an empty segment, before routing (Dash's catch-all would otherwise answer such URLs with the app page).
"""
from __future__ import annotations

import re
from urllib.parse import unquote

from flask import Flask, Response, abort, request, send_file

from analyzer.errors import UsageError
from analyzer.api import RunStore

REPORTS = {"report.md": "text/markdown; charset=utf-8", "report.html": "text/html; charset=utf-8"}
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c|00)", re.IGNORECASE)


def suspicious_path(raw_path: str) -> bool:
    if _ENCODED_SEPARATOR.search(raw_path):
        return True
    decoded = raw_path
    for _ in range(3):  # double and triple encoding
        decoded = unquote(decoded)
    return "\\" in decoded or "\x00" in decoded or "//" in decoded or ".." in decoded.split("/")


def download_name(run_id: str, name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id) + "-" + name


def register(server: Flask, store: RunStore) -> None:
    @server.before_request
    def refuse_path_tricks():
        raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or request.full_path
        if suspicious_path(raw.split("?", 1)[0]) or suspicious_path(request.path):
            abort(403)

    @server.route("/download/<path:spec>")
    def download(spec: str):
        run_id, _, name = spec.rpartition("/")
        if name.startswith("job-"):
            return _job_file(run_id, name.removeprefix("job-"))
        run = store.find(run_id)
        if run is None or (name != "trace" and name not in REPORTS):
            abort(404)
        if name == "trace":
            return send_file(run.trace, as_attachment=True, download_name=download_name(run_id, run.trace.name))
        try:
            text = store.report_text(run, name)
        except UsageError as exc:
            return Response(f"{exc}\n", status=422, mimetype="text/plain")
        return Response(text, mimetype=REPORTS[name],
                        headers={"Content-Disposition": f'attachment; filename="{download_name(run_id, name)}"'})

    def _job_file(folder: str, name: str):
        if name not in REPORTS:
            abort(404)
        try:
            text = store.job_report_text(folder, name)
        except UsageError:
            abort(404)
        return Response(text, mimetype=REPORTS[name], headers={
            "Content-Disposition": f'attachment; filename="{download_name(folder, "job-" + name)}"'})
