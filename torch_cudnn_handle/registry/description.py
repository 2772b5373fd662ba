"""Definitions, and describing a graph from one.

A ``_Definition`` is what a graph id names: a builder plus its parameters (or one graph
already built). ``_describe`` runs the builder on a fresh ``cudnn.pygraph`` description
for given input specs. The fake kernel (torch.compile, meta/fake tensors, no GPU) asks
only for the description's output layout, never a build. An output whose layout the
builder declared is a contract (build.py checks the build writes it); an undeclared
one is described with the strides cuDNN picks for it (output_strides.py), and the
build's own layout is what the op allocates. Host scalars (one-element CPU tensors)
are pass-by-value operands. Describing needs no GPU and no lock; it runs the user's
builder.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

import cudnn
import torch

from .. import _C
from .data_types import GraphDataTypes
from .operand_views import OperandViews, described_specs, natural_outputs
from .output_strides import undeclared_output_strides
from .specs import GraphLayout, TensorSpec, cudnn_data_type_of, torch_dtype_of

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
    output_shapes: Optional[Callable[..., Sequence[Sequence]]] = None  # fn(*input_shapes) under dynamic shapes (symbolic.py)
    data_types: GraphDataTypes = GraphDataTypes()  # io/intermediate/compute the author chose (data_types.py)
    dynamic_shapes: Optional[bool] = None  # build with dynamic shapes and a kernel cache (kernel_caches.py); None: the process-wide setting
    views: Optional[OperandViews] = None  # natural operands: what the builder sees of each (operand_views.py)


def _default_backward_operands(grad_outputs, inputs, outputs):
    return [*grad_outputs, *inputs, *outputs]


# ---------------------------------------------------------------------------------
# Describing


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


def _returned_tensors(definition: _Definition, result) -> list:
    """A builder's result as a list: one ``cudnn.Tensor``, or a list or tuple of them
    (None where an output is skipped). Anything else is the builder's mistake, named."""
    fix = "return the cudnn.Tensor a graph node gave (e.g. graph.relu(x)), or a list of them"
    if isinstance(result, cudnn.Tensor):
        return [result]
    if not isinstance(result, (list, tuple)):
        raise TypeError(f"graph {definition.name!r}: the builder returned {type(result).__name__} ({result!r:.40}); {fix}")
    for i, tensor in enumerate(result):
        if tensor is not None and not isinstance(tensor, cudnn.Tensor):
            raise TypeError(f"graph {definition.name!r}: element {i} of what the builder returned is {type(tensor).__name__}; {fix}")
    return list(result)


def _describe(definition: _Definition, specs: Sequence[TensorSpec], handle=None, **graph_options):
    """Run the definition's builder on a fresh graph description for ``specs``;
    ``graph_options``: more ``cudnn.pygraph`` arguments (routes.py: a kernel cache)."""
    io, intermediate, compute = definition.data_types.for_call(definition.name, specs)
    graph = cudnn.pygraph(
        name=definition.name, io_data_type=io, intermediate_data_type=intermediate, compute_data_type=compute, handle=handle,
        **graph_options,
    )
    described = described_specs(definition.name, definition.views, specs)
    inputs = [_input_tensor(graph, i, spec, described) for i, spec in enumerate(described)]
    returned = _returned_tensors(definition, definition.builder(graph, *inputs, **definition.params))
    outputs, positions = [], []
    for position, tensor in enumerate(returned):
        if tensor is not None:
            tensor.set_output(True)
            if isinstance(tensor.data_type, torch.dtype):
                # The frontend takes a torch dtype here but its lowering does not (on the
                # H200, set_data_type(torch.float16) wrote neither the op's nor the
                # frontend's outputs right): hand it the cudnn.data_type.
                tensor.set_data_type(cudnn_data_type_of(tensor.data_type))
            outputs.append(tensor)
            positions.append(position)
    if not outputs:
        raise ValueError(f"graph {definition.name!r}: the builder returned no output tensor")
    _validate_description(graph)
    inferred = undeclared_output_strides(graph)
    out_specs = []
    for i, tensor in enumerate(outputs):
        if not tensor.dim or not tensor.stride:
            raise ValueError(
                f"graph {definition.name!r}: could not infer the shape of output {i}; give it one in the builder "
                "(tensor.set_dim(...).set_stride(...))"
            )
        out_specs.append(TensorSpec(tuple(tensor.dim), tuple(inferred.get(id(tensor), tensor.stride)), _output_dtype(definition, i, tensor)))
    declared = tuple(bool(t.stride_assigned) for t in outputs)
    layout = GraphLayout(natural_outputs(definition.name, definition.views, specs, out_specs), tuple(positions), declared)
    return graph, inputs, outputs, layout


def _input_tensor(graph, index: int, spec: TensorSpec, specs: Sequence[TensorSpec]):
    """The graph tensor of op input ``index``. A host scalar is a pass-by-value operand
    (cuDNN reads its value on the host when the plan executes); a 0-dim one is
    described with as many unit dims as the first device input has (a norm's epsilon
    is [1, 1, 1, 1] next to a 4-d input), since a cuDNN tensor has at least one dim."""
    shape, stride = list(spec.shape), list(spec.stride)
    if spec.host and not shape:
        rank = next((len(s.shape) for s in specs if not s.host and s.shape), 1)
        shape, stride = [1] * rank, [1] * rank
    return graph.tensor(
        name=f"input{index}", dim=shape, stride=stride, data_type=cudnn_data_type_of(spec.dtype), is_pass_by_value=spec.host
    )


def _output_dtype(definition: _Definition, index: int, tensor) -> torch.dtype:
    dtype = torch_dtype_of(tensor.data_type)
    if dtype is None:
        raise ValueError(
            f"graph {definition.name!r}: output {index} has data type {tensor.data_type}, for which torch has no dtype "
            "(a packed or unset type); set_data_type() it to one torch has (torch dtypes are accepted)"
        )
    return dtype


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
