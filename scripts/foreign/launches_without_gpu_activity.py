"""A trace with the CUDA runtime's launch calls but no GPU-side activity.

The profiler is asked for the CPU activity alone on a CUDA machine. Kineto's
CPU group still includes the CUDA runtime/driver API records (cudaLaunchKernel,
cudaMemcpyAsync, ...), so CUPTI records the launches, but kernel, memcpy and
memset activity (the CUDA group) is never enabled: the launches appear with
nothing on the GPU timeline.

    python3 launches_without_gpu_activity.py trace.json.gz
"""
import gzip
import os
import shutil
import sys

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule


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
        nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(),
        nn.LayerNorm(2048), nn.Linear(2048, 512),
    ).cuda().eval()
    x = torch.randn(64, 512, device="cuda")
    with torch.inference_mode():
        for _ in range(10):  # warm-up
            x = torch.tanh(model(x))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU],
                     schedule=schedule(wait=1, warmup=1, active=5, repeat=1),
                     on_trace_ready=export_gz(out_path),
                     record_shapes=True) as prof:
            for _ in range(7):
                x = torch.tanh(model(x))
                prof.step()
        torch.cuda.synchronize()
    print("out", tuple(x.shape))


if __name__ == "__main__":
    main()
