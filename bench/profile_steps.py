"""Where the small-size gaps of the module table come from: per training step, host time
against GPU time and the kernels, the library's module against torch's fastest
alternative at the sizes where the library is slower (SDPA causal 4x16x1024x64,
RMSNorm 4096x1024, FusedLinear(gelu) 2048x1024 -> 4096), and the same view of
RMSNorm 32768x4096 and of a TransformerBlock(512, 8) 8x256 training step; section 8, the
host issue time per step of every nn module against torch's at the small sizes.

    python bench/profile_steps.py [--out bench/results/profile_steps.txt] [--quick] [--no-plans] [--sections 1,2,...]

For each candidate, per step (fwd+bwd: gradients set to None first, ``.backward(dy)``;
fwd: the forward of a training step, inputs requiring grad):

* time: host issue time (``perf_counter`` around N steps, before the sync), host wall
  time (the same with the sync at the end) and GPU time (CUDA events around the same
  N steps), medians of interleaved rounds, and the kernels' own device time;
* kernels: every GPU activity of a few steps after warm-up (torch.profiler, CUDA
  activity), grouped by name: launches and device microseconds per step;
* the library's graphs: for each built graph the step used, whether
  ``cudnn_fe.execute`` runs it natively (``built_graphs(id)[i].native``, ``.path_reason``),
  its workspace, the selected plan's name, and the fields of the
  frontend's serialized plan that decide the path (``pass_by_values``,
  ``workspace_modifications``, ``variant_pack_replacements``, ``fe_workspace_size``,
  ``json_version``; the ``cudnn_backend_data`` string left out);
* unless ``--no-plans``: every plan the heuristics rank for the library's sdpa forward
  and backward graphs at the small size, with GPU ms per call (last: a plan that faults
  cannot take the rest with it).

Stdout is the compact view (about 150 lines); ``--out`` gets everything: every kernel
with its full name, the CPU-side op table of each profile, the decoded plan documents.
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # timing

SDPA_SHAPE = (4, 16, 1024, 64)
RMSNORM_SHAPE = (32768, 4096)
RMSNORM_SMALL = (4096, 1024)
LINEAR_SMALL = (2048, 1024, 4096)  # rows, in, out
BLOCK = (512, 8, 8, 256)  # dim, heads, batch, seq: the demo's
_NOTES: Dict[str, bool] = {}  # notes said once per run
PLAN_FIELDS = ("pass_by_values", "workspace_modifications", "variant_pack_replacements", "fe_workspace_size", "json_version")


class Out:
    """``say``: stdout and the detail file; ``detail``: the detail file only."""

    def __init__(self, path: Optional[str]):
        self.path = path
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.file = open(path, "w") if path else None

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.detail(text)

    def detail(self, text: str = "") -> None:
        if self.file:
            self.file.write(text + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


def _short(value, limit: int = 90) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:150] if lines else ''}"


# ---------------------------------------------------------------------------------
# Measurements


def times_per_step(candidates: Dict[str, Tuple[Callable[[], None], Callable[[], object]]], steps: int, rounds: int) -> Dict[str, Tuple[float, float, float]]:
    """{name: (host issue ms, host wall ms, GPU ms) per step}: medians of ``rounds``
    interleaved rounds of ``steps`` steps; ``candidates[name] = (step, scope factory)``."""
    import torch

    samples: Dict[str, List[Tuple[float, float, float]]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, (step, scope) in candidates.items():
            with scope():
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                began = time.perf_counter()
                start.record()
                for _ in range(steps):
                    step()
                stop.record()
                issued = time.perf_counter() - began
                torch.cuda.synchronize()
                wall = time.perf_counter() - began
                samples[name].append((issued * 1e3 / steps, wall * 1e3 / steps, start.elapsed_time(stop) / steps))
    return {name: tuple(statistics.median(s[i] for s in values) for i in range(3)) for name, values in samples.items()}


def compare_candidates(out: Out, title: str, candidates: Dict[str, Tuple[Callable[[], None], Callable[[], object]]], args, kernel_rows: int) -> None:
    """Time per step, then the kernels of each candidate."""
    from timing import device_kernels

    for name, (step, scope) in candidates.items():  # warm up: builds, allocator, autotuners
        with scope():
            for _ in range(3):
                step()
    times = times_per_step(candidates, args.steps_timed, args.rounds)
    kernels = {}
    for name, (step, scope) in candidates.items():
        with scope():
            kernels[name] = device_kernels(step, steps=args.steps_profiled, warmup=2)
    out.say(f"\n{title}: ms per step (median of {args.rounds} interleaved rounds of {args.steps_timed} steps)")
    out.say(f"  {'candidate':34s} {'host issue':>10s} {'host wall':>10s} {'GPU events':>10s} {'kernel sum':>10s} {'GPU ops':>8s}")
    for name, (issue, wall, gpu) in times.items():
        per_step, _ = kernels[name]
        kernel_ms = sum(us for _, us in per_step.values()) / 1e3
        launches = sum(count for count, _ in per_step.values())
        out.say(f"  {name:34s} {issue:10.3f} {wall:10.3f} {gpu:10.3f} {kernel_ms:10.3f} {launches:8.1f}")
    out.say("  (host issue: perf_counter to the last launch; host wall: to the end of the sync; GPU ops: kernels, memsets, copies)")
    for name, (per_step, prof) in kernels.items():
        total = sum(us for _, us in per_step.values())
        out.say(f"\n  {name}: GPU ops per step, longest first ({args.steps_profiled} profiled steps; {total:.1f} us per step in all)")
        out.say(f"    {'per step':>8s} {'us/step':>9s}  name")
        for index, (kernel, (count, us)) in enumerate(per_step.items()):
            line = f"    {count:8.1f} {us:9.1f}  "
            if index < kernel_rows:
                out.say(line + _short(kernel, 100))
                if len(kernel) > 100:
                    out.detail(f"      full name: {kernel}")
            else:
                out.detail(line + kernel)
        if len(per_step) > kernel_rows:
            out.say(f"    ... {len(per_step) - kernel_rows} more in {out.path or '--out'}")
        out.detail(f"\n  {name}: CPU-side ops of the profiled steps (torch.profiler key_averages)")
        try:
            out.detail(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=70))
        except Exception as error:  # noqa: BLE001 -- a table the profiler cannot print is not worth the run
            out.detail(f"    ({_reason(error)})")


# ---------------------------------------------------------------------------------
# The library's graphs


def all_built() -> Dict[int, Tuple[int, object]]:
    """{id(BuiltGraph): (graph id, BuiltGraph)} of every graph the registry has built."""
    import torch_cudnn_handle as tch
    from torch_cudnn_handle import registry

    found = {}
    for graph_id in (definition.graph_id for definition in registry.definitions()):
        for built in tch.built_graphs(graph_id):
            found[id(built)] = (graph_id, built)
    return found


def _graph_name(graph_id: int) -> str:
    from torch_cudnn_handle.registry import graph_name

    try:
        return graph_name(graph_id)
    except Exception:  # noqa: BLE001
        return f"graph {graph_id}"


def _random_operands(specs, device) -> List[object]:
    import torch

    tensors = []
    for spec in specs:
        t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=device)
        if t.is_floating_point():
            t.normal_()
        else:
            t.zero_()
        tensors.append(t)
    return tensors


def selected_plan_name(graph) -> str:
    try:
        return graph.get_plan_name_at_index(getattr(graph, "_plan_index", 0))
    except Exception as error:  # noqa: BLE001
        return f"unknown ({_reason(error)})"


def describe_built(out: Out, graph_id: int, built, *, fields: bool, breakdown: bool, operands=None) -> None:
    """One or two lines per built graph; the decoded serialized plan in the detail file."""
    from torch_cudnn_handle.native import decode_ubjson

    shapes = " ".join("x".join(str(n) for n in spec.shape) for spec in built.inputs)
    plan = getattr(built, "engine", "") or selected_plan_name(built.graph)
    out.say(f"  [{graph_id}] {_graph_name(graph_id)} ({shapes}): native={built.native} ({built.path_reason}); "
            f"frontend workspace {built.workspace_size} B; plan {_short(plan, 60)}")
    try:
        document = decode_ubjson(built.graph.serialize(as_bytes=True))
    except Exception as error:  # noqa: BLE001 -- a python-engine plan has another format
        out.say(f"      serialized plan: not decodable ({_reason(error)})")
        return
    if not isinstance(document, dict):
        out.say(f"      serialized plan: a {type(document).__name__}, not an object")
        return
    if fields:
        out.say(f"      serialized keys: {', '.join(document)}")
        out.say("      " + "; ".join(f"{field}={_short(document[field], 60) if field in document else '(absent)'}" for field in PLAN_FIELDS))
    shown = {key: (f"<{len(value)} chars>" if key == "cudnn_backend_data" and isinstance(value, str) else value) for key, value in document.items()}
    out.detail(f"      decoded serialized plan of [{graph_id}] (cudnn_backend_data elided):")
    out.detail("      " + json.dumps(shown, default=str, indent=1)[:20000].replace("\n", "\n      "))
    backend = document.get("cudnn_backend_data")
    if isinstance(backend, str):
        try:
            plan = json.loads(backend)
            out.detail(f"      cudnn_backend_data: JSON with keys {list(plan) if isinstance(plan, dict) else type(plan).__name__}")
            out.detail("      " + backend[:3000])
        except ValueError:
            out.detail(f"      cudnn_backend_data: {len(backend)} chars, not JSON: {backend[:300]!r}")


def describe_new_graphs(out: Out, before: Dict[int, Tuple[int, object]], *, fields: bool, breakdown: bool) -> None:
    new = [(gid, built) for key, (gid, built) in all_built().items() if key not in before]
    native = sum(1 for _, built in new if built.native)
    out.say(f"\n  the library's graphs built for this step: {len(new)}, {native} native")
    for gid, built in sorted(new, key=lambda item: item[0]):
        describe_built(out, gid, built, fields=fields, breakdown=breakdown)


# ---------------------------------------------------------------------------------
# Sections


def _nullscope():
    return contextlib.nullcontext()


def _step(forward: Callable[[], object], leaves, dy, mode: str = "fwd+bwd") -> Callable[[], None]:
    def step():
        for tensor in leaves:
            tensor.grad = None
        forward().backward(dy)

    return step if mode == "fwd+bwd" else forward


def section_sdpa(out: Out, args) -> dict:
    import cudnn
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torch_cudnn_handle import registry
    from torch_cudnn_handle.nn import sdpa
    from torch_cudnn_handle.nn.attention import SDPA_GRAPHS

    b, h, s, d = SDPA_SHAPE
    out.say(f"\n## 1. sdpa causal q, k, v [{b}, {h}, {s}, {d}] bf16, fwd+bwd")
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    d_o = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    leaves = [q, k, v]
    before = all_built()
    candidates = {
        "library sdpa": (_step(lambda: sdpa(q, k, v, True), leaves, d_o), _nullscope),
        "torch SDPA, cuDNN backend": (_step(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), leaves, d_o),
                                      lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])),
    }
    try:
        frontend_sdpa = cudnn.sdpa_torch
        candidates["frontend op cudnn.sdpa_torch"] = (
            _step(lambda: frontend_sdpa(q, k, v, is_causal=True, return_lse=True)[0], leaves, d_o), _nullscope)
    except Exception as error:  # noqa: BLE001
        out.say(f"  frontend op unavailable: {_reason(error)}")
    compare_candidates(out, "sdpa", candidates, args, kernel_rows=6)

    forward_id = SDPA_GRAPHS[True]
    backward_id = None
    try:
        backward_id = registry.definition(forward_id).backward_id
    except Exception as error:  # noqa: BLE001
        out.say(f"  backward graph id unavailable: {_reason(error)}")
    with torch.no_grad():
        o, stats = torch.ops.cudnn_fe.execute(forward_id, [q.detach(), k.detach(), v.detach()])
    operands = {forward_id: [q.detach(), k.detach(), v.detach()],
                backward_id: [q.detach(), k.detach(), v.detach(), o, torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device).copy_(d_o), stats]}
    out.say("\n  the library's graphs (forward, backward):")
    built_of = {}
    for graph_id in (forward_id, backward_id):
        if graph_id is None:
            continue
        specs = tuple(registry.TensorSpec.of(t) for t in operands[graph_id])
        matches = [built for built in tch_built(graph_id) if built.inputs == specs]
        if not matches:
            out.say(f"  [{graph_id}] {_graph_name(graph_id)}: not built for these inputs")
            continue
        built_of[graph_id] = matches[0]
        describe_built(out, graph_id, matches[0], fields=True, breakdown=True, operands=operands[graph_id])
    others = [key for key in all_built() if key not in before and all(id(b) != key for b in built_of.values())]
    if others:
        out.say(f"  ({len(others)} other graphs built during this section)")
    return dict(forward_id=forward_id, backward_id=backward_id, built=built_of, operands=operands)


def tch_built(graph_id: int) -> list:
    import torch_cudnn_handle as tch

    return tch.built_graphs(graph_id)


def section_rmsnorm(out: Out, args, shape=RMSNORM_SHAPE, number: int = 2, modes=("fwd+bwd",)) -> None:
    import torch
    import torch.nn.functional as F

    from torch_cudnn_handle.nn import RMSNorm, reference_of

    rows, hidden = shape
    torch.manual_seed(0)
    norm = RMSNorm(hidden, device="cuda", dtype=torch.bfloat16)
    reference = reference_of(norm)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    for mode in modes:
        out.say(f"\n## {number}. RMSNorm({hidden}) x [{rows}, {hidden}] bf16, {mode}")
        before = all_built()
        candidates = {
            "library RMSNorm": (_step(lambda: norm(x), [x, norm.weight], dy, mode), _nullscope),
            "torch eager (reference)": (_step(lambda: reference(x), [x, reference.weight], dy, mode), _nullscope),
            "torch F.rms_norm": (_step(lambda: F.rms_norm(x, (hidden,), norm.weight, norm.eps), [x, norm.weight], dy, mode), _nullscope),
        }
        try:
            from cudnn.ops.norm import rms_norm

            candidates["frontend op cudnn.ops.norm.rms_norm"] = (
                _step(lambda: rms_norm(x, norm.weight, eps=norm.eps), [x, norm.weight], dy, mode), _nullscope)
        except Exception as error:  # noqa: BLE001
            out.say(f"  frontend op unavailable: {_reason(error)}")
        compare_candidates(out, f"RMSNorm {mode}", candidates, args, kernel_rows=4)
        describe_new_graphs(out, before, fields=True, breakdown=True)


def section_linear(out: Out, args, number: int) -> None:
    import torch

    from torch_cudnn_handle.nn import FusedLinear, reference_of

    rows, features_in, features_out = LINEAR_SMALL
    out.say(f"\n## {number}. FusedLinear({features_in}, {features_out}, 'gelu') x [{rows}, {features_in}] bf16, fwd+bwd")
    torch.manual_seed(0)
    layer = FusedLinear(features_in, features_out, activation="gelu", device="cuda", dtype=torch.bfloat16)
    reference = reference_of(layer)
    x = torch.randn(rows, features_in, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(rows, features_out, device="cuda", dtype=torch.bfloat16)
    before = all_built()
    candidates = {
        "library FusedLinear": (_step(lambda: layer(x), [x, *layer.parameters()], dy), _nullscope),
        "torch eager (reference)": (_step(lambda: reference(x), [x, *reference.parameters()], dy), _nullscope),
    }
    compare_candidates(out, "FusedLinear", candidates, args, kernel_rows=6)
    describe_new_graphs(out, before, fields=False, breakdown=False)


def section_block(out: Out, args) -> None:
    import torch

    from torch_cudnn_handle.nn import TransformerBlock, reference_of

    dim, heads, batch, seq = BLOCK
    out.say(f"\n## 3. TransformerBlock({dim}, {heads}) x [{batch}, {seq}, {dim}] bf16, training step (fwd+bwd)")
    torch.manual_seed(0)
    block = TransformerBlock(dim, heads, device="cuda", dtype=torch.bfloat16)
    reference = reference_of(block)
    x = torch.randn(batch, seq, dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(batch, seq, dim, device="cuda", dtype=torch.bfloat16)
    before = all_built()
    candidates = {
        "library block": (_step(lambda: block(x), [x, *block.parameters()], dy), _nullscope),
        "torch eager (reference)": (_step(lambda: reference(x), [x, *reference.parameters()], dy), _nullscope),
    }
    compare_candidates(out, "TransformerBlock", candidates, args, kernel_rows=10)
    describe_new_graphs(out, before, fields=False, breakdown=False)
    out.say("  (each graph's serialized plan fields are in the detail file)")


def section_plans(out: Out, args, sdpa_state: dict) -> None:
    """Every plan the heuristics rank for the library's sdpa graphs, GPU ms per call."""
    import cudnn
    import torch

    import torch_cudnn_handle as tch
    from torch_cudnn_handle import registry
    from torch_cudnn_handle.registry.describe import describe
    from timing import compare_cuda_ms

    out.say("\n## 4. the ranked plans of the library's sdpa graphs (small size): GPU ms per call, CUDA events")
    for graph_id, built in sdpa_state["built"].items():
        operands = sdpa_state["operands"][graph_id]
        library_plan = getattr(built, "engine", "") or selected_plan_name(built.graph)
        out.say(f"\n  [{graph_id}] {_graph_name(graph_id)}; the library runs: {_short(library_plan, 80)}")
        try:
            definition = registry.definition(graph_id)
            with tch.build_scope(built.device) as handle:
                graph, inputs, outputs, _ = describe(definition, built.inputs, handle)
                graph.build_operation_graph()
                graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                graph.check_support()
                graph.build_plans(cudnn.build_plan_policy.ALL)
            device = torch.device("cuda", built.device)
            results = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device) for s in built.layout.outputs]
            pack = dict(zip(list(inputs) + list(outputs), list(operands) + results))
            handle = tch.current_handle(built.device)
            candidates, rows = {}, []
            for index in range(graph.get_execution_plan_count()):
                try:
                    name = graph.get_plan_name_at_index(index)
                    size = graph.get_workspace_size_plan_at_index(index)
                    workspace = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
                    graph.execute_plan_at_index(pack, workspace, index, handle=handle)
                    torch.cuda.synchronize()
                except Exception as error:  # noqa: BLE001 -- a plan that does not build or run is reported
                    out.say(f"    plan {index:2d}: {_reason(error)}")
                    continue
                rows.append((index, name, size))
                candidates[f"plan {index}"] = (lambda pack=pack, workspace=workspace, index=index:
                                               graph.execute_plan_at_index(pack, workspace, index, handle=handle))
            figures = compare_cuda_ms(candidates, calls=args.plan_calls, rounds=args.rounds, warmup=2) if candidates else {}
            for index, name, size in rows:
                out.say(f"    plan {index:2d}: {figures[f'plan {index}']:8.4f} ms  workspace {size:>10d} B  {_short(name, 70)}")
        except Exception as error:  # noqa: BLE001
            out.say(f"    ranked plans unavailable: {_reason(error)}")


def section_host_costs(out: Out, args, number: int) -> None:
    """Host microseconds to issue one call of each graph the small-size steps run: the op
    (native path, no autograd; its calls repeat their addresses, so they launch the
    plan's CUDA graph), cudnnBackendExecute alone on the same plan (the floor without
    graph launch), and torch's nearest equivalent. Issue time only: below the launch
    queue's depth."""
    import statistics as stats

    import torch
    import torch.nn.functional as F

    import torch_cudnn_handle as tch
    import thread_scaling
    from timing import host_us_per_call
    from torch_cudnn_handle.nn import RMSNorm
    from torch_cudnn_handle.nn.attention import SDPA_GRAPHS
    from torch_cudnn_handle.nn.linear import GELU_BACKWARD, LINEAR_GRAPHS, MATMUL

    out.say(f"\n## {number}. host us to issue one call: the op (graph launch), cudnnBackendExecute alone, torch's equivalent")
    try:
        extension = thread_scaling.build()
    except Exception as error:  # noqa: BLE001
        out.say(f"  unavailable: {_reason(error)}")
        return
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    rows, hidden = RMSNORM_SMALL
    norm = RMSNorm(hidden, **bf16)
    x4 = torch.randn(rows, hidden, **bf16)  # natural operands: the graph views them as [rows, hidden, 1, 1]
    w4 = norm.weight.detach()
    with torch.no_grad():
        y4, inv_var = tch.execute(norm._graph, [x4, w4])
    backward_id = tch.registry.definition(norm._graph).backward_id
    n_rows, k, n = LINEAR_SMALL
    x3 = torch.randn(1, n_rows, k, **bf16)
    weight = torch.randn(n, k, **bf16)
    bias = torch.randn(n, **bf16)
    with torch.no_grad():
        y3, z3 = tch.execute(LINEAR_GRAPHS["gelu"], [x3, weight, bias])  # natural operands
    b, h, sq, d = SDPA_SHAPE
    q, kk, v = (torch.randn(b, h, sq, d, **bf16) for _ in range(3))
    with torch.no_grad():
        o, lse = tch.execute(SDPA_GRAPHS[True], [q, kk, v])
    sdpa_backward = tch.registry.definition(SDPA_GRAPHS[True]).backward_id
    cases = [
        ("rmsnorm fwd [4096, 1024]", norm._graph, [x4, w4], lambda: F.rms_norm(x4.view(rows, hidden), (hidden,), norm.weight, 1e-5)),
        ("rmsnorm bwd [4096, 1024]", backward_id, [y4, x4, w4, inv_var],
         lambda: torch.ops.aten._fused_rms_norm_backward(y4.view(rows, hidden), x4.view(rows, hidden), [hidden], inv_var.view(rows, 1),
                                                       norm.weight, [True, True]) if hasattr(torch.ops.aten, "_fused_rms_norm_backward") else None),
        ("linear+bias+gelu fwd [2048, 1024] -> 4096", LINEAR_GRAPHS["gelu"], [x3, weight, bias],
         lambda: F.gelu(F.linear(x3, weight, bias))),
        ("matmul dX [2048, 4096] @ [4096, 1024]", MATMUL, [y3, weight.unsqueeze(0)], lambda: torch.matmul(y3, weight)),
        ("matmul dW [4096, 2048] @ [2048, 1024]", MATMUL, [y3.mT, x3], lambda: torch.matmul(y3.mT, x3)),
        ("gelu backward [2048, 4096]", GELU_BACKWARD, [y3, z3], lambda: torch.ops.aten.gelu_backward(y3, z3)),
        ("sdpa fwd [4, 16, 1024, 64]", SDPA_GRAPHS[True], [q, kk, v],
         lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q, kk, v, None, True, 0.0, True, False)),
        ("sdpa bwd [4, 16, 1024, 64]", sdpa_backward, [q, kk, v, o, o.clone(), lse], None),
    ]
    calls, rounds = (50, 3) if args.quick else (200, 7)
    out.say(f"  (median of {rounds} rounds of {calls} calls, each timed until its last call is issued)")
    out.say(f"  {'graph':44s} {'op us':>8s} {'backend us':>11s} {'op - backend':>13s} {'torch us':>9s}  path")
    for label, graph_id, operands, torch_fn in cases:
        try:
            with torch.no_grad():
                op_us = stats.median(host_us_per_call(lambda: tch.execute(graph_id, operands), calls) for _ in range(rounds))
            backend = thread_scaling.BackendCall.of_registry(graph_id, operands, 1, [operands])
            backend_us = stats.median(backend.issue_us(extension, calls) for _ in range(rounds)) if backend.plan_json else None
            torch_us = None
            if torch_fn is not None:
                try:
                    torch_fn()
                    torch_us = stats.median(host_us_per_call(torch_fn, calls) for _ in range(rounds))
                except Exception as error:  # noqa: BLE001 -- an equivalent this torch lacks
                    out.detail(f"  {label}: torch equivalent unavailable: {_reason(error)}")
            cell = lambda v, signed=False: "-" if v is None else (f"{v:+.1f}" if signed else f"{v:.1f}")  # noqa: E731
            difference = None if backend_us is None else op_us - backend_us
            out.say(f"  {label:44s} {cell(op_us):>8s} {cell(backend_us):>11s} {cell(difference, True):>13s} {cell(torch_us):>9s}  "
                    f"{'native' if backend.plan_json else backend.why}")
        except Exception as error:  # noqa: BLE001
            out.say(f"  {label:44s} failed: {_reason(error)}")


def section_module_host_times(out: Out, args, number: int) -> None:
    """Host issue time per step of every nn module at bench/modules.py's small sizes, fwd
    and fwd+bwd, against torch's eager reference (and F.rms_norm): the host side of the
    module table, where the small sizes are host-bound."""
    import torch
    import torch.nn.functional as F

    from torch_cudnn_handle.nn import Attention, FusedLinear, RMSNorm, TransformerBlock, reference_of

    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    rows, hidden = RMSNORM_SMALL
    m, k, n = LINEAR_SMALL
    dim, heads, batch, seq = BLOCK
    modules = [(f"RMSNorm({hidden}) x [{rows}, {hidden}]", RMSNorm(hidden, **bf16), (rows, hidden))]
    for activation in ("gelu", "relu", None):
        modules.append((f"FusedLinear({k}, {n}, {activation!r}) x [{m}, {k}]", FusedLinear(k, n, activation, **bf16), (m, k)))
    modules.append((f"Attention({dim}, {heads}) x [{batch}, {seq}, {dim}]", Attention(dim, heads, True, **bf16), (batch, seq, dim)))
    modules.append((f"TransformerBlock({dim}, {heads}) x [{batch}, {seq}, {dim}]", TransformerBlock(dim, heads, **bf16), (batch, seq, dim)))
    out.say(f"\n## {number}. host issue ms per step of every nn module vs torch (median of {args.rounds} rounds of {args.steps_timed} steps)")
    out.say(f"  {'module':48s} {'mode':8s} {'library':>9s} {'torch':>9s} {'F.rms_norm':>10s} {'lib/best':>8s}")
    for label, module, shape in modules:
        reference = reference_of(module)
        x = torch.randn(*shape, **bf16).requires_grad_()
        with torch.no_grad():
            dy = torch.randn_like(module(x))
        for mode in ("fwd", "fwd+bwd"):
            candidates = {
                "library": (_step(lambda: module(x), [x, *module.parameters()], dy, mode), _nullscope),
                "torch": (_step(lambda: reference(x), [x, *reference.parameters()], dy, mode), _nullscope),
            }
            if isinstance(module, RMSNorm):
                candidates["F.rms_norm"] = (
                    _step(lambda: F.rms_norm(x, (hidden,), module.weight, module.eps), [x, module.weight], dy, mode), _nullscope)
            for step, scope in candidates.values():  # warm up: builds, allocator
                for _ in range(3):
                    step()
            times = times_per_step(candidates, args.steps_timed, args.rounds)
            issue = {name: value[0] for name, value in times.items()}
            best = min(v for name, v in issue.items() if name != "library")
            rms = f"{issue['F.rms_norm']:10.3f}" if "F.rms_norm" in issue else f"{'-':>10s}"
            out.say(f"  {label:48s} {mode:8s} {issue['library']:9.3f} {issue['torch']:9.3f} {rms} {issue['library'] / best:7.2f}x")
    out.say("  (host issue: perf_counter to the last launch of the steps; the GPU time of the same sizes is bench/modules.py's)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "profile_steps.txt"), help="the full detail (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds: a smoke run")
    parser.add_argument("--no-plans", action="store_true", help="skip section 4 (every ranked plan of the sdpa graphs)")
    parser.add_argument("--sections", default="1,2,3,4,5,6,7,8", help="which sections to run, comma-separated (default: all)")
    args = parser.parse_args(argv)
    args.steps_timed, args.steps_profiled, args.rounds, args.plan_calls = (10, 3, 2, 10) if args.quick else (50, 5, 5, 50)
    sections = {s.strip() for s in args.sections.split(",")}

    import torch
    from timing import require_cuda_gpu

    require_cuda_gpu(__file__)
    import cudnn

    import torch_cudnn_handle as tch

    out = Out(args.out)
    try:
        out.say(f"# profile_steps: torch {torch.__version__}, cuDNN {cudnn.backend_version_string()}, frontend {cudnn.__version__}, "
                f"{torch.cuda.get_device_name(0)}")
        out.say("env: " + ", ".join(f"{name}={os.environ.get(name)!r}" for name in
                                     ("TORCH_CUDNN_HANDLE_TUNE", "TORCH_CUDNN_HANDLE_TUNING_FILE", "TORCH_CUDNN_HANDLE_NATIVE",
                                      "TORCH_CUDNN_SDPA_USE_PYTHON"))
                + f"; extension with CUDA: {tch.with_cuda}")
        sdpa_state = section_sdpa(out, args) if "1" in sections or "4" in sections else None
        if "2" in sections:
            section_rmsnorm(out, args)
        if "3" in sections:
            section_block(out, args)
        if "5" in sections:
            section_rmsnorm(out, args, RMSNORM_SMALL, 5, ("fwd", "fwd+bwd"))
        if "6" in sections:
            section_linear(out, args, 6)
        if "7" in sections:
            section_host_costs(out, args, 7)
        if "8" in sections:
            section_module_host_times(out, args, 8)
        out.say(f"\nregistry: {tch.stats.graphs()}; pool: {tch.stats.pool()}")
        if "4" in sections and not args.no_plans and sdpa_state:
            section_plans(out, args, sdpa_state)
        if args.out:
            print(f"\nfull detail: {args.out}")
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
