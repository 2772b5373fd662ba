"""Definitions, and describing a graph from one.

A ``_Definition`` is what a graph id names: a builder plus its parameters (or one graph
already built). ``_describe`` runs the builder on a fresh ``cudnn.pygraph`` description
for given input specs. The fake kernel (torch.compile, meta/fake tensors, no GPU) asks
only for the description's output layout, never a build, so its shapes, strides and
dtypes are by construction those of the real build (build.py checks that they are).
Describing needs no GPU and no lock; it runs the user's builder.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

import cudnn
import torch
from cudnn.datatypes import torch_to_cudnn_data_type

from .. import _C
from .specs import _TORCH_DTYPES, _TORCH_OF_CUDNN, GraphLayout, TensorSpec

if TYPE_CHECKING:
    from .build import BuiltGraph


@dataclasses.dataclass
class _Definition:
    """What a graph id names. Lives as long as the process; only ``built`` ever changes
    (the atexit hook drops it)."""

    graph_id: int
    name: str
    builder: Optional[Callable[..., Any]]
    params: Dict[str, Any]
    num_inputs: Optional[int]  # None: the builder takes *inputs
    backward_id: Optional[int] = None  # the paired backward graph, if any
    backward_operands: Optional[Callable[..., Sequence[torch.Tensor]]] = None  # None: declared (autograd_record.py)
    backward_fn: Optional[Callable[..., Sequence[Optional[torch.Tensor]]]] = None  # or a torch-level backward
    built: Optional[BuiltGraph] = None  # a registered built graph: the only one this id runs
    tune: Optional[bool] = None  # time the candidate plans (plan_tuning/); None: the process-wide setting
    dynamic_shapes: Optional[bool] = None  # build with dynamic shapes and a kernel cache (kernel_caches.py); None: the process-wide setting


def _default_backward_operands(grad_outputs, inputs, outputs):
    return [*grad_outputs, *inputs, *outputs]


# ---------------------------------------------------------------------------------
# Describing


def _io_dtype(definition: "_Definition", specs: Sequence[TensorSpec]) -> torch.dtype:
    """The graph's io type: its first floating-point input's dtype. Refuses what a cuDNN
    graph cannot take, so a trace fails where the GPU build would."""
    for i, spec in enumerate(specs):
        if spec.dtype not in _TORCH_DTYPES:
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {definition.name!r} is {spec.dtype}, which a cuDNN graph cannot "
                f"take; use one of {', '.join(str(d).replace('torch.', '') for d in _TORCH_DTYPES)}"
            )
    floating = next((s.dtype for s in specs if s.dtype.is_floating_point), None)
    if floating is None:
        raise ValueError(
            f"cudnn_fe.execute: graph {definition.name!r} got no floating-point input "
            f"({', '.join(str(s.dtype).replace('torch.', '') for s in specs)}); its compute type follows the first "
            "floating-point input, so pass fp16, bf16 or fp32 tensors"
        )
    return floating


def _validate_description(graph) -> None:
    """Run the frontend's validate(): shape/stride inference over the description,
    then the backend's own check. The backend check needs the CUDA driver; on a machine
    without one, inference has already run when it fails, and that is all a layout
    needs (a real build, which needs the GPU anyway, validates fully)."""
    try:
        graph.validate()
    except (ValueError, TypeError):
        raise
    except Exception:
        if torch.cuda.is_available():
            raise


def describing_handle(device: Optional[int]):
    """The pooled handle a description is lowered with (``validate()`` lowers it), so
    that the frontend makes no handle of its own for it; None without a GPU, where
    nothing can be lowered. ``device``: the inputs' CUDA ordinal, or None (meta, fake
    tensors of no ordinal: the current device's)."""
    if not (_C.with_cuda and torch.cuda.is_available()):
        return None
    from ..pool import current_handle

    return current_handle(torch.cuda.current_device() if device is None else device)


def _describe(definition: _Definition, specs: Sequence[TensorSpec], handle=None, **graph_options):
    """Run the definition's builder on a fresh graph description for ``specs``;
    ``graph_options``: more ``cudnn.pygraph`` arguments (routes.py: a kernel cache)."""
    graph = cudnn.pygraph(
        name=definition.name,
        io_data_type=torch_to_cudnn_data_type(_io_dtype(definition, specs)),
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
        **graph_options,
    )
    inputs = [
        graph.tensor(name=f"input{i}", dim=list(s.shape), stride=list(s.stride), data_type=torch_to_cudnn_data_type(s.dtype))
        for i, s in enumerate(specs)
    ]
    result = definition.builder(graph, *inputs, **definition.params)
    returned = [result] if isinstance(result, cudnn.Tensor) else list(result)
    outputs, positions = [], []
    for position, tensor in enumerate(returned):
        if tensor is not None:
            tensor.set_output(True)
            outputs.append(tensor)
            positions.append(position)
    if not outputs:
        raise ValueError(f"graph {definition.name!r}: the builder returned no output tensor")
    _validate_description(graph)
    out_specs = []
    for i, tensor in enumerate(outputs):
        if not tensor.dim or not tensor.stride:
            raise ValueError(
                f"graph {definition.name!r}: could not infer the shape of output {i}; give it one in the builder "
                "(tensor.set_dim(...).set_stride(...))"
            )
        dtype = _TORCH_OF_CUDNN.get(tensor.data_type)
        if dtype is None:
            raise ValueError(f"graph {definition.name!r}: output {i} has data type {tensor.data_type}, which torch cannot hold; set_data_type() it")
        out_specs.append(TensorSpec(tuple(tensor.dim), tuple(tensor.stride), dtype))
    layout = GraphLayout(tuple(out_specs), tuple(positions))
    return graph, inputs, outputs, layout


# ---------------------------------------------------------------------------------
# Checking a call against a definition


def _positional_arity(builder) -> Optional[int]:
    """How many inputs a builder ``f(graph, *inputs, **params)`` takes, or None for *args."""
    try:
        parameters = list(inspect.signature(builder).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    return sum(1 for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


def _check_arity(definition: _Definition, count: int) -> None:
    if definition.num_inputs is not None and count != definition.num_inputs:
        raise ValueError(f"cudnn_fe.execute: graph {definition.name!r} takes {definition.num_inputs} input tensors, got {count}")


def _check_built_graph_inputs(definition: _Definition, device: int, inputs: Sequence[torch.Tensor]) -> BuiltGraph:
    """A registered built graph runs only on its device and only for the inputs it was built for."""
    built = definition.built
    if device != built.device:
        raise ValueError(
            f"cudnn_fe.execute: graph {definition.name!r} was built for cuda:{built.device} but the inputs are on "
            f"cuda:{device}; a built graph never runs on another device. Move the inputs, or register a builder "
            "(register_graph) so the graph is built per device."
        )
    _check_built_graph_specs(definition, [TensorSpec.of(t) for t in inputs])
    return built


def _check_built_graph_specs(definition: _Definition, specs: Sequence[TensorSpec]) -> None:
    _check_arity(definition, len(specs))
    for i, (got, expected) in enumerate(zip(specs, definition.built.inputs)):
        if got != expected:
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {definition.name!r} is {got.describe()}, but the graph was built "
                f"for {expected.describe()}. Pass a tensor of that layout (e.g. .contiguous() / .to(dtype)), or register "
                "a builder (register_graph) so a graph is built for each layout."
            )
