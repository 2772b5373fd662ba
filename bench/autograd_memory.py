"""What autograd keeps after one forward: each ``nn`` module against torch's equivalent.

    python bench/autograd_memory.py [--json out.json]

Bytes the CUDA allocator holds after a forward whose autograd graph is alive, beyond
what existed before (inputs, parameters): the outputs plus every tensor saved for
backward. bf16, the input requires grad. torch's equivalents: ``F.rms_norm``;
``act(F.linear(...))``; ``F.scaled_dot_product_attention`` on the cuDNN and flash
backends; the block's plain-torch reference. Nothing here asserts a size.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable, List

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import FusedLinear, RMSNorm, TransformerBlock, reference_of, sdpa
from timing import require_cuda_gpu

MIB = 2**20


def held(forward: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    result = forward()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    del result
    return after - before


def cases():
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8192, 8192, **bf16, requires_grad=True)
    norm = RMSNorm(8192, **bf16)
    yield "RMSNorm 8192x8192", lambda: norm(x), {"F.rms_norm": lambda: F.rms_norm(x, (8192,), norm.weight, norm.eps)}
    rows = torch.randn(16384, 4096, **bf16, requires_grad=True)
    for activation, act in (("relu", F.relu), ("gelu", F.gelu)):
        linear = FusedLinear(4096, 4096, activation=activation, **bf16)
        yield (f"FusedLinear {activation} 16384x4096->4096", lambda linear=linear: linear(rows),
               {"F.linear + act": lambda linear=linear, act=act: act(F.linear(rows, linear.weight, linear.bias))})
    q, k, v = (torch.randn(4, 16, 4096, 128, **bf16, requires_grad=True) for _ in range(3))

    def torch_sdpa(backend):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    yield ("sdpa causal 4x16x4096x128", lambda: sdpa(q, k, v, True),
           {"torch cuDNN": lambda: torch_sdpa(SDPBackend.CUDNN_ATTENTION), "torch flash": lambda: torch_sdpa(SDPBackend.FLASH_ATTENTION)})
    block = TransformerBlock(1024, 16, **bf16)
    reference = reference_of(block)
    tokens = torch.randn(8, 1024, 1024, **bf16, requires_grad=True)
    yield "TransformerBlock(1024, 16) 8x1024", lambda: block(tokens), {"torch reference": lambda: reference(tokens)}


def measure() -> List[dict]:
    rows = []
    for name, library, alternatives in cases():
        held(library)  # first call builds its graphs (and their workspaces) outside the measurement
        row = {"case": name, "library_mib": held(library) / MIB}
        row["torch"] = {label: held(fn) / MIB for label, fn in alternatives.items()}
        rows.append(row)
        print(f"{name:40s} library {row['library_mib']:9.2f} MiB   "
              + "   ".join(f"{label} {mib:9.2f} MiB" for label, mib in row["torch"].items()), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    require_cuda_gpu(__file__)
    rows = measure()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
