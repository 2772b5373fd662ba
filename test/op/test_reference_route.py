"""The reference route without a GPU: how a graph asks for the interpreter on CUDA tensors
(``register_graph(reference=True)``, the ``reference_path`` setting), what the setting
does to graphs already in the cache, and ``execute_reference``. test_reference_gpu.py runs
CUDA calls on it."""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import registry, settings
from torch_cudnn_handle.native import NativeBinding
from torch_cudnn_handle.registry import graph_cache
from torch_cudnn_handle.registry.build import BuiltGraph
from torch_cudnn_handle.registry.routes import Route


def relu(graph, x):
    return graph.relu(x)


def relu_grad(graph, dy, x):
    return [graph.relu_backward(dy, x)]


def test_reference_is_a_registration_option_its_backward_graph_inherits():
    graph_id = tch.register_graph(relu, reference=True, backward=tch.Backward.graph(relu_grad, operands=[tch.BackwardOperand.grad(0), tch.BackwardOperand.input(0)]))
    forward = registry.definition(graph_id)
    assert forward.reference is True and registry.definition(forward.backward_id).reference is True
    assert registry.definition(tch.register_graph(relu)).reference is None  # the setting decides
    with pytest.raises(TypeError, match="reference must be True, False or None"):
        tch.register_graph(relu, reference="yes")


def test_the_setting_has_a_variable_and_a_named_setter():
    row = next(s for s in settings.SETTINGS if s.name == "reference_path")
    assert (row.variable, row.default) == ("TORCH_CUDNN_HANDLE_REFERENCE", False)
    assert settings.set_reference_path(False) is False


def _entry(graph_id: int, runs_on: str):
    layout = registry.layout(graph_id, [registry.TensorSpec((2, 3, 4), (12, 4, 1), torch.float32)])
    built = BuiltGraph(None, 0, (), layout, (), 0, NativeBinding("python", "a stand-in"), route=Route(runs_on))
    key = (graph_id, 0, (("stand-in", runs_on),), False)
    registry._graph_cache._entries[key] = graph_cache._Entry(built)
    return key


def test_switching_the_setting_drops_the_entries_it_moves():
    """On: every graph cuDNN built is dropped (its native plan with it); off: every
    interpreter entry; graphs registered with reference=True or False never move."""
    follows, pinned_on, pinned_off = tch.register_graph(relu), tch.register_graph(relu, reference=True), tch.register_graph(relu, reference=False)
    keys = {name: _entry(gid, route) for name, gid, route in (
        ("built", follows, "cudnn"), ("reference_true", pinned_on, "interpreter"), ("reference_false", pinned_off, "cudnn"))}
    entries = registry._graph_cache._entries
    try:
        with settings.override(reference_path=True):
            assert keys["built"] not in entries and keys["reference_true"] in entries and keys["reference_false"] in entries
            keys["interpreted"] = _entry(follows, "interpreter")
        assert keys["interpreted"] not in entries  # off again: the interpreter's entry goes, cuDNN builds next time
        assert keys["reference_true"] in entries and keys["reference_false"] in entries
    finally:
        for key in keys.values():
            entries.pop(key, None)


def test_execute_reference_runs_any_call_on_the_interpreter_in_the_ops_layout():
    x = torch.randn(2, 3, 4)
    graph_id = tch.register_graph(relu)
    (y,) = tch.execute_reference(graph_id, [x])
    assert torch.equal(y, torch.relu(x)) and y.stride() == (12, 4, 1)
    (y64,) = tch.execute_reference(graph_id, [x.double()], compute_dtype=torch.float64)
    assert y64.dtype == torch.float64
    x.requires_grad_()
    assert not tch.execute_reference(graph_id, [x])[0].requires_grad  # no autograd node: a reference, not the op
    add = tch.register_graph(lambda g, a, b: g.add(a, b), name="add2")
    with pytest.raises(ValueError, match="inputs on more than one device"):  # the op's device rule
        tch.execute_reference(add, [torch.randn(2, 3, 4), torch.randn(2, 3, 4, device="meta")])
