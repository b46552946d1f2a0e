"""Llama-style building blocks: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU and
the hourglass FFN (shape paper eq. 3-5), with optional per-loop LoRA on every projection.

Every sublayer exposes `branch(x, rope, loop)`: what it adds to the residual stream. A plain
block adds its branches to x; a hyper-connection (hyper.py) reads and writes them instead.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

INIT_STD = 0.02  # GPT-2 / Llama initialisation scale


NORM_EPS = 1e-5  # RMSNorm's default epsilon


def float32_region(device_type: str):
    """Autocast switched off inside, where it is on; else nothing. An autocast context that does
    nothing still enters a compiled graph, and a graph with one is not kept in torch's
    AOTAutograd cache ("Unsupported call_function target _enter_autocast"), so every trial
    re-traced the fp32 head and the gates even with a warm compile cache."""
    return (
        torch.autocast(device_type=device_type, enabled=False)
        if torch.is_autocast_enabled(device_type)
        else contextlib.nullcontext()
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = NORM_EPS, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return y


class Proj(nn.Module):
    """A bias-free linear map, optionally with one LoRA adapter per loop iteration (relaxed
    recursive Transformers; Hyperloop Table 7). B starts at zero, so at initialisation the
    adapted layer is exactly the shared one. Loops beyond those trained reuse the last adapter.
    `loop` is an int, or the adapter's index as a 0-dim tensor (LanguageModel passes one, in
    range, so that a compiled layer is one graph for every loop)."""

    def __init__(self, d_in: int, d_out: int, lora_rank: int = 0, lora_loops: int = 0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.normal_(self.weight, std=INIT_STD)
        self.lora_A = self.lora_B = None
        if lora_rank:
            self.lora_A = nn.Parameter(torch.randn(lora_loops, lora_rank, d_in) / math.sqrt(d_in))
            self.lora_B = nn.Parameter(torch.zeros(lora_loops, d_out, lora_rank))

    def forward(self, x: torch.Tensor, loop: int | torch.Tensor | None = None) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.lora_A is not None and loop is not None:
            if isinstance(
                loop, torch.Tensor
            ):  # a gather in the graph (indexing by it would read it out)
                A, B = (
                    p.index_select(0, loop.reshape(1)).squeeze(0)
                    for p in (self.lora_A, self.lora_B)
                )
            else:
                i = min(loop, self.lora_A.shape[0] - 1)
                A, B = self.lora_A[i], self.lora_B[i]
            y = y + F.linear(F.linear(x, A), B)
        return y


class Rotary(nn.Module):
    """Rotary position embeddings (Su et al.), rotate-half convention; tables cached per length."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._tables: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # Eager steps reuse the tables (one per length and device); a compiled graph folds them in
        # itself, and tables made under inference_mode could not be used by a later backward.
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
            return self.compute(seq_len, device)
        key = (seq_len, str(device))
        if key not in self._tables:
            self._tables[key] = self.compute(seq_len, device)
        return self._tables[key]

    def compute(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(seq_len, device=device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq.to(device))  # (T, hd/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (T, hd)
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Pre-norm causal self-attention with grouped-query heads (n_kv_heads <= n_heads)."""

    def __init__(self, spec, lora_rank: int = 0, lora_loops: int = 0):
        super().__init__()
        d, lr, ll = spec.d_model, lora_rank, lora_loops
        self.n_heads, self.n_kv, self.hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.norm = RMSNorm(d, spec.norm_eps)
        self.q = Proj(d, spec.q_dim, lr, ll)
        self.k = Proj(d, spec.kv_dim, lr, ll)
        self.v = Proj(d, spec.kv_dim, lr, ll)
        self.o = Proj(spec.q_dim, d, lr, ll)

    def branch(self, x: torch.Tensor, rope, loop: int | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        h = self.norm(x)
        q = self.q(h, loop).view(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k(h, loop).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v(h, loop).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads
        )
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd)  # (B, T, nh*hd)
        return self.o(y, loop)


class SwiGLU(nn.Module):
    """Pre-norm SwiGLU MLP: W2 (SiLU(W1 norm x) * W3 norm x) (Shazeer 2020; shape paper eq. 5)."""

    def __init__(self, d: int, width: int, eps: float, lora_rank: int = 0, lora_loops: int = 0):
        super().__init__()
        self.norm = RMSNorm(d, eps)
        self.w1 = Proj(d, width, lora_rank, lora_loops)
        self.w3 = Proj(d, width, lora_rank, lora_loops)
        self.w2 = Proj(width, d, lora_rank, lora_loops)

    def forward(self, x: torch.Tensor, loop: int | None = None) -> torch.Tensor:
        h = self.norm(x)
        return self.w2(F.silu(self.w1(h, loop)) * self.w3(h, loop), loop)


class FeedForward(nn.Module):
    """K residual SwiGLU sub-blocks of width `ffn.width` (shape paper eq. 3-5). The conventional
    narrow-wide-narrow FFN is the K = 1 case, so the baseline is this module at its simplest."""

    def __init__(self, spec, lora_rank: int = 0, lora_loops: int = 0):
        super().__init__()
        f = spec.ffn
        self.blocks = nn.ModuleList(
            SwiGLU(spec.d_model, f.width, spec.norm_eps, lora_rank, lora_loops)
            for _ in range(f.depth)
        )

    def forward(self, x: torch.Tensor, loop: int | None = None) -> torch.Tensor:
        for block in self.blocks:  # h_{i+1} = h_i + MLP_i(h_i)   (eq. 3)
            x = x + block(x, loop)
        return x

    def branch(self, x: torch.Tensor, rope=None, loop: int | None = None) -> torch.Tensor:
        if len(self.blocks) == 1:
            return self.blocks[0](x, loop)
        return self(x, loop) - x


class Block(nn.Module):
    """One Transformer layer: x + Attn(norm x), then + FFN."""

    def __init__(self, spec, lora_rank: int = 0, lora_loops: int = 0):
        super().__init__()
        self.attn = Attention(spec, lora_rank, lora_loops)
        self.ffn = FeedForward(spec, lora_rank, lora_loops)

    @property
    def sublayers(self) -> tuple[nn.Module, nn.Module]:
        return self.attn, self.ffn

    def forward(self, x: torch.Tensor, rope, loop: int | None = None) -> torch.Tensor:
        x = x + self.attn.branch(x, rope, loop)
        return self.ffn(x, loop)
