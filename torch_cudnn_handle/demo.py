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
after the GPU demo, summary.py's rows say in words what each subsystem did.
"""

from __future__ import annotations

import re
import statistics

import torch

from .summary import current_settings, current_stats, summary_rows

# A small block: quick to trace on a CPU and to train on a GPU, big enough to time.
DIM, HEADS, MLP_RATIO, BATCH, SEQ = 512, 8, 4, 8, 256
STEPS = 5

LABEL_WIDTH = 28  # the longest label, "torch.ops.cudnn_fe.execute", plus two spaces


def row(label: str, value) -> None:
    """One report line: the label padded to LABEL_WIDTH, then the value."""
    print(f"  {label:<{LABEL_WIDTH}}{value}")


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
