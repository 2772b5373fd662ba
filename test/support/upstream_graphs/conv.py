"""Convolution graphs (test/python/conv/graph/test_conv_bias.py, test_wgrads.py; dgrad: public API)
and their entries."""

from __future__ import annotations

from typing import List

import cudnn
import torch

from .entry import CL, UpstreamGraph, _gen, _randn


# =====================================================================================
# conv (test/python/conv/graph/test_conv_bias.py, test_wgrads.py)


def conv_bias_relu(g, X, W, B, *, padding, stride, dilation, lower_clip, upper_clip):
    conv_output = g.conv_fprop(image=X, weight=W, pre_padding=padding, post_padding=padding, stride=stride, dilation=dilation)
    bias_output = g.bias(name="bias", input=conv_output, bias=B)
    return g.relu(name="relu", input=bias_output, lower_clip=lower_clip, upper_clip=upper_clip)


def _conv_bias_relu_inputs(device):
    gen = _gen(3)
    return [
        _randn(gen, 4, 16, 56, 56, device=device, memory_format=CL),
        _randn(gen, 16, 16, 3, 3, device=device, memory_format=CL),
        _randn(gen, 1, 16, 1, 1, device=device, memory_format=CL),
    ]


def _csbr(x, w, b=None, padding=(1, 1), stride=(1, 1), dilation=(1, 1), lower_clip=0.0, upper_clip=128):
    y = torch.nn.functional.conv2d(x, w, bias=None if b is None else b.reshape(-1), padding=padding, stride=stride, dilation=dilation)
    return torch.clamp(y, min=lower_clip, max=upper_clip)


def conv_relu(g, X, W, *, padding, stride, dilation, lower_clip, upper_clip):
    conv_output = g.conv_fprop(image=X, weight=W, padding=padding, stride=stride, dilation=dilation)
    return g.relu(name="relu", input=conv_output, lower_clip=lower_clip, upper_clip=upper_clip)


def _conv_relu_inputs(device):
    gen = _gen(4)
    return [_randn(gen, 20, 40, 30, 40, device=device, memory_format=CL), _randn(gen, 54, 40, 3, 4, device=device, memory_format=CL)]


def conv3d_bias_leaky_relu(g, X, W, B, *, padding, stride, dilation, negative_slope):
    conv_output = g.conv_fprop(image=X, weight=W, padding=padding, stride=stride, dilation=dilation)
    bias_output = g.bias(name="bias", input=conv_output, bias=B)
    return g.leaky_relu(name="relu", input=bias_output, negative_slope=negative_slope)


def _conv3d_inputs(device):
    gen = _gen(5)
    n, c, d, h, w, k = 4, 16, 52, 54, 56, 32
    return [
        _randn(gen, n, d, h, w, c, device=device).permute(0, 4, 1, 2, 3),
        _randn(gen, k, 3, 3, 3, c, device=device).permute(0, 4, 1, 2, 3),
        _randn(gen, 1, 1, 1, 1, k, device=device).permute(0, 4, 1, 2, 3),
    ]


def _conv3d_reference(inputs):
    x, w, b = inputs
    y = torch.nn.functional.conv3d(x, w, bias=b.reshape(-1), padding=[0, 1, 2], stride=[2, 3, 4], dilation=[1, 1, 1]).to(torch.float16)
    return [torch.nn.functional.leaky_relu(y, negative_slope=0.01)]


def leaky_relu_backward(g, loss, input, *, negative_slope):
    return g.leaky_relu_backward(loss=loss, input=input, negative_slope=negative_slope)


def _leaky_relu_backward_inputs(device):
    gen = _gen(6)
    return [_randn(gen, 4, 16, 56, 56, device=device, memory_format=CL), _randn(gen, 4, 16, 56, 56, device=device, memory_format=CL)]


def _leaky_relu_backward_reference(inputs):
    loss, x = inputs
    return [torch.ones_like(loss).masked_fill_(x <= 0.0, 0.01) * loss]


def scale_bias_relu_wgrad(g, X, DY, B, S, *, padding, stride, dilation, k, c):
    scale_output = g.scale(name="scale", input=X, scale=S)
    bias_output = g.bias(name="bias", input=scale_output, bias=B)
    relu_output = g.relu(name="relu", input=bias_output)
    wgrad_output = g.conv_wgrad(name="wgrad", image=relu_output, loss=DY, padding=padding, stride=stride, dilation=dilation)
    wgrad_output.set_dim([k, c, 3, 3])  # upstream declares the dims only
    return wgrad_output


def _wgrad_inputs(device):
    gen = _gen(7)
    n, c, k = 4, 32, 64
    return [
        _randn(gen, n, c, 32, 32, device=device, memory_format=CL),
        _randn(gen, n, k, 32, 32, device=device, memory_format=CL),
        _randn(gen, 1, c, 1, 1, device=device, memory_format=CL, scale=0.01),
        _randn(gen, 1, c, 1, 1, device=device, memory_format=CL, scale=0.01),
    ]


def _wgrad_reference(inputs):
    x, dy, b, s = (t.float() for t in inputs)
    image = torch.relu(x * s + b)
    return [torch.nn.grad.conv2d_weight(image, (64, 32, 3, 3), dy, padding=1).to(torch.float16)]


# conv dgrad: public API (conv_dgrad(loss, filter)); the output's layout declared as channels-last.
def conv_dgrad(g, DY, W, *, padding, stride, dilation, x_dim, x_stride):
    DX = g.conv_dgrad(name="dgrad", loss=DY, filter=W, padding=padding, stride=stride, dilation=dilation)
    DX.set_dim(list(x_dim)).set_stride(list(x_stride))
    return DX


def _dgrad_inputs(device):
    gen = _gen(8)
    return [_randn(gen, 4, 64, 32, 32, device=device, memory_format=CL), _randn(gen, 64, 32, 3, 3, device=device, memory_format=CL)]


def _dgrad_reference(inputs):
    dy, w = inputs
    return [torch.nn.grad.conv2d_input((4, 32, 32, 32), w.float(), dy.float(), padding=1).to(torch.float16)]


def conv_int8(g, X, W, *, padding, stride, dilation):
    conv_output = g.conv_fprop(image=X, weight=W, padding=padding, stride=stride, dilation=dilation)
    Y = g.identity(name="identity", input=conv_output)
    Y.set_data_type(cudnn.data_type.INT32)
    return Y


def _conv_int8_inputs(device):
    gen = _gen(9)
    x = torch.randint(-127, 128, (2, 64, 32, 32), generator=gen, dtype=torch.int8).to(device).to(memory_format=CL)
    w = torch.randint(-127, 128, (4, 64, 3, 3), generator=gen, dtype=torch.int8).to(device).to(memory_format=CL)
    return [x, w]


def _conv_int8_reference(inputs):
    x, w = inputs  # exact in float64 (|sum| < 2^53); torch has no int8 conv on the GPU
    return [torch.nn.functional.conv2d(x.double(), w.double(), padding=1).to(torch.int32)]


ENTRIES: List[UpstreamGraph] = [
    UpstreamGraph("conv_bias_relu", "conv fprop", "conv/graph/test_conv_bias.py::test_conv_bias_relu", conv_bias_relu,
                  _conv_bias_relu_inputs,
                  lambda i: [_csbr(*i, padding=[1, 1], stride=[3, 3], lower_clip=0.5, upper_clip=0.55)], [(0.05, 1e-2)],
                  params=dict(padding=[1, 1], stride=[3, 3], dilation=[1, 1], lower_clip=0.5, upper_clip=0.55)),
    UpstreamGraph("conv_relu", "conv fprop", "conv/graph/test_conv_bias.py::test_conv_relu", conv_relu, _conv_relu_inputs,
                  lambda i: [_csbr(*i, padding=[0, 1], stride=[2, 3], lower_clip=0.5, upper_clip=0.55)], [(1e-3, 1e-3)],
                  params=dict(padding=[0, 1], stride=[2, 3], dilation=[1, 1], lower_clip=0.5, upper_clip=0.55)),
    UpstreamGraph("conv3d_bias_leaky_relu", "conv fprop", "conv/graph/test_conv_bias.py::test_conv3d_bias_leaky_relu",
                  conv3d_bias_leaky_relu, _conv3d_inputs, _conv3d_reference, [(1e-2, 1e-2)],
                  params=dict(padding=[0, 1, 2], stride=[2, 3, 4], dilation=[1, 1, 1], negative_slope=0.01)),
    UpstreamGraph("leaky_relu_backward", "conv fprop", "conv/graph/test_conv_bias.py::test_leaky_relu_backward",
                  leaky_relu_backward, _leaky_relu_backward_inputs, _leaky_relu_backward_reference, [(1e-4, 1e-4)],
                  params=dict(negative_slope=0.01)),
    UpstreamGraph("conv_int8", "int8", "conv/graph/test_conv_bias.py::test_conv_int8", conv_int8, _conv_int8_inputs,
                  _conv_int8_reference, [(1e-2, 1e-2)], params=dict(padding=[1, 1], stride=[1, 1], dilation=[1, 1]),
                  frontend_types=dict(io_data_type=cudnn.data_type.INT8, intermediate_data_type=cudnn.data_type.INT32,
                                      compute_data_type=cudnn.data_type.INT32)),
    UpstreamGraph("scale_bias_relu_wgrad", "conv wgrad", "conv/graph/test_wgrads.py::test_scale_bias_relu_wgrad",
                  scale_bias_relu_wgrad, _wgrad_inputs, _wgrad_reference, [(1e-2, 1e-2)],
                  params=dict(padding=[1, 1], stride=[1, 1], dilation=[1, 1], k=64, c=32),
                  note="upstream declares only the output's dims (the frontend infers its strides) and runs it without a "
                       "reference; reference and tolerance ours"),
    UpstreamGraph("conv_dgrad", "conv dgrad", "public API (conv_dgrad)", conv_dgrad, _dgrad_inputs, _dgrad_reference,
                  [(1e-2, 1e-2)],
                  params=dict(padding=[1, 1], stride=[1, 1], dilation=[1, 1], x_dim=(4, 32, 32, 32), x_stride=(32768, 1, 1024, 32)),
                  note="public API; tolerance ours"),
]
