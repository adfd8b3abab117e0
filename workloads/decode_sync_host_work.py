"""Pathology, two at once: each step reads the new token back with `.item()` and then runs pure-Python host work
(workloads/decode_host_work.py's helper). With the step replayed as a CUDA graph the GPU is the bottleneck, and
either fix pays: without the read-back the host work hides under the next step's GPU work; without the host work
the GPU waits only for the read-back."""
from workloads.base import DecodeWorkload
from workloads.decode_host_work import position_checksum
from workloads.decode_item_sync import EOS_TOKEN_ID


class Workload(DecodeWorkload):
    def step(self) -> None:
        super().step()
        token = self.generator.ids[0, 0].item()  # PATHOLOGY: host sync every step (.item() on a CUDA tensor)
        self.finished = token == EOS_TOKEN_ID
        self.checksum = position_checksum(3000)  # PATHOLOGY: host work while nothing is queued on the GPU
