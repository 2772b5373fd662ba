"""Dynamic shapes' settings (plans/kernel_caches.py), which need no GPU: a graph's own
setting wins over settings.set_dynamic_shapes(), which wins over the environment (default
off); the backward graph follows its forward's registration."""

import torch_cudnn_handle as tch
from torch_cudnn_handle import registry
from torch_cudnn_handle.registry.routes import Facts, Resolved, decide


def dynamic_shapes_enabled(per_graph=None) -> bool:
    """Whether a CUDA call of a graph registered with ``dynamic_shapes=per_graph`` builds with a kernel cache (its route)."""
    definition = registry.definition(tch.register_graph(lambda g, x: g.relu(x), name="dyn", dynamic_shapes=per_graph))
    return "kernel_cache" in decide(definition, Resolved.now(), Facts("cuda")).plan_from


def test_per_graph_over_process_over_environment(monkeypatch, fresh_settings):
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_DYNAMIC_SHAPES", raising=False)
    assert dynamic_shapes_enabled() is False  # default off
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_DYNAMIC_SHAPES", "1")
    assert dynamic_shapes_enabled() is True
    tch.settings.set_dynamic_shapes(False)
    assert dynamic_shapes_enabled() is False
    assert dynamic_shapes_enabled(True) is True
    tch.settings.set_dynamic_shapes(True)
    assert dynamic_shapes_enabled(False) is False


def test_a_registration_carries_the_setting_to_its_backward():
    def forward(graph, x):
        return graph.relu(x)

    def backward(graph, dy, x, y):
        return graph.relu_backward(dy, x)

    graph_id = tch.register_graph(forward, backward=tch.Backward.graph(backward), dynamic_shapes=True)
    definition = registry.definition(graph_id)
    assert definition.dynamic_shapes is True
    assert registry.definition(definition.backward_id).dynamic_shapes is True
    assert registry.definition(tch.register_graph(forward)).dynamic_shapes is None
