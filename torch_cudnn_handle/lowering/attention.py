"""``F.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=..., enable_gqa=...)`` ->
nn.sdpa's graph, or with a mask the graph taking it as an additive bias (``additive_bias``)."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.fx
import torch.nn.functional as F
from torch import _C

from .fx_values import HALF, argument, execute, static, value


class Attention:
    targets = (F.scaled_dot_product_attention, _C._nn.scaled_dot_product_attention)

    @staticmethod
    def refusal(node) -> Optional[str]:
        q, k, v = (value(argument(node, i, name)) for i, name in enumerate(("query", "key", "value")))
        if q is None or k is None or v is None:
            return "q, k or v has no traced value"
        if any(t.dim() != 4 for t in (q, k, v)):
            return "q, k and v are not all [B, H, S, D]"
        mask = argument(node, 3, "attn_mask")
        if mask is not None:
            why = _mask_refusal(value(mask), q, k)
            if why:
                return why
            if argument(node, 5, "is_causal", False):
                return "a mask and is_causal together (torch refuses that call too)"
        if argument(node, 4, "dropout_p", 0.0) != 0.0:
            return "dropout (the library's graph has none)"
        if len({q.dtype, k.dtype, v.dtype}) > 1 or q.dtype not in HALF:
            return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: cuDNN attention takes float16 or bfloat16, one for all three"
        head = static(q.shape[-1])
        if head is None or head % 8 or any(static(t.shape[-1]) != head for t in (k, v)):
            return "the head dim is not one multiple of 8 for q, k and v"
        scale = argument(node, 6, "scale")
        if isinstance(scale, torch.fx.Node):
            return ("the scale is an input of the traced graph (torch.compile(dynamic=True) lifts a module's float attributes): "
                    "the graph bakes 1/sqrt(D) in; torch._dynamo.config.specialize_float = True keeps it a constant")
        if scale is not None and not math.isclose(scale, head ** -0.5):
            return f"scale {scale}, not the default 1/sqrt({head}) the graph uses"
        q_heads, kv_heads = static(q.shape[1]), static(k.shape[1])
        if q_heads is None or kv_heads is None or kv_heads != static(v.shape[1]) or q_heads % kv_heads:
            return "q's heads are not a fixed multiple of k's and v's (one count for k and v)"
        if q_heads != kv_heads and not argument(node, 7, "enable_gqa", False):
            return "k/v heads differ from q's without enable_gqa=True (torch refuses that call too)"
        if q.device != k.device or q.device != v.device:
            return "q, k and v on more than one device"
        return None

    @staticmethod
    def replace(graph, node) -> str:
        from ..nn.attention import SDPA_BIAS_GRAPH, SDPA_BIAS_INFERENCE_GRAPH, SDPA_GRAPHS, SDPA_INFERENCE_GRAPHS

        q, k, v = (argument(node, i, name) for i, name in enumerate(("query", "key", "value")))
        training = any(value(t).requires_grad for t in (q, k, v))
        causal = bool(argument(node, 5, "is_causal", False))
        mask = argument(node, 3, "attn_mask")
        if mask is None:
            graph_id, inputs, kind = (SDPA_GRAPHS if training else SDPA_INFERENCE_GRAPHS)[causal], [q, k, v], "causal" if causal else "full"
        else:
            with graph.inserting_before(node):
                bias = graph.call_function(additive_bias, (mask, value(q).dtype))
            graph_id, inputs, kind = SDPA_BIAS_GRAPH if training else SDPA_BIAS_INFERENCE_GRAPH, [q, k, v, bias], "the mask as a bias"
        node.replace_all_uses_with(execute(graph, node, graph_id, inputs))
        graph.erase_node(node)
        grouped = " (grouped-query)" if static(value(q).shape[1]) != static(value(k).shape[1]) else ""
        return f"lowered onto nn.sdpa's {'training' if training else 'inference'} graph, {kind}{grouped}"


def additive_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``attn_mask`` as the bias the graph adds to the scores, as torch reads it: a boolean mask
    keeps where True (0) and drops where False (-inf); a float mask is added as it is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask.logical_not(), float("-inf"))
    return mask.to(dtype).contiguous()


def _same_size(a, b) -> bool:
    """Two sizes the trace knows equal: the same int, or the same symbolic expression."""
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return static(a) is not None and static(a) == static(b)


def _mask_refusal(mask, q, k) -> Optional[str]:
    if mask is None:
        return "the mask has no traced value"
    if mask.dtype != torch.bool and mask.dtype != q.dtype:
        return f"a {mask.dtype} mask with {q.dtype} q (a float mask is added in q's dtype; torch promotes it otherwise)"
    if mask.dim() != 4:
        return f"a {mask.dim()}-D mask (the graph takes [B or 1, H or 1, S_q, S_kv])"
    if not (_same_size(mask.shape[2], q.shape[2]) and _same_size(mask.shape[3], k.shape[2])):
        return "a mask broadcast over the query or key positions (the graph takes [B or 1, H or 1, S_q, S_kv])"
    if any(static(mask.shape[d]) != 1 and not _same_size(mask.shape[d], q.shape[d]) for d in (0, 1)):
        return "a mask whose batch or head dim is neither 1 nor q's"
    return None
