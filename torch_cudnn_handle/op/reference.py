"""The op on the reference interpreter: the CPU kernels of ``cudnn_fe.execute``,
``execute.out`` and ``execute_``, the route CUDA calls take only where asked, and
``execute_reference``, the hook that runs any call on it.

A call whose inputs are all on the CPU runs here (a one-element CPU tensor stays a host
scalar, passed by value, exactly as on CUDA, so the CPU call describes the graph a GPU
builds). The graph's description for the call's specs (``registry.description``: one per
definition and specs, kept, never built) runs on the interpreter
(``torch_cudnn_handle.interpreter``) in torch ops, and the outputs come back in exactly
the layout a CUDA call returns (``layout.outputs``, which the fake kernel reports too):
the op allocates them and copies the interpreter's values in through the graph's view of
each (a natural operand's; a ragged output's memory as cuDNN writes it). Inputs are read
as the CUDA path binds them: a natural operand through its view, a packed input through
its offsets, a pointwise broadcast materialized (Note [Pointwise broadcasts]). Autograd
needs nothing here: the C++ autograd node is registered for every backend, and the
backward graphs and steps it runs go through the op, so onto this kernel again.

CUDA tensors reach it only where asked, never silently: a graph registered with
``reference=True``, or every graph under the ``reference_path`` setting
(``TORCH_CUDNN_HANDLE_REFERENCE=1``). Their graph-cache entry is the ``reference`` route
(registry/build.py: never built, so never native), and the Python path (python_path.py)
sends their calls here, on their device, in torch ops.

``execute_reference(graph_id, inputs)`` runs a call here whatever the settings, on the
inputs' device: the interpreter's answer, with no cuDNN, no autograd node and no
dispatcher (a stand-in where cuDNN has no plan for a shape; verify mode's reference).

Costs: torch ops per node, in float32 (or float64); a graph with ragged offsets or
sequence lengths reads them on the host, which on CUDA waits for the device.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch._prims_common import compute_required_storage_length

from .. import registry
from .._extension import _C
from ..interpreter import interpret_ordered
from ..registry import TensorSpec, materialize
from .checks import call_device, check_in_place, check_out, check_out_overlap, cuda_ordinal, refuse_off_gpu

__all__ = ["execute_reference", "description_for", "cpu_execute", "cpu_execute_out", "cpu_execute_in_place", "execute", "execute_out", "execute_in_place"]


def description_for(graph_id: int, inputs: Sequence[torch.Tensor], device: torch.device):
    """The (kept) description of this call (registry.description)."""
    return registry.description(graph_id, tuple(TensorSpec.of(t) for t in inputs), cuda_ordinal(device))


def _values(described, inputs: Sequence[torch.Tensor], compute_dtype: torch.dtype) -> List[torch.Tensor]:
    """The interpreter's value of each output of the call ``described``, in the op's order."""
    operands = materialize(inputs, described.layout.materialized)
    return interpret_ordered(described.graph, described.inputs, described.outputs, operands, compute_dtype=compute_dtype)


def _store(value: torch.Tensor, out: torch.Tensor, packed: bool) -> None:
    """Write an output's value into the op's tensor ``out``. A packed (ragged) output's
    value is the 4-D ``[B, H, S, D]`` view cuDNN writes through the offsets: its memory is
    ``out``'s, element for element (registry/ragged.py), so it is copied as memory. Any
    other is the graph's view of ``out`` (a natural output's shape differs), by value."""
    if packed:
        storage = value.untyped_storage().nbytes() // value.element_size() - value.storage_offset()
        count = min(compute_required_storage_length(out.shape, out.stride(), 0), storage)  # first to last addressed element
        flat = torch.as_strided(out, (count,), (1,), out.storage_offset())
        flat.copy_(torch.as_strided(value, (count,), (1,), value.storage_offset()))
    elif tuple(out.shape) == tuple(value.shape):
        out.copy_(value)
    else:
        out.view(value.shape).copy_(value)


def _is_packed(layout, index: int) -> bool:
    return bool(layout.tokens_like) and layout.tokens_like[index] >= 0


def _allocated(graph_id, inputs, device, compute_dtype) -> List[torch.Tensor]:
    described = description_for(graph_id, inputs, device)
    values = _values(described, inputs, compute_dtype)
    layout = described.layout
    results = []
    for i, (spec, value) in enumerate(zip(layout.outputs_for([t.shape for t in inputs]), values)):
        packed = _is_packed(layout, i)
        if not packed and (tuple(value.shape), tuple(value.stride()), value.dtype) == (spec.shape, spec.stride, spec.dtype):
            results.append(value)  # the interpreter wrote the op's layout already
            continue
        out = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=device)
        _store(value, out, packed)
        results.append(out)
    return results


def execute_reference(graph_id: int, inputs: Sequence[torch.Tensor], *, compute_dtype: torch.dtype = torch.float32) -> List[torch.Tensor]:
    """The outputs of ``torch.ops.cudnn_fe.execute(graph_id, inputs)`` as the reference
    interpreter computes them, on the inputs' device (CPU or CUDA, in torch ops), in the
    layout the op returns: no cuDNN build, no autograd node, whatever the settings.
    ``compute_dtype``: float32, or float64 for a tighter reference. The device rule is
    the op's (``checks.call_device``); a node the interpreter does not know raises
    ``NotImplementedError`` naming it."""
    device = call_device(graph_id, list(inputs))
    with torch.no_grad():
        return _allocated(graph_id, list(inputs), device, compute_dtype)


# -- the kernels ---------------------------------------------------------------------


def execute(graph_id: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """execute on the interpreter, on the inputs' device."""
    return _allocated(graph_id, inputs, call_device(graph_id, inputs), torch.float32)


def execute_out(graph_id: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    """execute.out on the interpreter: ``out`` is checked as on CUDA (count, layouts,
    device, no overlap), then written."""
    device = call_device(graph_id, inputs)
    described = description_for(graph_id, inputs, device)
    check_out(graph_id, described.layout, out, device, inputs)
    check_out_overlap(graph_id, inputs, out)
    for i, (value, target) in enumerate(zip(_values(described, inputs, torch.float32), out)):
        _store(value, target, _is_packed(described.layout, i))


def execute_in_place(graph_id: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """execute_ on the interpreter, ``inputs`` in the builder's order: every output is
    computed from the inputs as they were, then each one written in place is copied into
    its input; returns the others."""
    device = call_device(graph_id, inputs)
    described = description_for(graph_id, inputs, device)
    written = dict(check_in_place(graph_id, described.layout, inputs, [TensorSpec.of(t) for t in inputs]))
    outputs = _allocated(graph_id, inputs, device, torch.float32)
    for output, input_ in written.items():
        inputs[input_].copy_(outputs[output])
    return [t for o, t in enumerate(outputs) if o not in written]


def _on_cpu(graph_id: int, inputs: Sequence[torch.Tensor]) -> None:
    """The CPU kernel's device rule: the call's one device (checks.call_device) is the CPU."""
    if call_device(graph_id, inputs).type != "cpu":
        refuse_off_gpu(graph_id, inputs)


def cpu_execute(graph_id: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    _on_cpu(graph_id, inputs)
    registry.count_call("interpreter")  # the route of every CPU call (registry/routes.py)
    return execute(graph_id, inputs)


def cpu_execute_out(graph_id: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    _on_cpu(graph_id, inputs)
    registry.count_call("interpreter")
    execute_out(graph_id, inputs, out=out)


def cpu_execute_in_place(graph_id: int, inputs: List[torch.Tensor], written: List[torch.Tensor]) -> List[torch.Tensor]:
    merged = _C.merge_in_place(graph_id, inputs, written)
    _on_cpu(graph_id, merged)
    registry.count_call("interpreter")
    return execute_in_place(graph_id, merged)
