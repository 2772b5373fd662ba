"""A model compiled twice, as it is and lowered (torch_cudnn_handle.lowering), and the check
that the two agree: what the lowering's tests compare."""

import copy

import torch

from torch_cudnn_handle import lowering


def compiled_pair(model, inner="aot_eager", device="cpu", **compile_options):
    """``model`` in bf16 on ``device``, compiled by ``inner`` as it is (a copy) and lowered:
    (the model, the plain compile, the lowered compile)."""
    torch.manual_seed(0)
    model = model.to(device=device, dtype=torch.bfloat16)
    plain = torch.compile(copy.deepcopy(model), backend=inner, fullgraph=True, **compile_options)
    lowered = torch.compile(model, backend=lowering.backend(inner), fullgraph=True, **compile_options)
    return model, plain, lowered


def outputs_and_gradients(compiled, model, x):
    """``compiled(x)`` and the gradients of a loss on it for x (where floating) and the parameters."""
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    y = compiled(x)
    y = getattr(y, "logits", y)  # a transformers model's output
    grads = torch.autograd.grad(y.float().square().sum(), [x] * x.requires_grad + list(model.parameters()), allow_unused=True)
    return y, [g for g in grads if g is not None]


def assert_agree(plain, lowered, plain_model, model, x):
    """Outputs and gradients (the input's, the parameters') of the two compiles agree within
    bf16's numerics: outputs elementwise, gradients relative to each one's largest entry."""
    y0, g0 = outputs_and_gradients(plain, plain_model, x)
    y1, g1 = outputs_and_gradients(lowered, model, x)
    torch.testing.assert_close(y1.float(), y0.float(), rtol=2e-2, atol=3e-2)
    for a, b in zip(g1, g0):
        scale = float(b.float().abs().max()) or 1.0
        torch.testing.assert_close(a.float() / scale, b.float() / scale, rtol=0, atol=3e-2)
