"""Whether two tensors' memory overlaps: torch's rule for what an op may write.

``execute.out`` promises (in its schema) that it only reads its inputs, and ``execute_``
that it writes only the inputs it declares; a tensor written through one argument and
read through another breaks what torch.compile, autograd and the caller assume. Two
tensors overlap when they share a storage and their byte ranges meet (views that only
interleave count too: cuDNN may touch any byte in that range). Works on fake and meta
tensors, so a trace refuses what a real call would.
"""

from __future__ import annotations

import torch


def _int(value):
    """A plain int, or None for a symbolic value without a hint (then assume the worst)."""
    if isinstance(value, torch.SymInt):
        return value.node.hint
    return int(value)


def _byte_range(tensor: torch.Tensor):
    numbers = [_int(tensor.storage_offset()), *(_int(n) for n in tensor.shape), *(_int(s) for s in tensor.stride())]
    if any(n is None for n in numbers):
        return None
    offset, rank = numbers[0], tensor.dim()
    sizes, strides = numbers[1 : 1 + rank], numbers[1 + rank :]
    if any(n == 0 for n in sizes):
        return (0, 0)
    last = sum((n - 1) * s for n, s in zip(sizes, strides))
    size = tensor.element_size()
    return (offset * size, (offset + last + 1) * size)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not torch._C._is_alias_of(a, b):
        return False
    range_a, range_b = _byte_range(a), _byte_range(b)
    if range_a is None or range_b is None:
        return True
    return range_a[0] < range_b[1] and range_b[0] < range_a[1] and range_a[0] != range_a[1] and range_b[0] != range_b[1]
