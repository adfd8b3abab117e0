"""`python -m analyzer capture WORKLOAD.yaml`: run a workload three times over and write a run folder under traces/.

    config.py    load_config(): the YAML + `--set`, validated against SCHEMA -> a frozen, typed CaptureConfig
    runner.py    capture(): device, model and script (prepare.py), then a CaptureSession (session.py: config,
                 device, run folder, progress, notes) runs the phases and publishes the run folder (runfolder.py)
    phases.py    time -> compare modes -> profile -> sample -> script facts, each returning its part of meta.json;
                 the sample phase's sync-debug pass records sync sites (syncdebug.py)
    steps.py     the steps kind: a script of new_sequence() / step() calls (decode, prefill, generate, ...)
    serve.py     the serve kind: sessions of requests, each engine step one step
    distributed.py  tp > 1: one `python -m analyzer.capture.rank` process per rank (rank.py), one run folder

Imports only torch, pyyaml and the standard library, so it runs on a bare GPU machine from the repo root; importing
this package or `analyzer.capture.config` does not import torch (`python -m analyzer schema` stays light).
"""
from __future__ import annotations

from pathlib import Path


def run_capture(workload_path: str, overrides: list[str], out_dir: Path, argv: list[str]) -> int:
    """Load and validate the workload (a bad one raises UsageError before anything is written), capture it, and
    return the exit status: 0, 1 if the workload failed mid-run, 130 on Ctrl-C."""
    from analyzer.capture.config import load_config
    config = load_config(workload_path, overrides)
    if config.tp > 1:  # one process per rank, one run folder
        from analyzer.capture.distributed import capture_distributed
        return capture_distributed(config, Path(out_dir), argv)
    from analyzer.capture.runner import capture
    return capture(config, Path(out_dir), argv)
