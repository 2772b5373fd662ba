"""Describing a graph: a definition's builder run on a fresh ``cudnn.pygraph`` for given
input specs (``describe``), and what the description says of the outputs (``Description``).

The fake kernel (torch.compile, meta/fake tensors, no GPU) asks only for the
description's output layout, never a build. An output whose layout the
builder declared is a contract (build.py checks the build writes it); an undeclared
one is described with the strides cuDNN picks for it (output_strides.py), and the
build's own layout is what the op allocates. Host scalars (one-element CPU tensors)
are pass-by-value operands. Describing needs no GPU and no lock; it runs the user's
builder.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import cudnn
import torch

from .._extension import _C
from ..pool import current_handle
from .broadcasts import broadcast_inputs, materialized_specs
from .definition import Definition
from .operand_views import described_specs, natural_outputs
from .output_strides import undeclared_output_strides
from .ragged import RaggedOperands
from .specs import GraphLayout, TensorSpec, cudnn_data_type_of, torch_dtype_of



class Description(NamedTuple):
    """A described (not built) graph: the pygraph, its input and output tensors in the op's
    order, and the outputs' layout as the op returns them."""

    graph: Any
    inputs: List[Any]
    outputs: List[Any]
    layout: GraphLayout


def validate_description(graph) -> None:
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
    return current_handle(torch.cuda.current_device() if device is None else device)


def returned_tensors(definition: Definition, result) -> list:
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


def describe(definition: Definition, specs: Sequence[TensorSpec], handle=None, *, as_written: bool = False, **graph_options) -> Description:
    """Run the definition's builder on a fresh graph description for ``specs``;
    ``graph_options``: more ``cudnn.pygraph`` arguments (plans/: a kernel cache). In a
    pointwise-only graph an input that broadcasts is described at its full shape, and the
    layout names it (Note [Pointwise broadcasts] in broadcasts.py); ``as_written``: not
    (the interpreter's own tests, which broadcast in the interpreter)."""
    described = _describe_as_given(definition, specs, handle, **graph_options)
    if as_written or definition.views is not None or definition.ragged is not None:
        return described
    plan = broadcast_inputs(described.graph, described.inputs, specs, definition.name)
    if not plan:
        return described
    full_specs = materialized_specs(specs, plan)
    described = _describe_as_given(definition, full_specs, handle, **graph_options)
    if broadcast_inputs(described.graph, described.inputs, full_specs, definition.name):  # raises if one is left to cuDNN
        raise ValueError(f"graph {definition.name!r}: a broadcast remains after its inputs were described at full shape "
                         f"{[list(t.shape) for t in full_specs]} (Note [Pointwise broadcasts]); expand the operands before the call")
    return described._replace(layout=dataclasses.replace(described.layout, materialized=plan))


def _describe_as_given(definition: Definition, specs: Sequence[TensorSpec], handle=None, **graph_options) -> Description:
    io, intermediate, compute = definition.data_types.for_call(definition.name, specs)
    graph = cudnn.pygraph(
        name=definition.name, io_data_type=io, intermediate_data_type=intermediate, compute_data_type=compute, handle=handle,
        **graph_options,
    )
    ragged = definition.ragged
    described = described_specs(definition.name, definition.views, specs)
    refuse_low_rank(definition.name, described)  # what cuDNN sees (a natural operand's view)
    inputs = [_input_tensor(graph, i, spec, described, ragged) for i, spec in enumerate(described)]
    if ragged is not None:
        ragged.set_offsets(inputs)
    returned = returned_tensors(definition, _run_builder(definition, graph, inputs))
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
    if ragged is not None:
        ragged.check_builder_kept(inputs)
    validate_description(graph)
    refuse_mixed_matmul(definition.name, graph)
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
    tokens_like = ()
    if ragged is not None:  # a ragged output is returned packed, [T, H, D] (ragged.py)
        packed = [ragged.packed_output(i, tensor, spec, inputs) for i, (tensor, spec) in enumerate(zip(outputs, out_specs))]
        out_specs, tokens_like = [spec for spec, _ in packed], tuple(like for _, like in packed)
    layout = GraphLayout(natural_outputs(definition.name, definition.views, specs, tuple(out_specs)), tuple(positions), declared, tokens_like)
    return Description(graph, inputs, outputs, layout)


@functools.lru_cache(maxsize=4096)
def described_layout(definition: Definition, specs: Tuple[TensorSpec, ...], device: Optional[int]) -> GraphLayout:
    """The output layout a call of ``definition`` with ``specs`` returns, from its
    description (the fake kernel's, and the op's backward positions); cached per
    definition and specs, least recently used dropped first. Thread-safe: two first
    callers may both describe (a description is pure), never a wrong layout."""
    return describe(definition, specs, describing_handle(device)).layout


@functools.lru_cache(maxsize=1024)
def described(definition: Definition, specs: Tuple[TensorSpec, ...], device: Optional[int]) -> Description:
    """The description of a call of ``definition`` with ``specs``, kept: what the reference
    interpreter runs (op/reference.py), so it describes a layout once, not per call; the
    least recently used dropped first. Its pygraph is only read, never built, so threads
    share it."""
    return describe(definition, specs, describing_handle(device))


def _run_builder(definition: Definition, graph, inputs):
    """The builder's result. A Python number where a node takes a tensor fails deep in the
    frontend ("'float' object has no attribute 'shape'"): said here, with the fix."""
    try:
        return definition.builder(graph, *inputs, **definition.params)
    except AttributeError as error:
        number = next((kind for kind in ("float", "int", "bool") if str(error).startswith(f"'{kind}' object has no attribute")), None)
        if number is None:
            raise
        raise TypeError(
            f"graph {definition.name!r}: the builder passed a Python {number} where a graph node takes a tensor (the frontend "
            f"said: {error}). Make the constant a graph tensor, graph.tensor_scalar(value, cudnn.scalar_type.RUNTIME_PARAM), or pass it "
            "as a host-scalar input of the op (torch.tensor(value): one build serves every value)."
        ) from error


# Note [Tensors of fewer than 3 dims]: cuDNN 9.19 (with frontend 1.32) computes a graph
# on 1-D and 2-D tensors wrongly and says nothing: on the H200 a relu on a [32, 64] tensor
# (float32, float16, bfloat16, float32 -> float16, fp8) wrote wrong values on every plan
# the heuristics offered, while the same graph on [4, 32, 64] was exact. The frontend
# runs such graphs as given, so the op refuses a graph whose tensors all have fewer than
# 3 dims instead of returning wrong results; a view with a leading unit dim
# (x.unsqueeze(0)) costs nothing and is right. Low-rank side operands of a graph on
# higher-rank tensors (sdpa's [B] sequence lengths and ragged offsets) are measured right.
MIN_RANK = 3


def refuse_low_rank(graph_name: str, specs: Sequence[TensorSpec]) -> None:
    """Raise when every device tensor of ``specs`` has 1 or 2 dims (Note [Tensors of fewer than 3 dims])."""
    on_device = [(i, s) for i, s in enumerate(specs) if not s.host and s.shape]
    if on_device and max(len(s.shape) for _, s in on_device) < MIN_RANK:
        i, spec = on_device[0]
        raise ValueError(
            f"graph {graph_name!r}: its tensors have fewer than {MIN_RANK} dims (input {i} is {spec.describe()}); cuDNN "
            f"computes such graphs wrongly (measured on cuDNN 9.19: every plan of a 2-D relu wrote wrong values), so the op "
            f"refuses them. Give it {MIN_RANK}-D tensors, e.g. x.unsqueeze(0) (a view), and build the graph for them."
        )


_WIDE_FLOATS = {str(t) for t in (cudnn.data_type.HALF, cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT)}  # inspect()'s spelling


def refuse_mixed_matmul(graph_name: str, graph) -> None:
    """A matmul of two different 16/32-bit floating types (an fp16 A by an fp32 B): what cuDNN
    computes for it is not measured, and its output silently takes the graph's io type, so
    the op refuses it at description time (a trace too) with the fix. Only the op's own
    operands count (a virtual intermediate is computed in the graph's intermediate type);
    fp8 mixes (e4m3 by e5m2) and casts the builder writes (graph.identity) are not refused."""
    described = graph.inspect()
    types = {name: str(tensor.get("dtype")) for name, tensor in described.get("tensors", {}).items() if not tensor.get("is_virtual")}
    for node in described.get("nodes", ()):
        if node.get("type") != "MATMUL":
            continue
        a, b = (types.get(node.get("inputs", {}).get(port)) for port in ("A", "B"))
        if a in _WIDE_FLOATS and b in _WIDE_FLOATS and a != b:
            raise TypeError(
                f"graph {graph_name!r}: matmul {node.get('name')!r} multiplies A of {a.split('.')[-1]} by B of {b.split('.')[-1]}; "
                "the op refuses a "
                "matmul of two floating types (what cuDNN computes for it is not verified, and its output would take the "
                "graph's io type without a word). Pass both in one dtype (b.to(a.dtype)), or cast one in the builder: "
                "graph.identity(input=B) with .set_data_type(A.data_type)."
            )


def _input_tensor(graph, index: int, spec: TensorSpec, specs: Sequence[TensorSpec], ragged: Optional[RaggedOperands] = None):
    """The graph tensor of op input ``index``. A host scalar is a pass-by-value operand
    (cuDNN reads its value on the host when the plan executes); a 0-dim one is
    described with as many unit dims as the first device input has (a norm's epsilon
    is [1, 1, 1, 1] next to a 4-d input), since a cuDNN tensor has at least one dim.
    A packed input is cuDNN's 4-D ragged tensor (ragged.py)."""
    shape, stride = list(spec.shape), list(spec.stride)
    packed = ragged.graph_dims(index, specs) if ragged is not None else None
    if packed is not None:
        shape, stride = packed
    elif spec.host and not shape:
        rank = next((len(s.shape) for s in specs if not s.host and s.shape), 1)
        shape, stride = [1] * rank, [1] * rank
    return graph.tensor(
        name=f"input{index}", dim=shape, stride=stride, data_type=cudnn_data_type_of(spec.dtype), is_pass_by_value=spec.host
    )


def _output_dtype(definition: Definition, index: int, tensor) -> torch.dtype:
    dtype = torch_dtype_of(tensor.data_type)
    if dtype is None:
        raise ValueError(
            f"graph {definition.name!r}: output {index} has data type {tensor.data_type}, for which torch has no dtype "
            "(a packed or unset type); set_data_type() it to one torch has (torch dtypes are accepted)"
        )
    return dtype
