"""A tensor-parallel capture (`tp` > 1): one process per rank, one run folder.

The launcher (this module, in the `python -m analyzer capture` process) checks the workload, makes the hidden staging
folder (runfolder.py), hosts the rendezvous TCPStore itself (as torchrun's agent does: bound to port 0, so the kernel
picks a free port that no other process can take before the ranks connect, and no rank's exit takes the store from the
others) and starts `tp` processes of `python -m analyzer.capture.rank` (rank.py) with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT: the store's port). Backend: NCCL with one GPU
per rank (cuda:N for rank N) when the device is CUDA, gloo on the CPU. Every rank runs the same phases and writes
`rank<N>.trace.json.gz` and `.rank<N>.json` (its part of meta.json) into the staging folder. When all exit 0 the
launcher merges the parts into one meta.json (rank 0's parts at the top level, as a one-process run has them; every
rank's under `distributed.ranks`) and renames the folder into place.

If any rank fails, the others are stopped (SIGTERM, then SIGKILL), the staging folder is removed (no partial run
folder) and the capture fails with one line naming the rank that failed first. Ranks time out in the process group
(rendezvous and each collective: RANK_TIMEOUT_S), and the launcher stops them all past CAPTURE_TIMEOUT_S.

NVLink multicast stays off: NVLS_OFF is set in this process and in every rank's environment.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from analyzer.capture.config import REPO_ROOT, SCHEMA, CaptureConfig
from analyzer.capture.prepare import check_tensor_parallel, load_script
from analyzer.capture.rank import RESULT_FILE
from analyzer.capture.runfolder import RunFolder, utc_stamp, write_json_atomic
from analyzer.capture.runner import META_FILE, META_SCHEMA, print_summary
from analyzer.errors import UsageError

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RANK_TIMEOUT_S = 300  # process-group rendezvous and each collective
CAPTURE_TIMEOUT_S = float(os.environ.get("GPU_IDLE_TP_TIMEOUT_S", 1800))  # the whole capture, every rank
STOP_GRACE_S = 5  # after one rank failed: how long the others get to exit before they are stopped


def capture_distributed(config: CaptureConfig, out_dir: Path, argv: list[str]) -> int:
    """Capture the workload over `config.tp` ranks into one new run folder; returns the exit status."""
    os.environ.update(NVLS_OFF)
    notes: list[str] = []
    backend, device = resolve_backend(config, notes)
    script = load_script(config)
    check_tensor_parallel(config, script)
    if hasattr(script, "check_workload"):
        script.check_workload(config, device)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    created = utc_stamp()
    run = RunFolder(out_dir, config.run_name)
    logs = Path(tempfile.mkdtemp(prefix=f"{run.name}.ranks-"))
    print(f"ranks:   {config.tp} processes over {backend} (rank 0's progress below; rank logs in {logs})",
          file=sys.stderr)
    try:
        failure = run_ranks(config, run.staging, logs, backend)
    except KeyboardInterrupt:
        failure, code = "interrupted (KeyboardInterrupt)", 130
    else:
        code = 1
    if failure is not None:
        run.discard()
        print(f"error: {failure} (no run folder written; rank logs in {logs})", file=sys.stderr)
        return code
    results = [json.loads((run.staging / RESULT_FILE.format(rank=r)).read_text()) for r in range(config.tp)]
    meta = merge_meta(config, argv, created, notes, results, backend)
    for r in range(config.tp):
        (run.staging / RESULT_FILE.format(rank=r)).unlink()
    meta["files"] = sorted([f.name for f in run.staging.iterdir() if not f.name.startswith(".")] + [META_FILE])
    write_json_atomic(run.path(META_FILE), meta)
    final = run.publish()
    shutil.rmtree(logs, ignore_errors=True)
    print_summary(final, meta, device)
    for rank in meta["distributed"]["ranks"]:
        s = rank["unprofiled"]["step_ms"]
        print(f"rank {rank['rank']}:  {rank['unprofiled']['step_label']} p50 {s['p50']:.2f} ms, "
              f"p90 {s['p90']:.2f} ms ({rank['device']}, {rank['profiled']['trace']})")
    return 0


def resolve_backend(config: CaptureConfig, notes: list[str]) -> tuple[str, torch.device]:
    """NCCL with one GPU per rank, or gloo on the CPU; the device rank 0 runs on. Never touches a GPU here (the
    ranks do), so the launcher holds no CUDA context."""
    requested, has_cuda = config.device, torch.cuda.is_available()
    if requested == "auto":
        requested = "cuda" if has_cuda else "cpu"
        if not has_cuda:
            notes.append(f"device: auto resolved to CPU because torch sees no CUDA device; the {config.tp} ranks "
                         "run as CPU processes over gloo")
    if requested == "cuda":
        if not has_cuda:
            raise UsageError(f"{config.path}: key 'device': 'cuda' needs CUDA, but torch {torch.__version__} sees "
                             "no CUDA device; allowed here: auto, cpu")
        gpus = torch.cuda.device_count()
        if gpus < config.tp:
            raise UsageError(f"{config.path}: key 'tp': {config.tp} ranks need {config.tp} GPUs (one per rank), "
                             f"torch sees {gpus}")
        return "nccl", torch.device("cuda", 0)
    if config.mode == "cuda_graph":
        raise UsageError(f"{config.path}: key 'mode': 'cuda_graph' needs a CUDA device; allowed on CPU: eager")
    return "gloo", torch.device("cpu")


def rendezvous_store() -> "torch.distributed.TCPStore":
    """The ranks' rendezvous store, served from this process on 127.0.0.1 at a port the kernel picks (`.port`)."""
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))


def rank_command(config: CaptureConfig, staging: Path, backend: str) -> list[str]:
    """`python -m analyzer.capture.rank` with the resolved workload: every key given as a `--set`, so each rank
    validates exactly the config this process validated."""
    command = [sys.executable, "-m", "analyzer.capture.rank", "--workload", str(config.path.resolve()),
               "--staging", str(staging), "--backend", backend, "--timeout-s", str(RANK_TIMEOUT_S)]
    for field in SCHEMA:
        command += ["--set", f"{field.key}={json.dumps(config.get(field.key))}"]
    return command


def rank_environment(rank: int, world: int, port: int) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, **NVLS_OFF, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT)}


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux), so no rank outlives it."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_ranks(config: CaptureConfig, staging: Path, logs: Path, backend: str) -> str | None:
    """Start every rank and wait for all; None when every rank exited 0, else the one-line failure."""
    world, store = config.tp, rendezvous_store()  # served until every rank has exited
    command = rank_command(config, staging, backend)
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world):
            log = open(logs / f"rank{rank}.log", "w")
            # rank 0's progress goes to this terminal; the others' output to their log
            err = None if rank == 0 else log
            procs.append(subprocess.Popen(command, env=rank_environment(rank, world, store.port), stdout=log,
                                          stderr=err, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
            log.close()
        return wait_ranks(procs, staging, time.monotonic() + CAPTURE_TIMEOUT_S)
    finally:
        stop(procs)
        del store


def wait_ranks(procs: list[subprocess.Popen], staging: Path, deadline: float) -> str | None:
    exited: dict[int, float] = {}  # rank -> when this process saw it exit
    while True:
        for rank, proc in enumerate(procs):
            if rank not in exited and proc.poll() is not None:
                exited[rank] = time.time()
        failed = [r for r in exited if procs[r].returncode != 0]
        if failed:
            grace = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < grace and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            for rank, proc in enumerate(procs):
                if rank not in exited and proc.poll() is not None:
                    exited[rank] = time.time()
            return first_failure(procs, exited, staging)
        if len(exited) == len(procs):
            return None
        if time.monotonic() > deadline:
            running = [r for r, p in enumerate(procs) if p.poll() is None]
            return (f"ranks {', '.join(map(str, running))} still running after {CAPTURE_TIMEOUT_S:.0f} s "
                    "(GPU_IDLE_TP_TIMEOUT_S); stopped")
        time.sleep(0.05)


def first_failure(procs: list[subprocess.Popen], exited: dict[int, float], staging: Path) -> str:
    """The rank that failed first (by the time its own report says, else when it was seen to exit) and why."""
    failures = []
    for rank, seen in exited.items():
        code = procs[rank].returncode
        if code == 0:
            continue
        report = staging / RESULT_FILE.format(rank=rank)
        try:
            result = json.loads(report.read_text())
            failures.append((result.get("failed_unix", seen), rank, result.get("error") or f"exit status {code}"))
        except (OSError, ValueError):
            why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            failures.append((seen, rank, f"{why} before reporting"))
    _, rank, error = min(failures)
    return f"rank {rank} failed: {error}"


def stop(procs: list[subprocess.Popen]) -> None:
    """Stop the ranks still running (each by its own pid): SIGTERM, then SIGKILL after a grace period."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in running:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def topology() -> str | None:
    """`nvidia-smi topo -m` (the GPUs' links), when it runs."""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)  # nvidia-smi underlines the header with ANSI escapes
    return text if done.returncode == 0 and text.strip() else None


def merge_meta(config: CaptureConfig, argv: list[str], created: str, notes: list[str], results: list[dict],
               backend: str) -> dict:
    """One meta.json: rank 0's parts where a one-process run has them, every rank's under `distributed.ranks`."""
    first = results[0]
    rank_notes = list(first["notes"]) + [f"rank {r['rank']}: {n}" for r in results[1:] for n in r["notes"]
                                         if n not in first["notes"]]
    nccl = None
    if backend == "nccl":
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    distributed = {
        "backend": backend, "world_size": config.tp, "nccl_version": nccl,
        "launcher": "one `python -m analyzer.capture.rank` process per rank, rendezvous on a TCPStore the "
                    "launcher serves on 127.0.0.1",
        "environment": dict(NVLS_OFF), "rank_timeout_s": RANK_TIMEOUT_S,
        "topology": topology() if backend == "nccl" else None,
        "traces": [r["parts"]["profiled"]["trace"] for r in results],
        "straggler": {"rank": config.straggler.rank, "delay_ms": config.straggler.delay_ms}
        if config.straggler.rank is not None else None,
        "ranks": [{"rank": r["rank"], "pid": r["pid"], "device": r["device"], "hostname": r["hostname"],
                   "shard": r["model"].get("tensor_parallel"), **r["parts"]} for r in results],
    }
    return {"schema": META_SCHEMA, "complete": True, "error": None, "created_utc": created,
            "command": ["python", "-m", "analyzer", *argv], "workload_file": str(config.path),
            "workload": config.as_dict(), "environment": first["environment"], "model": first["model"],
            "notes": notes + rank_notes, **first["parts"], "distributed": distributed}
