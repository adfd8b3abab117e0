"""CUPTI's GPU time per CUDA graph node, by node kind (CUDA only): graphs of 128 nodes of one kind (an elementwise
add, a bf16 matmul, a memset, cuDNN/flash SDPA at decode shapes, a copy), each replayed behind a sleeping kernel with
CUDA events around the replay, without and with torch.profiler (this project's default settings).

    python benchmarks/cupti_graph_nodes.py

Why: on a 24-layer decode graph (588 nodes) CUPTI added 0.29 µs a node (2,229 against 2,056 µs a replay, H100),
where the capture's probe (a graph of elementwise adds) measured 0.2 and synthetic add/mm/softmax graphs 0.11-0.13;
in that trace the gap before each SDPA node was ~5 µs and before each memset ~1.3 µs against 0.45 µs elsewhere. If
some node kinds cost CUPTI much more, the probe should time them and the replay cut gaps by kind."""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

NODES = 128
ROUNDS = 15


def node_kinds(dev: torch.device) -> dict:
    bf = torch.bfloat16
    x, a = torch.randn(8, 896, device=dev, dtype=bf), torch.randn(8, 896, device=dev, dtype=bf)
    w, o = torch.randn(896, 896, device=dev, dtype=bf), torch.empty(8, 896, device=dev, dtype=bf)
    z = torch.empty(1 << 16, device=dev)
    q = torch.randn(8, 14, 1, 64, device=dev, dtype=bf)
    k, v = (torch.randn(8, 14, 256, 64, device=dev, dtype=bf) for _ in range(2))
    return {"add": lambda: x.add_(a), "mm": lambda: torch.mm(a, w, out=o), "memset": lambda: z.zero_(),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v), "copy": lambda: o.copy_(x)}


def graph_of(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graphs asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(NODES):
            fn()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph) -> float:
    """GPU µs of one replay queued behind a sleeping kernel (so its launch is not what is timed)."""
    torch.cuda._sleep(2_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    print("| node kind | replay, unprofiled (µs) | profiled (µs) | CUPTI per node (ns) |\n|---|---|---|---|")
    for name, fn in node_kinds(torch.device("cuda")).items():
        try:
            graph = graph_of(fn)
        except RuntimeError as exc:  # a kernel this GPU or build cannot capture
            print(f"| {name} | not captured: {str(exc).splitlines()[0][:80]} | | |")
            continue
        for _ in range(3):
            replay_us(graph)
        base = statistics.median(replay_us(graph) for _ in range(ROUNDS))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                     profile_memory=True, with_stack=True):
            profiled = statistics.median(replay_us(graph) for _ in range(ROUNDS))
        print(f"| {name} | {base:.1f} | {profiled:.1f} | {(profiled - base) / NODES * 1e3:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
