"""The op adds no GPU work: for GPU-bound graphs, GPU time per call of
``torch.ops.cudnn_fe.execute`` against the frontend's own ``graph.execute`` of the SAME
built plan (the registry's ``BuiltGraph``: its ``graph``, ``uids`` and ``workspace_size``,
executed as ``op.py``'s ``_launch`` does, on the pooled handle), side by side.

    python bench/gpu_work.py [--quick] [--json out.json]

Per graph: GPU ms per call (CUDA events around N back-to-back calls, the median of
interleaved rounds) and the ratio op / frontend execute; and what each launches
(torch.profiler, CUDA activity: every kernel, memset and copy, with device time).
The frontend execute gets preallocated outputs and workspace, so any allocation,
memset or extra launch of the op shows. Graphs: an 8x2048x2048 fp16 matmul and the
``FusedLinear(4096, 4096, 'gelu')`` forward graph on x [8192, 4096] bf16.
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # timing

_MATMUL = None


def _matmul_graph_id() -> int:
    global _MATMUL
    if _MATMUL is None:
        import torch_cudnn_handle as tch

        _MATMUL = tch.register_graph(lambda graph, a, b: graph.matmul(a, b, name="mm"), name="gpu_work_matmul")
    return _MATMUL


def _cases():
    """(label, graph id, op inputs) of each graph."""
    import torch

    from torch_cudnn_handle.nn.linear import LINEAR_GRAPHS

    torch.manual_seed(0)
    a = torch.randn(8, 2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(8, 2048, 2048, device="cuda", dtype=torch.float16)
    yield "matmul [8, 2048, 2048] @ [8, 2048, 2048] fp16", _matmul_graph_id(), [a, b]
    # The FusedLinear forward's operands exactly as FusedLinear.forward passes them.
    rows, k, n = 8192, 4096, 4096
    x = torch.randn(1, rows, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    yield f"linear + bias + gelu x [{rows}, {k}] -> {n} bf16 (FusedLinear graph)", LINEAR_GRAPHS["gelu"], [x, weight, bias]


def _kernels_text(kernels: Dict[str, tuple]) -> str:
    return "; ".join(f"{count:g}x {us:.1f} us {name[:60]}" for name, (count, us) in kernels.items())


def measure(label: str, graph_id: int, inputs: List[object], calls: int, rounds: int) -> dict:
    import torch

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.registry import TensorSpec
    from timing import compare_cuda_ms, device_kernels

    execute = torch.ops.cudnn_fe.execute.default
    with torch.no_grad():
        op_outputs = execute(graph_id, inputs)  # builds the graph (and its native plan) once
    specs = tuple(TensorSpec.of(t) for t in inputs)
    built = next(b for b in tch.built_graphs(graph_id) if b.inputs == specs and b.device == inputs[0].device.index)
    device = inputs[0].device
    outputs = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device) for s in built.layout.outputs]
    workspace = torch.empty(built.workspace_size, dtype=torch.uint8, device=device) if built.workspace_size else None
    handle = tch.current_handle(built.device)  # the pooled handle, on the current stream
    buffers = [*inputs, *outputs]

    def frontend_execute():
        built.graph.execute(buffers, workspace, handle=handle, tensor_uids=built.uids)

    def op():
        execute(graph_id, inputs)

    frontend_execute()
    torch.cuda.synchronize()
    same = all(torch.equal(x, y) for x, y in zip(op_outputs, outputs))
    candidates = {"torch.ops.cudnn_fe.execute": op, "frontend graph.execute, same plan": frontend_execute}
    with torch.no_grad():
        figures = compare_cuda_ms(candidates, calls=calls, rounds=rounds, warmup=5)
        kernels = {name: device_kernels(fn, steps=10, warmup=2)[0] for name, fn in candidates.items()}
    ratio = figures["torch.ops.cudnn_fe.execute"] / figures["frontend graph.execute, same plan"]
    same_kernels = {name: count for name, (count, _) in kernels["torch.ops.cudnn_fe.execute"].items()} == {
        name: count for name, (count, _) in kernels["frontend graph.execute, same plan"].items()
    }
    print(f"\n### {label}: the op's GPU work against the frontend's execute of the same plan\n")
    print(f"graph {graph_id}: native={built.native} ({built.path_reason}), workspace {built.workspace_size} B; "
          f"outputs bitwise equal: {same}")
    print("| candidate | GPU ms/call | ratio to frontend execute | GPU ops per call |")
    print("| --- | ---: | ---: | --- |")
    for name, ms in figures.items():
        print(f"| {name} | {ms:.4f} | {ms / figures['frontend graph.execute, same plan']:.3f}x | {_kernels_text(kernels[name])} |")
    print(f"same GPU ops per call: {same_kernels}", flush=True)
    return dict(
        graph=label,
        graph_id=graph_id,
        native=built.native,
        path_reason=built.path_reason,
        workspace_bytes=built.workspace_size,
        op_ms=figures["torch.ops.cudnn_fe.execute"],
        frontend_ms=figures["frontend graph.execute, same plan"],
        ratio=ratio,
        op_kernels={name: list(v) for name, v in kernels["torch.ops.cudnn_fe.execute"].items()},
        frontend_kernels={name: list(v) for name, v in kernels["frontend graph.execute, same plan"].items()},
        same_kernels=same_kernels,
        outputs_equal=same,
        calls=calls,
        rounds=rounds,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds: a smoke run")
    parser.add_argument("--calls", type=int, default=None, help="calls per timed block (default 100, --quick 10)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, --quick 3)")
    args = parser.parse_args(argv)

    from timing import require_cuda_gpu, save

    require_cuda_gpu(__file__)

    calls = args.calls or (10 if args.quick else 100)
    rounds = args.rounds or (3 if args.quick else 7)
    rows = [measure(label, graph_id, inputs, calls, rounds) for label, graph_id, inputs in _cases()]
    save(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
