"""torch.ops.cudnn_fe.execute on a real GPU, checked against torch."""

import os
import threading

import cudnn
import pytest
import torch
from cudnn.frost.device import build_scope_device, current_device

import torch_cudnn_handle as tch
from conftest import python_backward_calls, requires_native_path, run_concurrently, run_in_thread
from support.graphs import LINEAR_RELU, MATMUL, RELU, RELU_DECLARED, linear_inputs, linear_relu, linear_relu_backward, linear_relu_reference

pytestmark = pytest.mark.gpu

TOLERANCE = dict(atol=2e-2, rtol=2e-2)


def execute(inputs, graph=LINEAR_RELU):
    return torch.ops.cudnn_fe.execute(graph, list(inputs))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 16, 16, 16), (4, 256, 512, 128)])
def test_forward_matches_torch(dtype, shape):
    batch, m, k, n = shape
    inputs = linear_inputs(batch, m, k, n, dtype=dtype)
    (y,) = execute(inputs)
    assert (y.shape, y.dtype, y.device) == ((batch, m, n), dtype, inputs[0].device)
    torch.testing.assert_close(y, linear_relu_reference(*inputs), **TOLERANCE)


def reference_grads(inputs):
    leaves = [t.detach().float().requires_grad_() for t in inputs]
    torch.relu(torch.matmul(leaves[0], leaves[1]) + leaves[2]).sum().backward()
    return [leaf.grad for leaf in leaves]


def test_backward_matches_torch_and_runs_on_the_autograd_worker():
    inputs = linear_inputs(2, 64, 32, 16, requires_grad=True)
    threads = []

    def recording_backward(grads, ins, outs):
        threads.append((threading.get_ident(), torch.cuda.current_stream().cuda_stream))
        return linear_relu_backward(grads, ins, outs)

    recorded = tch.register_graph(linear_relu, name="linear_relu_recorded", backward=tch.Backward.function(recording_backward))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        (y,) = execute(inputs, recorded)
        y.float().sum().backward()
    torch.cuda.synchronize()
    assert threads and threads[0][0] != threading.get_ident()  # autograd's CUDA worker thread ...
    assert threads[0][1] == side.cuda_stream  # ... on the forward's stream
    for got, want in zip([t.grad for t in inputs], reference_grads(inputs)):
        torch.testing.assert_close(got.float(), want, **TOLERANCE)


def test_a_single_backward_graph_differentiates_the_op():
    x = (torch.randn(4, 8, 16, device="cuda", dtype=torch.float16)).requires_grad_()
    (y,) = torch.ops.cudnn_fe.execute(RELU, [x])
    torch.testing.assert_close(y, torch.relu(x))
    (y.float() * 3).sum().backward()
    torch.testing.assert_close(x.grad, (x > 0).to(x.dtype) * 3)


@requires_native_path
def test_a_declared_backward_runs_natively_once_its_graph_is_built_and_handed_over():
    x = torch.randn(3, 40, 24, device="cuda", dtype=torch.float16).requires_grad_()
    side = torch.cuda.Stream()
    with python_backward_calls() as calls:
        for step in range(4):
            x.grad = None
            with torch.cuda.stream(side if step == 3 else torch.cuda.current_stream()):
                (y,) = tch.execute(RELU_DECLARED, [x])
                (y.float() * (step + 2)).sum().backward()
            torch.cuda.synchronize()
            torch.testing.assert_close(x.grad, (x > 0).to(x.dtype) * (step + 2))
        first = list(calls)
        # create_graph: the backward records its own graph, so it goes through the dispatcher (Python)
        x.grad = None
        (y,) = tch.execute(RELU_DECLARED, [x])
        (y.float() * 5).sum().backward(create_graph=True)
        torch.testing.assert_close(x.grad.detach(), (x > 0).to(x.dtype) * 5)
    # The first backward built the backward graph (through Python; with
    # hand_over="second_call" the second handed it over, through Python too); the rest
    # ran natively.
    python_calls = 2 if tch.settings.get("native_hand_over") == "second_call" else 1
    assert first == [RELU_DECLARED] * python_calls
    assert calls == [RELU_DECLARED] * (python_calls + 1)


def test_the_eager_entry_is_the_same_op():
    inputs = linear_inputs(seed=11)
    (y,) = tch.execute(LINEAR_RELU, inputs)
    torch.testing.assert_close(y, execute(inputs)[0], atol=0, rtol=0)
    out = torch.empty_like(y)
    tch.execute_out(LINEAR_RELU, inputs, out=[out])
    torch.testing.assert_close(out, y, atol=0, rtol=0)
    grads = [t.requires_grad_() for t in linear_inputs(seed=11)]
    tch.execute(LINEAR_RELU, grads)[0].float().sum().backward()
    assert all(t.grad is not None for t in grads)


def test_the_op_runs_on_a_cold_thread():
    inputs = linear_inputs()
    torch.cuda.synchronize()
    y = run_in_thread(lambda: execute(inputs)[0])
    torch.testing.assert_close(y, linear_relu_reference(*inputs), **TOLERANCE)


def test_out_variant_writes_into_the_given_tensors():
    inputs = linear_inputs()
    out = torch.full((2, 16, 8), float("nan"), dtype=torch.float16, device="cuda")
    torch.ops.cudnn_fe.execute.out(LINEAR_RELU, inputs, out=[out])
    torch.testing.assert_close(out, linear_relu_reference(*inputs), **TOLERANCE)


def test_compiled_fullgraph_matches_eager_forward_and_backward():
    def loss(x, w, b):
        return execute([x, w, b])[0].float().sum()

    eager_inputs = linear_inputs(2, 32, 64, 16, requires_grad=True)
    compiled_inputs = [t.detach().clone().requires_grad_() for t in eager_inputs]
    eager = loss(*eager_inputs)
    eager.backward()
    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)(*compiled_inputs)
    compiled.backward()
    torch.testing.assert_close(compiled, eager, **TOLERANCE)
    for got, want in zip(compiled_inputs, eager_inputs):
        torch.testing.assert_close(got.grad, want.grad, **TOLERANCE)


@pytest.mark.parametrize("built_before_compile", [True, False], ids=["built-eagerly-first", "built-in-cudagraph-warmup"])
def test_reduce_overhead_training_matches_eager(built_before_compile):
    # A training loop as users write it: grads set to None each step (a .grad left from
    # the previous step would be a cudagraph output that the next replay overwrites).
    # Distinct shapes per case, so the second really builds during cudagraph warm-up.
    batch, m, k, n = (2, 32, 64, 16) if built_before_compile else (2, 48, 64, 24)

    class FusedLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            _, w, b = linear_inputs(batch, m, k, n)
            self.w, self.b = torch.nn.Parameter(w), torch.nn.Parameter(b)

        def forward(self, x):
            return execute([x, self.w, self.b])[0]

    model = FusedLinear()

    def training_step(x):
        y = model(x)
        return y, y.float().sum()

    if built_before_compile:
        training_step(linear_inputs(batch, m, k, n, seed=99)[0].requires_grad_())[1].backward()
    torch._dynamo.reset()
    compiled = torch.compile(training_step, mode="reduce-overhead", fullgraph=True)
    builds_before = tch.stats.graphs()["builds"]
    for step in range(5):  # cudagraph warm-up, then capture, then replays
        torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)
        x = linear_inputs(batch, m, k, n, seed=step)[0].requires_grad_()
        y, loss = compiled(x)
        got = y.detach().clone()  # the next replay reuses y's memory
        loss.backward()
        torch.testing.assert_close(got, model(x).detach(), **TOLERANCE)
        expected = reference_grads([x, model.w, model.b])
        for name, grad, want in zip(("x", "w", "b"), (x.grad, model.w.grad, model.b.grad), expected):
            torch.testing.assert_close(grad.float(), want, **TOLERANCE, msg=lambda m: f"d{name}, step {step}: {m}")
    # The forward's and backward's graphs: built in cudagraph warm-up, or not at all when eager built them.
    builds = tch.stats.graphs()["builds"] - builds_before
    assert builds == 0 if built_before_compile else builds >= 2


def test_reused_workspaces_and_variant_packs_stay_correct():
    # The native path keeps a workspace per (handle, stream) and the last variant pack
    # per handle. Alternate streams, operands and out buffers, and check every result.
    operands = [[torch.randn(1, 16, 16, device="cuda", dtype=torch.float16) for _ in range(2)] for _ in range(3)]
    outs = [torch.empty(1, 16, 16, device="cuda", dtype=torch.float16) for _ in range(2)]
    (first,) = torch.ops.cudnn_fe.execute(MATMUL, operands[0])  # builds
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    results = []
    for i in range(24):
        stream = side if i % 2 else torch.cuda.current_stream()
        a, b = operands[i % 3]
        with torch.cuda.stream(stream):
            if i % 4 < 2:
                results.append(((a, b), torch.ops.cudnn_fe.execute(MATMUL, [a, b])[0]))
            else:  # out= buffers written from both streams, checked before being reused
                out = outs[(i // 4) % 2]
                torch.ops.cudnn_fe.execute.out(MATMUL, [a, b], out=[out])
                results.append(((a, b), out.clone()))
                stream.synchronize()
    torch.cuda.synchronize()
    for (a, b), y in results:
        torch.testing.assert_close(y, torch.bmm(a, b), **TOLERANCE)
    paths = [g.native for g in tch.built_graphs(MATMUL) if g.inputs[0].shape == (1, 16, 16)]
    assert paths and all(native == bool(tch.settings.get("native_path")) for native in paths)


def test_no_workspace_stays_live_in_a_private_pool():
    # cudagraph trees' warm-up and torch.cuda.use_mem_pool route a stream's allocations
    # to a private pool; a workspace the native path kept there would stay live in it.
    a, b = (torch.randn(1, 16, 16, device="cuda", dtype=torch.float16) for _ in range(2))
    torch.ops.cudnn_fe.execute(MATMUL, [a, b])  # built, outside the pool
    pool, side = torch.cuda.MemPool(), torch.cuda.Stream()  # a stream this thread's handle has not seen
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.use_mem_pool(pool):
        results = [torch.ops.cudnn_fe.execute(MATMUL, [a, b])[0] for _ in range(3)]
    torch.cuda.synchronize()
    for y in results:  # torch.bmm outside the pool: cuBLAS keeps a workspace too
        torch.testing.assert_close(y, torch.bmm(a, b), **TOLERANCE)
    del results, y
    torch.cuda.synchronize()
    live = [block for segment in pool.snapshot() for block in segment["blocks"] if block["state"] == "active_allocated"]
    assert live == []


def test_cuda_graph_capture_and_replay():
    static = linear_inputs(seed=1)
    (y,) = execute(static)  # warm-up: builds the graph and gives this thread its handle
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (captured,) = execute(static)
    for seed in (2, 3):
        fresh = linear_inputs(seed=seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(captured, linear_relu_reference(*fresh), **TOLERANCE)


def test_capture_refuses_a_graph_that_was_never_built():
    cold = linear_inputs(3, 48, 32, 8, seed=4)
    execute(linear_inputs())  # this thread has its handle; only the graph is new
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="Warm up before capture"):
        with torch.cuda.graph(graph):
            execute(cold)
    torch.testing.assert_close(execute(cold)[0], linear_relu_reference(*cold), **TOLERANCE)


def test_builds_are_scoped_to_the_target_device():
    seen = []

    def recording_builder(graph, x, w, b):
        seen.append((current_device(), build_scope_device(), torch.cuda.current_device()))
        return linear_relu(graph, x, w, b)

    gid = tch.register_graph(recording_builder, name="scoped")
    with torch.cuda.device(0):
        execute(linear_inputs(), graph=gid)
    assert seen[-1] == (0, 0, 0)
    with tch.build_scope("cuda:0") as handle:
        assert current_device() == 0 and build_scope_device() == 0 and handle.device.ordinal == 0
    assert build_scope_device() is None


def test_each_key_is_built_exactly_once_under_concurrency():
    gid = tch.register_graph(linear_relu, name="concurrent_build")  # a new id: nothing built yet
    inputs = linear_inputs(2, 16, 32, 8, seed=5)
    before = tch.stats.graphs()["builds"]
    results = run_concurrently(lambda i: execute(inputs, graph=gid)[0], 8)
    assert tch.stats.graphs()["builds"] == before + 1
    for y in results:
        torch.testing.assert_close(y, linear_relu_reference(*inputs), **TOLERANCE)


def test_32_threads_execute_concurrently_and_all_match_torch():
    inputs = [linear_inputs(2, 64, 32, 16, seed=100 + i) for i in range(32)]
    execute(inputs[0])  # one build, shared by all threads
    torch.cuda.synchronize()

    def serve(i):
        for _ in range(20):
            y = execute(inputs[i])[0]
        torch.cuda.current_stream().synchronize()
        return y

    results = run_concurrently(serve, 32)
    for i, y in enumerate(results):
        torch.testing.assert_close(y, linear_relu_reference(*inputs[i]), **TOLERANCE)


def test_opcheck_with_real_cuda_tensors():
    inputs = linear_inputs()
    torch.library.opcheck(torch.ops.cudnn_fe.execute.default, (LINEAR_RELU, inputs))
    torch.library.opcheck(torch.ops.cudnn_fe.execute.default, (LINEAR_RELU, [t.requires_grad_() for t in linear_inputs()]))
    out = torch.empty(2, 16, 8, dtype=torch.float16, device="cuda")
    torch.library.opcheck(torch.ops.cudnn_fe.execute.out, (LINEAR_RELU, inputs), {"out": [out]})


def built_linear_graph():
    x, w, b = linear_inputs()
    with tch.build_scope(0) as handle:
        graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        X, W, B = graph.tensor_like(x), graph.tensor_like(w), graph.tensor_like(b)
        Y = linear_relu(graph, X, W, B)
        Y.set_output(True).set_data_type(cudnn.data_type.HALF)
        graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return tch.register_built_graph(graph, [X, W, B], [Y], device="cuda:0", name="prebuilt_linear"), (x, w, b)


def test_a_registered_built_graph_runs_and_checks_its_inputs():
    gid, good = built_linear_graph()
    torch.testing.assert_close(execute(good, graph=gid)[0], linear_relu_reference(*good), **TOLERANCE)
    x, w, b = good
    bad_calls = {
        "dtype": ([x.float(), w, b], r"input 0 of graph 'prebuilt_linear' is float32\[2, 16, 32\].*built for float16\[2, 16, 32\]"),
        "shape": ([x[:, :8], w, b], r"input 0 .* is float16\[2, 8, 32\]"),
        "stride": ([x, w.mT.contiguous().mT, b], r"input 1 .* stride \[256, 1, 32\]"),
        "count": ([x, w], r"takes 3 inputs \(one tensor per input of its builder\), got 2"),
        "cpu": ([x, w.cpu(), b], "input 1 .* is on cpu"),
    }
    for what, (inputs, message) in bad_calls.items():
        with pytest.raises(ValueError, match=message):
            execute(inputs, graph=gid)
        # ... and nothing is lost: the next good call still works.
        torch.testing.assert_close(execute(good, graph=gid)[0], linear_relu_reference(*good), **TOLERANCE)


def test_bad_calls_raise_clearly_and_the_next_good_call_works():
    good = linear_inputs()
    with pytest.raises(ValueError, match="unknown graph id 424242"):
        execute(good, graph=424242)
    with pytest.raises(ValueError, match=r"out\[0\] .* is float16\[2, 16, 4\]"):
        torch.ops.cudnn_fe.execute.out(LINEAR_RELU, good, out=[torch.empty(2, 16, 4, dtype=torch.float16, device="cuda")])
    with pytest.raises(ValueError, match="cuda:7 does not exist"):
        tch.current_handle(7)
    torch.testing.assert_close(execute(good)[0], linear_relu_reference(*good), **TOLERANCE)


def test_wrong_arguments_on_cuda_tensors_are_named_and_the_next_good_call_works():
    good = linear_inputs()
    x, w, b = good
    scale = tch.register_graph(lambda g, x, s: g.mul(x, s), name="scale_gpu")
    with pytest.raises(ValueError, match=r"input 1 of graph 'scale_gpu' is a 0-dim tensor on cuda:\d.*t.reshape\(1\)"):
        execute([x, torch.tensor(2.0, dtype=x.dtype, device=x.device)], graph=scale)
    with pytest.raises(TypeError, match=r"inputs\[2\] of graph 'linear_relu' is NoneType, not a tensor"):
        tch.execute(LINEAR_RELU, [x, w, None])
    with pytest.raises(TypeError, match="graph must be an int id"):
        tch.execute(2**63, good)
    (y,) = execute(good)
    with pytest.raises(ValueError, match="has 1 outputs, got 2 out tensors"):
        tch.execute_out(LINEAR_RELU, good, out=[y, y.clone()])
    torch.testing.assert_close(execute(good)[0], linear_relu_reference(*good), **TOLERANCE)


def test_the_cache_is_bounded_and_counts_evictions():
    gid = tch.register_graph(linear_relu, name="bounded")
    old_capacity = tch.stats.graphs()["capacity"]
    before = tch.stats.graphs()
    tch.settings.set_graph_cache_capacity(before["cached"] + 1)
    try:
        for m in (16, 32, 48):
            inputs = linear_inputs(2, m, 32, 8)
            torch.testing.assert_close(execute(inputs, graph=gid)[0], linear_relu_reference(*inputs), **TOLERANCE)
        after = tch.stats.graphs()
        assert after["evictions"] >= before["evictions"] + 2 and after["cached"] <= before["cached"] + 1
    finally:
        tch.settings.set_graph_cache_capacity(old_capacity)


@pytest.mark.skipif(os.environ.get("TORCH_CUDNN_HANDLE_NATIVE") == "0", reason="the native path is switched off")
def test_backend_plans_run_natively_and_match_the_python_path():
    inputs = linear_inputs(2, 64, 32, 16, seed=7)
    native_id = tch.register_graph(linear_relu, name="native_linear")
    python_id = tch.register_graph(linear_relu, name="python_path_linear")
    (first_call,) = execute(inputs, graph=native_id)  # built and handed over (or pending: hand_over="second_call")
    assert [b.native or b.native_pending for b in tch.built_graphs(native_id)] == [True]
    (native,) = execute(inputs, graph=native_id)  # natively
    tch.settings.set_native_path(False)
    try:
        (python_path,) = execute(inputs, graph=python_id)
    finally:
        tch.settings.set_native_path(True)
    assert [b.native for b in tch.built_graphs(native_id)] == [True], tch.built_graphs(native_id)[0].path_reason
    assert [b.native for b in tch.built_graphs(python_id)] == [False]
    assert tch.stats.graphs()["native"] >= 1
    # One plan, two ways to launch it: bit for bit the same.
    torch.testing.assert_close(native, python_path, atol=0, rtol=0)
    torch.testing.assert_close(native, first_call, atol=0, rtol=0)
    torch.testing.assert_close(native, linear_relu_reference(*inputs), **TOLERANCE)
    # The native kernel checks out= itself; a wrong one still gets the Python path's clear error.
    with pytest.raises(ValueError, match=r"out\[0\]"):
        torch.ops.cudnn_fe.execute.out(native_id, inputs, out=[torch.empty(2, 64, 8, dtype=torch.float16, device="cuda")])
    out = torch.empty_like(native)
    torch.ops.cudnn_fe.execute.out(native_id, inputs, out=[out])
    torch.testing.assert_close(out, native, atol=0, rtol=0)


def test_the_ubjson_decoder_reads_the_frontends_own_serialized_graphs():
    import json

    from torch_cudnn_handle.native import decode_ubjson

    execute(linear_inputs(seed=21))
    (built,) = [b for b in tch.built_graphs(LINEAR_RELU) if b.inputs[0].shape == (2, 16, 32)][:1]
    document = decode_ubjson(built.graph.serialize(as_bytes=True))  # every byte consumed, or it raises
    plan = json.loads(document["cudnn_backend_data"])
    operands = {str(uid) for uid in built.uids}
    assert operands <= {tensor["name"] for tensor in plan["operationGraph"]["tensors"]}
    assert set(built.uids) <= set(document["variant_pack_uids"])
