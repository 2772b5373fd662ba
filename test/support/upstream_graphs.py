"""Graphs from the frontend's own upstream Python tests (NVIDIA/cudnn-frontend, test/python/),
one entry per graph, for test_upstream_graphs_gpu.py (GPU) and test_upstream_graphs.py (CPU).

Each builder makes the node calls upstream makes, with upstream's attributes; only the glue
differs: the builder receives one cudnn tensor per op input (the registry, or
``describe_with_frontend`` below, creates them from the call's tensors) instead of creating
them with ``graph.tensor``/``graph.tensor_like``, and returns its outputs instead of calling
``set_output(True)`` (the registry does). Shapes, dtypes, layouts and tolerances are
upstream's unless an entry's ``note`` says otherwise.

An entry holds: name, family, builder, params (passed to the builder as keyword arguments;
part of the registered definition), make_inputs(device) (op inputs in the builder's order;
a host scalar stays a CPU tensor, as upstream passes it), reference(inputs) (upstream's torch
reference: one expected tensor or None per output), tolerances (atol, rtol) per output,
region(outputs, inputs) (the part of each output a graph defines, for graphs that leave
padding rows unwritten), in_place ({output: input} where upstream binds an output to an
input's buffer: registered so, and bound so when the frontend runs the graph), and frontend_types: the graph-level data types upstream gives a graph the registry cannot
describe (an all-integer graph), used only when the frontend runs the graph itself.

Upstream files the entries come from (paths in NVIDIA/cudnn-frontend):
  test/python/test_matmul_bias_relu.py (matmul + bias; int8 x bf16 matmul)
  test/python/conv/graph/test_conv_bias.py (conv fprop fusions, leaky relu backward, int8 conv)
  test/python/conv/graph/test_wgrads.py (scale-bias-relu-wgrad)
  test/python/norm/graph/test_layernorm.py, test_rmsnorm.py, test_instancenorm.py, test_batchnorm.py
  test/python/sdpa/fp16.py + fp16_ref.py (the SDPA forward/backward graphs of test_mhas_v2.py,
    its RoPE pre-processing, dropout, padding and ragged configurations, and its references)
Entries whose ``note`` says "public API" are written from the frontend's API where the stored
upstream snapshot has no such graph (conv dgrad, fp8 matmul).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cudnn
import torch
from cudnn.datatypes import torch_to_cudnn_data_type

import torch_cudnn_handle as tch

CL = torch.channels_last
F32 = cudnn.data_type.FLOAT

# Why the op refuses a graph today (torch_cudnn_handle/op.py, registry/description.py).


@dataclasses.dataclass
class UpstreamGraph:
    name: str
    family: str
    upstream: str  # where the graph comes from
    builder: Callable[..., Any]
    make_inputs: Callable[[str], List[torch.Tensor]]
    reference: Callable[[List[torch.Tensor]], List[Optional[torch.Tensor]]]
    tolerances: Sequence[Tuple[float, float]]  # (atol, rtol) per output
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    region: Optional[Callable[[List[torch.Tensor], List[torch.Tensor]], List[torch.Tensor]]] = None
    frontend_types: Optional[Dict[str, Any]] = None
    in_place: Optional[Dict[int, int]] = None  # {output: input} the graph writes into its inputs, as upstream binds them
    known_issue: str = ""  # measured on the H200 and still open: the GPU test is an xfail naming it
    note: str = ""
    graph_id: int = -1


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _randn(gen, *shape, dtype=torch.float16, device="cuda", scale=1.0, shift=0.0, memory_format=None):
    t = (torch.randn(*shape, generator=gen) * scale + shift).to(dtype=dtype, device=device)
    return t.to(memory_format=memory_format) if memory_format is not None else t


def _host_scalar(value: float, ndim: int) -> torch.Tensor:
    return torch.full((1,) * ndim, value, dtype=torch.float32)  # stays on the CPU, as upstream passes it


# =====================================================================================
# matmul (test/python/test_matmul_bias_relu.py)


def matmul_bias(g, X, W, B):
    response = g.matmul(name="matmul", A=X, B=W)
    Y = g.bias(name="bias", input=response, bias=B)
    Y.set_data_type(X.data_type)
    return Y


def _matmul_bias_inputs(device):
    gen = _gen(0)
    b, s, e = 1, 128, 768
    return [_randn(gen, b, s, e, device=device), _randn(gen, 1, e, e * 4, device=device), _randn(gen, 1, 1, e * 4, device=device)]


def _matmul_bias_reference(inputs):
    x, w, b = inputs
    return [torch.nn.functional.linear(x, w.squeeze().T, bias=b.squeeze())]


def int8_bf16_matmul(g, A, B):
    A_casted = g.identity(input=A, compute_data_type=cudnn.data_type.FLOAT)
    A_casted.set_data_type(cudnn.data_type.BFLOAT16)
    C = g.matmul(name="matmul", A=A_casted, B=B, compute_data_type=cudnn.data_type.FLOAT)
    C.set_data_type(cudnn.data_type.BFLOAT16)
    return C


def _int8_bf16_inputs(device):
    gen = _gen(1)
    b, m, n, k = 16, 32, 64, 128
    a = (torch.randint(3, (b, m, k), generator=gen, dtype=torch.int8) - 2).to(device)
    bb = (3 * torch.randn(b, k, n, generator=gen) - 1.25).to(dtype=torch.bfloat16, device=device)
    return [a, bb]


def _int8_bf16_reference(inputs):
    a, b = inputs
    return [torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16))]


# fp8: public API (per-tensor descaled fp8 GEMM). A row-major, B column-major: fp8 MMA takes K-major operands.
def fp8_matmul(g, A, B, descale_a, descale_b):
    C = g.matmul(name="matmul", A=A, B=B, compute_data_type=cudnn.data_type.FLOAT)
    C = g.mul(name="descale_a", a=C, b=descale_a)
    C = g.mul(name="descale_b", a=C, b=descale_b)
    C.set_data_type(cudnn.data_type.BFLOAT16)
    return C


def _fp8_inputs(device):
    gen = _gen(2)
    b, m, n, k = 1, 128, 128, 64
    a = torch.randn(b, m, k, generator=gen).to(torch.float8_e4m3fn).to(device)
    bt = torch.randn(b, n, k, generator=gen).to(torch.float8_e4m3fn).to(device)
    descale_a = torch.full((1, 1, 1), 0.5).to(device)
    descale_b = torch.full((1, 1, 1), 0.25).to(device)
    return [a, bt.transpose(1, 2), descale_a, descale_b]


def _fp8_reference(inputs):
    a, b, da, db = inputs
    return [(torch.matmul(a.float(), b.float()) * da * db).to(torch.bfloat16)]


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


# =====================================================================================
# The table

SDPA_TOL = (2e-2, 2e-2)  # ours: test_mhas_v2 compares through its own approx_equal helper

GRAPHS: List[UpstreamGraph] = [
    UpstreamGraph("matmul_bias", "matmul", "test_matmul_bias_relu.py::test_matmul_bias_relu", matmul_bias,
                  _matmul_bias_inputs, _matmul_bias_reference, [(1e-3, 1e-3)]),
    UpstreamGraph("int8_bf16_matmul", "int8", "test_matmul_bias_relu.py::test_int8_bf16_matmul", int8_bf16_matmul,
                  _int8_bf16_inputs, _int8_bf16_reference, [(1e-5, 1.6e-2)], note="torch.testing defaults for bf16"),
    UpstreamGraph("fp8_matmul", "fp8", "public API (per-tensor descaled fp8 GEMM)", fp8_matmul, _fp8_inputs, _fp8_reference,
                  [(1e-2, 1e-2)], note="public API; tolerance ours"),
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

BY_NAME = {entry.name: entry for entry in GRAPHS}

for _entry in GRAPHS:
    _entry.graph_id = tch.register_graph(
        _entry.builder, name=f"upstream_{_entry.name}", in_place=_entry.in_place, **(_entry.frontend_types or {}), **_entry.params
    )


# =====================================================================================
# The frontend running a graph itself, described as the registry describes it


def _graph_types(entry: UpstreamGraph, inputs: Sequence[torch.Tensor]) -> Dict[str, Any]:
    """The graph's types: ``frontend_types`` where upstream gives its own (registered with
    the graph too), else the registry's default: io = the first floating input's dtype,
    float32 intermediate and compute."""
    if entry.frontend_types:
        return dict(entry.frontend_types)
    floating = next((t.dtype for t in inputs if t.dtype.is_floating_point), None)
    return dict(io_data_type=torch_to_cudnn_data_type(floating), intermediate_data_type=F32, compute_data_type=F32)


def describe_with_frontend(entry: UpstreamGraph, inputs: Sequence[torch.Tensor], handle=None):
    """The graph as registry/description.py ``_describe`` makes it (name, types, one
    ``input{i}`` tensor per op input, the builder, outputs marked), except that a CPU input
    is declared pass-by-value, as upstream declares a host scalar. Returns (graph, inputs, outputs)."""
    graph = cudnn.pygraph(name=f"upstream_{entry.name}", handle=handle, **_graph_types(entry, inputs))
    tensors = [
        graph.tensor(name=f"input{i}", dim=list(t.shape), stride=list(t.stride()), data_type=torch_to_cudnn_data_type(t.dtype),
                     is_pass_by_value=t.device.type == "cpu")
        for i, t in enumerate(inputs)
    ]
    result = entry.builder(graph, *tensors, **entry.params)
    returned = [result] if isinstance(result, cudnn.Tensor) else list(result)
    outputs = [t for t in returned if t is not None]
    for t in outputs:
        t.set_output(True)
    return graph, tensors, outputs


_TORCH_OF = {
    cudnn.data_type.HALF: torch.float16, cudnn.data_type.BFLOAT16: torch.bfloat16, cudnn.data_type.FLOAT: torch.float32,
    cudnn.data_type.DOUBLE: torch.float64, cudnn.data_type.INT8: torch.int8, cudnn.data_type.INT32: torch.int32,
    cudnn.data_type.INT64: torch.int64, cudnn.data_type.UINT8: torch.uint8, cudnn.data_type.BOOLEAN: torch.bool,
    cudnn.data_type.FP8_E4M3: torch.float8_e4m3fn, cudnn.data_type.FP8_E5M2: torch.float8_e5m2,
}


def run_with_frontend(entry: UpstreamGraph, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Build the graph for the inputs' device the way the registry does (inside
    ``tch.build_scope``, with the pooled handle, ``graph.build([A, FALLBACK])``) and run it
    with the frontend's own ``graph.execute``: the plan the op's build selects, run by the
    frontend. An output the entry writes in place is bound to its input's buffer, as
    upstream binds it, and returned as that input. Raises what the frontend raises (e.g.
    cudnnGraphNotSupportedError)."""
    device = next(t.device for t in inputs if t.device.type == "cuda")
    with tch.build_scope(device.index) as handle:
        graph, tensors, outputs = describe_with_frontend(entry, inputs, handle)
        graph.validate()
        graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    # An in-place output is its input's buffer, seen with the output's strides (which may
    # differ in unit dimensions: registry/in_place.py), so its layout is the described one.
    written = {
        output: inputs[input_].as_strided(list(outputs[output].dim), list(outputs[output].stride))
        for output, input_ in (entry.in_place or {}).items()
    }
    results = [
        written[o] if o in written else torch.empty_strided(list(t.dim), list(t.stride), dtype=_TORCH_OF[t.data_type], device=device)
        for o, t in enumerate(outputs)
    ]
    workspace = torch.empty(max(int(graph.get_workspace_size()), 1), dtype=torch.uint8, device=device)
    pack = {t: as_cudnn_bits(x) if x.dtype == torch.bool and x.is_cuda else x for t, x in zip(tensors, inputs)}
    pack.update(zip(outputs, results))
    with torch.cuda.device(device):
        graph.execute(pack, workspace, handle=tch.current_handle(device.index))
    return [from_cudnn_bits(r) if r.dtype == torch.bool else r for r in results]


# cuDNN's BOOLEAN tensors are bits (LSB first, at each element's memory offset; measured,
# Note [Bit-packed booleans] in torch_cudnn_handle/bool_operands.py). The frontend hands
# a torch.bool buffer over as it is, so running it "as upstream does" means giving it
# bits and reading bits back. Written here independently of the op's packing (dense
# tensors only, which is all these graphs have).


def _memory_order(t: torch.Tensor) -> List[int]:
    return sorted(range(t.dim()), key=lambda axis: -t.stride()[axis])


def as_cudnn_bits(t: torch.Tensor) -> torch.Tensor:
    """A torch.bool buffer like ``t`` whose first bytes hold ``t``'s elements as bits."""
    flat = t.permute(*_memory_order(t)).reshape(-1).long()
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 8)])
    weights = 2 ** torch.arange(8, device=t.device)
    packed = (flat.view(-1, 8) * weights).sum(1).to(torch.uint8)
    buffer = torch.zeros_like(t)
    torch.as_strided(buffer.view(torch.uint8), (packed.numel(),), (1,)).copy_(packed)
    return buffer


def from_cudnn_bits(t: torch.Tensor) -> torch.Tensor:
    """The elements a torch.bool buffer's first bytes hold as bits, with ``t``'s layout."""
    n = t.numel()
    raw = torch.as_strided(t.view(torch.uint8), (-(-n // 8),), (1,)).long()
    bits = ((raw.unsqueeze(1) // 2 ** torch.arange(8, device=t.device)) % 2).reshape(-1)[:n].bool()
    order = _memory_order(t)
    out = torch.empty_like(t)
    out.permute(*order).copy_(bits.view([t.shape[a] for a in order]))
    return out


def compare_region(entry: UpstreamGraph, outputs: List[torch.Tensor], inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    return entry.region(outputs, inputs) if entry.region is not None else list(outputs)


def path_of(entry: UpstreamGraph) -> str:
    """'native', 'native pending' (its first call ran on the Python path, the next one hands
    it over) or 'python path', and the engine, of the graph's first built layout."""
    built = tch.built_graphs(entry.graph_id)
    if not built:
        return "not built"
    path = "native" if built[0].native else "native pending" if built[0].native_pending else "python path"
    return f"{path} ({built[0].engine})"
