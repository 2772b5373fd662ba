"""``FusedLinear``: ``act(x @ W^T + b)`` as one cuDNN graph, and its backward.

Forward: one graph per activation and bias (or none), matmul -> bias add -> activation
fused in the matmul's epilogue. The batch dimensions are folded into the rows first: the
frontend's matmul takes 3-D ``[batch, M, K] @ [batch, K, N]`` tensors, and one
``[1, B*M, K] @ [1, K, N]`` product is the same GEMM torch's ``linear`` runs, with
no question of whether a batch-1 weight broadcasts over a batch of inputs.

Backward (``Backward.steps``, declared): cuDNN fuses one matmul per graph, so it is
up to three small graphs and a torch sum, which the op's autograd node runs as one
node in C++ (no Python per step):

  * ``dZ``: the activation's backward, pointwise (relu from the output ``y``;
    gelu, gelu_tanh and silu from the pre-activation ``z``, which their forward graphs write as a
    second output, as the frontend's own swiglu op saves its pre-activations, so
    the backward needs no recompute GEMM); ``dZ = dY`` without an activation;
  * ``dX = dZ @ W`` and ``dW = dZ^T @ X``: the matmul graph, on transposed *views*
    (strides, never copies), each only when its gradient is needed;
  * ``db``: ``dZ`` summed to the bias's shape (a reduction torch does well), where there is a bias.

The weight is stored as torch's ``nn.Linear`` stores it, ``[out, in]``, so a state
dict moves between this module and its plain-torch reference unchanged. Every graph
takes natural tensors (``OperandViews``): the forward describes the weight as the
``[1, in, out]`` view ``weight.unsqueeze(0).mT`` and ``x`` as ``[1, rows, in]``, and
returns ``[..., out]``, so no view node is recorded around the op.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..op import execute
from ..registry import Backward, BackwardOperand, BackwardStep, OperandViews, register_graph
from ..registry.first_calls import at_site, new_site
from ._layout import declare, matrix_rows, matrix_rows_transposed, row_major

__all__ = ["FusedLinear", "ACTIVATIONS", "LINEAR_GRAPHS", "BIAS_FREE_LINEAR_GRAPHS", "MATMUL", "MATMUL_DX", "MATMUL_DW", "RELU_BACKWARD",
           "GELU_BACKWARD"]

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
WRITES_PRE_ACTIVATION = ("gelu", "gelu_tanh", "silu")  # activations whose backward reads the pre-activation z: their forward writes it too


# ---------------------------------------------------------------------------------
# Graph builders


def _product_dims(a, b):
    return [a.dim[0], a.dim[1], b.dim[2]]


def matmul(graph, a, b):
    """``a @ b`` for ``[batch, M, K]`` and ``[batch, K, N]``: the dX and dW products."""
    dim = _product_dims(a, b)
    return declare(graph.matmul(a, b, name="mm"), dim, row_major(dim), a.data_type)


def linear_forward(graph, x, w, b, *, activation: Optional[str]):
    """``act(x @ w + b)`` (``x @ w`` for ``b=None``); with the activations whose backward reads it
    (gelu, its tanh approximation, silu) also the pre-activation."""
    dim = _product_dims(x, w)
    stride = row_major(dim)
    z = graph.matmul(x, w, name="mm")
    if b is not None:
        z = graph.add(z, b, name="bias")
    if activation is None:
        return declare(z, dim, stride, x.data_type)
    if activation == "relu":
        return declare(graph.relu(z, name="act"), dim, stride, x.data_type)
    if activation == "silu":
        act = graph.swish(z, swish_beta=1.0, name="act")
    elif activation in WRITES_PRE_ACTIVATION:
        act = (graph.gelu if activation == "gelu" else graph.gelu_approx_tanh)(z, name="act")
    if activation in WRITES_PRE_ACTIVATION:
        return [declare(act, dim, stride, x.data_type), declare(z, dim, stride, x.data_type)]
    raise ValueError(f"FusedLinear: activation must be one of {ACTIVATIONS}, got {activation!r}")


def bias_free_linear_forward(graph, x, w, *, activation: Optional[str]):
    """``act(x @ w)``: a linear without a bias (Llama's projections)."""
    return linear_forward(graph, x, w, None, activation=activation)


def relu_backward(graph, dy, y):
    """``dy * (y > 0)``: relu's mask is the same read from its output as from its input."""
    return declare(graph.relu_backward(dy, y, name="drelu"), dy.dim, row_major(dy.dim), dy.data_type)


def gelu_backward(graph, dy, z):
    """``dy * gelu'(z)`` (the exact, erf gelu, as torch's default)."""
    return declare(graph.gelu_backward(dy, z, name="dgelu"), dy.dim, row_major(dy.dim), dy.data_type)


def gelu_tanh_backward(graph, dy, z):
    """``dy * gelu'(z)`` for gelu's tanh approximation."""
    return declare(graph.gelu_approx_tanh_backward(dy, z, name="dgelu"), dy.dim, row_major(dy.dim), dy.data_type)


def silu_backward(graph, dy, z):
    """``dy * silu'(z)``."""
    return declare(graph.swish_backward(dy, z, swish_beta=1.0, name="dsilu"), dy.dim, row_major(dy.dim), dy.data_type)


# The graphs' torch stand-ins (Note [A new layout's first calls]): the same outputs from torch
# ops, on the op's natural operands, in their dtype.


def torch_linear_forward(x, w, b, *, activation: Optional[str]):
    z = F.linear(x, w, b)
    if activation in WRITES_PRE_ACTIVATION:
        return [F.silu(z) if activation == "silu" else F.gelu(z, approximate="tanh" if activation == "gelu_tanh" else "none"), z]
    return z if activation is None else torch.relu(z)


def torch_bias_free_linear_forward(x, w, *, activation: Optional[str]):
    return torch_linear_forward(x, w, None, activation=activation)


def torch_relu_backward(dy, y):
    return torch.where(y > 0, dy, torch.zeros_like(dy))


def torch_gelu_backward(dy, z):
    return torch.ops.aten.gelu_backward(dy, z)


def torch_gelu_tanh_backward(dy, z):
    return torch.ops.aten.gelu_backward(dy, z, approximate="tanh")


def torch_silu_backward(dy, z):
    return torch.ops.aten.silu_backward(dy, z)


def torch_dx(dz, w):
    return dz @ w


def torch_dw(dz, x):
    return dz.reshape(-1, dz.shape[-1]).mT @ x.reshape(-1, x.shape[-1])


MATMUL = register_graph(matmul, name="nn_matmul")
RELU_BACKWARD = register_graph(relu_backward, name="nn_relu_backward")
GELU_BACKWARD = register_graph(gelu_backward, name="nn_gelu_backward")


# ---------------------------------------------------------------------------------
# Natural operands (registry OperandViews): the op takes the module's own tensors, x
# [..., K], weight [N, K], bias [N], and returns y [..., N]; each graph views them as the
# 3-D tensors the matmul takes, so a step records no view node around the op.


def _like_rows(*shapes):
    return [shapes[0]]


def forward_views(activation: Optional[str], bias: bool = True) -> OperandViews:
    outputs = 2 if activation in WRITES_PRE_ACTIVATION else 1  # the pre-activation z too, for their backward
    inputs = (matrix_rows, lambda w: w.unsqueeze(0).mT) + ((lambda b: b.view(1, 1, -1)),) * bias
    return OperandViews(inputs=inputs, outputs=lambda x, w, *b: [(*x[:-1], w[0])] * outputs)


# The backward's graphs on natural operands: dZ [..., N] from dY and y (relu) or z (gelu);
# dX [..., K] = dZ @ W; dW [N, K] = dZ^T @ X.
_POINTWISE_VIEWS = OperandViews(inputs=(matrix_rows, matrix_rows), outputs=_like_rows)
RELU_BACKWARD_ROWS = register_graph(relu_backward, name="nn_linear_relu_backward", views=_POINTWISE_VIEWS, stand_in=torch_relu_backward)
GELU_BACKWARD_ROWS = register_graph(gelu_backward, name="nn_linear_gelu_backward", views=_POINTWISE_VIEWS, stand_in=torch_gelu_backward)
SILU_BACKWARD_ROWS = register_graph(silu_backward, name="nn_linear_silu_backward", views=_POINTWISE_VIEWS, stand_in=torch_silu_backward)
GELU_TANH_BACKWARD_ROWS = register_graph(gelu_tanh_backward, name="nn_linear_gelu_tanh_backward", views=_POINTWISE_VIEWS,
                                         stand_in=torch_gelu_tanh_backward)
Z_BACKWARD_ROWS = {"gelu": GELU_BACKWARD_ROWS, "gelu_tanh": GELU_TANH_BACKWARD_ROWS, "silu": SILU_BACKWARD_ROWS}
MATMUL_DX = register_graph(
    matmul, name="nn_linear_dx", views=OperandViews(inputs=(matrix_rows, lambda w: w.unsqueeze(0)), outputs=lambda dz, w: [(*dz[:-1], w[1])]),
    stand_in=torch_dx,
)
MATMUL_DW = register_graph(
    matmul, name="nn_linear_dw", views=OperandViews(inputs=(matrix_rows_transposed, matrix_rows), outputs=lambda dz, x: [(dz[-1], x[-1])]),
    stand_in=torch_dw,
)


def _linear_products(dz):
    """dX = dZ @ W and dW = dZ^T @ X for nn.Linear's ``[out, in]`` weight."""
    op = BackwardOperand
    return [BackwardStep(MATMUL_DX, [dz, op.input(1)], for_grads=[0]), BackwardStep(MATMUL_DW, [dz, op.input(0)], for_grads=[1])]


def _backward_steps(activation: Optional[str], bias: bool, products=_linear_products):
    """The backward as declared steps, run by the op's autograd node in C++: ``dZ`` (the
    activation's backward; ``dY`` itself without one), ``dX`` only when x needs a
    gradient (it reads W), ``dW`` only when the weight does (it reads x): ``products(dZ)``,
    and ``db``, dZ summed to the bias's shape (a torch sum). The second output of the
    graphs that write z is read here and takes no gradient: it is non-differentiable."""
    op = BackwardOperand
    steps = []
    dz = op.grad(0)
    if activation is not None:
        pointwise, read = (RELU_BACKWARD_ROWS, op.output(0)) if activation == "relu" else (Z_BACKWARD_ROWS[activation], op.output(1))
        steps.append(BackwardStep(pointwise, [op.grad(0), read]))
        dz = op.step(0)
    dx, dw = len(steps), len(steps) + 1
    steps += products(dz)
    return steps, [op.step(dx), op.step(dw)] + [dz.sum_to_input()] * bias


def register_linear(activation: Optional[str], bias: bool, *, name: str = "nn_linear", views=None, products=_linear_products,
                    stand_in=None) -> int:
    """One linear graph: ``activation``, a bias or none; nn.Linear's weight layout unless
    ``views``, ``products`` (the dX and dW steps) and ``stand_in`` say another."""
    steps, grads = _backward_steps(activation, bias, products)
    forward, torch_forward = (linear_forward, torch_linear_forward) if bias else (bias_free_linear_forward, torch_bias_free_linear_forward)
    return register_graph(
        forward,
        name=f"{name}_{activation or 'identity'}" + ("" if bias else "_bias_free"),
        params=dict(activation=activation),
        views=views or forward_views(activation, bias),
        backward=Backward.steps(steps, grads=grads),
        stand_in=functools.partial(stand_in or torch_forward, activation=activation),
    )


LINEAR_GRAPHS = {activation: register_linear(activation, bias=True) for activation in ACTIVATIONS}
BIAS_FREE_LINEAR_GRAPHS = {activation: register_linear(activation, bias=False) for activation in ACTIVATIONS}


# ---------------------------------------------------------------------------------
# The module


class FusedLinear(nn.Module):
    """``act(x @ weight.T + bias)`` on cuDNN graphs, forward and backward.

    ``x`` is ``[..., in_features]`` (typically ``[B, M, K]``), fp16 or bf16, of the
    parameters' dtype; the result is ``[..., out_features]``. ``activation`` is
    ``"relu"``, ``"gelu"`` (exact, erf), ``"gelu_tanh"`` (gelu's tanh approximation),
    ``"silu"`` or ``None``; ``bias=False`` leaves the
    bias out, as ``nn.Linear``'s flag does. Parameters are named and laid out as
    ``nn.Linear``'s and initialized the same way.
    """

    def __init__(self, in_features: int, out_features: int, activation: Optional[str] = "relu", *, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"FusedLinear: activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self._graph = (LINEAR_GRAPHS if bias else BIAS_FREE_LINEAR_GRAPHS)[activation]
        self._site = new_site()  # its calls' site: a new size's first calls are counted per module (Note [A new layout's first calls])
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialization."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Plain Python checks on shape and dtype: they run on fake tensors too, so a trace fails here.
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"FusedLinear: the input is {list(x.shape)}, but this layer takes in_features={self.in_features} "
                f"(the input's last dimension); pass [..., {self.in_features}] or build FusedLinear("
                f"{x.shape[-1] if x.dim() else '...'}, {self.out_features})"
            )
        if x.dtype != self.weight.dtype:
            raise TypeError(
                f"FusedLinear: the input is {str(x.dtype).replace('torch.', '')}, but the weights are "
                f"{str(self.weight.dtype).replace('torch.', '')} (one cuDNN graph takes one io type); cast one of them: "
                f"x.to({self.weight.dtype}) or module.to({x.dtype})"
            )
        # Natural tensors in and out: the graph views them as [1, B*M, K] @ [1, K, N] + [1, 1, N]
        # (forward_views). A layout with no such view (a non-contiguous x) is made contiguous first.
        bias = [] if self.bias is None else [self.bias]
        return at_site(self._site, execute, self._graph, [x if x.is_contiguous() else x.contiguous(), self.weight, *bias])[0]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, activation={self.activation!r}"
                + ("" if self.bias is not None else ", bias=False"))
