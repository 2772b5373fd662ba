"""Plan lifetime and the op's contract on a real GPU: captured graphs outlive eviction,
native calls keep their plan hot, execute.out under autograd, misaligned views, the
native path's fallback, and fake layouts equal to what the GPU writes."""

import gc
import time
import weakref

import cudnn
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_cudnn_handle as tch
from support.graphs import LINEAR_RELU, MATMUL, RELU, linear_inputs, linear_relu, linear_relu_reference, matmul
from torch_cudnn_handle import _C

pytestmark = pytest.mark.gpu
TOLERANCE = dict(atol=2e-2, rtol=2e-2)


@pytest.fixture
def restore_capacity():
    capacity = tch.stats.graphs()["capacity"]
    yield
    tch.settings.set_graph_cache_capacity(capacity)


def half(*shape, seed=0):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device="cuda", dtype=torch.float16)


CAPTURE_CASES = {
    # graph, static inputs, reference, whether its plan needs a workspace
    "native, no workspace": (RELU, lambda seed: [half(4, 8, 16, seed=seed)], lambda x: torch.relu(x), False),
    "native, with workspace": (MATMUL, lambda seed: [half(1, 16, 16, seed=seed), half(1, 16, 16, seed=seed + 1)], torch.bmm, True),
    "Python path": (LINEAR_RELU, lambda seed: linear_inputs(seed=seed), linear_relu_reference, None),
}


@pytest.mark.parametrize("case", sorted(CAPTURE_CASES))
def test_a_captured_call_outlives_the_eviction_of_its_plan(case, restore_capacity):
    graph_id, make, reference, needs_workspace = CAPTURE_CASES[case]
    gid = tch.register_graph(tch.registry.definition(graph_id).builder, name=f"captured_{case}")
    python_path = needs_workspace is None
    tch.settings.set_native_path(not python_path)
    try:
        static = make(1)
        for _ in range(2):  # warm-up: built (and this thread has its handle), then handed to the native path
            torch.ops.cudnn_fe.execute(gid, static)
    finally:
        tch.settings.set_native_path(True)
    (built,) = tch.built_graphs(gid)
    assert built.native == (not python_path), built.path_reason
    if needs_workspace and built.workspace_size == 0:  # the plan this cuDNN selects for it (9.27) needs none
        pytest.skip(f"cuDNN {cudnn.backend_version()} selects {built.engine} for this matmul, which needs no workspace")
    if not python_path:
        assert (built.workspace_size > 0) == needs_workspace, built.workspace_size
    owner = weakref.ref(built)
    alive = _C.native_plans_alive()
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        (captured,) = torch.ops.cudnn_fe.execute(gid, static)
    # Evict it: a cache of one, and other layouts of the same graph pushed through.
    tch.settings.set_graph_cache_capacity(1)
    for n in (2, 3, 4):  # a larger batch dimension is a new layout for every case
        torch.ops.cudnn_fe.execute(gid, [t.repeat(n, *[1] * (t.dim() - 1)) for t in make(n)])
    assert all(b is not built for b in tch.built_graphs(gid)), "the captured plan was not evicted"
    del built
    gc.collect()
    assert owner() is not None or not python_path, "nothing kept the evicted Python-path plan for the CUDA graph"
    for seed in (2, 3):
        for dst, src in zip(static, make(seed)):
            dst.copy_(src)
        cuda_graph.replay()
        torch.testing.assert_close(captured, reference(*static), **TOLERANCE)
    if not python_path:
        assert _C.native_plans_alive() >= 1
    del cuda_graph
    torch.cuda.synchronize()
    # CUDA releases a destroyed graph's user objects on its own thread, soon after;
    # what they kept goes at the next release_dropped().
    deadline, released = time.monotonic() + 5, 0
    while time.monotonic() < deadline and (released == 0 or owner() is not None):
        gc.collect()
        released += _C.release_dropped()
        gc.collect()
        time.sleep(0.01)
    assert released >= 1 and owner() is None
    if not python_path:
        assert _C.native_plans_alive() <= alive


def test_native_calls_keep_their_plan_hot(restore_capacity):
    gid = tch.register_graph(matmul, name="hot_native_matmul")
    hot = [half(1, 16, 16, seed=1), half(1, 16, 16, seed=2)]
    for _ in range(2):  # built, then handed to the native path: the oldest Python-side use
        torch.ops.cudnn_fe.execute(gid, hot)
    (hot_plan,) = tch.built_graphs(gid)
    assert hot_plan.native
    time.sleep(0.01)
    torch.ops.cudnn_fe.execute(gid, [half(1, 32, 16, seed=3), half(1, 16, 16, seed=4)])  # newer, on the Python side
    time.sleep(0.01)
    for _ in range(10):  # native calls only: they never pass through the registry's Python
        torch.ops.cudnn_fe.execute(gid, hot)
    builds = tch.stats.graphs()["builds"]
    tch.settings.set_graph_cache_capacity(1)  # keeps the one used last, across both paths
    assert [b.inputs[0].shape for b in tch.built_graphs(gid)] == [(1, 16, 16)]
    torch.testing.assert_close(torch.ops.cudnn_fe.execute(gid, hot)[0], torch.bmm(*hot), **TOLERANCE)
    assert tch.stats.graphs()["builds"] == builds


# ---------------------------------------------------------------------------------
# execute.out under autograd


def test_out_bumps_versions_so_a_saved_tensor_overwritten_raises():
    a = half(1, 16, 16, seed=5).requires_grad_()
    x, w = half(1, 16, 16, seed=6), half(1, 16, 16, seed=7)
    saved = half(1, 16, 16, seed=8)
    loss = (a * saved).sum()  # saves `saved` for the backward
    version = saved._version
    torch.ops.cudnn_fe.execute.out(MATMUL, [x, w], out=[saved])
    assert saved._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    torch.testing.assert_close(saved, torch.bmm(x, w), **TOLERANCE)


def test_out_refuses_to_differentiate_and_runs_without_grad():
    x, w = half(1, 16, 16, seed=9).requires_grad_(), half(1, 16, 16, seed=10)
    out = torch.empty(1, 16, 16, dtype=torch.float16, device="cuda")
    with pytest.raises(RuntimeError, match=r"out=\.\.\. arguments don't support automatic differentiation.*inputs\[0\]"):
        torch.ops.cudnn_fe.execute.out(MATMUL, [x, w], out=[out])
    with pytest.raises(RuntimeError, match=r"out\[0\] requires grad"):
        tch.execute_out(MATMUL, [x.detach(), w], out=[out.clone().requires_grad_()])
    with torch.no_grad():
        torch.ops.cudnn_fe.execute.out(MATMUL, [x, w], out=[out])
    torch.testing.assert_close(out, torch.bmm(x.detach(), w), **TOLERANCE)


def test_opcheck_on_out_with_inputs_that_require_grad():
    # Under no_grad, as torch's own out= ops need it too (aten.add.out fails opcheck's
    # schema test in grad mode with the same refusal).
    x, w = half(1, 16, 16, seed=11), half(1, 16, 16, seed=12)
    out = torch.empty(1, 16, 16, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        torch.library.opcheck(torch.ops.cudnn_fe.execute.out, (MATMUL, [x.requires_grad_(), w.requires_grad_()]), {"out": [out]})


# ---------------------------------------------------------------------------------
# misaligned views


def offset_view(tensor: torch.Tensor) -> torch.Tensor:
    """The same values in a view one element past an aligned start (2-byte aligned for fp16)."""
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    view = storage[1:].view(tensor.shape)
    view.copy_(tensor)
    assert view.data_ptr() % 16 != 0
    return view


@pytest.mark.parametrize("native", [True, False], ids=["native", "python-path"])
@pytest.mark.parametrize("which", ["input 0", "input 1", "out"])
def test_a_misaligned_view_runs_correctly(which, native):
    gid = tch.register_graph(matmul, name=f"misaligned_{which}_{native}")
    tch.settings.set_native_path(native)
    try:
        x, w = half(1, 16, 16, seed=13), half(1, 16, 16, seed=14)
        torch.ops.cudnn_fe.execute(gid, [x, w])  # built for aligned operands
        expected = torch.bmm(x, w)
        inputs = [offset_view(x) if which == "input 0" else x, offset_view(w) if which == "input 1" else w]
        if which == "out":
            out = offset_view(torch.zeros_like(expected))
            torch.ops.cudnn_fe.execute.out(gid, inputs, out=[out])
            result = out
        else:
            (result,) = torch.ops.cudnn_fe.execute(gid, inputs)
        torch.cuda.synchronize()  # a fault would surface here, sticky
        torch.testing.assert_close(result, expected, **TOLERANCE)
        torch.testing.assert_close(torch.ops.cudnn_fe.execute(gid, [x, w])[0], expected, **TOLERANCE)
        assert tch.built_graphs(gid)[0].native == native
    finally:
        tch.settings.set_native_path(True)


# ---------------------------------------------------------------------------------
# the native path's fallback, and fake layouts equal to the GPU's


def test_a_failed_native_registration_falls_back_once_with_its_reason(monkeypatch):
    from torch_cudnn_handle import native
    from torch_cudnn_handle.native import binding

    def corrupted(graph, uids, serialized=None):
        spec, why = native.backend_plan_of(graph, uids, serialized)
        return (None, why) if spec is None else (native.NativePlanSpec("{not a plan"), why)

    monkeypatch.setattr(binding, "backend_plan_of", corrupted)  # where the hand-over looks it up
    gid = tch.register_graph(linear_relu, name="failed_native")
    inputs = linear_inputs(seed=15)
    builds = tch.stats.graphs()["builds"]
    for _ in range(3):
        torch.testing.assert_close(torch.ops.cudnn_fe.execute(gid, inputs)[0], linear_relu_reference(*inputs), **TOLERANCE)
    (built,) = tch.built_graphs(gid)
    assert not built.native and built.path_reason.startswith("native registration failed"), built.path_reason
    assert tch.stats.graphs()["builds"] == builds + 1


def exercise_every_registered_graph(dtype):
    """Run every nn module (what the package and its examples register) forward and
    backward, so each of their graphs is built for `dtype`."""
    from torch_cudnn_handle.nn import Attention, FusedLinear, RMSNorm, TransformerBlock, sdpa

    modules = [FusedLinear(64, 32, act, device="cuda", dtype=dtype) for act in (None, "relu", "gelu")]
    modules += [RMSNorm(64, device="cuda", dtype=dtype), Attention(128, 2, device="cuda", dtype=dtype)]
    modules += [TransformerBlock(128, 2, device="cuda", dtype=dtype)]
    for module in modules:
        width = 128 if isinstance(module, (Attention, TransformerBlock)) else 64
        x = torch.randn(2, 32, width, device="cuda", dtype=dtype, requires_grad=True)
        module(x).float().sum().backward()
    for causal in (False, True):
        q, k, v = (torch.randn(2, 2, 64, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        sdpa(q, k, v, causal).float().sum().backward()
        with torch.no_grad():
            sdpa(q, k, v, causal)  # the inference graph


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fake_layouts_equal_what_the_gpu_writes_for_every_registered_graph(dtype):
    exercise_every_registered_graph(dtype)
    checked = 0
    for definition in tch.registry.definitions():
        if definition.builder is None or not definition.name.startswith("nn_"):
            continue
        for built in tch.built_graphs(definition.graph_id):
            if built.inputs[0].dtype != dtype and all(s.dtype != dtype for s in built.inputs):
                continue
            if any(d < 0 for s in built.inputs for d in s.shape):
                continue  # a ragged (length-bucket) graph: no fixed token count; test/nn/test_attention_buckets_gpu.py runs those
            real_inputs = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device="cuda").normal_() for s in built.inputs]
            real = torch.ops.cudnn_fe.execute(definition.graph_id, real_inputs)
            with FakeTensorMode():
                fake_inputs = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device="cuda") for s in built.inputs]
                fake = torch.ops.cudnn_fe.execute(definition.graph_id, fake_inputs)
            assert [(tuple(t.shape), t.stride(), t.dtype) for t in fake] == [(tuple(t.shape), t.stride(), t.dtype) for t in real], definition.name
            checked += 1
    assert checked >= 10, checked


def test_a_built_graph_refuses_another_dtype_at_trace_time():
    from test_op_gpu import built_linear_graph

    gid, (x, w, b) = built_linear_graph()
    with FakeTensorMode():
        fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in (x, w, b)]
        fake[0] = fake[0].float()
        with pytest.raises(ValueError, match="input 0 of graph 'prebuilt_linear' is float32"):
            torch.ops.cudnn_fe.execute(gid, fake)
