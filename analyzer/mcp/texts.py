"""The text of each tool's answer: the MCP result's `content`, which several clients pass to the model alone, so it
holds the answer itself (lines, compact JSON and tables), within BUDGET characters. A list that does not fit is cut
at a row, and the answer says where the next page starts."""
from __future__ import annotations

import json

BUDGET = 20_000  # characters of one answer's text
CELL = 300  # characters of one table cell or query value


def one_line(value, width: int = CELL) -> str:
    """A value on one line of at most `width` characters ('…' where it was cut)."""
    text = " ".join(str(value).split()) if value is not None else "–"
    return text if len(text) <= width else text[:width - 1] + "…"


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def table(columns: list[str], rows: list[list]) -> tuple[list[str], list[str]]:
    """A Markdown table: its two header lines, and one line per row."""
    def line(cells):
        return "| " + " | ".join(one_line(c).replace("|", "\\|") for c in cells) + " |"
    return [line(columns), "|" + "---|" * len(columns)], [line(r) for r in rows]


def cap(text: str) -> str:
    """The last guard: nothing longer than BUDGET leaves."""
    if len(text) <= BUDGET:
        return text
    note = f"\n… cut at {BUDGET:,} characters (the structured content holds the rest)"
    return text[:BUDGET - len(note)] + note


def paged(head: list[str], lines: list[str], out: dict, key: str | None, what: str, tool: str,
          tail: list[str] = ()) -> str:
    """`head`, then as many of `lines` as fit in BUDGET, then `tail`. `lines[i]` renders `out[key][i]`: the rows left
    out leave the structured answer too, and its paging keys (offset, next_offset, total, note) say where the next
    page starts."""
    used = sum(len(line) + 1 for line in [*head, *tail]) + 200  # room for the note
    shown = 0
    for line in lines:
        if shown and used + len(line) + 1 > BUDGET:
            break
        used += len(line) + 1
        shown += 1
    if shown < len(lines):
        following = out.get("offset", 0) + shown
        if key is not None:
            out[key] = out[key][:shown]
        left = out["total"] - following if out.get("total") is not None else None
        out["next_offset"] = following
        out["note"] = (f"{left if left is not None else 'More'} {'more ' if left is not None else ''}{what} did not "
                       f"fit in one answer ({BUDGET:,} characters): call {tool} again with offset={following}")
    note = [out["note"]] if out.get("note") else []
    return cap("\n".join([*head, *lines[:shown], *tail, *note]))
