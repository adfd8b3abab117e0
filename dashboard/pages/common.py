"""Small pieces the pages share: links by run id, badges, error cards, the copy-as-Markdown block."""
from __future__ import annotations

from urllib.parse import quote

from dash import dcc, html

from analyzer.report.palette import CAUSE_COLORS, SEVERITY_COLORS


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
