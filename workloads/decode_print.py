"""Pathology: the decode loop prints the new tokens every step. Formatting a CUDA tensor copies it to the host and
synchronises (several times per print), so every step ends with the GPU drained."""
import io

from workloads.base import DecodeWorkload


class Workload(DecodeWorkload):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = io.StringIO()  # keeps the terminal clean; the formatting, and so the sync, still happens

    def step(self) -> None:
        super().step()
        print(f"step {self.steps_done}: tokens {self.generator.ids[:, 0]}", file=self.log)  # PATHOLOGY: print(tensor)
