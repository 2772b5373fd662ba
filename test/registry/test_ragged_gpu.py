"""Ragged (packed, THD) attention on the GPU: packed Q/K/V of exactly T live tokens, one
build for every token count, outputs [T, H, D].

Each token count runs three ways on the same packed buffers: the frontend itself (the graph
described as a frontend user describes it: 4-D [B, H, S_max, D] ragged tensors with their
offsets, built in ``tch.build_scope`` with ``graph.build([A, FALLBACK])``, run by
``graph.execute``), the op eagerly (``tch.execute``; the native path once built), and the
op under ``torch.compile(fullgraph=True)``. The op's output must be BITWISE equal to the
frontend's, and close to F.scaled_dot_product_attention run per batch element. Q, K and V
are the head of a NaN-poisoned allocation: an engine reading past the last token would
put NaN in the output. Training (ragged statistics [T, H, 1] and the declared backward)
is checked against torch's per-sequence attention and its autograd.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # test/: conftest and the support package

import cudnn  # noqa: E402

import torch_cudnn_handle as tch  # noqa: E402

from support import ragged_graphs as rg  # noqa: E402
from torch_cudnn_handle import settings  # noqa: E402

pytestmark = pytest.mark.gpu

# Same B and S_max, other token counts (Tq, Tkv): 52/61, 58/9, 60/144.
LENS = [((5, 17, 30), (9, 12, 40)), ((48, 1, 9), (2, 3, 4)), ((20, 20, 20), (48, 48, 48))]
TOL = dict(atol=2e-2, rtol=2e-2)  # upstream's SDPA tolerance (test/support/upstream_graphs/sdpa.py)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _poisoned_inputs(lens_q, lens_kv, *, own_o=False, seed=0):
    """rg.inputs on the GPU, with Q, K and V the first T tokens of twice-as-long buffers whose tail is NaN."""
    inputs = rg.inputs(lens_q, lens_kv, _device(), own_o=own_o, seed=seed)
    for i in range(3):
        buffer = torch.full((2 * inputs[i].shape[0] + 8, rg.H, rg.D), float("nan"), dtype=inputs[i].dtype, device=_device())
        buffer[: inputs[i].shape[0]] = inputs[i]
        inputs[i] = buffer[: inputs[i].shape[0]]
    return inputs


def _frontend(own_o: bool, inputs):
    """The same graph as a frontend user writes it, built as the registry builds, run by the frontend."""
    device = _device()
    builder = rg.sdpa_own_o if own_o else rg.sdpa_shared
    with tch.build_scope(device.index) as handle:
        g = cudnn.pygraph(
            io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT, handle=handle,
        )
        hd = rg.H * rg.D
        qkv = [
            g.tensor(name=name, dim=[rg.B, rg.H, rg.S_MAX, rg.D], stride=[rg.S_MAX * hd, rg.D, hd, 1], data_type=cudnn.data_type.HALF)
            for name in ("q", "k", "v")
        ]
        rest = [g.tensor_like(t) for t in inputs[3:]]
        offsets = rest[2:]
        for tensor, offset in zip(qkv, (offsets[0], offsets[1], offsets[2] if own_o else offsets[1])):
            tensor.set_ragged_offset(offset)
        o = builder(g, *qkv, *rest, attn_scale=rg.ATTN_SCALE)
        o.set_output(True)
        g.validate()
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    out = torch.empty(inputs[0].shape[0], rg.H, rg.D, dtype=torch.float16, device=device)
    workspace = torch.empty(max(int(g.get_workspace_size()), 1), dtype=torch.uint8, device=device)
    pack = dict(zip(qkv + rest, inputs))
    pack[o] = out
    g.execute(pack, workspace, handle=tch.current_handle(device.index))
    return out


def _check(name, got, expected, inputs, lens_q, lens_kv):
    assert (tuple(got.shape), got.stride(), got.dtype) == ((sum(lens_q), rg.H, rg.D), (rg.H * rg.D, rg.D, 1), torch.float16), name
    if not torch.equal(got, expected):
        diff = (got.double() - expected.double()).abs().nan_to_num(float("inf")).max().item()
        raise AssertionError(f"{name}: differs from the frontend's execute of the same graph (max abs diff {diff})")
    reference = rg.reference(inputs[0], inputs[1], inputs[2], lens_q, lens_kv)
    torch.testing.assert_close(got, reference, **TOL, msg=lambda m: f"{name} against per-sequence torch sdpa: {m}")


@pytest.mark.parametrize("own_o", [False, True], ids=["shared_offsets", "own_o_offsets"])
def test_one_build_serves_every_token_count_eager_and_native(own_o):
    graph = rg.register()[own_o]
    before = tch.stats.graphs()
    for seed, (lens_q, lens_kv) in enumerate(LENS):
        inputs = _poisoned_inputs(lens_q, lens_kv, own_o=own_o, seed=seed)
        expected = _frontend(own_o, inputs)
        (got,) = tch.execute(graph, inputs)
        _check(f"eager {lens_q}/{lens_kv}", got, expected, inputs, lens_q, lens_kv)
        (again,) = torch.ops.cudnn_fe.execute(graph, inputs)
        _check(f"torch.ops {lens_q}/{lens_kv}", again, expected, inputs, lens_q, lens_kv)
    torch.cuda.synchronize()
    built = tch.built_graphs(graph)
    after = tch.stats.graphs()
    print(f"\nragged sdpa ({'own o offsets' if own_o else 'shared offsets'}): {built[0].engine}, native={built[0].native} ({built[0].path_reason})")
    assert len(built) == 1, [b.inputs for b in built]  # one build for every T
    assert after["builds"] - before["builds"] == 1
    assert built[0].inputs[0].shape[0] == -1  # keyed without T
    # A backend plan runs natively (its tensors_to_dump are only the frontend's debug log).
    if built[0].engine.startswith("backend"):
        assert built[0].native, built[0].path_reason
        # A native call never reaches Python: only the first call (the build), and the
        # second under hand_over="second_call" (the hand-over), touched the registry.
        handed = int(settings.get("native_hand_over") == "second_call")
        assert after["hits"] - before["hits"] == handed and after["misses"] - before["misses"] == 1, (before, after)
        assert after["hand_overs"] - before["hand_overs"] == handed, (before, after)


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic_dynamic", "dynamic"])
def test_compiled_matches_eager_for_every_token_count(dynamic):
    graph = rg.register()[0]
    torch._dynamo.reset()
    compiled = torch.compile(lambda *x: torch.ops.cudnn_fe.execute(graph, list(x)), fullgraph=True, dynamic=dynamic)
    for seed, (lens_q, lens_kv) in enumerate(LENS):
        inputs = _poisoned_inputs(lens_q, lens_kv, seed=seed)
        # Automatic dynamic: the second token count recompiles with T symbolic, K's and V's
        # T two symbols that the fake kernel ties (they share offsets).
        (got,) = compiled(*inputs)
        _check(f"compiled (dynamic={dynamic}) {lens_q}/{lens_kv}", got, _frontend(False, inputs), inputs, lens_q, lens_kv)
    assert len(tch.built_graphs(graph)) == 1


def test_execute_out_writes_only_t_tokens():
    graph = rg.register()[0]
    lens_q, lens_kv = LENS[0]
    inputs = _poisoned_inputs(lens_q, lens_kv)
    t = sum(lens_q)
    sentinel = torch.full((t + 16, rg.H, rg.D), 7.0, dtype=torch.float16, device=_device())
    tch.execute_out(graph, inputs, out=[sentinel[:t]])
    _check("execute.out", sentinel[:t], _frontend(False, inputs), inputs, lens_q, lens_kv)
    assert bool((sentinel[t:] == 7.0).all()), "the graph wrote past the output's T tokens"


def test_offsets_on_the_cpu_are_refused_with_the_fix():
    graph = rg.register()[0]
    inputs = _poisoned_inputs(*LENS[0])
    tch.execute(graph, inputs)  # built, so the refusal comes from a call the native path sends back
    inputs[6] = inputs[6].cpu()
    with pytest.raises(ValueError, match=r"input 6 .* ragged offsets of packed input 1 and is on cpu.*offsets\.to\('cuda:\d'\)"):
        tch.execute(graph, inputs)


@pytest.mark.two_gpus
def test_offsets_on_another_gpu_are_refused_with_the_fix():
    graph = rg.register()[0]
    inputs = _poisoned_inputs(*LENS[0])
    other = (inputs[0].device.index + 1) % torch.cuda.device_count()
    inputs[5] = inputs[5].to(f"cuda:{other}")
    with pytest.raises(ValueError, match=rf"input 5 .* ragged offsets of packed input 0 and is on cuda:{other}"):
        tch.execute(graph, inputs)


# ---------------------------------------------------------------------------------------
# Training: ragged statistics and the declared backward


def _training_inputs(lens_q, lens_kv, seed):
    inputs = _poisoned_inputs(lens_q, lens_kv, seed=seed) + [rg.offsets(lens_q, _device(), per_token=rg.H)]
    for t in inputs[:3]:
        t.requires_grad_(True)  # views of buffers that take no gradient: leaves
    return inputs


def _reference_training(inputs, d_out, lens_q, lens_kv):
    """Per-sequence torch attention in float32: output, logsumexp statistics [T, H, 1], and grads."""
    q, k, v = (t.detach().float().requires_grad_(True) for t in inputs[:3])
    out = rg.reference(q, k, v, lens_q, lens_kv)
    out.backward(d_out.float())
    stats, tq, tk = [], 0, 0
    for nq, nk in zip(lens_q, lens_kv):
        scores = torch.einsum("qhd,khd->hqk", q[tq:tq + nq], k[tk:tk + nk]) * rg.ATTN_SCALE
        stats.append(torch.logsumexp(scores, -1).transpose(0, 1)[..., None])
        tq, tk = tq + nq, tk + nk
    return out.detach(), torch.cat(stats).detach(), [q.grad, k.grad, v.grad]


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic_dynamic"])
def test_training_one_build_each_way_gradients_match_torch(dynamic):
    """dynamic=None: the second token count recompiles with the packed buffers' T as
    symbols of their own (K's and V's two, which the fake kernel ties)."""
    graph = rg.register_training()
    backward_id = tch.registry.definition(graph).backward_id
    torch._dynamo.reset()
    compiled = torch.compile(lambda *x: torch.ops.cudnn_fe.execute(graph, list(x)), fullgraph=True, dynamic=dynamic)
    for seed, (lens_q, lens_kv) in enumerate(LENS):
        inputs = _training_inputs(lens_q, lens_kv, seed)
        o, stats = tch.execute(graph, inputs)
        d_out = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 100)).to(o)
        o.backward(d_out)
        grads = [t.grad.clone() for t in inputs[:3]]
        ref_o, ref_stats, ref_grads = _reference_training(inputs, d_out, lens_q, lens_kv)
        name = f"{lens_q}/{lens_kv}"
        assert (tuple(stats.shape), stats.dtype) == ((sum(lens_q), rg.H, 1), torch.float32), name
        torch.testing.assert_close(o.detach().float(), ref_o, **TOL, msg=lambda m: f"o {name}: {m}")
        torch.testing.assert_close(stats, ref_stats, **TOL, msg=lambda m: f"stats {name}: {m}")
        for what, got, want in zip("qkv", grads, ref_grads):
            assert got.shape == inputs["qkv".index(what)].shape
            torch.testing.assert_close(got.float(), want, **TOL, msg=lambda m, w=what: f"d{w} {name}: {m}")

        for t in inputs[:3]:
            t.grad = None
        c_o, c_stats = compiled(*inputs)
        c_o.backward(d_out)
        assert torch.equal(c_o, o) and torch.equal(c_stats, stats), f"compiled forward {name} differs from eager"
        # The backward may accumulate dQ with atomics (not bitwise repeatable): against torch.
        for what, t, want in zip("qkv", inputs[:3], ref_grads):
            torch.testing.assert_close(t.grad.float(), want, **TOL, msg=lambda m, w=what: f"compiled d{w} {name}: {m}")
    forward, backward = tch.built_graphs(graph), tch.built_graphs(backward_id)
    print(f"\nragged sdpa training: forward {forward[0].engine} native={forward[0].native}; "
          f"backward {backward[0].engine} native={backward[0].native} ({backward[0].path_reason})")
    assert (len(forward), len(backward)) == (1, 1)  # one build each for every T
    for built in forward + backward:
        if built.engine.startswith("backend"):
            assert built.native or "per call" in built.path_reason, built.path_reason
