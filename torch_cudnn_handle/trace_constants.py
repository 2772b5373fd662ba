"""Constants of a compiled frame: functions torch.compile calls once per trace, taking their
result as a constant (``torch.compiler.assume_constant_result``), marked only once
``torch._dynamo`` is loaded, so that importing the package does not load it (0.9 s).

Marking imports ``torch._dynamo``, so a module cannot mark a function as it is imported.
It registers it here instead (``@trace_constants.constant("written_inputs")``) and calls it
as an attribute of this module (``trace_constants.written_inputs(graph)``). The attribute
is missing from the module until then, so its lookup calls the module's ``__getattr__``,
which dynamo calls itself while tracing (it does not trace a module's ``__getattr__``):
dynamo is loaded then, so the lookup marks the function and keeps it as a plain attribute,
which later lookups and the guards of compiled frames read. A lookup before dynamo is
loaded (an eager call under a ``TorchFunctionMode``, or with a tensor subclass) gets the
function unmarked: nothing can trace it yet.

Thread rules: functions are registered while their modules are imported; a lookup from
any thread marks at most the same function twice (marking sets a flag on it).
"""

from __future__ import annotations

import sys
from typing import Callable, Dict

import torch

__all__ = ["constant"]

_registered: Dict[str, Callable] = {}  # attribute name -> function, for the process


def constant(name: str) -> Callable[[Callable], Callable]:
    """A decorator: ``fn``, registered as this module's attribute ``name`` (unchanged itself)."""

    def register(fn: Callable) -> Callable:
        if name in _registered or name in globals():
            raise ValueError(f"trace_constants: {name!r} is registered already")
        _registered[name] = fn
        return fn

    return register


def __getattr__(name: str) -> Callable:
    fn = _registered.get(name)
    if fn is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if "torch._dynamo" not in sys.modules:
        return fn  # nothing traces without dynamo: unmarked, and looked up here again next time
    marked = torch.compiler.assume_constant_result(fn)
    globals()[name] = marked
    return marked
