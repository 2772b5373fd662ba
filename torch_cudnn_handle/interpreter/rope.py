"""ROPE and ROPE_BWD nodes: rotary position embedding, rotate-half style.

cuDNN's RoPE (frontend ``RoPE_attributes``): the input is ``[B, H, S, D]`` (logical dims,
any strides), the position of an element is its index along S, and ``freqs`` holds one
row of raw angles per position (``[S_max, 1, 1, R]``; the kernel reads the first ``R/2``
of a row). The last ``R = rope_dim`` dims of D are rotated (``rope_dim`` 0: all of D):
with ``x1, x2`` their two halves and ``c, s`` the cosine and sine of the angles,
``(x1 c - x2 s, x2 c + x1 s)``; the first ``D - R`` dims pass through. Everything is
multiplied by ``output_scale`` (cos and sin pre-multiplied, the pass-through scaled).
The backward applies the transposed rotation (the sine negated) with the same scale.
"""

from __future__ import annotations

from typing import Dict

import torch

from .description import check_params, port


def _rotate(node, x: torch.Tensor, freqs: torch.Tensor, inverse: bool) -> torch.Tensor:
    check_params(node, ("output_scale", "rope_dim"))
    if x.dim() != 4:
        raise ValueError(f"interpreter: rope node {node.name!r} takes a [B, H, S, D] input, got {list(x.shape)}")
    width, positions = x.shape[-1], x.shape[2]
    rotated = int(node.params.get("rope_dim") or 0) or width
    scale = float(node.params.get("output_scale", 1.0) if node.params.get("output_scale") is not None else 1.0)
    if rotated % 2 or rotated > width:
        raise ValueError(f"interpreter: rope node {node.name!r}: rope_dim {rotated} must be even and at most the head dim {width}")
    table = freqs.reshape(freqs.shape[0], -1)
    if table.shape[0] < positions or table.shape[1] < rotated // 2:
        raise ValueError(f"interpreter: rope node {node.name!r}: freqs {list(freqs.shape)} has no angles for {positions} positions")
    angles = table[:positions, : rotated // 2]
    cos, sin = torch.cos(angles) * scale, torch.sin(angles) * scale
    if inverse:
        sin = -sin
    passthrough, part = x[..., : width - rotated], x[..., width - rotated:]
    x1, x2 = part[..., : rotated // 2], part[..., rotated // 2:]
    return torch.cat([passthrough * scale, x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope(node, ctx) -> Dict[str, torch.Tensor]:
    x, freqs = ctx.value(port(node, "input"), node), ctx.value(port(node, "freqs"), node)
    return {"OUT_0": _rotate(node, x, freqs, inverse=False)}


def rope_backward(node, ctx) -> Dict[str, torch.Tensor]:
    dy, freqs = ctx.value(port(node, "dY"), node), ctx.value(port(node, "freqs"), node)
    return {"OUT_0": _rotate(node, dy, freqs, inverse=True)}


HANDLERS = {"ROPE": rope, "ROPE_BWD": rope_backward}
