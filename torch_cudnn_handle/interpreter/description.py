"""What the interpreter reads of a frontend graph description.

Everything here goes through the description's public surface: ``graph.nodes`` (in the
order the builder added them, which is a topological order: a node can only take tensors
that exist), each node's ``node_type``, ``inputs``/``outputs`` by port and ``params``,
and each ``cudnn.Tensor``'s dataclass fields (dim, stride, data_type, is_virtual,
is_pass_by_value, pass_by_value, ragged_offset, ...). The tensors are collected from the
nodes rather than from ``graph.tensors``, which leaves out tensors whose names are
ambiguous (duplicate labels are legal). Nothing private of the frontend is read.

Also here: the one way the interpreter refuses what it does not know
(``refuse``: a ``NotImplementedError`` naming the node, its type and the attribute), and
the enum spelling it compares against (an enum's ``name``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List

import torch

from ..registry.specs import torch_dtype_of


class Refused(NotImplementedError):
    """A node (or a part of one) the interpreter has no exact semantics for."""


def node_kind(node) -> str:
    return getattr(node.node_type, "name", str(node.node_type))


def refuse(node, attribute: str, value: Any = None, why: str = "") -> "Refused":
    """The error for a node type, mode or attribute the interpreter does not implement.
    Returned (not raised) so call sites read ``raise refuse(...)``."""
    shown = "" if value is None else f" = {enum_name(value) if hasattr(value, 'name') else value!r}"
    reason = f": {why}" if why else ""
    return Refused(f"interpreter: node {node.name!r} ({node_kind(node)}) attribute {attribute!r}{shown} is not supported{reason}")


def enum_name(value: Any) -> Any:
    """An enum's member name (``norm_forward_phase.TRAINING`` -> ``"TRAINING"``); other values as they are."""
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else value


def check_params(node, known: Iterable[str]) -> None:
    """Refuse a node that carries a parameter its handler does not interpret (a None is unset)."""
    known = set(known)
    for key, value in node.params.items():
        if key not in known and value is not None:
            raise refuse(node, key, value)


def port(node, name: str, required: bool = True):
    """The tensor on input port ``name`` (None when optional and absent)."""
    tensor = node.inputs.get(name)
    if tensor is None and required:
        raise ValueError(f"interpreter: node {node.name!r} ({node_kind(node)}) has no {name!r} input")
    return tensor


def graph_nodes(graph) -> list:
    return list(graph.nodes)


def all_tensors(graph) -> Dict[int, Any]:
    """Every tensor the nodes touch (and their ragged offsets), by uid."""
    found: Dict[int, Any] = {}
    for node in graph_nodes(graph):
        for tensor in (*node.inputs.values(), *node.outputs.values()):
            while tensor is not None and tensor.uid not in found:  # the tensor, then its ragged offset (no recursive closure: no cycle per call)
                found[tensor.uid] = tensor
                tensor = tensor.ragged_offset
    return found


def produced_uids(graph) -> set:
    return {t.uid for node in graph_nodes(graph) for t in node.outputs.values() if t is not None}


def graph_inputs(graph) -> List[Any]:
    """The tensors no node produces (op inputs, pass-by-value scalars, ragged offsets), by uid order."""
    produced = produced_uids(graph)
    return [t for uid, t in sorted(all_tensors(graph).items()) if uid not in produced]


def graph_outputs(graph) -> List[Any]:
    """The non-virtual tensors some node produces, by uid order."""
    produced = produced_uids(graph)
    return [t for uid, t in sorted(all_tensors(graph).items()) if uid in produced and not t.is_virtual]


def torch_dtype(tensor) -> torch.dtype:
    """The torch dtype of a described tensor (either spelling of its data type)."""
    dtype = torch_dtype_of(tensor.data_type)
    if dtype is None:
        raise Refused(f"interpreter: tensor {tensor.name!r} has data type {tensor.data_type}, which torch has no dtype for")
    return dtype


def is_integer_data_type(data_type) -> bool:
    """An integer (or boolean) cudnn data type, e.g. a node's INT32 compute type."""
    if data_type is None:
        return False
    dtype = torch_dtype_of(data_type)
    return dtype is not None and not dtype.is_floating_point


def dims(tensor) -> List[int]:
    if not tensor.dim:
        raise ValueError(
            f"interpreter: tensor {tensor.name!r} has no dims; validate() the description first (its shape inference fills them)"
        )
    return [int(d) for d in tensor.dim]


def strides(tensor) -> List[int]:
    if not tensor.stride:
        raise ValueError(f"interpreter: tensor {tensor.name!r} has no strides; validate() the description first")
    return [int(s) for s in tensor.stride]
