"""The benchmark report, in one command on the GPU host:

    python bench/report.py [--quick] [--out bench/results]

writes ``REPORT.md`` (Markdown tables), ``report.png`` (plots) and ``report.json``
(the raw figures) under ``--out``. Everything in it is measured in this one run,
every ratio between candidates measured side by side (rounds interleaved, medians;
the host is noisy: absolute figures of separate runs differ by up to 60%):

1. host overhead of a call: ``bench_pool.py`` (getting a ready handle, a frontend
   execute through it) and ``bench_op.py`` (``cudnn_fe.execute`` against the
   frontend's own execute, the custom-op pattern, ``torch.bmm``, a CUDA graph replay);
2. thread scaling: 1, 4, 16 and 64 threads, each on its own stream, each making N
   calls of ``cudnn_fe.execute`` (a registered matmul), and the same with
   ``torch.bmm`` of the same size: calls per second, and their ratio;
3. the ``torch_cudnn_handle.nn`` modules against plain torch, forward + backward:
   ms per step from CUDA events, cuDNN / torch.

``--from-json report.json`` renders REPORT.md and report.png again from saved
figures, measuring nothing (no GPU needed). Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench_pool, bench_op, timing

THREAD_COUNTS = (1, 4, 16, 64)


# ---------------------------------------------------------------------------------
# 1. Host overhead: the two existing benchmarks, their rows through --json


def host_overhead(calls: int) -> List[dict]:
    import bench_op
    import bench_pool

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, module in (("bench_pool", bench_pool), ("bench_op", bench_op)):
            path = os.path.join(tmp, f"{name}.json")
            print(f"\n## {name}.py --calls {calls}", flush=True)
            module.main(["--json", path, "--calls", str(calls)])
            with open(path) as f:
                rows += [dict(row, source=f"{name}.py") for row in json.load(f)]
    return rows


# ---------------------------------------------------------------------------------
# 2. Thread scaling


class ThreadGang:
    """``n`` persistent threads, each with its own CUDA stream, started together on a
    job and timed until the last one's stream is done."""

    def __init__(self, n: int):
        import torch

        self.n, self.job, self.errors = n, None, []
        self.start, self.end = threading.Barrier(n + 1), threading.Barrier(n + 1)
        self.streams = [torch.cuda.Stream() for _ in range(n)]
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"gang-{i}") for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _loop(self, index: int) -> None:
        import torch

        stream = self.streams[index]
        while True:
            self.start.wait()
            job = self.job
            if job is None:
                return
            fn, calls = job
            try:
                with torch.cuda.stream(stream):
                    for _ in range(calls):
                        fn(index)
                stream.synchronize()
            except BaseException as error:  # noqa: BLE001 -- reported by run()
                self.errors.append(error)
            self.end.wait()

    def run(self, fn: Callable[[int], object], calls: int) -> float:
        """Seconds for every thread to make ``calls`` calls of ``fn(thread_index)``."""
        self.job = (fn, calls)
        begin = time.perf_counter()
        self.start.wait()
        self.end.wait()
        elapsed = time.perf_counter() - begin
        if self.errors:
            raise self.errors[0]
        return elapsed

    def close(self) -> None:
        self.job = None
        self.start.wait()
        for thread in self.threads:
            thread.join()


def thread_scaling(calls_per_thread: int, rounds: int) -> List[dict]:
    import torch

    import torch_cudnn_handle as tch
    from bench_op import MATMUL

    rows = []
    for batch, m, k, n in ((1, 16, 16, 16), (8, 256, 256, 256)):
        size = f"{batch}x{m}x{k} @ {batch}x{k}x{n} fp16"
        operands = [
            (torch.randn(batch, m, k, device="cuda", dtype=torch.float16), torch.randn(batch, k, n, device="cuda", dtype=torch.float16))
            for _ in range(max(THREAD_COUNTS))
        ]
        torch.cuda.synchronize()
        candidates = {
            "cudnn_fe.execute": lambda i: torch.ops.cudnn_fe.execute(MATMUL, list(operands[i])),
            "torch.bmm": lambda i: torch.bmm(*operands[i]),
        }
        print(f"\n### thread scaling, {size}, {calls_per_thread} calls per thread\n", flush=True)
        print("| threads | cudnn_fe.execute calls/s | torch.bmm calls/s | cudnn_fe / bmm |")
        print("| ---: | ---: | ---: | ---: |")
        for threads in THREAD_COUNTS:
            gang = ThreadGang(threads)
            try:
                for fn in candidates.values():  # warm up: each thread's handle, the built graph, the allocator
                    gang.run(fn, 20)
                seconds: Dict[str, List[float]] = {name: [] for name in candidates}
                for _ in range(rounds):
                    for name, fn in candidates.items():
                        seconds[name].append(gang.run(fn, calls_per_thread))
            finally:
                gang.close()
            rate = {name: threads * calls_per_thread / statistics.median(values) for name, values in seconds.items()}
            ratio = rate["cudnn_fe.execute"] / rate["torch.bmm"]
            print(f"| {threads} | {rate['cudnn_fe.execute']:,.0f} | {rate['torch.bmm']:,.0f} | {ratio:.2f}x |", flush=True)
            rows.append(dict(size=size, threads=threads, calls_per_thread=calls_per_thread, op_calls_per_s=rate["cudnn_fe.execute"],
                             bmm_calls_per_s=rate["torch.bmm"], ratio=ratio))
        print("pool:", tch.pool_stats())
    return rows


# ---------------------------------------------------------------------------------
# 3. The nn modules against plain torch, forward + backward


def cuda_ms(fn: Callable[[], object], iters: int) -> float:
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def compare_ms(candidates: Dict[str, Callable[[], object]], iters: int, rounds: int, warmup: int = 3) -> Dict[str, float]:
    """Median ms per call of each candidate from CUDA events, rounds interleaved."""
    from timing import compare

    return compare(candidates, calls=iters, warmup=warmup, rounds=rounds, timer=cuda_ms)


def training_step(module, x, dy):
    params = list(module.parameters())

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        module(x).backward(dy)

    return step


def module_steps(iters: int, rounds: int) -> List[dict]:
    import torch

    from torch_cudnn_handle.nn import Attention, FusedLinear, RMSNorm, TransformerBlock, reference_of, sdpa, sdpa_reference

    dtype = torch.bfloat16
    torch.manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_()

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    cases = []
    x = leaf(8, 512, 1024)
    for activation in ("gelu", None):
        layer = FusedLinear(1024, 4096, activation, device="cuda", dtype=dtype)
        cases.append((f"FusedLinear(1024, 4096, {activation!r})", "x [8, 512, 1024]", layer, reference_of(layer), x, rand(8, 512, 4096)))
    norm = RMSNorm(4096, device="cuda", dtype=dtype)
    x_norm = leaf(8, 512, 4096)
    cases.append(("RMSNorm(4096)", "x [8, 512, 4096]", norm, reference_of(norm), x_norm, rand(8, 512, 4096)))
    attention = Attention(1024, 16, device="cuda", dtype=dtype)
    x_seq = leaf(4, 1024, 1024)
    cases.append(("Attention(1024, 16 heads, causal)", "x [4, 1024, 1024]", attention, reference_of(attention), x_seq, rand(4, 1024, 1024)))
    block = TransformerBlock(1024, 16, mlp_ratio=4, device="cuda", dtype=dtype)
    cases.append(("TransformerBlock(1024, 16, mlp_ratio=4)", "x [4, 1024, 1024]", block, reference_of(block), x_seq, rand(4, 1024, 1024)))

    rows = []
    print(f"\n### nn modules, forward + backward, {str(dtype).replace('torch.', '')}, ms per step (CUDA events)\n", flush=True)
    print("| module | input | cuDNN ms | torch ms | cuDNN / torch |")
    print("| --- | --- | ---: | ---: | ---: |")

    def record(name, shape, figures):
        ratio = figures["cudnn"] / figures["torch"]
        print(f"| {name} | {shape} | {figures['cudnn']:.3f} | {figures['torch']:.3f} | {ratio:.2f}x |", flush=True)
        rows.append(dict(module=name, input=shape, cudnn_ms=figures["cudnn"], torch_ms=figures["torch"], ratio=ratio))

    for name, shape, module, reference, x_in, dy in cases:
        record(name, shape, compare_ms({"cudnn": training_step(module, x_in, dy), "torch": training_step(reference, x_in, dy)}, iters, rounds))

    q, k, v = (leaf(4, 16, 1024, 64) for _ in range(3))
    d_o = rand(4, 16, 1024, 64)

    def attention_step(fn):
        def step():
            for t in (q, k, v):
                t.grad = None
            fn(q, k, v, True).backward(d_o)

        return step

    record("sdpa (causal)", "q, k, v [4, 16, 1024, 64]", compare_ms({"cudnn": attention_step(sdpa), "torch": attention_step(sdpa_reference)}, iters, rounds))
    return rows


# ---------------------------------------------------------------------------------
# The report


def machine_facts() -> Dict[str, str]:
    import cudnn
    import torch

    import torch_cudnn_handle as tch

    facts = {
        "python": platform.python_version(),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
        "cuDNN frontend": cudnn.__version__,
        "CPU cores": str(os.cpu_count()),
        "platform": platform.platform(),
        "extension built with CUDA": str(tch.with_cuda),
    }
    try:
        facts["cuDNN backend"] = cudnn.backend_version_string()
    except Exception as error:  # noqa: BLE001
        facts["cuDNN backend"] = f"unknown ({type(error).__name__})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["GPU"] = f"{props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, {props.total_memory >> 30} GiB"
        facts["GPUs visible"] = str(torch.cuda.device_count())
    try:
        facts["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        ).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 -- a fact we can do without
        pass
    return facts


def write_markdown(data: dict, path: str) -> None:
    lines = [
        "# Benchmark report",
        "",
        f"Measured {data['date']} with `{data['command']}`. Every figure comes from this one run; each ratio "
        "compares candidates measured side by side in it (rounds interleaved, medians). Absolute figures of "
        "separate runs on this host differ by up to 60%: compare ratios, not times, across reports.",
        "",
        "## Machine",
        "",
        "| fact | value |",
        "| --- | --- |",
        *[f"| {key} | {value} |" for key, value in data["machine"].items()],
        "",
        "## 1. Host overhead of one call",
        "",
        "`bench/bench_pool.py` and `bench/bench_op.py`: host microseconds per call (`time.perf_counter` around "
        "N calls, device synchronized before and after), ratio to the table's baseline.",
    ]
    tables: Dict[str, List[dict]] = {}
    for row in data["host_overhead"]:
        tables.setdefault(f"{row['source']}: {row['table']}", []).append(row)
    for title, rows in tables.items():
        lines += ["", f"### {title}", "", f"| candidate | host us/call | ratio to `{rows[0]['baseline']}` | goal |", "| --- | ---: | ---: | --- |"]
        for row in rows:
            goal = row.get("goal")
            verdict = "" if goal is None else f"<= {goal:g}x: {'met' if row['ratio'] <= goal else 'NOT met'}"
            lines.append(f"| {row['candidate']} | {row['us']:.2f} | {row['ratio']:.2f}x | {verdict} |")
    lines += [
        "",
        "## 2. Thread scaling",
        "",
        "Each of T threads (own CUDA stream, started together) makes N calls; calls per second of all threads "
        "together, until the last stream is done. `cudnn_fe.execute` runs a registered cuDNN matmul, `torch.bmm` the "
        "same product.",
    ]
    sizes: Dict[str, List[dict]] = {}
    for row in data["thread_scaling"]:
        sizes.setdefault(row["size"], []).append(row)
    for size, rows in sizes.items():
        lines += ["", f"### {size}, N = {rows[0]['calls_per_thread']} calls per thread", "",
                  "| threads | cudnn_fe.execute calls/s | torch.bmm calls/s | cudnn_fe.execute / torch.bmm |", "| ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['threads']} | {r['op_calls_per_s']:,.0f} | {r['bmm_calls_per_s']:,.0f} | {r['ratio']:.2f}x |" for r in rows]
    lines += [
        "",
        "## 3. The nn modules against plain torch",
        "",
        "Forward + backward of each `torch_cudnn_handle.nn` module and of its plain-torch reference (same parameters, "
        "`reference_of`), bf16, eager: milliseconds per step from CUDA events, ratio below 1 = cuDNN faster.",
        "",
        "| module | input | cuDNN ms/step | torch ms/step | cuDNN / torch |",
        "| --- | --- | ---: | ---: | ---: |",
        *[f"| {r['module']} | {r['input']} | {r['cudnn_ms']:.3f} | {r['torch_ms']:.3f} | {r['ratio']:.2f}x |" for r in data["module_steps"]],
        "",
        "![plots](report.png)",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(data: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no report.png")
        return False
    fig = plt.figure(figsize=(16, 13))
    grid = fig.add_gridspec(2, 2, height_ratios=(1.2, 1))
    axes = [fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]

    # (1) host us/call, one bar per (size, candidate); duplicate rows of the "against ..." tables dropped
    seen, labels, values = set(), [], []
    for row in data["host_overhead"]:
        key = (row["source"], row["table"].split(":")[0], row["candidate"])
        if key not in seen:
            seen.add(key)
            labels.append(f"{row['table'].split(':')[0]} | {row['candidate']}")
            values.append(row["us"])
    axes[0].barh(range(len(values)), values, color="tab:blue")
    axes[0].set_yticks(range(len(values)), labels, fontsize=8)
    for i, value in enumerate(values):
        axes[0].annotate(f"{value:.2f}", (value, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    axes[0].invert_yaxis()
    axes[0].set_xscale("log")
    axes[0].set_xlabel("host us per call (log)")
    axes[0].set_title("1. host overhead of one call")

    # (2) thread scaling: calls/s against threads
    for size, style in zip(sorted({r["size"] for r in data["thread_scaling"]}), ("-", "--", ":")):
        rows = [r for r in data["thread_scaling"] if r["size"] == size]
        threads = [r["threads"] for r in rows]
        axes[1].plot(threads, [r["op_calls_per_s"] for r in rows], style, marker="o", color="tab:green", label=f"cudnn_fe.execute {size}")
        axes[1].plot(threads, [r["bmm_calls_per_s"] for r in rows], style, marker="s", color="tab:gray", label=f"torch.bmm {size}")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(THREAD_COUNTS, [str(t) for t in THREAD_COUNTS])
    axes[1].set_xlabel("threads (one stream each)")
    axes[1].set_ylabel("calls per second, all threads")
    axes[1].set_title("2. thread scaling")
    axes[1].legend(fontsize=7)

    # (3) modules: cuDNN / torch
    rows = data["module_steps"]
    axes[2].barh(range(len(rows)), [r["ratio"] for r in rows], color=["tab:green" if r["ratio"] <= 1 else "tab:red" for r in rows])
    axes[2].axvline(1.0, color="black", linewidth=1)
    axes[2].set_yticks(range(len(rows)), [r["module"] for r in rows], fontsize=8)
    axes[2].invert_yaxis()
    for i, row in enumerate(rows):
        axes[2].annotate(f"{row['ratio']:.2f}x", (row["ratio"], i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    axes[2].set_xlabel("ms cuDNN / ms torch, fwd + bwd (< 1: cuDNN faster)")
    axes[2].set_title("3. nn modules against plain torch")

    fig.suptitle(f"torch_cudnn_handle benchmarks, {data['machine'].get('GPU', 'no GPU')}, {data['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(data: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    write_markdown(data, os.path.join(out, "REPORT.md"))
    plotted = write_plot(data, os.path.join(out, "report.png"))
    print(f"\nwrote {os.path.join(out, 'REPORT.md')}" + (f" and {os.path.join(out, 'report.png')}" if plotted else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds: a smoke run, not figures to keep")
    parser.add_argument("--from-json", help="render REPORT.md and report.png from a saved report.json, measuring nothing")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            render(json.load(f), args.out)
        return 0

    import torch

    if not torch.cuda.is_available():
        print("bench/report.py measures on a GPU; this machine has none (use --from-json to render saved figures)")
        return 1
    calls, per_thread, rounds = (400, 100, 3) if args.quick else (4000, 1000, 5)
    data = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python " + " ".join([os.path.relpath(os.path.abspath(sys.argv[0]))] + sys.argv[1:]),
        "machine": machine_facts(),
    }
    data["host_overhead"] = host_overhead(calls)
    data["thread_scaling"] = thread_scaling(per_thread, rounds)
    data["module_steps"] = module_steps(iters=5 if args.quick else 20, rounds=rounds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(data, f, indent=1)
    render(data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
