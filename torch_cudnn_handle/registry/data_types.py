"""A graph's io, intermediate and compute data types, and the input dtypes a graph takes.

``cudnn.pygraph`` takes three types: io (a tensor created with no data type: inputs
the builder adds itself, outputs), intermediate (virtual tensors) and compute. An
author may set any of them per graph (``register_graph(..., io_data_type=...,
intermediate_data_type=..., compute_data_type=...)``, torch dtypes or cudnn.data_type);
by default io is the first floating-point device input's dtype (the first device
input's when none is floating: an all-integer graph) and intermediate and compute are
float32. Host scalars (pass-by-value operands such as an epsilon) never choose the io
type.

An all-integer graph (integer device inputs, none floating) computes in an integer type
by default, intermediates too: INT64 when an input is int64, else INT32. In float32 it
would round every value above 2**24 silently (a relu of int64 16777217 gave 16777216),
on cuDNN and on the interpreter alike. ``compute_data_type=torch.float32`` asks for the
float computation (a graph that needs it: an exp of integers). On cuDNN 9.19 no engine
takes a pointwise graph computing in INT32 or INT64 (H200: relu, add, max), so there such a
graph is refused naming that fix (build.py); the interpreter computes it exactly.
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
        default = _default_compute(specs)
        intermediate = self.intermediate if self.intermediate is not None else default
        compute = self.compute if self.compute is not None else default
        return io, intermediate, compute


def integer_default(types: GraphDataTypes, specs: Sequence[TensorSpec]) -> Optional[str]:
    """The integer compute type an all-integer graph got by default ("INT64", "INT32"), or
    None (chosen by the author, or a graph with floating inputs): what a failed build names."""
    if types.compute is not None:
        return None
    default = _default_compute(specs)
    return None if default == cudnn.data_type.FLOAT else default.name


def _device_specs(specs: Sequence[TensorSpec]) -> Sequence[TensorSpec]:
    return [s for s in specs if not s.host] or list(specs)


def _default_io_dtype(specs: Sequence[TensorSpec]) -> torch.dtype:
    device = _device_specs(specs)
    return next((s.dtype for s in device if s.dtype.is_floating_point), device[0].dtype)


def _default_compute(specs: Sequence[TensorSpec]):
    """float32, or for an all-integer graph its integer type (module docstring)."""
    dtypes = {s.dtype for s in _device_specs(specs)}
    integers = {d for d in dtypes if not d.is_floating_point and d != torch.bool}
    if not integers or any(d.is_floating_point for d in dtypes):
        return cudnn.data_type.FLOAT
    return cudnn.data_type.INT64 if torch.int64 in integers else cudnn.data_type.INT32


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
