"""Tensor-parallel decode (issue 16): the clean decode loop of decode.py, its model split over `tp` ranks.

`python -m analyzer capture workloads/tp_decode.yaml` starts one process per rank (analyzer/capture/distributed.py);
each builds its slices of the model (workloads/qwen2/parallel.py) and runs this script. With `straggler.rank` set,
that rank sleeps `straggler.delay_ms` in `straggler_sleep()` below, right before the first attention all-reduce of
every decode step, so every other rank waits for it inside that all-reduce: a straggler whose rank and line are known.
"""
from __future__ import annotations

import hashlib
import time

from workloads.base import DecodeWorkload


def straggler_sleep(delay_s: float) -> None:
    """THE PLANTED STRAGGLER: this rank arrives late at the attention all-reduce by `delay_s` seconds."""
    time.sleep(delay_s)


class PlantedStraggler:
    """Called before every attention all-reduce (TensorParallel.before_attention_all_reduce); sleeps before the
    first one of each decode step (layer 0), once the step has armed it."""

    def __init__(self, delay_ms: float):
        self.delay_s = delay_ms / 1000
        self.armed = False

    def arm(self) -> None:
        self.armed = True

    def before_all_reduce(self, layer_index: int) -> None:
        if self.armed and layer_index == 0:
            self.armed = False
            straggler_sleep(self.delay_s)


class Workload(DecodeWorkload):
    #: the capture may launch this script with tp > 1 (analyzer/capture/prepare.py check_tensor_parallel)
    tensor_parallel = True
    option_sections = ("straggler",)

    @classmethod
    def check_workload(cls, workload, device) -> None:
        if workload.straggler.rank is not None and workload.mode == "cuda_graph":
            from analyzer.errors import UsageError
            raise UsageError(f"{workload.path}: key 'straggler.rank': a planted straggler sleeps in Python, which a "
                             "CUDA graph replay never runs; allowed with mode cuda_graph: null")

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed, options):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode=mode, seed=seed)
        self.straggler = None
        if options["straggler.rank"] == model.tp.rank:
            self.straggler = PlantedStraggler(options["straggler.delay_ms"])
            model.tp.before_attention_all_reduce = self.straggler.before_all_reduce
        self.straggler_options = {"rank": options["straggler.rank"], "delay_ms": options["straggler.delay_ms"]}

    def step(self) -> None:
        if self.straggler is not None:
            self.straggler.arm()
        super().step()

    def describe(self) -> dict:
        """The rank, its shard, the straggler, and a digest of every token of the last sequence: equal digests
        across world sizes mean identical generated tokens."""
        tokens = self.tokens()
        shard = self.model.shard
        return {"tp_rank": self.model.tp.rank, "tp_size": self.model.tp.size,
                "q_heads": list(shard.q_heads), "kv_heads": list(shard.kv_heads),
                "straggler": {**self.straggler_options, "planted_here": self.straggler is not None,
                              "function": "workloads/tp_decode.py straggler_sleep()",
                              "where": "before layer 0's attention all-reduce, once per decode step"},
                "tokens_shape": list(tokens.shape),
                "tokens_sha1": hashlib.sha1(str(tokens.tolist()).encode()).hexdigest()}
