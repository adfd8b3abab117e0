"""Pathology: allocator churn at a steady rate. Each step takes a 32 MiB scratch buffer and then calls
`torch.cuda.empty_cache()`, so the caching allocator hands every cached block back to the driver (cudaFree, which
synchronizes the device) and the next step must cudaMalloc the scratch buffer and its own activations again. Unlike
alloc_churn (a buffer that grows every step), every step pays the same: the profiled window's steps cost what the
timed steps cost (on an H100, only 0.04 ms a step against the plain decode)."""
import torch

from workloads.base import DecodeWorkload

# 32 MiB of float32: above the allocator's 20 MiB segment size, so it takes a segment of its own
CHUNK_ELEMENTS = 8 << 20


class Workload(DecodeWorkload):
    def step(self) -> None:
        super().step()
        scratch = torch.empty(CHUNK_ELEMENTS, device=self.device)  # PATHOLOGY: a fresh 32 MiB segment every step
        del scratch
        torch.cuda.empty_cache()  # PATHOLOGY: every cached block back to the driver, so the next step cudaMallocs
