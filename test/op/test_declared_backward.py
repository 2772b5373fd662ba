"""Declared backward operands (``BackwardOperand``) without a GPU: what registration
refuses, and the operands the autograd node assembles in C++, on meta tensors (the
backward graph is then described, never built, for exactly those operands)."""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import _C, BackwardOperand
from support.graphs import RELU_DECLARED, relu, relu_grad


def two_outputs(graph, x):
    """relu(x), and sigmoid(x) laid out [B, C, H] with strides (12, 1, 3): not contiguous."""
    b = graph.sigmoid(x, name="b")
    return [graph.relu(x, name="a"), b.set_dim(list(x.dim)).set_stride([12, 1, 3])]


SEEN = []  # the backward graph's operand layouts, as its builder was described for them


def uses_all(graph, dy0, dy1, x, y1):
    SEEN.append([(list(t.dim), list(t.stride)) for t in (dy0, dy1, x, y1)])
    return [graph.relu_backward(dy0, x, name="d")]


DECLARED = tch.register_graph(
    two_outputs, name="two_outputs",
    backward=tch.Backward.graph(uses_all, operands=[BackwardOperand.grad(0), BackwardOperand.grad(1, strides_of_output=1), BackwardOperand.input(0), BackwardOperand.output(1)]),
)


def test_registration_refuses_what_is_not_a_declaration():
    with pytest.raises(TypeError, match="sequence of BackwardOperand"):
        tch.register_graph(relu, backward=tch.Backward.graph(relu_grad, operands=[BackwardOperand.grad(0), 1]))
    with pytest.raises(TypeError, match="sequence of BackwardOperand"):
        tch.register_graph(relu, backward=tch.Backward.graph(relu_grad, operands=[]))


def test_registration_checks_indices_and_count_against_the_builders():
    with pytest.raises(ValueError, match=r"BackwardOperand.input\(1\), but the builder takes 1 inputs"):
        tch.register_graph(
            relu, backward=tch.Backward.graph(relu_grad, operands=[BackwardOperand.grad(0), BackwardOperand.input(1)]),
        )
    with pytest.raises(ValueError, match="declares 3 operands, but the backward builder takes 2"):
        tch.register_graph(
            relu,
            backward=tch.Backward.graph(relu_grad, operands=[BackwardOperand.grad(0), BackwardOperand.input(0), BackwardOperand.output(0)]),
        )
    with pytest.raises(ValueError, match="negative index"):
        tch.register_graph(
            relu, backward=tch.Backward.graph(relu_grad, operands=[BackwardOperand.grad(-1), BackwardOperand.input(0)]),
        )
    with pytest.raises(TypeError, match="needs a backward builder"):
        tch.register_graph(relu, backward_operands=[BackwardOperand.grad(0)])


def test_a_record_is_declared_once_per_graph():
    with pytest.raises(RuntimeError, match="already has a record"):
        _C.declare_graph(DECLARED, True, DECLARED, [(1, 0, -1)], None, None, True)


def test_the_node_zero_fills_a_missing_gradient_densifies_and_restrides():
    SEEN.clear()
    x = torch.empty(2, 3, 4, device="meta", requires_grad=True)
    y0, y1 = tch.execute(DECLARED, [x])
    assert y1.stride() == (12, 1, 3)
    y1.sum().backward()  # no gradient for y0; y1's is an expanded scalar (stride 0)
    assert x.grad is not None and x.grad.shape == x.shape
    (dy0, dy1, seen_x, seen_y1), = SEEN
    assert dy0 == ([2, 3, 4], [12, 4, 1])  # zeros like y0, dense
    assert dy1 == ([2, 3, 4], [12, 1, 3])  # given y1's strides (strides_of_output=1)
    assert seen_x == ([2, 3, 4], [12, 4, 1]) and seen_y1 == ([2, 3, 4], [12, 1, 3])


def test_an_operand_the_call_does_not_have_is_named():
    bad = tch.register_graph(
        two_outputs, name="names_output_5",
        backward=tch.Backward.graph(lambda g, dy, y: [g.relu_backward(dy, y)], operands=[BackwardOperand.grad(0), BackwardOperand.output(5)]),
    )
    x = torch.empty(2, 3, 4, device="meta", requires_grad=True)
    y0, _ = tch.execute(bad, [x])
    with pytest.raises(RuntimeError, match=r"names outputs\[5\], but the forward call has 2 outputs"):
        y0.sum().backward()


def test_a_declared_backward_differentiates_on_meta_tensors():
    x = torch.empty(4, 8, 8, device="meta", requires_grad=True)
    (y,) = tch.execute(RELU_DECLARED, [x])
    y.backward(torch.empty_like(y))
    assert x.grad is not None and x.grad.shape == x.shape and x.grad.device.type == "meta"


@pytest.mark.parametrize("materialize", [True, False])
def test_a_backward_function_gets_zeros_or_none_for_an_unused_output(materialize):
    seen = []

    def backward_fn(grads, inputs, outputs):
        seen.append([None if g is None else (g.shape, bool(g.device.type == "meta")) for g in grads])
        return [torch.empty_like(inputs[0])]

    gid = tch.register_graph(
        two_outputs, name=f"two_outputs_fn_{materialize}",
        backward=tch.Backward.function(backward_fn, materialize_grads=materialize),
    )
    x = torch.empty(2, 8, 8, device="meta", requires_grad=True)
    a, _b = tch.execute(gid, [x])
    a.backward(torch.empty_like(a))
    assert seen[0][0] == (a.shape, True)
    assert seen[0][1] == ((a.shape, True) if materialize else None)
