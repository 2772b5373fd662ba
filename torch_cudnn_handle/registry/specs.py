"""The registry's value types: operand specs, output layouts, declared backward operands,
and the dtype tables.

All are frozen and hashable: a tuple of ``TensorSpec`` is part of the cache keys.
Shapes and strides are plain ints (never symbolic): a cuDNN graph is built for exact
shapes and strides.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import torch
from cudnn.datatypes import torch_to_cudnn_data_type

# The dtypes a graph's tensors may have, and their cudnn.data_type (the frontend's own table).
_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool)
_TORCH_OF_CUDNN = {torch_to_cudnn_data_type(dt): dt for dt in _TORCH_DTYPES}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape, stride (in elements) and dtype of one graph operand."""

    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorSpec":
        # int() specializes a symbolic size under torch.compile(dynamic=True): a cuDNN
        # graph is built for exact shapes and strides, so that is the truth.
        return cls(tuple(int(n) for n in tensor.shape), tuple(int(n) for n in tensor.stride()), tensor.dtype)

    def describe(self) -> str:
        return f"{str(self.dtype).replace('torch.', '')}{list(self.shape)} stride {list(self.stride)}"


@dataclasses.dataclass(frozen=True)
class GraphLayout:
    """What a call's outputs look like: their specs, and for each output the position
    (in the builder's returned sequence) it came from; a builder may return None for
    a slot (a backward builder does, for a forward input with no gradient)."""

    outputs: Tuple[TensorSpec, ...]
    output_positions: Tuple[int, ...]


def _spec_of_cudnn_tensor(tensor, what: str) -> TensorSpec:
    dtype = _TORCH_OF_CUDNN.get(tensor.data_type)
    if dtype is None or not tensor.dim:
        raise ValueError(f"register_built_graph: {what} needs dims, strides and a torch-representable data type")
    return TensorSpec(tuple(tensor.dim), tuple(tensor.stride), dtype)


@dataclasses.dataclass(frozen=True)
class BackwardOperand:
    """A tensor a backward takes from its forward call, named instead of computed: the
    gradient of a forward output, a forward input, or a forward output.

    * As the operands of one backward graph (``register_graph(..., backward=...,
      backward_operands=[...])``): the op's autograd node assembles them in C++, so
      when a native plan serves the backward graph it runs with no Python. A gradient
      autograd did not give is zeros like its output; a gradient is then made
      contiguous, or given the strides of the forward output ``strides_of_output``
      names (for a backward graph built for the output's layout, as the sdpa
      backward is). The outputs whose gradient is not among them are marked
      non-differentiable.
    * As what a backward function reads (``register_graph(..., backward_fn=...,
      backward_reads=[...])``, inputs and outputs only): the node saves just those
      (Note [What a node saves] in csrc/op/autograd_kernels.cpp), and the function gets
      None for the others. ``for_grads`` narrows it further: the tensor is saved only
      when one of those forward inputs needs a gradient (``input(0, for_grads=[1])``:
      ``x`` is read only to compute ``dW``).
    """

    source: int  # 0: gradient of output `index`, 1: input `index`, 2: output `index`
    index: int
    strides_of_output: int = -1
    for_grads: Tuple[int, ...] = ()

    @classmethod
    def grad(cls, output: int, *, strides_of_output: Optional[int] = None) -> "BackwardOperand":
        return cls(0, int(output), -1 if strides_of_output is None else int(strides_of_output))

    @classmethod
    def input(cls, index: int, *, for_grads: Sequence[int] = ()) -> "BackwardOperand":
        return cls(1, int(index), for_grads=tuple(int(i) for i in for_grads))

    @classmethod
    def output(cls, index: int, *, for_grads: Sequence[int] = ()) -> "BackwardOperand":
        return cls(2, int(index), for_grads=tuple(int(i) for i in for_grads))

    def describe(self) -> str:
        what = ("grad", "input", "output")[self.source]
        like = f", strides_of_output={self.strides_of_output}" if self.strides_of_output >= 0 else ""
        only = f", for_grads={list(self.for_grads)}" if self.for_grads else ""
        return f"BackwardOperand.{what}({self.index}{like}{only})"
