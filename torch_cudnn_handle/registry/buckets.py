"""Size buckets: a registered graph that serves every size of one dimension from a plan per bucket.

Note [Size buckets]: a cuDNN graph is built for exact shapes, so a graph fed a new token
count (a linear's rows, a norm's rows) pays a build in the call: up to a second and a
half where cuDNN compiles its kernels at runtime. ``register_graph(f, buckets=Buckets(
inputs={0: 0}, outputs={0: 0}))`` says input 0's dim 0 may take any size: a call pads it
with zeros up to its bucket (``Buckets.size_for``: ``per_doubling`` sizes per power of
two from ``minimum``, so at most 1/per_doubling of a bucket is padding), runs the plan
built for the bucket, and returns the named outputs narrowed back to the call's size (a
view of the bucket's output). Several inputs may share the dim (they must agree on its
size); outputs not named keep their shape.

Padding is exact only for a graph whose outputs never read across the padded dim (rows
of a matmul's M, pointwise ops, a norm over the other dims) or read zeros there harmlessly
(a sum; a matmul's K, padded in both operands). So before a padded call first runs at a
layout (or is first traced), the op checks it (op/bucket_check.py): it runs the graph on
the torch interpreter, on the CPU, at 3 rows and at 3 rows padded to 8 with zeros (the
backward too, for a differentiable graph: autograd through the padding and the narrowing,
as the call differentiates it), and a graph whose outputs or gradients change, or whose
output shapes do not follow the declaration, is refused with the output that moved: a
softmax, a mean or exp summed over the padded dim. Once per layout of the other dims, for
the process. (The registry keeps the rule; the op, which pads, runs the check: the
registry never calls the op.)

Where: ``execute`` / ``execute_out`` (op/eager.py) pad and narrow in torch ops, so
autograd, torch.compile (dynamic=True: a compiled frame per bucket, as ``size_for`` only
compares, and one more for a size equal to its bucket, whose narrowed output is
contiguous) and CUDA graphs see ordinary ops around the op; ``torch.ops.cudnn_fe.execute``
called directly runs the exact size. A bucket's plan gives bitwise-repeatable results for a given size; they
may differ from an exact plan's within the engines' numerics (another shape, maybe
another engine). Not with ``ragged=`` (already any length), ``views=`` or ``in_place=``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Optional, Sequence, Tuple

import torch


__all__ = ["Buckets", "bucket_size", "declared", "padded", "narrowed"]

def _index_map(what: str, mapping) -> Tuple[Tuple[int, int], ...]:
    if not isinstance(mapping, Mapping) or not all(
        isinstance(k, int) and not isinstance(k, bool) and k >= 0 and isinstance(v, int) and not isinstance(v, bool)
        for k, v in mapping.items()
    ):
        raise TypeError(f"Buckets: {what} must map {what[:-1]} indices (ints >= 0) to dims (ints), got {mapping!r}")
    return tuple(sorted(mapping.items()))


@dataclasses.dataclass(frozen=True)
class Buckets:
    """``inputs``: {op input: dim} that take any size, all the same in one call;
    ``outputs``: {output: dim} that follow it (narrowed back); sizes are padded up to the
    next of ``per_doubling`` steps per power of two from ``minimum``."""

    inputs: Mapping[int, int]
    outputs: Mapping[int, int] = dataclasses.field(default_factory=dict)
    minimum: int = 64
    per_doubling: int = 4

    def __post_init__(self):
        object.__setattr__(self, "inputs", _index_map("inputs", self.inputs))
        object.__setattr__(self, "outputs", _index_map("outputs", self.outputs))
        if not self.inputs:
            raise ValueError("Buckets: inputs names no input; give {input_index: dim} for the inputs whose dim takes any size")
        for name, value, low in (("minimum", self.minimum, 1), ("per_doubling", self.per_doubling, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"Buckets: {name} must be an int >= {low}, got {value!r}")

    def size_for(self, size) -> int:
        """The bucket ``size`` is padded to."""
        return bucket_size(size, self.minimum, self.per_doubling)

    @property
    def rule(self) -> tuple:
        """``(inputs, outputs, minimum, per_doubling)``, plain tuples and ints: what ``padded``
        and ``narrowed`` take, and what a compiled frame holds as a constant."""
        return (self.inputs, self.outputs, self.minimum, self.per_doubling)


def bucket_size(size, minimum: int, per_doubling: int) -> int:
    """The bucket ``size`` is padded to: the next of ``per_doubling`` steps per power of two
    from ``minimum``. Comparisons only, so a symbolic size under torch.compile(dynamic=True)
    guards on its bucket's range, not on its value."""
    low = minimum
    if size <= low:
        return low
    while True:
        step = -(-low // per_doubling)
        for i in range(1, per_doubling + 1):
            bucket = min(low + i * step, 2 * low)
            if size <= bucket:
                return bucket
        low *= 2


def declared(name: str, buckets, num_inputs: Optional[int], *, ragged, views, in_place) -> Optional[Buckets]:
    """Check ``register_graph(..., buckets=)``; what the definition keeps."""
    if buckets is None:
        return None
    if not isinstance(buckets, Buckets):
        raise TypeError(f"register_graph({name!r}): buckets must be a Buckets(inputs={{input: dim}}, outputs={{output: dim}}), got {type(buckets).__name__}")
    for option, given in (("ragged", ragged), ("views", views), ("in_place", in_place)):
        if given:
            raise ValueError(
                f"register_graph({name!r}): buckets= cannot be combined with {option}= (the padded call would not be the one "
                f"{option} describes); drop one of them"
            )
    if num_inputs is not None and buckets.inputs[-1][0] >= num_inputs:
        raise ValueError(f"register_graph({name!r}): Buckets names input {buckets.inputs[-1][0]}, but the builder takes {num_inputs} inputs")
    return buckets


_eager_bucket_size = functools.lru_cache(maxsize=4096)(bucket_size)  # an eager call's: one dict lookup, not the ladder


def _call_size(name: str, bucketed: tuple, inputs: Sequence[torch.Tensor]) -> int:
    size = None
    for index, dim in bucketed:
        if index >= len(inputs):
            raise ValueError(f"cudnn_fe.execute: graph {name!r} buckets its input {index}, but got {len(inputs)} inputs")
        t = inputs[index]
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or not -t.dim() <= dim < t.dim():
            raise ValueError(f"cudnn_fe.execute: graph {name!r} buckets dim {dim} of input {index}, which has no such dim")
        if size is None:
            size = t.shape[dim]
        elif t.shape[dim] != size:
            raise ValueError(
                f"cudnn_fe.execute: graph {name!r} buckets dim {dim} of input {index} with dim {bucketed[0][1]} of input {bucketed[0][0]}, "
                f"but their sizes differ ({t.shape[dim]} and {size}); bucketed dims must have one size per call"
            )
    return size


def padded(name: str, rule: tuple, inputs: Sequence[torch.Tensor]) -> Tuple[list, int]:
    """The call's inputs with the bucketed dims zero-padded to their bucket (``rule``:
    ``Buckets.rule``), and the call's size."""
    bucketed, _, minimum, per_doubling = rule
    size = _call_size(name, bucketed, inputs)
    tracing = torch.compiler.is_compiling()
    bucket = (bucket_size if tracing else _eager_bucket_size)(size, minimum, per_doubling)
    inputs = list(inputs)
    if tracing or bucket != size:  # traced: no guard on the size being its bucket's
        for index, dim in bucketed:
            t = inputs[index]
            inputs[index] = torch.nn.functional.pad(t, [0, 0] * (t.dim() - 1 - dim % t.dim()) + [0, bucket - size])
    return inputs, size


def narrowed(rule: tuple, outputs: Sequence[torch.Tensor], size) -> list:
    """The outputs ``rule`` names narrowed back to the call's size (views); the others as they are."""
    outputs = list(outputs)
    for index, dim in rule[1]:
        if torch.compiler.is_compiling() or outputs[index].shape[dim] != size:
            outputs[index] = outputs[index].narrow(dim, 0, size)
    return outputs
