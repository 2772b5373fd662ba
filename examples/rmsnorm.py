"""RMSNorm, forward and backward, against torch.

    python examples/rmsnorm.py

``RMSNorm(dim, eps)`` runs the frontend's rmsnorm node (training phase, which also
writes 1/rms per row) and one rmsnorm_backward graph for dX and dScale. Checked for
fp16 and bf16 against its float32 plain-torch reference with the same scale.
"""

import sys

import torch

from _check import Checker, require_cuda


def main() -> int:
    require_cuda("rmsnorm")
    from torch_cudnn_handle.nn import RMSNorm, reference_of

    checker = Checker()
    for dtype in (torch.float16, torch.bfloat16):
        for dim in (1024, 4096):
            torch.manual_seed(0)
            norm = RMSNorm(dim, eps=1e-5, device="cuda", dtype=dtype)
            with torch.no_grad():
                norm.weight.uniform_(0.5, 1.5)  # a scale that is not all ones, so dScale and the product are checked
            reference = reference_of(norm).float()
            x = (torch.randn(4, 128, dim, device="cuda") * 3).to(dtype).requires_grad_()
            x_ref = x.detach().float().requires_grad_()
            dy = torch.randn(4, 128, dim, device="cuda", dtype=dtype)

            y = norm(x)
            y.backward(dy)
            y_ref = reference(x_ref)
            y_ref.backward(dy.float())

            label = f"dim {dim} {str(dtype).replace('torch.', '')}"
            checker.check(f"{label} y", y, y_ref, dtype)
            checker.check(f"{label} dx", x.grad, x_ref.grad, dtype)
            checker.check(f"{label} dweight", norm.weight.grad, reference.weight.grad, dtype)
    return checker.exit_code()


if __name__ == "__main__":
    sys.exit(main())
