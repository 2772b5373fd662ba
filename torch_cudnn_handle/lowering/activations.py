"""The activation a linear's output goes through, as the lowering reads it from a traced
graph: exact gelu, gelu's tanh approximation (torch's, or written out as GPT-2 writes it),
relu and silu, each with the node whose value is its result."""

from __future__ import annotations

import math
import operator
from typing import Optional, Tuple

import torch
import torch.fx
import torch.nn.functional as F
from torch import _C

from .fx_values import ADD, MUL, calls, only_user, other_operand

_FUNCTIONS = {torch.relu: "relu", F.relu: "relu", _C._nn.gelu: "gelu", F.gelu: "gelu", F.silu: "silu", _C._nn.silu: "silu"}
_METHODS = {"relu": "relu"}


def activation_of(x: torch.fx.Node) -> Optional[Tuple[str, torch.fx.Node]]:
    """``(name, result)`` when every use of ``x`` is one activation of it, else None."""
    user = only_user(x)
    name = _called(user, x) if user is not None else None
    if name is not None:
        return name, user
    result = _written_gelu_tanh(x)
    return None if result is None else ("gelu_tanh", result)


def _called(node, x) -> Optional[str]:
    """The activation ``node`` calls on ``x`` alone, not in place."""
    if calls(node, tuple(_FUNCTIONS)):
        name = _FUNCTIONS[node.target]
    elif calls(node, methods=tuple(_METHODS)):
        name = _METHODS[node.target]
    else:
        return None
    if not node.args or node.args[0] is not x:
        return None
    if any(arg is not False for arg in node.args[1:]) or node.kwargs.get("inplace", False) or set(node.kwargs) - {"approximate", "inplace"}:
        return None  # in place (relu(x, inplace=True), silu(x, True)): left alone
    approximate = node.kwargs.get("approximate", "none")
    if name == "gelu" and approximate == "tanh":
        return "gelu_tanh"
    return name if approximate == "none" else None


def _scaled(node, operand, constant: float) -> bool:
    """``node`` is ``constant * operand`` (either order)."""
    other = other_operand(node, operand, MUL)
    return isinstance(other, (int, float)) and math.isclose(other, constant, rel_tol=1e-6)


def _written_gelu_tanh(x) -> Optional[torch.fx.Node]:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x ** 3)))`` (GPT-2's ``gelu_new``,
    either order in each product and sum): its result node, or None."""
    users = list(x.users)
    if len(users) != 3:
        return None
    half = next((u for u in users if _scaled(u, x, 0.5)), None)
    cube = next((u for u in users if calls(u, (torch.pow, operator.pow), ("pow",)) and u.args[0] is x and u.args[1] == 3), None)
    inner = next((u for u in users if other_operand(u, x, ADD) is not None), None)
    if half is None or cube is None or inner is None:
        return None
    cubed = only_user(cube)
    if cubed is None or not _scaled(cubed, cube, 0.044715) or other_operand(inner, x, ADD) is not cubed:
        return None
    argument = only_user(inner)
    if argument is None or not _scaled(argument, inner, math.sqrt(2 / math.pi)):
        return None
    tanh = only_user(argument)
    if not calls(tanh, (torch.tanh,), ("tanh",)):
        return None
    one_plus = only_user(tanh)
    one = other_operand(one_plus, tanh, ADD)
    if not isinstance(one, (int, float)) or one != 1:
        return None
    result = only_user(one_plus)
    if only_user(half) is not result or other_operand(result, half, MUL) is not one_plus:
        return None
    return result
