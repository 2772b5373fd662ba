"""The structural nodes: TRANSPOSE, SLICE, CONCATENATE and RESHAPE.

TRANSPOSE permutes dims (``params["permutation"]``), SLICE takes Python slices per dim,
CONCATENATE joins its inputs along ``axis``. RESHAPE LOGICAL is a row-major (logical)
reshape; VIEW_ONLY (cuDNN's default) reinterprets memory: the output's elements are
those its declared strides address in the input laid out with the input's strides.
"""

from __future__ import annotations

from typing import Dict

import torch

from .description import check_params, dims, enum_name, port, refuse, strides


def transpose(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ("permutation",))
    x = ctx.value(port(node, "input"), node)
    permutation = [int(p) for p in node.params["permutation"]]
    if sorted(permutation) != list(range(x.dim())):
        raise ValueError(f"interpreter: transpose {node.name!r}: {permutation} permutes no {x.dim()} dims")
    return {"OUT_0": x.permute(permutation)}


def slice_(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ("slices",))
    x = ctx.value(port(node, "input"), node)
    slices = tuple(node.params.get("slices") or ())
    if not all(isinstance(s, slice) and (s.step is None or s.step > 0) for s in slices):
        raise refuse(node, "slices", slices, "Python slices of positive steps, one per dim")
    return {"OUT_0": x[slices]}


def concatenate(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ("axis", "in_place_index", "_n_inputs"))
    count = int(node.params.get("_n_inputs", 0))
    parts = [ctx.value(port(node, f"inputs_{i}"), node) for i in range(count)]
    if not parts:
        raise ValueError(f"interpreter: concatenate {node.name!r} has no inputs")
    return {"OUT_0": torch.cat(parts, dim=int(node.params.get("axis", 0)))}


def reshape(node, ctx) -> Dict[str, torch.Tensor]:
    check_params(node, ("reshape_mode",))
    source = port(node, "input")
    x = ctx.value(source, node)
    out = node.outputs["OUT_0"]
    mode = enum_name(node.params.get("reshape_mode")) or "VIEW_ONLY"
    if mode == "LOGICAL":
        return {"OUT_0": x.reshape(dims(out))}
    if mode != "VIEW_ONLY":
        raise refuse(node, "reshape_mode", mode)
    memory = torch.empty_strided(x.shape, strides(source), dtype=x.dtype, device=x.device)
    memory.copy_(x)
    try:
        return {"OUT_0": torch.as_strided(memory, dims(out), strides(out), 0).clone()}
    except RuntimeError as error:
        raise ValueError(f"interpreter: reshape {node.name!r}: the output's layout addresses past its input's memory ({error})") from None


HANDLERS = {"TRANSPOSE": transpose, "SLICE": slice_, "CONCATENATE": concatenate, "RESHAPE": reshape}
