"""Every torch_cudnn_handle.nn module forward and backward on the CPU: the op's CPU kernel
(the reference interpreter) runs its graphs, forward graphs, declared backward graphs and
backward steps alike, against the module's plain-torch reference (``reference_of``) in
float32, the ground truth for low-precision runs."""

import pytest
import torch

from torch_cudnn_handle import registry
from torch_cudnn_handle.nn import Attention, FusedLinear, LayerNorm, RMSNorm, TransformerBlock, reference_of, sdpa, sdpa_reference

# What a result stored in the dtype may be off by, relative to the largest value of its
# output (the reference in float32; the module computes in float32 and rounds where cuDNN
# does: a bf16 block rounds each graph's output, so errors add up along the block).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _close(got, expected, dtype, what):
    scale = float(expected.detach().abs().max()) or 1.0
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=tol * scale, rtol=tol, msg=lambda m: f"{what}: {m}")


def _forward_backward(module, x):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    weights = torch.linspace(-1, 1, y.numel()).view(y.shape)  # a gradient that is not symmetric
    (y.float() * weights).sum().backward()
    return y, x.grad


def _check_module(module, x, dtype):
    reference = reference_of(module).float()
    y, dx = _forward_backward(module, x)
    y_ref, dx_ref = _forward_backward(reference, x.float())
    assert (y.shape, y.dtype, y.device.type) == (y_ref.shape, dtype, "cpu")
    _close(y, y_ref, dtype, "output")
    _close(dx, dx_ref, dtype, "input gradient")
    grads = dict(reference.named_parameters())
    largest = max(float(p.grad.abs().max()) for p in grads.values())
    for name, parameter in module.named_parameters():
        expected = grads[name].grad
        # A gradient that is zero in exact arithmetic (attention's key bias) is noise: judged against the block's scale.
        floor = 0.05 * largest
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(
            parameter.grad.float(), expected, atol=tol * max(float(expected.abs().max()), floor), rtol=tol, msg=lambda m: f"{name}: {m}"
        )


def _x(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_fused_linear(activation, dtype):
    torch.manual_seed(0)
    _check_module(FusedLinear(32, 24, activation, dtype=dtype), _x(2, 5, 32, dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("module", [RMSNorm, LayerNorm], ids=lambda m: m.__name__)
def test_norms(module, dtype):
    torch.manual_seed(0)
    norm = module(48, eps=1e-5, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(48) + 0.5)
        if module is LayerNorm:
            norm.bias.copy_(torch.rand(48) - 0.5)
    _check_module(norm, _x(3, 7, 48, dtype=dtype), dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sdpa_training_and_inference_graphs(dtype, causal):
    q, k, v = (_x(2, 3, 10, 16, dtype=dtype, seed=s).transpose(1, 2).contiguous().transpose(1, 2) for s in range(3))  # BSHD in memory
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = sdpa(*leaves, causal=causal)  # grads wanted: the training graph (O and the softmax stats)
    assert o.stride() == (q.stride(0), q.stride(1), q.stride(2), 1)  # O in Q's dimension order, as on the GPU
    weights = torch.linspace(-1, 1, o.numel()).view(o.shape)
    (o.float() * weights).sum().backward()
    floats = [t.float().requires_grad_() for t in (q, k, v)]
    expected = sdpa_reference(*floats, causal=causal)
    (expected * weights).sum().backward()
    _close(o, expected, dtype, "O")
    for got, leaf, name in zip(leaves, floats, "qkv"):
        _close(got.grad, leaf.grad, dtype, f"d{name}")
    with torch.no_grad():
        inference = sdpa(q, k, v, causal=causal)  # no grads: the inference graph
    _close(inference, expected, dtype, "O (inference)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_attention(dtype):
    torch.manual_seed(0)
    _check_module(Attention(32, 2, dtype=dtype), _x(2, 6, 32, dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_transformer_block(dtype):
    torch.manual_seed(0)
    _check_module(TransformerBlock(32, 2, mlp_ratio=2, dtype=dtype), _x(2, 8, 32, dtype=dtype), dtype)


def test_a_cpu_model_runs_no_cudnn_build():
    """The CPU kernel describes each graph and never builds one: nothing enters the graph cache."""
    before = registry.graph_stats()
    block = TransformerBlock(16, 2, mlp_ratio=2, dtype=torch.bfloat16)
    _forward_backward(block, _x(1, 4, 16, dtype=torch.bfloat16))
    after = registry.graph_stats()
    assert (after["builds"], after["misses"], after["cached"]) == (before["builds"], before["misses"], before["cached"])
