"""Build processes (registry/plans/build_process.py, Note [The build process]) on any machine:
a real helper process started, answering, refusing what it cannot build, reused, never
inherited by a forked child, off with the setting, and a helper that cannot start turning
the route off with one warning. Which graphs it may serve is the frontend's own table.
Building there needs a GPU: test_build_process_gpu.py."""

import os
import subprocess
import sys

import cudnn
import pytest

from torch_cudnn_handle import settings
from torch_cudnn_handle.registry.plans import build_process


def _matmul_description():
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT)
    a = graph.tensor(name="a", dim=[1, 8, 16], stride=[128, 16, 1], data_type=cudnn.data_type.HALF)
    b = graph.tensor(name="b", dim=[1, 16, 8], stride=[128, 8, 1], data_type=cudnn.data_type.HALF)
    graph.matmul(a, b, name="mm").set_output(True).set_data_type(cudnn.data_type.HALF)
    return graph


def _sdpa_description():
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT)
    q, k, v = (graph.tensor(name=n, dim=[1, 2, 64, 64], stride=[8192, 4096, 64, 1], data_type=cudnn.data_type.HALF) for n in "qkv")
    o, _ = graph.sdpa(q=q, k=k, v=v, generate_stats=False, attn_scale=0.125, name="sdpa")
    o.set_output(True)
    return graph


def test_a_graph_only_the_backend_serves_may_go_to_a_build_process_one_a_python_engine_may_serve_may_not():
    assert build_process.backend_only(_matmul_description())  # no Python engine family claims a matmul by default
    assert not build_process.backend_only(_sdpa_description())  # the frost sdpa engines' family does


_DESCRIBE_IN_A_FRESH_PROCESS = """
import sys
from torch_cudnn_handle.registry.plans import build_worker
sys.stdout.write(repr(build_worker._described(None, sys.stdin.buffer.read())))
"""


@pytest.mark.parametrize("kind", ["sdpa", "rmsnorm"])
def test_a_recipe_describes_the_same_graph_in_a_fresh_process(kind):
    import torch

    from torch_cudnn_handle import registry
    from torch_cudnn_handle.nn.attention import SDPA_GRAPHS
    from torch_cudnn_handle.nn.norm import rmsnorm_graph
    from torch_cudnn_handle.registry import TensorSpec
    from torch_cudnn_handle.registry.describe import describe

    if kind == "sdpa":
        graph_id, tensors = SDPA_GRAPHS[True], [torch.empty(2, 4, 96, 64, dtype=torch.bfloat16) for _ in range(3)]
    else:
        graph_id, tensors = rmsnorm_graph(1e-6), [torch.empty(3, 40, 256, dtype=torch.bfloat16), torch.empty(256, dtype=torch.bfloat16)]
    definition, specs = registry.definition(graph_id), tuple(TensorSpec.of(t) for t in tensors)
    recipe = build_process.recipe_of(definition, specs)
    assert recipe is not None
    here = repr(describe(definition, specs).graph)  # what this process builds: the frontend's description, uids included
    there = subprocess.run([sys.executable, "-c", _DESCRIBE_IN_A_FRESH_PROCESS], input=recipe, capture_output=True, timeout=120)
    assert there.returncode == 0, there.stderr.decode()[-2000:]
    assert there.stdout.decode() == here


def test_a_definition_that_cannot_travel_has_no_recipe():
    import torch

    import torch_cudnn_handle as tch
    from torch_cudnn_handle import registry
    from torch_cudnn_handle.registry import TensorSpec

    specs = (TensorSpec.of(torch.empty(2, 8, 16)),)
    closure = registry.definition(tch.register_graph(lambda g, x: g.relu(x), name="recipe_lambda"))
    assert build_process.recipe_of(closure, specs) is None  # a lambda does not pickle
    scale = 2.0

    def local_builder(g, x):
        return g.mul(x, scale)

    assert build_process.recipe_of(registry.definition(tch.register_graph(local_builder, name="recipe_local")), specs) is None


def test_a_helper_answers_refuses_what_it_cannot_build_and_is_reused():
    before = build_process.stats()
    assert build_process.build_description("{}", 0) is None  # not a graph description: the helper says so
    middle = build_process.stats()
    assert middle["failures"] == before["failures"] + 1 and middle["last_error"], middle
    assert middle["running"] == max(before["running"], 1) and not middle["disabled"]
    assert build_process.build_description("{\"nodes\": []}", 0) is None
    after = build_process.stats()
    assert after["running"] == middle["running"]  # the same helper served both: a failed build does not end it
    assert after["failures"] == middle["failures"] + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_uses_its_parents_helpers():
    build_process.build_description("{}", 0)  # a helper is running here
    assert build_process.stats()["running"] >= 1
    pid = os.fork()
    if pid == 0:
        os._exit(0 if build_process.stats()["running"] == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert build_process.stats()["running"] >= 1  # the parent's are still its own


def test_the_setting_off_sends_nothing():
    before = build_process.stats()
    with settings.override(build_process=False):
        assert build_process.offer(_matmul_description(), 0) is None
    assert build_process.stats() == before


_BROKEN_HELPER = """
import warnings
from torch_cudnn_handle import settings
from torch_cudnn_handle.registry.plans import build_process
build_process.WORKER = {worker!r}  # a program that exits before it answers
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = build_process.build_description("{{}}", 0)
    second = build_process.build_description("{{}}", 0)
print("results", first, second)
print("warnings", len(caught), caught[0].message if caught else None)
print("disabled", bool(build_process.stats()["disabled"]), build_process.stats()["running"])
settings.set_build_process(True)
print("rearmed", not build_process.stats()["disabled"])
"""


def test_a_helper_that_cannot_start_turns_the_route_off_with_one_warning_until_the_setting_is_set_again(tmp_path):
    broken = tmp_path / "worker.py"
    broken.write_text("import sys\nsys.exit(3)\n")
    # A fresh process: this one may hold idle helpers from other tests, which a build would take first.
    done = subprocess.run([sys.executable, "-c", _BROKEN_HELPER.format(worker=str(broken))], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["results"] == "None None"
    assert lines["warnings"].startswith("1 torch_cudnn_handle: a build process could not start (the build process ended)"), lines
    assert lines["disabled"] == "True 0" and lines["rearmed"] == "True"
