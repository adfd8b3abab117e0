"""Make a large, valid Kineto trace by replicating a real run's events back to back.

    python benchmarks/replicate_trace.py tests/fixtures/h200/item_sync --size-mb 200 --out /tmp/big/run

Every copy is shifted in time by the source window (plus a gap) and gets fresh correlation, External id and Python
ids, and renumbered step annotations, so the result analyzes like the source repeated N times (N x the syncs,
launches and steps). The run folder gets the source's meta.json, so sync call sites resolve as in the source.
Events are written one by one: memory stays flat whatever the output size.

    python benchmarks/replicate_trace.py ../shared/traces/external/v100-ddp-training-with-memory.json.gz \
        --ranks 4 --out /tmp/job --straggler 2:1:30 --slow-collective 3:20 --skew-ms 2.5

`--ranks N` writes a synthetic job instead: `rank0..N-1.trace.json.gz`, each a copy of one real trace that holds
collective kernels (NCCL/RCCL), with `distributedInfo` {rank, world_size, backend: nccl}, each rank's clock shifted
by its own skew, and optionally
- a planted straggler `RANK:STEP:MS`: that rank arrives MS late in step STEP (0-based among the trace's steps):
  everything it does from just after the step's start on is shifted MS later (the step annotation and the ops that
  span the point are stretched). Every other rank waits for it inside the first collective kernel that starts after
  that point: the kernel lasts MS longer, everything after it is MS later, as a real all-reduce behaves (a rank's
  collective ends when the last rank has arrived: duration = transfer + latest arrival - this rank's arrival);
- a slow collective `STEP:MS`: the first collective kernel of that step lasts MS longer on every rank (a slow link:
  no rank is late, the transfer itself is slow), everything after it MS later.
A source without collectives (an inference trace) gets one all-reduce after each step with
`--insert-collectives US` (its transfer time): a record_param_comms op and its launch on a thread of their own, the
kernel on a stream of its own where the step's GPU work ends.
The record_param_comms op around each collective's launch gets the args torch >= 2.1 writes ("Collective name",
"Seq", "Process Group Name", "Group size", "dtype"), with the same Seq on every rank.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import shutil
import sys
from pathlib import Path

from analyzer.trace.build import STEP_NAME
from analyzer.views.collectives import COMM_KERNEL, collective_name

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


_GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_KERNEL_DTYPE = {"float": "Float", "f32": "Float", "half": "Half", "f16": "Half", "bf16": "BFloat16",
                 "__nv_bfloat16": "BFloat16", "double": "Double", "f64": "Double", "int64_t": "Long", "i64": "Long"}


def _is_gpu_work(e: dict) -> bool:
    return str(e.get("cat", "")).lower() in _GPU_WORK


def _step_starts(events: list) -> list[float]:
    """CPU start of each step, as analyzer.views.steps picks them: the capture's own annotations (`prefill`,
    `label#N`) when there are any, else ProfilerStep#N (nested ones dropped)."""
    marks = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"
             and STEP_NAME.match(str(e.get("name", "")))]
    own = [e for e in marks if not str(e["name"]).startswith("ProfilerStep#")]
    out, last_end = [], float("-inf")
    for e in sorted(own or marks, key=lambda e: e["ts"]):
        if e["ts"] >= last_end:
            out.append(float(e["ts"]))
            last_end = e["ts"] + e.get("dur", 0)
    return out


def _collective_args(events: list, comm: list, world_size: int) -> None:
    """Give the record_param_comms op around each collective's launch the args torch >= 2.1 records."""
    launches = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and isinstance(corr, int):
            launches.setdefault(corr, e)
    ops: dict[tuple, list] = {}
    for e in events:
        if e.get("name") == "record_param_comms" and e.get("ph") == "X":
            ops.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    starts = {}
    for key, rows in ops.items():
        rows.sort(key=lambda e: e["ts"])
        starts[key] = [e["ts"] for e in rows]
    seq = 1000  # a window starts mid-job: Seq does not start at 0, but is the same on every rank
    for k in comm:
        launch = launches.get((k.get("args") or {}).get("correlation"))
        key = (launch.get("pid"), launch.get("tid")) if launch else None
        rows = ops.get(key, [])
        i = bisect.bisect_right(starts[key], launch["ts"]) - 1 if rows else -1
        if i < 0 or rows[i]["ts"] + rows[i].get("dur", 0) < launch["ts"]:
            continue
        have = rows[i].get("args") or {}
        dtype = have.get("dtype") or next((v for key, v in _KERNEL_DTYPE.items()
                                           if re.search(rf"[_(]{re.escape(key)}(?:[_),]|$)", k["name"])), "Float")
        rows[i]["args"] = {**have, "Collective name": collective_name(k["name"]),
                           "Seq": seq, "Process Group Name": "0", "Process Group Desc": "default_pg",
                           "Group size": world_size, "dtype": dtype}
        k["_seq"] = seq
        seq += 1


def _moved(e: dict, edits: list[tuple[float, float]], skew: float, stretch: dict[int, float]) -> dict:
    """The event on a rank's clock: shifted by every edit (point, ms) at or before its start, stretched by every
    edit strictly inside it (CPU slices only: GPU work that spans the point is left as it ran), plus the skew."""
    ts = e.get("ts")
    if not isinstance(ts, (int, float)):
        return e
    e2 = dict(e)
    e2.pop("_seq", None)
    dur = e.get("dur")
    shift, grow = skew, stretch.get(id(e), 0.0)
    for at, ms in edits:
        if ts >= at:
            shift += ms * 1e3
        elif isinstance(dur, (int, float)) and ts + dur > at and not _is_gpu_work(e):
            grow += ms * 1e3
    if grow:
        e2["dur"] = round(dur + grow, 3)
    e2["ts"] = round(ts + shift, 3)
    return e2


def _kept(events: list, steps: tuple[int, int] | None, flows: bool) -> list:
    """The events of steps FIRST..LAST (by start time; metadata kept) and, unless `flows`, no ac2g flow arrows."""
    if not flows:
        events = [e for e in events if e.get("ph") not in ("s", "f")]
    if steps is None:
        return events
    starts = _step_starts(events)
    first, last = steps
    if not 0 <= first <= last < len(starts):
        raise SystemExit(f"steps {first}:{last} out of range (the trace has {len(starts)} steps)")
    lo, hi = starts[first], starts[last + 1] if last + 1 < len(starts) else float("inf")
    return [e for e in events if not isinstance(e.get("ts"), (int, float)) or lo <= e["ts"] < hi]


def _inserted_collectives(events: list, transfer_us: float, nbytes: int) -> list[dict]:
    """For a trace without collectives: one all-reduce per step, as torch >= 2.1 records it. On the CPU, on a thread
    of its own in the process that launches the most kernels, c10d::allreduce_ > record_param_comms >
    cudaLaunchKernel just before the kernel; on the GPU, on a stream of its own, a `ncclDevKernel_AllReduce` kernel of
    `transfer_us` starting where the step's GPU work ends (the last end among GPU work that started before the
    next step began). Returns the new events; the kernels' durations get the waits later, as real ones do."""
    work = [e for e in events if e.get("ph") == "X" and _is_gpu_work(e)]
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})]
    if not work or not launches:
        raise SystemExit("the trace has no GPU work or no launch calls to place collectives after")
    kernel = max(work, key=lambda e: e.get("dur", 0))
    pid = max({e["pid"] for e in launches}, key=[e["pid"] for e in launches].count)
    tid = 1 + max((e["tid"] for e in events if isinstance(e.get("tid"), int)), default=0)
    stream = 1 + max((e["args"].get("stream", 0) for e in work if isinstance((e.get("args") or {}).get("stream"),
                                                                             int)), default=0)
    corr = 1 + max(e["args"]["correlation"] for e in launches)
    ext = 1 + max((e["args"].get("External id", 0) for e in events if isinstance((e.get("args") or {}).get(
        "External id"), int)), default=0)
    starts = _step_starts(events) + [float("inf")]
    new = []
    for i in range(len(starts) - 1):
        at = max((e["ts"] + e["dur"] for e in work if starts[i] <= e["ts"] < starts[i + 1]), default=None)
        if at is None:
            continue
        c, x = corr + i, ext + 3 * i
        new += [{"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": tid, "ts": at - 30.0,
                 "dur": 20.0, "args": {"External id": x}},
                {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": tid, "ts": at - 28.0,
                 "dur": 16.0, "args": {"External id": x + 1, "In msg nelems": nbytes // 2,
                                       "Out msg nelems": nbytes // 2, "dtype": "BFloat16"}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                 "ts": at - 20.0, "dur": 5.0, "args": {"External id": x + 1, "cbid": 211, "correlation": c}},
                {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": kernel["pid"],
                 "tid": stream, "ts": at, "dur": transfer_us,
                 "args": {"External id": x + 1, "device": kernel["args"].get("device", 0), "stream": stream,
                          "correlation": c, "grid": [2, 1, 1], "block": [640, 1, 1]}}]
    return new


def replicate_ranks(source: Path | dict, out_dir: Path, ranks: int, *, skew_ms: float = 2.5,
                    straggler: tuple[int, int, float] | None = None, slow: tuple[int, float] | None = None,
                    steps: tuple[int, int] | None = None, flows: bool = True,
                    insert_us: float | None = None, insert_bytes: int = 1 << 20) -> dict:
    """A synthetic job of `ranks` rank files from one real trace (see the module's docstring). `steps` keeps only
    steps FIRST..LAST of the source (smaller files; step indices then count from FIRST), `flows=False` drops the
    ac2g arrows. `source` may be a trace already read (`_load`), to make several jobs of one. `insert_us` adds an
    all-reduce of that transfer time (and `insert_bytes`) after each step, for a source without collectives.
    Returns what was planted."""
    data = source if isinstance(source, dict) else _load(source)
    label = data.get("traceName", "trace") if isinstance(source, dict) else source
    events = _kept([e for e in data["traceEvents"] if isinstance(e, dict)], steps, flows)
    if insert_us:
        events += _inserted_collectives(events, insert_us, insert_bytes)
    comm = sorted((e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
                   and COMM_KERNEL.search(str(e.get("name", "")))), key=lambda e: e["ts"])
    if (straggler or slow) and not comm:
        raise SystemExit(f"{label}: has no collective kernels (NCCL/RCCL) to plant a straggler or a slow one in")
    _collective_args(events, comm, ranks)
    starts = _step_starts(events)

    def first_comm_after(t: float) -> dict:
        hit = next((k for k in comm if k["ts"] >= t), None)
        if hit is None:
            raise SystemExit(f"{label}: no collective kernel after {t} µs")
        return hit

    def step_start(k: int) -> float:
        if not 0 <= k < len(starts):
            raise SystemExit(f"{label}: step {k} out of range (the trace has {len(starts)} steps)")
        return starts[k]

    planted = {"ranks": ranks, "skew_ms": skew_ms, "steps": len(starts)}
    shared: list[tuple[float, float]] = []
    stretch_all: dict[int, float] = {}
    if slow:
        k = first_comm_after(step_start(slow[0]))
        shared.append((k["ts"] + k["dur"], slow[1]))
        stretch_all[id(k)] = slow[1] * 1e3
        planted["slow_collective"] = {"step": slow[0], "extra_ms": slow[1], "kernel": k["name"],
                                      "seq": k.get("_seq")}
    late = {}
    if straggler:
        rank, step, delay = straggler
        at = step_start(step) + 0.5  # just inside the step: the step stretches, its work comes late
        waited_in = first_comm_after(at)
        late = {"rank": rank, "at": at, "ms": delay, "kernel": waited_in}
        planted["straggler"] = {"rank": rank, "step": step, "delay_ms": delay}
    head = {k: v for k, v in data.items() if k != "traceEvents"}
    out_dir.mkdir(parents=True, exist_ok=True)
    ours = {f"rank{r}.trace.json.gz" for r in range(ranks)}
    stale = sorted(p.name for p in out_dir.glob("*rank*.json*") if p.name not in ours)
    if stale:  # they would join the job
        raise SystemExit(f"{out_dir}: holds other rank files ({', '.join(stale[:3])}); choose an empty folder")
    sizes = []
    for r in range(ranks):
        skew = r * skew_ms * 1e3 * (-1) ** r
        edits, stretch = list(shared), dict(stretch_all)
        if late and r == late["rank"]:
            edits.append((late["at"], late["ms"]))
        elif late:
            k = late["kernel"]
            edits.append((k["ts"] + k["dur"], late["ms"]))
            stretch[id(k)] = stretch.get(id(k), 0.0) + late["ms"] * 1e3
        info = {**(head.get("distributedInfo") or {}), "backend": "nccl", "rank": r, "world_size": ranks}
        info.pop("pg_config", None)
        info.pop("pg_count", None)
        path = out_dir / f"rank{r}.trace.json.gz"
        moved = [_moved(e, edits, skew, stretch) for e in events]
        with gzip.open(path, "wt", compresslevel=1) as f:
            f.write(json.dumps({**head, "distributedInfo": info, "traceEvents": moved}))
        sizes.append(path.stat().st_size)
    planted["bytes"] = sizes
    return planted


def _numbers(text: str, n: int, what: str) -> list[float]:
    parts = text.split(":")
    if len(parts) != n:
        raise SystemExit(f"{what}: expected {n} numbers separated by ':', got {text!r}")
    return [float(p) for p in parts]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="run folder or trace file")
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--out", type=Path, required=True, help="run folder to create")
    ap.add_argument("--ranks", type=int, help="write a synthetic job of this many rank files instead")
    ap.add_argument("--skew-ms", type=float, default=2.5, help="clock skew between ranks (with --ranks)")
    ap.add_argument("--straggler", metavar="RANK:STEP:MS", help="plant a late rank (with --ranks)")
    ap.add_argument("--slow-collective", metavar="STEP:MS", help="slow the first collective of a step (with --ranks)")
    ap.add_argument("--steps", metavar="FIRST:LAST", help="keep only these steps of the source (with --ranks)")
    ap.add_argument("--no-flows", action="store_true", help="drop the ac2g flow arrows (with --ranks)")
    ap.add_argument("--insert-collectives", metavar="US", type=float,
                    help="add an all-reduce of US µs after each step, for a source without any (with --ranks)")
    args = ap.parse_args(argv)
    if args.ranks:
        straggler = _numbers(args.straggler, 3, "--straggler") if args.straggler else None
        slow = _numbers(args.slow_collective, 2, "--slow-collective") if args.slow_collective else None
        print(json.dumps(replicate_ranks(
            args.source, args.out, args.ranks, skew_ms=args.skew_ms,
            straggler=(int(straggler[0]), int(straggler[1]), straggler[2]) if straggler else None,
            slow=(int(slow[0]), slow[1]) if slow else None,
            steps=tuple(int(x) for x in _numbers(args.steps, 2, "--steps")) if args.steps else None,
            flows=not args.no_flows, insert_us=args.insert_collectives)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    info = replicate(args.source, args.out / "rank0.trace.json", args.size_mb)
    meta = args.source / "meta.json"
    if meta.is_file():
        shutil.copy(meta, args.out / "meta.json")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
