"""Decode-like loop whose attention runs on the host.

Each step: a few linear layers on the GPU make q/k/v for one new token, they
are copied to the CPU, attention over a KV cache kept in host memory (torch CPU
tensors, one position appended per step), the result is copied back to the GPU
and a scalar is read for the 'sampling' decision.

    python3 host_math_step.py trace.json.gz
"""
import gzip
import math
import os
import shutil
import sys

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule

device = "cuda" if torch.cuda.is_available() else "cpu"
HEADS, HEAD_DIM, START_LEN = 16, 64, 1536
D_MODEL = HEADS * HEAD_DIM


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 2048), nn.SiLU(), nn.Linear(2048, D_MODEL))
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.lm_head = nn.Linear(D_MODEL, 4096)


class HostKVCache:
    def __init__(self, length):
        g = torch.Generator().manual_seed(1)
        self.k = torch.randn(HEADS, length, HEAD_DIM, generator=g)
        self.v = torch.randn(HEADS, length, HEAD_DIM, generator=g)

    def append(self, k, v):
        self.k = torch.cat([self.k, k.view(HEADS, 1, HEAD_DIM)], dim=1)
        self.v = torch.cat([self.v, v.view(HEADS, 1, HEAD_DIM)], dim=1)

    def attend(self, q):
        q = q.view(HEADS, 1, HEAD_DIM)
        scores = torch.matmul(q, self.k.transpose(1, 2)) / math.sqrt(HEAD_DIM)
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, self.v).reshape(1, D_MODEL)


def decode_step(block, cache, h):
    h = h + block.mlp(h)
    q, k, v = block.qkv(h).cpu().chunk(3, dim=-1)
    cache.append(k, v)
    attn = cache.attend(q)
    h = h + block.out(attn.to(device))
    logits = block.lm_head(h)
    token = logits.argmax(dim=-1).item()
    return h, token


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
    block = Block().to(device).eval()
    cache = HostKVCache(START_LEN)
    h = torch.randn(1, D_MODEL, device=device) * 0.02

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.inference_mode():
        for _ in range(4):  # warm-up
            h, token = decode_step(block, cache, h)
            h = torch.nn.functional.layer_norm(h, (D_MODEL,))
        with profile(activities=activities,
                     schedule=schedule(wait=1, warmup=1, active=5, repeat=1),
                     on_trace_ready=export_gz(out_path),
                     record_shapes=True, with_stack=True) as prof:
            for _ in range(7):
                h, token = decode_step(block, cache, h)
                h = torch.nn.functional.layer_norm(h, (D_MODEL,))
                prof.step()
    print("cache length", cache.k.shape[1], "last token", token)


if __name__ == "__main__":
    main()
