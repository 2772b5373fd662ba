"""The Python side of ``torch.ops.cudnn_fe.execute`` and ``execute.out`` (csrc/op).

* CUDA: the C++ kernel (csrc/op/cuda_kernels.cpp) runs a call a native plan serves with
  no Python at all, and sends every other call here (``_execute_cuda``) on the inputs'
  device, this thread's pooled handle and the right context: the registry builds the
  graph on first use (and hands a backend plan to the native path, which then runs this
  first call too); otherwise the frontend's ordered execute runs it, with outputs and
  workspace from torch's caching allocator on the current stream. Nothing here
  synchronizes or allocates outside torch, so a warm call is capturable.
* Refusals: CPU tensors, another backend, no tensor at all (CompositeExplicitAutograd).
* Fake kernel: output layouts from the graph's description (never built), so
  torch.compile traces the op without a GPU; it refuses what a real call would.
* Autograd: the C++ kernels (csrc/op/autograd_kernels.cpp) record the node; its backward
  runs a declared backward natively in C++ when it can, and calls ``_backward`` here
  otherwise, on whichever thread autograd uses.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from . import _C
from . import registry as _registry_module
from .pool import current_handle
from .registry import TensorSpec

_registry = _registry_module._registry

__all__ = ["execute", "execute_out"]


def _inputs_device(graph_id: int, inputs: Sequence[torch.Tensor]) -> int:
    """The one CUDA device all inputs are on; a clear error otherwise."""
    device = None
    for i, tensor in enumerate(inputs):
        where = tensor.device
        if where.type != "cuda":
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {_graph_label(graph_id)} is on {where}; cuDNN graphs run on CUDA "
                "tensors, all on one device. Move it with .to('cuda:N')."
            )
        if tensor.dim() == 0:
            raise _zero_dim_error(graph_id, i, tensor)
        if device is None:
            device = where.index
        elif where.index != device:
            raise ValueError(
                f"cudnn_fe.execute: inputs of graph {_graph_label(graph_id)} are on more than one device (input 0 on "
                f"cuda:{device}, input {i} on {where}); put them all on the device the graph should run on."
            )
    if device is None:
        raise ValueError(f"cudnn_fe.execute: graph {_graph_label(graph_id)} got no input tensors; pass at least one CUDA tensor")
    return device


def _zero_dim_error(graph_id: int, index: int, tensor: torch.Tensor) -> ValueError:
    """A cuDNN graph tensor has at least one dimension (the frontend's own error is
    "Tensor 'input0' dims not set"). Only device tensors reach here: a CPU input is refused
    as such before."""
    return ValueError(
        f"cudnn_fe.execute: input {index} of graph {_graph_label(graph_id)} is a 0-dim tensor on {tensor.device}; a cuDNN "
        "graph's tensors have at least one dimension. Pass it as a [1]-shaped tensor (t.reshape(1))."
    )


def _graph_label(graph_id: int) -> str:
    try:
        return repr(_registry.definition(graph_id).name)
    except ValueError:
        return f"id {graph_id}"


def _built_for_call(graph_id: int, inputs: Sequence[torch.Tensor]):
    device = _inputs_device(graph_id, inputs)
    key_specs = tuple((t.shape, t.stride(), t.dtype) for t in inputs)
    return _registry.built_graph(graph_id, device, inputs, key_specs)


def _launch(built, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    handle = current_handle(built.device)
    if torch.cuda.is_current_stream_capturing():
        _C.keep_alive_while_captured(built)  # its plan (a frost plan's kernels too) outlives any eviction
    workspace = torch.empty(built.workspace_size, dtype=torch.uint8, device=inputs[0].device) if built.workspace_size else None
    built.graph.execute([*_aligned(inputs), *outputs], workspace, handle=handle, tensor_uids=built.uids)


# Plans are built for 16-byte aligned operands (the frontend sets no lower alignment,
# and cuDNN's kernels assume it: a 2-byte aligned view failed with
# CUDNN_STATUS_EXECUTION_FAILED_CUBLAS). A view that is not aligned is staged through an
# aligned copy of the same layout, on the current stream; the native kernel sends such
# calls here.
_ALIGNMENT = 16


def _is_aligned(tensor: torch.Tensor) -> bool:
    return tensor.data_ptr() % _ALIGNMENT == 0


def _aligned_copy(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def _aligned(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [t if _is_aligned(t) else _aligned_copy(t) for t in tensors]


def _empty_outputs(layout, device) -> List[torch.Tensor]:
    return [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device) for s in layout.outputs]


def _execute_cuda(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    built = _built_for_call(graph, inputs)
    if built.native:  # built by this call: its first run on the plan every later call runs on
        outputs = _C.run_native(graph, inputs)
        if outputs is not None:
            return outputs
    outputs = _empty_outputs(built.layout, inputs[0].device)
    _launch(built, inputs, outputs)
    return outputs


def _execute_out_cuda(graph: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    built = _built_for_call(graph, inputs)
    _check_out(graph, built.layout, out, inputs[0].device)
    if built.native and _C.run_native_out(graph, inputs, out):
        return
    staged = _aligned(out)
    _launch(built, inputs, staged)
    for target, written in zip(out, staged):
        if written is not target:
            target.copy_(written)


def _check_out(graph: int, layout, out: Sequence[torch.Tensor], device: torch.device) -> None:
    """``out`` must be the graph's outputs exactly: their count, and each one's shape,
    strides and dtype on the inputs' device. The CUDA and the fake kernel both check."""
    expected = layout.outputs
    if len(out) != len(expected):
        raise ValueError(
            f"cudnn_fe.execute.out: graph {_graph_label(graph)} has {len(expected)} outputs, got {len(out)} out tensors; "
            "pass one tensor per output"
        )
    for i, (tensor, spec) in enumerate(zip(out, expected)):
        if tensor.device != device or TensorSpec.of(tensor) != spec:
            raise ValueError(
                f"cudnn_fe.execute.out: out[{i}] of graph {_graph_label(graph)} is {TensorSpec.of(tensor).describe()} on "
                f"{tensor.device}, but the graph writes {spec.describe()} on {device}; allocate it with "
                "torch.empty_strided(shape, stride, dtype=..., device=...)."
            )


def _refuse_non_cuda(graph: int, inputs: List[torch.Tensor], **_kwargs):
    """Every dispatch that reaches no CUDA kernel: CPU tensors, another backend, or no
    tensor at all (the dispatcher's Undefined slot, which CompositeExplicitAutograd fills)."""
    _inputs_device(graph, inputs)  # names the first non-CUDA input, or the empty list
    raise ValueError(f"cudnn_fe.execute: graph {_graph_label(graph)} needs CUDA inputs")


def _layout_for_fake(graph: int, inputs: Sequence[torch.Tensor]):
    _one_device(graph, inputs)
    for i, tensor in enumerate(inputs):
        if tensor.dim() == 0:
            raise _zero_dim_error(graph, i, tensor)
    return _registry.layout(graph, tuple(TensorSpec.of(t) for t in inputs))


def _one_device(graph: int, tensors: Sequence[torch.Tensor]) -> None:
    """Fake and meta tensors keep their device: a trace refuses what a real call would
    (no input, inputs on several devices) instead of describing outputs for it."""
    if not tensors:
        raise ValueError(f"cudnn_fe.execute: graph {_graph_label(graph)} got no input tensors; pass at least one CUDA tensor")
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise ValueError(
            f"cudnn_fe.execute: inputs of graph {_graph_label(graph)} are on more than one device ({', '.join(devices)}); "
            "put them all on the device the graph should run on."
        )


def _execute_fake(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    return _empty_outputs(_layout_for_fake(graph, inputs), inputs[0].device)


def _execute_out_fake(graph: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    layout = _layout_for_fake(graph, inputs)  # an unknown id, a bad arity or dtype fails at trace time too
    _one_device(graph, [*inputs, *out])
    _check_out(graph, layout, out, inputs[0].device)
    return None


def _backward(graph: int, grad_outputs, inputs, outputs):
    """Gradients of one ``execute(graph, inputs)`` call: one per input, None for none.
    ``grad_outputs`` holds None where autograd gave no gradient."""
    forward = _registry.differentiable(graph)
    if forward.declared_operands is not None:  # what the C++ node assembles, assembled by the same code
        operands = _C.assemble_backward_operands(graph, grad_outputs, inputs, outputs)
        return _run_backward_graph(forward, operands, len(inputs))
    # A graph is built for exact strides; autograd hands over whatever it has (an
    # expanded scalar has stride 0), so give the backward dense gradients.
    zeros = torch.zeros_like if forward.materialize_grads else (lambda _: None)
    grads = [zeros(o) if g is None else g.contiguous() for g, o in zip(grad_outputs, outputs)]
    if forward.backward_fn is not None:
        grad_inputs = list(forward.backward_fn(grads, inputs, outputs))
    else:
        grad_inputs = _run_backward_graph(forward, list(forward.backward_operands(grads, inputs, outputs)), len(inputs))
    if len(grad_inputs) != len(inputs):
        raise ValueError(f"the backward of graph {forward.name!r} returned {len(grad_inputs)} gradients for {len(inputs)} inputs")
    return grad_inputs


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


_POSITIONS: dict = {}  # (graph id, operand layouts) -> output positions; the backward's hot path


def _output_positions(graph_id: int, operands: Sequence[torch.Tensor]) -> tuple:
    """Which builder output each of a graph's outputs is, for these operands' layouts."""
    key = (graph_id, tuple((t.shape, t.stride(), t.dtype) for t in operands))
    positions = _POSITIONS.get(key)
    if positions is None:
        positions = _registry.layout(graph_id, tuple(TensorSpec.of(t) for t in operands)).output_positions
        if len(_POSITIONS) >= 4096:
            _POSITIONS.clear()
        _POSITIONS[key] = positions
    return positions


_C._set_python_kernels(_execute_cuda, _execute_out_cuda, _backward)
_lib = torch.library.Library("cudnn_fe", "IMPL")
for _key in ("CPU", "CompositeExplicitAutograd"):
    _lib.impl("execute", _refuse_non_cuda, _key)
    _lib.impl("execute.out", _refuse_non_cuda, _key)
torch.library.register_fake("cudnn_fe::execute", _execute_fake, lib=_lib)
torch.library.register_fake("cudnn_fe::execute.out", _execute_out_fake, lib=_lib)

def execute(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """``torch.ops.cudnn_fe.execute(graph, inputs)``, with a cheaper eager entry.

    Eagerly it enters the dispatcher from C++ (autograd, then the CUDA kernel) without
    torch.ops' generic argument parsing; under torch.compile it is the op itself, so
    tracing sees ``cudnn_fe.execute`` either way."""
    if torch.compiler.is_compiling():
        return torch.ops.cudnn_fe.execute.default(graph, inputs)
    try:
        return _C.execute(graph, inputs)
    except TypeError as error:  # pybind11 refused an argument: say which, off the hot path
        raise _argument_error(graph, inputs=inputs) or error from None


def execute_out(graph: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    """``torch.ops.cudnn_fe.execute.out(graph, inputs, out=out)``; see :func:`execute`."""
    if torch.compiler.is_compiling():
        return torch.ops.cudnn_fe.execute.out(graph, inputs, out=out)
    try:
        _C.execute_out(graph, inputs, out=out)
    except TypeError as error:
        raise _argument_error(graph, inputs=inputs, out=out) or error from None


_INT64 = range(-(2**63), 2**63)


def _argument_error(graph, **tensor_lists) -> "TypeError | None":
    """What is wrong with the arguments pybind11 could not convert ("incompatible function
    arguments"), named: the graph id, or the element of ``inputs``/``out`` that is not a tensor."""
    if not isinstance(graph, int) or graph not in _INT64:
        return TypeError(
            f"cudnn_fe.execute: graph must be an int id from register_graph() (a signed 64-bit int), got {graph!r} "
            f"({type(graph).__name__})"
        )
    for argument, tensors in tensor_lists.items():
        if not isinstance(tensors, (list, tuple)):
            return TypeError(f"cudnn_fe.execute: {argument} must be a list of tensors, got {type(tensors).__name__}")
        for i, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor):
                return TypeError(
                    f"cudnn_fe.execute: {argument}[{i}] of graph {_graph_label(graph)} is {type(tensor).__name__}, not a "
                    f"tensor; pass a list of CUDA tensors only (a Python number as a tensor: torch.full([1], value, "
                    "device=...))"
                )
    return None
