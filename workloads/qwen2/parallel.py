"""Tensor parallelism for the Qwen2 runtime, Megatron-style.

Each rank of `size` holds a slice of every weight, cut from the full weights at load time (`shard_tensor`):
- attention: column-parallel q/k/v (the rank's query heads and the KV heads they read), row-parallel o_proj, one
  all-reduce of the attention output;
- MLP: column-parallel gate/up (a slice of the intermediate size), row-parallel down_proj, one all-reduce;
- embedding and LM head: vocab-parallel (a slice of the vocabulary rows, padded to a multiple of `size`); the
  embedding's rows are summed with one all-reduce, the logits all-gathered.

So one forward does `2 * layers + 1` all-reduces and one all-gather. The KV cache holds the rank's KV heads only.

KV heads are split when their count divides by `size`; otherwise, when `size` divides by it, each KV head is
replicated on `size / kv_heads` ranks and its query heads split among them (Qwen2-0.5B at tp=4: KV heads 2, query
heads 7 per KV head -> 4, 3, 4, 3 query heads per rank). Any other combination is refused with a one-line ValueError.

`size == 1` is the model as it always was: the full shapes, no process group, and every collective returns its input
unchanged, so the numbers are bit for bit those of a model built without tensor parallelism.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .config import Qwen2Config


def _split(n: int, parts: int, i: int) -> tuple[int, int]:
    """[start, stop) of part `i` of `n` items cut into `parts` parts, the first `n % parts` one item longer."""
    base, extra = divmod(n, parts)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


@dataclasses.dataclass(frozen=True)
class Shard:
    """What rank `rank` of `size` holds: [start, stop) ranges of query heads, KV heads, intermediate columns and
    vocabulary rows (`vocab_rows` rows in all, padded with zero rows past the vocabulary)."""
    rank: int
    size: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]
    vocab_rows: int
    kv_replicated: bool

    @property
    def num_heads(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def intermediate_size(self) -> int:
        return self.intermediate[1] - self.intermediate[0]

    def as_dict(self, config: Qwen2Config) -> dict:
        """meta.json's `model.tensor_parallel`."""
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "collectives_per_forward": {"all_reduce": 2 * config.num_hidden_layers + 1, "all_gather": 1}}


def plan_shard(config: Qwen2Config, rank: int, size: int) -> Shard:
    """The slices rank `rank` of `size` holds; a ValueError (one line) when the model cannot be cut `size` ways."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"tensor parallel rank {rank} of {size} does not exist")
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    group = heads // kv
    if kv % size == 0:
        per = kv // size
        kv_heads, q_heads = (rank * per, (rank + 1) * per), (rank * per * group, (rank + 1) * per * group)
        replicated = False
    elif size % kv == 0:
        copies = size // kv  # ranks sharing one KV head
        if group < copies:
            raise ValueError(f"tp={size}: {kv} KV heads with {group} query heads each cannot give every one of "
                             f"{size} ranks a query head")
        head = rank // copies
        start, stop = _split(group, copies, rank % copies)
        kv_heads, q_heads, replicated = (head, head + 1), (head * group + start, head * group + stop), True
    else:
        raise ValueError(f"tp={size}: {kv} KV heads can be neither split nor replicated evenly over {size} ranks "
                         f"(tp must divide {kv} or be a multiple of it)")
    if config.intermediate_size < size:
        raise ValueError(f"tp={size}: intermediate size {config.intermediate_size} is smaller than tp")
    rows = -(-config.vocab_size // size)
    vocab = (min(rank * rows, config.vocab_size), min((rank + 1) * rows, config.vocab_size))
    return Shard(rank, size, q_heads, kv_heads, _split(config.intermediate_size, size, rank), vocab,
                 rows if size > 1 else config.vocab_size, replicated)


def shard_tensor(name: str, full: torch.Tensor, shard: Shard, head_dim: int) -> torch.Tensor:
    """The rank's slice of the full checkpoint tensor `name` (a view where it can be; the whole tensor at size 1)."""
    if shard.size == 1:
        return full
    leaf = name.rsplit(".", 2)[-2:]  # e.g. ["q_proj", "weight"]
    if leaf[0] == "q_proj":
        return full[shard.q_heads[0] * head_dim: shard.q_heads[1] * head_dim]
    if leaf[0] in ("k_proj", "v_proj"):
        return full[shard.kv_heads[0] * head_dim: shard.kv_heads[1] * head_dim]
    if leaf[0] == "o_proj":
        return full[:, shard.q_heads[0] * head_dim: shard.q_heads[1] * head_dim]
    if leaf[0] in ("gate_proj", "up_proj"):
        return full[shard.intermediate[0]: shard.intermediate[1]]
    if leaf[0] == "down_proj":
        return full[:, shard.intermediate[0]: shard.intermediate[1]]
    if leaf[0] in ("embed_tokens", "lm_head"):
        rows = full[shard.vocab[0]: shard.vocab[1]]
        pad = shard.vocab_rows - rows.shape[0]
        return torch.cat([rows, rows.new_zeros(pad, *rows.shape[1:])]) if pad else rows
    return full  # norms: every rank holds them whole


class TensorParallel:
    """The ranks a model is split over and its collectives. `TensorParallel()` is one rank alone: no process group,
    and every collective returns its input.

    `before_attention_all_reduce`, when set, is called with the layer index just before each attention all-reduce
    (a workload plants a straggler there: workloads/tp_decode.py)."""

    def __init__(self, rank: int = 0, size: int = 1, group=None):
        self.rank, self.size, self.group = rank, size, group
        self.before_attention_all_reduce: Callable[[int], None] | None = None

    @classmethod
    def from_process_group(cls, group=None) -> "TensorParallel":
        """Over an initialised torch.distributed process group (the default one when `group` is None)."""
        import torch.distributed as dist
        return cls(dist.get_rank(group), dist.get_world_size(group), group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks, in place."""
        if self.size > 1:
            import torch.distributed as dist
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' `x` side by side along the last dimension (rank 0 first)."""
        if self.size == 1:
            return x
        import torch.distributed as dist
        out = x.new_empty(self.size * x.shape[0], *x.shape[1:])  # rank-major along dim 0
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        gather(out, x.contiguous(), group=self.group)
        return out.view(self.size, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], self.size * x.shape[-1])
