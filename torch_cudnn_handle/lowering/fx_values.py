"""What a traced graph's nodes say (their fake values, arguments, static sizes), and the two
nodes a replacement inserts: the op's call and a ``contiguous()``."""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.fx

HALF = (torch.float16, torch.bfloat16)
ADD = ((operator.add, torch.add), ("add",))  # calls(node, *ADD): a sum as a trace records it
MUL = ((operator.mul, torch.mul), ("mul",))


def value(arg) -> Optional[torch.Tensor]:
    """The fake tensor dynamo recorded for a node argument, or None."""
    return arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None


def static(size) -> Optional[int]:
    """A size that does not vary: an int, or a symbolic one the trace's guards fixed (a hidden
    dim a weight's shape pins down); None for one that varies (dynamic shapes)."""
    if isinstance(size, torch.SymInt):
        return size.node.maybe_as_int()
    return size if isinstance(size, int) else None


def argument(node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def only_user(node) -> Optional[torch.fx.Node]:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def calls(node, functions=(), methods=()) -> bool:
    """``node`` calls one of ``functions`` (torch functions) or ``methods`` (tensor method names)."""
    if not isinstance(node, torch.fx.Node):
        return False
    return (node.op == "call_function" and node.target in functions) or (node.op == "call_method" and node.target in methods)


def other_operand(node, operand, binary):
    """``node`` is ``operand`` (either side) combined with something by ``binary`` (``ADD`` or
    ``MUL``): that something (a node or a constant), else None."""
    if not calls(node, *binary) or len(node.args) != 2 or operand not in node.args:
        return None
    return node.args[1] if node.args[0] is operand else node.args[0]


def execute(graph: torch.fx.Graph, before, graph_id: int, inputs: list, output: int = 0) -> torch.fx.Node:
    """``torch.ops.cudnn_fe.execute(graph_id, inputs)[output]`` inserted before ``before``, whose
    traced value it takes over (a later match reads it)."""
    with graph.inserting_before(before):
        call = graph.call_function(torch.ops.cudnn_fe.execute.default, (graph_id, inputs))
        result = graph.call_function(operator.getitem, (call, output))
    result.meta["example_value"] = before.meta.get("example_value")
    return result


def contiguous(graph: torch.fx.Graph, before, node: torch.fx.Node) -> torch.fx.Node:
    """``node.contiguous()``: the graphs take natural operands in row-major layout (a no-op when they are)."""
    with graph.inserting_before(before):
        result = graph.call_method("contiguous", (node,))
    result.meta["example_value"] = node.meta.get("example_value")
    return result
