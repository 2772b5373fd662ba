"""The interpreter's convolutions (fprop, dgrad, wgrad) and RoPE against torch (CPU)."""

import cudnn
import pytest
import torch
import torch.nn.functional as F
from torch.nn import grad as conv_grad

from support.interpreter import assert_close, describe, randn, run, same_layout

CL = torch.channels_last


def _true_convolution():
    """convolution_mode.CONVOLUTION: cudnn 1.32 does not export the enum (conv_fprop takes it), so
    it is read from the binding module, here only."""
    return cudnn._pybind_module.convolution_mode.CONVOLUTION


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("padding, stride, dilation", [([1, 1], [1, 1], [1, 1]), ([0, 2], [2, 3], [1, 2]), ([2, 1], [1, 2], [2, 1])])
def test_conv2d_fprop(layout, padding, stride, dilation):
    x, w = randn(2, 8, 13, 11, seed=1), randn(6, 8, 3, 3, seed=2)
    if layout == "nhwc":
        x, w = x.to(memory_format=CL), w.to(memory_format=CL)
    (y,) = run(lambda g, x, w: g.conv_fprop(x, w, padding=padding, stride=stride, dilation=dilation), [x, w])
    assert_close(y, F.conv2d(x.double(), w.double(), padding=padding, stride=stride, dilation=dilation).float())


@pytest.mark.parametrize("spatial", [1, 3])
def test_conv_fprop_in_one_and_three_spatial_dims(spatial):
    x, w = randn(2, 4, *([9] * spatial), seed=3), randn(5, 4, *([3] * spatial), seed=4)
    conv = {1: F.conv1d, 3: F.conv3d}[spatial]
    (y,) = run(lambda g, x, w: g.conv_fprop(x, w, padding=[1] * spatial, stride=[2] * spatial, dilation=[1] * spatial), [x, w])
    assert_close(y, conv(x.double(), w.double(), padding=1, stride=2).float())


def test_asymmetric_padding_pads_before_and_after_separately():
    x, w = randn(1, 3, 10, 10, seed=5), randn(4, 3, 3, 3, seed=6)
    (y,) = run(lambda g, x, w: g.conv_fprop(x, w, pre_padding=[0, 2], post_padding=[1, 0], stride=[1, 1], dilation=[1, 1]), [x, w])
    assert y.shape == (1, 4, 9, 10)
    assert_close(y, F.conv2d(F.pad(x.double(), (2, 0, 0, 1)), w.double()).float())


def test_grouped_and_true_convolution():
    x, w = randn(2, 8, 7, 7, seed=7), randn(6, 4, 3, 3, seed=8)  # 2 groups of 4 channels
    grouped, flipped = run(
        lambda g, x, w: [g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]),
                         g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1],
                                      convolution_mode=_true_convolution())], [x, w])
    assert_close(grouped, F.conv2d(x.double(), w.double(), padding=1, groups=2).float())
    assert_close(flipped, F.conv2d(x.double(), w.double().flip([2, 3]), padding=1, groups=2).float())


def test_int8_convolution_accumulates_exactly_in_int32():
    gen = torch.Generator().manual_seed(9)
    x = torch.randint(-127, 128, (2, 64, 8, 8), generator=gen, dtype=torch.int8).to(memory_format=CL)
    w = torch.randint(-127, 128, (4, 64, 3, 3), generator=gen, dtype=torch.int8).to(memory_format=CL)
    (y,) = run(
        lambda g, x, w: g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], compute_data_type=cudnn.data_type.INT32).set_data_type(torch.int32),
        [x, w], intermediate=torch.int32, compute=cudnn.data_type.INT32,
    )
    assert y.dtype == torch.int32
    assert torch.equal(y, F.conv2d(x.double(), w.double(), padding=1).to(torch.int32))


@pytest.mark.parametrize("stride", [1, 2])
def test_dgrad_is_torchs_conv2d_input_into_a_declared_nhwc_layout(stride):
    dy, w = randn(2, 6, 5, 5, dtype=torch.float16, seed=10).to(memory_format=CL), randn(6, 4, 3, 3, dtype=torch.float16, seed=11)
    x_dims = (2, 4, 10 if stride == 2 else 5, 10 if stride == 2 else 5)
    x_strides = (x_dims[1] * x_dims[2] * x_dims[3], 1, x_dims[3] * x_dims[1], x_dims[1])

    def builder(g, dy, w):
        dx = g.conv_dgrad(loss=dy, filter=w, padding=[1, 1], stride=[stride, stride], dilation=[1, 1])
        return dx.set_dim(list(x_dims)).set_stride(list(x_strides))

    graph, ins, outs, _ = describe(builder, [dy, w])
    (dx,) = run(builder, [dy, w])
    assert same_layout(dx, outs[0]) and dx.stride() == x_strides
    expected = conv_grad.conv2d_input(x_dims, w.double(), dy.double(), stride=stride, padding=1)
    assert_close(dx, expected.half())


def test_dgrad_with_asymmetric_padding_is_the_gradient_of_the_padded_fprop():
    dy, w = randn(1, 3, 9, 10, seed=12), randn(3, 2, 3, 3, seed=13)
    (dx,) = run(lambda g, dy, w: g.conv_dgrad(loss=dy, filter=w, pre_padding=[0, 2], post_padding=[1, 0], stride=[1, 1], dilation=[1, 1],
                                              out_dims=[1, 2, 10, 10]), [dy, w])
    x = torch.zeros(1, 2, 10, 10, dtype=torch.float64, requires_grad=True)
    F.conv2d(F.pad(x, (2, 0, 0, 1)), w.double()).backward(dy.double())
    assert_close(dx, x.grad.float())


@pytest.mark.parametrize("spatial", [2, 3])
def test_wgrad_is_torchs_conv_weight_gradient(spatial):
    x, dy = randn(2, 4, *([8] * spatial), seed=14), randn(2, 6, *([4] * spatial), seed=15)
    w_dims = [6, 4] + [3] * spatial
    (dw,) = run(lambda g, x, dy: g.conv_wgrad(image=x, loss=dy, padding=[1] * spatial, stride=[2] * spatial, dilation=[1] * spatial,
                                              out_dims=w_dims), [x, dy])
    weight = {2: conv_grad.conv2d_weight, 3: conv_grad.conv3d_weight}[spatial]
    assert_close(dw, weight(x.double(), w_dims, dy.double(), stride=2, padding=1).float(), scale=10)


def _rope_reference(x, freqs, rope_dim, scale, inverse=False):
    d = x.shape[-1]
    r = rope_dim or d
    angles = freqs[: x.shape[2], 0, 0, : r // 2].double()
    cos, sin = torch.cos(angles), torch.sin(angles) * (-1 if inverse else 1)
    rest, part = x.double()[..., : d - r], x.double()[..., d - r:]
    x1, x2 = part[..., : r // 2], part[..., r // 2:]
    return torch.cat([rest, x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1) * scale


@pytest.mark.parametrize("rope_dim, output_scale", [(0, 1.0), (16, 1.0), (16, 1.37)])
@pytest.mark.parametrize("backward", [False, True])
def test_rope_rotates_the_last_rope_dim_dims_and_scales(rope_dim, output_scale, backward):
    x = randn(2, 3, 12, 48, dtype=torch.bfloat16, seed=16)
    r = rope_dim or 48
    freqs = torch.zeros(20, 1, 1, r)
    freqs[:, 0, 0, : r // 2] = torch.outer(torch.arange(20.0), 1.0 / (10000.0 ** (torch.arange(r // 2) / (r // 2))))
    op = "rope_backward" if backward else "rope"
    (y,) = run(lambda g, x, f: getattr(g, op)(x, f, output_scale=output_scale, rope_dim=rope_dim), [x, freqs])
    assert_close(y, _rope_reference(x, freqs, rope_dim, output_scale, inverse=backward).to(torch.bfloat16))
