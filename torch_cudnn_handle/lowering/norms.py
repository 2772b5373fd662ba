"""RMSNorm and LayerNorm -> the ``nn`` norm modules' graphs (nn/norm.py): torch's ops
(``F.rms_norm``, ``F.layer_norm``, what ``nn.RMSNorm`` and ``nn.LayerNorm`` call) and RMSNorm
as models write it by hand (Llama's: ``w * (x32 * rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)``)."""

from __future__ import annotations

import operator
from typing import NamedTuple, Optional, Union

import torch
import torch.fx
import torch.nn.functional as F

from .fx_values import ADD, HALF, MUL, argument, calls, contiguous, execute, only_user, other_operand, static, value


def _affine_refusal(x, affine, size, eps) -> Optional[str]:
    """What keeps a norm of ``x`` over its last ``size`` entries, scaled (and shifted) by ``affine``, torch's."""
    if x is None:
        return "the input has no traced value"
    if any(t is None for t in affine):
        return "no weight or bias (the library's graph scales and shifts)"
    if size is None or static(x.shape[-1]) != size or any(t.dim() != 1 or static(t.shape[0]) != size for t in affine):
        return "the norm is not over the last dim alone, or its weight is not [dim]"
    if x.dtype not in HALF or any(t.dtype != x.dtype for t in affine):
        return f"dtypes {x.dtype} and {[t.dtype for t in affine]}: the graph takes float16 or bfloat16, one for all"
    if isinstance(eps, torch.fx.Node):
        return ("eps is an input of the traced graph, not a constant (torch.compile(dynamic=True) lifts a module's float "
                "attributes): the graph bakes eps in; torch._dynamo.config.specialize_float = True keeps it a constant")
    return None


def _replace(graph, last, graph_name: str, eps: float, x, affine) -> str:
    from ..nn import norm

    graph_id = getattr(norm, graph_name)(eps)
    last.replace_all_uses_with(execute(graph, last, graph_id, [contiguous(graph, last, x), *affine]))
    graph.erase_node(last)
    return f"lowered onto nn.{'RMSNorm' if graph_name == 'rmsnorm_graph' else 'LayerNorm'}'s graph, eps={eps:g}"


class TorchNorm:
    """``F.rms_norm(x, (C,), weight, eps)`` or ``F.layer_norm(x, (C,), weight, bias, eps)``."""

    def __init__(self, targets, inputs: tuple, eps_index: int, graph: str):
        self.targets, self._inputs, self._eps_index, self._graph = targets, inputs, eps_index, graph

    def _operands(self, node) -> list:
        return [argument(node, index, name) for index, name in self._inputs]

    def refusal(self, node) -> Optional[str]:
        x, *affine = (value(operand) for operand in self._operands(node))
        shape = tuple(argument(node, 1, "normalized_shape"))
        return _affine_refusal(x, affine, shape[0] if len(shape) == 1 else None, argument(node, self._eps_index, "eps"))

    def replace(self, graph, node) -> str:
        x, *affine = self._operands(node)
        eps = argument(node, self._eps_index, "eps")
        eps = torch.finfo(value(x).dtype).eps if eps is None else float(eps)  # torch's default for eps=None (rms_norm)
        return _replace(graph, node, self._graph, eps, x, affine)


RMS_NORM = TorchNorm((torch.rms_norm, F.rms_norm), ((0, "input"), (2, "weight")), 3, "rmsnorm_graph")
LAYER_NORM = TorchNorm((torch.layer_norm, F.layer_norm), ((0, "input"), (2, "weight"), (3, "bias")), 4, "layernorm_graph")


# -- RMSNorm written by hand ------------------------------------------------------


class _Written(NamedTuple):
    x: torch.fx.Node  # the half-precision input
    weight: torch.fx.Node
    eps: Union[float, torch.fx.Node]
    last: torch.fx.Node  # the node whose value is the norm's result


def _float32(node) -> bool:
    return calls(node, methods=("to", "float")) and (node.target == "float" or torch.float32 in (*node.args[1:], node.kwargs.get("dtype")))


def _downcast(node) -> bool:
    return calls(node, methods=("to", "type_as")) and len(node.args) == 2


def _mean_of_squares(node, x32) -> bool:
    """``x32.pow(2).mean(-1, keepdim=True)`` (or ``torch.pow``, ``x32 * x32``, ``torch.mean``)."""
    if not calls(node, (torch.mean,), ("mean",)):
        return False
    dim, keepdim = argument(node, 1, "dim"), argument(node, 2, "keepdim", False)
    if dim not in (-1, [-1], (-1,)) or not keepdim:
        return False
    square = node.args[0]
    if calls(square, (torch.pow, operator.pow), ("pow",)):
        return square.args[0] is x32 and square.args[1] == 2
    return other_operand(square, x32, MUL) is x32


def _weight_product(node, operand):
    """``node`` is ``operand * w`` (either order): ``w``, unwrapped from a ``.float()`` (the
    graph scales in float32 either way), or None."""
    weight = other_operand(node, operand, MUL)
    return weight.args[0] if _float32(weight) else weight


def _written_rms_norm(rsqrt) -> Optional[_Written]:
    """RMSNorm as models write it, matched from its ``rsqrt`` both ways: ``x32 = x.to(float32)``,
    ``rsqrt(mean(x32 ** 2, -1, keepdim=True) + eps)``, ``x32 * that``, then the weight and the
    cast back to x's dtype in either order (Llama's: cast, then ``w * ``; OLMo 2's: ``w * ``, then cast)."""
    add, scaled = rsqrt.args[0], only_user(rsqrt)
    x32 = other_operand(scaled, rsqrt, MUL)
    if not calls(add, *ADD) or len(add.args) != 2 or not _float32(x32) or not any(_mean_of_squares(term, x32) for term in add.args):
        return None
    eps = add.args[1] if _mean_of_squares(add.args[0], x32) else add.args[0]
    step = only_user(scaled)
    if _downcast(step):  # cast, then the weight
        product = only_user(step)
        weight = _weight_product(product, step) if product is not None else None
        return None if weight is None else _Written(x32.args[0], weight, eps, product)
    weight = _weight_product(step, scaled) if step is not None else None  # the weight, then cast
    cast = only_user(step) if weight is not None else None
    return _Written(x32.args[0], weight, eps, cast) if _downcast(cast) else None


class WrittenRMSNorm:
    """RMSNorm as a model writes it by hand (found from its ``rsqrt``)."""

    targets = (torch.rsqrt, "rsqrt")

    @staticmethod
    def refusal(node) -> Optional[str]:
        found = _written_rms_norm(node)
        if found is None:
            return ("an rsqrt, but not an RMSNorm form: x32 * rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps), then * weight and "
                    ".to(dtype) in either order")
        x, weight = value(found.x), value(found.weight)
        if x is not None and value(found.last) is not None and value(found.last).dtype != x.dtype:
            return "the result's dtype is not the input's"
        return _affine_refusal(x, [weight], static(weight.shape[0]) if weight is not None and weight.dim() == 1 else None, found.eps)

    @staticmethod
    def replace(graph, node) -> str:
        found = _written_rms_norm(node)
        return _replace(graph, found.last, "rmsnorm_graph", float(found.eps), found.x, [found.weight]) + " (written by hand)"
