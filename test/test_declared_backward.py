"""Declared backward operands (``BackwardOperand``) without a GPU: what registration
refuses, and the assembly the autograd node runs in C++ (the same function the Python
fallback calls), on CPU and meta tensors."""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import _C, BackwardOperand
from graphs import RELU_DECLARED, relu, relu_grad


def two_outputs(graph, x):
    return [graph.relu(x, name="a"), graph.sigmoid(x, name="b")]


def uses_all(graph, dy0, dy1, x, y1):
    return [graph.relu_backward(dy0, x, name="d")]


DECLARED = tch.register_graph(
    two_outputs,
    name="two_outputs",
    backward=uses_all,
    backward_operands=[BackwardOperand.grad(0), BackwardOperand.grad(1, strides_of_output=1), BackwardOperand.input(0), BackwardOperand.output(1)],
)


def test_registration_refuses_what_is_not_a_declaration():
    with pytest.raises(TypeError, match="sequence of BackwardOperand"):
        tch.register_graph(relu, backward=relu_grad, backward_operands=[BackwardOperand.grad(0), 1])
    with pytest.raises(TypeError, match="sequence of BackwardOperand"):
        tch.register_graph(relu, backward=relu_grad, backward_operands=[])


def test_registration_checks_indices_and_count_against_the_builders():
    with pytest.raises(ValueError, match=r"BackwardOperand.input\(1\), but the builder takes 1 inputs"):
        tch.register_graph(relu, backward=relu_grad, backward_operands=[BackwardOperand.grad(0), BackwardOperand.input(1)])
    with pytest.raises(ValueError, match="declares 3 operands, but the backward builder takes 2"):
        tch.register_graph(
            relu, backward=relu_grad, backward_operands=[BackwardOperand.grad(0), BackwardOperand.input(0), BackwardOperand.output(0)]
        )
    with pytest.raises(ValueError, match="negative index"):
        tch.register_graph(relu, backward=relu_grad, backward_operands=[BackwardOperand.grad(-1), BackwardOperand.input(0)])
    with pytest.raises(TypeError, match="needs a backward builder"):
        tch.register_graph(relu, backward_operands=[BackwardOperand.grad(0)])


def test_a_declaration_is_made_once_per_graph():
    with pytest.raises(RuntimeError, match="already has a declared backward"):
        _C.declare_backward(DECLARED, DECLARED, [(1, 0, -1)])


def test_assembly_zero_fills_a_missing_gradient_densifies_and_restrides():
    x = torch.randn(2, 3, 4)
    y0 = torch.randn(2, 3, 4)
    y1 = torch.randn(2, 4, 3).transpose(1, 2)  # strides (12, 1, 3): not contiguous
    dy1 = torch.randn(2, 3, 4)  # contiguous: must come back with y1's strides
    operands = _C.assemble_backward_operands(DECLARED, [None, dy1], [x], [y0, y1])
    assert len(operands) == 4
    assert torch.equal(operands[0], torch.zeros_like(y0))
    assert operands[1].stride() == y1.stride() and torch.equal(operands[1], dy1)
    assert operands[2] is not None and operands[2].data_ptr() == x.data_ptr()  # saved tensors are passed as they are
    assert operands[3].data_ptr() == y1.data_ptr() and operands[3].stride() == y1.stride()
    # a non-contiguous gradient without strides_of_output is made contiguous
    dy0 = torch.randn(2, 4, 3).transpose(1, 2)
    dense = _C.assemble_backward_operands(DECLARED, [dy0, y1.clone()], [x], [y0, y1])[0]
    assert dense.is_contiguous() and torch.equal(dense, dy0)


def test_assembly_names_an_operand_the_call_does_not_have():
    x = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError, match=r"names grad_outputs\[1\], but the forward call has 1 grad_outputs"):
        _C.assemble_backward_operands(DECLARED, [None], [x], [x])
    with pytest.raises(RuntimeError, match="has no declared backward"):
        _C.assemble_backward_operands(10**9, [None], [x], [x])


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

    gid = tch.register_graph(two_outputs, name=f"two_outputs_fn_{materialize}", backward_fn=backward_fn, materialize_grads=materialize)
    x = torch.empty(2, 8, 8, device="meta", requires_grad=True)
    a, _b = tch.execute(gid, [x])
    a.backward(torch.empty_like(a))
    assert seen[0][0] == (a.shape, True)
    assert seen[0][1] == ((a.shape, True) if materialize else None)
