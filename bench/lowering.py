"""An unmodified model lowered onto cuDNN graphs (``lowering.backend()``) against inductor (issue 45).

The ``transformers`` package's ``LlamaForCausalLM`` (hand-written RMSNorm, grouped-query
attention, SwiGLU) and ``GPT2LMHeadModel`` (LayerNorm, attention; its Conv1D + tanh-gelu MLP
stays inductor's), random weights, bf16, ``--layers`` layers, at three sizes:

1. steady step, training (forward + backward of a mean-square loss on the logits) and
   inference (forward under no_grad), GPU ms per step (CUDA events, candidates interleaved):
   eager, ``torch.compile`` (inductor, default mode), ``mode="max-autotune-no-cudagraphs"``
   (at ``--autotune-sizes`` only: its compile takes minutes), and the lowering, all of it and
   (at ``--per-pattern-sizes``) each pattern group alone (``backend(patterns=...)``): which
   pattern gains and which loses against inductor;
2. the share of the lowered training step's GPU time in kernels the library's graphs launch
   (torch.profiler: kernels whose innermost op is ``cudnn_fe::execute`` or its backward node);
3. ``dynamic=True``, the first and third training steps at ``--lengths`` new sequence lengths
   (after one unmeasured length: the compile), inductor's and the lowering's (by default:
   torch's ops serve a new length's first two calls at each site while its plans build, and
   the third takes them; and with ``stand_in_calls=0``: built in the call), wall ms, medians.
Both compile with ``torch._dynamo.config.specialize_float = True``, so a norm's eps stays a
constant the lowering can bake in under ``dynamic=True``.

    python bench/lowering.py [--models llama,gpt2] [--sizes small,medium,large] [--lengths 20] [--parts steady,lengths] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test"))
from timing import compare_cuda_ms, device_kernels, report, require_cuda_gpu, save  # noqa: E402

SIZES = {  # dim, heads, batch, sequence length
    "small": (1024, 16, 4, 1024),
    "medium": (2048, 16, 4, 2048),
    "large": (4096, 32, 2, 4096),
}
GOALS = {"small": 0.90, "medium": 0.90, "large": 1.00}  # the lowering / inductor, training and inference


def build(name: str, size: str, layers: int):
    import torch
    from support.models import transformers_model

    dim, heads, _, length = SIZES[size]
    torch.manual_seed(0)
    model = transformers_model(name, dim=dim, layers=layers, heads=heads, kv_heads=heads // 4, vocab=8192, positions=4096)
    return model.to(device="cuda", dtype=torch.bfloat16)


def steps(model, ids):
    import torch

    def train():
        model.zero_grad(set_to_none=True)
        model(ids).logits.float().square().mean().backward()

    def infer():
        with torch.no_grad():
            model(ids)

    return train, infer


PATTERN_GROUPS = {"lowered: attention": ["attention"], "lowered: norms": ["rms_norm", "layer_norm"], "lowered: linears": ["linear_activation"]}


def compiled(model, how: str):
    import torch
    from torch_cudnn_handle import lowering

    model = copy.deepcopy(model)
    if how == "eager":
        return model
    if how.startswith("lowered"):
        return torch.compile(model, backend=lowering.backend(patterns=PATTERN_GROUPS.get(how)))
    return torch.compile(model, mode=None if how == "inductor" else how)


def cudnn_share(step) -> float:
    """The share of ``step``'s GPU time in kernels launched inside the op or its backward node."""
    kernels, prof = device_kernels(step, steps=3, warmup=2)
    for name, (launches, us) in list(kernels.items())[:8]:
        print(f"  {us:9.1f} us  {launches:4.0f}x  {name[:110]}")
    ours = total = 0.0
    for event in prof.key_averages():
        total += event.self_device_time_total
        if event.key.startswith("cudnn_fe::") or ("ExecuteFunction" in event.key and "evaluate_function" not in event.key):
            ours += event.self_device_time_total
    return ours / total if total else 0.0


def steady(name: str, size: str, args, rows: list) -> None:
    import torch

    model = build(name, size, args.layers)
    _, _, batch, length = SIZES[size]
    ids = torch.randint(0, 8192, (batch, length), device="cuda")
    hows = ["eager", "inductor", "lowered"] + (["max-autotune-no-cudagraphs"] * (size in args.autotune_sizes.split(",")))
    hows += list(PATTERN_GROUPS) * (size in args.per_pattern_sizes.split(","))
    candidates = {how: steps(compiled(model, how), ids) for how in hows}
    for index, mode in enumerate(("training", "inference")):
        figures = compare_cuda_ms({how: pair[index] for how, pair in candidates.items()}, calls=args.calls, rounds=args.rounds)
        title = f"{name} {size} (dim {SIZES[size][0]}, batch {batch}, length {length}) {mode} step, GPU ms (in the us column)"
        rows += report(title, figures, "inductor", {"lowered": GOALS[size]})
    share = cudnn_share(candidates["lowered"][0])
    print(f"\nlowered training step: {share:.0%} of its GPU time in the library's graphs")
    rows.append(dict(table=f"{name} {size} share", candidate="lowered", share=share))
    torch._dynamo.reset()


def new_lengths(name: str, args, rows: list) -> None:
    """The first training step at each new length, and the third (where the plans take over:
    Note [A new layout's first calls]), inductor's and the lowering's."""
    import torch

    from torch_cudnn_handle import lowering, settings

    size = args.sizes.split(",")[0]
    model = build(name, size, args.layers)
    _, _, batch, top = SIZES[size]
    named = {"inductor": "inductor", "lowered": "lowered", "built_in_call": "lowered, stand_in_calls=0"}
    hows = [named[name] for name in args.length_candidates.split(",")]
    drawn = random.Random(0).sample(range(128, top + 1), len(hows) * (args.lengths + 1))  # each its own: no plan built before
    firsts, thirds = {}, {}
    for index, how in enumerate(hows):
        lengths = drawn[index::len(hows)]
        backend = "inductor" if how == "inductor" else lowering.backend()
        model_compiled = torch.compile(copy.deepcopy(model), backend=backend, dynamic=True)
        times = []
        with settings.override(**({"stand_in_calls": 0} if how.endswith("=0") else {})):  # else the environment's (default 2)
            for length in lengths:
                train, _ = steps(model_compiled, torch.randint(0, 8192, (batch, length), device="cuda"))
                times.append([])
                for _ in range(3):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    train()
                    torch.cuda.synchronize()
                    times[-1].append((time.perf_counter() - start) * 1e3)
        firsts[how] = statistics.median(t[0] for t in times[1:])  # the first length compiled the frame
        thirds[how] = statistics.median(t[2] for t in times[1:])
    rows += report(f"{name} {size}, dynamic=True: first training step at {args.lengths} new lengths, median wall ms (us column)", firsts,
                   "inductor", {"lowered": 1.5})
    rows += report(f"{name} {size}, dynamic=True: third training step at each length, median wall ms (us column)", thirds, "inductor")
    torch._dynamo.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--sizes", default="small,medium,large")
    parser.add_argument("--autotune-sizes", default="medium")
    parser.add_argument("--per-pattern-sizes", default="small", help="sizes where each pattern group is also lowered alone")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lengths", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parts", default="steady,lengths", help="steady: the steady steps; lengths: first steps at new lengths")
    parser.add_argument("--length-candidates", default="inductor,lowered,built_in_call",
                        help="the lengths part's candidates: inductor, lowered (the environment's settings), built_in_call (stand_in_calls=0)")
    parser.add_argument("--json")
    args = parser.parse_args()
    require_cuda_gpu(__file__)
    import torch

    torch._dynamo.config.cache_size_limit = torch._dynamo.config.accumulated_cache_size_limit = 512  # every candidate compiled
    torch._dynamo.config.specialize_float = True  # a LayerNorm's eps stays a constant under dynamic=True (docs/torch-compile.md)
    rows = []
    for name in args.models.split(","):
        for size in args.sizes.split(",") if "steady" in args.parts else ():
            steady(name, size, args, rows)
            save(rows, args.json)
        if args.lengths and "lengths" in args.parts:
            new_lengths(name, args, rows)
            save(rows, args.json)


if __name__ == "__main__":
    main()
