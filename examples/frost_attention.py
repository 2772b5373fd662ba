"""Head-dim-512 causal attention on a frost engine, through ``torch.ops.cudnn_fe.execute``.

    python examples/frost_attention.py

No cuDNN backend engine serves head dim 512; the cuDNN frontend's frost engines (its
JIT-compiled CuTe DSL engines; ``sdpa_fwd_prefill_sm90`` on Hopper) do. The graph is
registered once and built per device on first use, inside ``build_scope`` of the
inputs' device (the first call pays the JIT compile, seconds). Prints which engine
served each build and how long the first call took, and checks the output against
float32 ``F.scaled_dot_product_attention(is_causal=True)``: on cuda:0, and on cuda:1
from a thread whose current device is cuda:0 when there are two GPUs.

Needs a GPU and the CuTe DSL (``nvidia-cutlass-dsl`` with its CUDA libraries); skips
(exit 0) without them.
"""

import sys
import time

import torch
import torch.nn.functional as F

from _check import Checker, require_cuda

B, H, S, D = 2, 4, 256, 512
DTYPE = torch.bfloat16


def require_cute_dsl(example: str) -> None:
    """Exit 0 with a SKIP line when the CuTe DSL, which frost engines compile with, is missing."""
    try:
        import cutlass  # noqa: F401
    except Exception as error:  # noqa: BLE001 -- ImportError, or its CUDA libraries failing to load
        print(
            f"SKIP {example}: the CuTe DSL (nvidia-cutlass-dsl with its CUDA libs) is not installed, so frost engines "
            f"cannot build ({type(error).__name__}: {error})"
        )
        sys.exit(0)


def causal_sdpa_inference(graph, q, k, v):
    """The package's inference sdpa graph (``nn.attention.sdpa_inference_forward``), causal."""
    from torch_cudnn_handle.nn.attention import sdpa_inference_forward

    return sdpa_inference_forward(graph, q, k, v, causal=True)


def check_engine(checker: Checker, label: str, engine: str) -> None:
    """One OK/MISMATCH line for the engine that served the graph: a frost one is expected."""
    checker.checks += 1
    if engine.startswith("frost:"):
        print(f"OK       {label}: engine {engine}")
    else:
        checker.failures += 1
        print(f"MISMATCH {label}: engine {engine}, expected a frost engine (frost:...)")


def main() -> int:
    require_cuda("frost_attention")
    require_cute_dsl("frost_attention")
    import torch_cudnn_handle as tch

    graph_id = tch.register_graph(causal_sdpa_inference, name="frost_causal_sdpa_d512")
    checker = Checker()
    for device in range(min(torch.cuda.device_count(), 2)):
        torch.manual_seed(device)
        q, k, v = (torch.randn(B, H, S, D, dtype=DTYPE, device=f"cuda:{device}") for _ in range(3))
        torch.cuda.synchronize(device)
        label = f"causal d{D} {str(DTYPE).replace('torch.', '')} cuda:{device}"
        start = time.perf_counter()
        try:
            with torch.cuda.device(0):  # cuda:1's graph is built and run from cuda:0, scoped to cuda:1
                (o,) = torch.ops.cudnn_fe.execute(graph_id, [q, k, v])
            torch.cuda.synchronize(device)
        except Exception as error:  # noqa: BLE001 -- reported as a failed check, with the frontend's reason
            checker.checks += 1
            checker.failures += 1
            print(f"MISMATCH {label}: the graph did not build or run: {type(error).__name__}: {error}")
            continue
        first_call_s = time.perf_counter() - start
        (built,) = [b for b in tch.built_graphs(graph_id) if b.device == device]
        print(f"cuda:{device}: engine {built.engine}, build time (first call) {first_call_s:.2f} s, {built.path_reason}")
        check_engine(checker, f"{label} engine", built.engine)
        o_ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        checker.check(f"{label} o", o, o_ref, DTYPE)
        # A second call reuses the built graph.
        (again,) = torch.ops.cudnn_fe.execute(graph_id, [q, k, v])
        checker.check(f"{label} o, second call", again, o_ref, DTYPE)
    print(f"registry: {tch.stats.graphs()['engines']}")
    return checker.exit_code()


if __name__ == "__main__":
    sys.exit(main())
