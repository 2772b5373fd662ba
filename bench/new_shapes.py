"""What a new shape costs, and what a second process saves (issues 20 and 29).

1. Causal SDPA, bf16, B=2 H=8 D=64 (q, k, v token-major, as Attention's projections give
   them), forward + backward, at ``--shapes`` lengths never seen before (the default 12:
   136..1544; more are drawn from [64, 4096] with ``--seed``): the first call at each
   length (build included), the second (where the library hands a plan to its native path)
   and the steady call, medians over lengths, and the first calls' total seconds, for the
   library's static route, its kernel-cache route (dynamic shapes), its length buckets
   (the attention_buckets setting, Note [Length buckets]), torch's flash backend and
   torch's cuDNN backend; candidates interleaved per length.
2. ``FusedLinear(1024, 1024, activation="gelu")`` forward at as many new token counts:
   static, kernel cache, builds off the caller's path (the background_builds setting:
   the interpreter serves a new count while it builds), torch ``linear`` + ``gelu``.

   For the library's candidates, also: the total build seconds over all lengths, and
   where a new length's time went (the graphs built for one length summed, median over
   lengths; ``BuiltGraph.phase_seconds``, registry/build_timing.py): cuDNN's build steps,
   the library's own share around them in the first call (goal <= 1 ms), the first
   execution, and the native hand-over the second call pays (``native_hand_over``; a
   length used once never does).
3. Two processes sharing a plan store (a fresh directory): the main job's block
   (``TransformerBlock(512, 8)``, bf16, batch 8x256, one training step). Plan obtaining
   seconds (``stats.graphs()["phase_seconds"]`` over ``OBTAIN_PHASES``: cuDNN's build
   steps in the first, cold process, the store's load in the second, warm one), their
   ratio (goal <= 0.1), the same for all of ``plan_seconds`` (the library's work around
   each graph, the same in both, included), and each one's time from its start to its
   first finished training step.

The library's graphs here are built with the plan store off (parts 1 and 2 measure
builds); part 3 runs this file again as a subprocess per process.

    python bench/new_shapes.py [--shapes 200 --seed 0] [--steady-calls 20] [--hand-over build|second_call] [--json out.json]
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
from timing import require_cuda_gpu  # noqa: E402
from torch_cudnn_handle.registry.build_timing import LIBRARY_PHASES, OBTAIN_PHASES, PHASES  # noqa: E402

HAND_OVER = "native_hand_over"
LENGTHS = [136 + 128 * i for i in range(12)]  # 136 .. 1544; --shapes N draws N from [64, 4096] instead
TOKENS = [4 * n for n in LENGTHS]


def draw_shapes(count: int, seed: int) -> None:
    """``count`` distinct lengths from [64, 4096] (and token counts 4x them), seeded."""
    import random

    LENGTHS[:] = sorted(random.Random(seed).sample(range(64, 4097), count))
    TOKENS[:] = [4 * n for n in LENGTHS]
GOAL_PLAN_RATIO = 0.1
GOAL_LIBRARY_MS = 1.0


def new_length_breakdown(built, size_of) -> dict:
    """Where a new size's time went: the phases of the graphs built for one size summed,
    then the median over sizes, in ms; with cuDNN's share, the library's and the first
    execution's (the first call), and the native hand-over's (the second call;
    registry/build_timing.py)."""
    per_size = {}
    for b in built:
        size = per_size.setdefault(size_of(b), {})
        for phase, seconds in (b.phase_seconds or {}).items():
            size[phase] = size.get(phase, 0.0) + seconds * 1e3
    sizes = list(per_size.values())

    def median_of(phases):
        return statistics.median(sum(size.get(p, 0.0) for p in phases) for size in sizes)

    return dict(
        phase_ms={p: median_of([p]) for p in PHASES if any(p in size for size in sizes)},
        cudnn_ms=median_of(OBTAIN_PHASES), library_ms=median_of(LIBRARY_PHASES), first_execution_ms=median_of(["first_execution"]),
        hand_over_ms=median_of([HAND_OVER]),
    )


def _first_second_and_steady(fn, steady_calls: int):
    """ms of the first call and of the second (each synchronized), then ms per call of
    ``steady_calls`` more."""
    import torch

    calls = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        calls.append((time.perf_counter() - start) * 1e3)
    start = time.perf_counter()
    for _ in range(steady_calls):
        fn()
    torch.cuda.synchronize()
    return calls[0], calls[1], (time.perf_counter() - start) * 1e3 / steady_calls


def _interleaved(candidates, sizes, make_call, steady_calls):
    """{candidate: ([first ms per size], [second ms per size], [steady ms per size])}, the
    order rotating per size."""
    results = {name: ([], [], []) for name in candidates}
    for i, size in enumerate(sizes):
        order = candidates[i % len(candidates):] + candidates[: i % len(candidates)]
        for name in order:
            for column, ms in zip(results[name], _first_second_and_steady(make_call(name, size), steady_calls)):
                column.append(ms)
    return results


def sdpa_part(steady_calls: int):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn.attention import BACKWARD_OPERANDS, sdpa_backward, sdpa_forward

    graphs = {
        route: tch.register_graph(
            sdpa_forward, name=f"bench_new_shapes_sdpa_{route}", backward=tch.Backward.graph(sdpa_backward, operands=BACKWARD_OPERANDS),
            params=dict(causal=True), dynamic_shapes=route == "kernel_cache",
        )
        for route in ("static", "kernel_cache")
    }
    backends = {"torch flash": SDPBackend.FLASH_ATTENTION, "torch cuDNN backend": SDPBackend.CUDNN_ATTENTION}

    from torch_cudnn_handle.nn import sdpa

    def make_call(name, length):
        q, k, v = (torch.randn(2, length, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
        d_o = torch.randn(2, 8, length, 64, device="cuda", dtype=torch.bfloat16)

        def call():
            if name in backends:
                with sdpa_kernel(backends[name]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif name == "library buckets":
                with tch.settings.override(attention_buckets=True):
                    o = sdpa(q, k, v, True)
            else:
                o = tch.execute(graphs[name.split()[-1]], [q, k, v])[0]
            torch.autograd.grad(o, (q, k, v), d_o)

        return call

    candidates = ["library static", "library kernel_cache", "library buckets", *backends]
    results = _interleaved(candidates, LENGTHS, make_call, steady_calls)
    builds = {f"library {route}": [b for g in (gid, tch.registry.definition(gid).backward_id) for b in tch.built_graphs(g)]
              for route, gid in graphs.items()}
    return results, builds, lambda built: built.inputs[0].shape[2]  # a graph's length: q's S


def linear_part(steady_calls: int):
    import torch
    import torch.nn.functional as F

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import FusedLinear
    from torch_cudnn_handle.nn.linear import forward_views, linear_forward

    static = FusedLinear(1024, 1024, activation="gelu", device="cuda", dtype=torch.bfloat16)
    cached = FusedLinear(1024, 1024, activation="gelu", device="cuda", dtype=torch.bfloat16)
    cached.load_state_dict(static.state_dict())
    cached._graph = tch.register_graph(  # the module's forward graph (its operand views), with a kernel cache
        linear_forward, name="bench_new_shapes_linear_gelu_kernel_cache", views=forward_views("gelu"), params=dict(activation="gelu"),
        dynamic_shapes=True,
    )
    modules = {"library static": static, "library kernel_cache": cached}

    background = FusedLinear(1024, 1024, activation="gelu", device="cuda", dtype=torch.bfloat16)
    background.load_state_dict(static.state_dict())
    background._graph = tch.register_graph(  # its own graph id, so its layouts are new to it too
        linear_forward, name="bench_new_shapes_linear_gelu_background", views=forward_views("gelu"), params=dict(activation="gelu"),
    )
    modules = {**modules, "library background": background}

    def make_call(name, tokens):
        x = torch.randn(1, tokens, 1024, device="cuda", dtype=torch.bfloat16)

        @torch.no_grad()
        def call():
            if name == "library background":
                with tch.settings.override(background_builds=True):
                    modules[name](x)
            elif name in modules:
                modules[name](x)
            else:
                F.gelu(F.linear(x, static.weight, static.bias))

        return call

    results = _interleaved(["library static", "library kernel_cache", "library background", "torch linear+gelu"], TOKENS, make_call,
                           steady_calls)
    builds = {name: tch.built_graphs(module._graph) for name, module in modules.items()}
    return results, builds, lambda built: built.inputs[0].shape[1]  # a graph's token count


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
    stats = tch.stats.graphs()
    store = tch.stats.plan_store()
    obtain = sum(stats["phase_seconds"].get(p, 0.0) for p in OBTAIN_PHASES)
    keys = ("plan_seconds", "phase_seconds", "builds", "routes")
    with open(report_path, "w") as file:
        json.dump(dict(first_step_s=first_step, obtain_seconds=obtain, **{k: stats[k] for k in keys},
                       **{f"disk_{k}": store[k] for k in ("hits", "misses", "writes", "rejected")}), file)


def processes_part():
    with tempfile.TemporaryDirectory() as directory:
        environment = dict(os.environ, TORCH_CUDNN_HANDLE_PLAN_STORE="1", TORCH_CUDNN_HANDLE_PLAN_STORE_DIR=os.path.join(directory, "plans"))
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
    parser.add_argument("--shapes", type=int, help="draw this many new lengths from [64, 4096] (default: the 12 fixed ones)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--skip-processes", action="store_true")
    parser.add_argument("--hand-over", choices=("build", "second_call"), default="build",
                        help="when the library hands a plan to its native path (the native_hand_over setting)")
    parser.add_argument("--block-process", help=argparse.SUPPRESS)  # part 3's child: write its report here
    args = parser.parse_args()
    require_cuda_gpu(__file__)
    if args.block_process:
        return block_process(args.block_process)
    import torch_cudnn_handle as tch

    if args.shapes:
        draw_shapes(args.shapes, args.seed)
    tch.settings.set_native_path(True)
    tch.settings.set_native_hand_over(args.hand_over)
    tch.settings.set_plan_store(False)  # parts 1 and 2 measure builds
    median = statistics.median
    figures = {}
    for title, part in (
        (f"causal SDPA fwd+bwd, bf16 B=2 H=8 D=64, {len(LENGTHS)} new lengths {LENGTHS[0]}..{LENGTHS[-1]}", sdpa_part),
        (f"FusedLinear(1024, 1024, gelu) forward, bf16, {len(TOKENS)} new token counts {TOKENS[0]}..{TOKENS[-1]}", linear_part),
    ):
        results, builds, size_of = part(args.steady_calls)
        print(f"\n{title}\n{'candidate':<24}{'first call ms':>15}{'second ms':>11}{'steady ms':>12}{'builds s':>10}{'first calls s':>15}"
              "  (medians over sizes; builds and first calls: totals)")
        figures[title] = {}
        for name, (first, second, steady) in results.items():
            built = builds.get(name) or []
            entry = figures[title][name] = dict(
                first_ms=median(first), second_ms=median(second), steady_ms=median(steady), first_ms_each=first,
                second_ms_each=second, steady_ms_each=steady,
            )
            total = sum(b.build_seconds for b in built) if built else None
            entry["first_seconds_total"] = sum(first) / 1e3
            print(f"{name:<24}{median(first):>15.2f}{median(second):>11.2f}{median(steady):>12.3f}"
                  + (f"{'':>10}" if total is None else f"{total:>10.2f}") + f"{sum(first) / 1e3:>15.2f}")
            if built:
                entry.update(new_length_breakdown(built, size_of), build_seconds_total=total, routes=sorted({b.route for b in built}))
                phases = entry["phase_ms"]
                print(f"{'':<4}a new length, ms (median): cuDNN {entry['cudnn_ms']:.2f}, library {entry['library_ms']:.2f} "
                      f"(goal <= {GOAL_LIBRARY_MS:g}: {'met' if entry['library_ms'] <= GOAL_LIBRARY_MS else 'NOT met'}), "
                      f"first execution {entry['first_execution_ms']:.2f}; native hand-over at the second call "
                      f"{entry['hand_over_ms']:.2f}; routes {entry['routes']}")
                print(f"{'':<4}by phase: " + ", ".join(f"{p} {phases[p]:.2f}" for p in PHASES if p in phases))

        torch_names = [n for n in figures[title] if n.startswith("torch")]
        for name, entry in figures[title].items():
            if name.startswith("library") and name != "library static":
                against = ", ".join(f"{entry['first_seconds_total'] / figures[title][t]['first_seconds_total']:.2f}x {t}" for t in torch_names)
                steady = entry["steady_ms"] / figures[title]["library static"]["steady_ms"]
                print(f"{'':<4}{name}: first calls {against}; steady {steady:.2f}x library static")

    if not args.skip_processes:
        cold, warm = processes_part()
        ratio = warm["obtain_seconds"] / cold["obtain_seconds"] if cold["obtain_seconds"] else float("nan")
        whole = warm["plan_seconds"] / cold["plan_seconds"] if cold["plan_seconds"] else float("nan")
        print("\nTransformerBlock(512, 8) bf16, batch 8x256, one training step, two processes sharing a plan store")
        print(f"{'process':<12}{'obtain s':>10}{'plan s':>9}{'start->first step s':>21}{'builds':>8}{'disk hits':>11}{'writes':>8}{'rejected':>10}")
        for name, report in (("1 (cold)", cold), ("2 (warm)", warm)):
            print(f"{name:<12}{report['obtain_seconds']:>10.3f}{report['plan_seconds']:>9.3f}{report['first_step_s']:>21.2f}{report['builds']:>8}"
                  f"{report['disk_hits']:>11}{report['disk_writes']:>8}{report['disk_rejected']:>10}")
        print(f"plan obtaining seconds, process 2 / process 1: {ratio:.3f} (goal <= {GOAL_PLAN_RATIO}: "
              f"{'met' if ratio <= GOAL_PLAN_RATIO else 'NOT met'}); all plan seconds: {whole:.3f}")
        print("  by phase, ms (cold / warm): " + ", ".join(
            f"{p} {cold['phase_seconds'].get(p, 0) * 1e3:.1f}/{warm['phase_seconds'].get(p, 0) * 1e3:.1f}" for p in PHASES
            if p in cold["phase_seconds"] or p in warm["phase_seconds"]))
        figures["second process"] = dict(cold=cold, warm=warm, plan_ratio=ratio, plan_seconds_ratio=whole, goal=GOAL_PLAN_RATIO)

    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=1)


if __name__ == "__main__":
    main()
