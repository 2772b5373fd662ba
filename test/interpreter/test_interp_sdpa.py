"""The interpreter's SDPA forward and backward against torch's scaled_dot_product_attention and
autograd (CPU): masks, padding, grouped heads, bias, scale, stats, dropout masks, ragged."""

import math

import cudnn
import pytest
import torch
import torch.nn.functional as F

from support import ragged_graphs as rg
from support.interpreter import assert_close, randn, run, run_registered
from torch_cudnn_handle import registry

B, H, S, D = 2, 4, 24, 16
SCALE = D ** -0.5
BR = cudnn.diagonal_alignment.BOTTOM_RIGHT


def qkv(dtype=torch.float16, s_q=S, s_kv=S, heads_kv=H, seed=0):
    return [randn(B, H, s_q, D, dtype=dtype, seed=seed), randn(B, heads_kv, s_kv, D, dtype=dtype, seed=seed + 1),
            randn(B, heads_kv, s_kv, D, dtype=dtype, seed=seed + 2)]


def forward_graph(**kwargs):
    def builder(g, q, k, v, *extra):
        tensors = dict(zip(kwargs.pop("_ports", ()), extra)) if "_ports" in kwargs else {}
        o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=True, attn_scale=SCALE, name="sdpa", **kwargs, **tensors)
        return [o, stats.set_data_type(cudnn.data_type.FLOAT)]

    return builder


def reference(q, k, v, mask=None, scale=SCALE, gqa=False):
    """(O, logsumexp of the scaled, masked scores) in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return o, torch.logsumexp(s, -1, keepdim=True)


def band(s_q, s_kv, keep):
    rows, cols = torch.arange(s_q).view(-1, 1), torch.arange(s_kv).view(1, -1)
    return keep(rows, cols)


CASES = {
    "full": (dict(), S, S, None),
    "causal": (dict(diagonal_band_right_bound=0), S, S, lambda r, c: c <= r),
    "deprecated_causal": (dict(use_causal_mask=True), S, S, lambda r, c: c <= r),
    "deprecated_window": (dict(use_causal_mask=True, sliding_window_length=5), S, S, lambda r, c: (c <= r) & (c > r - 5)),
    "bottom_right_causal": (dict(diagonal_alignment=BR, diagonal_band_right_bound=0), 16, 24, lambda r, c: c <= r + 8),
    "sliding_window": (dict(diagonal_band_left_bound=5, diagonal_band_right_bound=0), S, S, lambda r, c: (c <= r) & (c > r - 5)),
    "right_band": (dict(diagonal_band_right_bound=3), S, S, lambda r, c: c <= r + 3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_masks(case):
    kwargs, s_q, s_kv, keep = CASES[case]
    q, k, v = qkv(s_q=s_q, s_kv=s_kv)
    o, stats = run(forward_graph(**kwargs), [q, k, v])
    mask = None if keep is None else band(s_q, s_kv, keep)
    o_ref, lse = reference(q, k, v, mask)
    assert o.dtype == torch.float16 and stats.dtype == torch.float32 and stats.shape == (B, H, s_q, 1)
    assert_close(o, o_ref.half(), scale=2)
    assert_close(stats, lse.float())


def test_padding_masks_rows_and_columns_per_batch_element():
    q, k, v = qkv(seed=3)
    lens_q, lens_kv = [20, 7], [24, 11]
    seq_q, seq_kv = (torch.tensor(n, dtype=torch.int32).view(B, 1, 1, 1) for n in (lens_q, lens_kv))
    o, stats = run(forward_graph(use_padding_mask=True, _ports=("seq_len_q", "seq_len_kv")), [q, k, v, seq_q, seq_kv])
    for b, (nq, nk) in enumerate(zip(lens_q, lens_kv)):
        o_ref, lse = reference(q[b:b + 1, :, :nq], k[b:b + 1, :, :nk], v[b:b + 1, :, :nk])
        assert_close(o[b:b + 1, :, :nq], o_ref.half(), scale=2)
        assert_close(stats[b:b + 1, :, :nq], lse.float())
        assert torch.equal(o[b, :, nq:], torch.zeros_like(o[b, :, nq:]))  # a padded row: no key, O = 0


def test_bottom_right_alignment_follows_each_batch_elements_lengths():
    q, k, v = qkv(seed=4)
    lens_q, lens_kv = [10, 24], [24, 24]
    seq_q, seq_kv = (torch.tensor(n, dtype=torch.int32).view(B, 1, 1, 1) for n in (lens_q, lens_kv))
    o, _ = run(forward_graph(use_padding_mask=True, diagonal_alignment=BR, diagonal_band_right_bound=0, _ports=("seq_len_q", "seq_len_kv")),
               [q, k, v, seq_q, seq_kv])
    for b, (nq, nk) in enumerate(zip(lens_q, lens_kv)):
        mask = band(nq, nk, lambda r, c: c <= r + (nk - nq))
        o_ref, _ = reference(q[b:b + 1, :, :nq], k[b:b + 1, :, :nk], v[b:b + 1, :, :nk], mask)
        assert_close(o[b:b + 1, :, :nq], o_ref.half(), scale=2)


def test_grouped_query_heads_share_their_kv_head():
    q, k, v = qkv(dtype=torch.bfloat16, heads_kv=2, seed=5)
    o, stats = run(forward_graph(diagonal_band_right_bound=0), [q, k, v])
    o_ref, lse = reference(q, k, v, band(S, S, lambda r, c: c <= r), gqa=True)
    assert_close(o, o_ref.to(torch.bfloat16), scale=2)
    assert_close(stats, lse.float())


def test_an_additive_bias_and_a_pass_by_value_scale():
    q, k, v = qkv(dtype=torch.float32, seed=6)
    bias = randn(1, H, S, S, seed=9)
    scale = torch.full((1, 1, 1, 1), 0.3)  # a one-element CPU tensor: pass-by-value

    def builder(g, q, k, v, bias, scale):
        o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=True, attn_scale=scale, bias=bias)
        return [o, stats]

    o, stats = run(builder, [q, k, v, bias, scale])
    o_ref, lse = reference(q, k, v, bias.double(), scale=0.3)
    assert_close(o, o_ref.float())
    assert_close(stats, lse.float())


def test_stats_in_base_two():
    q, k, v = qkv(dtype=torch.float32, seed=10)
    _, stats = run(forward_graph(stats_use_log2=True), [q, k, v])
    _, lse = reference(q, k, v)
    assert_close(stats, (lse / math.log(2.0)).float())


def test_inference_writes_no_stats():
    q, k, v = qkv(seed=11)
    (o,) = run(lambda g, q, k, v: g.sdpa(q=q, k=k, v=v, generate_stats=False, attn_scale=SCALE)[0], [q, k, v])
    assert_close(o, reference(q, k, v)[0].half(), scale=2)


def _dropout_mask(seed=12, shape=(B, H, S, S), p=0.25):
    return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) >= p).to(torch.float16)


def test_dropout_from_a_given_mask():
    q, k, v = qkv(dtype=torch.float32, seed=13)
    mask, keep_scale = _dropout_mask(), torch.full((1, 1, 1, 1), 1 / 0.75)

    def builder(g, q, k, v, mask, keep_scale):
        o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=True, attn_scale=SCALE, dropout=(mask, keep_scale))
        return [o, stats]

    o, stats = run(builder, [q, k, v, mask, keep_scale])
    p = torch.softmax(q.double() @ k.double().transpose(-1, -2) * SCALE, -1)
    assert_close(o, ((p * mask.double() / 0.75) @ v.double()).float())
    assert_close(stats, reference(q, k, v)[1].float())  # the statistics are the softmax's, before dropout


def test_dropout_from_cudnns_philox_stream_is_refused():
    q, k, v = qkv(seed=14)
    seed, offset = torch.full((1, 1, 1, 1), 1, dtype=torch.int64), torch.full((1, 1, 1, 1), 2, dtype=torch.int64)

    def builder(g, q, k, v, seed, offset):
        return g.sdpa(q=q, k=k, v=v, generate_stats=False, attn_scale=SCALE, dropout=(0.1, seed, offset), name="attn")[0]

    with pytest.raises(NotImplementedError, match=r"node 'attn' \(SDPA\) attribute 'dropout'.*Philox"):
        run(builder, [q, k, v, seed, offset])


@pytest.mark.parametrize("kwargs, attribute", [
    (dict(use_alibi_mask=True, diagonal_band_right_bound=0), "use_alibi_mask"),
    (dict(use_causal_mask=True, diagonal_band_right_bound=4), "use_causal_mask"),
    (dict(use_causal_mask=True, use_causal_mask_bottom_right=True), "use_causal_mask"),
    (dict(sliding_window_length=3, diagonal_band_left_bound=4, diagonal_band_right_bound=0), "sliding_window_length"),
    (dict(softmax_precision=cudnn.data_type.HALF), "softmax_precision"),
])
def test_what_has_no_exact_semantics_here_is_refused_by_name(kwargs, attribute):
    q, k, v = qkv(seed=15)
    with pytest.raises(NotImplementedError, match=rf"node 'sdpa' \(SDPA\) attribute '{attribute}'"):
        run(forward_graph(**kwargs), [q, k, v])


def _autograd(q, k, v, d_o, mask=None, gqa=False, scale=SCALE):
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, attn_mask=mask, scale=scale, enable_gqa=gqa)
    o.backward(d_o.double())
    return o.detach(), [t.grad for t in leaves]


def backward_graph(**kwargs):
    def builder(g, q, k, v, o, d_o, stats, *extra):
        tensors = dict(zip(kwargs.pop("_ports", ()), extra)) if "_ports" in kwargs else {}
        return g.sdpa_backward(q=q, k=k, v=v, o=o, dO=d_o, stats=stats, attn_scale=SCALE, name="sdpa_backward", **kwargs, **tensors)

    return builder


@pytest.mark.parametrize("case", ["full", "causal", "sliding_window", "bottom_right_causal"])
@pytest.mark.parametrize("heads_kv", [H, 1])
def test_backward_is_autograd_of_sdpa(case, heads_kv):
    kwargs, s_q, s_kv, keep = CASES[case]
    q, k, v = qkv(dtype=torch.float32, s_q=s_q, s_kv=s_kv, heads_kv=heads_kv, seed=16)
    d_o = randn(B, H, s_q, D, seed=19)
    mask = None if keep is None else band(s_q, s_kv, keep)
    o_ref, lse = reference(q, k, v, mask, gqa=heads_kv != H)
    _, grads = _autograd(q, k, v, d_o, mask, gqa=heads_kv != H)
    got = run(backward_graph(**kwargs), [q, k, v, o_ref.float(), d_o, lse.float()])
    for g, expected in zip(got, grads):
        assert g.shape == expected.shape
        assert_close(g, expected.float(), scale=10)


def test_backward_with_padding_a_bias_and_a_dropout_mask():
    q, k, v = qkv(dtype=torch.float32, seed=20)
    d_o, bias = randn(B, H, S, D, seed=23), randn(1, H, S, S, seed=24)
    mask, keep_scale = _dropout_mask(seed=25), torch.full((1, 1, 1, 1), 1 / 0.75)
    lens = [17, 24]
    seq = torch.tensor(lens, dtype=torch.int32).view(B, 1, 1, 1)
    leaves = [t.double().requires_grad_() for t in (q, k, v, bias)]
    rows = torch.arange(S).view(1, 1, -1, 1) < seq.view(-1, 1, 1, 1)
    cols = torch.arange(S).view(1, 1, 1, -1) < seq.view(-1, 1, 1, 1)
    s = (leaves[0] @ leaves[1].transpose(-1, -2) * SCALE + leaves[3]).masked_fill(~(rows & cols), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num()
    o = (p * mask.double() / 0.75) @ leaves[2]
    (o * rows).backward(d_o.double())
    stats = torch.logsumexp(s.detach(), -1, keepdim=True)

    def builder(g, q, k, v, o, d_o, stats, bias, seq_q, seq_kv, mask, keep_scale):
        d_bias = g.tensor(dim=[1, H, S, S], stride=[H * S * S, S * S, S, 1], data_type=cudnn.data_type.FLOAT, name="dBias")
        dq, dk, dv = g.sdpa_backward(q=q, k=k, v=v, o=o, dO=d_o, stats=stats, attn_scale=SCALE, bias=bias, dBias=d_bias,
                                     use_padding_mask=True, seq_len_q=seq_q, seq_len_kv=seq_kv, dropout=(mask, keep_scale))
        return [dq, dk, dv, d_bias]

    got = run(builder, [q, k, v, (o * rows).detach().float(), d_o * rows, stats.float(), bias, seq, seq, mask, keep_scale])
    for g, leaf in zip(got, leaves):
        assert_close(g, leaf.grad.float(), scale=10)


# -- ragged (packed) operands: the suite's ragged graphs, described by the registry ---------

LENS_Q, LENS_KV = (5, 17, 30), (9, 12, 40)


def _packed(out: torch.Tensor, tokens: int) -> torch.Tensor:
    """The [T, H, D] token buffer behind a ragged [B, H, S, D] output."""
    return out.as_strided((tokens, out.shape[1], out.shape[3]), (out.stride(2), out.stride(1), out.stride(3)))


@pytest.mark.parametrize("own_o", [False, True], ids=["shared_offsets", "own_o_offsets"])
def test_ragged_forward_matches_attention_per_sequence(own_o):
    graph = rg.register()[own_o]
    inputs = rg.inputs(LENS_Q, LENS_KV, "cpu", own_o=own_o)
    (o,), _ = run_registered(graph, inputs)
    expected = rg.reference(*inputs[:3], LENS_Q, LENS_KV)
    assert_close(_packed(o, sum(LENS_Q)), expected, scale=2)


def test_ragged_training_forward_then_backward_is_autograd_per_sequence():
    forward_id = rg.register_training()
    backward_id = registry.definition(forward_id).backward_id
    inputs = rg.training_inputs(LENS_Q, LENS_KV, "cpu")
    (o, stats), _ = run_registered(forward_id, inputs)
    o, stats = _packed(o, sum(LENS_Q)), _packed(stats, sum(LENS_Q))
    d_o = rg.packed(sum(LENS_Q), "cpu", seed=7)
    q, k, v = inputs[:3]
    (dq, dk, dv, *_), _ = run_registered(backward_id, [d_o, q, k, v, o, stats, *inputs[3:]])
    dq, dk, dv = (_packed(t, n) for t, n in ((dq, sum(LENS_Q)), (dk, sum(LENS_KV)), (dv, sum(LENS_KV))))
    tq = tk = 0
    for nq, nk in zip(LENS_Q, LENS_KV):
        per = [t[a:a + n].transpose(0, 1)[None] for t, a, n in ((q, tq, nq), (k, tk, nk), (v, tk, nk))]
        o_ref, grads = _autograd(*per, d_o[tq:tq + nq].transpose(0, 1)[None], scale=rg.ATTN_SCALE)
        assert_close(o[tq:tq + nq], o_ref[0].transpose(0, 1).half(), scale=2)
        for got, expected in zip((dq[tq:tq + nq], dk[tk:tk + nk], dv[tk:tk + nk]), grads):
            assert_close(got, expected[0].transpose(0, 1).half(), scale=4)
        tq, tk = tq + nq, tk + nk
