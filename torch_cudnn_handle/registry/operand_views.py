"""Natural operands: how the op's torch tensors map to the tensors a builder describes.

A cuDNN node often wants another shape than the tensor a model holds: the norms take
``[rows, C, 1, 1]`` where a model has ``[B, S, C]``, a matmul ``[1, K, N]`` where
``nn.Linear`` keeps ``[N, K]``. Viewing in the model records a view node per operand
under autograd, each step. A graph that declares ``OperandViews`` instead takes the
natural tensors: each input is described (and built) as the view its function makes of
it, a view of the same memory starting at the same address, so a call binds the tensor
it was given as it is; each output is allocated in the natural shape the declaration
gives, a view of the layout the builder declared. Nothing here runs per call: the
views are taken on meta tensors when a layout is described, and the op, its native
plans and its fake kernel all see natural shapes only.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple

import torch

from .specs import TensorSpec

__all__ = ["OperandViews", "described_specs", "natural_outputs"]


@dataclasses.dataclass(frozen=True)
class OperandViews:
    """``inputs``: per op input, a function from the tensor (a meta tensor of the call's
    layout) to the view of it the builder gets (``lambda x: x.reshape(-1, x.shape[-1], 1, 1)``),
    or None to describe it as it is. ``outputs``: ``fn(*input_shapes)`` giving each output's
    natural shape (None: the shape the builder declared)."""

    inputs: Tuple[Optional[Callable[[torch.Tensor], torch.Tensor]], ...]
    outputs: Optional[Callable[..., Sequence[Optional[Sequence[int]]]]] = None

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not all(fn is None or callable(fn) for fn in self.inputs) or not (self.outputs is None or callable(self.outputs)):
            raise TypeError("OperandViews: inputs must be functions (tensor -> view) or None, outputs a function (*input_shapes) -> shapes")


def _meta(spec: TensorSpec) -> torch.Tensor:
    return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device="meta")


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Not ``_base``: that is autograd's view tracking, off inside the op's kernels.
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def described_specs(name: str, views: Optional[OperandViews], specs: Sequence[TensorSpec]) -> Tuple[TensorSpec, ...]:
    """The specs the builder describes its inputs with: each input's declared view."""
    if views is None:
        return tuple(specs)
    if len(views.inputs) != len(specs):
        raise ValueError(f"graph {name!r}: its OperandViews names {len(views.inputs)} inputs, but the call has {len(specs)}")
    described = []
    for i, (fn, spec) in enumerate(zip(views.inputs, specs)):
        if fn is None or spec.host:
            described.append(spec)
            continue
        tensor = _meta(spec)
        try:
            view = fn(tensor)
        except RuntimeError as error:
            raise ValueError(
                f"graph {name!r}: input {i} ({spec.describe()}) has no view its OperandViews can take ({error}); "
                "pass a tensor that view applies to (e.g. .contiguous())"
            ) from None
        if not isinstance(view, torch.Tensor) or not _same_storage(view, tensor):
            raise ValueError(
                f"graph {name!r}: OperandViews.inputs[{i}] must return a view of its argument (view, reshape, mT, ...), "
                f"not a copy; for input {i} ({spec.describe()}) it copies: pass that input .contiguous()"
            )
        if view.storage_offset() != tensor.storage_offset():
            raise ValueError(
                f"graph {name!r}: OperandViews.inputs[{i}] returned a view that starts elsewhere than the tensor; the op "
                "binds the tensor's own address, so the view must start where it does"
            )
        described.append(TensorSpec(tuple(view.shape), tuple(view.stride()), spec.dtype, spec.host))
    return tuple(described)


def natural_outputs(name: str, views: Optional[OperandViews], specs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> Tuple[TensorSpec, ...]:
    """The outputs as the op allocates them: each the view, in its natural shape, of the
    layout the builder declared (``outputs``, the graph's own specs)."""
    if views is None or views.outputs is None:
        return tuple(outputs)
    shapes = list(views.outputs(*[s.shape for s in specs]))
    if len(shapes) != len(outputs):
        raise ValueError(f"graph {name!r}: its OperandViews gives {len(shapes)} output shapes for {len(outputs)} outputs")
    natural = []
    for i, (shape, spec) in enumerate(zip(shapes, outputs)):
        if shape is None:
            natural.append(spec)
            continue
        try:
            view = _meta(spec).view([int(n) for n in shape])
        except RuntimeError as error:
            raise ValueError(
                f"graph {name!r}: output {i} is {spec.describe()} in the graph, which has no view of shape {list(shape)} "
                f"({error}); give OperandViews.outputs a shape of as many elements, in that memory order"
            ) from None
        natural.append(TensorSpec(tuple(view.shape), tuple(view.stride()), spec.dtype, spec.host))
    return tuple(natural)
