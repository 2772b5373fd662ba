"""Dynamic shapes' settings (kernel_caches.py), which need no GPU: a graph's own
setting wins over set_dynamic_shapes(), which wins over the environment (default off);
the backward graph follows its forward's registration."""

import pytest

import torch_cudnn_handle as tch
from torch_cudnn_handle.registry import _registry, kernel_caches
from torch_cudnn_handle.registry.kernel_caches import dynamic_shapes_enabled


@pytest.fixture
def process_setting():
    saved = kernel_caches._process_enabled
    kernel_caches._process_enabled = None
    yield
    kernel_caches._process_enabled = saved


def test_per_graph_over_process_over_environment(monkeypatch, process_setting):
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_DYNAMIC_SHAPES", raising=False)
    assert dynamic_shapes_enabled() is False  # default off
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_DYNAMIC_SHAPES", "1")
    assert dynamic_shapes_enabled() is True
    tch.set_dynamic_shapes(False)
    assert dynamic_shapes_enabled() is False
    assert dynamic_shapes_enabled(True) is True
    tch.set_dynamic_shapes(True)
    assert dynamic_shapes_enabled(False) is False


def test_a_registration_carries_the_setting_to_its_backward():
    def forward(graph, x):
        return graph.relu(x)

    def backward(graph, dy, x, y):
        return graph.relu_backward(dy, x)

    graph_id = tch.register_graph(forward, backward=backward, dynamic_shapes=True)
    definition = _registry.definition(graph_id)
    assert definition.dynamic_shapes is True
    assert _registry.definition(definition.backward_id).dynamic_shapes is True
    assert _registry.definition(tch.register_graph(forward)).dynamic_shapes is None
