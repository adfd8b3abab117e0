"""CI gates over a diff (`diff --fail-on`) or one report (`check`): each rule passes or fails with a one-line reason,
and the results can be written as JUnit XML or GitHub Actions annotations so that CI shows each failed rule."""
from __future__ import annotations

import dataclasses
import re
from xml.sax.saxutils import escape, quoteattr

from analyzer.errors import UsageError
from analyzer.units import fmt_pct, fmt_us

SEVERITY_RANK = {"high": 3, "medium": 2, "low": 1, "info": 0}
DIFF_RULES = ("new-finding", "util-drop", "step-time")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


@dataclasses.dataclass(frozen=True)
class RuleResult:
    rule: str
    passed: bool
    reason: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.rule}: {self.reason}"


def percent(text: str, what: str) -> float:
    """'5%' -> 0.05; anything else is a one-line usage error naming the value."""
    m = _PERCENT.match(text.strip())
    if not m:
        raise UsageError(f"{what}: {text!r} is not a percentage like 5%")
    return float(m.group(1)) / 100


def parse_fail_on(text: str) -> list[tuple[str, str | None]]:
    """`new-finding,util-drop=5%,step-time=10%` -> [(name, value)], checked against the known rules."""
    rules = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in DIFF_RULES:
            raise UsageError(f"--fail-on: unknown rule {name!r} (known: {', '.join(DIFF_RULES)})")
        if name == "new-finding":
            if value and value not in SEVERITY_RANK:
                raise UsageError(f"--fail-on: new-finding={value!r}: the least severity is one of "
                                 f"{', '.join(SEVERITY_RANK)}")
        elif not value:
            raise UsageError(f"--fail-on: {name} needs a threshold, e.g. {name}=5%")
        else:
            percent(value, f"--fail-on {name}")
        rules.append((name, value or None))
    if not rules:
        raise UsageError("--fail-on: no rule given")
    return rules


def diff_gate(d: dict, rules: list[tuple[str, str | None]]) -> list[RuleResult]:
    out = []
    for name, value in rules:
        if name == "new-finding":
            out.append(_new_finding(d, value or "info"))
        elif name == "util-drop":
            out.append(_util_drop(d, percent(value, "util-drop")))
        else:
            out.append(_step_time(d, percent(value, "step-time")))
    return out


def _new_finding(d: dict, least: str) -> RuleResult:
    rule = "new-finding" + ("" if least == "info" else f" (severity {least} or above)")
    new = [f for f in d["findings"] if f["status"] == "new" and not f.get("child")
           and SEVERITY_RANK.get(f.get("severity_after") or "info", 0) >= SEVERITY_RANK[least]]
    if not new:
        return RuleResult(rule, True, "no new finding")
    worst = max(new, key=lambda f: f["impact_after_us"] or 0)
    more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
    return RuleResult(rule, False, f"new {worst['severity_after']} finding: {worst['title_after']} "
                                   f"({fmt_us(worst['impact_after_us'])} of GPU idle){more}")


def _util_drop(d: dict, limit: float) -> RuleResult:
    rule = f"util-drop (at most {limit * 100:g} points)"
    u = d["summary"]["gpu_utilization"]
    if u["before"] is None or u["after"] is None:
        return RuleResult(rule, False, "GPU utilization is unknown in "
                                       + ("both runs" if u["before"] is None and u["after"] is None else
                                          "the run before" if u["before"] is None else "the run after"))
    drop = u["before"] - u["after"]
    text = f"GPU utilization {fmt_pct(u['before'])} -> {fmt_pct(u['after'])} ({-drop * 100:+.1f} points)"
    return RuleResult(rule, drop <= limit + 1e-12, text)


def _step_time(d: dict, limit: float) -> RuleResult:
    """The unprofiled step p50 (the capture's timing), else the median profiled step from the traces."""
    rule = f"step-time (at most +{limit * 100:g}%)"
    for key, label in ((d["summary"]["step_unprofiled_p50_us"], "unprofiled step p50"),
                       (d["per_step_median"].get("wall_us") or {}, "median profiled step")):
        before, after = key.get("before"), key.get("after")
        if before and after is not None:
            growth = after / before - 1
            text = f"{label} {fmt_us(before)} -> {fmt_us(after)} ({growth * 100:+.1f}%)"
            return RuleResult(rule, growth <= limit + 1e-12, text)
    return RuleResult(rule, False, "no step time in both runs (no meta.json timing and no steps in the traces)")


def check_gate(report: dict, max_idle_share: float | None, no_kinds: list[str]) -> list[RuleResult]:
    out = []
    s = report["summary"]
    if max_idle_share is not None:
        rule = f"max-idle-share ({max_idle_share * 100:g}%)"
        if s.get("gpu_utilization") is None:
            out.append(RuleResult(rule, False, "no GPU activity in this trace: idle share unknown"))
        else:
            idle = s["gpu_idle_us"] / s["window_us"] if s["window_us"] else 0.0
            out.append(RuleResult(rule, idle <= max_idle_share + 1e-12,
                                  f"GPU idle {fmt_pct(idle)} of the window ({fmt_us(s['gpu_idle_us'])} of "
                                  f"{fmt_us(s['window_us'])})"))
    for kind in no_kinds:
        found = [f for f in report["findings"] if f["kind"] == kind and not f.get("parent")]
        rule = f"no-finding-kind {kind}"
        if not found:
            out.append(RuleResult(rule, True, f"no {kind} finding"))
        else:
            top = found[0]
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            site = top.get("call_site")
            where = f" at {site}" if site and site not in top["title"] else ""
            out.append(RuleResult(rule, False, f"{top['title']}{where} ({fmt_us(top['impact_us'])} of GPU idle)"
                                               f"{more}"))
    if not out:
        raise UsageError("check: no rule given (--max-idle-share, --no-finding-kind)")
    return out


def junit_xml(suite: str, results: list[RuleResult]) -> str:
    failures = sum(not r.passed for r in results)
    cases = []
    for r in results:
        body = "" if r.passed else f"<failure message={quoteattr(r.reason)}>{escape(r.reason)}</failure>"
        cases.append(f'  <testcase classname={quoteattr("gpu-idle-analyzer." + suite)} name={quoteattr(r.rule)}>'
                     f"{body}</testcase>")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name={quoteattr("gpu-idle-analyzer " + suite)} '
            f'tests="{len(results)}" failures="{failures}" errors="0">\n' + "\n".join(cases) + "\n</testsuite>\n")


def github_annotations(results: list[RuleResult]) -> str:
    """GitHub Actions workflow commands: an error per failed rule (data escaped as the runner requires)."""
    def data(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def prop(text: str) -> str:
        return data(text).replace(":", "%3A").replace(",", "%2C")

    return "".join(f"::error title={prop('gpu-idle-analyzer ' + r.rule)}::{data(r.reason)}\n"
                   for r in results if not r.passed)
