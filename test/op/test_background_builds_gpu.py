"""Builds off the caller's path through the op, on a GPU (Note [Builds off the caller's
path]): with the serving_mode setting, a new layout's first call is served by the
interpreter on the GPU (right against torch, counted as a stand-in call) while the plan
builds; once built, calls run on cuDNN (natively), within the engine's numerics of the
stand-in's; a backward at a new layout is served the same way; deterministic calls wait."""

import pytest
import torch
import torch.nn.functional as F

import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import FusedLinear

pytestmark = pytest.mark.gpu


def _wait_for_builds():
    assert tch.registry.wait_for_builds(60) == 0


@pytest.fixture
def background(fresh_settings):
    fresh_settings.set_serving_mode(True)
    yield fresh_settings


def test_a_new_layout_is_served_by_the_stand_in_then_by_cudnn(background):
    torch.manual_seed(0)
    layer = FusedLinear(256, 384, "gelu", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 200, 256, device="cuda", dtype=torch.bfloat16)
    expected = F.gelu(F.linear(x.float(), layer.weight.float(), layer.bias.float()))
    before = tch.stats.graphs()
    with torch.no_grad():
        first = layer(x)
    after = tch.stats.graphs()
    assert after["stand_in_calls"] > before["stand_in_calls"] and after["background_builds"] > before["background_builds"]
    torch.testing.assert_close(first.float(), expected, atol=3e-2, rtol=3e-2)
    _wait_for_builds()
    with torch.no_grad():
        later = layer(x)
    assert tch.stats.graphs()["stand_in_calls"] == after["stand_in_calls"]  # built now: no stand-in
    torch.testing.assert_close(later.float(), expected, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(later, first, atol=2e-2, rtol=2e-2)  # within the engine's numerics, not bitwise
    assert all(b.native for b in tch.built_graphs(layer._graph)), [b.path_reason for b in tch.built_graphs(layer._graph)]


def test_a_training_step_at_a_new_layout_runs_forward_and_backward_on_the_stand_in(background):
    torch.manual_seed(1)
    layer = FusedLinear(128, 128, "relu", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 72, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()
    reference = tch.nn.reference_of(layer)
    x_ref = x.detach().clone().requires_grad_()
    reference(x_ref).float().sum().backward()
    torch.testing.assert_close(x.grad.float(), x_ref.grad.float(), atol=3e-2, rtol=3e-2)
    _wait_for_builds()


def test_deterministic_calls_wait_for_the_build(background):
    layer = FusedLinear(128, 64, None, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 40, 128, device="cuda", dtype=torch.bfloat16)
    stand_ins = tch.stats.graphs()["stand_in_calls"]
    torch.use_deterministic_algorithms(True)
    try:
        with torch.no_grad():
            layer(x)
    finally:
        torch.use_deterministic_algorithms(False)
    assert tch.stats.graphs()["stand_in_calls"] == stand_ins


def test_a_capture_waits_for_a_build_in_flight_and_captures_the_plan(background):
    """A capture that meets its layout's build in flight waits for it and captures the
    plan, never the stand-in (no two implementations in one capture)."""
    torch.manual_seed(2)
    layer = FusedLinear(256, 256, "relu", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 333, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x)  # the warm-up: a stand-in call, its build in flight
        graph = torch.cuda.CUDAGraph()
        stand_ins = tch.stats.graphs()["stand_in_calls"]
        with torch.cuda.graph(graph):
            captured = layer(x)
        assert tch.stats.graphs()["stand_in_calls"] == stand_ins
        graph.replay()
        expected = layer(x)
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)
