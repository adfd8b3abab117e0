"""Pathology: a fragmented cache. After each step the loop keeps a scratch buffer whose size changes every call (a
workspace sized by the sequence so far) and a small one of varying size. Each larger request fits no cached block,
so the caching allocator reserves a new segment while the previous one goes back to its cache; the small requests
are carved out of those cached segments. Reserved memory grows step after step while allocated memory stays flat,
without any empty_cache()."""
import torch

from workloads.base import DecodeWorkload

MIB = 1 << 20


class Workload(DecodeWorkload):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0  # across sequences: the sizes keep changing over the whole run
        self.scratch: list[torch.Tensor] = []

    def step(self) -> None:
        super().step()
        self.calls += 1
        workspace = torch.empty((8 + self.calls) * MIB, dtype=torch.uint8, device=self.device)  # PATHOLOGY: a new size every step
        small = torch.empty((2 + 5 * self.calls % 9) * MIB, dtype=torch.uint8, device=self.device)  # PATHOLOGY: carved from cached segments
        self.scratch = [workspace, small]  # the previous step's buffers are freed here, back to the cache
