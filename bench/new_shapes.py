"""What a new shape costs: first calls at shapes never seen before, steady calls once built (issues 29, 44).

Every part draws ``--shapes`` distinct sizes (seeded), runs each candidate's first call at
each size (synchronized; candidates interleaved, the order rotating per size, after one
call each at a size not measured: torch's lazy imports), then, once the library's builds
off the caller's path are done (``registry.wait_for_builds``), its steady time per size of
the subset (CUDA events over ``--steady-calls`` back-to-back calls). Candidates whose every
first call is a cuDNN build (``--subset`` of the sizes) are timed on a subset, and their
total over all sizes is the subset's mean times the count (marked "est."). "library" is a
module as it comes, with the settings of the environment (by default a new size's first
calls run torch's ops while its plans build: Note [A new layout's first calls]).

1. ``sdpa``: causal SDPA fwd+bwd, bf16, B=2 H=8 D=64, q/k/v token-major (as Attention's
   projections give them), lengths from [64, 4096]: ``nn.sdpa``; with ``attention_buckets``
   (Note [Length buckets]; with ``--sdpa-off-path`` also ``serving_mode``: Note
   [Attention off the caller's path]); the dense graph built per length (the static route; the
   kernel-cache route where cuDNN accepts dynamic shapes); torch flash; torch's cuDNN backend.
2. ``linear``: ``FusedLinear(1024, 1024, "gelu")`` forward, and forward + backward, at
   token counts 4x those lengths: the module; its forward graph built in the call (static;
   kernel cache where accepted); torch eager. ``linear_buckets``: the raw op's route for the
   same forward, a graph registered with token buckets (Note [Size buckets]), built off the
   caller's path.
3. ``block``: ``TransformerBlock(1024, 16)`` bf16, batch 2: the first training step at
   ``--block-lengths`` new lengths against the steady step at that length, the library's
   and torch eager's.
4. ``processes``: two processes sharing a plan store run the main job's block's first
   training step: plan obtaining seconds, cold and warm (goal <= 0.1).
5. ``repro``: two processes sharing a plan store (the first builds, the second loads) run
   one sequence of new sizes (a ``TransformerBlock(256, 4)``'s training steps, 3 per length),
   with the settings of the environment, then again under deterministic algorithms: every
   output and gradient hashed, the runs compared bitwise.

Parts 1-3 run with the plan store off, unless ``--plan-store DIR``: then a first run fills DIR and
a second run with the same DIR is the second process, its plans loaded.

    python bench/new_shapes.py [--shapes 200 --seed 0] [--parts sdpa,linear,linear_buckets,block,processes,repro] [--plan-store DIR] [--json out.json]
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()  # part 4: a process's start, before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from timing import cuda_ms_per_call, require_cuda_gpu  # noqa: E402
from torch_cudnn_handle.registry.build_timing import OBTAIN_PHASES  # noqa: E402

GOAL_PLAN_RATIO = 0.1


def draw(count: int, seed: int, low: int = 64, high: int = 4096) -> list:
    return sorted(random.Random(seed).sample(range(low, high + 1), count))


def _synchronized_ms(fn) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def _steady_ms(call, calls: int) -> float:
    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn.attention_routes import TAKE_OVER_CALLS

    for _ in range(TAKE_OVER_CALLS + 1):  # an exact plan's take-over starts (Note [Attention off the caller's path])
        call()
    tch.registry.wait_for_builds(120)
    call()  # the exact plan's first call: its backward builds
    tch.registry.wait_for_builds(120)
    for _ in range(3):  # a second sighting of the addresses captures the native CUDA graph
        call()
    return cuda_ms_per_call(call, calls)


def run_part(candidates: dict, sizes: list, subset: set, steady_calls: int) -> dict:
    """``candidates``: name -> (make_call(size) -> call, on the subset only). First calls
    interleaved per size, then steady calls per size once every build is done."""
    import torch_cudnn_handle as tch

    names = list(candidates)
    first = {name: {} for name in names}
    for name in names:  # once per process, at a size not measured: torch's lazy imports (the first autograd.grad imports sympy, 2 s)
        candidates[name][0](sizes[0] - 1)()
    tch.registry.wait_for_builds(900)
    for i, size in enumerate(sizes):
        for name in names[i % len(names):] + names[: i % len(names)]:
            make, subset_only = candidates[name]
            if not subset_only or size in subset:
                first[name][size] = _synchronized_ms(make(size))
    waited = time.perf_counter()
    still_building = tch.registry.wait_for_builds(900)
    waited = time.perf_counter() - waited
    # Steady calls at the subset's sizes (every candidate has them): the figure compared with the exact plan's.
    steady = {name: {size: _steady_ms(candidates[name][0](size), steady_calls) for size in first[name] if size in subset} for name in names}
    results = {}
    for name in names:
        firsts = list(first[name].values())
        estimated = len(firsts) < len(sizes)
        results[name] = dict(
            first_ms_median=statistics.median(firsts), steady_ms_median=statistics.median(steady[name].values()),
            first_seconds_total=(statistics.fmean(firsts) * len(sizes) if estimated else sum(firsts)) / 1e3, estimated=estimated,
            first_ms=first[name], steady_ms=steady[name],
        )
    results["_builds"] = dict(wait_seconds=waited, still_building=still_building, build_processes=tch.stats.build_processes(),
                              graphs=tch.stats.graphs())
    return results


def kernel_cache_accepted() -> bool:
    """Whether the library builds with dynamic shapes on this cuDNN (kernel_caches.MIN_BACKEND):
    the kernel-cache candidates."""
    import cudnn

    from torch_cudnn_handle.registry.plans.kernel_caches import MIN_BACKEND

    return cudnn.backend_version() >= MIN_BACKEND


def sdpa_candidates(off_path: bool) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import sdpa
    from torch_cudnn_handle.nn.attention import BACKWARD_OPERANDS, sdpa_backward, sdpa_forward

    routes = ("static", "kernel_cache") if kernel_cache_accepted() else ("static",)
    graphs = {route: tch.register_graph(sdpa_forward, name=f"bench_new_shapes_sdpa_{route}", params=dict(causal=True),
                                        backward=tch.Backward.graph(sdpa_backward, operands=BACKWARD_OPERANDS),
                                        dynamic_shapes=route == "kernel_cache") for route in routes}

    def maker(name):
        def make(length):
            q, k, v = (torch.randn(2, length, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
            d_o = torch.randn(2, 8, length, 64, device="cuda", dtype=torch.bfloat16)

            def call():
                if name == "library":  # nn.sdpa as it comes: the settings of the environment (by default: Note [A new layout's first calls])
                    o = sdpa(q, k, v, True)
                elif name == "library buckets":
                    with tch.settings.override(attention_buckets=True):
                        o = sdpa(q, k, v, True)
                elif name == "library off path":  # Note [Attention off the caller's path]
                    with tch.settings.override(attention_buckets=True, serving_mode=True):
                        o = sdpa(q, k, v, True)
                elif name.startswith("library"):
                    o = tch.execute(graphs[name.split()[-1]], [q, k, v])[0]
                else:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION if name == "torch flash" else SDPBackend.CUDNN_ATTENTION):
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(o, (q, k, v), d_o)

            return call

        return make

    # The two bucket candidates share their bucket plans: one of them per run.
    buckets = "library off path" if off_path else "library buckets"
    names = {"library": False, buckets: False, **{f"library {route}": True for route in routes}, "torch flash": False,
             "torch cuDNN backend": True}
    return {name: (maker(name), subset_only) for name, subset_only in names.items()}


def linear_candidates(backward: bool, buckets: bool = False) -> dict:
    """FusedLinear's candidates; ``buckets``: the raw op's token buckets instead (a part of their
    own: their builds would hold the helpers FusedLinear's background builds use)."""
    import torch
    import torch.nn.functional as F

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import FusedLinear
    from torch_cudnn_handle.nn.linear import forward_views, linear_forward

    module = FusedLinear(1024, 1024, activation="gelu", device="cuda", dtype=torch.bfloat16)
    routes = ("static", "kernel_cache") if kernel_cache_accepted() and not backward and not buckets else ("static",) if not backward else ()
    graphs = {route: tch.register_graph(linear_forward, name=f"bench_new_shapes_linear_{route}", views=forward_views("gelu"),
                                        params=dict(activation="gelu"), dynamic_shapes=route == "kernel_cache") for route in routes}
    if buckets:  # the raw op's route: token buckets (Note [Size buckets]), built off the caller's path
        graphs["buckets"] = tch.register_graph(linear_forward, name="bench_new_shapes_linear_buckets", params=dict(activation="gelu"),
                                               buckets=tch.Buckets({0: 1}, {0: 1, 1: 1}), serving_mode=True)
    weight_kn, bias_row = module.weight.detach().t().unsqueeze(0), module.bias.detach().view(1, 1, -1)

    def maker(name):
        def make(tokens):
            x = torch.randn(1, tokens, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
            d_y = torch.randn(1, tokens, 1024, device="cuda", dtype=torch.bfloat16)

            def call():
                with torch.set_grad_enabled(backward):
                    if name == "library":
                        y = module(x)
                    elif name == "library buckets":
                        y = tch.execute(graphs["buckets"], [x, weight_kn, bias_row])[0]
                    elif name.startswith("library"):
                        y = tch.execute(graphs[name.split()[-1]], [x, module.weight, module.bias])[0]
                    else:
                        y = F.gelu(F.linear(x, module.weight, module.bias))
                    if backward:
                        torch.autograd.grad(y, (x, module.weight, module.bias), d_y)

            return call

        return make

    names = {"library buckets" if buckets else "library": False, **{f"library {route}": True for route in routes}, "torch eager": False}
    return {name: (maker(name), subset_only) for name, subset_only in names.items()}


def block_part(lengths: list, steady_steps: int = 5) -> dict:
    import torch

    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import TransformerBlock, reference_of

    torch.manual_seed(0)
    block = TransformerBlock(1024, 16, device="cuda", dtype=torch.bfloat16)
    models = {"library": block, "torch eager": reference_of(block)}
    figures = {name: dict(first_ms={}, third_ms={}, steady_ms={}) for name in models}
    for i, length in enumerate(lengths):
        x = torch.randn(2, length, 1024, device="cuda", dtype=torch.bfloat16)

        def step(model):
            model.zero_grad(set_to_none=True)
            model(x).float().square().mean().backward()

        for name in list(models)[i % 2:] + list(models)[: i % 2]:
            figures[name]["first_ms"][length] = _synchronized_ms(lambda: step(models[name]))
        for name, model in models.items():  # steps 2 and 3 at the length, builds not waited for
            _synchronized_ms(lambda: step(model))
            figures[name]["third_ms"][length] = _synchronized_ms(lambda: step(model))
        tch.registry.wait_for_builds(900)
        for name, model in models.items():
            figures[name]["steady_ms"][length] = statistics.median(_synchronized_ms(lambda: step(model)) for _ in range(steady_steps))
    for entry in figures.values():
        entry["first_over_steady_median"] = statistics.median(entry["first_ms"][n] / entry["steady_ms"][n] for n in lengths)
        entry["first_ms_median"] = statistics.median(entry["first_ms"].values())
        entry["third_ms_median"] = statistics.median(entry["third_ms"].values())
        entry["steady_ms_median"] = statistics.median(entry["steady_ms"].values())
    return figures


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
    tch.registry.wait_for_builds(300)  # plans built or loaded off the first step's path (its stand-ins served it) count too
    stats = tch.stats.graphs()
    store = tch.stats.plan_store()
    obtain = sum(stats["phase_seconds"].get(p, 0.0) for p in OBTAIN_PHASES)
    keys = ("plan_seconds", "phase_seconds", "builds", "plan_sources", "routes")
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


def repro_process(path: str, deterministic: bool) -> None:
    """Part 5, one process: the sequence, each step's output and gradients hashed (sha256 of their bytes)."""
    import hashlib

    import torch

    from torch_cudnn_handle.nn import TransformerBlock

    torch.use_deterministic_algorithms(deterministic)
    torch.manual_seed(0)
    block = TransformerBlock(256, 4, device="cuda", dtype=torch.bfloat16)
    digests = []
    for length in draw(6, 7, 32, 512):
        x = torch.randn(2, length, 256, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(length))
        for _ in range(3):  # a stand-in's calls, then the plan's
            block.zero_grad(set_to_none=True)
            y = block(x)
            y.float().square().mean().backward()
            hashed = hashlib.sha256()
            for t in [y] + [p.grad for p in block.parameters()]:
                hashed.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
            digests.append(hashed.hexdigest()[:16])
    with open(path, "w") as file:
        json.dump(digests, file)


def repro_part() -> dict:
    """Two processes of one sequence, by default and under deterministic algorithms: bitwise equal or not."""
    found = {}
    with tempfile.TemporaryDirectory() as directory:
        environment = dict(os.environ, TORCH_CUDNN_HANDLE_PLAN_STORE="1", TORCH_CUDNN_HANDLE_PLAN_STORE_DIR=os.path.join(directory, "plans"))
        environment["PYTHONPATH"] = os.pathsep.join([ROOT, environment.get("PYTHONPATH", "")])
        for mode in ("default", "deterministic"):
            runs = []
            for i in (1, 2):
                path = os.path.join(directory, f"{mode}{i}.json")
                command = [sys.executable, os.path.abspath(__file__), "--repro-process", path] + (["--deterministic"] if mode != "default" else [])
                subprocess.run(command, env=environment, check=True)
                with open(path) as file:
                    runs.append(json.load(file))
            found[mode] = dict(steps=len(runs[0]), equal=runs[0] == runs[1], differing=[i for i, (a, b) in enumerate(zip(*runs)) if a != b])
    return found


def print_part(title: str, results: dict, baseline_torch: str) -> None:
    print(f"\n{title}\n{'candidate':<26}{'first call ms':>14}{'steady ms':>11}{'first calls s':>15}   (medians over sizes; first calls: total)")
    for name, entry in results.items():
        if name.startswith("_"):
            continue
        total = f"{entry['first_seconds_total']:.2f}{' est.' if entry['estimated'] else ''}"
        print(f"{name:<26}{entry['first_ms_median']:>14.2f}{entry['steady_ms_median']:>11.3f}{total:>15}")
    torch_total = results[baseline_torch]["first_seconds_total"]
    for name, entry in results.items():
        if name.startswith("library"):
            print(f"    {name}: first calls {entry['first_seconds_total'] / torch_total:.2f}x {baseline_torch}"
                  + "".join(f", {entry['first_seconds_total'] / results[t]['first_seconds_total']:.3f}x {t}"
                            for t in results if t.startswith("torch") and t != baseline_torch))
    exact = results.get("library static", {}).get("steady_ms", {})
    for name, entry in results.items():
        shared = [size for size in entry.get("steady_ms", {}) if size in exact] if name.startswith("library") and name != "library static" else []
        if shared:
            ratios = [entry["steady_ms"][size] / exact[size] for size in shared]
            print(f"    {name}: steady {statistics.median(ratios):.2f}x the exact plan's (median over {len(shared)} sizes)")
    builds = results["_builds"]
    print(f"    waited {builds['wait_seconds']:.1f} s for builds off the caller's path; build processes {builds['build_processes']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=200, help="new sizes per part (lengths from [64, 4096])")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subset", type=int, default=16, help="sizes the build-per-size candidates are timed at")
    parser.add_argument("--block-lengths", type=int, default=20)
    parser.add_argument("--steady-calls", type=int, default=20)
    parser.add_argument("--parts", default="sdpa,linear,linear_buckets,block,processes,repro")
    parser.add_argument("--sdpa-off-path", action="store_true", help="sdpa by buckets with background builds (else buckets in the call)")
    parser.add_argument("--plan-store", metavar="DIR", help="parts 1-3 with the plan store in DIR (else off: they measure builds); "
                        "run twice with one DIR for the first process (store empty) and the second (store warm)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--block-process", help=argparse.SUPPRESS)  # part 4's child: write its report here
    parser.add_argument("--repro-process", help=argparse.SUPPRESS)  # part 5's child: write its digests here
    parser.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    require_cuda_gpu(__file__)
    if args.block_process:
        return block_process(args.block_process)
    if args.repro_process:
        return repro_process(args.repro_process, args.deterministic)
    import cudnn

    import torch_cudnn_handle as tch

    tch.settings.set_plan_store(bool(args.plan_store))  # off: parts 1-3 measure builds
    if args.plan_store:
        tch.settings.set_plan_store_dir(args.plan_store)
    parts = args.parts.split(",")
    lengths = draw(args.shapes, args.seed)
    subset = set(random.Random(args.seed + 1).sample(lengths, min(args.subset, len(lengths))))
    figures = dict(cudnn=cudnn.backend_version(), lengths=lengths, subset=sorted(subset))
    if "sdpa" in parts:
        figures["sdpa"] = run_part(sdpa_candidates(args.sdpa_off_path), lengths, subset, args.steady_calls)
        print_part(f"causal SDPA fwd+bwd, bf16 B=2 H=8 D=64, {len(lengths)} new lengths {lengths[0]}..{lengths[-1]}", figures["sdpa"],
                   "torch flash")
    tokens = [4 * n for n in lengths]
    token_subset = {4 * n for n in subset}
    linear_parts = [(False, False), (True, False)] if "linear" in parts else []
    for backward, buckets in linear_parts + ([(False, True)] if "linear_buckets" in parts else []):
        key = "linear_buckets_fwd" if buckets else "linear_fwd_bwd" if backward else "linear_fwd"
        figures[key] = run_part(linear_candidates(backward, buckets), tokens, token_subset, args.steady_calls)
        print_part(f"{'the raw op, linear + bias + gelu with token buckets' if buckets else 'FusedLinear(1024, 1024, gelu)'} "
                   f"{'fwd+bwd' if backward else 'fwd'}, bf16, {len(tokens)} new token counts {tokens[0]}..{tokens[-1]}", figures[key],
                   "torch eager")
    if "block" in parts:
        block_lengths = draw(args.block_lengths, args.seed + 2)
        figures["block"] = block_part(block_lengths)  # the settings of the environment: by default, the first calls' stand-ins
        print(f"\nTransformerBlock(1024, 16) bf16 batch 2, first training step at {len(block_lengths)} new lengths "
              f"{block_lengths[0]}..{block_lengths[-1]} (medians over lengths)")
        for name, entry in figures["block"].items():
            print(f"{name:<14} first step {entry['first_ms_median']:.1f} ms, third {entry['third_ms_median']:.1f} ms, "
                  f"steady {entry['steady_ms_median']:.2f} ms, "
                  f"first / steady {entry['first_over_steady_median']:.2f}x")
        mine, eager = figures["block"]["library"], figures["block"]["torch eager"]
        print(f"    library / torch eager: first step {mine['first_ms_median'] / eager['first_ms_median']:.2f}x (goal <= 1.5), "
              f"steady {mine['steady_ms_median'] / eager['steady_ms_median']:.2f}x (goal <= 1)")
    if "processes" in parts:
        cold, warm = processes_part()
        ratio = warm["obtain_seconds"] / cold["obtain_seconds"] if cold["obtain_seconds"] else float("nan")
        print(f"\nTransformerBlock(512, 8), two processes sharing a plan store: plan obtaining {cold['obtain_seconds']:.3f} s cold, "
              f"{warm['obtain_seconds']:.3f} s warm, {ratio:.3f}x (goal <= {GOAL_PLAN_RATIO}); first step "
              f"{cold['first_step_s']:.2f} s / {warm['first_step_s']:.2f} s after start")
        figures["second process"] = dict(cold=cold, warm=warm, plan_ratio=ratio, goal=GOAL_PLAN_RATIO)
    if "repro" in parts:
        figures["repro"] = repro_part()
        for mode, found in figures["repro"].items():
            print(f"\ntwo processes, {found['steps']} training steps at new lengths ({mode}): "
                  f"{'bitwise equal' if found['equal'] else 'DIFFER at steps ' + str(found['differing'])}")
    if args.plan_store:
        figures["plan_store"] = tch.stats.plan_store()
        print(f"\nplan store {args.plan_store}: {figures['plan_store']}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=1, default=str)


if __name__ == "__main__":
    main()
