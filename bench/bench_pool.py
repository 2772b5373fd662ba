"""Host cost of getting a ready handle, and of a frontend execute through it, against
the pattern the frontend's own torch ops use: a per-thread dict of handles by device
plus ``cudnn.set_stream(h, torch.cuda.current_stream(d).cuda_stream)`` per call.

    python bench/bench_pool.py [--json out.json]
"""

import argparse
import threading

import cudnn
import torch

import torch_cudnn_handle as tch
from timing import compare, report, require_cuda_gpu, save

_frontend_pattern_handles = threading.local()


def frontend_pattern_handle(device: int = 0):
    """What cudnn's torch ops do: a threading.local dict per device, set_stream each call."""
    by_device = getattr(_frontend_pattern_handles, "by_device", None)
    if by_device is None:
        by_device = _frontend_pattern_handles.by_device = {}
    handle = by_device.get(device)
    if handle is None:
        handle = by_device[device] = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream(device).cuda_stream)
    return handle


def matmul_graph(handle, a, b):
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    A, B = graph.tensor_like(a), graph.tensor_like(b)
    C = graph.matmul(A, B)
    C.set_output(True).set_data_type(cudnn.data_type.HALF)
    graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return graph, (A.uid, B.uid, C.uid)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json")
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args(argv)
    require_cuda_gpu(__file__)

    rows = []
    figures = compare(
        {
            "frontend pattern (dict + set_stream(current_stream()))": frontend_pattern_handle,
            "tch.current_handle()": tch.current_handle,
            "tch.current_handle(0)": lambda: tch.current_handle(0),
        },
        calls=args.calls,
    )
    rows += report("getting a ready handle", figures, "frontend pattern (dict + set_stream(current_stream()))")
    print(f"\ncurrent_handle(): {figures['tch.current_handle()']:.3f} us per call (goal: under 1 us)")

    a = torch.randn(1, 16, 16, device="cuda", dtype=torch.float16)
    b = torch.randn(1, 16, 16, device="cuda", dtype=torch.float16)
    c = torch.empty(1, 16, 16, device="cuda", dtype=torch.float16)
    with tch.build_scope(0) as handle:
        graph, uids = matmul_graph(handle, a, b)
    buffers = [a, b, c]
    workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")
    figures = compare(
        {
            "frontend pattern + execute": lambda: graph.execute(buffers, workspace, handle=frontend_pattern_handle(0), tensor_uids=uids),
            "current_handle() + execute": lambda: graph.execute(buffers, workspace, handle=tch.current_handle(), tensor_uids=uids),
        },
        calls=args.calls,
    )
    rows += report("frontend ordered execute of a 1x16x16 matmul", figures, "frontend pattern + execute",
                   {"current_handle() + execute": 0.7})
    torch.testing.assert_close(c, torch.matmul(a, b))
    save(rows, args.json)


if __name__ == "__main__":
    main()
