"""RoPE and SDPA graphs (test/python/sdpa/fp16.py and fp16_ref.py: test_mhas_v2.py's graphs) and
their entries."""

from __future__ import annotations

from typing import List

import cudnn
import torch

from .entry import UpstreamGraph, _gen, _randn


# =====================================================================================
# RoPE and SDPA (test/python/sdpa/fp16.py and fp16_ref.py: test_mhas_v2.py's graphs)

B, H, S, D = 2, 4, 128, 64
ATTN_SCALE = 0.125
SHAPE = (B, H, S, D)
STRIDE = (H * S * D, S * D, D, 1)
STATS_SHAPE, STATS_STRIDE = (B, H, S, 1), (H * S, S, 1, 1)


def rope_forward(g, q, freqs):
    q_rot = g.rope(input=q, freqs=freqs, name="RoPE_Q")
    q_rot.set_data_type(q.data_type).set_dim(list(q.dim)).set_stride(list(q.stride))
    return q_rot


def rope_backward(g, dY, freqs):
    dQ = g.rope_backward(dY=dY, freqs=freqs, name="RoPE_BWD_Q")
    dQ.set_data_type(dY.data_type).set_dim(list(dY.dim)).set_stride(list(dY.stride))
    return dQ


def _rope_freqs(device, s=S, d=D):
    d2 = d // 2
    freqs_1d = 1.0 / (10000.0 ** (torch.arange(d2).float() / d2))
    angles = torch.outer(torch.arange(s).float(), freqs_1d)
    freqs = torch.zeros(s, 1, 1, d)
    freqs[:, 0, 0, :d2] = angles
    return freqs.to(device)


def _rope_inputs(device):
    gen = _gen(16)
    return [_randn(gen, *SHAPE, device=device, shift=-0.5), _rope_freqs(device)]


def _rotate(x, freqs, inverse=False):
    d2 = x.shape[-1] // 2
    angles = freqs[: x.shape[2], 0, 0, :d2].float()
    cos, sin = torch.cos(angles)[None, None], torch.sin(angles)[None, None]
    if inverse:
        sin = -sin
    x1, x2 = x.float()[..., :d2], x.float()[..., d2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _rope_reference(inputs):
    x, freqs = inputs
    return [_rotate(x, freqs)]


def _rope_backward_reference(inputs):
    dy, freqs = inputs
    return [_rotate(dy, freqs, inverse=True)]  # the rotation's transpose


def _attention_reference(q, k, v, *, causal=False, seq_len_q=None, seq_len_kv=None, dropout_mask=None, dropout_prob=0.0):
    """fp16_ref.compute_ref's semantics, unblocked: float32 scores, P rounded to the io type,
    padded rows zero, O rounded to the io type; stats = max + log(sum exp)."""
    q, k, v = q.float(), k.float(), v.float()
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * ATTN_SCALE
    rows = torch.arange(s.shape[2], device=s.device).view(1, 1, -1, 1)
    cols = torch.arange(s.shape[3], device=s.device).view(1, 1, 1, -1)
    masked = torch.zeros_like(s, dtype=torch.bool)
    if causal:
        masked |= cols > rows
    if seq_len_kv is not None:
        masked |= cols >= seq_len_kv.view(-1, 1, 1, 1)
    if seq_len_q is not None:
        masked |= rows >= seq_len_q.view(-1, 1, 1, 1)
    s = s.masked_fill(masked, float("-inf"))
    m = s.max(dim=-1, keepdim=True).values
    p = torch.exp(s - m).nan_to_num().half().float()
    l = p.sum(dim=-1, keepdim=True)
    if dropout_mask is not None:
        p = p * dropout_mask / (1 - dropout_prob)
    o = (torch.einsum("bhqk,bhkd->bhqd", p, v) / l.clamp(min=1.0)).half()
    return o, torch.log(l) + m


def sdpa_forward(g, q, k, v, *, attn_scale, causal):
    o, stats = g.sdpa(
        name="sdpa_forward", q=q, k=k, v=v, generate_stats=True, attn_scale=attn_scale,
        diagonal_band_right_bound=0 if causal else None,
    )
    o.set_dim(list(q.dim)).set_stride(list(q.stride))
    stats.set_data_type(cudnn.data_type.FLOAT).set_dim(list(STATS_SHAPE)).set_stride(list(STATS_STRIDE))
    return o, stats


def _qkv(device, seed):
    gen = _gen(seed)
    return [_randn(gen, *SHAPE, device=device, shift=-0.5) for _ in range(3)]


def _sdpa_forward_reference(causal):
    def reference(inputs):
        q, k, v = inputs[:3]
        return list(_attention_reference(q, k, v, causal=causal))

    return reference


DROPOUT_PROB = 0.1


def sdpa_forward_dropout(g, q, k, v, seed, offset, rng_dump, *, attn_scale, dropout_prob):
    o, stats = g.sdpa(
        name="sdpa_forward", q=q, k=k, v=v, generate_stats=True, attn_scale=attn_scale,
        dropout=(dropout_prob, seed, offset), rng_dump=rng_dump,
    )
    o.set_dim(list(q.dim)).set_stride(list(q.stride))
    stats.set_data_type(cudnn.data_type.FLOAT).set_dim(list(STATS_SHAPE)).set_stride(list(STATS_STRIDE))
    return o, stats


def _dropout_inputs(device):
    q, k, v = _qkv(device, 18)
    seed = torch.full((1, 1, 1, 1), 123456, dtype=torch.int64).to(device)
    offset = torch.full((1, 1, 1, 1), 789, dtype=torch.int64).to(device)
    rng_dump = torch.zeros((B, H, S, S), dtype=torch.float32).to(device)  # the graph writes the dropout mask here
    return [q, k, v, seed, offset, rng_dump]


def _dropout_reference(inputs):
    q, k, v, _, _, rng_dump = inputs  # read after the graph ran: the mask it drew
    return list(_attention_reference(q, k, v, dropout_mask=rng_dump, dropout_prob=DROPOUT_PROB))


SEQ_LEN_Q, SEQ_LEN_KV = (100, 77), (128, 50)


def sdpa_forward_padding(g, q, k, v, seq_len_q, seq_len_kv, *, attn_scale):
    o, stats = g.sdpa(
        name="sdpa_forward", q=q, k=k, v=v, generate_stats=True, attn_scale=attn_scale,
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
    )
    o.set_dim(list(q.dim)).set_stride(list(q.stride))
    stats.set_data_type(cudnn.data_type.FLOAT).set_dim(list(STATS_SHAPE)).set_stride(list(STATS_STRIDE))
    return o, stats


def _padding_inputs(device):
    q, k, v = _qkv(device, 19)
    return [q, k, v, torch.tensor(SEQ_LEN_Q, dtype=torch.int32).to(device), torch.tensor(SEQ_LEN_KV, dtype=torch.int32).to(device)]


def _padding_reference(inputs):
    q, k, v, sq, skv = inputs
    return list(_attention_reference(q, k, v, seq_len_q=sq, seq_len_kv=skv))


def _valid_rows(outputs, inputs):
    """Padding leaves the rows past each batch's seq_len_q undefined: compare the others."""
    seq_len_q = inputs[3].tolist()
    return [torch.cat([o[b, :, :n].reshape(-1) for b, n in enumerate(seq_len_q)]) for o in outputs]


# Ragged (packed) Q/K/V/O: token-major buffers, the 4-D (B, H, S, D) view with the
# (S*H*D, D, H*D, 1) strides of fp16.py's ragged configuration, per-batch element offsets.
RAGGED_STRIDE = (S * H * D, D, H * D, 1)


def sdpa_forward_ragged(g, q, k, v, seq_len_q, seq_len_kv, q_off, k_off, v_off, o_off, *, attn_scale):
    q.set_ragged_offset(q_off)
    k.set_ragged_offset(k_off)
    v.set_ragged_offset(v_off)
    o, _ = g.sdpa(
        name="sdpa_forward", q=q, k=k, v=v, generate_stats=False, attn_scale=attn_scale,
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
    )
    o.set_dim(list(q.dim)).set_stride(list(q.stride))
    o.set_ragged_offset(o_off)
    return o


def _packed(gen, seq_lens, device):
    """A (B*S, H, D) token buffer, live tokens first, the capacity tail NaN (upstream poisons it:
    no engine may read past the last offset), as the (B, H, S, D) ragged view."""
    buf = (torch.randn(B * S, H, D, generator=gen) - 0.5).half()
    buf[sum(seq_lens):] = float("nan")
    return buf.to(device).view(B, S, H, D).permute(0, 2, 1, 3)


def _ragged_inputs(device):
    gen = _gen(20)
    q, k, v = _packed(gen, SEQ_LEN_Q, device), _packed(gen, SEQ_LEN_KV, device), _packed(gen, SEQ_LEN_KV, device)
    offsets = lambda lens: (torch.tensor([0, *lens]).cumsum(0) * H * D).to(torch.int64).to(device)  # noqa: E731
    return [
        q, k, v, torch.tensor(SEQ_LEN_Q, dtype=torch.int32).to(device), torch.tensor(SEQ_LEN_KV, dtype=torch.int32).to(device),
        offsets(SEQ_LEN_Q), offsets(SEQ_LEN_KV), offsets(SEQ_LEN_KV), offsets(SEQ_LEN_Q),
    ]


def _tokens(view):
    return view.permute(0, 2, 1, 3).reshape(B * S, H, D)  # the packed buffer behind a ragged view


def _ragged_reference(inputs):
    q, k, v = (_tokens(t) for t in inputs[:3])
    out = []
    tq = tk = 0
    for nq, nk in zip(SEQ_LEN_Q, SEQ_LEN_KV):
        per = [t[a:a + n].permute(1, 0, 2)[None] for t, a, n in ((q, tq, nq), (k, tk, nk), (v, tk, nk))]
        o, _ = _attention_reference(*per)
        out.append(o[0].permute(1, 0, 2))
        tq, tk = tq + nq, tk + nk
    packed = torch.zeros(B * S, H, D, dtype=torch.float16, device=q.device)
    packed[:tq] = torch.cat(out)
    return [packed.view(B, S, H, D).permute(0, 2, 1, 3)]  # the output's ragged layout; the tail is not compared


def _live_tokens(outputs, inputs):
    return [_tokens(outputs[0])[: sum(SEQ_LEN_Q)]]


def sdpa_backward(g, q, k, v, o, dO, stats, *, attn_scale):
    dQ, dK, dV = g.sdpa_backward(
        name="sdpa_backward", q=q, k=k, v=v, o=o, dO=dO, stats=stats, attn_scale=attn_scale,
        use_deterministic_algorithm=True,
    )
    for t in (dQ, dK, dV):
        t.set_dim(list(q.dim)).set_stride(list(q.stride))
    return dQ, dK, dV


def _sdpa_backward_inputs(device):
    q, k, v = _qkv(device, 21)
    gen = _gen(22)
    d_o = _randn(gen, *SHAPE, device=device, scale=0.1)
    o, stats = _attention_reference(q, k, v)  # upstream feeds its forward graph's O and stats
    return [q, k, v, o, d_o, stats.contiguous()]


def _sdpa_backward_reference(inputs):
    q, k, v, _, d_o, _ = inputs
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    s = torch.einsum("bhqd,bhkd->bhqk", leaves[0], leaves[1]) * ATTN_SCALE
    o = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), leaves[2])
    o.backward(d_o.float())
    return [t.grad.half() for t in leaves]


SDPA_TOL = (2e-2, 2e-2)  # ours: test_mhas_v2 compares through its own approx_equal helper

ENTRIES: List[UpstreamGraph] = [
    UpstreamGraph("rope_forward", "rope", "sdpa/fp16.py (with_rope: RoPE_Q)", rope_forward, _rope_inputs, _rope_reference,
                  [(1e-2, 1e-2)], note="upstream checks RoPE through SDPA's output; tolerance ours"),
    UpstreamGraph("rope_backward", "rope", "sdpa/fp16.py (with_rope: RoPE_BWD_Q)", rope_backward, _rope_inputs,
                  _rope_backward_reference, [(1e-2, 1e-2)], note="upstream checks RoPE through SDPA's gradients; tolerance ours"),
    UpstreamGraph("sdpa_forward", "sdpa", "sdpa/fp16.py create_forward_graph (train: stats)", sdpa_forward,
                  lambda d: _qkv(d, 17), _sdpa_forward_reference(False), [SDPA_TOL] * 2,
                  params=dict(attn_scale=ATTN_SCALE, causal=False), note="attn_scale is a Python float: the frontend passes it by value"),
    UpstreamGraph("sdpa_forward_causal", "sdpa", "sdpa/fp16.py create_forward_graph (right_bound=0)", sdpa_forward,
                  lambda d: _qkv(d, 23), _sdpa_forward_reference(True), [SDPA_TOL] * 2,
                  params=dict(attn_scale=ATTN_SCALE, causal=True)),
    UpstreamGraph("sdpa_forward_dropout", "sdpa", "sdpa/fp16.py create_forward_graph (is_dropout, rng_dump)",
                  sdpa_forward_dropout, _dropout_inputs, _dropout_reference, [SDPA_TOL] * 2,
                  params=dict(attn_scale=ATTN_SCALE, dropout_prob=DROPOUT_PROB),
                  note="rng_dump is an input the graph writes (in place), as upstream binds it"),
    UpstreamGraph("sdpa_forward_padding", "sdpa", "sdpa/fp16.py create_forward_graph (is_padding)", sdpa_forward_padding,
                  _padding_inputs, _padding_reference, [SDPA_TOL] * 2, params=dict(attn_scale=ATTN_SCALE), region=_valid_rows),
    UpstreamGraph("sdpa_forward_ragged", "sdpa", "sdpa/fp16.py create_forward_graph (is_ragged, inference)",
                  sdpa_forward_ragged, _ragged_inputs, _ragged_reference, [SDPA_TOL], params=dict(attn_scale=ATTN_SCALE),
                  region=_live_tokens),
    UpstreamGraph("sdpa_backward", "sdpa", "sdpa/fp16.py create_backward_graph (is_determin)", sdpa_backward,
                  _sdpa_backward_inputs, _sdpa_backward_reference, [SDPA_TOL] * 3, params=dict(attn_scale=ATTN_SCALE),
                  note="O and stats from the torch reference (upstream feeds its forward graph's)"),
]
