"""The nn graphs' torch stand-ins (op/stand_in.py, Note [A new layout's first calls]): each gives
the graph's outputs, in the layout the op returns, as the interpreter computes them; a stand-in
that returns the wrong thing is refused naming the output. On the CPU, through the stand-in's
own entry (a CPU call of the op runs the interpreter)."""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle.nn.linear import (BIAS_FREE_LINEAR_GRAPHS, GELU_BACKWARD_ROWS, GELU_TANH_BACKWARD_ROWS, LINEAR_GRAPHS, MATMUL_DW,
                                          MATMUL_DX, RELU_BACKWARD_ROWS, SILU_BACKWARD_ROWS)
from torch_cudnn_handle import registry
from torch_cudnn_handle.nn import attention_stand_ins
from torch_cudnn_handle.nn.attention import SDPA_GRAPHS, SDPA_INFERENCE_GRAPHS
from torch_cudnn_handle.nn.norm import layernorm_graph, rmsnorm_graph
from torch_cudnn_handle.nn.swiglu import SWIGLU_DUP, SWIGLU_DZ, SWIGLU_GATE
from torch_cudnn_handle.nn import transposed_linear
from torch_cudnn_handle.op import stand_in

torch.manual_seed(0)
X, W, B = torch.randn(2, 5, 16), torch.randn(8, 16), torch.randn(8)
DY = torch.randn(2, 5, 8)
CASES = {
    **{f"linear_{a}": (LINEAR_GRAPHS[a], [X, W, B]) for a in LINEAR_GRAPHS},
    **{f"bias_free_linear_{a}": (BIAS_FREE_LINEAR_GRAPHS[a], [X, W]) for a in BIAS_FREE_LINEAR_GRAPHS},
    "relu_backward": (RELU_BACKWARD_ROWS, [DY, torch.relu(torch.randn(2, 5, 8))]),
    "gelu_backward": (GELU_BACKWARD_ROWS, [DY, torch.randn(2, 5, 8)]),
    "silu_backward": (SILU_BACKWARD_ROWS, [DY, torch.randn(2, 5, 8)]),
    "gelu_tanh_backward": (GELU_TANH_BACKWARD_ROWS, [DY, torch.randn(2, 5, 8)]),
    **{f"transposed_linear_{a}": (transposed_linear.TRANSPOSED_LINEAR_GRAPHS[a], [X, W.mT.contiguous(), B])
       for a in transposed_linear.TRANSPOSED_LINEAR_GRAPHS},
    "transposed_dx": (transposed_linear.MATMUL_DX, [DY, W.mT.contiguous()]),
    "transposed_dw": (transposed_linear.MATMUL_DW, [X, DY]),
    "swiglu_gate": (SWIGLU_GATE, [X, W, torch.randn(2, 5, 8)]),
    "swiglu_dz": (SWIGLU_DZ, [DY, torch.randn(2, 5, 8), torch.randn(2, 5, 8)]),
    "swiglu_dup": (SWIGLU_DUP, [DY, torch.randn(2, 5, 8)]),
    "dx": (MATMUL_DX, [DY, W]),
    "dw": (MATMUL_DW, [DY, X]),
    "rmsnorm": (rmsnorm_graph(1e-5), [X, torch.rand(16) + 0.5]),
    "layernorm": (layernorm_graph(1e-5), [X, torch.rand(16) + 0.5, torch.randn(16)]),
}
# The norms' backward graphs, on the statistics their forward saved.
_RMS_STATS = tch.execute(rmsnorm_graph(1e-5), CASES["rmsnorm"][1])[1]
_LN_STATS = tch.execute(layernorm_graph(1e-5), CASES["layernorm"][1])[1:]
CASES["rmsnorm_backward"] = (registry.definition(rmsnorm_graph(1e-5)).backward_id, [torch.randn(2, 5, 16), X, CASES["rmsnorm"][1][1], _RMS_STATS])
CASES["layernorm_backward"] = (registry.definition(layernorm_graph(1e-5)).backward_id,
                               [torch.randn(2, 5, 16), X, CASES["layernorm"][1][1], *_LN_STATS])

# Attention, q/k/v token-major as projections give them (BSHD in memory), and grouped-query
# (4 query heads on 2 K/V heads); the backward on the statistics its forward wrote.
_Q, _KV = (torch.randn(2, 12, h, 16, dtype=torch.bfloat16).transpose(1, 2) for h in (4, 2))
_K, _V = _KV, torch.randn(2, 2, 12, 16, dtype=torch.bfloat16)  # V head-major: its own layout
for _causal in (False, True):
    _name = "causal" if _causal else "full"
    CASES[f"sdpa_{_name}"] = (SDPA_GRAPHS[_causal], [_Q, _K, _V])
    CASES[f"sdpa_{_name}_inference"] = (SDPA_INFERENCE_GRAPHS[_causal], [_Q, _K, _V])
    _O, _STATS = tch.execute(SDPA_GRAPHS[_causal], [_Q, _K, _V])
    CASES[f"sdpa_{_name}_backward"] = (registry.definition(SDPA_GRAPHS[_causal]).backward_id,
                                       [_Q, _K, _V, _O, torch.randn_like(_O), _STATS])


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_stand_in_gives_the_interpreters_outputs_in_the_ops_layout(name):
    graph, inputs = CASES[name]
    expected = tch.execute(graph, inputs)  # CPU tensors: the interpreter
    got = stand_in.execute(graph, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (g.shape, g.stride(), g.dtype) == (e.shape, e.stride(), e.dtype)
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(name for name in CASES if name.startswith("sdpa")))
def test_attentions_stand_ins_give_the_same_outputs_a_block_at_a_time(name, monkeypatch):
    graph, inputs = CASES[name]
    whole = stand_in.execute(graph, inputs)
    for block_bytes in (2 * 12 * 12 * 4, 1):  # one (batch element, K/V head) row per block; one query of one row
        monkeypatch.setattr(attention_stand_ins, "_BLOCK_BYTES", block_bytes)
        for got, expected in zip(stand_in.execute(graph, inputs), whole):
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6 if got.dtype == torch.float32 else 0)


def test_a_stand_in_that_returns_the_wrong_thing_is_refused_naming_it():
    short = tch.register_graph(lambda g, x: g.relu(x), name="short_stand_in", stand_in=lambda x: [])
    with pytest.raises(ValueError, match="stand_in returned 0 outputs, but the graph has 1"):
        stand_in.execute(short, [X])
    wrong = tch.register_graph(lambda g, x: g.relu(x), name="wrong_stand_in", stand_in=lambda x: x.double())
    with pytest.raises(ValueError, match=r"returned \[2, 5, 16\] torch.float64 for output 0, where the graph writes"):
        stand_in.execute(wrong, [X])
    with pytest.raises(TypeError, match="stand_in must be callable"):
        tch.register_graph(lambda g, x: g.relu(x), name="not_callable", stand_in=3)


def test_a_stand_in_never_returns_an_input_or_a_view_of_one():
    identity = tch.register_graph(lambda g, x: g.identity(x), name="identity_stand_in", stand_in=lambda x: x)
    (y,) = stand_in.execute(identity, [X])
    assert torch.equal(y, X) and y.untyped_storage().data_ptr() != X.untyped_storage().data_ptr()


def test_a_graphs_first_stand_in_call_is_checked_and_later_sizes_trusted(monkeypatch):
    relu = tch.register_graph(lambda g, x: g.relu(x), name="checked_once", stand_in=torch.relu)
    (first,) = stand_in.execute(relu, [X])
    assert torch.equal(first, torch.relu(X))

    def no_description(*args):
        raise AssertionError("a later size described the graph again")

    monkeypatch.setattr(stand_in.reference, "description_for", no_description)
    (later,) = stand_in.execute(relu, [torch.randn(3, 7, 16)])
    assert later.shape == (3, 7, 16)
