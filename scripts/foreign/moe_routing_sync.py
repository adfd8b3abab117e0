"""A mixture-of-experts forward that reads its routing back to the host in every layer.

8 layers over 4,096 tokens; each routes every token to one of 8 experts (a linear router and argmax), groups the
tokens by expert and runs each expert's MLP on its group. Grouping needs each expert's token count as a Python int
for torch.split. Variants:

  tolist   `(expert[:, None] == ids).sum(0).tolist()`: a read-back per layer (8 per step); the GPU drains, and stays idle
           while the host goes from the read-back to the next layer's launches (the pathology)
  static   the same kernels, the counts known on the host: routing here is balanced by construction (each expert
           gets every 8th token after a sort), so the counts are fixed and need no read-back (the fix)

fp32, width 2048, expert hidden 4096: each layer's GPU work is well above its host launch time, so the step is
GPU-bound and the read-backs are what idles the GPU. Finding: the sync (kind "sync").

    python3 moe_routing_sync.py OUT_DIR [--rounds 12]
"""
import torch
import torch.nn as nn

from pairkit import device, main

TOKENS, WIDTH, HIDDEN, EXPERTS, LAYERS = 4096, 2048, 4096, 8, 8


class MoeLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(WIDTH, EXPERTS)
        self.up = nn.ModuleList(nn.Linear(WIDTH, HIDDEN) for _ in range(EXPERTS))
        self.down = nn.ModuleList(nn.Linear(HIDDEN, WIDTH) for _ in range(EXPERTS))
        self.register_buffer("ids", torch.arange(EXPERTS))

    def forward(self, x, read_back: bool):
        scores = self.router(x)
        # balanced routing: rank tokens by their score margin and deal them round-robin to the experts
        order = torch.argsort(scores.max(dim=1).values)
        expert = torch.empty_like(order)
        expert[order] = torch.arange(TOKENS, device=x.device) % EXPERTS
        by_expert = torch.argsort(expert, stable=True)
        if read_back:
            counts = (expert[:, None] == self.ids).sum(dim=0).tolist()
        else:
            counts = [TOKENS // EXPERTS] * EXPERTS
        groups = torch.split(x[by_expert], counts)
        out = torch.cat([self.down[e](torch.relu(self.up[e](g))) for e, g in enumerate(groups)])
        y = torch.empty_like(x)
        y[by_expert] = out
        return x + y


def make(variant):
    layers = nn.ModuleList(MoeLayer() for _ in range(LAYERS)).to(device).eval()
    x = torch.randn(TOKENS, WIDTH, device=device) * 0.1
    read_back = variant == "tolist"

    @torch.inference_mode()
    def step():
        h = x
        for layer in layers:
            h = layer(h, read_back)
    return step


if __name__ == "__main__":
    main(__doc__, ("tolist", "static"), ("sync", None), make, profiled_steps=4, steps=8)
