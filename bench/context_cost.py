"""Host cost of the op's context rule: ``context::ContextGuard`` (make the right context
current, put the caller's back after) against ``context::bind`` (the previous rule,
which left the context switched), same device, as each ``cudnn_fe.execute`` call does it.

Both are timed in C++ (bench/csrc/context_cost.cpp, a bench-only extension built here
on first use with torch.utils.cpp_extension.load from that file and
csrc/context/context_guard.cpp; needs ninja, the CUDA toolkit and a CUDA torch): host
microseconds per iteration of one loop each, with torch's current stream on the device
and its context (nullptr for a default stream), rounds interleaved, medians. The
difference is what restoring the caller's context adds to each call (goal: <= +0.3 us).

    python bench/context_cost.py [--device 0] [--calls 100000] [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GOAL_US = 0.3  # the most the guard may add per call over bind

GUARD = "ContextGuard(device, stream, stream_context), constructed + destroyed"
BIND = "context::bind(device, stream, stream_context) (the previous rule)"
DIFFERENCE = "difference: restoring the caller's context (guard - bind)"


def build():
    """The extension, compiled on first use (tools/extension_build.py)."""
    sys.path.insert(0, ROOT)
    from tools.extension_build import load_cuda_bench

    return load_cuda_bench("context_cost", ["bench/csrc/context_cost.cpp", "csrc/context/context_guard.cpp"])


def measure(device: int = 0, calls: int = 100_000, rounds: int = 15) -> Dict[str, float]:
    """{GUARD: us, BIND: us, DIFFERENCE: us}: medians of interleaved rounds (the order
    alternates between rounds), after one warm-up loop of each."""
    import torch

    extension = build()
    torch.empty(1, device=f"cuda:{device}")  # CUDA initialized; the C++ side makes the context current
    timers = {GUARD: extension.guard_us, BIND: extension.bind_us}
    for timer in timers.values():
        timer(device, max(calls // 10, 1))
    samples: Dict[str, List[float]] = {name: [] for name in timers}
    for index in range(rounds):
        for name in list(timers) if index % 2 == 0 else reversed(list(timers)):
            samples[name].append(timers[name](device, calls))
    figures = {name: statistics.median(values) for name, values in samples.items()}
    figures[DIFFERENCE] = figures[GUARD] - figures[BIND]
    return figures


def rows_of(figures: Dict[str, float], device: int, stream: str) -> List[dict]:
    """The rows for report.py's host section (one per figure), as bench_op.py's."""
    table = f"context guard: same device (cuda:{device}, {stream}), against bind"
    rows = []
    for name in (GUARD, BIND):
        rows.append(dict(table=table, candidate=name, us=figures[name], ratio=figures[name] / figures[BIND], baseline=BIND, goal=None))
    rows.append(dict(table=table, candidate=DIFFERENCE, us=figures[DIFFERENCE], ratio=None, baseline=BIND, goal=None,
                     goal_us=GOAL_US, difference=True))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--calls", type=int, default=100_000, help="iterations per timed loop")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (the median is reported)")
    parser.add_argument("--json", help="write the rows (report.py's host-section format) to this file")
    args = parser.parse_args(argv)

    import torch
    from timing import require_cuda_gpu

    require_cuda_gpu(__file__)
    figures = measure(args.device, args.calls, args.rounds)
    stream = "default stream" if torch.cuda.current_stream(args.device).cuda_stream == 0 else "side stream"
    print(f"\n### host us per call, same device (cuda:{args.device}, torch's current stream: {stream}), "
          f"{args.calls} calls x {args.rounds} rounds, medians\n")
    print(f"  {GUARD:75s} {figures[GUARD]:8.3f}")
    print(f"  {BIND:75s} {figures[BIND]:8.3f}")
    verdict = "met" if figures[DIFFERENCE] <= GOAL_US else "NOT met"
    print(f"  {DIFFERENCE:75s} {figures[DIFFERENCE]:+8.3f}  (goal <= +{GOAL_US:g} us: {verdict})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_of(figures, args.device, stream), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
