"""Make a large, valid Kineto trace by replicating a real run's events back to back.

    python benchmarks/replicate_trace.py tests/fixtures/h200/item_sync --size-mb 200 --out /tmp/big/run

Every copy is shifted in time by the source window (plus a gap) and gets fresh correlation, External id and Python
ids, and renumbered step annotations, so the result analyzes like the source repeated N times (N x the syncs,
launches and steps). The run folder gets the source's meta.json, so sync call sites resolve as in the source.
Events are written one by one: memory stays flat whatever the output size.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
from pathlib import Path

_STEP = re.compile(r"^(\w+)#(\d+)$")
ID_KEYS = ("correlation", "External id", "Python id", "Python parent id", "Ev Idx", "Record function id")


def _load(source: Path) -> dict:
    trace = source / "rank0.trace.json.gz" if source.is_dir() else source
    opener = gzip.open if trace.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(trace, "rt") as f:
        return json.load(f)


def replicate(source: Path, out_trace: Path, size_mb: float) -> dict:
    data = _load(source)
    events = data["traceEvents"]
    meta_events = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    timed = [e for e in body if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    period = (t1 - t0) + 1000.0  # µs between copies
    id_span = {k: 1 + max((int(e["args"][k]) for e in body if isinstance(e.get("args"), dict)
                           and isinstance(e["args"].get(k), int)), default=0) for k in ID_KEYS}
    id_span["Python parent id"] = id_span["Python id"] = max(id_span["Python id"], id_span["Python parent id"])
    step_span: dict[str, int] = {}
    for e in body:
        m = _STEP.match(str(e.get("name", ""))) if e.get("cat") in ("user_annotation", "gpu_user_annotation") else None
        if m:
            step_span[m.group(1)] = max(step_span.get(m.group(1), 0), int(m.group(2)) + 1)
    one_copy = sum(len(json.dumps(e)) + 2 for e in body)
    copies = max(1, int(size_mb * 1e6 / one_copy))
    head = {k: v for k, v in data.items() if k != "traceEvents"}
    out_trace.parent.mkdir(parents=True, exist_ok=True)
    with open(out_trace, "w") as f:
        f.write("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()))
        f.write('  "traceEvents": [\n')
        first = True
        for n in range(copies):
            shift = n * period
            for e in body:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = round(e2["ts"] + shift, 3)
                args = e2.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for k in ID_KEYS:
                        if isinstance(args.get(k), int) and (args[k] > 0 or k.startswith("Python")):
                            args[k] += n * id_span[k]
                    e2["args"] = args
                if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] += n * id_span["correlation"]
                m = _STEP.match(str(e2.get("name", ""))) if e2.get("cat") in ("user_annotation",
                                                                               "gpu_user_annotation") else None
                if m:
                    e2["name"] = f"{m.group(1)}#{int(m.group(2)) + n * step_span[m.group(1)]}"
                f.write(("" if first else ",\n") + "  " + json.dumps(e2))
                first = False
        for e in meta_events:
            f.write(",\n  " + json.dumps(e))
        f.write("\n  ]\n}\n")
    return {"copies": copies, "events": copies * len(body) + len(meta_events), "bytes": out_trace.stat().st_size}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="run folder or trace file")
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--out", type=Path, required=True, help="run folder to create")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    info = replicate(args.source, args.out / "rank0.trace.json", args.size_mb)
    meta = args.source / "meta.json"
    if meta.is_file():
        shutil.copy(meta, args.out / "meta.json")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
