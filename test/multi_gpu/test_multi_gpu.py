"""Two or more GPUs: the pool, the context guard and scoped builds across devices.

Skipped below 2 GPUs. Keep NVLink multicast off in anything started from here
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
"""

import os

import pytest
import torch
from cudnn.frost.device import current_device

import torch_cudnn_handle as tch
from conftest import run_concurrently, run_in_thread
from support.graphs import LINEAR_RELU, linear_inputs, linear_relu, linear_relu_reference
from torch_cudnn_handle import _C

pytestmark = [pytest.mark.gpu, pytest.mark.two_gpus]
TOLERANCE = dict(atol=2e-2, rtol=2e-2)


def test_a_handle_for_another_device_leaves_the_callers_context():
    with torch.cuda.device(0):
        handle = tch.current_handle("cuda:1")
        assert handle.device.ordinal == 1 and handle is not tch.current_handle(0)
        assert _C.current_context_device() == 0 and torch.cuda.current_device() == 0
    inputs = linear_inputs(device="cuda:1")
    with torch.cuda.device(0):
        (y,) = torch.ops.cudnn_fe.execute(LINEAR_RELU, inputs)
        assert _C.current_context_device() == 0 and torch.cuda.current_device() == 0
    assert y.device == torch.device("cuda", 1)
    torch.testing.assert_close(y, linear_relu_reference(*inputs), **TOLERANCE)
    devices = tch.stats.pool()["devices"]
    assert devices[0]["created"] >= 1 and devices[1]["created"] >= 1


def test_a_handle_for_another_device_leaves_a_bound_context_and_a_cold_threads_device():
    def thread():
        tch.bind_context(0)  # this thread now holds cuda:0's context
        held = _C.current_context_device()
        tch.current_handle(1)  # default-stream work for cuda:1: the caller's context stays
        return held, _C.current_context_device()

    assert run_in_thread(thread) == (0, 0)
    # A thread that never touched CUDA: what torch reports as its device stays so.
    cold = run_in_thread(lambda: (torch.cuda.current_device(), tch.current_handle(1).device.ordinal, torch.cuda.current_device()))
    assert cold == (0, 1, 0)


def test_a_real_streams_context_wins():
    side = torch.cuda.Stream(device=1)

    def thread():
        tch.bind_context(0)
        tch.bind_context(0, side.cuda_stream)  # a raw stream: its own context decides, over the named device
        return _C.current_context_device()

    assert run_in_thread(thread) == 1
    with pytest.raises(ValueError, match="the stream is on cuda:1"):
        tch.current_handle(0, side)


def test_builds_bake_the_target_devices_facts_and_never_cross_devices():
    seen = []

    def recording(graph, x, w, b):
        seen.append(current_device())
        return linear_relu(graph, x, w, b)

    gid = tch.register_graph(recording, name="per_device")
    for device in (0, 1):
        inputs = linear_inputs(device=f"cuda:{device}")
        with torch.cuda.device(1 - device):  # the ambient device is the other one
            (y,) = torch.ops.cudnn_fe.execute(gid, inputs)
        torch.testing.assert_close(y, linear_relu_reference(*inputs), **TOLERANCE)
    assert seen == [0, 1]
    assert sorted(b.device for b in tch.built_graphs(gid)) == [0, 1]


def test_a_built_graph_refuses_another_device():
    from test_op_gpu import built_linear_graph

    gid, good = built_linear_graph()
    with pytest.raises(ValueError, match="built for cuda:0 but the inputs are on cuda:1"):
        torch.ops.cudnn_fe.execute(gid, [t.to("cuda:1") for t in good])


def test_a_model_replicated_per_device_trains_on_threads():
    def replica(device):
        inputs = linear_inputs(device=f"cuda:{device}", requires_grad=True, seed=device)
        with torch.cuda.device(device):
            (y,) = torch.ops.cudnn_fe.execute(LINEAR_RELU, inputs)
            y.float().sum().backward()
        return y.detach(), [t.grad for t in inputs], inputs

    for device, (y, grads, inputs) in enumerate(run_concurrently(replica, 2)):
        leaves = [t.detach().float().requires_grad_() for t in inputs]
        torch.relu(torch.matmul(leaves[0], leaves[1]) + leaves[2]).sum().backward()
        torch.testing.assert_close(y, linear_relu_reference(*inputs), **TOLERANCE)
        for got, leaf in zip(grads, leaves):
            assert got.device == torch.device("cuda", device)
            torch.testing.assert_close(got.float(), leaf.grad, **TOLERANCE)


def _data_parallel_worker(rank, world_size, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    import torch.distributed as dist

    import graphs  # noqa: F401  -- registers the graphs in this process, in the same order

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    inputs = linear_inputs(device=f"cuda:{rank}", requires_grad=True, seed=rank)
    (y,) = torch.ops.cudnn_fe.execute(graphs.LINEAR_RELU, inputs)
    y.float().sum().backward()
    grad_w = inputs[1].grad.float()
    dist.all_reduce(grad_w)
    results[rank] = grad_w.cpu()
    dist.destroy_process_group()


def test_data_parallel_across_processes_matches_one_process():
    import torch.multiprocessing as mp

    world_size = 2
    results = mp.Manager().dict()
    mp.spawn(_data_parallel_worker, args=(world_size, 29531, results), nprocs=world_size, join=True)
    expected = torch.zeros_like(results[0])
    for rank in range(world_size):
        inputs = linear_inputs(device="cuda:0", requires_grad=True, seed=rank)
        torch.ops.cudnn_fe.execute(LINEAR_RELU, inputs)[0].float().sum().backward()
        expected += inputs[1].grad.float().cpu()
    for rank in range(world_size):
        torch.testing.assert_close(results[rank], expected, **TOLERANCE)
