"""Batch normalization graphs (test/python/norm/graph/test_batchnorm.py) and their entries."""

from __future__ import annotations

from typing import List

import cudnn
import torch

from .entry import CL, UpstreamGraph, _gen, _host_scalar, _randn


# =====================================================================================
# batchnorm (test/python/norm/graph/test_batchnorm.py)


def batchnorm_relu_mask(g, x, scale, bias, in_running_mean, in_running_var, epsilon, momentum, comparison):
    y_before_relu, saved_mean, saved_inv_var, out_running_mean, out_running_var = g.batchnorm(
        name="BN", input=x, scale=scale, bias=bias, in_running_mean=in_running_mean, in_running_var=in_running_var,
        epsilon=epsilon, momentum=momentum,
    )
    y = g.relu(name="relu", input=y_before_relu)
    mask = g.cmp_gt(name="cmp", input=y, comparison=comparison)
    for t in (saved_mean, saved_inv_var, out_running_mean, out_running_var):
        t.set_data_type(cudnn.data_type.FLOAT)
    mask.set_data_type(cudnn.data_type.BOOLEAN)
    return y, saved_mean, saved_inv_var, out_running_mean, out_running_var, mask


def _batchnorm_inputs(device):
    gen = _gen(13)
    n, c, h, w = 4, 16, 56, 56
    x = _randn(gen, n, c, h, w, device=device, memory_format=CL)
    scale, bias, running_mean, running_var = (_randn(gen, 1, c, 1, 1, dtype=torch.float32, device=device) for _ in range(4))
    comparison = torch.zeros_like(x)
    return [x, scale, bias, running_mean, running_var, _host_scalar(1e-3, 4), _host_scalar(1e-1, 4), comparison]


def _batchnorm_reference(inputs):
    x, scale, bias, running_mean, running_var, epsilon, momentum, _ = inputs
    x_ref = x.float()
    y = torch.nn.functional.batch_norm(
        x_ref, running_mean.clone().view(-1), running_var.clone().view(-1), weight=scale.view(-1), bias=bias.view(-1),
        training=True, momentum=momentum.item(), eps=epsilon.item(),
    )
    mean = torch.mean(x_ref, dim=(0, 2, 3), keepdim=True)
    inv_var = torch.rsqrt(torch.var(x_ref, dim=(0, 2, 3), keepdim=True) + epsilon.item())
    return [torch.relu(y), mean, inv_var, None, None, None]  # upstream checks y, mean, inv_var


def drelu_dadd_dbn(g, x, x_mask, scale, mean, inv_var, dY):
    dX_drelu = g.scale(name="drelu", input=dY, scale=x_mask)
    dX_drelu.set_data_type(cudnn.data_type.HALF)
    dX, dScale, dBias = g.batchnorm_backward(name="DBN", grad=dX_drelu, input=x, scale=scale, mean=mean, inv_variance=inv_var)
    dX.set_data_type(cudnn.data_type.HALF)
    dScale.set_data_type(cudnn.data_type.FLOAT)
    dBias.set_data_type(cudnn.data_type.FLOAT)
    return dX_drelu, dX, dScale, dBias  # upstream's dump_dX_dRelu=True


def _drelu_dbn_inputs(device):
    gen = _gen(14)
    n, c, h, w = 4, 16, 56, 56
    x = _randn(gen, n, c, h, w, device=device, memory_format=CL)
    x_mask = _randn(gen, n, c, h, w, device=device, memory_format=CL) > 0.0
    scale, mean, inv_var = (_randn(gen, 1, c, 1, 1, dtype=torch.float32, device=device) for _ in range(3))
    dy = _randn(gen, n, c, h, w, device=device, memory_format=CL)
    return [x, x_mask, scale, mean, inv_var, dy]


def _bn_backward(grad, x, scale, mean, inv_var):
    """Batchnorm's backward for given saved statistics (float32)."""
    count = grad.numel() // grad.shape[1]
    xhat = (x - mean) * inv_var
    dbias = grad.sum(dim=(0, 2, 3), keepdim=True)
    dscale = (grad * xhat).sum(dim=(0, 2, 3), keepdim=True)
    dx = scale * inv_var * (grad - dbias / count - xhat * dscale / count)
    return dx, dscale, dbias


def _drelu_dbn_reference(inputs):
    x, x_mask, scale, mean, inv_var, dy = inputs
    drelu = dy * x_mask
    dx, dscale, dbias = _bn_backward(drelu.float(), x.float(), scale, mean, inv_var)
    return [drelu, dx.half(), dscale, dbias]


def bn_infer_drelu_dbn(g, x, dY, scale, bias, mean, inv_variance):
    y = g.batchnorm_inference(input=x, mean=mean, inv_variance=inv_variance, scale=scale, bias=bias)
    dX_dRelu = g.relu_backward(loss=dY, input=y)
    dX_dRelu.set_data_type(cudnn.data_type.HALF)
    dX, dScale, dBias = g.batchnorm_backward(name="DBN", grad=dX_dRelu, input=x, scale=scale, mean=mean, inv_variance=inv_variance)
    dScale.set_data_type(cudnn.data_type.FLOAT)
    dBias.set_data_type(cudnn.data_type.FLOAT)
    return dX, dScale, dBias


def _bn_infer_inputs(device):
    gen = _gen(15)
    n, c, h, w = 4, 16, 56, 56
    x = _randn(gen, n, c, h, w, device=device, memory_format=CL)
    scale, bias, mean, inv_var = (_randn(gen, 1, c, 1, 1, dtype=torch.float32, device=device) for _ in range(4))
    dy = _randn(gen, n, c, h, w, device=device, memory_format=CL)
    return [x, dy, scale, bias, mean, inv_var]


def _bn_infer_reference(inputs):
    x, dy, scale, bias, mean, inv_var = inputs
    y = (x.float() - mean) * inv_var * scale + bias
    drelu = (dy.float() * (y > 0)).half().float()  # the graph's dX_dRelu is HALF
    dx, dscale, dbias = _bn_backward(drelu, x.float(), scale, mean, inv_var)
    return [dx.half(), dscale, dbias]


ENTRIES: List[UpstreamGraph] = [
    UpstreamGraph("batchnorm_relu_mask", "batchnorm", "norm/graph/test_batchnorm.py::test_bn_relu_with_mask",
                  batchnorm_relu_mask, _batchnorm_inputs, _batchnorm_reference, [(1e-3, 1e-3)] * 6,
                  in_place={3: 3, 4: 4},
                  note="the bool mask (output 5) is written by cuDNN as bits, which the op unpacks; the running stats are "
                       "written in place (into inputs 3 and 4), as upstream binds them"),
    UpstreamGraph("drelu_dadd_dbn", "batchnorm", "norm/graph/test_batchnorm.py::test_drelu_dadd_dbn[dump_dX_dRelu1]",
                  drelu_dadd_dbn, _drelu_dbn_inputs, _drelu_dbn_reference, [(1e-3, 1e-3)] + [(1e-2, 1e-2)] * 3,
                  note="the bool mask input is read by cuDNN as bits, which the op packs; upstream runs it without a "
                       "reference; reference and tolerance ours"),
    UpstreamGraph("bn_infer_drelu_dbn", "batchnorm", "norm/graph/test_batchnorm.py::test_bn_infer_drelu_dbn",
                  bn_infer_drelu_dbn, _bn_infer_inputs, _bn_infer_reference, [(1e-2, 1e-2)] * 3,
                  note="upstream runs it without a reference; reference and tolerance ours"),
]
