"""Attention length buckets (nn/attention_buckets.py, Note [Length buckets]): a
self-attention call is served by its length's bucket -- one ragged graph per (causal,
bucket) for every length up to it -- and is right against torch, forward and backward,
with no padded position reaching the output or the gradients. On CPU tensors the op runs
the graph through the torch interpreter (the CPU kernel); the GPU file checks cuDNN."""

import pytest
import torch
import torch.nn.functional as F

import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import Attention, sdpa
from torch_cudnn_handle.nn.attention_buckets import MIN_BUCKET, lengths_and_offsets, bucket_of
from torch_cudnn_handle.registry.describe import described_layout


@pytest.fixture(autouse=True)
def buckets_on(fresh_settings):
    fresh_settings.set_attention_buckets(True)


def test_buckets_are_powers_of_two_from_the_smallest():
    assert [bucket_of(n) for n in (1, MIN_BUCKET, MIN_BUCKET + 1, 256, 257, 4096, 4097)] == [128, 128, 256, 256, 512, 4096, 8192]


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3, 8])
def testlengths_and_offsets_written_in_one_copy_are_the_graphs_inputs(batch, training):
    """One host buffer, one copy: each tensor what the ragged graph reads, each 16-byte aligned (no staging copy)."""
    made = lengths_and_offsets(batch, 37, 4, 8, torch.device("cpu"), training)
    expected = [torch.full((batch, 1, 1, 1), 37, dtype=torch.int32)] * 2 + [torch.arange(batch + 1) * 37 * 32] * 2
    expected += [torch.arange(batch + 1) * 37 * 4] if training else []
    assert len(made) == len(expected)
    for got, want in zip(made, expected):
        assert got.dtype == want.dtype and torch.equal(got, want) and got.data_ptr() % 16 == 0


def _qkv(b, h, s, d, *, token_major=True, seed=0, dtype=torch.bfloat16, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    shape = (b, s, h, d) if token_major else (b, h, s, d)
    tensors = [(torch.randn(*shape, generator=generator) * 0.5).to(dtype) for _ in range(3)]
    tensors = [t.transpose(1, 2) if token_major else t for t in tensors]
    return [t.requires_grad_(requires_grad) for t in tensors]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [5, 128, 200])
def test_a_bucketed_call_is_right_against_torch(causal, length):
    q, k, v = _qkv(2, 2, length, 16)
    o = sdpa(q, k, v, causal)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert o.shape == q.shape and o.dtype == q.dtype
    torch.testing.assert_close(o.float(), expected, atol=2e-2, rtol=2e-2)


def test_lengths_in_one_bucket_share_one_graph_and_one_description():
    descriptions = described_layout.cache_info().misses
    built = tch.stats.graphs()["definitions"]
    for length in (131, 140, 199, 256):  # all in bucket 256
        sdpa(*_qkv(1, 2, length, 16, seed=length), True)
    assert tch.stats.graphs()["definitions"] - built <= 1  # at most the bucket's inference graph, registered once
    assert described_layout.cache_info().misses - descriptions <= 1  # T is in no key: one description serves them all


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_torch_and_padding_never_reaches_them(causal):
    q, k, v = _qkv(2, 2, 37, 16, requires_grad=True)
    d_o = torch.randn(2, 2, 37, 16).to(torch.bfloat16)
    grads = torch.autograd.grad(sdpa(q, k, v, causal), (q, k, v), d_o)
    reference = [t.detach().float().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(F.scaled_dot_product_attention(*reference, is_causal=causal), reference, d_o.float())
    for grad, want, name in zip(grads, expected, "qkv"):
        assert grad.shape == want.shape and grad.dtype == torch.bfloat16
        torch.testing.assert_close(grad.float(), want, atol=3e-2, rtol=3e-2, msg=f"d{name}")


@pytest.mark.parametrize("batch", [1, 2])
def test_a_layout_that_is_not_token_major_is_copied_and_right(batch):
    """Batch 1 too: there a reshape of the head-major layout is a view, not the token-major copy."""
    q, k, v = _qkv(batch, 2, 50, 16, token_major=False)
    torch.testing.assert_close(sdpa(q, k, v, True).float(), F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True),
                               atol=2e-2, rtol=2e-2)


def test_the_attention_module_trains_through_buckets_like_torch():
    torch.manual_seed(0)
    block = Attention(32, 2, causal=True, dtype=torch.bfloat16)
    x = torch.randn(2, 45, 32).to(torch.bfloat16).requires_grad_()
    y = block(x)
    y.float().square().mean().backward()
    reference = tch.nn.reference_of(block)
    x_ref = x.detach().clone().requires_grad_()
    y_ref = reference(x_ref)
    y_ref.float().square().mean().backward()
    torch.testing.assert_close(y.float(), y_ref.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(x.grad.float(), x_ref.grad.float(), atol=3e-2, rtol=3e-2)


def test_a_call_is_bitwise_repeatable():
    q, k, v = _qkv(1, 2, 70, 16)
    assert torch.equal(sdpa(q, k, v, True), sdpa(q, k, v, True))


def test_compile_with_dynamic_shapes_compiles_one_frame_per_bucket(fresh_dynamo):
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda q: sdpa(q, q, q, True), backend=counter, dynamic=True, fullgraph=True)
    for length in (136, 200, 250, 300, 400):
        q = torch.empty(2, length, 8, 64, dtype=torch.bfloat16, device="meta").transpose(1, 2)
        assert compiled(q).shape == q.shape
    assert counter.frame_count == 2  # buckets 256 and 512
