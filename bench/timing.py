"""Side-by-side host timing: every candidate is measured in the same run, interleaved,
and reported as a ratio against a named baseline (the GPU host is noisy: absolute
figures of separate runs differ by up to 60%)."""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable, Dict, List

import torch


def host_us_per_call(fn: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def compare(
    candidates: Dict[str, Callable[[], object]],
    calls: int = 4000,
    warmup: int = 200,
    rounds: int = 7,
    timer: Callable[[Callable[[], object], int], float] = host_us_per_call,
) -> Dict[str, float]:
    """Median of ``timer(fn, calls)`` (by default host microseconds per call) for each
    candidate, rounds interleaved."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: Dict[str, List[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            samples[name].append(timer(fn, calls))
    return {name: statistics.median(values) for name, values in samples.items()}


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
