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
produces; the demo prints that graph, where every matmul, norm and attention is a
``torch.ops.cudnn_fe.execute`` node, and which registered graph each id names.
"""

from __future__ import annotations

import re
import statistics

import torch

# A small block: quick to trace on a CPU and to train on a GPU, big enough to time.
DIM, HEADS, MLP_RATIO, BATCH, SEQ = 512, 8, 4, 8, 256
STEPS = 5


def main() -> int:
    import torch_cudnn_handle as tch

    if torch.cuda.is_available() and tch.with_cuda:
        return _train_and_time()
    return _trace_without_gpu()


# ---------------------------------------------------------------------------------
# Without a GPU: trace


def fake_cuda_module(module: torch.nn.Module, fake_mode) -> torch.nn.Module:
    """``module`` (built on the meta device) with fake CUDA parameters that need no
    grad: a CPU torch can neither initialize CUDA tensors nor give fake CUDA tensors
    autograd metadata, and a forward trace needs neither."""
    with fake_mode:
        for owner in module.modules():
            for name, parameter in list(owner.named_parameters(recurse=False)):
                fake = torch.empty(parameter.shape, dtype=parameter.dtype, device="cuda")
                setattr(owner, name, torch.nn.Parameter(fake, requires_grad=False))
    return module


def _trace_without_gpu() -> int:
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .nn import TransformerBlock
    from .registry import graph_name

    print("\ndemo: no CUDA GPU here, so the TransformerBlock is traced instead of trained:")
    print(f"  torch.compile(TransformerBlock({DIM}, {HEADS}, mlp_ratio={MLP_RATIO}), fullgraph=True) on fake CUDA "
          f"bf16 tensors [{BATCH}, {SEQ}, {DIM}], forward (nothing is built or run; the op's fake kernel describes each graph)\n")
    torch._dynamo.reset()
    fake_mode = FakeTensorMode()
    block = fake_cuda_module(TransformerBlock(DIM, HEADS, MLP_RATIO, device="meta", dtype=torch.bfloat16), fake_mode)
    with fake_mode:
        x = torch.empty(BATCH, SEQ, DIM, dtype=torch.bfloat16, device="cuda")
    backend = AotEagerAndRecordGraphs()
    y = torch.compile(block, fullgraph=True, backend=backend)(x)
    code = backend.fw_graphs[0].print_readable(print_output=False, include_stride=True)
    # The "# File: ..." lines name each op's source line; the graph reads better without them.
    print("\n".join(line for line in code.splitlines() if line.strip() and not line.strip().startswith("# File:")))
    ids = [int(i) for i in re.findall(r"torch\.ops\.cudnn_fe\.execute\.default\((\d+),", code)]
    print(f"{len(backend.fw_graphs)} graph, no graph break; {len(ids)} calls of torch.ops.cudnn_fe.execute, "
          f"output {list(y.shape)} {y.dtype} on {y.device}. Graph ids:")
    for graph_id in sorted(set(ids)):
        print(f"  {graph_id:>3} = {graph_name(graph_id)} (x{ids.count(graph_id)})")
    return 0 if ids and len(backend.fw_graphs) == 1 else 1


# ---------------------------------------------------------------------------------
# On a GPU: train side by side, then time


def _loss(model, x, target):
    return torch.nn.functional.mse_loss(model(x).float(), target)


def _train(block, reference, dtype) -> bool:
    print(f"\ndemo: TransformerBlock({DIM}, {HEADS}, mlp_ratio={MLP_RATIO}) {str(dtype).replace('torch.', '')}, batch "
          f"{BATCH}x{SEQ}: {STEPS} SGD steps, cuDNN graphs (eager) and plain torch, same initial parameters")
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
        print(f"  step {step}/{STEPS}: loss cuDNN {losses[0]:.5f}  torch {losses[1]:.5f}  {'OK' if ok else 'MISMATCH'}")
    return agree


def _ms_per_step(step, iters: int) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def _time(candidates, iters: int = 20, warmup: int = 3, rounds: int = 5):
    """Median ms per step of each candidate, rounds interleaved (same run, same clocks)."""
    for step in candidates.values():
        for _ in range(warmup):
            step()
    torch.cuda.synchronize()
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, step in candidates.items():
            samples[name].append(_ms_per_step(step, iters))
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

    print("\ncompiling both blocks with torch.compile (inductor; a minute or so) ...")
    compiled = {name: torch.compile(model, fullgraph=True) for name, model in (("cuDNN", block), ("torch", reference))}
    figures = _time(
        {
            "cuDNN eager": training_step(block),
            "torch eager": training_step(reference),
            "cuDNN compiled": training_step(compiled["cuDNN"]),
            "torch compiled": training_step(compiled["torch"]),
        }
    )
    print(f"\nms per training step (forward + backward), batch {BATCH}x{SEQ}, median of 5 interleaved rounds of 20 steps:\n")
    print("| block | eager ms/step | compiled ms/step |")
    print("| --- | ---: | ---: |")
    for name in ("cuDNN", "torch"):
        print(f"| {name} | {figures[f'{name} eager']:.3f} | {figures[f'{name} compiled']:.3f} |")
    print(f"| cuDNN / torch | {figures['cuDNN eager'] / figures['torch eager']:.2f}x | "
          f"{figures['cuDNN compiled'] / figures['torch compiled']:.2f}x |")
    import torch_cudnn_handle as tch

    print(f"\nhandle pool: {tch.pool_stats()}\ngraph registry: {tch.registry_stats()}")
    return 0 if agree else 1
