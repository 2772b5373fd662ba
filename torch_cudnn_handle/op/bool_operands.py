"""torch.bool operands of a graph: one byte per element in torch, one bit in cuDNN.

Note [Bit-packed booleans]: cuDNN reads and writes a ``BOOLEAN`` tensor bit-packed,
eight elements per byte, least significant bit first, element ``i`` at the bit of its
memory offset (``sum(index * stride)``). Measured on the H200 (cuDNN 9.19) with
upstream's batchnorm relu mask (an output: the first ``n/8`` bytes written, the rest
of a torch.bool buffer left as it was) and its drelu mask (an input: a one-byte-per-
element torch mask read as bits, so half the elements came out wrong). The frontend
passes a torch.bool tensor's pointer as it is, so its own ``execute`` has both
problems. The op keeps torch's meaning instead: a bool input is packed into a scratch
buffer before the graph runs, a bool output is written packed into scratch and unpacked
into the tensor the op returns (or the ``out`` it was given), all on the current stream
with torch ops, so a CUDA-graph capture records them too. Such graphs run on the Python
path (native/binding.py says so in ``path_reason``).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch._prims_common import compute_required_storage_length

from ..registry import is_host_scalar

__all__ = ["pack_call", "unpack_outputs"]


def _extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements from the first to one past the last a view addresses (torch's own rule)."""
    return compute_required_storage_length(tuple(shape), tuple(stride), 0)


def _shifts(device: torch.device) -> torch.Tensor:
    # Made per call, not cached: one made during a CUDA-graph capture would hold its
    # values only once the graph replays.
    return torch.arange(8, dtype=torch.uint8, device=device)


def _byte_buffer(shape: Sequence[int], stride: Sequence[int], device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bytes, view): zeroed scratch of at least the operand's extent in bytes (whole
    groups of 8), and a torch.bool view of it with the operand's shape and strides (what
    the frontend binds: only its pointer reaches cuDNN, which finds the bits in the first
    ``ceil(extent/8)`` bytes)."""
    extent = _extent(shape, stride)
    storage = torch.zeros(max(-(-extent // 8) * 8, 16), dtype=torch.uint8, device=device)
    return storage, storage.view(torch.bool).as_strided(shape, stride) if extent else storage.view(torch.bool)[:0].view(shape)


def packed_input(tensor: torch.Tensor) -> torch.Tensor:
    """A torch.bool CUDA tensor as cuDNN reads it: a view with its shape and strides over
    scratch that holds its elements as bits."""
    storage, view = _byte_buffer(tuple(tensor.shape), tuple(tensor.stride()), tensor.device)
    extent = _extent(tensor.shape, tensor.stride())
    if extent:
        spread = storage[: -(-extent // 8) * 8]
        spread.as_strided(tensor.shape, tensor.stride()).copy_(tensor)  # element -> a byte at its memory offset
        bits = torch.bitwise_left_shift(spread.view(-1, 8), _shifts(tensor.device)).sum(1, dtype=torch.uint8)
        storage[: bits.numel()].copy_(bits)  # the same scratch now holds the bits where cuDNN reads them
    return view


def packed_scratch(output: torch.Tensor) -> torch.Tensor:
    """Scratch for cuDNN to write a torch.bool output's bits into (a view like ``output``)."""
    return _byte_buffer(tuple(output.shape), tuple(output.stride()), output.device)[1]


def unpack_into(output: torch.Tensor, scratch: torch.Tensor) -> None:
    """Write the bits cuDNN left in ``scratch`` (from packed_scratch) into ``output``."""
    extent = _extent(output.shape, output.stride())
    if not extent:
        return
    raw = torch.as_strided(scratch, (-(-extent // 8),), (1,)).view(torch.uint8)
    spread = torch.bitwise_and(torch.bitwise_right_shift(raw.unsqueeze(1), _shifts(output.device)), 1).view(-1)
    output.copy_(spread.as_strided(output.shape, output.stride()).view(torch.bool))


def pack_call(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The call's operands as cuDNN takes them: bool inputs packed, bool outputs replaced
    by scratch (pass the result's second list to ``unpack_outputs`` after the launch)."""
    packed_in = [packed_input(t) if t.dtype == torch.bool and not is_host_scalar(t) else t for t in inputs]
    packed_out = [packed_scratch(t) if t.dtype == torch.bool else t for t in outputs]
    return packed_in, packed_out


def unpack_outputs(outputs: Sequence[torch.Tensor], launched: Sequence[torch.Tensor]) -> None:
    for output, written in zip(outputs, launched):
        if written is not output:
            unpack_into(output, written)
