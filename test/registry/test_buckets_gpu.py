"""Size buckets on the GPU (registry/buckets.py): a linear layer registered with
``buckets=`` serves every row count from one plan per bucket.

Each call is checked three ways: bitwise against the frontend executing the bucket's built
graph on the zero-padded inputs (narrowed back), against the same graph registered without
buckets (an exact plan per size, within the engines' numerics) and against torch; forward
and backward, eager, under torch.compile(dynamic=True), in a CUDA graph, on threads, and
with the build off the caller's path (the interpreter standing in).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # test/: conftest and the support package

import torch_cudnn_handle as tch  # noqa: E402
from conftest import frontend_outputs_of, run_concurrently  # noqa: E402
from support.graphs import linear_relu, linear_relu_backward, linear_relu_reference  # noqa: E402
from support.paths import REPO, TESTS  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_settings")]

ROWS = tch.Buckets(inputs={0: 1}, outputs={0: 1}, minimum=64, per_doubling=4)
BACKWARD = tch.Backward.function(linear_relu_backward)
BUCKETED = tch.register_graph(linear_relu, name="bucketed_linear_relu", backward=BACKWARD, buckets=ROWS)
EXACT = tch.register_graph(linear_relu, name="exact_linear_relu", backward=BACKWARD)
DTYPE = torch.bfloat16
TOL = dict(atol=2e-2, rtol=2e-2)


def inputs(m, seed=0, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    shapes = ((2, m, 128), (2, 128, 64), (2, 1, 64))
    return [(torch.randn(*s, generator=generator) * 0.5).to("cuda", DTYPE).requires_grad_(requires_grad) for s in shapes]


def padded(tensors, m):
    x, w, b = tensors
    bucket = ROWS.size_for(m)
    return [torch.nn.functional.pad(x.detach(), [0, 0, 0, bucket - m]), w.detach(), b.detach()]


def built_for(bucket):
    return [g for g in tch.built_graphs(BUCKETED) if g.layout.outputs[0].shape[1] == bucket]


@pytest.mark.parametrize("m", [1, 70, 77, 100, 129, 513])
def test_a_bucketed_call_is_the_frontends_bucket_plan_narrowed(m):
    x, w, b = inputs(m)
    (y,) = tch.execute(BUCKETED, [x, w, b])
    torch.cuda.synchronize()
    bucket = ROWS.size_for(m)
    assert y.shape == (2, m, 64)
    (built,) = built_for(bucket)
    (frontend,) = frontend_outputs_of(built, padded([x, w, b], m))
    assert torch.equal(y, frontend[:, :m]), f"bucket {bucket}: not bitwise the frontend's execute"
    torch.testing.assert_close(y, linear_relu_reference(x, w, b), **TOL)
    torch.testing.assert_close(y, tch.execute(EXACT, [x, w, b])[0], **TOL)
    assert torch.equal(tch.execute(BUCKETED, [x, w, b])[0], y)  # repeatable: the same plan
    assert built.native, "the bucket's plan runs from C++ once built"


def test_sizes_in_one_bucket_share_one_build():
    before = len(tch.built_graphs(BUCKETED))
    for m in (257, 270, 300, 320):  # one bucket: 320
        tch.execute(BUCKETED, inputs(m))
    assert len(tch.built_graphs(BUCKETED)) == before + 1 and len(built_for(320)) == 1


@pytest.mark.parametrize("m", [33, 97])
def test_backward_matches_the_exact_graph_and_torch(m):
    bucketed, exact, ref = inputs(m, requires_grad=True), inputs(m, requires_grad=True), inputs(m, requires_grad=True)
    grad = torch.randn(2, m, 64, generator=torch.Generator().manual_seed(3)).to("cuda", DTYPE)
    tch.execute(BUCKETED, bucketed)[0].backward(grad)
    tch.execute(EXACT, exact)[0].backward(grad)
    linear_relu_reference(*ref).backward(grad)
    for got, want, reference in zip(bucketed, exact, ref):
        torch.testing.assert_close(got.grad, want.grad, **TOL)
        torch.testing.assert_close(got.grad.float(), reference.grad.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.usefixtures("fresh_dynamo")
def test_torch_compile_dynamic_is_the_eager_bucketed_call():
    compiled = torch.compile(lambda x, w, b: tch.execute(BUCKETED, [x, w, b])[0], fullgraph=True, dynamic=True)
    for m in (130, 150, 170, 200):
        tensors = inputs(m, seed=m)
        assert torch.equal(compiled(*tensors), tch.execute(BUCKETED, tensors)[0])


def test_a_cuda_graph_replays_the_bucketed_call():
    x, w, b = inputs(90)
    want = tch.execute(BUCKETED, [x, w, b])[0]  # warm up: the bucket's plan is built
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = tch.execute(BUCKETED, [x, w, b])[0]
    fresh = inputs(90, seed=5)
    for static, new in zip((x, w, b), fresh):
        static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, tch.execute(BUCKETED, fresh)[0])
    assert not torch.equal(y, want)


def test_threads_get_their_own_sizes_right():
    sizes = [65, 111, 200, 333, 65, 111, 200, 333]
    want = {m: tch.execute(BUCKETED, inputs(m, seed=m))[0] for m in set(sizes)}
    torch.cuda.synchronize()

    def call(i):
        y = tch.execute(BUCKETED, inputs(sizes[i], seed=sizes[i]))[0]
        torch.cuda.current_stream().synchronize()
        return y

    for m, y in zip(sizes, run_concurrently(call, len(sizes))):
        assert torch.equal(y, want[m])


def test_the_interpreter_stands_in_while_a_bucket_builds():
    graph = tch.register_graph(linear_relu, name="bucketed_linear_relu_background", buckets=ROWS, serving_mode=True)
    x, w, b = inputs(600)
    before = tch.stats.graphs()["stand_in_calls"]
    first = tch.execute(graph, [x, w, b])[0]  # the bucket (640) builds on a build thread; the interpreter serves
    assert tch.stats.graphs()["stand_in_calls"] == before + 1
    assert tch.registry.wait_for_builds(120.0) == 0
    later = tch.execute(graph, [x, w, b])[0]
    torch.testing.assert_close(first, later, **TOL)
    torch.testing.assert_close(later, linear_relu_reference(x, w, b), **TOL)


STORE_PROGRAM = textwrap.dedent("""
    import json, sys, torch, torch_cudnn_handle as tch
    from support.graphs import linear_relu

    graph = tch.register_graph(linear_relu, name="stored_bucketed_linear_relu", buckets=tch.Buckets({0: 1}, {0: 1}))
    generator = torch.Generator().manual_seed(0)
    w, b = (torch.randn(*s, generator=generator).to("cuda", torch.bfloat16) for s in ((2, 128, 64), (2, 1, 64)))
    outputs = {m: tch.execute(graph, [torch.randn(2, m, 128, generator=generator).to("cuda", torch.bfloat16), w, b])[0].cpu()
               for m in (70, 77, 100)}
    torch.save(outputs, sys.argv[1])
    print(json.dumps(dict(routes=[g.plan_source for g in tch.built_graphs(graph)], store=tch.stats.plan_store())))
""")


def test_a_second_process_loads_the_bucket_plans_the_first_stored(tmp_path):
    environment = dict(os.environ, TORCH_CUDNN_HANDLE_PLAN_STORE="1", TORCH_CUDNN_HANDLE_PLAN_STORE_DIR=str(tmp_path / "plans"))
    environment["PYTHONPATH"] = os.pathsep.join([REPO, TESTS, environment.get("PYTHONPATH", "")])
    reports, outputs = [], []
    for name in ("first", "second"):
        run = subprocess.run([sys.executable, "-c", STORE_PROGRAM, str(tmp_path / f"{name}.pt")], env=environment,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-4000:]
        reports.append(json.loads(run.stdout.strip().splitlines()[-1]))
        outputs.append(torch.load(tmp_path / f"{name}.pt"))
    assert sorted(reports[0]["routes"]) == ["static", "static"]  # two buckets (80, 112) for three sizes
    assert reports[1]["routes"] == ["plan_store", "plan_store"], reports[1]
    for m in outputs[0]:
        assert torch.equal(outputs[1][m], outputs[0][m]), f"{m} rows: the loaded bucket plan is not the stored one"
