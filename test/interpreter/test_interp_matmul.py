"""The interpreter's MATMUL and REDUCTION nodes against torch (CPU, real numbers)."""

import cudnn
import pytest
import torch
import torch.nn.functional as F

from support import graphs
from support.interpreter import assert_close, randn, run


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matmul_broadcasts_a_batch_of_one(dtype):
    a, b = randn(3, 16, 32, dtype=dtype, seed=1), randn(1, 32, 8, dtype=dtype, seed=2)
    (c,) = run(lambda g, a, b: g.matmul(a, b), [a, b])
    assert c.shape == (3, 16, 8) and c.dtype == dtype
    assert_close(c, torch.matmul(a.double(), b.double()).to(dtype))


def test_matmul_reads_a_column_major_operand_by_its_strides():
    a = randn(2, 16, 32, seed=3)
    b = randn(2, 8, 32, seed=4).transpose(1, 2)  # [2, 32, 8], K fastest
    (c,) = run(lambda g, a, b: g.matmul(a, b), [a, b])
    assert_close(c, torch.matmul(a.double(), b.double()).float())


def test_int8_matmul_accumulates_exactly_into_int32():
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(-128, 128, (2, 16, 64), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (2, 64, 8), generator=gen, dtype=torch.int8)
    (c,) = run(
        lambda g, a, b: g.matmul(a, b, compute_data_type=cudnn.data_type.INT32).set_data_type(cudnn.data_type.INT32), [a, b],
        intermediate=cudnn.data_type.INT32, compute=cudnn.data_type.INT32,
    )
    assert c.dtype == torch.int32 and torch.equal(c, torch.matmul(a.long(), b.long()).int())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_matmul_with_descales_in_bfloat16(dtype):
    a, b = randn(1, 32, 64, seed=6).to(dtype), randn(1, 64, 16, seed=7).to(dtype)
    da, db = torch.full((1, 1, 1), 0.5), torch.full((1, 1, 1), 0.125)  # host scalars: pass-by-value

    def fp8_gemm(g, a, b, da, db):
        c = g.mul(g.mul(g.matmul(a, b, compute_data_type=cudnn.data_type.FLOAT), da), db)
        return c.set_data_type(cudnn.data_type.BFLOAT16)

    (c,) = run(fp8_gemm, [a, b, da, db])
    assert c.dtype == torch.bfloat16
    assert_close(c, (torch.matmul(a.double(), b.double()) * 0.5 * 0.125).to(torch.bfloat16))


def test_linear_relu_graph_of_the_suite():
    x, w, b = graphs.linear_inputs(device="cpu")
    (y,) = run(graphs.linear_relu, [x, w, b])
    assert y.dtype == torch.float16
    assert_close(y, torch.relu(torch.matmul(x.double(), w.double()) + b.double()).half())


@pytest.mark.parametrize("activation", ["relu", "gelu", "sigmoid"])
def test_matmul_bias_activation_epilogue(activation):
    x, w, b = randn(1, 24, 32, dtype=torch.bfloat16, seed=8), randn(1, 32, 16, dtype=torch.bfloat16, seed=9), randn(1, 1, 16, dtype=torch.bfloat16, seed=10)
    (y,) = run(lambda g, x, w, b: getattr(g, activation)(g.bias(g.matmul(x, w), b)), [x, w, b])
    expected = getattr(torch, activation)(torch.matmul(x.double(), w.double()) + b.double()) if activation != "gelu" else F.gelu(
        torch.matmul(x.double(), w.double()) + b.double())
    assert_close(y, expected.to(torch.bfloat16))


REDUCTIONS = {
    "ADD": lambda x, d: x.sum(d, keepdim=True), "MUL": lambda x, d: x.flatten(1).prod(1).view(-1, 1, 1),
    "MIN": lambda x, d: x.amin(d, keepdim=True), "MAX": lambda x, d: x.amax(d, keepdim=True),
    "AMAX": lambda x, d: x.abs().amax(d, keepdim=True), "AVG": lambda x, d: x.mean(d, keepdim=True),
    "NORM1": lambda x, d: x.abs().sum(d, keepdim=True), "NORM2": lambda x, d: x.square().sum(d, keepdim=True).sqrt(),
}


@pytest.mark.parametrize("mode", sorted(REDUCTIONS))
def test_reduction_to_the_output_dims(mode):
    x = randn(4, 6, 5, seed=11) * 0.5 + 1.0

    def reduce_rows(g, x):
        return g.reduction(x, mode=getattr(cudnn.reduction_mode, mode), out_dims=[4, 1, 1]).set_stride([1, 1, 1])

    (y,) = run(reduce_rows, [x])
    assert y.shape == (4, 1, 1)
    assert_close(y, REDUCTIONS[mode](x.double(), (1, 2)).float())


def test_reduction_mul_no_zeros_skips_zeros():
    x = torch.tensor([[[2.0, 0.0, 3.0], [0.0, 0.0, 5.0]]])
    (y,) = run(lambda g, x: g.reduction(x, mode=cudnn.reduction_mode.MUL_NO_ZEROS, out_dims=[1, 2, 1]), [x])
    assert torch.equal(y.reshape(-1), torch.tensor([6.0, 5.0]))


def test_a_nonzero_matmul_padding_is_refused():
    a, b = randn(1, 4, 8), randn(1, 8, 4)
    with pytest.raises(NotImplementedError, match=r"node 'mm' \(MATMUL\) attribute 'padding' = 1\.0"):
        run(lambda g, a, b: g.matmul(a, b, padding=1.0, name="mm"), [a, b])
