"""FusedLinear, forward and backward, against torch.

    python examples/fused_linear.py

``FusedLinear(in, out, activation)`` is an ``nn.Module`` whose forward is one
cuDNN graph (matmul + bias + activation) and whose backward is three (the
activation's backward, dX, dW). Here it is checked, for each activation and
fp16/bf16, against its plain-torch reference in float32 with the same parameters.
"""

import sys

import torch

from _check import Checker, require_cuda


def main() -> int:
    require_cuda("fused_linear")
    from torch_cudnn_handle.nn import FusedLinear, reference_of

    checker = Checker()
    for dtype in (torch.float16, torch.bfloat16):
        for activation in ("relu", "gelu", None):
            torch.manual_seed(0)
            layer = FusedLinear(256, 512, activation=activation, device="cuda", dtype=dtype)
            reference = reference_of(layer).float()  # same parameters, float32 torch
            x = torch.randn(4, 128, 256, device="cuda", dtype=dtype, requires_grad=True)
            x_ref = x.detach().float().requires_grad_()
            dy = torch.randn(4, 128, 512, device="cuda", dtype=dtype)

            y = layer(x)
            y.backward(dy)
            y_ref = reference(x_ref)
            y_ref.backward(dy.float())

            label = f"{activation or 'identity'} {str(dtype).replace('torch.', '')}"
            checker.check(f"{label} y", y, y_ref, dtype)
            checker.check(f"{label} dx", x.grad, x_ref.grad, dtype)
            checker.check(f"{label} dweight", layer.weight.grad, reference.weight.grad, dtype)
            checker.check(f"{label} dbias", layer.bias.grad, reference.bias.grad, dtype)
    return checker.exit_code()


if __name__ == "__main__":
    sys.exit(main())
