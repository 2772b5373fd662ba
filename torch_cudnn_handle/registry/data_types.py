"""A graph's io, intermediate and compute data types, and the input dtypes a graph takes.

``cudnn.pygraph`` takes three types: io (a tensor created with no data type: inputs
the builder adds itself, outputs), intermediate (virtual tensors) and compute. An
author may set any of them per graph (``register_graph(..., io_data_type=...,
intermediate_data_type=..., compute_data_type=...)``, torch dtypes or cudnn.data_type);
by default io is the first floating-point device input's dtype (the first device
input's when none is floating: an all-integer graph) and intermediate and compute are
float32. Host scalars (pass-by-value operands such as an epsilon) never choose the io
type.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import cudnn
import torch

from .specs import TORCH_DTYPES, TensorSpec, cudnn_data_type_of, dtype_names


@dataclasses.dataclass(frozen=True)
class GraphDataTypes:
    """What the author chose (None: the default). Values are cudnn.data_type."""

    io: Any = None
    intermediate: Any = None
    compute: Any = None

    @classmethod
    def chosen(cls, *, io=None, intermediate=None, compute=None) -> "GraphDataTypes":
        """From what ``register_graph`` got; refuses what the frontend has no type for."""
        return cls(*(_as_cudnn(value, what) for value, what in ((io, "io_data_type"), (intermediate, "intermediate_data_type"), (compute, "compute_data_type"))))

    def for_call(self, name: str, specs: Sequence[TensorSpec]) -> Tuple[Any, Any, Any]:
        """(io, intermediate, compute) as cudnn.data_type for a call with ``specs``;
        refuses an input dtype a cuDNN graph cannot take, so a trace fails where the
        GPU build would."""
        for i, spec in enumerate(specs):
            if spec.dtype not in TORCH_DTYPES:
                raise ValueError(
                    f"cudnn_fe.execute: input {i} of graph {name!r} is {spec.dtype}, which a cuDNN graph cannot take; "
                    f"use one of {dtype_names(TORCH_DTYPES)}"
                )
        io = self.io if self.io is not None else cudnn_data_type_of(_default_io_dtype(specs))
        intermediate = self.intermediate if self.intermediate is not None else cudnn.data_type.FLOAT
        compute = self.compute if self.compute is not None else cudnn.data_type.FLOAT
        return io, intermediate, compute


def _default_io_dtype(specs: Sequence[TensorSpec]) -> torch.dtype:
    device = [s for s in specs if not s.host] or list(specs)
    return next((s.dtype for s in device if s.dtype.is_floating_point), device[0].dtype)


def _as_cudnn(value, what: str) -> Optional[Any]:
    if value is None:
        return None
    converted = cudnn_data_type_of(value)
    if not isinstance(converted, cudnn.data_type) or converted == cudnn.data_type.NOT_SET:
        raise TypeError(
            f"register_graph: {what}={value!r} is not a data type a cuDNN graph takes; pass a cudnn.data_type or one of "
            f"the torch dtypes {dtype_names(TORCH_DTYPES)}"
        )
    return converted
