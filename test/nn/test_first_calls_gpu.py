"""A new layout's first calls on a GPU (Note [A new layout's first calls]): with
``stand_in_calls=N`` a module's first N calls at a new size are torch's own ops, bitwise, and
call N+1 on is the cuDNN plan, whatever the build took; two processes running one sequence of
calls give bitwise equal outputs; under deterministic algorithms the calls build and wait."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_cudnn_handle as tch
from support.paths import REPO
from torch_cudnn_handle import settings
from torch_cudnn_handle.nn import FusedLinear, RMSNorm
from torch_cudnn_handle.nn.linear import LINEAR_GRAPHS

pytestmark = pytest.mark.gpu


def test_the_first_calls_are_torchs_and_the_next_the_plans(fresh_settings):
    settings.set_stand_in_calls(2)
    torch.manual_seed(0)
    layer = FusedLinear(256, 512, "gelu", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(3, 77, 256, device="cuda", dtype=torch.bfloat16)
    outputs = [layer(x) for _ in range(4)]
    torch_ops = F.gelu(F.linear(x, layer.weight, layer.bias))
    assert torch.equal(outputs[0], torch_ops) and torch.equal(outputs[1], torch_ops)  # the stand-in: torch's ops, bitwise
    assert torch.equal(outputs[2], outputs[3])  # the plan from call 3 on
    torch.testing.assert_close(outputs[2], torch_ops, rtol=2e-2, atol=2e-2)
    (built,) = [b for b in tch.built_graphs(LINEAR_GRAPHS["gelu"]) if b.inputs[0].shape == (3, 77, 256)]
    assert built.route.stand_in == "torch" and built.route.stand_in_calls == 2 and built.native, built.path_reason
    norm = RMSNorm(512, device="cuda", dtype=torch.bfloat16)
    x.requires_grad_(True)
    for _ in range(3):  # forward and backward, the backward's graph on its own route
        y = norm(layer(x))
        (dx,) = torch.autograd.grad(y.float().square().sum(), [x])
        assert torch.isfinite(dx).all()


SEQUENCE = """
import hashlib, torch
import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import TransformerBlock
torch.manual_seed(0)
block = TransformerBlock(256, 4, device="cuda", dtype=torch.bfloat16)
digest = hashlib.sha256()
for length in (96, 130, 96, 200, 130, 96, 200, 96):
    x = torch.randn(2, length, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = block(x)
    (dx,) = torch.autograd.grad(y.float().square().sum(), [x])
    digest.update(y.detach().cpu().view(torch.int16).numpy().tobytes())
    digest.update(dx.cpu().view(torch.int16).numpy().tobytes())
print(digest.hexdigest())
"""


@pytest.mark.parametrize("deterministic", [False, True])
def test_two_processes_running_one_sequence_give_bitwise_equal_outputs(deterministic):
    program = SEQUENCE.replace("torch.manual_seed(0)", "torch.manual_seed(0)\ntorch.use_deterministic_algorithms(True)") if deterministic else SEQUENCE
    environment = dict(os.environ, TORCH_CUDNN_HANDLE_STAND_IN_CALLS="3", TORCH_CUDNN_HANDLE_PLAN_STORE="0",
                       CUBLAS_WORKSPACE_CONFIG=":4096:8")
    digests = [subprocess.run([sys.executable, "-c", program], cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
               for _ in range(2)]
    for run in digests:
        assert run.returncode == 0, run.stderr[-3000:]
    assert digests[0].stdout == digests[1].stdout, [d.stdout for d in digests]


def test_torchs_own_cudnn_attention_runs_beside_plans_built_off_the_callers_path(fresh_settings):
    """Note [A fetched plan is loaded by the call that takes it]: a build thread never deserializes
    (cuDNN's deserialize captures a CUDA graph of its own); torch's cuDNN attention in this thread
    failed while one did (an H100, 40 new lengths). Here it runs after each of 16 new lengths'
    stand-in calls, while their plans build in build processes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torch_cudnn_handle.nn import sdpa

    settings.set_stand_in_calls(2)
    lengths = range(80, 80 + 16 * 37, 37)
    inputs = {n: [torch.randn(2, 8, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)] for n in lengths}
    for _ in range(2):
        for q, k, v in inputs.values():
            torch.autograd.grad(sdpa(q, k, v, True).float().sum(), [q, k, v])  # the stand-in's calls: builds start
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum(), [q, k, v])
    torch.cuda.synchronize()
    for q, k, v in inputs.values():  # the third calls take the plans, loading them
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(sdpa(q, k, v, True), expected, rtol=2e-2, atol=2e-2)
    assert tch.stats.graphs()["stand_in_calls"] >= 2 * len(lengths)
