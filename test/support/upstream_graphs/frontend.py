"""The frontend running an entry's graph itself, described as the registry describes it, and
what the GPU tests compare with (compare_region, path_of)."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import cudnn
import torch
from cudnn.datatypes import torch_to_cudnn_data_type

import torch_cudnn_handle as tch

from .entry import F32, UpstreamGraph


# =====================================================================================
# The frontend running a graph itself, described as the registry describes it


def _graph_types(entry: UpstreamGraph, inputs: Sequence[torch.Tensor]) -> Dict[str, Any]:
    """The graph's types: ``frontend_types`` where upstream gives its own (registered with
    the graph too), else the registry's default: io = the first floating input's dtype,
    float32 intermediate and compute."""
    if entry.frontend_types:
        return dict(entry.frontend_types)
    floating = next((t.dtype for t in inputs if t.dtype.is_floating_point), None)
    return dict(io_data_type=torch_to_cudnn_data_type(floating), intermediate_data_type=F32, compute_data_type=F32)


def describe_with_frontend(entry: UpstreamGraph, inputs: Sequence[torch.Tensor], handle=None):
    """The graph as registry/describe.py ``describe`` makes it (name, types, one
    ``input{i}`` tensor per op input, the builder, outputs marked), except that a CPU input
    is declared pass-by-value, as upstream declares a host scalar. Returns (graph, inputs, outputs)."""
    graph = cudnn.pygraph(name=f"upstream_{entry.name}", handle=handle, **_graph_types(entry, inputs))
    tensors = [
        graph.tensor(name=f"input{i}", dim=list(t.shape), stride=list(t.stride()), data_type=torch_to_cudnn_data_type(t.dtype),
                     is_pass_by_value=t.device.type == "cpu")
        for i, t in enumerate(inputs)
    ]
    result = entry.builder(graph, *tensors, **entry.params)
    returned = [result] if isinstance(result, cudnn.Tensor) else list(result)
    outputs = [t for t in returned if t is not None]
    for t in outputs:
        t.set_output(True)
    return graph, tensors, outputs


_TORCH_OF = {
    cudnn.data_type.HALF: torch.float16, cudnn.data_type.BFLOAT16: torch.bfloat16, cudnn.data_type.FLOAT: torch.float32,
    cudnn.data_type.DOUBLE: torch.float64, cudnn.data_type.INT8: torch.int8, cudnn.data_type.INT32: torch.int32,
    cudnn.data_type.INT64: torch.int64, cudnn.data_type.UINT8: torch.uint8, cudnn.data_type.BOOLEAN: torch.bool,
    cudnn.data_type.FP8_E4M3: torch.float8_e4m3fn, cudnn.data_type.FP8_E5M2: torch.float8_e5m2,
}


def run_with_frontend(entry: UpstreamGraph, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Build the graph for the inputs' device the way the registry does (inside
    ``tch.build_scope``, with the pooled handle, ``graph.build([A, FALLBACK])``) and run it
    with the frontend's own ``graph.execute``: the plan the op's build selects, run by the
    frontend. An output the entry writes in place is bound to its input's buffer, as
    upstream binds it, and returned as that input. Raises what the frontend raises (e.g.
    cudnnGraphNotSupportedError)."""
    device = next(t.device for t in inputs if t.device.type == "cuda")
    with tch.build_scope(device.index) as handle:
        graph, tensors, outputs = describe_with_frontend(entry, inputs, handle)
        graph.validate()
        graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    # An in-place output is its input's buffer, seen with the output's strides (which may
    # differ in unit dimensions: registry/in_place.py), so its layout is the described one.
    written = {
        output: inputs[input_].as_strided(list(outputs[output].dim), list(outputs[output].stride))
        for output, input_ in (entry.in_place or {}).items()
    }
    results = [
        written[o] if o in written else torch.empty_strided(list(t.dim), list(t.stride), dtype=_TORCH_OF[t.data_type], device=device)
        for o, t in enumerate(outputs)
    ]
    workspace = torch.empty(max(int(graph.get_workspace_size()), 1), dtype=torch.uint8, device=device)
    pack = {t: as_cudnn_bits(x) if x.dtype == torch.bool and x.is_cuda else x for t, x in zip(tensors, inputs)}
    pack.update(zip(outputs, results))
    with torch.cuda.device(device):
        graph.execute(pack, workspace, handle=tch.current_handle(device.index))
    return [from_cudnn_bits(r) if r.dtype == torch.bool else r for r in results]


# cuDNN's BOOLEAN tensors are bits (LSB first, at each element's memory offset; measured,
# Note [Bit-packed booleans] in torch_cudnn_handle/op/bool_operands.py). The frontend hands
# a torch.bool buffer over as it is, so running it "as upstream does" means giving it
# bits and reading bits back. Written here independently of the op's packing (dense
# tensors only, which is all these graphs have).


def _memory_order(t: torch.Tensor) -> List[int]:
    return sorted(range(t.dim()), key=lambda axis: -t.stride()[axis])


def as_cudnn_bits(t: torch.Tensor) -> torch.Tensor:
    """A torch.bool buffer like ``t`` whose first bytes hold ``t``'s elements as bits."""
    flat = t.permute(*_memory_order(t)).reshape(-1).long()
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 8)])
    weights = 2 ** torch.arange(8, device=t.device)
    packed = (flat.view(-1, 8) * weights).sum(1).to(torch.uint8)
    buffer = torch.zeros_like(t)
    torch.as_strided(buffer.view(torch.uint8), (packed.numel(),), (1,)).copy_(packed)
    return buffer


def from_cudnn_bits(t: torch.Tensor) -> torch.Tensor:
    """The elements a torch.bool buffer's first bytes hold as bits, with ``t``'s layout."""
    n = t.numel()
    raw = torch.as_strided(t.view(torch.uint8), (-(-n // 8),), (1,)).long()
    bits = ((raw.unsqueeze(1) // 2 ** torch.arange(8, device=t.device)) % 2).reshape(-1)[:n].bool()
    order = _memory_order(t)
    out = torch.empty_like(t)
    out.permute(*order).copy_(bits.view([t.shape[a] for a in order]))
    return out


def compare_region(entry: UpstreamGraph, outputs: List[torch.Tensor], inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    return entry.region(outputs, inputs) if entry.region is not None else list(outputs)


def path_of(entry: UpstreamGraph) -> str:
    """'native', 'native pending' (its first call ran on the Python path, the next one hands
    it over) or 'python path', and the engine, of the graph's first built layout."""
    built = tch.built_graphs(entry.graph_id)
    if not built:
        return "not built"
    path = "native" if built[0].native else "native pending" if built[0].native_pending else "python path"
    return f"{path} ({built[0].engine})"
