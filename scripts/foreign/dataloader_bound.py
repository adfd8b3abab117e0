"""Inference fed by a slow DataLoader.

Each item costs ~2 ms of Python/numpy in the worker; the MLP on the GPU is far
faster, so the main thread waits in the DataLoader iterator most of each step.

    python3 dataloader_bound.py trace.json.gz
"""
import gzip
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

device = "cuda" if torch.cuda.is_available() else "cpu"


class SlowFeatures(Dataset):
    """Fake 'decode + featurize' of one sample."""

    def __init__(self, n=1024, dim=256):
        self.n, self.dim = n, dim

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        time.sleep(0.002)  # pretend to read a file
        rng = np.random.default_rng(idx)
        signal = rng.standard_normal(4096).astype(np.float32)
        spec = np.abs(np.fft.rfft(signal))[: self.dim]
        feats = (spec - spec.mean()) / (spec.std() + 1e-6)
        return torch.from_numpy(feats.astype(np.float32))


def open_shard(worker_id):
    # Each worker opens its own shard before reading; the second one comes up
    # about half a batch later, so the two workers' batches arrive staggered.
    time.sleep(0.018 * worker_id)


def export_gz(out_path):
    def handler(prof):
        raw = out_path[:-3] if out_path.endswith(".gz") else out_path + ".raw.json"
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(out_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        print("wrote", out_path, os.path.getsize(out_path), "bytes")
    return handler


def main():
    out_path = sys.argv[1]
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10)
    ).to(device).eval()
    loader = DataLoader(SlowFeatures(), batch_size=16, num_workers=2, pin_memory=False,
                        worker_init_fn=open_shard)

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.inference_mode():
        # Warm the model up (cuBLAS set-up, first kernels) before the workers start.
        for _ in range(3):
            model(torch.randn(16, 256, device=device))
        # The profiler's warm-up steps (its set-up runs on entering, before the
        # workers start) double as the loop's warm-up iterations.
        warmup_iters, active_iters = 3, 5
        with profile(activities=activities,
                     schedule=schedule(wait=0, warmup=warmup_iters, active=active_iters, repeat=1),
                     on_trace_ready=export_gz(out_path),
                     with_stack=True) as prof:
            for i, batch in enumerate(loader):
                x = batch.to(device)
                preds = model(x).argmax(dim=-1)
                prof.step()
                if i == warmup_iters + active_iters - 1:
                    break
    print("last preds", tuple(preds.shape))


if __name__ == "__main__":
    main()
