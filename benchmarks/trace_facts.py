"""Plain counts of what a captured trace holds (stdlib only), to check a capture by eye:

    python3 benchmarks/trace_facts.py traces/decode-*/
"""
import gzip
import json
import sys
from collections import Counter
from pathlib import Path


def facts(run: Path) -> dict:
    trace_file = run / "rank0.trace.json.gz" if run.is_dir() else run
    with gzip.open(trace_file) as f:
        events = json.load(f)["traceEvents"]
    cats = Counter(e.get("cat") for e in events)
    runtime = Counter(e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    reserved = [m.get("Total Reserved", 0) for m in memory if m.get("Device Type") == 1]
    return {
        "run": str(run), "bytes": trace_file.stat().st_size, "events": len(events),
        "categories": dict(cats.most_common()), "runtime_calls": dict(runtime.most_common(12)),
        "cuda_memory_events": len(reserved), "max_total_reserved": max(reserved, default=0),
        "annotations": [e["name"] for e in events if e.get("cat") == "user_annotation"][:12],
    }


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps(facts(Path(arg)), indent=1))
