"""The registry's value types: operand specs, output layouts, and the dtypes a graph takes
(read from the frontend's table, never copied).

All are frozen and hashable: a tuple of ``TensorSpec`` is part of the cache keys.
Shapes and strides are plain ints (never symbolic): a cuDNN graph is built for exact
shapes and strides.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import torch
from cudnn.datatypes import torch_to_cudnn_data_type


# A packed (ragged) operand's token count in a spec: any; it is no part of a key (ragged.py).
TOKENS = -1

# torch's packed fp4 (``float4_e2m1fn_x2``) counts pairs where a cuDNN tensor counts
# elements, so a shape cannot cross unchanged: left out of the dtypes a graph takes.
PACKED_DTYPES = frozenset(getattr(torch, name) for name in ("float4_e2m1fn_x2",) if hasattr(torch, name))

# The torch dtypes a graph's tensors may have: those the frontend's own table
# (cudnn.datatypes) maps to a cudnn.data_type, found by asking it about every dtype
# this torch has, so a dtype either side adds (fp8 e8m0, ...) needs no edit here.
TORCH_DTYPES = tuple(
    dtype
    for dtype in dict.fromkeys(value for value in vars(torch).values() if isinstance(value, torch.dtype))
    if dtype not in PACKED_DTYPES and torch_to_cudnn_data_type(dtype) is not None
)

# The frontend's table read backwards (its public direction is torch -> cudnn); the first
# torch dtype of a cudnn.data_type wins.
_TORCH_OF_CUDNN = {}
for _dtype in TORCH_DTYPES:
    _TORCH_OF_CUDNN.setdefault(torch_to_cudnn_data_type(_dtype), _dtype)
del _dtype


def cudnn_data_type_of(data_type):
    """A ``cudnn.data_type`` for what the frontend accepts as one (a cudnn.data_type or a
    torch dtype: ``tensor.set_data_type(torch.float16)`` keeps the torch dtype in the
    description, so its ``data_type`` may be either); None for anything else."""
    if isinstance(data_type, torch.dtype):
        return None if data_type in PACKED_DTYPES else torch_to_cudnn_data_type(data_type)
    return data_type


def torch_dtype_of(data_type) -> Optional[torch.dtype]:
    """The torch dtype of a graph tensor's data type (either spelling), through the
    frontend's table; None when torch has no dtype for it."""
    return _TORCH_OF_CUDNN.get(cudnn_data_type_of(data_type))


def dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape, stride (in elements) and dtype of one graph operand."""

    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: torch.dtype
    host: bool = False  # a host scalar: a pass-by-value operand, its value read per call (is_host_scalar)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorSpec":
        # int() specializes a symbolic size under torch.compile(dynamic=True): a cuDNN
        # graph is built for exact shapes and strides, so that is the truth.
        return cls(tuple(int(n) for n in tensor.shape), tuple(int(n) for n in tensor.stride()), tensor.dtype, is_host_scalar(tensor))

    def describe(self) -> str:
        where = " on the host (pass-by-value)" if self.host else ""
        shape = "[" + ", ".join("T" if n == TOKENS else str(n) for n in self.shape) + "]"
        return f"{str(self.dtype).replace('torch.', '')}{shape} stride {list(self.stride)}{where}"


def layout_lists(specs) -> list:
    """Specs as the (shape, stride, dtype, host) lists plan_tuning and the extension take
    (host: a host scalar, passed by value)."""
    return [(list(s.shape), list(s.stride), s.dtype, s.host) for s in specs]


def has_bool(*spec_lists: Sequence) -> bool:
    """Whether any TensorSpec in ``spec_lists`` is a torch.bool operand (Note [Bit-packed booleans] in op/bool_operands.py)."""
    return any(spec.dtype == torch.bool for specs in spec_lists for spec in specs)


def is_host_scalar(tensor: torch.Tensor) -> bool:
    """A CPU tensor of one element (0-dim or not): the op passes it to the graph by
    value (a pass-by-value operand), as the frontend does with a CPU tensor. Any other
    CPU tensor is refused. Fake and meta CPU tensors count too, so a trace describes
    the graph a real call builds."""
    return tensor.device.type == "cpu" and tensor.numel() == 1


@dataclasses.dataclass(frozen=True)
class GraphLayout:
    """What a call's outputs look like: their specs, for each output the position (in
    the builder's returned sequence) it came from (a builder may return None for a
    slot: a backward builder does, for a forward input with no gradient), which
    layouts the builder declared, and which inputs the op materializes."""

    outputs: Tuple[TensorSpec, ...]
    output_positions: Tuple[int, ...]
    # Per output, whether the builder declared its strides (a contract the build must
    # keep) or left them to cuDNN (the build's layout is what the op allocates).
    # Empty: all declared (a registered built graph).
    declared: Tuple[bool, ...] = ()
    # Per output, the op input whose token count a packed (ragged) output has, its
    # spec's first size being TOKENS; -1: not packed. Empty: none is (ragged.py).
    tokens_like: Tuple[int, ...] = ()
    # (op input, full shape) of each input the op materializes at its full broadcast shape
    # before the graph reads it (Note [Pointwise broadcasts] in broadcasts.py). Empty: none.
    materialized: Tuple[Tuple[int, Tuple[int, ...]], ...] = ()

    def is_declared(self, index: int) -> bool:
        return not self.declared or self.declared[index]

    def all_declared(self) -> bool:
        return all(self.is_declared(i) for i in range(len(self.outputs)))

    def outputs_for(self, input_shapes: Sequence[Sequence[int]]) -> Tuple[TensorSpec, ...]:
        """The output specs of a call whose inputs have ``input_shapes``: a packed output
        gets the token count of the input it is like."""
        if not any(i >= 0 for i in self.tokens_like):
            return self.outputs
        return tuple(
            spec if like < 0 else dataclasses.replace(spec, shape=(int(input_shapes[like][0]), *spec.shape[1:]))
            for spec, like in zip(self.outputs, self.tokens_like)
        )


def spec_of_cudnn_tensor(tensor, what: str) -> TensorSpec:
    dtype = torch_dtype_of(tensor.data_type)
    if dtype is None or not tensor.dim:
        raise ValueError(f"register_built_graph: {what} needs dims, strides and a torch-representable data type")
    return TensorSpec(tuple(tensor.dim), tuple(tensor.stride), dtype, bool(tensor.is_pass_by_value))
