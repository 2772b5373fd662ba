"""The walk: load a description's inputs, run its nodes in order, store its outputs.

``interpret`` is the one entry (``interpret_ordered`` the same in the op's order of
inputs and outputs). Each node family's module registers handlers by node type name
(``HANDLERS``); a handler takes ``(node, ctx)`` and returns its outputs' values by port.
``Context`` is what a handler sees: the values computed so far and the dtypes to compute
in.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence

import torch

from . import conv, matmul, norm_backward, norms, pointwise, reduction, rope, sdpa, structural
from .description import (
    all_tensors, dims, graph_inputs, graph_nodes, graph_outputs, is_integer_data_type, node_kind, produced_uids, refuse, torch_dtype,
)
from .values import pass_by_value, read, rounded, write

HANDLERS: Dict[str, Callable] = {
    **pointwise.HANDLERS, **matmul.HANDLERS, **reduction.HANDLERS, **conv.HANDLERS, **norms.HANDLERS,
    **norm_backward.HANDLERS, **rope.HANDLERS, **sdpa.HANDLERS, **structural.HANDLERS,
}

_COMPUTE_DTYPES = (torch.float32, torch.float64)


class Context:
    """The interpreter's state while it walks one description."""

    def __init__(self, compute_dtype: torch.dtype, device: torch.device):
        self.compute_dtype = compute_dtype
        self.device = device
        self.values: Dict[int, torch.Tensor] = {}

    def compute(self, node) -> torch.dtype:
        """The dtype ``node`` computes in: the interpreter's, or for an integer compute type
        int64 where the node is exact on integers (pointwise.integer_exact), else float64
        (exact below 2**53: an int8 convolution's INT32)."""
        if not is_integer_data_type(node.compute_data_type):
            return self.compute_dtype
        return torch.int64 if node_kind(node) == "POINTWISE" and pointwise.integer_exact(node) else torch.float64

    def value(self, tensor, node) -> torch.Tensor:
        """The value of ``tensor`` in ``node``'s compute dtype."""
        try:
            value = self.values[tensor.uid]
        except KeyError:
            raise ValueError(f"interpreter: node {node.name!r} reads {tensor.name!r} (uid {tensor.uid}), which has no value yet") from None
        return value.to(self.compute(node))

    def host_ints(self, tensor) -> List[int]:
        """An integer tensor's elements on the host (sequence lengths, ragged offsets)."""
        return [int(v) for v in self.values[tensor.uid].reshape(-1).tolist()]

    def scalar(self, tensor) -> float:
        return float(self.values[tensor.uid].reshape(-1)[0])

    def offsets_of(self, tensor) -> Optional[List[int]]:
        return None if tensor.ragged_offset is None else self.host_ints(tensor.ragged_offset)


def _device_of(tensors: Mapping[int, torch.Tensor], described: Mapping[int, object]) -> torch.device:
    for uid, data in tensors.items():
        desc = described.get(uid)
        if desc is not None and not desc.is_pass_by_value:
            return data.device
    return torch.device("cpu")


def _load_inputs(graph, tensors: Mapping[int, torch.Tensor], ctx: Context) -> None:
    described = all_tensors(graph)
    for uid in tensors:
        if uid not in described:
            raise ValueError(f"interpreter: uid {uid} names no tensor of the description")
    # Ragged offsets first: a ragged tensor is read through them.
    for desc in sorted(graph_inputs(graph), key=lambda t: t.ragged_offset is not None):
        data = tensors.get(desc.uid)
        if desc.is_pass_by_value:
            ctx.values[desc.uid] = pass_by_value(desc, data, _held_as(desc, ctx), ctx.device)
            continue
        if data is None:
            raise ValueError(f"interpreter: no tensor given for input {desc.name!r} (uid {desc.uid})")
        ctx.values[desc.uid] = read(desc, data, _held_as(desc, ctx), ctx.offsets_of(desc))


def _held_as(desc, ctx: Context) -> torch.dtype:
    """The dtype an input's value is held in: integers int64 (exact), booleans float64 (0/1),
    floating types the interpreter's compute dtype."""
    dtype = torch_dtype(desc)
    if dtype.is_floating_point:
        return ctx.compute_dtype
    return torch.float64 if dtype == torch.bool else torch.int64


def _store(node, port: str, out, value: torch.Tensor, ctx: Context, round_virtual: bool) -> None:
    shape = dims(out)
    if list(value.shape) != shape:
        try:
            value = value.broadcast_to(shape)
        except RuntimeError:
            raise ValueError(
                f"interpreter: node {node.name!r} computed {list(value.shape)} for its {port!r} output, described as {shape}"
            ) from None
    if not out.is_virtual or (round_virtual and out.data_type is not None):
        value = rounded(value, torch_dtype(out))  # what a consumer reads back from memory
    ctx.values[out.uid] = value


@torch.no_grad()  # a reference, not a differentiable op: outputs never carry the inputs' autograd history
def interpret(
    graph, tensors: Mapping[int, torch.Tensor], *, compute_dtype: torch.dtype = torch.float32, round_virtual: bool = False
) -> Dict[int, torch.Tensor]:
    """Run a (validated) frontend graph description in plain torch ops.

    ``tensors``: the description's non-virtual input tensors by uid, on any one device (a
    pass-by-value operand as a one-element CPU tensor; a ``tensor_scalar`` needs none).
    Returns every non-virtual output by uid: a new tensor with the dims, strides and
    dtype the description declares. ``compute_dtype``: float32 or float64.
    ``round_virtual``: also round virtual tensors to their declared data types (off:
    see the package docstring). Raises ``NotImplementedError`` for what it cannot
    compute exactly."""
    if compute_dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"interpreter: compute_dtype must be one of {_COMPUTE_DTYPES}, got {compute_dtype}")
    ctx = Context(compute_dtype, _device_of(tensors, all_tensors(graph)))
    _load_inputs(graph, tensors, ctx)
    for node in graph_nodes(graph):
        handler = HANDLERS.get(node_kind(node))
        if handler is None:
            raise refuse(node, "node type", node_kind(node), "no interpreter handler for this node type")
        results = handler(node, ctx)
        for port, out in node.outputs.items():
            if out is None:
                continue
            if port not in results:
                raise refuse(node, port, why="the interpreter does not compute this output")
            _store(node, port, out, results[port], ctx, round_virtual)
    return {desc.uid: write(desc, ctx.values[desc.uid], ctx.device, ctx.offsets_of(desc)) for desc in graph_outputs(graph)}


def interpret_ordered(
    graph, input_tensors: Sequence, output_tensors: Sequence, inputs: Sequence[torch.Tensor], **options
) -> List[torch.Tensor]:
    """``interpret`` in the op's order: ``inputs[i]`` is the value of the description's
    ``input_tensors[i]``; returns the values of ``output_tensors``, in their order."""
    if len(input_tensors) != len(inputs):
        raise ValueError(f"interpreter: {len(input_tensors)} described inputs but {len(inputs)} tensors")
    produced, described = produced_uids(graph), all_tensors(graph)
    # An in-place output (bound to an input's buffer) is no input; a tensor no node reads is left out.
    by_uid = {t.uid: x for t, x in zip(input_tensors, inputs) if t.uid in described and t.uid not in produced}
    results = interpret(graph, by_uid, **options)
    return [results[t.uid] for t in output_tensors]
