"""Ragged (packed [T, H, D]) operands without a GPU: what the builder sees, the token
count left out of every key, outputs sized [T, H, D] (eager fake kernel, torch.compile with
symbolic T, execute.out), and the refusals. Meta tensors run the descriptions, never a build."""

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import torch_cudnn_handle as tch
from torch_cudnn_handle.registry.describe import described_layout
from torch_cudnn_handle.registry.routes import Facts, Resolved, decide
from torch_cudnn_handle.registry.specs import TensorSpec

from support import ragged_graphs as rg

LENS = [((5, 17, 30), (9, 12, 40)), ((48, 1, 9), (2, 3, 4)), ((20, 20, 20), (48, 48, 48))]


def descriptions() -> int:
    """How many layouts the registry has described so far (its layout cache's misses)."""
    return described_layout.cache_info().misses


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("own_o", [False, True], ids=["shared_offsets", "own_o_offsets"])
def test_outputs_are_packed_like_q_and_one_description_serves_every_token_count(own_o):
    graph = rg.register()[own_o]
    before = descriptions()
    for lens_q, lens_kv in LENS:
        (o,) = torch.ops.cudnn_fe.execute(graph, rg.inputs(lens_q, lens_kv, "meta", own_o=own_o))
        assert (tuple(o.shape), o.stride(), o.dtype) == ((sum(lens_q), rg.H, rg.D), (rg.H * rg.D, rg.D, 1), torch.float16)
    assert descriptions() == before + 1  # T is no part of the layout key
    specs = tch.registry.definition(graph).call_specs([TensorSpec.of(t) for t in rg.inputs(*LENS[0], "meta", own_o=own_o)])
    assert specs[0].describe() == "float16[T, 4, 64] stride [256, 64, 1]"


def test_the_builder_sees_cudnns_ragged_tensor():
    seen = {}

    def builder(g, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off):
        seen.update(q=(list(q.dim), list(q.stride)), k=(list(k.dim), list(k.stride)),
                    q_off=q.ragged_offset is q_off, k_off=k.ragged_offset is kv_off, v_off=v.ragged_offset is kv_off)
        return rg.sdpa_shared(g, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, attn_scale=rg.ATTN_SCALE)

    graph = tch.register_graph(builder, ragged={0: tch.Ragged(5, 32), 1: tch.Ragged(6, 16), 2: tch.Ragged(6, 16)})
    torch.ops.cudnn_fe.execute(graph, rg.inputs((3, 4, 5), (6, 7, 8), "meta"))
    hd = rg.H * rg.D
    assert seen == dict(
        q=([rg.B, rg.H, 32, rg.D], [32 * hd, rg.D, hd, 1]), k=([rg.B, rg.H, 16, rg.D], [16 * hd, rg.D, hd, 1]),
        q_off=True, k_off=True, v_off=True,
    )


def test_a_non_contiguous_token_buffer_keeps_its_strides():
    """q, k, v as slices of one [T, 3, H, D] buffer: the token stride is 3*H*D, in the
    graph's descriptor and in the packed output declared like q."""
    graph = rg.register()[0]
    lens = (4, 5, 6)
    qkv = torch.empty(sum(lens), 3, rg.H, rg.D, dtype=torch.float16, device="meta")
    q, k, v = qkv.unbind(1)
    rest = rg.inputs(lens, lens, "meta")[3:]
    (o,) = torch.ops.cudnn_fe.execute(graph, [q, k, v, *rest])
    assert (tuple(o.shape), o.stride()) == ((15, rg.H, rg.D), (3 * rg.H * rg.D, rg.D, 1))


def test_compile_dynamic_one_frame_with_symbolic_tokens():
    graph = rg.register()[0]
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(lambda *x: torch.ops.cudnn_fe.execute(graph, list(x))[0], backend=backend, fullgraph=True, dynamic=True)
    for lens_q, lens_kv in LENS:
        o = compiled(*rg.inputs(lens_q, lens_kv, "meta"))
        assert tuple(o.shape) == (sum(lens_q), rg.H, rg.D)
    assert len(backend.fw_graphs) == 1
    (output,) = [n for n in backend.fw_graphs[0].graph.nodes if n.op == "output"]
    (traced,) = [v for v in output.args[0] if v is not None]
    assert isinstance(traced.meta["val"].shape[0], torch.SymInt)  # the output's T is q's symbol, not a constant


def test_compile_static_recompiles_per_token_count_but_describes_once():
    graph = rg.register()[0]
    calls = []
    compiled = torch.compile(lambda *x: torch.ops.cudnn_fe.execute(graph, list(x))[0], backend="aot_eager", fullgraph=True, dynamic=False)
    before = descriptions()
    for lens_q, lens_kv in LENS:
        calls.append(tuple(compiled(*rg.inputs(lens_q, lens_kv, "meta")).shape))
    assert calls == [(sum(lq), rg.H, rg.D) for lq, _ in LENS]
    assert descriptions() == before + 1  # one description


def test_execute_out_takes_an_output_of_qs_token_count_only():
    graph = rg.register()[0]
    ins = rg.inputs((5, 6, 7), (1, 2, 3), "meta")
    torch.ops.cudnn_fe.execute.out(graph, ins, out=[torch.empty(18, rg.H, rg.D, dtype=torch.float16, device="meta")])
    with pytest.raises(ValueError, match=r"out\[0\].*float16\[19, 4, 64\].*writes float16\[18, 4, 64\]"):
        torch.ops.cudnn_fe.execute.out(graph, ins, out=[torch.empty(19, rg.H, rg.D, dtype=torch.float16, device="meta")])


# -- refusals ------------------------------------------------------------------------


def test_offsets_on_another_device_are_refused_with_the_fix():
    graph = rg.register()[0]
    ins = rg.inputs((5, 6, 7), (1, 2, 3), "meta")
    ins[6] = ins[6].to("cpu") if ins[6].device.type != "meta" else torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"input 6 .* ragged offsets of packed input 1 and is on cpu.*offsets\.to\('meta'\)"):
        torch.ops.cudnn_fe.execute(graph, ins)


def test_a_one_element_cpu_offsets_tensor_is_no_host_scalar():
    """B = 0 gives a one-element offsets tensor, which elsewhere would pass by value."""
    graph = rg.register()[0]
    ins = rg.inputs((5,), (1,), "meta")
    ins[5] = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"input 5 .* ragged offsets of packed input 0 and is on cpu"):
        torch.ops.cudnn_fe.execute(graph, ins)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda ins: ins.__setitem__(0, ins[0].view(-1, rg.D)), r"input 0 .* packed .* must be a \[T, H, D\] GPU tensor"),
        (lambda ins: ins.__setitem__(5, ins[5].float()), r"input 5 .* ragged offsets of input 0, is float32\[4\]"),
        (lambda ins: ins.__setitem__(2, ins[2][:-1]), r"inputs 1 and 2 .* share ragged offsets \(input 6\) but hold 6 and 5 tokens"),
    ],
    ids=["not_3d", "float_offsets", "shared_offsets_other_t"],
)
def test_bad_packed_operands_are_refused(bad, match):
    graph = rg.register()[0]
    ins = rg.inputs((1, 2, 3), (1, 2, 3), "meta")
    bad(ins)
    with pytest.raises(ValueError, match=match):
        torch.ops.cudnn_fe.execute(graph, ins)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(ragged=[0]), TypeError, "ragged must be a dict"),
        (dict(ragged={0: (5, 48)}), TypeError, r"must be Ragged\(offsets"),
        (dict(ragged={0: tch.Ragged(1, 48), 1: tch.Ragged(6, 48)}), ValueError, "not packed itself"),
        (dict(ragged={0: tch.Ragged(5, 0)}), ValueError, "max_seq_len=0 must be a positive int"),
        (dict(ragged={0: tch.Ragged(9, 48)}), ValueError, "offsets input 9 is past the builder's 7 inputs"),
        (dict(ragged={0: tch.Ragged(5, 48)}, tune=True), ValueError, "cannot be tuned"),
        (dict(backward_ragged={0: tch.Ragged(5, 48)}), TypeError, "backward_ragged declares .* give backward"),
    ],
)
def test_bad_declarations_are_refused_at_registration(kwargs, error, match):
    with pytest.raises(error, match=match):
        tch.register_graph(rg.sdpa_shared, params=dict(attn_scale=rg.ATTN_SCALE), **kwargs)


def test_a_ragged_output_of_unknown_length_is_refused():
    def builder(g, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, o_off):
        o, _ = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=False, attn_scale=0.1, use_padding_mask=True,
                      seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
        return o.set_dim([rg.B, rg.H, 40, rg.D]).set_stride([40 * rg.H * rg.D, rg.D, rg.H * rg.D, 1]).set_ragged_offset(o_off)

    graph = tch.register_graph(builder, ragged={0: tch.Ragged(5, 48), 1: tch.Ragged(6, 48), 2: tch.Ragged(6, 48)})
    ins = rg.inputs((1, 2, 3), (1, 2, 3), "meta") + [rg.offsets((1, 2, 3), "meta")]
    with pytest.raises(ValueError, match=r"ragged output 0 .* token count is unknown; .*o\.set_ragged_offset\(q_off\)"):
        torch.ops.cudnn_fe.execute(graph, ins)


def test_training_forward_and_backward_give_packed_outputs_and_gradients():
    graph = rg.register_training()
    before = descriptions()
    for lens_q, lens_kv in LENS[:2]:
        ins = rg.training_inputs(lens_q, lens_kv, "meta")
        for t in ins[:3]:
            t.requires_grad_(True)
        o, stats = torch.ops.cudnn_fe.execute(graph, ins)
        tq = sum(lens_q)
        assert (tuple(o.shape), tuple(stats.shape), stats.stride(), stats.dtype) == ((tq, rg.H, rg.D), (tq, rg.H, 1), (rg.H, 1, 1), torch.float32)
        assert o.requires_grad and not stats.requires_grad  # the statistics take no gradient
        o.float().sum().backward()
        assert [tuple(t.grad.shape) for t in ins[:3]] == [tuple(t.shape) for t in ins[:3]]
    assert descriptions() == before + 2  # the forward's and the backward's, each T-free


def test_training_compiles_one_frame_forward_and_backward():
    graph = rg.register_training()
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(lambda *x: torch.ops.cudnn_fe.execute(graph, list(x))[0], backend=backend, fullgraph=True, dynamic=True)
    for lens_q, lens_kv in LENS:
        ins = rg.training_inputs(lens_q, lens_kv, "meta")
        for t in ins[:3]:
            t.requires_grad_(True)
        compiled(*ins).float().sum().backward()
        assert [tuple(t.grad.shape) for t in ins[:3]] == [tuple(t.shape) for t in ins[:3]]
    assert (len(backend.fw_graphs), len(backend.bw_graphs)) == (1, 1)


def test_spec_describe_names_the_token_count():
    assert TensorSpec((-1, 2, 8), (16, 8, 1), torch.float16).describe() == "float16[T, 2, 8] stride [16, 8, 1]"


def test_ragged_graphs_are_never_tuned():
    """Tuning times candidates on random data, which are no valid offsets: off per graph,
    which wins over the plan_tuning setting."""

    graph = rg.register_training()
    forward = tch.registry.definition(graph)
    backward = tch.registry.definition(forward.backward_id)
    with tch.settings.override(plan_tuning=True):
        for definition in (forward, backward):
            assert decide(definition, Resolved.now(), Facts("cuda")).tuned is False


def test_the_cuda_paths_refusal_of_cpu_offsets_names_the_inputs_gpu():
    """What the device rule (op/checks.py call_device) says, on fake CUDA inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_cudnn_handle.op.checks import call_device

    graph = rg.register()[0]
    offsets = rg.offsets((1, 2, 3), "cpu")
    with FakeTensorMode():
        ins = rg.inputs((1, 2, 3), (1, 2, 3), "cuda:0")
    ins[5] = offsets
    with pytest.raises(ValueError, match=r"input 5 .* ragged offsets of packed input 0 and is on cpu, but the graph runs on cuda:0.*offsets\.to\('cuda:0'\)"):
        call_device(graph, ins)


# -- packed inputs sharing offsets under symbols of their own ------------------------
# torch.compile's automatic dynamic shapes (no dynamic=True: the second token count
# recompiles) give K's T and V's T a symbol each, although they share offsets and so
# are always equal; the fake kernel must describe them as one token count.


def _fake_cuda_packed(*tokens):
    """A shape environment without duck shaping (equal sizes, distinct symbols, as
    automatic dynamic shapes give them) and one fake CUDA [T, H, D] buffer per count, each
    T a symbol of its own; create under the returned mode."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    shape_env = ShapeEnv(duck_shape=False)
    symbols = [
        shape_env.create_symintnode(shape_env.create_symbol(n, ConstantSource(f"tokens{i}"), dynamic_dim=DimDynamic.DYNAMIC), hint=n)
        for i, n in enumerate(tokens)
    ]
    mode = FakeTensorMode(shape_env=shape_env)
    with mode:
        buffers = [torch.empty(t, rg.H, rg.D, dtype=torch.float16, device="cuda:0") for t in symbols]
    return mode, symbols, buffers


def _expr(size) -> str:
    return str(size.node.expr) if isinstance(size, torch.SymInt) else str(size)


def test_packed_inputs_sharing_offsets_are_one_token_count_under_distinct_symbols():
    graph = rg.register()[0]
    lens_q, lens_kv = (4, 5, 6), (3, 3, 3)
    mode, (tq, tk, tv), (q, k, v) = _fake_cuda_packed(sum(lens_q), sum(lens_kv), sum(lens_kv))
    assert _expr(tk) != _expr(tv)  # what automatic dynamic shapes hand the fake kernel
    with mode:
        rest = rg.inputs(lens_q, lens_kv, "cuda:0")[3:]
        (o,) = torch.ops.cudnn_fe.execute(graph, [q, k, v, *rest])
    assert o.device == torch.device("cuda:0") and tuple(o.shape[1:]) == (rg.H, rg.D)
    assert isinstance(o.shape[0], torch.SymInt) and _expr(o.shape[0]) == _expr(tq)  # O follows q's symbol
    assert _expr(tk) == _expr(tv)  # torch now knows K and V hold the same tokens (a guard of the frame)


def test_gradients_of_packed_inputs_sharing_offsets_follow_one_symbol():
    """The declared backward: dK and dV share K's offsets, dQ and dO Q's; with every
    packed operand a symbol of its own, each gradient follows its input's symbol."""
    forward = rg.register_training()
    backward = tch.registry.definition(forward).backward_id
    lens_q, lens_kv = (4, 5, 6), (3, 3, 3)
    tq, tkv = sum(lens_q), sum(lens_kv)
    mode, (t_do, t_q, t_k, t_v, t_o, t_stats), (d_o, q, k, v, o, stats) = _fake_cuda_packed(tq, tq, tkv, tkv, tq, tq)
    with mode:
        stats = torch.empty(t_stats, rg.H, 1, dtype=torch.float32, device="cuda:0")
        rest = rg.training_inputs(lens_q, lens_kv, "cuda:0")[3:]
        d_q, d_k, d_v = torch.ops.cudnn_fe.execute(backward, [d_o, q, k, v, o, stats, *rest])
    assert [_expr(g.shape[0]) for g in (d_q, d_k, d_v)] == [_expr(t_q), _expr(t_k), _expr(t_k)]
    assert len({_expr(t) for t in (t_do, t_q, t_o)}) == 1 and _expr(t_k) == _expr(t_v)


def test_distinct_symbols_of_unequal_token_counts_are_refused_with_the_fix():
    graph = rg.register()[0]
    mode, _, (q, k, v) = _fake_cuda_packed(15, 9, 10)
    with mode:
        rest = rg.inputs((4, 5, 6), (3, 3, 3), "cuda:0")[3:]
        with pytest.raises(ValueError, match=r"inputs 1 and 2 .* share ragged offsets \(input 6\) but hold 9 and 10 tokens; give each buffer its own offsets"):
            torch.ops.cudnn_fe.execute(graph, [q, k, v, *rest])


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_compile_with_automatic_dynamic_shapes_recompiles_once_for_every_token_count(training):
    """No dynamic=True: the second token count recompiles with each buffer's T a symbol of
    its own (K's and V's too), and that frame serves every later count."""
    graph = rg.register_training() if training else rg.register()[0]
    make = rg.training_inputs if training else rg.inputs
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(lambda *x: torch.ops.cudnn_fe.execute(graph, list(x))[0], backend=backend, fullgraph=True)
    for lens_q, lens_kv in LENS:
        ins = make(lens_q, lens_kv, "meta")
        for t in ins[:3]:
            t.requires_grad_(training)
        o = compiled(*ins)
        assert tuple(o.shape) == (sum(lens_q), rg.H, rg.D)
        if training:
            o.float().sum().backward()
            assert [tuple(t.grad.shape) for t in ins[:3]] == [tuple(t.shape) for t in ins[:3]]
    assert (len(backend.fw_graphs), len(backend.bw_graphs)) == (2, 2 if training else 0)
    (output,) = [n for n in backend.fw_graphs[1].graph.nodes if n.op == "output"]
    traced = output.args[0][0].meta["val"]
    assert isinstance(traced.shape[0], torch.SymInt)  # symbolic T in the recompiled frame
