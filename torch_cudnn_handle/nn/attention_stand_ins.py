"""The sdpa graphs' stand-ins: what serves the op's first calls of a new length while its plan builds.

Note [A new layout's first calls] (registry/first_calls.py) says which calls those are.
``nn.sdpa`` has its own (torch's attention, attention_routes.py); these serve the op's
calls of the same graphs, which a lowered model makes (lowering/attention.py), and the
backward graph's first calls behind either. A training forward must also write the
softmax statistics its backward reads, which torch's attention does not return, so both
directions run the attention's math (interpreter/attention.py) in float32, a block of
(batch element, K/V head) rows, or of one row's queries, at a time, so that a block's scores
stay under ``_BLOCK_BYTES`` at any length. Outputs are laid out as the graphs lay them
(``like_layout``: O like Q, dQ/dK/dV like Q/K/V; the statistics packed). Scale 1/sqrt(D),
causal top-left, as the graphs.
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

import torch

from ..interpreter.attention import Masking, backward, forward, keep_mask
from ._layout import like_layout

__all__ = ["torch_sdpa_forward", "torch_sdpa_inference_forward", "torch_sdpa_backward"]

_BLOCK_BYTES = 256 << 20  # a block's float32 scores, at most (at least one query's)


def torch_sdpa_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> List[torch.Tensor]:
    """The training forward's ``O`` and ``Stats``."""
    return list(_forward(q, k, v, causal))


def torch_sdpa_inference_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """The inference forward's ``O``."""
    return _forward(q, k, v, causal)[0]


def torch_sdpa_backward(q, k, v, o, d_o, stats, *, causal: bool) -> List[torch.Tensor]:
    """``dQ, dK, dV`` from the ``O`` and ``Stats`` given (a plan's or a stand-in's)."""
    q_rows, k_rows, v_rows, o_rows, d_o_rows, stats_rows = (_rows(t, k.shape[1]) for t in (q, k, v, o, d_o, stats))
    keep = _keep(q, k, causal)
    d_q, d_k, d_v = torch.empty_like(q_rows), torch.zeros_like(k_rows), torch.zeros_like(v_rows)
    for rows, queries in _blocks(q, k):  # dK and dV sum over the query blocks
        block_q, block_k, block_v, _ = backward(q_rows[rows, :, queries], k_rows[rows], v_rows[rows], o_rows[rows, :, queries],
                                                d_o_rows[rows, :, queries], stats_rows[rows, :, queries], scale=_scale(q),
                                                keep=keep[..., queries, :])
        d_q[rows, :, queries] = block_q
        d_k[rows] += block_k
        d_v[rows] += block_v
    return [_laid_out(grad.reshape(like.shape), like) for grad, like in ((d_q, q), (d_k, k), (d_v, v))]


def _forward(q, k, v, causal: bool):
    q_rows, k_rows, v_rows = (_rows(t, k.shape[1]) for t in (q, k, v))
    keep = _keep(q, k, causal)
    o = q_rows.new_empty(*q_rows.shape[:3], v.shape[-1])
    stats = q_rows.new_empty(*q_rows.shape[:3], 1)
    for rows, queries in _blocks(q, k):
        o[rows, :, queries], stats[rows, :, queries] = forward(q_rows[rows, :, queries], k_rows[rows], v_rows[rows], scale=_scale(q),
                                                               keep=keep[..., queries, :])
    b, h, s_q, _ = q.shape
    return _laid_out(o.reshape(b, h, s_q, v.shape[-1]), q), stats.reshape(b, h, s_q, 1)  # Stats packed row-major, as declared


def _scale(q) -> float:
    return q.shape[-1] ** -0.5


def _rows(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, S, X]`` as float32 ``[B * Hk, H / Hk, S, X]``: one row per (batch element, K/V head)."""
    b, h, s, x = t.shape
    return t.float().reshape(b * kv_heads, h // kv_heads, s, x)


def _keep(q, k, causal: bool) -> torch.Tensor:
    return keep_mask(Masking(right_bound=0) if causal else Masking(), 1, q.shape[2], k.shape[2], q.device)


def _blocks(q, k) -> Iterator[Tuple[slice, slice]]:
    """(rows, query positions) blocks whose float32 scores fit ``_BLOCK_BYTES``: several whole
    rows (``_rows``) at a time, or one row's queries in parts."""
    rows, s_q = q.shape[0] * k.shape[1], q.shape[2]
    per_query = (q.shape[1] // k.shape[1]) * k.shape[2] * 4
    row_step = max(1, _BLOCK_BYTES // (per_query * s_q))
    query_step = s_q if row_step > 1 else max(1, _BLOCK_BYTES // per_query)
    for start in range(0, rows, row_step):
        for first in range(0, s_q, query_step):
            yield slice(start, min(start + row_step, rows)), slice(first, min(first + query_step, s_q))


def _laid_out(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` in a new tensor of ``like``'s dtype whose strides follow ``like``'s dimension order."""
    out = torch.empty_strided(value.shape, like_layout(value.shape, like.stride()), dtype=like.dtype, device=like.device)
    return out.copy_(value)
