"""Serve requests from a thread pool through one cuDNN TransformerBlock.

    python examples/threaded_inference.py [--workers 8] [--requests 64]

A ``concurrent.futures.ThreadPoolExecutor`` runs each request (one sequence)
through a shared ``TransformerBlock`` on the worker's own CUDA stream. Nothing is
set up per thread: the first call on a worker takes a cuDNN handle from the pool
(bound to that thread's device, context and current stream); the graphs were built
once, by whichever request came first. Every result is checked against the
plain-torch reference, and the pool's handle counts are printed before and after.
"""

import argparse
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from _check import Checker, require_cuda


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args(argv)
    require_cuda("threaded_inference")
    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import TransformerBlock, reference_of

    dtype, dim = torch.bfloat16, 256
    torch.manual_seed(0)
    block = TransformerBlock(dim, 4, mlp_ratio=4, device="cuda", dtype=dtype).eval()
    reference = reference_of(block).float().eval()
    requests = [torch.randn(1, args.seq, dim, dtype=dtype) for _ in range(args.requests)]  # on the host, as a server gets them
    torch.cuda.synchronize()  # the parameters are written before any worker stream reads them
    print("pool before:", tch.stats.pool())

    local = threading.local()

    def serve(x_host: torch.Tensor):
        if not hasattr(local, "stream"):
            local.stream = torch.cuda.Stream()  # each worker launches on a stream of its own
        with torch.inference_mode(), torch.cuda.stream(local.stream):
            return threading.get_ident(), block(x_host.to("cuda")).cpu()  # .cpu() waits for this stream only

    with ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="serve") as pool:
        answers = list(pool.map(serve, requests))
    print("pool after: ", tch.stats.pool())
    print(f"{len(requests)} requests served by {len({ident for ident, _ in answers})} worker threads "
          f"({args.workers} in the pool); graph registry: {tch.stats.graphs()}")

    checker = Checker()
    with torch.no_grad():
        for i, (x_host, (_, y)) in enumerate(zip(requests, answers)):
            checker.check(f"request {i}", y, reference(x_host.cuda().float()).cpu(), dtype, verbose=False)
    _, label, error, tolerance = checker.worst
    print(f"worst: {label}: max abs err {error:.3e} (tol {tolerance:.3e})")
    return checker.exit_code()


if __name__ == "__main__":
    sys.exit(main())
