"""``TransformerBlock``: a pre-norm transformer block built from this package's modules.

``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``; every matmul, norm and
attention, forward and backward, runs as a cuDNN graph through
``torch.ops.cudnn_fe.execute`` (the residual adds stay torch ops), so a
``torch.compile(fullgraph=True)`` of it is one graph whose heavy nodes are all
cuDNN's.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .linear import FusedLinear
from .norm import RMSNorm

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    """Pre-norm block: RMSNorm -> Attention (q/k/v/out ``FusedLinear``, sdpa) -> residual,
    RMSNorm -> MLP (``FusedLinear(dim, mlp_ratio*dim, activation)``, ``FusedLinear(.., dim, None)``)
    -> residual. ``x``: ``[B, S, dim]`` fp16/bf16."""

    def __init__(
        self, dim: int, heads: int, mlp_ratio: int = 4, *, activation: str = "gelu", causal: bool = True, eps: float = 1e-5, device=None, dtype=None
    ):
        super().__init__()
        self.dim, self.heads, self.mlp_ratio, self.activation, self.causal, self.eps = dim, heads, mlp_ratio, activation, causal, float(eps)
        hidden = int(dim * mlp_ratio)
        self.norm1 = RMSNorm(dim, eps, device=device, dtype=dtype)
        self.attn = Attention(dim, heads, causal, device=device, dtype=dtype)
        self.norm2 = RMSNorm(dim, eps, device=device, dtype=dtype)
        self.mlp = nn.Sequential(
            FusedLinear(dim, hidden, activation=activation, device=device, dtype=dtype),
            FusedLinear(hidden, dim, activation=None, device=device, dtype=dtype),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))
