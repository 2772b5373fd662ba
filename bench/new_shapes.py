"""What a new shape costs, and what a second process saves (issue 20).

1. Causal SDPA, bf16, B=2 H=8 D=64, forward + backward, at 12 lengths never seen before
   (136..1544): the first call at each length (build included) and the steady call,
   medians over lengths, for the library's static route, its kernel-cache route
   (dynamic shapes), torch's flash backend and torch's cuDNN backend; candidates
   interleaved per length.
2. ``FusedLinear(1024, 1024, activation="gelu")`` forward at 12 new token counts:
   static, kernel cache, torch ``linear`` + ``gelu``.
3. Two processes sharing a plan store (a fresh directory): the main job's block
   (``TransformerBlock(512, 8)``, bf16, batch 8x256, one training step). Plan seconds
   (``registry_stats()["plan_seconds"]``: time obtaining built graphs) of the first
   (cold, builds) and the second (warm, loads), their ratio (goal <= 0.1), and each
   one's time from its start to its first finished training step.

The library's graphs here are built with the plan store off (parts 1 and 2 measure
builds); part 3 runs this file again as a subprocess per process.

    python bench/new_shapes.py [--steady-calls 20] [--json out.json]
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()  # part 3: a process's start, before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LENGTHS = [136 + 128 * i for i in range(12)]  # 136 .. 1544
TOKENS = [4 * n for n in LENGTHS]
GOAL_PLAN_RATIO = 0.1


def _first_and_steady(fn, steady_calls: int):
    """ms of the first call (synchronized), then ms per call of ``steady_calls`` more."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    for _ in range(steady_calls):
        fn()
    torch.cuda.synchronize()
    return first, (time.perf_counter() - start) * 1e3 / steady_calls


def _interleaved(candidates, sizes, make_call, steady_calls):
    """{candidate: ([first ms per size], [steady ms per size])}, the order rotating per size."""
    results = {name: ([], []) for name in candidates}
    for i, size in enumerate(sizes):
        order = candidates[i % len(candidates):] + candidates[: i % len(candidates)]
        for name in order:
            first, steady = _first_and_steady(make_call(name, size), steady_calls)
            results[name][0].append(first)
            results[name][1].append(steady)
    return results


def sdpa_part(steady_calls: int):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn.attention import _BACKWARD_OPERANDS, sdpa_backward, sdpa_forward

    graphs = {
        route: tch.register_graph(
            sdpa_forward, name=f"bench_new_shapes_sdpa_{route}", backward=sdpa_backward, backward_operands=_BACKWARD_OPERANDS,
            causal=True, dynamic_shapes=route == "kernel_cache",
        )
        for route in ("static", "kernel_cache")
    }
    backends = {"torch flash": SDPBackend.FLASH_ATTENTION, "torch cuDNN backend": SDPBackend.CUDNN_ATTENTION}

    def make_call(name, length):
        q, k, v = (torch.randn(2, 8, length, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        d_o = torch.randn(2, 8, length, 64, device="cuda", dtype=torch.bfloat16)

        def call():
            if name in backends:
                with sdpa_kernel(backends[name]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                o = tch.execute(graphs[name.split()[-1]], [q, k, v])[0]
            torch.autograd.grad(o, (q, k, v), d_o)

        return call

    candidates = ["library static", "library kernel_cache", *backends]
    results = _interleaved(candidates, LENGTHS, make_call, steady_calls)
    builds = {f"library {route}": [b for g in (gid, tch.registry._registry.definition(gid).backward_id) for b in tch.built_graphs(g)]
              for route, gid in graphs.items()}
    return results, builds


def linear_part(steady_calls: int):
    import torch
    import torch.nn.functional as F

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import FusedLinear
    from torch_cudnn_handle.nn.linear import linear_forward

    static = FusedLinear(1024, 1024, activation="gelu", device="cuda", dtype=torch.bfloat16)
    cached = FusedLinear(1024, 1024, activation="gelu", device="cuda", dtype=torch.bfloat16)
    cached.load_state_dict(static.state_dict())
    cached._graph = tch.register_graph(linear_forward, name="bench_new_shapes_linear_gelu_kernel_cache", activation="gelu", dynamic_shapes=True)
    modules = {"library static": static, "library kernel_cache": cached}

    def make_call(name, tokens):
        x = torch.randn(1, tokens, 1024, device="cuda", dtype=torch.bfloat16)

        @torch.no_grad()
        def call():
            if name in modules:
                modules[name](x)
            else:
                F.gelu(F.linear(x, static.weight, static.bias))

        return call

    results = _interleaved(["library static", "library kernel_cache", "torch linear+gelu"], TOKENS, make_call, steady_calls)
    builds = {name: tch.built_graphs(module._graph) for name, module in modules.items()}
    return results, builds


def block_process(report_path: str) -> None:
    """Part 3, one process: a block's first training step; what obtaining its plans cost."""
    import torch

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import TransformerBlock

    torch.manual_seed(0)
    block = TransformerBlock(512, 8, device="cuda", dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(block.parameters(), lr=1e-3)
    x = torch.randn(8, 256, 512, device="cuda", dtype=torch.bfloat16)
    block(x).float().square().mean().backward()
    optimizer.step()
    torch.cuda.synchronize()
    first_step = time.perf_counter() - _STARTED
    stats = tch.registry_stats()
    with open(report_path, "w") as file:
        json.dump(dict(first_step_s=first_step, **{k: stats[k] for k in ("plan_seconds", "builds", "routes", "disk_hits", "disk_misses", "disk_writes", "disk_rejected")}), file)


def processes_part():
    with tempfile.TemporaryDirectory() as directory:
        environment = dict(os.environ, TORCH_CUDNN_HANDLE_PLAN_CACHE="1", TORCH_CUDNN_HANDLE_CACHE_DIR=os.path.join(directory, "plans"))
        environment["PYTHONPATH"] = os.pathsep.join([ROOT, environment.get("PYTHONPATH", "")])
        reports = []
        for i in (1, 2):
            path = os.path.join(directory, f"process{i}.json")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--block-process", path], env=environment, check=True)
            with open(path) as file:
                reports.append(json.load(file))
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steady-calls", type=int, default=20)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--skip-processes", action="store_true")
    parser.add_argument("--block-process", help=argparse.SUPPRESS)  # part 3's child: write its report here
    args = parser.parse_args()
    if args.block_process:
        return block_process(args.block_process)

    from torch_cudnn_handle.registry import plan_store

    plan_store.set_plan_cache(False)  # parts 1 and 2 measure builds
    median = statistics.median
    figures = {}
    for title, part in (
        (f"causal SDPA fwd+bwd, bf16 B=2 H=8 D=64, {len(LENGTHS)} new lengths {LENGTHS[0]}..{LENGTHS[-1]}", sdpa_part),
        (f"FusedLinear(1024, 1024, gelu) forward, bf16, {len(TOKENS)} new token counts {TOKENS[0]}..{TOKENS[-1]}", linear_part),
    ):
        results, builds = part(args.steady_calls)
        print(f"\n{title}\n{'candidate':<24}{'first call ms':>15}{'steady ms':>12}{'build ms':>11}  (medians over sizes; build: per graph)")
        figures[title] = {}
        for name, (first, steady) in results.items():
            built = builds.get(name) or []
            build = median(b.build_seconds * 1e3 for b in built) if built else None
            phases = {p: median((b.phase_seconds or {}).get(p, 0.0) * 1e3 for b in built) for p in ("describe", "load", "build", "store", "native")} if built else {}
            figures[title][name] = dict(first_ms=median(first), steady_ms=median(steady), build_ms=build, phase_ms=phases, first_ms_each=first,
                                        routes=sorted({b.route for b in built}))
            print(f"{name:<24}{median(first):>15.2f}{median(steady):>12.3f}{'' if build is None else f'{build:>11.2f}'}")
            if built:
                print(f"{'':<26}build by phase, ms: " + ", ".join(f"{p} {ms:.2f}" for p, ms in phases.items())
                      + f"; routes {sorted({b.route for b in built})}")

    if not args.skip_processes:
        cold, warm = processes_part()
        ratio = warm["plan_seconds"] / cold["plan_seconds"] if cold["plan_seconds"] else float("nan")
        print("\nTransformerBlock(512, 8) bf16, batch 8x256, one training step, two processes sharing a plan store")
        print(f"{'process':<12}{'plan s':>9}{'start->first step s':>21}{'builds':>8}{'disk hits':>11}{'writes':>8}{'rejected':>10}")
        for name, report in (("1 (cold)", cold), ("2 (warm)", warm)):
            print(f"{name:<12}{report['plan_seconds']:>9.3f}{report['first_step_s']:>21.2f}{report['builds']:>8}{report['disk_hits']:>11}"
                  f"{report['disk_writes']:>8}{report['disk_rejected']:>10}")
        print(f"plan seconds, process 2 / process 1: {ratio:.3f} (goal <= {GOAL_PLAN_RATIO}: {'met' if ratio <= GOAL_PLAN_RATIO else 'NOT met'})")
        figures["second process"] = dict(cold=cold, warm=warm, plan_ratio=ratio, goal=GOAL_PLAN_RATIO)

    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=1)


if __name__ == "__main__":
    main()
