"""Torch's autograd and ownership contract on a GPU, each case held against torch's own op:
memory kept for backward, a gradient through every output, in-place ops on outputs,
deterministic mode, handles the pool owns, releasable workspaces."""

import threading

import cudnn
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from conftest import run_concurrently
import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import FusedLinear, RMSNorm
from torch_cudnn_handle.nn.attention import SDPA_GRAPHS

pytestmark = pytest.mark.gpu


def held_after_forward(forward, *inputs) -> int:
    """Bytes the CUDA allocator holds after ``forward(*inputs)`` while its autograd
    graph is alive, beyond the inputs and parameters that existed before."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    result = forward(*inputs)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    del result
    return held


def built_for(module, *inputs) -> None:
    """One call of ``module`` (forward and backward), then every build it started finished."""
    module(*inputs).float().sum().backward()
    assert tch.registry.wait_for_builds(120) == 0


def test_rmsnorm_keeps_what_torch_keeps():
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    norm = RMSNorm(8192, device="cuda", dtype=torch.bfloat16)
    library = held_after_forward(norm, x)
    torch_held = held_after_forward(lambda t: F.rms_norm(t, (8192,), norm.weight, norm.eps), x)
    print(f"RMSNorm 8192x8192 bf16: held after forward: library {library / 2**20:.1f} MiB, torch {torch_held / 2**20:.1f} MiB")
    assert library <= torch_held + 2**20  # the output, plus inv_var (32 KiB) where torch keeps rstd


def test_fused_linear_keeps_what_torch_keeps():
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for activation, act in (("relu", F.relu), ("gelu", F.gelu)):
        linear = FusedLinear(1024, 4096, activation=activation, device="cuda", dtype=torch.bfloat16)
        built_for(linear, x)  # built (waited for under serving_mode): the plans are measured
        library = held_after_forward(linear, x)
        torch_held = held_after_forward(lambda t: act(F.linear(t, linear.weight, linear.bias)), x)
        print(f"FusedLinear {activation} 4096x1024->4096: library {library / 2**20:.1f} MiB, torch {torch_held / 2**20:.1f} MiB")
        assert library <= torch_held + 2**20


def test_sdpa_keeps_what_torch_cudnn_attention_keeps():
    q, k, v = (torch.randn(2, 8, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    library = held_after_forward(lambda *t: tch.execute(SDPA_GRAPHS[True], list(t)), q, k, v)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        torch_held = held_after_forward(lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), q, k, v)
    print(f"sdpa 2x8x2048x64 bf16: library {library / 2**20:.2f} MiB, torch cuDNN {torch_held / 2**20:.2f} MiB")
    assert library <= torch_held + 2**20


def test_a_gradient_through_the_statistics_is_never_dropped():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o, stats = tch.execute(SDPA_GRAPHS[True], [q, k, v])
    assert not stats.requires_grad and stats.grad_fn is None  # torch's rule for logsumexp
    (o.sum() + stats.sum()).backward()
    reference = [t.detach().float().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*reference, is_causal=True).sum().backward()
    for got, want in zip((q, k, v), reference):
        torch.testing.assert_close(got.grad.float(), want.grad, atol=2e-2, rtol=2e-2)


def test_in_place_on_a_module_output_works_as_in_torch():
    norm = RMSNorm(512, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = norm(x)
    F.relu_(y)
    y.sum().backward()
    reference = x.detach().float().requires_grad_()
    F.relu(F.rms_norm(reference, (512,), norm.weight.detach().float(), norm.eps)).sum().backward()
    torch.testing.assert_close(x.grad.float(), reference.grad, atol=3e-2, rtol=3e-2)


def sdpa_step(q, k, v):
    for t in (q, k, v):
        t.grad = None
    o = tch.execute(SDPA_GRAPHS[True], [q, k, v])[0]
    o.backward(torch.ones_like(o))
    return o.detach().clone(), [t.grad.clone() for t in (q, k, v)]


def test_deterministic_mode_builds_deterministic_plans_and_repeats_bitwise():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = sdpa_step(q, k, v)
        for _ in range(3):
            again = sdpa_step(q, k, v)
            assert torch.equal(again[0], first[0])
            assert all(torch.equal(a, b) for a, b in zip(again[1], first[1]))
    finally:
        torch.use_deterministic_algorithms(previous)
    backward_id = tch.registry.definition(SDPA_GRAPHS[True]).backward_id
    built = [b for b in tch.built_graphs(backward_id) if b.deterministic]
    assert built, "no deterministic build of the sdpa backward"
    assert any(b.native for b in built)


def test_a_pooled_handle_refuses_destroy_and_keeps_working():
    handle = tch.current_handle(0)
    with pytest.raises(RuntimeError, match="belongs to torch_cudnn_handle's pool"):
        cudnn.destroy_handle(handle)
    assert handle.backend_handle is not None
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    norm = RMSNorm(64, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(norm(x).float(), F.rms_norm(x.float(), (64,), norm.weight.float(), norm.eps), atol=2e-2, rtol=2e-2)
    own = cudnn.create_handle()
    cudnn.destroy_handle(own)  # a handle of one's own is destroyed as before
    assert own.backend_handle is None


def test_no_path_creates_a_frontend_handle_outside_the_pool(monkeypatch):
    created = []
    original = cudnn.create_handle

    def counting():
        created.append(threading.get_ident())
        return original()

    monkeypatch.setattr(cudnn, "create_handle", counting)
    compiling = threading.Lock()

    def work(i):
        gid = tch.register_graph(
            lambda g, x: g.relu(x), name=f"fresh_relu_{i}",
            backward=tch.Backward.graph(lambda g, dy, x: [g.relu_backward(dy, x)], operands=[tch.BackwardOperand.grad(0), tch.BackwardOperand.input(0)]),
        )
        x = torch.randn(4, 32, 16 + 8 * i, device="cuda", dtype=torch.float16, requires_grad=True)
        (y,) = tch.execute(gid, [x])
        y.float().sum().backward()
        compiled = torch.compile(lambda t: tch.execute(gid, [t])[0], backend="aot_eager", fullgraph=True)
        with compiling:  # dynamo traces one frame at a time (it is not thread-safe); the op still runs on this thread
            compiled(x.detach()).sum()
        norm = RMSNorm(16 + 8 * i, device="cuda", dtype=torch.bfloat16)
        norm(torch.randn(4, 16 + 8 * i, device="cuda", dtype=torch.bfloat16, requires_grad=True)).sum().backward()
        torch.cuda.synchronize()

    run_concurrently(work, 4)
    assert created == []


def test_release_workspaces_frees_the_native_workspaces_and_calls_go_on():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    before = sdpa_step(q, k, v)  # the sdpa backward's plan has a workspace
    sdpa_step(q, k, v)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    freed = tch.release_workspaces()
    assert freed > 0
    assert torch.cuda.memory_allocated() <= allocated - freed
    assert tch.release_workspaces() == 0  # nothing kept since
    after = sdpa_step(q, k, v)
    assert torch.equal(after[0], before[0]) and all(torch.equal(a, b) for a, b in zip(after[1], before[1]))
