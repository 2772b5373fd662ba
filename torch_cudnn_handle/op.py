"""The Python side of ``torch.ops.cudnn_fe.execute``, ``execute.out`` and ``execute_`` (csrc/op).

* CUDA: the C++ kernel (csrc/op/cuda_kernels.cpp) runs a call a native plan serves with
  no Python at all, and sends every other call here (``_execute_cuda``) on the inputs'
  device, this thread's pooled handle and the right context: the registry builds the
  graph on first use and hands a backend plan to the native path (at the build, or at
  the graph's second call with ``hand_over="second_call"``; registry/cache.py), which
  then runs that call too; otherwise (graphs the native path cannot serve, and a first
  call under ``second_call``) the frontend's ordered execute runs it, with
  outputs and workspace from torch's caching allocator on the current stream. Nothing here
  synchronizes or allocates outside torch, so a warm call is capturable.
* Host scalars: a one-element CPU tensor input is a pass-by-value operand of the graph
  (registry/specs.py ``is_host_scalar``); the call's device is its CUDA tensors'. cuDNN
  reads the value on the host when the plan executes, so the tensor may be freed or
  changed right after the call; a CUDA-graph capture reads it once, at capture, and
  every replay uses that value (as torch does with a CPU scalar it passes to a kernel).
* Refusals: any other CPU tensor, another backend, no tensor at all
  (CompositeExplicitAutograd), ragged offsets off the inputs' GPU (registry/ragged.py).
* Ragged (packed [T, H, D]) operands: a packed output is allocated with the token count
  of the input it is like (``GraphLayout.outputs_for``), here, in the fake kernel and in
  C++ (``OperandLayout::tokens_of``).
* Fake kernel: output layouts from the graph's description (never built), so
  torch.compile traces the op without a GPU; it refuses what a real call would. CPU
  scalars trace beside fake CUDA tensors.
* In place (``execute_``, a graph registered with ``in_place={output: input}``): those
  outputs are bound to their inputs' buffers (registry/in_place.py checks the layouts),
  the others allocated; its other kernels (autograd's refusal, version counters,
  functionalization) are C++ (csrc/op/in_place_kernels.cpp). ``execute.out`` refuses an
  ``out`` that overlaps an input (_overlap.py): its schema says inputs are only read.
* Autograd: the C++ kernels (csrc/op/autograd_kernels.cpp) record the node; its backward
  runs a declared backward natively in C++ when it can, and calls ``_backward`` here
  otherwise, on whichever thread autograd uses.
"""

from __future__ import annotations

import time
from typing import List, Sequence

import torch
from torch._subclasses.fake_tensor import is_fake

from . import _C, bool_operands
from . import registry as _registry_module
from .pool import current_handle
from ._overlap import overlaps
from .registry import symbolic
from .registry.in_place import check_layouts
from .registry.specs import TensorSpec, is_host_scalar

_registry = _registry_module._registry

__all__ = ["execute", "execute_out", "execute_"]


def _inputs_device(graph_id: int, inputs: Sequence[torch.Tensor]) -> int:
    """The one CUDA device all inputs but host scalars are on; a clear error otherwise."""
    device = None
    for i, tensor in enumerate(inputs):
        where = tensor.device
        if is_host_scalar(tensor) and not _is_ragged_offsets(graph_id, i):
            continue
        if where.type != "cuda":
            _refuse_misplaced_offsets(graph_id, i, tensor, "cuda" if device is None else f"cuda:{device}")
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {_graph_label(graph_id)} is on {where}{_host_scalar_rule(tensor)}; cuDNN "
                "graphs run on CUDA tensors, all on one device. Move it with .to('cuda:N')."
            )
        if tensor.dim() == 0:
            raise _zero_dim_error(graph_id, i, tensor)
        if device is None:
            device = where.index
        elif where.index != device:
            _refuse_misplaced_offsets(graph_id, i, tensor, f"cuda:{device}")
            raise ValueError(
                f"cudnn_fe.execute: inputs of graph {_graph_label(graph_id)} are on more than one device (cuda:{device} and "
                f"input {i} on {where}); put them all on the device the graph should run on."
            )
    if device is None:
        raise ValueError(
            f"cudnn_fe.execute: graph {_graph_label(graph_id)} got no input tensors"
            f"{' on a GPU, only host scalars' if inputs else ''}; pass at least one CUDA tensor"
        )
    return device


def _is_ragged_offsets(graph_id: int, index: int) -> bool:
    ragged = _registry.ragged_of(graph_id)
    return ragged is not None and ragged.describes_offsets(index) is not None


def _refuse_misplaced_offsets(graph_id: int, index: int, tensor: torch.Tensor, device: str) -> None:
    """Ragged offsets on another device than the graph's other inputs: cuDNN reads them
    on the GPU, in the kernel, so they must be there (never a host scalar, even of one
    element)."""
    if not _is_ragged_offsets(graph_id, index):
        return
    packed = _registry.ragged_of(graph_id).describes_offsets(index)
    raise ValueError(
        f"cudnn_fe.execute: input {index} of graph {_graph_label(graph_id)} holds the ragged offsets of packed input "
        f"{packed} and is on {tensor.device}, but the graph runs on {device}; cuDNN reads ragged offsets on that GPU. "
        f"Move them there: offsets.to({device!r}) (build them there once per batch, not per call)."
    )


def _host_scalar_rule(tensor: torch.Tensor) -> str:
    """For a CPU tensor the op refuses: why it is not a host scalar."""
    if tensor.device.type != "cpu":
        return ""
    return (
        f" with {tensor.numel()} elements, and a CPU input must be a host scalar (a 0-dim or one-element CPU tensor, "
        "passed to the graph by value)"
    )


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


def _built_for_call(graph_id: int, inputs: Sequence[torch.Tensor], call: bool = True):
    """The graph built for these inputs; ``call``: the op runs it now (a pending native
    hand-over happens first: registry/cache.py), else only its layout is wanted."""
    device = _inputs_device(graph_id, inputs)
    key_specs = tuple((t.shape, t.stride(), t.dtype, t.is_cpu) for t in inputs)  # is_cpu: a host scalar (checked above)
    return _registry.built_graph(graph_id, device, inputs, key_specs, torch.are_deterministic_algorithms_enabled(), call=call)


def _launch(built, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    handle = current_handle(built.device)
    if torch.cuda.is_current_stream_capturing():
        _C.keep_alive_while_captured(built)  # its plan (a frost plan's kernels too) outlives any eviction
    # Host scalars go in as they are: the frontend binds a CPU tensor's data_ptr, the
    # host address cuDNN reads the value from (at capture, in a CUDA-graph capture).
    workspace = torch.empty(built.workspace_size, dtype=torch.uint8, device=_device(built)) if built.workspace_size else None
    inputs, launched_outputs = _aligned(inputs), outputs
    packing = bool_operands.has_bool(built.inputs, built.layout.outputs)  # Note [Bit-packed booleans]
    if packing:
        inputs, launched_outputs = bool_operands.pack_call(inputs, outputs)
    buffers = [*inputs, *launched_outputs]
    if built.graph_views is not None:  # the graph's own views of natural operands (registry/operand_views.py)
        buffers = [t if t.is_cpu else t.as_strided(*view) for t, view in zip(buffers, built.graph_views)]
    built.graph.execute(buffers, workspace, handle=handle, tensor_uids=built.uids)
    if packing:
        bool_operands.unpack_outputs(outputs, launched_outputs)


# Plans are built for 16-byte aligned operands (the frontend sets no lower alignment,
# and cuDNN's kernels assume it: a 2-byte aligned view failed with
# CUDNN_STATUS_EXECUTION_FAILED_CUBLAS). A view that is not aligned is staged through an
# aligned copy of the same layout, on the current stream; the native kernel sends such
# calls here.
_ALIGNMENT = 16


def _is_aligned(tensor: torch.Tensor) -> bool:
    return tensor.is_cpu or tensor.data_ptr() % _ALIGNMENT == 0  # a host scalar is read by value on the host


def _aligned_copy(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def _aligned(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [t if _is_aligned(t) else _aligned_copy(t) for t in tensors]


def _empty_outputs(layout, device, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    specs = layout.outputs_for([t.shape for t in inputs])  # a packed output: the T of the input it is like
    return [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device) for s in specs]


def _device(built) -> torch.device:
    """The CUDA device a built graph runs on (inputs[0] may be a host scalar)."""
    return torch.device("cuda", built.device)


def _first_launch_timed(built, launch):
    """``launch()``; a built graph's first launch is timed on the host into its
    ``phase_seconds["first_execution"]`` (registry/build_timing.py)."""
    if built.phase_seconds is None or "first_execution" in built.phase_seconds:
        return launch()
    started = time.perf_counter()
    result = launch()
    _registry.record_first_execution(built, time.perf_counter() - started)
    return result


def _execute_cuda(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    built = _built_for_call(graph, inputs)
    return _first_launch_timed(built, lambda: _run_built(graph, built, inputs))


def _run_built(graph: int, built, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    if built.native:  # handed over by this call (or built by it, hand_over="build"): the plan every later call runs on
        outputs = _C.run_native(graph, inputs)
        if outputs is not None:
            return outputs
    outputs = _empty_outputs(built.layout, _device(built), inputs)
    _launch(built, inputs, outputs)
    return outputs


def _execute_out_cuda(graph: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    built = _built_for_call(graph, inputs)
    _check_out(graph, built.layout, out, _device(built), inputs)
    _check_out_overlap(graph, inputs, out)
    _first_launch_timed(built, lambda: _run_built_out(graph, built, inputs, out))


def _run_built_out(graph: int, built, inputs: List[torch.Tensor], out: List[torch.Tensor]) -> None:
    if built.native and _C.run_native_out(graph, inputs, out):
        return
    staged = _aligned(out)
    _launch(built, inputs, staged)
    for target, written in zip(out, staged):
        if written is not target:
            target.copy_(written)


def _check_out(graph: int, layout, out: Sequence[torch.Tensor], device: torch.device, inputs: Sequence[torch.Tensor]) -> None:
    """``out`` must be the graph's outputs exactly: their count, and each one's shape,
    strides and dtype on the inputs' device. The CUDA and the fake kernel both check."""
    expected = layout.outputs_for([spec.shape for spec in symbolic.hint_specs(inputs)])
    if len(out) != len(expected):
        raise ValueError(
            f"cudnn_fe.execute.out: graph {_graph_label(graph)} has {len(expected)} outputs, got {len(out)} out tensors; "
            "pass one tensor per output"
        )
    for i, (tensor, spec) in enumerate(zip(out, expected)):
        given = symbolic.hint_specs([tensor])[0]  # no specialization under dynamic shapes; the real call checks again
        if tensor.device != device or given != spec:
            raise ValueError(
                f"cudnn_fe.execute.out: out[{i}] of graph {_graph_label(graph)} is {given.describe()} on "
                f"{tensor.device}, but the graph writes {spec.describe()} on {device}; allocate it with "
                "torch.empty_strided(shape, stride, dtype=..., device=...)."
            )


def _execute_in_place_cuda(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """execute_ on the Python path; ``inputs`` in the builder's order (the C++ kernel
    merged them). Returns the outputs not written in place."""
    built = _built_for_call(graph, inputs)
    writes = _check_in_place(graph, built.layout, inputs, [TensorSpec.of(t) for t in inputs])
    return _first_launch_timed(built, lambda: _run_built_in_place(graph, built, inputs, writes))


def _run_built_in_place(graph: int, built, inputs: List[torch.Tensor], writes) -> List[torch.Tensor]:
    if built.native:  # handed over by this call (or built by it, hand_over="build"): the plan every later call runs on
        others = _C.run_native_in_place(graph, inputs)
        if others is not None:
            return others
    outputs = _empty_outputs(built.layout, _device(built), inputs)
    others = [t for o, t in enumerate(outputs) if o not in dict(writes)]
    # A misaligned written input is staged through one aligned copy, read and written
    # there (the same binding), then copied back. (A bool one is bit-packed by _launch,
    # read from the packed copy and unpacked into it.)
    staged = _aligned(inputs)
    for output, input_ in writes:
        outputs[output] = staged[input_]
    _launch(built, staged, outputs)
    for _, input_ in writes:
        if staged[input_] is not inputs[input_]:
            inputs[input_].copy_(staged[input_])
    return others


def _check_out_overlap(graph: int, inputs: Sequence[torch.Tensor], out: Sequence[torch.Tensor]) -> None:
    """execute.out's schema says it only reads its inputs and writes each ``out`` once."""
    writes = _C.in_place_writes(graph)
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
                f"cudnn_fe.execute.out: out[{k}] of graph {_graph_label(graph)} overlaps inputs[{j}], but execute.out's "
                f"schema says its inputs are only read (torch.compile and autograd rely on it); {fix}."
            )
        for i in range(k):
            if overlaps(out[i], target):
                raise ValueError(
                    f"cudnn_fe.execute.out: out[{i}] and out[{k}] of graph {_graph_label(graph)} overlap; pass separate tensors"
                )


def _check_in_place(graph: int, layout, inputs: Sequence[torch.Tensor], specs) -> list:
    """What execute_ refuses, the CUDA and the fake kernel alike: a written input that is
    not laid out as the output written into it (registry/in_place.py), or that overlaps
    another input. Returns the graph's (output, input) writes."""
    writes = _C.in_place_writes(graph)
    check_layouts(_graph_label_name(graph), layout.outputs_for([spec.shape for spec in specs]), specs, writes)
    _check_in_place_overlap(graph, inputs, writes)
    return writes


def _check_in_place_overlap(graph: int, inputs: Sequence[torch.Tensor], writes) -> None:
    """execute_ writes exactly its written inputs: none may share memory with another input."""
    for output, j in writes:
        for i, other in enumerate(inputs):
            if i != j and overlaps(inputs[j], other):
                raise ValueError(
                    f"cudnn_fe.execute_: input {j} of graph {_graph_label(graph)}, which it writes in place (output "
                    f"{output}), overlaps input {i}, which execute_'s schema says is only read; pass separate tensors "
                    "(e.g. input.clone())"
                )


def _graph_label_name(graph: int) -> str:
    """The graph's name, for messages that quote it."""
    try:
        return _registry.definition(graph).name
    except ValueError:
        return f"id {graph}"


def _refuse_non_cuda(graph: int, inputs: List[torch.Tensor], **_kwargs):
    """Every dispatch that reaches no CUDA kernel: CPU tensors, another backend, or no
    tensor at all (the dispatcher's Undefined slot, which CompositeExplicitAutograd fills)."""
    _inputs_device(graph, inputs)  # names the first non-CUDA input, or the empty list
    raise ValueError(f"cudnn_fe.execute: graph {_graph_label(graph)} needs CUDA inputs")


def _refuse_non_cuda_in_place(graph: int, inputs: List[torch.Tensor], written: List[torch.Tensor]):
    _refuse_non_cuda(graph, _C.merge_in_place(graph, inputs, written))


def _cuda_index(device: torch.device):
    return device.index if device.type == "cuda" else None


def _layout_for_fake(graph: int, inputs: Sequence[torch.Tensor]):
    """The layout at the inputs' sizes (their hints under dynamic shapes: no specialization)."""
    device = _call_device(graph, inputs)
    return _registry.layout(graph, symbolic.hint_specs(inputs), _cuda_index(device))


def _fake_output_layouts(graph: int, inputs: Sequence[torch.Tensor], device: torch.device):
    """(sizes, strides, dtype) per output: symbolic where the inputs' sizes are
    (torch.compile(dynamic=True); registry/symbolic.py), from the graph's descriptions."""
    definition = _registry.definition(graph)
    describe = lambda specs: _registry.layout(graph, specs, _cuda_index(device))  # noqa: E731
    at_hints = describe(symbolic.hint_specs(inputs))  # refuses what a call at these sizes would
    if definition.ragged is not None:
        definition.ragged.tie_tokens(inputs)  # packed inputs sharing offsets: one symbol, before any probe
    if definition.output_shapes is not None and symbolic.is_symbolic(inputs):
        shapes = definition.output_shapes(*[t.shape for t in inputs])
        return symbolic.shaped_outputs(definition.name, shapes, inputs, at_hints)
    layouts = symbolic.output_layouts(definition.name, describe, inputs)
    if definition.ragged is None:
        return layouts
    # A packed output has the token count of the input it is like: that input's size,
    # symbolic under dynamic shapes (the description, keyed without it, has TOKENS).
    tokens_like = at_hints.tokens_like
    return [
        (sizes if like < 0 else [inputs[like].shape[0], *sizes[1:]], strides, dtype)
        for (sizes, strides, dtype), like in zip(layouts, tokens_like or [-1] * len(layouts))
    ]


def _call_device(graph: int, inputs: Sequence[torch.Tensor]) -> torch.device:
    """The device a traced call's outputs are on: the one device of its inputs that are
    not host scalars. Fake and meta tensors keep their device, so a trace refuses what a
    real call would (no input, inputs on several devices, a CPU tensor that is not a
    scalar, a 0-dim device tensor) instead of describing outputs for it."""
    if not inputs:
        raise ValueError(f"cudnn_fe.execute: graph {_graph_label(graph)} got no input tensors; pass at least one CUDA tensor")
    on_device = [(i, t) for i, t in enumerate(inputs) if not is_host_scalar(t) or _is_ragged_offsets(graph, i)]
    for i, tensor in on_device:
        if tensor.dim() == 0:
            raise _zero_dim_error(graph, i, tensor)
    if not on_device:
        return inputs[0].device  # only host scalars: described as they are (a real call refuses them)
    devices = sorted({str(t.device) for _, t in on_device})
    if len(devices) > 1:
        others = {t.device for i, t in on_device if not _is_ragged_offsets(graph, i)}
        for i, tensor in on_device:
            if len(others) == 1 and tensor.device not in others:
                _refuse_misplaced_offsets(graph, i, tensor, str(next(iter(others))))
        cpu = next(((i, t) for i, t in on_device if t.device.type == "cpu"), None)
        rule = f": input {cpu[0]} is on cpu{_host_scalar_rule(cpu[1])}" if cpu else ""
        raise ValueError(
            f"cudnn_fe.execute: inputs of graph {_graph_label(graph)} are on more than one device ({', '.join(devices)})"
            f"{rule}; put them all on the device the graph should run on."
        )
    return on_device[0][1].device


def _execute_fake(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    device = _call_device(graph, inputs)
    return [torch.empty_strided(sizes, strides, dtype=dtype, device=device) for sizes, strides, dtype in _fake_output_layouts(graph, inputs, device)]


def _execute_out_fake(graph: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    layout = _layout_for_fake(graph, inputs)  # an unknown id, a bad arity or dtype fails at trace time too
    _check_out(graph, layout, out, _call_device(graph, inputs), inputs)
    _check_out_overlap(graph, inputs, out)
    return None


def _execute_in_place_fake(graph: int, inputs: List[torch.Tensor], written: List[torch.Tensor]) -> List[torch.Tensor]:
    """What a real execute_ refuses, refused at trace time; the outputs not written in place."""
    all_inputs = _C.merge_in_place(graph, inputs, written)
    device = _call_device(graph, all_inputs)
    writes = _check_in_place(graph, _layout_for_fake(graph, all_inputs), all_inputs, symbolic.hint_specs(all_inputs))
    written_outputs = {output for output, _ in writes}
    return [
        torch.empty_strided(sizes, strides, dtype=dtype, device=device)
        for o, (sizes, strides, dtype) in enumerate(_fake_output_layouts(graph, all_inputs, device))
        if o not in written_outputs
    ]


def _backward(graph: int, grad_outputs, inputs, outputs):
    """Gradients of one ``execute(graph, inputs)`` call from its Python backward: one per
    input, None for none. ``grad_outputs`` holds None where autograd gave no gradient
    (zeros when the graph's record materializes them); ``inputs`` and ``outputs`` hold
    None where the node did not save one (the graph's ``backward_reads``)."""
    forward = _registry.differentiable(graph)
    # A graph is built for exact strides; autograd hands over whatever it has (an
    # expanded scalar has stride 0), so give the backward dense gradients.
    grads = [None if g is None else g.contiguous() for g in grad_outputs]
    if forward.backward_fn is not None:
        grad_inputs = list(forward.backward_fn(grads, inputs, outputs))
    else:
        grad_inputs = _run_backward_graph(forward, list(forward.backward_operands(grads, inputs, outputs)), len(inputs))
    if len(grad_inputs) != len(inputs):
        raise ValueError(f"the backward of graph {forward.name!r} returned {len(grad_inputs)} gradients for {len(inputs)} inputs")
    return grad_inputs


def _run_declared_backward(graph: int, operands, num_inputs: int):
    """A declared backward no native plan serves (yet): its operands, assembled by the
    autograd node in C++, run on the backward graph through the op."""
    return _run_backward_graph(_registry.definition(graph), operands, num_inputs)


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
    """Which builder output each of a graph's outputs is, for these operands' layouts.
    Real tensors: the graph the call just ran was built for them, so its layout says
    (describing the graph again would cost a new length a second description); fake
    or meta ones (a trace): the description's, cached per layout."""
    if all((t.is_cuda or is_host_scalar(t)) and not is_fake(t) for t in operands):
        return _built_for_call(graph_id, operands, call=False).layout.output_positions  # a hit: execute() just built it
    specs = symbolic.hint_specs(operands)  # which builder output each is does not depend on sizes: no specialization
    key = (graph_id, specs)
    positions = _POSITIONS.get(key)
    if positions is None:
        positions = _registry.layout(graph_id, specs, _cuda_index(operands[0].device)).output_positions
        if len(_POSITIONS) >= 4096:
            _POSITIONS.clear()
        _POSITIONS[key] = positions
    return positions


_C._set_python_kernels(_execute_cuda, _execute_out_cuda, _execute_in_place_cuda, _backward, _run_declared_backward)
_lib = torch.library.Library("cudnn_fe", "IMPL")
for _key in ("CPU", "CompositeExplicitAutograd"):
    _lib.impl("execute", _refuse_non_cuda, _key)
    _lib.impl("execute.out", _refuse_non_cuda, _key)
    _lib.impl("execute_", _refuse_non_cuda_in_place, _key)
torch.library.register_fake("cudnn_fe::execute", _execute_fake, lib=_lib)
torch.library.register_fake("cudnn_fe::execute.out", _execute_out_fake, lib=_lib)
torch.library.register_fake("cudnn_fe::execute_", _execute_in_place_fake, lib=_lib)

_has_torch_function = torch._C._has_torch_function  # a TorchFunctionMode, or an input with __torch_function__


def execute(graph: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """``torch.ops.cudnn_fe.execute(graph, inputs)``, with a cheaper eager entry.

    Eagerly it enters the dispatcher from C++ (autograd, then the CUDA kernel) without
    torch.ops' generic argument parsing; under torch.compile, under a
    ``TorchFunctionMode`` and for tensor subclasses with ``__torch_function__`` it is
    the op itself, so tracing, modes and subclasses see ``cudnn_fe.execute`` either way."""
    try:
        routed = _has_torch_function(inputs)  # a TypeError for inputs that are not a sequence
    except TypeError as error:
        raise _argument_error(graph, inputs=inputs) or error from None
    if routed or torch.compiler.is_compiling():
        return torch.ops.cudnn_fe.execute.default(graph, inputs)
    try:
        return _C.execute(graph, inputs)
    except TypeError as error:  # pybind11 refused an argument: say which, off the hot path
        raise _argument_error(graph, inputs=inputs) or error from None


def execute_out(graph: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    """``torch.ops.cudnn_fe.execute.out(graph, inputs, out=out)``; see :func:`execute`."""
    try:
        routed = _has_torch_function(inputs) or _has_torch_function(out)
    except TypeError as error:
        raise _argument_error(graph, inputs=inputs, out=out) or error from None
    if routed or torch.compiler.is_compiling():
        return torch.ops.cudnn_fe.execute.out(graph, inputs, out=out)
    try:
        _C.execute_out(graph, inputs, out=out)
    except TypeError as error:
        raise _argument_error(graph, inputs=inputs, out=out) or error from None


@torch._dynamo.assume_constant_result
def _written_inputs(graph: int) -> tuple:
    """Which inputs the graph writes in place (its record's), read once per trace: a
    constant of the compiled frame, not a graph break."""
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
        raise _argument_error(graph, inputs=inputs) or error from None
    if routed or torch.compiler.is_compiling():
        written_at = _written_inputs(graph)
        if not written_at:
            raise ValueError(
                f"cudnn_fe.execute_: graph {_graph_label(graph)} writes none of its inputs in place; register it with "
                "register_graph(builder, in_place={output_index: input_index}), or call execute"
            )
        if written_at[-1] >= len(inputs):
            raise ValueError(f"cudnn_fe.execute_: graph {_graph_label(graph)} writes its input {written_at[-1]}, but got {len(inputs)} inputs")
        written = [inputs[i] for i in written_at]
        others = [t for i, t in enumerate(inputs) if i not in written_at]
        return torch.ops.cudnn_fe.execute_.default(graph, others, written)
    try:
        return _C.execute_in_place(graph, inputs)
    except TypeError as error:
        raise _argument_error(graph, inputs=inputs) or error from None


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
                    f"tensor; pass a list of tensors (a Python number as a host scalar: torch.tensor(value))"
                )
    return None
