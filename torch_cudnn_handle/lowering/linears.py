"""A linear whose one user is its activation -> FusedLinear's graph (the activation in the
GEMM's epilogue), and SwiGLU's gate ``silu(linear(x, W_gate)) * linear(x, W_up)`` -> the gate
graph (nn/swiglu.py: SiLU and the product in the gate GEMM's epilogue; the up projection
stays a plain linear). A linear with no activation stays cuBLAS's: the fusion's gain is the epilogue."""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.nn.functional as F
from torch import _C

from .fx_values import HALF, argument, calls, contiguous, execute, only_user, static, value

_LINEARS = (_C._nn.linear, F.linear)
_ACTIVATIONS = {torch.relu: "relu", F.relu: "relu", _C._nn.gelu: "gelu", F.gelu: "gelu", F.silu: "silu", _C._nn.silu: "silu"}
_METHOD_ACTIVATIONS = {"relu": "relu"}


def _activation(node) -> Optional[str]:
    """The activation ``node`` applies to its first argument alone (exact gelu, relu, silu), or None."""
    if calls(node, tuple(_ACTIVATIONS)):
        name = _ACTIVATIONS[node.target]
    elif calls(node, methods=tuple(_METHOD_ACTIVATIONS)):
        name = _METHOD_ACTIVATIONS[node.target]
    else:
        return None
    if name == "gelu" and node.kwargs.get("approximate", "none") != "none":
        return None
    if any(arg is not False for arg in node.args[1:]) or node.kwargs.get("inplace", False) or set(node.kwargs) - {"approximate", "inplace"}:
        return None  # in place (relu(x, inplace=True), silu(x, True)): left alone
    return name


def _operands(node) -> list:
    return [argument(node, i, name) for i, name in enumerate(("input", "weight", "bias"))]


def _up_projection(gated) -> Optional[torch.fx.Node]:
    """SwiGLU: ``gated`` (a silu) times a bias-free linear of the gate's own input, by the gate's
    width: that linear's node, or None."""
    product = only_user(gated)
    if not calls(product, (operator.mul, torch.mul), ("mul",)) or len(product.args) != 2 or gated not in product.args:
        return None
    up = product.args[1] if product.args[0] is gated else product.args[0]
    gate = gated.args[0]
    if not calls(up, _LINEARS) or up is gate or argument(up, 2, "bias") is not None or argument(up, 0, "input") is not argument(gate, 0, "input"):
        return None
    gate_weight, up_weight = value(argument(gate, 1, "weight")), value(argument(up, 1, "weight"))
    if gate_weight is None or up_weight is None or static(gate_weight.shape[0]) != static(up_weight.shape[0]) or up_weight.dtype != gate_weight.dtype:
        return None
    return up


class LinearActivation:
    targets = _LINEARS

    @staticmethod
    def refusal(node) -> Optional[str]:
        x, weight, bias = (value(operand) for operand in _operands(node))
        if _activation(only_user(node)) is None:
            return "no exact gelu, relu or silu as the linear's one user (the fusion's gain is the epilogue; a plain linear stays cuBLAS's)"
        if x is None or weight is None or (bias is None and argument(node, 2, "bias") is not None):
            return "no traced value"
        if x.dtype not in HALF or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
            return f"dtypes {x.dtype}, {weight.dtype}, {None if bias is None else bias.dtype}: the graph takes float16 or bfloat16, one for all"
        if x.dim() < 2 or weight.dim() != 2:
            return "a 1-D input or weight"
        return None

    @staticmethod
    def replace(graph, node) -> str:
        from ..nn.linear import BIAS_FREE_LINEAR_GRAPHS, LINEAR_GRAPHS
        from ..nn.swiglu import SWIGLU_GATE

        activation_node = only_user(node)
        activation = _activation(activation_node)
        x, weight, bias = _operands(node)
        up = _up_projection(activation_node) if activation == "silu" and bias is None else None
        if up is not None:  # SwiGLU: silu(x W_gate^T) * up in the gate's epilogue
            product = only_user(activation_node)
            lowered = execute(graph, product, SWIGLU_GATE, [contiguous(graph, product, x), weight, contiguous(graph, product, up)])
            product.replace_all_uses_with(lowered)
            graph.erase_node(product)
            onto = "SwiGLU's gate graph (silu and the product with the up projection in the gate GEMM's epilogue)"
        else:
            graphs = LINEAR_GRAPHS if bias is not None else BIAS_FREE_LINEAR_GRAPHS
            lowered = execute(graph, activation_node, graphs[activation], [contiguous(graph, activation_node, x), weight, *([bias] * (bias is not None))])
            activation_node.replace_all_uses_with(lowered)
            onto = f"FusedLinear's {activation} graph{'' if bias is not None else ' without a bias'} ({activation} in the GEMM's epilogue)"
        graph.erase_node(activation_node)
        graph.erase_node(node)
        return "lowered onto " + onto
