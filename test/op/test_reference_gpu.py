"""The reference route on CUDA tensors, only where asked: a graph registered with
``reference=True`` and every graph under the ``reference_path`` setting run on the torch
interpreter on their GPU, never built, never native; ``execute_reference`` runs any call
there. (test_reference_route.py has what needs no GPU.)"""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import _C, registry, settings, stats
from torch_cudnn_handle.registry.build import REFERENCE_SOURCE

pytestmark = pytest.mark.gpu


def fma(graph, x, s, y):
    return graph.add(graph.mul(x, s, name="mul"), y, name="add")


def relu(graph, x):
    return graph.relu(x, name="relu")


def relu_grad(graph, dy, x):
    return [graph.relu_backward(dy, x, name="drelu")]


def _inputs(device="cuda", dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=gen).to(dtype=dtype, device=device) for shape in ((4, 64, 96), (1, 1, 96), (4, 64, 96))]


def _assert_reference_entry(graph_id):
    (built,) = tch.built_graphs(graph_id)
    assert built.route.runs_on == "interpreter" and built.plan_source == REFERENCE_SOURCE and built.graph is None and not built.native and not built.native_pending
    assert "torch interpreter" in built.path_reason and built.engine == "reference"
    return built


def test_a_reference_graph_runs_on_the_interpreter_on_its_gpu_and_is_never_built():
    graph_id = tch.register_graph(fma, name="fma_reference", reference=True)
    inputs = _inputs()
    before = stats.graphs()
    (out,) = tch.execute(graph_id, inputs)
    assert out.device == inputs[0].device and out.dtype == torch.float16
    (expected,) = tch.execute(graph_id, [t.cpu() for t in inputs])  # the CPU kernel: the same interpreter
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=2e-3, rtol=2e-3)
    _assert_reference_entry(graph_id)
    after = stats.graphs()
    assert after["builds"] == before["builds"] and after["plan_sources"].get(REFERENCE_SOURCE, 0) == before["plan_sources"].get(REFERENCE_SOURCE, 0) + 1
    assert _C.run_native(graph_id, inputs) is None  # no native plan, now or at a later call
    tch.execute(graph_id, inputs)
    assert _C.run_native(graph_id, inputs) is None and not tch.built_graphs(graph_id)[0].native


def test_out_in_place_and_autograd_on_the_reference_route():
    graph_id = tch.register_graph(
        relu, name="relu_reference", reference=True,
        backward=tch.Backward.graph(relu_grad, operands=[tch.BackwardOperand.grad(0), tch.BackwardOperand.input(0)]),
    )
    x = torch.randn(2, 8, 16, device="cuda", requires_grad=True)
    (y,) = tch.execute(graph_id, [x])
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(x.grad, dy * (x.detach() > 0))
    _assert_reference_entry(registry.definition(graph_id).backward_id)  # its backward graph is one too
    out = torch.empty_like(y)
    tch.execute_out(graph_id, [x.detach()], out=[out])
    assert torch.equal(out, torch.relu(x.detach()))
    writes = tch.register_graph(relu, name="relu_in_place_reference", reference=True, in_place={0: 0})
    z = torch.randn(2, 8, 16, device="cuda")
    expected = torch.relu(z)
    assert tch.execute_(writes, [z]) == [] and torch.equal(z, expected)


def test_the_setting_moves_every_graph_there_and_back_at_once():
    follows = tch.register_graph(fma, name="fma_follows")
    stays = tch.register_graph(fma, name="fma_stays_cudnn", reference=False)
    inputs = _inputs()
    (native,) = tch.execute(follows, inputs)
    tch.execute(stays, inputs)
    assert tch.built_graphs(follows)[0].plan_source != REFERENCE_SOURCE
    with settings.override(reference_path=True):
        assert tch.built_graphs(follows) == []  # dropped with its native plan when the setting was switched
        (interpreted,) = tch.execute(follows, inputs)
        _assert_reference_entry(follows)
        assert tch.built_graphs(stays)[0].plan_source != REFERENCE_SOURCE  # reference=False: cuDNN whatever the setting
        torch.testing.assert_close(interpreted.float(), native.float(), atol=2e-3, rtol=2e-3)
    assert tch.built_graphs(follows) == []  # off: the interpreter's entry is dropped too
    tch.execute(follows, inputs)
    assert tch.built_graphs(follows)[0].plan_source != REFERENCE_SOURCE


def test_execute_reference_runs_a_cuda_call_in_torch_ops_on_its_gpu():
    graph_id = tch.register_graph(fma, name="fma_hook")
    inputs = _inputs()
    (ours,) = tch.execute_reference(graph_id, inputs, compute_dtype=torch.float64)
    assert ours.device == inputs[0].device and tch.built_graphs(graph_id) == []  # no build
    x, s, y = (t.double() for t in inputs)
    torch.testing.assert_close(ours.double(), (x * s + y).half().double(), atol=1e-3, rtol=1e-3)
