"""plotly.js for the dashboard's pages without the trace types they never draw.

The installed bundle (plotly's package_data/plotly.min.js, 4.8 MB) registers all of its ~47 trace types as it loads
(3D, maps, geo, WebGL, ...), and building them is most of the 1-2 s that loading it takes on a small machine, on
every page load, before the first graph can be drawn. The dashboard draws scatter (part of plotly's core), bar and
heatmap only: `lite_bundle` is the same file with every other trace type left out of that one register call, so
their modules are never initialised (plotly's bundle initialises each module on first use). It is made from the
installed plotly at first use and served at /_plotly-lite.js; a bundle laid out otherwise (another plotly release)
is served whole, unchanged.
"""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

import plotly

KEEP = ("bar", "heatmap")  # every trace type dashboard.figures makes, besides scatter
FULL = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
_REGISTER = re.compile(r"\.register\(\[((?:[A-Za-z0-9_$]+\(\),)*[A-Za-z0-9_$]+\(\))\]\)")
_CALL = re.compile(r"=([A-Za-z0-9_$]+)\(\)")
_TRACE_NAME = re.compile(r'moduleType:"trace",name:"([a-z0-9]+)"')


def _definition(text: str, name: str) -> str | None:
    """The text of the bundle's lazy module `var NAME=W(...)`, up to the next module's definition."""
    start = text.find(f"var {name}=W(")
    if start < 0:
        return None
    end = text.find("});var ", start)
    return text[start:end if end > 0 else len(text)]


def _trace_name(text: str, factory: str, hops: int = 3) -> str | None:
    """The trace type a register entry stands for: its module re-exports (sometimes after adding to it) the module
    that says moduleType "trace" and its name; None for anything else (a component such as calendars)."""
    module = _definition(text, factory) or ""
    found = _TRACE_NAME.search(module)
    if found:
        return found.group(1)
    first = _CALL.search(module.partition('"use strict";')[2])
    return _trace_name(text, first.group(1), hops - 1) if first and hops > 0 else None


def lite_bundle(text: str, keep: tuple[str, ...] = KEEP) -> str | None:
    """The bundle with only the `keep` trace types registered (entries that are not trace types stay), or None
    when its register call or any of `keep` cannot be found."""
    calls = list(_REGISTER.finditer(text))
    if len(calls) != 1:
        return None
    call = calls[0]
    entries = call.group(1).split(",")
    names = [_trace_name(text, entry[:-2]) for entry in entries]
    if not set(keep) <= set(names) or sum(n is not None for n in names) < len(entries) // 2:
        return None
    kept = [e for e, n in zip(entries, names) if n is None or n in keep]
    return text[:call.start(1)] + ",".join(kept) + text[call.end(1):]


@functools.lru_cache(maxsize=1)
def served() -> tuple[bytes, str]:
    """(the bundle to serve, its ETag): the lite bundle, else the full one."""
    text = FULL.read_text(encoding="utf-8")
    body = (lite_bundle(text) or text).encode("utf-8")
    return body, hashlib.sha1(body).hexdigest()
