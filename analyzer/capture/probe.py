"""What the profiler costs on this host with this run's own profiler settings: small loops timed without and with
torch.profiler, interleaved, so that the analyzer can take the profiler's cost out of the trace from measured costs
(analyzer.views.whatif) instead of fitting it.

Each loop records a known set of events per iteration, and the costs follow from the differences:
  python_call: one Python function call           -> one python_function event (with_stack)
  c_call:      one builtin call (list.append)      -> one python_function event of a C function (with_stack)
  op:          x.add_(y) on a CPU tensor            -> a C call + one cpu_op
  op_alloc:    torch.add(x, y) on a CPU tensor      -> a C call + one cpu_op + two [memory] events (profile_memory)
  launch:      x.add_(y) on a CUDA tensor           -> a C call + one cpu_op + one launch call (CUPTI) + a kernel
  graph_node:  a CUDA graph of 256 such kernels replayed on an idle GPU, only the replay call timed -> one graph
               launch call whose cost grows with its nodes (CUPTI traces each node: on an H100, 0.6–1.4 µs a node, and
               a 24-layer decode graph's launch call takes 0.5–1 ms profiled against 0.09 ms without)
  host_compute: sorted() of 2,000 floats            -> one C call lasting ~0.1 ms: how much slower host compute runs
and, on the GPU's own clock (CUDA events), what CUPTI adds between kernels that run back to back:
  gpu_queued_kernel: 128 such kernels queued behind a sleeping kernel, so that they run back to back
  gpu_graph_node:    the 256-node graph's nodes, launched behind a sleeping kernel
The profiled loops run in one profiler session that records nothing to disk, between two unprofiled passes; each
figure is the median over rounds. Only the CPU's time is timed: the GPU is synchronized before each loop, not inside
it, so that a loop's kernels never make it wait.
"""
from __future__ import annotations

import random
import statistics
import time

import torch

ITERATIONS = 2000  # per loop and round
ROUNDS = 5
COMPUTE_CALLS = 100
COMPUTE_SIZE = 2000
GRAPH_NODES = 256
GRAPH_REPLAYS = 20
QUEUED_KERNELS = 128
# a kernel that holds the stream while the CPU queues the kernels behind it: 2e7 cycles, ~10 ms at 2 GHz, several
# times what queueing QUEUED_KERNELS (or launching the graph) takes under the profiler
SLEEP_CYCLES = 20_000_000


def _loops(device: torch.device | None) -> dict:
    x, y = torch.ones(4), torch.ones(4)
    data = [random.Random(0).random() for _ in range(COMPUTE_SIZE)]
    n = ITERATIONS

    def nothing():
        pass

    def python_call():
        f = nothing
        for _ in range(n):
            f()

    def c_call():
        append = [].append
        for i in range(n):
            append(i)

    def op():
        for _ in range(n):
            x.add_(y)

    def op_alloc():
        for _ in range(n):
            torch.add(x, y)

    def host_compute():
        for _ in range(COMPUTE_CALLS):
            sorted(data)

    loops = {"python_call": python_call, "c_call": c_call, "op": op, "op_alloc": op_alloc,
             "host_compute": host_compute}
    if device is not None:
        gx, gy = torch.ones(4, device=device), torch.ones(4, device=device)

        def launch():
            for _ in range(n):
                gx.add_(gy)

        loops["launch"] = launch
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            gx.add_(gy)  # warm-up off the capture, as torch.cuda.graphs asks
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_NODES):
                gx.add_(gy)

        def graph_replay() -> int:
            """The replay calls' own time, each on an idle GPU (a replay queued behind another costs less under
            CUPTI than the first of a step does)."""
            spent = 0
            for _ in range(GRAPH_REPLAYS):
                torch.cuda.synchronize(device)
                t0 = time.perf_counter_ns()
                graph.replay()
                spent += time.perf_counter_ns() - t0
            return spent

        loops["graph_replay"] = graph_replay
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def back_to_back(launch) -> int:
            """GPU ns from the sleeping kernel's end to the end of the work `launch` queued behind it."""
            torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            launch()
            end.record()
            end.synchronize()
            return int(start.elapsed_time(end) * 1e6)

        def queue_kernels():
            for _ in range(QUEUED_KERNELS):
                gx.add_(gy)

        loops["gpu_queued_kernel"] = lambda: back_to_back(queue_kernels)
        loops["gpu_graph_node"] = lambda: back_to_back(graph.replay)
    return loops


def _time_rounds(loops: dict, sync) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(ROUNDS):
        for name, loop in loops.items():
            sync()
            t0 = time.perf_counter_ns()
            spent = loop()  # a loop that times only part of itself returns that time
            out[name].append(spent if spent is not None else time.perf_counter_ns() - t0)
    return out


def probe_profiler_cost(options: dict, device: torch.device) -> dict:
    """meta.json's `profiler_cost`: the profiler's cost per recorded event and the slow-down of host compute under
    `options` (torch.profiler.profile's keyword arguments, without a schedule), on this host."""
    cuda = device.type == "cuda"
    loops = _loops(device if cuda else None)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    for loop in loops.values():  # warm: first calls, the allocator's blocks, the CUDA context's kernels
        loop()
    before = _time_rounds(loops, sync)
    with torch.profiler.profile(**options):
        profiled = _time_rounds(loops, sync)
    after = _time_rounds(loops, sync)
    unprofiled = {name: before[name] + after[name] for name in loops}
    per_iteration = {name: (statistics.median(profiled[name]) - statistics.median(unprofiled[name])) / ITERATIONS
                     for name in loops if name != "host_compute"}
    gpu = {name: per_iteration.pop(name) * ITERATIONS / count
           for name, count in (("gpu_queued_kernel", QUEUED_KERNELS), ("gpu_graph_node", GRAPH_NODES))
           if name in per_iteration}
    c_call = max(per_iteration["c_call"], 0.0)
    op = max(per_iteration["op"] - c_call, 0.0)
    costs = {"python_call": max(per_iteration["python_call"], 0.0), "c_call": c_call, "op": op,
             "memory_event": max((per_iteration["op_alloc"] - c_call - op) / 2, 0.0)}
    if cuda:
        costs["launch"] = max(per_iteration["launch"] - c_call - op, 0.0)
        # per replay: a C call and the launch call, then the nodes (the loop's per-iteration figure is per ITERATIONS)
        replay = per_iteration["graph_replay"] * ITERATIONS / GRAPH_REPLAYS
        costs["graph_node"] = max((replay - c_call - costs["launch"]) / GRAPH_NODES, 0.0)
        costs.update({name: max(ns, 0.0) for name, ns in gpu.items()})
    compute_unprofiled = statistics.median(unprofiled["host_compute"])
    compute_profiled = statistics.median(profiled["host_compute"]) - COMPUTE_CALLS * c_call
    return {
        "per_event_us": {k: round(v / 1e3, 4) for k, v in costs.items()},
        "host_compute_slowdown": round(compute_profiled / compute_unprofiled, 4) if compute_unprofiled else None,
        "settings": {k: bool(options.get(k)) for k in ("record_shapes", "profile_memory", "with_stack")}
        | {"cuda": cuda},
        "iterations": ITERATIONS, "rounds": ROUNDS, "probe_s": round(time.perf_counter() - t0, 3),
        "loop_ms": {name: {"unprofiled_p50": round(statistics.median(unprofiled[name]) / 1e6, 4),
                           "profiled_p50": round(statistics.median(profiled[name]) / 1e6, 4)} for name in loops},
        "definition": ("per recorded event: the median time of a loop under torch.profiler (this run's settings) "
                       "minus its median without, per iteration, less the costs of the other events the iteration "
                       "records (python_call: a Python call's event; c_call: a builtin's; op: a cpu_op; "
                       "memory_event: a [memory] event; launch: a kernel launch call's, CUPTI included; graph_node: "
                       "a CUDA graph launch call's per node of the graph); gpu_queued_kernel and gpu_graph_node: the "
                       "GPU time CUPTI adds per kernel run back to back, eager or in a graph (CUDA events)"),
    }
