"""The graph registry: graph builders (or built graphs) in, int ids out.

``torch.ops.cudnn_fe.execute`` takes a graph as an int id, so it works with opcheck,
torch.compile, export and CUDA graphs on every torch version. An id names a
definition; the registry turns a definition and a call's inputs into a built graph.

  * ``specs.py``: TensorSpec, GraphLayout, BackwardOperand, BackwardStep, the torch <-> cuDNN dtype tables;
  * ``operand_views.py``: natural operands (how the op's tensors map to what a builder describes);
  * ``description.py``: definitions, and the builder run on a graph description
    (layouts for the fake kernel);
  * ``build.py``: one build for one device, the native hand-over (at the build or the second call), BuiltGraph;
  * ``cache.py``: GraphRegistry (ids, the LRU, in-flight builds, eviction);
  * ``ragged.py``: packed [T, H, D] operands with ragged offsets, keyed without T;
  * ``routes.py``: how a build is obtained: from the plan store (``plan_store.py``,
    ``plan_disk.py``), with a kernel cache (``kernel_caches.py``), or statically;
  * ``build_timing.py``: where a build's time went, phase by phase;
  * here: the public API on the one process-wide registry, and its atexit hook.

Every function here is thread-safe.
"""

from __future__ import annotations

import atexit
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

import torch

from .. import _C
from . import description, kernel_caches
from .build import BuiltGraph
from .cache import GraphRegistry, hand_over_when
from . import symbolic  # noqa: F401 -- registry.symbolic: the fake kernel (op.py) imports it from here
from .data_types import GraphDataTypes
from .kernel_caches import set_dynamic_shapes
from .plan_store import set_plan_cache
from .operand_views import OperandViews
from .ragged import Ragged
from .specs import BackwardOperand, BackwardStep, GraphLayout, TensorSpec

__all__ = [
    "BackwardOperand",
    "BackwardStep",
    "OperandViews",
    "Ragged",
    "TensorSpec",
    "GraphLayout",
    "BuiltGraph",
    "register_graph",
    "register_built_graph",
    "graph_name",
    "registry_stats",
    "set_cache_capacity",
    "set_native_path",
    "built_graphs",
    "set_dynamic_shapes",
    "set_plan_cache",
]

_describe = description._describe  # registry._describe: tests and bench describe graphs through it

_registry = GraphRegistry()


@atexit.register
def _drop_built_graphs() -> None:
    """Release the cached graphs while CUDA is still up (atexit runs before interpreter
    teardown), instead of leaving them to the frontend's bindings to report as leaked.
    Native plans are left to the process's end, like the pool's handles. A child forked
    after handles existed has no CUDA state to release them into: it leaves them."""
    if _C.with_cuda and _C.forked_after_handles():
        return
    _registry.drop_built()
    kernel_caches.clear()


def register_graph(
    builder: Callable[..., Any],
    *,
    name: Optional[str] = None,
    backward: Optional[Callable[..., Any]] = None,
    backward_operands: Optional[Union[Callable[..., Sequence[torch.Tensor]], Sequence[BackwardOperand]]] = None,
    backward_fn: Optional[Callable[..., Sequence[Optional[torch.Tensor]]]] = None,
    backward_reads: Optional[Sequence[BackwardOperand]] = None,
    differentiable_outputs: Optional[Sequence[int]] = None,
    materialize_grads: bool = True,
    tune: Optional[bool] = None,
    output_shapes: Optional[Callable[..., Sequence[Sequence[Any]]]] = None,
    io_data_type: Any = None,
    intermediate_data_type: Any = None,
    compute_data_type: Any = None,
    dynamic_shapes: Optional[bool] = None,
    ragged: Optional[Dict[int, Ragged]] = None,
    backward_ragged: Optional[Dict[int, Ragged]] = None,
    views: Optional[OperandViews] = None,
    backward_views: Optional[OperandViews] = None,
    backward_steps: Optional[Sequence[BackwardStep]] = None,
    backward_grads: Optional[Sequence[Optional[BackwardOperand]]] = None,
    in_place: Optional[Mapping[int, int]] = None,
    **params,
) -> int:
    """Register a graph builder; returns the id ``torch.ops.cudnn_fe.execute`` takes.

    ``builder(graph, *inputs, **params)`` adds nodes to ``graph`` (a ``cudnn.pygraph``)
    for ``inputs`` (one ``cudnn`` tensor per op input, with the call's shapes, strides
    and dtypes) and returns its output tensor or a sequence of them; the registry marks
    them as outputs. ``params`` are passed to every call of the builder and are part of
    the definition: the same builder with other parameters is another id.

    The graph's types: ``io_data_type`` (of tensors created without one, outputs
    included), ``intermediate_data_type`` (virtual tensors), ``compute_data_type``,
    each a torch dtype or a ``cudnn.data_type``. By default io is the first
    floating-point input's dtype (the first input's in an all-integer graph) and
    intermediate and compute are float32.

    Inputs: CUDA tensors, all on one device, and host scalars: a CPU tensor of one
    element (``torch.tensor(1e-5)``) is a pass-by-value operand (an epsilon, a scale),
    its value read when the plan runs, so one build serves every value. The op's
    ``Tensor[]`` schema cannot carry a Python number: wrap it, ``torch.tensor(x)``.

    Outputs: an output whose strides the builder declares (``set_stride``) is written
    in exactly that layout; one it only marks leaves the layout to cuDNN (an NHWC
    convolution writes NHWC), and the op returns what the build writes.

    A backward makes ``torch.ops.cudnn_fe.execute(id, ...)`` differentiable; give one of:

    * ``backward``: the builder of one backward graph, ``backward(graph, *operands,
      **params)``, returning one gradient tensor (or None) per forward input. Its
      operands are, by default, all gradients, inputs and outputs in that order. Name
      them instead with a sequence of ``BackwardOperand.grad(i)`` / ``.input(i)`` /
      ``.output(i)``: the autograd node then assembles them in C++ and, once a native
      plan serves the backward graph, runs the backward with no Python. Or compute them
      with a function ``backward_operands(grad_outputs, inputs, outputs)`` (Python on
      every backward), e.g. to pass views (``w.mT``) of saved tensors.
    * ``backward_steps``: a declared backward of several graphs, for one cuDNN cannot
      fuse into one (one matmul per graph): ``BackwardStep(graph_id, operands,
      for_grads=...)`` in order, whose operands may be earlier steps' outputs
      (``BackwardOperand.step(s, k)``), and ``backward_grads``, per forward input where
      its gradient comes from (``BackwardOperand.step(s, k)``, ``.grad(i)``, either
      ``.sum_to_input()`` for a broadcast input such as a bias, or None). The node runs
      the steps in C++ through the op (natively once native plans serve them), a step
      only when an input in its ``for_grads`` needs a gradient; it saves what the steps
      read, and the outputs whose gradient no step takes are non-differentiable.
    * ``backward_fn(grad_outputs, inputs, outputs)``: torch-level code returning one
      gradient (or None) per forward input, for a backward that takes several graphs
      (cuDNN fuses one matmul per graph); it typically calls
      ``torch.ops.cudnn_fe.execute`` on other registered graphs.

    Either runs on the thread autograd picks, on the forward's device and stream.
    A function (``backward_fn``, a computing ``backward_operands``) gets zeros for an
    output autograd gave no gradient for, unless ``materialize_grads=False`` (then None,
    as with ``ctx.set_materialize_grads(False)`` in a torch.autograd.Function); a
    declared backward zero-fills only the gradients it names.

    What autograd keeps, as torch's own ops do (Note [What a node saves] in
    csrc/op/autograd_kernels.cpp): a declared backward's node saves only the inputs and
    outputs its operands name. A function backward reads every input and output unless
    ``backward_reads`` names the ones it does (``BackwardOperand.input(i)`` /
    ``.output(i)``, optionally ``for_grads=[j, ...]``: read only to compute those
    inputs' gradients); it then gets None for the others.

    Which outputs are differentiable: with declared ``backward_operands``, the outputs
    whose gradient is among them (the others are marked non-differentiable, as torch
    marks a logsumexp output); else ``differentiable_outputs`` (default: all).

    Under ``torch.use_deterministic_algorithms(True)`` a graph is built among the
    engines cuDNN does not mark non-deterministic (a separate build, cached beside the
    other); with none, the call raises (or warns, with ``warn_only=True``) as torch does
    for an op without a deterministic implementation. A builder that has a
    deterministic variant of its own (the sdpa backward's) reads
    ``torch.are_deterministic_algorithms_enabled()``.

    Under ``torch.compile(dynamic=True)`` the fake kernel gives outputs symbolic sizes
    (one compiled frame serves every size; registry/symbolic.py): each output dimension
    either stays fixed or follows one input dimension, found from two descriptions. A
    graph whose outputs follow the inputs some other way gives
    ``output_shapes(*input_shapes) -> [shape, ...]`` (one per output).

    Natural operands: ``views=OperandViews(inputs=[fn or None per input], outputs=fn)``
    says how each torch tensor maps to the tensor the builder describes (a view of the
    same memory, e.g. ``lambda x: x.reshape(-1, x.shape[-1], 1, 1)`` for a norm) and each
    output's natural shape (``fn(*input_shapes)``), so callers pass and get natural
    tensors and record no view nodes around the op; ``backward_views`` does the same for
    the ``backward`` graph.

    ``dynamic_shapes=True`` describes the graph (and its backward) with dynamic shapes
    and builds it with a kernel cache shared by every layout of the same structure, so a
    new sequence length or token count reuses compiled kernels; None follows
    ``set_dynamic_shapes()`` / ``TORCH_CUDNN_HANDLE_DYNAMIC_SHAPES`` (default off). A
    graph whose build with the cache fails is built statically; ``built_graphs(id)``
    says which ``route`` served each layout, and why.

    Ragged (packed, THD) operands: ``ragged={i: Ragged(offsets=j, max_seq_len=S)}``
    makes op input ``i`` a packed ``[T, H, D]`` token buffer whose ragged offsets are op
    input ``j`` (``B + 1`` int64 or int32 elements on the same GPU: where each batch
    element starts, in elements, so cumulative token counts times ``H*D`` for a
    contiguous buffer), its sequences at most ``S`` tokens. The builder gets it as
    cuDNN's ragged tensor, 4-D ``[B, H, S, D]``, its ragged offset already set. An
    output the builder gives a ragged offset is returned packed, ``[T, H, D]``, with
    the token count of the packed input whose offsets it shares
    (``o.set_ragged_offset(q_off)``). The token count is no part of any key: one build
    (and one native plan) serves every ``T``. The op never reads the offsets (that
    would sync with the GPU), so offsets past a buffer's ``T`` tokens, or a sequence
    longer than ``S``, make cuDNN read or write past the buffers. Such a graph is not
    tuned (tuning would run it on random offsets). ``backward_ragged`` declares the
    packed operands of its ``backward`` graph the same way, by the backward's operand
    positions; its gradients come back ``[T, H, D]`` like the inputs (registry/ragged.py).

    ``in_place={output: input}``: the graph writes those outputs (indices as
    ``execute`` returns them) into those inputs' buffers, as upstream binds batchnorm's
    next running statistics to the running statistics it read. Call it with
    ``execute_(id, inputs)``, which writes them there and returns the other outputs
    (the schema declares the written inputs mutated: version counters bump,
    torch.compile copies back into them, autograd refuses a written input that
    requires grad). Each such output must have exactly its input's shape, strides and
    dtype. ``execute`` still returns every output as a new tensor (that is the
    differentiable form), and ``execute.out`` refuses an ``out`` that overlaps an input.
    """
    return _registry.register(
        builder, name=name, backward=backward, backward_operands=backward_operands, backward_fn=backward_fn,
        backward_reads=backward_reads, differentiable_outputs=differentiable_outputs, materialize_grads=materialize_grads,
        tune=tune, output_shapes=output_shapes, dynamic_shapes=dynamic_shapes, ragged=ragged, backward_ragged=backward_ragged,
        views=views, backward_views=backward_views, backward_steps=backward_steps, backward_grads=backward_grads,
        in_place=in_place,
        data_types=GraphDataTypes.chosen(io=io_data_type, intermediate=intermediate_data_type, compute=compute_data_type),
        **params,
    )


def register_built_graph(graph, inputs: Sequence[Any], outputs: Sequence[Any], *, device, name: Optional[str] = None) -> int:
    """Register a ``cudnn.pygraph`` that is already built, with its input and output
    tensors in the op's order. It runs only on ``device`` and only for inputs of
    exactly the shapes, strides and dtypes it was built for."""
    return _registry.register_built(graph, inputs, outputs, device=device, name=name)


def graph_name(graph_id: int) -> str:
    """The name a graph was registered under (its builder's name unless ``name=`` was given)."""
    return _registry.definition(graph_id).name


def registry_stats() -> dict:
    """Counters of the built-graph cache: hits, misses, builds (graphs built, not loaded),
    evictions, cached, capacity, and how many cached graphs run natively (from C++) or
    on the Python path, ``native_pending`` of those awaiting their native hand-over (at
    their second call) and ``hand_overs`` done so far; ``routes``: graphs obtained per route ("static", "kernel_cache",
    "disk_cache"); ``plan_seconds``: the time spent obtaining them, and ``phase_seconds`` the
    same by phase (``BuiltGraph.phase_seconds`` summed; build_timing.py); the plan store's
    ``disk_hits``, ``disk_misses``, ``disk_writes``, ``disk_rejected``, ``disk_write_errors``."""
    return _registry.stats()


def set_native_path(enabled: bool, *, hand_over: Optional[str] = None) -> None:
    """Whether graphs built from now on may run natively (from C++). Graphs already
    built keep their path (one pending its hand-over is handed over at its second call).
    Off by default on builds without CUDA.

    ``hand_over``: when a graph the native path may serve is handed to it (its plan
    serialized, then deserialized by the extension): ``"build"`` (the default;
    ``TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER``), so the first call already runs on the plan
    every later call runs on and only it may wait for the device (cuDNN waits on a plan's
    first execution), or ``"second_call"``, so the first call runs on the Python path and
    a layout used once never pays the hand-over (about 5-7 ms for an SDPA forward and
    backward), at the price of a second such wait at the second call. None: unchanged."""
    if hand_over is not None:
        _registry.native_hand_over = hand_over_when(hand_over)
    _registry.native_enabled = bool(enabled) and _C.with_cuda


def built_graphs(graph_id: int) -> list:
    """The cached BuiltGraph objects of ``graph_id`` (one per device and input layout);
    an unknown id raises."""
    _registry.definition(graph_id)  # an unknown id is an error, not "nothing built yet"
    return _registry.built_of(graph_id)


def set_cache_capacity(capacity: int) -> None:
    """Bound the number of built graphs kept (least recently used are evicted first)."""
    if capacity < 1:
        raise ValueError("the built-graph cache needs a capacity of at least 1")
    _registry.set_capacity(capacity)
