"""The validity section in words, shared by report.md, report.html, the CLI and the dashboard: what the trace can
and cannot show, before any finding."""
from __future__ import annotations

MARK = {"fail": "FAILED", "warn": "warning", "ok": "ok"}


def validity_items(report: dict) -> list[tuple[str, str, str]]:
    """(status, check name, what it means) for each check that did not pass, failures first."""
    checks = (report.get("validity") or {}).get("checks") or []
    bad = [c for c in checks if c.get("status") in ("fail", "warn")]
    bad.sort(key=lambda c: c["status"] != "fail")
    return [(c["status"], c["name"], _with_examples(c)) for c in bad]


def _with_examples(check: dict) -> str:
    text = check.get("meaning") or ""
    examples = (check.get("measured") or {}).get("examples") or []
    if not examples:
        return text
    by_site: dict[tuple, list[str]] = {}
    for e in examples:
        by_site.setdefault((e["api"], e.get("call_site")), []).append(f"{e['after_first_gpu_work_ms']:g}")
    shown = "; ".join(f"{api} at {', '.join(times)} ms after the first recorded GPU work"
                      + (f", from {site}" if site else "")
                      for (api, site), times in by_site.items())
    more = check["measured"].get("without_gpu_work", len(examples)) - len(examples)
    return text + f" (the calls: {shown}{f'; {more} more' if more > 0 else ''})"


def validity_line(report: dict) -> str | None:
    """One sentence: all passed, or how many failed / warned (the items follow it)."""
    v = report.get("validity") or {}
    checks = v.get("checks") or []
    if not checks:
        return None
    failed, warned = v.get("failed") or [], v.get("warned") or []
    if not failed and not warned:
        return (f"Trace checks: all {len(checks)} passed ({', '.join(c['name'].replace('_', ' ') for c in checks)}).")
    parts = [f"{len(failed)} failed" if failed else "", f"{len(warned)} warned" if warned else ""]
    lowered = "; findings they touch are marked with a lower confidence" + (
        " and a failed check's findings say so in their title" if failed else "")
    return f"Trace checks: {' and '.join(p for p in parts if p)} of {len(checks)}{lowered}."
