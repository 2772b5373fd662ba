"""The nn modules' graphs (torch_cudnn_handle/nn/) through the interpreter on the CPU, forward
and backward, against their plain-torch references (nn/reference.py) and autograd.

Each graph is described by the registry for the module's natural tensors (its
``OperandViews``), exactly as a call describes it; the interpreter reads each input through
the view the description declares (the tensor's address with the view's strides).
"""

import pytest
import torch

from support.interpreter import assert_close, randn, run_registered
from torch_cudnn_handle import nn as tnn
from torch_cudnn_handle import registry
from torch_cudnn_handle.nn import attention, linear, norm
from torch_cudnn_handle.nn.reference import reference_of

BATCH, ROWS, K, N = 2, 12, 32, 24


def _natural(out: torch.Tensor, spec) -> torch.Tensor:
    return out.view(spec.shape)


def _backward_id(graph_id: int) -> int:
    return registry.definition(graph_id).backward_id


@pytest.mark.parametrize("activation", linear.ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_linear_forward_and_its_declared_backward_steps(activation, dtype):
    torch.manual_seed(0)
    module = tnn.FusedLinear(K, N, activation=activation, dtype=dtype)
    reference = reference_of(module).double()
    x = randn(BATCH, ROWS, K, dtype=dtype, seed=1)
    outputs, layout = run_registered(linear.LINEAR_GRAPHS[activation], [x, module.weight.detach(), module.bias.detach()])
    y = _natural(outputs[0], layout.outputs[0])
    leaf = x.double().requires_grad_()
    expected = reference(leaf)
    assert y.shape == (BATCH, ROWS, N) and y.dtype == dtype
    assert_close(y, expected.detach().to(dtype), scale=4)

    # The backward as the module declares it: dZ (the activation's backward), dX = dZ W, dW = dZ^T X, db = sum dZ.
    dy = randn(BATCH, ROWS, N, dtype=dtype, seed=2)
    expected.backward(dy.double())
    dz = dy
    if activation is not None:
        pointwise, read = ((linear.RELU_BACKWARD_ROWS, y) if activation == "relu" else
                           (linear.Z_BACKWARD_ROWS[activation], _natural(outputs[1], layout.outputs[1])))
        (dz,), dz_layout = run_registered(pointwise, [dy, read])
        dz = _natural(dz, dz_layout.outputs[0])
    (dx,), dx_layout = run_registered(linear.MATMUL_DX, [dz, module.weight.detach()])
    (dw,), dw_layout = run_registered(linear.MATMUL_DW, [dz, x])
    assert_close(_natural(dx, dx_layout.outputs[0]), leaf.grad.to(dtype), scale=8)
    assert_close(_natural(dw, dw_layout.outputs[0]), reference.weight.grad.to(dtype), scale=8)
    assert_close(dz.double().sum((0, 1)).to(dtype), reference.bias.grad.to(dtype), scale=8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_forward_and_backward_graphs(dtype):
    module = tnn.RMSNorm(K, eps=1e-5, dtype=dtype)
    with torch.no_grad():
        module.weight.copy_(randn(K, dtype=dtype, seed=3, shift=1.0))
    reference = reference_of(module).double()
    x = randn(BATCH, ROWS, K, dtype=dtype, seed=4, scale=2.0)
    forward = norm.rmsnorm_graph(1e-5)
    (y, inv_var), layout = run_registered(forward, [x, module.weight.detach()])
    y, inv_var = _natural(y, layout.outputs[0]), _natural(inv_var, layout.outputs[1])
    leaf = x.double().requires_grad_()
    expected = reference(leaf)
    assert_close(y, expected.detach().to(dtype), scale=2)
    assert inv_var.shape == (BATCH, ROWS, 1) and inv_var.dtype == torch.float32
    assert_close(inv_var, torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-5).float())

    dy = randn(BATCH, ROWS, K, dtype=dtype, seed=5)
    expected.backward(dy.double())
    (dx, dscale), back_layout = run_registered(_backward_id(forward), [dy, x, module.weight.detach(), inv_var])
    assert_close(_natural(dx, back_layout.outputs[0]), leaf.grad.to(dtype), scale=4)
    assert_close(_natural(dscale, back_layout.outputs[1]), reference.weight.grad.to(dtype), scale=8)


def _heads(seed, dtype, b=2, s=16, heads=4, d=16):
    """[B, H, S, D] views of a [B, S, H*D] projection, BSHD in memory (what Attention feeds sdpa)."""
    return randn(b, s, heads * d, dtype=dtype, seed=seed).view(b, s, heads, d).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_graphs_forward_backward_and_inference(causal):
    dtype = torch.bfloat16
    q, k, v = (_heads(seed, dtype) for seed in (6, 7, 8))
    (o, stats), _ = run_registered(attention.SDPA_GRAPHS[causal], [q, k, v])
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    assert o.stride() == q.stride()  # O adopts Q's (BSHD) dimension order, as declared
    assert_close(o, expected.detach().to(dtype), scale=2)
    assert stats.shape == (2, 4, 16, 1) and stats.dtype == torch.float32

    (o_inference,), _ = run_registered(attention.SDPA_INFERENCE_GRAPHS[causal], [q, k, v])
    assert torch.equal(o_inference, o)

    d_o = torch.empty_like(o).copy_(randn(2, 4, 16, 16, dtype=dtype, seed=9))  # given O's strides, as the node does
    expected.backward(d_o.double())
    grads, _ = run_registered(_backward_id(attention.SDPA_GRAPHS[causal]), [q, k, v, o, d_o, stats])
    for got, leaf, like in zip(grads, leaves, (q, k, v)):
        assert got.stride() == like.stride()
        assert_close(got, leaf.grad.to(dtype), scale=4)
