"""matmul graphs (test/python/test_matmul_bias_relu.py; fp8: public API) and their entries."""

from __future__ import annotations

from typing import List

import cudnn
import torch

from .entry import UpstreamGraph, _gen, _randn


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


ENTRIES: List[UpstreamGraph] = [
    UpstreamGraph("matmul_bias", "matmul", "test_matmul_bias_relu.py::test_matmul_bias_relu", matmul_bias,
                  _matmul_bias_inputs, _matmul_bias_reference, [(1e-3, 1e-3)]),
    UpstreamGraph("int8_bf16_matmul", "int8", "test_matmul_bias_relu.py::test_int8_bf16_matmul", int8_bf16_matmul,
                  _int8_bf16_inputs, _int8_bf16_reference, [(1e-5, 1.6e-2)], note="torch.testing defaults for bf16"),
    UpstreamGraph("fp8_matmul", "fp8", "public API (per-tensor descaled fp8 GEMM)", fp8_matmul, _fp8_inputs, _fp8_reference,
                  [(1e-2, 1e-2)], note="public API; tolerance ours"),
]
