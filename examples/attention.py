"""cuDNN sdpa, forward and backward, against ``F.scaled_dot_product_attention``.

    python examples/attention.py

``torch_cudnn_handle.nn.sdpa(q, k, v, causal)`` runs the frontend's sdpa node
(training: it also writes the softmax stats) and, under autograd, one
sdpa_backward graph. Checked for causal and non-causal, fp16 and bf16, on
``[B, H, S, D]`` tensors packed BHSD and on BSHD-strided views (what the
projections of an attention layer give), against float32 torch.
"""

import sys

import torch
import torch.nn.functional as F

from _check import Checker, require_cuda

B, H, S, D = 2, 8, 256, 64


def inputs(layout: str, dtype):
    if layout == "bhsd":
        make = lambda: torch.randn(B, H, S, D, device="cuda", dtype=dtype)  # noqa: E731
    else:  # [B, S, H, D] in memory, seen as [B, H, S, D]
        make = lambda: torch.randn(B, S, H, D, device="cuda", dtype=dtype).transpose(1, 2)  # noqa: E731
    return [make().requires_grad_() for _ in range(3)]


def main() -> int:
    require_cuda("attention")
    from torch_cudnn_handle.nn import sdpa

    checker = Checker()
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            for layout in ("bhsd", "bshd"):
                torch.manual_seed(0)
                q, k, v = inputs(layout, dtype)
                q_ref, k_ref, v_ref = (t.detach().float().requires_grad_() for t in (q, k, v))
                d_o = torch.randn(B, H, S, D, device="cuda", dtype=dtype)

                o = sdpa(q, k, v, causal=causal)
                o.backward(d_o)
                o_ref = F.scaled_dot_product_attention(q_ref, k_ref, v_ref, is_causal=causal)
                o_ref.backward(d_o.float())

                label = f"{'causal' if causal else 'full'} {layout} {str(dtype).replace('torch.', '')}"
                checker.check(f"{label} o", o, o_ref, dtype)
                for name, got, want in (("dq", q.grad, q_ref.grad), ("dk", k.grad, k_ref.grad), ("dv", v.grad, v_ref.grad)):
                    checker.check(f"{label} {name}", got, want, dtype)
    return checker.exit_code()


if __name__ == "__main__":
    sys.exit(main())
