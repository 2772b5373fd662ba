"""The native hand-over at a graph's second call, on a GPU (native/binding.py, registry/graph_cache.py):
the first call runs the built graph through the frontend's execute, the second hands
its plan to the native path once (however many threads make it at once) and runs
natively, and every call's results are bit for bit the same. A backward graph follows
the same rule; ``hand_over="build"`` keeps the old one. The rule's locking without a GPU
is test_native_hand_over.py's."""


import pytest
import torch

import torch_cudnn_handle as tch
from conftest import python_backward_calls, requires_native_path, run_concurrently
from support.graphs import linear_inputs, linear_relu, linear_relu_reference, relu, relu_grad
from torch_cudnn_handle import _C
from torch_cudnn_handle import registry, settings
from torch_cudnn_handle.native.binding import PENDING_REASON as NATIVE_PENDING_REASON

pytestmark = [pytest.mark.gpu, requires_native_path]
TOLERANCE = dict(atol=2e-2, rtol=2e-2)


@pytest.fixture
def second_call_rule():
    with settings.override(native_path=True, native_hand_over="second_call"):
        yield


def only_built(graph_id):
    (built,) = tch.built_graphs(graph_id)
    return built


def test_the_first_call_runs_on_the_python_path_and_the_second_natively(second_call_rule):
    gid = tch.register_graph(linear_relu, name="hand_over_linear_relu")
    inputs = linear_inputs(2, 64, 32, 16, seed=21)
    plans = _C.native_plan_count()
    (first,) = tch.execute(gid, inputs)
    built = only_built(gid)
    assert (built.native, built.native_pending, built.path_reason) == (False, True, NATIVE_PENDING_REASON)
    assert _C.native_plan_count() == plans  # nothing registered for a layout used once
    assert "native_hand_over" not in built.phase_seconds and not {"serialize", "native"} & set(built.phase_seconds)
    build_seconds = built.build_seconds

    (second,) = tch.execute(gid, inputs)
    assert built.native and not built.native_pending and built.native_serial > 0, built.path_reason
    assert "second call" in built.path_reason
    assert _C.native_plan_count() == plans + 1
    assert built.phase_seconds["native_hand_over"] > 0 and built.build_seconds == build_seconds

    hits = tch.stats.graphs()["hits"]
    (third,) = tch.execute(gid, inputs)  # natively from C++: the registry is not asked
    assert tch.stats.graphs()["hits"] == hits
    # The frontend's execute and the native plan run the same plan: bit for bit equal.
    torch.testing.assert_close(second, first, atol=0, rtol=0)
    torch.testing.assert_close(third, first, atol=0, rtol=0)
    torch.testing.assert_close(first, linear_relu_reference(*inputs), **TOLERANCE)


def test_eight_threads_making_the_second_call_at_once_hand_over_once(second_call_rule):
    gid = tch.register_graph(linear_relu, name="hand_over_linear_relu_threads")
    inputs = linear_inputs(4, 128, 64, 32, seed=22)
    (first,) = tch.execute(gid, inputs)
    torch.cuda.synchronize()
    before = tch.stats.graphs()
    plans = _C.native_plan_count()

    def second_call(_):
        (result,) = tch.execute(gid, inputs)
        torch.cuda.current_stream().synchronize()
        return result

    results = run_concurrently(second_call, 8)
    after = tch.stats.graphs()
    assert after["hand_overs"] - before["hand_overs"] == 1, (before, after)
    assert _C.native_plan_count() == plans + 1  # one native plan, however many threads
    assert only_built(gid).native, only_built(gid).path_reason
    for result in results:  # whichever path each thread's call took
        torch.testing.assert_close(result, first, atol=0, rtol=0)


def test_a_backward_graph_is_handed_over_at_its_second_call(second_call_rule):
    gid = tch.register_graph(
        relu, name="hand_over_relu_declared",
        backward=tch.Backward.graph(relu_grad, operands=[tch.BackwardOperand.grad(0), tch.BackwardOperand.input(0)]),
    )
    backward_id = registry.definition(gid).backward_id
    x = torch.randn(3, 40, 24, device="cuda", dtype=torch.float16).requires_grad_()
    grads, counts = [], []
    with python_backward_calls() as calls:
        for step in range(3):
            x.grad = None
            (y,) = tch.execute(gid, [x])
            (y.float() * 3).sum().backward()
            torch.cuda.synchronize()
            grads.append(x.grad.clone())
            counts.append(len(calls))
            if step == 0:
                backward = only_built(backward_id)
                assert backward.native_pending and not backward.native, backward.path_reason
    assert counts == [1, 2, 2], counts  # built, handed over, then C++ only
    assert backward.native, backward.path_reason
    for grad in grads:
        torch.testing.assert_close(grad, grads[0], atol=0, rtol=0)
    torch.testing.assert_close(grads[0], (x > 0).to(x.dtype) * 3)


def test_hand_over_at_build_keeps_the_old_rule():
    with settings.override(native_path=True, native_hand_over="build"):
        gid = tch.register_graph(linear_relu, name="hand_over_at_build_linear_relu")
        inputs = linear_inputs(2, 64, 32, 16, seed=23)
        (first,) = tch.execute(gid, inputs)
    built = only_built(gid)
    assert built.native and not built.native_pending, built.path_reason
    assert "native" in built.phase_seconds and "native_hand_over" not in built.phase_seconds
    (second,) = tch.execute(gid, inputs)
    torch.testing.assert_close(second, first, atol=0, rtol=0)


def test_no_hand_over_during_a_capture(second_call_rule):
    """A second call inside a CUDA-graph capture runs the Python path and stays pending:
    deserializing a plan is no part of a capture. The next call outside hands it over."""
    gid = tch.register_graph(linear_relu, name="hand_over_linear_relu_capture")
    inputs = linear_inputs(2, 64, 32, 16, seed=24)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (first,) = tch.execute(gid, inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (captured,) = tch.execute(gid, inputs)
    assert only_built(gid).native_pending
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, first, atol=0, rtol=0)
    (later,) = tch.execute(gid, inputs)
    assert only_built(gid).native, only_built(gid).path_reason
    torch.testing.assert_close(later, first, atol=0, rtol=0)
