"""Run in a fresh process by test_semantics_gpu.py: does any call block the host?

Each step queues a long kernel (torch.cuda._sleep) on a fresh stream, makes one call of
the library on that stream, and records how long the call took on the host and whether
the stream was still busy when it returned. A call that synchronizes returns only after
the sleep, with the stream idle. Prints one JSON object: {step: [host_ms, still_busy]}, and
whether every result matched torch after the streams drained.

    python test/support/host_sync_probe.py [--detail]

--detail splits the process's first call into its parts (the handle, the build, the first
launch), to find which one synchronizes. --trace records each step with torch.profiler and
adds, per step, the CUDA API calls that took over 50 ms (what blocked, and under which op).
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # test/: the support package

SLEEP_CYCLES = int(2.0 * 1.98e9)  # ~2 s on an H200's clock: far longer than any call here, builds included


TRACE = "--trace" in sys.argv
BLOCKING = {}  # step -> [(CUDA API call, ms, enclosing ops)]


def slow_api_calls(profile):
    calls = []
    for event in profile.events():
        if event.name.startswith("cu") and event.time_range.elapsed_us() > 50_000:
            parents, parent = [], event.cpu_parent
            while parent is not None and len(parents) < 4:
                parents.append(parent.name)
                parent = parent.cpu_parent
            calls.append((event.name, round(event.time_range.elapsed_us() / 1e3, 1), parents))
    return calls


def step(name, fn, results, checks):
    stream = torch.cuda.Stream()
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) if TRACE else None
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        if profiler:
            profiler.__enter__()
        start = time.perf_counter()
        out = fn()
        elapsed = (time.perf_counter() - start) * 1e3
        busy = not stream.query()
        if profiler:
            profiler.__exit__(None, None, None)
            BLOCKING[name] = slow_api_calls(profiler)
    stream.synchronize()
    results[name] = [round(elapsed, 3), busy]
    if out is not None:
        checks.append((name, out))


def main(detail: bool) -> int:
    torch.cuda.init()
    torch.empty(1, device="cuda")  # torch's own first use (context, allocator) is not ours to judge
    torch.cuda._sleep(1)
    torch.cuda.synchronize()
    import torch_cudnn_handle as tch
    from support.graphs import LINEAR_RELU, linear_inputs, linear_relu_reference

    def linear_gelu(graph, x, w, b):
        return graph.gelu(graph.add(graph.matmul(x, w), b))

    gid = tch.register_graph(linear_gelu, name="probe_linear_gelu")
    python_gid = tch.register_graph(linear_gelu, name="probe_linear_gelu_python_path")
    x, w, b = linear_inputs(4, 64, 32, 16)
    torch.cuda.synchronize()  # the inputs are ready before any busy stream reads them
    reference = torch.nn.functional.gelu(torch.matmul(x.float(), w.float()) + b.float())
    results, checks = {}, []
    if detail:
        step("handle (cudnnCreate)", lambda: tch.current_handle(0) and None, results, checks)
        key = tuple((t.shape, t.stride(), t.dtype, t.is_cpu) for t in (x, w, b))  # op/python_path.py's key
        step("build + native registration", lambda: tch.registry.built_for(gid, 0, [x, w, b], key, False) and None, results, checks)
        step("first launch (native)", lambda: torch.ops.cudnn_fe.execute(gid, [x, w, b])[0], results, checks)
    else:
        step("first call (native)", lambda: torch.ops.cudnn_fe.execute(gid, [x, w, b])[0], results, checks)
    step("second call (native)", lambda: torch.ops.cudnn_fe.execute(gid, [x, w, b])[0], results, checks)
    step("tch.execute", lambda: tch.execute(gid, [x, w, b])[0], results, checks)
    out = torch.empty_like(reference, dtype=x.dtype)
    step("execute.out", lambda: tch.execute_out(gid, [x, w, b], out=[out]) or out, results, checks)
    tch.settings.set_native_path(False)
    step("first call (Python path)", lambda: torch.ops.cudnn_fe.execute(python_gid, [x, w, b])[0], results, checks)
    step("second call (Python path)", lambda: torch.ops.cudnn_fe.execute(python_gid, [x, w, b])[0], results, checks)
    tch.settings.set_native_path(True)
    trained = []
    leaves = [[t.detach().requires_grad_() for t in linear_inputs(2, 64, 32, 16, seed=3)] for _ in range(2)]
    torch.cuda.synchronize()

    def forward_backward():  # both queued behind the sleep: the backward runs on the forward's stream
        inputs = leaves[len(trained)]
        y = torch.ops.cudnn_fe.execute(LINEAR_RELU, inputs)[0]
        y.float().sum().backward()
        trained.append((inputs, y))

    step("forward + backward (first)", forward_backward, results, checks)
    step("forward + backward (second)", forward_backward, results, checks)
    # torch's own first use of cuDNN, for comparison: a cuDNN convolution of a new shape.
    image, kernel = torch.randn(2, 8, 32, 32, device="cuda"), torch.randn(16, 8, 3, 3, device="cuda")
    torch.cuda.synchronize()
    step("torch's first cuDNN convolution", lambda: torch.nn.functional.conv2d(image, kernel), results, [])
    torch.cuda.synchronize()
    ok = all(torch.allclose(out.float(), reference, atol=2e-2, rtol=2e-2) for _, out in checks)
    (first, y), (second, _) = trained
    ok = ok and all(torch.equal(a.grad, b.grad) for a, b in zip(first, second))
    ok = ok and torch.allclose(y.float(), linear_relu_reference(*first).float(), atol=2e-2, rtol=2e-2)
    print(json.dumps({"steps": results, "results_match": bool(ok), **({"slow_api_calls": BLOCKING} if TRACE else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main("--detail" in sys.argv))
