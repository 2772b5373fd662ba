"""Broadcast inputs of pointwise-only graphs: found in a description, described at their
full shape, and materialized by the op per call (Note [Pointwise broadcasts]).

Note [Pointwise broadcasts]: on the H200 (cuDNN 9.19, frontend 1.32) graphs of pointwise
nodes alone compute some broadcasts wrong, through the frontend's own execute as through
the op. The grid of test/op/test_pointwise_broadcasts_gpu.py (49 patterns, 3-D and 4-D,
fp16/bf16/fp32; run 2026-12-02) found 12-13 of 49 wrong as written: an operand ``[1, 1,
96]`` or ``[1, 64, 1]`` broadcast into ``[4, 64, 96]`` (off by 1.5 up to inf), and a
virtual intermediate ``s * t`` of ``[1, 1, 96]`` broadcast into ``+ x`` (nan, inf or
7e18); ``[4, 1, 96]``, ``[1, 64, 96]``, ``[4, 64, 1]`` and ``[1, 1, 1]`` came out right,
and 4-D row-major pointwise graphs were refused by cuDNN ("no engine") either way. Every
operand at the full shape is exact in all of them, and a broadcast operand of a pointwise
node fused after a matmul (a bias ``[1, 1, N]``: FusedLinear) is measured right.

So in a graph whose nodes are all POINTWISE, a broadcast is never left to cuDNN:

  * an op input that broadcasts (a dim of size 1 where the output of a node reading it is
    larger), of that output's rank, read only by nodes of that one output shape, is
    described at that shape, row-major; the op materializes it per call:
    ``input.expand(shape).contiguous()``, torch ops on the current stream (capturable, no
    host sync);
  * if a broadcast remains (a virtual intermediate that broadcasts into a later node, or
    an input read at two output shapes) and every output of the graph has one shape F to
    which each op input expands, every op input is described and materialized at F: a
    pointwise graph computes the same values at full shape, its intermediates included;
  * otherwise the description is refused with the node, the shapes and the fix (expand the
    operand before the call, or split the graph), never run.

Host scalars (pass-by-value) are left alone; graphs with packed (ragged) or natural
operands (OperandViews) are never passed here, their descriptions map the call's specs
otherwise; an input written in place never broadcasts (in_place.py). Broadcasts between
tensors of different rank are left as written.

Why materialize rather than refuse: the graph is the user's, correct as written, and torch
broadcasts the same expression; refusing would make every caller write the expand
themselves. Materializing costs one copy of each small operand per call (the size of the
output, in the input's dtype) and gives the full-shape graph's values, the case measured
exact.

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


def _broadcasts(dims, out) -> bool:
    return len(dims) == len(out) and any(d == 1 and o > 1 for d, o in zip(dims, out))


def _expands_to(shape, full) -> bool:
    return len(shape) == len(full) and all(d in (1, f) for d, f in zip(shape, full))


def broadcast_inputs(graph, graph_inputs: Sequence, specs: Sequence[TensorSpec], name: str = "") -> Materialized:
    """The op inputs of the validated description ``graph`` to materialize, with their full
    shapes (the rule of Note [Pointwise broadcasts]); () when there is none. Raises
    ValueError for a broadcast the rule cannot take from cuDNN. ``graph_inputs``: the graph
    tensor of each op input, in op order; ``specs``: the call's; ``name``: the graph's."""
    nodes = list(graph.nodes)
    if not nodes or any(_kind(node) != "POINTWISE" for node in nodes):
        return ()
    index_of = {tensor.uid: i for i, tensor in enumerate(graph_inputs)}
    reads = []  # (node, op input index or None for a virtual tensor, its dims, the node's output shape)
    for node in nodes:
        outputs = [t for t in node.outputs.values() if t is not None and t.dim]
        if len(outputs) != 1:
            continue
        out = tuple(int(n) for n in outputs[0].dim)
        for tensor in node.inputs.values():
            if tensor is not None and tensor.dim:
                i = index_of.get(tensor.uid)
                if i is None or not specs[i].host:
                    reads.append((node, i, tuple(int(n) for n in tensor.dim), out))
    shapes: Dict[int, List[Tuple[int, ...]]] = {}  # op input -> the output shape of each node reading it
    for _, i, _, out in reads:
        if i is not None:
            shapes.setdefault(i, []).append(out)
    broadcast_reads = [read for read in reads if _broadcasts(read[2], read[3])]
    broadcasting = sorted({i for _, i, _, _ in broadcast_reads if i is not None})
    direct = tuple((i, shapes[i][0]) for i in broadcasting if len(set(shapes[i])) == 1)
    covered = {i for i, _ in direct}
    left = [(node, i, dims, out) for node, i, dims, out in broadcast_reads if i is None or i not in covered]
    if not left:
        return direct
    finals = {tuple(int(n) for n in t.dim) for node in nodes for t in node.outputs.values() if t is not None and not t.is_virtual}
    if len(finals) == 1:
        (full,) = finals
        widened = tuple((i, full) for i, spec in enumerate(specs) if not spec.host and tuple(spec.shape) != full)
        if widened and all(spec.host or _expands_to(spec.shape, full) for spec in specs):
            return widened
    node, i, dims, out = left[0]
    what = "an intermediate" if i is None else f"input {i}"
    raise ValueError(
        f"graph {name!r}: {what} of shape {list(dims)} broadcasts into node {node.name!r} (output {list(out)}) in a graph of "
        f"pointwise nodes only, which cuDNN computes wrong for some shapes (Note [Pointwise broadcasts]); the op cannot describe "
        f"it at full shape (the graph's outputs have shapes {sorted(map(list, finals))}, its inputs {[list(t.shape) for t in specs]}). Expand the operand to "
        f"{list(out)} before the call (tensor.expand(...).contiguous()) or split the graph where the shapes differ")


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
