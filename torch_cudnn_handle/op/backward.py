"""The op's Python backward: what the C++ autograd node (csrc/op/autograd_kernels.cpp)
calls when no native plan runs the backward, on whichever thread autograd uses, on the
forward's device and stream.

  * ``backward``: a graph whose ``Backward`` is a function, or a backward graph whose
    operands are computed in Python (registry/backward.py);
  * ``run_declared_backward``: a declared backward graph (its operands assembled by the
    node in C++) that no native plan serves yet.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch._subclasses.fake_tensor import is_fake

from .. import registry
from ..registry import hint_specs, is_host_scalar
from .checks import call_device, cuda_ordinal, key_specs
from .eager import execute
from .reference import description_for

__all__ = ["backward", "run_declared_backward"]


def backward(graph_id: int, grad_outputs, inputs, outputs):
    """Gradients of one ``execute(graph_id, inputs)`` call: one per input, None for none.
    ``grad_outputs`` holds None where autograd gave no gradient (zeros when the graph's
    record materializes them); ``inputs`` and ``outputs`` hold None where the node did
    not save one (``Backward.function(..., reads=...)``)."""
    forward = registry.differentiable(graph_id)
    # A graph is built for exact strides; autograd hands over whatever it has (an
    # expanded scalar has stride 0), so give the backward dense gradients.
    grads = [None if g is None else g.contiguous() for g in grad_outputs]
    if forward.backward.kind == "function":
        grad_inputs = list(forward.backward.fn(grads, inputs, outputs))
    else:
        operands = list(forward.backward.compute_operands(grads, inputs, outputs))
        grad_inputs = _run_backward_graph(forward, operands, len(inputs))
    if len(grad_inputs) != len(inputs):
        raise ValueError(f"the backward of graph {forward.name!r} returned {len(grad_inputs)} gradients for {len(inputs)} inputs")
    return grad_inputs


def run_declared_backward(graph_id: int, operands, num_inputs: int):
    """A declared backward no native plan serves (yet): its operands, assembled by the
    autograd node in C++, run on the backward graph through the op."""
    return _run_backward_graph(registry.definition(graph_id), operands, num_inputs)


def _run_backward_graph(forward, operands, num_inputs: int):
    """One backward graph: its outputs are the gradients its builder returned, in order,
    with the None slots (inputs without a gradient) left out."""
    results = execute(forward.backward_id, operands)
    positions = _output_positions(forward.backward_id, operands)
    grad_inputs = [None] * num_inputs
    for position, grad in zip(positions, results):
        if position >= num_inputs:
            raise ValueError(f"the backward graph of {forward.name!r} returned more gradients than its forward has inputs ({num_inputs})")
        grad_inputs[position] = grad
    return grad_inputs


def _output_positions(graph_id: int, operands: Sequence[torch.Tensor]) -> tuple:
    """Which builder output each of a graph's outputs is, for these operands' layouts.
    Real CUDA tensors: the graph the call just ran was built for them, so its layout says
    (describing the graph again would cost a new length a second description); fake or
    meta ones (a trace): the description's (cached by the registry per layout); which
    builder output each is does not depend on sizes, so hints: no specialization. Real CPU
    tensors: the description the CPU kernel just ran (reference.py)."""
    if all((t.is_cuda or is_host_scalar(t)) and not is_fake(t) for t in operands):
        built = registry.kept_graph(graph_id, call_device(graph_id, operands).index, operands, key_specs(operands),
                                    torch.are_deterministic_algorithms_enabled())
        if built is not None:
            return built.layout.output_positions
        return description_for(graph_id, operands, operands[0].device).layout.output_positions  # building: the stand-in's
    if all(t.is_cpu and not is_fake(t) for t in operands):  # the CPU kernel's kept description: a hit too
        return description_for(graph_id, operands, operands[0].device).layout.output_positions
    return registry.layout(graph_id, hint_specs(operands), cuda_ordinal(operands[0].device)).output_positions
