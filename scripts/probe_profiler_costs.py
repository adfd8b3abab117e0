"""The project's table of the profiler's cost per recorded event (analyzer/views/profiler_costs.json): the capture's
probe (analyzer.capture.probe) run on this host for each combination of the profiler settings that change what a
trace records, RUNS times each, the median kept. Prints the table's entries as JSON; merge them into the table by
hand, replacing the entries of the same torch version and host.

    python3 scripts/probe_profiler_costs.py "HOST DESCRIPTION" [RUNS]
"""
from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analyzer.capture.probe import probe_profiler_cost  # noqa: E402


def main(host: str, runs: int) -> list[dict]:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    entries = []
    for stack, shapes, memory in itertools.product((True, False), repeat=3):
        options = {"activities": activities, "with_stack": stack, "record_shapes": shapes, "profile_memory": memory}
        probes = [probe_profiler_cost(options, device)["per_event_us"] for _ in range(runs)]
        entries.append({"torch": torch.__version__, "host": host, "runs": runs,
                        "settings": {"record_shapes": shapes, "profile_memory": memory, "with_stack": stack,
                                     "cuda": cuda},
                        "per_event_us": {k: round(statistics.median(p[k] for p in probes), 4) for k in probes[0]}})
    return entries


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3), indent=1))
