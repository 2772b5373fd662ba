"""Where the host time of one native ``cudnn_fe.execute`` call goes, and which plan the
frontend's heuristics pick, for a 1x16x16 and an 8x1024x1024x1024 fp16 matmul.

1. Each step of the native call timed alone in C++ (``_C._native_breakdown``): pooled
   handle, workspace and output allocation, variant pack, ``cudnnBackendExecute`` with a
   prebuilt pack, and the whole ``NativePlan::execute``.
2. What each candidate launches per call (torch.profiler / CUPTI): kernels, memsets and
   the CUDA runtime and driver calls, for the native op, the frontend's execute with a
   preset handle, ``torch.bmm`` and ``torch.add``.
3. Every plan the heuristics rank for the graph: its name, workspace, and host us per
   frontend execute, side by side.

    python bench/profile_native.py [--plans]
"""

import collections
import sys

import cudnn
import torch
from torch.profiler import ProfilerActivity, profile

import torch_cudnn_handle as tch
from torch_cudnn_handle import _C
from bench_pool import matmul_graph
from timing import compare


def matmul(graph, a, b):
    return graph.matmul(a, b, name="mm")


MATMUL = tch.register_graph(matmul, name="profile_matmul")
PLANS = "--plans" in sys.argv


def launches_per_call(fn, calls=50):
    """{event name: count per call} of the CUDA-side events and runtime/driver calls."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    counts = collections.Counter()
    for event in prof.events():
        name = event.name
        device_side = str(event.device_type).endswith("CUDA")
        if device_side or name.startswith(("cuda", "cu")):
            counts[("gpu: " if device_side else "api: ") + name[:70]] += 1
    return {name: n / calls for name, n in counts.most_common() if n >= calls}


def plans_of(a, b, calls):
    with tch.build_scope(0) as handle:
        graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        A, B = graph.tensor_like(a), graph.tensor_like(b)
        C = graph.matmul(A, B)
        C.set_output(True).set_data_type(cudnn.data_type.HALF)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans(cudnn.build_plan_policy.ALL)
    c = torch.empty(a.shape[0], a.shape[1], b.shape[2], device="cuda", dtype=a.dtype)
    reference = torch.bmm(a, b)
    candidates, rows = {}, []
    for index in range(graph.get_execution_plan_count()):
        try:
            size = graph.get_workspace_size_plan_at_index(index)
            name = graph.get_plan_name_at_index(index)
            workspace = torch.empty(max(size, 1), device="cuda", dtype=torch.uint8)
            pack = {A: a, B: b, C: c}
            handle = tch.current_handle()
            graph.execute_plan_at_index(pack, workspace, index, handle=handle)
            torch.cuda.synchronize()
            ok = torch.allclose(c, reference, atol=5e-2, rtol=5e-2)
        except Exception as error:  # noqa: BLE001 -- a plan that does not build or run is reported
            print(f"  plan {index}: {type(error).__name__}: {str(error)[:120]}")
            continue
        rows.append((index, name, size, ok))
        candidates[f"plan {index}"] = (lambda pack=pack, workspace=workspace, index=index, handle=handle:
                                       graph.execute_plan_at_index(pack, workspace, index, handle=handle))
    figures = compare(candidates, calls=calls, rounds=3) if candidates else {}
    for index, name, size, ok in rows:
        print(f"  plan {index:2d}: {figures[f'plan {index}']:7.2f} us  workspace {size:>10d}  correct={ok}  {name}")


def profile_size(batch, m, k, n, calls):
    print(f"\n## {batch}x{m}x{k} @ {batch}x{k}x{n} fp16")
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(batch, k, n, device="cuda", dtype=torch.float16)
    (c,) = tch.execute(MATMUL, [a, b])
    built = [g for g in tch.built_graphs(MATMUL) if g.inputs[0].shape == tuple(a.shape)][0]
    print(f"selected plan: native={built.native} ({built.path_reason}), workspace {built.workspace_size} bytes")

    with tch.build_scope(0) as handle:
        graph, uids = matmul_graph(handle, a, b)
    workspace = torch.empty(max(graph.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")
    preset = cudnn.create_handle()
    cudnn.set_stream(preset, torch.cuda.current_stream().cuda_stream)

    print("\n### 1. steps of one native call, us (C++ timing)")
    for step, us in _C._native_breakdown(MATMUL, [a, b], [c], calls).items():
        print(f"  {step:32s} {us:10.2f}")
    x = torch.ones(16, device="cuda")
    print("\n### 1b. the same call from Python, side by side (host us per call)")
    figures = compare({
        "tch.execute (pybind entry)": lambda: tch.execute(MATMUL, [a, b]),
        "torch.ops.cudnn_fe.execute.default": lambda: torch.ops.cudnn_fe.execute.default(MATMUL, [a, b]),
        "torch.ops.cudnn_fe.execute.out": lambda: torch.ops.cudnn_fe.execute.out(MATMUL, [a, b], out=[c]),
        "frontend execute, preset handle": lambda: graph.execute([a, b, c], workspace, handle=preset, tensor_uids=uids),
        "torch.bmm": lambda: torch.bmm(a, b),
        "torch.bmm(out=)": lambda: torch.bmm(a, b, out=c),
        "a pybind call (_C.native_plan_count)": _C.native_plan_count,
    }, calls=calls, rounds=5)
    for name, us in figures.items():
        print(f"  {name:40s} {us:8.2f}")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(200):
            tch.execute(MATMUL, [a, b])
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))

    print("\n### 2. per call: GPU work and CUDA API calls (torch.profiler)")
    for label, fn in {
        "tch.execute (native)": lambda: tch.execute(MATMUL, [a, b]),
        "frontend execute, preset handle": lambda: graph.execute([a, b, c], workspace, handle=preset, tensor_uids=uids),
        "torch.bmm": lambda: torch.bmm(a, b),
        "torch.add": lambda: torch.add(x, x),
    }.items():
        print(f"  {label}:")
        for name, per_call in launches_per_call(fn).items():
            print(f"    {per_call:5.2f}  {name}")

    if PLANS:
        print("\n### 3. the ranked plans (frontend execute_plan_at_index, host us per call)")
        plans_of(a, b, calls)
    cudnn.destroy_handle(preset)


def steps_under_threads(a, b, calls):
    """Section 1 again from 1, 4 and 16 threads at once (the seam releases the GIL):
    which step slows down when threads contend."""
    import threading

    print("\n### 4. steps of one native call, us, with N threads running them at once (mean over threads)")
    for threads in (1, 4, 16):
        barrier, results = threading.Barrier(threads), []

        def worker():
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                outs = tch.execute(MATMUL, [a, b])  # this thread's handle and workspace
                barrier.wait()
                results.append(_C._native_breakdown(MATMUL, [a, b], outs, calls))
            stream.synchronize()

        workers = [threading.Thread(target=worker) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        steps = sorted(results[0])
        print(f"  {threads:2d} threads: " + ", ".join(f"{s.split(' ')[0]} {sum(r[s] for r in results) / len(results):.2f}"
                                                   for s in steps if s != "workspace_bytes"))


def main():
    print(f"torch {torch.__version__}, cuDNN {_C.cudnn_backend_version()}, frontend {cudnn.__version__}")
    profile_size(1, 16, 16, 16, 2000)
    steps_under_threads(torch.randn(1, 16, 16, device="cuda", dtype=torch.float16),
                        torch.randn(1, 16, 16, device="cuda", dtype=torch.float16), 2000)
    if "--threads-only" in sys.argv:
        return
    profile_size(8, 1024, 1024, 1024, 200)


if __name__ == "__main__":
    main()
