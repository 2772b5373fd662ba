"""POINTWISE nodes: every mode the frontend's pygraph builds (``params["mode"]``).

Operands broadcast as cuDNN broadcasts them (a dim of size 1 against any size; torch's
rule, which also aligns lower ranks on the right as the pygraph's inference does).
Booleans are 0/1: a comparison or logical op yields 0/1, and a logical op, a select's
mask or a BOOLEAN output reads any non-zero value as true. A backward mode takes
``(loss, input)``, the input being the forward op's input, and computes
``loss * f'(input)`` in closed form (no autograd: it runs under inference mode too).
The relu family follows cuDNN's clip attributes: ``y = x`` on ``[lower_clip,
upper_clip]``, ``upper_clip`` above, ``negative_slope * x`` below a zero lower clip
(a lower clip other than zero together with a slope is refused: its formula is not
pinned down here).
"""

from __future__ import annotations

import math
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from .description import check_params, is_integer_data_type, refuse

_EXTRA = ("negative_slope", "lower_clip", "upper_clip", "swish_beta", "axis")


def _flag(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bool)


def _as(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(like.dtype)


UNARY: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "abs": torch.abs, "ceil": torch.ceil, "cos": torch.cos, "erf": torch.erf, "exp": torch.exp, "floor": torch.floor,
    "log": torch.log, "neg": torch.neg, "reciprocal": torch.reciprocal, "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid,
    "sin": torch.sin, "sqrt": torch.sqrt, "tan": torch.tan, "tanh": torch.tanh, "identity": lambda x: x,
    "logical_not": lambda x: _as(x == 0, x), "elu": F.elu, "gelu": F.gelu,
    "gelu_approx_tanh": lambda x: F.gelu(x, approximate="tanh"), "softplus": F.softplus,
}

BINARY: Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "bias": torch.add, "sub": torch.sub, "mul": torch.mul, "scale": torch.mul, "div": torch.div,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow, "mod": torch.fmod, "add_square": lambda a, b: a + b * b,
    "cmp_eq": lambda a, b: _as(a == b, a), "cmp_neq": lambda a, b: _as(a != b, a), "cmp_gt": lambda a, b: _as(a > b, a),
    "cmp_ge": lambda a, b: _as(a >= b, a), "cmp_lt": lambda a, b: _as(a < b, a), "cmp_le": lambda a, b: _as(a <= b, a),
    "logical_and": lambda a, b: _as(_flag(a) & _flag(b), a), "logical_or": lambda a, b: _as(_flag(a) | _flag(b), a),
}

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_grad(x):
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _gelu_tanh_grad(x):
    t = torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)


def _sigmoid_grad(x):
    s = torch.sigmoid(x)
    return s * (1.0 - s)


# f'(x) of each backward mode's forward op (its loss is multiplied in by the caller).
DERIVATIVE: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh_backward": lambda x: 1.0 - torch.tanh(x) ** 2,
    "sigmoid_backward": _sigmoid_grad,
    "gelu_backward": _gelu_grad,
    "gelu_approx_tanh_backward": _gelu_tanh_grad,
    "elu_backward": lambda x: torch.where(x > 0, torch.ones_like(x), torch.exp(x)),
    "softplus_backward": torch.sigmoid,
}

# Modes exact on int64 values, which a node with an integer compute type computes in int64
# (run.py's Context.compute); any other such node computes in float64. A relu without a slope too.
_INTEGER_EXACT = frozenset((
    "abs", "neg", "identity", "logical_not", "add", "bias", "sub", "mul", "scale", "max", "min", "cmp_eq", "cmp_neq",
    "cmp_gt", "cmp_ge", "cmp_lt", "cmp_le", "logical_and", "logical_or", "binary_select", "gen_index",
))


def integer_exact(node) -> bool:
    """Whether this pointwise node computes exactly on int64 values (``_INTEGER_EXACT``)."""
    mode = node.params.get("mode")
    if mode == "relu":
        return not node.params.get("negative_slope") and all(
            node.params.get(clip) is None or float(node.params[clip]).is_integer() for clip in ("lower_clip", "upper_clip"))
    return mode in _INTEGER_EXACT


_RELU_LIKE = ("relu", "leaky_relu", "relu_backward", "leaky_relu_backward")
_SWISH = ("swish", "swish_backward")


def _relu_params(node):
    slope = float(node.params.get("negative_slope") or 0.0)
    lower = node.params.get("lower_clip")
    lower = 0.0 if lower is None else float(lower)
    upper = node.params.get("upper_clip")
    if lower != 0.0 and slope != 0.0:
        raise refuse(node, "lower_clip", lower, "a non-zero lower clip together with negative_slope")
    return slope, lower, upper


def _relu(node, x):
    slope, lower, upper = _relu_params(node)
    if not x.is_floating_point():  # int64 (integer_exact: no slope, integral clips)
        return x.clamp(min=int(lower), max=None if upper is None else int(float(upper)))
    y = torch.where(x < lower, lower + slope * (x - lower), x)  # one of lower, slope is zero (_relu_params)
    return y if upper is None else torch.minimum(y, torch.tensor(float(upper), dtype=x.dtype, device=x.device))


def _relu_backward(node, dy, x):
    slope, lower, upper = _relu_params(node)
    if upper is not None:
        raise refuse(node, "upper_clip", upper, "a clipped relu's backward")
    return torch.where(x > lower, dy, slope * dy)


def _swish(x, beta):
    return x * torch.sigmoid(beta * x)


def _swish_grad(x, beta):
    s = torch.sigmoid(beta * x)
    return s + beta * x * s * (1.0 - s)


def _gen_index(node, x):
    axis = node.params.get("axis")
    if axis is None or not -x.dim() <= int(axis) < x.dim():
        raise refuse(node, "axis", axis, f"gen_index needs an axis of the input's {x.dim()} dims")
    axis = int(axis) % x.dim()
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    return torch.arange(x.shape[axis], dtype=x.dtype, device=x.device).view(shape).expand(x.shape)


def _check_extras(node, mode: str) -> None:
    """A scalar attribute on a mode that does not read it is refused, not ignored."""
    allowed = {"relu": ("negative_slope", "lower_clip", "upper_clip"), "relu_backward": ("negative_slope", "lower_clip", "upper_clip"),
               "leaky_relu": ("negative_slope",), "leaky_relu_backward": ("negative_slope",), "swish": ("swish_beta",),
               "swish_backward": ("swish_beta",), "gen_index": ("axis",)}.get(mode, ())
    check_params(node, ("mode", *allowed))


def _inputs(node, ctx, count: int):
    values = [ctx.value(node.inputs[f"IN_{i}"], node) for i in range(count) if f"IN_{i}" in node.inputs]
    if len(values) != count or len(node.inputs) != count:
        raise ValueError(f"interpreter: pointwise node {node.name!r} ({node.params.get('mode')}) takes {count} inputs, has {len(node.inputs)}")
    return values


def pointwise(node, ctx) -> Dict[str, torch.Tensor]:
    mode = node.params.get("mode")
    _check_extras(node, mode)
    if mode in UNARY:
        (x,) = _inputs(node, ctx, 1)
        y = UNARY[mode](x)
    elif mode in BINARY:
        a, b = _inputs(node, ctx, 2)
        y = BINARY[mode](a, b)
        if mode == "div" and is_integer_data_type(node.compute_data_type):
            y = torch.trunc(y)  # integer division truncates, as C does
    elif mode in ("relu", "leaky_relu"):
        (x,) = _inputs(node, ctx, 1)
        y = _relu(node, x)
    elif mode in ("relu_backward", "leaky_relu_backward"):
        dy, x = _inputs(node, ctx, 2)
        y = _relu_backward(node, dy, x)
    elif mode in _SWISH:
        beta = node.params.get("swish_beta")
        beta = 1.0 if beta is None else float(beta)
        values = _inputs(node, ctx, 1 if mode == "swish" else 2)
        y = _swish(values[0], beta) if mode == "swish" else values[0] * _swish_grad(values[1], beta)
    elif mode in DERIVATIVE:
        dy, x = _inputs(node, ctx, 2)
        y = dy * DERIVATIVE[mode](x)
    elif mode == "gen_index":
        (x,) = _inputs(node, ctx, 1)
        y = _gen_index(node, x)
    elif mode == "binary_select":
        a, b, mask = _inputs(node, ctx, 3)
        y = torch.where(_flag(mask), a, b)
    else:
        raise refuse(node, "mode", mode, "an unknown pointwise mode")
    return {"OUT_0": y}


HANDLERS = {"POINTWISE": pointwise}
