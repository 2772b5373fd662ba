"""The top-level names of earlier releases, kept for one release: each still works, with a
DeprecationWarning naming its replacement. Nothing in the package uses them."""

from __future__ import annotations

import warnings
from typing import Optional

from . import settings, stats

__all__ = ["deprecated_attribute"]


def set_native_path(enabled: bool, *, hand_over: Optional[str] = None) -> bool:
    if hand_over is not None:
        settings.set_native_hand_over(hand_over)
    return settings.set_native_path(enabled)


def set_plan_cache(enabled: bool, directory: Optional[str] = None) -> bool:
    if directory is not None:
        settings.set_plan_store_dir(directory)
    return settings.set_plan_store(enabled)


def set_plan_tuning(enabled: bool, cache_file: Optional[str] = None) -> bool:
    if cache_file is not None:
        settings.set_tuning_file(cache_file)
    return settings.set_plan_tuning(enabled)


def registry_stats() -> dict:
    """The graph cache's counters with the plan store's as ``disk_*``, and as ``routes`` the
    graphs obtained per plan source with the plan store's under its old name ``"disk_cache"``, as before."""
    graphs = stats.graphs()
    graphs["routes"] = {("disk_cache" if source == "plan_store" else source): n for source, n in graphs["plan_sources"].items()}
    return dict(graphs, **{f"disk_{name}": n for name, n in stats.plan_store().items()})


# old name -> (the function that serves it, the replacement to name)
_REPLACED = {
    "set_native_path": (set_native_path, "torch_cudnn_handle.settings.set_native_path(enabled) and settings.set_native_hand_over(when)"),
    "set_native_cuda_graphs": (settings.set_native_cuda_graphs, "torch_cudnn_handle.settings.set_native_cuda_graphs"),
    "set_dynamic_shapes": (settings.set_dynamic_shapes, "torch_cudnn_handle.settings.set_dynamic_shapes"),
    "set_plan_cache": (set_plan_cache, "torch_cudnn_handle.settings.set_plan_store(enabled) and settings.set_plan_store_dir(path)"),
    "set_plan_tuning": (set_plan_tuning, "torch_cudnn_handle.settings.set_plan_tuning(enabled) and settings.set_tuning_file(path)"),
    "set_cache_capacity": (settings.set_graph_cache_capacity, "torch_cudnn_handle.settings.set_graph_cache_capacity"),
    "registry_stats": (registry_stats, "torch_cudnn_handle.stats.graphs() and stats.plan_store()"),
    "pool_stats": (stats.pool, "torch_cudnn_handle.stats.pool()"),
    "tuning_stats": (stats.tuning, "torch_cudnn_handle.stats.tuning()"),
    "native_cuda_graph_stats": (stats.native_cuda_graphs, "torch_cudnn_handle.stats.native_cuda_graphs()"),
}


def deprecated_attribute(name: str):
    if name not in _REPLACED:
        raise AttributeError(f"module 'torch_cudnn_handle' has no attribute {name!r}")
    function, replacement = _REPLACED[name]

    def deprecated(*args, **kwargs):
        warnings.warn(f"torch_cudnn_handle.{name} is deprecated and will be removed in the next release; use {replacement}",
                      DeprecationWarning, stacklevel=2)
        return function(*args, **kwargs)

    deprecated.__name__ = deprecated.__qualname__ = name
    deprecated.__doc__ = f"Deprecated: use {replacement}."
    return deprecated
