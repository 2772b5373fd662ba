"""torch.compile(dynamic=True) on a GPU, with inductor: one compiled frame serves every
length of the SDPA and block examples, forward and backward; sdpa's outputs are bit
for bit the library's eager ones (the same built plan runs either way) and close to
torch's, its gradients and the block's results close to eager. test_dynamic_shapes.py checks the same tracing on
meta tensors without a GPU."""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from torch_cudnn_handle.nn import TransformerBlock, sdpa

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]
DTYPE = torch.bfloat16


def eager_and_compiled(fn, inputs_of, lengths):
    """Runs ``fn`` eagerly and compiled (dynamic=True, inductor) on each length's inputs,
    forward and backward; returns the frame counter and, per length, both runs' outputs
    and input gradients."""
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    runs = []
    for n in lengths:
        results = []
        for run in (fn, compiled):
            inputs = [t.detach().requires_grad_() for t in inputs_of(n)]
            out = run(*inputs)
            out.float().square().sum().backward()
            results.append((out.detach(), [t.grad for t in inputs]))
        runs.append((n, *results))
    return counter, runs


def test_sdpa_compiles_once_for_every_length():
    def inputs_of(n):
        generator = torch.Generator(device="cuda").manual_seed(n)
        return [torch.randn(2, 4, n, 64, device="cuda", dtype=DTYPE, generator=generator) for _ in range(3)]

    def attention(q, k, v):
        return sdpa(q, k, v, causal=True)

    counter, runs = eager_and_compiled(attention, inputs_of, (136, 264, 392, 776))
    assert counter.frame_count == 1, counter.frame_count
    for n, (eager, eager_grads), (compiled, compiled_grads) in runs:
        assert torch.equal(compiled, eager), n  # the same forward plan on the same inputs
        for a, b in zip(compiled_grads, eager_grads):
            torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)
        q, k, v = inputs_of(n)
        torch.testing.assert_close(compiled, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=2e-2, rtol=2e-2)


def test_the_block_compiles_once_for_every_length():
    torch.manual_seed(0)
    block = TransformerBlock(128, 2, mlp_ratio=2, device="cuda", dtype=DTYPE)

    def inputs_of(n):
        generator = torch.Generator(device="cuda").manual_seed(n)
        return [torch.randn(2, n, 128, device="cuda", dtype=DTYPE, generator=generator)]

    counter, runs = eager_and_compiled(block, inputs_of, (24, 40, 136, 264))
    assert counter.frame_count == 1, counter.frame_count
    for n, (eager, eager_grads), (compiled, compiled_grads) in runs:
        assert compiled.shape == (2, n, 128)
        # inductor fuses the residual adds and casts around the library's calls, so compare by value
        torch.testing.assert_close(compiled, eager, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(compiled_grads[0], eager_grads[0], atol=5e-2, rtol=5e-2)
