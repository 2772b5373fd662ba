"""CONV_FPROP, CONV_DGRAD and CONV_WGRAD nodes, 1-D to 3-D spatial.

Dims are cuDNN's logical ``[N, C, spatial...]`` whatever the memory layout (NHWC and
NCHW read the same here). Padding is ``padding`` (both sides) or ``pre_padding`` /
``post_padding`` (asymmetric: the image is padded explicitly, then convolved without
padding); ``stride`` and ``dilation`` default to 1; the group count is the image's
channels over the filter's. ``convolution_mode`` CROSS_CORRELATION (the default, torch's
convolution) or CONVOLUTION (the filter flipped in every spatial dim). dgrad and wgrad
are torch's own convolution backward (``torch.nn.grad``), for the output dims the
description declares.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch.nn import grad as conv_grad

from .description import check_params, dims, enum_name, port, refuse

_PARAMS = ("padding", "pre_padding", "post_padding", "stride", "dilation", "convolution_mode")
_FPROP = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_DGRAD = {1: conv_grad.conv1d_input, 2: conv_grad.conv2d_input, 3: conv_grad.conv3d_input}
_WGRAD = {1: conv_grad.conv1d_weight, 2: conv_grad.conv2d_weight, 3: conv_grad.conv3d_weight}


def _geometry(node, spatial: int) -> Tuple[List[int], List[int], List[int], List[int], bool]:
    """(pre, post, stride, dilation, flipped) with cuDNN's defaults."""
    check_params(node, _PARAMS)
    if spatial not in _FPROP:
        raise refuse(node, "spatial dims", spatial, "1-D to 3-D convolutions only")
    sym = node.params.get("padding")
    pre = list(node.params.get("pre_padding") or sym or [0] * spatial)
    post = list(node.params.get("post_padding") or sym or [0] * spatial)
    stride = list(node.params.get("stride") or [1] * spatial)
    dilation = list(node.params.get("dilation") or [1] * spatial)
    for name, value in (("pre_padding", pre), ("post_padding", post), ("stride", stride), ("dilation", dilation)):
        if len(value) != spatial:
            raise ValueError(f"interpreter: node {node.name!r}: {name} {value} has not {spatial} elements")
    mode = enum_name(node.params.get("convolution_mode")) or "CROSS_CORRELATION"
    if mode not in ("CROSS_CORRELATION", "CONVOLUTION"):
        raise refuse(node, "convolution_mode", mode)
    return pre, post, stride, dilation, mode == "CONVOLUTION"


def _groups(node, channels: int, filter_channels: int) -> int:
    if filter_channels <= 0 or channels % filter_channels:
        raise ValueError(f"interpreter: node {node.name!r}: {channels} channels do not split into groups of {filter_channels}")
    return channels // filter_channels


def _flip(w: torch.Tensor) -> torch.Tensor:
    return w.flip(list(range(2, w.dim())))


def _pad(x: torch.Tensor, pre: List[int], post: List[int]) -> torch.Tensor:
    pairs = [p for before, after in zip(reversed(pre), reversed(post)) for p in (before, after)]  # F.pad: last dim first
    return F.pad(x, pairs)


def conv_fprop(node, ctx) -> Dict[str, torch.Tensor]:
    x, w = ctx.value(port(node, "image"), node), ctx.value(port(node, "weight"), node)
    pre, post, stride, dilation, flipped = _geometry(node, x.dim() - 2)
    groups = _groups(node, x.shape[1], w.shape[1])
    w = _flip(w) if flipped else w
    if pre != post:
        x, pre = _pad(x, pre, post), [0] * len(pre)
    return {"Y": _FPROP[x.dim() - 2](x, w, stride=stride, padding=pre, dilation=dilation, groups=groups)}


def conv_dgrad(node, ctx) -> Dict[str, torch.Tensor]:
    dy, w = ctx.value(port(node, "loss"), node), ctx.value(port(node, "filter"), node)
    dx_dims = dims(node.outputs["DX"])
    spatial = dy.dim() - 2
    pre, post, stride, dilation, flipped = _geometry(node, spatial)
    groups = _groups(node, dx_dims[1], w.shape[1])
    w = _flip(w) if flipped else w
    if pre == post:
        return {"DX": _DGRAD[spatial](dx_dims, w, dy, stride=stride, padding=pre, dilation=dilation, groups=groups)}
    padded = dx_dims[:2] + [n + a + b for n, a, b in zip(dx_dims[2:], pre, post)]
    dx = _DGRAD[spatial](padded, w, dy, stride=stride, padding=0, dilation=dilation, groups=groups)
    crop = (slice(None), slice(None), *(slice(a, a + n) for a, n in zip(pre, dx_dims[2:])))
    return {"DX": dx[crop]}


def conv_wgrad(node, ctx) -> Dict[str, torch.Tensor]:
    x, dy = ctx.value(port(node, "image"), node), ctx.value(port(node, "loss"), node)
    dw_dims = dims(node.outputs["DW"])
    spatial = x.dim() - 2
    pre, post, stride, dilation, flipped = _geometry(node, spatial)
    groups = _groups(node, x.shape[1], dw_dims[1])
    if pre != post:
        x, pre = _pad(x, pre, post), [0] * spatial
    dw = _WGRAD[spatial](x, dw_dims, dy, stride=stride, padding=pre, dilation=dilation, groups=groups)
    return {"DW": _flip(dw) if flipped else dw}


HANDLERS = {"CONV_FPROP": conv_fprop, "CONV_DGRAD": conv_dgrad, "CONV_WGRAD": conv_wgrad}
