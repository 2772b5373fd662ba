"""The strides cuDNN gives an output its builder declared none for, without a GPU.

The frontend's description infers an undeclared output's dims, but its strides only
provisionally (row-major); the real ones come from the backend's layout inference at
build time (``pygraph._sync_ir_shapes_from_backend``), which needs libcudnn and a GPU.
The fake kernel must report, on a machine with neither, the layout the build writes, so
this applies the rule of the frontend's C++ nodes (``infer_properties_node``) to the
description, for the nodes whose rule follows their input's layout:

  * a pointwise output takes the strides of its first input of the same dims, a norm's
    output those of its input (same dims);
  * a convolution's output (fprop, dgrad, wgrad) is channels-last whatever its inputs'
    layout: measured on the H200 (frontend 1.32, cuDNN 9.19), an NCHW convolution
    writes NHWC too;
  * otherwise a norm's statistics' and a reduction's output (and a pointwise one with
    no input of its dims) take the stride order of the node's first input
    (``generate_stride_order_preserving_format`` then ``generate_stride``).

Every other node (matmul: row-major; attention, rope, ...) keeps the description's
own inference. A stride order lists each dim's rank, fastest (smallest stride) first;
a tie keeps dim order (the C++ sorts a handful of dims by insertion, which is stable).
An output of more dims than the input ranks the extra dims after the input's, as the
C++ pads.

Declared strides (``set_stride``) are never touched: they are the builder's contract.
The build remains the authority (build.py allocates an undeclared output as the built
graph lays it out, and warns when this prediction missed); this is what lets a trace
agree with it.
"""

from __future__ import annotations

from typing import Dict, List, Sequence


def stride_order_of(stride: Sequence[int], ndim: int) -> List[int]:
    """Each dim's rank by stride, smallest first (ties in dim order), padded to ``ndim``."""
    by_speed = sorted(range(len(stride)), key=lambda i: stride[i])
    order = [0] * len(stride)
    for rank, dim in enumerate(by_speed):
        order[dim] = rank
    return order[:ndim] + list(range(len(order), ndim))


def dense_strides(dims: Sequence[int], order: Sequence[int]) -> List[int]:
    """Dense strides for ``dims`` laid out fastest-first in ``order``."""
    strides, step = [0] * len(dims), 1
    for _, dim in sorted((rank, dim) for dim, rank in enumerate(order)):
        strides[dim] = step
        step *= dims[dim]
    return strides


def row_major(dims: Sequence[int]) -> List[int]:
    """Packed strides of ``dims``, the last dimension innermost (a size-0 dim counted as 1)."""
    return dense_strides([max(int(d), 1) for d in dims], [len(dims) - 1 - i for i in range(len(dims))])


def channels_last_order(ndim: int) -> List[int]:
    """The stride order of channels-last (NHWC, NDHWC): channels fastest, then the
    spatial dims innermost first, the batch slowest."""
    order = [0] * ndim
    order[1] = 0
    for rank, dim in enumerate(range(ndim - 1, 1, -1), start=1):
        order[dim] = rank
    order[0] = ndim - 1
    return order


def _node_kind(node) -> str:
    return getattr(getattr(node, "node_type", None), "name", "")


def _follows_its_input(kind: str) -> bool:
    """Nodes whose undeclared outputs take their first input's layout (see above)."""
    return kind == "POINTWISE" or kind.startswith("CONV_") or "NORM" in kind or kind == "REDUCTION"


def undeclared_output_strides(graph) -> Dict[int, List[int]]:
    """``{id(tensor): strides}`` for every node output of the validated description
    ``graph`` whose strides the builder did not declare, in node order, so an output
    computed from another node's undeclared output sees that one's strides first."""
    inferred: Dict[int, List[int]] = {}

    def stride_of(tensor) -> List[int]:
        return inferred.get(id(tensor), list(tensor.stride or ()))

    for node in graph._nodes:  # the description's nodes, topologically ordered (validate() walks them so)
        kind = _node_kind(node)
        inputs = [t for t in node.inputs.values() if t is not None and t.dim and not t.is_pass_by_value]
        if not _follows_its_input(kind) or not inputs:
            continue
        for output in node.outputs.values():
            if output is None or output.stride_assigned or not output.dim:
                continue
            dims = list(output.dim)
            if kind.startswith("CONV_"):
                inferred[id(output)] = dense_strides(dims, channels_last_order(len(dims)))
                continue
            candidates = inputs if kind == "POINTWISE" else inputs[:1]
            same_dims = next((t for t in candidates if list(t.dim) == dims), None)
            if same_dims is not None:
                inferred[id(output)] = stride_of(same_dims)
            else:
                inferred[id(output)] = dense_strides(dims, stride_order_of(stride_of(inputs[0]), len(dims)))
    return inferred
