"""Natural operands and FusedLinear's declared backward of several graphs, on a GPU.

The modules now pass their own tensors to the op (no view nodes) and FusedLinear's
backward runs as one C++ node. Checked here: outputs and gradients equal, bit for bit,
what the view-based route computes (the same builders registered without
OperandViews, called on views, with the Python backward the module had), except the
bias gradient (a torch sum either way, over another shape: close); no Python runs
in a warm FusedLinear or RMSNorm step when native plans serve it; and with
TORCH_CUDNN_HANDLE_NATIVE=0 every graph runs on the Python path with the same results.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_cudnn_handle as tch
from conftest import python_kernels, requires_native_path
from torch_cudnn_handle.nn import FusedLinear, RMSNorm
from torch_cudnn_handle.nn.linear import GELU_BACKWARD, MATMUL, RELU_BACKWARD, linear_forward
from torch_cudnn_handle.nn.norm import BACKWARD_OPERANDS, rmsnorm_backward, rmsnorm_forward

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]

# The view-based route, as the modules ran before: graphs described on 4-D / 3-D views.
PREVIOUS_RMSNORM = tch.register_graph(
    rmsnorm_forward, name="previous_rmsnorm", backward=tch.Backward.graph(rmsnorm_backward, operands=BACKWARD_OPERANDS), params=dict(eps=1e-5)
)


def _previous_linear_backward(activation):
    def backward(grads, inputs, outputs):
        x, w, dy = inputs[0], inputs[1], grads[0]
        if activation == "relu":
            (dy,) = tch.execute(RELU_BACKWARD, [dy, outputs[0]])
        elif activation == "gelu":
            (dy,) = tch.execute(GELU_BACKWARD, [dy, outputs[1]])
        dx = tch.execute(MATMUL, [dy, w.mT])[0]
        dw = tch.execute(MATMUL, [dy.mT, x])[0].mT
        return [dx, dw, dy.sum(dim=1, keepdim=True)]

    return backward


PREVIOUS_LINEAR = {
    activation: tch.register_graph(
        linear_forward, name=f"previous_linear_{activation}", params=dict(activation=activation),
        backward=tch.Backward.function(_previous_linear_backward(activation), materialize_grads=False),
    )
    for activation in (None, "relu", "gelu")
}


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_equals_the_view_based_route_bitwise(dtype):
    torch.manual_seed(0)
    norm = RMSNorm(1024, device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (3 * torch.randn(4, 64, 1024, device="cuda")).to(dtype)
    dy = torch.randn_like(x)
    (x_new,) = _leaves(x)
    y_new = norm(x_new)
    y_new.backward(dy)
    x_old, w_old = _leaves(x, norm.weight)
    y_old = tch.execute(PREVIOUS_RMSNORM, [x_old.reshape(-1, 1024, 1, 1), w_old.view(1, 1024, 1, 1)])[0].view(x.shape)
    y_old.backward(dy)
    assert torch.equal(y_new, y_old)
    assert torch.equal(x_new.grad, x_old.grad)
    assert torch.equal(norm.weight.grad, w_old.grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_fused_linear_equals_the_view_based_route(activation, dtype):
    torch.manual_seed(0)
    layer = FusedLinear(256, 384, activation, device="cuda", dtype=dtype)
    x = torch.randn(4, 64, 256, device="cuda").to(dtype)
    dy = torch.randn(4, 64, 384, device="cuda").to(dtype)
    layer(x.detach().requires_grad_()).backward(dy)  # built (waited for under serving_mode)
    assert tch.registry.wait_for_builds(120) == 0
    layer.zero_grad(set_to_none=True)
    (x_new,) = _leaves(x)
    y_new = layer(x_new)
    y_new.backward(dy)
    x_old, w_old, b_old = _leaves(x, layer.weight, layer.bias)
    y_old = tch.execute(PREVIOUS_LINEAR[activation], [x_old.reshape(1, -1, 256), w_old.unsqueeze(0).mT, b_old.view(1, 1, 384)])[0]
    y_old.view(4, 64, 384).backward(dy)
    assert torch.equal(y_new, y_old.view(4, 64, 384))
    assert torch.equal(x_new.grad, x_old.grad)
    assert torch.equal(layer.weight.grad, w_old.grad)
    torch.testing.assert_close(layer.bias.grad, b_old.grad)  # a torch sum over [4, 64] rows vs [256]


def _recording_python_kernels(calls):
    """Every call that reaches the op's Python kernels (execute and both backwards), recorded while in the block."""

    def record(what, fn):
        def recorded(*args, **kwargs):
            calls.append((what, args[0]))
            return fn(*args, **kwargs)

        return recorded

    from torch_cudnn_handle.op import backward as op_backward, python_path

    return python_kernels(
        execute=record("execute", python_path.execute), execute_out=record("execute_out", python_path.execute_out),
        execute_in_place=record("execute_", python_path.execute_in_place), backward=record("backward", op_backward.backward),
        run_declared_backward=record("declared backward", op_backward.run_declared_backward),
    )


@requires_native_path
@pytest.mark.parametrize("module", ["relu", "gelu", None, "rmsnorm"])
def test_a_warm_step_runs_no_python(module):
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    layer = RMSNorm(512, **bf16) if module == "rmsnorm" else FusedLinear(512, 768, module, **bf16)
    x = torch.randn(2, 96, 512, **bf16).requires_grad_()
    for _ in range(2):  # the first step builds each graph (Python), the second hands its plan to C++
        layer(x).float().sum().backward()
        assert tch.registry.wait_for_builds(120) == 0  # under serving_mode, its builds
    calls = []
    with _recording_python_kernels(calls):
        layer(x).float().sum().backward()
        torch.cuda.synchronize()
    assert calls == [], calls


@pytest.mark.parametrize("module", ["linear", "rmsnorm"])
def test_the_python_path_computes_the_same(module, tmp_path):
    """TORCH_CUDNN_HANDLE_NATIVE=0: every graph (forward and each backward step) runs
    through the frontend's execute; the results equal the native path's."""
    script = textwrap.dedent(
        f"""
        import os, sys, torch, torch_cudnn_handle as tch
        from torch_cudnn_handle.nn import FusedLinear, RMSNorm
        torch.manual_seed(0)
        bf16 = dict(device="cuda", dtype=torch.bfloat16)
        layer = RMSNorm(512, **bf16) if {module!r} == "rmsnorm" else FusedLinear(512, 768, "gelu", **bf16)
        x = torch.randn(2, 96, 512, **bf16).requires_grad_()
        layer(x).float().sum().backward()  # built (waited for under serving_mode): the plans are compared
        assert tch.registry.wait_for_builds(120) == 0
        layer.zero_grad(set_to_none=True)
        x.grad = None
        y = layer(x)
        y.backward(torch.randn_like(y))
        torch.save([y.detach().cpu(), x.grad.cpu()] + [p.grad.cpu() for p in layer.parameters()], sys.argv[1])
        if os.environ["TORCH_CUDNN_HANDLE_NATIVE"] == "0":
            assert tch.stats.graphs()["native"] == 0, tch.stats.graphs()
        """
    )
    results = {}
    for native in ("1", "0"):
        path = tmp_path / f"native{native}.pt"
        env = dict(os.environ, TORCH_CUDNN_HANDLE_NATIVE=native)
        subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, timeout=600)
        results[native] = torch.load(path)
    for native_result, python_result in zip(results["1"], results["0"]):
        assert torch.equal(native_result, python_result)
