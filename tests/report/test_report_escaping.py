"""Reports that survive pasting: an H200 run whose step label holds an HTML tag, a table pipe and a backtick
(tests/workloads/hostile_names.py). report.md and diff.md, rendered by a CommonMark + GFM-table renderer as GitHub
renders them, show the name as text: no element comes from it, and every table keeps its columns."""
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from analyzer import api

FIX = Path(__file__).resolve().parents[1] / "fixtures"
HOSTILE = FIX / "h200_extra" / "hostile_names"
LABEL = "decode_<img src=x onerror=alert(1)>|`step"


class Elements(HTMLParser):
    """Tags and the cell count of every table row of rendered HTML."""

    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1

    def handle_data(self, data):
        self.text.append(data)


def render(markdown: str) -> Elements:
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    parsed = Elements()
    parsed.feed(html)
    return parsed


@pytest.fixture(scope="module")
def hostile():
    return api.analyze(api.load(HOSTILE, cache=False)).report


def test_the_label_reached_the_report(hostile):
    steps = [s["step"] for s in hostile["gaps"]["per_step"]]
    assert [s for s in steps if s != "prefill"] == [f"{LABEL}#{k}" for k in range(4)]


@pytest.mark.parametrize("kind", ["report", "diff"])
def test_markdown_renders_the_names_as_text(hostile, kind):
    if kind == "report":
        text = api.render(hostile)["report.md"]
    else:
        plain = api.analyze(api.load(FIX / "h200" / "item_sync", cache=False)).report
        text = api.render_diff_markdown(api.compare(LABEL, plain, LABEL, hostile))
    page = render(text)
    assert "img" not in page.tags and "script" not in page.tags
    assert LABEL in "".join(page.text)  # shown, character for character
    # every Markdown table row became one rendered row: no name split a row or ended a table
    assert len(page.rows) == sum(ln.startswith("|") and not ln.startswith("|---") for ln in text.splitlines())


def test_every_table_row_keeps_its_header_width(hostile):
    text = api.render(hostile)["report.md"]
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    for table in html.split("<table>")[1:]:
        body = table.split("</table>")[0]
        parsed = Elements()
        parsed.feed("<table>" + body)
        assert len(set(parsed.rows)) == 1, parsed.rows
