"""The two caches on a GPU: plans built with a kernel cache (dynamic shapes, from cuDNN
9.21: registry/plans/kernel_caches.py says why) and plans loaded from the plan store (another
process's builds) against plans built statically.

What is compared is bitwise (torch.equal): the matmul+bias+gelu graph of
nn/linear.py and the nn sdpa forward and backward graphs of nn/attention.py, at
several lengths. A plan from the store is the plan that was built, so it must be
bitwise equal. A kernel-cache build may select another plan than a static build
(dynamic shapes change the heuristics' list); whether it does decides whether
dynamic shapes can be on by default: a failure of ``test_kernel_cache_builds_...``
names the plans of both routes.
"""

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

import torch_cudnn_handle as tch
from support.paths import REPO, TESTS
from torch_cudnn_handle.nn.attention import BACKWARD_OPERANDS, sdpa_backward, sdpa_forward
from torch_cudnn_handle.nn.linear import linear_forward
from torch_cudnn_handle import registry, settings
from torch_cudnn_handle.registry.build_timing import AFTER_BUILD_PHASES

pytestmark = pytest.mark.gpu

LENGTHS = (136, 264, 520, 1032)
ROOT = REPO


def register(tag: str, dynamic: bool):
    """The linear (gelu) graph and the causal sdpa forward with its backward, under names of ``tag``."""
    linear = tch.register_graph(
        linear_forward, name=f"plan_cache_linear_gelu_{tag}", dynamic_shapes=dynamic, params=dict(activation="gelu"),
    )
    attention = tch.register_graph(
        sdpa_forward, name=f"plan_cache_sdpa_{tag}", backward=tch.Backward.graph(sdpa_backward, operands=BACKWARD_OPERANDS), params=dict(causal=True),
        dynamic_shapes=dynamic,
    )
    return linear, attention


def inputs(length: int, seed: int):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator) * scale

    weight = randn(1024, 1024, scale=0.03)
    linear = [randn(1, 2 * length, 1024), weight.unsqueeze(0).mT, randn(1, 1, 1024)]
    attention = [randn(2, 8, length, 64) for _ in range(3)]
    return linear, attention, randn(2, 8, length, 64)


def workload(linear_id: int, attention_id: int, length: int, seed: int = 0):
    """Outputs of the linear graph, and of the sdpa forward and backward."""
    linear, attention, d_o = inputs(length, seed)
    y, z = tch.execute(linear_id, linear)
    q, k, v = (t.requires_grad_() for t in attention)
    o, stats = tch.execute(attention_id, [q, k, v])
    o.backward(d_o)
    return [y, z, o.detach(), stats, q.grad, k.grad, v.grad]


def assert_bitwise(actual, expected, what):
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape and torch.equal(a, e), f"{what}: output {i} differs (max abs {(a.float() - e.float()).abs().max().item():.3e})"


def assert_same_numbers(actual, expected, what, engines, expected_engines):
    """Bitwise where both builds selected the same engines; else within the engines' numerics
    (bf16: cuDNN may pick another engine for a dynamic-shape graph than for a static one,
    measured on cuDNN 9.27), the engines named either way."""
    what = f"{what}, engines {sorted(engines)} vs {sorted(expected_engines)}"
    if set(engines) == set(expected_engines):
        return assert_bitwise(actual, expected, what)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, f"{what}: output {i}"
        torch.testing.assert_close(a.float(), e.float(), atol=6e-2, rtol=5e-2, msg=lambda m: f"{what}: output {i}: {m}")


def engines_of(*graph_ids):
    return {engine for *_, engine in routes(*graph_ids)}


def routes(*graph_ids):
    ids = [*graph_ids, *(registry.definition(g).backward_id for g in graph_ids)]
    return [(b.plan_source, b.plan_source_reason, b.native, b.engine) for g in ids if g is not None for b in tch.built_graphs(g)]


CACHE_REFUSED = "the build with a kernel cache failed"  # plans/__init__.py's reason for a static build after one


def cache_routes(built) -> set:
    """The routes of kernel-cache requests: ``kernel_cache``, or ``static`` where cuDNN refused the
    cache for that structure and said so (cuDNN 9.27 refuses it for the sdpa backward:
    "no ... finalize_internal()"); any other static build fails here, with its reason."""
    for route, reason, *_ in built:
        assert route == "kernel_cache" or (route == "static" and reason.startswith(CACHE_REFUSED)), (route, reason)
    return {route if route == "kernel_cache" else "refused" for route, *_ in built}


@pytest.fixture
def plan_cache(tmp_path):
    """The plan store on, in tmp_path, for this test."""
    with settings.override(plan_store=True, plan_store_dir=tmp_path / "plans"):
        yield tmp_path / "plans"


# ---------------------------------------------------------------------------------
# (a) the kernel cache route


import cudnn  # noqa: E402

from torch_cudnn_handle.registry.plans import kernel_caches  # noqa: E402

def _below_min_backend() -> bool:
    try:
        return cudnn.backend_version() < kernel_caches.MIN_BACKEND
    except Exception:  # noqa: BLE001 -- no libcudnn here: the module skips anyway
        return True


below_min_backend = pytest.mark.skipif(_below_min_backend(), reason=kernel_caches.BELOW_MIN_BACKEND)


def test_below_the_minimum_cudnn_a_dynamic_shapes_request_builds_statically_and_says_why():
    if not _below_min_backend():
        pytest.skip("this cuDNN builds with kernel caches")
    dynamic = register(f"gated_{uuid.uuid4().hex[:8]}", True)
    static = register(f"gated_static_{uuid.uuid4().hex[:8]}", False)
    assert_bitwise(workload(*dynamic, LENGTHS[1]), workload(*static, LENGTHS[1]), "a gated request")
    assert {(route, reason) for route, reason, *_ in routes(*dynamic)} == {("static", kernel_caches.BELOW_MIN_BACKEND)}


@below_min_backend
def test_kernel_cache_builds_give_bitwise_the_outputs_of_static_builds():
    tag = uuid.uuid4().hex[:8]
    static, dynamic = register(f"static_{tag}", False), register(f"dynamic_{tag}", True)
    for length in LENGTHS:
        expected = workload(*static, length)
        actual = workload(*dynamic, length)
        assert_same_numbers(actual, expected, f"length {length}, kernel cache against static", engines_of(*dynamic), engines_of(*static))
        assert_bitwise(workload(*dynamic, length), actual, f"length {length}, kernel cache, second call (native)")
    built = routes(*dynamic)
    assert len(built) == 3 * len(LENGTHS)  # linear, sdpa forward, sdpa backward per length
    assert "kernel_cache" in cache_routes(built)
    assert all(native for _, _, native, _ in built), "the native path serves kernel-cache plans (from their second call)"
    assert {route for route, *_ in routes(*static)} == {"static"}
    stats = tch.stats.graphs()
    assert stats["plan_sources"]["kernel_cache"] >= sum(route == "kernel_cache" for route, *_ in built) and stats["plan_seconds"] > 0
    for b in tch.built_graphs(dynamic[1]):  # where each build's time went
        handed = "native" if settings.get("native_hand_over") == "build" else "native_hand_over"
        assert {"describe", "operation_graph", "heuristics", "support", "plan", handed} <= set(b.phase_seconds)
        assert sum(v for k, v in b.phase_seconds.items() if k not in AFTER_BUILD_PHASES) == pytest.approx(b.build_seconds)


@below_min_backend
def test_a_new_length_is_cheaper_with_the_kernel_cache():
    """Not a benchmark (bench/new_shapes.py is): the kernel cache must at least not make
    later lengths dearer than the first, whose kernels it compiled."""
    linear, attention = register(f"dynamic_{uuid.uuid4().hex[:8]}", True)
    for length in LENGTHS:
        workload(linear, attention, length)
    seconds = {}
    for b in tch.built_graphs(attention):
        seconds[b.inputs[0].shape[2]] = b.build_seconds
    first, later = seconds[LENGTHS[0]], [seconds[n] for n in LENGTHS[1:]]
    assert min(later) < first, seconds


# ---------------------------------------------------------------------------------
# (b) a second process loads what the first built

_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    import torch
    import torch_cudnn_handle as tch
    sys.path.insert(0, sys.argv[3])
    from test_plan_cache_gpu import register, routes, workload

    linear, attention = register("two_processes", False)
    outputs = {length: workload(linear, attention, length) for length in (136, 520)}
    for length, first in outputs.items():  # the second call hands each plan to the native path
        assert all(torch.equal(a, b) for a, b in zip(workload(linear, attention, length), first)), length
    torch.cuda.synchronize()
    torch.save({str(k): v for k, v in outputs.items()}, sys.argv[1])
    stats = dict(tch.stats.graphs(), store=tch.stats.plan_store())
    json.dump(dict(stats=stats, routes=routes(linear, attention), seconds=time.perf_counter() - started), open(sys.argv[2], "w"))
    """
)


def run_process(tmp_path, name: str, cache_dir):
    script = tmp_path / "second_process.py"
    script.write_text(_SCRIPT)
    environment = dict(os.environ, TORCH_CUDNN_HANDLE_PLAN_STORE="1", TORCH_CUDNN_HANDLE_PLAN_STORE_DIR=str(cache_dir))
    environment["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS, environment.get("PYTHONPATH", "")])
    tensors, report = tmp_path / f"{name}.pt", tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, str(script), str(tensors), str(report), os.path.dirname(os.path.abspath(__file__))],
        env=environment, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(tensors), json.loads(report.read_text()), done.stderr


def test_a_second_process_loads_the_plans_the_first_built(tmp_path):
    cache_dir = tmp_path / "plans"
    first, first_report, _ = run_process(tmp_path, "first", cache_dir)
    second, second_report, warnings_text = run_process(tmp_path, "second", cache_dir)
    graphs = 3 * 2  # linear, sdpa forward, sdpa backward at 2 lengths
    assert first_report["stats"]["builds"] == graphs and first_report["stats"]["store"]["writes"] == graphs
    assert second_report["stats"]["builds"] == 0, second_report
    assert second_report["stats"]["store"]["hits"] == graphs and second_report["stats"]["store"]["rejected"] == 0, warnings_text
    assert {route for route, *_ in second_report["routes"]} == {"plan_store"}
    assert all(native for _, _, native, _ in second_report["routes"]), [r for r in second_report["routes"] if not r[2]]
    for length in first:
        assert_bitwise(second[length], first[length], f"length {length}, second process")
    assert second_report["stats"]["plan_seconds"] < first_report["stats"]["plan_seconds"]


def test_a_corrupt_entry_is_rebuilt_with_a_warning(tmp_path, plan_cache):
    tag = uuid.uuid4().hex[:8]
    expected = workload(*register(tag, False), 136)
    for name in os.listdir(plan_cache):
        with open(plan_cache / name, "r+b") as file:  # same length, other bytes at the end of the blob
            file.seek(-8, os.SEEK_END)
            file.write(b"\xff" * 8)
    rejected = tch.stats.plan_store()["rejected"]
    again = register(tag, False)  # same names and params: the same keys
    with pytest.warns(UserWarning, match="was rejected"):
        actual = workload(*again, 136)
    assert tch.stats.plan_store()["rejected"] == rejected + 3
    assert {route for route, *_ in routes(*again)} == {"static"}
    assert_bitwise(actual, expected, "rebuilt after a corrupt entry")


def test_the_python_path_runs_a_loaded_plan(plan_cache):
    """With the native path off, the frontend executes the deserialized graph itself."""
    tag = uuid.uuid4().hex[:8]
    expected = workload(*register(tag, False), 264)
    with settings.override(native_path=False):
        again = register(tag, False)
        actual = workload(*again, 264)
    assert [(route, native) for route, _, native, _ in routes(*again)] == [("plan_store", False)] * 3
    assert_bitwise(actual, expected, "a loaded plan on the Python path")


# ---------------------------------------------------------------------------------
# (c) eager, compile, capture and backward, served by plans of either cache


@pytest.fixture(params=[pytest.param("kernel_cache", marks=below_min_backend), "plan_store"])
def cached_graphs(request, plan_cache):
    """Graph ids whose plans come from ``request.param``'s route (built or loaded at the first call)."""
    tag = uuid.uuid4().hex[:8]
    if request.param == "kernel_cache":
        return request.param, register(f"dynamic_{tag}", True)
    for length in LENGTHS[:2]:
        workload(*register(tag, False), length)  # built and stored
    return request.param, register(tag, False)  # the same keys: loaded


def test_eager_compile_capture_and_backward_on_cached_plans(cached_graphs):
    route, (linear, attention) = cached_graphs
    static = register(f"reference_{uuid.uuid4().hex[:8]}", False)
    length = LENGTHS[1]

    # eager and backward
    expected = workload(*static, length)
    first = workload(linear, attention, length)
    assert_same_numbers(first, expected, f"{route}: eager", engines_of(linear, attention), engines_of(*static))
    assert_bitwise(workload(linear, attention, length), first, f"{route}: eager, second call (native)")
    if route == "kernel_cache":
        assert "kernel_cache" in cache_routes(routes(linear, attention))
    else:
        assert {r for r, *_ in routes(linear, attention)} == {route}, routes(linear, attention)
    assert all(native for _, _, native, _ in routes(linear, attention))

    # torch.compile, whole graph, forward and backward
    def step(x, w, b, q, k, v):
        y, _ = tch.execute(linear, [x, w, b])
        o, _ = tch.execute(attention, [q, k, v])
        return y, o

    def reference_step(x, w, b, q, k, v):
        y, _ = tch.execute(static[0], [x, w, b])
        o, _ = tch.execute(static[1], [q, k, v])
        return y, o

    (x, w, b), qkv, d_o = inputs(length, seed=3)
    compiled = torch.compile(step, fullgraph=True)
    q, k, v = (t.clone().requires_grad_() for t in qkv)
    y, o = compiled(x, w, b, q, k, v)
    o.backward(d_o)
    q0, k0, v0 = (t.clone().requires_grad_() for t in qkv)
    y0, o0 = reference_step(x, w, b, q0, k0, v0)
    o0.backward(d_o)
    assert_same_numbers([y, o.detach(), q.grad, k.grad, v.grad], [y0, o0.detach(), q0.grad, k0.grad, v0.grad], f"{route}: compile",
                        engines_of(linear, attention), engines_of(*static))

    # CUDA graph capture after a warm-up (the warm-up built everything at this length)
    static_in = [x.clone(), w.clone(), b.clone(), *(t.clone() for t in qkv)]
    with torch.no_grad():
        step(*static_in)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step(*static_in)
        (x2, w2, b2), qkv2, _ = inputs(length, seed=4)
        for dst, src in zip(static_in, [x2, w2, b2, *qkv2]):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in captured]
        assert_same_numbers(replayed, reference_step(x2, w2, b2, *qkv2), f"{route}: captured and replayed", engines_of(linear, attention),
                            engines_of(*static))
        assert_bitwise(replayed, step(x2, w2, b2, *qkv2), f"{route}: captured and replayed, against its own eager call")
