"""The Python path of the CUDA kernels: every call no native plan served.

The C++ kernel (csrc/op/cuda_kernels.cpp) runs a call a native plan serves with no
Python at all and sends every other call here, on the inputs' device, this thread's
pooled handle and the right context: the registry builds the graph on first use (its
binding may hand the plan to the native path then, or at its second call: Note [The
native hand-over]), which then runs the call too; otherwise (graphs the native path
cannot serve, a first call under ``second_call``) the frontend's ordered execute runs it,
with outputs and workspace from torch's caching allocator on the current stream. Nothing
here synchronizes or allocates outside torch, so a warm call is capturable (verify mode,
off by default, synchronizes at each built graph's first launch: verify.py). A graph
registered ``reference=True`` (or every graph, under the ``reference_path`` setting) runs
on the reference interpreter instead (reference.py): Note [The Python path's routes].

Host scalars go in as they are: the frontend binds a CPU tensor's data_ptr, the host
address cuDNN reads the value from when the plan executes (once, at capture, in a
CUDA-graph capture: every replay uses that value, as torch does with a CPU scalar).
"""

from __future__ import annotations

import time
from typing import List, Sequence

import torch

from .. import registry
from .._extension import _C
from ..pool import current_handle
from ..registry import TensorSpec, materialize
from . import bool_operands, reference, verify
from .stand_in import execute as stood_in, execute_out as stood_in_out
from .checks import call_device, check_in_place, check_out, check_out_overlap, key_specs, refuse_off_gpu

__all__ = ["built_for_call", "plan_ready", "execute", "execute_out", "execute_in_place"]


def built_for_call(graph_id: int, inputs: Sequence[torch.Tensor], call: bool = True, stand_in: str = "interpreter"):
    """The graph built for these inputs; ``call``: the op runs it now (a pending native
    hand-over happens first, and the call is counted under its route), else only its layout
    is wanted. None while the graph builds off the call's path, where its route says: the
    caller's ``stand_in`` serves instead (by default the op's: stand_in.py)."""
    device = call_device(graph_id, inputs)
    if device.type != "cuda":  # the C++ kernel binds the first CUDA input's device; the rest is this rule's
        refuse_off_gpu(graph_id, inputs)
    built = registry.built_for(graph_id, device.index, inputs, key_specs(inputs), torch.are_deterministic_algorithms_enabled(), call=call,
                               stand_in=stand_in)
    if call and built is not None:
        registry.count_call(built.route.label)
    return built


def plan_ready(graph_id: int, inputs: Sequence[torch.Tensor], stand_in: str) -> bool:
    """Whether ``graph_id``'s plan for these CUDA inputs is built. False while it builds off
    the caller's path (one is started if none is in flight: Note [Builds off the caller's
    path]), so a caller with its own stand-in (nn.sdpa: torch's attention) serves the call;
    where the caller's path must build (the setting off, deterministic algorithms, a
    capture) it is built now, or refused, as a call would be."""
    return built_for_call(graph_id, inputs, call=False, stand_in=stand_in) is not None


# Plans are built for 16-byte aligned operands (the frontend sets no lower alignment,
# and cuDNN's kernels assume it: a 2-byte aligned view failed with
# CUDNN_STATUS_EXECUTION_FAILED_CUBLAS). A view that is not aligned is staged through an
# aligned copy of the same layout, on the current stream; the native kernel sends such
# calls here.
_ALIGNMENT = 16


def _aligned(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    def aligned(t: torch.Tensor) -> torch.Tensor:
        if t.is_cpu or t.data_ptr() % _ALIGNMENT == 0:  # a host scalar is read by value on the host
            return t
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)

    return [aligned(t) for t in tensors]


def _empty_outputs(built, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    specs = built.layout.outputs_for([t.shape for t in inputs])  # a packed output: the T of the input it is like
    device = torch.device("cuda", built.device)  # inputs[0] may be a host scalar
    return [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device) for s in specs]


def _launch(built, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    handle = current_handle(built.device)
    if torch.cuda.is_current_stream_capturing():
        _C.keep_alive_while_captured(built)  # its plan (a frost plan's kernels too) outlives any eviction
    workspace = (
        torch.empty(built.workspace_size, dtype=torch.uint8, device=torch.device("cuda", built.device)) if built.workspace_size else None
    )
    inputs, launched_outputs = _aligned(inputs), outputs
    packing = built.has_bool  # Note [Bit-packed booleans]
    if packing:
        inputs, launched_outputs = bool_operands.pack_call(inputs, outputs)
    buffers = [*inputs, *launched_outputs]
    if built.graph_views is not None:  # the graph's own views of natural operands (registry/operand_views.py)
        buffers = [t if t.is_cpu else t.as_strided(*view) for t, view in zip(buffers, built.graph_views)]
    built.graph.execute(buffers, workspace, handle=handle, tensor_uids=built.uids)
    if packing:
        bool_operands.unpack_outputs(outputs, launched_outputs)


def _first_launch(built) -> bool:
    """Whether the op's next launch of ``built`` is its first (timed, and verified in verify mode)."""
    return built.phase_seconds is not None and "first_execution" not in built.phase_seconds


def _timed(built, launch):
    """``launch()``, timed on the host into the built graph's ``phase_seconds["first_execution"]``
    (registry/build_timing.py)."""
    started = time.perf_counter()
    result = launch()
    registry.record_first_execution(built, time.perf_counter() - started)
    return result


def _run_into(graph_id: int, built, inputs: Sequence[torch.Tensor], out: Sequence[torch.Tensor]) -> None:
    """The call written into ``out``: the native plan, else the frontend (misaligned ``out`` staged)."""
    if built.binding.run_out(inputs, out):
        return
    staged = _aligned(out)
    _launch(built, inputs, staged)
    for target, written in zip(out, staged):
        if written is not target:
            target.copy_(written)


# Note [The Python path's routes]: a built graph of the reference route (a graph the
# interpreter runs: reference.py) runs there, and so does a call whose layout is still
# building off the call's path (Note [Builds off the caller's path], graph_cache.py). Otherwise the inputs a pointwise graph
# broadcasts are materialized first (Note [Pointwise broadcasts] in registry/broadcasts.py:
# the graph, its native plan included, was built for them at full shape), and the graph's
# first launch is timed and, in verify mode, checked (verify.py): launched into outputs
# pre-filled with NaN, then compared with the interpreter's.


def execute(graph_id: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    built = built_for_call(graph_id, inputs)
    if built is None:
        return stood_in(graph_id, inputs)
    if built.route.runs_on == "interpreter":
        return reference.execute(graph_id, inputs)
    operands = materialize(inputs, built.layout.materialized)

    def run():
        outputs = built.binding.run(operands)  # native since this call's build or hand-over
        if outputs is None:
            outputs = _empty_outputs(built, operands)
            _launch(built, operands, outputs)
        return outputs

    if not _first_launch(built):
        return run()
    check = verify.first_execution(graph_id, built, inputs)
    if check is None:
        return _timed(built, run)
    outputs = check.prefilled(_empty_outputs(built, operands))
    _timed(built, lambda: _run_into(graph_id, built, operands, outputs))
    check.finish(outputs)
    return outputs


def execute_out(graph_id: int, inputs: List[torch.Tensor], *, out: List[torch.Tensor]) -> None:
    built = built_for_call(graph_id, inputs)
    if built is None:
        return stood_in_out(graph_id, inputs, out=out)
    if built.route.runs_on == "interpreter":
        return reference.execute_out(graph_id, inputs, out=out)
    check_out(graph_id, built.layout, out, torch.device("cuda", built.device), inputs)
    check_out_overlap(graph_id, inputs, out)
    operands = materialize(inputs, built.layout.materialized)
    if not _first_launch(built):
        return _run_into(graph_id, built, operands, out)
    check = verify.first_execution(graph_id, built, inputs)
    _timed(built, lambda: _run_into(graph_id, built, operands, out))
    if check is not None:
        check.finish(out, prefilled=False)
    return None


def execute_in_place(graph_id: int, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """execute_ on the Python path; ``inputs`` in the builder's order (the C++ kernel
    merged them). Returns the outputs not written in place."""
    built = built_for_call(graph_id, inputs)
    if built is None or built.route.runs_on == "interpreter":
        return reference.execute_in_place(graph_id, inputs)
    writes = check_in_place(graph_id, built.layout, inputs, [TensorSpec.of(t) for t in inputs])
    written = dict(writes)  # output -> the input it is written into
    operands = materialize(inputs, built.layout.materialized)  # never a written input: it has its output's layout

    def run():
        others = built.binding.run_in_place(operands)
        if others is not None:
            return others
        outputs = _empty_outputs(built, operands)
        others = [t for o, t in enumerate(outputs) if o not in written]
        # A misaligned written input is staged through one aligned copy, read and written
        # there (the same binding), then copied back. (A bool one is bit-packed by _launch,
        # read from the packed copy and unpacked into it.)
        staged = _aligned(operands)
        for output, input_ in writes:
            outputs[output] = staged[input_]
        _launch(built, staged, outputs)
        for _, input_ in writes:
            if staged[input_] is not operands[input_]:
                operands[input_].copy_(staged[input_])
        return others

    if not _first_launch(built):
        return run()
    check = verify.first_execution(graph_id, built, inputs, written=[input_ for _, input_ in writes])
    others = _timed(built, run)
    if check is not None:
        rest = iter(others)
        check.finish([inputs[written[o]] if o in written else next(rest) for o in range(len(built.layout.outputs))], prefilled=False)
    return others
