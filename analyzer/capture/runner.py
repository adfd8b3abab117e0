"""One capture from a validated config: set up, run the phases over the workload's kind, publish the run folder.

The run folder is written under a hidden `.NAME.partial` name and renamed when done. If the workload fails mid-run
(or Ctrl-C), the folder is still published, with `"complete": false`, the error and the parts of meta.json the
finished phases returned, and the exit status is 1 (130 on Ctrl-C).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

import torch

from analyzer.capture.config import CaptureConfig
from analyzer.capture.phases import PHASES, WorkloadKind
from analyzer.capture.prepare import (build_model, environment, load_script, model_meta, resolve_device,
                                      resolve_dtype)
from analyzer.capture.runfolder import RunFolder, utc_stamp, write_json_atomic
from analyzer.capture.serve import ServeKind
from analyzer.capture.session import CaptureSession
from analyzer.capture.steps import StepsKind
from analyzer.progress import Progress

META_FILE = "meta.json"
META_SCHEMA = "gpu-idle-analyzer/run-meta/1"


def capture(config: CaptureConfig, out_dir: Path, argv: list[str]) -> int:
    """Capture the workload into a new run folder under `out_dir`; returns the exit status."""
    notes: list[str] = []
    device = resolve_device(config, notes)
    dtype = resolve_dtype(config, device)
    script = load_script(config)
    if hasattr(script, "check_workload"):
        script.check_workload(config, device)
    torch.manual_seed(config.seed)
    model = build_model(config, script, device, dtype)
    from workloads import runtime
    sampling = runtime.sampling(config)
    run = RunFolder(out_dir, config.run_name)
    header = {"created_utc": utc_stamp(), "command": ["python", "-m", "analyzer", *argv],
              "workload_file": str(config.path), "workload": config.as_dict(), "environment": environment(device),
              "model": model_meta(config, model)}
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    session = CaptureSession(config, device, run, Progress(), notes)
    outcome = Outcome()
    try:
        run_phases(session, lambda: make_kind(script, model, sampling, config), outcome)
    finally:  # whatever happened, the run folder is published (incomplete unless every phase ran)
        final, meta = publish(session, header, outcome)
    print_summary(final, meta, device)
    return outcome.exit_code


def make_kind(script: type, model, sampling, config: CaptureConfig) -> WorkloadKind:
    """The kind of the script's workload: sessions of requests (`kind = "serve"`) or steps of a sequence."""
    kind = ServeKind if getattr(script, "kind", None) == "serve" else StepsKind
    return kind(script, model, sampling, config)


@dataclasses.dataclass
class Outcome:
    """How the phases went, as meta.json and the exit status report it."""
    parts: dict = dataclasses.field(default_factory=dict)  # meta.json's parts from the phases, merged in order
    complete: bool = False
    error: str | None = None
    traceback: str | None = None
    exit_code: int = 0


def run_phases(session: CaptureSession, make: Callable[[], WorkloadKind], outcome: Outcome) -> None:
    """Every phase in order over the workload's kind, each one's part of meta.json merged into `outcome.parts`. A
    failure ends the run, keeping what the phases before it returned: an exception of the workload is recorded
    (exit 1), Ctrl-C too (exit 130)."""
    try:
        kind = make()
        for phase in PHASES:
            merge_part(outcome.parts, phase(session, kind))
        outcome.complete = True
    except KeyboardInterrupt:
        outcome.error, outcome.exit_code = "interrupted (KeyboardInterrupt)", 130
    except Exception as exc:  # the workload failed mid-run: keep what was captured, mark it incomplete
        outcome.error, outcome.exit_code = f"{exc.__class__.__name__}: {exc}".strip(), 1
        outcome.traceback = traceback.format_exc()
    finally:
        session.progress.close()


def merge_part(meta: dict, part: dict) -> None:
    """A phase's part into meta.json's parts: new keys appended, a section two phases fill (`serving`) merged."""
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(meta.get(key), dict):
            meta[key] = {**meta[key], **value}
        else:
            meta[key] = value


def publish(session: CaptureSession, header: dict, outcome: Outcome) -> tuple[Path, dict]:
    """meta.json into the staging folder, then the folder under its final name."""
    meta = {"schema": META_SCHEMA, "complete": outcome.complete, "error": outcome.error, **header,
            "notes": session.notes, **outcome.parts}
    if outcome.traceback is not None:
        meta["traceback"] = outcome.traceback
    meta["files"] = sorted(f.name for f in session.run.staging.iterdir() if not f.name.startswith("."))
    write_json_atomic(session.file(META_FILE), meta)
    return session.run.publish(), meta


def print_summary(final: Path, meta: dict, device: torch.device) -> None:
    shown = os.path.relpath(final) if not os.path.relpath(final).startswith("..") else str(final)
    env, model = meta["environment"], meta["model"]
    where = f"{env.get('gpu_name')} ({env['device']})" if device.type == "cuda" else f"CPU ({env['cpu']})"
    name = model["preset"] or model["checkpoint"]
    print(f"run:     {shown}{'' if meta['complete'] else '   INCOMPLETE: ' + str(meta['error'])}")
    print(f"device:  {where}, torch {env['torch']}, {model['dtype']}, {name} "
          f"({model['config']['num_hidden_layers']} layers), batch {meta['workload']['batch_size']}")
    timing = meta.get("unprofiled")
    if timing:
        s = timing["step_ms"]
        rate = f", {timing['tokens_per_s']:.1f} tokens/s" if timing["tokens_per_s"] else ""
        print(f"step:    {timing['step_label']} p50 {s['p50']:.2f} ms, p90 {s['p90']:.2f} ms{rate} "
              f"(no profiler, {timing['steps']} steps)")
    serving = meta.get("serving", {}).get("unprofiled")
    if serving:
        print(f"serving: {serving['requests']} requests, TTFT p50 {serving['ttft_ms']['p50']:.1f} ms, "
              f"TPOT p50 {(serving['tpot_ms'] or {}).get('p50', float('nan')):.2f} ms, "
              f"{serving['throughput_tokens_per_s']:.0f} tokens/s, mean batch {serving['mean_batch']}")
    if "mode_comparison" in meta:
        m = meta["mode_comparison"]
        print(f"modes:   eager {m['eager_step_ms']:.2f} ms vs CUDA graph {m['cuda_graph_step_ms']:.2f} ms "
              f"per step ({m['eager_over_graph']:.1f}x)")
    if meta.get("sync_sites"):
        top = meta["sync_sites"][0]
        print(f"syncs:   {sum(s['count'] for s in meta['sync_sites'])} synchronizing calls in the sync-debug pass; "
              f"most at {top['call_site']}")
    if meta["complete"]:
        print(f"analyze: python -m analyzer analyze {shown}")
