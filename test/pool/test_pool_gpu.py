"""The cuDNN handle pool on a real GPU: devices, streams, contexts, threads, hazards."""

import os
import threading

import cudnn
import pytest
import torch

import torch_cudnn_handle as tch
from conftest import outcome_in_forked_child, run_in_thread
from support.pool_counts import device_counts, wait_for_in_use
from torch_cudnn_handle import _C

pytestmark = pytest.mark.gpu


def small_matmul_graph():
    """A frontend graph built and run outside the op, straight on pooled handles."""
    a = torch.randn(1, 16, 16, device="cuda", dtype=torch.float16)
    b = torch.randn(1, 16, 16, device="cuda", dtype=torch.float16)
    with tch.build_scope(0) as handle:
        graph = cudnn.pygraph(
            io_data_type=cudnn.data_type.HALF,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        A, B = graph.tensor_like(a), graph.tensor_like(b)
        C = graph.matmul(A, B)
        C.set_output(True).set_data_type(cudnn.data_type.HALF)
        graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")
    return graph, (A, B, C), (a, b), workspace


def test_handle_is_the_frontends_handle_bound_to_the_device():
    handle = tch.current_handle(0)
    assert isinstance(handle, cudnn.Handle) and isinstance(handle, tch.PooledHandle)
    assert handle.device.ordinal == 0
    assert handle.backend_handle
    for same in (None, "cuda:0", "cuda", torch.device("cuda", 0), torch.device("cuda")):
        assert tch.current_handle(same) is handle  # one Handle object per (thread, device)
    assert handle.stream == torch.cuda.current_stream(0).cuda_stream
    assert device_counts()["created"] >= 1


def test_stream_follows_torch_and_a_repeat_makes_no_set_stream_call():
    handle = tch.current_handle(0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert tch.current_handle(0).stream == side.cuda_stream
        calls = handle.set_stream_calls
        total = tch.stats.pool()["set_stream_calls"]
        for _ in range(1000):
            tch.current_handle(0)
        assert handle.set_stream_calls == calls
        assert tch.stats.pool()["set_stream_calls"] == total
    assert tch.current_handle(0).stream == torch.cuda.current_stream(0).cuda_stream
    assert handle.set_stream_calls == calls + 1
    # An explicit stream, as a torch.cuda.Stream or as its raw handle.
    assert tch.current_handle(0, side).stream == side.cuda_stream
    assert tch.current_handle(0, torch.cuda.default_stream(0).cuda_stream).stream == torch.cuda.default_stream(0).cuda_stream


def test_frontend_set_stream_and_the_pool_share_one_record():
    handle = tch.current_handle(0)
    side = torch.cuda.Stream()
    cudnn.set_stream(handle, side.cuda_stream)  # the frontend's own idempotent set_stream
    assert handle.stream == side.cuda_stream
    calls = handle.set_stream_calls
    tch.current_handle(0, side)  # the pool knows cuDNN is already on `side`
    assert handle.set_stream_calls == calls
    tch.current_handle(0)  # back to torch's current stream: one real call
    assert handle.set_stream_calls == calls + 1 and handle.stream == torch.cuda.current_stream(0).cuda_stream


def test_bad_streams_are_rejected():
    with pytest.raises(ValueError, match="not a CUDA stream handle"):
        tch.current_handle(0, -3)
    with pytest.raises(TypeError, match="expected a stream, got str"):
        tch.current_handle(0, "stream")


def test_a_brand_new_thread_runs_a_frontend_graph():
    graph, (A, B, C), (a, b), workspace = small_matmul_graph()
    c = torch.empty(1, 16, 16, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()

    def cold_thread():
        before = _C.current_context_device()  # nothing torch-related ran on this thread
        handle = tch.current_handle()
        after = _C.current_context_device()
        graph.execute({A: a, B: b, C: c}, workspace, handle=handle)
        torch.cuda.synchronize()
        return before, after, handle.device.ordinal

    before, after, ordinal = run_in_thread(cold_thread)
    assert (before, after, ordinal) == (-1, 0, 0)
    torch.testing.assert_close(c, torch.matmul(a, b))


def test_bind_context_binds_a_cold_thread():
    assert run_in_thread(lambda: (_C.current_context_device(), tch.bind_context(0), _C.current_context_device())) == (-1, None, 0)


def test_thread_churn_leaves_no_more_handles_than_peak_concurrency():
    tch.current_handle(0)
    baseline = device_counts()
    wave = 8
    barrier = threading.Barrier(wave)

    def short_lived():
        tch.current_handle(0)
        barrier.wait()

    for _ in range(1000 // wave):
        threads = [threading.Thread(target=short_lived) for _ in range(wave)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for_in_use(baseline["in_use"])
    after = device_counts()
    assert after["created"] - baseline["created"] <= wave, (baseline, after)
    assert after["in_use"] == baseline["in_use"]


def test_capture_refuses_a_new_handle_and_serves_an_existing_one():
    def cold_capture():
        side = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=side):
                tch.current_handle(0)
        except RuntimeError as error:
            return str(error)
        return "no error"

    message = run_in_thread(cold_capture)
    assert "capturing a CUDA graph" in message and "Warm up before capture" in message, message

    handle = tch.current_handle(0)  # warm: this thread has its handle
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = tch.current_handle(0)
        capture_stream = torch.cuda.current_stream(0).cuda_stream
    assert captured is handle and captured.stream == capture_stream


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_is_refused_the_inherited_handles():
    tch.current_handle(0)
    message = outcome_in_forked_child(lambda: tch.current_handle(0))
    assert "forked" in message and "spawn" in message, message
    assert tch.current_handle(0).device.ordinal == 0
