"""Profile torch.compile's first calls of a function, compilation included.

Inductor's and Triton's caches point at new empty folders, so the first call
in the window traces, lowers and compiles the function from scratch (Dynamo,
AOTAutograd, Inductor, Triton); three more calls follow.

This is the process's first compile, so the window also holds Dynamo's and
Inductor's own imports and set-up. Python stacks are off: with them on, the
profiler records every Python and C call of the compiler (421,237 Python events,
an 8.5 MB gzip trace, even with Dynamo/Inductor set up by another compile before
the window), far past a small fixture; Dynamo's and Inductor's own
record_function ranges still mark the compile.

    python3 compile_in_window.py trace.json.gz [--cuda-only]

--cuda-only records CUDA activity alone (no CPU ops): the compile is then untraced host time before the first Triton
kernel's launch.
"""
import os
import sys
import tempfile

_cache_root = tempfile.mkdtemp(prefix="compile_in_window_")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_cache_root, "inductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_cache_root, "triton")

import gzip  # noqa: E402
import shutil  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"


@torch.compile
def bias_gelu(x, bias):
    return torch.nn.functional.gelu(x + bias) * 0.5


def main():
    out_path = sys.argv[1]
    torch.manual_seed(0)

    x = torch.randn(64, 1024, device=device)
    bias = torch.randn(1024, device=device)
    cuda_only = "--cuda-only" in sys.argv[2:] and device == "cuda"
    activities = [] if cuda_only else [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.inference_mode():
        with profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=4, repeat=1),
                     with_stack=False) as prof:
            for i in range(4):
                if i:
                    prof.step()
                y = bias_gelu(x, bias)
            if device == "cuda":
                torch.cuda.synchronize()
    print("out", tuple(y.shape), "cache", _cache_root)

    raw = out_path[:-3] if out_path.endswith(".gz") else out_path + ".raw.json"
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(out_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    shutil.rmtree(_cache_root, ignore_errors=True)
    print("wrote", out_path, os.path.getsize(out_path), "bytes")


if __name__ == "__main__":
    main()
