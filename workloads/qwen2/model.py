"""The Qwen2 architecture as Hugging Face `Qwen2ForCausalLM` defines it, written for plain eager inference.

Parameter names match Hugging Face checkpoints one to one, so a state dict moves between the two unchanged.
Attention reads a preallocated static KV cache through a boolean mask over its whole length: the same code then
runs eagerly (one kernel per op, the subject of the analyzer) and inside a captured CUDA graph.

With a `TensorParallel` of size > 1 (parallel.py) each module holds one rank's slice of the weights (the parameter
names stay Hugging Face's, the shapes are the slice's) and adds its collective; at size 1 nothing changes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import Qwen2Config
from .parallel import Shard, TensorParallel, plan_shard


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin`: rotate_half(x) * sin == roll(x, D/2) * [-sin, sin]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class KVCache:
    """Preallocated keys and values for every layer ([batch, kv_heads, max_len, head_dim] each), and the additive
    causal mask over all `max_len` slots (rows are query positions). `kv_heads`: the KV heads this rank holds
    (tensor parallel; default all of them)."""

    def __init__(self, config: Qwen2Config, batch_size: int, max_len: int, device, dtype, kv_heads: int | None = None):
        shape = (batch_size, kv_heads or config.num_key_value_heads, max_len, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        causal = torch.ones(max_len, max_len, dtype=torch.bool, device=device).tril()
        self.mask = torch.zeros(max_len, max_len, device=device, dtype=dtype).masked_fill(~causal, float("-inf"))
        self.max_len = max_len
        self.batch_size = batch_size

    def rows(self, start: int, stop: int) -> "KVCache":
        """A view of batch rows [start, stop): writes through it land in this cache."""
        view = object.__new__(KVCache)
        view.keys = [k[start:stop] for k in self.keys]
        view.values = [v[start:stop] for v in self.values]
        view.mask, view.max_len, view.batch_size = self.mask, self.max_len, stop - start
        return view


class Attention(nn.Module):
    """Column-parallel q/k/v over the shard's heads, row-parallel o_proj, then the all-reduce (tensor parallel)."""

    def __init__(self, config: Qwen2Config, shard: Shard, tp: TensorParallel, layer_index: int, device=None,
                 dtype=None):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, d
        self.tp, self.layer_index = tp, layer_index
        kw = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=True, **kw)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=True, **kw)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=True, **kw)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False, **kw)

    def forward(self, x, cos, sin, k_cache, v_cache, positions, mask):
        b, t, _ = x.shape
        # F.linear on the parameters rather than Module.__call__: the same kernels, less Python per layer.
        d, kv = self.head_dim, self.num_kv_heads
        q = F.linear(x, self.q_proj.weight, self.q_proj.bias).view(b, t, self.num_heads, d).transpose(1, 2)
        k = F.linear(x, self.k_proj.weight, self.k_proj.bias).view(b, t, kv, d).transpose(1, 2)
        v = F.linear(x, self.v_proj.weight, self.v_proj.bias).view(b, t, kv, d).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if positions.dim() == 1:
            k_cache.index_copy_(2, positions, k)
            v_cache.index_copy_(2, positions, v)
        else:  # one decode position per row: [b, kv_heads, 1, head_dim] indices into the slot axis
            k_cache.scatter_(2, positions, k)
            v_cache.scatter_(2, positions, v)
        # Grouped-query attention without copying K/V: the query heads that share a KV head are stacked as extra
        # query rows of that head ([b, kv_heads, group * t, d]); `mask` rows are tiled to match.
        q = q.reshape(b, self.num_kv_heads, -1, self.head_dim)
        out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        # reshape, not view: the memory-efficient SDPA kernel may return strides a view cannot express
        out = out.reshape(b, self.num_heads, t, self.head_dim).transpose(1, 2).reshape(b, t, -1)
        out = F.linear(out, self.o_proj.weight)
        if self.tp.before_attention_all_reduce is not None:
            self.tp.before_attention_all_reduce(self.layer_index)
        return self.tp.all_reduce(out)


class MLP(nn.Module):
    """Column-parallel gate/up over the shard's intermediate columns, row-parallel down_proj, then the all-reduce."""

    def __init__(self, config: Qwen2Config, shard: Shard, tp: TensorParallel, device=None, dtype=None):
        super().__init__()
        h, i = config.hidden_size, shard.intermediate_size
        self.tp = tp
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(h, i, **kw)
        self.up_proj = nn.Linear(h, i, **kw)
        self.down_proj = nn.Linear(i, h, **kw)

    def forward(self, x):
        gate = F.linear(x, self.gate_proj.weight)
        return self.tp.all_reduce(F.linear(F.silu(gate) * F.linear(x, self.up_proj.weight), self.down_proj.weight))


class DecoderLayer(nn.Module):
    def __init__(self, config: Qwen2Config, shard: Shard, tp: TensorParallel, layer_index: int, device=None,
                 dtype=None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.self_attn = Attention(config, shard, tp, layer_index, device, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.mlp = MLP(config, shard, tp, device, dtype)

    def forward(self, x, cos, sin, k_cache, v_cache, positions, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, positions, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Body(nn.Module):
    """`model.*` in a Hugging Face checkpoint."""

    def __init__(self, config: Qwen2Config, shard: Shard, tp: TensorParallel, device=None, dtype=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(shard.vocab_rows, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(config, shard, tp, i, device, dtype)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)


class Qwen2ForCausalLM(nn.Module):
    """The whole model, or with `tp` (parallel.TensorParallel) of size > 1 the slices one rank holds; `config` stays
    the full model's, `shard` says which slices."""

    def __init__(self, config: Qwen2Config, device=None, dtype=None, tp: TensorParallel | None = None):
        super().__init__()
        self.config = config
        self.tp = tp or TensorParallel()
        self.shard = plan_shard(config, self.tp.rank, self.tp.size)
        self.model = Qwen2Body(config, self.shard, self.tp, device, dtype)
        self.lm_head = nn.Linear(config.hidden_size, self.shard.vocab_rows, bias=False, device=device, dtype=dtype)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.requires_grad_(False)
        self._rope_len = 0

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def prepare(self, max_len: int) -> None:
        """Build the rotary tables for positions [0, max_len)."""
        if max_len <= self._rope_len:
            return
        c, dev = self.config, self.device
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float, device=dev) / c.head_dim))
        freqs = torch.arange(max_len, device=dev, dtype=torch.float)[:, None] * inv_freq  # as HF computes them
        self._cos = torch.cat((freqs, freqs), dim=-1).cos().to(self.dtype)
        self._signed_sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1).to(self.dtype)
        self._rope_len = max_len

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                last_only: bool = True) -> torch.Tensor:
        """Logits for `input_ids` [batch, T] placed at `positions` [T] (a device tensor) of `cache`, or, for one
        decode token per row of sequences of different lengths (continuous batching), at `positions` [batch, 1].

        Returns [batch, vocab] for the last position, or [batch, T, vocab] with `last_only=False`.
        """
        if positions.dim() == 2:
            return self._forward_per_row(input_ids, positions, cache, last_only)
        cos = self._cos.index_select(0, positions)
        sin = self._signed_sin.index_select(0, positions)
        mask = cache.mask.index_select(0, positions)
        group = self.shard.num_heads // self.shard.num_kv_heads
        if input_ids.shape[1] > 1 and group > 1:
            mask = mask.repeat(group, 1)
        return self._layers(input_ids, cos, sin, positions, mask, cache, last_only)

    def _forward_per_row(self, input_ids, positions, cache, last_only):
        b, c = input_ids.shape[0], self.config
        if input_ids.shape[1] != 1:
            raise ValueError("per-row positions take one token per row")
        flat = positions.view(-1)
        cos = self._cos.index_select(0, flat).view(b, 1, 1, -1)  # broadcast over heads
        sin = self._signed_sin.index_select(0, flat).view(b, 1, 1, -1)
        mask = cache.mask.index_select(0, flat).view(b, 1, 1, -1)  # broadcast over kv heads and stacked query rows
        slots = positions.view(b, 1, 1, 1).expand(b, self.shard.num_kv_heads, 1, c.head_dim)
        return self._layers(input_ids, cos, sin, slots, mask, cache, last_only)

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """A KV cache for the heads this rank holds."""
        return KVCache(self.config, batch_size, max_len, self.device, self.dtype, self.shard.num_kv_heads)

    def _layers(self, input_ids, cos, sin, positions, mask, cache, last_only):
        x = self._embed(input_ids)
        for layer, k_cache, v_cache in zip(self.model.layers, cache.keys, cache.values):
            x = layer(x, cos, sin, k_cache, v_cache, positions, mask)
        if last_only:
            x = x[:, -1]
        return self._logits(self.model.norm(x))

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: rows of other ranks' tokens are zero here, the all-reduce fills them in."""
        if self.tp.size == 1:
            return self.model.embed_tokens(input_ids)
        start, stop = self.shard.vocab
        local = input_ids - start
        outside = (local < 0) | (local >= stop - start)
        x = F.embedding(local.masked_fill(outside, 0), self.model.embed_tokens.weight)
        return self.tp.all_reduce(x.masked_fill_(outside.unsqueeze(-1), 0))

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel LM head: each rank's slice of the logits, all-gathered, padding rows dropped."""
        if self.tp.size == 1:
            return self.lm_head(x)
        return self.tp.all_gather_last(F.linear(x, self.lm_head.weight))[..., : self.config.vocab_size]
