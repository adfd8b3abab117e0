"""plotly.js JSON as plotly.io writes it, without importing plotly: compact, float arrays as base64 typed arrays,
and plotly.js itself read from the installed package. Shared by report.html and the dashboard."""
from __future__ import annotations

import base64
import functools
import importlib.util
import json
from pathlib import Path

import numpy as np


def packed(values, dtype: str = "f8") -> dict:
    """A numpy array as plotly.js's base64 typed array (what plotly.py sends, without its validation cost)."""
    a = np.ascontiguousarray(values, dtype=np.float64 if dtype == "f8" else np.float32)
    out = {"dtype": dtype, "bdata": base64.b64encode(a.tobytes()).decode("ascii")}
    if a.ndim == 2:
        out["shape"] = f"{a.shape[0]}, {a.shape[1]}"
    return out


def plotly_json(value) -> str:
    """JSON as plotly.io writes it into a page: compact, NaN as null, float arrays as base64 typed arrays, and
    <, > and / escaped so that no string can end the <script>."""
    text = json.dumps(value, separators=(",", ":"), default=typed_array)
    if "NaN" in text or "Infinity" in text:
        text = json.dumps(json.loads(text, parse_constant=lambda _: None), separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("/", "\\u002f")


def typed_array(value):
    if isinstance(value, np.ndarray):
        if value.size and value.dtype == np.float64 and value.ndim == 1:
            return packed(value)
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def plotly_js() -> str:
    """plotly.min.js as plotly.offline.get_plotlyjs() returns it."""
    return plotly_file("package_data", "plotly.min.js")


@functools.lru_cache(maxsize=None)
def plotly_file(*parts: str) -> str:
    """A file of the installed plotly package, read without importing plotly (which costs more than the page)."""
    package = importlib.util.find_spec("plotly")
    return Path(package.submodule_search_locations[0], *parts).read_bytes().decode("utf-8")



def template(name: str) -> dict:
    """One of plotly's layout templates, as `template=name` puts it into a figure's JSON."""
    return json.loads(plotly_file("package_data", "templates", f"{name}.json"))
