"""``RMSNorm``: the frontend's rmsnorm node forward, its rmsnorm_backward node backward.

Both graphs follow the frontend's own torch op (``cudnn.ops.norm.rmsnorm``): rows
are laid out as the canonical 4-D ``[rows, hidden, 1, 1]``, the scale as
``[1, hidden, 1, 1]`` of the input's dtype, the forward runs in the TRAINING phase
and also writes ``inv_var`` (``[rows, 1, 1, 1]`` float32, 1/rms per row), which the
backward node reads instead of recomputing it. The backward is *one* graph
(``backward=``): ``dX`` and ``dScale`` from ``dY``, ``X``, the scale and ``inv_var``.

The op takes the module's natural tensors (``x [..., C]``, ``weight [C]``): the graphs
declare how those map to the 4-D layout (``OperandViews``), so a step records no view
node around the op, and ``inv_var`` comes back as ``[..., 1]``.

One difference: the frontend op binds epsilon as a host pass-by-value tensor on
every call; an op input here is a CUDA tensor, so epsilon is a graph-owned scalar
(``tensor_scalar``, a runtime parameter, as the frontend's swiglu op binds its
constants). It is part of the graph's definition: one id per distinct ``eps``,
registered when the first module with that ``eps`` is constructed. The default,
1e-5, is also what the frontend's python norm engines (sm_100) assume when they
find no bound epsilon buffer, so the default means the same on every engine.
"""

from __future__ import annotations

import functools
import threading
from typing import Dict

import cudnn
import torch
from torch import nn

from ..op import execute
from ..registry import Backward, BackwardOperand, OperandViews, register_graph
from ..registry.first_calls import at_site, new_site
from ._layout import declare, row_major

__all__ = ["RMSNorm", "LayerNorm", "rmsnorm_graph", "layernorm_graph"]


def rmsnorm_forward(graph, x, scale, *, eps: float):
    """``y = x * rsqrt(mean(x^2) + eps) * scale`` per row, and ``inv_var`` (1/rms)."""
    epsilon = graph.tensor_scalar(float(eps), cudnn.scalar_type.RUNTIME_PARAM, name="epsilon")
    y, inv_var = graph.rmsnorm(
        name="rmsnorm", norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=x, scale=scale, epsilon=epsilon
    )
    stats = [x.dim[0], 1, 1, 1]
    return [declare(y, x.dim, row_major(x.dim), x.data_type), declare(inv_var, stats, row_major(stats), cudnn.data_type.FLOAT)]


def rmsnorm_backward(graph, dy, x, scale, inv_var, *, eps: float):  # noqa: ARG001 -- eps is the forward's
    """``dX`` and ``dScale`` (no bias, so no ``dBias``)."""
    dx, dscale, _dbias = graph.rmsnorm_backward(name="rmsnorm_bwd", grad=dy, input=x, scale=scale, inv_variance=inv_var, has_dbias=False)
    return [declare(dx, x.dim, row_major(x.dim), x.data_type), declare(dscale, scale.dim, row_major(scale.dim), scale.data_type)]


def torch_rmsnorm_forward(x, weight, *, eps: float):
    """The forward graph's torch stand-in (Note [A new layout's first calls]): ``y`` and ``inv_var``, in float32 as the graph."""
    x32 = x.float()
    inv_var = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    return [(x32 * inv_var * weight.float()).to(x.dtype), inv_var]


def torch_rmsnorm_backward(dy, x, weight, inv_var):
    """The backward graph's torch stand-in: ``dX`` and ``dScale`` from the saved ``inv_var``, in float32 as the graph."""
    x_hat, dy32 = x.float() * inv_var, dy.float()
    g = dy32 * weight.float()
    dx = inv_var * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    return [dx.to(x.dtype), (dy32 * x_hat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)]


# dY, X, scale, inv_var: declared, so the backward runs natively, without Python.
BACKWARD_OPERANDS = (BackwardOperand.grad(0), BackwardOperand.input(0), BackwardOperand.input(1), BackwardOperand.output(1))


def _rows(t):
    """``[..., C]`` as cuDNN's ``[rows, C, 1, 1]`` (a view of the same memory)."""
    return t.reshape(-1, t.shape[-1], 1, 1)


def _channels(t):
    """The scale ``[C]`` as ``[1, C, 1, 1]``."""
    return t.view(1, -1, 1, 1)


def _stats_shape(x_shape):
    return (*x_shape[:-1], 1)


# Natural operands: x [..., C], weight [C]; y like x, inv_var [..., 1].
_FORWARD_VIEWS = OperandViews(inputs=(_rows, _channels), outputs=lambda x, w: [x, _stats_shape(x)])
# dY, X, scale, inv_var [..., 1] in; dX like X, dScale like the scale out.
_BACKWARD_VIEWS = OperandViews(inputs=(_rows, _rows, _channels, _rows), outputs=lambda dy, x, w, s: [x, w])


_graphs: Dict[tuple, int] = {}  # (norm, eps) -> its graph id, for the process
_lock = threading.Lock()


def _graph_for(norm: str, eps: float, forward, backward, operands, views, backward_views, stand_in, backward_stand_in) -> int:
    """The registered ``norm`` graph for ``eps``, registered once per value (``eps`` is part of its definition)."""
    eps = float(eps)
    with _lock:
        if (norm, eps) not in _graphs:
            _graphs[norm, eps] = register_graph(
                forward, name=f"nn_{norm}_eps{eps:g}", params=dict(eps=eps), views=views,
                backward=Backward.graph(backward, operands=operands, views=backward_views, stand_in=backward_stand_in),
                stand_in=functools.partial(stand_in, eps=eps),
            )
        return _graphs[norm, eps]


def rmsnorm_graph(eps: float) -> int:
    """The registered rmsnorm graph for ``eps``."""
    return _graph_for("rmsnorm", eps, rmsnorm_forward, rmsnorm_backward, BACKWARD_OPERANDS, _FORWARD_VIEWS, _BACKWARD_VIEWS,
                      torch_rmsnorm_forward, torch_rmsnorm_backward)


def layernorm_forward(graph, x, scale, bias, *, eps: float):
    """``y = (x - mean) * rsqrt(var + eps) * scale + bias`` per row, and ``mean`` and ``inv_var``."""
    epsilon = graph.tensor_scalar(float(eps), cudnn.scalar_type.RUNTIME_PARAM, name="epsilon")
    y, mean, inv_var = graph.layernorm(
        name="layernorm", norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=x, scale=scale, bias=bias, epsilon=epsilon
    )
    stats = [x.dim[0], 1, 1, 1]
    return [declare(y, x.dim, row_major(x.dim), x.data_type)] + [declare(t, stats, row_major(stats), cudnn.data_type.FLOAT) for t in (mean, inv_var)]


def layernorm_backward(graph, dy, x, scale, mean, inv_var, *, eps: float):  # noqa: ARG001 -- eps is the forward's
    """``dX``, ``dScale`` and ``dBias``."""
    dx, dscale, dbias = graph.layernorm_backward(name="layernorm_bwd", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var)
    return [declare(dx, x.dim, row_major(x.dim), x.data_type)] + [declare(t, scale.dim, row_major(scale.dim), scale.data_type) for t in (dscale, dbias)]


def torch_layernorm_forward(x, weight, bias, *, eps: float):
    """The forward graph's torch stand-in: ``y``, ``mean`` and ``inv_var``, in float32 as the graph."""
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True)
    inv_var = torch.rsqrt((x32 - mean).square().mean(-1, keepdim=True) + eps)
    return [((x32 - mean) * inv_var * weight.float() + bias.float()).to(x.dtype), mean, inv_var]


def torch_layernorm_backward(dy, x, weight, mean, inv_var):
    """The backward graph's torch stand-in: ``dX``, ``dScale`` and ``dBias`` from the saved statistics, in float32 as the graph."""
    x_hat, dy32 = (x.float() - mean) * inv_var, dy.float()
    g = dy32 * weight.float()
    dx = inv_var * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
    channels = x.shape[-1]
    return [dx.to(x.dtype), (dy32 * x_hat).reshape(-1, channels).sum(0).to(weight.dtype), dy32.reshape(-1, channels).sum(0).to(weight.dtype)]


# dY, X, scale, mean, inv_var: declared. Natural operands: x [..., C], weight and bias [C]; y like x, the statistics [..., 1].
LAYERNORM_BACKWARD_OPERANDS = (BackwardOperand.grad(0), BackwardOperand.input(0), BackwardOperand.input(1), BackwardOperand.output(1),
                               BackwardOperand.output(2))
_LAYERNORM_VIEWS = OperandViews(inputs=(_rows, _channels, _channels), outputs=lambda x, w, b: [x, _stats_shape(x), _stats_shape(x)])
_LAYERNORM_BACKWARD_VIEWS = OperandViews(inputs=(_rows, _rows, _channels, _rows, _rows), outputs=lambda dy, x, w, m, s: [x, w, w])


def layernorm_graph(eps: float) -> int:
    """The registered layernorm graph for ``eps``."""
    return _graph_for("layernorm", eps, layernorm_forward, layernorm_backward, LAYERNORM_BACKWARD_OPERANDS, _LAYERNORM_VIEWS,
                      _LAYERNORM_BACKWARD_VIEWS, torch_layernorm_forward, torch_layernorm_backward)


class RMSNorm(nn.Module):
    """RMS normalization over the last dimension with a learned scale (``weight``).

    ``y = x / sqrt(mean(x^2, -1) + eps) * weight``, computed in float32 and
    rounded once to ``x``'s dtype (fp16 or bf16, the parameters' dtype too).
    """

    def __init__(self, dim: int, eps: float = 1e-5, *, device=None, dtype=None):
        super().__init__()
        self.dim, self.eps = dim, float(eps)
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self._graph = rmsnorm_graph(self.eps)
        self._site = new_site()  # its calls' site: a new size's first calls are counted per module (Note [A new layout's first calls])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Natural tensors in and out: the graph views them as its 4-D layout (_FORWARD_VIEWS).
        # A layout with no such view (a non-contiguous x) is made contiguous first.
        return at_site(self._site, execute, self._graph, [x if x.is_contiguous() else x.contiguous(), self.weight])[0]

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps:g}"


class LayerNorm(nn.Module):
    """Layer normalization over the last dimension with a learned scale and shift (``weight``,
    ``bias``), named and initialized as ``nn.LayerNorm``'s; computed in float32 and rounded
    once to ``x``'s dtype (fp16 or bf16, the parameters' dtype too)."""

    def __init__(self, dim: int, eps: float = 1e-5, *, device=None, dtype=None):
        super().__init__()
        self.dim, self.eps = dim, float(eps)
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))
        self._graph = layernorm_graph(self.eps)
        self._site = new_site()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return at_site(self._site, execute, self._graph, [x if x.is_contiguous() else x.contiguous(), self.weight, self.bias])[0]

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps:g}"
