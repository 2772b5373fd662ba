"""Dynamic shapes: one cuDNN kernel cache per graph structure and device.

A graph described with ``is_dynamic_shape_enabled=True`` and a ``kernel_cache``
(``cudnn.create_kernel_cache()``) stores the kernels its plan compiled there, and a
later build of a graph of the same topology (another sequence length, another token
count) may bind them instead of compiling again: a new layout's build gets cheap.
cuDNN uses the kernel cache only for dynamic-shape graphs, and only across graphs of
one topology, so a cache here belongs to one (definition, device, determinism, input
dtypes and ranks): what can change the topology a builder describes.

Opt-in: ``register_graph(..., dynamic_shapes=True)`` > the ``dynamic_shapes`` setting (the
call's route says: routes.py); and only from cuDNN 9.21 (``MIN_BACKEND``).
Measured on the H200 with cuDNN 9.19: the causal sdpa forward built with a kernel
cache at a second length (264, after 136) wrote outputs up to 4.7 away from the static
build's, through the frontend's own execute as through the native path, so below 9.21
such a request builds statically and ``plan_source_reason`` says why.

Thread safety and lifetimes: whether one cuDNN kernel cache may be written by two
builds at once is not documented, so a ``KernelCacheSlot``'s lock is held for the
whole build that uses it (builds of other graphs, or other devices, still run in
parallel). The caches live until ``clear()`` (the registry's atexit hook, while CUDA is
still up); a graph built with one holds its own reference to it.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, Optional, Sequence

import cudnn


__all__ = ["KernelCacheSlot", "MIN_BACKEND", "slot_for", "clear"]


@dataclasses.dataclass
class KernelCacheSlot:
    cache: Any  # the cudnn kernel cache, created on first use
    lock: threading.Lock
    refused: str = ""  # why a build with it failed (then graphs of this slot build statically)


_lock = threading.Lock()
_slots: Dict[tuple, KernelCacheSlot] = {}


MIN_BACKEND = 92100  # see the module docstring
BELOW_MIN_BACKEND = (
    "dynamic shapes need cuDNN 9.21 or newer here: on cuDNN 9.19 (H200) a kernel-cache build of the sdpa forward gave "
    "outputs up to 4.7 away from a static build's, so it is built statically"
)


def slot_for(graph_id: int, device: int, specs: Sequence[Any], deterministic: bool) -> KernelCacheSlot:
    """The kernel cache of this graph structure on ``device`` (created on first use); a
    refused slot (no cache) below ``MIN_BACKEND``."""
    key = (graph_id, device, bool(deterministic), tuple((s.dtype, len(s.shape)) for s in specs))
    with _lock:
        slot = _slots.get(key)
        if slot is None:
            if cudnn.backend_version() < MIN_BACKEND:
                slot = _slots[key] = KernelCacheSlot(cache=None, lock=threading.Lock(), refused=BELOW_MIN_BACKEND)
            else:
                slot = _slots[key] = KernelCacheSlot(cache=cudnn.create_kernel_cache(), lock=threading.Lock())
        return slot


def clear() -> None:
    """Forget every kernel cache (graphs built with one keep theirs alive)."""
    with _lock:
        _slots.clear()
