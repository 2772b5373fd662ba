"""The benchmark report, in one command on the GPU host:

    python bench/report.py [--quick] [--out bench/results] [--sections host,threads,gpu_work,modules,memory]
                           [--runs untuned,tuned] [--module-sizes small,medium,large] [--update]

writes ``REPORT.md`` (Markdown tables), ``report.png`` (plots) and ``report.json``
(the raw figures, rewritten after every section) under ``--out``. Everything in it is
measured in this one run, every ratio between candidates measured side by side
(rounds interleaved, medians; the host is noisy: absolute figures of separate runs
differ by up to 60%):

1. host overhead of a call: ``bench_pool.py`` (getting a ready handle, a frontend
   execute through it), ``bench_op.py`` (``cudnn_fe.execute`` against the
   frontend's own execute, the custom-op pattern, ``torch.bmm``, a CUDA graph replay)
   and ``context_cost.py`` (the context guard against the previous bind, in C++);
2. thread scaling: 1, 4, 16 and 64 threads, each on its own stream, each making N
   calls of ``torch.ops.cudnn_fe.execute`` and of the C++ eager entry ``tch.execute``
   (a registered matmul), and the same with ``torch.bmm`` of the same size: calls per
   second, and their ratios to ``torch.bmm``; then ``thread_scaling.py``, the same in
   C++ threads (no GIL), with ``cudnnBackendExecute`` alone (plan shared, plan per
   thread) to show what serializes;
3. the op adds no GPU work: ``gpu_work.py``, GPU ms per call of ``cudnn_fe.execute``
   against the frontend's ``graph.execute`` of the same built plan, GPU-bound graphs;
4. the module table: ``modules.py``, every ``torch_cudnn_handle.nn`` module at three
   sizes, fwd and fwd+bwd, against torch's alternatives and the frontend's own torch
   ops, ratio library / fastest alternative. It runs twice, each time in its own
   process with its own baselines: untuned, then with ``TORCH_CUDNN_HANDLE_TUNE=1``
   and ``TORCH_CUDNN_HANDLE_TUNING_FILE`` set to a temporary file (``--runs`` picks
   which).

``--update`` measures the given sections into an existing ``report.json`` under
``--out`` and keeps the rest (a GPU session's per-command time limit may not fit every
section in one command); the report says when each section was measured, and every
ratio still compares candidates measured side by side in one process.

Figures other scripts measured (``thread_scaling.py --python-calls``, ``new_shapes.py``)
are entered by hand into ``report.json``'s ``measured_elsewhere`` (a title and Markdown
lines, each with its command) and its ``notes`` (the goals not met); both are rendered
after the measured sections and kept by ``--update``.

``--from-json report.json`` renders REPORT.md and report.png again from saved
figures, measuring nothing (no GPU needed; reports of earlier versions render too).
Nothing here asserts a time.
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
import time
import traceback
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench_pool, bench_op, context_cost, gpu_work, modules, timing

THREAD_COUNTS = (1, 4, 16, 64)
ERRORS: List[str] = []  # sections that failed in this run, for report.json and REPORT.md


# ---------------------------------------------------------------------------------
# 1. Host overhead: the host benchmarks, their rows through --json


def host_overhead(calls: int) -> List[dict]:
    import bench_op
    import bench_pool
    import context_cost

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # context_cost.py times a C++ loop of ~0.1 us iterations: more of them per loop.
        for name, module, module_calls in (("bench_pool", bench_pool, calls), ("bench_op", bench_op, calls),
                                           ("context_cost", context_cost, calls * 25)):
            path = os.path.join(tmp, f"{name}.json")
            print(f"\n## {name}.py --calls {module_calls}", flush=True)
            try:
                module.main(["--json", path, "--calls", str(module_calls)])
                with open(path) as f:
                    rows += [dict(row, source=f"{name}.py") for row in json.load(f)]
            except Exception as error:  # noqa: BLE001 -- one failed benchmark (or extension build) does not end the report
                ERRORS.append(f"{name}.py: {type(error).__name__}: {error}")
                print(f"{name}.py failed: {type(error).__name__}: {error}", flush=True)
    return rows


# ---------------------------------------------------------------------------------
# 2. Thread scaling (ThreadGang: timing.py)


def thread_scaling(calls_per_thread: int, rounds: int) -> List[dict]:
    import torch

    import torch_cudnn_handle as tch
    from bench_op import MATMUL
    from timing import ThreadGang

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
            "tch.execute": lambda i: tch.execute(MATMUL, list(operands[i])),
            "torch.bmm": lambda i: torch.bmm(*operands[i]),
        }
        print(f"\n### thread scaling, {size}, {calls_per_thread} calls per thread\n", flush=True)
        print("| threads | cudnn_fe.execute calls/s | tch.execute calls/s | torch.bmm calls/s | cudnn_fe / bmm | tch.execute / bmm |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
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
            eager_ratio = rate["tch.execute"] / rate["torch.bmm"]
            print(f"| {threads} | {rate['cudnn_fe.execute']:,.0f} | {rate['tch.execute']:,.0f} | {rate['torch.bmm']:,.0f} | "
                  f"{ratio:.2f}x | {eager_ratio:.2f}x |", flush=True)
            rows.append(dict(size=size, threads=threads, calls_per_thread=calls_per_thread, op_calls_per_s=rate["cudnn_fe.execute"],
                             eager_calls_per_s=rate["tch.execute"], bmm_calls_per_s=rate["torch.bmm"], ratio=ratio, eager_ratio=eager_ratio))
        print("pool:", tch.stats.pool())
    return rows


def thread_scaling_cpp(calls_per_thread: int, rounds: int) -> List[dict]:
    import thread_scaling

    print("\n## thread_scaling.py (C++ threads)", flush=True)
    return thread_scaling.measure(calls_per_thread, rounds)


# ---------------------------------------------------------------------------------
# 3. The op adds no GPU work (gpu_work.py)


def gpu_work(quick: bool) -> List[dict]:
    import gpu_work as bench_gpu_work

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gpu_work.json")
        print("\n## gpu_work.py" + (" --quick" if quick else ""), flush=True)
        bench_gpu_work.main(["--json", path] + (["--quick"] if quick else []))
        with open(path) as f:
            return json.load(f)


# ---------------------------------------------------------------------------------
# 4. The module table (modules.py), untuned and tuned, each in its own process


def module_table(quick: bool, runs_wanted: Tuple[str, ...], sizes: Optional[List[str]] = None,
                 timeout: Optional[float] = None) -> Tuple[List[dict], Dict[str, dict]]:
    """Runs ``modules.py`` in a subprocess per run (``"untuned"``, ``"tuned"``), each
    with its own torch baselines, for ``sizes`` (None: all), each stopped after
    ``timeout`` seconds with the rows it finished (modules.py saves them as it goes);
    returns (all rows, {run: how it ran})."""
    import torch

    from modules import SIZES, TUNE_ENV, TUNING_FILE_ENV

    torch.cuda.empty_cache()  # leave the GPU's memory to the child
    rows: List[dict] = []
    runs: Dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tuned in [run == "tuned" for run in runs_wanted]:
            label = "tuned" if tuned else "untuned"
            env = dict(os.environ)
            env.pop(TUNE_ENV, None)
            env.pop(TUNING_FILE_ENV, None)
            env.pop("TORCH_CUDNN_HANDLE_TUNING_CACHE", None)  # its deprecated spelling
            if tuned:
                env[TUNE_ENV] = "1"
                env[TUNING_FILE_ENV] = os.path.join(tmp, "plan_tuning.json")  # not created here: the library writes it
            path = os.path.join(tmp, f"modules_{label}.json")
            command = [sys.executable, os.path.join(HERE, "modules.py"), "--json", path] + (["--quick"] if quick else [])
            command += ["--sizes", ",".join(sizes)] if sizes else []
            settings = {name: env.get(name) for name in (TUNE_ENV, TUNING_FILE_ENV)}
            print(f"\n## modules.py, {label} ({', '.join(f'{k}={v}' for k, v in settings.items())})", flush=True)
            began = time.perf_counter()
            try:
                returncode = subprocess.run(command, env=env, check=False, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                returncode = 124  # as timeout(1) says it; the rows finished so far are kept
            info = dict(run=label, returncode=returncode, seconds=time.perf_counter() - began, sizes=list(sizes or SIZES),
                        env={name: (value.replace(tmp, "<tmp>") if value else value) for name, value in settings.items()})
            if os.path.exists(path):
                with open(path) as f:
                    result = json.load(f)
                rows += result.get("rows", [])
                info.update(complete=result.get("complete", False), torch=result.get("torch"), gpu=result.get("gpu"))
            else:
                info.update(complete=False)
            runs[label if not sizes else f"{label}, {'/'.join(sizes)}"] = info
            if returncode != 0:
                ERRORS.append(f"modules.py, {label} run: exit {returncode}" + ("" if info.get("complete") else " (its table is incomplete)"))
            print(f"modules.py {label}: exit {returncode}, {info['seconds']:.0f} s", flush=True)
    return rows, runs


def merge_runs(kept: Dict[str, dict], runs: Dict[str, dict], remeasured: set) -> Dict[str, dict]:
    """How each run ran, after ``runs`` re-measured the (run, size) pairs in ``remeasured``:
    an earlier entry keeps only its sizes not re-measured, and goes when none is left.
    (Entries of older reports name no run and no sizes: their key is the run, every size.)"""
    import modules

    merged = {}
    for key, info in kept.items():
        left = [size for size in info.get("sizes", modules.SIZES) if (info.get("run", key), size) not in remeasured]
        if left:
            merged[key] = dict(info, sizes=left)
    return {**merged, **runs}


# ---------------------------------------------------------------------------------
# 5. What autograd keeps after a forward (autograd_memory.py)


def autograd_memory() -> List[dict]:
    import autograd_memory as bench_memory

    print("\n## autograd_memory.py", flush=True)
    return bench_memory.measure()


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


def _rate(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _x(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def _markdown_host_overhead(data: dict) -> List[str]:
    lines = [
        "",
        "## 1. Host overhead of one call",
        "",
        "`bench/bench_pool.py` and `bench/bench_op.py`: host microseconds per call (`time.perf_counter` around "
        "N calls, device synchronized before and after), ratio to the table's baseline. `bench/context_cost.py`: "
        "host microseconds per iteration of a C++ loop (`std::chrono::steady_clock`), the op's `ContextGuard` "
        "against the previous `context::bind`, same device; the difference row is what restoring the caller's "
        "context adds per call.",
    ]
    tables: Dict[str, List[dict]] = {}
    for row in data["host_overhead"]:
        tables.setdefault(f"{row['source']}: {row['table']}", []).append(row)
    for title, rows in tables.items():
        lines += ["", f"### {title}", "", f"| candidate | host us/call | ratio to `{rows[0]['baseline']}` | goal |", "| --- | ---: | ---: | --- |"]
        for row in rows:
            goal, goal_us = row.get("goal"), row.get("goal_us")
            if goal is not None:
                verdict = f"<= {goal:g}x: {'met' if row['ratio'] <= goal else 'NOT met'}"
            elif goal_us is not None:  # an absolute goal (context_cost.py's difference row)
                verdict = f"<= {goal_us:+g} us: {'met' if row['us'] <= goal_us else 'NOT met'}"
            else:
                verdict = ""
            us = f"{row['us']:+.2f}" if row.get("difference") else f"{row['us']:.2f}"
            lines.append(f"| {row['candidate']} | {us} | {_x(row.get('ratio'))} | {verdict} |")
    return lines


def _by_size(rows: List[dict]) -> Dict[str, List[dict]]:
    sizes: Dict[str, List[dict]] = {}
    for row in rows:
        sizes.setdefault(row["size"], []).append(row)
    return sizes


def _markdown_thread_scaling(data: dict) -> List[str]:
    lines = [
        "",
        "## 2. Thread scaling",
        "",
        "Each of T threads (own CUDA stream, started together) makes N calls; calls per second of all threads "
        "together, until the last stream is done. `cudnn_fe.execute` (`torch.ops.cudnn_fe.execute`) and `tch.execute` "
        "(the C++ eager entry) run a registered cuDNN matmul, `torch.bmm` the same product.",
    ]
    for size, rows in _by_size(data["thread_scaling"]).items():
        lines += ["", f"### {size}, N = {rows[0]['calls_per_thread']} calls per thread", "",
                  "| threads | cudnn_fe.execute calls/s | tch.execute calls/s | torch.bmm calls/s | cudnn_fe.execute / torch.bmm | "
                  "tch.execute / torch.bmm |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['threads']} | {_rate(r.get('op_calls_per_s'))} | {_rate(r.get('eager_calls_per_s'))} | {_rate(r.get('bmm_calls_per_s'))} | "
                  f"{_x(r.get('ratio'))} | {_x(r.get('eager_ratio'))} |" for r in rows]
    if data.get("thread_scaling_cpp"):
        lines += _markdown_thread_scaling_cpp(data["thread_scaling_cpp"])
    return lines


def _markdown_thread_scaling_cpp(rows: List[dict]) -> List[str]:
    lines = [
        "",
        "### C++ threads: where calls serialize",
        "",
        "`bench/thread_scaling.py`: the same, from C++ threads (no GIL anywhere), and `cudnnBackendExecute` alone: the "
        "op's serialized plan executed on each thread's own handle with a variant pack built once, one plan descriptor "
        "shared by all threads (as the op shares it) or one per thread. Where op / backend is 1x or more, the op is "
        "as fast as cuDNN's own entry point at that thread count: what serializes there is cuDNN's, not the library's.",
    ]
    for size, group in _by_size(rows).items():
        names = list(group[0]["rates"])
        lines += ["", f"#### {size}, N = {group[0]['calls_per_thread']} calls per thread", "",
                  "| threads | " + " | ".join(f"{name} calls/s" for name in names) + " | op / torch.bmm | op / backend (shared plan) |",
                  "| ---: |" + " ---: |" * (len(names) + 2)]
        lines += [f"| {r['threads']} | " + " | ".join(_rate(r["rates"].get(name)) for name in names) +
                  f" | {_x(r.get('op_over_bmm'))} | {_x(r.get('op_over_backend'))} |" for r in group]
    return lines


def _kernels_cell(kernels: Dict[str, list]) -> str:
    return "<br>".join(f"{count:g}x {us:.1f} us `{name[:60]}`" for name, (count, us) in kernels.items()) or "-"


def _markdown_gpu_work(data: dict) -> List[str]:
    lines = [
        "",
        "## 3. The op adds no GPU work",
        "",
        "`bench/gpu_work.py`: GPU milliseconds per call (CUDA events around N back-to-back calls, median of interleaved "
        "rounds) of `torch.ops.cudnn_fe.execute` and of the frontend's own `graph.execute` of the same built plan "
        "(the registry's graph, uids and workspace size, on the pooled handle, outputs and workspace preallocated); "
        "GPU ops per call from torch.profiler (CUDA activity: kernels, memsets, copies).",
        "",
        "| graph | path | cudnn_fe.execute GPU ms/call | frontend execute GPU ms/call | op / frontend | GPU ops per call (op) | "
        "same GPU ops | outputs equal |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in data["gpu_work"]:
        path = "native" if r.get("native") else f"Python ({r.get('path_reason', '')})"
        lines.append(f"| {r['graph']} | {path} | {r['op_ms']:.4f} | {r['frontend_ms']:.4f} | {_x(r.get('ratio'), 3)} | "
                     f"{_kernels_cell(r.get('op_kernels', {}))} | {r.get('same_kernels')} | {r.get('outputs_equal')} |")
    return lines


RUNS = ("untuned", "tuned")


def _markdown_module_table(data: dict) -> List[str]:
    import modules

    rows = data["module_table"]
    runs_info = data.get("module_table_runs", {})
    lines = [
        "",
        "## 4. The nn modules against every alternative",
        "",
        "`bench/modules.py`, bf16: GPU milliseconds per step (CUDA events around back-to-back steps, median of "
        "interleaved rounds) of the library's module and of each alternative: for sdpa torch's flash and cuDNN "
        "backends; for the others the plain-torch reference (same parameters) eager and under `torch.compile` "
        "(and `F.rms_norm` for RMSNorm); and the frontend's own torch op where there is one (`cudnn.sdpa_torch`, "
        "`cudnn.ops.norm.rms_norm`). fwd is the forward of a training step (inputs require grad); fwd+bwd adds "
        "`.backward(dy)`. Ratio = library / fastest alternative (< 1: the library is faster). Each run is its own "
        "process with its own baselines: *untuned* is the library's default plan choice, *tuned* runs with "
        f"`{modules.TUNE_ENV}=1` (and `{modules.TUNING_FILE_ENV}` set to a temporary file).",
    ]
    present = [run for run in RUNS if any(r.get("run") == run for r in rows)]
    present += sorted({r.get("run") for r in rows if r.get("run") not in RUNS})
    if runs_info:
        lines += [""] + [f"- {run}: exit {info.get('returncode')}, {info.get('seconds', 0):.0f} s, "
                         f"{'complete' if info.get('complete') else 'INCOMPLETE'}; sizes {'/'.join(info.get('sizes', modules.SIZES))}; "
                         f"env {info.get('env')}" for run, info in runs_info.items()]
    # Summary: ratio per run, side by side.
    groups: Dict[tuple, Dict[str, dict]] = {}
    for r in sorted(rows, key=modules.row_order):
        groups.setdefault((r["config"], r["size"], r["input"], r["mode"]), {})[r.get("run", "untuned")] = r
    header = "| module | size | input | mode | " + " | ".join(f"library / fastest ({run}) | fastest ({run})" for run in present) + " |"
    lines += ["", "### Summary: library / fastest alternative", "", header,
              "| --- | --- | --- | --- | " + " | ".join("---: | ---" for _ in present) + " |"]
    for (config, size, shape, mode), by_run in groups.items():
        cells = []
        for run in present:
            r = by_run.get(run)
            cells += [modules.ratio_text(r) if r else "-", (r.get("fastest") or "-") if r else "-"]
        lines.append(f"| {config} | {size} | {shape} | {mode} | " + " | ".join(cells) + " |")
    compiled = [r for r in sorted(rows, key=modules.row_order) if r.get("compiled_ratio") is not None]
    if compiled:
        lines += ["", "### The library's module under torch.compile", "",
                  "The same steps with the library's module compiled (`torch.compile(module)`, what a model that compiles "
                  "gets), against the same fastest alternative.", "",
                  "| module | size | mode | run | library ms | library compiled ms | fastest alternative | library compiled / fastest |",
                  "| --- | --- | --- | --- | ---: | ---: | --- | ---: |"]
        lines += [f"| {r['config']} | {r['size']} | {r['mode']} | {r.get('run', 'untuned')} | {modules._ms(r['ms'].get(modules.LIBRARY))} | "
                  f"{modules._ms(r['ms'].get(modules.LIBRARY_COMPILED))} | {r['fastest']} {modules._ms(r['ms'].get(r['fastest']))} | "
                  f"{_x(r['compiled_ratio'])} |" for r in compiled]
    for run in present:
        lines += ["", f"### {run} run: every candidate", ""]
        lines += modules.markdown_table([r for r in rows if r.get("run", "untuned") == run])
    return lines


def _markdown_module_steps(data: dict) -> List[str]:
    """The earlier reports' module section (rendered from their JSON)."""
    return [
        "",
        "## nn modules against plain torch (earlier report format)",
        "",
        "Forward + backward of each `torch_cudnn_handle.nn` module and of its plain-torch reference (same parameters, "
        "`reference_of`), bf16, eager: milliseconds per step from CUDA events, ratio below 1 = cuDNN faster.",
        "",
        "| module | input | cuDNN ms/step | torch ms/step | cuDNN / torch |",
        "| --- | --- | ---: | ---: | ---: |",
        *[f"| {r['module']} | {r['input']} | {r['cudnn_ms']:.3f} | {r['torch_ms']:.3f} | {r['ratio']:.2f}x |" for r in data["module_steps"]],
    ]


def _markdown_autograd_memory(data: dict) -> List[str]:
    rows = data["autograd_memory"]
    labels = sorted({label for r in rows for label in r["torch"]})
    return [
        "",
        "## 5. What autograd keeps after a forward",
        "",
        "MiB the CUDA allocator holds after one forward whose autograd graph is alive (outputs plus tensors saved for "
        "backward), beyond the inputs and parameters; bf16, the input requires grad (`autograd_memory.py`).",
        "",
        "| case | library MiB | " + " | ".join(f"{label} MiB" for label in labels) + " | library / torch's least |",
        "| --- | ---: | " + " | ".join("---:" for _ in labels) + " | ---: |",
        *[
            f"| {r['case']} | {r['library_mib']:.2f} | "
            + " | ".join(f"{r['torch'][label]:.2f}" if label in r["torch"] else "-" for label in labels)
            + f" | {r['library_mib'] / min(r['torch'].values()):.2f}x |"
            for r in rows
        ],
    ]


def write_markdown(data: dict, path: str) -> None:
    lines = [
        "# Benchmark report",
        "",
        f"Measured {data['date']} with `{data['command']}`"
        + ("" if not data.get("measured") else "; sections measured: " + "; ".join(f"{name} {when}" for name, when in data["measured"].items()))
        + ". Each ratio compares candidates measured side by side in one process (rounds interleaved, medians). "
        "Absolute figures of separate runs on this host differ by up to 60%: compare ratios, not times, across reports.",
        "",
        "## Machine",
        "",
        "| fact | value |",
        "| --- | --- |",
        *[f"| {key} | {value} |" for key, value in data["machine"].items()],
    ]
    for key, section in (("host_overhead", _markdown_host_overhead), ("thread_scaling", _markdown_thread_scaling),
                         ("gpu_work", _markdown_gpu_work), ("module_table", _markdown_module_table), ("module_steps", _markdown_module_steps),
                         ("autograd_memory", _markdown_autograd_memory)):
        if data.get(key):
            lines += section(data)
    for extra in data.get("measured_elsewhere", []):  # figures of other scripts, each with its command
        lines += ["", f"## {extra['title']}", "", *extra["lines"]]
    if data.get("notes"):
        lines += ["", "## Goals not met: the measured reasons", "", *[f"- {note}" for note in data["notes"]]]
    if data.get("errors"):
        lines += ["", "## Errors in this run", "", *[f"- {error}" for error in data["errors"]]]
    lines += ["", "![plots](report.png)", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


# -- plots ------------------------------------------------------------------------


def _plot_host_overhead(ax, data: dict) -> None:
    # host us/call, one bar per (size, candidate); duplicate rows of the "against ..." tables dropped
    seen, labels, values = set(), [], []
    for row in data["host_overhead"]:
        if row.get("difference"):  # a difference of two bars above, possibly <= 0: no bar on a log axis
            continue
        key = (row["source"], row["table"].split(":")[0], row["candidate"])
        if key not in seen:
            seen.add(key)
            labels.append(f"{row['table'].split(':')[0]} | {row['candidate']}")
            values.append(row["us"])
    ax.barh(range(len(values)), values, color="tab:blue")
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    for i, value in enumerate(values):
        ax.annotate(f"{value:.2f}", (value, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("host us per call (log)")
    ax.set_title("1. host overhead of one call")


def _plot_thread_scaling(ax, data: dict) -> None:
    for size, style in zip(sorted({r["size"] for r in data["thread_scaling"]}), ("-", "--", ":")):
        rows = [r for r in data["thread_scaling"] if r["size"] == size]
        threads = [r["threads"] for r in rows]
        ax.plot(threads, [r["op_calls_per_s"] for r in rows], style, marker="o", color="tab:green", label=f"cudnn_fe.execute {size}")
        if all(r.get("eager_calls_per_s") is not None for r in rows):
            ax.plot(threads, [r["eager_calls_per_s"] for r in rows], style, marker="^", color="tab:olive", label=f"tch.execute {size}")
        ax.plot(threads, [r["bmm_calls_per_s"] for r in rows], style, marker="s", color="tab:gray", label=f"torch.bmm {size}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(THREAD_COUNTS, [str(t) for t in THREAD_COUNTS])
    ax.set_xlabel("threads (one stream each)")
    ax.set_ylabel("calls per second, all threads")
    ax.set_title("2. thread scaling")
    ax.legend(fontsize=7)


def _plot_gpu_work(ax, data: dict) -> None:
    rows = data["gpu_work"]
    ratios = [r["ratio"] for r in rows]
    ax.barh(range(len(rows)), ratios, color=["tab:green" if abs(x - 1) <= 0.02 else "tab:red" for x in ratios])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(rows)), [r["graph"][:48] for r in rows], fontsize=8)
    ax.invert_yaxis()
    for i, ratio in enumerate(ratios):
        ax.annotate(f"{ratio:.3f}x", (ratio, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_xlim(0, max(1.2, max(ratios) * 1.15))
    ax.set_xlabel("GPU ms/call, op / frontend execute (same plan)")
    ax.set_title("3. the op adds no GPU work (1.00x = none)")


MODULE_SERIES = (  # (mode, run): bar color
    (("fwd", "untuned"), "#9ecae1"),
    (("fwd", "tuned"), "#3182bd"),
    (("fwd+bwd", "untuned"), "#fdae6b"),
    (("fwd+bwd", "tuned"), "#e6550d"),
)


def _plot_module_table(ax, data: dict) -> None:
    import modules

    rows = sorted(data["module_table"], key=modules.row_order)
    groups: List[tuple] = []
    for r in rows:
        group = (r["module"], r["size"], r["input"])
        if group not in groups:
            groups.append(group)
    ratio = {((r["module"], r["size"], r["input"]), r["mode"], r.get("run", "untuned")): r.get("ratio") for r in rows}
    series = [(key, color) for key, color in MODULE_SERIES if any(k[1:] == key for k in ratio)]
    height = 0.8 / max(len(series), 1)
    smallest, largest = 0.5, 2.0
    for index, ((mode, run), color) in enumerate(series):
        ys, xs = [], []
        for g, group in enumerate(groups):
            value = ratio.get((group, mode, run))
            if value is not None and value > 0:
                ys.append(g - 0.4 + height * (index + 0.5))
                xs.append(value)
        smallest, largest = min([smallest] + xs), max([largest] + xs)
        # Bars grow from parity (1x): left = the library is faster, right = slower.
        ax.barh(ys, [x - 1 for x in xs], left=1, height=height * 0.95, color=color, label=f"{mode}, {run}")
        for y, x in zip(ys, xs):
            ax.annotate(f"{x:.2f}", (x, y), xytext=(2 if x >= 1 else -2, 0), textcoords="offset points", va="center",
                        ha="left" if x >= 1 else "right", fontsize=6)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlim(smallest / 1.25, largest * 1.25)
    ticks = [2.0 ** e for e in range(-8, 9) if smallest / 1.25 <= 2.0 ** e <= largest * 1.25]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.set_yticks(range(len(groups)), [f"{module} {size}: {shape}" for module, size, shape in groups], fontsize=8)
    ax.set_ylim(len(groups) - 0.5, -0.5)
    ax.set_xlabel("library ms / fastest alternative's ms per step, log scale (left of 1x: the library is faster)")
    ax.set_title("4. nn modules: library / fastest alternative (torch backends, eager, torch.compile, the frontend's ops)")
    ax.legend(fontsize=8, loc="lower right")


def _plot_module_steps(ax, data: dict) -> None:
    rows = data["module_steps"]
    ax.barh(range(len(rows)), [r["ratio"] for r in rows], color=["tab:green" if r["ratio"] <= 1 else "tab:red" for r in rows])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(rows)), [r["module"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    for i, row in enumerate(rows):
        ax.annotate(f"{row['ratio']:.2f}x", (row["ratio"], i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_xlabel("ms cuDNN / ms torch, fwd + bwd (< 1: cuDNN faster)")
    ax.set_title("nn modules against plain torch (earlier report format)")


# (data key, draw, full width, relative height)
PANELS = (
    ("host_overhead", _plot_host_overhead, True, 1.3),
    ("thread_scaling", _plot_thread_scaling, False, 1.0),
    ("gpu_work", _plot_gpu_work, False, 1.0),
    ("module_steps", _plot_module_steps, False, 1.0),
    ("module_table", _plot_module_table, True, 2.6),
)


def _layout(data: dict) -> List[List[tuple]]:
    """Rows of panels: a full-width panel alone, half-width ones in pairs."""
    rows, pending = [], None
    for panel in PANELS:
        if not data.get(panel[0]):
            continue
        if panel[2]:
            if pending:
                rows.append([pending])
                pending = None
            rows.append([panel])
        elif pending:
            rows.append([pending, panel])
            pending = None
        else:
            pending = panel
    if pending:
        rows.append([pending])
    return rows


def write_plot(data: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no report.png")
        return False
    layout = _layout(data)
    if not layout:
        print("nothing to plot: no report.png")
        return False
    heights = [max(panel[3] for panel in row) for row in layout]
    fig = plt.figure(figsize=(16, 5.2 * sum(heights)))
    grid = fig.add_gridspec(len(layout), 2, height_ratios=heights)
    for r, row in enumerate(layout):
        for c, (key, draw, _wide, _height) in enumerate(row):
            ax = fig.add_subplot(grid[r, :] if len(row) == 1 else grid[r, c])
            draw(ax, data)
    fig.suptitle(f"torch_cudnn_handle benchmarks, {data['machine'].get('GPU', 'no GPU')}, {data['date']}")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))  # room for the title
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(data: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    write_markdown(data, os.path.join(out, "REPORT.md"))
    plotted = write_plot(data, os.path.join(out, "report.png"))
    print(f"\nwrote {os.path.join(out, 'REPORT.md')}" + (f" and {os.path.join(out, 'report.png')}" if plotted else ""))


SECTIONS = ("host", "threads", "gpu_work", "modules", "memory")
_ERROR_PREFIXES = {  # which recorded errors a section's new measurement replaces (--update)
    "host": ("bench_pool.py", "bench_op.py", "context_cost.py", "section host"),
    "threads": ("thread_scaling.py", "section threads"),
    "gpu_work": ("section gpu_work",),
    "modules": ("modules.py", "section modules"),
    "memory": ("section memory",),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds, smallest module sizes: a smoke run, not figures to keep")
    parser.add_argument("--from-json", help="render REPORT.md and report.png from a saved report.json, measuring nothing")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"which sections to measure, comma-separated (default: {','.join(SECTIONS)})")
    parser.add_argument("--runs", default="untuned,tuned", help="the module table's runs, comma-separated: untuned, tuned (default: both)")
    parser.add_argument("--no-tuned", action="store_true", help="the same as --runs untuned")
    parser.add_argument("--module-sizes", help="the module table's sizes, comma-separated (default: all); with --update the "
                        "other sizes' rows are kept, so a long run can be split across calls")
    parser.add_argument("--module-timeout", type=float, help="seconds each module run may take; a run stopped then keeps "
                        "the rows it finished")
    parser.add_argument("--update", action="store_true", help="measure the given sections into --out's report.json, keeping the others")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            render(json.load(f), args.out)
        return 0
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")

    runs_wanted = ("untuned",) if args.no_tuned else tuple(r.strip() for r in args.runs.split(",") if r.strip())
    if not runs_wanted or any(r not in RUNS for r in runs_wanted):
        parser.error(f"--runs takes a comma-separated subset of {', '.join(RUNS)}")

    from timing import require_cuda_gpu

    require_cuda_gpu(__file__, hint="python bench/report.py --from-json bench/results/report.json --out DIR renders the saved figures without one")
    calls, per_thread, rounds = (400, 100, 3) if args.quick else (4000, 1000, 5)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python " + " ".join([os.path.relpath(os.path.abspath(sys.argv[0]))] + sys.argv[1:])
    data = {"date": now, "command": command, "machine": machine_facts()}
    existing = os.path.join(args.out, "report.json")
    if args.update and os.path.exists(existing):
        with open(existing) as f:
            data = dict(json.load(f), machine=data["machine"])
        data["command"] = f"{data['command']}; then {command}"
        ERRORS.extend(e for e in data.get("errors", []) if not any(e.startswith(p) for s in sections for p in _ERROR_PREFIXES[s]))
    data.setdefault("measured", {})
    os.makedirs(args.out, exist_ok=True)

    def save() -> None:
        with open(os.path.join(args.out, "report.json"), "w") as f:
            json.dump(data, f, indent=1)

    def module_section() -> None:
        sizes = [s.strip() for s in args.module_sizes.split(",")] if args.module_sizes else None
        rows, runs = module_table(args.quick, runs_wanted, sizes, args.module_timeout)
        # What this call ran replaces the earlier rows of those (run, size) pairs, finished or not.
        remeasured = {(info["run"], size) for info in runs.values() for size in info["sizes"]}
        kept = [r for r in data.get("module_table", []) if (r.get("run", "untuned"), r["size"]) not in remeasured] if args.update else []
        data["module_table"] = kept + rows
        data["module_table_runs"] = merge_runs(data.get("module_table_runs", {}) if args.update else {}, runs, remeasured)

    def threads_section() -> None:
        data["thread_scaling"] = thread_scaling(per_thread, rounds)
        try:
            data["thread_scaling_cpp"] = thread_scaling_cpp(2 * per_thread, 3)
        except Exception as error:  # noqa: BLE001 -- the extension build may fail; the Python figures stand
            ERRORS.append(f"thread_scaling.py: {type(error).__name__}: {error}")
            traceback.print_exc()

    measure = {
        "host": lambda: data.__setitem__("host_overhead", host_overhead(calls)),
        "threads": threads_section,
        "gpu_work": lambda: data.__setitem__("gpu_work", gpu_work(args.quick)),
        "modules": module_section,
        "memory": lambda: data.__setitem__("autograd_memory", autograd_memory()),
    }
    began = time.perf_counter()
    for section in SECTIONS:
        if section not in sections:
            continue
        try:
            measure[section]()
            data["measured"][section] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        except Exception as error:  # noqa: BLE001 -- one failed section does not end the report
            ERRORS.append(f"section {section}: {type(error).__name__}: {error}")
            traceback.print_exc()
        data["errors"] = list(ERRORS)
        save()
    print(f"\nreport measured in {time.perf_counter() - began:.0f} s", flush=True)
    render(data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
