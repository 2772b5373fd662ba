"""Broadcast inputs of pointwise-only graphs: found in a description, described at their
full shape, and materialized by the op per call (Note [Pointwise broadcasts]).

Note [Pointwise broadcasts]: on the H200 (cuDNN 9.19 and 9.27, frontend 1.32) the graph
of pointwise nodes alone ``x * s + y``, ``x, y`` ``[4, 64, 96]`` and ``s`` ``[1, 1, 96]``
(broadcast over the leading dims), returned results off by up to 13.7 (fp16), 55.9 (bf16)
and 16.7 (fp32), through the frontend's own execute as through the op; with ``s`` at the
full shape it is exact. A broadcast operand of a pointwise node fused after a matmul (a
bias ``[1, 1, N]``: FusedLinear) is measured right. So in a graph whose nodes are all
POINTWISE, an op input that broadcasts (a dim of size 1 where the output of a node
reading it is larger) is described at that node's output shape, row-major, and the op
materializes it per call: ``input.expand(shape).contiguous()``, torch ops on the current
stream (capturable, no host sync). cuDNN then reads full-shape operands only, the case
measured exact.

Why materialize rather than refuse at build: the graph is the user's, correct as written,
and torch broadcasts the same expression; refusing would make every caller write the
expand themselves, and a refusal is only as good as the pattern list behind it, which
without a GPU here is one measured case. Materializing costs one copy of the small operand
per call (the size of the output, in the input's dtype) and never gives a wrong value the
full-shape graph would not. It is applied where it is sure to keep the graph's meaning:

  * every node is POINTWISE (a matmul, conv, norm, sdpa, reduction or structural node
    anywhere: the rule does not apply);
  * the input is an op input of the same rank as the node output it broadcasts to, every
    node that reads it has that output shape (so no node's output changes), and it is not
    a host scalar (pass-by-value);
  * the graph has no packed (ragged) operands and no natural operands (OperandViews),
    whose description maps the call's specs otherwise. (An input written in place never
    broadcasts: it has its output's layout, in_place.py.)

Not covered (left as the builder wrote them): a virtual intermediate that broadcasts into
a later node, broadcasts of other rank. test/op/test_pointwise_broadcasts_gpu.py measures
a grid of patterns on the GPU, these included, and reports which cuDNN gets wrong.

Where it acts: ``describe`` (describe.py) describes the graph again at the full shapes and
the layout carries the pairs (``GraphLayout.materialized``); the build builds, keys the
plan store, times and hands over the native plan for the materialized specs (build.py).
A native plan matches exact input layouts, so a call with the small tensor never runs on
it directly: it reaches the Python path, which materializes it and then runs the native
plan (or the frontend) on the full-shape tensor. The interpreter reads the description,
so it gets the materialized tensor too (op/reference.py).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .output_strides import row_major
from .specs import TensorSpec

__all__ = ["Materialized", "broadcast_inputs", "materialized_specs", "materialize"]

Materialized = Tuple[Tuple[int, Tuple[int, ...]], ...]  # (op input, the full shape it is described and bound at)


def _kind(node) -> str:
    return getattr(node.node_type, "name", str(node.node_type))


def broadcast_inputs(graph, graph_inputs: Sequence, specs: Sequence[TensorSpec]) -> Materialized:
    """The op inputs of the validated description ``graph`` to materialize, with their full
    shapes (the rule of Note [Pointwise broadcasts]); () when there is none.
    ``graph_inputs``: the graph tensor of each op input, in op order; ``specs``: the call's.
    (A graph with packed or natural operands is never passed here: describe.py.)"""
    nodes = list(graph.nodes)
    if not nodes or any(_kind(node) != "POINTWISE" for node in nodes):
        return ()
    index_of = {tensor.uid: i for i, tensor in enumerate(graph_inputs)}
    shapes: Dict[int, List[Tuple[int, ...]]] = {}  # op input -> the output shape of each node reading it
    broadcasts: Dict[int, bool] = {}
    for node in nodes:
        outputs = [t for t in node.outputs.values() if t is not None and t.dim]
        if len(outputs) != 1:
            continue
        out = tuple(int(n) for n in outputs[0].dim)
        for tensor in node.inputs.values():
            i = None if tensor is None else index_of.get(tensor.uid)
            if i is None:
                continue
            shapes.setdefault(i, []).append(out)
            dims = tuple(int(n) for n in tensor.dim)
            if len(dims) == len(out) and any(d == 1 and o > 1 for d, o in zip(dims, out)):
                broadcasts[i] = True
    found = []
    for i in sorted(broadcasts):
        if specs[i].host or len(set(shapes[i])) != 1:
            continue
        found.append((i, shapes[i][0]))
    return tuple(found)


def materialized_specs(specs: Sequence[TensorSpec], plan: Materialized) -> Tuple[TensorSpec, ...]:
    """``specs`` with each materialized input at its full shape, row-major."""
    out = list(specs)
    for i, shape in plan:
        out[i] = TensorSpec(tuple(shape), tuple(row_major(shape)), specs[i].dtype, False)
    return tuple(out)


def materialize(inputs: Sequence[torch.Tensor], plan: Optional[Materialized]) -> Sequence[torch.Tensor]:
    """The call's inputs with each one of ``plan`` expanded to its full shape and made
    contiguous (torch ops on the current stream); ``inputs`` itself when ``plan`` is empty."""
    if not plan:
        return inputs
    out = list(inputs)
    for i, shape in plan:
        out[i] = out[i].expand(shape).contiguous()
    return out
