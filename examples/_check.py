"""What every example shares: skip cleanly without a GPU, and check numbers against torch.

``Checker.check`` prints one ``OK`` or ``MISMATCH`` line per comparison with the
maximum absolute error and the tolerance it was held to; an example's exit status
is ``Checker.exit_code()``: 0 when everything matched, 1 otherwise.

Tolerance: ``max|actual - expected| <= atol + rtol * max|expected|``, the expected
values being float32 torch on the same (fp16/bf16-rounded) inputs and parameters.
"""

from __future__ import annotations

import sys

import torch

# (atol, rtol) per dtype of the cuDNN side: a few units in the last place of the
# output format, relative to the largest expected value.
TOLERANCE = {torch.float16: (5e-3, 1e-2), torch.bfloat16: (1e-2, 3e-2), torch.float32: (1e-4, 1e-3)}

# Relative tolerance of a training loss per dtype of the cuDNN model, against the same
# model in torch taking the same steps: the two round differently and drift apart
# slowly; a few steps stay well inside it.
LOSS_RTOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}


def require_cuda(example: str) -> None:
    """Exit 0 with a SKIP line when there is no GPU or the extension has no CUDA."""
    if not torch.cuda.is_available():
        print(f"SKIP {example}: needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
        sys.exit(0)
    import torch_cudnn_handle as tch

    if not tch.with_cuda:
        print(f"SKIP {example}: torch_cudnn_handle was built without CUDA (rebuild it with a CUDA torch installed)")
        sys.exit(0)


class Checker:
    def __init__(self):
        self.failures = 0
        self.checks = 0
        self.worst = (0.0, "", 0.0, 0.0)  # (error / tolerance, label, error, tolerance)

    def check(self, label: str, actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = None, verbose: bool = True) -> bool:
        """Compare ``actual`` with ``expected`` (shapes must match); ``verbose=False``
        prints the line only on a mismatch."""
        atol, rtol = TOLERANCE[dtype or actual.dtype]
        self.checks += 1
        if tuple(actual.shape) != tuple(expected.shape):
            self.failures += 1
            print(f"MISMATCH {label}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
            return False
        actual, expected = actual.detach().float(), expected.detach().float()
        error = (actual - expected).abs().max().item() if actual.numel() else 0.0
        tolerance = atol + rtol * (expected.abs().max().item() if expected.numel() else 0.0)
        ok = error <= tolerance and bool(torch.isfinite(actual).all())
        self.failures += not ok
        self.worst = max(self.worst, (error / tolerance if tolerance else float("inf"), label, error, tolerance))
        if verbose or not ok:
            print(f"{'OK      ' if ok else 'MISMATCH'} {label}: max abs err {error:.3e} (tol {tolerance:.3e})")
        return ok

    def exit_code(self) -> int:
        print(f"{self.checks - self.failures}/{self.checks} checks OK" + ("" if not self.failures else f", {self.failures} MISMATCH"))
        return 1 if self.failures else 0
