"""Greedy decoding that detokenizes after every step, in pure Python.

Each step: embedding, a stack of MLP blocks, the LM head and argmax on the GPU; `.tolist()` of the new token (a
read-back); then the text so far is rebuilt from the vocabulary pieces and normalized (incremental detokenization,
a few ms of Python over a 4,000-token text) while nothing is queued on the GPU. Variants (--detok):

  step    detokenize after every step (the pathology)
  end     keep the ids and detokenize once after the last step (the fix)

The profiled window is 16 steps after 2 warm-up steps (with_stack on, record_shapes on): strip the Python events to
get what most users' traces hold. Then both variants are timed without the profiler in interleaved rounds;
per-step times in truth.json beside the trace.

    python3 detokenize_steps.py OUT_DIR [--detok step]
"""
import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule

device = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB, WIDTH, DEPTH = 8000, 1024, 8


def make_pieces(seed=0):
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzéèàç"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(1, 8))) for _ in range(VOCAB)]


PIECES = make_pieces()


BYTE_DECODER = {chr(b if 33 <= b < 127 else 256 + b): b for b in range(256)}  # byte-level BPE's char <-> byte
for _c in "abcdefghijklmnopqrstuvwxyzéèàç ":
    BYTE_DECODER.setdefault(_c, ord(_c) if ord(_c) < 256 else 63)


def detokenize(ids, previous=""):
    """The whole text so far, decoded the way a slow (pure-Python) byte-level BPE tokenizer's decode() does it (pieces
    joined, every character mapped back to its byte, the bytes decoded as UTF-8), and the part that is new since the
    previous step's text (its common prefix walked character by character): what an incremental detokenizer that
    re-decodes the sequence every step costs, written plainly."""
    text = "".join([PIECES[i] if i % 3 else " " + PIECES[i] for i in ids])
    buf = [0] * len(text)
    k = 0
    for c in text:
        buf[k] = BYTE_DECODER[c]
        k += 1
    raw = bytes(buf).decode("utf-8", errors="replace")
    i, n = 0, min(len(raw), len(previous))
    while i < n and raw[i] == previous[i]:
        i += 1
    return raw, raw[i:]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                                  nn.Linear(2 * WIDTH, WIDTH)) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, token):
        x = self.embed(token)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x).argmax(dim=-1)


class Decoding:
    def __init__(self, model, detok, prompt_tokens=6000):
        self.model, self.detok = model, detok
        self.ids = [random.Random(1).randrange(VOCAB) for _ in range(prompt_tokens)]
        self.token = torch.tensor([self.ids[-1]], device=device)
        self.text = ""

    def step(self):
        self.token = self.model(self.token)
        self.ids += self.token.tolist()
        if self.detok == "step":
            self.text, self.new_text = detokenize(self.ids, self.text)

    def finish(self):
        self.text, self.new_text = detokenize(self.ids, self.text)


def median(values):
    values = list(values)
    return statistics.median(values) if values else None  # --rounds 0: no timing


def export_gz(out_path):
    def handler(prof):
        raw = out_path[:-3]
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(out_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        print("wrote", out_path, os.path.getsize(out_path), "bytes")
    return handler


def run_steps(dec, n):
    t0 = time.perf_counter()
    for _ in range(n):
        dec.step()
    dec.finish()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--detok", default="step", choices=["step", "end"])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = Model().to(device).eval()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    ids = Decoding(model, "step").ids
    detok_ms = []
    for _ in range(5):
        t0 = time.perf_counter()
        detokenize(ids, "")
        detok_ms.append((time.perf_counter() - t0) * 1e3)
    detok_ms = median(detok_ms)
    with torch.inference_mode():
        dec = Decoding(model, args.detok)
        for _ in range(4):
            dec.step()
        with profile(activities=activities, schedule=schedule(wait=0, warmup=2, active=16, repeat=1),
                     on_trace_ready=export_gz(os.path.join(args.out_dir, "trace.json.gz")),
                     record_shapes=True, with_stack=True) as prof:
            for _ in range(18):
                dec.step()
                prof.step()
        per_round = {"step": [], "end": []}
        for kind in per_round:
            run_steps(Decoding(model, kind), 4)
        for _ in range(args.rounds):
            for kind in per_round:
                per_round[kind].append(run_steps(Decoding(model, kind), args.steps))
    truth = {"detok": args.detok, "torch": torch.__version__, "detokenize_ms_alone": detok_ms,
             "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "profiled_steps": 16, "rounds": args.rounds, "steps_per_round": args.steps, "ms_per_step": per_round,
             "median_ms_per_step": {k: median(r) for k, r in per_round.items()},
             "saving_end_ms": median(s - e for s, e in zip(per_round["step"], per_round["end"]))}
    with open(os.path.join(args.out_dir, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps({k: truth[k] for k in ("detokenize_ms_alone", "median_ms_per_step", "saving_end_ms")}))


if __name__ == "__main__":
    main()
