"""The run list over many analyzed runs (what the dashboard's run page and the MCP server's list_runs read): N run
folders, each a hard link of one analyzed example run (trace, meta.json, report.*), listed by a fresh RunStore
(cold: every report read once) and again (warm), against the baseline of decoding every report.json whole with
json.loads in the same run.

    python benchmarks/bench_runs.py [N] [RUN]     (default: 1000 copies of traces/examples/graph_decode)
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from analyzer import api  # noqa: E402


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1000
    source = Path(argv[1]) if len(argv) > 1 else REPO / "traces" / "examples" / "graph_decode"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "traces"
        template = Path(tmp) / "template"
        shutil.copytree(source, template)
        api.write(api.analyze(api.load(template, cache=False)))
        files = [p for p in template.iterdir() if p.is_file()]
        for i in range(n):
            folder = root / f"run{i:05d}"
            folder.mkdir(parents=True)
            for f in files:
                os.link(f, folder / f.name)
        t0 = time.perf_counter()
        for folder in root.iterdir():
            json.loads((folder / "report.json").read_bytes())
        baseline = time.perf_counter() - t0
        store = api.RunStore(root)
        t0 = time.perf_counter()
        rows = store.rows()
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.rows()
        warm = time.perf_counter() - t0
    assert len(rows) == n and all(r.status == "analyzed" for r in rows)
    size = (template / "report.json").stat().st_size if template.exists() else 0
    print("| runs | json.loads of every report.json (baseline) | run list, cold | run list, warm |\n|---|---|---|---|\n"
          f"| {n} | {baseline:.2f} s (1.00) | {cold:.2f} s ({cold / baseline:.2f}) | {warm:.2f} s "
          f"({warm / baseline:.2f}) |" + (f" report.json {size / 1e3:.0f} KB" if size else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
