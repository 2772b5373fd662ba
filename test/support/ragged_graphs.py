"""Ragged (packed, THD) attention graphs for test_ragged.py (CPU) and test_ragged_gpu.py.

Packed Q [Tq, H, D] and K/V [Tkv, H, D] token buffers (exactly the live tokens), per batch
element seq_len tensors [B, 1, 1, 1] and ragged offsets [B + 1] (cumulative token counts
times H*D). Two ways for the output to say how long it is: it shares Q's offsets input
(``sdpa_shared``), or it has offsets of its own, as upstream's fp16.py does (``sdpa_own_o``).
``register_training`` adds ragged statistics (offsets in units of H) and the backward.
"""

from __future__ import annotations

from typing import List, Sequence

import cudnn
import torch
import torch.nn.functional as F

import torch_cudnn_handle as tch

B, H, D, S_MAX = 3, 4, 64, 48
ATTN_SCALE = 0.125


def sdpa_shared(g, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, *, attn_scale):
    o, _ = g.sdpa(
        name="sdpa", q=q, k=k, v=v, generate_stats=False, attn_scale=attn_scale,
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
    )
    return o.set_dim(list(q.dim)).set_stride(list(q.stride)).set_ragged_offset(q_off)


def sdpa_own_o(g, q, k, v, seq_len_q, seq_len_kv, q_off, k_off, v_off, o_off, *, attn_scale):
    o, _ = g.sdpa(
        name="sdpa", q=q, k=k, v=v, generate_stats=False, attn_scale=attn_scale,
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
    )
    return o.set_dim(list(q.dim)).set_stride(list(q.stride)).set_ragged_offset(o_off)


def register(max_seq_len: int = S_MAX):
    """(shared, own_o): fresh ids, so each test counts its own builds."""
    shared = tch.register_graph(
        sdpa_shared,
        ragged={0: tch.Ragged(offsets=5, max_seq_len=max_seq_len), 1: tch.Ragged(6, max_seq_len), 2: tch.Ragged(6, max_seq_len)},
        params=dict(attn_scale=ATTN_SCALE),
    )
    own_o = tch.register_graph(
        sdpa_own_o, ragged={0: tch.Ragged(5, max_seq_len), 1: tch.Ragged(6, max_seq_len), 2: tch.Ragged(7, max_seq_len)},
        params=dict(attn_scale=ATTN_SCALE),
    )
    return shared, own_o


def sdpa_train(g, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, stats_off, *, attn_scale):
    o, stats = g.sdpa(
        name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=attn_scale,
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
    )
    o.set_dim(list(q.dim)).set_stride(list(q.stride)).set_ragged_offset(q_off)
    b, h, s, _ = q.dim
    stats.set_data_type(cudnn.data_type.FLOAT).set_dim([b, h, s, 1]).set_stride([s * h, 1, h, 1]).set_ragged_offset(stats_off)
    return o, stats


def sdpa_train_backward(g, dO, q, k, v, o, stats, seq_len_q, seq_len_kv, q_off, kv_off, stats_off, *, attn_scale):
    dQ, dK, dV = g.sdpa_backward(
        name="sdpa_backward", q=q, k=k, v=v, o=o, dO=dO, stats=stats, attn_scale=attn_scale,
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
    )
    for grad, like, offset in ((dQ, q, q_off), (dK, k, kv_off), (dV, v, kv_off)):
        grad.set_dim(list(like.dim)).set_stride(list(like.stride)).set_ragged_offset(offset)
    return [dQ, dK, dV, None, None, None, None, None]  # one per forward input


def register_training(max_seq_len: int = S_MAX) -> int:
    """Forward (O and ragged statistics, [Tq, H, 1] float) and its declared backward:
    operands dO, q, k, v, o, stats, seq_len_q, seq_len_kv, q_off, kv_off, stats_off."""
    op, r = tch.BackwardOperand, tch.Ragged
    return tch.register_graph(
        sdpa_train, ragged={0: r(5, max_seq_len), 1: r(6, max_seq_len), 2: r(6, max_seq_len)},
        params=dict(attn_scale=ATTN_SCALE),
        backward=tch.Backward.graph(sdpa_train_backward, operands=[op.grad(0), op.input(0), op.input(1), op.input(2), op.output(0), op.output(1), *(op.input(i) for i in range(3, 8))], ragged={
            0: r(8, max_seq_len), 1: r(8, max_seq_len), 2: r(9, max_seq_len), 3: r(9, max_seq_len), 4: r(8, max_seq_len),
            5: r(10, max_seq_len),
        }),
    )


def training_inputs(lens_q, lens_kv, device, seed=0) -> List[torch.Tensor]:
    return inputs(lens_q, lens_kv, device, seed=seed) + [offsets(lens_q, device, per_token=H)]


def offsets(lens: Sequence[int], device, per_token: int = H * D) -> torch.Tensor:
    """Where each batch element starts, in elements of a buffer of ``per_token`` per token."""
    return (torch.tensor([0, *lens]).cumsum(0) * per_token).to(torch.int64).to(device)


def seq_lens(lens: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(lens, dtype=torch.int32).view(-1, 1, 1, 1).to(device)


def packed(tokens: int, device, seed: int, dtype=torch.float16) -> torch.Tensor:
    if torch.device(device).type == "meta":
        return torch.empty(tokens, H, D, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, H, D, generator=gen) * 0.5).to(dtype).to(device)


def inputs(lens_q, lens_kv, device, *, own_o=False, seed=0) -> List[torch.Tensor]:
    q = packed(sum(lens_q), device, seed)
    k, v = packed(sum(lens_kv), device, seed + 1), packed(sum(lens_kv), device, seed + 2)
    head = [q, k, v, seq_lens(lens_q, device), seq_lens(lens_kv, device)]
    if own_o:
        return head + [offsets(lens_q, device), offsets(lens_kv, device), offsets(lens_kv, device), offsets(lens_q, device)]
    return head + [offsets(lens_q, device), offsets(lens_kv, device)]


def reference(q, k, v, lens_q, lens_kv) -> torch.Tensor:
    """Per batch element, F.scaled_dot_product_attention in float32 on its own tokens."""
    out, tq, tk = [], 0, 0
    for nq, nk in zip(lens_q, lens_kv):
        per = [t[a:a + n].float().transpose(0, 1)[None] for t, a, n in ((q, tq, nq), (k, tk, nk), (v, tk, nk))]
        out.append(F.scaled_dot_product_attention(*per, scale=ATTN_SCALE)[0].transpose(0, 1))
        tq, tk = tq + nq, tk + nk
    return torch.cat(out).to(q.dtype)
