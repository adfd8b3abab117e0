"""torch.compile of our eager Qwen2 decode step, as a user would compile it: `Generator._decode` (the forward over the
static KV cache, greedy or sampled token selection, and the in-place updates of the next input, its position and the
token history) becomes one compiled graph (`fullgraph=True`, static shapes) with `compile.mode`.

The prefill stays eager (it runs once per sequence, at its own length). The state the step reads and writes (KV cache,
mask, rotary tables, ids, position, history) is marked as static addresses, as torch.compile's documentation asks for
CUDA graphs: with `reduce-overhead` / `max-autotune` on CUDA each step is then one CUDA-graph replay of the compiled
kernels, with no input copies. Compilation (and, with CUDA graphs, the warm-up and recording runs) happens in the
capture's warm-up steps (`timing.warmup_steps` >= 3 is enforced), so the timed and profiled steps are steady-state
compiled decode. Greedy tokens equal the eager decode's.
"""
from __future__ import annotations

import os
import shutil
import time

import torch

from analyzer.errors import UsageError
from workloads.base import DecodeWorkload

#: compile, CUDA-graph warm-up run, CUDA-graph recording: the steps before a `reduce-overhead` step is steady state
WARMUP_CALLS = 3
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def toolchain_problem(device) -> str | None:
    """Why inductor cannot compile on `device` here, or None: C++ kernels on the CPU need a C++ compiler; Triton
    kernels on CUDA need Triton and a C compiler (for its launcher)."""
    if device.type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:
            has_triton = None
        if has_triton is not None and not has_triton():
            return "inductor on CUDA needs Triton, which torch cannot import here (pip install triton)"
        if not (os.environ.get("CC") or any(shutil.which(c) for c in ("cc", "gcc", "clang"))):
            return "Triton needs a C compiler (cc, gcc or clang; or set CC), and none is on PATH"
        return None
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
    except ImportError:
        return None  # an older inductor: let the compile itself report
    except Exception as exc:  # InvalidCxxCompiler and kin
        return (f"inductor on the CPU needs a C++ compiler (g++ or clang++, or set CXX): "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__}")
    return None


class Workload(DecodeWorkload):
    option_sections = ("compile",)

    @classmethod
    def check_workload(cls, workload, device) -> None:
        where = f"{workload.path}: key"
        if workload.mode != "eager":
            raise UsageError(f"{where} 'mode': compile_decode compiles the eager decode step (for CUDA graphs use "
                             f"compile.mode=reduce-overhead); allowed: eager")
        if workload.timing.compare_modes:
            raise UsageError(f"{where} 'timing.compare_modes': compile_decode has no eager/cuda_graph pair to "
                             f"compare (capture decode.yaml for the eager step); allowed: false")
        if workload.timing.warmup_steps < WARMUP_CALLS:
            raise UsageError(f"{where} 'timing.warmup_steps': {workload.timing.warmup_steps} leaves compilation "
                             f"or CUDA-graph recording in the timed steps; allowed: {WARMUP_CALLS} or more")
        problem = toolchain_problem(device)
        if problem:
            raise UsageError(f"{where} 'script': compile_decode: {problem}")

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed, options):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode="eager", seed=seed)
        self.compile_mode = options["compile.mode"]
        gen = self.generator
        for tensor in (*gen.cache.keys, *gen.cache.values, gen.cache.mask, gen.ids, gen.pos, gen.history,
                       model._cos, model._signed_sin):
            torch._dynamo.mark_static_address(tensor)
        gen._decode = torch.compile(gen._decode, mode=self.compile_mode, fullgraph=True, dynamic=False)
        self.calls = 0
        self.first_calls_s: list[float] = []

    def step(self) -> None:
        if self.calls < WARMUP_CALLS:  # compilation and CUDA-graph recording: time them for meta.json
            t0 = time.perf_counter()
            super().step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.first_calls_s.append(time.perf_counter() - t0)
        else:
            super().step()
        self.calls += 1

    def describe(self) -> dict:
        from torch._dynamo.utils import counters
        return {"compiled": "workloads.qwen2.Generator._decode", "compile_mode": self.compile_mode,
                "backend": "inductor", "fullgraph": True, "dynamic": False,
                "cuda_graphs": self.device.type == "cuda" and self.compile_mode in CUDA_GRAPH_MODES,
                "first_calls_s": self.first_calls_s,
                "unique_graphs": counters["stats"]["unique_graphs"],
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}
