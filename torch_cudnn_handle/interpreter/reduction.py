"""REDUCTION and GENSTATS nodes: reductions to the output's dims.

The axes reduced are those where the output's dim is 1 and the input's is not (cuDNN
infers them the same way, from the output shape). GENSTATS writes the sum and the sum of
squares, per channel as its outputs' dims say.
"""

from __future__ import annotations

from typing import Dict, List

import torch

from .description import check_params, dims, enum_name, port, refuse

_MODES = {
    "ADD": lambda x, axes: x.sum(axes, keepdim=True),
    "MUL": lambda x, axes: _prod(x, axes),
    "MIN": lambda x, axes: x.amin(axes, keepdim=True),
    "MAX": lambda x, axes: x.amax(axes, keepdim=True),
    "AMAX": lambda x, axes: x.abs().amax(axes, keepdim=True),
    "AVG": lambda x, axes: x.mean(axes, keepdim=True),
    "NORM1": lambda x, axes: x.abs().sum(axes, keepdim=True),
    "NORM2": lambda x, axes: x.square().sum(axes, keepdim=True).sqrt(),
    "MUL_NO_ZEROS": lambda x, axes: _prod(torch.where(x == 0, torch.ones_like(x), x), axes),
}


def _prod(x: torch.Tensor, axes: List[int]) -> torch.Tensor:
    for axis in axes:
        x = x.prod(axis, keepdim=True)
    return x


def reduced_axes(node, x_shape, out_shape) -> List[int]:
    if len(x_shape) != len(out_shape) or any(o not in (1, i) for i, o in zip(x_shape, out_shape)):
        raise ValueError(f"interpreter: node {node.name!r} reduces {list(x_shape)} to {list(out_shape)}, which is no reduction")
    return [axis for axis, (i, o) in enumerate(zip(x_shape, out_shape)) if o == 1 and i != 1]


def reduction(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ("mode",))
    if node.inputs.get("group_offset") is not None:
        raise refuse(node, "group_offset", why="grouped reductions")
    mode = enum_name(node.params.get("mode"))
    if mode not in _MODES:
        raise refuse(node, "mode", mode, "an unknown reduction mode")
    x = ctx.value(port(node, "input"), node)
    axes = reduced_axes(node, x.shape, dims(node.outputs["OUT_0"]))
    return {"OUT_0": _MODES[mode](x, axes) if axes else x}


def genstats(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ())
    x = ctx.value(port(node, "input"), node)
    out = {}
    for name, value in (("SUM", x), ("SQ_SUM", x * x)):
        if node.outputs.get(name) is not None:
            axes = reduced_axes(node, x.shape, dims(node.outputs[name]))
            out[name] = value.sum(axes, keepdim=True) if axes else value
    return out


HANDLERS = {"REDUCTION": reduction, "GENSTATS": genstats}
