"""The suite's shared graphs (test/graphs.py, test/graph_inputs.py), as registered, through the
interpreter on the CPU against torch."""

import pytest
import torch
import torch.nn.functional as F

from support import graph_inputs as gi
from support import graphs
from support.interpreter import assert_close, describe_registered, randn, run_registered, same_layout
from torch_cudnn_handle import registry
from torch_cudnn_handle.interpreter import interpret_ordered


def test_linear_relu_and_its_torch_level_backward_graphs():
    x, w, b = graphs.linear_inputs(device="cpu")
    (y,), _ = run_registered(graphs.LINEAR_RELU, [x, w, b])
    assert_close(y, graphs.linear_relu_reference(x.double(), w.double(), b.double()).half())
    dy = randn(*y.shape, dtype=torch.float16, seed=1)
    (dz,), _ = run_registered(graphs.RELU_BACKWARD, [dy, y])
    (dx,), _ = run_registered(graphs.MATMUL, [dz, w.mT])
    (dw,), _ = run_registered(graphs.MATMUL, [x.mT, dz])
    leaves = [t.double().requires_grad_() for t in (x, w, b)]
    torch.relu(leaves[0] @ leaves[1] + leaves[2]).backward(dy.double())
    assert_close(dx, leaves[0].grad.half(), scale=4)
    assert_close(dw, leaves[1].grad.half(), scale=4)


@pytest.mark.parametrize("graph_id", [graphs.RELU, graphs.RELU_DECLARED], ids=["relu", "relu_declared"])
def test_relu_and_its_backward_graph(graph_id):
    x = randn(2, 8, 16, dtype=torch.bfloat16, seed=2)
    (y,), _ = run_registered(graph_id, [x])
    assert torch.equal(y, torch.relu(x))
    dy = randn(2, 8, 16, dtype=torch.bfloat16, seed=3)
    (dx,), _ = run_registered(registry.definition(graph_id).backward_id, [dy, x])
    assert torch.equal(dx, dy * (x > 0))


def test_rmsnorm_and_layernorm_with_a_host_epsilon():
    x, scale, bias = randn(4, 64, 1, 1, dtype=torch.float16, seed=4), randn(1, 64, 1, 1, dtype=torch.float16, seed=5), randn(1, 64, 1, 1, dtype=torch.float16, seed=6)
    eps = torch.tensor(1e-5)  # 0-dim host scalar, described [1, 1, 1, 1] pass-by-value
    (y,), _ = run_registered(gi.RMSNORM, [x, scale, eps])
    rows = lambda t: t.double().reshape(-1, 64)  # noqa: E731
    assert_close(y.reshape(4, 64), F.rms_norm(rows(x), [64], scale.double().reshape(-1), eps=1e-5).half())
    (y,), _ = run_registered(gi.LAYERNORM, [x, scale, bias, eps])
    assert_close(y.reshape(4, 64), F.layer_norm(rows(x), [64], scale.double().reshape(-1), bias.double().reshape(-1), eps=1e-5).half())


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_matmul_into_the_chosen_bfloat16(fp8):
    a, b = randn(1, 32, 64, seed=7).to(fp8), randn(1, 64, 16, seed=8).to(fp8)
    (c,), _ = run_registered(gi.FP8_MATMUL, [a, b, torch.tensor(0.5), torch.tensor(2.0)])
    assert c.dtype == torch.bfloat16
    assert_close(c, (a.double() @ b.double()).to(torch.bfloat16))


def test_conv_with_an_undeclared_output_layout_gets_the_descriptions():
    x, w = gi.nhwc(2, 16, 8, 8, dtype=torch.float16, device="cpu"), gi.nhwc(16, 16, 3, 3, dtype=torch.float16, device="cpu")
    x.copy_(randn(2, 16, 8, 8, dtype=torch.float16, seed=9))
    w.copy_(randn(16, 16, 3, 3, dtype=torch.float16, seed=10))
    graph, ins, outs, layout = describe_registered(gi.CONV, [x, w])
    (y,) = interpret_ordered(graph, ins, outs, [x, w])
    assert same_layout(y, outs[0])  # the description's provisional strides (the op allocates layout.outputs: NHWC)
    assert_close(y, F.conv2d(x.double(), w.double(), padding=1).half(), scale=4)


def test_int8_conv_writes_exact_int32():
    gen = torch.Generator().manual_seed(11)
    x = torch.randint(-127, 128, (2, 16, 8, 8), generator=gen, dtype=torch.int8).to(memory_format=torch.channels_last)
    w = torch.randint(-127, 128, (16, 16, 3, 3), generator=gen, dtype=torch.int8).to(memory_format=torch.channels_last)
    (y,), _ = run_registered(gi.INT8_CONV, [x, w])
    assert y.dtype == torch.int32 and torch.equal(y, F.conv2d(x.double(), w.double(), padding=1).to(torch.int32))


def test_an_output_typed_with_a_torch_dtype():
    x = randn(2, 4, 8, seed=12)
    (y,), _ = run_registered(gi.RELU_TO_HALF, [x])
    assert y.dtype == torch.float16 and torch.equal(y, torch.relu(x).half())
