"""The eager entries ``execute``, ``execute_out`` and ``execute_``: the op itself with a cheaper
way in. Eagerly each enters the dispatcher from C++ (autograd, then the CUDA kernel)
without torch.ops' generic argument parsing; under torch.compile, under a
``TorchFunctionMode`` and for tensor subclasses with ``__torch_function__`` each is the op
itself, so tracing, modes and subclasses see ``cudnn_fe.execute`` either way.

A graph registered with ``buckets=`` is padded to its bucket and narrowed back here, in
torch ops around the op, on every route, after the padding check of its layout
(Note [Size buckets] in registry/buckets.py, op/bucket_check.py).
"""

from __future__ import annotations

from typing import List

import torch

from .. import registry, trace_constants
from .._extension import _C
from .bucket_check import check_padding
from .checks import argument_error, graph_label

__all__ = ["execute", "execute_out", "execute_"]

_has_torch_function = torch._C._has_torch_function  # a TorchFunctionMode, or an input with __torch_function__


def _bucket_rule(graph):
    """``(id, name, Buckets.rule)`` of a graph registered with ``buckets=``, or None. While
    tracing, compared against registry.BUCKET_RULES (a constant of the frame: a graph id may
    be symbolic there); eagerly one lookup in registry.BUCKETED, none before a graph has buckets."""
    if torch.compiler.is_compiling():
        for entry in registry.BUCKET_RULES:
            if graph == entry[0]:
                return entry
        return None
    entry = registry.BUCKETED.get(graph) if type(graph) is int and registry.BUCKETED else None
    return None if entry is None else (graph, *entry)


# Padded layouts checked already (Note [Size buckets]: bucket_check.py), one set lookup a
# call; for the process. A trace is checked by the fake kernel instead.
_checked_layouts: set = set()


def _bucketed_execute(graph: int, name: str, rule: tuple, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    padded, size = registry.padded(name, rule, inputs)
    if not torch.compiler.is_compiling():
        layout = (graph, *((t.shape, t.stride(), t.dtype) for t in padded))
        if layout not in _checked_layouts:
            check_padding(registry.definition(graph), [registry.TensorSpec.of(t) for t in padded])
            _checked_layouts.add(layout)
    return registry.narrowed(rule, _execute(graph, padded), size)


def execute(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """``torch.ops.cudnn_fe.execute(graph, inputs)``: the graph's outputs, new tensors (for a
    graph registered with ``buckets=``, the named outputs are views of its bucket's)."""
    bucketed = _bucket_rule(graph)
    if bucketed is not None:
        return _bucketed_execute(*bucketed, inputs)
    return _execute(graph, inputs)


def _execute(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    try:
        routed = _has_torch_function(inputs)  # a TypeError for inputs that are not a sequence
    except TypeError as error:
        raise argument_error(graph, inputs=inputs) or error from None
    if routed or torch.compiler.is_compiling():
        return torch.ops.cudnn_fe.execute.default(graph, inputs)
    try:
        return _C.execute(graph, inputs)
    except TypeError as error:  # pybind11 refused an argument: say which, off the hot path
        raise argument_error(graph, inputs=inputs) or error from None


def execute_out(graph: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    """``torch.ops.cudnn_fe.execute.out(graph, inputs, out=out)``; see :func:`execute` (a
    bucketed graph's outputs are copied into ``out``)."""
    bucketed = _bucket_rule(graph)
    if bucketed is not None:
        values = _bucketed_execute(*bucketed, inputs)
        if len(out) != len(values) or any(tuple(t.shape) != tuple(v.shape) for t, v in zip(out, values)):
            raise ValueError(
                f"cudnn_fe.execute.out: graph {graph_label(graph)} returns outputs of shapes {[list(v.shape) for v in values]}, "
                f"but out has {[list(t.shape) for t in out]}; allocate out with those shapes"
            )
        for target, value in zip(out, values):
            target.copy_(value)
        return None
    try:
        routed = _has_torch_function(inputs) or _has_torch_function(out)
    except TypeError as error:
        raise argument_error(graph, inputs=inputs, out=out) or error from None
    if routed or torch.compiler.is_compiling():
        return torch.ops.cudnn_fe.execute.out(graph, inputs, out=out)
    try:
        _C.execute_out(graph, inputs, out=out)
    except TypeError as error:
        raise argument_error(graph, inputs=inputs, out=out) or error from None


@trace_constants.constant("written_inputs")
def _written_inputs(graph: int) -> tuple:
    """Which inputs the graph writes in place (its record's), read once per trace: a
    constant of the compiled frame, not a graph break (called as
    ``trace_constants.written_inputs``, which marks it for dynamo without loading dynamo here)."""
    return tuple(input_ for _, input_ in _C.in_place_writes(graph))


def execute_(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """Run a graph registered with ``in_place={output: input}``: those outputs are written
    into those inputs (given here in the builder's order, as to :func:`execute`); returns
    the other outputs, in order.

    ``torch.ops.cudnn_fe.execute_(graph, others, written)`` underneath: ``written`` are the
    inputs the graph writes (by input index), declared mutated in the schema, so their
    version counters bump, torch.compile functionalizes the call (the functional execute,
    then a copy back into them), and autograd refuses the call while an input requires
    grad (``execute`` is the differentiable form: it returns every output as a new tensor)."""
    try:
        routed = _has_torch_function(inputs)
    except TypeError as error:
        raise argument_error(graph, inputs=inputs) or error from None
    if routed or torch.compiler.is_compiling():
        written_at = trace_constants.written_inputs(graph)
        if not written_at:
            raise ValueError(
                f"cudnn_fe.execute_: graph {graph_label(graph)} writes none of its inputs in place; register it with "
                "register_graph(builder, in_place={output_index: input_index}), or call execute"
            )
        if written_at[-1] >= len(inputs):
            raise ValueError(f"cudnn_fe.execute_: graph {graph_label(graph)} writes its input {written_at[-1]}, but got {len(inputs)} inputs")
        written = [inputs[i] for i in written_at]
        others = [t for i, t in enumerate(inputs) if i not in written_at]
        return torch.ops.cudnn_fe.execute_.default(graph, others, written)
    try:
        return _C.execute_in_place(graph, inputs)
    except TypeError as error:
        raise argument_error(graph, inputs=inputs) or error from None
