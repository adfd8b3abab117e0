"""Pathology: allocator churn. Each step appends to a buffer that grows by 32 MiB (a fresh, larger block every
time) and then calls `torch.cuda.empty_cache()`, so the caching allocator hands its blocks back to the driver and
must cudaMalloc again on the next step."""
import torch

from workloads.base import DecodeWorkload

# 32 MiB of float32 per step: above the allocator's 20 MiB segment size, so every larger copy needs a segment of
# its own (smaller chunks would share one 20 MiB segment and hide the churn for the first steps).
CHUNK_ELEMENTS = 8 << 20


class Workload(DecodeWorkload):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunk = torch.zeros(CHUNK_ELEMENTS, device=self.device)
        self.kept = torch.zeros(0, device=self.device)

    def new_sequence(self) -> None:
        super().new_sequence()
        self.kept = torch.zeros(0, device=self.device)

    def step(self) -> None:
        super().step()
        self.kept = torch.cat([self.kept, self.chunk])  # PATHOLOGY: a growing buffer, a new larger segment every step
        torch.cuda.empty_cache()  # PATHOLOGY: returns every cached block to the driver (cudaFree), so the next step cudaMallocs
