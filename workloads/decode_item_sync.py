"""Pathology: the decode loop reads each new token back with `.item()` (an end-of-sequence check), which makes the
CPU wait for the GPU to drain every step."""
from workloads.base import DecodeWorkload

EOS_TOKEN_ID = 151643  # Qwen2's <|endoftext|>


class Workload(DecodeWorkload):
    def step(self) -> None:
        super().step()
        token = self.generator.ids[0, 0].item()  # PATHOLOGY: host sync every step (.item() on a CUDA tensor)
        self.finished = token == EOS_TOKEN_ID
