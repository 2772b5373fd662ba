"""The module table: every ``torch_cudnn_handle.nn`` module at a small, a medium and a
large size, forward and forward + backward, bf16, GPU milliseconds per step of

  (a) the library's module,
  (b) every torch alternative: for sdpa torch's flash and cuDNN backends
      (``sdpa_kernel([SDPBackend.FLASH_ATTENTION])`` / ``CUDNN_ATTENTION``); for the
      others the plain-torch reference (``reference_of(module)``, same parameters),
      eager and under ``torch.compile``, and for RMSNorm also ``F.rms_norm``,
  (c) the frontend's own torch op where there is one: ``cudnn.sdpa_torch``
      (``torch.ops.cudnn.sdpa_fwd``/``sdpa_bwd``) and ``cudnn.ops.norm.rms_norm``
      (``torch.ops.cudnn.rmsnorm``/``rmsnorm_bwd``); '-' with the reason otherwise,

and the ratio library / fastest alternative, per (module, size, fwd | fwd+bwd).

    python bench/modules.py [--quick] [--json out.json] [--only sdpa,rmsnorm,...] [--sizes small,...]

"fwd" is the forward of a training step (inputs and parameters require grad, so
every candidate also keeps what its backward needs: softmax stats, 1/rms, gelu's
pre-activation); "fwd+bwd" is that forward and ``.backward(dy)``, gradients set to
None before each step. Each figure: CUDA events around ``iters`` back-to-back steps
(``timing.cuda_ms_per_call``), the median of ``rounds`` rounds, candidates
interleaved; a forced sdpa backend is entered around a timed block, not per step.
``iters`` is chosen per (module, size, mode) so a block takes about ``--target-ms``.

The library's plan choice follows the environment: ``TORCH_CUDNN_HANDLE_TUNE=1``
(with ``TORCH_CUDNN_HANDLE_TUNING_FILE``) is the tuned run; ``bench/report.py`` runs
this script twice, untuned and tuned, each with its own baselines measured in its own
process. The JSON is rewritten after every (module, size), so a run that dies keeps
what it measured. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # timing

TUNE_ENV = "TORCH_CUDNN_HANDLE_TUNE"
TUNING_FILE_ENV = "TORCH_CUDNN_HANDLE_TUNING_FILE"
SDPA_PYTHON_ENV = "TORCH_CUDNN_SDPA_USE_PYTHON"  # the frontend's switch that serves torch's cuDNN SDPA from its Python API

MODULES = ("sdpa", "rmsnorm", "linear_gelu", "linear_relu", "block")
SIZES = ("small", "medium", "large")
MODES = ("fwd", "fwd+bwd")
LIBRARY = "library"
LIBRARY_COMPILED = "library compile"  # the library's module under torch.compile: a library variant, not an alternative

# (module key, size) -> shape; see each case builder for what the numbers mean.
SHAPES = {
    "sdpa": {"small": (4, 16, 1024, 64), "medium": (2, 16, 4096, 128), "large": (1, 16, 16384, 128)},  # B, H, S, D
    "rmsnorm": {"small": (4096, 1024), "medium": (16384, 4096), "large": (32768, 8192)},  # rows, hidden
    "linear": {"small": (2048, 1024, 4096), "medium": (8192, 4096, 4096), "large": (16384, 4096, 16384)},  # M, K -> N
    "block": {"small": (512, 8, 8, 256), "medium": (1024, 16, 8, 512), "large": (2048, 16, 4, 2048)},  # dim, heads, B, S
}
MODULE_LABELS = {
    "sdpa": "sdpa (causal)",
    "rmsnorm": "RMSNorm",
    "linear_gelu": "FusedLinear(gelu)",
    "linear_relu": "FusedLinear(relu)",
    "block": "TransformerBlock",
}
NO_FRONTEND_OP = {
    "linear_gelu": "cudnn 1.32 has no torch op for a dense linear + bias + gelu (its GEMM fusions are sm100 kernels: swiglu, srelu, amax)",
    "linear_relu": "cudnn 1.32 has no torch op for a dense linear + bias + relu (its GEMM fusions are sm100 kernels: swiglu, srelu, amax)",
    "block": "cudnn 1.32 has no torch op for a transformer block",
}


def tuned_from_env(environ=os.environ) -> bool:
    return environ.get(TUNE_ENV, "0").strip() == "1"  # as torch_cudnn_handle.plan_tuning reads it


def run_label(tuned: bool) -> str:
    return "tuned" if tuned else "untuned"


def reason_of(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160] if text else ''}".rstrip(": ")


# ---------------------------------------------------------------------------------
# Candidates and cases


class Candidate:
    """One way of computing the module: ``forward()`` returns the output; ``leaves``
    are the tensors whose ``.grad`` a training step resets; ``scope`` (a context
    manager factory) is entered around its warm-up and timed blocks."""

    def __init__(self, forward: Callable[[], object], leaves: List[object], scope: Optional[Callable[[], object]] = None):
        self.forward, self.leaves, self.scope = forward, list(leaves), scope

    def step(self, mode: str, dy) -> Callable[[], None]:
        forward, leaves = self.forward, self.leaves
        if mode == "fwd":
            return lambda: forward()

        def step():
            for tensor in leaves:
                tensor.grad = None
            forward().backward(dy)

        return step


class Case:
    def __init__(self, key: str, size: str, config: str, input_text: str):
        self.key, self.size, self.config, self.input = key, size, config, input_text
        self.candidates: Dict[str, Candidate] = {}
        self.unavailable: Dict[str, str] = {}
        self.dy = None
        self.check_against = ""  # the candidate whose forward output the others are compared to


def _compiled(reference, allow_compile: bool, case: Case):
    import torch

    if not allow_compile:
        case.unavailable["torch compile"] = "skipped (--no-compile)"
        return None
    return torch.compile(reference, dynamic=False)


def _sdpa_case(size: str, dtype, allow_compile: bool) -> Case:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torch_cudnn_handle.nn import sdpa

    b, h, s, d = SHAPES["sdpa"][size]
    case = Case("sdpa", size, f"sdpa(causal) D={d}", f"q, k, v [{b}, {h}, {s}, {d}]")
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype).requires_grad_() for _ in range(3))
    case.dy = torch.randn(b, h, s, d, device="cuda", dtype=dtype)
    leaves = [q, k, v]
    case.candidates[LIBRARY] = Candidate(lambda: sdpa(q, k, v, True), leaves)
    case.candidates["torch flash"] = Candidate(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), leaves, lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    )
    case.candidates["torch cuDNN"] = Candidate(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), leaves, lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])
    )
    try:
        import cudnn

        frontend_sdpa = cudnn.sdpa_torch  # registers torch.ops.cudnn.sdpa_fwd / sdpa_bwd
        # return_lse=True: its autograd needs the stats (a dense backward without them raises).
        case.candidates["frontend op"] = Candidate(lambda: frontend_sdpa(q, k, v, is_causal=True, return_lse=True)[0], leaves)
    except Exception as error:  # noqa: BLE001 -- reported in the table
        case.unavailable["frontend op"] = reason_of(error)
    case.check_against = "torch flash"
    return case


def _rmsnorm_case(size: str, dtype, allow_compile: bool) -> Case:
    import torch
    import torch.nn.functional as F

    from torch_cudnn_handle.nn import RMSNorm, reference_of

    rows, hidden = SHAPES["rmsnorm"][size]
    case = Case("rmsnorm", size, f"RMSNorm({hidden})", f"x [{rows}, {hidden}]")
    norm = RMSNorm(hidden, device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.add_(0.1 * torch.randn_like(norm.weight))  # a scale that is not all ones
    reference = reference_of(norm)
    compiled = _compiled(reference, allow_compile, case)
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype).requires_grad_()
    case.dy = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    case.candidates[LIBRARY] = Candidate(lambda: norm(x), [x, norm.weight])
    case.candidates["torch eager"] = Candidate(lambda: reference(x), [x, reference.weight])
    if compiled is not None:
        case.candidates["torch compile"] = Candidate(lambda: compiled(x), [x, reference.weight])
    eps = norm.eps
    case.candidates["torch F.rms_norm"] = Candidate(lambda: F.rms_norm(x, (hidden,), reference.weight, eps), [x, reference.weight])
    try:
        from cudnn.ops.norm import rms_norm as frontend_rms_norm  # torch.ops.cudnn.rmsnorm, differentiable

        case.candidates["frontend op"] = Candidate(lambda: frontend_rms_norm(x, norm.weight, eps=eps), [x, norm.weight])
    except Exception as error:  # noqa: BLE001 -- reported in the table
        case.unavailable["frontend op"] = reason_of(error)
    case.check_against = "torch eager"
    return case


def _linear_case(key: str, size: str, dtype, allow_compile: bool) -> Case:
    import torch

    from torch_cudnn_handle.nn import FusedLinear, reference_of

    activation = key.split("_")[1]
    m, k, n = SHAPES["linear"][size]
    case = Case(key, size, f"FusedLinear({k}, {n}, {activation!r})", f"x [{m}, {k}]")
    layer = FusedLinear(k, n, activation, device="cuda", dtype=dtype)
    reference = reference_of(layer)
    compiled = _compiled(reference, allow_compile, case)
    x = torch.randn(m, k, device="cuda", dtype=dtype).requires_grad_()
    case.dy = torch.randn(m, n, device="cuda", dtype=dtype)
    case.candidates[LIBRARY] = Candidate(lambda: layer(x), [x, layer.weight, layer.bias])
    case.candidates["torch eager"] = Candidate(lambda: reference(x), [x, reference.weight, reference.bias])
    if compiled is not None:
        case.candidates["torch compile"] = Candidate(lambda: compiled(x), [x, reference.weight, reference.bias])
    case.unavailable["frontend op"] = NO_FRONTEND_OP[key]
    case.check_against = "torch eager"
    return case


def _block_case(size: str, dtype, allow_compile: bool) -> Case:
    import torch

    from torch_cudnn_handle.nn import TransformerBlock, reference_of

    dim, heads, batch, seq = SHAPES["block"][size]
    case = Case("block", size, f"TransformerBlock({dim}, {heads})", f"x [{batch}, {seq}, {dim}]")
    block = TransformerBlock(dim, heads, device="cuda", dtype=dtype)
    reference = reference_of(block)
    compiled = _compiled(reference, allow_compile, case)
    x = torch.randn(batch, seq, dim, device="cuda", dtype=dtype).requires_grad_()
    case.dy = torch.randn(batch, seq, dim, device="cuda", dtype=dtype)
    case.candidates[LIBRARY] = Candidate(lambda: block(x), [x, *block.parameters()])
    case.candidates["torch eager"] = Candidate(lambda: reference(x), [x, *reference.parameters()])
    if compiled is not None:
        case.candidates["torch compile"] = Candidate(lambda: compiled(x), [x, *reference.parameters()])
        # A model that compiles torch compiles the library's block too (its ops trace without graph breaks).
        library_compiled = torch.compile(block, dynamic=False)
        case.candidates[LIBRARY_COMPILED] = Candidate(lambda: library_compiled(x), [x, *block.parameters()])
    case.unavailable["frontend op"] = NO_FRONTEND_OP["block"]
    case.check_against = "torch eager"
    return case


def build_case(key: str, size: str, dtype, allow_compile: bool) -> Case:
    if key == "sdpa":
        return _sdpa_case(size, dtype, allow_compile)
    if key == "rmsnorm":
        return _rmsnorm_case(size, dtype, allow_compile)
    if key in ("linear_gelu", "linear_relu"):
        return _linear_case(key, size, dtype, allow_compile)
    if key == "block":
        return _block_case(size, dtype, allow_compile)
    raise ValueError(f"unknown module {key!r}; choose from {MODULES}")


# ---------------------------------------------------------------------------------
# Measuring one case


def _scope(candidate: Candidate):
    import contextlib

    return candidate.scope() if candidate.scope is not None else contextlib.nullcontext()


def _forward_check(case: Case, available: List[str]) -> Dict[str, float]:
    """Max |output - check_against's output| of each candidate's forward (information,
    not a test: a large figure means a benchmark compares unlike things)."""
    import torch

    if case.check_against not in available:
        return {}
    outputs = {}
    for name in available:
        with _scope(case.candidates[name]):
            outputs[name] = case.candidates[name].forward().detach()
    base = outputs.pop(case.check_against).float()
    diffs = {name: float((out.float() - base).abs().max()) for name, out in outputs.items()}
    diffs["(scale: max |output|)"] = float(base.abs().max())
    del outputs, base
    torch.cuda.synchronize()
    return diffs


def measure_case(case: Case, modes, warmup: int, rounds: int, target_ms: float, iters_range: Tuple[int, int], fixed_iters: Optional[int]) -> List[dict]:
    import torch

    from timing import compare_cuda_ms, cuda_ms_per_call

    rows = []
    order = list(case.candidates)
    diffs: Dict[str, float] = {}
    # fwd+bwd first: a candidate whose backward fails is still timed forward.
    for mode in sorted(modes, key=lambda m: m != "fwd+bwd"):
        unavailable = dict(case.unavailable)
        steps = {}
        for name in order:
            candidate = case.candidates[name]
            step = candidate.step(mode, case.dy)
            try:
                with _scope(candidate):
                    for _ in range(warmup):  # the first call builds (cuDNN graphs) or compiles (inductor)
                        step()
                torch.cuda.synchronize()
                steps[name] = step
            except Exception as error:  # noqa: BLE001 -- a candidate that cannot run this configuration is reported
                unavailable[name] = reason_of(error)
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        if not diffs:
            try:
                diffs = _forward_check(case, [n for n in order if n in steps])
            except Exception as error:  # noqa: BLE001 -- the check is information only
                print(f"  note: forward check of {case.config} failed ({reason_of(error)})")
                torch.cuda.empty_cache()
        scopes = {name: case.candidates[name].scope for name in steps if case.candidates[name].scope is not None}
        if fixed_iters:
            iters = fixed_iters
        elif steps:
            estimate = 0.0
            for name, step in steps.items():
                with _scope(case.candidates[name]):
                    estimate = max(estimate, cuda_ms_per_call(step, 2))
            iters = int(min(iters_range[1], max(iters_range[0], math.ceil(target_ms / max(estimate, 1e-3)))))
        else:
            iters = 0
        figures = compare_cuda_ms(steps, calls=iters, rounds=rounds, warmup=0, scopes=scopes) if steps else {}
        alternatives = {name: ms for name, ms in figures.items() if name not in (LIBRARY, LIBRARY_COMPILED)}
        fastest = min(alternatives, key=alternatives.get) if alternatives else None
        library_ms = figures.get(LIBRARY)
        compiled_ms = figures.get(LIBRARY_COMPILED)
        rows.append(
            dict(
                key=case.key,
                module=MODULE_LABELS[case.key],
                size=case.size,
                config=case.config,
                input=case.input,
                mode=mode,
                dtype="bf16",
                ms={name: figures[name] for name in order if name in figures},
                unavailable={name: why for name, why in unavailable.items() if name not in figures},
                fastest=fastest,
                ratio=(library_ms / alternatives[fastest]) if (library_ms is not None and fastest) else None,
                compiled_ratio=(compiled_ms / alternatives[fastest]) if (compiled_ms is not None and fastest) else None,
                iters=iters,
                rounds=rounds,
                max_abs_diff=diffs,
            )
        )
    rows.sort(key=lambda row: MODES.index(row["mode"]))
    return rows


# ---------------------------------------------------------------------------------
# Formatting (also used by report.py)


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def alternatives_text(row: dict) -> str:
    parts = [f"{name} {_ms(ms)}" for name, ms in row["ms"].items() if name not in (LIBRARY, LIBRARY_COMPILED)]
    parts += [f"{name} -" for name in row.get("unavailable", {}) if name != LIBRARY]
    return ", ".join(parts)


def ratio_text(row: dict) -> str:
    return "-" if row.get("ratio") is None else f"{row['ratio']:.2f}x"


def markdown_table(rows: List[dict]) -> List[str]:
    """The module table in Markdown, then one footnote per distinct '-' reason."""
    lines = [
        "| module | size | input | mode | library ms | alternatives, ms | fastest alternative | library / fastest |",
        "| --- | --- | --- | --- | ---: | --- | --- | ---: |",
    ]
    # reason -> module -> (sizes, modes) where a candidate was '-' for it
    reasons: Dict[str, Dict[str, Tuple[List[str], List[str]]]] = {}
    for row in sorted(rows, key=row_order):
        lines.append(
            f"| {row['config']} | {row['size']} | {row['input']} | {row['mode']} | {_ms(row['ms'].get(LIBRARY))} | "
            f"{alternatives_text(row)} | {row.get('fastest') or '-'} | {ratio_text(row)} |"
        )
        for name, why in row.get("unavailable", {}).items():
            sizes, modes = reasons.setdefault(f"{name}: {why}", {}).setdefault(row["module"], ([], []))
            if row["size"] not in sizes:
                sizes.append(row["size"])
            if row["mode"] not in modes:
                modes.append(row["mode"])
    if reasons:
        lines.append("")
        for reason, where in reasons.items():
            places = "; ".join(f"{module} {'/'.join(sizes)} {'/'.join(modes)}" for module, (sizes, modes) in where.items())
            lines.append(f"- '-' {reason} ({places})")
    return lines


def row_order(row: dict) -> tuple:
    """Modules, sizes and modes in the table's order (unknown ones last)."""

    def index(items, value):
        return items.index(value) if value in items else len(items)

    return index(MODULES, row.get("key")), index(SIZES, row.get("size")), index(MODES, row.get("mode"))


def _print_rows(rows: List[dict]) -> None:
    for row in rows:
        print(
            f"| {row['config']} | {row['size']} | {row['input']} | {row['mode']} | {_ms(row['ms'].get(LIBRARY))} | "
            f"{alternatives_text(row)} | {row.get('fastest') or '-'} | {ratio_text(row)} |",
            flush=True,
        )
        scale = row.get("max_abs_diff", {}).get("(scale: max |output|)")
        for name, diff in row.get("max_abs_diff", {}).items():
            if scale and not name.startswith("(") and diff > 0.05 * scale + 0.05 and row["mode"] == "fwd":
                print(f"  note: {row['config']}: {name}'s forward differs from the baseline's by up to {diff:.3g} (outputs up to {scale:.3g})")


# ---------------------------------------------------------------------------------
# Main


def run(keys, sizes, modes, *, quick: bool, rounds: int, target_ms: float, allow_compile: bool, json_path: Optional[str]) -> dict:
    import torch

    tuned = tuned_from_env()
    result = dict(
        run=run_label(tuned),
        tuned=tuned,
        env={name: os.environ.get(name) for name in (TUNE_ENV, TUNING_FILE_ENV, "TORCH_CUDNN_HANDLE_NATIVE", SDPA_PYTHON_ENV)},
        torch=torch.__version__,
        gpu=torch.cuda.get_device_name(0),
        rows=[],
        complete=False,
        seconds=0.0,
    )
    began = time.perf_counter()
    dtype = torch.bfloat16
    warmup, fixed_iters = (2, 3) if quick else (3, None)
    print(f"\n### nn modules, {result['run']} library ({TUNE_ENV}={os.environ.get(TUNE_ENV)!r}), bf16, GPU ms per step "
          f"(CUDA events, median of {rounds} interleaved rounds)\n", flush=True)
    if os.environ.get(SDPA_PYTHON_ENV):
        print(f"note: {SDPA_PYTHON_ENV}={os.environ[SDPA_PYTHON_ENV]!r}: torch's cuDNN SDPA backend may be served by the frontend's "
              "Python API here, not by torch's own C++ path\n")
    print("| module | size | input | mode | library ms | alternatives, ms | fastest alternative | library / fastest |")
    print("| --- | --- | --- | --- | ---: | --- | --- | ---: |", flush=True)
    for key in keys:
        for size in sizes:
            case_began = time.perf_counter()
            torch.manual_seed(0)
            try:
                case = build_case(key, size, dtype, allow_compile)
                rows = measure_case(case, modes, warmup, rounds, target_ms, (3, 200), fixed_iters)
            except Exception as error:  # noqa: BLE001 -- one case that cannot even be set up does not end the table
                rows = [dict(key=key, module=MODULE_LABELS[key], size=size, config=MODULE_LABELS[key], input=str(SHAPES.get(key.split("_")[0], {}).get(size)),
                             mode=mode, dtype="bf16", ms={}, unavailable={LIBRARY: f"case failed: {reason_of(error)}"}, fastest=None, ratio=None,
                             iters=0, rounds=rounds, max_abs_diff={}) for mode in modes]
            finally:
                case = None
                gc.collect()
                torch._dynamo.reset()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            for row in rows:
                row.update(run=result["run"], tuned=tuned, seconds=time.perf_counter() - case_began)
            _print_rows(rows)
            result["rows"] += rows
            result["seconds"] = time.perf_counter() - began
            _save(result, json_path)
    result["complete"] = True
    result["seconds"] = time.perf_counter() - began
    _save(result, json_path)
    reasons = markdown_table(result["rows"])
    footnotes = reasons[reasons.index("") + 1:] if "" in reasons else []
    if footnotes:
        print("\n" + "\n".join(footnotes))
    print(f"\nmodule table ({result['run']}): {result['seconds']:.0f} s", flush=True)
    return result


def _save(result: dict, path: Optional[str]) -> None:
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".tmp", path)


def _csv(value: str, allowed) -> List[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    unknown = [item for item in items if item not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {', '.join(allowed)}")
    return items


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows (and the run's settings) here")
    parser.add_argument("--quick", action="store_true", help="smallest size only, 3 steps x 3 rounds: a smoke run, not figures to keep")
    parser.add_argument("--only", type=lambda v: _csv(v, MODULES), default=list(MODULES), help=f"modules, comma-separated: {','.join(MODULES)}")
    parser.add_argument("--sizes", type=lambda v: _csv(v, SIZES), default=None, help="sizes, comma-separated: small,medium,large")
    parser.add_argument("--modes", type=lambda v: _csv(v, MODES), default=list(MODES), help="fwd,fwd+bwd")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per figure (default 5, --quick 3)")
    parser.add_argument("--target-ms", type=float, default=25.0, help="GPU time of one timed block of steps (sets iters)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile candidates (no inductor compiles)")
    args = parser.parse_args(argv)

    from timing import require_cuda_gpu

    require_cuda_gpu(__file__)
    sizes = args.sizes or (["small"] if args.quick else list(SIZES))
    rounds = args.rounds or (3 if args.quick else 5)
    result = run(args.only, sizes, args.modes, quick=args.quick, rounds=rounds, target_ms=args.target_ms,
                 allow_compile=not args.no_compile, json_path=args.json)
    return 0 if result["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
