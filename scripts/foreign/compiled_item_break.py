"""A compiled decode-style step whose forward reads a value back in its middle.

A stack of 12 residual MLP blocks at batch 1 (small kernels: the host's launches set the pace), compiled with
torch.compile (mode "default"). Halfway through, the forward checks the activations' scale and rescales them when
they grow. Variants:

  item     `if h.abs().max().item() > LIMIT: h = h * 0.5`: the `.item()` is a graph break (two graphs per step,
           eager code between them) and a read-back that drains the GPU (the pathology)
  where    `h = torch.where(h.abs().max() > LIMIT, h * 0.5, h)`: the same decision on the GPU, one graph, no
           read-back (the fix)

Finding: the sync at the read-back (kind "sync"); the fix removes the read-back and the break, not the work
around it.

    python3 compiled_item_break.py OUT_DIR [--rounds 12]
"""
import torch
import torch.nn as nn

from pairkit import device, main

WIDTH, BLOCKS, LIMIT = 1024, 12, 1e4


class Net(nn.Module):
    def __init__(self, read_back: bool):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                                  nn.Linear(2 * WIDTH, WIDTH)) for _ in range(BLOCKS))
        self.read_back = read_back

    def forward(self, h):
        for i, block in enumerate(self.blocks):
            h = h + block(h)
            if i == BLOCKS // 2:
                if self.read_back:
                    if h.abs().max().item() > LIMIT:
                        h = h * 0.5
                else:
                    h = torch.where(h.abs().max() > LIMIT, h * 0.5, h)
        return h


def make(variant):
    torch.manual_seed(0)
    net = Net(read_back=variant == "item").to(device).eval()
    compiled = torch.compile(net)
    x = torch.randn(1, WIDTH, device=device)

    @torch.inference_mode()
    def step():
        compiled(x)
    return step


if __name__ == "__main__":
    main(__doc__, ("item", "where"), ("sync", "item"), make, profiled_steps=6, steps=50)
