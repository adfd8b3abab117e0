"""A training loop that logs its loss and gradient norm every step.

A 6-layer MLP classifier (width 2048, batch 512, fp32) trained with AdamW; each step: forward, cross-entropy,
backward (autograd's own thread launches the backward kernels), gradient clipping, optimizer step. Variants:

  every_step   `loss.item()` and the clipped gradient norm's `.item()` every step, for the log (two read-backs
               that drain the GPU each step; the pathology)
  no_readback  the loss and norm kept on the GPU, summed, read once after the timed steps (the fix)

Finding: the syncs (kind "sync"), priced on a training step: forward, backward and optimizer.

    python3 training_readback.py OUT_DIR [--rounds 12]
"""
import torch
import torch.nn as nn

from pairkit import device, main

WIDTH, DEPTH, BATCH, CLASSES = 2048, 6, 512, 1000


def make(variant):
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(BATCH, WIDTH, device=device)
    y = torch.randint(0, CLASSES, (BATCH,), device=device)
    log = []
    kept = torch.zeros(2, device=device)

    def step():
        nonlocal kept
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if variant == "every_step":
            log.append((loss.item(), norm.item()))
        else:
            kept = kept + torch.stack([loss.detach(), norm])
    return step


if __name__ == "__main__":
    main(__doc__, ("every_step", "no_readback"), ("sync", "item"), make, profiled_steps=4, steps=10,
         step_label="train_step")
