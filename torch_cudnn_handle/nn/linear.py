"""``FusedLinear``: ``act(x @ W^T + b)`` as one cuDNN graph, and its backward.

Forward: one graph per activation, matmul -> bias add -> activation fused in the
matmul's epilogue. The batch dimensions are folded into the rows first: the
frontend's matmul takes 3-D ``[batch, M, K] @ [batch, K, N]`` tensors, and one
``[1, B*M, K] @ [1, K, N]`` product is the same GEMM torch's ``linear`` runs, with
no question of whether a batch-1 weight broadcasts over a batch of inputs.

Backward (``backward_fn``): cuDNN fuses one matmul per graph, so it is three
small graphs and a torch sum:

  * ``dZ``: the activation's backward, pointwise (relu from the output ``y``;
    gelu from the pre-activation ``z``, which the gelu forward graph writes as a
    second output, as the frontend's own swiglu op saves its pre-activations, so
    the backward needs no recompute GEMM); ``dZ = dY`` without an activation;
  * ``dX = dZ @ W`` and ``dW = dZ^T @ X``: the same registered matmul graph, on
    transposed *views* (strides, never copies);
  * ``db``: ``dZ.sum`` over the rows (a reduction torch does well).

The weight is stored as torch's ``nn.Linear`` stores it, ``[out, in]``, so a state
dict moves between this module and its plain-torch reference unchanged; the
forward reads it as the ``[1, in, out]`` view ``weight.unsqueeze(0).mT``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ..op import execute
from ..registry import BackwardOperand, register_graph
from ._layout import declare, row_major

__all__ = ["FusedLinear", "ACTIVATIONS", "LINEAR_GRAPHS", "MATMUL", "RELU_BACKWARD", "GELU_BACKWARD"]

ACTIVATIONS = (None, "relu", "gelu")


# ---------------------------------------------------------------------------------
# Graph builders


def _product_dims(a, b):
    return [a.dim[0], a.dim[1], b.dim[2]]


def matmul(graph, a, b):
    """``a @ b`` for ``[batch, M, K]`` and ``[batch, K, N]``: the dX and dW products."""
    dim = _product_dims(a, b)
    return declare(graph.matmul(a, b, name="mm"), dim, row_major(dim), a.data_type)


def linear_forward(graph, x, w, b, *, activation: Optional[str]):
    """``act(x @ w + b)``; with gelu also the pre-activation ``x @ w + b``."""
    dim = _product_dims(x, w)
    stride = row_major(dim)
    z = graph.add(graph.matmul(x, w, name="mm"), b, name="bias")
    if activation is None:
        return declare(z, dim, stride, x.data_type)
    if activation == "relu":
        return declare(graph.relu(z, name="act"), dim, stride, x.data_type)
    if activation == "gelu":
        y = declare(graph.gelu(z, name="act"), dim, stride, x.data_type)
        return [y, declare(z, dim, stride, x.data_type)]
    raise ValueError(f"FusedLinear: activation must be one of {ACTIVATIONS}, got {activation!r}")


def relu_backward(graph, dy, y):
    """``dy * (y > 0)``: relu's mask is the same read from its output as from its input."""
    return declare(graph.relu_backward(dy, y, name="drelu"), dy.dim, row_major(dy.dim), dy.data_type)


def gelu_backward(graph, dy, z):
    """``dy * gelu'(z)`` (the exact, erf gelu, as torch's default)."""
    return declare(graph.gelu_backward(dy, z, name="dgelu"), dy.dim, row_major(dy.dim), dy.data_type)


MATMUL = register_graph(matmul, name="nn_matmul")
RELU_BACKWARD = register_graph(relu_backward, name="nn_relu_backward")
GELU_BACKWARD = register_graph(gelu_backward, name="nn_gelu_backward")


def _make_backward(activation: Optional[str]):
    def linear_backward(grads, inputs, outputs):
        # x [1, R, K], w [1, K, N] (a view of weight [N, K]); each saved only when the
        # other's gradient is needed (_backward_reads), else None.
        x, w = inputs[0], inputs[1]
        dy, dz_given = grads[0], grads[1] if len(grads) > 1 else None  # dz_given: the gelu graph's z used directly
        if dy is None:
            dz = dz_given
        else:
            if activation == "relu":
                (dy,) = execute(RELU_BACKWARD, [dy, outputs[0]])
            elif activation == "gelu":
                (dy,) = execute(GELU_BACKWARD, [dy, outputs[1]])
            dz = dy if dz_given is None else dy + dz_given
        dx = execute(MATMUL, [dz, w.mT])[0] if w is not None else None  # [1, R, N] @ [1, N, K]
        dw = execute(MATMUL, [dz.mT, x])[0].mT if x is not None else None  # [1, N, R] @ [1, R, K]: weight's own layout
        return [dx, dw, dz.sum(dim=1, keepdim=True)]

    linear_backward.__name__ = f"linear_{activation or 'identity'}_backward"
    return linear_backward


def _backward_reads(activation: Optional[str]):
    """What the backward reads, as torch's linear and activations save: ``x`` for ``dW``,
    ``W`` for ``dX``, and the activation's own (relu: its output; gelu: its input ``z``)."""
    reads = [BackwardOperand.input(0, for_grads=[1]), BackwardOperand.input(1, for_grads=[0])]
    if activation == "relu":
        reads.append(BackwardOperand.output(0))
    elif activation == "gelu":
        reads.append(BackwardOperand.output(1))
    return reads


LINEAR_GRAPHS = {
    activation: register_graph(
        linear_forward,
        name=f"nn_linear_{activation or 'identity'}",
        backward_fn=_make_backward(activation),
        backward_reads=_backward_reads(activation),
        materialize_grads=False,  # the gelu graph's pre-activation output gets no gradient from the module: no zero fill
        activation=activation,
    )
    for activation in ACTIVATIONS
}


# ---------------------------------------------------------------------------------
# The module


class FusedLinear(nn.Module):
    """``act(x @ weight.T + bias)`` on cuDNN graphs, forward and backward.

    ``x`` is ``[..., in_features]`` (typically ``[B, M, K]``), fp16 or bf16, of the
    parameters' dtype; the result is ``[..., out_features]``. ``activation`` is
    ``"relu"``, ``"gelu"`` (exact, erf) or ``None``. Parameters are named and laid
    out as ``nn.Linear``'s and initialized the same way.
    """

    def __init__(self, in_features: int, out_features: int, activation: Optional[str] = "relu", *, device=None, dtype=None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"FusedLinear: activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        self._graph = LINEAR_GRAPHS[activation]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialization."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
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
        lead = x.shape[:-1]
        rows = x.reshape(1, -1, self.in_features)  # [1, B*M, K]; a view of a contiguous x
        weight = self.weight.unsqueeze(0).mT  # [1, K, N] view of [N, K]
        bias = self.bias.view(1, 1, self.out_features)
        y = execute(self._graph, [rows, weight, bias])[0]
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, activation={self.activation!r}"
