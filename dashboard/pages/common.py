"""Small pieces the pages share: links by run id, badges, error cards, the copy-as-Markdown block."""
from __future__ import annotations

from urllib.parse import quote

from dash import dcc, html

from analyzer.report.palette import BUSY_COLOR, CAUSE_COLORS, SEVERITY_COLORS
from analyzer.units import fmt_pct, fmt_us


MESSAGE_VALUE_CHARS = 100  # a value quoted back in a message (a link's query, a path) is cut to this many


def clipped(text: str, limit: int = MESSAGE_VALUE_CHARS) -> str:
    """`text` as a message quotes it: whole up to `limit` characters, else its start and how long it was (a
    20,000-character query pasted into a link is not printed back whole)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def quoted(value) -> str:
    """repr() of a value from a URL, clipped."""
    return clipped(repr(value))


def run_href(run_id: str) -> str:
    return "/run/" + quote(run_id, safe="/")


def download_href(run_id: str, name: str) -> str:
    return f"/download/{quote(run_id, safe='/')}/{name}"


def badge(text: str, color: str, **kwargs) -> html.Span:
    return html.Span(text, className="badge", style={"--c": color}, **kwargs)


def severity_badge(severity: str | None) -> html.Span:
    return badge(severity or "–", SEVERITY_COLORS.get(severity, "#999999"))


def cause_badge(cause: str, text: str | None = None) -> html.Span:
    return badge(text or cause, CAUSE_COLORS.get(cause, "#999999"))


def window_parts(busy_us: float | None, idle_by_cause: dict[str, float]) -> list[tuple[str, float, str]]:
    """(name, µs, colour) of the profiled window's parts: GPU busy, then idle by cause (the report's order)."""
    parts = [("busy", busy_us or 0.0, BUSY_COLOR)]
    parts += [(f"idle: {c}", us, CAUSE_COLORS.get(c, "#999999")) for c, us in idle_by_cause.items()]
    return [(name, float(us), color) for name, us, color in parts if us and us > 0]


def window_bar(busy_us: float | None, idle_by_cause: dict[str, float], window_us: float | None,
               className: str = "window-bar") -> html.Div | str:
    """The profiled window as one bar: GPU busy, then idle by cause, each part as wide as its share of the window
    (hover: each part's time and share)."""
    parts = window_parts(busy_us, idle_by_cause)
    total = window_us or sum(us for _, us, _ in parts)
    if not total or not parts:
        return "–"
    title = "\n".join(f"{name}: {fmt_us(us)} ({fmt_pct(us / total)})" for name, us, _ in parts)
    return html.Div([html.Span(className="seg", title=f"{name}: {fmt_us(us)} ({fmt_pct(us / total)})",
                               style={"width": f"{100 * us / total:.3f}%", "background": color},
                               **{"data-part": name, "data-us": f"{us:.3f}"})
                     for name, us, color in parts], className=className, title=title)


def error_card(message: str, title: str = "Cannot show this", back: bool = False, **kwargs) -> html.Div:
    children = [html.B(title + ": "), html.Span(message, className="error-message")]
    if back:
        children += [" ", dcc.Link("back to the run list", href="/")]
    return html.Div(children, className="error-card", role="alert", **kwargs)


def markdown_block(text: str, element_id: str, what: str) -> html.Div:
    """A copy button for the Markdown text (for pasting into a GitHub issue), and the text itself folded."""
    return html.Div([
        # the text itself, not the folded element's (a closed <details> has no rendered text to copy)
        html.Div([dcc.Clipboard(content=text, id=f"{element_id}-copy", title="copy to the clipboard",
                                className="clipboard"),
                  html.Span(f"Copy {what} as Markdown, for pasting into a GitHub issue")], className="copy-row"),
        html.Details([html.Summary("show the Markdown"), html.Pre(text, id=element_id, className="markdown")]),
    ], className="markdown-block")


# Only x-axis changes go to the server. Plotly's autosize relayout after the first draw (and on window resizes)
# would otherwise be a second request for the figure, and Dash drops the answer to an earlier one: a zoom made just
# before it would be lost. A clientside callback from a graph's relayoutData into a Store, which the server reads.
X_AXIS_RELAYOUT_JS = """function(relayout) {
    const keys = Object.keys(relayout || {});
    return keys.some(k => k.startsWith('xaxis')) ? relayout : window.dash_clientside.no_update;
}"""


def window_from_relayout(relayout: dict | None) -> tuple[float, float] | str | None:
    """(lo_ms, hi_ms) from a zoom or pan, "full" from a double-click, None for anything else (autosize)."""
    if not relayout:
        return None
    for key, value in relayout.items():
        if key.startswith("xaxis") and key.endswith(".range") and isinstance(value, list) and len(value) == 2:
            return float(value[0]), float(value[1])
    for key, value in relayout.items():
        if key.startswith("xaxis") and key.endswith(".range[0]"):
            other = relayout.get(key.replace("[0]", "[1]"))
            if other is not None:
                return float(value), float(other)
    if any(key.startswith("xaxis") and key.endswith(".autorange") for key in relayout):
        return "full"
    return None
