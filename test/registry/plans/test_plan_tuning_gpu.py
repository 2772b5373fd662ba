"""Tuned plan choice on a real GPU: same results, the fastest measured plan, a cache that
another process reuses, deterministic plans only when torch asks for them."""

import json
import os
import subprocess
import sys

import cudnn
import pytest
import torch

import torch_cudnn_handle as tch
from support.graphs import linear_inputs, linear_relu, linear_relu_reference, matmul
from support.paths import TESTS
from torch_cudnn_handle.registry.plans import tuning as plan_tuning
from torch_cudnn_handle.native import decode_ubjson
from torch_cudnn_handle import registry, settings
from torch_cudnn_handle.registry import TensorSpec
from torch_cudnn_handle.registry.describe import describe

pytestmark = pytest.mark.gpu

TOLERANCE = dict(atol=2e-2, rtol=2e-2)
SHAPE = (4, 256, 512, 128)  # batch, m, k, n: big enough for the heuristics to offer several plans


@pytest.fixture(autouse=True)
def tuning_cache(tmp_path):
    """A private cache file, process-wide tuning off (graphs opt in with tune=True)."""
    path = str(tmp_path / "tuning.json")
    with settings.override(plan_tuning=False, tuning_file=path):
        yield path


def matmul_inputs(seed=0, dtype=torch.float16):
    batch, m, k, n = SHAPE
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=generator) * 0.5).to(dtype=dtype, device="cuda") for shape in ((batch, m, k), (batch, k, n))]


def entry_of(name):
    """The tuning_stats() entry of the graph registered under ``name`` (one layout)."""
    (entry,) = [e for label, e in tch.stats.tuning()["entries"].items() if label.startswith(f"{name} on cuda:")]
    return entry


def assert_fastest_measured(entry):
    assert entry["source"] == "tuned", entry["reason"]
    assert entry["candidates"] == len(entry["timings_ms"]) >= 1
    assert entry["plan"] in entry["timings_ms"] and entry["heuristic_plan"] in entry["timings_ms"]
    assert entry["fastest_ms"] == min(entry["timings_ms"].values())
    assert entry["fastest_ms"] <= entry["heuristic_ms"]


def counters():
    stats = tch.stats.tuning()
    return {name: stats[name] for name in ("tuned", "cache_hits", "cache_misses")}


def test_a_tuned_matmul_matches_the_untuned_one_and_torch():
    tuned = tch.register_graph(matmul, name="tuned_matmul", tune=True)
    untuned = tch.register_graph(matmul, name="untuned_matmul", tune=False)
    a, b = matmul_inputs()
    before = counters()
    (y_tuned,) = tch.execute(tuned, [a, b])
    (y_untuned,) = tch.execute(untuned, [a, b])
    torch.testing.assert_close(y_tuned, y_untuned, **TOLERANCE)
    torch.testing.assert_close(y_tuned.float(), torch.bmm(a.float(), b.float()), **TOLERANCE)
    entry = entry_of("tuned_matmul")
    assert_fastest_measured(entry)
    assert tch.built_graphs(tuned)[0].plan == entry["plan"]
    after = counters()
    assert (after["tuned"] - before["tuned"], after["cache_misses"] - before["cache_misses"]) == (1, 1)


def test_a_tuned_linear_relu_matches_the_untuned_one_and_torch():
    tuned = tch.register_graph(linear_relu, name="tuned_linear_relu", tune=True)
    untuned = tch.register_graph(linear_relu, name="untuned_linear_relu", tune=False)
    inputs = linear_inputs(*SHAPE, seed=3)
    (y_tuned,) = tch.execute(tuned, inputs)
    torch.testing.assert_close(y_tuned, tch.execute(untuned, inputs)[0], **TOLERANCE)
    torch.testing.assert_close(y_tuned, linear_relu_reference(*inputs), **TOLERANCE)
    assert_fastest_measured(entry_of("tuned_linear_relu"))
    assert tch.built_graphs(tuned)[0].plan == entry_of("tuned_linear_relu")["plan"]


def described(graph_id, inputs, handle):
    """A fresh, unbuilt graph of ``graph_id`` for ``inputs``, and build_graph's arguments for it."""
    specs = tuple(TensorSpec.of(t) for t in inputs)
    graph, ins, outs, layout = describe(registry.definition(graph_id), specs, handle)
    as_tuples = lambda specs: [(s.shape, s.stride, s.dtype) for s in specs]  # noqa: E731
    arguments = dict(device=0, handle=handle, input_specs=as_tuples(specs), output_specs=as_tuples(layout.outputs), uids=[t.uid for t in ins + outs])
    return graph, dict(arguments, name=registry.definition(graph_id).name)


def backend_plan(graph):
    """The backend plan a graph serializes, without its opaque binary payloads (on the
    H200 two serializations of one plan differed there in a few bytes that look like a
    host address): the engine, its knobs and the operation graph."""
    import json

    def structure(value):
        if isinstance(value, dict):
            return {k: structure(v) for k, v in value.items()}
        if isinstance(value, list):
            return [structure(v) for v in value]
        return "<payload>" if isinstance(value, str) and len(value) > 256 else value

    data = decode_ubjson(graph.serialize(as_bytes=True))["cudnn_backend_data"]
    return structure(json.loads(data)) if isinstance(data, str) else data


def test_the_untuned_path_is_a_plain_build():
    gid = tch.register_graph(matmul, name="plain_matmul")
    with tch.build_scope(0) as handle:
        graph, arguments = described(gid, matmul_inputs(), handle)
        choice = plan_tuning.build_graph(graph, tune=False, **arguments)
        plain, _ = described(gid, matmul_inputs(), handle)
        plain.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    assert (choice.source, choice.plan) == ("heuristic", None)
    assert backend_plan(graph) == backend_plan(plain)


def test_serialize_writes_the_plan_the_tuning_selected():
    gid = tch.register_graph(matmul, name="serialized_matmul")
    with tch.build_scope(0) as handle:
        graph, arguments = described(gid, matmul_inputs(), handle)
        choice = plan_tuning.build_graph(graph, tune=True, fresh_graph=lambda: described(gid, matmul_inputs(), handle)[0], **arguments)
        # The same plan built alone on a fresh graph serializes the same.
        alone, _ = described(gid, matmul_inputs(), handle)
        alone.build_operation_graph()
        alone.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        assert alone.get_plan_name_at_index(choice.index) == choice.plan
        alone.build_plan_at_index(choice.index)
    assert backend_plan(graph) == backend_plan(alone)
    assert graph.get_workspace_size() == alone.get_workspace_size()


def test_selecting_a_plan_after_building_all_moves_serialize_to_it():
    """The frontend behaviour tuning relies on, shown on a plan the heuristics did not pick
    and that was not the last one built."""
    gid = tch.register_graph(matmul, name="reselected_matmul")
    with tch.build_scope(0) as handle:
        graph, _ = described(gid, matmul_inputs(), handle)
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        built = []
        for index in range(graph.get_execution_plan_count()):
            try:
                graph.build_plan_at_index(index)
                built.append(index)
            except Exception:  # noqa: BLE001 -- not every ranked plan builds
                pass
        if len(built) < 2:
            pytest.skip("the heuristics offer a single buildable plan for this graph here")
        graph.build_plan_at_index(built[1])
        heuristic, _ = described(gid, matmul_inputs(), handle)
        heuristic.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        alone, _ = described(gid, matmul_inputs(), handle)
        alone.build_operation_graph()
        alone.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        alone.build_plan_at_index(built[1])
    assert backend_plan(graph) == backend_plan(alone) != backend_plan(heuristic)
    assert graph.get_workspace_size() == alone.get_workspace_size()


CHILD = """
import json, sys, torch
sys.path.insert(0, {test_dir!r})
import torch_cudnn_handle as tch
from support.graphs import matmul
gid = tch.register_graph(matmul, name="shared_matmul", tune=True)
generator = torch.Generator().manual_seed(0)
a, b = [(torch.randn(*s, generator=generator) * 0.5).to(dtype=torch.float16, device="cuda") for s in ({a}, {b})]
(y,) = tch.execute(gid, [a, b])
torch.testing.assert_close(y.float(), torch.bmm(a.float(), b.float()), atol=2e-2, rtol=2e-2)
stats = tch.stats.tuning()
print(json.dumps(dict(tuned=stats["tuned"], cache_hits=stats["cache_hits"], plan=tch.built_graphs(gid)[0].plan)))
"""


def test_a_second_process_reuses_the_choice(tuning_cache):
    gid = tch.register_graph(matmul, name="shared_matmul", tune=True)
    tch.execute(gid, matmul_inputs())
    plan = tch.built_graphs(gid)[0].plan
    assert entry_of("shared_matmul")["source"] == "tuned"
    batch, m, k, n = SHAPE
    script = CHILD.format(test_dir=TESTS, a=(batch, m, k), b=(batch, k, n))
    env = dict(os.environ, TORCH_CUDNN_HANDLE_TUNING_CACHE=tuning_cache, TORCH_CUDNN_HANDLE_TUNE="0")
    child = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen["tuned"] == 0 and seen["cache_hits"] >= 1
    assert seen["plan"] == plan


def test_a_stale_cache_entry_is_tuned_again(tuning_cache):
    tch.execute(tch.register_graph(matmul, name="stale_matmul", tune=True), matmul_inputs())
    document = json.load(open(tuning_cache))
    (key,) = document["entries"]  # this test's own file
    document["entries"][key]["plan"] = "not_a_plan_the_heuristics_offer"
    json.dump(document, open(tuning_cache, "w"))
    before = counters()
    again = tch.register_graph(matmul, name="stale_matmul", tune=True)  # the same graph, a new id: built again
    tch.execute(again, matmul_inputs())
    after = counters()
    assert (after["tuned"] - before["tuned"], after["cache_hits"] - before["cache_hits"]) == (1, 0)
    assert plan_tuning.read_cache(tuning_cache)[key]["plan"] == tch.built_graphs(again)[0].plan == entry_of("stale_matmul")["plan"]


def deterministic_plan_names(gid, inputs):
    """The plans the frontend's own NONDETERMINISTIC filter lets build, on a fresh graph."""
    names = set()
    with tch.build_scope(0) as handle:
        graph, _ = described(gid, inputs, handle)
        graph.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        for index in range(graph.get_execution_plan_count()):
            try:
                graph.build_plan_at_index(index)
                names.add(graph.get_plan_name_at_index(index))
            except Exception:  # noqa: BLE001 -- filtered out, or does not build
                pass
    return names


def test_deterministic_algorithms_choose_a_deterministic_plan():
    gid = tch.register_graph(matmul, name="deterministic_matmul", tune=True)
    inputs = matmul_inputs(seed=5)
    reference = torch.bmm(*(t.float() for t in inputs))
    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        (y,) = tch.execute(gid, inputs)
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.testing.assert_close(y.float(), reference, **TOLERANCE)
    entry = entry_of("deterministic_matmul")
    allowed = deterministic_plan_names(gid, inputs)
    if entry["source"] == "heuristic":  # a fallback only when no timed plan was deterministic
        assert not allowed & set(entry["timings_ms"]), entry["reason"]
    else:
        assert entry["plan"] in allowed, entry
        excluded = {plan for plan, why in entry["skipped"].items() if why.startswith("nondeterministic")}
        assert not excluded & allowed


def test_tuning_during_cuda_graph_capture_is_refused():
    gid = tch.register_graph(matmul, name="captured_matmul", tune=True)
    inputs = matmul_inputs(seed=7)
    with tch.build_scope(0) as handle:
        graph, arguments = described(gid, inputs, handle)
    capture = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"plan tuning of graph 'captured_matmul'.*capturing a CUDA graph.*before capture"):
        with torch.cuda.graph(capture):
            plan_tuning.build_graph(graph, tune=True, **arguments)
    with pytest.raises(RuntimeError, match="capturing a CUDA graph"):  # through the op: the registry refuses first
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            tch.execute(gid, inputs)
    (y,) = tch.execute(gid, inputs)  # outside capture it tunes and runs
    torch.testing.assert_close(y.float(), torch.bmm(*(t.float() for t in inputs)), **TOLERANCE)
