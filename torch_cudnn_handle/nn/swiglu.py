"""SwiGLU's gate: ``silu(x @ W_gate^T) * up`` as one cuDNN graph, and its backward.

A SwiGLU MLP (Llama's) is ``down(silu(gate(x)) * up(x))``. The gate's GEMM carries the
SiLU and the product with ``up`` in its epilogue, so ``silu(gate(x))`` is never written;
``up(x)`` and ``down`` stay plain linears. The graph also writes the pre-activation
``z = x @ W_gate^T``, which the backward reads, as FusedLinear's gelu and silu graphs do.

Backward (declared steps, run by the op's autograd node in C++):

  * ``dZ = (dY * silu'(z)) * up`` and ``dUp = dY * silu(z)``: two pointwise graphs;
  * ``dX = dZ @ W_gate`` and ``dW_gate = dZ^T @ X``: FusedLinear's matmul graphs.

Natural operands, as FusedLinear's: ``x [..., K]``, ``weight [N, K]`` (``nn.Linear``'s
layout), ``up [..., N]``; the result is ``[..., N]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import Backward, BackwardOperand, BackwardStep, OperandViews, register_graph
from ._layout import declare, matrix_rows, row_major
from .linear import MATMUL_DW, MATMUL_DX

__all__ = ["SWIGLU_GATE"]


def swiglu_gate(graph, x, w, up):
    """``silu(x @ w) * up`` and the pre-activation ``x @ w``."""
    dim = [x.dim[0], x.dim[1], w.dim[2]]
    z = graph.matmul(x, w, name="mm")
    gated = graph.mul(graph.swish(z, swish_beta=1.0, name="act"), up, name="gate")
    return [declare(gated, dim, row_major(dim), x.data_type), declare(z, dim, row_major(dim), x.data_type)]


def swiglu_dz(graph, dy, up, z):
    """``(dy * silu'(z)) * up``."""
    return declare(graph.mul(graph.swish_backward(dy, z, swish_beta=1.0, name="dsilu"), up, name="dgated"), dy.dim, row_major(dy.dim),
                   dy.data_type)


def swiglu_dup(graph, dy, z):
    """``dy * silu(z)``."""
    return declare(graph.mul(dy, graph.swish(z, swish_beta=1.0, name="act"), name="dup"), dy.dim, row_major(dy.dim), dy.data_type)


# The torch stand-ins (Note [A new layout's first calls]), on the same natural operands.


def torch_swiglu_gate(x, w, up):
    z = F.linear(x, w)
    return [F.silu(z) * up, z]


def torch_swiglu_dz(dy, up, z):
    return torch.ops.aten.silu_backward(dy * up, z)


def torch_swiglu_dup(dy, z):
    return dy * F.silu(z)


_ROWS = OperandViews(inputs=(matrix_rows, matrix_rows, matrix_rows), outputs=lambda dy, *_: [dy])
SWIGLU_DZ = register_graph(swiglu_dz, name="nn_swiglu_dz", views=_ROWS, stand_in=torch_swiglu_dz)
SWIGLU_DUP = register_graph(swiglu_dup, name="nn_swiglu_dup", views=OperandViews(inputs=(matrix_rows, matrix_rows), outputs=lambda dy, z: [dy]),
                            stand_in=torch_swiglu_dup)


def _backward():
    op = BackwardOperand
    steps = [
        BackwardStep(SWIGLU_DZ, [op.grad(0), op.input(2), op.output(1)], for_grads=[0, 1]),
        BackwardStep(SWIGLU_DUP, [op.grad(0), op.output(1)], for_grads=[2]),
        BackwardStep(MATMUL_DX, [op.step(0), op.input(1)], for_grads=[0]),
        BackwardStep(MATMUL_DW, [op.step(0), op.input(0)], for_grads=[1]),
    ]
    return Backward.steps(steps, grads=[op.step(2), op.step(3), op.step(1)])


SWIGLU_GATE = register_graph(
    swiglu_gate,
    name="nn_swiglu_gate",
    views=OperandViews(inputs=(matrix_rows, lambda w: w.unsqueeze(0).mT, matrix_rows), outputs=lambda x, w, up: [(*x[:-1], w[0])] * 2),
    backward=_backward(),
    stand_in=torch_swiglu_gate,
)
