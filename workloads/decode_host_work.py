"""Pathology: after each decode step, pure-Python bookkeeping in a helper (a checksum over the step's positions,
written as a generator expression) runs while nothing is queued on the GPU."""
import math

from workloads.base import DecodeWorkload


def position_checksum(count: int) -> float:
    return sum(math.sqrt(i) * 3.0 % 7.0 for i in range(count))  # PATHOLOGY: host work between GPU steps


class Workload(DecodeWorkload):
    def step(self) -> None:
        super().step()
        self.checksum = position_checksum(3000)
