"""What the phases of one capture share: the config, the device, the run folder being written, the progress line and
the notes for meta.json. The workload's results are not kept here: each phase returns its own part of meta.json."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from analyzer.capture.config import CaptureConfig
from analyzer.capture.runfolder import RunFolder
from analyzer.progress import Progress


@dataclasses.dataclass
class CaptureSession:
    config: CaptureConfig
    device: torch.device
    run: RunFolder
    progress: Progress
    notes: list[str] = dataclasses.field(default_factory=list)
    #: this process's tensor-parallel rank (0 when the workload is not split): it names the files it writes
    rank: int = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def note(self, text: str) -> None:
        """A fact about the run that its reader should know (meta.json's `notes`)."""
        self.notes.append(text)

    def file(self, name: str) -> Path:
        """Where a file of the run folder is written (in the hidden staging folder until it is published)."""
        return self.run.path(name)

    def rank_file(self, name: str) -> str:
        """This rank's file of rank 0's `name`: `rank0.trace.json.gz` -> `rank<N>.trace.json.gz`,
        `memory_snapshot.pickle` -> `rank<N>.memory_snapshot.pickle` (rank 0 keeps the name)."""
        if self.rank == 0:
            return name
        return f"rank{self.rank}.{name.removeprefix('rank0.')}"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def memory_sample(self) -> dict:
        """memory_allocated / memory_reserved now (CUDA; nothing on the CPU)."""
        if not self.cuda:
            return {}
        return {"allocated_bytes": torch.cuda.memory_allocated(self.device),
                "reserved_bytes": torch.cuda.memory_reserved(self.device)}

    def memory_stats(self) -> dict:
        """The caching allocator's numeric counters (CUDA; nothing on the CPU). One call costs ~1 ms of Python."""
        if not self.cuda:
            return {}
        return {k: v for k, v in torch.cuda.memory_stats(self.device).items() if isinstance(v, (int, float))}
