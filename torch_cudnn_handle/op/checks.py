"""What the op refuses, and the one rule for which device a call runs on.

``call_device``: the one device of a call's inputs that are not host scalars (a host
scalar is a one-element CPU tensor, passed to the graph by value; ragged offsets never
are one). The same rule for real tensors (the CUDA kernel's Python path, the CPU kernel)
and for fake and meta tensors (the fake kernel), so a trace refuses what a real call
would: no input, inputs on several devices, a CPU tensor that is not a scalar beside
device tensors, a 0-dim device tensor. All on the CPU, a call runs on the reference
interpreter (reference.py); on any other backend it is refused (``refuse_off_gpu``). The C++ kernels leave every such error to it (csrc/op/cuda_kernels.cpp
binds the first CUDA input's device before the Python path runs, and this rule then
checks the rest). Also here: ``execute.out``'s and ``execute_``'s layout and overlap checks,
and the names of arguments pybind11 could not convert.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import registry
from .._extension import _C
from ..registry import check_layouts, hint_specs, is_host_scalar
from .overlap import overlaps

__all__ = ["call_device", "refuse_off_gpu", "cuda_ordinal", "graph_label", "check_out", "check_out_overlap", "check_in_place", "argument_error"]


def graph_label(graph_id: int) -> str:
    """The graph's name, quoted, for messages (its id when unknown)."""
    definition = registry.find_definition(graph_id)
    return f"id {graph_id}" if definition is None else repr(definition.name)


def _ragged_offsets_of(graph_id: int, index: int) -> Optional[int]:
    """The packed input whose ragged offsets input ``index`` holds, or None."""
    definition = registry.find_definition(graph_id)
    ragged = None if definition is None else definition.ragged
    return None if ragged is None else ragged.describes_offsets(index)


def _host_scalar_rule(tensor: torch.Tensor) -> str:
    """For a CPU tensor the op refuses: why it is not a host scalar."""
    if tensor.device.type != "cpu":
        return ""
    return (
        f" with {tensor.numel()} elements, and a CPU input must be a host scalar (a 0-dim or one-element CPU tensor, "
        "passed to the graph by value)"
    )


def _refuse_misplaced_offsets(graph_id: int, index: int, tensor: torch.Tensor, device: str) -> None:
    """Ragged offsets off the device of the graph's other inputs: cuDNN reads them on the
    GPU, in the kernel, so they must be there (never a host scalar, even of one element)."""
    packed = _ragged_offsets_of(graph_id, index)
    if packed is None:
        return
    raise ValueError(
        f"cudnn_fe.execute: input {index} of graph {graph_label(graph_id)} holds the ragged offsets of packed input "
        f"{packed} and is on {tensor.device}, but the graph runs on {device}; cuDNN reads ragged offsets on that GPU. "
        f"Move them there: offsets.to({device!r}) (build them there once per batch, not per call)."
    )


def _device_inputs(graph_id: int, inputs: Sequence[torch.Tensor]) -> list:
    """(index, tensor) of the inputs that are not host scalars (ragged offsets never are)."""
    return [(i, t) for i, t in enumerate(inputs) if not is_host_scalar(t) or _ragged_offsets_of(graph_id, i) is not None]


def _what_a_call_takes(graph_id: int) -> str:
    """For a call with no inputs: what one takes, on either kind of machine."""
    definition = registry.find_definition(graph_id)
    count = None if definition is None else definition.num_inputs
    how_many = "its inputs as tensors" if count is None else f"{count} tensor{'' if count == 1 else 's'}"
    return f"it takes {how_many}: CUDA tensors, which cuDNN runs, or CPU tensors, which the reference interpreter runs"


def key_specs(inputs: Sequence[torch.Tensor]) -> tuple:
    """The graph cache's hot key of a call's inputs: (shape, stride, dtype, is_cpu) each (is_cpu: a host scalar)."""
    return tuple((t.shape, t.stride(), t.dtype, t.is_cpu) for t in inputs)


def call_device(graph_id: int, inputs: Sequence[torch.Tensor]) -> torch.device:
    """The device a call runs on (see the module docstring); a clear error otherwise."""
    if not inputs:
        raise ValueError(f"cudnn_fe.execute: graph {graph_label(graph_id)} got no input tensors; {_what_a_call_takes(graph_id)}")
    on_device = _device_inputs(graph_id, inputs)
    for i, tensor in on_device:
        if tensor.dim() == 0:
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {graph_label(graph_id)} is a 0-dim tensor on {tensor.device}; a cuDNN "
                "graph's tensors have at least one dimension. Pass it as a [1]-shaped tensor (t.reshape(1))."
            )
    if not on_device:
        raise ValueError(
            f"cudnn_fe.execute: graph {graph_label(graph_id)} got no input tensors on a GPU, only host scalars; pass at "
            "least one CUDA tensor (or a CPU tensor of more than one element: the call then runs on the CPU, through the "
            "reference interpreter)"
        )
    devices = {t.device for _, t in on_device}
    if len(devices) == 1:
        return on_device[0][1].device
    others = {t.device for i, t in on_device if _ragged_offsets_of(graph_id, i) is None}
    for i, tensor in on_device:
        if len(others) == 1 and tensor.device not in others:
            _refuse_misplaced_offsets(graph_id, i, tensor, str(next(iter(others))))
    listed = ", ".join(sorted(str(d) for d in devices))
    cpu = next(((i, t) for i, t in on_device if t.device.type == "cpu"), None)
    if cpu is not None:
        elsewhere = sorted(str(d) for d in devices if d.type != "cpu")
        raise ValueError(
            f"cudnn_fe.execute: input {cpu[0]} of graph {graph_label(graph_id)} is on cpu{_host_scalar_rule(cpu[1])}, and its "
            f"other inputs are on {', '.join(elsewhere)}: inputs on more than one device ({listed}). Put them all on the "
            f"device the graph should run on (.to({elsewhere[0]!r}))."
        )
    raise ValueError(
        f"cudnn_fe.execute: inputs of graph {graph_label(graph_id)} are on more than one device ({listed}); put them all on "
        "the device the graph should run on."
    )


def refuse_off_gpu(graph_id: int, inputs: Sequence[torch.Tensor]) -> None:
    """A call whose one device is neither a GPU nor the CPU (another backend), named."""
    i, tensor = _device_inputs(graph_id, inputs)[0]
    _refuse_misplaced_offsets(graph_id, i, tensor, "cuda")
    raise ValueError(
        f"cudnn_fe.execute: input {i} of graph {graph_label(graph_id)} is on {tensor.device}, and the op has no kernel for "
        f"{tensor.device.type} tensors: cuDNN graphs run on CUDA tensors, and on CPU tensors through the reference "
        "interpreter (torch ops), all on one device. Move it with .to('cuda:N') (or .cpu())."
    )


def cuda_ordinal(device: torch.device) -> Optional[int]:
    return device.index if device.type == "cuda" else None


def check_out(graph_id: int, layout, out: Sequence[torch.Tensor], device: torch.device, inputs: Sequence[torch.Tensor]) -> None:
    """``out`` must be the graph's outputs exactly: their count, and each one's shape,
    strides and dtype on the inputs' device. The CUDA and the fake kernel both check."""
    expected = layout.outputs_for([spec.shape for spec in hint_specs(inputs)])
    if len(out) != len(expected):
        raise ValueError(
            f"cudnn_fe.execute.out: graph {graph_label(graph_id)} has {len(expected)} outputs, got {len(out)} out tensors; "
            "pass one tensor per output"
        )
    for i, (tensor, spec) in enumerate(zip(out, expected)):
        given = hint_specs([tensor])[0]  # no specialization under dynamic shapes; the real call checks again
        if tensor.device != device or given != spec:
            raise ValueError(
                f"cudnn_fe.execute.out: out[{i}] of graph {graph_label(graph_id)} is {given.describe()} on "
                f"{tensor.device}, but the graph writes {spec.describe()} on {device}; allocate it with "
                "torch.empty_strided(shape, stride, dtype=..., device=...)."
            )


def check_out_overlap(graph_id: int, inputs: Sequence[torch.Tensor], out: Sequence[torch.Tensor]) -> None:
    """execute.out's schema says it only reads its inputs and writes each ``out`` once."""
    writes = _C.in_place_writes(graph_id)
    for k, target in enumerate(out):
        for j, source in enumerate(inputs):
            if not overlaps(target, source):
                continue
            if (k, j) in writes:
                fix = (
                    f"the graph writes output {k} into input {j} in place (in_place): call torch_cudnn_handle.execute_(graph, "
                    "inputs) (torch.ops.cudnn_fe.execute_), whose schema declares that write"
                )
            else:
                fix = (
                    f"pass an out tensor of its own; for a graph that writes output {k} into input {j}, register it with "
                    f"in_place={{{k}: {j}}} and call torch_cudnn_handle.execute_(graph, inputs)"
                )
            raise ValueError(
                f"cudnn_fe.execute.out: out[{k}] of graph {graph_label(graph_id)} overlaps inputs[{j}], but execute.out's "
                f"schema says its inputs are only read (torch.compile and autograd rely on it); {fix}."
            )
        for i in range(k):
            if overlaps(out[i], target):
                raise ValueError(f"cudnn_fe.execute.out: out[{i}] and out[{k}] of graph {graph_label(graph_id)} overlap; pass separate tensors")


def check_in_place(graph_id: int, layout, inputs: Sequence[torch.Tensor], specs) -> list:
    """What execute_ refuses, the CUDA and the fake kernel alike: a written input that is
    not laid out as the output written into it (registry/in_place.py), or that overlaps
    another input. Returns the graph's (output, input) writes."""
    writes = _C.in_place_writes(graph_id)
    check_layouts(registry.definition(graph_id).name, layout.outputs_for([spec.shape for spec in specs]), specs, writes)
    for output, j in writes:
        for i, other in enumerate(inputs):
            if i != j and overlaps(inputs[j], other):
                raise ValueError(
                    f"cudnn_fe.execute_: input {j} of graph {graph_label(graph_id)}, which it writes in place (output "
                    f"{output}), overlaps input {i}, which execute_'s schema says is only read; pass separate tensors "
                    "(e.g. input.clone())"
                )
    return writes


_INT64 = range(-(2**63), 2**63)


def argument_error(graph, **tensor_lists) -> Optional[TypeError]:
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
                    f"cudnn_fe.execute: {argument}[{i}] of graph {graph_label(graph)} is {type(tensor).__name__}, not a "
                    f"tensor; pass a list of tensors (a Python number as a host scalar: torch.tensor(value))"
                )
    return None
