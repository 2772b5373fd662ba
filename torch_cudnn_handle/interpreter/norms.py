"""The normalization forward nodes: LAYERNORM, RMSNORM, INSTANCENORM, BATCHNORM (training,
with running-stat updates) and BATCHNORM_INFERENCE.

The normalized axes follow the frontend's C++ nodes: where a statistic (mean / inv_var,
given or declared) has dim 1 and the input does not; without statistics, where the scale
is not 1 (layernorm, rmsnorm), every axis after the first (either, without a scale), the
spatial axes (instancenorm). ``inv_var`` is ``1 / sqrt(biased variance + epsilon)``
(rmsnorm: of the mean square), ``y = (x - mean) * inv_var * scale + bias``. Batchnorm's
running statistics are ``(1 - momentum) * running + momentum * batch``, the variance
unbiased (Bessel-corrected) there, as cuDNN's batchnorm (and torch's) updates them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from .description import check_params, dims, enum_name, port, refuse


def normalized_axes(node, x_shape: Sequence[int], stats=None, scale=None, first: int = 1) -> List[int]:
    """The axes a norm normalizes over (module docstring); ``stats``/``scale`` are described tensors or None."""
    if stats is not None:
        stats_shape = dims(stats)
        if len(stats_shape) != len(x_shape) or any(s not in (1, x) for s, x in zip(stats_shape, x_shape)):
            raise ValueError(f"interpreter: node {node.name!r}: statistics {stats_shape} do not fit its input {list(x_shape)}")
        return [i for i, (s, x) in enumerate(zip(stats_shape, x_shape)) if s == 1 and x != 1]
    if scale is not None:
        return [i for i, s in enumerate(dims(scale)) if s != 1]
    return list(range(first, len(x_shape)))


def _phase(node) -> str:
    phase = enum_name(node.params.get("norm_forward_phase"))
    if phase not in ("TRAINING", "INFERENCE"):
        raise refuse(node, "norm_forward_phase", phase, "TRAINING or INFERENCE")
    return phase


def _optional(node, ctx, name: str) -> Optional[torch.Tensor]:
    tensor = node.inputs.get(name)
    return None if tensor is None else ctx.value(tensor, node)


def _affine(y: torch.Tensor, scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
    if scale is not None:
        y = y * scale
    return y if bias is None else y + bias


def _stats_output(node):
    return node.outputs.get("inv_var") or node.outputs.get("mean")


def _normalize(node, ctx, *, rms: bool, first: int) -> Dict[str, torch.Tensor]:
    check_params(node, ("norm_forward_phase",))
    phase = _phase(node)
    x = ctx.value(port(node, "input"), node)
    scale, bias = _optional(node, ctx, "scale"), _optional(node, ctx, "bias")
    eps = ctx.scalar(port(node, "epsilon"))
    axes = normalized_axes(node, x.shape, _stats_output(node) if phase == "TRAINING" else None, node.inputs.get("scale"), first)
    mean = torch.zeros_like(x) if rms else x.mean(axes, keepdim=True)
    centered = x - mean
    inv_var = torch.rsqrt(centered.square().mean(axes, keepdim=True) + eps)
    out = {"Y": _affine(centered * inv_var, scale, bias)}
    if phase == "TRAINING":
        out["inv_var"] = inv_var
        if not rms:
            out["mean"] = mean
    return out


def layernorm(node, ctx):
    return _normalize(node, ctx, rms=False, first=1)


def rmsnorm(node, ctx):
    return _normalize(node, ctx, rms=True, first=1)


def instancenorm(node, ctx):
    return _normalize(node, ctx, rms=False, first=2)


def batchnorm(node, ctx) -> Dict[str, torch.Tensor]:
    if any(name.startswith("peer_stats") for name in node.inputs):
        raise refuse(node, "peer_stats", why="batchnorm across peers")
    check_params(node, ())
    x = ctx.value(port(node, "input"), node)
    scale, bias = ctx.value(port(node, "scale"), node), ctx.value(port(node, "bias"), node)
    eps = ctx.scalar(port(node, "epsilon"))
    axes = [i for i in range(x.dim()) if i != 1]
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    var = centered.square().mean(axes, keepdim=True)
    inv_var = torch.rsqrt(var + eps)
    out = {"Y": _affine(centered * inv_var, scale, bias), "mean": mean, "inv_var": inv_var}
    running = [name for name in ("in_running_mean", "in_running_var") if node.inputs.get(name) is not None]
    if running:
        momentum = ctx.scalar(port(node, "momentum"))
        count = x.numel() // x.shape[1]
        unbiased = var * count / max(count - 1, 1)
        for name, batch, key in (("in_running_mean", mean, "next_running_mean"), ("in_running_var", unbiased, "next_running_var")):
            if name in running:
                out[key] = (1.0 - momentum) * ctx.value(node.inputs[name], node) + momentum * batch
    return out


def batchnorm_inference(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ())
    x = ctx.value(port(node, "input"), node)
    mean, inv_var = ctx.value(port(node, "mean"), node), ctx.value(port(node, "inv_variance"), node)
    scale, bias = ctx.value(port(node, "scale"), node), ctx.value(port(node, "bias"), node)
    return {"Y": (x - mean) * inv_var * scale + bias}


HANDLERS = {
    "LAYERNORM": layernorm, "RMSNORM": rmsnorm, "INSTANCENORM": instancenorm, "BATCHNORM": batchnorm,
    "BATCHNORM_INFERENCE": batchnorm_inference,
}
