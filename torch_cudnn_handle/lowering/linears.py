"""A linear whose output goes through an activation alone -> FusedLinear's graph (the
activation in the GEMM's epilogue): ``F.linear`` (a bias or none) and ``torch.addmm(b, x, W)``
viewed back (transformers' ``Conv1D``, its weight ``[in, out]``); and SwiGLU's gate
``silu(linear(x, W_gate)) * linear(x, W_up)`` -> the gate graph (nn/swiglu.py: SiLU and the
product in the gate GEMM's epilogue; the up projection stays a plain linear). A linear with
no activation stays cuBLAS's: the fusion's gain is the epilogue."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import _C

from .activations import activation_of
from .fx_values import HALF, MUL, argument, calls, contiguous, execute, only_user, other_operand, static, value

_LINEARS = (_C._nn.linear, F.linear)


def _operands(node) -> list:
    """``[x, weight, bias]`` of a linear, or of an addmm (its ``[in, out]`` weight)."""
    if node.target is torch.addmm:
        return [node.args[1], node.args[2], node.args[0]]
    return [argument(node, i, name) for i, name in enumerate(("input", "weight", "bias"))]


def _output(node) -> Optional[torch.fx.Node]:
    """What an activation reads: the linear's result, or the view an addmm's result is given back."""
    if node.target is not torch.addmm:
        return node
    view = only_user(node)
    return view if calls(view, methods=("view", "reshape")) else None


def _up_projection(gated) -> Optional[torch.fx.Node]:
    """SwiGLU: ``gated`` (a silu) times a bias-free linear of the gate's own input, by the gate's
    width: that linear's node, or None."""
    up, gate = other_operand(only_user(gated), gated, MUL), gated.args[0]
    if not calls(up, _LINEARS) or up is gate or argument(up, 2, "bias") is not None or argument(up, 0, "input") is not argument(gate, 0, "input"):
        return None
    gate_weight, up_weight = value(argument(gate, 1, "weight")), value(argument(up, 1, "weight"))
    if gate_weight is None or up_weight is None or static(gate_weight.shape[0]) != static(up_weight.shape[0]) or up_weight.dtype != gate_weight.dtype:
        return None
    return up


class LinearActivation:
    targets = _LINEARS + (torch.addmm,)

    @staticmethod
    def refusal(node) -> Optional[str]:
        output = _output(node)
        if output is None or activation_of(output) is None:
            return ("no exact gelu, tanh gelu, relu or silu alone on the linear's output (the fusion's gain is the epilogue; a plain "
                    "linear stays cuBLAS's)")
        if node.target is torch.addmm and (len(node.args) != 3 or node.kwargs):
            return "an addmm with beta or alpha"
        operands = _operands(node)
        x, weight, bias = (value(operand) for operand in operands)
        if x is None or weight is None or (bias is None and operands[2] is not None):
            return "no traced value"
        if x.dtype not in HALF or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
            return f"dtypes {x.dtype}, {weight.dtype}, {None if bias is None else bias.dtype}: the graph takes float16 or bfloat16, one for all"
        if x.dim() < 2 or weight.dim() != 2 or (bias is not None and bias.dim() != 1):
            return "a 1-D input, or a weight that is not 2-D, or a bias that is not 1-D"
        return None

    @staticmethod
    def replace(graph, node) -> str:
        from ..nn.linear import BIAS_FREE_LINEAR_GRAPHS, LINEAR_GRAPHS
        from ..nn.swiglu import SWIGLU_GATE
        from ..nn.transposed_linear import TRANSPOSED_LINEAR_GRAPHS

        output = _output(node)
        activation, result = activation_of(output)
        x, weight, bias = _operands(node)
        up = _up_projection(result) if activation == "silu" and bias is None and result.args[0] is node else None
        if up is not None:  # SwiGLU: silu(x W_gate^T) * up in the gate's epilogue
            result = only_user(result)
            lowered = execute(graph, result, SWIGLU_GATE, [contiguous(graph, result, x), weight, contiguous(graph, result, up)])
            onto = "SwiGLU's gate graph (silu and the product with the up projection in the gate GEMM's epilogue)"
        elif node.target is torch.addmm:  # Conv1D: the weight [in, out]; the result viewed back as the addmm's was
            lowered = execute(graph, result, TRANSPOSED_LINEAR_GRAPHS[activation], [contiguous(graph, result, x), weight, bias])
            lowered.meta["example_value"] = value(node)
            with graph.inserting_before(result):
                viewed = graph.call_method(output.target, (lowered, *output.args[1:]), output.kwargs)
            viewed.meta["example_value"] = value(result)
            lowered = viewed
            onto = f"FusedLinear's {activation} graph on an [in, out] weight ({activation} in the GEMM's epilogue)"
        else:
            graphs = LINEAR_GRAPHS if bias is not None else BIAS_FREE_LINEAR_GRAPHS
            lowered = execute(graph, result, graphs[activation], [contiguous(graph, result, x), weight, *([bias] * (bias is not None))])
            onto = f"FusedLinear's {activation} graph{'' if bias is not None else ' without a bias'} ({activation} in the GEMM's epilogue)"
        result.replace_all_uses_with(lowered)
        graph.erase_node(result)  # the rest of the linear and its activation: dead now, gone at lower()'s dead-code pass
        return "lowered onto " + onto
