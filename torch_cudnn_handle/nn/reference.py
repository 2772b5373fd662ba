"""Plain-torch references of the cuDNN modules: same parameters, same names.

Each reference has the cuDNN module's parameter names and shapes, so
``reference.load_state_dict(module.state_dict())`` (what ``reference_of`` does) gives
the same function computed by torch ops alone: what the examples and the GPU tests
check the cuDNN graphs against, and what the benchmarks time them against.
``reference_of(module).float()`` is the float32 ground truth for low-precision runs.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._layout import merge_heads, split_heads
from .attention import Attention
from .block import TransformerBlock
from .linear import ACTIVATIONS, FusedLinear
from .norm import LayerNorm, RMSNorm

__all__ = [
    "LinearReference",
    "RMSNormReference",
    "sdpa_reference",
    "AttentionReference",
    "TransformerBlockReference",
    "reference_of",
]

_ACT = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


class LinearReference(nn.Module):
    """``act(F.linear(x, weight, bias))``."""

    def __init__(self, in_features: int, out_features: int, activation: Optional[str] = "relu", *, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"LinearReference: activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        FusedLinear.reset_parameters(self)  # the same initialization

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ACT[self.activation](F.linear(x, self.weight, self.bias))


class RMSNormReference(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * weight`` in float32, rounded once to ``x``'s dtype."""

    def __init__(self, dim: int, eps: float = 1e-5, *, device=None, dtype=None):
        super().__init__()
        self.dim, self.eps = dim, float(eps)
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x.dtype)


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal)``."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


class AttentionReference(nn.Module):
    """``Attention`` with ``F.linear`` projections and ``F.scaled_dot_product_attention``."""

    def __init__(self, dim: int, heads: int, causal: bool = True, *, device=None, dtype=None):
        super().__init__()
        self.dim, self.heads, self.causal = dim, heads, causal
        self.q, self.k, self.v, self.out = (LinearReference(dim, dim, activation=None, device=device, dtype=dtype) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(projection(x), self.heads) for projection in (self.q, self.k, self.v))
        return self.out(merge_heads(sdpa_reference(q, k, v, self.causal)))


class TransformerBlockReference(nn.Module):
    """``TransformerBlock`` in plain torch (same submodule and parameter names)."""

    def __init__(
        self, dim: int, heads: int, mlp_ratio: int = 4, *, activation: str = "gelu", causal: bool = True, eps: float = 1e-5, device=None, dtype=None
    ):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = RMSNormReference(dim, eps, device=device, dtype=dtype)
        self.attn = AttentionReference(dim, heads, causal, device=device, dtype=dtype)
        self.norm2 = RMSNormReference(dim, eps, device=device, dtype=dtype)
        self.mlp = nn.Sequential(
            LinearReference(dim, hidden, activation=activation, device=device, dtype=dtype),
            LinearReference(hidden, dim, activation=None, device=device, dtype=dtype),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _empty_like(module: nn.Module) -> nn.Module:
    """The reference of ``module``'s configuration (parameters not yet copied)."""
    if isinstance(module, FusedLinear):
        return LinearReference(module.in_features, module.out_features, module.activation, bias=module.bias is not None, device="meta")
    if isinstance(module, RMSNorm):
        return RMSNormReference(module.dim, module.eps, device="meta")
    if isinstance(module, LayerNorm):
        return nn.LayerNorm(module.dim, module.eps, device="meta")  # torch's own: weight and bias, named as here
    if isinstance(module, Attention):
        return AttentionReference(module.dim, module.heads, module.causal, device="meta")
    if isinstance(module, TransformerBlock):
        return TransformerBlockReference(
            module.dim, module.heads, module.mlp_ratio, activation=module.activation, causal=module.causal, eps=module.eps, device="meta"
        )
    raise TypeError(f"reference_of: no plain-torch reference for {type(module).__name__}")


def reference_of(module: nn.Module) -> nn.Module:
    """A plain-torch module computing what ``module`` computes, with a *copy* of its
    parameters (same values, device, dtype and ``requires_grad``)."""
    reference = _empty_like(module)
    sources = dict(module.named_parameters())
    for name, parameter in list(reference.named_parameters()):
        source = sources[name]
        owner = reference.get_submodule(name.rpartition(".")[0]) if "." in name else reference
        setattr(owner, name.rpartition(".")[2], nn.Parameter(source.detach().clone(), requires_grad=source.requires_grad))
    return reference
