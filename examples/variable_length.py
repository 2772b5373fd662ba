"""Train over 200 distinct sequence lengths, every step checked against torch.

    python examples/variable_length.py [--lengths 200] [--dim 128] [--heads 2] [--batch 2]

A small model: causal self-attention (``tch.nn.Attention``: four ``FusedLinear``
projections around cuDNN sdpa) with a residual, mean-pooled over the sequence, then a
``FusedLinear`` gelu head. Each training step takes a batch of a length never seen
before (lengths drawn without repeats from 16..1023, in random order, as a generation
or packing loop meets them), so every step builds the attention's graphs for that length
(the projections' forward, dX and dW products, sdpa forward and backward); the head
sees a fixed shape and builds once.

Each step is checked against the same model in float32 torch (``reference_of``) holding
the same parameters (copied from the cuDNN model before the step): the loss within the
dtype's loss tolerance and every parameter's gradient within the gradient tolerance
(``_check.py``). Prints a line every 50 steps, then the total build seconds
(``stats.graphs()``: time spent obtaining graphs), where they went by phase, and how
many graphs each route served (with the plan store on, a second run loads what the first
built). Exits 1 on a mismatch; prints SKIP and exits 0 without a GPU.
"""

import argparse
import random
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from _check import LOSS_RTOL, Checker, require_cuda

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class PooledAttention(nn.Module):
    """``head(mean_S(x + attention(x)))``; works with the cuDNN modules and their references alike."""

    def __init__(self, attention: nn.Module, head: nn.Module):
        super().__init__()
        self.attention, self.head = attention, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(x)
        return self.head(h.mean(dim=1, keepdim=True))  # [B, 1, dim]: the head's shape never changes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, default=200, help="distinct sequence lengths, one training step each")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    if not 1 <= args.lengths <= 1008:
        parser.error(f"--lengths must be 1..1008 (distinct lengths in 16..1023), got {args.lengths}")
    require_cuda("variable_length")
    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import Attention, FusedLinear, reference_of

    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    model = PooledAttention(
        Attention(args.dim, args.heads, causal=True, device="cuda", dtype=dtype),
        FusedLinear(args.dim, args.dim, activation="gelu", device="cuda", dtype=dtype),
    )
    reference = PooledAttention(reference_of(model.attention), reference_of(model.head)).float()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    lengths = random.Random(0).sample(range(16, 1024), args.lengths)
    print(f"PooledAttention(dim={args.dim}, heads={args.heads}) {args.dtype}, batch {args.batch}, "
          f"{len(lengths)} distinct lengths {min(lengths)}..{max(lengths)}")

    checker, loss_failures = Checker(), 0
    stats_before = tch.stats.graphs()
    started = time.perf_counter()
    for step, length in enumerate(lengths, start=1):
        x = torch.randn(args.batch, length, args.dim, device="cuda", dtype=dtype)
        target = torch.randn(args.batch, 1, args.dim, device="cuda")
        reference.load_state_dict(model.state_dict())  # the same parameters, in float32
        reference.zero_grad(set_to_none=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x).float(), target)
        loss.backward()
        loss_ref = F.mse_loss(reference(x.float()), target)
        loss_ref.backward()

        error, tolerance = abs(loss.item() - loss_ref.item()), LOSS_RTOL[dtype] * abs(loss_ref.item())
        if error > tolerance:
            loss_failures += 1
            print(f"MISMATCH step {step} (length {length}) loss: cuDNN {loss.item():.5f}, torch {loss_ref.item():.5f}")
        for (name, parameter), expected in zip(model.named_parameters(), reference.parameters()):
            checker.check(f"step {step} (length {length}) grad {name}", parameter.grad, expected.grad, dtype, verbose=False)
        optimizer.step()
        if step % 50 == 0 or step == len(lengths):
            torch.cuda.synchronize()
            print(f"step {step}/{len(lengths)} (length {length}): loss cuDNN {loss.item():.5f}, torch {loss_ref.item():.5f}, "
                  f"{time.perf_counter() - started:.1f} s")
    torch.cuda.synchronize()
    wall = time.perf_counter() - started

    stats = tch.stats.graphs()
    plan_seconds = stats["plan_seconds"] - stats_before["plan_seconds"]
    phases = {p: s - stats_before["phase_seconds"].get(p, 0.0) for p, s in stats["phase_seconds"].items()}
    routes = {r: n - stats_before["plan_sources"].get(r, 0) for r, n in stats["plan_sources"].items()}
    print(f"{len(lengths)} steps in {wall:.1f} s; total build seconds {plan_seconds:.2f} "
          f"({sum(routes.values())} graphs obtained: {', '.join(f'{n} {r}' for r, n in sorted(routes.items()))})")
    print("  by phase, s: " + ", ".join(f"{p} {s:.2f}" for p, s in sorted(phases.items(), key=lambda item: -item[1])))
    print(f"  worst gradient: {checker.worst[1]} at {checker.worst[0]:.2f} of its tolerance")
    if loss_failures:
        print(f"{loss_failures} step losses MISMATCH")
    return max(checker.exit_code(), 1 if loss_failures else 0)


if __name__ == "__main__":
    sys.exit(main())
