"""The registry's value types: operand specs, output layouts, declared backward operands,
and the dtypes a graph takes (read from the frontend's table, never copied).

All are frozen and hashable: a tuple of ``TensorSpec`` is part of the cache keys.
Shapes and strides are plain ints (never symbolic): a cuDNN graph is built for exact
shapes and strides.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import torch
from cudnn.datatypes import _cudnn_to_torch_data_type, torch_to_cudnn_data_type


# A packed (ragged) operand's token count in a spec: any; it is no part of a key (ragged.py).
TOKENS = -1

# torch's packed fp4 (``float4_e2m1fn_x2``) counts pairs where a cuDNN tensor counts
# elements, so a shape cannot cross unchanged: left out of the dtypes a graph takes.
_PACKED_DTYPES = frozenset(getattr(torch, name) for name in ("float4_e2m1fn_x2",) if hasattr(torch, name))

# The torch dtypes a graph's tensors may have: those the frontend's own table
# (cudnn.datatypes) maps to a cudnn.data_type, found by asking it about every dtype
# this torch has, so a dtype either side adds (fp8 e8m0, ...) needs no edit here.
_TORCH_DTYPES = tuple(
    dtype
    for dtype in dict.fromkeys(value for value in vars(torch).values() if isinstance(value, torch.dtype))
    if dtype not in _PACKED_DTYPES and torch_to_cudnn_data_type(dtype) is not None
)


def cudnn_data_type_of(data_type):
    """A ``cudnn.data_type`` for what the frontend accepts as one (a cudnn.data_type or a
    torch dtype: ``tensor.set_data_type(torch.float16)`` keeps the torch dtype in the
    description, so its ``data_type`` may be either); None for anything else."""
    if isinstance(data_type, torch.dtype):
        return None if data_type in _PACKED_DTYPES else torch_to_cudnn_data_type(data_type)
    return data_type


def torch_dtype_of(data_type) -> Optional[torch.dtype]:
    """The torch dtype of a graph tensor's data type (either spelling), through the
    frontend's table; None when torch has no dtype for it."""
    cudnn_type = cudnn_data_type_of(data_type)
    return None if cudnn_type is None else _cudnn_to_torch_data_type(cudnn_type)


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
    slot: a backward builder does, for a forward input with no gradient), and which
    layouts the builder declared."""

    outputs: Tuple[TensorSpec, ...]
    output_positions: Tuple[int, ...]
    # Per output, whether the builder declared its strides (a contract the build must
    # keep) or left them to cuDNN (the build's layout is what the op allocates).
    # Empty: all declared (a registered built graph).
    declared: Tuple[bool, ...] = ()
    # Per output, the op input whose token count a packed (ragged) output has, its
    # spec's first size being TOKENS; -1: not packed. Empty: none is (ragged.py).
    tokens_like: Tuple[int, ...] = ()

    def is_declared(self, index: int) -> bool:
        return not self.declared or self.declared[index]

    def outputs_for(self, input_shapes: Sequence[Sequence[int]]) -> Tuple[TensorSpec, ...]:
        """The output specs of a call whose inputs have ``input_shapes``: a packed output
        gets the token count of the input it is like."""
        if not any(i >= 0 for i in self.tokens_like):
            return self.outputs
        return tuple(
            spec if like < 0 else dataclasses.replace(spec, shape=(int(input_shapes[like][0]), *spec.shape[1:]))
            for spec, like in zip(self.outputs, self.tokens_like)
        )


def _spec_of_cudnn_tensor(tensor, what: str) -> TensorSpec:
    dtype = torch_dtype_of(tensor.data_type)
    if dtype is None or not tensor.dim:
        raise ValueError(f"register_built_graph: {what} needs dims, strides and a torch-representable data type")
    return TensorSpec(tuple(tensor.dim), tuple(tensor.stride), dtype, bool(tensor.is_pass_by_value))


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

    source: int  # 0: gradient of output `index`, 1: input `index`, 2: output `index`, 3: output `output` of step `index`
    index: int
    strides_of_output: int = -1
    for_grads: Tuple[int, ...] = ()
    step_output: int = 0  # source 3: which output of the step
    summed: bool = False  # as an input's gradient (backward_grads): summed to that input's shape

    @classmethod
    def grad(cls, output: int, *, strides_of_output: Optional[int] = None) -> "BackwardOperand":
        return cls(0, int(output), -1 if strides_of_output is None else int(strides_of_output))

    @classmethod
    def input(cls, index: int, *, for_grads: Sequence[int] = ()) -> "BackwardOperand":
        return cls(1, int(index), for_grads=tuple(int(i) for i in for_grads))

    @classmethod
    def output(cls, index: int, *, for_grads: Sequence[int] = ()) -> "BackwardOperand":
        return cls(2, int(index), for_grads=tuple(int(i) for i in for_grads))

    @classmethod
    def step(cls, step: int, output: int = 0) -> "BackwardOperand":
        """Output ``output`` of an earlier step of a declared backward of several graphs
        (``backward_steps``)."""
        return cls(3, int(step), step_output=int(output))

    def sum_to_input(self) -> "BackwardOperand":
        """As an input's gradient (``backward_grads``): summed to that input's shape, as
        autograd reduces the gradient of a broadcast input (a bias)."""
        if self.source not in (0, 3):
            raise ValueError(f"{self.describe()}: only a gradient or a step's output can be summed to an input's shape")
        return dataclasses.replace(self, summed=True)

    def describe(self) -> str:
        what = ("grad", "input", "output", "step")[self.source]
        like = f", strides_of_output={self.strides_of_output}" if self.strides_of_output >= 0 else ""
        only = f", for_grads={list(self.for_grads)}" if self.for_grads else ""
        output = f", {self.step_output}" if self.source == 3 else ""
        summed = ".sum_to_input()" if self.summed else ""
        return f"BackwardOperand.{what}({self.index}{output}{like}{only}){summed}"


@dataclasses.dataclass(frozen=True)
class BackwardStep:
    """One graph of a declared backward of several (``register_graph(...,
    backward_steps=[...], backward_grads=[...])``): a registered graph id, its operands
    (``BackwardOperand``\\ s, ``BackwardOperand.step(s, k)`` for an earlier step's
    output), and the forward inputs whose gradient needs it (empty: always)."""

    graph: int
    operands: Tuple[BackwardOperand, ...]
    for_grads: Tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "operands", tuple(self.operands))
        object.__setattr__(self, "for_grads", tuple(int(i) for i in self.for_grads))
        if not all(isinstance(o, BackwardOperand) for o in self.operands):
            raise TypeError("BackwardStep: operands must be BackwardOperand.grad(i) / .input(i) / .output(i) / .step(s, k)")
