"""Graph builders written the way the frontend's users write them, for the tests of
host scalars, data types and undeclared output layouts (test_graph_inputs*.py).

Each builder is plain frontend code: it takes the graph and its input tensors and
returns its outputs, declaring no more than an author would.
"""

import cudnn
import torch

import torch_cudnn_handle as tch


def rmsnorm_with_epsilon(graph, x, scale, epsilon):
    """RMSNorm inference; ``epsilon`` a host scalar (a pass-by-value operand)."""
    y, _ = graph.rmsnorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=x, scale=scale, bias=None, epsilon=epsilon)
    return y


def layernorm_with_epsilon(graph, x, scale, bias, epsilon):
    y, _, _ = graph.layernorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=x, scale=scale, bias=bias, epsilon=epsilon)
    return y


def scaled_fp8_matmul(graph, a, b, a_descale, b_descale):
    """An fp8 GEMM: fp8 A and B, float32 accumulation, dequantized by two host scalars;
    the output takes the graph's io type (registered as bfloat16)."""
    c = graph.matmul(a, b, compute_data_type=cudnn.data_type.FLOAT)
    c = graph.mul(c, a_descale, compute_data_type=cudnn.data_type.FLOAT)
    return graph.mul(c, b_descale, compute_data_type=cudnn.data_type.FLOAT)


def conv_fprop(graph, x, w):
    """A 3x3 'same' convolution, its output only marked: cuDNN picks its layout."""
    return graph.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])


def int8_conv_fprop(graph, x, w):
    """An int8 convolution accumulating in int32, writing int32."""
    y = graph.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], compute_data_type=cudnn.data_type.INT32)
    return y.set_data_type(torch.int32)


def relu_to_half(graph, x):
    """A float32 relu whose output is declared with a torch dtype."""
    return graph.relu(x).set_data_type(torch.float16)


RMSNORM = tch.register_graph(rmsnorm_with_epsilon, name="rmsnorm_eps")
LAYERNORM = tch.register_graph(layernorm_with_epsilon, name="layernorm_eps")
FP8_MATMUL = tch.register_graph(scaled_fp8_matmul, name="fp8_matmul", io_data_type=torch.bfloat16)
CONV = tch.register_graph(conv_fprop, name="conv_fprop")
INT8_CONV = tch.register_graph(
    int8_conv_fprop, name="int8_conv", intermediate_data_type=torch.int32, compute_data_type=cudnn.data_type.INT32
)
RELU_TO_HALF = tch.register_graph(relu_to_half, name="relu_to_half")


def nhwc(n, c, h, w, *, dtype, device):
    """An [n, c, h, w] tensor laid out NHWC (channels_last)."""
    return torch.empty(n, c, h, w, dtype=torch.float32, device=device).to(dtype).to(memory_format=torch.channels_last)


def nhwc_strides(n, c, h, w):
    return (h * w * c, 1, w * c, c)
