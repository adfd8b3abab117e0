"""Pathology, two at once, the host work large: each step reads the new token back with `.item()` and then runs
20,000 iterations of workloads/decode_host_work.py's pure-Python helper (~1.5 ms unprofiled on an H100 host, 40,000
recorded calls under with_stack). With the step replayed as a CUDA graph the GPU waits for all of it every step; its
twin without the helper is decode_item_sync."""
from workloads.base import DecodeWorkload
from workloads.decode_host_work import position_checksum
from workloads.decode_item_sync import EOS_TOKEN_ID


class Workload(DecodeWorkload):
    def step(self) -> None:
        super().step()
        token = self.generator.ids[0, 0].item()  # PATHOLOGY: host sync every step (.item() on a CUDA tensor)
        self.finished = token == EOS_TOKEN_ID
        self.checksum = position_checksum(20000)  # PATHOLOGY: host work while nothing is queued on the GPU
