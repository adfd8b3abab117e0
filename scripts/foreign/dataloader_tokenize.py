"""A classifier fed by a DataLoader whose dataset tokenizes raw text in Python, in the loading process.

Each sample is a 3,000-character text, tokenized by `__getitem__` with a pure-Python greedy longest match (about
0.3 ms a sample), batch 16; the model is a 4-layer MLP over the mean of the token embeddings; each step logs
its loss with `.item()`, so the host waits for the GPU every step and the next batch is loaded after. Variants:

  inline    DataLoader(num_workers=0): the batch is tokenized on the training thread, in `__next__`, while the
            GPU has nothing queued (the pathology)
  workers   DataLoader(num_workers=2, persistent_workers=True, prefetch_factor=4): batches are tokenized in
            worker processes ahead of time (the fix)

Finding: the input wait (kind "input_wait").

    python3 dataloader_tokenize.py OUT_DIR [--rounds 12]
"""
import random

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from pairkit import device, main
from tokenizer_threads import VOCAB, tokenize  # the same greedy pure-Python tokenizer

CHARS, BATCH, WIDTH = 3000, 16, 1024
LETTERS = "abcdefghijklmnopqrstuvwxyz "


class Texts(Dataset):
    def __init__(self, count=4096, seed=1):
        rng = random.Random(seed)
        self.texts = ["".join(rng.choice(LETTERS) for _ in range(CHARS)) for _ in range(64)]
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        ids = tokenize(self.texts[i % len(self.texts)])[:512]
        ids += [0] * (512 - len(ids))
        return torch.tensor(ids), i % 10


def make(variant):
    torch.manual_seed(0)
    embed = nn.EmbeddingBag(len(VOCAB), WIDTH, mode="mean").to(device)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    head = nn.Sequential(*layers, nn.Linear(WIDTH, 10)).to(device)
    opt = torch.optim.AdamW([*embed.parameters(), *head.parameters()], lr=1e-4)
    extra = dict(num_workers=2, persistent_workers=True, prefetch_factor=4) if variant == "workers" else {}
    loader = DataLoader(Texts(), batch_size=BATCH, shuffle=False, pin_memory=device == "cuda", **extra)
    batches = iter(())
    log = []

    def step():
        nonlocal batches
        try:
            ids, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            ids, labels = next(batches)
        ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(head(embed(ids)), labels)
        loss.backward()
        opt.step()
        log.append(loss.item())
    return step


if __name__ == "__main__":
    main(__doc__, ("inline", "workers"), ("input_wait", None), make, profiled_steps=6, steps=16,
         step_label="train_step")
