"""Layer, RMS and instance normalization graphs (test/python/norm/graph/) and their entries."""

from __future__ import annotations

from typing import List

import cudnn
import torch

from .entry import CL, UpstreamGraph, _gen, _host_scalar, _randn


# =====================================================================================
# normalizations (test/python/norm/graph/)


def layernorm_forward(g, X, scale, bias, epsilon):
    Y, mean, inv_var = g.layernorm(
        name="LN", norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=scale, bias=bias, epsilon=epsilon
    )
    Y.set_data_type(X.data_type)
    mean.set_data_type(cudnn.data_type.FLOAT)
    inv_var.set_data_type(cudnn.data_type.FLOAT)
    return Y, mean, inv_var


def _layernorm_tensors(device, requires_grad=False):
    gen = _gen(10)
    e = 1024
    x = _randn(gen, 16, 128, e, device=device, scale=3, shift=-0.5)
    scale = _randn(gen, 1, 1, e, device=device, scale=5, shift=-1)
    bias = _randn(gen, 1, 1, e, device=device, scale=7, shift=-2)
    return [t.requires_grad_(requires_grad) for t in (x, scale, bias)], gen


def _layernorm_forward_inputs(device):
    (x, scale, bias), _ = _layernorm_tensors(device)
    return [x, scale, bias, _host_scalar(1e-3, 3)]


def _layernorm_forward_reference(inputs):
    x, scale, bias, _ = inputs
    y = torch.nn.functional.layer_norm(x, [x.shape[-1]], weight=scale.reshape(-1), bias=bias.reshape(-1), eps=1e-3)
    mean = x.float().mean(dim=-1, keepdim=True)
    inv_var = torch.rsqrt(torch.var(x.float(), dim=-1, keepdim=True, correction=0) + 1e-3)
    return [y, mean, inv_var]


def layernorm_backward(g, DY, X, scale, mean, inv_var):
    DX, Dscale, Dbias = g.layernorm_backward(name="DLN", grad=DY, input=X, scale=scale, mean=mean, inv_variance=inv_var)
    for t in (DX, Dscale, Dbias):
        t.set_data_type(X.data_type)
    return DX, Dscale, Dbias


def _layernorm_autograd(device):
    """Upstream's backward setup: layer_norm, an MSE loss against a random target, backward.
    Mean and inverse variance come from torch here (upstream feeds its forward graph's)."""
    (x, scale, bias), gen = _layernorm_tensors(device, requires_grad=True)
    y = torch.nn.functional.layer_norm(x, [x.shape[-1]], weight=scale.reshape(-1), bias=bias.reshape(-1), eps=1e-3)
    y.retain_grad()
    target = _randn(gen, *y.shape, device=device)
    torch.nn.functional.mse_loss(y, target).backward()
    mean = x.detach().float().mean(dim=-1, keepdim=True)
    inv_var = torch.rsqrt(torch.var(x.detach().float(), dim=-1, keepdim=True, correction=0) + 1e-3)
    return x, scale, bias, y.grad, mean, inv_var


def _layernorm_backward_inputs(device):
    x, scale, _, dy, mean, inv_var = _layernorm_autograd(device)
    return [dy, x.detach(), scale.detach(), mean, inv_var]


def _layernorm_backward_reference(inputs):
    x, scale, bias, _, _, _ = _layernorm_autograd(inputs[0].device)
    return [x.grad, scale.grad, bias.grad]


class _RMSNormReference(torch.nn.Module):
    """Upstream's reference module (mean of squares, rsqrt in float32, scale, then bias)."""

    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight, bias=None):
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        inv_var = torch.rsqrt(norm_x.float() + self.eps)
        y = weight * (x * inv_var.to(x.dtype))
        if bias is not None:
            y = y + bias
        return y, inv_var


def rmsnorm_forward(g, X, scale, bias, epsilon):
    Y, inv_var = g.rmsnorm(
        name="RMS", norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=scale, bias=bias, epsilon=epsilon
    )
    Y.set_data_type(X.data_type)
    inv_var.set_data_type(cudnn.data_type.FLOAT)
    return Y, inv_var


def _rmsnorm_tensors(device, requires_grad=False):
    gen = _gen(11)
    e = 1024
    x = _randn(gen, 16, 128, e, device=device, scale=2, shift=-1.25)
    scale = _randn(gen, 1, 1, e, device=device, scale=3, shift=-2.75)
    bias = _randn(gen, 1, 1, e, device=device)
    return [t.requires_grad_(requires_grad) for t in (x, scale, bias)], gen


def _rmsnorm_forward_inputs(device):
    (x, scale, bias), _ = _rmsnorm_tensors(device)
    return [x, scale, bias, _host_scalar(1e-3, 3)]


def _rmsnorm_forward_reference(inputs):
    x, scale, bias, _ = inputs
    return list(_RMSNormReference(1e-3)(x, scale, bias))


def rmsnorm_backward(g, grad, X, scale, inv_var):
    DX, Dscale, Dbias = g.rmsnorm_backward(name="DRMS", grad=grad, input=X, scale=scale, inv_variance=inv_var, has_dbias=True)
    for t in (DX, Dscale, Dbias):
        t.set_data_type(X.data_type)
    return DX, Dscale, Dbias


def _rmsnorm_autograd(device):
    (x, scale, bias), gen = _rmsnorm_tensors(device, requires_grad=True)
    y, inv_var = _RMSNormReference(1e-3)(x, scale, bias)
    y.retain_grad()
    target = _randn(gen, *y.shape, device=device)
    torch.nn.functional.mse_loss(y, target).backward()
    return x, scale, bias, y.grad, inv_var.detach()


def _rmsnorm_backward_inputs(device):
    x, scale, _, dy, inv_var = _rmsnorm_autograd(device)
    return [dy, x.detach(), scale.detach(), inv_var]


def _rmsnorm_backward_reference(inputs):
    x, scale, bias, _, _ = _rmsnorm_autograd(inputs[0].device)
    return [x.grad, scale.grad, bias.grad]


def instancenorm_forward(g, X, scale, bias, epsilon):
    Y, mean, inv_var = g.instancenorm(
        name="IN", norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=scale, bias=bias, epsilon=epsilon
    )
    Y.set_data_type(X.data_type)
    mean.set_data_type(cudnn.data_type.FLOAT)
    inv_var.set_data_type(cudnn.data_type.FLOAT)
    return Y, mean, inv_var


def _instancenorm_tensors(device, requires_grad=False):
    gen = _gen(12)
    n, c, h, w = 16, 32, 64, 64
    x = _randn(gen, n, c, h, w, device=device, memory_format=CL)
    scale = _randn(gen, 1, c, 1, 1, device=device, memory_format=CL)
    bias = _randn(gen, 1, c, 1, 1, device=device, memory_format=CL)
    return [t.requires_grad_(requires_grad) for t in (x, scale, bias)], gen


def _instancenorm_forward_inputs(device):
    (x, scale, bias), _ = _instancenorm_tensors(device)
    return [x, scale, bias, _host_scalar(1e-5, 4)]


def _instancenorm_forward_reference(inputs):
    x, scale, bias, _ = inputs
    c = x.shape[1]
    y = torch.nn.functional.instance_norm(x, weight=scale.view(c), bias=bias.view(c))
    mean = x.float().mean(dim=(2, 3), keepdim=True)
    inv_var = torch.rsqrt(torch.var(x.float(), dim=(2, 3), keepdim=True) + 1e-5)
    return [y, mean, inv_var]


def instancenorm_backward(g, DY, X, scale, mean, inv_var):
    DX, Dscale, Dbias = g.instancenorm_backward(name="DIN", grad=DY, input=X, scale=scale, mean=mean, inv_variance=inv_var)
    for t in (DX, Dscale, Dbias):
        t.set_data_type(X.data_type)
    return DX, Dscale, Dbias


def _instancenorm_autograd(device):
    (x, scale, bias), gen = _instancenorm_tensors(device, requires_grad=True)
    c = x.shape[1]
    y = torch.nn.functional.instance_norm(x, weight=scale.view(c), bias=bias.view(c))
    y.retain_grad()
    target = _randn(gen, *y.shape, device=device)
    torch.nn.functional.mse_loss(y, target).backward()
    mean = x.detach().float().mean(dim=(2, 3), keepdim=True)
    inv_var = torch.rsqrt(torch.var(x.detach().float(), dim=(2, 3), keepdim=True) + 1e-5)
    return x, scale, bias, y.grad.to(memory_format=CL), mean, inv_var


def _instancenorm_backward_inputs(device):
    x, scale, _, dy, mean, inv_var = _instancenorm_autograd(device)
    return [dy, x.detach(), scale.detach(), mean, inv_var]


def _instancenorm_backward_reference(inputs):
    x, scale, bias, _, _, _ = _instancenorm_autograd(inputs[0].device)
    return [x.grad, scale.grad, bias.grad]


ENTRIES: List[UpstreamGraph] = [
    UpstreamGraph("layernorm_forward", "layernorm", "norm/graph/test_layernorm.py::test_layernorm (forward)",
                  layernorm_forward, _layernorm_forward_inputs, _layernorm_forward_reference, [(1e-2, 1e-2)] * 3),
    UpstreamGraph("layernorm_backward", "layernorm", "norm/graph/test_layernorm.py::test_layernorm (backward)",
                  layernorm_backward, _layernorm_backward_inputs, _layernorm_backward_reference, [(2e-4, 2e-4)] * 3),
    UpstreamGraph("rmsnorm_forward", "rmsnorm", "norm/graph/test_rmsnorm.py::test_rmsnorm (forward, bias)",
                  rmsnorm_forward, _rmsnorm_forward_inputs, _rmsnorm_forward_reference, [(0.03125, 0.03125), (0.005, 0.005)]),
    UpstreamGraph("rmsnorm_backward", "rmsnorm", "norm/graph/test_rmsnorm.py::test_rmsnorm (backward, dbias)",
                  rmsnorm_backward, _rmsnorm_backward_inputs, _rmsnorm_backward_reference,
                  [(2e-4, 2e-4), (5e-4, 5e-4), (5e-4, 5e-4)]),
    UpstreamGraph("instancenorm_forward", "instancenorm", "norm/graph/test_instancenorm.py::test_in (forward)",
                  instancenorm_forward, _instancenorm_forward_inputs, _instancenorm_forward_reference, [(1e-2, 1e-2)] * 3),
    UpstreamGraph("instancenorm_backward", "instancenorm", "norm/graph/test_instancenorm.py::test_in (backward)",
                  instancenorm_backward, _instancenorm_backward_inputs, _instancenorm_backward_reference, [(2e-3, 2e-3)] * 3,
                  note="upstream also binds an epsilon the backward node never reads; left out"),
]
