"""Train a TransformerBlock on cuDNN graphs under torch.compile, side by side with torch.

    python examples/transformer_block.py [--steps 5] [--backend inductor] [--dtype bf16]

Two copies of one pre-norm block with the same initial parameters: the cuDNN one
(every matmul, norm and attention a cuDNN graph, forward and backward, compiled
with ``torch.compile(fullgraph=True)``) and its plain-torch reference (eager). Both
take the same SGD steps on the same batches; the loss of each step must agree
within the tolerance of the dtype (the two round differently, so they drift apart
slowly; a few steps stay well inside it).
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from _check import LOSS_RTOL, require_cuda

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def step(model, optimizer, x, target) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x).float(), target)
    loss.backward()
    optimizer.step()
    return loss.item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend for the cuDNN block")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    require_cuda("transformer_block")
    from torch_cudnn_handle.nn import TransformerBlock, reference_of

    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    block = TransformerBlock(args.dim, args.heads, mlp_ratio=4, device="cuda", dtype=dtype)
    reference = reference_of(block)  # same initial parameters, plain torch
    compiled = torch.compile(block, fullgraph=True, backend=args.backend)
    optimizers = [torch.optim.SGD(m.parameters(), lr=args.lr) for m in (block, reference)]

    batches = [
        (torch.randn(args.batch, args.seq, args.dim, device="cuda", dtype=dtype), torch.randn(args.batch, args.seq, args.dim, device="cuda"))
        for _ in range(args.steps)
    ]
    print(f"TransformerBlock(dim={args.dim}, heads={args.heads}) {args.dtype}, batch {args.batch}x{args.seq}, "
          f"cuDNN block compiled with backend={args.backend!r} (the first step compiles)")
    rtol, failures = LOSS_RTOL[dtype], 0
    for i, (x, target) in enumerate(batches):
        loss = step(compiled, optimizers[0], x, target)
        loss_ref = step(reference, optimizers[1], x, target)
        error = abs(loss - loss_ref)
        ok = error <= rtol * abs(loss_ref)
        failures += not ok
        print(f"{'OK      ' if ok else 'MISMATCH'} step {i + 1}/{args.steps}: loss cuDNN {loss:.5f}, torch {loss_ref:.5f}, "
              f"max abs err {error:.3e} (tol {rtol * abs(loss_ref):.3e})")
    print(f"{args.steps - failures}/{args.steps} steps OK" + (f", {failures} MISMATCH" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
