"""The math of scaled dot-product attention, forward and backward, on dense tensors.

``q [B, Hq, Sq, D]``, ``k [B, Hk, Skv, D]``, ``v [B, Hk, Skv, Dv]`` (``Hq`` a multiple of
``Hk``: grouped-query attention, each group of ``Hq / Hk`` query heads reading one K/V
head). Scores ``S = scale * q k^T (+ bias)``; a position the mask does not keep is
``-inf``. ``Stats = max + log(sum exp)`` per query row (natural log), the softmax
``P = exp(S - Stats)``; with a dropout mask, ``O = (P * mask * dropout_scale) v``. A row
with no key kept has ``O = 0`` and ``Stats = -inf``. The backward recomputes ``P`` from the
``Stats`` it is given and uses the ``O`` it is given (``delta = rowsum(dO * O)``), as
cuDNN's does.

The mask (``keep``) follows the frontend's score modifiers
(utils/attn_score_modifiers.h): padding keeps rows ``r < seq_len_q[b]`` and columns
``c < seq_len_kv[b]``; a right bound ``R`` keeps ``c <= r + shift + R`` and a left bound
``L`` keeps ``c > r + shift - L``, where ``shift`` is 0 for TOP_LEFT alignment and
``seq_len_kv[b] - seq_len_q[b]`` (the actual lengths with padding, else the dims) for
BOTTOM_RIGHT.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import torch


@dataclasses.dataclass(frozen=True)
class Masking:
    right_bound: Optional[int] = None
    left_bound: Optional[int] = None
    bottom_right: bool = False
    seq_len_q: Optional[List[int]] = None  # per batch element, with padding
    seq_len_kv: Optional[List[int]] = None


@dataclasses.dataclass(frozen=True)
class Dropout:
    mask: torch.Tensor  # broadcastable to [B, Hq, Sq, Skv]; 0 drops
    scale: float


def keep_mask(masking: Masking, batch: int, s_q: int, s_kv: int, device) -> torch.Tensor:
    """``[B, 1, Sq, Skv]`` booleans: which scores the softmax sees."""
    rows = torch.arange(s_q, device=device).view(1, 1, -1, 1)
    cols = torch.arange(s_kv, device=device).view(1, 1, 1, -1)
    per_batch = lambda lengths, default: torch.tensor(  # noqa: E731
        lengths if lengths is not None else [default] * batch, device=device
    ).view(-1, 1, 1, 1)
    len_q, len_kv = per_batch(masking.seq_len_q, s_q), per_batch(masking.seq_len_kv, s_kv)
    keep = (rows < len_q) & (cols < len_kv)
    shift = (len_kv - len_q) if masking.bottom_right else torch.zeros_like(len_q)
    if masking.right_bound is not None:
        keep &= cols <= rows + shift + int(masking.right_bound)
    if masking.left_bound is not None:
        keep &= cols > rows + shift - int(masking.left_bound)
    return keep


def _grouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V heads repeated for their query-head groups."""
    if t.shape[1] == heads:
        return t
    if heads % t.shape[1]:
        raise ValueError(f"interpreter: sdpa has {heads} query heads, not a multiple of the {t.shape[1]} K/V heads")
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _ungrouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """A gradient over query heads summed back to ``heads`` K/V heads."""
    if t.shape[1] == heads:
        return t
    return t.view(t.shape[0], heads, t.shape[1] // heads, *t.shape[2:]).sum(2)


def _scores(q, k, scale: float, bias: Optional[torch.Tensor]) -> torch.Tensor:
    s = torch.matmul(q, _grouped(k, q.shape[1]).transpose(-1, -2)) * scale
    return s if bias is None else s + bias


def forward(q, k, v, *, scale: float, keep: torch.Tensor, bias=None, dropout: Optional[Dropout] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(O, Stats): ``[B, Hq, Sq, Dv]`` and ``[B, Hq, Sq, 1]``."""
    s = _scores(q, k, scale, bias).masked_fill(~keep, float("-inf"))
    row_max = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)))
    total = p.sum(-1, keepdim=True)
    live = total > 0
    probabilities = p / torch.where(live, total, torch.ones_like(total))
    stats = torch.where(live, row_max + torch.log(torch.where(live, total, torch.ones_like(total))), torch.full_like(total, float("-inf")))
    if dropout is not None:
        probabilities = probabilities * dropout.mask * dropout.scale
    return torch.matmul(probabilities, _grouped(v, q.shape[1])), stats


def backward(q, k, v, o, d_o, stats, *, scale: float, keep: torch.Tensor, bias=None, dropout: Optional[Dropout] = None):
    """(dQ, dK, dV, dS): dS, the gradient of the scores, is what a bias's gradient sums."""
    heads = q.shape[1]
    k_full, v_full = _grouped(k, heads), _grouped(v, heads)
    s = _scores(q, k, scale, bias)
    usable = keep & torch.isfinite(stats)
    p = torch.where(usable, torch.exp(s - torch.where(torch.isfinite(stats), stats, torch.zeros_like(stats))), torch.zeros_like(s))
    kept = p if dropout is None else p * dropout.mask * dropout.scale
    d_v = torch.matmul(kept.transpose(-1, -2), d_o)
    d_p = torch.matmul(d_o, v_full.transpose(-1, -2))
    if dropout is not None:
        d_p = d_p * dropout.mask * dropout.scale
    delta = (d_o * o).sum(-1, keepdim=True)
    d_s = p * (d_p - delta)
    d_q = torch.matmul(d_s, k_full) * scale
    d_k = torch.matmul(d_s.transpose(-1, -2), q) * scale
    return d_q, _ungrouped(d_k, k.shape[1]), _ungrouped(d_v, v.shape[1]), d_s
