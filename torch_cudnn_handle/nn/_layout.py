"""Output layouts for graph builders.

A builder's outputs are allocated by the op from the layout its *description*
reports (``registry._describe``: shape inference, before any build), and the GPU
build later runs with whatever layout the backend settles on. The frontend never
overwrites a dim or stride the builder set itself (``_sync_ir_shapes_from_backend``
skips user-assigned ones), so every builder here declares each output's dims,
strides and data type explicitly: the buffers the op allocates are then, by
construction, the layout cuDNN writes, on a GPU and in the fake kernel alike.
"""

from __future__ import annotations

from typing import List, Sequence

from ..registry.output_strides import row_major

__all__ = ["row_major", "like_layout", "declare", "split_heads", "merge_heads", "matrix_rows", "matrix_rows_transposed"]


def like_layout(dim: Sequence[int], like_stride: Sequence[int]) -> List[int]:
    """Packed strides of ``dim`` in the dimension order of ``like_stride``.

    The frontend's own sdpa op gives O (and dQ/dK/dV) the layout of Q (of Q/K/V):
    an attention that reads BSHD-strided inputs then writes BSHD-strided outputs,
    which the projections around it consume without a copy. A broadcast input
    (a zero stride) has no order to follow: packed row-major then, as there.
    """
    if 0 in like_stride:
        return row_major(dim)
    order = sorted(range(len(dim)), key=lambda axis: like_stride[axis])  # innermost first; stable on ties
    stride, acc = [0] * len(dim), 1
    for axis in order:
        stride[axis] = acc
        acc *= max(int(dim[axis]), 1)
    return stride


def declare(tensor, dim: Sequence[int], stride: Sequence[int], data_type):
    """Set an output's dims, strides and data type (see the module docstring)."""
    return tensor.set_dim([int(d) for d in dim]).set_stride([int(s) for s in stride]).set_data_type(data_type)


def split_heads(t, heads: int):
    """``[B, S, H*D]`` as ``[B, H, S, D]``: a view, BSHD in memory (what attention reads)."""
    b, s, width = t.shape
    return t.view(b, s, heads, width // heads).transpose(1, 2)


def merge_heads(o):
    """``[B, H, S, D]`` back to ``[B, S, H*D]`` (a view when ``o`` is BSHD in memory)."""
    b, h, s, d = o.shape
    return o.transpose(1, 2).reshape(b, s, h * d)


def matrix_rows(t):
    """``[..., C]`` as ``[1, rows, C]`` (a view of the same memory): a matmul's operand."""
    return t.reshape(1, -1, t.shape[-1])


def matrix_rows_transposed(t):
    """``[..., C]`` as ``[1, C, rows]`` (the transposed view: a weight gradient's left operand)."""
    return t.reshape(1, -1, t.shape[-1]).mT
