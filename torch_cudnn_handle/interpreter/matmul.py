"""MATMUL nodes: ``C = A @ B`` over ``[..., M, K] @ [..., K, N]``, batch dims broadcast.

The operands are converted to the compute dtype first (float32, or float64 for an integer
compute type), so an fp8 or int8 GEMM runs where torch has no such kernel, and
accumulates at least in float32 as cuDNN's does.
"""

from __future__ import annotations

from typing import Dict

import torch

from .description import check_params, port, refuse


def matmul(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ("padding",))
    padding = node.params.get("padding", 0.0)
    if padding not in (None, 0, 0.0):
        raise refuse(node, "padding", padding, "a matmul padding value")
    a, b = ctx.value(port(node, "A"), node), ctx.value(port(node, "B"), node)
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"interpreter: matmul {node.name!r} takes [..., M, K] @ [..., K, N], got {list(a.shape)} @ {list(b.shape)}")
    return {"C": torch.matmul(a, b)}


HANDLERS = {"MATMUL": matmul}
