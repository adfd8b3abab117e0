"""Markdown that survives pasting: strings from a trace (function, op and step names, file paths) can hold HTML tags,
`|`, backticks or newlines. Escaped here, none of them can break a table, open a code span, or put markup into the
GitHub issue the report is pasted into. Code spans are left as they are (GitHub shows their content literally)."""
from __future__ import annotations

import re

import msgspec

_TAG_LINE = re.compile(r"^(<summary>|<sub>)(.*)(</summary>|</sub>)$")
_OWN_LINES = ("<details>", "</details>", "<!--")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")
_UNESCAPED_TICK = re.compile(r"(?<!\\)`")
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")  # what can open an HTML tag, comment or autolink ("<1%" cannot)


def one_line(value):
    """A report (dicts, lists, strings) with every newline in a string turned into a space: a copy, or the report
    itself when none of its strings holds one (told by its JSON, which msgspec writes much faster than a walk in
    Python visits a large report)."""
    try:  # other objects (numpy scalars) written as their repr: _one_line leaves them as they are anyway
        text = msgspec.json.encode(value, enc_hook=repr)
    except (TypeError, ValueError, OverflowError):
        return _one_line(value)
    return _one_line(value) if b"\\n" in text or b"\\r" in text else value


def _one_line(value):
    if isinstance(value, str):
        return value.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    if isinstance(value, dict):
        return {k: _one_line(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_one_line(v) for v in value]
    return value


_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def inline(text: str) -> str:
    """Escape what opens HTML outside code spans (CommonMark's: a run of n backticks to the next run of exactly n); a backtick
    that closes no span is shown as a backtick."""
    out, at = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [_plain(text[at:m.start()]), m.group(0)]
        at = m.end()
    out.append(_plain(text[at:]))
    return "".join(out)


def _plain(text: str) -> str:
    return _UNESCAPED_TICK.sub(r"\\`", _TAG_START.sub("&lt;", text))


def cell(value) -> str:
    """A table cell: inline text, `|` escaped, never empty."""
    text = "–" if value is None or value == "" else str(value)
    return _UNESCAPED_PIPE.sub(r"\\|", inline(text.replace("\n", " ")))


def code(value) -> str:
    """A code span that holds any text, backticks included (a longer fence). In a table, cell() escapes its `|`."""
    if not value:
        return "–"
    text = str(value).replace("\n", " ")
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if run else ""
    return fence + pad + text + pad + fence


def finish(lines: list[str]) -> str:
    """The document: free-text lines escaped; table rows (escaped cell by cell) and our own tags kept."""
    out = []
    for line in "\n".join(lines).split("\n"):
        if line.startswith("|") or line.startswith(_OWN_LINES):
            out.append(line)
        elif m := _TAG_LINE.match(line):
            out.append(m.group(1) + inline(m.group(2)) + m.group(3))
        else:
            out.append(inline(line))
    return "\n".join(out) + "\n"
