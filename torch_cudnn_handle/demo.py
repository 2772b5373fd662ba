"""The demo ``python -m torch_cudnn_handle`` runs after its report.

On a GPU: a ``TransformerBlock`` whose every matmul, norm and attention (forward
and backward) is a cuDNN graph trains a few steps side by side with the same block
in plain torch (same initial parameters, same batches), showing both losses per
step; then a short table of milliseconds per training step (forward + backward)
of the two, eager and under ``torch.compile``, measured in the same run with CUDA
events.

Without a GPU (CI): the same block is traced by ``torch.compile(fullgraph=True)``
on fake CUDA tensors, forward only (a CPU build of torch cannot give fake CUDA
tensors autograd metadata), with a backend that records the graph AOT autograd
produces; the demo prints which registered graph each ``torch.ops.cudnn_fe.execute``
node calls, how often, and that there was no graph break. With ``verbose`` it also
prints the graph itself, where every matmul, norm and attention is such a node.

Report and demo print label/value rows through ``row``, so their values share one column;
``summary_rows`` says in words what each subsystem holds and did (handles, graphs, plan
store, plan tuning, native CUDA graphs), for the report and after the GPU demo.
"""

from __future__ import annotations

import re
import statistics

import torch

# A small block: quick to trace on a CPU and to train on a GPU, big enough to time.
DIM, HEADS, MLP_RATIO, BATCH, SEQ = 512, 8, 4, 8, 256
STEPS = 5

LABEL_WIDTH = 28  # the longest label, "torch.ops.cudnn_fe.execute", plus two spaces


def row(label: str, value) -> None:
    """One report line: the label padded to LABEL_WIDTH, then the value."""
    print(f"  {label:<{LABEL_WIDTH}}{value}")


def current_stats() -> dict:
    """Every stats dict of the library, by subsystem (``--json`` prints them as they are)."""
    import torch_cudnn_handle as tch

    return dict(pool=tch.pool_stats(), registry=tch.registry_stats(), tuning=tch.tuning_stats(),
                native_cuda_graphs=tch.native_cuda_graph_stats())


def current_settings() -> dict:
    """The settings that decide where graphs come from and how they run."""
    from . import plan_tuning
    from .registry import kernel_caches, plan_store

    return dict(
        plan_store=dict(enabled=plan_store.plan_cache_enabled(), directory=plan_store.plan_cache_dir()),
        plan_tuning=dict(enabled=plan_tuning.tuning_enabled(), cache_file=plan_tuning.cache_path()),
        dynamic_shapes=kernel_caches.dynamic_shapes_enabled(),
    )


def _counted(pairs, none: str = "none") -> str:
    """"2 built, 1 loaded" from (count, words) pairs, leaving out zero counts (all zero: ``none``)."""
    return ", ".join(f"{n} {words}" for n, words in pairs if n) or none


def _handle_rows(pool: dict) -> list:
    import torch_cudnn_handle as tch

    if not tch.with_cuda:
        return [("handles", "none: this build has no CUDA, so it has no cuDNN handle pool")]
    devices = pool["devices"]
    if not devices:
        return [("handles", "none yet: the pool makes one per device and thread on first use")]
    rows = []
    for ordinal, counts in sorted(devices.items()):
        rows.append(("handles" if not rows else "", f"cuda:{ordinal}: {counts['created']} made, {counts['in_use']} held by "
                                                    f"live threads, {counts['free']} free for the next thread"))
    label, value = rows[0]
    rows[0] = (label, f"{value}; {pool['set_stream_calls']} cudnnSetStream calls" + (" (all devices)" if len(rows) > 1 else ""))
    return rows


ROUTE_WORDS = {"static": "built", "kernel_cache": "built from a kernel cache (dynamic shapes)", "disk_cache": "loaded from the plan store"}


def _graph_rows(registry: dict) -> list:
    routes = registry["routes"]
    obtained = sum(routes.values())
    if not obtained and not registry["cached"]:
        return [("graphs", f"{registry['definitions']} registered, none built yet (each is built on its first call, "
                           "per device and input layout)")]
    where = _counted((n, ROUTE_WORDS.get(route, f"via {route}")) for route, n in sorted(routes.items(), key=lambda item: item[0] != "static"))
    rows = [("graphs", f"{registry['definitions']} registered; {obtained} obtained in {registry['plan_seconds']:.2f} s: {where}")]
    pending = registry["native_pending"]
    on_python = "on the Python path" + (f" ({pending} of them go native at their next call)" if pending else "")
    paths = _counted([(registry["native"], "run natively (C++)"), (registry["python_path"], on_python)])
    rows.append(("  in the cache", f"{registry['cached']} of at most {registry['capacity']}: {paths}"
                                   + (f"; {registry['evictions']} evicted" if registry["evictions"] else "")))
    return rows


def _plan_store_row(registry: dict, store: dict, active_only: bool) -> list:
    counts = _counted([(registry["disk_hits"], "plans loaded"), (registry["disk_writes"], "written"),
                       (registry["disk_rejected"], "rejected (stale or damaged)"), (registry["disk_write_errors"], "failed to write")],
                      none="")
    if active_only and not counts:
        return []
    if not store["enabled"]:
        return [("plan store", "off (TORCH_CUDNN_HANDLE_PLAN_CACHE=0 or set_plan_cache(False)): every graph is built"
                 + (f"; {counts}" if counts else ""))]
    return [("plan store", f"on, {store['directory']}: " + (counts or "nothing loaded or written yet"))]


def _tuning_row(tuning: dict, settings: dict, active_only: bool) -> list:
    counts = _counted([(tuning["tuned"], "graphs timed"), (tuning["cache_hits"], "choices from the tuning cache"),
                       (tuning["fallbacks"], "fell back to the heuristics' plan"), (tuning["cache_errors"], "tuning-cache errors")],
                      none="")
    if active_only and not counts:
        return []
    if not settings["enabled"]:
        return [("plan tuning", "off: heuristics pick each plan (TORCH_CUDNN_HANDLE_TUNE=1 or set_plan_tuning(True) times them)"
                 + (f"; {counts}" if counts else ""))]
    timed = f"{counts} in {tuning['tune_seconds']:.2f} s" if counts else "nothing timed yet"
    return [("plan tuning", f"on, cache {settings['cache_file']}: {timed}")]


def _cuda_graph_row(graphs: dict, active_only: bool) -> list:
    import torch_cudnn_handle as tch

    counts = _counted([(graphs["populated"] + graphs["captured"], "made"), (graphs["launched"], "launches"),
                       (graphs["failed"], "could not be made"), (graphs["kept"], "kept")], none="")
    if active_only and not counts:
        return []
    if not tch.with_cuda:
        return [("native CUDA graphs", "none: this build has no CUDA")]
    if not graphs["enabled"]:
        return [("native CUDA graphs", "off (TORCH_CUDNN_HANDLE_NATIVE_CUDA_GRAPHS=0 or set_native_cuda_graphs(False))"
                 + (f"; {counts}" if counts else ""))]
    return [("native CUDA graphs", "on (a native call whose addresses repeat replays one): " + (counts or "none made yet"))]


def summary_rows(stats: dict, settings: dict, active_only: bool = False) -> list:
    """(label, value) rows that say, per subsystem, what it holds and did, in words:
    the handle pool, the graphs (built or loaded, from where, on which path), the plan
    store, plan tuning and the native CUDA graphs. ``active_only``: handles and graphs,
    and the others only where they counted something."""
    return [
        *_handle_rows(stats["pool"]),
        *_graph_rows(stats["registry"]),
        *_plan_store_row(stats["registry"], settings["plan_store"], active_only),
        *_tuning_row(stats["tuning"], settings["plan_tuning"], active_only),
        *_cuda_graph_row(stats["native_cuda_graphs"], active_only),
    ]


def main(verbose: bool = False) -> int:
    import torch_cudnn_handle as tch

    if torch.cuda.is_available() and tch.with_cuda:
        return _train_and_time()
    return _trace_without_gpu(verbose)


# ---------------------------------------------------------------------------------
# Without a GPU: trace


def _trace_without_gpu(verbose: bool) -> int:
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .nn import TransformerBlock, fake_cuda_module
    from .registry import graph_name

    print("\ndemo: no CUDA GPU here, so the TransformerBlock is traced instead of trained")
    row("traced", f"torch.compile(TransformerBlock({DIM}, {HEADS}, mlp_ratio={MLP_RATIO}), fullgraph=True), forward")
    row("input", f"fake CUDA bf16 [{BATCH}, {SEQ}, {DIM}]; nothing is built or run (the op's fake kernel describes each graph)")
    torch._dynamo.reset()
    fake_mode = FakeTensorMode()
    block = fake_cuda_module(TransformerBlock, DIM, HEADS, MLP_RATIO, fake_mode=fake_mode, dtype=torch.bfloat16)
    with fake_mode:
        x = torch.empty(BATCH, SEQ, DIM, dtype=torch.bfloat16, device="cuda")
    backend = AotEagerAndRecordGraphs()
    y = torch.compile(block, fullgraph=True, backend=backend)(x)
    code = backend.fw_graphs[0].print_readable(print_output=False, include_stride=True)
    # The "# File: ..." lines name each op's source line; the graph reads better without them.
    graph_lines = [line for line in code.splitlines() if line.strip() and not line.strip().startswith("# File:")]
    ids = [int(i) for i in re.findall(r"torch\.ops\.cudnn_fe\.execute\.default\((\d+),", code)]
    graphs = len(backend.fw_graphs)
    row("result", f"{graphs} graph, {'no graph break' if graphs == 1 else 'graph breaks'}; "
                  f"output {list(y.shape)} {y.dtype} on {y.device}")
    row("cudnn_fe.execute", f"{len(ids)} calls, {len(set(ids))} graph ids:")
    for graph_id in sorted(set(ids)):
        row(f"  graph {graph_id}", f"{graph_name(graph_id)} x{ids.count(graph_id)}")
    if verbose:
        print("\nthe traced FX graph (AOT autograd, forward):")
        print("\n".join(graph_lines))
    else:
        row("FX graph", f"{len(graph_lines)} lines; --verbose prints it")
    return 0 if ids and graphs == 1 else 1


# ---------------------------------------------------------------------------------
# On a GPU: train side by side, then time


def _loss(model, x, target):
    return torch.nn.functional.mse_loss(model(x).float(), target)


def _train(block, reference, dtype) -> bool:
    print(f"\ndemo: TransformerBlock({DIM}, {HEADS}, mlp_ratio={MLP_RATIO}) {str(dtype).replace('torch.', '')}, batch "
          f"{BATCH}x{SEQ}: {STEPS} SGD steps, cuDNN graphs (eager) and plain torch, same initial parameters")
    row("loss", f"{'cuDNN':<10}{'torch':<10}")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (block, reference)]
    agree = True
    for step in range(1, STEPS + 1):
        x = torch.randn(BATCH, SEQ, DIM, device="cuda", dtype=dtype)
        target = torch.randn(BATCH, SEQ, DIM, device="cuda")
        losses = []
        for model, optimizer in zip((block, reference), optimizers):
            optimizer.zero_grad(set_to_none=True)
            loss = _loss(model, x, target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        ok = abs(losses[0] - losses[1]) <= 2e-2 * abs(losses[1])
        agree &= ok
        row(f"step {step}/{STEPS}", f"{losses[0]:<10.5f}{losses[1]:<10.5f}{'OK' if ok else 'MISMATCH'}")
    return agree


def _time(candidates, rounds: int = 3):
    """Median ms per training step of each candidate over `rounds` interleaved rounds of
    torch.utils.benchmark's blocked_autorange (wall time, CUDA synchronized around each
    block: the step time a user sees, host-bound or GPU-bound alike)."""
    from torch.utils import benchmark

    for step in candidates.values():
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, step in candidates.items():
            measurement = benchmark.Timer("step()", globals={"step": step}).blocked_autorange(min_run_time=0.5)
            samples[name].append(measurement.median * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def _train_and_time() -> int:
    from .nn import TransformerBlock, reference_of

    dtype = torch.bfloat16
    torch.manual_seed(0)
    block = TransformerBlock(DIM, HEADS, MLP_RATIO, device="cuda", dtype=dtype)
    reference = reference_of(block)
    agree = _train(block, reference, dtype)

    x = torch.randn(BATCH, SEQ, DIM, device="cuda", dtype=dtype)
    target = torch.randn(BATCH, SEQ, DIM, device="cuda")

    def training_step(model):
        parameters = list(model.parameters())

        def step():
            for p in parameters:
                p.grad = None
            _loss(model, x, target).backward()

        return step

    print("compiling both blocks with torch.compile (inductor; a minute or so) ...")
    compiled = {name: torch.compile(model, fullgraph=True) for name, model in (("cuDNN", block), ("torch", reference))}
    figures = _time(
        {
            "cuDNN eager": training_step(block),
            "torch eager": training_step(reference),
            "cuDNN compiled": training_step(compiled["cuDNN"]),
            "torch compiled": training_step(compiled["torch"]),
        }
    )
    print(f"\nms per training step (forward + backward), batch {BATCH}x{SEQ}, median of 3 interleaved rounds of torch.utils.benchmark")
    for line in timing_rows(figures):
        row(*line)
    for line in summary_rows(current_stats(), current_settings(), active_only=True):
        row(*line)
    return 0 if agree else 1


def timing_rows(figures: dict) -> list:
    """(label, value) rows of the timing table: eager and compiled ms/step of each block, then their ratio."""
    ratio = {mode: figures[f"cuDNN {mode}"] / figures[f"torch {mode}"] for mode in ("eager", "compiled")}
    return [
        ("block", f"{'eager':<10}{'compiled':<10}"),
        *((name, f"{figures[f'{name} eager']:<10.3f}{figures[f'{name} compiled']:<10.3f}") for name in ("cuDNN", "torch")),
        ("cuDNN / torch", f"{ratio['eager']:.2f}x".ljust(10) + f"{ratio['compiled']:.2f}x"),
    ]
