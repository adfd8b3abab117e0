"""The args of record_param_comms ops, read from the trace text while it is decoded.

torch >= 2.1 puts a collective's description on the record_param_comms cpu_op around its launch: "Collective name",
"Seq", "Process Group Name", "Process Group Ranks", "Group size", "In msg nelems", "Out msg nelems", "dtype". The
decoder skips args keys the model does not declare, and declaring these on every event's Struct would cost about 15%
of the decode of any trace; so they are read here instead, only from the chunks whose events include such an op: a
byte search for the name, then one small decode per op.
"""
from __future__ import annotations

import mmap
import re

import msgspec

COMM_OP = "record_param_comms"
_NAME = b'"record_param_comms"'
_ARGS = re.compile(rb'"record_param_comms"[^{}]*?"args":\s*(\{[^{}]*\})')  # Kineto writes name before args


def comm_op_args(text: bytes | mmap.mmap, start: int = 0, end: int | None = None) -> dict[int, dict]:
    """External id -> args of the record_param_comms ops whose events start in text[start:end] (the first op of an
    id wins)."""
    end = len(text) if end is None else end
    found: dict[int, dict] = {}
    at = text.find(_NAME, start, end)
    while at >= 0:
        match = _ARGS.match(text, at)
        at = text.find(_NAME, at + 1, end)
        if match is None:
            continue
        try:
            args = msgspec.json.decode(match.group(1))
        except msgspec.DecodeError:
            continue
        ext = args.get("External id")
        if type(ext) is int:
            found.setdefault(ext, args)
    return found
