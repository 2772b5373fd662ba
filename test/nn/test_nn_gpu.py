"""The nn modules on a GPU: forward and backward against torch, in fp16 and bf16.

The truth is the plain-torch reference in float32 with the same parameters and
inputs. A cuDNN result passes when its largest error is within a few units in the
last place of its dtype (relative to the largest expected value) or within three
times the error torch itself makes computing the same thing in that dtype, which
is what a deep module (the block) needs: both round at every op boundary.
"""

import threading

import pytest
import torch
import torch.nn.functional as F

from conftest import python_backward_calls, requires_native_path
import torch_cudnn_handle as tch
from torch_cudnn_handle import execute as tch_execute

pytestmark = pytest.mark.gpu

from torch_cudnn_handle.nn import (  # noqa: E402
    Attention,
    FusedLinear,
    LayerNorm,
    RMSNorm,
    TransformerBlock,
    reference_of,
    sdpa,
    sdpa_reference,
)

DTYPES = [torch.float16, torch.bfloat16]
TOLERANCE = {torch.float16: (5e-3, 1e-2), torch.bfloat16: (1e-2, 3e-2)}


def assert_close(actual, expected, torch_lowp=None, what=""):
    """``actual`` (cuDNN, fp16/bf16) against ``expected`` (float32 torch); ``torch_lowp``: torch in ``actual``'s dtype."""
    assert actual.shape == expected.shape, what
    atol, rtol = TOLERANCE[actual.dtype]
    expected = expected.float()
    error = (actual.float() - expected).abs().max().item()
    tolerance = atol + rtol * expected.abs().max().item()
    if torch_lowp is not None:
        tolerance = max(tolerance, 3 * (torch_lowp.float() - expected).abs().max().item())
    assert torch.isfinite(actual).all(), f"{what}: not finite"
    assert error <= tolerance, f"{what}: max abs error {error:.3e} > tolerance {tolerance:.3e}"


def run(module, x, dy):
    x = x.detach().requires_grad_()
    y = module(x)
    y.backward(dy)
    return y.detach(), x.grad, {name: p.grad for name, p in module.named_parameters()}


def check_module(module, x, dy):
    """``module`` (cuDNN) against its reference in float32 and in ``x``'s dtype, forward and backward."""
    y, dx, grads = run(module, x, dy)
    y32, dx32, grads32 = run(reference_of(module).float(), x.float(), dy.float())
    y16, dx16, grads16 = run(reference_of(module), x, dy)
    assert_close(y, y32, y16, "output")
    assert_close(dx, dx32, dx16, "input gradient")
    for name, grad in grads.items():
        assert grad is not None and grad.shape == grads32[name].shape, name
        assert_close(grad, grads32[name], grads16[name], f"gradient of {name}")


def inputs(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype), torch.randn(*shape, device="cuda").to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", None])
def test_fused_linear(activation, bias, dtype):
    torch.manual_seed(0)
    layer = FusedLinear(256, 384, activation, bias=bias, device="cuda", dtype=dtype)
    x = torch.randn(4, 64, 256, device="cuda").to(dtype)
    check_module(layer, x, torch.randn(4, 64, 384, device="cuda").to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_gate(dtype):
    """silu(x W^T) * up on its graph, each backward graph alone, and the autograd node's four
    steps, against torch in float32 (every comparison made before any is asserted)."""
    from torch_cudnn_handle.nn.swiglu import SWIGLU_DUP, SWIGLU_DZ, SWIGLU_GATE

    torch.manual_seed(0)
    leaves = [torch.randn(4, 64, 256, device="cuda"), torch.randn(384, 256, device="cuda") / 16, torch.randn(4, 64, 384, device="cuda")]
    dy, z = torch.randn(4, 64, 384, device="cuda"), torch.randn(4, 64, 384, device="cuda")

    def run_gate(fn, dtype):
        x, w, up = (t.detach().clone().to(dtype).requires_grad_() for t in leaves)  # fresh leaves: no run adds to another's grads
        y = fn(x, w, up)
        y.backward(dy.to(dtype))
        return [y.detach(), x.grad, w.grad, up.grad]

    def dz_dup(dtype):
        up, g, pre = (t.to(dtype) for t in (leaves[2], dy, z))
        return [torch.ops.aten.silu_backward(g, pre) * up, g * F.silu(pre)]

    ours = run_gate(lambda x, w, up: tch_execute(SWIGLU_GATE, [x, w, up])[0], dtype)
    ours += [tch_execute(SWIGLU_DZ, [t.to(dtype) for t in (dy, leaves[2], z)])[0], tch_execute(SWIGLU_DUP, [dy.to(dtype), z.to(dtype)])[0]]
    torch32 = run_gate(lambda x, w, up: F.silu(F.linear(x, w)) * up, torch.float32) + dz_dup(torch.float32)
    lowp = run_gate(lambda x, w, up: F.silu(F.linear(x, w)) * up, dtype) + dz_dup(dtype)
    errors = []
    for what, a, b, c in zip(("output", "dx", "dw", "dup", "dz graph", "dup graph"), ours, torch32, lowp):
        try:
            assert_close(a, b, c, what)
        except AssertionError as error:
            errors.append(str(error))
    assert not errors, errors


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("module", [RMSNorm, LayerNorm], ids=lambda m: m.__name__)
def test_norms(module, dtype):
    torch.manual_seed(0)
    norm = module(1024, device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        if module is LayerNorm:
            norm.bias.uniform_(-0.5, 0.5)
    check_module(norm, *inputs(4, 64, 1024, dtype=dtype, scale=3.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_sdpa(layout, causal, dtype):
    torch.manual_seed(0)

    def make():
        if layout == "bhsd":
            return torch.randn(2, 4, 128, 64, device="cuda").to(dtype)
        return torch.randn(2, 128, 4, 64, device="cuda").to(dtype).transpose(1, 2)

    q, k, v = make(), make(), make()
    d_o = torch.randn(2, 4, 128, 64, device="cuda").to(dtype)
    results = {}
    for name, fn, cast in (("cudnn", sdpa, lambda t: t), ("torch", sdpa_reference, lambda t: t), ("float32", sdpa_reference, lambda t: t.float())):
        leaves = [cast(t).detach().requires_grad_() for t in (q, k, v)]
        o = fn(*leaves, causal)
        o.backward(cast(d_o))
        results[name] = [o.detach()] + [t.grad for t in leaves]
    assert results["cudnn"][0].stride() == q.stride()  # O in Q's layout
    for i, what in enumerate(("O", "dQ", "dK", "dV")):
        assert_close(results["cudnn"][i], results["float32"][i], results["torch"][i], what)


def test_the_gelu_graph_takes_natural_operands_and_its_pre_activation_is_not_differentiable():
    from torch_cudnn_handle.nn.linear import LINEAR_GRAPHS

    torch.manual_seed(0)
    x = torch.randn(2, 32, 32, device="cuda", dtype=torch.bfloat16).requires_grad_()
    weight = torch.randn(48, 32, device="cuda", dtype=torch.bfloat16).requires_grad_()
    bias = torch.randn(48, device="cuda", dtype=torch.bfloat16).requires_grad_()
    y, z = tch_execute(LINEAR_GRAPHS["gelu"], [x, weight, bias])
    assert y.shape == z.shape == (2, 32, 48)
    assert y.requires_grad and not z.requires_grad  # z is what the declared backward reads, never differentiated
    (2 * y.float().sum()).backward()
    leaves = [t.detach().float().requires_grad_() for t in (x, weight, bias)]
    z_ref = leaves[0] @ leaves[1].T + leaves[2]
    torch.testing.assert_close(z.float(), z_ref.detach(), atol=0.1, rtol=2e-2)
    (2 * F.gelu(z_ref).sum()).backward()
    for got, want in zip((x, weight, bias), leaves):
        torch.testing.assert_close(got.grad.float(), want.grad, atol=0.5, rtol=3e-2)


@pytest.mark.parametrize("module", ["sdpa", "rmsnorm"])
@requires_native_path
def test_declared_backwards_reach_python_only_on_their_first_two_calls(module):
    torch.manual_seed(0)
    if module == "sdpa":
        q, k, v = (torch.randn(1, 2, 96, 64, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        leaves, run, reference = [q, k, v], lambda: sdpa(q, k, v, True), lambda *t: sdpa_reference(*t, True)
    else:
        norm = RMSNorm(256, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(3, 5, 256, device="cuda", dtype=torch.bfloat16).requires_grad_()
        leaves, run, reference = [x, norm.weight], lambda: norm(x), lambda x, w: F.rms_norm(x.float(), (256,), w.float(), 1e-5)
    counts = []
    with python_backward_calls() as calls:
        for _ in range(3):
            for leaf in leaves:
                leaf.grad = None
            y = run()
            y.backward(torch.ones_like(y))
            counts.append(len(calls))
    # A build and a native hand-over at most, then C++ only.
    assert counts[0] <= 1 and counts[1] <= 2 * counts[0] and counts[2] == counts[1], counts
    floats = [t.detach().float().requires_grad_() for t in leaves]
    reference(*floats).sum().backward()
    for got, want in zip(leaves, floats):
        torch.testing.assert_close(got.grad.float(), want.grad, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention(dtype):
    torch.manual_seed(0)
    check_module(Attention(256, 4, device="cuda", dtype=dtype), *inputs(2, 128, 256, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_transformer_block(activation, dtype):
    torch.manual_seed(0)
    block = TransformerBlock(256, 4, mlp_ratio=4, activation=activation, device="cuda", dtype=dtype)
    check_module(block, *inputs(2, 128, 256, dtype=dtype))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_block_matches_eager(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = TransformerBlock(256, 4, device="cuda", dtype=torch.bfloat16)
    x, dy = inputs(2, 128, 256, dtype=torch.bfloat16)
    y, dx, grads = run(block, x, dy)
    block.zero_grad(set_to_none=True)
    yc, dxc, _ = run(torch.compile(block, backend=backend, fullgraph=True), x, dy)
    gradsc = {name: p.grad for name, p in block.named_parameters()}  # the compiled wrapper prefixes names
    # the same graphs on the same inputs: equal up to the rounding of torch-side ops inductor may fuse
    torch.testing.assert_close(yc, y, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(dxc, dx, atol=2e-2, rtol=2e-2)
    for name, grad in grads.items():
        torch.testing.assert_close(gradsc[name], grad, atol=5e-2, rtol=2e-2, msg=name)


def test_modules_serve_many_threads():
    torch.manual_seed(0)
    block = TransformerBlock(128, 2, device="cuda", dtype=torch.bfloat16).eval()
    requests = [torch.randn(1, 64, 128, device="cuda", dtype=torch.bfloat16) for _ in range(32)]
    with torch.no_grad():
        block(requests[0])  # built (waited for under serving_mode): the plans, not a stand-in, are compared
        assert tch.registry.wait_for_builds(120) == 0
        expected = [block(x) for x in requests]
    torch.cuda.synchronize()
    results, errors = [None] * len(requests), []

    def worker(indices):
        try:
            stream = torch.cuda.Stream()
            with torch.no_grad(), torch.cuda.stream(stream):
                for i in indices:
                    results[i] = block(requests[i])
            stream.synchronize()
        except BaseException as error:  # noqa: BLE001 -- reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(range(t, len(requests), 8),)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want)  # the same graphs: the same numbers on any thread and stream
