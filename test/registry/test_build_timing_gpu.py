"""Where a new shape's time goes, on a GPU (registry/build_timing.py): each built
graph's ``phase_seconds`` names cuDNN's build steps, the library's own work around
them and the first execution, by the route it took, and the native hand-over of its
second call apart; and a new length's first backward is not described a second time. Outputs are checked against torch."""

import uuid

import pytest
import torch
import torch.nn.functional as F

import torch_cudnn_handle as tch
from torch_cudnn_handle.nn.attention import BACKWARD_OPERANDS, sdpa_backward, sdpa_forward
from torch_cudnn_handle.nn.linear import linear_forward
from torch_cudnn_handle import registry, settings
from torch_cudnn_handle.registry.describe import described_layout
from torch_cudnn_handle.registry.build_timing import AFTER_BUILD_PHASES

pytestmark = pytest.mark.gpu

BUILT = {"operation_graph", "heuristics", "support", "plan"}


def native_enabled() -> bool:
    return tch.with_cuda and settings.get("native_path")


def handed_over_at_build() -> bool:
    return native_enabled() and settings.get("native_hand_over") == "build"


def library_phases(*more):
    """The phases every first call has, and the native hand-over's where the build does it
    (by default the second call does: ``native_hand_over``)."""
    native = {"serialize", "native"} if handed_over_at_build() else set()
    return {"scope", "describe", "inspect", "first_execution", *native, *more}


def linear_inputs(tokens: int):
    generator = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(1, tokens, 256, device="cuda", dtype=torch.bfloat16, generator=generator)
    weight = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16, generator=generator) * 0.05
    bias = torch.randn(1, 1, 128, device="cuda", dtype=torch.bfloat16, generator=generator)
    return [x, weight.unsqueeze(0).mT, bias]


def run_linear(graph_id: int, tokens: int):
    x, w, b = inputs = linear_inputs(tokens)
    y, z = tch.execute(graph_id, inputs)
    expected = F.linear(x.float(), w[0].mT.float(), b[0, 0].float())
    torch.testing.assert_close(z.float(), expected, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(y.float(), F.gelu(expected), atol=3e-2, rtol=3e-2)
    return y, z


def only_build(graph_id: int):
    (built,) = tch.built_graphs(graph_id)
    return built


def assert_sums(built):
    assert built.build_seconds == pytest.approx(sum(s for p, s in built.phase_seconds.items() if p not in AFTER_BUILD_PHASES))
    assert all(s >= 0 for s in built.phase_seconds.values())


def test_a_static_build_records_cudnn_steps_the_library_share_and_the_first_execution():
    before = tch.stats.graphs()["phase_seconds"]
    graph_id = tch.register_graph(
        linear_forward, name=f"timing_static_{uuid.uuid4().hex[:8]}", params=dict(activation="gelu"),
    )
    run_linear(graph_id, 200)
    built = only_build(graph_id)
    assert built.plan_source == "static"
    assert set(built.phase_seconds) == BUILT | library_phases()  # store off: no key, load or store
    assert_sums(built)
    after = tch.stats.graphs()["phase_seconds"]
    for phase, seconds in built.phase_seconds.items():
        assert after[phase] - before.get(phase, 0.0) >= seconds * 0.999
    build_seconds, first_execution = built.build_seconds, built.phase_seconds["first_execution"]
    run_linear(graph_id, 200)  # a later call is no first execution; the second hands the plan over
    assert only_build(graph_id).phase_seconds["first_execution"] == first_execution
    if native_enabled() and not handed_over_at_build():
        assert set(built.phase_seconds) == BUILT | library_phases("native_hand_over") and built.native, built.path_reason
        assert built.build_seconds == build_seconds  # the hand-over is no part of the first call
        handed = tch.stats.graphs()["phase_seconds"]["native_hand_over"] - after.get("native_hand_over", 0.0)
        assert handed >= built.phase_seconds["native_hand_over"] * 0.999 > 0
    run_linear(graph_id, 200)  # natively: nothing more to record
    assert set(built.phase_seconds) == BUILT | library_phases(*(["native_hand_over"] if built.native and not handed_over_at_build() else []))


def test_a_stored_plan_then_a_loaded_one_say_so_by_phase(tmp_path, fresh_settings):
    settings.set_plan_store(True)
    settings.set_plan_store_dir(tmp_path / "plans")
    name = f"timing_stored_{uuid.uuid4().hex[:8]}"
    first = tch.register_graph(linear_forward, name=name, params=dict(activation="gelu"))
    expected = run_linear(first, 72)
    built = only_build(first)
    # "load": the store was looked in (a miss) before the build
    assert set(built.phase_seconds) == BUILT | library_phases("key", "load", "serialize", "store")
    assert_sums(built)
    again = tch.register_graph(linear_forward, name=name, params=dict(activation="gelu"))  # same key: loaded, not built
    actual = run_linear(again, 72)
    loaded = only_build(again)
    assert loaded.plan_source == "plan_store"
    assert set(loaded.phase_seconds) == library_phases("key", "load") - {"serialize"}  # the stored blob is the native hand-over's
    assert_sums(loaded)
    for a, e in zip(actual, expected):
        assert torch.equal(a, e)


def test_a_tuned_build_records_its_candidate_timing(tmp_path, fresh_settings):
    settings.set_tuning_file(tmp_path / "tuning.json")
    graph_id = tch.register_graph(
        linear_forward, name=f"timing_tuned_{uuid.uuid4().hex[:8]}", tune=True, params=dict(activation="gelu"),
    )
    run_linear(graph_id, 136)
    built = only_build(graph_id)
    assert set(built.phase_seconds) == {"operation_graph", "heuristics", "support", "tune"} | library_phases()
    assert_sums(built)


def test_a_new_lengths_first_backward_is_built_without_a_second_description():
    graph_id = tch.register_graph(
        sdpa_forward, name=f"timing_sdpa_{uuid.uuid4().hex[:8]}", backward=tch.Backward.graph(sdpa_backward, operands=BACKWARD_OPERANDS), params=dict(causal=True),
    )
    backward_id = registry.definition(graph_id).backward_id
    descriptions = described_layout.cache_info().misses
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16, generator=generator, requires_grad=True) for _ in range(3))
    d_o = torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
    o = tch.execute(graph_id, [q, k, v])[0]
    grads = torch.autograd.grad(o, (q, k, v), d_o)
    assert described_layout.cache_info().misses == descriptions, "the backward graph was described beside its build"
    built = only_build(backward_id)
    assert set(built.phase_seconds) == BUILT | library_phases()
    reference = [t.detach().float().requires_grad_() for t in (q, k, v)]
    expected_o = F.scaled_dot_product_attention(*reference, is_causal=True)
    expected = torch.autograd.grad(expected_o, reference, d_o.float())
    torch.testing.assert_close(o.float(), expected_o, atol=2e-2, rtol=2e-2)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)
