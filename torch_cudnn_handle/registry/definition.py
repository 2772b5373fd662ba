"""``Definition``: what a graph id names, the checks that make one, and the table of them.

A definition is a builder plus its parameters and options (or, for a registered built
graph, only its arity: the graph cache holds that graph), made once by ``define`` and
fixed for the life of the process. ``define`` checks everything that can be checked
before a call: the builder and its options, ragged and in-place declarations, the
backward against its forward (``backward.declare``, which also hands the graph's record
to C++). A backward graph is a definition of its own, with its own id.

Thread safety: ``Definitions`` takes one lock for its table; definitions never change.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import threading
import uuid
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import cudnn

from . import backward as backward_record
from .backward import Backward
from .buckets import Buckets, declared as declared_buckets
from .data_types import GraphDataTypes
from .in_place import declared_writes
from .operand_views import OperandViews
from .ragged import RaggedOperands
from .specs import TensorSpec

__all__ = ["Definition", "Definitions", "positional_arity", "check_arity"]


@dataclasses.dataclass(frozen=True, eq=False)
class Definition:
    """What a graph id names; hashed by identity (one per id)."""

    graph_id: int
    name: str
    builder: Optional[Callable[..., Any]]  # None: a registered built graph (graph_cache.py holds it)
    params: Mapping[str, Any]
    num_inputs: Optional[int]  # None: the builder takes *inputs
    backward: Optional[Backward] = None  # how a call is differentiated (backward.py)
    backward_id: Optional[int] = None  # the backward graph of a Backward.graph
    tune: Optional[bool] = None  # time the candidate plans (plans/tuning/); None: the setting
    output_shapes: Optional[Callable[..., Sequence[Sequence]]] = None  # fn(*input_shapes) under dynamic shapes (symbolic.py)
    data_types: GraphDataTypes = GraphDataTypes()  # io/intermediate/compute the author chose (data_types.py)
    dynamic_shapes: Optional[bool] = None  # with dynamic shapes and a kernel cache (plans/kernel_caches.py); None: the setting
    ragged: Optional[RaggedOperands] = None  # packed [T, H, D] inputs and their ragged offsets (ragged.py)
    views: Optional[OperandViews] = None  # natural operands: what the builder sees of each (operand_views.py)
    reference: Optional[bool] = None  # CUDA calls run on the torch interpreter, never cuDNN; None: the reference_path setting
    serving_mode: Optional[bool] = None  # serving mode: a stand-in until the plan is ready (routes.py); None: the setting
    stand_in_calls: Optional[int] = None  # a new layout's first N calls on a stand-in, N+1 waits (routes.py); None: the setting
    stand_in: Optional[Callable[..., Any]] = None  # torch ops computing its outputs, for those calls; None: the interpreter
    buckets: Optional[Buckets] = None  # dims that take any size, padded to a bucket (buckets.py)

    @property
    def is_built(self) -> bool:
        return self.builder is None

    def call_specs(self, specs: Sequence[TensorSpec]) -> Tuple[TensorSpec, ...]:
        """What keys and describes a call: its specs, a packed input's token count left out."""
        return tuple(specs) if self.ragged is None else self.ragged.call_specs(specs)


def positional_arity(builder) -> Optional[int]:
    """How many inputs a builder ``f(graph, *inputs, **params)`` takes, or None for *args."""
    try:
        parameters = list(inspect.signature(builder).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    return sum(1 for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


def check_arity(definition: Definition, count: int) -> None:
    if definition.num_inputs is not None and count != definition.num_inputs:
        n = definition.num_inputs
        raise ValueError(f"cudnn_fe.execute: graph {definition.name!r} takes {n} input{'' if n == 1 else 's'} (one tensor per input of "
                         f"its builder), got {count}")


# Note [Graph ids]: an id is unique in the process, whichever table holds it (a graph's
# record in C++, csrc/op/graph_record.h, is keyed by id alone), and it is the same in every
# process that registers the same definition on the same cuDNN and library versions: a
# hash of the definition's fields (a builder by its module, qualified name and code), the
# next free one where two definitions hash alike (so a definition registered twice gets
# its ids in registration order). torch.compile's caches on disk (inductor's FX graph
# cache, AOTAutograd's) key a compiled graph by its code, where a cuDNN graph is its id,
# and replay it in any process: with ids counted per process, a graph compiled where id
# 1 was a relu ran where id 1 was another graph, and failed on sizes its fake kernel
# never gave; on the H200 a reduce-overhead training step compiled on cuDNN 9.19 failed
# when replayed on 9.27. Registered built graphs hash a per-process salt too: their
# graph is an object no other process has.
_taken: set = set()
_taken_lock = threading.Lock()
_PROCESS_SALT = uuid.uuid4().hex


@functools.lru_cache(maxsize=1)
def _versions() -> str:
    """What a graph's behaviour depends on besides its definition: cuDNN's and this library's versions."""
    from .._version import __version__

    try:
        backend = cudnn.backend_version()
    except Exception:  # noqa: BLE001 -- no libcudnn here (a CPU machine): the interpreter runs every graph
        backend = None
    return f"cudnn {backend}, frontend {cudnn.__version__}, torch_cudnn_handle {__version__}"


def _code_identity(code) -> str:
    constants = [_code_identity(c) if inspect.iscode(c) else repr(c) for c in code.co_consts]
    return hashlib.sha256(b"|".join(x.encode() for x in (repr(code.co_code), repr(constants), repr(code.co_names)))).hexdigest()[:16]


def _identity(value, depth: int = 0) -> str:
    """A text for a definition field that another process gives the same value (a function by
    module, qualified name and code; a value by repr, which for an object without one names
    its address: then the id is this process's alone, never wrong)."""
    if depth > 6:
        return type(value).__qualname__
    depth += 1
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_identity(v, depth) for v in value) + ")"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_identity(k, depth)}:{_identity(v, depth)}" for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__qualname__ + _identity({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, depth)
    if isinstance(value, functools.partial):
        return f"partial({_identity(value.func, depth)},{_identity(value.args, depth)},{_identity(value.keywords, depth)})"
    code = getattr(value, "__code__", None)
    if code is not None and inspect.iscode(code):
        captured = [cell.cell_contents for cell in value.__closure__ or ()]  # what a closure (a builder made in a loop) captured
        defaults = (value.__defaults__, value.__kwdefaults__)
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}:{_code_identity(code)}" + (
            _identity([captured, defaults], depth) if captured or defaults != (None, None) else "")
    return repr(value)


def _new_id(fields: Mapping[str, Any]) -> int:
    """The id of a new definition (Note [Graph ids]): positive, below 2**48."""
    text = _versions() + "|" + _identity(dict(fields)) + ("|" + _PROCESS_SALT if fields.get("builder") is None else "")
    graph_id = int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "big") or 1
    with _taken_lock:
        while graph_id in _taken:
            graph_id = graph_id % (2**48 - 1) + 1
        _taken.add(graph_id)
    return graph_id


class Definitions:
    """Definitions by id (the registry's is every definition of this process)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._table: Dict[int, Definition] = {}

    def _add(self, **fields) -> int:
        graph_id = _new_id(fields)
        with self._lock:
            self._table[graph_id] = Definition(graph_id=graph_id, **fields)
            return graph_id

    def get(self, graph_id: int) -> Definition:
        definition = self._table.get(graph_id)
        if definition is None:
            raise ValueError(
                f"cudnn_fe.execute: unknown graph id {graph_id}; ids come from torch_cudnn_handle.register_graph() "
                "(or register_built_graph()) in this process"
            )
        return definition

    def find(self, graph_id: int) -> Optional[Definition]:
        return self._table.get(graph_id)

    def __len__(self) -> int:
        return len(self._table)

    def all(self) -> list:
        with self._lock:
            return list(self._table.values())

    def differentiable(self, graph_id: int) -> Definition:
        """The definition of ``graph_id``, which must have a backward."""
        forward = self.get(graph_id)
        if forward.backward is None:
            raise RuntimeError(
                f"graph {forward.name!r} (id {graph_id}) has no backward, so it cannot be differentiated; register it "
                "with register_graph(builder, backward=Backward.graph(backward_builder)) or backward=Backward.function(fn)"
            )
        return forward

    def add_built(self, name: str, num_inputs: int) -> int:
        """The id of a registered built graph (graph_cache.py keeps the graph itself)."""
        return self._add(name=name, builder=None, params={}, num_inputs=num_inputs)

    def define(
        self, builder, *, name: Optional[str], params: Mapping[str, Any], backward: Optional[Backward], tune: Optional[bool],
        output_shapes, data_types: GraphDataTypes, dynamic_shapes: Optional[bool], ragged, views, in_place,
        reference: Optional[bool] = None, serving_mode: Optional[bool] = None, buckets: Optional[Buckets] = None,
        stand_in_calls: Optional[int] = None, stand_in: Optional[Callable[..., Any]] = None,
    ) -> int:
        """Check a registration and add its definitions (the forward's, and a backward
        graph's); returns the forward's id, its record declared in C++."""
        if builder is None:
            raise TypeError("register_graph: expected a builder callable, got None")
        for what, fn in (("builder", builder), ("output_shapes", output_shapes), ("stand_in", stand_in)):
            if fn is not None and not callable(fn):
                raise TypeError(f"register_graph: {what} must be callable, got {type(fn).__name__}")
        if views is not None and not isinstance(views, OperandViews):
            raise TypeError(f"register_graph: views must be an OperandViews, got {type(views).__name__}")
        if backward is not None and not isinstance(backward, Backward):
            raise TypeError(f"register_graph: backward must be a Backward (Backward.graph/.steps/.function), got {type(backward).__name__}")
        for option, value in (("reference", reference), ("serving_mode", serving_mode)):
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"register_graph: {option} must be True, False or None (the setting), got {value!r}")
        if stand_in_calls is not None and (not isinstance(stand_in_calls, int) or isinstance(stand_in_calls, bool) or stand_in_calls < 0):
            raise TypeError(f"register_graph: stand_in_calls must be a whole number (0 or more) or None (the setting), got {stand_in_calls!r}")
        if not isinstance(params, Mapping):
            raise TypeError(f"register_graph: params must be a dict of the builder's keyword arguments, got {type(params).__name__}")
        name = name or getattr(builder, "__name__", "graph")
        num_inputs = positional_arity(builder)
        buckets = declared_buckets(name, buckets, num_inputs, ragged=ragged, views=views, in_place=in_place)
        packed = RaggedOperands.declared(name, ragged, num_inputs)
        if packed is not None:
            if tune:
                raise ValueError(
                    f"register_graph({name!r}): a graph with ragged operands cannot be tuned (tuning runs the candidates on "
                    "random data, which are no valid offsets); drop tune=True"
                )
            tune = False
        writes = declared_writes(name, in_place, num_inputs)
        if writes and (views is not None or packed is not None):
            raise ValueError(
                f"register_graph({name!r}): in_place writes into the op's own input buffers, and a graph whose operands "
                "are views (views=) or packed (ragged=) sees them otherwise; write those outputs as new tensors (drop "
                "in_place)"
            )
        for step_graph in backward.graph_ids() if backward is not None else ():
            self.get(step_graph)  # an unknown step graph fails here, not in a backward
        backward_id = backward_arity = None
        if backward is not None and backward.kind == "graph":
            backward_arity = positional_arity(backward.builder)
            backward_packed = RaggedOperands.declared(f"{name}_backward", backward.ragged, backward_arity)
            backward_id = self._add(
                name=f"{name}_backward", builder=backward.builder, params=dict(params), num_inputs=backward_arity,
                tune=False if backward_packed is not None else tune, dynamic_shapes=dynamic_shapes, ragged=backward_packed,
                views=backward.views, reference=reference, serving_mode=serving_mode,  # the backward graph's too
                stand_in_calls=stand_in_calls, stand_in=backward.stand_in,
            )
        graph_id = self._add(
            name=name, builder=builder, params=dict(params), num_inputs=num_inputs, backward=backward, backward_id=backward_id,
            tune=tune, output_shapes=output_shapes, data_types=data_types, dynamic_shapes=dynamic_shapes, ragged=packed, views=views,
            reference=reference, serving_mode=serving_mode, buckets=buckets, stand_in_calls=stand_in_calls, stand_in=stand_in,
        )
        backward_record.declare(graph_id, name, backward, num_inputs=num_inputs, backward_id=backward_id,
                                backward_arity=backward_arity, in_place=writes)
        return graph_id
