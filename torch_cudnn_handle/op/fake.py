"""The fake kernels of ``cudnn_fe.execute``, ``execute.out`` and ``execute_``: output layouts
from the graph's description (never a build), so torch.compile traces the op without a
GPU; they refuse what a real call would (checks.py). Under ``torch.compile(dynamic=True)``
outputs get symbolic sizes where the inputs have them (registry/symbolic.py); a packed
(ragged) output has the token count of the input it is like. CPU scalars trace beside
fake CUDA tensors.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .. import registry
from .._extension import _C
from .bucket_check import check_padding
from .checks import call_device, check_in_place, check_out, check_out_overlap, cuda_ordinal

__all__ = ["execute", "execute_out", "execute_in_place"]


def _layout(graph_id: int, inputs: Sequence[torch.Tensor], device: torch.device):
    """The layout at the inputs' sizes (their hints under dynamic shapes: no specialization)."""
    return registry.layout(graph_id, registry.hint_specs(inputs), cuda_ordinal(device))


def _output_layouts(graph_id: int, inputs: Sequence[torch.Tensor], device: torch.device):
    """(sizes, strides, dtype) per output: symbolic where the inputs' sizes are, from the graph's descriptions."""
    definition = registry.definition(graph_id)
    if definition.buckets is not None:  # a trace of a bucketed graph: checked as its first padded call is (bucket_check.py)
        check_padding(definition, registry.hint_specs(inputs))
    describe = lambda specs: registry.layout(graph_id, specs, cuda_ordinal(device))  # noqa: E731
    at_hints = describe(registry.hint_specs(inputs))  # refuses what a call at these sizes would
    if definition.ragged is not None:
        definition.ragged.tie_tokens(inputs)  # packed inputs sharing offsets: one symbol, before any probe
    if definition.output_shapes is not None and registry.is_symbolic(inputs):
        shapes = definition.output_shapes(*[t.shape for t in inputs])
        return registry.shaped_outputs(definition.name, shapes, inputs, at_hints)
    layouts = registry.output_layouts(definition.name, describe, inputs)
    if definition.ragged is None:
        return layouts
    # A packed output has the token count of the input it is like: that input's size,
    # symbolic under dynamic shapes (the description, keyed without it, has TOKENS).
    tokens_like = at_hints.tokens_like
    return [
        (sizes if like < 0 else [inputs[like].shape[0], *sizes[1:]], strides, dtype)
        for (sizes, strides, dtype), like in zip(layouts, tokens_like or [-1] * len(layouts))
    ]


def execute(graph_id: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    device = call_device(graph_id, inputs)
    return [torch.empty_strided(sizes, strides, dtype=dtype, device=device) for sizes, strides, dtype in _output_layouts(graph_id, inputs, device)]


def execute_out(graph_id: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    device = call_device(graph_id, inputs)
    check_out(graph_id, _layout(graph_id, inputs, device), out, device, inputs)  # an unknown id, a bad arity or dtype fails here too
    check_out_overlap(graph_id, inputs, out)


def execute_in_place(graph_id: int, inputs: List[torch.Tensor], written: List[torch.Tensor]) -> List[torch.Tensor]:
    """What a real execute_ refuses, refused at trace time; the outputs not written in place."""
    all_inputs = _C.merge_in_place(graph_id, inputs, written)
    device = call_device(graph_id, all_inputs)
    writes = check_in_place(graph_id, _layout(graph_id, all_inputs, device), all_inputs, registry.hint_specs(all_inputs))
    written_outputs = {output for output, _ in writes}
    return [
        torch.empty_strided(sizes, strides, dtype=dtype, device=device)
        for o, (sizes, strides, dtype) in enumerate(_output_layouts(graph_id, all_inputs, device))
        if o not in written_outputs
    ]
