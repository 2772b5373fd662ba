"""The native path's CUDA graph launch (Note [Native CUDA graph launch],
csrc/native/plan_graphs.h), on a GPU, with real plans, by both routes that make a graph:
a matmul whose builder keeps only engines cuDNN can populate into a CUDA graph, and one
whose builder keeps only engines without that note (its graphs are captured from an
execute):

* the first call at new addresses executes, the second makes a graph and launches it,
  later ones launch it; every output bitwise equal to the frontend's own execute of the
  same plan and to the op with graph launch switched off; new values at the same
  addresses are read by the launched graph (nothing is baked in but addresses);
* the functional op in a loop (torch's caching allocator hands the output back at the
  same address) launches graphs; threads each launch their own; a CUDA-graph capture
  records an execute, never a launch, and replays right;
* graphs of different plans launched in turn on one handle each read only their own
  operands; RMSNorm's training step (no engine with the note) is launched, bitwise
  equal to executing it;
* the registry forgetting a plan destroys its graphs; switched off, nothing is launched.
"""

from __future__ import annotations

import contextlib

import cudnn
import pytest
import torch

import torch_cudnn_handle as tch
from conftest import frontend_outputs_of, run_concurrently
from torch_cudnn_handle.registry import TensorSpec

pytestmark = pytest.mark.gpu


def graph_capable_matmul(graph, a, b):
    graph.select_behavior_notes([cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API])  # as a frontend user filters plans
    return graph.matmul(a, b, name="mm")


def captured_matmul(graph, a, b):
    graph.deselect_behavior_notes([cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API])
    return graph.matmul(a, b, name="mm")


@contextlib.contextmanager
def graph_launch(enabled: bool):
    """The native path's graph launch switched on or off, restored after; yields the previous setting."""
    previous = tch.settings.set_native_cuda_graphs(enabled)
    try:
        yield previous
    finally:
        tch.settings.set_native_cuda_graphs(previous)


# builder, what path_reason says of how its graphs are made, the count that grows
ROUTES = {
    "populated": (graph_capable_matmul, "populated by cuDNN", "populated"),
    "captured": (captured_matmul, "captured from its execute", "captured"),
}


def plain_matmul(graph, a, b):
    return graph.matmul(a, b, name="mm")


@pytest.fixture(params=sorted(ROUTES))
def matmul(request):
    """A registered matmul whose graphs are made by one route, and its operands; skips
    where no plan of that kind is built."""
    builder, route, count = ROUTES[request.param]
    graph = tch.register_graph(builder, name=f"{request.param}_matmul")
    a = torch.randn(4, 64, 32, device="cuda", dtype=torch.float16)
    b = torch.randn(4, 32, 48, device="cuda", dtype=torch.float16)
    try:
        for _ in range(2):  # built; handed to the native path at the build or (hand_over="second_call") here
            tch.execute(graph, [a, b])
    except cudnn.cudnnGraphNotSupportedError as error:
        pytest.skip(f"no {request.param} matmul engine here: {error}")
    (built,) = [x for x in tch.built_graphs(graph) if x.inputs == (TensorSpec.of(a), TensorSpec.of(b))]
    assert built.native, built.path_reason
    assert f"CUDA graph {route}" in built.path_reason, built.path_reason  # the builder's note filter reached the plan
    with graph_launch(True):
        yield graph, a, b, built, count


def frontend_output(built, a, b):
    return frontend_outputs_of(built, [a, b])[0]


def counts():
    torch.cuda.synchronize()
    stats = tch.stats.native_cuda_graphs()
    return dict(stats, made=stats["populated"] + stats["captured"])


def test_a_call_at_repeated_addresses_is_launched_as_a_graph_bitwise_equal_to_execute(matmul):
    graph, a, b, built, count = matmul
    expected = frontend_output(built, a, b)
    out = torch.empty_like(expected)
    before = counts()
    for call in range(4):
        out.fill_(float("nan"))  # a route that wrote nothing fails
        tch.execute_out(graph, [a, b], out=[out])
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), expected.view(torch.int16)), f"call {call}"
    after = counts()
    # Call 0 executes (addresses seen once), call 1 makes a graph and launches it, 2 and 3
    # launch; call 0 already launches when `out` got the block of an earlier output (the fixture's).
    assert after["made"] - before["made"] <= 1 and after["made"] - before["made"] == after[count] - before[count], (before, after)
    assert after["launched"] - before["launched"] >= 3, (before, after)
    assert after["failed"] == before["failed"]
    torch.testing.assert_close(out, torch.bmm(a, b), atol=5e-2, rtol=1e-2)


def test_a_launched_graph_reads_the_values_at_its_addresses_not_the_ones_it_was_made_with(matmul):
    graph, a, b, built, _ = matmul
    out = torch.empty(4, 64, 48, device="cuda", dtype=torch.float16)
    for _ in range(3):
        tch.execute_out(graph, [a, b], out=[out])  # a graph for these addresses exists now
    before = counts()
    for seed in range(3):
        torch.manual_seed(seed)
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        tch.execute_out(graph, [a, b], out=[out])
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), frontend_output(built, a, b).view(torch.int16)), f"seed {seed}"
    assert counts()["launched"] - before["launched"] == 3


def test_graph_launch_switched_off_gives_the_same_bits_and_launches_nothing(matmul):
    graph, a, b, built, _ = matmul
    on = [tch.execute(graph, [a, b])[0] for _ in range(3)]
    with graph_launch(False) as previous:
        assert previous is True and tch.stats.native_cuda_graphs()["enabled"] is False
        before = counts()
        off = [tch.execute(graph, [a, b])[0] for _ in range(3)]
        assert counts()["launched"] == before["launched"] and counts()["made"] == before["made"]
    for x in on + off:
        assert torch.equal(x.view(torch.int16), on[0].view(torch.int16))


def test_the_functional_op_in_a_loop_is_launched_from_the_second_sighting(matmul):
    graph, a, b, *_ = matmul
    expected = tch.execute(graph, [a, b])[0]
    before = counts()
    for _ in range(10):  # each output is freed before the next call: the allocator hands the block back
        (y,) = torch.ops.cudnn_fe.execute(graph, [a, b])
        assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
        del y
    after = counts()
    assert after["launched"] - before["launched"] >= 5, (before, after)


def test_threads_launch_their_own_graphs_and_get_their_own_products(matmul):
    graph, _, _, built, _ = matmul
    operands = [(torch.randn(4, 64, 32, device="cuda", dtype=torch.float16), torch.randn(4, 32, 48, device="cuda", dtype=torch.float16))
                for _ in range(8)]
    expected = [frontend_output(built, a, b) for a, b in operands]
    before = counts()

    def work(i):
        stream = torch.cuda.Stream()
        out = torch.empty(4, 64, 48, device="cuda", dtype=torch.float16)
        with torch.cuda.stream(stream):
            for _ in range(20):
                torch.ops.cudnn_fe.execute.out(graph, list(operands[i]), out=[out])
        stream.synchronize()
        return out

    results = run_concurrently(work, 8)
    for i in range(8):
        assert torch.equal(results[i].view(torch.int16), expected[i].view(torch.int16)), f"thread {i}"
    after = counts()
    assert after["made"] - before["made"] >= 8 and after["launched"] - before["launched"] >= 8 * 18, (before, after)


def test_a_capture_records_an_execute_and_replays_right(matmul):
    graph, a, b, built, _ = matmul
    for _ in range(3):
        tch.execute(graph, [a, b])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tch.execute(graph, [a, b])
    torch.cuda.current_stream().wait_stream(stream)
    before = counts()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        (static_out,) = torch.ops.cudnn_fe.execute(graph, [a, b])
    assert counts()["launched"] == before["launched"]  # the capture went through cudnnBackendExecute
    a.copy_(torch.randn_like(a))
    captured.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out.view(torch.int16), frontend_output(built, a, b).view(torch.int16))


def test_forgetting_a_plan_destroys_its_graphs():
    graph = tch.register_graph(graph_capable_matmul, name="graph_capable_matmul_forgotten")
    a = torch.randn(2, 32, 32, device="cuda", dtype=torch.float16)
    b = torch.randn(2, 32, 32, device="cuda", dtype=torch.float16)
    out = torch.empty(2, 32, 32, device="cuda", dtype=torch.float16)
    try:
        for _ in range(3):  # built; handed over and executed natively (first sighting); populated and launched
            tch.execute_out(graph, [a, b], out=[out])
    except cudnn.cudnnGraphNotSupportedError as error:
        pytest.skip(f"no graph-capable engine: {error}")
    if "CUDA graph" not in tch.built_graphs(graph)[0].path_reason:
        pytest.skip(tch.built_graphs(graph)[0].path_reason)
    kept = counts()["kept"]
    assert kept >= 1
    capacity = tch.stats.graphs()["capacity"]
    tch.settings.set_graph_cache_capacity(1)  # evicts every built graph but the newest
    try:
        other = tch.register_graph(plain_matmul, name="evicts_the_graph_capable_one")
        tch.execute(other, [a, b])
        assert not tch.built_graphs(graph)
        assert counts()["kept"] < kept
    finally:
        tch.settings.set_graph_cache_capacity(capacity)


def test_graphs_of_different_plans_launched_in_turn_each_read_only_their_own_operands():
    """Plans alternate on one handle, as a model's layers do: each round gives every
    plan new values at its same addresses, and every launch equals the frontend's
    execute of that plan on those values."""
    cases = []
    for name, (builder, _, _) in sorted(ROUTES.items()):
        graph = tch.register_graph(builder, name=f"{name}_matmul_in_turn")
        for shape in ((2, 64, 32, 48), (3, 32, 64, 16)):
            batch, m, k, n = shape
            a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(batch, k, n, device="cuda", dtype=torch.float16)
            try:
                tch.execute(graph, [a, b])
            except cudnn.cudnnGraphNotSupportedError:
                continue  # that route has no engine for this matmul here
            cases.append((graph, a, b, torch.empty(batch, m, n, device="cuda", dtype=torch.float16)))
    if len(cases) < 2:
        pytest.skip("fewer than two plans to alternate")
    built = {id(a): x for graph, a, b, _ in cases for x in tch.built_graphs(graph) if x.inputs == (TensorSpec.of(a), TensorSpec.of(b))}
    before = counts()
    for round_ in range(5):
        for graph, a, b, out in cases:
            a.normal_()
            b.normal_()
            tch.execute_out(graph, [a, b], out=[out])
        torch.cuda.synchronize()
        for graph, a, b, out in cases:
            expected = frontend_output(built[id(a)], a, b)
            assert torch.equal(out.view(torch.int16), expected.view(torch.int16)), f"round {round_}, graph {graph}, {tuple(a.shape)}"
    after = counts()
    assert after["launched"] - before["launched"] >= 3 * len(cases), (before, after)


def test_rmsnorm_training_steps_are_launched_as_graphs_bitwise_equal_to_executing_them():
    """RMSNorm's plans (on an H200 none carries the native-API note, so their graphs are
    captured): steps with graph launch on give the bits of steps with it off. Results are
    compared step by step and not kept, so the caching allocator hands every step the
    same blocks, as in a training loop."""
    norm = tch.nn.RMSNorm(1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        x.grad = norm.weight.grad = None
        y = norm(x)
        y.backward(dy)
        return y.detach(), x.grad, norm.weight.grad

    with graph_launch(False):
        off = [[t.clone() for t in step()] for _ in range(3)]
    # dScale is a reduction across rows: bitwise only if cuDNN's own executes agree
    reduction_is_deterministic = all(torch.equal(results[2], off[0][2]) for results in off)
    with graph_launch(True):
        before = counts()
        for i in range(8):
            for name, got, want in zip(("y", "dx", "dweight"), step(), off[0]):
                if name == "dweight" and not reduction_is_deterministic:
                    torch.testing.assert_close(got, want)
                else:
                    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"step {i}: {name}"
        after = counts()
        # The forward alone (inference): launched too, and equal to the training forward's bits.
        inference_before = counts()
        with torch.no_grad():
            for i in range(6):
                assert torch.equal(norm(x).view(torch.int16), off[0][0].view(torch.int16)), f"inference call {i}"
        inference_after = counts()
    reasons = [built.path_reason for built in tch.built_graphs(norm._graph)]
    assert reasons and all("launched as a CUDA graph" in reason for reason in reasons), reasons
    assert after["launched"] - before["launched"] >= 2 * 4, (before, after)  # forward and backward, most steps
    assert after["failed"] == before["failed"], (before, after)
    assert inference_after["launched"] - inference_before["launched"] >= 4, (inference_before, inference_after)
