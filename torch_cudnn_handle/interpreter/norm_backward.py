"""The normalization backward nodes: LAYERNORM_BWD, RMSNORM_BWD, INSTANCENORM_BWD and
BATCHNORM_BWD, in closed form from the saved statistics they are given.

With ``xhat = (x - mean) * inv_var`` (rmsnorm: ``x * inv_var``) and ``g = dy * scale``,
over the normalized axes A (from the statistics' dims, as the forward):
``dx = inv_var * (g - mean_A(g) - xhat * mean_A(g * xhat))`` (rmsnorm has no
``mean_A(g)`` term), ``dscale = sum(dy * xhat)`` and ``dbias = sum(dy)`` reduced to the
scale's dims. This is the gradient of the forward formula through its statistics too,
i.e. what autograd gives when the statistics are the forward's.
"""

from __future__ import annotations

from typing import Dict

import torch

from .description import check_params, dims, port, refuse
from .norms import normalized_axes
from .reduction import reduced_axes


def _reduce_to(node, value: torch.Tensor, out) -> torch.Tensor:
    axes = reduced_axes(node, value.shape, dims(out))
    return value.sum(axes, keepdim=True) if axes else value


def _backward(node, ctx, *, rms: bool) -> Dict[str, torch.Tensor]:
    if any(name.startswith("peer_stats") for name in node.inputs):
        raise refuse(node, "peer_stats", why="batchnorm across peers")
    dy, x = ctx.value(port(node, "grad"), node), ctx.value(port(node, "input"), node)
    inv_var_desc = port(node, "inv_variance")
    inv_var = ctx.value(inv_var_desc, node)
    axes = normalized_axes(node, x.shape, inv_var_desc)
    mean = torch.zeros((), dtype=x.dtype, device=x.device) if rms else ctx.value(port(node, "mean"), node)
    xhat = (x - mean) * inv_var
    scale_desc = node.inputs.get("scale")
    g = dy if scale_desc is None else dy * ctx.value(scale_desc, node)
    projection = xhat * (g * xhat).mean(axes, keepdim=True)
    dx = inv_var * (g - projection if rms else g - g.mean(axes, keepdim=True) - projection)
    out = {"DX": dx}
    if node.outputs.get("DScale") is not None:
        out["DScale"] = _reduce_to(node, dy * xhat, node.outputs["DScale"])
    if node.outputs.get("DBias") is not None:
        out["DBias"] = _reduce_to(node, dy, node.outputs["DBias"])
    return out


def layernorm_backward(node, ctx):
    check_params(node, ())
    return _backward(node, ctx, rms=False)


def rmsnorm_backward(node, ctx):
    check_params(node, ("has_dbias",))
    return _backward(node, ctx, rms=True)


def instancenorm_backward(node, ctx):
    check_params(node, ())
    return _backward(node, ctx, rms=False)


def batchnorm_backward(node, ctx):
    check_params(node, ("_n_peer_stats",))  # peers are refused by name in _backward
    return _backward(node, ctx, rms=False)


HANDLERS = {
    "LAYERNORM_BWD": layernorm_backward, "RMSNORM_BWD": rmsnorm_backward, "INSTANCENORM_BWD": instancenorm_backward,
    "BATCHNORM_BWD": batchnorm_backward,
}
