"""Side-by-side timing: every candidate is measured in the same run, interleaved,
and reported as a ratio against a named baseline (the GPU host is noisy: absolute
figures of separate runs differ by up to 60%).

* ``host_us_per_call``: host microseconds per call (``time.perf_counter`` around N calls).
* ``cuda_ms_per_call``: GPU milliseconds per call from two CUDA events around N
  back-to-back calls. This is the one CUDA-event loop of ``bench/`` (``report.py``,
  ``modules.py``, ``gpu_work.py``, ``profile_steps.py``). Library timers do not fit
  here: ``triton.testing.do_bench`` flushes L2 and times every call alone, and
  ``torch.utils.benchmark`` times the host clock, so neither gives the steady-state
  time of back-to-back steps interleaved with their baselines.
* ``compare``: the median of a timer for each candidate, rounds interleaved.
* ``device_kernels``: what a step launches on the GPU (torch.profiler, CUDA activity),
  grouped by kernel name, with device time.
* ``ThreadGang``: ``n`` persistent threads, each on its own CUDA stream, started together
  and timed until the last stream is done (report.py's and thread_scaling.py's threads rows).
* ``require_cuda_gpu``: what every entry point that measures on a GPU calls first: without
  one it says so in one line on stderr and exits with status 2 (no traceback).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
from typing import Callable, ContextManager, Dict, List, Optional, Tuple

import torch

NO_GPU_EXIT_STATUS = 2


def require_cuda_gpu(script: str, hint: str = "") -> None:
    """Return if this process can measure on a CUDA GPU; otherwise print
    "bench/<script>: needs a CUDA GPU (why)" (and ``hint``) to stderr and exit with
    status 2. ``script``: the entry point's ``__file__``. Call it after parsing the
    arguments, so ``--help`` works anywhere."""
    if torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build"
    else:
        why = f"torch {torch.__version__} has CUDA {torch.version.cuda} but sees no GPU: torch.cuda.is_available() is False"
    print(f"bench/{os.path.basename(script)}: needs a CUDA GPU ({why}){'; ' + hint if hint else ''}", file=sys.stderr, flush=True)
    sys.exit(NO_GPU_EXIT_STATUS)


def host_us_per_call(fn: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def cuda_ms_per_call(fn: Callable[[], object], calls: int) -> float:
    """GPU milliseconds per call: CUDA events on the current stream around ``calls``
    back-to-back calls (device synchronized first, so the loop starts on an idle GPU).
    A call the host cannot issue as fast as the GPU runs it shows as GPU idle time
    inside the interval: this is the time a step takes, not the sum of its kernels."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / calls


def compare(
    candidates: Dict[str, Callable[[], object]],
    calls: int = 4000,
    warmup: int = 200,
    rounds: int = 7,
    timer: Callable[[Callable[[], object], int], float] = host_us_per_call,
    scopes: Optional[Dict[str, Callable[[], ContextManager]]] = None,
) -> Dict[str, float]:
    """Median of ``timer(fn, calls)`` (by default host microseconds per call) for each
    candidate, rounds interleaved. ``scopes[name]()``, when given, is a context manager
    entered around that candidate's warm-up and around each of its timed blocks (not
    per call), e.g. ``lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])``."""
    scopes = scopes or {}
    for name, fn in candidates.items():
        with scopes.get(name, contextlib.nullcontext)():
            for _ in range(warmup):
                fn()
    samples: Dict[str, List[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            with scopes.get(name, contextlib.nullcontext)():
                samples[name].append(timer(fn, calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def compare_cuda_ms(
    candidates: Dict[str, Callable[[], object]],
    calls: int,
    rounds: int,
    warmup: int = 3,
    scopes: Optional[Dict[str, Callable[[], ContextManager]]] = None,
) -> Dict[str, float]:
    """Median GPU ms per call of each candidate (``cuda_ms_per_call``), rounds interleaved."""
    return compare(candidates, calls=calls, warmup=warmup, rounds=rounds, timer=cuda_ms_per_call, scopes=scopes)


def device_kernels(fn: Callable[[], object], steps: int = 5, warmup: int = 3) -> Tuple[Dict[str, Tuple[float, float]], object]:
    """What ``steps`` calls of ``fn`` (after ``warmup`` more) ran on the GPU:
    ``({name: (launches per step, device us per step)}, profiler)``, longest first.
    Kernels, memsets and copies alike (every CUDA-side event of torch.profiler); the
    profiler is returned for its CPU-side tables."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    totals: Dict[str, List[float]] = {}
    for event in prof.events():
        if not str(event.device_type).endswith("CUDA"):
            continue
        entry = totals.setdefault(event.name, [0, 0.0])
        entry[0] += 1
        entry[1] += event.time_range.elapsed_us()
    per_step = {name: (count / steps, us / steps) for name, (count, us) in totals.items()}
    return dict(sorted(per_step.items(), key=lambda item: -item[1][1])), prof


def report(title: str, figures: Dict[str, float], baseline: str, goals: Dict[str, float] | None = None) -> List[dict]:
    """Prints a table of us/call and the ratio to `baseline`; returns the rows."""
    rows = []
    print(f"\n### {title}\n")
    print(f"| candidate | host us/call | ratio to `{baseline}` | goal |")
    print("| --- | ---: | ---: | --- |")
    for name, us in figures.items():
        ratio = us / figures[baseline]
        goal = (goals or {}).get(name)
        verdict = "" if goal is None else f"<= {goal:g}x: {'met' if ratio <= goal else 'NOT met'}"
        print(f"| {name} | {us:.2f} | {ratio:.2f}x | {verdict} |")
        rows.append(dict(table=title, candidate=name, us=us, ratio=ratio, baseline=baseline, goal=goal))
    return rows


def save(rows: List[dict], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


class ThreadGang:
    """``n`` persistent threads, each with its own CUDA stream, started together on a
    job and timed until the last one's stream is done."""

    def __init__(self, n: int):
        self.n, self.job, self.errors = n, None, []
        self.start, self.end = threading.Barrier(n + 1), threading.Barrier(n + 1)
        self.streams = [torch.cuda.Stream() for _ in range(n)]
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"gang-{i}") for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _loop(self, index: int) -> None:
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
