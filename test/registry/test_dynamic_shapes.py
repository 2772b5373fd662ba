"""torch.compile(dynamic=True) without a GPU: the fake kernel gives outputs symbolic
sizes, so one compiled frame (forward and backward) serves every length; meta tensors
run the graphs' descriptions, never a build."""

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import FusedLinear, RMSNorm, TransformerBlock, sdpa

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

DTYPE = torch.bfloat16


def compile_over(fn, shapes, backward=True):
    """``fn`` compiled with dynamic shapes, run (forward and backward) on meta inputs of
    each shape in ``shapes``; returns the recording backend and the last outputs."""
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=True)
    for shape in shapes:
        x = torch.empty(shape, device="meta", dtype=DTYPE, requires_grad=backward)
        y = compiled(x)
        assert y.shape == shape[:-1] + y.shape[-1:]
        if backward:
            y.float().sum().backward()
            assert x.grad.shape == x.shape
    return backend


@pytest.mark.parametrize(
    "name, make, last",
    [
        ("rmsnorm", lambda: RMSNorm(64, device="meta", dtype=DTYPE), 64),
        ("linear_gelu", lambda: FusedLinear(64, 96, "gelu", device="meta", dtype=DTYPE), 64),
        ("block", lambda: TransformerBlock(64, 2, mlp_ratio=2, device="meta", dtype=DTYPE), 64),
    ],
)
def test_one_frame_serves_every_length(name, make, last):
    module = make()
    backend = compile_over(module, [(2, n, last) for n in (24, 40, 136, 264, 520)])
    assert (len(backend.fw_graphs), len(backend.bw_graphs)) == (1, 1), name


def test_sdpa_compiles_once_for_every_length():
    def attention(q):
        return sdpa(q, q, q, causal=True)

    backend = compile_over(attention, [(2, 4, n, 64) for n in (136, 264, 392, 776, 1544)])
    assert (len(backend.fw_graphs), len(backend.bw_graphs)) == (1, 1)


def test_one_kv_head_in_token_major_memory_compiles_once_for_every_length():
    """Multi-query attention: k and v of one head, [B, S, 1, D] in memory (a projection's output
    transposed). The size-1 head dim ties its stride with the sequence's; dK and dV keep that
    layout, and their strides follow the length symbolically."""

    def attention(x):
        b, s, _ = x.shape
        q = x.view(b, s, 4, 16).transpose(1, 2)
        kv = x[..., :16].contiguous().view(b, s, 1, 16).transpose(1, 2)
        from torch_cudnn_handle.nn.attention import SDPA_GRAPHS

        return tch.execute(SDPA_GRAPHS[True], [q, kv, kv])[0].transpose(1, 2).reshape(b, s, 64)

    backend = compile_over(attention, [(2, n, 64) for n in (24, 40, 136)])
    assert (len(backend.fw_graphs), len(backend.bw_graphs)) == (1, 1)


def matmul(graph, a, b):
    return graph.matmul(a, b, name="mm")


def test_a_shape_function_is_used_and_checked():
    good = tch.register_graph(matmul, name="mm_shaped", output_shapes=lambda a, b: [(a[0], a[1], b[2])])
    bad = tch.register_graph(matmul, name="mm_wrong_shape", output_shapes=lambda a, b: [(a[0], b[2], a[1])])
    w = torch.empty(1, 64, 32, device="meta", dtype=DTYPE)
    for gid in (good, bad):
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: tch.execute(gid, [x, w])[0], backend="aot_eager", fullgraph=True, dynamic=True)
        if gid == bad:
            with pytest.raises(Exception, match="output_shapes function gives"):
                compiled(torch.empty(1, 40, 64, device="meta", dtype=DTYPE))
            continue
        for rows in (40, 72):
            assert compiled(torch.empty(1, rows, 64, device="meta", dtype=DTYPE)).shape == (1, rows, 32)
