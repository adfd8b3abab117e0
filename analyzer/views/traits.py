"""What kind of run a trace records, so that words and advice fit it: training or inference, decode steps or other
steps, CUDA or HIP, eager launches or CUDA-graph replay / capture."""
from __future__ import annotations

import dataclasses
import re

from analyzer.views import apis
from analyzer.views.graphs import GraphUse
from analyzer.trace import TraceModel
from analyzer.views.waits import present_codes

_TRAINING_OP = re.compile(r"^autograd::engine::evaluate_function|^Optimizer\.(step|zero_grad)#|"
                          r"^torch::autograd::AccumulateGrad$")
_COMPILED_OP = re.compile(r"^CompiledFunction|^Torch-Compiled Region|^## Call CompiledFxGraph|^CompiledFxGraph")


def is_compiled_region(op_name: str) -> bool:
    """A torch.compile graph's own op (Dynamo's compiled region, AOT autograd's function, Inductor's graph call)."""
    return bool(_COMPILED_OP.search(op_name))


_HIP_NAMES = {"cudaMalloc": "hipMalloc", "cudaFree": "hipFree", "cudaStreamSynchronize": "hipStreamSynchronize",
              "cudaDeviceSynchronize": "hipDeviceSynchronize", "cudaLaunchKernel": "hipLaunchKernel",
              "cudaGraphLaunch": "hipGraphLaunch"}


@dataclasses.dataclass(frozen=True)
class TraceTraits:
    training: bool
    hip: bool
    graphs: GraphUse
    decode: bool  # the steps are decode steps (our runtime's annotations, or named so)
    compiled: bool  # torch.compile graphs ran (AOT autograd's CompiledFunction, Inductor's compiled regions)

    @property
    def step_word(self) -> str:
        return "decode step" if self.decode and not self.training else "step"

    @property
    def graph_word(self) -> str:
        return "HIP graph" if self.hip else "CUDA graph"

    @property
    def runtime_word(self) -> str:
        return "HIP" if self.hip else "CUDA"

    def api(self, cuda_name: str) -> str:
        """The API as this trace's runtime spells it (cudaMalloc -> hipMalloc on ROCm)."""
        return _HIP_NAMES.get(cuda_name, cuda_name) if self.hip else cuda_name

    @property
    def alloc_conf(self) -> str:
        return "PYTORCH_HIP_ALLOC_CONF" if self.hip else "PYTORCH_CUDA_ALLOC_CONF"

    def as_dict(self) -> dict:
        return {"training": self.training, "runtime": self.runtime_word, "decode": self.decode,
                "compiled": self.compiled, "graphs": self.graphs.as_dict()}


def trace_traits(model: TraceModel, graphs: GraphUse, step_names: list[str], compiled_frames: bool) -> TraceTraits:
    op_codes = present_codes(model.ops.name, len(model.names)).tolist()
    training = any(_TRAINING_OP.search(model.names[c]) for c in op_codes)
    compiled = compiled_frames or any(is_compiled_region(model.names[c]) for c in op_codes)
    decode = any(n.startswith("decode") for n in step_names)
    return TraceTraits(training=training, hip=apis.is_hip(model), graphs=graphs, decode=decode, compiled=compiled)
