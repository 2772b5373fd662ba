"""An upstream graph's entry (UpstreamGraph: the fields are described in the package's
docstring) and the input helpers the families' entries share."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cudnn
import torch

CL = torch.channels_last
F32 = cudnn.data_type.FLOAT

# Why the op refuses a graph today (torch_cudnn_handle/op/checks.py, registry/describe.py).


@dataclasses.dataclass
class UpstreamGraph:
    name: str
    family: str
    upstream: str  # where the graph comes from
    builder: Callable[..., Any]
    make_inputs: Callable[[str], List[torch.Tensor]]
    reference: Callable[[List[torch.Tensor]], List[Optional[torch.Tensor]]]
    tolerances: Sequence[Tuple[float, float]]  # (atol, rtol) per output
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    region: Optional[Callable[[List[torch.Tensor], List[torch.Tensor]], List[torch.Tensor]]] = None
    frontend_types: Optional[Dict[str, Any]] = None
    in_place: Optional[Dict[int, int]] = None  # {output: input} the graph writes into its inputs, as upstream binds them
    known_issue: str = ""  # measured on the H200 and still open: the GPU test is an xfail naming it
    note: str = ""
    graph_id: int = -1


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _randn(gen, *shape, dtype=torch.float16, device="cuda", scale=1.0, shift=0.0, memory_format=None):
    t = (torch.randn(*shape, generator=gen) * scale + shift).to(dtype=dtype, device=device)
    return t.to(memory_format=memory_format) if memory_format is not None else t


def _host_scalar(value: float, ndim: int) -> torch.Tensor:
    return torch.full((1,) * ndim, value, dtype=torch.float32)  # stays on the CPU, as upstream passes it
