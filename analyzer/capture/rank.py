"""One rank of a tensor-parallel capture: `python -m analyzer.capture.rank --workload PATH --staging DIR ...`.

Started by distributed.py (one process per rank) with the environment torchrun gives a rank: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT. As under torchrun, the rendezvous store at MASTER_ADDR:MASTER_PORT is the
launcher's (no rank hosts it, so ranks may leave in any order); the rank connects to it as a client. It joins the
process group, builds its slices of the model and runs every phase of the capture as a single-process capture does
(the same steps on every rank, so the collectives pair up), writing `rank<N>.trace.json.gz` into the launcher's staging
folder. What it would have put in meta.json goes to `.rank<N>.json` there; the launcher merges those into the one
meta.json. Exit status 0 when every phase ran, else 1.

The process always ends with os._exit, never by finalizing the interpreter: gloo's threads can outlive
destroy_process_group(). Once torch._dynamo is imported after init_process_group (building the model on the meta
device does it), torch.distributed.nn.functional's `group=group.WORLD` defaults hold the default group, so the group
and its worker threads live on; a worker that releases a collective's tensors after finalization has begun needs the
GIL, CPython ends that thread with pthread_exit, the unwind meets a noexcept destructor and the rank dies of SIGABRT
("terminate called without an active exception"), a race a loaded machine loses.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from analyzer.capture.runfolder import write_json_atomic

RESULT_FILE = ".rank{rank}.json"


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def run_rank(args, rank: int, world: int, local_rank: int, staging: Path) -> dict:
    """Join the group, build this rank's model, run the phases; returns this rank's part of meta.json."""
    import torch
    import torch.distributed as dist

    from analyzer.capture.config import load_config
    from analyzer.capture.prepare import build_model, environment, load_script, model_meta, resolve_dtype
    from analyzer.capture.runfolder import RunFolder
    from analyzer.capture.runner import Outcome, make_kind, run_phases
    from analyzer.capture.session import CaptureSession
    from analyzer.progress import Progress
    from workloads import runtime

    config = load_config(args.workload, args.set)
    if args.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # the ranks share the machine's cores: more intra-op threads than cores leaves each collective waiting for
        # a peer whose threads are descheduled (gloo all-reduce 0.8 ms -> 3 ms with 2 ranks x 2 threads on 2 cores)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    timeout = datetime.timedelta(seconds=args.timeout_s)
    # the launcher hosts the store (distributed.py run_ranks): every rank is a client, rank 0 included
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    if args.backend == "nccl":
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, timeout=timeout, device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    script = load_script(config)
    if hasattr(script, "check_workload"):
        script.check_workload(config, device)
    dtype = resolve_dtype(config, device)
    torch.manual_seed(config.seed)
    model = build_model(config, script, device, dtype, runtime.tensor_parallel())
    sampling = runtime.sampling(config)
    notes = [] if device.type == "cuda" else [f"CPU rank: torch.set_num_threads({torch.get_num_threads()}), the "
                                              f"machine's {os.cpu_count()} cores shared by {world} ranks"]
    session = CaptureSession(config, device, RunFolder.attach(staging), Progress(), notes, rank=rank)
    outcome = Outcome()
    run_phases(session, lambda: make_kind(script, model, sampling, config), outcome)
    return {"complete": outcome.complete, "error": outcome.error, "traceback": outcome.traceback,
            "device": str(device), "hostname": platform.node(), "notes": session.notes, "parts": outcome.parts,
            "environment": environment(device), "model": model_meta(config, model)}


def main(argv: list[str] | None = None) -> NoReturn:
    """Run this rank and end the process: os._exit(0) when every phase ran, os._exit(1) otherwise."""
    parser = argparse.ArgumentParser(prog="python -m analyzer.capture.rank")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--staging", required=True, type=Path)
    parser.add_argument("--backend", required=True, choices=("gloo", "nccl"))
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result: dict = {"rank": rank, "pid": os.getpid(), "complete": False, "error": None}
    try:
        result.update(run_rank(args, rank, world, int(os.environ.get("LOCAL_RANK", rank)), args.staging))
    except KeyboardInterrupt:
        result["error"] = "interrupted (KeyboardInterrupt)"
    except BaseException as exc:  # noqa: BLE001 - every failure becomes this rank's one-line error
        result.update(error=one_line(f"{exc.__class__.__name__}: {exc}"), traceback=traceback.format_exc())
    if not result["complete"]:
        result["failed_unix"] = time.time()  # the launcher names the rank that failed first
        result["error"] = one_line(result["error"] or "failed")
    write_json_atomic(args.staging / RESULT_FILE.format(rank=rank), result)
    if not result["complete"]:
        if result.get("traceback"):
            print(result["traceback"], file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)  # never wait on peers that may be stuck in a collective
    import torch.distributed as dist
    try:
        dist.barrier()  # every rank is past its last collective and has written its files: nobody leaves a peer behind
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the rank's files are written; a teardown error does not undo them
        print(f"rank {rank}: process group teardown: {exc}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # not a return: no interpreter finalization beside gloo's threads (module docstring)


if __name__ == "__main__":
    main()
