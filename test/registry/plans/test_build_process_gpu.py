"""Build processes on a GPU (Note [The build process]): a background build of a graph only
the cuDNN backend serves is built by a helper process, and the plan it sends back is the
plan an in-process build selects: the same engine, bitwise the same results, run natively.
A graph a Python engine family may claim (sdpa, the norms) travels as its recipe, which the
helper describes itself; deterministic calls stay in-process."""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle.nn.linear import forward_views, linear_forward

pytestmark = pytest.mark.gpu


@pytest.fixture
def background(fresh_settings):
    fresh_settings.set_serving_mode(True)
    fresh_settings.set_build_process(True)
    yield fresh_settings


def _linear(name: str) -> int:
    return tch.register_graph(linear_forward, name=name, views=forward_views("gelu"), params=dict(activation="gelu"))


def _built(graph_id: int):
    assert tch.registry.wait_for_builds(120) == 0
    (built,) = tch.built_graphs(graph_id)
    return built


def test_a_fused_linear_built_in_a_build_process_is_the_plan_built_here(background):
    torch.manual_seed(0)
    x = torch.randn(3, 173, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16) / 16
    b = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    elsewhere, here = _linear("build_process_linear_gelu"), _linear("build_process_linear_gelu_here")
    before = tch.stats.build_processes()
    first = tch.execute(elsewhere, [x, w, b])  # the stand-in serves it while the helper builds
    built = _built(elsewhere)
    assert built.plan_source == "build_process", (built.plan_source, built.plan_source_reason, tch.stats.build_processes())
    assert tch.stats.build_processes()["builds"] == before["builds"] + 1
    assert "build_process" in built.phase_seconds and built.native_pending, built.path_reason  # loaded here, never on a build thread
    with tch.settings.override(serving_mode=False):
        expected = tch.execute(here, [x, w, b])
    assert tch.built_graphs(here)[0].plan_source == "static"
    assert built.engine == tch.built_graphs(here)[0].engine
    later = tch.execute(elsewhere, [x, w, b])
    assert built.native, built.path_reason  # handed over by the first call it served (Note [A fetched plan is loaded by the call that takes it])
    for got, want, stand_in in zip(later, expected, first):
        assert torch.equal(got, want)  # the same plan
        torch.testing.assert_close(stand_in, want, atol=3e-2, rtol=3e-2)  # the stand-in: torch ops, within the numerics


def test_a_graph_with_a_host_scalar_keeps_it_through_a_build_process(background):
    def scaled_matmul(g, a, b, alpha):
        y = g.mul(g.matmul(a, b, name="mm"), alpha, name="scale")
        dim = [a.dim[0], a.dim[1], b.dim[2]]
        return y.set_dim(dim).set_stride([dim[1] * dim[2], dim[2], 1]).set_data_type(a.data_type)

    elsewhere = tch.register_graph(scaled_matmul, name="build_process_scaled_matmul")
    here = tch.register_graph(scaled_matmul, name="build_process_scaled_matmul_here")
    a, b = torch.randn(1, 96, 64, device="cuda", dtype=torch.float16), torch.randn(1, 64, 80, device="cuda", dtype=torch.float16)
    alpha = torch.full((1, 1, 1), 0.75)  # a one-element CPU tensor (with the operand's rank, as cuDNN wants): pass-by-value
    tch.execute(elsewhere, [a, b, alpha])
    assert tch.registry.wait_for_builds(120) == 0
    with tch.settings.override(serving_mode=False):
        (expected,) = tch.execute(here, [a, b, alpha])
        tch.execute(elsewhere, [a, b, alpha])  # a failed background build raises here, in the call's own build
    (built,) = tch.built_graphs(elsewhere)
    assert built.plan_source == "build_process", (built.plan_source, tch.stats.build_processes())
    for value in (0.75, -2.0):  # a by-value scalar is read per call, not baked into the plan
        (got,) = tch.execute(elsewhere, [a, b, torch.full((1, 1, 1), value)])
        (want,) = tch.execute(here, [a, b, torch.full((1, 1, 1), value)])
        assert torch.equal(got, want)
        torch.testing.assert_close(got, (a @ b) * value, atol=2e-2, rtol=2e-2)
    assert torch.equal(tch.execute(elsewhere, [a, b, alpha])[0], expected)


@pytest.mark.parametrize("kind", ["sdpa", "rmsnorm"])
def test_a_graph_a_python_engine_family_may_claim_is_built_in_a_build_process_from_its_recipe(background, kind):
    from torch_cudnn_handle.nn.attention import sdpa_inference_forward
    from torch_cudnn_handle.nn.norm import rmsnorm_forward

    torch.manual_seed(0)
    if kind == "sdpa":
        builder, params = sdpa_inference_forward, dict(causal=True)
        inputs = [torch.randn(1, 2, 96, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    else:
        builder, params = rmsnorm_forward, dict(eps=1e-5)
        inputs = [torch.randn(80, 256, 1, 1, device="cuda", dtype=torch.bfloat16), torch.rand(1, 256, 1, 1, device="cuda", dtype=torch.bfloat16)]
    elsewhere = tch.register_graph(builder, name=f"build_process_{kind}", params=params)
    here = tch.register_graph(builder, name=f"build_process_{kind}_here", params=params)
    first = tch.execute(elsewhere, inputs)  # the interpreter stands in while a helper builds
    built = _built(elsewhere)
    with tch.settings.override(serving_mode=False):
        expected = tch.execute(here, inputs)
    (static,) = tch.built_graphs(here)
    stats = tch.stats.build_processes()
    if static.engine.startswith("frost:"):  # the frontend's walk picked a Python engine: its plan cannot travel
        assert built.plan_source == "static" and "Python engine" in stats["last_error"], (built.plan_source, stats)
    else:
        assert built.plan_source == "build_process", (built.plan_source, built.plan_source_reason, stats["last_error"], stats)
        assert built.engine == static.engine and built.native_pending, built.path_reason
    for got, want, stand_in in zip(tch.execute(elsewhere, inputs), expected, first):
        assert torch.equal(got, want)  # the same plan, whichever process built it
        torch.testing.assert_close(stand_in.float(), want.float(), atol=3e-2, rtol=3e-2)
    assert built.plan_source == "static" or built.native, built.path_reason  # handed over by the first call it served


def test_deterministic_builds_stay_in_this_process(background):
    deterministic = _linear("build_process_linear_gelu_deterministic")
    x = torch.randn(1, 40, 256, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16), torch.randn(384, device="cuda", dtype=torch.bfloat16)
    torch.use_deterministic_algorithms(True)
    try:
        tch.execute(deterministic, [x, w, b])  # waits for its build, in this process
    finally:
        torch.use_deterministic_algorithms(False)
    assert [b.plan_source for b in tch.built_graphs(deterministic)] == ["static"]
