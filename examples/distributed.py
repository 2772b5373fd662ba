"""Train TransformerBlocks on cuDNN graphs on several GPUs, with DDP and with FSDP2, under torch.compile.

    torchrun --nproc-per-node=2 examples/distributed.py [--steps 4] [--backend inductor]
    python examples/distributed.py        # one process, one GPU (world size 1)

Every rank builds the same model (same seed): ``--layers`` ``TransformerBlock``s, every
matmul, norm and attention a cuDNN graph, and beside it the same blocks in plain torch
(``reference_of``, same initial parameters). Each rank trains on its own batches
(deterministic, different per rank), and the two models are trained the same way:

* DDP: ``DistributedDataParallel(torch.compile(model, fullgraph=True))``;
* FSDP2: each block compiled (``fullgraph=True``), then ``fully_shard`` on each block and
  on the root.

The loss of each step, averaged over the ranks, must agree between the two models within
the tolerance of the dtype; with DDP and more than one rank the replicas must also end
bitwise equal on every rank (their gradients were averaged). Rank 0 prints one ``OK`` or
``MISMATCH`` line per check; every rank exits 1 on a mismatch. Without a GPU: a ``SKIP``
line and exit 0. NVLink multicast (NVLS) is off unless ``NCCL_NVLS_ENABLE`` says otherwise.
"""

import argparse
import os
import socket
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # read by NCCL when the process group starts

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from _check import LOSS_RTOL, require_cuda

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def init_distributed() -> tuple:
    """Start the NCCL process group (torchrun's environment, or a group of one for a
    plain ``python`` launch) on this rank's GPU; ``(rank, world_size, device)``."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank >= torch.cuda.device_count():
        raise SystemExit(f"distributed: local rank {local_rank} has no GPU (this machine has {torch.cuda.device_count()}): "
                         f"start at most {torch.cuda.device_count()} processes per node (torchrun --nproc-per-node)")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def build_models(args, dtype, device) -> tuple:
    """``(cuDNN model, torch model)``: ``args.layers`` blocks each, the same initial
    parameters, and the same on every rank (same seed)."""
    from torch_cudnn_handle.nn import TransformerBlock, reference_of

    torch.manual_seed(0)
    blocks = [TransformerBlock(args.dim, args.heads, mlp_ratio=4, device=device, dtype=dtype) for _ in range(args.layers)]
    return nn.Sequential(*blocks), nn.Sequential(*(reference_of(block) for block in blocks))


def rank_batches(args, rank: int, dtype, device) -> list:
    """This rank's ``(input, target)`` batches: deterministic, different on each rank."""
    generator = torch.Generator().manual_seed(1000 + rank)
    shape = (args.batch, args.seq, args.dim)
    return [
        (torch.randn(shape, generator=generator).to(device, dtype), torch.randn(shape, generator=generator).to(device))
        for _ in range(args.steps)
    ]


def wrap_ddp(model: nn.Module, backend: str) -> nn.Module:
    # The model is compiled, then wrapped: DDP's own forward (its logger, its hooks)
    # does not trace, so a fullgraph=True compile of the DDP module fails. The model is
    # compiled on its first call, inside DDP's forward, where dynamo sees the active DDP
    # module and hands the captured graph to its DDPOptimizer
    # (torch._dynamo.config.optimize_ddp, on by default): the graph is split at DDP's
    # gradient-bucket boundaries, so a bucket's all-reduce starts while the backward of
    # earlier layers still runs. Several compiled subgraphs are expected; the capture
    # itself is whole (fullgraph=True, no graph break).
    return DistributedDataParallel(torch.compile(model, fullgraph=True, backend=backend))


def wrap_fsdp(model: nn.Sequential, backend: str) -> nn.Module:
    # Each block is compiled, then sharded (the order torchtitan uses): FSDP2's
    # all-gather and reduce-scatter hooks sit on the compiled module and run eagerly
    # around its graph, so each block's graph is whole (fullgraph=True) and sees
    # unsharded parameters. A fullgraph compile of the whole sharded model fails instead:
    # FSDP2's hooks are disabled for dynamo, so tracing reaches a skipped function.
    for index, block in enumerate(model):
        model[index] = torch.compile(block, fullgraph=True, backend=backend)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model


def train(model: nn.Module, batches: list, lr: float) -> list:
    """SGD on this rank's batches; the loss of each step averaged over the ranks."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, target in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x).float(), target)
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # a sum (gloo has no AVG; one formula for every backend)
        losses.append(total.item() / dist.get_world_size())
    return losses


def compare_losses(label: str, losses: list, reference_losses: list, rtol: float, say) -> int:
    """One line per step; the number of mismatches."""
    failures = 0
    for step, (loss, loss_ref) in enumerate(zip(losses, reference_losses), 1):
        error, tolerance = abs(loss - loss_ref), rtol * abs(loss_ref)
        ok = error <= tolerance
        failures += not ok
        say(f"{'OK      ' if ok else 'MISMATCH'} {label} step {step}/{len(losses)}: loss cuDNN {loss:.5f}, torch {loss_ref:.5f}, "
            f"max abs err {error:.3e} (tol {tolerance:.3e})")
    return failures


def replica_spread(model: nn.Module) -> float:
    """The largest difference between this rank's parameters and rank 0's, over all ranks."""
    flat = torch.cat([parameter.detach().float().flatten() for parameter in model.parameters()])
    rank0 = flat.clone()
    dist.broadcast(rank0, src=0)
    spread = (flat - rank0).abs().max()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return spread.item()


def run_ddp(args, dtype, device, batches, say) -> int:
    model, reference = build_models(args, dtype, device)
    losses = train(wrap_ddp(model, args.backend), batches, args.lr)
    reference_losses = train(wrap_ddp(reference, args.backend), batches, args.lr)
    failures = compare_losses("DDP", losses, reference_losses, LOSS_RTOL[dtype], say)
    if dist.get_world_size() > 1:
        spread = replica_spread(model)
        failures += spread != 0
        say(f"{'OK      ' if spread == 0 else 'MISMATCH'} DDP replicas equal on all ranks: max abs difference {spread:.3e} (tol 0)")
    return failures


def run_fsdp(args, dtype, device, batches, say) -> int:
    model, reference = build_models(args, dtype, device)
    losses = train(wrap_fsdp(model, args.backend), batches, args.lr)
    reference_losses = train(wrap_fsdp(reference, args.backend), batches, args.lr)
    return compare_losses("FSDP2", losses, reference_losses, LOSS_RTOL[dtype], say)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of both models")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    require_cuda("distributed")

    rank, world_size, device = init_distributed()
    say = print if rank == 0 else (lambda *_: None)
    try:
        dtype = DTYPES[args.dtype]
        batches = rank_batches(args, rank, dtype, device)
        say(f"{args.layers} x TransformerBlock(dim={args.dim}, heads={args.heads}) {args.dtype} on {world_size} GPU(s), "
            f"batch {args.batch}x{args.seq} per rank, both models compiled with backend={args.backend!r} (the first step compiles)")
        failures = run_ddp(args, dtype, device, batches, say) + run_fsdp(args, dtype, device, batches, say)
        checks = 2 * args.steps + (world_size > 1)
        say(f"{checks - failures}/{checks} checks OK" + (f", {failures} MISMATCH" if failures else ""))
        return 1 if failures else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
