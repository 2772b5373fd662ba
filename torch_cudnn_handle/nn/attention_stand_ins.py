"""The sdpa graphs' stand-ins: what serves the op's first calls of a new length while its plan builds.

Note [A new layout's first calls] (registry/first_calls.py) says which calls those are.
``nn.sdpa`` has its own (torch's attention, attention_routes.py); these serve the op's
calls of the same graphs, which a lowered model makes (lowering/attention.py), and the
backward graph's first calls behind either. A training forward must also write the
softmax statistics its backward reads, which torch's attention does not return, so both
directions run the attention's math (interpreter/attention.py) in float32, a block of
(batch element, K/V head) rows at a time so that a block's scores stay under
``_BLOCK_BYTES``. Outputs are laid out as the graphs lay them (``like_layout``: O like Q,
dQ/dK/dV like Q/K/V; the statistics packed). Scale 1/sqrt(D), causal top-left, as the graphs.
"""

from __future__ import annotations

from typing import Iterator, List

import torch

from ..interpreter.attention import Masking, backward, forward, keep_mask
from ._layout import like_layout

__all__ = ["torch_sdpa_forward", "torch_sdpa_inference_forward", "torch_sdpa_backward"]

_BLOCK_BYTES = 256 << 20  # a block's float32 scores, at most (at least one row of the blocks below)


def torch_sdpa_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> List[torch.Tensor]:
    """The training forward's ``O`` and ``Stats``."""
    return list(_forward(q, k, v, causal))


def torch_sdpa_inference_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """The inference forward's ``O``."""
    return _forward(q, k, v, causal)[0]


def torch_sdpa_backward(q, k, v, o, d_o, stats, *, causal: bool) -> List[torch.Tensor]:
    """``dQ, dK, dV`` from the ``O`` and ``Stats`` given (a plan's or a stand-in's)."""
    rows, keep = [_rows(t, k.shape[1]) for t in (q, k, v, o, d_o, stats)], _keep(q, k, causal)
    blocks = [backward(*(t[block] for t in rows), scale=q.shape[-1] ** -0.5, keep=keep)[:3] for block in _blocks(q, k)]
    return [_laid_out(torch.cat(part).reshape(like.shape), like) for part, like in zip(zip(*blocks), (q, k, v))]


def _forward(q, k, v, causal: bool):
    rows, keep = [_rows(t, k.shape[1]) for t in (q, k, v)], _keep(q, k, causal)
    outputs, statistics = zip(*(forward(*(t[block] for t in rows), scale=q.shape[-1] ** -0.5, keep=keep) for block in _blocks(q, k)))
    b, h, s_q, _ = q.shape
    o = _laid_out(torch.cat(outputs).reshape(b, h, s_q, v.shape[-1]), q)
    return o, torch.cat(statistics).reshape(b, h, s_q, 1)  # packed row-major, as the graph declares them


def _rows(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, S, X]`` as float32 ``[B * Hk, H / Hk, S, X]``: one row per (batch element, K/V head)."""
    b, h, s, x = t.shape
    return t.float().reshape(b * kv_heads, h // kv_heads, s, x)


def _keep(q, k, causal: bool) -> torch.Tensor:
    return keep_mask(Masking(right_bound=0) if causal else Masking(), 1, q.shape[2], k.shape[2], q.device)


def _blocks(q, k) -> Iterator[slice]:
    """Slices of the rows (``_rows``) whose scores fit ``_BLOCK_BYTES``."""
    rows = q.shape[0] * k.shape[1]
    per_row = (q.shape[1] // k.shape[1]) * q.shape[2] * k.shape[2] * 4
    step = max(1, _BLOCK_BYTES // per_row)
    return (slice(start, min(start + step, rows)) for start in range(0, rows, step))


def _laid_out(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` in a new tensor of ``like``'s dtype whose strides follow ``like``'s dimension order."""
    out = torch.empty_strided(value.shape, like_layout(value.shape, like.stride()), dtype=like.dtype, device=like.device)
    return out.copy_(value)
