"""A linear whose weight is stored ``[in, out]``: ``act(x @ W + b)``, transformers' ``Conv1D``
(GPT-2's projections, ``torch.addmm(b, x, W)``), on FusedLinear's graphs.

The forward is FusedLinear's graph with the weight viewed ``[1, in, out]`` as it lies
(``nn.Linear``'s ``[out, in]`` weight is viewed through a transpose instead); the backward
is FusedLinear's steps with the two products for this layout: ``dX = dZ @ W^T`` and
``dW = X^T @ dZ`` (``[in, out]``, the weight's own layout). Natural operands: ``x [..., K]``,
``weight [K, N]``, ``bias [N]``; the result is ``[..., N]`` (and, for the activations whose
backward reads it, the pre-activation).
"""

from __future__ import annotations

from ..registry import BackwardOperand, BackwardStep, OperandViews, register_graph
from ._layout import matrix_rows, matrix_rows_transposed
from .linear import ACTIVATIONS, WRITES_PRE_ACTIVATION, matmul, register_linear, torch_linear_forward

__all__ = ["TRANSPOSED_LINEAR_GRAPHS"]


def torch_dx(dz, w):
    return dz @ w.mT


def torch_dw(x, dz):
    return x.reshape(-1, x.shape[-1]).mT @ dz.reshape(-1, dz.shape[-1])


def torch_forward(x, w, b, *, activation):
    return torch_linear_forward(x, w.mT, b, activation=activation)


MATMUL_DX = register_graph(matmul, name="nn_transposed_linear_dx", stand_in=torch_dx,
                           views=OperandViews(inputs=(matrix_rows, lambda w: w.unsqueeze(0).mT), outputs=lambda dz, w: [(*dz[:-1], w[0])]))
MATMUL_DW = register_graph(matmul, name="nn_transposed_linear_dw", stand_in=torch_dw,
                           views=OperandViews(inputs=(matrix_rows_transposed, matrix_rows), outputs=lambda x, dz: [(x[-1], dz[-1])]))


def _products(dz):
    op = BackwardOperand
    return [BackwardStep(MATMUL_DX, [dz, op.input(1)], for_grads=[0]), BackwardStep(MATMUL_DW, [op.input(0), dz], for_grads=[1])]


def _views(activation) -> OperandViews:
    outputs = 2 if activation in WRITES_PRE_ACTIVATION else 1
    return OperandViews(inputs=(matrix_rows, lambda w: w.unsqueeze(0), lambda b: b.view(1, 1, -1)),
                        outputs=lambda x, w, b: [(*x[:-1], w[1])] * outputs)


TRANSPOSED_LINEAR_GRAPHS = {
    activation: register_linear(activation, True, name="nn_transposed_linear", views=_views(activation), products=_products,
                                stand_in=torch_forward)
    for activation in ACTIVATIONS
}
