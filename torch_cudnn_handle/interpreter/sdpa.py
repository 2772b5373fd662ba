"""SDPA and SDPA_BWD nodes: what of the frontend's sdpa kwargs the interpreter honours.

Supported: ``attn_scale`` (a float or a tensor; unset is 1), ``bias`` (and ``dBias`` in
the backward), the padding mask (``use_padding_mask`` with ``seq_len_q``/``seq_len_kv``),
the diagonal band (``diagonal_alignment``, ``diagonal_band_left_bound`` /
``right_bound``, and the deprecated ``use_causal_mask``, ``use_causal_mask_bottom_right``,
``sliding_window_length``, folded in as the frontend's setters fold them, refused where that
depends on the setters' order), grouped-query heads, ragged Q/K/V/O/Stats (read
and written through their offsets: values.py), ``generate_stats`` / ``is_inference``,
``stats_use_log2``, and dropout given as a mask (``dropout=(mask, scale)``). Hints that
change no value (``implementation``, ``unfuse_fma``, ``max_total_seq_len_*``,
``use_deterministic_algorithm``) are accepted.

Refused (``NotImplementedError``): dropout from a seed and offset (cuDNN's Philox stream
is not reproduced here), alibi, score_mod callbacks, paged K/V, sink tokens, block masks,
cumulative sequence lengths, score_max/score_sum_exp/rng_dump outputs and the
python-engine-only attributes; any other kwarg the node carries.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from . import attention
from .description import check_params, enum_name, port, refuse

_HINTS = ("implementation", "unfuse_fma", "max_total_seq_len_q", "max_total_seq_len_kv", "use_deterministic_algorithm")
_MASKING = (
    "use_padding_mask", "use_causal_mask", "use_causal_mask_bottom_right", "sliding_window_length", "diagonal_alignment",
    "diagonal_band_left_bound", "diagonal_band_right_bound",
)
_COMMON = ("attn_scale", "_dropout_n", "dropout_0", "dropout_1", "dropout_2", *_MASKING, *_HINTS)
_FORWARD_PARAMS = (*_COMMON, "generate_stats", "is_inference", "stats_use_log2")
_FALSE_IS_UNSET = ("use_alibi_mask", "attn_scale_prefolded")
_INPUTS = ("q", "k", "v", "seq_len_q", "seq_len_kv", "attn_scale", "bias", "dropout_0", "dropout_1", "dropout_2")


def _check_kwargs(node, params, inputs, outputs) -> None:
    for name in _FALSE_IS_UNSET:
        if node.params.get(name):
            raise refuse(node, name, node.params[name])
    check_params(node, (*params, *_FALSE_IS_UNSET))
    for name in node.inputs:
        if name not in inputs:
            raise refuse(node, name, why="an sdpa input the interpreter does not read")
    for name, tensor in node.outputs.items():
        if tensor is not None and name not in outputs:
            raise refuse(node, name, why="an sdpa output the interpreter does not compute")


def _scale(node, ctx) -> float:
    if node.inputs.get("attn_scale") is not None:
        return ctx.scalar(node.inputs["attn_scale"])
    value = node.params.get("attn_scale")
    return 1.0 if value is None else float(value)


def _dropout(node, ctx) -> Optional[attention.Dropout]:
    count = node.params.get("_dropout_n")
    if not count:
        return None
    if count == 3:
        raise refuse(node, "dropout", (node.params.get("dropout_0"), "seed", "offset"),
                     "cuDNN draws this mask with its Philox RNG, which the interpreter does not reproduce; "
                     "pass the mask instead: dropout=(mask, scale)")
    if count != 2 or node.inputs.get("dropout_0") is None:
        raise refuse(node, "dropout", why="dropout is (probability, seed, offset) or (mask, scale)")
    scale = ctx.scalar(node.inputs["dropout_1"]) if node.inputs.get("dropout_1") is not None else float(node.params["dropout_1"])
    return attention.Dropout(ctx.value(node.inputs["dropout_0"], node), scale)


def _deprecated_band(node, alignment, left, right):
    """Fold the deprecated masking kwargs into (alignment, left, right), as the frontend's setters
    do (a causal flag: right bound 0 and its alignment; sliding_window_length: the left bound).
    Refused where the result would depend on the order the setters run in."""
    params = node.params
    causal = [name for name in ("use_causal_mask", "use_causal_mask_bottom_right") if params.get(name)]
    if causal:
        wanted = "BOTTOM_RIGHT" if causal[0] == "use_causal_mask_bottom_right" else "TOP_LEFT"
        explicit = enum_name(params.get("diagonal_alignment"))
        if len(causal) > 1 or right not in (None, 0) or explicit not in (None, wanted):
            raise refuse(node, causal[0], True, "a causal flag with another alignment or right bound (order-dependent in the frontend)")
        alignment, right = wanted, 0
    window = params.get("sliding_window_length")
    if window:
        if left not in (None, int(window)):
            raise refuse(node, "sliding_window_length", window, "together with another diagonal_band_left_bound")
        left = int(window)
    return alignment, left, right


def _masking(node, ctx, batch: int) -> attention.Masking:
    params = node.params
    alignment = enum_name(params.get("diagonal_alignment")) or "TOP_LEFT"
    if alignment not in ("TOP_LEFT", "BOTTOM_RIGHT"):
        raise refuse(node, "diagonal_alignment", alignment)
    alignment, left, right = _deprecated_band(node, alignment, params.get("diagonal_band_left_bound"), params.get("diagonal_band_right_bound"))
    lengths = {}
    padded = bool(params.get("use_padding_mask"))
    for name in ("seq_len_q", "seq_len_kv"):
        tensor = node.inputs.get(name)
        if (tensor is not None) != padded:
            raise refuse(node, name, why="seq_len_q and seq_len_kv come with use_padding_mask=True, and only with it")
        if tensor is not None:
            lengths[name] = ctx.host_ints(tensor)
            if len(lengths[name]) != batch:
                raise ValueError(f"interpreter: sdpa {node.name!r}: {name} has {len(lengths[name])} elements for {batch} batch elements")
    return attention.Masking(right, left, alignment == "BOTTOM_RIGHT", lengths.get("seq_len_q"), lengths.get("seq_len_kv"))


def _bias(node, ctx) -> Optional[torch.Tensor]:
    tensor = node.inputs.get("bias")
    return None if tensor is None else ctx.value(tensor, node)


def _qkv(node, ctx):
    q, k, v = (ctx.value(port(node, name), node) for name in ("q", "k", "v"))
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"interpreter: sdpa {node.name!r} takes [B, H, S, D] q, k and v")
    return q, k, v


def sdpa(node, ctx) -> Dict[str, torch.Tensor]:
    dropout = _dropout(node, ctx)  # first: a Philox dropout is refused as such, not by its rng_dump output
    _check_kwargs(node, _FORWARD_PARAMS, _INPUTS, ("O", "Stats"))
    q, k, v = _qkv(node, ctx)
    keep = attention.keep_mask(_masking(node, ctx, q.shape[0]), q.shape[0], q.shape[2], k.shape[2], q.device)
    o, stats = attention.forward(q, k, v, scale=_scale(node, ctx), keep=keep, bias=_bias(node, ctx), dropout=dropout)
    if node.params.get("stats_use_log2"):
        stats = stats * (1.0 / math.log(2.0))
    return {"O": o, "Stats": stats}


def sdpa_backward(node, ctx) -> Dict[str, torch.Tensor]:
    dropout = _dropout(node, ctx)
    _check_kwargs(node, _COMMON, (*_INPUTS, "o", "dO", "stats"), ("dQ", "dK", "dV", "dBias"))
    q, k, v = _qkv(node, ctx)
    o, d_o, stats = (ctx.value(port(node, name), node) for name in ("o", "dO", "stats"))
    keep = attention.keep_mask(_masking(node, ctx, q.shape[0]), q.shape[0], q.shape[2], k.shape[2], q.device)
    bias = _bias(node, ctx)
    d_q, d_k, d_v, d_s = attention.backward(q, k, v, o, d_o, stats, scale=_scale(node, ctx), keep=keep, bias=bias, dropout=dropout)
    out = {"dQ": d_q, "dK": d_k, "dV": d_v}
    if node.outputs.get("dBias") is not None:
        target = list(node.outputs["dBias"].dim)
        axes = [i for i, n in enumerate(target) if n == 1 and d_s.shape[i] != 1]
        out["dBias"] = d_s.sum(axes, keepdim=True) if axes else d_s
    return out


HANDLERS = {"SDPA": sdpa, "SDPA_BWD": sdpa_backward}
