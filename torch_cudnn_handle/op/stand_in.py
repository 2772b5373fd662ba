"""A call its route's stand-in serves while the graph's plan builds: the graph's own torch stand-in, else the interpreter.

Note [A new layout's first calls] (registry/first_calls.py) says which calls those are. A
graph registered with ``stand_in=fn`` is served by ``fn(*inputs)``, torch ops that return
its outputs as the op does (``FusedLinear``: ``F.linear`` and the activation, in the
parameters' dtype); any other by the reference interpreter (reference.py), which computes
in float32 whatever the dtypes. A graph's first stand-in call checks the stand-in's outputs
against the graph's description (count, shapes, dtypes, laid out as a CUDA call lays them
out); later calls, at other sizes, trust it to keep that contract (describing a new size,
0.6 ms, was most of a stand-in call's cost on the H200), and only make sure no output
aliases an input (the op returns new tensors). It runs inside the op's kernel, below autograd: the call's
backward is the graph's, on its own route. Its results agree with the plan's within the
engines' numerics, not bitwise.
"""

from __future__ import annotations

from typing import List

import torch

from .. import registry
from . import reference
from .checks import call_device
from .overlap import overlaps

__all__ = ["execute", "execute_out"]


_checked: set = set()  # graphs whose stand-in's first call was checked against the description, for the process


def execute(graph_id: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """The call's outputs from its stand-in."""
    definition = registry.definition(graph_id)
    if definition.stand_in is None:
        return reference.execute(graph_id, inputs)
    result = definition.stand_in(*inputs)
    values = list(result) if isinstance(result, (list, tuple)) else [result]
    if graph_id in _checked:
        return [value.clone() if any(overlaps(value, t) for t in inputs) else value for value in values]
    outputs = _checked_outputs(definition, graph_id, inputs, values)
    _checked.add(graph_id)
    return outputs


def _checked_outputs(definition, graph_id: int, inputs: List[torch.Tensor], values: list) -> List[torch.Tensor]:
    device = call_device(graph_id, inputs)
    specs = reference.description_for(graph_id, inputs, device).layout.outputs_for([t.shape for t in inputs])
    if len(values) != len(specs):
        raise ValueError(f"graph {definition.name!r}: its stand_in returned {len(values)} outputs, but the graph has {len(specs)}; "
                         "return one tensor per output of the builder, in its order")
    outputs = []
    for i, (value, spec) in enumerate(zip(values, specs)):
        if not isinstance(value, torch.Tensor) or (tuple(value.shape), value.dtype) != (spec.shape, spec.dtype):
            got = f"{type(value).__name__}" if not isinstance(value, torch.Tensor) else f"{list(value.shape)} {value.dtype}"
            raise ValueError(f"graph {definition.name!r}: its stand_in returned {got} for output {i}, where the graph writes "
                             f"{spec.describe()}; return what the builder's output is")
        if tuple(value.stride()) != spec.stride or value.device != device or any(overlaps(value, t) for t in inputs):
            value = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=device).copy_(value)
        outputs.append(value)
    return outputs


def execute_out(graph_id: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    """execute.out on the stand-in: the outputs, written into ``out`` (checked as the interpreter's are)."""
    if registry.definition(graph_id).stand_in is None:
        return reference.execute_out(graph_id, inputs, out=out)
    for target, value in zip(out, execute(graph_id, inputs)):
        target.copy_(value)
    return None
